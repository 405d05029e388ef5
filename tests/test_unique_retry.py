"""A held insert that collides on a UNIQUE set (docs/unique.md, docs/errors.md): `errors retry`
applies it through the same UNIQUE rule as a first apply, so the retrying site marks the same row
every other site marked, and the sites converge.

Before (soak of session 36, report D2): a held insert of a renumbered table kept its rank and was
retried with a plain INSERT of its raw values: the database refused the duplicate (1062 on MariaDB,
UniqueViolation on PostgreSQL, IntegrityError on SQLite), the change stayed held, MariaDB's message
blamed "the column's collation ... trailing spaces" for two byte-identical values and advised a
skip, and the skip dropped the whole source transaction at that site while the others kept it, with
status exit 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, TestCluster, make_cluster, mm, query

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.engine.site import Site

USERS = {"key": "id", "columns": {"email": "varchar(100)", "name": "varchar(40)", "qty": "int"}}


def _refuse_negative(cl: TestCluster, site: str) -> None:
    if cl.backend.name == "sqlite":  # SQLite cannot add a CHECK to a table: an application's trigger
        cl.execute(
            site,
            "CREATE TRIGGER qty_ok BEFORE INSERT ON users WHEN NEW.qty < 0 "
            "BEGIN SELECT RAISE(ABORT, 'qty must not be negative'); END",
        )
    else:
        cl.execute(site, "ALTER TABLE users ADD CONSTRAINT qty_ok CHECK (qty >= 0)")


def _allow_negative(cl: TestCluster, site: str) -> None:
    cl.execute(site, "DROP TRIGGER qty_ok" if cl.backend.name == "sqlite" else "ALTER TABLE users DROP CONSTRAINT qty_ok")


def _by_name(cl: TestCluster, site: str) -> dict[str, Any]:
    return {r[2]: r[1] for r in cl.rows(site, "users")}  # name -> email


def _held(topo: str) -> list[dict[str, Any]]:
    r = mm("errors", "-t", topo, "--json")
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: something is held
    return [e for e in json.loads(r.stdout) if e["state"] != "skipped"]


@pytest.mark.parametrize("earlier", ["holder", "held"])
def test_a_held_insert_that_collides_on_a_unique_value_is_marked_or_wins_on_retry(
    backend: Backend, tmp_path: Path, earlier: str
) -> None:
    """s1 holds s2's insert of 'a@x' (its CHECK refuses qty -1) and has its own row of 'a@x'.
    `earlier` says whose claim is earlier: the held row's ('held': on retry it takes the value
    and s1's row is marked, as at s2) or s1's ('holder': the retried row is marked)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], {"users": USERS}, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_email ON users (email)")
    api.init(cl.topo)
    _refuse_negative(cl, "s1")
    if earlier == "held":
        cl.execute("s2", "INSERT INTO users (email, name, qty) VALUES ('a@x', 'bob', -1)")
        cl.execute("s1", "INSERT INTO users (email, name, qty) VALUES ('a@x', 'ann', 1)")
    else:
        cl.execute("s1", "INSERT INTO users (email, name, qty) VALUES ('a@x', 'ann', 1)")
        cl.execute("s2", "INSERT INTO users (email, name, qty) VALUES ('a@x', 'bob', -1)")
    cl.refresh_until_quiet()
    topo = str(cl.topo.path)
    held = _held(topo)
    assert [(e["site"], e["state"], e["op"]) for e in held] == [("s1", "failed", "I")], held
    _allow_negative(cl, "s1")
    r = mm("errors", "retry", "-t", topo, "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _held(topo) == []
    cl.refresh_until_quiet()
    cl.assert_converged()
    winner, loser = ("bob", "ann") if earlier == "held" else ("ann", "bob")
    origin = "s1" if loser == "ann" else "s2"
    for s in cl.urls:
        e = _by_name(cl, s)
        assert e[winner] == "a@x", (s, e)
        assert e[loser].startswith(f"a@x~{origin}~"), (s, e)
        log = [(c["decision"], c["remote_values"]) for c in api.conflicts(cl.topo, s) if c["kind"] == "unique"]
        assert log[-1] == ("marked", {"email": "a@x"}), (s, log)
    st = mm("status", "-t", topo)
    assert st.returncode == 0, st.stdout + st.stderr
    # the holder releases the value: the marked row regains it, at every site
    cl.execute("s2" if winner == "bob" else "s1", f"UPDATE users SET email = 'z@x' WHERE name = '{winner}'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _by_name(cl, "s1") == {winner: "z@x", loser: "a@x"}


# ---- PostgreSQL + MariaDB: the soak's case, a held source transaction (D2) -------------------


def _shop(servers: dict[str, Backend], tmp: Path, target: str, policy: str = "suffix") -> tuple[str, dict[str, str], str]:
    """customers (email UNIQUE, policy suffix) and products (a natural key) at 'pg' and 'my';
    returns the topology file, the URLs and the other site."""
    pg, my = servers["postgresql"], servers["mysql"]
    urls = {"pg": pg.new_site(tmp, "pg"), "my": my.new_site(tmp, "my")}
    query(
        pg,
        urls["pg"],
        "CREATE TABLE customers (id integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
        "email varchar(120) NOT NULL UNIQUE, name text)",
    )
    query(pg, urls["pg"], "CREATE TABLE products (sku varchar(32) PRIMARY KEY, price numeric(10,2) NOT NULL)")
    query(pg, urls["pg"], "INSERT INTO products VALUES ('A', 10)")
    query(
        my,
        urls["my"],
        "CREATE TABLE customers (id INT AUTO_INCREMENT PRIMARY KEY, "
        "email VARCHAR(120) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL UNIQUE, name TEXT)",
    )
    query(
        my,
        urls["my"],
        "CREATE TABLE products (sku VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY, "
        "price DECIMAL(10,2) NOT NULL)",
    )
    doc = {
        "sites": {s: {"url": u} for s, u in urls.items()},
        "tables": {"customers": {"key": "id", "unique": {"email": policy}}, "products": {"key": "sku", "renumber": False}},
        "links": "mesh",
    }
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = mm("init", "-t", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    return str(path), urls, "pg" if target == "my" else "my"


def _sql(servers: dict[str, Backend], urls: dict[str, str], site: str, sql: str) -> list[tuple[Any, ...]]:
    return query(servers["postgresql" if site == "pg" else "mysql"], urls[site], sql)


def _state(servers: dict[str, Backend], urls: dict[str, str], site: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    cust = [tuple(r) for r in _sql(servers, urls, site, "SELECT id, email, name FROM customers ORDER BY id")]
    prod = [(str(r[0]), str(r[1])) for r in _sql(servers, urls, site, "SELECT sku, price FROM products ORDER BY sku")]
    return cust, prod


@pytest.mark.parametrize(("target", "policy"), [("my", "suffix"), ("pg", "suffix"), ("my", "park")])
def test_a_held_source_transaction_with_a_losing_unique_insert_is_retried_and_converges(
    servers: dict[str, Backend], tmp_path: Path, target: str, policy: str
) -> None:
    """`target` has a CHECK the other site lacks and its own customer 'x@shop'; the other site,
    in one transaction, inserts 'x@shop' too and sets a price the CHECK refuses. `target` holds
    that transaction; the other site marks its own row ('x@shop~<site>~...'; policy park: parks
    it). With the CHECK dropped, `errors retry --all` applies the transaction with the same mark
    (park: parks the row too): both sites equal, nothing held but the parked row, status 0 (park:
    once the holder frees the value) (before: 1062 / UniqueViolation at the retry, held for good;
    the soak's `errors skip` then lost the customer and the price at MariaDB, status 0)."""
    topo, urls, source = _shop(servers, tmp_path, target, policy)
    _sql(servers, urls, target, "ALTER TABLE products ADD CONSTRAINT cap CHECK (price < 500)")
    _sql(servers, urls, target, f"INSERT INTO customers (email, name) VALUES ('x@shop', 'at {target}, first')")
    b = servers["postgresql" if source == "pg" else "mysql"]
    c = b.connect(urls[source])
    try:  # one application transaction at the source
        cur = c.cursor()
        cur.execute(f"INSERT INTO customers (email, name) VALUES ('x@shop', 'at {source}, second')")
        cur.execute("UPDATE products SET price = 700 WHERE sku = 'A'")
        c.commit()
    finally:
        c.close()
    mm("refresh", "-t", topo, "--until-quiet")
    parked = [(source, "customers", "parked")] if policy == "park" else []
    held = _held(topo)
    assert sorted((e["site"], e["table"], e["state"]) for e in held) == sorted(
        [(target, "customers", "txn"), (target, "products", "failed"), *parked]
    ), held
    second = f"at {source}, second"
    if policy == "suffix":
        mark = _sql(servers, urls, source, f"SELECT email FROM customers WHERE name = '{second}'")[0][0]
        assert mark.startswith(f"x@shop~{source}~"), mark
    _sql(servers, urls, target, "ALTER TABLE products DROP CONSTRAINT cap")
    r = mm("errors", "retry", "-t", topo, "--all")
    assert r.returncode == 0, r.stdout + r.stderr  # nothing held again (a parked row needs no retry)
    mm("refresh", "-t", topo, "--until-quiet")
    assert sorted((e["site"], e["state"]) for e in _held(topo)) == sorted(
        (s, "parked") for s in ([target, source] if parked else [])
    ), _held(topo)
    assert _state(servers, urls, "pg") == _state(servers, urls, "my")
    cust, prod = _state(servers, urls, target)
    first = ("x@shop", f"at {target}, first")
    assert sorted((e, n) for _i, e, n in cust) == ([first] if parked else [first, (mark, second)])
    assert prod == [("A", "700.00")]
    if parked:  # the holder frees the value: the parked row returns at both sites
        _sql(servers, urls, target, "UPDATE customers SET email = 'y@shop' WHERE email = 'x@shop'")
        r = mm("refresh", "-t", topo, "--until-quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        assert _state(servers, urls, "pg") == _state(servers, urls, "my")
        assert sorted((e, n) for _i, e, n in _state(servers, urls, "pg")[0]) == [
            ("x@shop", second),
            ("y@shop", f"at {target}, first"),
        ]
    assert _held(topo) == []
    st = mm("status", "-t", topo)
    assert st.returncode == 0, st.stdout + st.stderr


# ---- the message of a duplicate at MariaDB ------------------------------------------------------


def test_a_duplicate_of_the_same_bytes_is_not_blamed_on_the_collation(servers: dict[str, Backend], tmp_path: Path) -> None:
    """A UNIQUE column with utf8mb4_bin (PAD SPACE): a value refused as a duplicate of a row
    holding the very same bytes is no collation difference; explain_rejection says nothing of
    trailing spaces then (before: "is the same value as 'x@shop' ... under the column's
    collation, not as text ... trailing spaces ... then skip this change"). 'x@shop ' beside
    'x@shop' still is."""
    topo, urls, _ = _shop(servers, tmp_path, "my")
    _sql(servers, urls, "my", "INSERT INTO customers (email, name) VALUES ('x@shop', 'first')")
    t = load_topology(Path(topo))
    s = Site("my", t.sites["my"].url)
    try:
        from sqlalchemy.exc import IntegrityError

        for value, collation in (("x@shop", False), ("x@shop ", True)):
            with s.engine.connect() as conn:
                info = s.info(conn, "customers", t)
                with pytest.raises(IntegrityError) as e:
                    conn.exec_driver_sql("INSERT INTO customers (email, name) VALUES (%s, 'second')", (value,))
                conn.rollback()
                told = s.dialect.explain_rejection(conn, info, e.value)
            assert told is not None
            # a skip's advice says what it drops: the source transaction, at this site only
            assert "every other change of its source transaction at this site only" in told, told
            if collation:
                assert "is the same value as 'x@shop', which a row here holds, under the column's collation" in told, told
            else:
                assert "trailing" not in told and "under the column's collation" not in told, told
                assert "customers.email = 'x@shop': a row here holds exactly this value" in told, told
    finally:
        s.dispose()
