"""Refresh orchestration: every batch of a link pulled and reconciled in one transaction at the
target, with retries of transient failures; reconcile and catch-up on their own."""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import Topology
from multimaster.core.versions import now_iso, seconds_ahead
from multimaster.dialects.schema import TableInfo
from multimaster.engine import references
from multimaster.engine.apply import keys_unranked
from multimaster.engine.cluster import Cluster, Progress, as_cluster
from multimaster.engine.pull import pull_batch, store_batch
from multimaster.engine.reconcile import ReconcileResult, RefreshResult, rank_local_keys, reconcile_table
from multimaster.engine.site import Site
from multimaster.errors import ClockAhead, ConfigError, MultimasterError, PurgedPastWatermark

__all__ = ["refresh", "refresh_link", "reconcile", "catch_up", "relay_origins", "write_retrying", "check_not_purged", "RETRIES"]

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# refresh / reconcile


def relay_origins(topo: Topology, site: str, info: TableInfo) -> list[str] | None:
    """Origins whose changes `site` must pass on (second-order records), None for all.

    A change applied at X is pulled from X by every site that pulls from X. It is needed there only
    if that site does not pull from the change's origin directly — unless the table depends on
    causal delivery (policies other than latest/additive, natural keys): then every applied change
    is relayed so that no site sees a change before one it depends on."""
    causal = not info.spec.renumber or any(s.policy.kind not in ("latest", "additive") for s in info.spec.slots)
    if causal:
        return None
    pullers = [ln.target for ln in topo.links if ln.source == site]
    need = set()
    for origin in topo.sites:
        if origin == site:
            continue
        if any(p != origin and origin not in topo.peers_of(p) for p in pullers):
            need.add(origin)
    return sorted(need)


def _base_max(conn: Connection, site: Site, table: str) -> int:
    return store.tables.base_max(conn, site.dialect, table)


def refresh_link(
    cl: Cluster,
    target: str,
    source: str,
    *,
    batch_size: int | None = None,
    reconcile_: bool = True,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> RefreshResult:
    """Pull `source`'s change log into `target`'s snapshot and reconcile, batch by batch.

    Each batch is one transaction at `target`: snapshot rows, watermark and the applied changes
    commit together, so an interrupted refresh leaves nothing half-done and resumes where it was.
    `stop` is asked between batches (the daemon's shutdown): True ends the refresh there."""
    t = cl.topo
    tgt, src = cl.site(target), cl.site(source)
    batch = batch_size or t.refresh.batch_size
    res = RefreshResult(target, source)
    t0 = time.perf_counter()
    peers = t.peers_of(target)
    try:
        for tb in references.refresh_order(tgt, t):  # referenced tables first
            info, base_max = _table_at(tgt, t, tb)
            link = _LinkTable(t, target, source, tgt, src, tb, info, base_max, peers, reconcile_)
            res.reconciled[tb] = _refresh_table(link, batch, res, progress, stop)
            if stop is not None and stop():
                break
        if res.pulled == 0:
            with tgt.write() as conn:  # nothing new: still a success, for status and purge retention
                store.links.stats(conn, tgt.dialect, source, 0, 0, 0, now_iso())
    except MultimasterError as e:
        res.error = redact(str(e))
        _record_error(tgt, source, res.error)
    except Exception as e:  # noqa: BLE001 - recorded for status, re-raised by the caller when asked
        res.error = redact(f"{type(e).__name__}: {str(getattr(e, 'orig', e)).splitlines()[0] if str(e) else ''}")
        _record_error(tgt, source, res.error)
    res.seconds = time.perf_counter() - t0
    return res


@dataclass(frozen=True)
class _LinkTable:
    """One table of a link being refreshed: what each of its batches needs."""

    topo: Topology
    target: str
    source: str
    tgt: Site
    src: Site
    table: str
    info: TableInfo
    base_max: int
    peers: list[str]
    reconcile_: bool


def _table_at(tgt: Site, t: Topology, tb: str) -> tuple[TableInfo, int]:
    """Table `tb` as the target site holds it, and its base max key (refusing a target where
    multimaster is not installed)."""
    with tgt.read() as conn:
        tgt.require_installed(conn, t)
        info = tgt.info(conn, tb, t)
        base_max = _base_max(conn, tgt, tb)
    return info, base_max


def _refresh_table(
    link: _LinkTable, batch: int, res: RefreshResult, progress: Progress | None, stop: Callable[[], bool] | None
) -> ReconcileResult:
    """Pull and apply one table of a link in batches of `batch` changes until none is left (or
    `stop` says so), counting them in `res`. Returns what reconciling did."""
    tgt, src, source, target, tb = link.tgt, link.src, link.source, link.target, link.table
    rr = ReconcileResult(tb)
    batches = 0
    while True:
        with tgt.read() as conn:
            wm = store.watermarks.read(conn, tgt.dialect, source, tb)
        rows = pull_batch(src, tgt, None, link.info, wm, batch)
        check_not_purged(src, target, tb, wm)
        if not rows:
            break
        done = write_retrying(tgt, functools.partial(_apply_batch, link=link, rows=rows, wm=wm))
        if done is None:
            continue
        res.pulled += done[0]
        if done[1] is not None:
            rr.add(done[1])
        res.batches += 1
        batches += 1
        if progress:
            progress(f"{source} -> {target} {tb}: {res.pulled} changes pulled")
        if len(rows) < batch or (stop is not None and stop()):
            break
    if link.reconcile_ and not batches:
        # nothing pulled: still apply what an earlier `refresh --no-reconcile` stored, and rank the
        # keys local inserts drew, as a reconcile would (read first: usually there is nothing to do)
        with tgt.read() as conn:
            todo = _unsettled(conn, link)
        if todo:
            rr.add(write_retrying(tgt, functools.partial(_settle, link=link)))
    return rr


def _unsettled(conn: Connection, link: _LinkTable) -> str | None:
    """What a link that brought nothing still has to do at its target: "apply" the source's snapshot
    rows not applied yet (pulled without reconciling), "rank" the keys local inserts drew (dialects
    whose writers capture concurrently), or None."""
    d, info = link.tgt.dialect, link.info
    snap = d.obj(info.name, link.source).snapshot()
    if conn.exec_driver_sql(f"SELECT 1 FROM {snap} WHERE applied = 0 LIMIT 1").first() is not None:
        return "apply"
    if references.waiting_rows(conn, d, info, link.peers):  # what they wait for may have come by now
        return "apply"
    if info.spec.renumber and d.caps.concurrent_capture and keys_unranked(conn, d, info, link.base_max):
        return "rank"
    return None


def _settle(conn: Connection, *, link: _LinkTable) -> ReconcileResult:
    """In a write transaction at the target: what _unsettled found."""
    tgt, info = link.tgt, link.info
    todo = _unsettled(conn, link)
    if todo == "apply":
        return reconcile_table(conn, tgt, info, link.peers, link.base_max, relay_origins(link.topo, link.target, info))
    rr = ReconcileResult(info.name)
    if todo == "rank":
        rr.renumbered = rank_local_keys(conn, tgt, info, link.base_max)
    return rr


def _apply_batch(
    conn: Connection, *, link: _LinkTable, rows: list[tuple[Any, ...]], wm: int
) -> tuple[int, ReconcileResult | None] | None:
    """In the target's write transaction: store the pulled `rows` in the snapshot, move the
    watermark past them, reconcile (when asked) and record the link's statistics. Returns (changes
    stored, what reconciling did), or None when another refresher moved the watermark from `wm`
    meanwhile (read again)."""
    tgt, source, tb, info = link.tgt, link.source, link.table, link.info
    if store.watermarks.read(conn, tgt.dialect, source, tb) != wm:
        return None  # another refresher moved it: read again
    _check_clock_offset(link, rows)
    stored, last, lowest = store_batch(conn, tgt, info, source, rows, applied=link.reconcile_)
    store.watermarks.write(conn, tgt.dialect, source, tb, last)
    if link.reconcile_:
        fresh = {source: lowest} if lowest is not None else {}
        r = reconcile_table(conn, tgt, info, link.peers, link.base_max, relay_origins(link.topo, link.target, info), fresh)
        store.links.stats(conn, tgt.dialect, source, stored, r.applied, len(r.conflicts), now_iso())
        return stored, r
    store.links.stats(conn, tgt.dialect, source, stored, 0, 0, now_iso())
    return stored, None


def _check_clock_offset(link: _LinkTable, rows: list[tuple[Any, ...]]) -> None:
    """Refuse (ClockAhead) a batch holding a change whose version is further ahead of this site's
    wall clock than refresh.max_clock_offset: applying it would drag this site's clock there for
    good (docs/clock.md "Clock discipline")."""
    limit = link.topo.refresh.max_offset_seconds()
    if limit is None:
        return
    now_ms = int(time.time() * 1000)
    for r in rows:
        ver = r[3]
        if isinstance(ver, str) and len(ver) > 19 and ver[:19].isdigit():
            ahead = seconds_ahead(ver, now_ms)
            if ahead > limit:
                raise ClockAhead(link.source, link.target, link.table, r[2], str(r[4]), ahead, limit)


#: attempts of one write transaction that failed transiently (deadlock, serialization failure, lock timeout)
RETRIES = 10


def write_retrying(site: Site, fn: Callable[[Connection], T]) -> T:
    """Run `fn` in one write transaction at `site`. A transient failure rolls the whole transaction
    back (nothing of the batch stays) and runs it again after a jittered exponential backoff
    (10 ms doubling to 1 s); after RETRIES attempts, or on any other error, it raises."""
    delay = 0.01
    for attempt in range(RETRIES):
        try:
            with site.write() as conn:
                return fn(conn)
        except DBAPIError as e:
            if attempt == RETRIES - 1 or not site.dialect.is_retryable(e):
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def _record_error(tgt: Site, source: str, msg: str) -> None:
    try:
        with tgt.write() as conn:
            store.links.error(conn, tgt.dialect, source, msg, now_iso())
    except Exception:  # noqa: BLE001 - the target itself may be what failed
        pass


def refresh(
    topo: Topology | Cluster,
    site: str | None = None,
    peer: str | None = None,
    *,
    batch_size: int | None = None,
    reconcile_: bool = True,
    progress: Progress | None = None,
) -> list[RefreshResult]:
    """Refresh every link into `site` (all sites if None), only from `peer` if given."""
    cl, own = as_cluster(topo)
    try:
        t = cl.topo
        for n in (site, peer):
            if n is not None and n not in t.sites:
                raise ConfigError([f"site '{n}' is not defined under sites"])
        links = [ln for ln in t.links if (site is None or ln.target == site) and (peer is None or ln.source == peer)]
        if not links:
            raise ConfigError([f"no link matches --site {site} --peer {peer} (see 'links' in the topology)"])
        return [
            refresh_link(cl, ln.target, ln.source, batch_size=batch_size, reconcile_=reconcile_, progress=progress)
            for ln in links
        ]
    finally:
        if own:
            cl.close()


def reconcile(topo: Topology | Cluster, site: str | None = None) -> dict[str, dict[str, ReconcileResult]]:
    """Apply snapshot rows already pulled (e.g. by `refresh --no-reconcile`)."""
    cl, own = as_cluster(topo)
    try:
        t = cl.topo
        out: dict[str, dict[str, ReconcileResult]] = {}
        for n in [site] if site else list(t.sites):
            s = cl.site(n)
            out[n] = {}
            for tb in t.tables:

                def apply(conn: Connection, tb: str = tb) -> ReconcileResult:
                    s.require_installed(conn, t)
                    info = s.info(conn, tb, t)
                    return reconcile_table(conn, s, info, t.peers_of(n), _base_max(conn, s, tb), relay_origins(t, n, info))

                out[n][tb] = write_retrying(s, apply)
        return out
    finally:
        if own:
            cl.close()


def catch_up(topo: Topology | Cluster, site: str | None = None) -> None:
    """Bring every shadow up to date with its site's own inserts (SQLite writes them lazily; the
    reconciler does this itself). For tools that copy shadow rows (repair, add-site)."""
    cl, own = as_cluster(topo)
    try:
        for n in [site] if site else list(cl.topo.sites):
            s = cl.site(n)
            with s.write() as conn:
                for tb in cl.topo.tables:
                    s.dialect.catch_up(conn, s.info(conn, tb, cl.topo))
    finally:
        if own:
            cl.close()


# ---------------------------------------------------------------------------------------------


def check_not_purged(src: Site, target: str, table: str, watermark: int) -> None:
    """Raise :class:`PurgedPastWatermark` when `src` purged second-order entries past `watermark`.

    Called by refresh after each pull: the horizon is read after the pulled rows, so a purge that
    raced the pull is seen."""
    with src.read() as conn:
        h = store.purges.horizon(conn, src.dialect, table)
    if h > watermark:
        raise PurgedPastWatermark(src.name, target, table, watermark, h)
