"""Versions: hybrid-logical-clock timestamps with their origin, as one sortable string.

``ver = '%019d:%s' % (hlc, origin)``; ``hlc = wall_ms * 65536 + counter``. The fixed-width
clock part makes string order equal (timestamp, origin) order. See docs/clock.md.
"""

from __future__ import annotations

import time

__all__ = ["make_ver", "ver_hlc", "ver_origin", "ver_ms", "base_rid", "natural_rid", "hlc_now", "HLC_SHIFT", "BASE_VER"]

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


def hlc_now(floor: int = 0) -> int:
    """The next clock value: wall milliseconds, never behind `floor + 1`."""
    return max(floor + 1, int(time.time() * 1000) << HLC_SHIFT)


def now_iso() -> str:
    """The current UTC time as the bookkeeping tables store it ('2026-01-02T03:04:05Z'): sorts as text."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def started_at_now() -> str:
    """The current UTC time as a verify run's start is written ('2026-01-02T03:04:05+00:00',
    VerifyResult.started_at and `_mm_verifications.started_at`)."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")
