"""When two values of a column are the same value (core/values.py), checked with hypothesis: an
equivalence; a value is the same value in every form a site's driver gives it or a dialect's value
adapter makes of it (dialects/types.py); values that differ as the kind defines differ."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from multimaster.core.values import ColumnType, canonical, differing, same
from multimaster.dialects import types

UTC = dt.timezone.utc

#: decimals SQLite keeps exact (docs/types.md: up to 15 significant digits), scale 0..4
decimals = st.builds(
    lambda digits, scale, neg: Decimal(digits).scaleb(-scale) * (-1 if neg else 1),
    st.integers(0, 10**14),
    st.integers(0, 4),
    st.booleans(),
)
naive = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)

#: kind -> values of that kind, as a server's driver returns them
VALUES = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "decimal": decimals,
    "float": st.floats(allow_nan=True, allow_infinity=True),
    "bool": st.booleans(),
    "text": st.text(max_size=8),
    "bytes": st.binary(max_size=8),
    "date": st.dates(),
    "timestamp": naive,
    "timestamptz": naive.map(lambda d: d.replace(tzinfo=UTC)),
    "json": json_values.filter(lambda v: v is not None),  # (a JSON null at the top is read as SQL NULL)
}
kinded = st.sampled_from(sorted(VALUES)).flatmap(lambda k: st.tuples(st.just(k), VALUES[k]))


def _forms(kind: str, v: object) -> list[object]:
    """`v` as every dialect's value adapter makes it (what recapture and repair write, and what
    SQLite then reads back), and as the drivers give it."""
    out = [v]
    for table in (types.NATIVE, types.SQLITE):
        f = types.adapter(table, kind)
        assert f is not None
        out.append(f(v))
    if kind == "decimal":
        assert isinstance(v, Decimal)
        out += [float(v), str(v), v.quantize(Decimal("0.000001"))]  # SQLite's REAL; more trailing zeros
    if kind == "timestamptz":
        assert isinstance(v, dt.datetime)
        out += [v.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30))), v.replace(tzinfo=None).isoformat(" ")]
    if kind == "bool":
        out += [int(bool(v)), "true" if v else "false"]
    if kind == "json":
        out += [json.dumps(v, sort_keys=True), json.dumps(v, indent=1)]
    if kind == "bytes":
        assert isinstance(v, bytes)
        out += [memoryview(v), bytearray(v), {"$hex": v.hex()}]
    return out


@given(kinded, st.data())
def test_a_value_is_the_same_value_in_every_form_a_site_holds_it(kv, data) -> None:  # type: ignore[no-untyped-def]
    kind, v = kv
    t = ColumnType(kind, 2 if kind == "decimal" and data.draw(st.booleans()) else None)
    forms = _forms(kind, v)
    for a in forms:
        for b in forms:
            assert same(a, b, t), (kind, a, b)
            assert hash(canonical(a, t)) == hash(canonical(b, t))


@given(kinded, kinded, kinded)
def test_same_is_an_equivalence(a, b, c) -> None:  # type: ignore[no-untyped-def]
    for kind in {a[0], b[0], c[0], None}:
        t = ColumnType(kind)
        x, y, z = a[1], b[1], c[1]
        assert same(x, x, t)
        assert same(x, y, t) == same(y, x, t)
        if same(x, y, t) and same(y, z, t):
            assert same(x, z, t)


@given(st.sampled_from(sorted(VALUES)).flatmap(lambda k: st.tuples(st.just(k), VALUES[k], VALUES[k])))
def test_different_values_differ(kvv) -> None:  # type: ignore[no-untyped-def]
    kind, a, b = kvv
    t = ColumnType(kind)
    if kind == "float":
        expect = a == b or (a != a and b != b)  # one NaN
    elif kind == "json":
        expect = _json_equal(a, b)
    else:
        expect = a == b
    assert same(a, b, t) == expect, (a, b)
    assert not same(a, None, t) and not same(None, b, t) and same(None, None, t)


def _json_equal(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@given(decimals, decimals, st.integers(0, 4))
def test_decimals_are_compared_at_the_declared_scale(a, b, scale) -> None:  # type: ignore[no-untyped-def]
    q = Decimal(1).scaleb(-scale)
    assert same(a, b, ColumnType("decimal", scale)) == (a.quantize(q, "ROUND_HALF_UP") == b.quantize(q, "ROUND_HALF_UP"))
    assert same(a, b, ColumnType("decimal")) == (a == b)


def test_the_forms_the_reported_defects_compared() -> None:
    price = ColumnType("decimal", 2)
    assert same(1.5, Decimal("1.50"), price) and same("1.50", 1.5, price)  # SQLite's REAL, PostgreSQL's Decimal
    assert not same(1.5, Decimal("1.51"), price) and not same("", None, ColumnType("text"))
    assert same("2024-05-01 10:00:00+00:00", dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))))
    assert same('{"a": 1, "b": [1, 2]}', {"b": [1, 2], "a": 1}, ColumnType("json"))
    assert same(1, True, ColumnType("bool")) and not same(0, True, ColumnType("bool"))
    assert same("1.50", Decimal("1.5"))  # no kind known: the text is read as the kind the other value shows
    assert differing({"a": 1.5, "b": "x"}, {"a": Decimal("1.50"), "b": "y"}, ["a", "b"], {"a": price}) == ("b",)
    assert same(float("nan"), float("nan"), ColumnType("float")) and same("abc", "abc", ColumnType("decimal"))
