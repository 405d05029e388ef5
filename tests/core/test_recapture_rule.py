"""What recapture sends (core/recapture.py), checked against a reference model: applying the plan's
changes to the peer's rows gives the site's rows for every key no change on its way touches, and
leaves the others as they were, listed."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from multimaster.core.recapture import DELETE, INSERT, UPDATE, Op, plan
from multimaster.core.values import differing

COLS = ("a", "b", "c")
_rows = st.dictionaries(
    st.integers(0, 12),
    st.fixed_dictionaries({c: st.one_of(st.none(), st.integers(0, 2), st.text(max_size=1)) for c in COLS}),
    max_size=10,
)


def _same_row(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """The model's equality of two rows: both absent, or every column the same value (core/values.py
    same, no kind known: how recapture compares when it is given no column types)."""
    if a is None or b is None:
        return a is None and b is None
    return not differing(a, b, COLS)


def _apply(there: dict[int, dict[str, Any]], here: dict[int, dict[str, Any]], op: Op) -> None:
    """The model of a captured change arriving at the peer: an insert or an update carries the
    site's values of its columns, a delete removes the row."""
    if op.kind == DELETE:
        assert op.key in there
        del there[op.key]
    elif op.kind == INSERT:
        assert op.key not in there
        there[op.key] = {c: here[op.key][c] for c in op.columns}
    else:
        assert op.key in there and op.columns
        there[op.key] = {**there[op.key], **{c: here[op.key][c] for c in op.columns}}


@given(_rows, _rows, st.sets(st.integers(0, 12)))
def test_the_peer_ends_with_the_sites_rows_except_those_with_a_change_on_its_way(here, there, flight):  # type: ignore[no-untyped-def]
    p = plan(here, there, COLS, flight)
    after = {k: dict(v) for k, v in there.items()}
    for op in p.ops:
        _apply(after, here, op)
    for k in set(here) | set(there):  # rows equal as values.same says (0 read as '0' elsewhere is 0)
        if k in flight:
            assert _same_row(after.get(k), there.get(k))
        else:
            assert _same_row(after.get(k), here.get(k))
    differ = {k for k in set(here) | set(there) if not _same_row(here.get(k), there.get(k))}
    assert set(p.left) == differ & flight
    assert {o.key for o in p.ops} == differ - flight  # one change per differing row, none for equal ones
    assert len(p.ops) == len({o.key for o in p.ops})


@given(_rows, st.sets(st.integers(0, 12)))
def test_equal_sites_send_nothing(rows, flight):  # type: ignore[no-untyped-def]
    p = plan(rows, {k: dict(v) for k, v in rows.items()}, COLS, flight)
    assert p.ops == () and p.left == ()


def test_an_update_names_only_the_columns_that_differ() -> None:
    p = plan({1: {"a": 1, "b": 2, "c": 3}}, {1: {"a": 1, "b": 5, "c": 3}}, ["c", "b", "a"], set())
    assert p.ops == (Op(UPDATE, 1, ("b",)),)
    assert p.count(UPDATE) == 1 and p.count(INSERT) == 0


def test_columns_outside_the_shared_ones_are_not_compared() -> None:
    assert plan({1: {"a": 1, "x": 1}}, {1: {"a": 1, "x": 2}}, ["a"], set()).ops == ()


def test_keys_of_mixed_types_still_get_one_order() -> None:
    p = plan({1: {"a": 1}, "k": {"a": 1}}, {}, ["a"], set())
    assert [o.key for o in p.ops] == [1, "k"]


@given(st.dictionaries(st.integers(0, 12), st.tuples(st.integers(0, 10**6), st.integers(0, 2)), max_size=10), st.data())
def test_the_same_decimals_read_from_other_databases_send_nothing(rows, data) -> None:  # type: ignore[no-untyped-def]
    """The site reads a NUMERIC(12,2) as SQLite gives it (a float, or the text its adapter binds),
    the peer as a server's driver does (a Decimal with the column's scale): equal values, no change
    (before, every row was sent as an update: 1.5 != Decimal('1.50'))."""
    from decimal import Decimal

    from multimaster.core.values import ColumnType

    here = {k: {"price": float(Decimal(c).scaleb(-2)), "q": q} for k, (c, q) in rows.items()}
    there = {k: {"price": Decimal(c).scaleb(-2).quantize(Decimal("0.01")), "q": Decimal(q)} for k, (c, q) in rows.items()}
    if data.draw(st.booleans()):
        here = {k: {**r, "price": str(Decimal(repr(r["price"])))} for k, r in here.items()}
    types = {"price": ColumnType("decimal", 2), "q": ColumnType("int")}
    assert plan(here, there, ["price", "q"], set(), types) == plan(there, here, ["price", "q"], set(), types)
    assert plan(here, there, ["price", "q"], set(), types).ops == ()
    changed = data.draw(st.sampled_from(sorted(rows))) if rows else None
    if changed is not None:
        here[changed] = {**here[changed], "q": here[changed]["q"] + 1}
        assert plan(here, there, ["price", "q"], set(), types).ops == (Op(UPDATE, changed, ("q",)),)
