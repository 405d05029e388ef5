"""core/batches.py against a reference model: transactions drawn at random positions of one clock,
some still running (all their positions at or past the horizon, and invisible to the reader), the
rest committed; the model finds by brute force the highest cut at most the horizon that splits no
transaction, and the batches must hold exactly the entries below it, none split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from multimaster.core.batches import clean, plan_cuts, stream_step


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


# --- stream_step: a link read window after window, a transaction longer than the window in pieces


@st.composite
def streams(draw: st.DrawFn) -> tuple[dict[object, list[tuple[int, int]]], set[object], int, int, int]:
    """Transactions of (position, table) entries on one clock over up to three tables; some still
    running (every position at or past the horizon, invisible); a window and a batch limit."""
    n = draw(st.integers(0, 40))
    ntx = draw(st.integers(1, 10))
    ntables = draw(st.integers(1, 3))
    positions = sorted(draw(st.sets(st.integers(1, 120), min_size=n, max_size=n)))
    # long transactions are what this is about: a few owners take most entries
    owner = [draw(st.integers(0, ntx - 1)) if draw(st.booleans()) else 0 for _ in range(n)]
    txns: dict[object, list[tuple[int, int]]] = {}
    for pos, t in zip(positions, owner):
        txns.setdefault(t, []).append((pos, draw(st.integers(0, ntables - 1))))
    horizon = draw(st.integers(1, 130))
    running = {t for t, es in txns.items() if min(p for p, _ in es) >= horizon and draw(st.booleans())}
    return txns, running, horizon, draw(st.integers(1, 6)), draw(st.integers(1, 5))


def _read(
    visible: list[tuple[int, int, object]], wms: dict[int, int], window: int
) -> tuple[dict[int, list[tuple[int, object]]], int | None, set[object], int | None]:
    """What engine/pull.py pull_link returns of the model: per table the first `window` entries
    past its watermark, the window's end, the transactions read below it with entries past a cut
    table's last entry read, and the highest such position."""
    rows = {t: [(p, g) for p, tb, g in visible if tb == t and p > wm][:window] for t, wm in wms.items()}
    cut = [t for t, r in rows.items() if len(r) >= window]
    if not cut:
        return rows, None, set(), None
    end = min(rows[t][-1][0] + 1 for t in cut)
    seen = {g for r in rows.values() for p, g in r if p < end}
    past = [(p, g) for p, tb, g in visible for t in cut if tb == t and p > rows[t][-1][0] and g in seen]
    return rows, end, {g for _, g in past}, max((p for p, _ in past), default=None)


@settings(max_examples=500, deadline=None)
@given(streams())
def test_stream_takes_whole_transactions_in_bounded_reads(
    sc: tuple[dict[object, list[tuple[int, int]]], set[object], int, int, int],
) -> None:
    txns, running, horizon, window, limit = sc
    visible = sorted((p, tb, g) for g, es in txns.items() if g not in running for p, tb in es)
    tables = {tb for es in txns.values() for _, tb in es} or {0}
    wms = dict.fromkeys(tables, 0)
    commits: list[list[int]] = []
    stretch: list[int] | None = None
    before: dict[int, int] = dict(wms)
    reach: int | None = None
    for _ in range(500):
        rows, end, continuing, beyond = _read(visible, wms, window)
        assert all(len(r) <= window for r in rows.values()), "a read larger than the window"
        entries = [e for r in rows.values() for e in r]
        step = stream_step(entries, horizon, end, continuing, beyond, limit, reach)
        assert step.kind != "grow", "the reader knows how far every transaction reaches"

        def take(lo: int | None, hi: int) -> list[int]:
            got = sorted(p for p, _ in entries if (lo is None or p >= lo) and p < hi)
            for t, r in rows.items():
                mine = [p for p, _ in r if (lo is None or p >= lo) and p < hi]
                if mine:
                    wms[t] = mine[-1]
            return got

        if step.kind == "batches":
            assert stretch is None
            lo = None
            for c in step.cuts:
                commits.append(take(lo, c))
                lo = c
            before = dict(wms)
            if end is None:
                break
        elif step.kind == "piece":
            if stretch is None:
                stretch, before = [], dict(wms)
            assert step.reach is not None and step.cuts == [end]
            stretch += take(None, step.cuts[0])
            reach = step.reach
        elif step.kind == "finish":
            assert stretch is not None
            if step.cuts:
                stretch += take(None, step.cuts[0])
            commits.append(stretch)
            stretch, reach, before = None, None, dict(wms)
        else:  # hold: a stretch is rolled back, the refresh ends
            if stretch is not None:
                wms = dict(before)
                stretch, reach = None, None
            break
    else:
        raise AssertionError("the refresh never ended")
    assert stretch is None
    taken = [p for c in commits for p in c]
    assert len(taken) == len(set(taken)), "an entry twice"
    assert all(p < horizon for p in taken), "an entry at or past the horizon"
    committed = {g: [p for p, _ in es] for g, es in txns.items() if g not in running}
    for g, ps in committed.items():  # each transaction whole in one commit, or not taken
        homes = [i for i, c in enumerate(commits) if set(ps) & set(c)]
        assert len(homes) <= 1, f"transaction {g} split across commits"
        if homes:
            assert set(ps) <= set(commits[homes[0]]), f"transaction {g} taken in part"
    assert set(taken) == reference_taken(committed, horizon), "skipped, or held back without cause"


def test_stream_one_long_transaction_in_pieces() -> None:
    # 'a' at 1..6 in one table, a window of 2: piece, piece, then the stretch ends after 6
    s1 = stream_step([(1, "a"), (2, "a")], 100, 3, {"a"}, 6, 10)
    assert (s1.kind, s1.cuts, s1.reach) == ("piece", [3], 6)
    s2 = stream_step([(3, "a"), (4, "a")], 100, 5, {"a"}, 6, 10, s1.reach)
    assert (s2.kind, s2.cuts) == ("piece", [5])
    s3 = stream_step([(5, "a"), (6, "a")], 100, 7, set(), None, 10, s2.reach)
    assert s3.kind == "finish" and s3.cuts == [7]
    # the same transaction reaching the horizon: nothing taken
    assert stream_step([(1, "a"), (2, "a")], 5, 3, {"a"}, 6, 10).kind == "hold"
    # an agent that does not say how far it reaches: the window grows
    assert stream_step([(1, "a"), (2, "a")], 100, 3, {"a"}, None, 10).kind == "grow"
