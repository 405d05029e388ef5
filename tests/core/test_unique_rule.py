"""Pure property tests of the UNIQUE rule (multimaster.core.unique): no database.

Random histories (inserts, updates of single columns, deletes, at several sites, with values drawn
from a tiny domain so they collide) are delivered to a site in EVERY order. The site is modelled
the way the reconciler works (multimaster.engine.uniques): a row's intended values are the
last-writer-wins fold of the changes delivered so far; after each change, only the rows the engine
decides again -- the marked rows, the changed row when its values collide with a row's, and every
claimant of their values, transitively -- go through ``resolve``; every other row keeps what it
has, and the changed row, when it collides with nothing, holds its values as they are (the fast
path). After every step no two live rows hold the same values of a set (the database's UNIQUE
constraint would refuse it), and every order ends in the same table, which is ``resolve`` of the
final rows taken whole.
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from multimaster.core.unique import Claimant, UniqueSet, group_key, mark_value, resolve

COLS = ("c", "e", "t")  # c: a code (text), e: an email (text), t: a tenant (int)
SETS = (
    UniqueSet("e", (1,), "suffix", 1, 40),
    UniqueSet("c+t", (0, 2), "null", 0),
)
#: with a park set: t (an int, no column to mark) parks its losers; e is still suffixed among the rest
PARK_SETS = (
    UniqueSet("t", (2,), "park", 2),
    UniqueSet("e", (1,), "suffix", 1, 40),
)
VALUES = {0: ("k", "q", None), 1: ("a", "b", None), 2: (1, 2)}


def _ver(i: int, site: str) -> str:
    return f"{i + 1:019d}:{site}"


@st.composite
def histories(draw: Any) -> list[tuple[Any, ...]]:
    """Up to 5 changes: ('I', ver, rid, values), ('U', ver, rid, col, value), ('D', ver, rid)."""
    n = draw(st.integers(2, 5))
    out: list[tuple[Any, ...]] = []
    rids: list[str] = []
    for i in range(n):
        ver = _ver(i, draw(st.sampled_from(("s1", "s2", "s3"))))
        kind = draw(st.sampled_from("IIUD")) if rids else "I"
        if kind == "I":
            vals = {c: draw(st.sampled_from(VALUES[c])) for c in range(3)}
            out.append(("I", ver, ver, vals))
            rids.append(ver)
        elif kind == "U":
            c = draw(st.integers(0, 2))
            out.append(("U", ver, draw(st.sampled_from(rids)), c, draw(st.sampled_from(VALUES[c]))))
        else:
            out.append(("D", ver, draw(st.sampled_from(rids))))
    return out


def _fold(delivered: list[tuple[Any, ...]]) -> dict[str, tuple[dict[int, Any], dict[int, str]]]:
    """Last-writer-wins: per live row, its values and each column's version."""
    rows: dict[str, tuple[dict[int, Any], dict[int, str]]] = {}
    dead = {ev[2] for ev in delivered if ev[0] == "D"}
    for ev in delivered:
        if ev[0] == "I" and ev[2] not in dead:
            rows[ev[2]] = (dict(ev[3]), {c: ev[1] for c in range(3)})
    for ev in sorted((e for e in delivered if e[0] == "U"), key=lambda e: e[1]):
        if ev[2] in rows and ev[1] > rows[ev[2]][1][ev[3]]:
            rows[ev[2]][0][ev[3]] = ev[4]
            rows[ev[2]][1][ev[3]] = ev[1]
    return rows


def _claimant(rid: str, vals: dict[int, Any], vers: dict[int, str], sets: tuple[UniqueSet, ...] = SETS) -> Claimant:
    return Claimant(rid, vals, {u.name: max(vers[i] for i in u.columns) for u in sets})


def _full(
    rows: dict[str, tuple[dict[int, Any], dict[int, str]]], sets: tuple[UniqueSet, ...] = SETS
) -> tuple[dict[str, dict[int, Any]], set[str]]:
    """The table the rule gives, taken whole, and the parked rows."""
    res = resolve(sets, [_claimant(r, v, w, sets) for r, (v, w) in rows.items()])
    return {r: {**v, **res.marks.get(r, {})} for r, (v, _) in rows.items() if r not in res.parked}, set(res.parked)


def _collides(u: UniqueSet, vals: dict[int, Any], rid: str, actual: dict[str, dict[int, Any]]) -> bool:
    g = group_key(u, vals)
    return g is not None and any(o != rid and group_key(u, a) == g for o, a in actual.items())


def _deliver(order: list[tuple[Any, ...]], sets: tuple[UniqueSet, ...] = SETS) -> tuple[dict[str, dict[int, Any]], set[str]]:
    """The table at a site receiving the changes in `order`, one at a time, as the engine works,
    and the parked rows (live rows not in the table: their values are kept apart)."""
    SETS = sets  # noqa: N806 (the model below reads the sets under test)
    actual: dict[str, dict[int, Any]] = {}
    delivered: list[tuple[Any, ...]] = []
    for ev in order:
        delivered.append(ev)
        rows = _fold(delivered)
        actual = {r: a for r, a in actual.items() if r in rows}  # deleted rows leave
        rid = ev[2]
        seeds = {r for r, a in actual.items() if a != rows[r][0]}  # marked rows
        seeds |= {r for r in rows if r not in actual and r != rid}  # parked rows
        if rid in rows:
            vals = rows[rid][0]
            if any(_collides(u, vals, rid, actual) for u in SETS):
                seeds.add(rid)
                if any(u.policy == "park" for u in SETS):
                    # a park set: the changed row and the rows holding its values leave the table
                    # while applying (parked until decided)
                    for u in SETS:
                        if u.policy == "park" and _collides(u, vals, rid, actual):
                            for o in [o for o, a in actual.items() if o != rid and group_key(u, a) == group_key(u, vals)]:
                                seeds.add(o)
                                del actual[o]
                    actual.pop(rid, None)
                if rid in actual or not any(u.policy == "park" for u in SETS):
                    # while applying, the changed row holds its mark value: it collides with nothing
                    actual[rid] = {**vals, **{u.mark: mark_value(u, vals[u.mark], rid) for u in SETS if u.policy != "park"}}
            elif rid not in seeds:
                actual[rid] = dict(vals)  # the fast path
        # the rows decided again: the seeds and every claimant of their values, transitively
        todo, chosen = set(seeds), set()
        while todo:
            chosen |= todo
            groups = {(u.name, group_key(u, rows[r][0])) for r in todo for u in SETS}
            todo = {o for o in rows if o not in chosen and any((u.name, group_key(u, rows[o][0])) in groups for u in SETS)} | {
                o for o in actual if o not in chosen and any((u.name, group_key(u, actual[o])) in groups for u in SETS)
            }
        chosen &= set(rows)
        res = resolve(SETS, [_claimant(r, *rows[r], SETS) for r in chosen])
        for r in chosen:
            if r in res.parked:
                actual.pop(r, None)
            else:
                actual[r] = {**rows[r][0], **res.marks.get(r, {})}
        for u in SETS:  # the database's UNIQUE constraint
            held = [group_key(u, a) for a in actual.values()]
            held = [g for g in held if g is not None]
            assert len(held) == len(set(held)), (u.name, actual)
    return actual, set(_fold(delivered)) - set(actual)


@settings(max_examples=150, deadline=None)
@given(histories())
def test_every_delivery_order_ends_in_the_table_the_rule_gives(history: list[tuple[Any, ...]]) -> None:
    want = _full(_fold(history))
    for order in permutations(history):
        assert _deliver(list(order)) == want, order


@settings(max_examples=150, deadline=None)
@given(histories())
def test_park_every_delivery_order_ends_in_the_same_table_and_parked_rows(history: list[tuple[Any, ...]]) -> None:
    want = _full(_fold(history), PARK_SETS)
    for order in permutations(history):
        assert _deliver(list(order), PARK_SETS) == want, order


def test_park_the_earliest_claim_holds_the_row_the_others_are_parked() -> None:
    u = UniqueSet("t", (2,), "park", 2)
    a = Claimant("0000000000000000002:s1", {2: 7}, {"t": "0000000000000000002:s1"})
    b = Claimant("0000000000000000001:s2", {2: 7}, {"t": "0000000000000000001:s2"})
    c = Claimant("0000000000000000003:s1", {2: 8}, {"t": "0000000000000000003:s1"})
    res = resolve([u], [a, b, c])
    assert res.parked == {a.rid: [("t", b.rid)]} and res.marks == {}


@given(st.lists(st.tuples(st.sampled_from(("a", "b")), st.integers(1, 9)), min_size=1, max_size=6), st.randoms())
def test_resolve_ignores_the_order_of_its_rows(vals: list[tuple[str, int]], rnd: Any) -> None:
    rows = [Claimant(_ver(i, "s1"), {1: e}, {"e": _ver(v, "s2")}) for i, (e, v) in enumerate(vals)]
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    a, b = resolve(SETS[:1], rows), resolve(SETS[:1], shuffled)
    assert a.marks == b.marks
    # one holder per value: the earliest claim
    for e in {e for e, _ in vals}:
        group = [r for r in rows if r.values[1] == e]
        holders = [r for r in group if r.rid not in a.marks]
        assert len(holders) == 1 and holders[0] == min(group, key=lambda r: (r.claims["e"], r.rid))


def test_suffix_marks_fit_the_column_and_differ_per_row() -> None:
    u = UniqueSet("e", (1,), "suffix", 1, 30)
    a = mark_value(u, "x" * 40, "0000000000000000001:s1")
    b = mark_value(u, "x" * 40, "0000000000000000002:s1")
    assert len(a) == 30 and a != b and a.startswith("xxx") and "~s1~" in a
    assert mark_value(UniqueSet("t", (2,), "null", 2), 5, "r") is None
