"""What the survivors of a removed site hold of its change log, and who gives what to whom
(``remove-site``, docs/operations.md "Removing a site").

Every site that pulls from site S keeps a snapshot of S's change log: the entries it pulled, by
their position in S's log (``pseq``), up to its watermark. Purge drops the applied ones
(ops/purge.py step 6) and records how far (``_mm_snap_horizons``), so a site's snapshot holds
*every* entry it pulled at the positions above its horizon, up to its watermark (its own
changes, which S relayed to it, excepted: it never stores them). When S is gone for good and its
pullers had pulled different prefixes of its log, the ones behind get the positions they lack
from those that still hold them, and apply them as if pulled from S. These are the decisions,
on plain data:

- :func:`plan`: per site, the copies (donor, positions after, up to) that bring it as far as the
  sites' holdings allow: the furthest any of them pulled, or short of it where no site holds a
  position any more;
- :func:`verdict`: which sites applied fewer of S's changes than the furthest (its versions,
  ``_mm_origins``), after the copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Holding", "Copy", "CatchUp", "plan", "Behind", "verdict"]


@dataclass(frozen=True)
class Holding:
    """One site's hold on the removed site's log of one table: it pulled the log up to `position`
    (its watermark) and still holds, in its snapshot, every entry it pulled at the positions in
    (`kept`, `position`] (`kept` <= `position`; `kept` = `position`: it holds none it can give)."""

    site: str
    position: int
    kept: int


@dataclass(frozen=True)
class Copy:
    """The entries `donor` holds at the positions in (`after`, `upto`], to be applied at the
    receiving site as if pulled from the removed site (its watermark then moves to `upto`)."""

    donor: str
    after: int
    upto: int


@dataclass(frozen=True)
class CatchUp:
    """What one site receives: the copies, in order (each starts where the one before ended),
    from its position `start` towards `goal`, the furthest position any site pulled."""

    site: str
    start: int
    goal: int
    copies: tuple[Copy, ...] = ()

    @property
    def reaches(self) -> int:
        """The position the copies bring the site to."""
        return self.copies[-1].upto if self.copies else self.start

    @property
    def short(self) -> bool:
        """Whether positions up to the goal remain that no site holds any more."""
        return self.reaches < self.goal


def plan(holdings: Sequence[Holding]) -> dict[str, CatchUp]:
    """Per site, the copies that bring it as far towards the furthest position pulled as the
    holdings allow. From its position p, a donor that holds p + 1 onwards (kept <= p < position)
    can give it everything up to its own position; of those, the one that pulled furthest gives
    (ties: the first by name), and the next copy starts there. This reaches every position the
    union of the other sites' holdings covers without a hole (the greedy cover of intervals).
    Deterministic: the same holdings give the same plan."""
    for h in holdings:
        if not 0 <= h.kept <= h.position:
            raise ValueError(f"site '{h.site}': kept {h.kept} must be between 0 and its position {h.position}")
    if len({h.site for h in holdings}) != len(holdings):
        raise ValueError("one holding per site")
    goal = max((h.position for h in holdings), default=0)
    out: dict[str, CatchUp] = {}
    for h in holdings:
        cur = h.position
        copies: list[Copy] = []
        while cur < goal:
            donors = [d for d in holdings if d.site != h.site and d.kept <= cur < d.position]
            if not donors:
                break
            best = min(donors, key=lambda d: (-d.position, d.site))
            copies.append(Copy(best.site, cur, best.position))
            cur = best.position
        out[h.site] = CatchUp(h.site, h.position, goal, tuple(copies))
    return out


@dataclass(frozen=True)
class Behind:
    """A site that applied fewer of the removed site's changes than `furthest` did: the highest
    version of it applied there (`has`, None: none) and at `furthest` (`top`)."""

    site: str
    has: str | None
    top: str
    furthest: str


def verdict(applied: Mapping[str, str | None]) -> list[Behind]:
    """The sites whose highest applied version of the removed site's changes (`applied`: site ->
    ``_mm_origins.max_ver``, None: none) is below the highest of all, by name. Every site applies
    an origin's changes in version order, so a lower version means changes missing."""
    tops = [v for v in applied.values() if v is not None]
    if not tops:
        return []
    top = max(tops)
    furthest = min(s for s, v in applied.items() if v == top)
    return [Behind(s, v, top, furthest) for s, v in sorted(applied.items()) if v is None or v < top]
