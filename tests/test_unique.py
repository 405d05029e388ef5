"""Secondary UNIQUE constraints (docs/unique.md): two sites writing the same value of a UNIQUE set
never block replication; the earliest claim holds the value, the other row is marked, every site
ends the same whatever the delivery order, and the conflict log says so. Applications write with
plain clients (sqlite3, psycopg, PyMySQL)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, TestCluster, make_cluster, mm

from multimaster import api
from multimaster.errors import SchemaError

USERS: dict[str, dict[str, Any]] = {
    "users": {"key": "id", "columns": {"email": "varchar(100)", "name": "varchar(40)", "tenant": "int", "code": "varchar(40)"}}
}


def _q(cl: TestCluster) -> str:
    return "`" if cl.backend.name == "mysql" else '"'


def _cluster(backend: Backend, tmp_path: Any, indexes: list[str], config: dict[str, Any] | None = None) -> TestCluster:
    """Two sites with `users`, the UNIQUE indexes `indexes` (SQL column lists) created by the
    application before init."""
    tables = {"users": dict(USERS["users"], config=config or {})}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], tables, init=False)
    for site in cl.urls:
        for n, cols in enumerate(indexes):
            cl.execute(site, f"CREATE UNIQUE INDEX ux{n} ON users ({cols})")
    api.init(cl.topo)
    return cl


def _emails(cl: TestCluster, site: str) -> dict[str, Any]:
    return {r[2]: r[1] for r in cl.rows(site, "users")}  # name -> email


def _unique_conflicts(cl: TestCluster, site: str) -> list[dict[str, Any]]:
    return [r for r in api.conflicts(cl.topo, site) if r["kind"] == "unique"]


@pytest.mark.parametrize("first", ["s1", "s2"])
def test_same_email_at_two_sites_converges_in_both_orders(backend: Backend, tmp_path: Any, first: str) -> None:
    cl = _cluster(backend, tmp_path, ["email"])
    cl.execute("s1", "INSERT INTO users (email, name) VALUES ('a@x', 'ann')")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")  # later: loses
    other = "s2" if first == "s1" else "s1"
    cl.refresh(first, other)
    cl.refresh(other, first)
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2"):
        e = _emails(cl, s)
        assert e["ann"] == "a@x"
        assert e["bob"].startswith("a@x~s2~")
        log = _unique_conflicts(cl, s)
        assert [(r["decision"], r["slot"], r["remote_values"]) for r in log] == [("marked", "email", {"email": "a@x"})]
    # later, unrelated changes still flow both ways
    cl.execute("s1", "UPDATE users SET name = 'ann2' WHERE email = 'a@x'")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('c@x', 'cid')")
    cl.execute("s2", "UPDATE users SET name = 'bob2' WHERE name = 'bob'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert set(_emails(cl, "s1")) == {"ann2", "bob2", "cid"}


def test_released_value_is_regained_at_every_site(backend: Backend, tmp_path: Any) -> None:
    cl = _cluster(backend, tmp_path, ["email"])
    cl.execute("s1", "INSERT INTO users (email, name) VALUES ('a@x', 'ann')")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('b@x', 'bea')")
    cl.execute("s1", "INSERT INTO users (email, name) VALUES ('b@x', 'ben')")  # later: loses to bea
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _emails(cl, "s1")["bob"].startswith("a@x~") and _emails(cl, "s1")["ben"].startswith("b@x~")
    # the holder of a@x changes it (at its own site), the holder of b@x is deleted (at the other)
    cl.execute("s1", "UPDATE users SET email = 'z@x' WHERE name = 'ann'")
    cl.execute("s1", "DELETE FROM users WHERE name = 'bea'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2"):
        e = _emails(cl, s)
        assert (e["ann"], e["bob"], e["ben"]) == ("z@x", "a@x", "b@x")
        assert sorted((r["decision"], r["remote_values"]["email"]) for r in _unique_conflicts(cl, s)) == [
            ("marked", "a@x"),
            ("marked", "b@x"),
            ("regained", "a@x"),
            ("regained", "b@x"),
        ]


def test_loser_changing_its_own_value_ends_its_mark(backend: Backend, tmp_path: Any) -> None:
    cl = _cluster(backend, tmp_path, ["email"])
    cl.execute("s1", "INSERT INTO users (email, name) VALUES ('a@x', 'ann')")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")
    cl.refresh_until_quiet()
    # at its own site, an application updates the marked row: other columns, then the UNIQUE one
    cl.execute("s2", "UPDATE users SET name = 'bobby' WHERE name = 'bob'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _emails(cl, "s1")["bobby"].startswith("a@x~")
    cl.execute("s2", "UPDATE users SET email = 'b@x' WHERE name = 'bobby'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    # the holder releasing a@x later gives it to nobody: bobby's mark ended with its own change
    cl.execute("s1", "DELETE FROM users WHERE name = 'ann'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _emails(cl, "s2") == {"bobby": "b@x"}


def test_multi_column_unique(backend: Backend, tmp_path: Any) -> None:
    cl = _cluster(backend, tmp_path, ["tenant, code"])
    cl.execute("s1", "INSERT INTO users (tenant, code, name) VALUES (1, 'k', 'ann')")
    cl.execute("s2", "INSERT INTO users (tenant, code, name) VALUES (1, 'k', 'bob')")
    cl.execute("s2", "INSERT INTO users (tenant, code, name) VALUES (2, 'k', 'cid')")  # other tenant: no collision
    cl.execute("s2", "INSERT INTO users (tenant, code, name) VALUES (3, 'q', 'dan')")
    cl.refresh_until_quiet()
    # concurrently, s1 inserts (4, q) and s2 moves dan to tenant 4, an update of the other
    # column of the set: eve's claim is the earlier
    cl.execute("s1", "INSERT INTO users (tenant, code, name) VALUES (4, 'q', 'eve')")
    cl.execute("s2", "UPDATE users SET tenant = 4 WHERE name = 'dan'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    rows = {r[2]: (r[3], r[4]) for r in cl.rows("s1", "users")}  # name -> (tenant, code)
    assert rows["ann"] == (1, "k") and rows["cid"] == (2, "k") and rows["eve"] == (4, "q")
    assert rows["bob"][0] == 1 and rows["bob"][1].startswith("k~s2~")
    assert rows["dan"][0] == 4 and rows["dan"][1].startswith("q~s2~")
    assert {r["slot"] for r in _unique_conflicts(cl, "s1")} == {"code+tenant"}


def test_null_policy(backend: Backend, tmp_path: Any) -> None:
    cl = _cluster(backend, tmp_path, ["email"], {"unique": {"email": "null"}})
    cl.execute("s1", "INSERT INTO users (email, name) VALUES ('a@x', 'ann')")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _emails(cl, "s2") == {"ann": "a@x", "bob": None}
    assert [r["policy"] for r in _unique_conflicts(cl, "s2")] == ["null"]
    cl.execute("s2", "DELETE FROM users WHERE name = 'ann'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _emails(cl, "s1") == {"bob": "a@x"}


def test_init_refuses_a_partial_or_expression_index(sqlite_backend: Backend, tmp_path: Any) -> None:
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], USERS, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_live ON users (email) WHERE tenant > 0")
        cl.execute(s, "CREATE UNIQUE INDEX ux_lower ON users (lower(name))")
    with pytest.raises(SchemaError) as e:
        api.init(cl.topo)
    msg = str(e.value)
    assert "'ux_live' is a partial index" in msg and "'ux_lower' is an expression index" in msg


def test_topology_unique_names_a_set_the_table_lacks(sqlite_backend: Backend, tmp_path: Any) -> None:
    cl = make_cluster(
        sqlite_backend,
        tmp_path,
        ["s1", "s2"],
        dict(USERS, users=dict(USERS["users"], config={"unique": {"name": "null"}})),
        init=False,
    )
    with pytest.raises(SchemaError) as e:
        api.init(cl.topo)
    assert "tables.users.unique.name: no UNIQUE set" in str(e.value)


def test_cli_init_refresh_and_conflicts_show_the_mark(tmp_path: Any) -> None:
    """As a user runs it: sqlite3 writes, the `multimaster` command replicates and lists."""
    import json
    import sqlite3
    import subprocess

    import yaml

    cli = str(Path(sys.executable).parent / "multimaster")
    for s in ("s1", "s2"):
        with sqlite3.connect(tmp_path / f"{s}.db") as c:
            c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT UNIQUE, name TEXT)")
    topo = tmp_path / "topology.yaml"
    doc = {
        "sites": {s: {"url": f"sqlite:///{tmp_path / (s + '.db')}"} for s in ("s1", "s2")},
        "tables": {"users": {"key": "id", "unique": {"email": "suffix"}}},
        "links": "mesh",
    }
    topo.write_text(yaml.safe_dump(doc))

    def mm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, *args], capture_output=True, text=True, timeout=120)

    assert mm("init", "-t", str(topo)).returncode == 0
    for s, name in (("s1", "ann"), ("s2", "bob")):
        with sqlite3.connect(tmp_path / f"{s}.db") as c:
            c.execute("INSERT INTO users (email, name) VALUES ('a@x', ?)", (name,))
    for _ in range(2):
        r = mm("refresh", "-t", str(topo))
        assert r.returncode == 0, r.stderr
    r = mm("conflicts", "-t", str(topo), "--site", "s1", "--kind", "unique", "--json")
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert (row["kind"], row["slot"], row["decision"], row["rule"]) == ("unique", "email", "marked", "suffix")
    assert row["remote_values"] == {"email": "a@x"} and row["remote_row"]["email"].startswith("a@x~s2~")
    for s in ("s1", "s2"):
        with sqlite3.connect(tmp_path / f"{s}.db") as c:
            assert [r[0] for r in c.execute("SELECT email FROM users ORDER BY name")][0] == "a@x"
    # a bad policy in the topology file: named, with the fix, non-zero exit
    doc["tables"]["users"]["unique"] = {"email": "newest"}
    topo.write_text(yaml.safe_dump(doc))
    r = mm("status", "-t", str(topo))
    assert (
        r.returncode != 0 and "tables.users.unique.email: unknown policy 'newest'; use one of suffix, null" in r.stdout + r.stderr
    )


def test_mixed_cluster(tmp_path: Any) -> None:
    """SQLite, PostgreSQL and MariaDB in one cluster: each inserts the same email."""
    import yaml
    from clusters import BACKENDS, server_unavailable

    from multimaster.config.topology import load_topology

    backends: dict[str, Backend] = {}
    try:
        for n in ("sqlite", "postgresql", "mysql"):
            try:
                backends[n] = BACKENDS[n]()
            except ConnectionError as e:
                server_unavailable(n, str(e))
        urls = {}
        for site, n in (("lite", "sqlite"), ("pg", "postgresql"), ("maria", "mysql")):
            urls[site] = backends[n].new_site(tmp_path, site)
            # MariaDB: a binary collation, as PostgreSQL and SQLite compare (docs/mysql.md "Collations")
            email = "varchar(100) COLLATE utf8mb4_bin" if n == "mysql" else "varchar(100)"
            backends[n].create_table(urls[site], "users", "id", {"email": email, "name": "varchar(40)"})
            c = backends[n].connect(urls[site])
            c.cursor().execute("CREATE UNIQUE INDEX ux_email ON users (email)")
            c.commit()
            c.close()
        doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"users": {"key": "id"}}, "links": "mesh"}
        (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
        cl = TestCluster(
            backends["sqlite"],
            load_topology(tmp_path / "topology.yaml"),
            urls,
            {"users": {"key": "id", "columns": {"email": "", "name": ""}}},
        )
        api.init(cl.topo)

        def run(site: str, sql: str) -> None:
            b = backends[{"lite": "sqlite", "pg": "postgresql", "maria": "mysql"}[site]]
            c = b.connect(urls[site])
            c.cursor().execute(sql)
            c.commit()
            c.close()

        def table(site: str) -> dict[str, Any]:
            b = backends[{"lite": "sqlite", "pg": "postgresql", "maria": "mysql"}[site]]
            c = b.connect(urls[site])
            cur = c.cursor()
            cur.execute("SELECT name, email FROM users")
            out = dict(cur.fetchall())
            c.close()
            return out

        for site in ("pg", "lite", "maria"):  # pg's insert is the earliest claim
            run(site, f"INSERT INTO users (email, name) VALUES ('a@x', '{site}')")
            time.sleep(0.005)  # distinct milliseconds: in one, the site with the lower sub-millisecond count wins
        cl.refresh_until_quiet()
        got = {s: table(s) for s in urls}
        assert got["lite"] == got["pg"] == got["maria"]
        assert (
            got["pg"]["pg"] == "a@x" and got["pg"]["lite"].startswith("a@x~lite~") and got["pg"]["maria"].startswith("a@x~maria~")
        )
        run("maria", "DELETE FROM users WHERE name = 'pg'")  # released: lite's claim is the next
        cl.refresh_until_quiet()
        got = {s: table(s) for s in urls}
        assert got["lite"] == got["pg"] == got["maria"]
        assert got["pg"]["lite"] == "a@x" and got["pg"]["maria"].startswith("a@x~maria~")
    finally:
        for b in backends.values():
            b.cleanup()


def test_added_site_keeps_what_marked_rows_want(backend: Backend, tmp_path: Any) -> None:
    """add-site copies the remembered values: a value released later is regained at the new site too."""
    import yaml

    from multimaster.config.topology import load_topology
    from multimaster.ops.instantiate import add_site

    cl = _cluster(backend, tmp_path, ["email"])
    cl.execute("s1", "INSERT INTO users (email, name) VALUES ('a@x', 'ann')")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")
    cl.refresh_until_quiet()
    url = cl.backend.new_site(tmp_path, "s3")
    cl.backend.create_table(url, "users", "id", USERS["users"]["columns"])
    c = cl.backend.connect(url)
    c.cursor().execute("CREATE UNIQUE INDEX ux0 ON users (email)")
    c.commit()
    c.close()
    doc = yaml.safe_load(open(cl.topo.path).read())
    doc["sites"]["s3"] = {"url": url}
    (tmp_path / "grown.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    big = TestCluster(cl.backend, load_topology(tmp_path / "grown.yaml"), {**cl.urls, "s3": url}, cl.tables)
    add_site(big.topo, "s3", "s2")
    big.refresh_until_quiet()
    big.assert_converged()
    big.execute("s1", "DELETE FROM users WHERE name = 'ann'")
    big.refresh_until_quiet()
    big.assert_converged()
    assert _emails(big, "s3") == {"bob": "a@x"}


def test_natural_key_table(backend: Backend, tmp_path: Any) -> None:
    tables = {"people": {"key": "code", "auto": False, "columns": {"email": "varchar(100)", "name": "varchar(40)"}}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], tables, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_people ON people (email)")
    api.init(cl.topo)
    cl.execute("s1", "INSERT INTO people (code, email, name) VALUES ('p1', 'a@x', 'ann')")
    cl.execute("s2", "INSERT INTO people (code, email, name) VALUES ('p2', 'a@x', 'bob')")
    cl.refresh_until_quiet()
    cl.assert_converged()
    rows = {r[0]: r[1] for r in cl.rows("s1", "people")}
    assert rows["p1"] == "a@x" and rows["p2"].startswith("a@x~k~")
    cl.execute("s2", "UPDATE people SET email = 'b@x' WHERE code = 'p1'")  # the holder moves, at the loser's site
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert {r[0]: r[1] for r in cl.rows("s2", "people")} == {"p1": "b@x", "p2": "a@x"}


def test_applications_writing_while_refreshing(backend: Backend, tmp_path: Any) -> None:
    """Applications at both sites insert and update emails from a small domain (their own
    database refuses a value it holds: they carry on) while a refresher loops; the sites converge
    and every row is there once."""
    import random
    import threading

    cl = _cluster(backend, tmp_path, ["email"])
    done: dict[str, int] = {"s1": 0, "s2": 0}

    def app(site: str) -> None:
        rnd = random.Random(site)
        for i in range(40):
            try:
                if i % 3 == 2:
                    cl.execute(
                        site,
                        "UPDATE users SET email = ? WHERE name = ?",
                        (f"e{rnd.randrange(12)}@x", f"{site}-{rnd.randrange(i)}"),
                    )
                else:
                    cl.execute(site, "INSERT INTO users (email, name) VALUES (?, ?)", (f"e{rnd.randrange(12)}@x", f"{site}-{i}"))
                    done[site] += 1
            except Exception as e:  # noqa: BLE001 - the application's own UNIQUE violation
                if "unique" in str(e).lower() or "duplicate" in str(e).lower():
                    continue
                if "deadlock" in str(e).lower():  # MariaDB rolled it back (against the reconciler): carry on
                    continue
                app_errors.append(e)
                return

    app_errors: list[BaseException] = []
    errors = cl.run_while_refreshing([threading.Thread(target=app, args=(s,)) for s in ("s1", "s2")])
    assert not errors, errors
    assert not app_errors, app_errors
    cl.refresh_until_quiet()
    cl.assert_converged()
    rows = cl.rows("s1", "users")
    assert len(rows) == done["s1"] + done["s2"]
    plain = [r[1] for r in rows if r[1] is not None and "~" not in r[1]]
    assert len(plain) == len(set(plain))


def test_star_hub_relays_the_values_changes_carried(sqlite_backend: Backend, tmp_path: Any) -> None:
    """The hub marks a colliding insert for itself but relays it as it came: the leaves decide
    themselves, and regain the value when it is released."""
    cl = make_cluster(sqlite_backend, tmp_path, ["h", "a", "b"], USERS, links={"star": "h"}, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux0 ON users (email)")
    api.init(cl.topo)
    cl.execute("a", "INSERT INTO users (email, name) VALUES ('a@x', 'ann')")
    cl.execute("b", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")
    cl.refresh("h")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _emails(cl, "a")["bob"].startswith("a@x~b~")
    cl.execute("b", "DELETE FROM users WHERE name = 'ann'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _emails(cl, "a") == {"bob": "a@x"}


def test_a_site_installed_before_its_unique_constraint_is_told_to_init(sqlite_backend: Backend, tmp_path: Any) -> None:
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], USERS)
    for s in cl.urls:  # the application adds a UNIQUE constraint after init
        cl.execute(s, "CREATE UNIQUE INDEX ux0 ON users (email)")
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")
    errors = [r.error for r in api.refresh(cl.topo, "s1") if r.error]
    assert errors and "_mm_unique_users" in errors[0] and "multimaster init" in errors[0]
    api.init(cl.topo)
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_init_refuses_sets_it_cannot_mark(sqlite_backend: Backend, tmp_path: Any) -> None:
    tables = {
        "t": {
            "key": "id",
            "columns": {
                "n": "int NOT NULL",
                "email": "varchar(100)",
                "name": "varchar(10)",
                "m": "int",
                "note": "text",
                "code": "varchar(8) NOT NULL",
            },
        }
    }
    tables["t"]["config"] = {
        "groups": {"contact": {"columns": ["email", "note"]}},
        "unique": {"name": "suffix", "n": "null", "code": "suffix"},
    }
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], tables, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_n ON t (n)")  # an int NOT NULL: 'null' cannot mark it (park would)
        cl.execute(s, "CREATE UNIQUE INDEX ux_e ON t (email)")  # its mark column is in a group
        cl.execute(s, "CREATE UNIQUE INDEX ux_name ON t (name)")  # 10 characters: too short for a suffix
        cl.execute(s, "CREATE UNIQUE INDEX ux_m ON t (m)")  # an int, nullable: null by default, fine
        cl.execute(s, "CREATE UNIQUE INDEX ux_code ON t (code)")  # too short, and NOT NULL: park, not null
    with pytest.raises(SchemaError) as e:
        api.init(cl.topo)
    msg = str(e.value)
    assert "UNIQUE (n) has no nullable column for policy 'null'" in msg
    assert "column 'email' marks the rows losing UNIQUE (email) and cannot be in a column group" in msg
    assert (
        "column 'name' (VARCHAR(10)) is too short for a suffix mark (24 characters at least); set tables.t.unique.name: null,"
        in msg
    )
    assert (
        "column 'code' (VARCHAR(8)) is too short for a suffix mark (24 characters at least); set tables.t.unique.code: park "
        in msg
    )
    assert "(m)" not in msg


def test_colliding_changes_in_one_batch(backend: Backend, tmp_path: Any) -> None:
    """s3 pulls both peers without reconciling, then reconciles once: the two inserts of a@x are
    candidates of the same batch (and s3 holds a@x itself, claimed last)."""
    tables = {"users": dict(USERS["users"])}
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], tables, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux0 ON users (email)")
    api.init(cl.topo)
    # in this order: a version is the wall clock's millisecond (and a counter within it), so two
    # sites inserting in the same millisecond tie and the site name decides; the sleeps keep the
    # three inserts in distinct milliseconds (a loaded machine ran s2's and s1's in one)
    cl.execute("s2", "INSERT INTO users (email, name) VALUES ('a@x', 'bob')")
    time.sleep(0.005)
    cl.execute("s1", "INSERT INTO users (email, name) VALUES ('a@x', 'ann')")
    time.sleep(0.005)
    cl.execute("s3", "INSERT INTO users (email, name) VALUES ('a@x', 'cid')")
    cl.refresh("s3", reconcile_=False)
    api.reconcile(cl.topo, "s3")
    e = _emails(cl, "s3")
    assert e["bob"] == "a@x" and e["ann"].startswith("a@x~s1~") and e["cid"].startswith("a@x~s3~")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert sorted(r["rid"] for r in _unique_conflicts(cl, "s3")) == sorted(r["rid"] for r in _unique_conflicts(cl, "s1"))


# ---- policy park: a set with no column to mark (sku INTEGER NOT NULL) --------------------------

STOCK: dict[str, dict[str, Any]] = {"stock": {"key": "id", "columns": {"sku": "int NOT NULL", "name": "varchar(40)"}}}


def _stock(cl: TestCluster, site: str) -> dict[str, int]:
    return {r[2]: r[1] for r in cl.rows(site, "stock")}  # name -> sku


def _park_cluster(backend: Backend, tmp_path: Any) -> tuple[TestCluster, str]:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, init=False)
    for site in cl.urls:
        cl.execute(site, "CREATE UNIQUE INDEX ux_sku ON stock (sku)")
    api.init(cl.topo)
    topo = str(tmp_path / "topology.yaml")
    return cl, topo


def _parked(topo: str) -> list[dict[str, Any]]:
    r = mm("errors", "-t", topo, "--json")
    rows = json.loads(r.stdout)
    # exit 1 while a change is held, a parked row too (docs/cli.md "Exit codes"), 0 when none is
    assert r.returncode == (1 if any(e["state"] in ("failed", "waiting", "txn", "parked") for e in rows) else 0), r.stderr
    return [e for e in rows if e["state"] == "parked"]


def _collide(cl: TestCluster, first: str) -> None:
    cl.execute("s1", "INSERT INTO stock (sku, name) VALUES (7, 'ann')")  # the earlier claim: holds 7
    cl.execute("s2", "INSERT INTO stock (sku, name) VALUES (7, 'bob')")
    other = "s2" if first == "s1" else "s1"
    cl.refresh(first, other)
    cl.refresh(other, first)
    cl.refresh_until_quiet()


@pytest.mark.parametrize("first", ["s1", "s2"])
def test_park_same_sku_at_two_sites_one_row_the_other_parked_then_returns(backend: Backend, tmp_path: Any, first: str) -> None:
    cl, topo = _park_cluster(backend, tmp_path)
    _collide(cl, first)
    cl.assert_converged()
    for s in ("s1", "s2"):
        assert _stock(cl, s) == {"ann": 7}
    parked = _parked(topo)
    assert sorted(p["site"] for p in parked) == ["s1", "s2"]
    for p in parked:
        assert p["table"] == "stock" and p["op"] == "P"
        assert p["change"]["values"] == {"name": "bob", "sku": 7} and p["change"]["unique"] == "sku"
        assert "sku=7" in p["error"] and p["change"]["holder"] in p["error"]
    table = mm("errors", "-t", topo)
    assert table.returncode == 1 and "parked" in table.stdout and "holder's value" in table.stdout, table.stdout
    st = mm("status", "-t", topo)
    assert st.returncode == 1 and "multimaster errors" in st.stderr, st.stderr
    # the holder changes its sku: the parked row comes back at every site
    cl.execute("s1", "UPDATE stock SET sku = 8 WHERE name = 'ann'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2"):
        assert _stock(cl, s) == {"ann": 8, "bob": 7}
        log = [(r["decision"], r["slot"]) for r in _unique_conflicts(cl, s)]
        assert sorted(log) == [("parked", "sku"), ("returned", "sku")], log
    assert _parked(topo) == []
    assert mm("status", "-t", topo).returncode == 0


def test_park_update_of_a_parked_row_from_its_origin_survives_its_return(backend: Backend, tmp_path: Any) -> None:
    cl, topo = _park_cluster(backend, tmp_path)
    cl.execute("s1", "INSERT INTO stock (sku, name) VALUES (7, 'ann')")
    cl.execute("s2", "INSERT INTO stock (sku, name) VALUES (7, 'bob')")
    cl.refresh("s1")  # s1 parks bob
    assert _stock(cl, "s1") == {"ann": 7}
    # at its origin (which has not heard of ann yet) bob's other column changes: s1 keeps it for bob
    cl.execute("s2", "UPDATE stock SET name = 'bobby' WHERE sku = 7")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _stock(cl, "s2") == {"ann": 7}
    assert {p["change"]["values"]["name"] for p in _parked(topo)} == {"bobby"}
    cl.execute("s2", "DELETE FROM stock WHERE name = 'ann'")  # the holder is deleted: bobby returns
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2"):
        assert _stock(cl, s) == {"bobby": 7}
    assert _parked(topo) == []


def test_park_colliding_inserts_in_one_batch(backend: Backend, tmp_path: Any) -> None:
    """s3 pulls both peers without reconciling, then reconciles once: two inserts of sku 7 are
    candidates of the same batch, and s3 holds 7 itself (claimed last)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_sku ON stock (sku)")
    api.init(cl.topo)
    # the claims' order is their versions' (each site's clock): apart by more than a millisecond,
    # as under load two sites' inserts in one millisecond could sort either way
    cl.execute("s2", "INSERT INTO stock (sku, name) VALUES (7, 'bob')")
    time.sleep(0.01)
    cl.execute("s1", "INSERT INTO stock (sku, name) VALUES (7, 'ann')")
    time.sleep(0.01)
    cl.execute("s3", "INSERT INTO stock (sku, name) VALUES (7, 'cid')")
    cl.refresh("s3", reconcile_=False)
    api.reconcile(cl.topo, "s3")
    assert _stock(cl, "s3") == {"bob": 7}
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _stock(cl, "s1") == {"bob": 7}
    # bob leaves 7: the earliest remaining claim (ann) returns, cid stays parked behind it
    cl.execute("s2", "UPDATE stock SET sku = 9 WHERE name = 'bob'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2", "s3"):
        assert _stock(cl, s) == {"bob": 9, "ann": 7}
    assert sorted(p["site"] for p in _parked(str(tmp_path / "topology.yaml"))) == ["s1", "s2", "s3"]


def test_park_skip_deletes_the_parked_row_at_every_site(backend: Backend, tmp_path: Any) -> None:
    cl, topo = _park_cluster(backend, tmp_path)
    _collide(cl, "s1")
    (bob,) = [p for p in _parked(topo) if p["site"] == "s1"]
    r = mm("errors", "skip", "-t", topo, "--site", "s1", "--id", str(bob["id"]), "--reason", "duplicate of ann")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _stock(cl, "s1") == {"ann": 7}  # the holder stays
    # the skip is a delete of bob's identity, replicated: s2 drops its parked bob too
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _parked(topo) == []
    skipped = [e for e in json.loads(mm("errors", "-t", topo, "--all", "--json").stdout) if e["state"] == "skipped"]
    assert [(e["site"], e["reason"]) for e in skipped] == [("s1", "duplicate of ann")]
    assert mm("status", "-t", topo).returncode == 0
    # the value freed later gives it to nobody: bob is gone for good
    cl.execute("s2", "UPDATE stock SET sku = 8 WHERE name = 'ann'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2"):
        assert _stock(cl, s) == {"ann": 8}


def test_park_refused_for_a_table_other_tables_reference(backend: Backend, tmp_path: Any) -> None:
    tables = dict(STOCK)
    # (the foreign key as a table constraint: MariaDB ignores an inline REFERENCES)
    tables["lines"] = {"key": "id", "columns": {"qty": "int", "stock_id": "int, FOREIGN KEY (stock_id) REFERENCES stock (id)"}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], tables, init=False)
    for site in cl.urls:
        cl.execute(site, "CREATE UNIQUE INDEX ux_sku ON stock (sku)")
    with pytest.raises(SchemaError) as e:
        api.init(cl.topo)
    msg = str(e.value)
    assert "table 'lines' references table 'stock' by foreign key" in msg and "policy 'park'" in msg, msg
    assert "suffix or null" in msg and "drop the foreign key" in msg
    # the CLI says so too, with a non-zero exit
    r = mm("init", "-t", str(tmp_path / "topology.yaml"))
    assert r.returncode != 0 and "references table 'stock'" in r.stdout + r.stderr


def test_park_mixed_cluster(tmp_path: Any) -> None:
    """SQLite, PostgreSQL and MariaDB in one cluster, applications on plain clients: each inserts
    sku 7; one row holds it, the two others are parked at every site, listed by `errors`; the
    holder moves to another sku and the earliest remaining claim comes back everywhere."""
    import yaml
    from clusters import BACKENDS, server_unavailable

    from multimaster.config.topology import load_topology

    backends: dict[str, Backend] = {}
    names = {"lite": "sqlite", "pg": "postgresql", "maria": "mysql"}
    try:
        for n in ("sqlite", "postgresql", "mysql"):
            try:
                backends[n] = BACKENDS[n]()
            except ConnectionError as e:
                server_unavailable(n, str(e))
        urls = {}
        for site, n in names.items():
            urls[site] = backends[n].new_site(tmp_path, site)
            backends[n].create_table(urls[site], "stock", "id", {"sku": "int NOT NULL", "name": "varchar(40)"})
            c = backends[n].connect(urls[site])
            c.cursor().execute("CREATE UNIQUE INDEX ux_sku ON stock (sku)")
            c.commit()
            c.close()
        topo = tmp_path / "topology.yaml"
        topo.write_text(yaml.safe_dump({"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"stock": {"key": "id"}}}))
        cl = TestCluster(
            backends["sqlite"], load_topology(topo), urls, {"stock": {"key": "id", "columns": {"sku": "", "name": ""}}}
        )
        r = mm("init", "-t", str(topo))
        assert r.returncode == 0, r.stdout + r.stderr

        def run(site: str, sql: str) -> None:
            c = backends[names[site]].connect(urls[site])
            c.cursor().execute(sql)
            c.commit()
            c.close()

        def table(site: str) -> dict[str, Any]:
            c = backends[names[site]].connect(urls[site])
            cur = c.cursor()
            cur.execute("SELECT name, sku FROM stock")
            out = dict(cur.fetchall())
            c.close()
            return out

        for site in ("pg", "lite", "maria"):  # pg's insert is the earliest claim
            run(site, f"INSERT INTO stock (sku, name) VALUES (7, '{site}')")
            time.sleep(0.005)  # distinct milliseconds (as above)
        cl.refresh_until_quiet()
        assert {s: table(s) for s in urls} == {s: {"pg": 7} for s in urls}
        parked = _parked(str(topo))
        assert sorted((p["site"], p["change"]["values"]["name"]) for p in parked) == sorted(
            (s, n) for s in urls for n in ("lite", "maria")
        )
        assert mm("status", "-t", str(topo)).returncode == 1
        run("maria", "UPDATE stock SET sku = 9 WHERE name = 'pg'")  # released: lite's claim is the next
        cl.refresh_until_quiet()
        assert {s: table(s) for s in urls} == {s: {"pg": 9, "lite": 7} for s in urls}
        assert sorted((p["site"], p["change"]["values"]["name"]) for p in _parked(str(topo))) == [
            (s, "maria") for s in sorted(urls)
        ]
    finally:
        for b in backends.values():
            b.cleanup()


def test_park_added_site_keeps_the_parked_row(backend: Backend, tmp_path: Any) -> None:
    """add-site copies the parked rows: the new site lists its own, and returns it with the others."""
    import yaml

    from multimaster.config.topology import load_topology
    from multimaster.ops.instantiate import add_site

    cl, topo = _park_cluster(backend, tmp_path)
    _collide(cl, "s1")
    url = cl.backend.new_site(tmp_path, "s3")
    cl.backend.create_table(url, "stock", "id", STOCK["stock"]["columns"])
    c = cl.backend.connect(url)
    c.cursor().execute("CREATE UNIQUE INDEX ux_sku ON stock (sku)")
    c.commit()
    c.close()
    doc = yaml.safe_load(open(cl.topo.path).read())
    doc["sites"]["s3"] = {"url": url}
    grown = tmp_path / "grown.yaml"
    grown.write_text(yaml.safe_dump(doc, sort_keys=False))
    big = TestCluster(cl.backend, load_topology(grown), {**cl.urls, "s3": url}, cl.tables)
    add_site(big.topo, "s3", "s2")
    big.refresh_until_quiet()
    big.assert_converged()
    assert sorted(p["site"] for p in _parked(str(grown))) == ["s1", "s2", "s3"]
    big.execute("s3", "UPDATE stock SET sku = 8 WHERE name = 'ann'")
    big.refresh_until_quiet()
    big.assert_converged()
    assert _stock(big, "s3") == {"ann": 8, "bob": 7}
    assert _parked(str(grown)) == []


def test_a_sqlite_text_unique_beside_a_varchar_one_is_refused_with_the_declaration_to_make(tmp_path: Any) -> None:
    """The usual SQLite DDL, `email TEXT UNIQUE`, beside `email VARCHAR(255) UNIQUE` on PostgreSQL:
    init refuses it (a losing row's mark is cut to the column's length, and every site must cut it
    alike) and says what to declare at the SQLite site; declared so, init goes on."""
    import sqlite3

    import yaml
    from clusters import BACKENDS, server_unavailable

    try:
        pg = BACKENDS["postgresql"]()
    except ConnectionError as e:
        server_unavailable("postgresql", str(e))
    try:
        url = pg.new_site(tmp_path, "pg")
        with pg.connect(url) as c:
            c.cursor().execute("CREATE TABLE users (id SERIAL PRIMARY KEY, email VARCHAR(255) UNIQUE, name TEXT)")
            c.commit()
        with sqlite3.connect(tmp_path / "lite.db") as c:
            c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY AUTOINCREMENT, email TEXT UNIQUE, name TEXT)")
        doc = {
            "sites": {"lite": {"url": f"sqlite:///{tmp_path / 'lite.db'}"}, "pg": {"url": url}},
            "tables": {"users": {"key": "id"}},
            "links": "mesh",
        }
        (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
        r = mm("init", "-t", str(tmp_path / "topology.yaml"))
        assert r.returncode == 2, r.stdout + r.stderr
        assert "'lite' declares no length for email: declare it VARCHAR(255) there" in " ".join(r.stderr.split())
        with sqlite3.connect(tmp_path / "lite.db") as c:
            c.execute("DROP TABLE users")
            c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY AUTOINCREMENT, email VARCHAR(255) UNIQUE, name TEXT)")
        r = mm("init", "-t", str(tmp_path / "topology.yaml"))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        pg.cleanup()
