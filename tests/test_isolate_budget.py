"""Isolating mode in transactions of a bounded length (engine/isolate.py "budget"). A batch the
target rejects runs again change by change, holding the changes at fault; that transaction holds
the tables' writers back (MariaDB: their slots), and with many rejected changes under load it held
them for 1,000 s while applications got lock wait timeouts (1205; session 34). Now each isolating
transaction goes on for at most MM_ISOLATE_BUDGET seconds once it has handled one source
transaction, commits, and the next goes on from what is left, in the same refresh; the outcome is
the one of a single transaction (core/errorqueue.in_halves `stop`, property-tested in
tests/test_error_queue.py). Here the budget is 0: every transaction handles one source transaction
or one span of them, so a batch with rejected changes takes many, and the site ends exactly as the
model says, each source transaction whole."""

from __future__ import annotations

from typing import Any

from clusters import Backend, make_cluster, mm
from test_error_queue import TABLES, reject_negative_qty

from multimaster import api
from multimaster.engine import isolate

ROWS = 12


def _writes(cl: Any) -> dict[int, int]:
    """At s1, after the seed: an update of every item, every third to a negative qty (rejected at
    s2), and six transactions that insert an item and a note together. Returns what s2 must hold
    of the seeded items: id -> qty."""
    want = {}
    for i in range(1, ROWS + 1):
        bad = i % 3 == 0
        cl.execute("s1", "UPDATE items SET qty = ? WHERE id = ?", (-i if bad else 100 + i, i))
        want[i] = i if bad else 100 + i
    for j in range(6):
        c = cl.db("s1")
        try:
            cur = c.cursor()
            p = cl.backend.param()
            cur.execute(f"INSERT INTO items (name, qty) VALUES ({p}, {p})", (f"new{j}", j))
            cur.execute(f"INSERT INTO notes (body) VALUES ({p})", (f"note{j}",))
            c.commit()
        finally:
            c.close()
    return want


def test_isolating_in_many_short_transactions_ends_as_one(backend: Backend, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    for i in range(1, ROWS + 1):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, ?)", (f"i{i}", i))
    cl.refresh_until_quiet()
    reject_negative_qty(cl, "s2")
    want = _writes(cl)

    calls: list[int] = []
    real = isolate.reconcile_isolating

    def counted(*a: Any, **kw: Any) -> Any:  # the real function, counted: each call is one transaction
        got = real(*a, **kw)
        calls.append(sum(r.left for r in got.values()))
        return got

    monkeypatch.setattr(isolate, "reconcile_isolating", counted)
    monkeypatch.setenv("MM_ISOLATE_BUDGET", "0")
    (res,) = api.refresh(cl.topo, site="s2")
    assert res.error is None, res.error
    assert len(calls) > 2 and calls[0] > 0 and calls[-1] == 0, calls  # many transactions, none left
    assert res.reconciled["items"].left == 0

    items = {k: q for k, _n, q in cl.rows("s2", "items")}
    assert {k: items[k] for k in want} == want
    assert sorted(n for _k, n, _q in cl.rows("s2", "items") if n.startswith("new")) == [f"new{j}" for j in range(6)]
    assert sorted(b for _k, b in cl.rows("s2", "notes")) == [f"note{j}" for j in range(6)]
    held = api.list_errors(cl.topo, site="s2")
    assert sorted((h["state"], h["op"]) for h in held) == [("failed", "U")] * (ROWS // 3)


def test_the_refresh_command_goes_on_past_its_budget(backend: Backend, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The front door: `multimaster refresh` with a budget of 0 applies everything in one run."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    for i in range(1, ROWS + 1):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, ?)", (f"i{i}", i))
    cl.refresh_until_quiet()
    reject_negative_qty(cl, "s2")
    want = _writes(cl)
    monkeypatch.setenv("MM_ISOLATE_BUDGET", "0")
    r = mm("refresh", "-t", str(tmp_path / "topology.yaml"), "--site", "s2")
    assert "Traceback" not in r.stderr, r.stderr
    items = {k: q for k, _n, q in cl.rows("s2", "items")}
    assert {k: items[k] for k in want} == want
    assert len(cl.rows("s2", "notes")) == 6
