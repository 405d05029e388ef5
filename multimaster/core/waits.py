"""Changes that wait, as operators see them (docs/operations.md "Stalled links"): what the oldest
waiting change of a link waits for, and when the link counts as stalled.

A change waits (``applied = 2`` in its snapshot) when it cannot be applied yet: an update or a
delete of a row this site has not received, a reference to a row not here yet, or an earlier
change of its origin that waits. Usually what it waits for arrives with the next refresh of some
other link. When it never comes (its origin is gone and no live site has it, or it was never
made), the link's later changes from that origin wait for good: that must not be silent.
"""

from __future__ import annotations

from dataclasses import dataclass

from multimaster.core.versions import BASE_VER, ver_ms

__all__ = ["Wait", "reason", "stalled", "fix", "failing", "behind", "behind_message", "since_s", "NEEDS_ACTION"]


@dataclass(frozen=True)
class Wait:
    """The oldest waiting change of a link at its target, and how many wait."""

    count: int
    table: str
    ver: str
    origin: str
    op: str
    rid: str
    row_known: bool  # whether the target holds the row (alive or deleted) the change is of

    def age_s(self, now_ms: int) -> float:
        """Seconds since the oldest waiting change was made at its origin (its version's clock)."""
        return max(0.0, (now_ms - ver_ms(self.ver)) / 1000)


def _inserted_at(rid: str) -> str | None:
    """The site whose insert gave identity `rid` (None: a row of the common base, or not a version)."""
    if rid.startswith(BASE_VER):
        return None
    head, _, site = rid.partition(":")
    return site if head.isdigit() and len(head) == 19 and site else None


def reason(w: Wait) -> str:
    """What the oldest waiting change waits for, in words."""
    if w.op in ("U", "D") and not w.row_known:
        what = "an update" if w.op == "U" else "a delete"
        at = _inserted_at(w.rid)
        src = f" (inserted at {at})" if at else ""
        return f"{w.table}: {what} from {w.origin} of row {w.rid}{src}, which this site has not received"
    return (
        f"{w.table}: a change from {w.origin} of row {w.rid} waits for an earlier change of {w.origin} "
        "or a row it references, which this site has not received"
    )


def stalled(w: Wait | None, now_ms: int, after_s: float | None) -> bool:
    """Whether a link whose oldest waiting change is `w` is stalled: something waits, and for
    longer than `after_s` seconds (None: never)."""
    return w is not None and w.count > 0 and after_s is not None and w.age_s(now_ms) >= after_s


#: how a refresh records a failure that the next refresh meets again until someone acts (a table
#: a site has no replication objects for, a link not connected, a watermark purged past: engine/
#: refresh.py LASTING), before its message: `status` names such a link at once, not after a grace
NEEDS_ACTION = "needs action: "


def failing(
    last_success_at: str | None, last_error_at: str | None, now: str, after_s: float | None, last_error: str | None = None
) -> bool:
    """Whether a link cannot make progress because its refreshes fail: its last refresh failed for
    a reason that needs action (`last_error` starts with NEEDS_ACTION, which a success takes off:
    it is not transient, the next refresh fails alike), or an error was recorded after the last
    success and no refresh has
    succeeded for `after_s` seconds (the same grace as :func:`stalled`, for failures that pass on
    their own, a peer restarting or a network drop; None: never), or none ever did. Times are the
    bookkeeping's UTC text ('2026-01-02T03:04:05Z'), which sorts as time."""
    if last_error_at is None:
        return False
    if (last_error or "").startswith(NEEDS_ACTION):
        return True  # (a success since would have taken the mark off: store/links.py stats)
    if last_success_at is not None and last_success_at > last_error_at:
        return False
    if after_s is None or (last_success_at is not None and last_success_at == last_error_at):
        return False
    if last_success_at is None:
        return True
    return _seconds(now) - _seconds(last_success_at) >= after_s


def behind(
    waiting: int, oldest_age_s: float | None, since_success_s: float | None, after_s: float | None, allowance_s: float = 0.0
) -> float | None:
    """How long a link has made no progress while changes wait at its source for it, when that is
    at least `after_s` (refresh.stall_after) plus `allowance_s` (the longest its schedule lets a
    change wait before its next refresh even starts); None otherwise, or when `after_s` is None
    ('off'). It is the shorter of the age of the oldest change waiting (`oldest_age_s`, from when
    it was made at its origin) and the time since the link's last successful refresh
    (`since_success_s`, None: none ever succeeded): a link refreshed by hand now and then is not
    behind for a change made a moment ago, nor a link that keeps succeeding for an old change it is
    taking now. Changes held at the target (parked, in its error queue) are not `waiting` here:
    :func:`stalled` and the error queue name them."""
    if after_s is None or waiting <= 0 or oldest_age_s is None:
        return None
    stuck = oldest_age_s if since_success_s is None else min(oldest_age_s, since_success_s)
    return stuck if stuck >= after_s + max(0.0, allowance_s) else None


def behind_message(
    source: str,
    target: str,
    waiting: int,
    oldest_age_s: float,
    stuck_s: float,
    last_success_at: str | None,
    last_error: str | None,
    running: tuple[str, str, str, str] | None = None,
) -> str:
    """What `status` says of a link :func:`behind` found behind, with what is known of why and the
    commands that show or end it: a refresh of it waiting for a lock at the target now, as its
    lock watch recorded it (`running`: when the refresh began, the process, when its wait began,
    the watch's last report; store/running.py), else its last error after its last success, if
    any, else that a refresh runs without finishing or none runs."""
    since = f"since {last_success_at}" if last_success_at else "since it was set up"
    if running is not None:
        started, runner, wait_since, report = running
        why = (
            f"a refresh of it running since {started} (process {runner}) waits for a lock since {wait_since}; "
            f"its last report: {report}"
        )
    elif last_error:
        why = f"its last failed refresh said: {last_error}"
    else:
        why = (
            "no refresh of it failed meanwhile: one is running and not finishing (a lock held at "
            f"'{target}', a very long transaction), or no refresher runs for '{target}'"
        )
    head = (
        f"link {source} -> {target} behind: {waiting} change(s) wait at '{source}', the oldest made "
        f"{oldest_age_s:.0f}s ago, and no refresh of the link succeeded {since} ({stuck_s:.0f}s without "
        f"progress); {why}."
    )
    if running is not None:
        return (
            f"{head} It goes on by itself once the transaction holding the lock ends (it commits or rolls "
            "back, or its session is ended: pg_terminate_backend(pid) on PostgreSQL, KILL <connection> on "
            f"MariaDB); 'multimaster refresh -t FILE --site {target} --peer {source}' shows the wait live"
        )
    return (
        f"{head} See what it waits for: 'multimaster refresh -t FILE --site {target} --peer "
        f"{source}' names a lock it waits for and the session holding it (so does the daemon's log, "
        f"'lock_wait'); start 'multimaster run -t FILE --site {target}' if no refresher runs"
    )


def since_s(at: str | None, now: str) -> float | None:
    """Seconds from bookkeeping time `at` to `now` (None when `at` is)."""
    return None if at is None else max(0.0, _seconds(now) - _seconds(at))


def _seconds(at: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def fix(target: str) -> str:
    """The commands that resolve a stalled link into `target`."""
    return (
        f"refresh {target} from every live peer ('multimaster refresh -t FILE --site {target}'); if the site "
        f"that made the missing change is gone for good, copy {target} again from a live peer "
        f"('multimaster add-site -t FILE {target} --from PEER --replace')"
    )
