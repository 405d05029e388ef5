"""Versions: '%019d:%s' % (hlc, origin), compared as strings (docs/concepts.md, docs/clock.md)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from multimaster.core import versions

hlcs = st.integers(0, 10**19 - 1)
# site names are identifiers (a first letter or _, then letters, digits, _); a few characters
# suffice, and few make ties and prefixes likely
origins = st.builds(str.__add__, st.sampled_from("aAsZ_"), st.text("a0s1Z_9", max_size=4))


@settings(max_examples=200, deadline=None)
@given(hlc=hlcs, origin=origins)
def test_make_ver_round_trips(hlc: int, origin: str) -> None:
    v = versions.make_ver(hlc, origin)
    assert len(v) == 20 + len(origin) and v[19] == ":" and v[:19].isdigit()
    assert versions.ver_hlc(v) == hlc
    assert versions.ver_origin(v) == origin
    assert versions.ver_ms(v) == hlc >> versions.HLC_SHIFT


@settings(max_examples=300, deadline=None)
@given(a=st.tuples(hlcs, origins), b=st.tuples(hlcs, origins))
def test_string_order_is_timestamp_then_site_name(a: tuple[int, str], b: tuple[int, str]) -> None:
    va, vb = versions.make_ver(*a), versions.make_ver(*b)
    assert (va < vb) == (a < b)
    assert (va == vb) == (a == b)


@settings(max_examples=100, deadline=None)
@given(h=st.integers(0, 10**12), origin=origins)
def test_same_timestamp_orders_by_site_name_even_for_prefixes(h: int, origin: str) -> None:
    assert versions.make_ver(h, origin) < versions.make_ver(h, origin + "0")
    assert versions.make_ver(h, origin + "z") < versions.make_ver(h + 1, origin)


def test_wall_clock_part() -> None:
    ms = 1_700_000_000_123
    for counter in (0, 1, 65535):
        v = versions.make_ver((ms << versions.HLC_SHIFT) + counter, "s1")
        assert versions.ver_ms(v) == ms
    assert versions.HLC_SHIFT == 16
    assert versions.make_ver(5, "s1") == "0000000000000000005:s1"


@settings(max_examples=100, deadline=None)
@given(key=st.integers(0, 10**9), hlc=st.integers(1, 10**19 - 1), origin=origins)
def test_base_rows_sort_before_every_replicated_change(key: int, hlc: int, origin: str) -> None:
    rid = versions.base_rid(key)
    assert rid == versions.BASE_VER + f"#{key}"
    assert rid < versions.make_ver(hlc, origin)
    assert versions.BASE_VER < rid
    assert versions.ver_hlc(rid) == 0 and versions.ver_ms(rid) == 0
    assert versions.ver_origin(rid) == f"#{key}"
    assert versions.ver_origin(versions.BASE_VER) == ""


def test_natural_rid() -> None:
    assert versions.natural_rid("x") == "k:x"
    assert versions.natural_rid(42) == "k:42"
    later = versions.natural_rid("x") + "@" + versions.make_ver(3, "s1")
    assert versions.natural_rid("x") < later  # a later life sorts after the first


def test_hlc_now_follows_the_wall_clock_and_never_goes_back() -> None:
    before = int(time.time() * 1000) << versions.HLC_SHIFT
    h = versions.hlc_now()
    after = int(time.time() * 1000) << versions.HLC_SHIFT
    assert before <= h <= after
    ahead = after + (10_000 << versions.HLC_SHIFT)  # a floor in the future (a peer's clock)
    assert versions.hlc_now(ahead) == ahead + 1
    assert versions.hlc_now(versions.hlc_now(ahead)) == ahead + 2
    assert versions.hlc_now(0) >= before
