"""The error queue holds source transactions whole (docs/errors.md "What is held"): one source
transaction writes an order and three lines; the receiving site rejects one line (a CHECK there);
neither the order nor any of its lines is visible there, the queue holds the transaction (the
line rejected ``failed``, the others held with it), a transaction committed after it arrives, and
`status` exits 1. Once the cause is fixed, `errors retry` (the CLI, as a user runs it) applies the
order with all its lines together (and a later transaction held behind it): a reader polling that
site with a plain client never sees the order without all its lines. `errors skip` drops the whole transaction. Over PostgreSQL, MariaDB
and PostgreSQL to MariaDB; on SQLite, whose changes carry no transaction, the unit stays one
change (the documented limit)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from clusters import SEE_A, Backend, TestCluster, made, make_cluster, see_a
from test_error_queue import MixedCluster, mm

TABLES = {
    "orders": {"key": "id", "columns": {"oref": "text", "nlines": "int"}},
    "olines": {"key": "id", "columns": {"oref": "text", "n": "int", "qty": "int"}},
}


#: how a reader at the receiving site sees order A: (orders, lines), in one statement
@pytest.fixture(params=["postgresql", "mysql", "postgresql-to-mysql"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """s1 writes, s2 receives (and rejects a line)."""
    names = {"postgresql-to-mysql": ("postgresql", "mysql")}.get(request.param, (request.param, request.param))
    backends = [made(names[0])]
    if names[1] != names[0]:
        backends.append(made(names[1]))
        cl: TestCluster = MixedCluster({"s1": backends[0], "s2": backends[1]}, tmp_path, TABLES)
    else:
        cl = make_cluster(backends[0], tmp_path, ["s1", "s2"], TABLES)
    yield cl
    for b in backends:
        b.cleanup()


def _kind(cl: TestCluster, site: str) -> str:
    return cl.backend_of(site).name if isinstance(cl, MixedCluster) else cl.backend.name


def _ph(cl: TestCluster, site: str) -> str:
    return "?" if _kind(cl, site) == "sqlite" else "%s"


def _order(cl: TestCluster, oref: str, qtys: list[int]) -> None:
    """One transaction at s1: an order and its lines (a plain client)."""
    p = _ph(cl, "s1")
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({p}, {p})", (oref, len(qtys)))
        for n, q in enumerate(qtys):
            cur.execute(f"INSERT INTO olines (oref, n, qty) VALUES ({p}, {p}, {p})", (oref, n, q))
        c.commit()
    finally:
        c.close()


def _reject_negative(cl: TestCluster, site: str) -> None:
    if _kind(cl, site) == "sqlite":
        cl.execute(
            site,
            "CREATE TRIGGER qty_ok BEFORE INSERT ON olines WHEN NEW.qty < 0 BEGIN SELECT RAISE(ABORT, 'qty must not be negative'); END",
        )
    else:
        cl.execute(site, "ALTER TABLE olines ADD CONSTRAINT qty_ok CHECK (qty >= 0)")


def _errors(topo: str, *args: str) -> list[dict[str, Any]]:
    r = mm("errors", "-t", topo, "--json", *args)
    rows = json.loads(r.stdout)
    # exit 1 while a change is held (docs/cli.md "Exit codes"), 0 when none is
    assert r.returncode == (1 if any(h["state"] in ("failed", "waiting", "txn", "parked") for h in rows) else 0), r.stderr
    return rows


def _held_order(cl: TestCluster, tmp: Path) -> tuple[str, list[dict[str, Any]]]:
    """Order A (three lines, the second rejected at s2), then order B, committed after it; refreshed.
    Returns the topology file and s2's queue."""
    topo = str(tmp / "topology.yaml")
    _reject_negative(cl, "s2")
    _order(cl, "A", [1, -1, 2])
    _order(cl, "B", [5])
    cl.refresh_until_quiet()  # no link error
    assert [r[1:] for r in cl.rows("s2", "orders")] == [("B", 1)]  # B arrived, A did not, nor any of its lines
    assert [r[1:] for r in cl.rows("s2", "olines")] == [("B", 0, 5)]
    return topo, _errors(topo, "--site", "s2")


def test_a_rejected_change_holds_its_whole_transaction_until_retried(cluster: TestCluster, tmp_path: Path) -> None:
    cl = cluster
    topo, held = _held_order(cl, tmp_path)
    # the queue holds the transaction: the line rejected failed, the order and two lines held with it
    assert sorted((h["table"], h["op"], h["state"]) for h in held) == [
        ("olines", "I", "failed"),
        ("olines", "I", "txn"),
        ("olines", "I", "txn"),
        ("orders", "I", "txn"),
    ]
    failed = next(h for h in held if h["state"] == "failed")
    assert failed["change"]["values"]["qty"] == -1 and "qty" in failed["error"].lower(), failed
    assert all(h["blocked_by"] == failed["id"] for h in held if h["state"] == "txn")
    assert len({(h["origin"], h["txn"]) for h in held}) == 1 and held[0]["txn"] is not None
    table = mm("errors", "-t", topo, "--site", "s2")
    assert table.returncode == 1 and f"held with #{failed['id']} (same transaction)" in table.stdout, table.stdout
    # status exits 1 and names the command; every change of the transaction counts
    st = mm("status", "-t", topo)
    assert st.returncode == 1 and "multimaster errors" in st.stderr, st.stderr
    assert json.loads(mm("status", "-t", topo, "--json").stdout)["held_errors"] == 4
    # retried before the cause is fixed: held whole again, one more attempt each, nothing visible
    r = mm("errors", "retry", "-t", topo, "--all")
    assert r.returncode == 1 and "still held" in r.stdout, r.stdout
    again = _errors(topo, "--site", "s2")
    assert sorted(h["id"] for h in again) == sorted(h["id"] for h in held)
    assert [h["attempts"] for h in again] == [2, 2, 2, 2]
    assert see_a(cl, "s2") == (0, 0)
    # a later transaction changes order A and adds a line: held whole behind it (a refresh, not
    # isolating mode: nothing of it was rejected)
    p = _ph(cl, "s1")
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute("UPDATE orders SET nlines = 4 WHERE oref = 'A'")
        cur.execute(f"INSERT INTO olines (oref, n, qty) VALUES ({p}, {p}, {p})", ("A", 3, 7))
        c.commit()
    finally:
        c.close()
    cl.refresh_until_quiet()
    order = next(h for h in held if h["table"] == "orders")
    later = [h for h in _errors(topo, "--site", "s2") if h["id"] not in {x["id"] for x in held}]
    assert sorted((h["table"], h["op"], h["state"]) for h in later) == [("olines", "I", "txn"), ("orders", "U", "waiting")]
    head = next(h for h in later if h["state"] == "waiting")
    assert head["blocked_by"] == order["id"] and all(h["blocked_by"] == head["id"] for h in later if h is not head)
    assert see_a(cl, "s2") == (0, 0)
    # the cause fixed: one retry applies the order with all its lines together, as a reader sees
    cl.execute("s2", "ALTER TABLE olines DROP CONSTRAINT qty_ok")
    seen: set[tuple[int, int]] = set()
    done = threading.Event()

    def poll() -> None:
        c = cl.db("s2")
        try:
            cur = c.cursor()
            while not done.is_set():
                cur.execute(SEE_A)
                r = cur.fetchone()
                c.rollback()  # a fresh snapshot for the next read (MariaDB: REPEATABLE READ)
                seen.add((int(r[0]), int(r[1])))
        finally:
            c.close()

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        r = mm("errors", "retry", "-t", topo, "--site", "s2", "--id", str(failed["id"]))
    finally:
        done.set()
        reader.join()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "applied 6" in r.stdout, r.stdout  # both transactions: the later one waited behind the first
    assert seen <= {(0, 0), (1, 4)} and (0, 0) in seen, seen
    assert see_a(cl, "s2") == (1, 4)
    assert _errors(topo) == []
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert mm("status", "-t", topo).returncode == 0


def test_skip_drops_the_whole_transaction_and_applies_what_waited(cluster: TestCluster, tmp_path: Path) -> None:
    cl = cluster
    topo, held = _held_order(cl, tmp_path)
    # a later transaction changes order A: it waits behind the held one
    cl.execute("s1", "UPDATE orders SET nlines = 4 WHERE oref = 'A'")
    cl.refresh_until_quiet()
    waiting = [h for h in _errors(topo, "--site", "s2") if h["state"] == "waiting"]
    order = next(h for h in held if h["table"] == "orders")
    assert [(w["table"], w["op"], w["blocked_by"]) for w in waiting] == [("orders", "U", order["id"])]
    # skip names one change (the order, held with the line rejected): its whole transaction goes
    r = mm("errors", "skip", "-t", topo, "--site", "s2", "--id", str(order["id"]), "--reason", "order A cancelled")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "with its source transaction" in r.stdout and "applied 1 waiting behind it" in r.stdout, r.stdout
    assert _errors(topo) == []
    logged = _errors(topo, "--all")
    assert sorted(h["id"] for h in logged) == sorted(h["id"] for h in held)
    assert {(h["state"], h["reason"]) for h in logged} == {("skipped", "order A cancelled")}
    assert see_a(cl, "s2") == (0, 0)  # never applied here, nor the update that waited (its row is gone)
    assert [r[1:] for r in cl.rows("s2", "orders")] == [("B", 1)]
    assert mm("status", "-t", topo).returncode == 0
    # the link goes on
    _order(cl, "C", [3, 4])
    cl.refresh_until_quiet()
    assert [r[1:] for r in cl.rows("s2", "orders")] == [("B", 1), ("C", 2)]


def test_sqlite_changes_carry_no_transaction_each_is_held_alone(sqlite_backend: Backend, tmp_path: Path) -> None:
    """The limit: a SQLite source records no transaction, so only the rejected line is held."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TABLES)
    topo = str(tmp_path / "topology.yaml")
    _reject_negative(cl, "s2")
    _order(cl, "A", [1, -1, 2])
    cl.refresh_until_quiet()
    assert see_a(cl, "s2") == (1, 2)
    held = _errors(topo, "--site", "s2")
    assert [(h["table"], h["state"], h["txn"]) for h in held] == [("olines", "failed", None)]


def test_init_adds_the_transaction_column_to_an_error_queue_without_it(backend: Backend, tmp_path: Path) -> None:
    import sqlalchemy as sa

    from multimaster.engine.site import Site

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    site = Site("s2", cl.urls["s2"])
    t = site.dialect.mm_table("_mm_errors")
    with site.write() as conn:  # as an earlier version left it
        conn.exec_driver_sql(f"ALTER TABLE {t} DROP COLUMN txn")
    r = mm("init", "-t", str(tmp_path / "topology.yaml"))
    assert r.returncode == 0, r.stderr
    with site.read() as conn:
        assert "txn" in {
            c["name"] for c in sa.inspect(conn).get_columns(t.split(".")[-1], schema=t.split(".")[0] if "." in t else None)
        }
    site.dispose()
    _reject_negative(cl, "s2")
    _order(cl, "A", [1, -1])
    cl.refresh_until_quiet()
    assert {h["state"] for h in _errors(str(tmp_path / "topology.yaml"), "--site", "s2")} == (
        {"failed"} if backend.name == "sqlite" else {"failed", "txn"}
    )
