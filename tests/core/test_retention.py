"""The pure decisions of bounded state (multimaster.core.retention): which tombstones every site
had dead at its observation, and when an observation may be purged with."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multimaster.core.retention import Observation, delete_horizon, everywhere, holding, passed, pick_fence, rank_floor
from multimaster.core.versions import BASE_VER, make_ver

SITES = ["s1", "s2", "s3"]
vers = st.builds(make_ver, st.integers(1, 50), st.sampled_from(SITES))
maybe_ver = st.one_of(st.none(), st.integers(1, 50))


@st.composite
def observation(draw, site):  # type: ignore[no-untyped-def]
    applied = {o: make_ver(h, o) for o in SITES if o != site for h in [draw(maybe_ver)] if h is not None}
    own = draw(maybe_ver)
    return Observation(site, applied, None if own is None else make_ver(own, site))


@given(observation("s2"), observation("s3"), vers)
def test_a_delete_is_under_the_horizon_exactly_when_every_other_site_had_it(o2, o3, dv):  # type: ignore[no-untyped-def]
    fences = {"s2": o2, "s3": o3}
    hz = delete_horizon(dv[20:], "s1", SITES, fences)
    assert (hz is not None and dv <= hz) == (o2.has(dv) and o3.has(dv))
    assert everywhere(dv, "s1", SITES, fences) == (o2.has(dv) and o3.has(dv))


@given(observation("s2"), observation("s3"), st.dictionaries(st.sampled_from(SITES), vers))
def test_nothing_new_can_arrive_below_the_rank_floor(o2, o3, applied_here):  # type: ignore[no-untyped-def]
    fences = {"s2": o2, "s3": o3}
    floor = rank_floor("s1", SITES, fences, applied_here)
    for f in (o2, o3):
        # what s1 can still receive from f.site is past both of these
        bounds = [v for v in (applied_here.get(f.site), f.clock_floor) if v]
        assert floor <= (max(bounds) if bounds else BASE_VER)


@given(
    st.one_of(st.none(), observation("s2")),
    st.one_of(st.none(), observation("s2")),
    st.dictionaries(st.sampled_from(SITES), vers),
)
def test_the_fence_picked_has_been_caught_up_with(stored, fresh, applied_here):  # type: ignore[no-untyped-def]
    f = pick_fence(stored, fresh, applied_here)
    if f is not None:
        assert passed(f, applied_here)
        assert f is fresh or not (fresh is not None and passed(fresh, applied_here))
    else:
        assert all(o is None or not passed(o, applied_here) for o in (stored, fresh))
    assert holding("s1", ["s1", "s2"], {"s2": f}, applied_here) == ([] if f is not None else ["s2"])


def test_a_single_site_has_nothing_to_wait_for():  # type: ignore[no-untyped-def]
    assert delete_horizon("s1", "s1", ["s1"], {}) > make_ver(10**18, "s1")
    assert rank_floor("s1", ["s1"], {}, {}) > make_ver(10**18, "s1")


def test_the_common_base_is_everywhere():  # type: ignore[no-untyped-def]
    o = Observation("s2", {}, None)
    assert o.has(BASE_VER) and not o.has(make_ver(1, "s3")) and not o.has(make_ver(1, "s2"))
    assert Observation("s2", {}, make_ver(5, "s2")).has(make_ver(5, "s2"))
