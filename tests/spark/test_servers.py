"""A mixed cluster: one SQLite, one PostgreSQL and one MariaDB site (different column types:
INTEGER vs BIGINT vs INT), in uniquely named databases dropped afterwards, set up by `multimaster
init`; the sites are made to differ behind replication's back (capture guard on). Skipped when a
server does not answer; with MM_REQUIRE_SERVERS=1 that is a failure instead."""

from __future__ import annotations

import json
import sqlite3
import uuid
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from mm_spark_helpers import base_rid, client, require_server, row, uncaptured, write_topology
from typer.testing import CliRunner

from multimaster import api
from multimaster.cli import app
from multimaster.config.topology import load_topology
from multimaster.spark import verify
from multimaster.spark.repair import apply_plan, plan_repair

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
MY_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/"
ROWS = 60


def _admin(url: str) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 3})


@pytest.fixture
def pg_db():
    eng = _admin(PG_ADMIN)
    require_server("PostgreSQL", lambda: eng.connect().close())
    name = f"mm_verify_{uuid.uuid4().hex[:10]}"
    with eng.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with eng.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    eng.dispose()


@pytest.fixture
def my_db():
    eng = _admin(MY_ADMIN)
    require_server("MariaDB", lambda: eng.connect().close())
    name = f"mm_verify_{uuid.uuid4().hex[:10]}"
    with eng.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE `{name}`"))
    yield f"mysql+pymysql://root@127.0.0.1:3306/{name}"
    with eng.connect() as c:
        c.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
    eng.dispose()


#: the same table, each database with types of its own
DDL = {
    "s1": "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)",
    "pg": "CREATE TABLE items(id BIGINT PRIMARY KEY, name VARCHAR(100), qty BIGINT, price DOUBLE PRECISION)",
    "my": "CREATE TABLE items(id INT PRIMARY KEY, name VARCHAR(100), qty INT, price DOUBLE)",
}


def _fill(url: str, ddl: str, ph: str) -> None:
    """The table and rows 1..ROWS, written by a plain client before init (the common base)."""
    c = client(url)
    cur = c.cursor()
    cur.execute(ddl)
    cur.executemany(
        f"INSERT INTO items (id, name, qty, price) VALUES ({', '.join([ph] * 4)})", [row(i) for i in range(1, ROWS + 1)]
    )
    if not isinstance(c, sqlite3.Connection):  # the others run in a transaction
        c.commit()
    c.close()


@pytest.fixture
def mixed(tmp_path, pg_db, my_db):
    names = ["s1", "pg", "my"]
    (tmp_path / "s1.db").touch()
    urls = {"s1": f"sqlite:///{tmp_path / 's1.db'}", "pg": pg_db, "my": my_db}
    for s, ph in zip(names, ("?", "%s", "%s")):
        _fill(urls[s], DDL[s], ph)
    assert list(urls) == names
    path = write_topology(tmp_path / "topology.yml", urls)
    api.init(load_topology(path))
    return path, urls


def test_mixed_cluster_converged_diverged_repaired(spark, mixed):
    topo, urls = mixed
    res = verify(topo, spark=spark, partitions=2)
    t = res.tables["items"]
    assert res.converged, t.counts
    assert t.rows == {"s1": ROWS, "pg": ROWS, "my": ROWS}
    assert len(set(t.fingerprints.values())) == 1  # int/bigint/int and real/float8/double hash alike
    cs = verify(topo, spark=spark, checksum_only=True, buckets=8).tables["items"]
    assert cs.converged and cs.fingerprints == t.fingerprints

    # per row: a change on its way explains its own row, not another one (the waiting identities
    # are read from PostgreSQL's change log and MariaDB's snapshot)
    c = client(urls["pg"])
    c.cursor().execute("UPDATE items SET qty = 555 WHERE id = 5")  # captured at pg
    c.commit()
    c.close()
    api.refresh(load_topology(topo), "my", "pg", reconcile_=False)  # pulled by my, not applied; s1 has not pulled it
    t = verify(topo, spark=spark).tables["items"]
    assert (t.status, t.differing, t.unexplained) == ("converging", 1, 0)
    with uncaptured(urls["pg"]) as c:
        c.execute("UPDATE items SET qty = 1000, price = 0.5 WHERE id = 3")
    t = verify(topo, spark=spark).tables["items"]
    assert (t.status, t.differing, t.unexplained) == ("diverged", 2, 1)
    assert {x.rid: x.waiting for x in t.samples} == {base_rid(3): False, base_rid(5): True}
    api.reconcile(load_topology(topo), "my")  # what was pulled without reconciling is applied by reconcile
    for _ in range(3):  # row 5 lands everywhere; row 3 stays as it is
        api.refresh(load_topology(topo))
    t = verify(topo, spark=spark).tables["items"]
    assert (t.status, t.differing, t.unexplained, t.samples[0].rid) == ("diverged", 1, 1, base_rid(3))
    logs = {s: _log_count(urls[s], s) for s in ("pg", "my")}

    with uncaptured(urls["my"]) as c:
        c.execute("DELETE FROM items WHERE id = 4")
        c.execute("DELETE FROM _mm_shadow_items WHERE `key` = 4")
    res = verify(topo, spark=spark)
    t = res.tables["items"]
    assert t.status == "diverged"
    assert t.counts["values"] == {"s1": 0, "pg": 1, "my": 0}
    assert t.counts["missing"] == {"s1": 0, "pg": 0, "my": 1}
    assert t.columns == {"qty": 1, "price": 1}

    plan = plan_repair(topo, "s1", spark=spark)
    assert plan.counts() == {
        "pg": {"items": {"delete": 0, "insert": 0, "rekey": 0, "update": 1}},
        "my": {"items": {"delete": 0, "insert": 1, "rekey": 0, "update": 0}},
    }
    apply_plan(topo, plan)
    assert verify(topo, spark=spark).converged
    for s in ("pg", "my"):  # neither the divergence nor the repair was captured
        assert _log_count(urls[s], s) == logs[s], s


def _log_count(url: str, site: str) -> int:
    c = client(url)
    try:
        cur = c.cursor()
        cur.execute("SELECT count(*) FROM _mm._mm_log_items" if site == "pg" else "SELECT count(*) FROM _mm_log_items")
        return int(cur.fetchone()[0])
    finally:
        c.close()


#: a NUMERIC column at every site; SQLite's refuses the name 'boom' (to make its repair fail)
DECIMAL_DDL = {
    "lite": "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT CHECK (name <> 'boom'), price NUMERIC(10,2))",
    "pg": "CREATE TABLE items(id BIGINT PRIMARY KEY, name VARCHAR(100), price NUMERIC(10,2))",
    "my": "CREATE TABLE items(id INT PRIMARY KEY, name VARCHAR(100), price DECIMAL(10,2))",
}


def _rows_at(url: str) -> list[tuple[Any, ...]]:
    c = client(url)
    try:
        cur = c.cursor()
        cur.execute("SELECT id, name, price FROM items ORDER BY id")
        return [(int(i), n, Decimal(str(p))) for i, n, p in cur.fetchall()]
    finally:
        c.close()


def test_repair_from_a_server_converts_decimals_for_sqlite_and_reports_each_site(spark, tmp_path, pg_db, my_db):
    """`verify --repair-from pg --apply` writes PostgreSQL's decimals at a SQLite site as its
    dialect's value adapter does (before: sqlite3 cannot bind Decimal, exit 2, the SQLite row left
    tampered, and "Applied" printed before anything was). Each site is repaired in one transaction:
    one that fails is rolled back whole, named, and the others are repaired all the same (exit 2)."""
    (tmp_path / "lite.db").touch()
    urls = {"lite": f"sqlite:///{tmp_path / 'lite.db'}", "pg": pg_db, "my": my_db}
    for s, ph in zip(urls, ("?", "%s", "%s")):
        c = client(urls[s])
        c.cursor().execute(DECIMAL_DDL[s])
        c.cursor().executemany(
            f"INSERT INTO items (id, name, price) VALUES ({ph}, {ph}, {ph})",
            [(i, f"n{i}", f"{i * 1.25:.2f}") for i in range(1, 6)],
        )
        if s != "lite":
            c.commit()
        c.close()
    topo = write_topology(tmp_path / "topology.yml", urls)
    api.init(load_topology(topo))
    good = _rows_at(urls["pg"])
    for s in ("lite", "my"):
        with uncaptured(urls[s]) as c:
            c.execute("UPDATE items SET name = 'tampered', price = 9.99 WHERE id = 2")
    runner = CliRunner()
    r = runner.invoke(app, ["verify", "-t", str(topo), "--repair-from", "pg", "--apply"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.index("Repair from 'pg': plan, applying it now") < out.index("Repair from 'pg': applied") < out.index("After")
    assert "Applied" not in out and "CONVERGED" in out
    assert _rows_at(urls["lite"]) == _rows_at(urls["my"]) == good

    # the SQLite site refuses a value of the reference: its repair fails whole, MariaDB's is done
    with uncaptured(urls["pg"]) as c:
        c.execute("UPDATE items SET name = 'boom' WHERE id = 4")
    for s in ("lite", "my"):
        with uncaptured(urls[s]) as c:
            c.execute("UPDATE items SET price = 0.01 WHERE id = 1")
    lite_before, good = _rows_at(urls["lite"]), _rows_at(urls["pg"])
    r = runner.invoke(app, ["verify", "-t", str(topo), "--repair-from", "pg", "--apply", "--json"])
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    assert doc["repair"]["applied"] is False
    lite, my = doc["repair"]["sites"]["lite"], doc["repair"]["sites"]["my"]
    assert (lite["status"], my["status"]) == ("failed", "applied")
    assert "CHECK constraint failed" in lite["error"] and my["error"] is None
    assert my["counts"] == {"items": {"delete": 0, "insert": 0, "rekey": 0, "update": 2}}
    assert "repair from 'pg' failed at site 'lite'" in r.stderr and "CHECK constraint failed" in r.stderr
    assert "repaired: 'my'" in r.stderr
    assert _rows_at(urls["my"]) == good
    assert _rows_at(urls["lite"]) == lite_before  # one transaction: row 1 is not repaired either
    assert doc["after"]["tables"]["items"]["status"] == "diverged"


#: a JSON column at every site, as each database declares it
JSON_DDL = {
    "s1": "CREATE TABLE docs(id INTEGER PRIMARY KEY, doc JSON)",
    "pg": "CREATE TABLE docs(id BIGINT PRIMARY KEY, doc JSONB)",
    "my": "CREATE TABLE docs(id INT PRIMARY KEY, doc JSON)",
}


def test_json_is_compared_by_value_not_spelling(spark, tmp_path, pg_db, my_db):  # type: ignore[no-untyped-def]
    """PostgreSQL's jsonb spells an object with its keys in its own order and no 1.50; SQLite and
    MariaDB keep the text an application wrote. Before: the same value replicated everywhere was
    reported diverged at PostgreSQL (explorer, session 34). A different value still is."""
    (tmp_path / "s1.db").touch()
    urls = {"s1": f"sqlite:///{tmp_path / 's1.db'}", "pg": pg_db, "my": my_db}
    for s, ddl in JSON_DDL.items():
        c = client(urls[s])
        c.cursor().execute(ddl)
        if not isinstance(c, sqlite3.Connection):
            c.commit()
        c.close()
    path = write_topology(tmp_path / "topology.yml", urls, tables={"docs": {"key": "id"}})
    api.init(load_topology(path))
    c = client(urls["s1"])
    c.executemany(
        "INSERT INTO docs (id, doc) VALUES (?, ?)",
        [(1, '{"b": 1, "a": [1.50, {"d": "x", "c": null}]}'), (2, '"just a string"'), (3, "null"), (4, None)],
    )
    c.commit()
    c.close()
    for _ in range(3):
        api.refresh(load_topology(path))
    c = client(urls["pg"])
    cur = c.cursor()
    cur.execute("SELECT doc::text FROM docs WHERE id = 1")
    assert cur.fetchone()[0] != '{"b": 1, "a": [1.50, {"d": "x", "c": null}]}'  # jsonb spelled it its own way
    c.close()
    t = verify(path, spark=spark).tables["docs"]
    assert (t.status, t.differing) == ("converged", 0), t.samples
    with uncaptured(urls["my"]) as c:
        c.execute("""UPDATE docs SET doc = '{"a": [1.5, {"c": null, "d": "y"}], "b": 1}' WHERE id = 1""")
        c.execute("UPDATE docs SET doc = NULL WHERE id = 3")  # JSON null is not SQL NULL
    t = verify(path, spark=spark).tables["docs"]
    assert (t.status, t.differing) == ("diverged", 2)
    assert t.columns == {"doc": 2}
