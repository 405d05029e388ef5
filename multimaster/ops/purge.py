"""Log purge: change logs that do not grow forever.

The paper's change logs are append-only; a cluster that runs for months must drop entries every
peer has pulled. At site X, for table t, one purge (one transaction at X):

1. reads the watermark every *puller* of X (a site with a link from X) holds for X and remembers
   it in X's ``_mm_pullers`` (watermarks only grow, so the last value seen of an unreachable puller
   is a safe lower bound);
2. W = the lowest watermark among *live* pullers. A puller is *given up* (``expired``) only when
   this purge cannot reach it and neither a purge of X reached it nor did it refresh from X for
   longer than the retention (at least :data:`MIN_RETENTION`): it no longer holds entries back,
   purge names it with the commands that bring it back, status names its link once X purged past
   its watermark, and its next refresh fails with :class:`PurgedPastWatermark` (re-instantiate it
   with add-site). A puller that answers holds entries back however long it has not refreshed
   (docs/decisions.md "Purge gives up only a peer it cannot reach");
3. deletes the change-log entries whose second-order ``A`` record every live puller has pulled
   (seq2 <= W) and whose version is older than ``min_age``, never the newest entry (SQLite reuses
   the highest rowid), and none at or after a change of the same origin still waiting in one of
   X's snapshots. The second-order log is a view over the change log, so the append record goes
   with the entry, and pullers drop applied snapshot rows in their own purge (step 6);
4. raises ``_mm_origins.max_ver`` of each origin to the highest version purged: the reconciler's
   dedupe record once the log entry is gone (a late copy over another route stays a duplicate —
   an origin's changes are applied in version order everywhere);
5. records the horizon in ``_mm_purges``: the highest change-log entry purged (= its seq2);
6. drops X's own applied snapshot rows (nothing reads them again but remove-site, which gives a
   dead site's entries to the pullers behind), recording per snapshot the highest position
   dropped (``_mm_snap_horizons``: above it the snapshot holds every entry pulled);
7. drops the tombstones and conflict-log rows past the topology's ``purge`` retention that every
   site has (:mod:`multimaster.ops.retention`, docs/operations.md "Tombstones and the conflict
   log"), in the same transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import parse_duration, parse_retention
from multimaster.core.versions import HLC_SHIFT, now_iso
from multimaster.dialects.schema import names
from multimaster.engine.remote import AgentSite
from multimaster.errors import ConfigError, MultimasterError, PurgedPastWatermark
from multimaster.ops import retention

if TYPE_CHECKING:
    from multimaster.config.topology import Topology
    from multimaster.engine.cluster import Cluster
    from multimaster.engine.site import Site

__all__ = [
    "MIN_RETENTION",
    "PurgePolicy",
    "PurgeReport",
    "TablePurge",
    "PullerState",
    "purge",
    "purge_site",
    "pullers",
    "purged_past",
]

#: the shortest retention: how long a puller purge cannot reach, and that does not refresh, may stay
#: away before it is given up (a network drop, a restart, a weekend must not cost a re-instantiation)
MIN_RETENTION = 3600.0
_RETENTION_WHY = (
    "it is how long a site that purge cannot reach, and that does not refresh, may stay away before it is given "
    "up and must be re-instantiated (a site that answers is never given up); --min-age is what lets entries go sooner"
)


@dataclass(frozen=True)
class PurgePolicy:
    """When entries may go.

    retention: a puller that purge cannot reach, and that neither a purge reached nor refreshed
    for longer, is given up (expired) and stops holding entries; at least :data:`MIN_RETENTION`.
    min_age: only entries whose version is older than this go (a margin for copies in transit).
    snapshots: also drop this site's applied snapshot rows.
    tombstones_after / conflicts_after: keep tombstones / conflict-log rows at least this long
    (seconds; infinity: forever); None: the topology's ``purge`` section."""

    retention: float = 7 * 86400.0
    min_age: float = 3600.0
    snapshots: bool = True
    tombstones_after: float | None = None
    conflicts_after: float | None = None

    @classmethod
    def parse(
        cls,
        retention: str | float | None = None,
        min_age: str | float | None = None,
        snapshots: bool = True,
        tombstones_after: str | float | None = None,
        conflicts_after: str | float | None = None,
    ) -> "PurgePolicy":
        problems = []
        vals: dict[str, float] = {}
        for name, v, parse in (
            ("retention", retention, parse_duration),
            ("min_age", min_age, parse_duration),
            ("tombstones_after", tombstones_after, parse_retention),
            ("conflicts_after", conflicts_after, parse_retention),
        ):
            if v is None:
                continue
            try:
                vals[name] = parse(v)
            except ValueError as e:
                problems.append(f"--{name.replace('_', '-')}: {e}" + (" or 'off'" if name.endswith("_after") else ""))
        if vals.get("retention", MIN_RETENTION) < MIN_RETENTION:
            problems.append(f"--retention: {retention} is below the minimum, it must be at least 1h: {_RETENTION_WHY}")
            del vals["retention"]
        if problems:
            raise ConfigError(problems)
        return cls(snapshots=snapshots, **vals)

    def __post_init__(self) -> None:
        if self.retention < MIN_RETENTION:
            raise ConfigError([f"retention {self.retention:g}s is below the minimum, it must be at least 1h: {_RETENTION_WHY}"])

    def after(self, topo: "Topology") -> tuple[float, float]:
        """(tombstones_after, conflicts_after) in seconds, the topology's where not given."""
        t = self.tombstones_after if self.tombstones_after is not None else parse_retention(topo.purge.tombstones_after)
        c = self.conflicts_after if self.conflicts_after is not None else parse_retention(topo.purge.conflicts_after)
        return t, c


@dataclass
class PullerState:
    """What site `source` knows of one site that pulls from it, for one table."""

    peer: str
    table: str
    watermark: int
    last_success_at: str | None
    reachable: bool
    expired: bool  # given up: unreachable, and neither reached nor refreshed for longer than the retention
    away_s: float | None  # since its last refresh from `source` (since first seen when it never did)
    down_s: float | None = None  # since a purge of `source` last reached it or it refreshed; None: reachable now


@dataclass
class TablePurge:
    table: str
    keep_from: int = 0  # W: second-order records above it are kept
    held_by: list[str] = field(default_factory=list)  # live pullers at the lowest watermark
    purged: int = 0  # change-log entries deleted
    log2_deleted: int = 0
    snapshot_rows: int = 0
    log_left: int = 0
    log2_left: int = 0
    tombstones: int = 0  # tombstones dropped (step 7)
    tombstones_held: int = 0  # past the retention, kept because some site may still need them
    tombstones_left: int = 0
    conflicts: int = 0  # conflict-log rows deleted
    conflicts_held: int = 0  # past the retention, kept because some site lacks a change of them
    state_held_by: dict[str, str] = field(default_factory=dict)  # site -> why it holds step 7 back


@dataclass
class PurgeReport:
    site: str
    tables: dict[str, TablePurge] = field(default_factory=dict)
    pullers: list[PullerState] = field(default_factory=list)
    dry_run: bool = False
    error: str | None = None
    #: what became of the server's record of capturing transactions (MariaDB's
    #: mysql.transaction_registry: truncated, or why not; docs/mysql.md); None: nothing to do
    registry: str | None = None
    #: per puller given up, what happened and the commands that bring it back
    given_up: list[str] = field(default_factory=list)

    @property
    def expired(self) -> list[str]:
        return sorted({p.peer for p in self.pullers if p.expired})

    @property
    def purged(self) -> int:
        return sum(t.purged for t in self.tables.values())

    @property
    def tombstones(self) -> int:
        return sum(t.tombstones for t in self.tables.values())

    @property
    def conflicts(self) -> int:
        return sum(t.conflicts for t in self.tables.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "dry_run": self.dry_run,
            "error": self.error,
            "expired": self.expired,
            "purged": self.purged,
            "tombstones": self.tombstones,
            "conflicts": self.conflicts,
            "tables": {t: vars(tp) for t, tp in self.tables.items()},
            "pullers": [vars(p) for p in self.pullers],
            "registry": self.registry,
            "given_up": self.given_up,
        }


def _age_s(iso: str | None, now: float) -> float | None:
    if not iso:
        return None
    try:
        ts = datetime.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
    return max(0.0, now - ts)


def pullers(cl: "Cluster", site: str, policy: PurgePolicy, *, now: float | None = None, record: bool = True) -> list[PullerState]:
    """The sites pulling from `site`, their watermarks and whether they are expired.

    Reads every puller (unreachable ones: the last value `site` recorded) and, when `record`,
    writes what it read into `site`'s ``_mm_pullers``."""
    now = time.time() if now is None else now
    topo = cl.topo
    src = cl.site(site)
    out: list[PullerState] = []
    seen = _watermarks_held(cl, site)
    stamp = now_iso()
    with src.write() if record else src.read() as conn:
        stored = store.purges.pullers(conn, src.dialect)
        for ln in topo.links:
            if ln.source != site:
                continue
            for tb in topo.tables:
                key = (ln.target, tb)
                old = stored.get(key)
                wm, last, reachable = _merge_watermark(seen.get(key), old)
                first = old[2] if old else stamp
                reached = stamp if reachable else (old[3] if old else None)  # the last time a purge reached it
                if record:
                    store.purges.record_puller(conn, src.dialect, ln.target, tb, wm, last, first, reached, new=old is None)
                down = None if reachable else _down_s(now, last, reached, first)
                out.append(
                    PullerState(
                        ln.target,
                        tb,
                        wm,
                        last,
                        reachable,
                        down is not None and down > policy.retention,
                        _age_s(last or first, now),
                        down,
                    )
                )
    return out


def _down_s(now: float, *times: str | None) -> float | None:
    """How long an unreachable puller has been out of touch: since the latest of its last refresh,
    the last time a purge reached it and when it was first seen (None: none known)."""
    ages = [a for a in (_age_s(t, now) for t in times) if a is not None]
    return min(ages) if ages else None


def _span(seconds: float) -> str:
    """`seconds` as a person reads it: 2h05m, 3d04h, 59m."""
    m = int(seconds // 60)
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def _given_up(topo: "Topology", site: str, states: list[PullerState], policy: PurgePolicy) -> list[str]:
    """One message per puller of `site` given up: why, what it means, the commands that bring it back."""
    path = getattr(topo, "path", None) or "FILE"
    out = []
    for peer in sorted({p.peer for p in states if p.expired}):
        down = max((p.down_s or 0.0) for p in states if p.peer == peer and p.expired)
        out.append(
            f"site '{peer}' is given up by '{site}': purge could not reach it, and it did not refresh from '{site}', "
            f"for {_span(down)} (more than --retention {_span(policy.retention)}); '{site}' no longer keeps the changes it "
            f"has not pulled, so it misses them. Bring it back: multimaster remove-site -t {path} {peer} --force, then "
            f"multimaster add-site -t {path} {peer} --from {site} --replace"
        )
    return out


def _watermarks_held(cl: Cluster, site: str) -> dict[tuple[str, str], tuple[int, str | None]]:
    """(puller, table) -> (the watermark the puller holds for `site`, its last successful refresh
    from `site`), for every puller that answers and has multimaster installed. One that holds no
    watermark of `site` yet (left pending by add-site of `site`: its snapshot is made on its own
    host, `add-site --connect-only`, from position 0) holds 0: it answers, so it is never given
    up, and it needs every entry (before, it read as unreachable and was given up after the
    retention: `site` purged what it had not pulled)."""
    topo = cl.topo
    seen: dict[tuple[str, str], tuple[int, str | None]] = {}
    for ln in topo.links:
        if ln.source != site:
            continue
        p = cl.site(ln.target)
        try:
            if isinstance(p, AgentSite):  # what its agent reads there, the same
                held = p.watermarks_held(site)
                if not held.get("installed"):
                    continue
                for tb in topo.tables:
                    wm = held["watermarks"].get(tb)
                    seen[(ln.target, tb)] = (int(wm or 0), held.get("last_success_at"))
                continue
            with p.read() as conn:
                if not p.installed_tables(conn):
                    continue
                last = store.links.row(conn, p.dialect, site).get("last_success_at")
                for tb in topo.tables:
                    wm = store.watermarks.find(conn, p.dialect, site, tb)
                    seen[(ln.target, tb)] = (wm or 0, last)
        except MultimasterError:
            continue
        except Exception:  # noqa: BLE001 - an unreachable or half-installed puller: use what was recorded
            continue
    return seen


def _merge_watermark(
    seen: tuple[int, str | None] | None, old: tuple[int, str | None, str | None, str | None] | None
) -> tuple[int, str | None, bool]:
    """(watermark, last success, reachable) of one puller and table, from what it holds now
    (`seen`, None: it did not answer) and what was recorded (`old`): watermarks only grow."""
    if seen is not None:
        wm, last = seen
        if old is not None:
            wm = max(wm, old[0])
            last = last or old[1]
        return wm, last, True
    wm, last = (old[0], old[1]) if old else (0, None)
    return wm, last, False


def purge_site(
    cl: "Cluster", site: str, policy: PurgePolicy | None = None, *, dry_run: bool = False, now: float | None = None
) -> PurgeReport:
    """Purge the change logs of one site (see the module docstring). One transaction per table."""
    policy = policy or PurgePolicy()
    now = time.time() if now is None else now
    topo = cl.topo
    src = cl.site(site)
    d = src.dialect
    rep = PurgeReport(site, dry_run=dry_run)
    with src.read() as conn:
        src.require_installed(conn, topo)
    rep.pullers = pullers(cl, site, policy, now=now, record=not dry_run)
    rep.given_up = _given_up(topo, site, rep.pullers, policy)
    tombstones_after, conflicts_after = policy.after(topo)
    observed, missing = retention.observe_sites(cl, site)
    cutoff = f"{(int((now - policy.min_age) * 1000) << HLC_SHIFT):019d}:"
    for tb in topo.tables:
        tp = TablePurge(tb)
        rep.tables[tb] = tp
        o = d.obj(tb)
        live = [p for p in rep.pullers if p.table == tb and not p.expired]
        with src.read() if dry_run else src.write() as conn:
            peers = _snapshotted(conn, d, tb, topo.peers_of(site))
            max_seq, max_seq2 = conn.exec_driver_sql(
                f"SELECT (SELECT max(seq) FROM {o.log}), (SELECT max(seq2) FROM {o.log2})"
            ).first() or (None, None)
            if live:
                w = min(p.watermark for p in live)
                tp.held_by = sorted(p.peer for p in live if p.watermark == w)
            else:
                w = int(max_seq2 or 0)
            tp.keep_from = w
            if not dry_run:
                # the shadow first learns this site's own inserts from the log entries about to go
                # (SQLite writes it lazily): a later update or delete of such a row finds its identity
                d.catch_up(conn, src.info(conn, tb, topo))
            cand: list[Any] = []
            if max_seq is not None:
                cand = _purge_log(conn, d, tb, peers, int(max_seq), cutoff, w, dry_run)
                tp.purged = len(cand)
            _purge_log2(conn, d, tp, cand, dry_run)
            if policy.snapshots:
                tp.snapshot_rows += _drop_applied_snapshot_rows(conn, d, tb, peers, dry_run)
            tp.log_left = int(conn.exec_driver_sql(f"SELECT count(*) FROM {o.log}").scalar() or 0)
            tp.log2_left = int(conn.exec_driver_sql(f"SELECT count(*) FROM {o.log2}").scalar() or 0)
            st = retention.purge_state(
                conn,
                src,
                topo,
                tb,
                {s: obs[tb] for s, obs in observed.items()},
                missing,
                tombstones_after=tombstones_after,
                conflicts_after=conflicts_after,
                now=now,
                dry_run=dry_run,
            )
            tp.tombstones, tp.tombstones_held, tp.tombstones_left = st.tombstones, st.tombstones_held, st.tombstones_left
            tp.conflicts, tp.conflicts_held, tp.state_held_by = st.conflicts, st.conflicts_held, st.held_by
    if not dry_run:
        with src.write() as conn:
            store.fences.forget_except(conn, d, list(topo.sites))
            # the bounds between a connection's transactions below every entry left (MariaDB)
            lows = [conn.exec_driver_sql(f"SELECT min(seq) FROM {d.obj(tb).log}").scalar() for tb in topo.tables]
            held = [int(x) for x in lows if x is not None]
            d.trim_txn_bounds(conn, min(held) if held else None)
        with src.write() as conn:  # alone: it may be DDL, which commits (MariaDB's TRUNCATE)
            rep.registry = d.trim_registry(conn)
    return rep


def purged_past(
    src: "Site | AgentSite", tgt: "Site | AgentSite", source: str, target: str, watermarks: dict[str, int]
) -> str | None:
    """Why the link `source` -> `target` can never refresh again (status names it at once, before
    a refresh of it fails): `src` purged changes past `target`'s `watermarks` (read before this
    call), the message of :class:`PurgedPastWatermark` with the fix; None when it did not.

    Each horizon is read after the watermarks and a watermark below it is read again: a live
    puller's watermark was at or past every horizon when that purge ran (purge keeps what a live
    puller has not pulled) and only grows, so one still below it belongs to a puller given up."""
    if isinstance(src, AgentSite):
        horizons = {tb: src.purge_horizon(tb) for tb in watermarks}
    else:
        with src.read() as conn:  # every table's in one statement
            horizons = store.purges.horizons(conn, src.dialect, list(watermarks))
    for tb, wm in watermarks.items():
        h = horizons[tb]
        if h <= wm:
            continue
        if isinstance(tgt, AgentSite):
            now = tgt.link_at_target(source)["watermarks"].get(tb, wm)
        else:
            with tgt.read() as conn:
                now = store.watermarks.read(conn, tgt.dialect, source, tb)
        if h > now:
            return str(PurgedPastWatermark(source, target, tb, now, h))
    return None


def _purge_log(conn: Any, d: Any, tb: str, peers: list[str], max_seq: int, cutoff: str, w: int, dry_run: bool) -> list[Any]:
    """Steps 3 and 4: the change-log entries of `tb` every live puller has pulled (second-order
    position <= `w`), older than `cutoff`, never the newest (`max_seq`), none at or after a change of
    the same origin waiting in a snapshot of `peers`; unless `dry_run`, raise ``_mm_origins`` to the
    highest version among them and delete them. Returns them as (seq, origin, ver)."""
    o = d.obj(tb)
    ph = d.caps.placeholder
    waiting = " ".join(
        f"AND NOT EXISTS (SELECT 1 FROM {d.obj(tb, q).snap} s WHERE s.applied <> 1 AND s.origin = l.origin AND s.ver <= l.ver)"
        for q in peers
    )
    cand = conn.exec_driver_sql(
        f"SELECT l.seq, l.origin, l.ver FROM {o.log} l WHERE l.seq < {ph} AND l.ver < {ph} "
        f"AND NOT EXISTS (SELECT 1 FROM {o.log2} a WHERE a.seq = l.seq AND a.op = 'A' AND a.seq2 > {ph}) {waiting}",
        (int(max_seq), cutoff, w),
    ).all()
    if cand and not dry_run:
        _raise_origins(conn, d, tb, cand)
        conn.exec_driver_sql(f"DELETE FROM {o.log} WHERE seq = {ph}", [(c[0],) for c in cand])
    return cand


def _snapshotted(conn: Any, d: Any, tb: str, peers: list[str]) -> list[str]:
    """The peers of `peers` whose snapshot of `tb` this site holds. A site of the topology that
    `add-site` has not connected yet has none here (it pulls nothing from here and sent nothing
    here; add-site copies what it needs from its source), so nothing of it waits here to be kept."""
    return [q for q in peers if d.table_kind(conn, names(tb, q).snapshot()) is not None]


def _raise_origins(conn: Any, d: Any, tb: str, cand: list[Any]) -> None:
    """Raise ``_mm_origins.max_ver`` of every origin of `cand` (seq, origin, ver) to the highest
    version of it purged: the dedupe record once the entries are gone."""
    top: dict[str, str] = {}
    for _seq, origin, ver in cand:
        if origin not in top or ver > top[origin]:
            top[origin] = ver
    for origin, ver in top.items():
        store.origins.mark_applied(conn, d, tb, origin, ver)


def _purge_log2(conn: Any, d: Any, tp: TablePurge, cand: list[Any], dry_run: bool) -> None:
    """Step 5: every purged entry took its append record along (the second-order log is a view
    over the change log): unless `dry_run`, the horizon recorded is the highest one."""
    tp.log2_deleted = tp.purged
    if tp.purged and not dry_run:
        store.purges.record_horizon(conn, d, tp.table, max(int(c[0]) for c in cand), tp.purged)


def _drop_applied_snapshot_rows(conn: Any, d: Any, tb: str, peers: list[str], dry_run: bool) -> int:
    """Step 6: delete (with `dry_run`: count) the applied rows of this site's snapshots of `tb`,
    raising each snapshot's horizon to the highest position deleted (above it the snapshot still
    holds every entry pulled: remove-site gives them to the sites behind, core/salvage.py)."""
    n = 0
    for q in peers:
        snap = d.obj(tb, q).snap
        if dry_run:
            n += int(conn.exec_driver_sql(f"SELECT count(*) FROM {snap} WHERE applied = 1").scalar() or 0)
            continue
        # (bounded by the highest read: a row a concurrent reconcile marks applied meanwhile stays)
        top = conn.exec_driver_sql(f"SELECT max(pseq) FROM {snap} WHERE applied = 1").scalar()
        if top is None:
            continue
        n += conn.exec_driver_sql(f"DELETE FROM {snap} WHERE applied = 1 AND pseq <= {int(top)}").rowcount or 0
        store.purges.raise_snapshot_horizon(conn, d, q, tb, int(top))
    return n


def purge(
    topo: "Topology | Cluster",
    site: str | None = None,
    policy: PurgePolicy | None = None,
    *,
    dry_run: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[PurgeReport]:
    """Purge every site's change logs (only `site` if given). A site that fails is reported in its
    report's `error`; the others are still purged."""
    from multimaster.engine.cluster import as_cluster

    cl, own = as_cluster(topo)
    try:
        if site is not None and site not in cl.topo.sites:
            raise ConfigError([f"site '{site}' is not defined under sites"])
        out = []
        # a site reached through its agent is purged on its own host (docs/agent.md)
        for n in [site] if site else [n for n in cl.topo.sites if not cl.topo.sites[n].agent]:
            try:
                out.append(purge_site(cl, n, policy, dry_run=dry_run))
            except MultimasterError as e:
                out.append(PurgeReport(n, dry_run=dry_run, error=redact(str(e))))
            if progress:
                r = out[-1]
                progress(
                    f"{n}: "
                    + (
                        r.error
                        or f"purged {r.purged} change-log entries, {r.tombstones} tombstones, {r.conflicts} conflict-log rows"
                    )
                )
        return out
    finally:
        if own:
            cl.close()
