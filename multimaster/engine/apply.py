"""Apply: execute a plan of :mod:`multimaster.core.planner` at a site, with set-based SQL.

The planner has decided everything: which identities are new, which rows are deleted, which
column values change, which conflicts were resolved how. :func:`execute_plan` carries it out in
this order, one function per step: the keys of new identities (and the shifts of existing keys
they cause), the table's deletes, inserts and updates, the shadow's new rows and updates, the
conflict records. Runs inside the reconcile transaction with the capture guard set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy.engine import Connection, RootTransaction

from multimaster import store
from multimaster.core.keys import rank_moves
from multimaster.core.planner import KeyAssignment, Plan, assign_keys, heads_text
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.engine import references
from multimaster.engine.site import Site, after_commit

__all__ = [
    "Applied",
    "execute_plan",
    "keys_locked",
    "keys_unranked",
    "move_keys",
    "normalize_keys",
    "keys_ranked_now",
    "rewind_key_counter",
]

#: per write transaction, per renumbered table: its highest key when the transaction first took the
#: table's writers' lock, before any key moved (keys_locked): what a rollback would bring back
_floors: WeakKeyDictionary[RootTransaction, dict[str, int]] = WeakKeyDictionary()


@dataclass
class Applied:
    """What executing a plan did to the table: rows inserted, updated, deleted; existing keys moved."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    renumbered: int = 0


def execute_plan(
    conn: Connection, site: Site, info: TableInfo, p: Plan, base_max: int, new_keys: dict[str, int] | None = None
) -> Applied:
    """Carry out `p` at `site`. `new_keys`: the keys of the plan's new identities when they are
    known already (the fast path numbered them and no existing key shifts); else they are ranked
    here among the identities the shadow holds."""
    d = site.dialect
    done = Applied()
    # keys of new identities, and shifts of the existing ones
    done.renumbered = _assign_keys(conn, d, info, p, base_max, new_keys)
    # user table: deletes, inserts, updates
    done.deleted = _delete_rows(conn, d, info, p)
    done.inserted = _insert_rows(conn, d, info, p)
    done.updated = _update_rows(conn, d, info, p)
    # shadow
    _insert_shadow_rows(conn, d, info, p)
    _update_shadow_rows(conn, d, info, p)
    # conflicts
    _record_conflicts(conn, d, p)
    return done


def _assign_keys(conn: Connection, d: Dialect, info: TableInfo, p: Plan, base_max: int, new_keys: dict[str, int] | None) -> int:
    """Give every new identity of a renumbered table its key (base + rank in insertion order),
    shifting the existing keys that rank after it. Returns how many planned rows moved."""
    new = p.new_rids
    if not new or not info.spec.renumber:
        return 0
    if new_keys is not None:
        for rid in new:
            p.rows[rid].key = new_keys[rid]
        return 0
    o = d.obj(info.name)
    max_rid = conn.exec_driver_sql(f"SELECT max(rid) FROM {o.shadow}").scalar()
    max_key = conn.exec_driver_sql(f"SELECT max({d.key_col}) FROM {o.shadow}").scalar()
    max_key = max_key if max_key is not None else base_max
    if max_rid is None or new[0] > max_rid:
        below = [max(0, max_key - base_max)] * len(new)
    else:
        below = _ranks_below(conn, d, info, new, base_max)
    ka = assign_keys(new, below, base_max)
    renumbered = _shift_keys(conn, d, info, p, ka, max_key, len(new))
    for rid in new:
        p.rows[rid].key = ka.keys[rid]
    return renumbered


def keys_unranked(conn: Connection, d: Dialect, info: TableInfo, base_max: int) -> bool:
    """Whether renumbered `info` has keys above those known to be ranks: drawn by local inserts
    since the reconciler last ranked them (dialects whose writers capture concurrently)."""
    top = conn.exec_driver_sql(f"SELECT max({d.key_col}) FROM {d.obj(info.name).shadow}").scalar()
    return top is not None and top > max(store.tables.keys_ranked(conn, d, info.name), base_max)


def normalize_keys(conn: Connection, d: Dialect, info: TableInfo, base_max: int, floor: int | None = None) -> int:
    """Under Dialect.lock_writers (no local insert in flight): give the identities inserted here
    since keys were last ranked — the shadow rows with keys above ``keys_ranked`` (or `floor`) —
    the keys floor + 1, floor + 2, ... in identity order, in the table and the shadow
    (core/keys.py rank_moves). Their keys came from the key counter: a rolled-back insert leaves a
    gap, and two concurrent inserts may have drawn key and version in opposite orders. Every older
    identity sorts below them (a local insert draws its version after the reconciler that last
    ranked keys committed, past every version it had), and keeps its key: the shadow's keys up to
    the floor are the truth, not its ranks (a purge left holes in them). `floor`: add-site, the
    peer's. Returns how many rows moved."""
    o = d.obj(info.name)
    ph = d.caps.placeholder
    k0 = max(store.tables.keys_ranked(conn, d, info.name), base_max) if floor is None else floor
    rows = [
        (str(r), int(k))
        for r, k in conn.exec_driver_sql(f"SELECT rid, {d.key_col} FROM {o.shadow} WHERE {d.key_col} > {ph}", (k0,))
    ]
    moves = rank_moves(rows, k0)
    move_keys(conn, d, info, moves, "rank")
    if d.caps.concurrent_capture:
        store.tables.set_keys_ranked(conn, d, info.name, k0 + len(rows))
    return len(moves)


def move_keys(conn: Connection, d: Dialect, info: TableInfo, moves: list[tuple[str, int, int]], reason: str) -> None:
    """Move the rows of renumbered `info` by (identity, key, new key), in the table and the shadow,
    through keys above every key (no unique key collides on the way); referencing columns follow
    and the key history records them (engine/references.py)."""
    if not moves:
        return
    o = d.obj(info.name)
    ph = d.caps.placeholder
    q = d.quote
    key = q(info.key.name)
    top = conn.exec_driver_sql(
        f"SELECT {d.greatest(f'(SELECT coalesce(max({key}), 0) FROM {q(info.name)})', f'(SELECT max({d.key_col}) FROM {o.shadow})')}"
    ).scalar()
    off = int(top or 0) + 1
    d.lock_keys(conn, info, [old for _rid, old, _new in moves])
    with references.deferred(conn, d, references.involved(conn, d, info)):
        for tbl, col in ((q(info.name), key), (o.shadow, d.key_col)):
            conn.exec_driver_sql(
                f"UPDATE {tbl} SET {col} = {ph} WHERE {col} = {ph}", [(new + off, old) for _r, old, new in moves]
            )
            conn.exec_driver_sql(f"UPDATE {tbl} SET {col} = {col} - {ph} WHERE {col} > {ph}", (off, off))
        references.keys_moved(conn, d, info, moves, reason)


def key_top(conn: Connection, d: Dialect, info: TableInfo, base_max: int) -> int:
    """The highest key of renumbered `info`: in the table, in the shadow, or base_max."""
    q = d.quote
    table = f"(SELECT coalesce(max({q(info.key.name)}), 0) FROM {q(info.name)})"
    shadow = f"(SELECT coalesce(max({d.key_col}), 0) FROM {d.obj(info.name).shadow})"
    return max(int(conn.exec_driver_sql(f"SELECT {d.greatest(table, shadow)}").scalar() or 0), base_max)


def keys_locked(conn: Connection, d: Dialect, info: TableInfo, base_max: int) -> None:
    """Right after Dialect.lock_writers, before any key of `info` moves: note the highest key, once
    per transaction (keys_ranked_now keeps the key counter at or past it, for a rollback)."""
    txn = conn.get_transaction()
    if txn is not None:
        _floors.setdefault(txn, {}).setdefault(info.name, key_top(conn, d, info, base_max))


def keys_ranked_now(conn: Connection, d: Dialect, info: TableInfo, base_max: int) -> None:
    """Under Dialect.lock_writers, after keys were given: every key is a rank now; record it and
    set the key counter to the highest key (the next local insert ranks last).

    The counter (a sequence) does not roll back with the transaction: were the transaction to
    roll back (an error, the process killed before COMMIT), the rows would get back the keys they
    had, and the counter must not be below those, or a local insert would draw a key some row
    holds (a duplicate key). So here the counter goes no lower than the highest key the table held
    when this transaction took the writers' lock (keys_locked); when that is above the highest rank
    (keys of rolled-back local inserts left gaps), it moves the rest of the way down once this
    transaction has committed, in one of its own (rewind_key_counter)."""
    top = conn.exec_driver_sql(f"SELECT max({d.key_col}) FROM {d.obj(info.name).shadow}").scalar()
    top = max(int(top or 0), base_max)
    store.tables.set_keys_ranked(conn, d, info.name, top)
    txn = conn.get_transaction()
    floor = _floors.get(txn, {}).get(info.name, top) if txn is not None else top
    d.reset_key_counter(conn, info, max(top, floor))
    if floor > top:
        after_commit(conn, ("rewind_key_counter", info.name), lambda c: rewind_key_counter(c, d, info))


def rewind_key_counter(conn: Connection, d: Dialect, info: TableInfo) -> None:
    """In a transaction of its own, after the one that ranked the keys of `info` committed: under
    the writers' lock (no local insert in flight) set the key counter back to the highest key. This
    transaction moves no key, so whenever it ends (committed, rolled back, its process killed) every
    key is at or below the counter."""
    d.lock_writers(conn, info)
    d.reset_key_counter(conn, info, key_top(conn, d, info, store.tables.base_max(conn, d, info.name)))


def _ranks_below(conn: Connection, d: Dialect, info: TableInfo, new: list[str], base_max: int) -> list[int]:
    """Per new identity, the rank (key - base) of the greatest identity the shadow holds below it."""
    o = d.obj(info.name)
    ph = d.caps.placeholder
    below = []
    for rid in new:
        pk = conn.exec_driver_sql(
            f"SELECT {d.key_col} FROM {o.shadow} WHERE rid < {ph} ORDER BY rid DESC LIMIT 1", (rid,)
        ).scalar()
        below.append(max(0, (pk if pk is not None else base_max) - base_max))
    return below


def _shift_keys(conn: Connection, d: Dialect, info: TableInfo, p: Plan, ka: KeyAssignment, max_key: int, n_new: int) -> int:
    """Move the existing keys that the new identities push up, in the table and the shadow, and in
    the plan's rows. Returns how many planned rows moved."""
    shifts = [s for s in ka.shifts if s[1] is None or s[1] > s[0]]
    moving = [s for s in shifts if s[0] < max_key]
    if not moving:
        return 0
    offset = max_key + n_new + 1
    with references.deferred(conn, d, references.involved(conn, d, info)):  # referencing columns follow
        moved = references.shadow_keys(conn, d, info, moving)
        d.shift_keys(conn, info, moving, offset)
        references.keys_moved(conn, d, info, moved, "shift")
    renumbered = 0
    for st in p.rows.values():
        if st.existed:
            for low, high, delta in moving:
                if st.key > low and (high is None or st.key <= high):
                    st.key += delta
                    renumbered += 1
                    break
    return renumbered


def _delete_rows(conn: Connection, d: Dialect, info: TableInfo, p: Plan) -> int:
    """Delete the table rows of identities the plan deleted. Returns how many."""
    dels = [(st.key,) for st in p.rows.values() if st.existed and st.alive_before and st.values is None]
    if dels:
        conn.exec_driver_sql(f"DELETE FROM {d.quote(info.name)} WHERE {d.quote(info.key.name)} = {d.caps.placeholder}", dels)
    return len(dels)


def _insert_rows(conn: Connection, d: Dialect, info: TableInfo, p: Plan) -> int:
    """Insert the table rows of identities that are alive after the plan and were not before. Returns how many."""
    q = d.quote
    cols = info.column_names
    ins = [(st.key, *st.values) for st in p.rows.values() if st.values is not None and not st.alive_before]
    if ins:
        collist = ", ".join([q(info.key.name)] + [q(c) for c in cols])
        conn.exec_driver_sql(f"INSERT INTO {q(info.name)} ({collist}) VALUES ({d.ph(len(cols) + 1)})", ins)
    return len(ins)


def _update_rows(conn: Connection, d: Dialect, info: TableInfo, p: Plan) -> int:
    """Update the changed columns of rows alive before and after, one statement per set of changed
    columns. Returns how many rows."""
    q = d.quote
    cols = info.column_names
    groups: dict[tuple[int, ...], list[tuple[Any, ...]]] = {}
    for st in p.rows.values():
        if st.alive_before and st.values is not None and st.changed:
            idx = tuple(sorted(st.changed))
            groups.setdefault(idx, []).append((*(st.values[i] for i in idx), st.key))
    for idx, params in groups.items():
        d.bulk_update(conn, q(info.name), [q(cols[i]) for i in idx], q(info.key.name), params)
    return sum(len(v) for v in groups.values())


def _insert_shadow_rows(conn: Connection, d: Dialect, info: TableInfo, p: Plan) -> None:
    """Add a shadow row for every identity new to this site (live or deleted), with the other
    heads of its slots whose policy chooses among heads (two inserts of one natural key)."""
    q = d.quote
    slots = [s.name for s in info.spec.slots]
    picks = [s.name for s in info.spec.slots if s.policy.chooses]
    new_rows = [
        (
            st.rid,
            st.key,
            st.deleted,
            *(st.versions.get(s) for s in slots),
            *(x for s in picks for x in heads_text(st.heads.get(s))),
        )
        for st in p.rows.values()
        if not st.existed
    ]
    if new_rows:
        cols = ["rid", d.key_col, "deleted"] + [q("v_" + s) for s in slots] + [q(p_ + s) for s in picks for p_ in ("h_", "x_")]
        conn.exec_driver_sql(f"INSERT INTO {d.obj(info.name).shadow} ({', '.join(cols)}) VALUES ({d.ph(len(cols))})", new_rows)


def _update_shadow_rows(conn: Connection, d: Dialect, info: TableInfo, p: Plan) -> None:
    """Write the new slot versions, other heads (docs/conflicts.md "Concurrent heads") and delete
    versions of known identities to the shadow, one statement per set of changed fields."""
    q = d.quote
    sgroups: dict[tuple[bool, tuple[str, ...], tuple[str, ...]], list[tuple[Any, ...]]] = {}
    for st in p.rows.values():
        if st.existed and (st.changed_slots or st.deleted_changed or st.heads_changed):
            sl = tuple(sorted(st.changed_slots))
            hl = tuple(sorted(st.heads_changed))
            sgroups.setdefault((st.deleted_changed, sl, hl), []).append(
                ((st.deleted,) if st.deleted_changed else ())
                + tuple(st.versions[s] for s in sl)
                + tuple(x for s in hl for x in heads_text(st.heads.get(s)))
                + (st.rid,)
            )
    for (delc, sl, hl), params in sgroups.items():
        cols = (["deleted"] if delc else []) + [q("v_" + s) for s in sl] + [q(p_ + s) for s in hl for p_ in ("h_", "x_")]
        d.bulk_update(conn, d.obj(info.name).shadow, cols, "rid", params)


def _record_conflicts(conn: Connection, d: Dialect, p: Plan) -> None:
    """Write the plan's conflicts to the conflict log, each with the key its row has now."""
    store.conflicts.record(conn, d, p.conflicts, {rid: st.key for rid, st in p.rows.items()})
