"""A transaction relayed through a SQLite site keeps its origin's ``txn`` (docs/transactions.md "A
relayed entry keeps its origin's txn"): PostgreSQL site pg writes an order and its lines in one
transaction, SQLite site lite pulls it, and a third site pulls it from lite only. Where that site
rejects one line (a CHECK), the whole transaction is held there, and `errors retry` applies it whole
once the cause is fixed. Before session 36 SQLite's change log and snapshots had no ``txn``
column: the relayed entries arrived as changes of no transaction, the rejected line was held alone
and the order arrived with its other lines.

A SQLite site made before that (its change log and snapshots without ``txn``) is brought up to
date the first time a multimaster process opens it (Dialect.upgrade_on_open), and `init` run again
adds the columns too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, made, see_a
from test_error_queue import MixedCluster, mm

TABLES = {
    "orders": {"key": "id", "columns": {"oref": "text", "nlines": "int"}},
    "olines": {"key": "id", "columns": {"oref": "text", "n": "int", "qty": "int"}},
}


@pytest.fixture(params=["mysql", "postgresql"])
def relayed(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """pg writes, lite (SQLite) relays, far (MariaDB or a second PostgreSQL site) receives."""
    backends: dict[str, Backend] = {}
    try:
        for site, name in (("pg", "postgresql"), ("lite", "sqlite"), ("far", request.param)):
            backends[site] = backends["pg"] if name == "postgresql" and "pg" in backends else made(name)
        yield MixedCluster(backends, tmp_path, TABLES)
    finally:
        for b in {id(b): b for b in backends.values()}.values():
            b.cleanup()


def _order(cl: MixedCluster, oref: str, qtys: list[int]) -> None:
    """One transaction at pg: an order and its lines."""
    c = cl.db("pg")
    try:
        cur = c.cursor()
        cur.execute("INSERT INTO orders (oref, nlines) VALUES (%s, %s)", (oref, len(qtys)))
        for n, q in enumerate(qtys):
            cur.execute("INSERT INTO olines (oref, n, qty) VALUES (%s, %s, %s)", (oref, n, q))
        c.commit()
    finally:
        c.close()


#: order A held whole: its rejected line, and the order and its other lines with it
HELD_WHOLE = [("olines", "failed"), ("olines", "txn"), ("olines", "txn"), ("orders", "txn")]


def _states(held: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((h["table"], h["state"]) for h in held)


def _held(topo: str, site: str) -> list[dict[str, Any]]:
    r = mm("errors", "-t", topo, "--json", "--site", site)
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def _lite_txns(cl: MixedCluster) -> set[tuple[str, Any]]:
    """(origin, txn) of every entry of lite's change logs."""
    c = cl.db("lite")
    try:
        return {(str(o), t) for tb in TABLES for o, t in c.execute(f"SELECT origin, txn FROM _mm_log_{tb}").fetchall()}
    finally:
        c.close()


def _relay_and_hold(cl: MixedCluster, tmp: Path) -> tuple[str, list[dict[str, Any]]]:
    """Order A (three lines, the second rejected at far) written at pg, pulled by lite, pulled from
    lite by far; then order B the same way. Returns the topology file and far's queue."""
    topo = str(tmp / "topology.yaml")
    cl.execute("far", "ALTER TABLE olines ADD CONSTRAINT qty_ok CHECK (qty >= 0)")
    _order(cl, "A", [1, -1, 2])
    _order(cl, "B", [5])
    cl.refresh("lite", "pg")
    # lite's log holds pg's two transactions, each entry with pg's own transaction id
    txns = _lite_txns(cl)
    assert {o for o, _ in txns} == {"pg"} and len(txns) == 2 and all(t is not None for _, t in txns), txns
    cl.refresh("far", "lite")  # far hears of A only through lite
    assert see_a(cl, "far") == (0, 0)  # nothing of A: not the order without a line
    assert [r[1:] for r in cl.rows("far", "orders")] == [("B", 1)]
    return topo, _held(topo, "far")


def test_a_transaction_relayed_by_a_sqlite_site_is_held_whole_and_retried_whole(relayed: MixedCluster, tmp_path: Path) -> None:
    cl = relayed
    topo, held = _relay_and_hold(cl, tmp_path)
    assert _states(held) == HELD_WHOLE, held
    assert {h["origin"] for h in held} == {"pg"} and len({h["txn"] for h in held}) == 1 and held[0]["txn"] is not None
    assert {(h["origin"], h["txn"]) for h in held} <= _lite_txns(cl)
    # the cause fixed: one retry applies the order with all its lines
    cl.execute("far", "ALTER TABLE olines DROP CONSTRAINT qty_ok")
    failed = next(h for h in held if h["state"] == "failed")
    r = mm("errors", "retry", "-t", topo, "--site", "far", "--id", str(failed["id"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert see_a(cl, "far") == (1, 3)
    cl.refresh_until_quiet()
    cl.assert_converged()


def _drop_txn_columns(cl: MixedCluster) -> None:
    """lite as a multimaster before session 36 made it: no txn in its change logs and snapshots."""
    c = cl.db("lite")
    try:
        rels = [
            str(r[0])
            for r in c.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND (name LIKE '\\_mm\\_log\\_%' ESCAPE '\\' "
                "OR name LIKE '\\_mm\\_snap\\_%\\_\\_%' ESCAPE '\\')"
            )
        ]
        assert len(rels) == 2 + 2 * 2, rels
        for rel in rels:
            c.execute(f'ALTER TABLE "{rel}" DROP COLUMN txn')
        c.commit()
    finally:
        c.close()


def _lite_columns(cl: MixedCluster) -> set[tuple[str, bool]]:
    c = cl.db("lite")
    try:
        rels = [
            str(r[0])
            for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '\\_mm\\_%' ESCAPE '\\'")
        ]
        return {
            (rel, any(r[1] == "txn" for r in c.execute(f'PRAGMA table_info("{rel}")')))
            for rel in rels
            if "_log_" in rel or "__" in rel
        }
    finally:
        c.close()


@pytest.mark.parametrize("upgrade", ["first use", "init"])
def test_a_sqlite_site_made_before_relays_transactions_whole_once_upgraded(
    upgrade: str, relayed: MixedCluster, tmp_path: Path
) -> None:
    cl = relayed
    _drop_txn_columns(cl)
    assert not any(has for _, has in _lite_columns(cl))
    if upgrade == "init":
        r = mm("init", "-t", str(tmp_path / "topology.yaml"))
        assert r.returncode == 0, r.stdout + r.stderr
        assert all(has for _, has in _lite_columns(cl))
    _, held = _relay_and_hold(cl, tmp_path)  # first use: the refresh's own process adds them
    assert all(has for _, has in _lite_columns(cl))
    assert _states(held) == HELD_WHOLE, held


def test_a_sqlite_site_holds_a_rejected_postgresql_transaction_whole(tmp_path: Path) -> None:
    """lite itself rejects a line of pg's transaction: the order and its other lines are held with
    it (before session 36 lite's snapshots had no txn: the line was held alone, the order applied)."""
    backends = {"pg": made("postgresql"), "lite": made("sqlite")}
    try:
        cl = MixedCluster(backends, tmp_path, TABLES)
        topo = str(tmp_path / "topology.yaml")
        cl.execute(
            "lite",
            "CREATE TRIGGER qty_ok BEFORE INSERT ON olines WHEN NEW.qty < 0 BEGIN SELECT RAISE(ABORT, 'qty must not be negative'); END",
        )
        _order(cl, "A", [1, -1, 2])
        cl.refresh_until_quiet()
        assert see_a(cl, "lite") == (0, 0)
        held = _held(topo, "lite")
        assert _states(held) == HELD_WHOLE, held
        assert len({(h["origin"], h["txn"]) for h in held}) == 1 and held[0]["txn"] is not None
        cl.execute("lite", "DROP TRIGGER qty_ok")
        r = mm("errors", "retry", "-t", topo, "--all")
        assert r.returncode == 0, r.stdout + r.stderr
        assert see_a(cl, "lite") == (1, 3)
    finally:
        for b in backends.values():
            b.cleanup()


def test_a_transaction_relayed_by_a_sqlite_site_keeps_its_txn_through_the_sqlite_sites_agent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """far pulls lite through lite's agent (engine/wire.py rows): the same transaction held whole."""
    import yaml
    from test_agent import running_agent

    from multimaster import api
    from multimaster.config.topology import load_topology

    monkeypatch.setenv("MM_AGENT_TOKEN", "relay-token-0123456789abcdef")
    backends = {"pg": made("postgresql"), "lite": made("sqlite"), "far": made("mysql")}
    try:
        cl = MixedCluster(backends, tmp_path, TABLES)
        path = tmp_path / "topology.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["sites"]["lite"]["token"] = "${MM_AGENT_TOKEN}"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        cl.execute("far", "ALTER TABLE olines ADD CONSTRAINT qty_ok CHECK (qty >= 0)")
        _order(cl, "A", [1, -1, 2])
        cl.refresh("lite", "pg")
        with running_agent(load_topology(path), "lite") as url:
            doc["sites"]["lite"]["url"] = url
            (tmp_path / "far.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            res = api.refresh(load_topology(tmp_path / "far.yaml"), "far", "lite")
            assert res[0].error is None and res[0].pulled >= 4, res
        assert see_a(cl, "far") == (0, 0)
        held = _held(str(path), "far")
        assert _states(held) == HELD_WHOLE, held
        assert {(h["origin"], h["txn"]) for h in held} <= _lite_txns(cl) and len({h["txn"] for h in held}) == 1
    finally:
        for b in backends.values():
            b.cleanup()


def test_a_sqlite_site_made_before_that_cannot_be_written_is_refused_naming_init(tmp_path: Path) -> None:
    """The first use cannot add the column to a file opened read-only: refused naming the site,
    the column and init (not a bare 'no such column' at the first read); opened writable, it is added."""
    import sqlite3

    from multimaster.engine.site import Site
    from multimaster.errors import NotInstalled

    db = tmp_path / "old.db"
    c = sqlite3.connect(db)
    c.executescript(
        "CREATE TABLE _mm_log_t (seq INTEGER PRIMARY KEY, mask INTEGER NOT NULL); CREATE TABLE _mm_snap_t__p (pseq INTEGER PRIMARY KEY, mask INTEGER NOT NULL)"
    )
    c.close()
    ro = Site("lite", f"sqlite:///file:{db}?mode=ro&uri=true")
    with pytest.raises(NotInstalled) as e:
        ro.engine  # noqa: B018 - opening it is the first use
    assert "site 'lite'" in str(e.value) and "txn" in str(e.value) and "multimaster init" in str(e.value), e.value
    rw = Site("lite", f"sqlite:///{db}")
    rw.engine  # noqa: B018
    rw.dispose()
    c = sqlite3.connect(db)
    try:
        for rel in ("_mm_log_t", "_mm_snap_t__p"):
            assert "txn" in {r[1] for r in c.execute(f"PRAGMA table_info({rel})")}
    finally:
        c.close()
