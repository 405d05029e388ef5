"""core/batches.py against a reference model: transactions drawn at random positions of one clock,
some still running (all their positions at or past the horizon, and invisible to the reader), the
rest committed; the model finds by brute force the highest cut at most the horizon that splits no
transaction, and the batches must hold exactly the entries below it, none split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from multimaster.core.batches import clean, plan_cuts


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[int, object]], dict[object, list[int]], int, int]:
    n = draw(st.integers(0, 40))
    ntx = draw(st.integers(1, 12))
    owner = [draw(st.integers(0, ntx - 1)) for _ in range(n)]
    positions = sorted(draw(st.sets(st.integers(1, 200), min_size=n, max_size=n)))
    txns: dict[object, list[int]] = {}
    for pos, t in zip(positions, owner):
        txns.setdefault(t, []).append(pos)
    horizon = draw(st.integers(1, 210))
    # a transaction whose positions are all at or past the horizon may still be running: invisible
    running = {t for t, ps in txns.items() if min(ps) >= horizon and draw(st.booleans())}
    unknown = draw(st.booleans())  # entries of one-entry transactions may come without a group
    entries: list[tuple[int, object]] = []
    for t, ps in txns.items():
        if t in running:
            continue
        for p in ps:
            entries.append((p, None if unknown and len(ps) == 1 else t))
    limit = draw(st.integers(1, 10))
    return entries, {t: ps for t, ps in txns.items() if t not in running}, horizon, limit


def reference_taken(txns: dict[object, list[int]], horizon: int) -> set[int]:
    """The entries below the highest cut c <= horizon that splits no transaction."""
    allpos = sorted(p for ps in txns.values() for p in ps)
    for c in range(horizon, 0, -1):
        if all(not (min(ps) < c <= max(ps)) for ps in txns.values()):
            return {p for p in allpos if p < c}
    return set()


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_cuts_match_the_reference(sc: tuple[list[tuple[int, object]], dict[object, list[int]], int, int]) -> None:
    entries, txns, horizon, limit = sc
    cuts = plan_cuts(entries, horizon, limit)
    positions = sorted(p for p, _ in entries)
    # batches are consecutive and non-empty, each cut is clean and at most the horizon
    batches: list[list[int]] = []
    lo = -1
    for c in cuts:
        assert c > lo
        assert c <= horizon
        b = [p for p in positions if lo <= p < c] if lo >= 0 else [p for p in positions if p < c]
        assert b, "an empty batch"
        batches.append(b)
        lo = c
        # no transaction has entries on both sides of a cut
        assert all(not (min(ps) < c <= max(ps)) for ps in txns.values())
        assert clean(entries, c)
    taken = [p for b in batches for p in b]
    assert len(taken) == len(set(taken)), "an entry twice"
    assert set(taken) == reference_taken(txns, horizon), "skipped, or held back without cause"

    # a batch holds at most `limit` entries unless it is one stretch (no clean cut inside it),
    # and it is full: the next batch's first stretch would not have fit
    def stretches(b: list[int]) -> list[list[int]]:
        out: list[list[int]] = [[]]
        for i, p in enumerate(b):
            out[-1].append(p)
            if i + 1 < len(b) and clean(entries, b[i + 1]):
                out.append([])
        return out

    for i, b in enumerate(batches):
        assert len(b) <= limit or len(stretches(b)) == 1
        if i + 1 < len(batches):
            assert len(b) + len(stretches(batches[i + 1])[0]) > limit


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 100), st.integers(0, 5)), unique_by=lambda e: e[0], max_size=30), st.integers(1, 8))
def test_without_horizon_everything_goes_in_whole_transactions(entries: list[tuple[int, int]], limit: int) -> None:
    cuts = plan_cuts(entries, None, limit)
    if not entries:
        assert cuts == []
        return
    assert cuts[-1] > max(p for p, _ in entries)
    assert all(clean(entries, c) for c in cuts)


def test_one_transaction_larger_than_the_limit_is_one_batch() -> None:
    entries = [(1, "a"), (2, "b"), (3, "a"), (4, "b"), (5, "c")]
    assert plan_cuts(entries, 10, 1) == [5, 6]
    assert plan_cuts(entries, 10, 4) == [5, 6]
    assert plan_cuts(entries, 10, 5) == [6]


def test_a_transaction_past_the_horizon_holds_back_what_follows_its_start() -> None:
    entries = [(1, "a"), (2, "b"), (3, "c"), (7, "b")]
    assert plan_cuts(entries, 5, 100) == [2]
