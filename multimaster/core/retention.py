"""Bounded state: when a tombstone or a conflict-log row may go, as pure functions of plain data.

A site X keeps, for every other site Y and table, an :class:`Observation` of Y: the highest
version of the table Y had applied per origin (its ``_mm_origins``) and the highest version Y had
written itself (``own``), read together at one moment (``applied`` first, ``own`` no earlier).
Versions of one origin are applied in version order everywhere, so "Y had applied ``v``" is
``v <= applied[origin(v)]`` (``v <= own`` for Y's own versions). The argument (docs/operations.md,
"Tombstones and the conflict log") in short:

- when the observation of Y shows the delete of row r applied at Y, r was dead at Y, and Y never
  writes a change of r again (an application cannot update or delete a row that is not there;
  the apply of the delete and Y's own writes of the table are serialized), so every change of r
  Y ever wrote has a version <= ``own`` of that observation;
- once X has applied everything Y had written at the observation (:func:`passed`), no change of r
  from Y can still arrive at X as new: a copy over any route is at most ``applied[Y]`` here, a
  duplicate;
- when that holds for every other site Y, nothing can still arrive at X that names r: the
  tombstone can go. A late copy of a change of r is dropped as a duplicate; it never resurrects
  the row (delete wins) nor parks.

Renumbered keys are ranks counted from the shadow (the key of the greatest identity below a new
one, plus one): :func:`rank_floor` bounds the identities X can still receive, and the greatest
identity below that bound stays, so every future identity finds the same predecessor as at a
site that dropped nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from multimaster.core.versions import BASE_VER, ver_origin

__all__ = ["Observation", "passed", "delete_horizon", "rank_floor", "everywhere", "holding", "pick_fence"]


@dataclass(frozen=True)
class Observation:
    """What site `site` had of one table when read at `at`: per origin the highest version it
    had applied, and the highest version it had written itself (None: none yet)."""

    site: str
    applied: Mapping[str, str]
    own: str | None
    at: str = ""

    def has(self, ver: str) -> bool:
        """Whether `site` had applied (or written) the change of version `ver` when observed."""
        if ver.startswith(BASE_VER) or not ver_origin(ver):
            return True  # the common base: every site has it from init
        origin = ver_origin(ver)
        top = self.own if origin == self.site else self.applied.get(origin)
        return top is not None and ver <= top

    @property
    def clock_floor(self) -> str | None:
        """The highest version `site` had written or applied: its clock was past it, so whatever
        it writes after the observation has a greater version."""
        vs = [v for v in (self.own, *self.applied.values()) if v]
        return max(vs) if vs else None


def passed(fence: Observation, applied_here: Mapping[str, str]) -> bool:
    """Whether this site (`applied_here`: its highest applied version per origin) has applied
    everything `fence.site` had written when it was observed."""
    if fence.own is None:
        return True
    top = applied_here.get(fence.site)
    return top is not None and fence.own <= top


def pick_fence(stored: Observation | None, fresh: Observation | None, applied_here: Mapping[str, str]) -> Observation | None:
    """The observation of one site to purge with: the fresh one when it passed, else the stored
    one when it passed, else none (nothing may go this time)."""
    for obs in (fresh, stored):
        if obs is not None and passed(obs, applied_here):
            return obs
    return None


def holding(here: str, sites: list[str], fences: Mapping[str, Observation | None], applied_here: Mapping[str, str]) -> list[str]:
    """The other sites without a passed observation (each holds every tombstone back)."""
    return [s for s in sites if s != here and (fences.get(s) is None or not passed(fences[s], applied_here))]  # type: ignore[arg-type]


def delete_horizon(origin: str, here: str, sites: list[str], fences: Mapping[str, Observation | None]) -> str | None:
    """The highest version of `origin` every other site had applied at its fence (None: some
    site had none of it). A tombstone whose delete has version dv of `origin` was dead at every
    site at its fence when dv <= this horizon. `fences` must all have passed (:func:`holding`
    is empty)."""
    tops: list[str | None] = []
    for s in sites:
        if s == here:
            continue
        f = fences[s]
        assert f is not None
        tops.append(f.own if f.site == origin else f.applied.get(origin))
    if not tops:
        return _TOP
    if any(t is None for t in tops):
        return None
    return min(t for t in tops if t is not None)


#: above every version (a single-site topology: nothing can arrive)
_TOP = "\U0010ffff"


def rank_floor(here: str, sites: list[str], fences: Mapping[str, Observation | None], applied_here: Mapping[str, str]) -> str:
    """A version every identity this site can still receive is greater than: from each other site
    Y, anything new here is past both what this site applied of Y and what Y had written or
    applied at its (passed) fence. This site's own new rows are past its clock, so past every
    identity it holds."""
    floor = _TOP
    for s in sites:
        if s == here:
            continue
        f = fences[s]
        assert f is not None
        cands = [v for v in (applied_here.get(s), f.clock_floor) if v]
        b = max(cands) if cands else BASE_VER
        floor = min(floor, b)
    return floor


def everywhere(ver: str | None, here: str, sites: list[str], observed: Mapping[str, Observation | None]) -> bool:
    """Whether every other site had the change of version `ver` when last observed (None: no
    version, nothing to wait for)."""
    if ver is None:
        return True
    for s in sites:
        if s == here:
            continue
        o = observed.get(s)
        if o is None or not o.has(ver):
            return False
    return True
