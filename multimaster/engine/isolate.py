"""Isolating mode: when a batch fails for good, find the changes at fault and hold them in the error
queue (docs/errors.md), so everything else of the link goes on.

A refresh applies a batch in one transaction (engine/refresh.py). When the database rejects it
with an error that is not transient (:func:`permanent`: not a deadlock, serialization failure or
lock timeout — ``Dialect.is_retryable`` —, not a lost connection), the transaction is rolled back
and the batch runs again here: malformed change-log entries are held (not stored in the snapshot),
the rest is stored, and the new changes are applied one by one in version order, each by the
reconciler itself (``reconcile_table(only=[ver])``, no fast path) under a SAVEPOINT. A change whose
savepoint fails is held (``failed``, the database's error); a later change of a row with a held
change waits behind it (``waiting``); a change that waits for its row holds back the later changes
of its origin, as in a batch. `errors retry` re-applies held changes the same way (:func:`retry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.core.errorqueue import is_version, malformed, retry_order
from multimaster.core.versions import now_iso
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.engine import held
from multimaster.engine.pull import log_select_columns, store_batch
from multimaster.engine.reconcile import ReconcileResult, reconcile_table
from multimaster.engine.site import Site
from multimaster.errors import CorruptChange
from multimaster.store.errorqueue import Held

__all__ = ["permanent", "describe", "has_malformed", "apply_batch", "reconcile_isolating", "retry", "RetryResult"]


def permanent(d: Dialect, e: BaseException) -> bool:
    """Whether `e`, raised while applying a batch, is the database rejecting a change for good: a
    malformed change, or a database error that is neither transient (Dialect.is_retryable) nor a
    lost connection (those stay link errors, retried with backoff)."""
    if isinstance(e, CorruptChange):
        return True
    return isinstance(e, DBAPIError) and not e.connection_invalidated and not d.is_retryable(e)


def describe(e: BaseException) -> str:
    """The error as the queue stores it: the driver's message (first lines), passwords masked."""
    orig = getattr(e, "orig", None) or e
    text = " ".join(str(orig).strip().splitlines()[:3]) or type(orig).__name__
    return redact(f"{type(orig).__name__}: {text}")


def _snaps(d: Dialect, info: TableInfo, peers: Sequence[str]) -> dict[str, str]:
    return {p: d.obj(info.name, p).snapshot() for p in peers}


def _split(rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[tuple[tuple[Any, ...], str]]]:
    """The pulled `rows` (seq2, op2, seq, ver, origin, op, rid, key, mask, ...) that can be stored,
    and the malformed ones with why."""
    good, bad = [], []
    for r in rows:
        if r[1] != "A":
            bad.append((r, f"unknown second-order log record type {r[1]!r}"))
            continue
        why = None if r[3] is None else malformed(r[3], r[4], r[5], r[6], r[8])
        if why:
            bad.append((r, why))
        else:
            good.append(r)
    return good, bad


def has_malformed(rows: list[tuple[Any, ...]]) -> bool:
    """Whether pulled `rows` hold an entry that cannot be applied as it is (core.errorqueue.malformed)."""
    return bool(_split(rows)[1])


def apply_batch(
    conn: Connection,
    site: Site,
    info: TableInfo,
    peer: str,
    rows: list[tuple[Any, ...]],
    peers: Sequence[str],
    base_max: int,
    relay: Sequence[str] | None,
    reconcile_: bool,
) -> tuple[int, ReconcileResult | None]:
    """In the target's write transaction, a batch from `peer` that failed for good: hold its
    malformed entries, store the rest, move the watermark past the batch, and (when `reconcile_`)
    apply the new changes one by one (:func:`reconcile_isolating`). Returns (stored, result)."""
    d = site.dialect
    good, bad = _split(rows)
    stored, _last, _ = store_batch(conn, site, info, peer, good, applied=False)
    at = now_iso()
    for r, why in bad:
        ver = r[3] if is_version(r[3]) else f"?{peer}:{r[2]}"  # a position names it when its version cannot
        rid = r[6] if isinstance(r[6], str) and r[6] else "?"
        h = Held(info.name, peer, ver, str(r[4]), rid, "?")
        store.errorqueue.hold(conn, d, h, "failed", at, f"change log of peer '{peer}', entry {r[2]}: {why}")
    store.watermarks.write(conn, d, peer, info.name, rows[-1][0])
    if not reconcile_:
        return stored, None
    return stored, reconcile_isolating(conn, site, info, peers, base_max, relay)


def reconcile_isolating(
    conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], base_max: int, relay: Sequence[str] | None
) -> ReconcileResult:
    """Apply the snapshot rows of `info` not applied yet one by one, in version order, each under
    a savepoint; hold (in the error queue) each change the database rejects, and the later changes
    of its row behind it. Returns what was applied."""
    d = site.dialect
    snaps = _snaps(d, info, peers)
    for snap in snaps.values():
        conn.exec_driver_sql(f"UPDATE {snap} SET applied = 0 WHERE applied = 2")
    todo: dict[str, tuple[str, str, str, str]] = {}
    for p, snap in snaps.items():
        for ver, origin, rid, op in conn.exec_driver_sql(
            f"SELECT s.ver, s.origin, s.rid, s.op FROM {snap} s WHERE s.applied = 0 AND "
            f"{store.origins.not_applied(d, info.name, 's')} ORDER BY s.ver"
        ):
            todo.setdefault(ver, (origin, rid, op, p))
    res = ReconcileResult(info.name)
    waits: list[str] = []  # versions waiting for their row (applied = 2 once done)
    waiting_origins: set[str] = set()
    for ver in sorted(todo):
        origin, rid, op, peer = todo[ver]
        h = Held(info.name, peer, ver, origin, rid, op)
        if origin in waiting_origins:  # an earlier change of its origin waits for its row
            waits.append(ver)
            continue
        r, err = _apply_one(conn, site, info, peers, base_max, relay, h)
        if err is not None:
            continue
        assert r is not None
        res.add(r)
        if r.parked:
            waits.append(ver)
            waiting_origins.add(origin)
    for ver in waits:
        held.mark(conn, d, list(snaps.values()), ver, applied=2)
    return res


def _apply_one(
    conn: Connection,
    site: Site,
    info: TableInfo,
    peers: Sequence[str],
    base_max: int,
    relay: Sequence[str] | None,
    h: Held,
    queued: Mapping[str, Any] | None = None,
) -> tuple[ReconcileResult | None, str | None]:
    """Apply the change `h` (its snapshot rows not applied) under a savepoint, or hold it: waiting
    behind a held change of its row, or failed with the database's error. `queued`: its row in the
    queue when it is held already (a retry). Returns (what was applied, None) or (None, why held)."""
    d = site.dialect
    snaps = list(_snaps(d, info, peers).values())
    at = now_iso()
    first = store.errorqueue.blocker(conn, d, info.name, h.rid)
    if first is not None and (queued is None or first != queued["id"]):
        if queued is None:
            store.errorqueue.hold(conn, d, h, "waiting", at, blocked_by=first)
        else:
            store.errorqueue.waits_behind(conn, d, queued["id"], first, at)
        held.mark(conn, d, snaps, h.ver)
        return None, "waiting"
    if not is_version(h.ver):
        why = f"malformed change (ver={h.ver!r})"
    else:
        # a held insert that kept its rank: its row goes in at the key it ranks to
        key = held.rank_kept(conn, d, info, h.rid) if queued is not None and h.op == "I" and info.spec.renumber else None
        sp = conn.begin_nested()
        try:
            if key is not None:
                r = _insert_at_rank(conn, site, info, peers, relay, h, key)
            else:
                r = reconcile_table(conn, site, info, peers, base_max, relay, only=[h.ver])
        except (DBAPIError, CorruptChange) as e:
            if not permanent(d, e):
                raise
            _rolled_back(conn, d, sp)
            why = describe(e)
            if h.op == "I" and info.spec.renumber and queued is None:
                _keep_rank(conn, site, info, peers, base_max, h)
        else:
            sp.commit()
            return r, None
    if queued is None:
        store.errorqueue.hold(conn, d, h, "failed", at, why)
    else:
        store.errorqueue.failed_again(conn, d, queued["id"], why, at)
    held.mark(conn, d, snaps, h.ver)
    return None, why


def _rolled_back(conn: Connection, d: Dialect, sp: Any) -> None:
    """Roll back to savepoint `sp`, and what a rollback does not undo everywhere: the capture
    guard (a session setting on some databases) and the scratch table of identities."""
    sp.rollback()
    d.set_applying(conn, False)
    conn.exec_driver_sql(f"DELETE FROM {d.temp_rids(conn)}")


def _keep_rank(conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], base_max: int, h: Held) -> bool:
    """A held insert of a renumbered table keeps its rank: its shadow row is written (the keys of
    later identities shift as if it were here) and not its table row, so every key agrees with the
    other sites' while it is held. Not relayed (a retry relays it). Returns whether it could."""
    sp = conn.begin_nested()
    try:
        reconcile_table(conn, site, info, peers, base_max, [], only=[h.ver], rank_only=True)
    except (DBAPIError, CorruptChange) as e:
        if not permanent(site.dialect, e):
            raise
        _rolled_back(conn, site.dialect, sp)
        return False
    sp.commit()
    return True


def _insert_at_rank(
    conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], relay: Sequence[str] | None, h: Held, key: int
) -> ReconcileResult:
    """Retry a held insert that kept its rank: insert its row at `key` (the values its snapshot row
    carries), relay it when peers need it, mark it applied."""
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    snaps = _snaps(d, info, peers)
    snap = snaps[held.peer_of(conn, d, snaps, h.ver)]
    cols = info.column_names
    vals = conn.exec_driver_sql(f"SELECT {', '.join(q('n_' + c) for c in cols)} FROM {snap} WHERE ver = {ph}", (h.ver,)).first()
    if vals is None:
        raise CorruptChange(info.name, h.peer, h.ver, "the held insert is no longer in the snapshot")
    d.lock_for_apply(conn, info)
    d.set_applying(conn, True)
    collist = ", ".join([q(info.key.name)] + [q(c) for c in cols])
    conn.exec_driver_sql(f"INSERT INTO {q(info.name)} ({collist}) VALUES ({d.ph(len(cols) + 1)})", (key, *vals))
    d.after_apply(conn, info)
    if relay is None or h.origin in relay:
        lcols = log_select_columns(site, info)
        d.append_log(
            conn,
            info.name,
            [*lcols, "sv"],
            select=f"SELECT {', '.join(lcols)}, {int(info.version)} FROM {snap} WHERE ver = {ph}",
            params=(h.ver,),
        )
    d.set_applying(conn, False)
    held.mark(conn, d, list(snaps.values()), h.ver, applied=1)
    return ReconcileResult(info.name, applied=1, inserted=1)


@dataclass
class RetryResult:
    """What `errors retry` did at one site: ids applied, ids still held (id -> why)."""

    site: str
    applied: list[int] = field(default_factory=list)
    held: dict[int, str] = field(default_factory=dict)
    result: dict[str, ReconcileResult] = field(default_factory=dict)


def retry(
    conn: Connection,
    site: Site,
    infos: dict[str, TableInfo],
    peers: Sequence[str],
    base_max: dict[str, int],
    relay: Mapping[str, Sequence[str] | None],
    queued: list[dict[str, Any]],
    out: RetryResult,
) -> None:
    """In a write transaction at `site`: apply the held changes `queued` (rows of the queue, open)
    again, in version order per table, each under a savepoint. One that applies leaves the queue;
    one that fails again stays (its error and attempts updated), and the later changes of its row
    wait behind it. `_mm_origins` is not asked: a held change may be below what it records."""
    d = site.dialect
    for q in retry_order(queued):
        if q["state"] not in store.errorqueue.OPEN or q["state"] == store.errorqueue.SCHEMA:
            continue  # (a change waiting for a column is applied when the site has it: engine/evolve.py)
        tb = str(q["tbl"])
        info = infos[tb]
        h = Held(tb, str(q["peer"]), str(q["ver"]), str(q["origin"]), str(q["rid"]), str(q["op"]))
        if h.op == "?":  # a malformed change-log entry: nothing to apply, only to skip
            store.errorqueue.failed_again(
                conn, d, q["id"], f"{q['error']} (a malformed entry cannot be applied: skip it)"[:2000], now_iso()
            )
            out.held[int(q["id"])] = "malformed"
            continue
        held.mark(conn, d, list(_snaps(d, info, peers).values()), h.ver, applied=0)
        r, why = _apply_one(conn, site, info, peers, base_max[tb], relay[tb], h, queued=q)
        if why is not None:
            out.held[int(q["id"])] = why
            continue
        assert r is not None
        if r.parked:  # waits for its row: held still (a refresh would take it for a duplicate)
            why = "waits for its row, which this site does not hold"
            store.errorqueue.failed_again(conn, d, q["id"], why, now_iso())
            held.mark(conn, d, list(_snaps(d, info, peers).values()), h.ver)
            out.held[int(q["id"])] = why
            continue
        store.errorqueue.release(conn, d, q["id"])
        out.applied.append(int(q["id"]))
        out.result.setdefault(tb, ReconcileResult(tb)).add(r)
