"""Who gives what of a removed site's change log to whom (core/salvage.py), checked against a
reference model that knows each site's holdings as sets of positions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multimaster.core.salvage import Behind, CatchUp, Copy, Holding, plan, verdict


def _reference_reach(holdings: list[Holding], site: str) -> int:
    """The model: each other site holds the set of positions (kept, position]; `site` can reach
    the highest q such that every position from its own position + 1 to q is in one of those sets."""
    me = next(h for h in holdings if h.site == site)
    held: set[int] = set()
    for h in holdings:
        if h.site != site:
            held |= set(range(h.kept + 1, h.position + 1))
    q = me.position
    while q + 1 in held:
        q += 1
    return q


@st.composite
def _holdings(draw: st.DrawFn) -> list[Holding]:
    n = draw(st.integers(1, 5))
    out = []
    for i in range(n):
        position = draw(st.integers(0, 40))
        kept = draw(st.integers(0, position))
        out.append(Holding(f"s{i + 1}", position, kept))
    return out


@given(_holdings())
def test_each_site_reaches_what_the_others_hold_without_a_hole(holdings: list[Holding]) -> None:
    got = plan(holdings)
    goal = max(h.position for h in holdings)
    assert set(got) == {h.site for h in holdings}
    by = {h.site: h for h in holdings}
    for h in holdings:
        c = got[h.site]
        assert (c.start, c.goal) == (h.position, goal)
        assert c.reaches == min(_reference_reach(holdings, h.site), goal) == _reference_reach(holdings, h.site)
        assert c.short == (c.reaches < goal)
        cur = h.position
        for cp in c.copies:  # contiguous, each within what its giver holds, never from itself
            d = by[cp.donor]
            assert cp.donor != h.site and cp.after == cur and d.kept <= cp.after < cp.upto == d.position
            cur = cp.upto


@given(_holdings())
def test_the_plan_does_not_depend_on_the_order_the_holdings_come_in(holdings: list[Holding]) -> None:
    assert plan(holdings) == plan(list(reversed(holdings)))


def test_a_site_behind_gets_from_the_furthest_and_chains_past_a_purged_range() -> None:
    got = plan([Holding("s1", 10, 4), Holding("s2", 3, 0), Holding("s3", 6, 2), Holding("s4", 12, 9)])
    assert got["s2"] == CatchUp("s2", 3, 12, (Copy("s3", 3, 6), Copy("s1", 6, 10), Copy("s4", 10, 12)))
    assert got["s4"].copies == () and not got["s4"].short
    purged = plan([Holding("s1", 10, 10), Holding("s2", 3, 0)])
    assert purged["s2"].copies == () and purged["s2"].short and purged["s2"].reaches == 3


def test_holdings_are_checked() -> None:
    with pytest.raises(ValueError, match="kept"):
        plan([Holding("s1", 3, 4)])
    with pytest.raises(ValueError, match="one holding per site"):
        plan([Holding("s1", 3, 0), Holding("s1", 4, 0)])


VERS = st.one_of(st.none(), st.sampled_from(["%019d:s9" % v for v in (5, 7, 12, 100)]))


@given(st.dictionaries(st.sampled_from(["s1", "s2", "s3", "s4"]), VERS, max_size=4))
def test_the_sites_below_the_highest_version_are_behind(applied: dict[str, str | None]) -> None:
    got = verdict(applied)
    tops = [v for v in applied.values() if v is not None]
    if not tops:
        assert got == []
        return
    top = max(tops)
    assert [b.site for b in got] == sorted(s for s, v in applied.items() if v != top)
    for b in got:
        assert b == Behind(b.site, applied[b.site], top, min(s for s, v in applied.items() if v == top))
