"""The keys of renumbered tables (core/keys.py) checked with hypothesis against a reference model:
the key of an identity is base + its rank among every identity ever known, counted over the whole
history, whatever a site's shadow still holds after purges (docs/concepts.md, docs/operations.md
"Tombstones and the conflict log", docs/schema-changes.md "A table made again")."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multimaster.core.keys import key_differences, rank_moves, ranked, remade


def _rid(i: int) -> str:
    return f"{i:019d}:s{i % 3}"


@st.composite
def _remade_site(draw):  # type: ignore[no-untyped-def]
    """A site's state when its renumbered table was made again, with the keys every site agrees
    on (`true`): identities 0..n-1 in rid order with keys base + 1 ... base + n; some deleted, some
    tombstones purged (never the greatest identity, which the purge keeps); the last `local` ones
    inserted here and not ranked yet (drawn keys above the floor, in any order, with gaps); rows of
    live identities (some deleted while capture was missing), identities whose insert is held (no
    row), and rows no capture saw at keys no live identity holds."""
    base = draw(st.integers(0, 5))
    n = draw(st.integers(0, 14))
    true = {_rid(i): base + i + 1 for i in range(n)}
    rids = list(true)
    dead = {r for r in rids if draw(st.booleans())}
    local = draw(st.integers(0, n))
    floor_i = n - local  # identities at or above it were inserted here since keys were last ranked
    unranked = rids[floor_i:]
    floor = base + floor_i
    drawn = draw(
        st.permutations(sorted(draw(st.sets(st.integers(floor + 1, floor + 3 * n + 3), min_size=local, max_size=local))))
    )
    keys = dict(true)
    keys.update(zip(unranked, drawn))
    purged = {r for r in dead if r not in unranked and r != (rids[-1] if rids else None) and draw(st.booleans())}
    known = {r: (keys[r], r in dead) for r in rids if r not in purged}
    live = [r for r in rids if r not in dead]
    held = {r for r in live if draw(st.booleans()) and draw(st.booleans())}
    gone = {r for r in live if draw(st.booleans()) and draw(st.booleans())}  # deleted while capture was missing
    rows = {keys[r] for r in live if r not in held and r not in gone}
    taken = {keys[r] for r in live}
    extra = draw(st.sets(st.integers(1, base + 3 * n + 6), max_size=5)) - taken
    at_held = {keys[r] for r in held if draw(st.booleans())}  # a row no capture saw took a held insert's key
    rows |= extra | at_held
    return base, true, known, rows, held, (floor if local else draw(st.sampled_from([None, floor]))), extra | at_held


@given(_remade_site())
def test_a_table_made_again_keeps_every_identitys_key_and_places_the_new_rows_last(site) -> None:  # type: ignore[no-untyped-def]
    base, true, known, rows, held, floor, new_rows = site
    r = remade(known, rows, held, floor, base)
    after = {rid: k for rid, (k, _dead) in known.items()}
    for rid, old, new in r.moves:
        assert after[rid] == old
        after[rid] = new
    # every identity the site still holds has the key it has at every other site
    assert after == {rid: true[rid] for rid in known}
    # the rows no capture saw are taken out and take the next keys, as local inserts
    assert r.unseen == sorted(new_rows)
    top = max([base, *true.values()])
    assert r.placed == list(range(top + 1, top + 1 + len(new_rows)))
    assert not set(r.placed) & set(after.values())


@given(st.dictionaries(st.integers(0, 30).map(_rid), st.integers(1, 40), max_size=12), st.integers(0, 40))
def test_rank_moves_rank_the_keys_above_the_floor_in_identity_order_and_leave_the_others(known, floor) -> None:  # type: ignore[no-untyped-def]
    out = ranked(known, floor)
    below = {r: k for r, k in known.items() if k <= floor}
    above = sorted(r for r, k in known.items() if k > floor)
    assert {r: out[r] for r in below} == below
    assert [out[r] for r in above] == list(range(floor + 1, floor + 1 + len(above)))
    assert all(known[r] != new == out[r] and old == known[r] for r, old, new in rank_moves(known.items(), floor))
    assert ranked(known, None) == known


@st.composite
def _two_sites(draw):  # type: ignore[no-untyped-def]
    """Two sites' shadows (identity -> key) out of one history: every identity is known at both,
    or on its way to one of them (or to both), or was a tombstone one of them purged. A site's key
    of an identity is base + its rank among the identities that site has known (purged ones
    included)."""
    n = draw(st.integers(0, 14))
    rids = [_rid(i) for i in range(n)]
    where = {
        r: draw(st.sampled_from(["both", "both", "both", "to_here", "to_there", "to_both", "purged_here", "purged_there"]))
        for r in rids
    }
    on_way = {r for r in rids if where[r].startswith("to_")}
    seen_here = [r for r in rids if where[r] not in ("to_here", "to_both")]
    seen_there = [r for r in rids if where[r] not in ("to_there", "to_both")]
    here = {r: i + 1 for i, r in enumerate(seen_here) if where[r] != "purged_here"}
    there = {r: i + 1 for i, r in enumerate(seen_there) if where[r] != "purged_there"}
    return here, there, on_way


@given(_two_sites())
def test_sites_that_agree_on_the_history_show_no_key_difference(sites) -> None:  # type: ignore[no-untyped-def]
    here, there, on_way = sites
    assert key_differences(here, there, on_way) == []


@given(_two_sites(), st.data())
def test_a_moved_key_below_everything_on_its_way_is_reported(sites, data) -> None:  # type: ignore[no-untyped-def]
    here, there, on_way = sites
    coming = [r for r in on_way if (r in here) != (r in there)]
    lowest = min(coming, default=None)
    shared = sorted(r for r in here.keys() & there.keys() if lowest is None or r < lowest)
    if not shared:
        return
    r = data.draw(st.sampled_from(shared))
    moved = {**here, r: here[r] + data.draw(st.integers(1, 5))}
    assert (r, moved[r], there[r]) in key_differences(moved, there, on_way)
