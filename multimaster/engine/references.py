"""Foreign keys between replicated tables, at a site (docs/foreign-keys.md).

A declared foreign key of a replicated table to the key of a renumbered replicated table is a
*reference* (:class:`~multimaster.core.references.Ref`). Capture writes beside the key
``n_<col>`` the referenced row's identity ``f_<col>`` (``fo_<col>`` for the old value), so a
reference travels by identity. This module:

- discovers the references of a table (:func:`discover`; init refuses what cannot work) and
  installs what carries them (:func:`install`: the change log's and snapshots' identity columns,
  the capture that fills them, deferrable constraints);
- resolves them when applying (:func:`resolve`): each identity becomes the referenced row's key
  at this site; a change referencing an identity this site does not hold waits in its snapshot
  (``applied = 2``) with the later changes of its origin, and is tried again at every refresh
  (:func:`waiting_rows`); a self-reference to a row inserted by the same batch is set once that
  row has its key (:func:`fix_self`);
- moves every column referencing a renumbered table's keys when they move, in the same
  transaction, with foreign-key checks deferred (:func:`keys_moved`), and records the move in the
  key history (``_mm_keymoves``);
- orders a link's tables parents first (:func:`refresh_order`).

The decisions are :mod:`multimaster.core.references`; reconcile and apply call this module in a
few lines.
"""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Engine

from multimaster import store
from multimaster.core.planner import ConflictRecord
from multimaster.core.references import REFUSED_ON_UPDATE, Ref, RefChange, fk_order, orphan_action, waiting
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo, names
from multimaster.engine import held
from multimaster.errors import SchemaError, UnresolvedReference

if TYPE_CHECKING:
    from multimaster.config.topology import Topology


class Site(Protocol):
    """What this module uses of an engine.site.Site (which imports this module)."""

    name: str
    dialect: Dialect

    def info(self, conn: Connection, table: str, topo: "Topology") -> TableInfo: ...

    def known_info(self, table: str, conn: Connection | None = None) -> TableInfo | None: ...

    def read(self) -> AbstractContextManager[Connection]: ...

    def require_installed(self, conn: Connection, topo: "Topology") -> None: ...


__all__ = [
    "discover",
    "install",
    "log_columns",
    "resolve",
    "refuse_unresolved",
    "fix_self",
    "insert_keys",
    "orphans_of",
    "deferred",
    "involved",
    "shadow_keys",
    "keys_moved",
    "orphan_marked",
    "waiting_rows",
    "before_deletes",
    "orphans",
    "refresh_order",
    "Referencing",
    "referencing",
]

_CONN_FLAG = "mm_fk_deferred"


def _action(v: Any) -> str:
    return " ".join(str(v).upper().split()) if v else "NO ACTION"


def _is_integer_key(insp: Any, table: str, cols: list[str]) -> bool:
    pk = insp.get_pk_constraint(table).get("constrained_columns") or []
    if pk != cols or len(cols) != 1:
        return False
    for c in insp.get_columns(table):
        if c["name"] == cols[0]:
            return "INT" in str(c["type"]).upper()
    return False


def discover(conn: Connection, site: Site, info: TableInfo, topo: "Topology") -> tuple[tuple[Ref, ...], tuple[Ref, ...]]:
    """The references of replicated table `info` at `site`: its declared single-column foreign keys
    to the key of a renumbered replicated table, and those to the key of a natural-key one
    (TableInfo.natural_refs). Raises SchemaError naming both tables for a foreign
    key to a table that is not replicated but has an auto-counter key (its keys differ per site),
    and for an ON UPDATE action that would not follow a moved key."""
    insp = inspect(conn)
    refs: list[Ref] = []
    natural: list[Ref] = []
    problems: list[str] = []
    for fk in site.dialect.foreign_keys(conn, info.name):
        cols, parent, pcols = fk.get("constrained_columns") or [], fk.get("referred_table"), fk.get("referred_columns") or []
        opts = fk.get("options") or {}
        if not parent or len(cols) != 1 or cols[0] not in info.column_names:
            continue
        if parent not in topo.tables:
            if _is_integer_key(insp, parent, pcols):
                problems.append(
                    f"site '{site.name}': table '{info.name}' (column '{cols[0]}') references table '{parent}', which is not "
                    f"replicated and has an auto-counter key: its keys differ per site. Replicate '{parent}' too (add it "
                    f"under tables) or drop the foreign key"
                )
            continue
        pinfo = info if parent == info.name else site.info(conn, parent, topo)
        if pcols != [pinfo.key.name]:
            continue  # other columns are the same at every site
        ref = Ref(cols[0], parent, _action(opts.get("ondelete")), _action(opts.get("onupdate")), fk.get("name"))
        if not pinfo.spec.renumber:  # natural keys are the same at every site: nothing to resolve
            if orphan_action(ref.on_delete) != "default":  # (the database's default is the site's)
                natural.append(ref)
            continue
        if ref.on_update in REFUSED_ON_UPDATE:
            problems.append(
                f"site '{site.name}': table '{info.name}' (column '{ref.column}') references renumbered table '{parent}' "
                f"ON UPDATE {ref.on_update}: the keys of '{parent}' move, and the reference would not follow; declare it "
                "ON UPDATE CASCADE or NO ACTION"
            )
            continue
        if orphan_action(ref.on_delete) == "default":
            problems.append(
                f"site '{site.name}': table '{info.name}' (column '{ref.column}') references renumbered table '{parent}' "
                f"ON DELETE SET DEFAULT: a default key names a different row of '{parent}' at each site; declare it "
                "ON DELETE SET NULL, CASCADE or NO ACTION"
            )
            continue
        refs.append(ref)
    if problems:
        raise SchemaError(problems)
    return tuple(sorted(refs, key=lambda r: r.column)), tuple(sorted(natural, key=lambda r: r.column))


def log_columns(d: Dialect, info: TableInfo, prefix: str = "") -> list[str]:
    """The identity columns of the change log and snapshots: ``f_<col>``, ``fo_<col>`` per reference."""
    return [prefix + d.quote(p + r.column) for r in info.refs for p in ("f_", "fo_")]


def install(conn: Connection, site: Site, info: TableInfo, peers: Sequence[str]) -> None:
    """At init, for table `info` with references: the identity columns in its change log and
    snapshots (added when missing), the capture filling them, deferrable constraints."""
    d = site.dialect
    if info.refs:
        insp = inspect(conn)
        for tbl in [names(info.name).log] + [names(info.name, p).snapshot() for p in peers]:
            have = {c["name"] for c in insp.get_columns(tbl, schema=d.caps.bookkeeping_schema)}
            for r in info.refs:
                for p in ("f_", "fo_"):
                    if p + r.column not in have:
                        conn.exec_driver_sql(
                            f"ALTER TABLE {d.mm_table(tbl)} ADD COLUMN {d.quote(p + r.column)} {d.reference_type}"
                        )
    if info.spec.renumber:  # every foreign key to its key, of any table: its keys move
        for fk in referencing(conn, d, info.name, info.key.name, fresh=True):
            if fk.name:
                d.make_foreign_key_deferrable(conn, fk.table, fk.name)
    d.install_reference_capture(conn, info)


# ---------------------------------------------------------------------------------------------
# applying


def refuse_unresolved(conn: Connection, site: Site, info: TableInfo, cand: str, snaps: dict[str, str]) -> None:
    """Raise UnresolvedReference for the earliest candidate in `cand` that sets a reference
    (an insert, or an update of the column) to a key without the referenced row's identity
    (``n_<col>`` set, ``f_<col>`` NULL). Applied, that key — the row's key at the origin when
    the change was written — would be taken as a key here, where it may name another row, with
    nothing to show for it but `verify`. Raised, the batch runs again in isolating mode
    (engine/isolate.py), which holds the change in the error queue with this error and applies
    the rest; `errors retry` refuses it again the same way."""
    d = site.dialect
    q = d.quote
    first: tuple[str, str, Any, Ref] | None = None
    for r in info.refs:
        n, f = q("n_" + r.column), q("f_" + r.column)
        row = conn.exec_driver_sql(
            f"SELECT ver, origin, {n} FROM {cand} WHERE op <> 'D' AND (mask & {_bit(info, r.column)}) <> 0 "
            f"AND {n} IS NOT NULL AND {f} IS NULL ORDER BY ver LIMIT 1"
        ).first()
        if row is not None and (first is None or str(row[0]) < first[0]):
            first = (str(row[0]), str(row[1]), row[2], r)
    if first is None:
        return
    ver, origin, value, r = first
    op = conn.exec_driver_sql(f"SELECT op FROM {cand} WHERE ver = {d.caps.placeholder}", (ver,)).scalar()
    peer = held.peer_of(conn, d, snaps, ver)
    raise UnresolvedReference(site.name, info.name, r.column, r.parent, peer, ver, origin, str(op), value)


def _parent_shadow(d: Dialect, r: Ref) -> str:
    return d.obj(r.parent).shadow


def _bit(info: TableInfo, col: str) -> int:
    return 1 << info.column_names.index(col)


def resolve(conn: Connection, site: Site, info: TableInfo, cand: str, snaps: dict[str, str], values: bool = True) -> int:
    """Before the candidates of `info` (scratch table `cand`) are applied: refuse one that sets a
    reference without its identity (:func:`refuse_unresolved`; not when only ranks are given,
    `values` False), park those that reference an identity this site does not hold
    (core.references.waiting: with the later changes of their origin, `applied = 2` in the
    snapshots), then turn every carried identity into the referenced row's key here (``n_<col>``
    from ``f_<col>``, ``o_<col>`` from ``fo_<col>``). Returns how many changes were parked."""
    if not info.refs:
        return 0
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    if values:
        refuse_unresolved(conn, site, info, cand, snaps)
    for parent in sorted({r.parent for r in info.refs if r.parent != info.name}):
        pinfo = site.known_info(parent, conn)
        if pinfo is not None:
            # no key of the parent moves until this transaction ends (another link's reconciler
            # would move them in a transaction of its own), and its shadow knows every local row
            d.lock_writers(conn, pinfo)
            d.catch_up(conn, pinfo)  # (SQLite writes a local insert's shadow row lazily)
    unknown = " OR ".join(
        f"({q('f_' + r.column)} IS NOT NULL AND (mask & {_bit(info, r.column)}) <> 0 AND NOT EXISTS "
        f"(SELECT 1 FROM {_parent_shadow(d, r)} s WHERE s.rid = {cand}.{q('f_' + r.column)}))"
        for r in info.refs
    )
    if conn.exec_driver_sql(f"SELECT 1 FROM {cand} WHERE op <> 'D' AND ({unknown}) LIMIT 1").first() is None:
        rows: Sequence[Any] = []  # every reference is to a row held here: nothing waits (the usual case)
    else:
        fcols = [q("f_" + r.column) for r in info.refs]
        rows = conn.exec_driver_sql(f"SELECT ver, origin, rid, op, mask, {', '.join(fcols)} FROM {cand} ORDER BY ver").all()
    changes: list[RefChange] = []
    wanted: dict[str, set[str]] = {}
    bits = [(r.parent, _bit(info, r.column)) for r in info.refs]
    for row in rows:
        ver, origin, rid, op, mask = row[0], row[1], row[2], row[3], int(row[4])
        refs = tuple((p, f) for (p, bit), f in zip(bits, row[5:]) if f is not None and op != "D" and mask & bit)
        for p, f in refs:
            wanted.setdefault(p, set()).add(f)
        changes.append(RefChange(ver, origin, rid, op, refs))
    known: dict[str, set[str]] = {}
    for parent, rids in wanted.items():
        sh = d.obj(parent).shadow
        found: set[str] = set()
        ordered = sorted(rids)
        for i in range(0, len(ordered), 500):
            chunk = ordered[i : i + 500]
            found |= {
                r[0]
                for r in conn.exec_driver_sql(f"SELECT rid FROM {sh} WHERE rid IN ({', '.join([ph] * len(chunk))})", tuple(chunk))
            }
        known[parent] = found
    parked = sorted(waiting(info.name, changes, known))
    held.park(conn, d, list(snaps.values()), cand, parked)
    for r in info.refs:
        sh = _parent_shadow(d, r)
        for val, ident in (("n_", "f_"), ("o_", "fo_")):
            v, f = q(val + r.column), q(ident + r.column)
            conn.exec_driver_sql(
                f"UPDATE {cand} SET {v} = (SELECT s.{d.key_col} FROM {sh} s WHERE s.rid = {cand}.{f}) "
                f"WHERE {f} IS NOT NULL AND EXISTS (SELECT 1 FROM {sh} s WHERE s.rid = {cand}.{f})"
            )
    return len(parked)


def insert_keys(
    conn: Connection, site: Site, info: TableInfo, snap: str, peer: str, ver: str, values: Sequence[Any]
) -> list[Any] | None:
    """The values `values` (``n_<col>`` in `info`'s column order) of the insert `ver` stored in
    `snap` (from `peer`), each reference as the key here of the row its identity names (a retried
    held insert that kept its rank goes in at it, not through the reconciler: engine/isolate.py).
    None when one names an identity this site does not hold (it waits); UnresolvedReference when
    one has a value and no identity. A reference to a deleted row gets its key: :func:`orphans_of`
    then applies the delete."""
    if not info.refs:
        return list(values)
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    fcols = ", ".join(q("f_" + r.column) for r in info.refs)
    row = conn.exec_driver_sql(f"SELECT origin, {fcols} FROM {snap} WHERE ver = {ph}", (ver,)).first()
    if row is None:
        return None
    out = list(values)
    for r, ident in zip(info.refs, row[1:]):
        i = info.column_names.index(r.column)
        if out[i] is None:
            continue
        if ident is None:
            raise UnresolvedReference(site.name, info.name, r.column, r.parent, peer, ver, str(row[0]), "I", out[i])
        key = conn.exec_driver_sql(f"SELECT {d.key_col} FROM {_parent_shadow(d, r)} WHERE rid = {ph}", (ident,)).scalar()
        if key is None:
            return None
        out[i] = key
    return out


def orphans_of(conn: Connection, site: Site, info: TableInfo, snap: str, ver: str, peers: Sequence[str]) -> None:
    """:func:`orphans` for the one change `ver` of `snap` just applied (a retried held insert): a
    row it made reference a deleted row goes, or its reference is set NULL (delete wins)."""
    if not info.refs:
        return
    d = site.dialect
    cand = d.temp_name("_mm_tmp_one")
    cols = ", ".join(["ver", "rid", "op", "mask"] + [d.quote("f_" + r.column) for r in info.refs])
    d.create_temp(conn, cand, f"SELECT {cols} FROM {snap} WHERE 1 = 0", index=None)
    conn.exec_driver_sql(f"INSERT INTO {cand} ({cols}) SELECT {cols} FROM {snap} WHERE ver = {d.caps.placeholder}", (ver,))
    orphans(conn, site, info, cand, peers)
    d.drop_temp(conn, cand)


def fix_self(conn: Connection, site: Site, info: TableInfo, cand: str) -> None:
    """After the candidates of `info` were applied: a self-reference is set from its identity once
    more, for the rows whose value of the column came from a candidate (its slot's version is the
    candidate's): the referenced row may have been inserted by the same batch, or its key moved by
    the batch's new identities."""
    d = site.dialect
    q = d.quote
    sh = d.obj(info.name).shadow
    for r in info.refs:
        if r.parent != info.name:
            continue
        slot = next(s for s in info.spec.slots if info.column_names.index(r.column) in s.columns)
        f = q("f_" + r.column)
        pairs = conn.exec_driver_sql(
            f"SELECT s.{d.key_col}, ps.{d.key_col} FROM {cand} c JOIN {sh} s ON s.rid = c.rid JOIN {sh} ps ON ps.rid = c.{f} "
            f"WHERE c.op <> 'D' AND (c.mask & {_bit(info, r.column)}) <> 0 AND s.deleted IS NULL "
            f"AND coalesce(s.{q('v_' + slot.name)}, s.rid) = c.ver"
        ).all()
        if pairs:
            conn.exec_driver_sql(
                f"UPDATE {q(info.name)} SET {q(r.column)} = {d.caps.placeholder} WHERE {q(info.key.name)} = {d.caps.placeholder}",
                [(pk, k) for k, pk in pairs],
            )


def involved(conn: Connection, d: Dialect, info: TableInfo) -> bool:
    """Whether `info` has references or some table's foreign key references its key."""
    return bool(info.refs) or bool(info.spec.renumber and referencing(conn, d, info.name, info.key.name))


@contextmanager
def deferred(conn: Connection, d: Dialect, needed: bool = True) -> Iterator[bool]:
    """Foreign-key checks deferred for this transaction (SQLite, PostgreSQL) or off for this
    session until the block ends (MariaDB): nested blocks reuse the outermost. Yields whether the
    database still carries out ON UPDATE CASCADE meanwhile. Nothing when not `needed`."""
    if not needed:
        yield False
        return
    if _CONN_FLAG in conn.info:
        yield bool(conn.info[_CONN_FLAG])
        return
    cascades = d.defer_foreign_keys(conn, True)
    conn.info[_CONN_FLAG] = cascades
    try:
        yield cascades
    finally:
        del conn.info[_CONN_FLAG]
        d.defer_foreign_keys(conn, False)


@dataclass(frozen=True)
class Referencing:
    """A declared foreign key of any table of the database (replicated or not) to a table's key."""

    table: str
    column: str
    on_update: str
    on_delete: str = "NO ACTION"
    name: str | None = None  # the constraint's name, when the database gives one


_REFERENCING: "weakref.WeakKeyDictionary[Engine, dict[str, list[Referencing]]]" = weakref.WeakKeyDictionary()


def referencing(conn: Connection, d: Dialect, table: str, key: str, fresh: bool = False) -> list[Referencing]:
    """Every single-column foreign key of the database's tables to `table`.`key` (read once per
    engine, or again when `fresh`: the schema is fixed while replicating)."""
    eng = conn.engine
    by_parent = None if fresh else _REFERENCING.get(eng)
    if by_parent is None:
        insp = inspect(conn)
        by_parent = {}
        for t in insp.get_table_names():
            if t.startswith("_mm_"):
                continue
            for fk in d.foreign_keys(conn, t):
                cols, pcols = fk.get("constrained_columns") or [], fk.get("referred_columns") or []
                if len(cols) == 1 and len(pcols) == 1 and fk.get("referred_table"):
                    by_parent.setdefault(f"{fk['referred_table']}.{pcols[0]}", []).append(
                        Referencing(
                            t,
                            cols[0],
                            _action((fk.get("options") or {}).get("onupdate")),
                            _action((fk.get("options") or {}).get("ondelete")),
                            fk.get("name"),
                        )
                    )
        _REFERENCING[eng] = by_parent
    return by_parent.get(f"{table}.{key}", [])


def keys_moved(conn: Connection, d: Dialect, info: TableInfo, moves: Sequence[tuple[str, int, int]], reason: str) -> None:
    """After the keys of renumbered `info` moved (identity, old key, new key), inside `deferred`:
    move every column referencing them (a database that ran ON UPDATE CASCADE moved those
    already), and record the moves in the key history."""
    if not moves:
        return
    ph = d.caps.placeholder
    refs = referencing(conn, d, info.name, info.key.name)
    cascades = bool(conn.info.get(_CONN_FLAG, False))
    todo = [r for r in refs if not (cascades and r.on_update == "CASCADE")]
    kept = [(r, obj, col) for r in refs for obj, col in _kept_values(conn, d, r)]
    if todo or kept:
        km = d.temp_name("_mm_tmp_kmap")
        d.create_temp(
            conn,
            km,
            f"SELECT {d.key_col} AS old_k, {d.key_col} AS new_k FROM {d.obj(info.name).shadow} WHERE 1 = 0",
            index="old_k",
        )
        conn.exec_driver_sql(f"INSERT INTO {km} (old_k, new_k) VALUES ({ph}, {ph})", [(old, new) for _, old, new in moves])
        news = [new for _, _, new in moves]
        for r in todo:
            _move_column(conn, d, r, km, min(news), max(news))
        for r, obj, col in kept:  # no unique index there: one UPDATE
            conn.exec_driver_sql(
                f"UPDATE {obj} SET {col} = (SELECT m.new_k FROM {km} m WHERE m.old_k = {obj}.{col}) "
                f"WHERE {col} IN (SELECT m2.old_k FROM {km} m2)"
            )
        d.drop_temp(conn, km)
    store.keymoves.record(conn, d, info.name, moves, reason)


def _kept_values(conn: Connection, d: Dialect, r: Referencing) -> list[tuple[str, str]]:
    """Where the bookkeeping keeps values of referencing column `r` apart from its table
    (docs/unique.md): the value a marked row wants (``_mm_unique_<t>.i_<col>``) and a parked row's
    (``_mm_parked_<t>.c_<col>``), as (object, column) written in SQL. They follow a moved key as
    the table's column does, or a marked row would regain, or a parked row return with, the key
    another row has now."""
    out = []
    for name, col in ((f"_mm_unique_{r.table}", "i_" + r.column), (f"_mm_parked_{r.table}", "c_" + r.column)):
        if d.table_kind(conn, name) is None:
            continue
        obj = d.mm_table(d.quote(name))
        if col in d.existing_columns(conn, obj):
            out.append((obj, d.quote(col)))
    return out


def _move_column(conn: Connection, d: Dialect, r: Referencing, km: str, min_new: int, max_new: int) -> None:
    """Move referencing column `r` by the scratch map `km` (old_k -> new_k, new keys between
    `min_new` and `max_new`) in two UPDATEs, through values above every value the column holds and
    every new key: MariaDB and SQLite check a unique index that holds the column (UNIQUE (order_id,
    product_id)) row by row, so one UPDATE moving 1 -> 2 while 2 -> 3 is not made yet collides
    with the row still at 2. The first UPDATE moves the rows out of the way (each to its new key +
    off), the second down by off: each lands on its new key, which no row holds any more."""
    q = d.quote
    t, c = q(r.table), q(r.column)
    held = conn.exec_driver_sql(f"SELECT max({c}) FROM {t}").scalar()
    top = max(int(held if held is not None else 0), max_new)
    off = top - min_new + 1  # every new key + off is above top
    p = d.caps.placeholder
    conn.exec_driver_sql(
        f"UPDATE {t} SET {c} = (SELECT m.new_k FROM {km} m WHERE m.old_k = {t}.{c}) + {p} "
        f"WHERE {c} IN (SELECT m2.old_k FROM {km} m2)",
        (off,),
    )
    conn.exec_driver_sql(f"UPDATE {t} SET {c} = {c} - {p} WHERE {c} > {p}", (off, top))


def shadow_keys(
    conn: Connection, d: Dialect, info: TableInfo, ranges: Sequence[tuple[int, int | None, int]]
) -> list[tuple[str, int, int]]:
    """The moves that key shifts `ranges` (low, high, delta: low < key <= high moves by delta)
    will make, read from the shadow before they are made."""
    ph = d.caps.placeholder
    sh = d.obj(info.name).shadow
    out: list[tuple[str, int, int]] = []
    for low, high, delta in ranges:
        cond = f"{d.key_col} > {ph}" + ("" if high is None else f" AND {d.key_col} <= {ph}")
        params = (low,) if high is None else (low, high)
        out += [
            (rid, int(k), int(k) + delta)
            for rid, k in conn.exec_driver_sql(f"SELECT rid, {d.key_col} FROM {sh} WHERE {cond}", params)
        ]
    return out


# ---------------------------------------------------------------------------------------------
# the orphan rule: a row whose referenced row is deleted (delete wins)


def before_deletes(conn: Connection, site: Site, info: TableInfo, cand: str, peers: Sequence[str]) -> None:
    """Before the candidates of renumbered `info` delete its rows: the rows referencing them, at
    any depth, are set NULL or deleted first (core.references.orphan_action), with the delete's
    version, as every site does whichever arrives first; not left to the database, whose
    referential actions do not touch the shadow or the conflict log (or do not run at all while
    checks are off). A row is deleted when any change of it that reached this site referenced a
    deleted row — also when a later change moved it to another row — so the outcome does not
    depend on the order changes arrive in (`peers`: whose snapshots hold those changes)."""
    d = site.dialect
    if not (info.spec.renumber and referencing(conn, d, info.name, info.key.name)):
        return
    dels = conn.exec_driver_sql(
        f"SELECT s.{d.key_col}, s.rid, c.ver FROM {cand} c JOIN {d.obj(info.name).shadow} s ON s.rid = c.rid "
        f"WHERE c.op = 'D' AND s.deleted IS NULL"
    ).all()
    if dels:
        _cascade(conn, site, info.name, info.key.name, {int(k): v for k, _, v in dels}, {r: v for _, r, v in dels}, peers, set())


def orphans(conn: Connection, site: Site, info: TableInfo, cand: str, peers: Sequence[str]) -> None:
    """After the candidates of `info` were applied: a row one of them made reference a deleted
    identity (its delete reached this site first) is deleted — whatever it references now — or,
    ON DELETE SET NULL, its reference set NULL if it still names it; with the delete's version."""
    d = site.dialect
    q = d.quote
    sh = d.obj(info.name).shadow
    for r in info.refs:
        ps = d.obj(r.parent).shadow
        f = q("f_" + r.column)
        rows = conn.exec_driver_sql(
            f"SELECT DISTINCT ps.{d.key_col}, ps.rid, ps.deleted, s.{d.key_col} FROM {cand} c JOIN {ps} ps ON ps.rid = c.{f} "
            f"JOIN {sh} s ON s.rid = c.rid WHERE c.op <> 'D' AND ps.deleted IS NOT NULL AND s.deleted IS NULL"
        ).all()
        if not rows:
            continue
        dead_keys = {int(pk): v for pk, _, v, _ in rows}
        if orphan_action(r.on_delete) == "null":
            _orphan_rows(conn, site, info.name, r.column, r.on_delete, dead_keys, {}, peers, set())
        else:
            own = {int(k): v for _, _, v, k in rows}  # these rows go, whatever they reference now
            _orphan_rows(conn, site, info.name, r.column, r.on_delete, dead_keys, {}, peers, set(), own)


def _cascade(
    conn: Connection,
    site: Site,
    table: str,
    key: str,
    dead: dict[int, str],
    dead_rids: dict[str, str],
    peers: Sequence[str],
    seen: set[tuple[str, int]],
) -> None:
    """Rows of `table` with keys `dead` (key -> delete version; identities `dead_rids`) are going:
    every row referencing one, in any table, gets its ON DELETE action, depth first."""
    for ref in referencing(conn, site.dialect, table, key):
        _orphan_rows(conn, site, ref.table, ref.column, ref.on_delete, dead, dead_rids, peers, seen)


def _ever_referenced(
    conn: Connection, d: Dialect, table: str, column: str, dead_rids: dict[str, str], peers: Sequence[str]
) -> dict[str, str]:
    """The identities of `table` some change of which, in this site's change log or snapshots,
    referenced (by `column`) an identity of `dead_rids`: identity -> that delete's version."""
    q = d.quote
    ph = d.caps.placeholder
    f = q("f_" + column)
    out: dict[str, str] = {}
    ordered = sorted(dead_rids)
    sources = [d.obj(table).log] + [d.obj(table, p).snapshot() for p in peers]
    for i in range(0, len(ordered), 500):
        chunk = ordered[i : i + 500]
        marks = ", ".join([ph] * len(chunk))
        for src in sources:
            for rid, f_rid in conn.exec_driver_sql(f"SELECT rid, {f} FROM {src} WHERE {f} IN ({marks})", tuple(chunk)):
                v = dead_rids[f_rid]
                out[rid] = min(out.get(rid, v), v)
    return out


def _orphan_rows(
    conn: Connection,
    site: Site,
    table: str,
    column: str,
    on_delete: str,
    dead: dict[int, str],
    dead_rids: dict[str, str],
    peers: Sequence[str],
    seen: set[tuple[str, int]],
    own: dict[int, str] | None = None,
) -> None:
    """The rows of `table` referencing (by `column`) a key of `dead` (parent key -> its delete
    version) — and, when they are deleted, the rows of `own` (their key -> version) and those any
    change of which referenced an identity of `dead_rids` — are set NULL, or deleted (their shadow
    rows marked with the version, a conflict record `orphan` each, their own referencing rows
    first)."""
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    info = site.known_info(table, conn)
    keycol = info.key.name if info is not None else _pk(conn, table)
    if keycol is None:
        return
    action = orphan_action(on_delete)
    cols = [keycol, column] + ([c for c in info.column_names if c != column] if info is not None else [])
    sel = f"SELECT {', '.join(q(c) for c in cols)} FROM {q(table)} WHERE "
    found: dict[Any, tuple[tuple[Any, ...], str]] = {}  # row key -> (row, version)
    ordered = sorted(dead)
    for i in range(0, len(ordered), 500):
        chunk = ordered[i : i + 500]
        for row in conn.exec_driver_sql(sel + f"{q(column)} IN ({', '.join([ph] * len(chunk))})", tuple(chunk)):
            found[row[0]] = (tuple(row), dead[int(row[1])])
    if info is not None:
        d.catch_up(conn, info)
        if action != "null" and info.spec.renumber:
            _found_by_identity(conn, d, info, column, sel, dead_rids, own or {}, peers, found)
    for k in [k for k in found if (table, k) in seen]:
        del found[k]
    _act(conn, site, info, table, keycol, column, cols, action, found, peers, seen)


def orphan_marked(
    conn: Connection, site: Site, info: TableInfo, column: str, on_delete: str, rows: dict[Any, str], peers: Sequence[str]
) -> None:
    """Rows of `info` (key -> a delete's version) whose reference by `column` (ON DELETE `on_delete`:
    CASCADE, RESTRICT, NO ACTION) names a deleted row though their table row does not show it: a
    UNIQUE mark holds NULL there, the value they want being kept apart (docs/unique.md), so
    neither the database's referential action nor the rule finding rows by their value reached
    them. They go as those rows went: delete wins, with the version, rows referencing them first,
    a conflict record `orphan` each."""
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    cols = [info.key.name, column] + [c for c in info.column_names if c != column]
    sel = f"SELECT {', '.join(q(c) for c in cols)} FROM {q(info.name)} WHERE {q(info.key.name)} = {ph}"
    found: dict[Any, tuple[tuple[Any, ...], str]] = {}
    for k, v in rows.items():
        row = conn.exec_driver_sql(sel, (k,)).first()
        if row is not None:
            found[k] = (tuple(row), v)
    d.catch_up(conn, info)
    _act(conn, site, info, info.name, info.key.name, column, cols, orphan_action(on_delete), found, peers, set())


def orphan_parked(
    conn: Connection, site: Site, info: TableInfo, column: str, on_delete: str, rows: dict[Any, tuple[str, list[Any], str]]
) -> None:
    """Parked rows of `info` (key -> (identity, kept values in TableInfo.columns order, a delete's
    version)) whose kept reference by `column` (ON DELETE `on_delete`) names a deleted row: a
    parked row is not in its table, so neither the database's referential action nor the rule
    finding rows by their value reached them (docs/unique.md). SET NULL: the caller set the kept
    value NULL; any other action: deleted, their shadow rows marked with the version (no row
    references them: init refuses a park set on a referenced table). A conflict record `orphan`
    each, with the values kept."""
    if not rows:
        return
    idx = {c.name: i for i, c in enumerate(info.columns)}
    cols = [info.key.name, column] + [c for c in info.column_names if c != column]
    found = {k: ((k, *(img[idx[c]] for c in cols[1:])), ver) for k, (_rid, img, ver) in rows.items()}
    _record_orphans(
        conn, site.dialect, info.name, column, cols, orphan_action(on_delete), found, {k: r[0] for k, r in rows.items()}
    )


def _act(
    conn: Connection,
    site: Site,
    info: TableInfo | None,
    table: str,
    keycol: str,
    column: str,
    cols: list[str],
    action: str,
    found: dict[Any, tuple[tuple[Any, ...], str]],
    peers: Sequence[str],
    seen: set[tuple[str, int]],
) -> None:
    """The orphan action on the rows `found` (key -> (row, version)) of `table`: set NULL, or
    deleted (their own referencing rows first); recorded (_record_orphans)."""
    if not found:
        return
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    by_key: dict[Any, str] = {}
    if info is not None:
        for k in found:
            rid = conn.exec_driver_sql(
                f"SELECT rid FROM {d.obj(table).shadow} WHERE {d.key_col} = {ph} AND deleted IS NULL", (k,)
            ).scalar()
            if rid is not None:
                by_key[k] = rid
    if action == "null":
        conn.exec_driver_sql(f"UPDATE {q(table)} SET {q(column)} = NULL WHERE {q(keycol)} = {ph}", [(k,) for k in found])
    else:
        seen.update((table, k) for k in found)
        gone = {k: v for k, (_, v) in found.items()}
        _cascade(conn, site, table, keycol, gone, {by_key[k]: v for k, v in gone.items() if k in by_key}, peers, seen)
        conn.exec_driver_sql(f"DELETE FROM {q(table)} WHERE {q(keycol)} = {ph}", [(k,) for k in gone])
    if info is not None:
        _record_orphans(conn, d, table, column, cols, action, found, by_key)


def _found_by_identity(
    conn: Connection,
    d: Dialect,
    info: TableInfo,
    column: str,
    sel: str,
    dead_rids: dict[str, str],
    own: dict[int, str],
    peers: Sequence[str],
    found: dict[Any, tuple[tuple[Any, ...], str]],
) -> None:
    """Add to `found` the live rows of `own` (key -> version) and those some change of which
    referenced (by `column`) an identity of `dead_rids`."""
    ph = d.caps.placeholder
    extra = dict(own)
    if dead_rids and any(r.column == column for r in info.refs):
        sh = d.obj(info.name).shadow
        for rid, v in _ever_referenced(conn, d, info.name, column, dead_rids, peers).items():
            k = conn.exec_driver_sql(f"SELECT {d.key_col} FROM {sh} WHERE rid = {ph} AND deleted IS NULL", (rid,)).scalar()
            if k is not None:
                extra[int(k)] = min(extra.get(int(k), v), v)
    for k, v in extra.items():
        if k not in found:
            row = conn.exec_driver_sql(sel + f"{d.quote(info.key.name)} = {ph}", (k,)).first()
            if row is not None:
                found[k] = (tuple(row), v)


def _record_orphans(
    conn: Connection,
    d: Dialect,
    table: str,
    column: str,
    cols: list[str],
    action: str,
    found: dict[Any, tuple[tuple[Any, ...], str]],
    by_key: dict[Any, str],
) -> None:
    """Mark the deleted orphans' shadow rows with their version and log an `orphan` conflict each."""
    ph = d.caps.placeholder
    if action != "null":
        conn.exec_driver_sql(
            f"UPDATE {d.obj(table).shadow} SET deleted = {ph} WHERE rid = {ph}", [(found[k][1], rid) for k, rid in by_key.items()]
        )
    store.conflicts.record(
        conn,
        d,
        [
            ConflictRecord(
                table,
                rid,
                "orphan",
                None,
                (column,),
                None,
                {column: found[k][0][1]},
                found[k][1],
                None,
                "delete-wins",
                "null" if action == "null" else "delete",
                dict(zip(cols[1:], found[k][0][1:])),
                None,
            )
            for k, rid in by_key.items()
        ],
        {rid: k for k, rid in by_key.items()},
    )


def _pk(conn: Connection, table: str) -> str | None:
    pk = inspect(conn).get_pk_constraint(table).get("constrained_columns") or []
    return pk[0] if len(pk) == 1 else None


# ---------------------------------------------------------------------------------------------
# refreshing


def waiting_rows(conn: Connection, d: Dialect, info: TableInfo, peers: Sequence[str]) -> bool:
    """Whether a snapshot of `info` (a table with references) holds changes waiting (`applied = 2`):
    a refresh of any link tries them again, whichever table brought what they wait for."""
    if not info.refs:
        return False
    return any(
        conn.exec_driver_sql(f"SELECT 1 FROM {d.obj(info.name, p).snapshot()} WHERE applied = 2 LIMIT 1").first() is not None
        for p in peers
    )


def refresh_order(site: Site, topo: "Topology") -> list[str]:
    """The replicated tables in the order a link refreshes them at `site`: referenced tables first."""
    with site.read() as conn:
        site.require_installed(conn, topo)
        parents = {tb: [r.parent for r in site.info(conn, tb, topo).refs] for tb in topo.tables}
    return fk_order(list(topo.tables), parents)
