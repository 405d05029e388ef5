"""What a link's oldest waiting change waits for, and when the link is stalled (core/waits.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multimaster.core.versions import base_rid
from multimaster.core.waits import Wait, behind, behind_message, reason, stalled

MS = 65536  # one millisecond of the hybrid clock


def _ver(ms: int, site: str) -> str:
    return "%019d:%s" % (ms * MS, site)


def test_an_update_of_a_row_never_received_names_who_inserted_it() -> None:
    w = Wait(3, "items", _ver(1000, "s2"), "s2", "U", _ver(900, "s3"), row_known=False)
    assert reason(w) == f"items: an update from s2 of row {_ver(900, 's3')} (inserted at s3), which this site has not received"
    d = Wait(1, "items", _ver(1000, "s2"), "s2", "D", base_rid(7), row_known=False)
    assert "a delete from s2 of row" in reason(d) and "inserted at" not in reason(d)


def test_a_change_of_a_known_row_waits_for_its_origin_or_a_reference() -> None:
    w = Wait(1, "child", _ver(1000, "s2"), "s2", "I", _ver(1000, "s2"), row_known=False)
    assert "waits for an earlier change of s2 or a row it references" in reason(w)
    u = Wait(1, "child", _ver(1000, "s2"), "s2", "U", _ver(5, "s1"), row_known=True)
    assert "waits for an earlier change of s2" in reason(u)


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.one_of(st.none(), st.floats(0.001, 10**4)))
def test_stalled_exactly_when_the_oldest_is_older_than_the_limit(made_ms: int, later_ms: int, after: float | None) -> None:
    w = Wait(1, "t", _ver(made_ms, "s1"), "s1", "U", _ver(made_ms, "s1"), True)
    now = made_ms + later_ms
    assert stalled(w, now, after) == (after is not None and later_ms / 1000 >= after)
    assert not stalled(None, now, after)
    assert not stalled(Wait(0, "t", w.ver, "s1", "U", w.rid, True), now, after)


def _iso(s: int) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s))


@given(
    st.one_of(st.none(), st.integers(0, 10_000)),
    st.one_of(st.none(), st.integers(0, 10_000)),
    st.integers(0, 20_000),
    st.one_of(st.none(), st.integers(0, 3_000)),
)
def test_a_link_fails_when_its_last_refresh_failed_and_none_succeeded_for_the_grace(
    ok: int | None, bad: int | None, now: int, after: int | None
) -> None:
    """core/waits.py failing against the rule in seconds: an error after the last success (or no
    success at all), and the last success at least `after` seconds ago; never without an error or
    without a grace ('off')."""
    from multimaster.core.waits import failing

    want = bad is not None and after is not None and (ok is None or (ok < bad and now - ok >= after))
    assert failing(None if ok is None else _iso(ok), None if bad is None else _iso(bad), _iso(now), after) == want


@given(
    st.one_of(st.none(), st.integers(0, 10_000)),
    st.integers(0, 10_000),
    st.integers(0, 20_000),
    st.one_of(st.none(), st.integers(0, 3_000)),
)
def test_a_failure_that_needs_action_is_failing_at_once(ok: int | None, bad: int, now: int, after: int | None) -> None:
    """An error marked NEEDS_ACTION (a success takes the mark off, store/links.py stats) is failing
    whatever the grace, and whenever the last success was; an unmarked one keeps the grace."""
    from multimaster.core.waits import NEEDS_ACTION, failing

    last_ok = None if ok is None else _iso(ok)
    assert failing(last_ok, _iso(bad), _iso(now), after, NEEDS_ACTION + "site 's2' has no replication objects")
    want = after is not None and (ok is None or (ok < bad and now - ok >= after))
    assert failing(last_ok, _iso(bad), _iso(now), after, "OperationalError: connection refused") == want


_S = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(st.integers(0, 5), st.none() | _S, st.none() | _S, st.none() | _S, _S)
def test_behind_exactly_when_changes_wait_and_nothing_progressed_for_the_limit(
    waiting: int, oldest: float | None, since: float | None, after: float | None, allowance: float
) -> None:
    got = behind(waiting, oldest, since, after, allowance)
    if after is None or waiting == 0 or oldest is None:
        assert got is None
        return
    stuck = oldest if since is None else min(oldest, since)
    assert (got is not None) == (stuck >= after + allowance)
    if got is not None:  # how long: never more than the oldest change's age, nor the time since a success
        assert got == stuck and got <= oldest and (since is None or got <= since)


def test_a_recent_success_or_a_recent_change_is_not_behind() -> None:
    assert behind(3, 900.0, 5.0, 60.0) is None  # refreshed 5 s ago: taking its old changes
    assert behind(3, 5.0, 900.0, 60.0) is None  # a change made 5 s ago on a link refreshed by hand
    assert behind(3, 900.0, 120.0, 60.0) == 120.0
    assert behind(3, 900.0, 120.0, 60.0, allowance_s=86400.0) is None  # a nightly link's wait


def test_a_link_behind_names_the_recorded_refresh_waiting_else_what_is_known() -> None:
    """A refresh's recorded lock wait (store/running.py) is named over an older last error and
    over the guess; without one, the last error after the last success, else the guess."""
    run = ("2026-11-30T07:29:35Z", "vm:14833", "2026-11-30T07:29:36Z", "s1 -> s2: waiting 0.3 s for a lock at s2, held by pid 7")
    m = behind_message("s1", "s2", 1, 3.0, 3.0, "2026-11-30T07:29:32Z", "an old error", run)
    assert m.startswith("link s1 -> s2 behind: 1 change(s) wait at 's1'"), m
    assert "a refresh of it running since 2026-11-30T07:29:35Z (process vm:14833) waits for a lock since " in m, m
    assert run[3] in m and "an old error" not in m and "--site s2 --peer s1" in m, m
    assert "no refresher runs" not in m, m
    m = behind_message("s1", "s2", 1, 3.0, 3.0, None, "lock timeout")
    assert "its last failed refresh said: lock timeout" in m and "since it was set up" in m, m
    m = behind_message("s1", "s2", 1, 3.0, 3.0, None, None)
    assert "one is running and not finishing" in m and "start 'multimaster run -t FILE --site s2'" in m, m
