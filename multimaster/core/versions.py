"""Versions: hybrid-logical-clock timestamps with their origin, as one sortable string.

``ver = '%019d:%s' % (hlc, origin)``; ``hlc = wall_ms * 65536 + counter``. The fixed-width
clock part makes string order equal (timestamp, origin) order. See docs/clock.md.
"""

from __future__ import annotations

import time
from typing import Iterable

__all__ = [
    "clock_tier",
    "ahead_warnings",
    "make_ver",
    "ver_hlc",
    "ver_origin",
    "ver_ms",
    "base_rid",
    "natural_rid",
    "hlc_now",
    "HLC_SHIFT",
    "BASE_VER",
]

HLC_SHIFT = 16
BASE_VER = "0" * 19 + ":"


def make_ver(hlc: int, origin: str) -> str:
    return f"{hlc:019d}:{origin}"


def ver_hlc(ver: str) -> int:
    return int(ver[:19])


def ver_origin(ver: str) -> str:
    return ver[20:]


def ver_ms(ver: str) -> int:
    """Wall-clock milliseconds of a version (0 for the common base)."""
    return int(ver[:19]) >> HLC_SHIFT


def base_rid(key: object) -> str:
    """Identity of a row that was in the table when `init` ran (the common base)."""
    return f"{BASE_VER}#{key}"


def natural_rid(key: object) -> str:
    """Identity of a row of a table whose key is not renumbered: the key itself."""
    return f"k:{key}"


def seconds_ahead(ver: str, now_ms: int) -> float:
    """How many seconds the clock of version `ver` is ahead of the wall clock `now_ms` (negative:
    behind)."""
    return ((ver_hlc(ver) >> HLC_SHIFT) - now_ms) / 1000.0


def clock_tier(ahead_s: float, warn: float | None, limit: float | None) -> str:
    """How a change whose version is `ahead_s` seconds ahead of the receiving site's wall clock is
    treated (docs/clock.md "Clock discipline"): 'hold' past `limit` (refresh.max_clock_offset),
    'warn' past `warn` (refresh.clock_warn) and not past `limit`, else 'ok' (None: no bound)."""
    if limit is not None and ahead_s > limit:
        return "hold"
    if warn is not None and ahead_s > warn:
        return "warn"
    return "ok"


def ahead_warnings(entries: Iterable[tuple[str, str]], now_ms: int, warn: float | None, limit: float | None) -> dict[str, float]:
    """Per origin, how far ahead (seconds) the furthest of its versions among `entries` ((origin,
    ver) pairs; other values are ignored) is, for the origins with a version in the 'warn' tier of
    :func:`clock_tier`. Versions past `limit` are not counted: they are held, not warned about."""
    out: dict[str, float] = {}
    if warn is None:
        return out
    for origin, ver in entries:
        if not isinstance(ver, str) or len(ver) < 20 or not ver[:19].isdigit():
            continue
        ahead = seconds_ahead(ver, now_ms)
        if clock_tier(ahead, warn, limit) == "warn" and ahead > out.get(str(origin), float("-inf")):
            out[str(origin)] = ahead
    return out


def hlc_now(floor: int = 0) -> int:
    """The next clock value: wall milliseconds, never behind `floor + 1`."""
    return max(floor + 1, int(time.time() * 1000) << HLC_SHIFT)


def now_iso() -> str:
    """The current UTC time as the bookkeeping tables store it ('2026-01-02T03:04:05Z'): sorts as text."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def iso_in(seconds: float) -> str:
    """The UTC time `seconds` from now (negative: ago), as :func:`now_iso` writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


def started_at_now() -> str:
    """The current UTC time as a verify run's start is written ('2026-01-02T03:04:05+00:00',
    VerifyResult.started_at and `_mm_verifications.started_at`)."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")
