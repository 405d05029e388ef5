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

__all__ = ["Wait", "reason", "stalled", "fix", "failing", "NEEDS_ACTION"]


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
