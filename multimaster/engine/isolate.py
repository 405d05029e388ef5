"""Isolating mode: when a batch fails for good, find the changes at fault and hold them in the error
queue (docs/errors.md), so everything else of the link goes on.

A refresh applies a batch in one transaction (engine/refresh.py). When the database rejects it
with an error that is not transient (:func:`permanent`: not a deadlock, serialization failure or
lock timeout — ``Dialect.is_retryable`` —, not a lost connection), the transaction is rolled back
and the batch runs again here: malformed change-log entries are held (not stored in the snapshot),
the rest is stored, and the new changes are applied *source transaction by source transaction*
(core.errorqueue.units: the changes of one ``(origin, txn)``; a change whose source records no
transaction, a SQLite site's, is one alone), each unit under one SAVEPOINT, its changes by the
reconciler itself (``reconcile_table(only=[...])``, no fast path), table by table (parents first),
then in version order. A unit whose savepoint fails is rolled back and held whole: the change at
fault (the last of the unit's shortest failing prefix) ``failed`` (the database's error), the
others ``txn`` (held with it); a later
change of a row with a held change waits behind it (``waiting``), and its unit with it; a unit with
a change that waits for its row waits whole, and holds back the later changes of its origin, as in
a batch. `errors retry` re-applies held units the same way (:func:`retry`).

Units go several at a time where the database takes them (core.errorqueue.in_halves): the batch's
halves, each in one savepoint with one reconcile per table; a half that fails is halved again, down
to the units at fault, which alone go unit by unit as above. The outcome is the same as one unit
at a time, which cost one reconcile per change: a batch of 2,000 with one change rejected took 52 s
on MariaDB and 246 s on PostgreSQL (1.6 s and 1.2 s now, session 30).

A transaction of isolating mode holds the tables' writers back (MariaDB: their slots), so it goes
on for at most :func:`budget` seconds once it has handled one unit: it commits what it did, the
units it did not reach stay stored and not applied, and the next transaction goes on from them
(engine/refresh.py ``_settle_left``), the same outcome as one transaction (core.errorqueue.in_halves
``stop``). Many rejected changes under load held MariaDB's writers for 1,000 s, and applications
got lock wait timeouts (1205) meanwhile (session 34).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.core.errorqueue import MALFORMED, Holds, in_halves, is_version, refusal, shortest_failing, units
from multimaster.core.versions import now_iso
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.engine import held, references, relays, uniques
from multimaster.engine.pull import any_misfit, refit, store_batch
from multimaster.engine.reconcile import ReconcileResult, reconcile_table
from multimaster.engine.site import Site
from multimaster.errors import CorruptChange
from multimaster.store.errorqueue import Held

__all__ = [
    "permanent",
    "describe",
    "has_malformed",
    "has_misfit",
    "known_origins",
    "refused_message",
    "apply_batch",
    "hold_waiting",
    "reconcile_isolating",
    "budget",
    "retry",
    "RetryResult",
]


def permanent(d: Dialect, e: BaseException) -> bool:
    """Whether `e`, raised while applying a batch, is the database rejecting a change for good: a
    malformed change, or a database error that is neither transient (Dialect.is_retryable) nor a
    lost connection nor a column the engine's description has and the table no longer has
    (Dialect.names_missing_column; those stay link errors, retried with backoff)."""
    if isinstance(e, CorruptChange):
        return True
    if isinstance(e, DBAPIError) and d.names_missing_column(e):
        # the batch was built from a description older than the table (a column dropped since,
        # by `multimaster ddl` or by hand): a link error; the next refresh describes it again.
        # Held, the changes waited for an `errors retry` that nothing calls for (session 32)
        return False
    return isinstance(e, DBAPIError) and not e.connection_invalidated and not d.is_retryable(e)


def describe(e: BaseException) -> str:
    """The error as the queue stores it: the driver's message (first lines), passwords masked."""
    orig = getattr(e, "orig", None) or e
    text = " ".join(str(orig).strip().splitlines()[:3]) or type(orig).__name__
    return redact(f"{type(orig).__name__}: {text}")


def _snaps(d: Dialect, info: TableInfo, peers: Sequence[str]) -> dict[str, str]:
    return {p: d.obj(info.name, p).snapshot() for p in peers}


def _split(
    rows: list[tuple[Any, ...]], known: Collection[str] | None = None
) -> tuple[list[tuple[Any, ...]], list[tuple[tuple[Any, ...], str]], dict[str, str]]:
    """The pulled `rows` (seq2, op2, seq, ver, origin, op, rid, key, mask, ...) that can be stored
    (in order), the malformed ones with why, and among those stored, the versions of the entries
    whose origin is not in `known` (None: not checked), with why (core.errorqueue.refusal)."""
    good, bad, foreign = [], [], {}
    for r in rows:
        if r[1] != "A":
            bad.append((r, f"unknown second-order log record type {r[1]!r}"))
            continue
        if r[3] is None:  # a second-order record without its entry: nothing to hold
            good.append(r)
            continue
        got = refusal(r[3], r[4], r[5], r[6], r[8], known if known is not None else (r[4],), r[-1])  # sup: last
        if got is None:
            good.append(r)
        elif got[0] == MALFORMED:
            bad.append((r, got[1]))
        else:
            good.append(r)
            foreign[str(r[3])] = got[1]
    return good, bad, foreign


def has_malformed(rows: list[tuple[Any, ...]], known: Collection[str] | None = None) -> bool:
    """Whether pulled `rows` hold an entry that cannot be applied as it is (core.errorqueue.refusal:
    malformed, or of an origin not in `known` when given)."""
    _, bad, foreign = _split(rows, known)
    return bool(bad or foreign)


def has_misfit(site: Site, infos: Sequence[TableInfo], rows: Mapping[str, list[tuple[Any, ...]]]) -> bool:
    """Whether pulled `rows` (per table of `infos`) hold a value `site` cannot store exactly: the
    batch is applied in isolating mode, which holds it with its source transaction and the later
    changes of its row (engine/pull.py store_batch)."""
    return any(any_misfit(site, i, rows[i.name]) for i in infos if rows.get(i.name))


def known_origins(conn: Connection, site: Site, topo_sites: Sequence[str]) -> frozenset[str]:
    """The origins a change pulled into `site` may have (store.retired.known_origins)."""
    return store.retired.known_origins(conn, site.dialect, list(topo_sites))


def refused_message(peer: str, table: str, seq: Any, origin: Any, why: str, site: str) -> str:
    """The queue's error for an entry refused as it was pulled: the peer, the table, the entry and
    its origin, what is wrong, and the fix."""
    head = f"change log of peer '{peer}', table '{table}', entry {seq} (origin '{origin}'): {why}"
    if why.startswith("origin "):
        return (
            f"{head}. Fix: if '{origin}' is a site of the cluster, add it under sites in the topology file, then "
            f"'multimaster errors retry -t FILE --site {site} --id ID'; otherwise drop it: "
            f"'multimaster errors skip -t FILE --site {site} --id ID --reason TEXT'"
        )
    return f"{head}. It can never be applied: 'multimaster errors skip -t FILE --site {site} --id ID --reason TEXT'"


def apply_batch(
    conn: Connection,
    site: Site,
    infos: Sequence[TableInfo],
    peer: str,
    rows: Mapping[str, list[tuple[Any, ...]]],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    relay: Mapping[str, Sequence[str] | None],
    reconcile_: bool,
    known: Collection[str] | None = None,
) -> tuple[int, dict[str, ReconcileResult]]:
    """In the target's write transaction, a batch from `peer` (`rows` per table; `infos` in the
    order tables are applied) that failed for good, or holds entries refused as they are
    (core.errorqueue.refusal): hold its malformed entries, store the rest, hold those whose origin
    is not in `known` (their source transactions and later changes of their rows are held with
    them before anything is applied), move the watermarks past the batch, and (when `reconcile_`)
    apply the new changes source transaction by source transaction (:func:`reconcile_isolating`).
    Returns (stored, results)."""
    d = site.dialect
    stored = 0
    at = now_iso()
    for info in infos:
        part = rows.get(info.name)
        if not part:
            continue
        good, bad, foreign = _split(part, known)
        unfit: list[dict[str, Any]] = []  # values this site cannot store exactly: held as stored
        n, _last, _ = store_batch(conn, site, info, peer, good, applied=False, refused=unfit)
        stored += n
        if unfit and reconcile_:
            _keep_ranks_held(conn, site, {info.name: info}, peers, base_max, unfit)
        width = 3 + 6 + 2 * len(info.columns) + 2 * len(info.refs)  # the txn's place (pull.log_select_columns)
        for r, why in bad:
            ver = r[3] if is_version(r[3]) else f"?{peer}:{r[2]}"  # a position names it when its version cannot
            rid = r[6] if isinstance(r[6], str) and r[6] else "?"
            txn = r[width] if len(r) > width and r[width] is not None and isinstance(r[4], str) else None
            h = Held(info.name, peer, ver, str(r[4]), rid, "?", None if txn is None else str(txn))
            store.errorqueue.hold(conn, d, h, "failed", at, refused_message(peer, info.name, r[2], r[4], why, site.name))
        if foreign:
            seq = {str(r[3]): r[2] for r in good}
            refused_now = []
            for c in held.pending(conn, d, [info], peers):
                refused = foreign.get(c["ver"])
                if refused is None:
                    continue
                msg = refused_message(peer, info.name, seq[c["ver"]], c["origin"], refused, site.name)
                store.errorqueue.hold(conn, d, held.as_held(c), "failed", at, msg)
                held.mark(conn, d, list(_snaps(d, info, peers).values()), c["ver"])
                refused_now.append(c)
            if reconcile_:
                _keep_ranks_held(conn, site, {info.name: info}, peers, base_max, refused_now)
        store.watermarks.write(conn, d, peer, info.name, part[-1][0])
    if not reconcile_:
        return stored, {}
    return stored, reconcile_isolating(conn, site, infos, peers, base_max, relay, budget())


def hold_waiting(
    conn: Connection, site: Site, infos: Sequence[TableInfo], peers: Sequence[str], base_max: Mapping[str, int]
) -> int:
    """Before applying the changes of `infos` not applied yet: hold the source transactions a held
    change holds back (engine/held.py hold_groups), and let their inserts of renumbered tables keep
    their rank. Returns how many changes were held."""
    got = held.hold_groups(conn, site.dialect, infos, peers)
    _keep_ranks_held(conn, site, {i.name: i for i in infos}, peers, base_max, got)
    return len(got)


#: seconds one isolating transaction goes on once it handled a unit (MM_ISOLATE_BUDGET overrides)
BUDGET_S = 2.0


def budget() -> float:
    """How long one transaction of isolating mode goes on, once it has handled a source
    transaction, before it commits and the next one goes on (MM_ISOLATE_BUDGET, seconds)."""
    return float(os.environ.get("MM_ISOLATE_BUDGET", BUDGET_S))


def reconcile_isolating(
    conn: Connection,
    site: Site,
    infos: Sequence[TableInfo],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    relay: Mapping[str, Sequence[str] | None],
    budget_s: float | None = None,
) -> dict[str, ReconcileResult]:
    """Apply the snapshot rows of `infos` (in the order tables are applied) not applied yet, source
    transaction by source transaction (core.errorqueue.units: a change without one is one alone),
    each under one savepoint, its changes table by table in that order, then by version — many
    units at once where the database takes them (core.errorqueue.in_halves: halves of the batch,
    then their halves, down to the units at fault; one at a time, a batch of 2,000 with one change
    rejected took 52 s on MariaDB and 246 s on PostgreSQL, session 30). A unit the
    database rejects is rolled back and held whole: the change rejected ``failed`` with the
    database's error, every other ``txn``, held with it; later changes of its rows wait behind it.
    A unit with a change that must wait for its row waits whole (``applied = 2``), with the later
    changes of its origins. `budget_s`: once a unit was handled and that many seconds passed, no
    more is tried; the rest stays stored, not applied, and each table's result says how many units
    were left (``left``) for the next transaction. Returns what was applied, per table."""
    d = site.dialect
    by = {i.name: i for i in infos}
    order = [i.name for i in infos]
    for info in infos:
        for snap in _snaps(d, info, peers).values():
            conn.exec_driver_sql(f"UPDATE {snap} SET applied = 0 WHERE applied = 2")
    hold_waiting(conn, site, infos, peers, base_max)
    cs = held.pending(conn, d, infos, peers)
    holds = Holds(store.errorqueue.rows(conn, d))
    res = {i.name: ReconcileResult(i.name) for i in infos}
    waits: list[dict[str, Any]] = []  # changes waiting for their row (applied = 2 once done)
    waiting_origins: set[str] = set()
    us = [[cs[i] for i in unit] for unit in units(cs, order)]
    deadline = None if budget_s is None else time.monotonic() + budget_s
    handled = [0]

    def together(lo: int, hi: int) -> bool:
        group = us[lo:hi]
        if any(any(m["origin"] in waiting_origins for m in ms) or holds.blocked(ms) is not None for ms in group):
            return False  # one of them waits, or waits behind a held change: unit by unit
        done, _why = _apply_many(conn, site, by, order, peers, base_max, relay, [m for ms in group for m in ms], retry=False)
        for tb, r in (done or {}).items():
            res[tb].add(r)
        handled[0] += done is not None
        return done is not None

    def one(i: int) -> None:
        handled[0] += 1
        members = us[i]
        if any(m["origin"] in waiting_origins for m in members):  # an earlier change of its origin waits for its row
            waits.extend(members)
            return
        b = holds.blocked(members)
        if b is not None:
            pos, state, ref = b
            ids = _hold_unit(conn, site, by, peers, base_max, members, pos, state, int(ref), None)
            holds.hold(members, ids, pos)
            return
        done, pos, why = _apply_unit(conn, site, by, peers, base_max, relay, members, retry=False)
        if done is not None:
            for tb, r in done.items():
                res[tb].add(r)
            return
        assert why is not None
        if why == _WAITS:
            waits.extend(members)
            waiting_origins.update(m["origin"] for m in members)
            return
        ids = _hold_unit(conn, site, by, peers, base_max, members, pos, "failed", None, why)
        holds.hold(members, ids, pos)

    def out_of_time() -> bool:
        return deadline is not None and handled[0] > 0 and time.monotonic() >= deadline

    # the batch failed as a whole already: its halves, and so on down to the units at fault
    done = in_halves(len(us), together, one, whole=False, stop=out_of_time)
    for m in waits:
        held.mark(conn, d, list(_snaps(d, by[m["tbl"]], peers).values()), m["ver"], applied=2)
    _count_left(res, us[done:])
    return res


def _count_left(res: Mapping[str, ReconcileResult], rest: Sequence[Sequence[dict[str, Any]]]) -> None:
    """Per table, the units left for the next transaction (stored, not applied)."""
    for ms in rest:
        for tb in {m["tbl"] for m in ms}:
            res[tb].left += 1


#: why a unit was not applied: a change of it waits for its row (this site does not hold it yet)
_WAITS = "waits for its row, which this site does not hold"
#: why a retried held insert was not applied: a row it references is not at this site yet
_WAITS_REF = "waits for a row it references, which this site does not hold yet"


def _hold_unit(
    conn: Connection,
    site: Site,
    infos: Mapping[str, TableInfo],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    members: Sequence[Mapping[str, Any]],
    head: int,
    state: str,
    blocked_by: int | None,
    error: str | None,
) -> list[int]:
    """Queue the unit `members` (not held before): the change at `head` as `state` ('failed' with
    `error`, 'waiting' behind or 'txn' with `blocked_by`), the others 'txn' with it; inserts of
    renumbered tables keep their rank; every snapshot row ``applied = 3``. Returns their ids."""
    d = site.dialect
    at = now_iso()
    first = store.errorqueue.hold(conn, d, held.as_held(members[head]), state, at, error, blocked_by)
    ids = [
        first if k == head else store.errorqueue.hold(conn, d, held.as_held(m), "txn", at, blocked_by=first)
        for k, m in enumerate(members)
    ]
    _keep_ranks_held(conn, site, infos, peers, base_max, members)
    for m in members:
        held.mark(conn, d, list(_snaps(d, infos[m["tbl"]], peers).values()), m["ver"])
    return ids


def _keep_ranks_held(
    conn: Connection,
    site: Site,
    infos: Mapping[str, TableInfo],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    cs: Sequence[Mapping[str, Any]],
) -> None:
    """Changes `cs` just held: their inserts into renumbered tables keep their rank
    (:func:`_keep_rank`), a table's all at once where the database takes them, else in halves
    (core.errorqueue.in_halves; one at a time, each a reconcile, a source transaction of 400
    inserts held for one rejected change took 12 s on MariaDB, session 30); their snapshot rows
    stay held (``applied = 3``)."""
    d = site.dialect
    by: dict[str, list[Held]] = {}
    for c in cs:
        if c["op"] == "I" and infos[c["tbl"]].spec.renumber and is_version(c["ver"]):
            by.setdefault(str(c["tbl"]), []).append(held.as_held(c))
    for tb, hs in by.items():
        snaps = list(_snaps(d, infos[tb], peers).values())
        for h in hs:
            held.unhold(conn, d, snaps, h.ver)
        _keep_ranks(conn, site, infos[tb], peers, base_max[tb], hs)
        for h in hs:
            held.mark(conn, d, snaps, h.ver)


def _keep_ranks(conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], base_max: int, hs: Sequence[Held]) -> None:
    """:func:`_keep_rank` for the held inserts `hs` of `info`: many at once, in halves when refused."""

    def one(i: int) -> None:
        _keep_rank(conn, site, info, peers, base_max, hs[i : i + 1])

    in_halves(len(hs), lambda lo, hi: _keep_rank(conn, site, info, peers, base_max, hs[lo:hi]), one)


def _apply_unit(
    conn: Connection,
    site: Site,
    infos: Mapping[str, TableInfo],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    relay: Mapping[str, Sequence[str] | None],
    members: Sequence[Mapping[str, Any]],
    retry: bool,
) -> tuple[dict[str, ReconcileResult] | None, int, str | None]:
    """Apply the unit `members` (their snapshot rows not applied; table by table, then by version)
    under one savepoint: all of them, or none. Returns (what was applied per table, -1, None), or
    (None, the position of the change at fault, why: the database's error, or _WAITS) with
    nothing changed. `retry`: a held insert that kept its rank goes in at the key it ranks to.

    The unit goes at once, one reconcile per table (:func:`_apply_many`). When it fails, the
    change at fault is the last of the shortest failing prefix of the unit, found by halving
    (prefixes tried and rolled back): log2(n) attempts, where one reconcile per change took 12 s
    for a source transaction of 400 inserts on MariaDB (session 30)."""
    order = list(dict.fromkeys(str(m["tbl"]) for m in members))
    done, why = _apply_many(conn, site, infos, order, peers, base_max, relay, members, retry)
    if done is not None:
        return done, -1, None
    errors: dict[int, str] = {len(members): str(why)}

    def fails(k: int) -> bool:
        _done, w = _apply_many(conn, site, infos, order, peers, base_max, relay, members[:k], retry, probe=True)
        if w is not None:
            errors[k] = w
        return w is not None

    k = shortest_failing(len(members), fails)
    return None, k - 1, errors[k]


def _rolled_back(conn: Connection, d: Dialect, sp: Any) -> None:
    """Roll back to savepoint `sp`, and what a rollback does not undo everywhere: the capture
    guard (a session setting on some databases) and the scratch table of identities."""
    sp.rollback()
    d.set_applying(conn, False)
    conn.exec_driver_sql(f"DELETE FROM {d.temp_rids(conn)}")


def _keep_rank(conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], base_max: int, hs: Sequence[Held]) -> bool:
    """Held inserts `hs` of a renumbered table keep their rank: their shadow rows are written (the
    keys of later identities shift as if they were here) and not their table rows, so every key
    agrees with the other sites' while they are held. Not relayed (a retry relays them). Returns
    whether it could (all of them, or none)."""
    sp = conn.begin_nested()
    try:
        reconcile_table(conn, site, info, peers, base_max, [], only=[h.ver for h in hs], rank_only=True)
    except (DBAPIError, CorruptChange) as e:
        if not permanent(site.dialect, e):
            raise
        _rolled_back(conn, site.dialect, sp)
        return False
    sp.commit()
    return True


def _insert_at_rank(
    conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], relay: Sequence[str] | None, h: Held, key: int
) -> ReconcileResult | None:
    """Retry a held insert that kept its rank: insert its row at `key` (the values its snapshot row
    carries, each reference as the key here of the row its identity names: references.insert_keys),
    relay it when peers need it, mark it applied. None, with nothing done, when a row it references
    is not here (it waits); UnresolvedReference when a reference has no identity. Before session
    34 the references went in as the origin's keys, which may name other rows here."""
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    snaps = _snaps(d, info, peers)
    snap = snaps[held.peer_of(conn, d, snaps, h.ver)]
    cols = info.column_names
    vals = conn.exec_driver_sql(f"SELECT {', '.join(q('n_' + c) for c in cols)} FROM {snap} WHERE ver = {ph}", (h.ver,)).first()
    if vals is None:
        raise CorruptChange(info.name, h.peer, h.ver, "the held insert is no longer in the snapshot")
    row = references.insert_keys(conn, site, info, snap, h.peer, h.ver, tuple(vals))
    if row is None:
        return None
    d.lock_for_apply(conn, info)
    d.set_applying(conn, True)
    with references.deferred(conn, d, references.involved(conn, d, info)):  # as the reconciler applies
        # its UNIQUE sets as at a first apply: a value a row here holds is decided by the rule, so
        # this site marks (or parks) the row every other site did (before session 37: the raw
        # values, refused as a duplicate, and held for good)
        values, pend = uniques.room_for_insert(conn, site, info, h.rid, row)
        if values is not None:
            collist = ", ".join([q(info.key.name)] + [q(c) for c in cols])
            conn.exec_driver_sql(f"INSERT INTO {q(info.name)} ({collist}) VALUES ({d.ph(len(cols) + 1)})", (key, *values))
        conflicts = uniques.after_insert(conn, site, info, pend, list(snaps))
        references.orphans_of(conn, site, info, snap, h.ver, list(snaps))  # it references a row deleted meanwhile
    d.after_apply(conn, info)
    held.mark(conn, d, list(snaps.values()), h.ver, applied=1)
    relays.relay_one(conn, site, info, snap, list(snaps.values()), h.ver, h.origin, relay)
    d.set_applying(conn, False)
    return ReconcileResult(info.name, applied=1, inserted=1, conflicts=conflicts)


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
    infos: Mapping[str, TableInfo],
    order: Sequence[str],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    relay: Mapping[str, Sequence[str] | None],
    queued: list[dict[str, Any]],
    others: list[dict[str, Any]],
    out: RetryResult,
    known: Collection[str] | None = None,
) -> None:
    """In a write transaction at `site`: apply the held changes `queued` (open rows of the queue)
    again, unit by unit (core.errorqueue.units: a source transaction, or a change without one),
    in the order they apply, each unit under one savepoint: all its changes apply and leave the
    queue, or none does. A unit rejected again stays held whole — the change at fault ``failed``
    with the new error, the others ``txn`` with it, one more attempt each —, and the units behind
    it wait. A unit with a change that waits behind a held change not retried here (`others`, the
    other open rows) stays as it is. `order`: the tables' order (parents first). `_mm_origins` is
    not asked: a held change may be below what it records. A unit with a change whose origin is
    not in `known` (when given: the topology's sites and the retired ones) stays held, failed."""
    d = site.dialect
    # a change waiting for a column is applied when the site has it (engine/evolve.py), not here
    queued = [q for q in queued if q["state"] != store.errorqueue.SCHEMA]
    holds = Holds(others)
    at = now_iso()
    ready = _retry_ready(conn, d, queued, order, holds, known, at, out, _refit(conn, site, infos, queued))

    def together(lo: int, hi: int) -> bool:
        group = ready[lo:hi]
        if any(holds.blocked(ms) is not None for ms, _ids in group):
            return False  # behind a unit held again just now: unit by unit
        done, _why = _apply_many(
            conn, site, infos, order, peers, base_max, relay, [m for ms, _ids in group for m in ms], retry=True
        )
        if done is None:
            return False
        _released(conn, d, [i for _ms, ids in group for i in ids], done, out)
        return True

    def one(k: int) -> None:
        _retry_unit(conn, site, infos, peers, base_max, relay, holds, ready[k][0], ready[k][1], at, out)

    # all together first: one reconcile per table instead of one per change (a renumbered table's
    # keys shift once, not once per unit); halves of them when that is rejected or waits, down to
    # the units at fault
    in_halves(len(ready), together, one)
    # what waited to be relayed behind the changes applied or skipped now goes, in version order
    for tb in order:
        if tb in infos and (relay[tb] is None or relay[tb]):
            relays.released(conn, site, infos[tb], list(_snaps(d, infos[tb], peers).values()), relay[tb])


def _retry_unit(
    conn: Connection,
    site: Site,
    infos: Mapping[str, TableInfo],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    relay: Mapping[str, Sequence[str] | None],
    holds: Holds,
    members: list[dict[str, Any]],
    ids: list[int],
    at: str,
    out: RetryResult,
) -> None:
    """A retry's unit on its own, under one savepoint: applied and out of the queue, or held whole
    again (the change at fault with the new error, the others with it)."""
    d = site.dialect
    if _blocked(conn, d, holds, members, ids, at, out):  # behind a unit held again just now
        return
    # (_apply_many makes its snapshot rows new inside its savepoint: a failure leaves them held)
    done, pos, why = _apply_unit(conn, site, infos, peers, base_max, relay, members, retry=True)
    if done is None:
        assert why is not None
        store.errorqueue.failed_again(conn, d, ids[pos], why, at)
        _held_with(conn, d, ids, pos, at, out, why, attempt=True)
        holds.hold(members, ids, pos)
        return
    _released(conn, d, ids, done, out)


def _released(conn: Connection, d: Dialect, ids: Sequence[int], done: Mapping[str, ReconcileResult], out: RetryResult) -> None:
    """Held changes `ids` applied (`done`, per table): out of the queue, counted in `out`."""
    store.errorqueue.release(conn, d, list(ids))
    out.applied.extend(ids)
    for tb, r in done.items():
        out.result.setdefault(tb, ReconcileResult(tb)).add(r)


def _retry_ready(
    conn: Connection,
    d: Dialect,
    queued: list[dict[str, Any]],
    order: Sequence[str],
    holds: Holds,
    known: Collection[str] | None,
    at: str,
    out: RetryResult,
    misfit: Mapping[tuple[str, str], str],
) -> list[tuple[list[dict[str, Any]], list[int]]]:
    """The units of `queued` a retry applies, in order, each as (its changes, their ids); those it
    cannot stay held (a malformed entry, an origin not `known`, a value this site still cannot
    store exactly (`misfit`: (table, version) -> error), behind a held change)."""
    ready: list[tuple[list[dict[str, Any]], list[int]]] = []
    for unit in units(queued, order):
        members = [queued[i] for i in unit]
        ids = [int(m["id"]) for m in members]
        bad = next((k for k, m in enumerate(members) if m["op"] == "?"), None)
        if bad is not None:  # a malformed change-log entry: nothing to apply, only to skip
            note = " (a malformed entry cannot be applied: skip it)"
            err = str(members[bad]["error"] or "")
            store.errorqueue.failed_again(conn, d, ids[bad], (err if err.endswith(note) else err + note)[:2000], at)
            _held_with(conn, d, ids, bad, at, out, "malformed", attempt=True)
            holds.hold(members, ids, bad)
            continue
        alien = next((k for k, m in enumerate(members) if known is not None and m["origin"] not in known), None)
        if alien is not None:  # its origin is still no site known here (core.errorqueue.refusal)
            m = members[alien]
            again = str(m["error"] or "") or f"origin '{m['origin']}' is not a site of the topology, nor a site removed from it"
            store.errorqueue.failed_again(conn, d, ids[alien], again[:2000], at)
            _held_with(conn, d, ids, alien, at, out, f"origin '{m['origin']}' is not a site of the topology", attempt=True)
            holds.hold(members, ids, alien)
            continue
        unfit = next((k for k, m in enumerate(members) if (str(m["tbl"]), str(m["ver"])) in misfit), None)
        if unfit is not None:  # a value this site still cannot store exactly (engine/pull.py refit)
            err = misfit[(str(members[unfit]["tbl"]), str(members[unfit]["ver"]))]
            store.errorqueue.failed_again(conn, d, ids[unfit], err[:2000], at)
            _held_with(conn, d, ids, unfit, at, out, "a value this site cannot store exactly", attempt=True)
            holds.hold(members, ids, unfit)
            continue
        if not _blocked(conn, d, holds, members, ids, at, out):
            ready.append((members, ids))
    return ready


def _refit(
    conn: Connection, site: Site, infos: Mapping[str, TableInfo], queued: Sequence[Mapping[str, Any]]
) -> dict[tuple[str, str], str]:
    """The held changes of `queued` whose values were taken out as they were stored, because this
    site could not store them exactly (engine/pull.py): put back where the columns hold them now;
    returns those that still do not fit, (table, version) -> error."""
    by: dict[tuple[str, str], set[str]] = {}
    for q in queued:
        if q["op"] != "?" and q["tbl"] in infos:
            by.setdefault((str(q["tbl"]), str(q["peer"])), set()).add(str(q["ver"]))
    out: dict[tuple[str, str], str] = {}
    for (tb, peer), vers in sorted(by.items()):
        for ver, err in refit(conn, site, infos[tb], peer, vers).items():
            out[(tb, ver)] = err
    return out


def _blocked(
    conn: Connection,
    d: Dialect,
    holds: Holds,
    members: Sequence[Mapping[str, Any]],
    ids: Sequence[int],
    at: str,
    out: RetryResult,
) -> bool:
    """Whether the unit `members` waits behind a held change it does not retry; if so it stays
    held, behind it."""
    b = holds.blocked(members)
    if b is None:
        return False
    pos, state, ref = b
    if state == "waiting":
        store.errorqueue.waits_behind(conn, d, ids[pos], int(ref), at)
    else:
        store.errorqueue.held_with(conn, d, ids[pos], int(ref), at, attempt=False)
    _held_with(conn, d, ids, pos, at, out, f"waits behind #{ref}", attempt=False)
    holds.hold(members, ids, pos)
    return True


def _apply_many(
    conn: Connection,
    site: Site,
    infos: Mapping[str, TableInfo],
    order: Sequence[str],
    peers: Sequence[str],
    base_max: Mapping[str, int],
    relay: Mapping[str, Sequence[str] | None],
    members: Sequence[Mapping[str, Any]],
    retry: bool,
    probe: bool = False,
) -> tuple[dict[str, ReconcileResult] | None, str | None]:
    """Apply the changes `members` at once, under one savepoint, table by table in `order`, one
    reconcile per table (as a refresh applies a batch). Returns (what was applied per table, None);
    or (None, why: the database's error, or _WAITS when one waits for its row) with nothing
    changed. `retry`: they are held changes (their snapshot rows made new first; a held insert
    that kept its rank goes in at it). `probe`: roll back even when all applied (only whether
    they would).

    One change at a time, each reconciled alone, cost one reconcile per change, and on a
    renumbered table each shifted the keys of every later row again: 678 changes released on
    MariaDB took 212 s (docs/performance.md, session 30)."""
    d = site.dialect
    res: dict[str, ReconcileResult] = {}
    sp = conn.begin_nested()
    tb = ""
    try:
        if retry:
            for tb in sorted({str(m["tbl"]) for m in members}):
                vers = [str(m["ver"]) for m in members if m["tbl"] == tb]
                held.unhold_many(conn, d, list(_snaps(d, infos[tb], peers).values()), vers)
        for tb in order:
            mine = sorted((m for m in members if m["tbl"] == tb), key=lambda m: str(m["ver"]))
            if not mine:
                continue
            info = infos[tb]
            rest: list[str] = []
            kept = (
                held.ranks_kept(conn, d, info, [str(m["rid"]) for m in mine if m["op"] == "I"])
                if retry and info.spec.renumber
                else {}
            )
            for m in mine:
                h = held.as_held(m)
                key = kept.get(str(h.rid)) if h.op == "I" else None
                if key is None:
                    rest.append(h.ver)
                    continue
                done = _insert_at_rank(conn, site, info, peers, relay[tb], h, key)
                if done is None:
                    _rolled_back(conn, d, sp)
                    return None, _WAITS_REF
                res.setdefault(tb, ReconcileResult(tb)).add(done)
            if rest:
                r = reconcile_table(conn, site, info, peers, base_max[tb], relay[tb], only=rest)
                if r.parked:
                    _rolled_back(conn, d, sp)
                    return None, _WAITS
                res.setdefault(tb, ReconcileResult(tb)).add(r)
    except (DBAPIError, CorruptChange) as e:
        if not permanent(d, e):
            raise
        _rolled_back(conn, d, sp)
        return None, _why(conn, site, infos.get(tb), e)
    if probe:
        _rolled_back(conn, d, sp)
    else:
        sp.commit()
    return res, None


def _why(conn: Connection, site: Site, info: TableInfo | None, e: BaseException) -> str:
    """The queue's error for a change `site` rejected with `e`: the database's message, or, where
    the dialect says what it means (a duplicate only under a column's collation), that, naming the
    site and the fix (Dialect.explain_rejection)."""
    told = site.dialect.explain_rejection(conn, info, e) if info is not None else None
    if told is None:
        return describe(e)
    return (
        f"value refused: site '{site.name}' ({site.dialect.title}): {told} ('multimaster errors retry -t FILE --site "
        f"{site.name} --id ID', 'multimaster errors skip -t FILE --site {site.name} --id ID --reason TEXT', which drops "
        f"it with the rest of its source transaction at this site only; database error: {describe(e)})"
    )


def _held_with(
    conn: Connection, d: Dialect, ids: Sequence[int], head: int, at: str, out: RetryResult, why: str, attempt: bool
) -> None:
    """A unit stays held: every change of it but the one at `head` is held with it (``txn``)."""
    out.held[ids[head]] = why
    for k, i in enumerate(ids):
        if k != head:
            store.errorqueue.held_with(conn, d, i, ids[head], at, attempt)
            out.held[i] = f"held with #{ids[head]} (its source transaction)"
