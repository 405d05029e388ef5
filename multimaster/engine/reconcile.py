"""Reconcile: apply the changes pulled into a table's snapshots to the table, in one transaction.

:func:`reconcile_table` is a short sequence of named steps: catch the shadow up with the site's own
inserts, gather the candidates (new snapshot rows, one per version, less those applied here
already), apply the plain ones set-based (:mod:`multimaster.engine.fastpath`), let
:mod:`multimaster.core.planner` decide the rest in version order and execute its plan
(:mod:`multimaster.engine.apply`), mark what is applied (`_mm_origins`) and what waits, relay what
peers need, move the clock. Reading a peer's change log into a snapshot is
:mod:`multimaster.engine.pull`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.core.planner import Change, ConflictRecord, RowState, heads_of, parse_sup, plan
from multimaster.core.versions import ver_hlc
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.engine import fastpath, held, references, relays, uniques
from multimaster.engine.apply import Applied, execute_plan, keys_locked, keys_ranked_now, keys_unranked, normalize_keys
from multimaster.engine.pull import log_select_columns
from multimaster.engine.site import Site
from multimaster.errors import CorruptChange

__all__ = ["ReconcileResult", "RefreshResult", "reconcile_table", "rank_local_keys"]


@dataclass
class ReconcileResult:
    table: str
    applied: int = 0
    duplicates: int = 0
    parked: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    renumbered: int = 0
    conflicts: list[ConflictRecord] = field(default_factory=list)
    #: source transactions an isolating transaction left for the next one when its time ran out
    #: (engine/isolate.py budget): the latest result's, not a sum
    left: int = 0

    def add(self, other: "ReconcileResult") -> None:
        for f in ("applied", "duplicates", "parked", "inserted", "updated", "deleted", "renumbered"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.conflicts.extend(other.conflicts)
        self.left = other.left


@dataclass
class RefreshResult:
    site: str
    peer: str
    pulled: int = 0
    batches: int = 0
    seconds: float = 0.0
    reconciled: dict[str, ReconcileResult] = field(default_factory=dict)
    error: str | None = None
    #: the error was a transient one of a site's database (a lock wait timed out, a deadlock, a
    #: serialization failure: Dialect.is_retryable) that outlasted the refresh's own retries: the
    #: sites answer, so the daemon tries again at the link's schedule, not backing off as from a down peer
    transient: bool = False
    #: changes of this link that wait at the target after the refresh (for their row, a
    #: referenced row, an earlier change of their origin), and what the oldest waits for
    waiting: int = 0
    waits_for: str | None = None
    #: set when the oldest has waited longer than refresh.stall_after: what it waits for, and the fix
    stalled: str | None = None
    #: per origin whose versions came ahead of this site's clock past refresh.clock_warn (applied,
    #: not held): how far ahead (s), and the warning naming it (docs/clock.md)
    clock_ahead: dict[str, float] = field(default_factory=dict)
    clock_warnings: list[str] = field(default_factory=list)
    #: a read found changes the refresh could not take yet (past the source's horizon)
    held_back: bool = False
    #: then, when every one of them waits for a transaction still open at the source: who it is,
    #: open how long, doing what, the statement that ends it (engine/refresh.py held_at_source)
    held_at_source: dict[str, Any] | None = None
    #: the target's tables whose capture was found missing and whose writes of then are not
    #: recaptured yet, each named with the fix (store/gaps.py, engine/evolve.py gap_message)
    gaps: list[str] = field(default_factory=list)
    #: the table of each of `gaps`
    gap_tables: list[str] = field(default_factory=list)

    @property
    def applied(self) -> int:
        return sum(r.applied for r in self.reconciled.values())

    @property
    def conflicts(self) -> int:
        return sum(len(r.conflicts) for r in self.reconciled.values())


@dataclass
class _Candidates:
    """The scratch table of candidate changes (one row per version, none applied here yet) and what
    the later steps need to know of it."""

    table: str
    columns: list[str]  # the change log's columns, as log_select_columns names them
    per_origin: dict[str, tuple[int, str]]  # origin -> (changes, highest version)
    total: int  # rows of `table`
    pending: int  # new snapshot rows read (the same change from two peers counts twice)


def reconcile_table(
    conn: Connection,
    site: Site,
    info: TableInfo,
    peers: Sequence[str],
    base_max: int,
    relay: Sequence[str] | None = None,
    fresh: dict[str, int] | None = None,
    only: Sequence[str] | None = None,
    rank_only: bool = False,
) -> ReconcileResult:
    """Apply every snapshot row not yet applied (from all `peers`) to the local table.

    Duplicates are recognised by `_mm_origins`: per origin, the highest version applied here (every
    route delivers an origin's changes in version order, and a change that must wait for its row
    holds back the later changes of its origin). Applied changes whose origin is in `relay` (None:
    all) enter the local change log with their own version and origin and a second-order record,
    so the peers of this site pull them.

    `only` (versions, checked by core.errorqueue.is_version): apply those snapshot rows alone, one
    by one through the planner, whatever `_mm_origins` says (the error queue's isolating mode and
    retries, engine/isolate.py). Otherwise a change of a row that has a change held in the error
    queue waits behind it there (engine/held.py). `rank_only`: new identities get their shadow row
    (their rank) and no table row (a held insert, engine/isolate.py).

    Runs inside the caller's write transaction; sets and resets the capture guard itself."""
    d = site.dialect
    res = ReconcileResult(info.name)
    snaps = {p: d.obj(info.name, p).snapshot() for p in peers}
    d.lock_for_apply(conn, info)
    # 0. the shadow knows every local row (capture may write it lazily)
    d.catch_up(conn, info)
    # 1. candidates, one per version
    cands = _candidates(conn, site, info, snaps, fresh, only, values=not rank_only)
    if cands is not None and only is None and held.hold_behind(conn, d, info, snaps, cands.table):
        cands = _recount(conn, d, cands)
    # on error the transaction rolls back, and the capture guard and scratch tables with it
    d.set_applying(conn, True)
    with references.deferred(conn, d, references.involved(conn, d, info)):  # foreign keys: checked at COMMIT
        return _reconcile(conn, site, info, base_max, relay, snaps, cands, res, only, rank_only)


def _reconcile(
    conn: Connection,
    site: Site,
    info: TableInfo,
    base_max: int,
    relay: Sequence[str] | None,
    snaps: dict[str, str],
    cands: "_Candidates | None",
    res: ReconcileResult,
    only: Sequence[str] | None,
    rank_only: bool,
) -> ReconcileResult:
    """reconcile_table from step 1b on, with the capture guard set and foreign-key checks deferred."""
    d = site.dialect
    # 1b. keys: local inserts in flight end first, and the keys they drew become ranks
    keying = _lock_keys(conn, site, info, base_max, cands, res)
    if cands is None:
        res.conflicts = uniques.settle(conn, site, info, list(snaps))
        if keying:
            keys_ranked_now(conn, d, info, base_max)
        d.set_applying(conn, False)
        return res
    res.duplicates += max(0, cands.pending - cands.total)
    max_hlc = ver_hlc(max(top for _, top in cands.per_origin.values()))
    references.before_deletes(conn, site, info, cands.table, list(snaps))  # rows referencing deleted rows go first
    # 1c. secondary UNIQUE sets: room for the changes that collide (engine/uniques.py)
    uq = uniques.before_apply(conn, site, info, cands.table)
    # 2. the plain changes, set-based
    fr, rest = _apply_plain(conn, site, info, cands, base_max, res, isolating=only is not None or uniques.no_fast(uq))
    # 3. the rest: the planner decides, in version order, piece by piece; each plan is executed
    parked, conflicts = _plan_rest(conn, site, info, fr, rest, base_max, uq, rank_only, res)
    references.fix_self(conn, site, info, cands.table)
    references.orphans(conn, site, info, cands.table, list(snaps))  # references to rows deleted meanwhile
    uq_conflicts = uniques.after_apply(conn, site, info, cands.table, uq, list(snaps))
    # 4. changes waiting for their row stay in the snapshots, to be tried again
    _park(conn, d, snaps, cands.table, parked)
    # 5. what is applied is known for good: the highest version per origin
    if only is None:
        _mark_applied(conn, d, info, cands, bool(parked))
    elif not rank_only:  # a held insert keeping its rank is not applied: nothing to mark
        _mark_applied_below_gaps(conn, d, info, list(snaps.values()), list(cands.per_origin))
    # 6. relay: changes some peer of this site needs enter the change log
    if relay is None or relay:
        relays.relay(conn, site, info, cands.table, cands.columns, relay, list(snaps.values()))
    # 7. the clock moves past every version received
    d.advance_clock(conn, max_hlc, info.name)
    if keying:  # (its reset_key_counter moves the counters past every key as after_apply does: not both)
        keys_ranked_now(conn, d, info, base_max)
    else:
        d.after_apply(conn, info)
    d.set_applying(conn, False)
    d.drop_temp(conn, cands.table)
    res.applied = cands.total - len(parked)
    res.parked = len(parked)
    res.conflicts = conflicts + uq_conflicts
    return res


def _lock_keys(
    conn: Connection, site: Site, info: TableInfo, base_max: int, cands: "_Candidates | None", res: ReconcileResult
) -> bool:
    """Step 1b, where writers capture concurrently and `info` is renumbered: when keys are to be
    given (a candidate inserts, or local inserts drew keys not ranked yet), take the table's
    writers' lock (waiting for the local writers in flight, holding back new ones) before any row
    is touched, and rank the local keys (apply.normalize_keys). Returns whether it did."""
    d = site.dialect
    if not (info.spec.renumber and d.caps.concurrent_capture):
        return False
    inserts = (
        cands is not None and conn.exec_driver_sql(f"SELECT 1 FROM {cands.table} WHERE op = 'I' LIMIT 1").first() is not None
    )
    if not inserts and not keys_unranked(conn, d, info, base_max):
        return False
    d.lock_writers(conn, info)
    keys_locked(conn, d, info, base_max)  # what a rollback would bring back: the counter stays past it
    if cands is not None:
        # the rows the batch changes, first: with brief waits (Dialect.lock_writers) a batch that
        # finds one held by an application gives up before it did any work the writers wait for
        _lock_candidate_rows(conn, d, info, cands.table)
    res.renumbered += normalize_keys(conn, d, info, base_max)
    return True


def rank_local_keys(conn: Connection, site: Site, info: TableInfo, base_max: int) -> int:
    """In a write transaction at `site`, with nothing to apply: rank the keys local inserts into
    `info` drew (see _lock_keys), so this site's keys equal its peers' even when it receives
    nothing. Returns how many rows moved."""
    d = site.dialect
    if not (info.spec.renumber and d.caps.concurrent_capture) or not keys_unranked(conn, d, info, base_max):
        return 0
    res = ReconcileResult(info.name)
    d.lock_for_apply(conn, info)
    d.set_applying(conn, True)
    if _lock_keys(conn, site, info, base_max, None, res):
        keys_ranked_now(conn, d, info, base_max)
    d.set_applying(conn, False)
    return res.renumbered


def _candidates(
    conn: Connection,
    site: Site,
    info: TableInfo,
    snaps: dict[str, str],
    fresh: dict[str, int] | None,
    only: Sequence[str] | None = None,
    values: bool = True,
) -> _Candidates | None:
    """Step 1: copy the new snapshot rows of every peer into a scratch table, one per version, less
    those already applied here (arrived over another route), and mark them applied in the
    snapshots. None (and no scratch table) when there is nothing to apply. `values` False: only
    ranks are given (a held insert keeping its rank), no value is written."""
    d = site.dialect
    cand = d.temp_name("_mm_tmp_cand")
    lcols = log_select_columns(site, info)
    only_t = held.only_table(conn, d, next(iter(snaps.values())), only) if snaps else None
    counts, selects = _new_rows(conn, d, info, snaps, lcols, fresh, only, only_t)
    sources = [p_ for p_, n in counts.items() if n]
    if sources:
        if len(sources) == 1:  # one peer's log holds each version once: no de-duplication needed
            d.create_temp(conn, cand, selects[sources[0]], index=None)
        else:  # the same change may come from several peers: keep one
            d.create_temp(conn, cand, f"SELECT {', '.join(lcols)} FROM {snaps[sources[0]]} WHERE 1 = 0", keys="ver", index=None)
            for p_ in sources:
                conn.exec_driver_sql(d.insert_ignore_into(cand, ", ".join(lcols), selects[p_]))
        for p_ in sources:
            conn.exec_driver_sql(f"UPDATE {snaps[p_]} SET applied = 1 WHERE applied = 0{held.only_versions(only, table=only_t)}")
    if only_t is not None:
        d.drop_temp(conn, only_t)
    if not sources:
        return None
    # references: to keys here; a change referencing an identity not held here waits
    references.resolve(conn, site, info, cand, snaps, values)
    per_origin = {
        o_: (int(n), top) for o_, n, top in conn.exec_driver_sql(f"SELECT origin, count(*), max(ver) FROM {cand} GROUP BY origin")
    }
    total = sum(n for n, _ in per_origin.values())
    if not total:
        d.drop_temp(conn, cand)
        return None
    return _Candidates(cand, lcols, per_origin, total, sum(counts.values()))


def _recount(conn: Connection, d: Dialect, cands: _Candidates) -> _Candidates | None:
    """The candidates after some left them (held behind a change in the error queue): None, and
    no scratch table, when none is left. `_mm_origins` still moves past the ones that left."""
    total = conn.exec_driver_sql(f"SELECT count(*) FROM {cands.table}").scalar() or 0
    if not total:
        d.drop_temp(conn, cands.table)
        return None
    cands.total = int(total)
    return cands


def _new_rows(
    conn: Connection,
    d: Dialect,
    info: TableInfo,
    snaps: dict[str, str],
    lcols: list[str],
    fresh: dict[str, int] | None,
    only: Sequence[str] | None = None,
    only_t: str | None = None,
) -> tuple[dict[str, int], dict[str, str]]:
    """Per peer, how many snapshot rows are new, and the SELECT of those not applied here yet.

    New: not applied yet (rows that waited for their row, `applied = 2`, are tried again) or pulled
    in this transaction (`fresh`: peer -> lowest pseq stored). Applied here: `_mm_origins` holds a
    version at least as high from the same origin. `only_t`: the scratch table holding `only`
    (held.only_table), when it is long."""
    counts: dict[str, int] = {}
    selects: dict[str, str] = {}
    for p_, snap in snaps.items():
        conn.exec_driver_sql(f"UPDATE {snap} SET applied = 0 WHERE applied = 2")
        # (stored in this transaction as applied: not those held there, waiting for a column)
        new_rows = (
            f"s.applied = 0 OR (s.pseq >= {int(fresh[p_])} AND s.applied = 1)" if fresh and p_ in fresh else "s.applied = 0"
        )
        applied_here = store.origins.not_applied(d, info.name, "s")
        if only is not None:  # these versions, whatever _mm_origins says
            new_rows, applied_here = f"s.applied = 0{held.only_versions(only, 's.', only_t)}", "1 = 1"
        counts[p_] = conn.exec_driver_sql(f"SELECT count(*) FROM {snap} s WHERE {new_rows}").scalar() or 0
        # (table names are checked plain identifiers)
        selects[p_] = f"SELECT {', '.join('s.' + c for c in lcols)} FROM {snap} s WHERE ({new_rows}) AND {applied_here}"
    return counts, selects


def _apply_plain(
    conn: Connection,
    site: Site,
    info: TableInfo,
    cands: _Candidates,
    base_max: int,
    res: ReconcileResult,
    isolating: bool = False,
) -> tuple[fastpath.FastResult, str]:
    """Step 2: apply the plain changes set-based (fastpath.py) and count them in `res`. Returns what
    the fast path did and the SELECT of the candidates left for the planner (alias c, ending in a
    WHERE that _plan_rest extends to read them piece by piece in version order).
    `isolating` (the error queue's isolating mode): no fast path, the planner takes them all."""
    d = site.dialect
    lcols = cands.columns
    cand = cands.table
    rest = f"SELECT {', '.join(lcols)} FROM {cand} c WHERE 1 = 1"
    fr = fastpath.FastResult()
    # set-based apply reads and then writes rows: where applications write the table meanwhile
    # (not single_writer), after locking every row the candidates touch (Capabilities.set_based_apply)
    if fastpath.wanted(site, cands.total) and not isolating:
        if not d.caps.single_writer:
            _lock_candidate_rows(conn, d, info, cand)
        fr = fastpath.apply_fast(conn, site, info, cand, base_max, cands.total)
        res.inserted += fr.inserted
        res.updated += fr.updated
        res.deleted += fr.deleted
        if fr.done:
            rest = f"SELECT {', '.join(lcols)} FROM {cand} c WHERE NOT EXISTS (SELECT 1 FROM {fr.done} x WHERE x.ver = c.ver)"
    return fr, rest


def _lock_candidate_rows(conn: Connection, d: Dialect, info: TableInfo, cand: str) -> None:
    """Lock the table and shadow rows of every identity in `cand` (and of every incarnation of a
    natural key in it), so an application's concurrent write waits for the apply."""
    tmp = d.temp_rids(conn)
    conn.exec_driver_sql(d.insert_ignore_into(tmp, "rid", f"SELECT DISTINCT rid FROM {cand}"))
    if not info.spec.renumber:
        o = d.obj(info.name)
        conn.exec_driver_sql(
            d.insert_ignore_into(tmp, "rid", f"SELECT s.rid FROM {o.shadow} s JOIN {cand} c ON c.{d.key_col} = s.{d.key_col}")
        )
    d.lock_rows(conn, info, tmp)
    conn.exec_driver_sql(f"DELETE FROM {tmp}")


#: the changes the planner decides at once (_plan_rest): the plan of one piece (its changes, their
#: rows' states) is what memory holds, whatever a batch brings; MM_PLAN_PIECE overrides it (tests)
PLAN_PIECE = 10_000


def plan_piece() -> int:
    """PLAN_PIECE, or the environment's MM_PLAN_PIECE (at least 1)."""
    raw = os.environ.get("MM_PLAN_PIECE")
    return max(1, int(raw)) if raw and raw.strip().isdigit() else PLAN_PIECE


def _plan_rest(
    conn: Connection,
    site: Site,
    info: TableInfo,
    fr: fastpath.FastResult,
    rest: str,
    base_max: int,
    uq: Any,
    rank_only: bool,
    res: ReconcileResult,
) -> tuple[list[Change], list[ConflictRecord]]:
    """Step 3: the planner decides the changes `rest` selects (those the fast path left), in version
    order, from the state this site holds of their rows, in pieces of plan_piece() changes: each
    piece's plan is executed before the next piece is read (its rows' states read after it), and
    an origin with a change parked holds its changes of the later pieces too. When the fast path
    already numbered the new identities (no key shifts), their keys are its. Returns the changes
    parked and the conflicts; drops the fast path's tables."""
    d = site.dialect
    ph = d.caps.placeholder
    piece = plan_piece()
    parked: list[Change] = []
    conflicts: list[ConflictRecord] = []
    after: str | None = None
    while fr.left:
        sql = f"{rest}{'' if after is None else f' AND c.ver > {ph}'} ORDER BY c.ver LIMIT {piece}"
        ordered = [_to_change(info, tuple(r), "snapshot") for r in conn.exec_driver_sql(sql, () if after is None else (after,))]
        if not ordered:
            break
        states = _load_states(conn, site, info, {c.rid for c in ordered}, [c.key for c in ordered])
        uniques.parked_states(conn, site, info, states)  # a parked row's values are kept apart
        p = plan(info.spec, ordered, states, {c.origin for c in parked})
        new_keys: dict[str, int] | None = None
        if fr.keyed and p.new_rids:
            new_keys = dict(
                conn.exec_driver_sql(
                    f"SELECT rid, {d.key_col} FROM {fr.keyed} WHERE rid IN ({', '.join([ph] * len(p.new_rids))})",
                    tuple(p.new_rids),
                ).all()
            )
        if rank_only:
            held.rank_only(p)
        uniques.plan_parked(conn, site, info, p, uq)
        _count(res, execute_plan(conn, site, info, p, base_max, new_keys))
        parked += p.parked
        conflicts += p.conflicts
        if len(ordered) < piece:
            break
        after = ordered[-1].ver
    for name in (fr.keyed, fr.done):
        if name:
            d.drop_temp(conn, name)
    return parked, conflicts


def _count(res: ReconcileResult, done: Applied) -> None:
    """Add what executing a plan did to `res`."""
    res.inserted += done.inserted
    res.updated += done.updated
    res.deleted += done.deleted
    res.renumbered += done.renumbered


def _park(conn: Connection, d: Dialect, snaps: dict[str, str], cand: str, parked: list[Change]) -> None:
    """Step 4: a change that must wait for its row (and the later changes of its origin) is marked
    `applied = 2` in every snapshot, to be tried again, and leaves the candidates."""
    held.park(conn, d, list(snaps.values()), cand, [c.ver for c in parked])


def _mark_applied(conn: Connection, d: Dialect, info: TableInfo, cands: _Candidates, parked: bool) -> None:
    """Step 5: raise `_mm_origins` to the highest version applied per origin (read again from the
    candidates when some were parked)."""
    tops = (
        {o_: top for o_, top in conn.exec_driver_sql(f"SELECT origin, max(ver) FROM {cands.table} GROUP BY origin")}
        if parked
        else {o_: top for o_, (_, top) in cands.per_origin.items()}
    )
    for origin, top in tops.items():
        store.origins.mark_applied(conn, d, info.name, origin, top)


def _mark_applied_below_gaps(conn: Connection, d: Dialect, info: TableInfo, snaps: Sequence[str], origins: Sequence[str]) -> None:
    """Step 5 for changes applied one by one whatever `_mm_origins` says (a held change retried or
    released, a batch applied change by change): their versions may lie above changes of their
    origin this site stored and did not apply yet (new in a snapshot, or waiting for their row).
    Raising the mark past those would make the reconciler take them for duplicates and drop them
    (session 29: a held insert keeping its rank marked its version applied, and the batch's earlier
    inserts of its origin, stored a moment before, were never applied). So per origin the mark
    rises to the highest version applied (in a snapshot, ``applied`` 1 or 4) below the lowest one
    not applied yet (``applied`` 0 or 2) above it; changes held in the error queue do not stop it
    (a retry applies them whatever the mark)."""
    ph = d.caps.placeholder
    past = store.origins.not_applied(d, info.name, "s")
    for origin in origins:
        lows = [
            conn.exec_driver_sql(
                f"SELECT min(s.ver) FROM {snap} s WHERE s.origin = {ph} AND s.applied IN (0, {held.WAITING}) AND {past}",
                (origin,),
            ).scalar()
            for snap in snaps
        ]
        low = min((str(v) for v in lows if v is not None), default=None)
        below = "" if low is None else f" AND s.ver < {ph}"
        tops = [
            conn.exec_driver_sql(
                f"SELECT max(s.ver) FROM {snap} s WHERE s.origin = {ph} AND s.applied IN (1, {relays.RELAY_WAITS}){below}",
                (origin,) if low is None else (origin, low),
            ).scalar()
            for snap in snaps
        ]
        top = max((str(v) for v in tops if v is not None), default=None)
        if top is not None:
            store.origins.mark_applied(conn, d, info.name, origin, top)


def _to_change(info: TableInfo, r: tuple[Any, ...], peer: str) -> Change:
    n = len(info.columns)
    ver, origin, op, rid, key, mask = r[0], r[1], r[2], r[3], r[4], r[5]
    if op not in ("I", "U", "D") or not isinstance(ver, str) or mask is None or rid is None:
        raise CorruptChange(info.name, peer, ver, f"malformed change (op={op!r}, mask={mask!r}, rid={rid!r})")
    try:
        sup = parse_sup(r[-1])  # the last column (pull.log_select_columns)
    except ValueError as e:
        raise CorruptChange(info.name, peer, ver, f"malformed change: {e}") from None
    return Change(ver, origin, op, rid, key, int(mask), tuple(r[6 : 6 + n]), tuple(r[6 + n : 6 + 2 * n]), sup)


def _load_states(conn: Connection, site: Site, info: TableInfo, rids: set[str], keys: Sequence[Any] = ()) -> dict[str, RowState]:
    """The shadow rows (and table values of live rows) of `rids`; for a natural-key table also of
    every other incarnation of `keys` (the planner decides among a key's incarnations)."""
    d = site.dialect
    q = d.quote
    o = d.obj(info.name)
    tmp = d.temp_rids(conn)
    conn.exec_driver_sql(f"INSERT INTO {tmp} (rid) VALUES ({d.caps.placeholder})", [(r,) for r in rids])
    natural = not info.spec.renumber
    if natural and keys:
        kt = d.temp_name("_mm_tmp_keys")
        # the scratch column is kv, not key (a reserved word in MySQL): its index names it bare
        d.create_temp(conn, kt, f"SELECT {d.key_col} AS kv FROM {o.shadow} WHERE 1 = 0", index="kv")
        distinct: dict[Any, Any] = {}
        for k in keys:
            distinct.setdefault(bytes(k) if isinstance(k, (bytes, bytearray, memoryview)) else k, k)
        conn.exec_driver_sql(f"INSERT INTO {kt} (kv) VALUES ({d.caps.placeholder})", [(k,) for k in distinct.values()])
        conn.exec_driver_sql(
            d.insert_ignore_into(tmp, "rid", f"SELECT s.rid FROM {o.shadow} s JOIN {kt} k ON k.kv = s.{d.key_col}")
        )
        d.drop_temp(conn, kt)
    d.lock_rows(conn, info, tmp)
    slots = [s.name for s in info.spec.slots]
    picks = [s.name for s in info.spec.slots if s.policy.chooses]  # their other heads (install_heads)
    vcols = "".join(f", s.{q('v_' + s)}" for s in slots) + "".join(f", s.{q(p_ + s)}" for s in picks for p_ in ("h_", "x_"))
    ucols = "".join(f", t.{q(c)}" for c in info.column_names)
    # a natural key's table row belongs to its live incarnation only
    live = " AND s.deleted IS NULL" if natural else ""
    sql = (
        f"SELECT s.rid, s.{d.key_col}, s.deleted, t.{q(info.key.name)} IS NOT NULL{vcols}{ucols} FROM {tmp} r "
        f"JOIN {o.shadow} s ON s.rid = r.rid LEFT JOIN {q(info.name)} t ON t.{q(info.key.name)} = s.{d.key_col}{live}"
    )
    out: dict[str, RowState] = {}
    ns = len(slots) + 2 * len(picks)
    for r in conn.exec_driver_sql(sql):
        present = bool(r[3])
        versions = {s: r[4 + i] for i, s in enumerate(slots)}
        at = 4 + len(slots)
        heads = {s: h for i, s in enumerate(picks) if (h := heads_of(r[at + 2 * i], r[at + 2 * i + 1]))}
        values = list(r[4 + ns :]) if present else None
        out[r[0]] = RowState(r[0], r[1], r[2], versions, values, heads=heads)
    conn.exec_driver_sql(f"DELETE FROM {tmp}")
    return out
