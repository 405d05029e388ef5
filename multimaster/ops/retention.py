"""Bounded state: tombstones and conflict-log rows purged once every site has them.

Run by :func:`multimaster.ops.purge.purge_site` for each table, inside the transaction that
purges the change log (docs/operations.md, "Tombstones and the conflict log"). The decisions are
pure functions of :mod:`multimaster.core.retention`; this module reads what they need from the
sites and carries them out:

1. every other site Y is observed (:func:`observe_sites`): the highest version it applied per
   origin, then the highest it wrote itself. An unreachable site is not observed; the
   observation stored at this site (``_mm_fences``) stands in for it;
2. per Y, the observation to purge with is the fresh one if this site has applied everything Y
   had written then, else the stored one if that holds for it (a busy Y is always ahead of its
   fresh observation; the stored one, from an earlier purge, catches up). The fresh one replaces
   the stored one unless the stored one is still waiting to be caught up with;
3. tombstones (renumbered tables): a deleted identity whose delete is older than
   ``purge.tombstones_after`` goes when every Y had applied the delete at its observation, and
   each observation has been caught up with; the greatest identity below what this site can
   still receive stays (new identities take their key from it). Natural-key tables keep their
   tombstones: a key's dead lives name its next life;
4. conflict-log rows older than ``purge.conflicts_after`` go when every Y, at its latest
   observation, had applied both changes of the conflict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from multimaster import store
from multimaster.core.retention import (
    Observation,
    delete_horizon,
    everywhere,
    holding,
    passed,
    pick_fence,
    rank_floor,
)
from multimaster.core.versions import HLC_SHIFT, ver_origin
from multimaster.engine.remote import AgentSite

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from multimaster.config.topology import Topology
    from multimaster.engine.cluster import Cluster
    from multimaster.engine.site import Site

__all__ = ["StatePurge", "observe_sites", "purge_state"]


@dataclass
class StatePurge:
    """What purge did (or, dry run, would do) to one table's tombstones and conflict log."""

    tombstones: int = 0  # dropped
    tombstones_held: int = 0  # past the retention, but some site may still need them
    tombstones_left: int = 0
    conflicts: int = 0  # conflict-log rows deleted
    conflicts_held: int = 0  # past the retention, but some site has not applied both changes
    held_by: dict[str, str] = field(default_factory=dict)  # site -> why it holds something back


def observe_sites(cl: "Cluster", here: str) -> tuple[dict[str, dict[str, Observation]], dict[str, str]]:
    """Every other site's observation per table, and why a site could not be observed."""
    topo = cl.topo
    out: dict[str, dict[str, Observation]] = {}
    missing: dict[str, str] = {}
    for name in topo.sites:
        if name == here:
            continue
        s = cl.site(name)
        try:
            if isinstance(s, AgentSite):  # what its agent reads there, the same
                seen = s.observe()
                if seen is None:
                    missing[name] = "not installed"
                else:
                    out[name] = {tb: seen[tb] for tb in topo.tables}
                continue
            with s.read() as conn:
                have = set(s.installed_tables(conn))
                if not set(topo.tables) <= have:
                    missing[name] = "not installed"
                    continue
                out[name] = {tb: store.fences.observe(conn, s.dialect, tb, name) for tb in topo.tables}
        except Exception as e:  # noqa: BLE001 - down or broken: the stored observation stands in for it
            missing[name] = f"unreachable ({type(e).__name__})"
    return out, missing


def _version_before(now: float, seconds: float) -> str:
    """The lowest version of a change made `seconds` before `now` (versions sort by time)."""
    return f"{(int((now - seconds) * 1000) << HLC_SHIFT):019d}:"


def _iso_before(now: float, seconds: float) -> str:
    """`seconds` before `now` as conflict rows' ``detected_at`` is written (to the millisecond)."""
    t = datetime.fromtimestamp(now - seconds, timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{t.microsecond // 1000:03d}Z"


def purge_state(
    conn: "Connection",
    site: "Site",
    topo: "Topology",
    table: str,
    fresh: dict[str, Observation],
    missing: dict[str, str],
    *,
    tombstones_after: float,
    conflicts_after: float,
    now: float,
    dry_run: bool,
) -> StatePurge:
    """Steps 2-4 of the module docstring for `table` at `site`, in the caller's transaction
    (`fresh`: this run's observations of the other sites, for `table`)."""
    d = site.dialect
    here = site.name
    sites = list(topo.sites)
    info = site.info(conn, table, topo)
    out = StatePurge()
    if not dry_run:
        d.lock_for_apply(conn, info)
    applied_here = dict(store.origins.read(conn, d, table))
    stored = store.fences.read(conn, d, table)
    fences = {s: pick_fence(stored.get(s), fresh.get(s), applied_here) for s in sites if s != here}
    if not dry_run:
        for s, obs in fresh.items():
            old = stored.get(s)
            if old is None or passed(old, applied_here):
                store.fences.write(conn, d, table, obs)
    held = holding(here, sites, fences, applied_here)
    for s in held:
        if s in missing and s not in stored:
            out.held_by[s] = f"{missing[s]}, never observed"
        elif s in missing:
            out.held_by[s] = f"{missing[s]}; this site has not applied everything it had written when last observed"
        else:
            out.held_by[s] = "this site has not applied everything it had written yet"
    if info.spec.renumber and tombstones_after != float("inf"):
        cutoff = _version_before(now, tombstones_after)
        _purge_tombstones(conn, site, info, sites, (fences, applied_here, missing), held, cutoff, out, dry_run)
    out.tombstones_left = int(
        conn.exec_driver_sql(f"SELECT count(*) FROM {d.obj(table).shadow} WHERE deleted IS NOT NULL").scalar() or 0
    )
    if conflicts_after != float("inf"):
        latest = {s: fresh.get(s) or stored.get(s) for s in sites if s != here}
        _purge_conflicts(conn, site, table, sites, latest, missing, _iso_before(now, conflicts_after), out, dry_run)
        if not dry_run:  # the key history goes with the conflict log's retention (docs/foreign-keys.md)
            store.keymoves.delete_before(conn, d, table, _iso_before(now, conflicts_after))
    return out


def _purge_tombstones(
    conn: Any,
    site: "Site",
    info: Any,
    sites: list[str],
    seen: tuple[dict[str, Observation | None], dict[str, str], dict[str, str]],
    held: list[str],
    cutoff: str,
    out: StatePurge,
    dry_run: bool,
) -> None:
    """Step 3: drop the tombstones of `info` deleted before `cutoff` that no change still to come
    can need (`seen`: the fences, this site's highest applied version per origin, why a site
    could not be observed)."""
    fences, applied_here, missing = seen
    d = site.dialect
    here = site.name
    shadow = d.obj(info.name).shadow
    ph = d.caps.placeholder
    rows = conn.exec_driver_sql(
        f"SELECT rid, deleted, {d.key_col} FROM {shadow} WHERE deleted IS NOT NULL AND deleted < {ph}", (cutoff,)
    ).all()
    if not rows:
        return
    unranked = _unranked_above(conn, site, info)
    if held:
        out.tombstones_held = len(rows)
        return
    floor = rank_floor(here, sites, fences, applied_here)
    keep = conn.exec_driver_sql(f"SELECT max(rid) FROM {shadow} WHERE rid <= {ph}", (floor,)).scalar()
    horizons: dict[str, str | None] = {}
    drop: list[str] = []
    for rid, dv, key in rows:
        if unranked is not None and key > unranked:
            out.tombstones_held += 1  # a key a local insert drew: the next reconcile ranks it, counting it
            continue
        origin = ver_origin(dv)
        if origin not in horizons:
            horizons[origin] = delete_horizon(origin, here, sites, fences)
        hz = horizons[origin]
        if rid == keep:
            continue  # the greatest identity below what can still arrive: new keys count from it
        if rid < keep and hz is not None and dv <= hz:
            drop.append(rid)
            continue
        out.tombstones_held += 1
        for s, f in fences.items():
            if f is not None and not f.has(dv):
                why = missing.get(s, "")
                out.held_by.setdefault(s, (why + "; " if why else "") + "had not applied every delete when last observed")
    if drop and not dry_run:
        conn.exec_driver_sql(f"DELETE FROM {shadow} WHERE rid = {ph}", [(r,) for r in drop])
    out.tombstones = len(drop)


def _unranked_above(conn: Any, site: "Site", info: Any) -> int | None:
    """Where writers capture concurrently, the key of renumbered `info` above which keys were drawn
    by local inserts and not ranked yet (engine/apply.py normalize_keys ranks them counting every
    identity above it: one dropped would give the later ones lower keys than at every other
    site); None where there is none."""
    d = site.dialect
    if not (info.spec.renumber and d.caps.concurrent_capture):
        return None
    return max(store.tables.keys_ranked(conn, d, info.name), store.tables.base_max(conn, d, info.name))


def _purge_conflicts(
    conn: Any,
    site: "Site",
    table: str,
    sites: list[str],
    latest: dict[str, Observation | None],
    missing: dict[str, str],
    before: str,
    out: StatePurge,
    dry_run: bool,
) -> None:
    """Step 4: delete the conflict-log rows of `table` recorded before `before` whose two changes
    every other site had applied when last observed."""
    d = site.dialect
    here = site.name
    go: list[int] = []
    for cid, lv, rv in store.conflicts.expired(conn, d, table, before):
        if everywhere(lv, here, sites, latest) and everywhere(rv, here, sites, latest):
            go.append(cid)
            continue
        out.conflicts_held += 1
        for s in sites:
            o = latest.get(s)
            if s != here and (o is None or not (o.has(rv) and (lv is None or o.has(lv)))):
                why = missing.get(s, "")
                out.held_by.setdefault(
                    s, (why + "; " if why else "") + "had not applied both changes of a conflict when last observed"
                )
    if go and not dry_run:
        store.conflicts.delete(conn, d, go)
    out.conflicts = len(go)
