"""The engine's I/O: refresh (pull a peer's change log into a snapshot) and reconcile (apply it).

Decisions are made by :mod:`multimaster.core.planner` on plain data; this module reads the inputs,
executes the plan through the site's dialect, and keeps every batch in one local transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.core.planner import Change, ConflictRecord, Plan, RowState, assign_keys, plan
from multimaster.core.versions import ver_hlc
from multimaster.dialects.schema import TableInfo
from multimaster.engine import fastpath
from multimaster.engine.site import Site
from multimaster.errors import CorruptChange

__all__ = ["ReconcileResult", "RefreshResult", "reconcile_table", "pull_batch", "log_select_columns"]


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

    def add(self, other: "ReconcileResult") -> None:
        for f in ("applied", "duplicates", "parked", "inserted", "updated", "deleted", "renumbered"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.conflicts.extend(other.conflicts)


@dataclass
class RefreshResult:
    site: str
    peer: str
    pulled: int = 0
    batches: int = 0
    seconds: float = 0.0
    reconciled: dict[str, ReconcileResult] = field(default_factory=dict)
    error: str | None = None

    @property
    def applied(self) -> int:
        return sum(r.applied for r in self.reconciled.values())

    @property
    def conflicts(self) -> int:
        return sum(len(r.conflicts) for r in self.reconciled.values())


def log_select_columns(site: Site, info: TableInfo, prefix: str = "") -> list[str]:
    q = site.dialect.quote
    cols = [f"{prefix}ver", f"{prefix}origin", f"{prefix}op", f"{prefix}rid", f"{prefix}key", f"{prefix}mask"]
    cols += [prefix + q("n_" + c) for c in info.column_names]
    cols += [prefix + q("o_" + c) for c in info.column_names]
    return cols


# ---------------------------------------------------------------------------------------------
# pull


def pull_batch(source: Site, target: Site, target_conn: Connection | None, info: TableInfo, watermark: int, limit: int) -> list[tuple[Any, ...]]:
    """Read up to `limit` second-order log entries of `source` past `watermark`, joined with the
    change log rows they reference. Returns rows (seq2, op2, seq, ver, origin, op, rid, key, mask,
    n..., o...). Entries for changes that originated at `target` are kept (to advance the
    watermark) but their change columns are None."""
    o = source.dialect.obj(info.name)
    q = source.dialect.quote
    ph = source.dialect.caps.placeholder
    cols = ", ".join(log_select_columns(source, info, "l."))
    sql = (
        f"SELECT l2.seq2, l2.op, l2.seq, {cols} FROM {o['log2']} l2 "
        f"LEFT JOIN {o['log']} l ON l.seq = l2.seq AND l.origin <> {ph} "
        f"WHERE l2.seq2 > {ph} "
        f"ORDER BY l2.seq2 LIMIT {int(limit)}"
    )
    del q
    with source.read() as sconn:
        return [tuple(r) for r in sconn.exec_driver_sql(sql, (target.name, watermark))]


def store_batch(conn: Connection, site: Site, info: TableInfo, peer: str, rows: list[tuple[Any, ...]],
                applied: bool = False) -> tuple[int, int]:
    """Copy pulled rows into the snapshot of `peer`; apply purge records. Returns (stored, last seq2).

    `applied=True` stores them as applied: the caller reconciles them in the same transaction (see
    reconcile_table's `fresh`), which saves marking every row afterwards."""
    d = site.dialect
    o = d.obj(info.name, peer)
    ncols = len(info.columns)
    width = 6 + 2 * ncols
    appended = []
    purged = []
    adapters = [(i, f) for i, f in enumerate(d.value_adapters(info)) if f is not None]
    conv = [(6 + i, f) for i, f in adapters] + [(6 + ncols + i, f) for i, f in adapters]  # n_ and o_ values
    for r in rows:
        _seq2, op2, seq = r[0], r[1], r[2]
        if op2 == "A":
            if r[3] is None:
                continue  # the change came from this site, or was purged already
            vals = r[3:3 + width]
            if not isinstance(vals[0], str) or len(vals[0]) < 21 or vals[2] not in ("I", "U", "D") or vals[5] is None:
                raise CorruptChange(info.name, peer, seq, f"malformed change (ver={vals[0]!r}, op={vals[2]!r}, mask={vals[5]!r})")
            if conv:  # values as this site's driver stores them exactly (dialects/types.py)
                vals = list(vals)
                for i, f in conv:
                    vals[i] = f(vals[i])
            appended.append((seq, *vals))
        elif op2 == "P":
            purged.append((seq,))
        else:
            raise CorruptChange(info.name, peer, seq, f"unknown second-order log record type {op2!r}")
    if appended:
        cols = ["pseq", "ver", "origin", "op", "rid", "key", "mask"] + [d.quote("n_" + c) for c in info.column_names] + [d.quote("o_" + c) for c in info.column_names]
        d.store_snapshot_rows(conn, o['snap'], cols, appended, applied)
    if purged:
        conn.exec_driver_sql(f"DELETE FROM {o['snap']} WHERE pseq = {d.caps.placeholder} AND applied = 1", purged)
    last = rows[-1][0] if rows else 0
    return len(appended), last


# ---------------------------------------------------------------------------------------------
# reconcile


def _to_change(info: TableInfo, r: tuple[Any, ...], peer: str) -> Change:
    n = len(info.columns)
    ver, origin, op, rid, key, mask = r[0], r[1], r[2], r[3], r[4], r[5]
    if op not in ("I", "U", "D") or not isinstance(ver, str) or mask is None or rid is None:
        raise CorruptChange(info.name, peer, ver, f"malformed change (op={op!r}, mask={mask!r}, rid={rid!r})")
    return Change(ver, origin, op, rid, key, int(mask), tuple(r[6:6 + n]), tuple(r[6 + n:6 + 2 * n]))


def reconcile_table(conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], base_max: int,
                    relay: Sequence[str] | None = None, fresh: dict[str, int] | None = None) -> ReconcileResult:
    """Apply every snapshot row not yet applied (from all `peers`) to the local table.

    Duplicates are recognised by `_mm_origins`: per origin, the highest version applied here (every
    route delivers an origin's changes in version order, and a change that must wait for its row
    holds back the later changes of its origin). Applied changes whose origin is in `relay` (None:
    all) enter the local change log with their own version and origin and a second-order record,
    so the peers of this site pull them.

    Runs inside the caller's write transaction; sets and resets the capture guard itself."""
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    res = ReconcileResult(info.name)
    own = d.obj(info.name)
    snaps = {p: d.obj(info.name, p)["snap"] for p in peers}
    d.lock_for_apply(conn, info)
    # 0. the shadow knows every local row (capture may write it lazily)
    d.catch_up(conn, info)
    # 1. candidates, one per version: rows not applied yet (or pulled in this transaction, `fresh`:
    # peer -> lowest pseq stored), less those already applied here (arrived over another route)
    cand = d.temp_name("_mm_tmp_cand")
    lcols = log_select_columns(site, info)
    counts: dict[str, int] = {}
    selects: dict[str, str] = {}
    for p_, snap in snaps.items():
        conn.exec_driver_sql(f"UPDATE {snap} SET applied = 0 WHERE applied = 2")
        new_rows = f"s.applied = 0 OR s.pseq >= {int(fresh[p_])}" if fresh and p_ in fresh else "s.applied = 0"
        counts[p_] = conn.exec_driver_sql(f"SELECT count(*) FROM {snap} s WHERE {new_rows}").scalar() or 0
        # (table names are checked plain identifiers)
        selects[p_] = (f"SELECT {', '.join('s.' + c for c in lcols)} FROM {snap} s WHERE ({new_rows}) AND "
                       f"{store.origins.not_applied(d, info.name, 's')}")
    sources = [p_ for p_, n in counts.items() if n]
    if not sources:
        return res
    n_rows = sum(counts.values())
    if len(sources) == 1:  # one peer's log holds each version once: no de-duplication needed
        d.create_temp(conn, cand, selects[sources[0]], index=None)
    else:  # the same change may come from several peers: keep one
        d.create_temp(conn, cand, f"SELECT {', '.join(lcols)} FROM {snaps[sources[0]]} WHERE 1 = 0", keys="ver", index=None)
        for p_ in sources:
            conn.exec_driver_sql(d.insert_ignore_into(cand, ", ".join(lcols), selects[p_]))
    for p_ in sources:
        conn.exec_driver_sql(f"UPDATE {snaps[p_]} SET applied = 1 WHERE applied = 0")
    per_origin = {o_: (int(n), top) for o_, n, top in conn.exec_driver_sql(f"SELECT origin, count(*), max(ver) FROM {cand} GROUP BY origin")}
    total = sum(n for n, _ in per_origin.values())
    if not total:
        d.drop_temp(conn, cand)
        return res
    res.duplicates += max(0, n_rows - total)
    max_hlc = ver_hlc(max(top for _, top in per_origin.values()))
    # on error the transaction rolls back, and the capture guard and scratch tables with it
    d.set_applying(conn, True)
    # 3. the plain changes, set-based
    new_keys = None
    rest = f"SELECT {', '.join(lcols)} FROM {cand} ORDER BY ver"
    fr = fastpath.FastResult()
    # set-based apply reads and then writes rows without locking them: only where no other writer
    # of this table can commit meanwhile (Capabilities.set_based_apply); elsewhere the planner's locked path
    if fastpath.enabled() and d.caps.set_based_apply:
        fr = fastpath.apply_fast(conn, site, info, cand, base_max, total)
        res.inserted += fr.inserted
        res.updated += fr.updated
        res.deleted += fr.deleted
        if fr.done:
            rest = f"SELECT {', '.join(lcols)} FROM {cand} c WHERE NOT EXISTS (SELECT 1 FROM {fr.done} x WHERE x.ver = c.ver) ORDER BY ver"
    # 4. the rest: the planner decides, in version order
    ordered = [_to_change(info, tuple(r), "snapshot") for r in conn.exec_driver_sql(rest)] if fr.left else []
    states = _load_states(conn, site, info, {c.rid for c in ordered}, [c.key for c in ordered]) if ordered else {}
    p = plan(info.spec, ordered, states)
    if fr.keyed and p.new_rids:
        new_keys = dict(conn.exec_driver_sql(
            f"SELECT rid, key FROM {fr.keyed} WHERE rid IN ({', '.join([ph] * len(p.new_rids))})", tuple(p.new_rids)).all())
    for name in (fr.keyed, fr.done):
        if name:
            d.drop_temp(conn, name)
    _execute(conn, site, info, p, base_max, res, new_keys)
    if p.parked:
        for snap in snaps.values():
            conn.exec_driver_sql(f"UPDATE {snap} SET applied = 2 WHERE ver = {ph}", [(c.ver,) for c in p.parked])
    if p.parked:
        conn.exec_driver_sql(f"DELETE FROM {cand} WHERE ver = {ph}", [(c.ver,) for c in p.parked])
    # 5. what is applied is known for good: the highest version per origin
    tops = ({o_: top for o_, top in conn.exec_driver_sql(f"SELECT origin, max(ver) FROM {cand} GROUP BY origin")} if p.parked
            else {o_: top for o_, (_, top) in per_origin.items()})
    for origin, top in tops.items():
        store.origins.mark_applied(conn, d, info.name, origin, top)
    # 6. relay: changes some peer of this site needs enter the change log with their own version
    # and origin (each entry is its own second-order record: the second-order log is a view)
    if relay is None or relay:
        inn = "" if relay is None else f" WHERE origin IN ({', '.join([ph] * len(relay))})"
        conn.exec_driver_sql(
            f"INSERT INTO {own['log']} ({', '.join(d.log_write_columns(lcols))}) SELECT {', '.join(lcols)} FROM {cand}{inn} ORDER BY ver",
            tuple(relay or ()))
    d.advance_clock(conn, max_hlc, info.name)
    d.after_apply(conn, info)
    d.set_applying(conn, False)
    d.drop_temp(conn, cand)
    res.applied = total - len(p.parked)
    res.parked = len(p.parked)
    res.conflicts = p.conflicts
    del q
    return res


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
        d.create_temp(conn, kt, f"SELECT key FROM {o['shadow']} WHERE 1 = 0", index="key")
        distinct: dict[Any, Any] = {}
        for k in keys:
            distinct.setdefault(bytes(k) if isinstance(k, (bytes, bytearray, memoryview)) else k, k)
        conn.exec_driver_sql(f"INSERT INTO {kt} (key) VALUES ({d.caps.placeholder})", [(k,) for k in distinct.values()])
        conn.exec_driver_sql(d.insert_ignore_into(tmp, "rid", f"SELECT s.rid FROM {o['shadow']} s JOIN {kt} k ON k.key = s.key"))
        d.drop_temp(conn, kt)
    d.lock_rows(conn, info, tmp)
    slots = [s.name for s in info.spec.slots]
    vcols = "".join(f", s.{q('v_' + s)}" for s in slots)
    ucols = "".join(f", t.{q(c)}" for c in info.column_names)
    # a natural key's table row belongs to its live incarnation only
    live = " AND s.deleted IS NULL" if natural else ""
    sql = (
        f"SELECT s.rid, s.key, s.deleted, t.{q(info.key.name)} IS NOT NULL{vcols}{ucols} FROM {tmp} r "
        f"JOIN {o['shadow']} s ON s.rid = r.rid LEFT JOIN {q(info.name)} t ON t.{q(info.key.name)} = s.key{live}"
    )
    out: dict[str, RowState] = {}
    ns = len(slots)
    for r in conn.exec_driver_sql(sql):
        present = bool(r[3])
        versions = {s: r[4 + i] for i, s in enumerate(slots)}
        values = list(r[4 + ns:]) if present else None
        out[r[0]] = RowState(r[0], r[1], r[2], versions, values)
    conn.exec_driver_sql(f"DELETE FROM {tmp}")
    return out


def _execute(conn: Connection, site: Site, info: TableInfo, p: Plan, base_max: int, res: ReconcileResult,
             new_keys: dict[str, int] | None = None) -> None:
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    o = d.obj(info.name)
    table = q(info.name)
    keyc = q(info.key.name)
    cols = info.column_names
    spec = info.spec
    new = p.new_rids
    # keys of new identities, and shifts of the existing ones
    if new and spec.renumber and new_keys is not None:
        for rid in new:
            p.rows[rid].key = new_keys[rid]
    elif new and spec.renumber:
        max_rid = conn.exec_driver_sql(f"SELECT max(rid) FROM {o['shadow']}").scalar()
        max_key = conn.exec_driver_sql(f"SELECT max(key) FROM {o['shadow']}").scalar()
        max_key = max_key if max_key is not None else base_max
        if max_rid is None or new[0] > max_rid:
            below = [max(0, max_key - base_max)] * len(new)
        else:
            below = []
            for rid in new:
                pk = conn.exec_driver_sql(
                    f"SELECT key FROM {o['shadow']} WHERE rid < {ph} ORDER BY rid DESC LIMIT 1", (rid,)
                ).scalar()
                below.append(max(0, (pk if pk is not None else base_max) - base_max))
        ka = assign_keys(new, below, base_max)
        shifts = [s for s in ka.shifts if s[1] is None or s[1] > s[0]]
        moving = [s for s in shifts if s[0] < max_key]
        if moving:
            offset = max_key + len(new) + 1
            d.shift_keys(conn, info, moving, offset)
            for st in p.rows.values():
                if st.existed:
                    for low, high, delta in moving:
                        if st.key > low and (high is None or st.key <= high):
                            st.key += delta
                            res.renumbered += 1
                            break
        for rid in new:
            p.rows[rid].key = ka.keys[rid]
    # user table: deletes, inserts, updates
    dels = [(st.key,) for st in p.rows.values() if st.existed and st.alive_before and st.values is None]
    if dels:
        conn.exec_driver_sql(f"DELETE FROM {table} WHERE {keyc} = {ph}", dels)
    ins = [(st.key, *st.values) for st in p.rows.values() if st.values is not None and not st.alive_before]
    if ins:
        collist = ", ".join([keyc] + [q(c) for c in cols])
        conn.exec_driver_sql(f"INSERT INTO {table} ({collist}) VALUES ({d.ph(len(cols) + 1)})", ins)
    groups: dict[tuple[int, ...], list[tuple[Any, ...]]] = {}
    for st in p.rows.values():
        if st.alive_before and st.values is not None and st.changed:
            idx = tuple(sorted(st.changed))
            groups.setdefault(idx, []).append((*(st.values[i] for i in idx), st.key))
    for idx, params in groups.items():
        d.bulk_update(conn, table, [q(cols[i]) for i in idx], keyc, params)
    # shadow
    slots = [s.name for s in spec.slots]
    new_rows = [(st.rid, st.key, st.deleted, *(st.versions.get(s) for s in slots)) for st in p.rows.values() if not st.existed]
    if new_rows:
        collist = ", ".join(["rid", "key", "deleted"] + [q("v_" + s) for s in slots])
        conn.exec_driver_sql(f"INSERT INTO {o['shadow']} ({collist}) VALUES ({d.ph(3 + len(slots))})", new_rows)
    sgroups: dict[tuple[bool, tuple[str, ...]], list[tuple[Any, ...]]] = {}
    for st in p.rows.values():
        if st.existed and (st.changed_slots or st.deleted_changed):
            sl = tuple(sorted(st.changed_slots))
            sgroups.setdefault((st.deleted_changed, sl), []).append(
                ((st.deleted,) if st.deleted_changed else ()) + tuple(st.versions[s] for s in sl) + (st.rid,)
            )
    for (delc, sl), params in sgroups.items():
        d.bulk_update(conn, o["shadow"], (["deleted"] if delc else []) + [q("v_" + s) for s in sl], "rid", params)
    # conflicts
    if p.conflicts:
        store.conflicts.record(conn, d, p.conflicts, {rid: st.key for rid, st in p.rows.items()})
    res.inserted += len(ins)
    res.deleted += len(dels)
    res.updated += sum(len(v) for v in groups.values())

