"""Refresh orchestration: a link's entries of every table read in one read at the source, cut into
batches at source-transaction boundaries, each batch pulled and reconciled across its tables in one
transaction at the target, with retries of transient failures; reconcile and catch-up on their own."""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import Link, Topology
from multimaster.core import waits as waits_core
from multimaster.core.batches import Step, batch_txn, stream_step
from multimaster.core.progress import ProgressEvent
from multimaster.core.references import fk_order
from multimaster.core.versions import ahead_warnings, now_iso, seconds_ahead, ver_ms
from multimaster.dialects.base import catalog_once
from multimaster.dialects.schema import TableInfo
from multimaster.engine import evolve, isolate, references, uniques
from multimaster.engine.apply import keys_unranked
from multimaster.engine.cluster import Cluster, Progress, as_cluster, each
from multimaster.engine.lockwatch import Watch, watching
from multimaster.engine.pull import LinkRead, entry_groups, pull_link, store_batch
from multimaster.engine.reconcile import ReconcileResult, RefreshResult, rank_local_keys, reconcile_table
from multimaster.engine.remote import AgentSite
from multimaster.engine.site import Site
from multimaster.errors import (
    AgentOnly,
    ClockAhead,
    ConfigError,
    MultimasterError,
    NotConnected,
    NotInstalled,
    PurgedPastWatermark,
    SchemaError,
)

__all__ = [
    "refresh",
    "refresh_link",
    "apply_entries",
    "apply_order",
    "reconcile",
    "catch_up",
    "relay_origins",
    "schemas_elsewhere",
    "write_retrying",
    "check_not_purged",
    "read_link",
    "RETRIES",
    "back_off",
    "clock_warning",
]

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# refresh / reconcile


def relay_origins(topo: Topology, site: str, info: TableInfo) -> list[str] | None:
    """Origins whose changes `site` must pass on (second-order records), None for all.

    A change applied at X is pulled from X by every site that pulls from X (X's pullers); passing
    one back to its own origin is never needed. Which others X relays:

    - in a mesh (every site pulls every writable site, Topology.pulls_every_writable) with
      refresh.relay 'all' (the default): every applied change, unless the only puller is the only
      other writable site (two sites). A puller that has a change gets it as a position only
      (_have below), so the relay costs the log row at X and a position on the wire, and while an
      origin is away or slow, each of its pullers gets from any other site whatever of it that
      site has (docs/decisions.md "Relaying in a mesh");
    - elsewhere, a table that depends on causal delivery (policies other than latest/additive,
      natural keys) relays every applied change, so that no site sees a change before one it
      depends on; any other table relays what some puller does not pull from its origin directly.

    A site no one pulls from (a read-only site) relays nothing."""
    pullers = [ln.target for ln in topo.links if ln.source == site]
    if not pullers:
        return []
    if topo.pulls_every_writable() and topo.refresh.relay == "all":
        origins = set(topo.sites) - topo.read_only - {site}
        return None if any(p != o for o in origins for p in pullers) else []
    causal = not info.spec.renumber or any(s.policy.kind not in ("latest", "additive") for s in info.spec.slots)
    if causal:
        return None
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
    followed: Followed | None = None,
) -> RefreshResult:
    """Pull `source`'s change logs into `target`'s snapshots and reconcile, batch by batch
    (_refresh_link).

    A table of the topology that one of the link's sites has no replication objects for (added to
    the file and `init` not run yet, or its replication stopped with `uninstall --table` while the
    file read still lists it) does not block the others: the link's other tables are refreshed,
    then the link's error names the table, the site and both fixes (errors.NotInstalled), and is
    recorded after the refresh's success, for `status` to report at once (core/waits.py
    NEEDS_ACTION). When a site lacks every table, the refresh fails as before. A table that fails
    its schema check at a site of the link (_unfit: a key or column the file names that the table
    lacks) is left out alike, the link's error naming the table, the problem and the fix."""
    kw: dict[str, Any] = dict(batch_size=batch_size, reconcile_=reconcile_, progress=progress, stop=stop, followed=followed)
    with catalog_once():  # each site's bookkeeping tables looked up once in the refresh, not per question
        return _refresh_link_installed(cl, target, source, kw)


def _refresh_link_installed(cl: Cluster, target: str, source: str, kw: dict[str, Any]) -> RefreshResult:
    """refresh_link: the tables a site of the link lacks or cannot describe left out."""
    missing = _not_installed(cl, target, source)
    lacking = {tb for tables in missing.values() for tb in tables}
    unfit = _unfit(cl, target, source, lacking)
    rest = [tb for tb in cl.topo.tables if tb not in lacking and tb not in unfit]
    if not unfit and (not lacking or not rest):
        return _refresh_link(cl, target, source, **kw)
    res = _refresh_rest(cl, target, source, rest, kw)
    why = [str(NotInstalled(n, f"replication objects for table(s) {tables}", tables)) for n, tables in missing.items()]
    why += [_unfit_message(tb, problems) for tb, problems in unfit.items()]
    head = f"table(s) {sorted(lacking | set(unfit))} not refreshed on this link"
    why_s = f"{head}, its other tables were: " if rest else f"{head}: "
    why_s += "; ".join(why)
    res.error = f"{res.error}; {why_s}" if res.error else why_s
    _record_error(cl.site(target), source, res.error, lasting=True)
    return res


def _refresh_rest(cl: Cluster, target: str, source: str, rest: list[str], kw: dict[str, Any]) -> RefreshResult:
    """The link refreshed for its tables `rest` alone (none: nothing done)."""
    if not rest:
        return RefreshResult(target, source)
    view = cl.narrowed(rest)
    try:
        return _refresh_link(view, target, source, **kw)
    finally:
        for n in (target, source):  # described without the tables left out: described anew next time
            for tb in rest:
                cl.site(n).forget(tb)


def _unfit_message(table: str, problems: list[str]) -> str:
    return (
        f"table '{table}' fails its schema check: {'; '.join(problems)}. Correct tables.{table} in the topology file (a "
        f"running 'multimaster run' reloads it on its own) or the table at that site; the link's other tables go on"
    )


def _unfit(cl: Cluster, target: str, source: str, lacking: set[str]) -> dict[str, list[str]]:
    """The topology's tables (installed at both sites of the link) that a site of the link, reached
    by its database, cannot describe against the file: a key or column the table does not have, a
    policy its column cannot take (engine/schema.py introspect's SchemaError), with its problems.
    Such a table is left out of the link's refresh alone, as a table a site lacks is. {} when a site
    cannot be read (the refresh itself says why)."""
    out: dict[str, list[str]] = {}
    for n in (target, source):
        s = cl.site(n) if n in cl.topo.sites else None
        if s is None or isinstance(s, AgentSite):
            continue
        if all(s.known_info(tb) is not None for tb in cl.topo.tables if tb not in lacking and tb not in out):
            continue  # described already (s.info would not read): no transaction for nothing
        try:
            with s.read() as conn:
                for tb in cl.topo.tables:
                    if tb in lacking or tb in out:
                        continue
                    try:
                        s.info(conn, tb, cl.topo)
                    except SchemaError as e:
                        out[tb] = e.problems
        except Exception:  # noqa: BLE001 - unreachable: the refresh reports it
            return {}
    if lacking or out:  # described with tables the refresh leaves out: described anew without them
        for n in (target, source):
            cl.site(n).forget()
    return out


def _not_installed(cl: Cluster, target: str, source: str) -> dict[str, list[str]]:
    """Per site of the link (its source when reached by its database), the topology's tables it
    has no replication objects for; {} when it cannot be read (the refresh itself says why)."""
    out: dict[str, list[str]] = {}
    for n in (target, source):
        s = cl.site(n) if n in cl.topo.sites else None
        if s is None or isinstance(s, AgentSite):
            continue  # a source read through its agent: its agent checks what it serves
        try:
            with s.read() as conn:
                have = set(s.installed_tables(conn))
        except Exception:  # noqa: BLE001 - unreachable, not installed at all: the refresh reports it
            return {}
        lack = [tb for tb in cl.topo.tables if tb not in have]
        if lack:
            out[n] = lack
    return out


def _refresh_link(
    cl: Cluster,
    target: str,
    source: str,
    *,
    batch_size: int | None = None,
    reconcile_: bool = True,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
    followed: Followed | None = None,
) -> RefreshResult:
    """Pull `source`'s change logs into `target`'s snapshots and reconcile, batch by batch.

    Every table's entries are read in one read at the source (engine/pull.py pull_link) and cut
    into batches at source-transaction boundaries (core/batches.py, docs/transactions.md). Each
    batch is one transaction at `target` across every table it touches: snapshot rows, watermarks
    and the applied changes commit together, so a reader at `target` sees a source transaction
    whole or not at all, and an interrupted refresh leaves nothing half-done and resumes where it
    was. `stop` is asked between batches (the daemon's shutdown): True ends the refresh there.
    `progress` is told the changes pulled after each batch, and a write transaction's wait for a
    lock at the target once it passes refresh.lock_wait_warn (engine/lockwatch.py)."""
    t = cl.topo
    tgt, src = cl.site(target), cl.site(source)
    batch = batch_size or t.refresh.batch_size
    res = RefreshResult(target, source)
    t0 = time.perf_counter()
    tell = _Tell.of(progress, source, target, t0, t.refresh.lock_wait_warn_seconds())
    try:
        for tb in t.tables:
            res.reconciled[tb] = ReconcileResult(tb)
        tables, warned, problems = _pull_described(cl, target, source, followed, reconcile_, res, batch, tell, stop)
        skew = next(iter(tables.values())).skew if tables else {}
        if reconcile_:
            _note_waits(tgt, t, source, res)
        if res.held_back and not res.pulled and not isinstance(src, AgentSite):
            with tgt.read() as conn:
                wms = store.watermarks.read_all(conn, tgt.dialect, source, list(t.tables))
                have = _have(conn, tables) if tables else None
            res.held_at_source = held_at_source(src, target, t, wms, have)
            if res.held_at_source is not None and res.stalled is None:
                res.stalled = held_stall(source, target, res.held_at_source, t.refresh.stall_after_seconds())
        if res.pulled and (skew or warned):
            _note_skew(tgt, t, source, skew, res)
        if res.pulled == 0:  # nothing new: still a success, for status and purge retention
            with watching(tgt, tell.watch if tell else None) as lw, tgt.write(lw) as conn:
                store.links.stats(conn, tgt.dialect, source, 0, 0, 0, now_iso())
        if problems:  # replication went on in the schema each site captured before
            raise SchemaError(problems)
    except MultimasterError as e:
        res.error = redact(str(e))
        _record_error(tgt, source, res.error, lasting=isinstance(e, LASTING))
    except Exception as e:  # noqa: BLE001 - recorded for status, re-raised by the caller when asked
        res.error = redact(f"{type(e).__name__}: {str(getattr(e, 'orig', e)).splitlines()[0] if str(e) else ''}")
        res.transient = isinstance(e, DBAPIError) and (tgt.dialect.is_retryable(e) or src.dialect.is_retryable(e))
        _record_error(tgt, source, res.error)
        if isinstance(e, DBAPIError) and tgt.dialect.names_missing_column(e):
            for tb in t.tables:  # described again by the next refresh (isolate.permanent)
                tgt.forget(tb)
    res.seconds = time.perf_counter() - t0
    return res


def _pull_described(
    cl: Cluster,
    target: str,
    source: str,
    followed: Followed | None,
    reconcile_: bool,
    res: RefreshResult,
    batch: int,
    tell: _Tell | None,
    stop: Callable[[], bool] | None,
) -> tuple[dict[str, _LinkTable], bool, list[str]]:
    """Follow the sites' schemas, describe the link's tables, pull and apply every batch: again,
    described anew, when another process followed the target's schema meanwhile (what committed
    stays). Returns the tables, whether the target had warned about the source's clock, and the
    schema changes refused."""
    attempt = 0
    while True:
        problems, tables, warned = _follow_and_describe(cl, target, source, followed, reconcile_, res)
        try:
            touched = _refresh_batches(tables, batch, res, tell, stop)
            if reconcile_ and any(res.reconciled[tb].left for tb in tables):
                for tb, r in _settle_left(tables, tell.watch if tell else None, stop).items():
                    res.reconciled[tb].add(r)
            if reconcile_ and not (stop is not None and stop()):
                idle = {tb: link for tb, link in tables.items() if tb not in touched}
                todo = _unsettled_all(idle)  # (one read transaction for them all)
                for tb, link in idle.items():
                    res.reconciled[tb].add(_settle_if_needed(link, todo[tb], tell.watch if tell else None, stop))
            return tables, warned, problems
        except _DescribedBehind as e:
            for tb in e.tables:
                cl.site(target).forget(tb)
            attempt += 1
            if attempt == DESCRIBE_ATTEMPTS:
                raise SchemaError(
                    [f"site '{target}': {e}, {DESCRIBE_ATTEMPTS} times in one refresh; the next refresh goes on"]
                ) from None


def _follow_and_describe(
    cl: Cluster, target: str, source: str, followed: Followed | None, reconcile_: bool, res: RefreshResult
) -> tuple[list[str], dict[str, _LinkTable], bool]:
    """_follow_schemas, then _describe: again after a jittered backoff (as write_retrying) when a
    read fails transiently — MariaDB refuses to describe a table whose ALTER runs at that moment
    ("skipped since its definition is being modified by concurrent DDL statement")."""
    delay, attempt = 0.01, 0
    while True:
        try:
            problems = _follow_schemas(cl, target, source, followed)
            tables, warned = _describe(cl, target, source, reconcile_, res)
            return problems, tables, warned
        except DBAPIError as e:
            attempt += 1
            transient = cl.site(target).dialect.is_retryable(e) or cl.site(source).dialect.is_retryable(e)
            if attempt == RETRIES or not transient:
                raise
            delay = back_off(delay)


def _describe(cl: Cluster, target: str, source: str, reconcile_: bool, res: RefreshResult) -> tuple[dict[str, _LinkTable], bool]:
    """The link's tables as the target describes them now, in apply order (sharing one `skew`), and
    whether the target warned about the source's clock before; `res.gaps` noted."""
    t = cl.topo
    tgt, src = cl.site(target), cl.site(source)
    with tgt.read() as conn:
        bases = store.tables.base_maxes(conn, tgt.dialect)  # (the tables installed: its keys)
        tgt.require_installed(conn, t, bases)
        linked = store.watermarks.by_peer(conn, tgt.dialect)  # one read: this link's and the other sources'
        if not set(t.tables) <= linked.get(source, set()):
            raise NotConnected(target, source)  # no snapshot of it: add-site left it to be connected here
        # three tables almost always empty: asked together, each read only when it has rows
        rare = store.with_rows(conn, tgt.dialect, {"_mm_gaps": "closed IS NULL", "_mm_retired": "", "_mm_skew": ""})
        gaps = evolve.open_gaps(conn, tgt) if "_mm_gaps" in rare else []
        res.gaps, res.gap_tables = [m for _, m in gaps], [tb for tb, _ in gaps]
        infos = {tb: tgt.info(conn, tb, t) for tb in t.tables}
        known = isolate.known_origins(conn, tgt, list(t.sites)) if "_mm_retired" in rare else frozenset(t.sites)
        warned = "_mm_skew" in rare and any(w["peer"] == source for w in store.skew.read(conn, tgt.dialect))
        versioned = store.schemas.exists(conn, tgt.dialect)
        skew: dict[str, float] = {}
        peers = [p for p in t.peers_of(target) if p in linked]  # not a site listed and not added yet (watermarks.added)
        tables = {
            tb: _LinkTable(t, target, source, tgt, src, tb, infos[tb], bases[tb], peers, reconcile_, known, skew, versioned)
            for tb in apply_order(t, infos)
        }
    return tables, warned


def apply_entries(
    cl: Cluster, target: str, source: str, rows: dict[str, list[tuple[Any, ...]]], wms: dict[str, int]
) -> tuple[int, dict[str, ReconcileResult]] | None:
    """Apply entries of `source`'s change log that were not read at `source` — remove-site gives a
    dead site's entries that another of its pullers still holds (engine/salvage.py) — exactly as
    a refresh applies a batch read there: one write transaction at `target` across every table
    (_apply_part: snapshot rows, watermarks, reconcile, relay, error queue, link statistics).
    `rows`: per table, in read_entries' layout and position order; `wms`: every table's watermark
    at `target` for `source`, which they continue from. Returns (changes stored, what reconciling
    did per table), or None when a watermark moved meanwhile (nothing was written)."""
    t = cl.topo
    tgt = cl.site(target)
    with tgt.read() as conn:
        tgt.require_installed(conn, t)
        infos = {tb: tgt.info(conn, tb, t) for tb in t.tables}
        known = isolate.known_origins(conn, tgt, list(t.sites))
        peers = store.watermarks.added(conn, tgt.dialect, t.peers_of(target))
        tables = {
            tb: _LinkTable(t, target, source, tgt, cl.site(source), tb, infos[tb], _base_max(conn, tgt, tb), peers, True, known)
            for tb in apply_order(t, infos)
        }
    return _apply_part(tgt, tables, {tb: rows.get(tb, []) for tb in tables}, wms, None)  # type: ignore[no-any-return]


def held_at_source(
    src: Site,
    target: str,
    t: Topology,
    watermarks: dict[str, int],
    have: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any] | None:
    """Where writers capture concurrently at `src`: when every change waiting there for `target`
    lies at or past the source's horizon, the transaction still open that holds it there (what
    committed after it began is handed out only when it ends, docs/concepts.md "Many writers"):
    who, open how long, doing what, the statement that ends it, and the changes it holds back
    (`waiting`, `oldest` version). None otherwise, and when this login may not read the writers'
    registrations (MariaDB's `_mm_slots`: a pull login). `have`: what `target` applied per table
    and origin (a mesh, _have): relayed changes it has are not waiting for it."""
    try:
        return _held_at_source(src, target, t, watermarks, have)
    except DBAPIError:
        return None


def _held_at_source(
    src: Site, target: str, t: Topology, watermarks: dict[str, int], have: Mapping[str, Mapping[str, str]] | None
) -> dict[str, Any] | None:
    d = src.dialect
    if not d.caps.concurrent_capture:
        return None
    with src.read() as conn:
        hs = [d.read_horizon(conn, tb) for tb in t.tables]
        if any(h is None for h in hs):
            return None
        horizon = min(h for h in hs if h is not None)
        waiting, oldest = 0, None
        for tb in t.tables:
            n, ver, low = store.links.waiting_from(conn, d, tb, watermarks[tb], target, (have or {}).get(tb))
            if low is not None and low < horizon:
                return None  # the next refresh can take it
            waiting += n
            if ver is not None and (oldest is None or ver < oldest):
                oldest = ver
        if not waiting:
            return None
        ow = d.open_writer(conn)
    if ow is None:
        return None
    return {
        "who": ow.who,
        "open_s": None if ow.open_s is None else round(ow.open_s, 1),
        "doing": ow.state,
        "fix": ow.fix,
        "waiting": waiting,
        "oldest": oldest,
    }


def held_stall(source: str, target: str, held: dict[str, Any], after_s: float | None, now_ms: int | None = None) -> str | None:
    """The stall message of a link held at its source (held_at_source), once the oldest change it
    holds back has waited refresh.stall_after (`after_s`; None: off); None before."""
    if after_s is None or held.get("oldest") is None:
        return None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    age = max(0.0, (now_ms - ver_ms(str(held["oldest"]))) / 1000)
    if age < after_s:
        return None
    open_for = "" if held["open_s"] is None else f" for {held['open_s']:.0f}s"
    doing = f", {held['doing']}" if held["doing"] else ""
    return (
        f"link {source} -> {target} stalled: {held['waiting']} change(s) committed at '{source}' wait, the oldest made "
        f"{age:.0f}s ago, behind a transaction open there{open_for} ({held['who']}{doing}): what commits after a "
        f"transaction began is handed out when it ends. Fix: end that transaction (COMMIT or ROLLBACK in its session, "
        f"or at site '{source}': {held['fix']})"
    )


def _note_waits(tgt: Site, t: Topology, source: str, res: RefreshResult) -> None:
    """After a refresh: how many changes of the link wait at the target, what the oldest waits
    for, and whether the link is stalled (the oldest older than refresh.stall_after)."""
    with tgt.read() as conn:
        found = store.links.parked_all(conn, tgt.dialect, list(t.tables), source)  # (one statement, not one per table)
    waits = [w for w in found if w is not None]
    if not waits:
        return
    oldest = min(waits, key=lambda w: w.ver)
    res.waiting = sum(w.count for w in waits)
    res.waits_for = waits_core.reason(oldest)
    now_ms = int(time.time() * 1000)
    if waits_core.stalled(oldest, now_ms, t.refresh.stall_after_seconds()):
        res.stalled = (
            f"link {source} -> {tgt.name} stalled: {res.waiting} change(s) wait, the oldest made "
            f"{oldest.age_s(now_ms):.0f}s ago: {res.waits_for}. Fix: {waits_core.fix(tgt.name)}"
        )


def _note_skew(tgt: Site, t: Topology, source: str, skew: dict[str, float], res: RefreshResult) -> None:
    """After a refresh that pulled changes: the origins whose versions came ahead of the target's
    clock past refresh.clock_warn (applied, not held) are recorded for status and the metrics
    (replacing the link's earlier record; none: cleared), and named in the result's warnings."""
    res.clock_ahead = dict(skew)
    warn, limit = t.refresh.clock_warn_seconds(), t.refresh.max_offset_seconds()
    res.clock_warnings = [clock_warning(tgt.name, source, o, a, warn, limit) for o, a in sorted(skew.items())]
    with tgt.write() as conn:
        store.skew.replace(conn, tgt.dialect, source, skew, now_iso())


def clock_warning(target: str, source: str, origin: str, ahead: float, warn: float | None, limit: float | None) -> str:
    """The warning for versions of `origin` that came `ahead` seconds ahead of `target`'s clock."""
    held = f"; past refresh.max_clock_offset ({limit:g} s) they would be held" if limit is not None else ""
    return (
        f"clock warning: site '{origin}' is {ahead:.1f} s ahead of site '{target}''s clock (its changes pulled from "
        f"'{source}'), past refresh.clock_warn ({warn or 0:g} s){held}. Applied; correct the clock of site '{origin}'."
    )


class Followed:
    """The sites a refresh of several links followed already in this round (engine/evolve.py), with
    what was refused there: each site is followed once per round, by the first link of it, while
    the links of other sites wait for it (links refreshed in threads, refresh's `parallel`)."""

    def __init__(self) -> None:
        self.done: dict[str, list[str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def lock(self, site: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(site, threading.Lock())


def _follow_schemas(cl: Cluster, target: str, source: str, followed: Followed | None = None) -> list[str]:
    """The link's two sites capture in their tables' current schema (engine/evolve.py): a table
    whose columns changed there (or whose capture is gone) is followed first. The source only
    where this refresher may write there (a pull login may not: its own refresher follows it).
    `followed`: the sites a refresh of several links followed already in this round, with what
    was refused there (each site is followed once per round). Returns the changes refused (named,
    with the fix)."""
    problems: list[str] = []
    for n in (target, source):
        if n == source and isinstance(cl.site(n), AgentSite):
            continue  # read through its agent, which writes nothing: the site's own refresher follows it
        with followed.lock(n) if followed is not None else contextlib.nullcontext():
            if followed is not None and n in followed.done:
                problems.extend(followed.done[n])
                continue
            try:
                mine = [p for ev in follow_site(cl, n) for p in ev.problems]
            except DBAPIError:
                if n == target:
                    raise
                continue
            problems.extend(mine)
            if followed is not None:
                followed.done[n] = mine
    return problems


def follow_site(cl: Cluster, site: str, tables: Sequence[str] | None = None) -> list[evolve.Evolved]:
    """Site `site`'s capture follows its tables' schema (of `tables`, default all; engine/evolve.py
    follow), with what the site relays and the other sites' columns."""
    return evolve.follow(
        cl.site(site),
        cl.topo,
        functools.partial(relay_origins, cl.topo, site),
        schemas_elsewhere(cl, site),
        tables,
        write=write_retrying,
    )


def schemas_elsewhere(cl: Cluster, site: str) -> Callable[[str], dict[str, set[str]]]:
    """For a table: the columns of its current schema at every site other than `site` (those that
    cannot be reached, or keep no schema versions, are left out)."""

    def others(table: str) -> dict[str, set[str]]:
        have: dict[str, set[str]] = {}
        for n in cl.topo.sites:
            if n == site:
                continue
            try:
                s = cl.site(n)
                if isinstance(s, AgentSite):
                    cols = s.registered_columns(table)
                else:
                    with s.read() as conn:
                        cols = evolve.registered_columns(conn, s, table)
            except Exception:  # noqa: BLE001 - an unreachable site tells nothing
                continue
            if cols is not None:
                have[n] = set(cols)
        return have

    return others


def apply_order(t: Topology, infos: dict[str, TableInfo]) -> list[str]:
    """The order in which a batch applies its tables and takes their locks: referenced tables
    before the tables referencing them (core/references.py fk_order), else the topology's order;
    the same for every refresher, so two never wait for each other in opposite orders."""
    return fk_order(list(t.tables), {tb: [r.parent for r in info.refs] for tb, info in infos.items()})


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
    #: the origins a change of this link may have: the topology's sites and the retired ones
    #: (core.errorqueue.refusal; a change of another origin is held in the error queue)
    known: frozenset[str] | None = None
    #: per origin, the furthest ahead of this site's clock its versions came past refresh.clock_warn
    #: (shared by the link's tables, filled as batches are applied; docs/clock.md)
    skew: dict[str, float] = field(default_factory=dict)
    #: whether the target records schema versions (``_mm_schemas``; a site installed before them
    #: does not until `init`): a batch then checks `info` still describes the recorded one
    versioned: bool = True


Rows = list[tuple[Any, ...]]


#: a refresh reads at most this many batches' worth of entries per table at once (pull_link's
#: window): memory stays bounded whatever the backlog, with room to cut batches at transaction
#: boundaries; a window too small for one transaction grows until it holds it
WINDOW_BATCHES = 4


def _told_nobody(_what: Any) -> None:
    """The progress of a refresh nobody asked to be told of."""


@dataclass(frozen=True)
class _Tell:
    """What a link's refresh tells its caller's `progress`: the changes pulled so far (`pulled`),
    and the lock waits of its write transactions at the target (`watch`: None when
    refresh.lock_wait_warn is off)."""

    progress: Progress
    subject: str
    started: float
    watch: Watch | None

    @classmethod
    def of(cls, progress: Progress | None, source: str, target: str, started: float, wait_after: float | None) -> _Tell:
        """Also without a `progress` to tell: the watch records the refresh's lock waits at a
        server target for `status` (store/running.py)."""
        report: Progress = progress if progress is not None else _told_nobody
        subject = f"{source} -> {target}"
        watch = None if wait_after is None else Watch(subject, report, wait_after, peer=source, started_at=now_iso())
        return cls(report, subject, started, watch)

    def pulled(self, pulled: int, applied: int, batches: int) -> None:
        self.progress(
            ProgressEvent(
                "pull",
                self.subject,
                done=pulled,
                applied=applied,
                batches=batches,
                seconds=time.perf_counter() - self.started,
            )
        )


def _refresh_batches(
    tables: dict[str, _LinkTable], batch: int, res: RefreshResult, tell: _Tell | None, stop: Callable[[], bool] | None
) -> set[str]:
    """Read a window of the link's entries, cut it into batches and apply each in one target
    transaction; read again while the window was cut or another refresher moved a watermark
    meanwhile. A transaction longer than the window is taken in pieces, its stretch applied in one
    target transaction (_refresh_stretch). Returns the tables a batch touched."""
    if not tables:
        return set()
    first = next(iter(tables.values()))
    tgt, src, source, target = first.tgt, first.src, first.source, first.target
    touched: set[str] = set()
    window = max(batch * WINDOW_BATCHES, 1)
    if not src.dialect.caps.txn_column:
        return _refresh_whole(tables, window, res, tell)
    whole = False  # a stretch met a change to hold: its transactions are read whole (as before pieces)
    while True:
        with tgt.read() as conn:
            wms = store.watermarks.read_all(conn, tgt.dialect, source, list(tables))
            have = _have(conn, tables)
        read = read_link(src, target, [lt.info for lt in tables.values()], wms, window, have)
        if not _not_purged(first, wms):
            continue  # another refresher moved a watermark, and the source purged what it took
        step = _step(tables, read, batch)
        if step.kind == "piece" and not whole:
            box = [(wms, read)]
            del read  # the stretch lets go of it once used: memory holds one window at a time
            got = _refresh_stretch(tables, window, batch, res, tell, box)
            if got is None:  # the stretch reaches the source's horizon: held back, nothing applied
                res.held_back = True
                return touched
            if got is _WHOLE:
                whole = True
                continue
            touched |= got
            if stop is not None and stop():
                return touched
            continue
        parts = _parts(read, step.cuts) if step.kind == "batches" else []
        res.held_back = not parts and any(read.rows.values())
        ended = _apply_parts(tables, parts, wms, res, tell, stop, touched)
        if ended == "stopped":
            return touched
        if ended == "moved":
            continue
        if step.kind in ("grow", "piece"):  # piece: only when `whole` (read whole, as before pieces)
            window *= 2  # one transaction, begun at the read's first entry, is longer than the window
            continue
        if step.kind == "hold" or not read.more:
            return touched


def _apply_parts(
    tables: dict[str, _LinkTable],
    parts: list[dict[str, Rows]],
    wms: dict[str, int],
    res: RefreshResult,
    tell: _Tell | None,
    stop: Callable[[], bool] | None,
    touched: set[str],
) -> str | None:
    """Apply the batches `parts` of one read in turn, each in its own target transaction, moving
    `wms` and noting what they did. Returns "moved" when another refresher moved a watermark
    (read again), "stopped" when `stop` said so, None when all were applied."""
    first = next(iter(tables.values()))
    for part in parts:
        done = _apply_part(first.tgt, tables, part, wms, tell.watch if tell else None)
        if done is None:
            return "moved"
        stored, results = done
        for tb, rows in part.items():
            if rows:
                wms[tb] = rows[-1][0]
                touched.add(tb)
        res.pulled += stored
        for tb, r in results.items():
            res.reconciled[tb].add(r)
        res.batches += 1
        if tell:
            tell.pulled(res.pulled, res.applied, res.batches)
        if stop is not None and stop():
            return "stopped"
    return None


#: _refresh_stretch's answer when the stretch met a change to hold: read its transactions whole
_WHOLE: set[str] = set()


class _HeldBack(Exception):
    """A stretch reaches the source's horizon: roll it back, take it when what holds it ends."""


class _ReadWhole(Exception):
    """A stretch met a change to hold (rejected here, or behind one held): roll it back; its
    transactions are read whole (the error queue holds a source transaction whole, which one piece
    cannot do once an earlier piece applied part of it)."""


def _refresh_stretch(
    tables: dict[str, _LinkTable],
    window: int,
    batch: int,
    res: RefreshResult,
    tell: _Tell | None,
    pre: list[tuple[dict[str, int], LinkRead]],
) -> set[str] | None:
    """A transaction longer than the window: read window after window, from the last position
    read, each piece stored and reconciled in ONE target transaction with the rest of the stretch
    (the entries up to the first clean cut past every transaction it took part of,
    core/batches.py stream_step), then committed: memory holds a window, readers at the target see
    the transaction whole. `pre`: the watermarks of the read that found it, and that read (taken
    out of the list when used, so that it is not held while the next window is read).

    Returns the tables touched; ``set()`` when another refresher moved a watermark (read again);
    None when the stretch reaches the source's horizon (rolled back: held back); _WHOLE when it met
    a change to hold (rolled back: read its transactions whole instead)."""
    first = next(iter(tables.values()))
    tgt = first.tgt
    # pieces of the whole window: each piece's reconcile costs more as the target's open
    # transaction grows (docs/performance.md "One large transaction"), so fewer, larger pieces
    run = functools.partial(_stretch_txn, tables=tables, window=window, batch=batch, token=batch_txn(), tell=tell, pre=pre)
    try:
        stored_all, pieces, results = write_retrying(tgt, run, tell.watch if tell else None)
    except _Moved:
        return set()
    except _HeldBack:
        return None
    except _ReadWhole:
        return _WHOLE
    except Exception as e:
        if not isolate.permanent(tgt.dialect, e):
            raise
        return _WHOLE  # rejected for good: held whole in a read of the whole transaction
    return _counted(res, stored_all, pieces, results)


def _counted(res: RefreshResult, stored: int, batches: int, results: dict[str, ReconcileResult]) -> set[str]:
    """Add one target transaction's changes stored, batches and what it applied to `res`; the
    tables it touched."""
    res.pulled += stored
    res.batches += batches
    for tb, r in results.items():
        res.reconciled[tb].add(r)
    return set(results)


def _stretch_txn(
    conn: Connection,
    *,
    tables: dict[str, _LinkTable],
    window: int,
    batch: int,
    token: str,
    tell: _Tell | None,
    pre: list[tuple[dict[str, int], LinkRead]],
) -> tuple[int, int, dict[str, ReconcileResult]]:
    """_refresh_stretch's one target transaction: (changes stored, pieces, results per table).
    Memory holds one window: each read is let go before the next is made."""
    first = next(iter(tables.values()))
    tgt, src, source, target = first.tgt, first.src, first.source, first.target
    infos = [lt.info for lt in tables.values()]
    if first.reconcile_ and store.errorqueue.any_open(conn, tgt.dialect):
        raise _ReadWhole()  # changes are held: a piece might hold part of a transaction another applied
    wms = {tb: store.watermarks.read_locked(conn, tgt.dialect, source, tb) for tb in tables}
    stored_all, pieces = 0, 0
    results: dict[str, ReconcileResult] = {}
    reach: int | None = None
    while True:
        first_read = pre.pop() if pre else None
        if first_read is not None and first_read[0] == wms:
            read = first_read[1]
        else:
            read = read_link(src, target, infos, wms, window, _have(conn, tables))
            if not _not_purged(first, wms):
                raise _Moved()
        del first_read
        step = _step(tables, read, batch, reach)
        if step.kind == "batches" or (reach is None and step.kind != "piece"):
            raise _Moved()  # another refresher took the start meanwhile: read again outside
        if step.kind not in ("piece", "finish"):
            raise _HeldBack()
        upto = step.cuts[0] if step.cuts else None
        part = {tb: [r for r in rows if upto is not None and int(r[2]) < upto] for tb, rows in read.rows.items()}
        if any(part.values()):
            if any(isolate.has_malformed(rows, first.known) for rows in part.values() if rows) or isolate.has_misfit(
                tgt, infos, part
            ):
                raise _ReadWhole()
            done = _apply_batch(conn, tables=tables, rows=part, wms=dict(wms), token=token)
            if done is None:
                raise _Moved()
            stored_all += done[0]
            pieces += 1
            for tb, rows in part.items():
                if rows:
                    wms[tb] = rows[-1][0]
                    results.setdefault(tb, ReconcileResult(tb))
            for tb, r in done[1].items():
                results.setdefault(tb, ReconcileResult(tb)).add(r)
            if tell:
                tell.pulled(stored_all, sum(r.applied for r in results.values()), pieces)
        if step.kind == "finish":
            return stored_all, pieces, results
        reach = step.reach
        del read, part  # before the next window is read


class _Moved(Exception):
    """Another refresher moved a watermark of the link while this one read: read again."""


class _DescribedBehind(Exception):
    """The target's schema was followed (by another process: a refresher of a link from it, `ddl`)
    after this refresh described its tables: entries read in that description would be stored in
    the wrong columns, and changes held for columns the target has. Describe them again, read again."""

    def __init__(self, tables: list[str]) -> None:
        super().__init__(f"the schema of {tables} was followed meanwhile")
        self.tables = tables


def _check_described(conn: Connection, tables: Iterable[_LinkTable]) -> None:
    """In the target's write transaction, once it holds the tables' reconcilers' lock (which a
    follow takes first, engine/evolve.py): raise _DescribedBehind when a table's recorded schema
    version is not the one its description was made in."""
    behind = []
    for lt in tables:
        if lt.versioned:
            cur = store.schemas.current_version(conn, lt.tgt.dialect, lt.table)
            if cur is not None and cur != lt.info.version:
                behind.append(lt.table)
    if behind:
        raise _DescribedBehind(behind)


def _refresh_whole(tables: dict[str, _LinkTable], window: int, res: RefreshResult, tell: _Tell | None) -> set[str]:
    """A source that records no transactions (SQLite): its read of one window holds only whole
    transactions, but a window cut by its size may end inside one. So every window of the link is
    applied in ONE target transaction, window after window (memory holds one window; the target's
    transaction holds them all), until a read is not cut: a reader at the target sees every source
    transaction whole. A batch rejected for good runs again holding the changes at fault.

    The first window is read BEFORE the target's write transaction begins: a SQLite target has
    one writer, and a read from a distant source (an agent over a WAN) must not hold the
    application writers there for its round trips. The transaction uses that read only if the
    watermarks it reads again are the ones it was read from (else it reads afresh); only a link
    whose first window was cut reads its later windows holding the lock."""
    first = next(iter(tables.values()))
    tgt, src, source, target = first.tgt, first.src, first.source, first.target
    token = batch_txn()
    while True:
        with tgt.read() as conn:
            wms0 = store.watermarks.read_all(conn, tgt.dialect, source, list(tables))
            have0 = _have(conn, tables)
        pre = read_link(src, target, [lt.info for lt in tables.values()], wms0, window, have0)
        if not _not_purged(first, wms0):
            continue  # another refresher moved a watermark, and the source purged what it took
        if not any(pre.rows.values()):
            return set()
        run = functools.partial(_whole_link, tables=tables, window=window, token=token, tell=tell, pre=(wms0, pre))
        watch = tell.watch if tell else None
        try:
            try:
                stored_all, windows, results = write_retrying(tgt, run, watch)
            except Exception as e:
                if isinstance(e, _Moved) or not isolate.permanent(tgt.dialect, e):
                    raise
                stored_all, windows, results = write_retrying(tgt, functools.partial(run, isolating=True), watch)
        except _Moved:
            continue
        return _counted(res, stored_all, windows, results)


def _whole_link(
    conn: Connection,
    *,
    tables: dict[str, _LinkTable],
    window: int,
    token: str,
    tell: _Tell | None,
    pre: tuple[dict[str, int], LinkRead] | None = None,
    isolating: bool = False,
) -> tuple[int, int, dict[str, ReconcileResult]]:
    """_refresh_whole's one target transaction: (changes stored, windows, results of the tables
    touched). `pre`: the watermarks a first window was read from before this transaction, and
    that read (used when the watermarks are still those)."""
    first = next(iter(tables.values()))
    tgt, src, source, target = first.tgt, first.src, first.source, first.target
    infos = [lt.info for lt in tables.values()]
    wms = {tb: store.watermarks.read_locked(conn, tgt.dialect, source, tb) for tb in tables}
    stored_all, windows = 0, 0
    results: dict[str, ReconcileResult] = {}
    while True:
        if pre is not None and pre[0] == wms:
            read = pre[1]
        else:
            read = read_link(src, target, infos, wms, window, _have(conn, tables))
            if not _not_purged(first, wms):
                raise _Moved()
        pre = None
        if not any(read.rows.values()):
            break
        bad = any(isolate.has_malformed(rows, first.known) for rows in read.rows.values() if rows)
        bad = bad or isolate.has_misfit(tgt, infos, read.rows)  # a value this site cannot store exactly
        done = _apply_batch(conn, tables=tables, rows=read.rows, wms=dict(wms), isolating=isolating or bad, token=token)
        if done is None:
            raise _Moved()
        stored_all += done[0]
        windows += 1
        for tb, rows in read.rows.items():
            if rows:
                wms[tb] = rows[-1][0]
                results.setdefault(tb, ReconcileResult(tb))
        for tb, r in done[1].items():
            results.setdefault(tb, ReconcileResult(tb)).add(r)
        if tell:
            tell.pulled(stored_all, sum(r.applied for r in results.values()), windows)
        if not read.more:
            break
    return stored_all, windows, results


def _apply_part(tgt: Site, tables: dict[str, _LinkTable], part: dict[str, Rows], wms: dict[str, int], watch: Watch | None) -> Any:
    """Apply one batch in one write transaction at the target (_apply_batch): a malformed entry, or
    one whose origin is no site known here, is held at once; a batch rejected for good runs again,
    holding the changes at fault (engine/isolate.py)."""
    known = next(iter(tables.values())).known
    malformed = any(isolate.has_malformed(rows, known) for rows in part.values() if rows)
    # a value this site cannot store exactly: held with its source transaction (engine/pull.py)
    malformed = malformed or isolate.has_misfit(tgt, [t.info for t in tables.values()], part)
    try:
        return write_retrying(
            tgt, functools.partial(_apply_batch, tables=tables, rows=part, wms=dict(wms), isolating=malformed), watch
        )
    except Exception as e:
        if malformed or not isolate.permanent(tgt.dialect, e):
            raise
        return write_retrying(
            tgt, functools.partial(_apply_batch, tables=tables, rows=part, wms=dict(wms), isolating=True), watch
        )


def _step(tables: dict[str, _LinkTable], read: LinkRead, batch: int, reach: int | None = None) -> Step:
    """What to take of one read where the source records transactions (core/batches.py
    stream_step): batches cut at source-transaction boundaries below the horizon and the window's
    end, a piece of a transaction longer than the window, or nothing yet. `reach`: in a stretch
    (_stretch_txn), the highest position of a transaction it took part of."""
    if not any(read.rows.values()):
        return Step("finish") if reach is not None else Step("hold")
    entries = [e for tb, rows in read.rows.items() for e in entry_groups(rows, tables[tb].info)]
    return stream_step(entries, read.horizon, read.end, read.continuing, read.beyond, batch, reach)


def _parts(read: LinkRead, cuts: list[int]) -> list[dict[str, Rows]]:
    """The batches of one read ending at `cuts`, in order, each as rows per table."""
    out: list[dict[str, Rows]] = []
    lo: int | None = None
    for c in cuts:
        out.append({tb: [r for r in rows if (lo is None or int(r[2]) >= lo) and int(r[2]) < c] for tb, rows in read.rows.items()})
        lo = c
    return out


def _unsettled_all(tables: dict[str, _LinkTable]) -> dict[str, str | None]:
    """:func:`_unsettled` of each of `tables`, read in one transaction at their target."""
    if not tables:
        return {}
    with next(iter(tables.values())).tgt.read() as conn:
        return {tb: _unsettled(conn, link) for tb, link in tables.items()}


def _settle_if_needed(
    link: _LinkTable, todo: str | None, watch: Watch | None = None, stop: Callable[[], bool] | None = None
) -> ReconcileResult:
    """A table the refresh brought nothing for: still apply what an earlier `refresh
    --no-reconcile` stored, and rank the keys local inserts drew, as a reconcile would (`todo`:
    what _unsettled read first; usually there is nothing to do)."""
    if todo:
        try:
            return write_retrying(link.tgt, functools.partial(_settle, link=link), watch)
        except Exception as e:  # rejected for good: again, holding the changes at fault
            if not isolate.permanent(link.tgt.dialect, e):
                raise
            rr = write_retrying(link.tgt, functools.partial(_settle, link=link, isolating=True), watch)
            if rr.left:
                rr.add(_settle_left({link.table: link}, watch, stop)[link.table])
            return rr
    return ReconcileResult(link.table)


def _settle_left(
    tables: dict[str, _LinkTable], watch: Watch | None, stop: Callable[[], bool] | None
) -> dict[str, ReconcileResult]:
    """What isolating transactions left when their time ran out (engine/isolate.py budget): the
    next transactions go on, holding the changes at fault, each for at most the budget, every
    table of the link together (a source transaction across tables stays whole), until none is
    left, or `stop` (the daemon's shutdown) says so: the rest stays stored for the next refresh."""
    first = next(iter(tables.values()))
    tgt = first.tgt
    out = {tb: ReconcileResult(tb) for tb in tables}

    def run(conn: Connection) -> dict[str, ReconcileResult]:
        for link in tables.values():
            tgt.dialect.lock_for_apply(conn, link.info)
        _check_described(conn, tables.values())
        infos = [link.info for link in tables.values()]  # in apply_order
        base = {tb: link.base_max for tb, link in tables.items()}
        relays = {tb: relay_origins(link.topo, link.target, link.info) for tb, link in tables.items()}
        return isolate.reconcile_isolating(conn, tgt, infos, first.peers, base, relays, isolate.budget())

    while not (stop is not None and stop()):
        got = write_retrying(tgt, run, watch)
        for tb, r in got.items():
            out[tb].add(r)
        if not any(r.left for r in got.values()):
            break
    return out


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
    if uniques.unsettled(conn, link.tgt, info):
        return "apply"  # a marked row regains a value released here (docs/unique.md)
    return None


def _settle(conn: Connection, *, link: _LinkTable, isolating: bool = False) -> ReconcileResult:
    """In a write transaction at the target: what _unsettled found (`isolating`: change by change,
    holding those rejected, engine/isolate.py)."""
    tgt, info = link.tgt, link.info
    tgt.dialect.lock_for_apply(conn, info)
    _check_described(conn, [link])
    todo = _unsettled(conn, link)
    if todo == "apply":
        relay = relay_origins(link.topo, link.target, info)
        if isolating:
            return isolate.reconcile_isolating(
                conn, tgt, [info], link.peers, {info.name: link.base_max}, {info.name: relay}, isolate.budget()
            )[info.name]
        isolate.hold_waiting(conn, tgt, [info], link.peers, {info.name: link.base_max})
        return reconcile_table(conn, tgt, info, link.peers, link.base_max, relay)
    rr = ReconcileResult(info.name)
    if todo == "rank":
        rr.renumbered = rank_local_keys(conn, tgt, info, link.base_max)
    return rr


def _apply_batch(
    conn: Connection,
    *,
    tables: dict[str, _LinkTable],
    rows: dict[str, Rows],
    wms: dict[str, int],
    isolating: bool = False,
    token: str | None = None,
) -> tuple[int, dict[str, ReconcileResult]] | None:
    """In the target's one write transaction of the batch, table by table in apply_order: store
    the pulled `rows` in the snapshots, move the watermarks past them, reconcile (when asked), then
    record the link's statistics. Returns (changes stored, what reconciling did per table), or None
    when another refresher moved a watermark from `wms` meanwhile (read again). `isolating`: the
    batch was rejected for good; hold the changes at fault in the error queue and apply the rest,
    change by change (engine/isolate.py)."""
    first = next(iter(tables.values()))
    tgt, source = first.tgt, first.source
    for tb in tables:  # locked: no other refresher moves them until this one commits
        if store.watermarks.read_locked(conn, tgt.dialect, source, tb) != wms[tb]:
            return None  # another refresher moved it: read again
    # the tables' reconcilers (other links' refreshers, a release of what waited for a column, an
    # errors retry) wait from here: what this batch holds in the error queue behind a held change
    # (hold_waiting, a column this site lacks) is never behind one another applies meanwhile
    for link in tables.values():
        tgt.dialect.lock_for_apply(conn, link.info)
    _check_described(conn, tables.values())
    for tb, link in tables.items():
        if rows.get(tb):
            _check_clock_offset(link, rows[tb])
    # the name of rows that came without a source transaction (store_batch): kept together for the
    # cuts downstream of this site, never a unit of the error queue (core/batches.py batch_txn)
    token = token or batch_txn()
    stored_all, applied, conflicts = 0, 0, 0
    results: dict[str, ReconcileResult] = {}
    infos = [link.info for link in tables.values()]  # in apply_order
    if isolating:
        base = {tb: link.base_max for tb, link in tables.items()}
        relays = {tb: relay_origins(link.topo, link.target, link.info) for tb, link in tables.items()}
        stored_all, results = isolate.apply_batch(
            conn, tgt, infos, source, rows, first.peers, base, relays, first.reconcile_, first.known
        )
        applied = sum(r.applied for r in results.values())
        conflicts = sum(len(r.conflicts) for r in results.values())
        store.links.stats(conn, tgt.dialect, source, stored_all, applied, conflicts, now_iso())
        return stored_all, results
    # while changes are held, whole source transactions they hold back are held before anything
    # is applied (engine/isolate.py hold_waiting): the rows are stored as new, not as applied
    holding = first.reconcile_ and store.errorqueue.any_open(conn, tgt.dialect)
    lowest: dict[str, int | None] = {}
    for tb, link in tables.items():
        part = rows.get(tb)
        if not part:
            continue
        stored, last, lowest[tb] = store_batch(
            conn, tgt, link.info, source, part, applied=link.reconcile_ and not holding, txn=token
        )
        store.watermarks.write(conn, tgt.dialect, source, tb, last)
        stored_all += stored
    if holding:
        isolate.hold_waiting(conn, tgt, infos, first.peers, {tb: link.base_max for tb, link in tables.items()})
    for tb, link in tables.items():
        if tb not in lowest or not link.reconcile_:
            continue
        low = lowest[tb]
        fresh = {source: low} if low is not None else {}
        r = reconcile_table(
            conn, tgt, link.info, link.peers, link.base_max, relay_origins(link.topo, link.target, link.info), fresh
        )
        applied += r.applied
        conflicts += len(r.conflicts)
        results[tb] = r
    store.links.stats(conn, tgt.dialect, source, stored_all, applied, conflicts, now_iso())
    return stored_all, results


def _check_clock_offset(link: _LinkTable, rows: list[tuple[Any, ...]]) -> None:
    """Refuse (ClockAhead) a batch holding a change whose version is further ahead of this site's
    wall clock than refresh.max_clock_offset: applying it would drag this site's clock there for
    good (docs/clock.md "Clock discipline"). The origins of versions ahead past refresh.clock_warn
    (but within the offset) are noted in the link's `skew`, to be warned about."""
    limit = link.topo.refresh.max_offset_seconds()
    now_ms = int(time.time() * 1000)
    for origin, ahead in ahead_warnings(
        ((r[4], r[3]) for r in rows), now_ms, link.topo.refresh.clock_warn_seconds(), limit
    ).items():
        link.skew[origin] = max(ahead, link.skew.get(origin, ahead))
    if limit is None:
        return
    for r in rows:
        ver = r[3]
        if isinstance(ver, str) and len(ver) > 19 and ver[:19].isdigit():
            ahead = seconds_ahead(ver, now_ms)
            if ahead > limit:
                raise ClockAhead(link.source, link.target, link.table, r[2], str(r[4]), ahead, limit)


#: times one refresh of a link describes the target's tables again when their schema was followed
#: by another process while it ran (_DescribedBehind), before it reports it
DESCRIBE_ATTEMPTS = 3


#: attempts of one write transaction that failed transiently (deadlock, serialization failure, lock timeout)
RETRIES = 10


def back_off(delay: float) -> float:
    """Sleep about `delay` seconds (jittered by ±50 %); the next delay, doubled up to 1 s."""
    time.sleep(delay * (0.5 + random.random()))
    return min(delay * 2, 1.0)


def write_retrying(site: Site, fn: Callable[[Connection], T], watch: Watch | None = None) -> T:
    """Run `fn` in one write transaction at `site`. A transient failure rolls the whole transaction
    back (nothing of the batch stays) and runs it again after a jittered exponential backoff
    (10 ms doubling to 1 s); after RETRIES attempts, or on any other error, it raises. Every
    attempt but the last waits briefly for locks once it holds a table's writers' lock (Site.write
    brief, Dialect.lock_writers): applications never wait behind it for long; the last one waits
    as long as the site lets it, so a row an application keeps locked delays the batch, never
    starves it. `watch`: lock waits of every attempt are watched as one (engine/lockwatch.py)."""
    delay = 0.01
    with watching(site, watch) as lw:
        for attempt in range(RETRIES):
            try:
                with site.write(lw, brief=attempt < RETRIES - 1, early=0 < attempt < RETRIES - 1) as conn:
                    return fn(conn)
            except DBAPIError as e:
                if attempt == RETRIES - 1 or not site.dialect.is_retryable(e):
                    raise
                if lw is not None:
                    lw.retrying()
                delay = back_off(delay)
    raise AssertionError("unreachable")


#: failures that the next refresh meets again until someone acts (install, connect, copy the site
#: again): recorded as such, and `status` names the link at once (core/waits.py NEEDS_ACTION)
LASTING = (NotInstalled, NotConnected, PurgedPastWatermark)


def _record_error(tgt: Site, source: str, msg: str, *, lasting: bool = False) -> None:
    """The link's last error, at its target; a `lasting` one marked so (core/waits.py NEEDS_ACTION)."""
    try:
        with tgt.write() as conn:
            store.links.error(conn, tgt.dialect, source, (waits_core.NEEDS_ACTION if lasting else "") + msg, now_iso())
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
    parallel: bool = False,
) -> list[RefreshResult]:
    """Refresh every link into `site` (all sites if None), only from `peer` if given; the results
    in the topology's order of the links. `parallel` (`multimaster refresh`): the links into each
    site one after another, as without it, and those into different sites at once, in threads (at
    most engine/cluster.py PARALLEL), as the daemon runs them: over a WAN each link waits on its
    round trips. A change then travels one link per round at least, not necessarily along a
    chain of links in the file's order; a link's failure is its result's error, as without it."""
    cl, own = as_cluster(topo)
    try:
        t = cl.topo
        for n in (site, peer):
            if n is not None and n not in t.sites:
                raise ConfigError([f"site '{n}' is not defined under sites"])
        links = [ln for ln in t.links if (site is None or ln.target == site) and (peer is None or ln.source == peer)]
        if site is None:  # a site reached through its agent is refreshed on its own host (docs/agent.md)
            links = [ln for ln in links if not t.sites[ln.target].agent]
        elif t.sites[site].agent:
            raise AgentOnly(site, t.sites[site].url, "refreshing it (its links write its database)")
        if not links:
            raise ConfigError([f"no link matches --site {site} --peer {peer} (see 'links' in the topology)"])
        followed = Followed()  # each site's schema is followed once in the round

        def run(group: list[Link]) -> list[RefreshResult]:
            return [
                refresh_link(
                    cl, ln.target, ln.source, batch_size=batch_size, reconcile_=reconcile_, progress=progress, followed=followed
                )
                for ln in group
            ]

        if not parallel:
            return run(links)
        groups = [[ln for ln in links if ln.target == n] for n in dict.fromkeys(ln.target for ln in links)]
        done = {(r.site, r.peer): r for group in each(run, groups) for r in group}
        return [done[(ln.target, ln.source)] for ln in links]
    finally:
        if own:
            cl.close()


def reconcile(topo: Topology | Cluster, site: str | None = None) -> dict[str, dict[str, ReconcileResult]]:
    """Apply snapshot rows already pulled (e.g. by `refresh --no-reconcile`): per site, every
    table in one transaction, referenced tables first."""
    cl, own = as_cluster(topo)
    try:
        t = cl.topo
        out: dict[str, dict[str, ReconcileResult]] = {}
        for n in [site] if site else list(t.sites):
            s = cl.site(n)
            out[n] = {}

            def apply(conn: Connection, isolating: bool = False) -> dict[str, ReconcileResult]:
                # every table in one transaction, referenced tables first, as a refresh applies a
                # batch: a source transaction across tables is seen whole or not at all
                s.require_installed(conn, t)
                peers = store.watermarks.added(conn, s.dialect, t.peers_of(n))  # a site listed and not added yet: none
                infos = {tb: s.info(conn, tb, t) for tb in t.tables}
                order = [infos[tb] for tb in apply_order(t, infos)]
                bases = {i.name: _base_max(conn, s, i.name) for i in order}
                relays = {i.name: relay_origins(t, n, i) for i in order}
                if isolating:  # for at most the budget each time, until none is left (below)
                    return isolate.reconcile_isolating(conn, s, order, peers, bases, relays, isolate.budget())
                isolate.hold_waiting(conn, s, order, peers, bases)
                return {i.name: reconcile_table(conn, s, i, peers, bases[i.name], relays[i.name]) for i in order}

            try:
                out[n] = write_retrying(s, apply)
            except Exception as e:  # rejected for good: again, holding the changes at fault
                if not isolate.permanent(s.dialect, e):
                    raise
                out[n] = write_retrying(s, functools.partial(apply, isolating=True))
                while any(r.left for r in out[n].values()):
                    more = write_retrying(s, functools.partial(apply, isolating=True))
                    for tb, r in more.items():
                        out[n][tb].add(r)
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


def read_link(
    src: Site,
    target: str,
    infos: list[TableInfo],
    watermarks: dict[str, int],
    window: int | None = None,
    have: dict[str, dict[str, str]] | None = None,
) -> LinkRead:
    """engine/pull.py pull_link at `src`: run here against its database, or by its agent there
    (engine/remote.py, docs/agent.md), which runs the same function and sends its result."""
    if isinstance(src, AgentSite):
        return src.pull_link(target, infos, watermarks, window, have)
    return pull_link(src, target, infos, watermarks, window, have)


def _have(conn: Connection, tables: dict[str, _LinkTable]) -> dict[str, dict[str, str]] | None:
    """What the link's target has applied, per table and origin (_mm_origins), for its source to
    send those changes as positions only — where every site pulls every writable site directly (a
    mesh), None elsewhere. In a mesh a change reaches a site over every route (tables that need
    causal delivery are relayed by every site), but a site that lacks it, now or after a peer is
    removed, can get it from any other site, so no snapshot of a peer needs the bodies of what its
    owner had already (remove-site's salvage reads snapshots: docs/operations.md "Removing a
    site"). In a chain or a star the route through the peer may be the only one."""
    first = next(iter(tables.values()))
    if not first.topo.pulls_every_writable():
        return None
    return store.origins.have(conn, first.tgt.dialect, tables)


def _not_purged(link: _LinkTable, wms: dict[str, int]) -> bool:
    """Whether the source purged nothing past the watermarks `wms` a read of the link started
    from: True when it did not; False when it did but another refresher of the link moved one
    of them at the target meanwhile (it took those entries before the source purged them: read
    again from where it stands). Raises :class:`PurgedPastWatermark` when the target really is
    behind what the source purged."""
    try:
        _check_none_purged(link.src, link.target, wms)
    except PurgedPastWatermark:
        with link.tgt.read() as conn:
            now = store.watermarks.read_all(conn, link.tgt.dialect, link.source, list(wms))
        if now != wms:
            return False
        raise
    return True


def _check_none_purged(src: Site, target: str, wms: dict[str, int]) -> None:
    """check_not_purged of every table of `wms` (table -> watermark), in their order: the
    horizons read in one statement (the agent's: one request per table, as before)."""
    if isinstance(src, AgentSite):
        for tb, wm in wms.items():
            check_not_purged(src, target, tb, wm)
        return
    with src.read() as conn:
        hs = store.purges.horizons(conn, src.dialect, list(wms))
    for tb, wm in wms.items():
        if hs[tb] > wm:
            raise PurgedPastWatermark(src.name, target, tb, wm, hs[tb])


def check_not_purged(src: Site, target: str, table: str, watermark: int) -> None:
    """Raise :class:`PurgedPastWatermark` when `src` purged second-order entries past `watermark`.

    Called by refresh after each pull: the horizon is read after the pulled rows, so a purge that
    raced the pull is seen."""
    if isinstance(src, AgentSite):  # read by its agent, after the pull's answer came
        h = src.purge_horizon(table)
    else:
        with src.read() as conn:
            h = store.purges.horizon(conn, src.dialect, table)
    if h > watermark:
        raise PurgedPastWatermark(src.name, target, table, watermark, h)
