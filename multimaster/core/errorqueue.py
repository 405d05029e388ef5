"""What the error queue decides without a database (docs/errors.md): whether a change-log entry
is well-formed enough to be applied or stored at all, and the order held changes are retried in.

A change is *malformed* when applying it cannot even be tried: its version is not
``'%019d:%s' % (hlc, origin)`` with the origin a site name, its operation is not I, U or D, or its
identity or column mask is missing. Such an entry (a hand-made row in a change log, say) is held
in the error queue like a change the database rejected, instead of blocking its link.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

__all__ = ["is_version", "malformed", "retry_order"]

_VERSION = re.compile(r"[0-9]{19}:[A-Za-z_][A-Za-z0-9_]*\Z")


def is_version(v: Any) -> bool:
    """Whether `v` is a version string (a fixed-width clock, ':', a site name)."""
    return isinstance(v, str) and _VERSION.match(v) is not None


def malformed(ver: Any, origin: Any, op: Any, rid: Any, mask: Any) -> str | None:
    """Why the change (ver, origin, op, rid, mask) cannot be applied as it is, None when it can."""
    problems = []
    if not is_version(ver):
        problems.append(f"ver={ver!r}")
    if not isinstance(origin, str) or not origin:
        problems.append(f"origin={origin!r}")
    if op not in ("I", "U", "D"):
        problems.append(f"op={op!r}")
    if rid is None or (isinstance(rid, str) and not rid):
        problems.append(f"rid={rid!r}")
    if mask is None or isinstance(mask, bool) or not isinstance(mask, int) or mask < 0:
        problems.append(f"mask={mask!r}")
    return f"malformed change ({', '.join(problems)})" if problems else None


def retry_order(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Held changes in the order a retry applies them: per table, by version (a row's changes in
    the order they were made; every origin's in the order it made them)."""
    return sorted(rows, key=lambda r: (r["tbl"], r["ver"], r["id"]))
