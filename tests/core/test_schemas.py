"""core/schemas.py: an entry carried between two sites' layouts by column name keeps every value
both sites have, drops what the receiving site dropped, and keeps apart (pending) exactly what the
receiving site needs and lacks; the mask remap, the narrowing rule and the value codec."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multimaster.core.schemas import (
    Col,
    decode_pending,
    encode_pending,
    evolution,
    literal_default,
    narrowing,
    remap_mask,
    translate,
)

NAMES = ["a", "b", "c", "d", "e", "f"]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[str], list[str], frozenset[str]]:
    src = sorted(draw(st.sets(st.sampled_from(NAMES), max_size=6)))
    dst = sorted(draw(st.sets(st.sampled_from(NAMES), max_size=6)))
    dropped = frozenset(draw(st.sets(st.sampled_from([c for c in NAMES if c not in dst] or ["zz"]))))
    return src, dst, dropped


@given(layouts(), st.sampled_from("IUD"), st.data())
def test_translate_carries_by_name(lay, op, data):  # type: ignore[no-untyped-def]
    src, dst, dropped = lay
    mask = data.draw(st.integers(0, (1 << len(src)) - 1)) if op == "U" else (1 << len(src)) - 1
    new = [data.draw(st.one_of(st.none(), st.integers())) for _ in src]
    old = [data.draw(st.one_of(st.none(), st.integers())) for _ in src]
    defaults = {c: f"default of {c}" for c in dst}
    t = translate(op, mask, new, old, src, dst, dropped, defaults)
    for i, c in enumerate(src):
        carried = bool(mask >> i & 1)
        if c in dst:
            j = dst.index(c)
            assert bool(t.mask >> j & 1) == carried
            if carried:
                assert (t.new[j], t.old[j]) == (new[i], old[i])
        else:
            needs = carried and c not in dropped and op != "D" and (op == "U" or new[i] is not None)
            assert (c in t.pending) == needs
            if needs:
                assert t.pending[c] == (new[i], old[i])
    for j, c in enumerate(dst):
        if c not in src:  # an insert from a site without the column takes this site's default
            assert bool(t.mask >> j & 1) == (op == "I")
            assert t.new[j] == (defaults[c] if op == "I" else None)


@given(layouts(), st.data())
def test_remap_mask_is_translate_of_the_mask(lay, data):  # type: ignore[no-untyped-def]
    src, dst, _ = lay
    mask = data.draw(st.integers(0, (1 << len(src)) - 1))
    t = translate("U", mask, [1] * len(src), [1] * len(src), src, dst, frozenset(src))
    assert remap_mask(mask, src, dst) == t.mask


def test_narrowing():  # type: ignore[no-untyped-def]
    assert narrowing("VARCHAR(40)", "VARCHAR(10)") and not narrowing("VARCHAR(10)", "VARCHAR(40)")
    assert not narrowing("character varying(10)", "text") and narrowing("text", "character varying(10)")
    assert narrowing("BIGINT", "INTEGER") and not narrowing("INT", "BIGINT") and not narrowing("integer", "bigint")
    assert narrowing("NUMERIC(10,2)", "NUMERIC(10,3)") and not narrowing("NUMERIC(10,2)", "NUMERIC(12,2)")
    assert narrowing("DOUBLE PRECISION", "REAL") and narrowing("TEXT", "INTEGER")


def test_evolution_refuses_what_is_not_online():  # type: ignore[no-untyped-def]
    old = [Col("name", "VARCHAR(40)"), Col("qty", "BIGINT")]
    new = [Col("code", "INT", nullable=False), Col("name", "VARCHAR(10)"), Col("qty", "BIGINT"), Col("x", "INT", False, True)]
    ev = evolution("a", "items", old, new, {"code": ["b"], "x": ["b"]})
    assert ev.added == ("code", "x") and ev.retyped == ("name",)
    assert len(ev.problems) == 2
    assert "items.name was narrowed from VARCHAR(40) to VARCHAR(10)" in ev.problems[0]
    assert "items.code is NOT NULL without a default while site(s) b" in ev.problems[1]
    assert not evolution("a", "items", old, new[:1] + old, {"code": []}).problems  # every other site has it


def test_literal_defaults():  # type: ignore[no-untyped-def]
    assert literal_default("'grey'::text") == (True, "grey")
    assert literal_default("'it''s'") == (True, "it's")
    assert literal_default("0") == (True, 0) and literal_default("'1.50'::numeric") == (True, "1.50")
    assert literal_default("NULL") == (True, None) and literal_default(None) == (False, None)
    assert literal_default("now()") == (False, None) and literal_default("nextval('s'::regclass)") == (False, None)


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.text(),
    st.binary(),
    st.datetimes(),
    st.dates(),
    st.times(),
    st.timedeltas(),
    st.dictionaries(st.text(), st.integers(), max_size=3),
)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES), st.tuples(values, values), max_size=3))
def test_pending_values_come_back_with_their_types(pending):  # type: ignore[no-untyped-def]
    back = decode_pending(encode_pending(pending))
    assert back == pending
    for c, (n, o) in pending.items():
        assert type(back[c][0]) is type(n) and type(back[c][1]) is type(o)
    assert isinstance(decode_pending(encode_pending({"a": (Decimal("1.5"), dt.date(2020, 1, 1))}))["a"][0], Decimal)
