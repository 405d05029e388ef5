"""Changes held in the error queue (docs/errors.md), as the reconciler sees them: a change of a row
that has a change held waits behind it, and what marks a held change in its snapshot.

A held change's snapshot row is ``applied = 3`` (not applied, not tried again by a refresh: only
``multimaster errors retry`` applies it, engine/isolate.py). The queue's rows are
:mod:`multimaster.store.errorqueue`'s.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.core.errorqueue import is_version, plan_holds
from multimaster.core.planner import Plan
from multimaster.core.versions import now_iso
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.store.errorqueue import Held

__all__ = [
    "HELD",
    "WAITING",
    "park",
    "hold_behind",
    "hold_groups",
    "pending",
    "as_held",
    "only_versions",
    "only_table",
    "ONLY_INLINE",
    "mark",
    "unhold",
    "peer_of",
    "rank_only",
    "rank_kept",
    "ranks_kept",
    "unhold_many",
    "tombstone",
]

#: `applied` of a snapshot row held in the error queue
HELD = 3
#: `applied` of a snapshot row waiting (for its row, a referenced row, an earlier change of its origin)
WAITING = 2


def park(conn: Connection, d: Dialect, snaps: Sequence[str], cand: str, vers: Sequence[str]) -> None:
    """The changes `vers` wait: ``applied = 2`` in every snapshot of `snaps`, tried again at the
    next reconcile, and removed from the candidates `cand`. One statement per 500 changes (a
    driver runs an executemany of an UPDATE row by row: a round trip per change)."""
    ph = d.caps.placeholder
    for i in range(0, len(vers), 500):
        part = tuple(vers[i : i + 500])
        among = f"ver IN ({', '.join([ph] * len(part))})"
        for snap in snaps:
            conn.exec_driver_sql(f"UPDATE {snap} SET applied = {WAITING} WHERE {among}", part)
        conn.exec_driver_sql(f"DELETE FROM {cand} WHERE {among}", part)


#: above this many versions, `only` is a scratch table, not a list in the statement's text (each
#: version is ~30 bytes: a list of every held change made statements of megabytes, past MariaDB's
#: max_allowed_packet, 16 MB, at about 500,000)
ONLY_INLINE = 1000


def only_versions(only: Sequence[str] | None, prefix: str = "", table: str | None = None) -> str:
    """SQL: `` AND <prefix>ver IN (...)`` for `only` ('' for None); with `table` (from
    :func:`only_table`), the versions are read from it. Every version must pass
    core.errorqueue.is_version (digits, ':' and a site name: safe as a literal)."""
    if only is None:
        return ""
    if table is not None:
        return f" AND {prefix}ver IN (SELECT ver FROM {table})"
    bad = [v for v in only if not is_version(v)]
    if bad or not only:
        raise ValueError(f"not versions: {bad or only!r}")
    return f" AND {prefix}ver IN ({', '.join(repr(str(v)) for v in only)})"


def only_table(conn: Connection, d: Dialect, like: str, only: Sequence[str] | None) -> str | None:
    """A scratch table (one column `ver`, unique) holding `only` when it has more than
    :data:`ONLY_INLINE` versions, typed like the snapshot `like`; None otherwise (the list is
    inlined). The caller drops it."""
    if only is None or len(only) <= ONLY_INLINE:
        return None
    t = d.temp_name("_mm_tmp_only")
    d.create_temp(conn, t, f"SELECT ver FROM {like} WHERE 1 = 0", keys="ver", index=None)
    vers = sorted({str(v) for v in only})
    for i in range(0, len(vers), 5000):
        conn.exec_driver_sql(f"INSERT INTO {t} (ver) VALUES ({d.caps.placeholder})", [(v,) for v in vers[i : i + 5000]])
    return t


def mark(conn: Connection, d: Dialect, snaps: Sequence[str], ver: str, applied: int = HELD, was: int | None = None) -> None:
    """Set `applied` of the snapshot rows of `ver` (in every snapshot of `snaps`; with `was`, only
    those whose `applied` is `was`)."""
    only = "" if was is None else f" AND applied = {int(was)}"
    for snap in snaps:
        conn.exec_driver_sql(f"UPDATE {snap} SET applied = {int(applied)} WHERE ver = {d.caps.placeholder}{only}", (ver,))


def unhold(conn: Connection, d: Dialect, snaps: Sequence[str], ver: str) -> None:
    """The held snapshot rows of `ver` (``applied = 3``) become new (0), to be applied now (a retry,
    a held insert keeping its rank). Only those: a copy of the same change stored later as a
    duplicate (``applied = 1``: `_mm_origins` had passed it) stays as it is. Its mask is in the
    layout of the day it came (a follow remaps only rows not applied); made new too, it was
    applied instead of the held copy with its bits naming other columns, and an increment was
    lost (session 29, a column added while three sites relay)."""
    unhold_many(conn, d, snaps, [ver])


def unhold_many(conn: Connection, d: Dialect, snaps: Sequence[str], vers: Sequence[str]) -> None:
    """:func:`unhold` for each of `vers`, 500 versions a statement."""
    ph = d.caps.placeholder
    for i in range(0, len(vers), 500):
        part = tuple(vers[i : i + 500])
        for snap in snaps:
            conn.exec_driver_sql(
                f"UPDATE {snap} SET applied = 0 WHERE ver IN ({', '.join([ph] * len(part))}) AND applied = {HELD}", part
            )


def peer_of(conn: Connection, d: Dialect, snaps: dict[str, str], ver: str) -> str:
    """The first peer (in `snaps`' order) whose snapshot holds `ver`."""
    for peer, snap in snaps.items():
        if conn.exec_driver_sql(f"SELECT 1 FROM {snap} WHERE ver = {d.caps.placeholder}", (ver,)).first() is not None:
            return peer
    return next(iter(snaps))


def hold_behind(conn: Connection, d: Dialect, info: TableInfo, snaps: dict[str, str], cand: str) -> int:
    """The candidates in `cand` whose row has an earlier change held in the error queue wait behind it:
    queued as ``waiting`` (blocked_by the row's earliest held change), their snapshot rows
    ``applied = 3``, removed from `cand`. Returns how many (0, reading one row, when the table has
    nothing held)."""
    if not store.errorqueue.any_open(conn, d, info.name):
        return 0
    behind = conn.exec_driver_sql(
        f"SELECT c.ver, c.origin, c.rid, c.op FROM {cand} c JOIN ({store.errorqueue.open_rids(d, info.name)}) e "
        "ON e.rid = c.rid WHERE c.ver >= e.first ORDER BY c.ver"
    ).all()
    at = now_iso()
    held_vers = store.errorqueue.open_versions(conn, d, info.name, [str(r[0]) for r in behind])
    for ver, origin, rid, op in behind:
        if ver in held_vers:  # this very change, held already (it came over another route too)
            mark(conn, d, list(snaps.values()), ver)
            conn.exec_driver_sql(f"DELETE FROM {cand} WHERE ver = {d.caps.placeholder}", (ver,))
            continue
        first = store.errorqueue.blocker(conn, d, info.name, rid)
        h = Held(info.name, peer_of(conn, d, snaps, ver), ver, origin, rid, op)
        store.errorqueue.hold(conn, d, h, "waiting", at, blocked_by=first)
        mark(conn, d, list(snaps.values()), ver)
        conn.exec_driver_sql(f"DELETE FROM {cand} WHERE ver = {d.caps.placeholder}", (ver,))
    return len(behind)


def rank_only(p: Plan) -> None:
    """Make the plan's new identities shadow rows alone: a held insert of a renumbered table keeps
    its rank (so every key agrees with the other sites') while its row is absent."""
    for st in p.rows.values():
        if not st.existed:
            st.values = None


def rank_kept(conn: Connection, d: Dialect, info: TableInfo, rid: str) -> int | None:
    """The key identity `rid` ranks to when a held insert kept its rank here (its shadow row alive,
    its table row absent), None otherwise."""
    return ranks_kept(conn, d, info, [rid]).get(rid)


def ranks_kept(conn: Connection, d: Dialect, info: TableInfo, rids: Sequence[str]) -> dict[str, int]:
    """The keys the identities `rids` rank to where a held insert kept its rank here (its shadow row
    alive, its table row absent): rid -> key, for those that did. 500 a statement."""
    q = d.quote
    ph = d.caps.placeholder
    out: dict[str, int] = {}
    for i in range(0, len(rids), 500):
        part = tuple(dict.fromkeys(rids[i : i + 500]))
        for rid, key in conn.exec_driver_sql(
            f"SELECT s.rid, s.{d.key_col} FROM {d.obj(info.name).shadow} s WHERE s.rid IN ({', '.join([ph] * len(part))}) "
            f"AND s.deleted IS NULL AND NOT EXISTS (SELECT 1 FROM {q(info.name)} t WHERE t.{q(info.key.name)} = s.{d.key_col})",
            part,
        ):
            out[str(rid)] = int(key)
    return out


def tombstone(conn: Connection, d: Dialect, info: TableInfo, rid: str, ver: str) -> None:
    """A held insert that kept its rank is skipped: its identity is deleted here (at its own
    version), so this site holds a tombstone, not a row it never had."""
    ph = d.caps.placeholder
    conn.exec_driver_sql(f"UPDATE {d.obj(info.name).shadow} SET deleted = {ph} WHERE rid = {ph} AND deleted IS NULL", (ver, rid))


def pending(
    conn: Connection, d: Dialect, infos: Sequence[TableInfo], peers: Sequence[str], states: Sequence[int] = (0,)
) -> list[dict[str, Any]]:
    """The changes of `infos` not applied yet: snapshot rows (of every peer, one per version) with
    `applied` in `states` that `_mm_origins` does not count as applied here, table by table, each
    as a mapping (tbl, peer, ver, origin, rid, op, txn: its source transaction, None where its
    origin recorded none)."""
    out: list[dict[str, Any]] = []
    for info in infos:
        seen: set[str] = set()
        for p in peers:
            snap = d.obj(info.name, p).snapshot()
            sql = (
                f"SELECT s.ver, s.origin, s.rid, s.op, s.txn FROM {snap} s WHERE s.applied IN ({', '.join(str(int(x)) for x in states)}) "
                f"AND {store.origins.not_applied(d, info.name, 's')} ORDER BY s.ver"
            )
            for ver, origin, rid, op, t in conn.exec_driver_sql(sql):
                if ver in seen:
                    continue
                seen.add(ver)
                out.append(
                    {
                        "tbl": info.name,
                        "peer": p,
                        "ver": ver,
                        "origin": origin,
                        "rid": rid,
                        "op": op,
                        "txn": None if t is None else str(t),
                    }
                )
    return out


def as_held(c: Mapping[str, Any]) -> Held:
    """The change `c` (as :func:`pending` or the queue's rows describe it) to hold."""
    return Held(str(c["tbl"]), str(c["peer"]), str(c["ver"]), str(c["origin"]), str(c["rid"]), str(c["op"]), c.get("txn"))


def hold_groups(conn: Connection, d: Dialect, infos: Sequence[TableInfo], peers: Sequence[str]) -> list[dict[str, Any]]:
    """Before the changes of `infos` not applied yet are applied: hold those a held change holds back
    (core.errorqueue.plan_holds): a source transaction with a change of a row that has a change held,
    or with a change held itself, is held whole — ``waiting`` behind the row's held change (or
    ``txn``, with its transaction's), its other changes ``txn`` with it —, its snapshot rows
    ``applied = 3``. `infos` in the order their tables are applied. Returns the changes held
    (reading one row, when nothing is held at all)."""
    if not store.errorqueue.any_open(conn, d):
        return []
    cs = pending(conn, d, infos, peers, states=(0, 2))
    if not cs:
        return []
    queued = store.errorqueue.rows(conn, d)
    # a change held already, come over another route too: the same change, it stays held once
    twins = {(str(q["tbl"]), str(q["ver"])) for q in queued}
    for c in cs:
        if (str(c["tbl"]), str(c["ver"])) in twins:
            mark(conn, d, [d.obj(c["tbl"], p).snapshot() for p in peers], c["ver"])
    cs = [c for c in cs if (str(c["tbl"]), str(c["ver"])) not in twins]
    if not cs:
        return []
    plan = plan_holds(cs, queued, [i.name for i in infos])
    at = now_iso()
    ids: dict[int, int] = {}
    for i, state, ref in plan:
        c = cs[i]
        blocked = ref if isinstance(ref, int) else ids[ref[1]]  # type: ignore[index]
        ids[i] = store.errorqueue.hold(conn, d, as_held(c), state, at, blocked_by=blocked)
        mark(conn, d, [d.obj(c["tbl"], p).snapshot() for p in peers], c["ver"])
    return [dict(cs[i], id=ids[i]) for i, _, _ in plan]
