"""core/errorqueue.py's units of holding against a reference model (docs/errors.md "What is held"):
changes of one source transaction (origin, txn) are one unit, a change without a transaction is
one alone, and the order of units respects every row's version order; the model finds the units by
brute force (transitive closure of "changes a row before"), the holds by a fixpoint over all pairs
of units, a retry's set by a fixpoint over all pairs of changes. A change whose ``txn`` is a batch's
name (the changes a batch stored from a source that records no transaction, core/batches.py
batch_txn) is one alone too: the model knows the names it drew."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from multimaster.core.batches import batch_txn, is_batch_txn, source_txn
from multimaster.core.errorqueue import Holds, closure, group_of, plan_holds, retry_set, units

TABLES = ["orders", "lines", "notes"]
#: two batches' names (engine/refresh.py gives them to changes that came without a transaction)
BATCHES = ["3b5d5c3712955042212316173ccf37be", "00000000000000000000000000000042"]


def model_txn(t: Any) -> Any:
    """The source transaction the model takes `t` for: none for a batch's name."""
    return None if t in BATCHES else t


@st.composite
def changes(draw: st.DrawFn, n_max: int = 14) -> list[dict[str, Any]]:
    n = draw(st.integers(0, n_max))
    hlcs = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True))
    out = []
    for h in hlcs:
        origin = draw(st.sampled_from(["s1", "s2"]))
        out.append(
            {
                "tbl": draw(st.sampled_from(TABLES)),
                "rid": draw(st.sampled_from(["r0", "r1", "r2", "r3"])),
                "ver": "%019d:%s" % (h, origin),
                "origin": origin,
                "txn": draw(st.sampled_from([None, "t0", "t1", "t2", *BATCHES])),
            }
        )
    return out


def model_key(cs: list[dict[str, Any]], i: int) -> Any:
    c = cs[i]
    return (c["origin"], c["txn"]) if model_txn(c["txn"]) is not None else i


def model_units(cs: list[dict[str, Any]]) -> set[frozenset[int]]:
    """Brute force: groups by transaction; g before h when some row is changed by g before h; the
    units are the classes of groups that each reach the other."""
    groups = sorted({model_key(cs, i) for i in range(len(cs))}, key=repr)
    before = {(g, h): False for g in groups for h in groups}
    for a in range(len(cs)):
        for b in range(len(cs)):
            same_row = (cs[a]["tbl"], cs[a]["rid"]) == (cs[b]["tbl"], cs[b]["rid"])
            if same_row and cs[a]["ver"] < cs[b]["ver"]:
                before[(model_key(cs, a), model_key(cs, b))] = True
    for k in groups:  # Warshall
        for g in groups:
            for h in groups:
                if before[(g, k)] and before[(k, h)]:
                    before[(g, h)] = True
    out = set()
    for g in groups:
        cls = {h for h in groups if h == g or (before[(g, h)] and before[(h, g)])}
        out.add(frozenset(i for i in range(len(cs)) if model_key(cs, i) in cls))
    return out


@settings(max_examples=300)
@given(changes())
def test_units_are_the_entangled_transactions_in_row_order(cs: list[dict[str, Any]]) -> None:
    us = units(cs, TABLES)
    flat = [i for u in us for i in u]
    assert sorted(flat) == list(range(len(cs)))  # every change once
    assert {frozenset(u) for u in us} == model_units(cs)
    where = {i: (k, p) for k, u in enumerate(us) for p, i in enumerate(u)}
    for a in range(len(cs)):  # a row's changes apply in version order
        for b in range(len(cs)):
            if (cs[a]["tbl"], cs[a]["rid"]) == (cs[b]["tbl"], cs[b]["rid"]) and cs[a]["ver"] < cs[b]["ver"]:
                assert where[a] < where[b]
    for u in us:  # parents before children, then by version
        keys = [(TABLES.index(cs[i]["tbl"]), cs[i]["ver"]) for i in u]
        assert keys == sorted(keys)


@st.composite
def queues(draw: st.DrawFn) -> list[dict[str, Any]]:
    qs = draw(changes(n_max=5))
    return [dict(q, id=100 + k, state=draw(st.sampled_from(["failed", "waiting", "txn"]))) for k, q in enumerate(qs)]


def model_held_units(cs: list[dict[str, Any]], queued: list[dict[str, Any]]) -> set[frozenset[int]]:
    us = units(cs, TABLES)
    qrows = {(q["tbl"], q["rid"]) for q in queued}
    qtxns = {(q["origin"], q["txn"]) for q in queued if model_txn(q["txn"]) is not None}

    def rows(u: list[int]) -> set[tuple[str, str]]:
        return {(cs[i]["tbl"], cs[i]["rid"]) for i in u}

    held = {k for k, u in enumerate(us) if rows(u) & qrows or any((cs[i]["origin"], cs[i]["txn"]) in qtxns for i in u)}
    grown = True
    while grown:
        grown = False
        for k, u in enumerate(us):
            if k not in held and any(j < k and rows(us[j]) & rows(u) for j in held):
                held.add(k)
                grown = True
    return {frozenset(us[k]) for k in held}


@settings(max_examples=300)
@given(changes(), queues())
def test_a_unit_is_held_whole_behind_what_holds_it(cs: list[dict[str, Any]], queued: list[dict[str, Any]]) -> None:
    plan = plan_holds(cs, queued, TABLES)
    decided = {i: (state, ref) for i, state, ref in plan}
    assert len(decided) == len(plan)
    us = units(cs, TABLES)
    got = {frozenset(u) for u in us if any(i in decided for i in u)}
    assert got == model_held_units(cs, queued)
    for u in us:
        if not any(i in decided for i in u):
            continue
        assert all(i in decided for i in u)  # whole
        # the head waits for something outside its unit; the others are held with the head
        heads = [i for i in u if not (isinstance(decided[i][1], tuple) and decided[i][1][1] in u)]
        assert len(heads) == 1
        h = heads[0]
        state, ref = decided[h]
        target = queued_by(queued, ref) if isinstance(ref, int) else cs[ref[1]]
        if state == "waiting":  # behind a held change of its row
            assert (target["tbl"], target["rid"]) == (cs[h]["tbl"], cs[h]["rid"])
        else:  # with its transaction's held changes
            assert state == "txn" and model_txn(cs[h]["txn"]) is not None
            assert (target["origin"], target["txn"]) == (cs[h]["origin"], cs[h]["txn"])
        for i in u:
            if i != h:
                assert decided[i] == ("txn", ("new", h))
    pos = {i: k for k, (i, _, _) in enumerate(plan)}
    for i, _, ref in plan:  # what a change waits for is queued before it
        if not isinstance(ref, int):
            assert pos[ref[1]] < pos[i]


def queued_by(queued: list[dict[str, Any]], id_: int) -> dict[str, Any]:
    return next(q for q in queued if q["id"] == id_)


def test_nothing_queued_holds_nothing() -> None:
    cs = [{"tbl": "orders", "rid": "r", "ver": "%019d:s1" % 1, "origin": "s1", "txn": "t"}]
    assert plan_holds(cs, []) == []
    assert Holds([]).blocked(cs) is None


def test_a_transaction_is_held_with_its_failed_change() -> None:
    q = [
        {"id": 1, "tbl": "lines", "rid": "a", "ver": "%019d:s1" % 2, "origin": "s1", "txn": "t", "state": "txn"},
        {"id": 2, "tbl": "lines", "rid": "b", "ver": "%019d:s1" % 3, "origin": "s1", "txn": "t", "state": "failed"},
    ]
    new = [{"tbl": "orders", "rid": "o", "ver": "%019d:s1" % 1, "origin": "s1", "txn": "t"}]
    assert plan_holds(new, q) == [(0, "txn", 2)]


def model_closure(queued: list[dict[str, Any]], starts: list[int], behind: bool = False) -> set[int]:
    """Brute force: the rule applied until nothing is added. A taken change takes its
    transaction's changes, its row's changes at or after it, and with `behind` those of its row
    held behind it (blocked_by) whatever their versions."""
    by_id = {q["id"]: q for q in queued}
    want = {s for s in starts if s in by_id}
    grown = True
    while grown:
        grown = False
        for q in queued:
            if q["id"] in want:
                continue
            for p in (by_id[i] for i in list(want)):
                same_txn = model_txn(q["txn"]) is not None and (q["origin"], q["txn"]) == (p["origin"], p["txn"])
                same_row = (q["tbl"], q["rid"]) == (p["tbl"], p["rid"])
                if same_txn or (same_row and (q["ver"] >= p["ver"] or (behind and q.get("blocked_by") == p["id"]))):
                    want.add(q["id"])
                    grown = True
                    break
    return want


@settings(max_examples=300)
@given(queues(), st.integers(0, 5))
def test_a_retry_takes_the_transactions_and_the_rows_behind(queued: list[dict[str, Any]], k: int) -> None:
    if not queued:
        assert retry_set(queued, 100) == []
        return
    start = queued[k % len(queued)]["id"]
    got = set(retry_set(queued, start))
    want = model_closure(queued, [start])
    assert got == want
    g = set(group_of(queued, start))
    s = queued_by(queued, start)
    assert g == {
        q["id"]
        for q in queued
        if q["id"] == start or (model_txn(s["txn"]) is not None and (q["origin"], q["txn"]) == (s["origin"], s["txn"]))
    }


@settings(max_examples=400)
@given(st.data(), st.integers(0, 40), st.booleans())
def test_the_closure_of_many_starts_is_the_fixpoint_of_the_rule(data: st.DataObject, n: int, behind: bool) -> None:
    """closure (linear: each row's changes a suffix, each transaction once) against the rule applied
    until nothing is added: a taken change takes its transaction's changes, its row's changes at or
    after it, and with `behind` those of its row held behind it (blocked_by) whatever their
    versions. Hot rows and long transactions included (up to 40 changes on 3 rows)."""
    queued = []
    hlcs = data.draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True))
    for k, h in enumerate(hlcs):
        origin = data.draw(st.sampled_from(["s1", "s2"]))
        queued.append(
            {
                "id": 100 + k,
                "tbl": data.draw(st.sampled_from(TABLES[:2])),
                "rid": data.draw(st.sampled_from(["r0", "r1"])),
                "ver": "%019d:%s" % (h, origin),
                "origin": origin,
                "txn": data.draw(st.sampled_from([None, "t0", "t1", BATCHES[0]])),
                "blocked_by": data.draw(st.sampled_from([None, *range(100, 100 + n)])) if n else None,
            }
        )
    starts = data.draw(st.lists(st.sampled_from([q["id"] for q in queued] + [99]), max_size=4)) if queued else [99]
    assert closure(queued, starts, behind=behind) == sorted(model_closure(queued, starts, behind))


@settings(max_examples=300)
@given(changes(), queues())
def test_a_batch_s_name_counts_for_no_transaction(cs: list[dict[str, Any]], queued: list[dict[str, Any]]) -> None:
    """Every decision is the one taken with no transaction where a change carries a batch's name:
    a unit is never larger than a source transaction where the source recorded none (session 36:
    one change held from a SQLite peer held the whole batch that came with it)."""
    bare = [dict(c, txn=model_txn(c["txn"])) for c in cs]
    bare_q = [dict(q, txn=model_txn(q["txn"])) for q in queued]
    assert units(cs, TABLES) == units(bare, TABLES)
    assert plan_holds(cs, queued, TABLES) == plan_holds(bare, bare_q, TABLES)
    for q in queued:
        assert closure(queued, [q["id"]]) == closure(bare_q, [q["id"]])
        assert group_of(queued, q["id"]) == group_of(bare_q, q["id"])


@given(st.integers(0, 2**64 - 1), st.integers(1, 2**32), st.integers(0, 2**48), st.integers(0, 2**32))
def test_no_source_transaction_id_is_taken_for_a_batch_s_name(xid: int, conn: int, trx: int, bound: int) -> None:
    """PostgreSQL's id (a 64-bit number as text) and MariaDB's ('<connection>:0.<trx>', split at a
    bound: ':<bound>' appended) are source transactions; a batch's name is none."""
    for t in (str(xid), f"{conn}:0.{trx}", f"{conn}:0.{trx}:{bound}", f"{conn}:0."):
        assert not is_batch_txn(t) and source_txn(t) == t
    name = batch_txn()
    assert is_batch_txn(name) and source_txn(name) is None and source_txn(None) is None
    assert name != batch_txn()
