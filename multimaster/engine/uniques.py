"""Secondary UNIQUE constraints at apply time (docs/unique.md): the rule of
:mod:`multimaster.core.unique` carried out in the reconcile transaction.

Three calls from the reconciler:

- :func:`before_apply`, on the candidate changes before the fast path: a set-based check per
  UNIQUE set finds the changes whose new values collide with a row of the table or with another
  candidate (none, usually: then nothing else happens). For each colliding change the rows that
  hold the value are *vacated* (their mark column gets their mark value, their intended value is
  remembered in ``_mm_unique_<t>``), and the change itself writes its mark value instead of the
  value (an insert, an update of the mark column) or has its row vacated too (an update of other
  columns of the set). Nothing collides during the apply any more.
- :func:`after_apply`, after the plan is executed: the candidates get their values back (they are
  relayed as they came), then :func:`settle`.
- :func:`settle`: every row with a remembered value, and every row claiming the same values of any
  set (transitively), is decided again by the rule; marks and regains are written (marks first,
  so a regained value is free), ``_mm_unique_<t>`` keeps the intended values of the marked rows,
  and every row newly marked or regaining its value is in the conflict log (kind ``unique``).

A remembered value stays valid while the version of its column's slot in the shadow is the one
it was remembered with: a later change of the column (replicated, or written by an application
here) is a normal change and ends the mark. Everything runs with the capture guard set: marks and
regains are never captured; every site computes them for itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.core.planner import ConflictRecord, Plan
from multimaster.core.references import Ref, orphan_action
from multimaster.core.unique import PARK, Claimant, Resolution, UniqueSet, group_key, mark_value, resolve
from multimaster.core.versions import BASE_VER
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.engine import references
from multimaster.engine.site import Site
from multimaster.errors import NotInstalled

__all__ = [
    "Pending",
    "install",
    "uninstall",
    "read_marks",
    "write_marks",
    "table_name",
    "parked_table",
    "before_apply",
    "after_apply",
    "room_for_insert",
    "after_insert",
    "settle",
    "unsettled",
    "no_fast",
    "parked_states",
    "plan_parked",
    "parked_change",
    "skip_parked",
]


def table_name(d: Dialect, table: str) -> str:
    """``_mm_unique_<t>``: the intended values of the marked rows of `table`, as written in SQL."""
    return d.mm_table(d.quote(f"_mm_unique_{table}"))


def parked_table(d: Dialect, table: str) -> str:
    """``_mm_parked_<t>``: the rows of `table` parked by a ``park`` set, as written in SQL."""
    return d.mm_table(d.quote(f"_mm_parked_{table}"))


def _marks(info: TableInfo) -> list[int]:
    """The mark columns of the marking (not ``park``) sets."""
    return sorted({u.mark for u in info.uniques if u.policy != PARK})


def _parks(info: TableInfo) -> bool:
    return any(u.policy == PARK for u in info.uniques)


def install(conn: Connection, d: Dialect, info: TableInfo) -> None:
    """Create ``_mm_unique_<t>`` when `info` has UNIQUE sets (and add the columns of mark columns
    a later UNIQUE set brought). One row per marked row and mark column: `rid`, `col` (the mark
    column), `ver` (the version of its slot when its value was remembered) and the value in
    ``i_<col>``, of the column's own type. Few rows: no index."""
    if not info.uniques:
        return
    q = d.quote
    if _parks(info):
        cols = "".join(f", {q('c_' + c.name)} {c.type_sql}" for c in info.columns)
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {parked_table(d, info.name)} (rid TEXT NOT NULL, sname TEXT NOT NULL, holder TEXT NOT NULL{cols})"
        )
    t = table_name(d, info.name)
    marks = [info.columns[i] for i in _marks(info)]
    cols = "".join(f", {q('i_' + c.name)} {c.type_sql}" for c in marks)
    conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {t} (rid TEXT NOT NULL, col TEXT NOT NULL, ver TEXT NOT NULL{cols})")
    from sqlalchemy import inspect

    have = {c["name"] for c in inspect(conn).get_columns(f"_mm_unique_{info.name}", schema=d.caps.bookkeeping_schema)}
    for c in marks:
        if "i_" + c.name not in have:
            conn.exec_driver_sql(f"ALTER TABLE {t} ADD COLUMN {q('i_' + c.name)} {c.type_sql}")


def uninstall(conn: Connection, d: Dialect, table: str) -> list[str]:
    """Drop ``_mm_unique_<t>`` and ``_mm_parked_<t>`` of `table` where they exist (multimaster
    uninstall --table); returns what was dropped ("table name")."""
    dropped = []
    for name, sql in ((f"_mm_unique_{table}", table_name(d, table)), (f"_mm_parked_{table}", parked_table(d, table))):
        if d.table_kind(conn, name) is not None:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {sql}")
            dropped.append(f"table {name}")
    _installed.difference_update({seen for seen in _installed if seen[1] == table})
    return dropped


def read_marks(src: Connection, sd: Dialect, info: TableInfo) -> list[tuple[str, list[str], list[tuple[Any, ...]]]]:
    """add-site, at the peer: its ``_mm_parked_<t>`` (``parked``) and ``_mm_unique_<t>``
    (``marks``) as (which, columns, rows), for :func:`write_marks` at the new site (the shadow,
    copied with them, holds the same slot versions, so the remembered values stay valid)."""
    if not info.uniques:
        return []
    out: list[tuple[str, list[str], list[tuple[Any, ...]]]] = []
    if _parks(info):
        pn = ["rid", "sname", "holder"] + ["c_" + c.name for c in info.columns]
        rows = src.exec_driver_sql(f"SELECT {', '.join(sd.quote(c) for c in pn)} FROM {parked_table(sd, info.name)}").all()
        out.append(("parked", pn, [tuple(r) for r in rows]))
    names = ["rid", "col", "ver"] + ["i_" + info.columns[i].name for i in _marks(info)]
    rows = src.exec_driver_sql(f"SELECT {', '.join(sd.quote(c) for c in names)} FROM {table_name(sd, info.name)}").all()
    out.append(("marks", names, [tuple(r) for r in rows]))
    return out


def write_marks(dst: Connection, dd: Dialect, info: TableInfo, which: str, columns: Sequence[str], rows: list[Any]) -> None:
    """add-site, at the new site: rows :func:`read_marks` read at the peer (`which`: ``parked``
    or ``marks``)."""
    if not rows:
        return
    t = parked_table(dd, info.name) if which == "parked" else table_name(dd, info.name)
    dst.exec_driver_sql(f"INSERT INTO {t} ({', '.join(dd.quote(c) for c in columns)}) VALUES ({dd.ph(len(columns))})", rows)


_installed: set[tuple[str, str]] = set()  # (database URL, table) whose _mm_unique_<t> was seen


def _require(conn: Connection, site: Site, info: TableInfo) -> None:
    """Refuse a site installed before `info` had UNIQUE sets (``_mm_unique_<t>`` missing), naming
    the fix, instead of failing on the missing table inside the apply."""
    seen = (str(conn.engine.url), info.name)
    if seen in _installed:
        return
    for obj in [f"_mm_unique_{info.name}"] + ([f"_mm_parked_{info.name}"] if _parks(info) else []):
        if site.dialect.table_kind(conn, obj) is None:
            raise NotInstalled(site.name, f"table {obj} (table '{info.name}' has UNIQUE constraints it was installed without)")
    _installed.add(seen)


@dataclass
class Pending:
    """What before_apply did: the candidates' values it replaced (ver, rid, column, value) and the
    rows marked before this reconcile (rid -> columns)."""

    rewritten: list[tuple[str, str, int, Any]] = field(default_factory=list)
    was_marked: dict[str, set[int]] = field(default_factory=dict)
    #: the rows parked before this reconcile
    was_parked: set[str] = field(default_factory=set)
    #: new identities inserted by a candidate colliding on a park set: shadow row only, for now
    park_inserts: set[str] = field(default_factory=set)
    #: the batch goes through the planner whole (a candidate touches a parked row)
    whole: bool = False


# ---- reading ---------------------------------------------------------------------------------


def _default_ver(info: TableInfo, rid: str) -> str:
    return rid if info.spec.renumber else BASE_VER


def _slot_col(info: TableInfo, i: int) -> str:
    return "v_" + info.spec.slots[info.spec.slot_of[i]].name


def _set_cols(info: TableInfo) -> list[int]:
    return sorted({i for u in info.uniques for i in u.columns})


def _join(d: Dialect, info: TableInfo) -> str:
    """The table's row of a shadow row `s` (a natural key's row belongs to its live incarnation)."""
    live = " AND s.deleted IS NULL" if not info.spec.renumber else ""
    return f"{d.quote(info.name)} t ON t.{d.quote(info.key.name)} = s.{d.key_col}{live}"


def _stored(conn: Connection, d: Dialect, info: TableInfo) -> dict[str, dict[int, tuple[str, Any]]]:
    """``_mm_unique_<t>``: rid -> mark column -> (version, intended value)."""
    q = d.quote
    marks = _marks(info)
    if not marks:
        return {}
    index = {info.columns[i].name: i for i in marks}
    sql = f"SELECT rid, col, ver, {', '.join(q('i_' + info.columns[i].name) for i in marks)} FROM {table_name(d, info.name)}"
    out: dict[str, dict[int, tuple[str, Any]]] = {}
    for r in conn.exec_driver_sql(sql):
        i = index.get(r[1])
        if i is not None:
            out.setdefault(r[0], {})[i] = (r[2], r[3 + marks.index(i)])
    return out


def _images(conn: Connection, d: Dialect, info: TableInfo) -> dict[str, list[Any]]:
    """``_mm_parked_<t>``: rid -> the parked row's values (TableInfo.columns order)."""
    if not _parks(info):
        return {}
    cols = ", ".join(d.quote("c_" + c.name) for c in info.columns)
    return {r[0]: list(r[1:]) for r in conn.exec_driver_sql(f"SELECT rid, {cols} FROM {parked_table(d, info.name)}")}


def _put_image(conn: Connection, d: Dialect, info: TableInfo, rid: str, values: Sequence[Any], sname: str, holder: str) -> None:
    q = d.quote
    t = parked_table(d, info.name)
    conn.exec_driver_sql(f"DELETE FROM {t} WHERE rid = {d.caps.placeholder}", (rid,))
    names = ["rid", "sname", "holder"] + ["c_" + c.name for c in info.columns]
    conn.exec_driver_sql(
        f"INSERT INTO {t} ({', '.join(q(n) for n in names)}) VALUES ({d.ph(len(names))})", (rid, sname, holder, *values)
    )


def _park_keys(conn: Connection, d: Dialect, info: TableInfo, keys: Iterable[Any]) -> set[str]:
    """Take the live rows of `keys` out of the table, their values kept in ``_mm_parked_<t>``
    (parked until :func:`_settle` decides them). Returns their rids."""
    q = d.quote
    ph = d.caps.placeholder
    live = " AND s.deleted IS NULL" if not info.spec.renumber else ""
    cols = ", ".join(f"t.{q(c.name)}" for c in info.columns)
    out: set[str] = set()
    for k in keys:
        r = conn.exec_driver_sql(
            f"SELECT s.rid, {cols} FROM {d.obj(info.name).shadow} s JOIN {_join(d, info)} WHERE s.{d.key_col} = {ph}{live}", (k,)
        ).first()
        if r is None:
            continue
        _put_image(conn, d, info, r[0], list(r[1:]), "", "")
        conn.exec_driver_sql(f"DELETE FROM {q(info.name)} WHERE {q(info.key.name)} = {ph}", (k,))
        out.add(r[0])
    return out


@dataclass
class _Row:
    rid: str
    key: Any
    live: bool
    actual: dict[int, Any]  # the table's values of every column of a set (a parked row's: kept apart)
    versions: dict[int, str]  # per column of a set, the version of its slot
    image: list[Any] | None = None  # a parked row's values (TableInfo.columns order)


def _load(
    conn: Connection, d: Dialect, info: TableInfo, rids: Sequence[str], images: dict[str, list[Any]] | None = None
) -> dict[str, _Row]:
    """The shadow and table rows of `rids` (a parked row, in `images`, is live with its kept values)."""
    images = images or {}
    q = d.quote
    cols = _set_cols(info)
    ph = d.caps.placeholder
    slots = sorted({_slot_col(info, i) for i in cols})
    out: dict[str, _Row] = {}
    for k in range(0, len(rids), 500):
        chunk = list(rids[k : k + 500])
        sql = (
            f"SELECT s.rid, s.{d.key_col}, s.deleted, t.{q(info.key.name)} IS NOT NULL"
            + "".join(f", s.{q(v)}" for v in slots)
            + "".join(f", t.{q(info.columns[i].name)}" for i in cols)
            + f" FROM {d.obj(info.name).shadow} s LEFT JOIN {_join(d, info)} WHERE s.rid IN ({', '.join([ph] * len(chunk))})"
        )
        for r in conn.exec_driver_sql(sql, tuple(chunk)):
            sv = dict(zip(slots, r[4 : 4 + len(slots)]))
            vals = r[4 + len(slots) :]
            img = images.get(r[0]) if not r[3] else None
            live = (bool(r[3]) or img is not None) and r[2] is None
            out[r[0]] = _Row(
                r[0],
                r[1],
                live,
                {i: (img[i] if img is not None else vals[j]) for j, i in enumerate(cols)},
                {i: sv[_slot_col(info, i)] or _default_ver(info, r[0]) for i in cols},
                img,
            )
    return out


def _lock(conn: Connection, d: Dialect, info: TableInfo, rids: Iterable[str]) -> None:
    """Lock the table and shadow rows of `rids` (an application's concurrent write waits)."""
    rids = list(rids)
    if not rids:
        return
    tmp = d.temp_rids(conn)
    conn.exec_driver_sql(f"INSERT INTO {tmp} (rid) VALUES ({d.caps.placeholder})", [(r,) for r in rids])
    d.lock_rows(conn, info, tmp)
    conn.exec_driver_sql(f"DELETE FROM {tmp}")


def _holders(conn: Connection, d: Dialect, info: TableInfo, u: UniqueSet, groups: Iterable[tuple[Any, ...]]) -> set[str]:
    """The rids of the rows whose values of set `u` are one of `groups`."""
    q = d.quote
    ph = d.caps.placeholder
    where = " AND ".join(f"t.{q(info.columns[i].name)} = {ph}" for i in u.columns)
    sql = f"SELECT s.rid FROM {d.obj(info.name).shadow} s JOIN {_join(d, info)} WHERE {where}"
    out: set[str] = set()
    for g in groups:
        out.update(r[0] for r in conn.exec_driver_sql(sql, tuple(g)))
    return out


# ---- before the apply --------------------------------------------------------------------------


def before_apply(conn: Connection, site: Site, info: TableInfo, cand: str) -> Pending | None:
    """Make room for the candidates of `cand` that collide (module docstring). None when `info`
    has no UNIQUE set."""
    if not info.uniques:
        return None
    _require(conn, site, info)
    d = site.dialect
    pend = Pending(was_marked={rid: set(m) for rid, m in _stored(conn, d, info).items()}, was_parked=set(_images(conn, d, info)))
    for u in info.uniques:
        _make_room(conn, d, info, cand, u, pend)
    if _parks(info):
        parked = _images(conn, d, info)
        if pend.park_inserts or any(
            conn.exec_driver_sql(f"SELECT 1 FROM {cand} WHERE rid = {d.caps.placeholder} LIMIT 1", (rid,)).first()
            for rid in parked
        ):
            pend.whole = True
    return pend


def room_for_insert(
    conn: Connection, site: Site, info: TableInfo, rid: str, row: Sequence[Any]
) -> tuple[list[Any] | None, Pending | None]:
    """:func:`before_apply` for one insert that does not go through the reconciler: a held insert
    of a renumbered table retried at the rank it kept (engine/isolate.py ``_insert_at_rank``), in
    the reconcile transaction with the capture guard set. `row`: its values (TableInfo.columns
    order). For each UNIQUE set whose values a row of the table holds: a ``park`` set takes those
    rows out of the table and keeps the insert's values apart (None is returned: no table row to
    write, the shadow row it kept is its identity); a marking set vacates them and the insert writes
    its mark value. Returns the values to insert and what :func:`after_insert` needs (None: the
    table has no UNIQUE set). Before session 37 the retry inserted the raw values: the database
    refused the duplicate and the change stayed held for good, while every other site had marked
    the row (docs/unique.md "At apply time")."""
    if not info.uniques:
        return list(row), None
    _require(conn, site, info)
    d = site.dialect
    pend = Pending(was_marked={r: set(m) for r, m in _stored(conn, d, info).items()}, was_parked=set(_images(conn, d, info)))
    vals = list(row)

    def holding(u: UniqueSet) -> set[Any]:
        g = tuple(row[i] for i in u.columns)
        if any(v is None for v in g):
            return set()  # NULLs collide with nothing
        rids = _holders(conn, d, info, u, [g]) - {rid}
        return {r.key for r in _load(conn, d, info, sorted(rids)).values() if r.live}

    parks = {k for u in info.uniques if u.policy == PARK for k in holding(u)}
    if parks:
        _park_keys(conn, d, info, parks)
        _put_image(conn, d, info, rid, vals, "", "")  # _settle decides who goes back
        return None, pend
    versions = _load(conn, d, info, [rid])[rid].versions  # its shadow row, kept with its rank
    for u in (x for x in info.uniques if x.policy != PARK):
        keys = holding(u)
        if not keys:
            continue
        _vacate(conn, d, info, u, keys, pend)
        m = u.mark
        if vals[m] is not None and not any(x[1] == rid and x[2] == m for x in pend.rewritten):
            pend.rewritten.append((versions[m], rid, m, vals[m]))
            vals[m] = mark_value(u, vals[m], rid)
    return vals, pend


def after_insert(
    conn: Connection, site: Site, info: TableInfo, pend: Pending | None, peers: Sequence[str] = ()
) -> list[ConflictRecord]:
    """After the insert :func:`room_for_insert` made room for: the rule decides the rows it
    vacated, the inserted row and every claimant of their values (the same :func:`settle` a
    reconcile ends with). Returns the conflict records written."""
    if pend is None:
        return []
    return _settle(conn, site, info, pend, write=True, peers=peers)[0]


def parked_change(conn: Connection, d: Dialect, info: TableInfo, rid: str) -> dict[str, Any] | None:
    """What `errors` shows of parked row `rid`: its key, its kept values, the set it lost and
    the row holding that set's values (rid and key); None when it is not parked."""
    ph = d.caps.placeholder
    r = conn.exec_driver_sql(
        f"SELECT p.sname, p.holder, s.{d.key_col}, h.{d.key_col} FROM {parked_table(d, info.name)} p "
        f"JOIN {d.obj(info.name).shadow} s ON s.rid = p.rid LEFT JOIN {d.obj(info.name).shadow} h ON h.rid = p.holder "
        f"WHERE p.rid = {ph}",
        (rid,),
    ).first()
    img = _images(conn, d, info).get(rid)
    if r is None or img is None:
        return None
    return {
        "key": r[2],
        "values": {c.name: v for c, v in zip(info.columns, img)},
        "unique": r[0],
        "holder": r[1],
        "holder_key": r[3],
    }


def skip_parked(conn: Connection, site: Site, info: TableInfo, rid: str) -> None:
    """`errors skip` of parked row `rid` (docs/unique.md): the row is deleted for good, at every
    site: a local delete of its identity, captured (a fresh version, replicated as any delete),
    so every site ends with a tombstone. In the caller's write transaction: with the capture guard
    set, the rows holding its values step out and it steps in; the guard off, it is deleted (the
    capture trigger writes the delete); the guard set again, the holders step back; its kept
    values go."""
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    images = _images(conn, d, info)
    if rid not in images:
        return
    img = images[rid]
    key = conn.exec_driver_sql(
        f"SELECT {d.key_col} FROM {d.obj(info.name).shadow} WHERE rid = {ph} AND deleted IS NULL", (rid,)
    ).scalar()
    names = [q(info.key.name)] + [q(c.name) for c in info.columns]
    sel = ", ".join(names)
    d.lock_for_apply(conn, info)
    d.set_applying(conn, True)
    if key is not None:
        holders: list[tuple[Any, ...]] = []
        for u in (x for x in info.uniques if x.policy == PARK):
            where = " AND ".join(f"{q(info.columns[i].name)} = {ph}" for i in u.columns)
            for h in conn.exec_driver_sql(
                f"SELECT {sel} FROM {q(info.name)} WHERE {where}", tuple(img[i] for i in u.columns)
            ).all():
                holders.append(tuple(h))
                conn.exec_driver_sql(f"DELETE FROM {q(info.name)} WHERE {q(info.key.name)} = {ph}", (h[0],))
        ins = f"INSERT INTO {q(info.name)} ({sel}) VALUES ({d.ph(len(names))})"
        conn.exec_driver_sql(ins, (key, *img))
        d.set_applying(conn, False)
        conn.exec_driver_sql(f"DELETE FROM {q(info.name)} WHERE {q(info.key.name)} = {ph}", (key,))
        d.set_applying(conn, True)
        if holders:
            conn.exec_driver_sql(ins, holders)
    conn.exec_driver_sql(f"DELETE FROM {parked_table(d, info.name)} WHERE rid = {ph}", (rid,))
    d.set_applying(conn, False)


def no_fast(pend: Pending | None) -> bool:
    """Whether the batch must go through the planner whole: a candidate touches a parked row
    (its changes go to the kept values, not the table)."""
    return pend is not None and pend.whole


def parked_states(conn: Connection, site: Site, info: TableInfo, states: dict[str, Any]) -> None:
    """The planner's view of a parked row (live in the shadow, absent from the table): the values
    kept for it, so a change of it is decided as of any live row."""
    if not _parks(info):
        return
    images = _images(conn, site.dialect, info)
    for rid, st in states.items():
        if rid in images and st.values is None and st.deleted is None:
            st.values = list(images[rid])
            st.alive_before = True


def plan_parked(conn: Connection, site: Site, info: TableInfo, p: Plan, pend: Pending | None) -> None:
    """Before the plan is executed: the rows parked (and the new rows a park set holds out) get
    the planned values in ``_mm_parked_<t>`` instead of the table."""
    if pend is None or not _parks(info):
        return
    d = site.dialect
    images = _images(conn, d, info)
    for rid, st in p.rows.items():
        if rid in images and st.existed:
            if st.values is not None:
                _put_image(conn, d, info, rid, st.values, "", "")
            st.changed = set()
        elif rid in pend.park_inserts and not st.existed:
            if st.values is not None:
                _put_image(conn, d, info, rid, st.values, "", "")
            st.values = None


def _make_room(conn: Connection, d: Dialect, info: TableInfo, cand: str, u: UniqueSet, pend: Pending) -> None:
    q = d.quote
    t = q(info.name)
    keyc = q(info.key.name)
    shadow = d.obj(info.name).shadow
    smask = sum(1 << i for i in u.columns)
    m = u.mark
    sets_m = f"CASE WHEN c.op = 'I' OR (c.mask & {1 << m}) <> 0 THEN 1 ELSE 0 END"
    vals = ", ".join(
        f"CASE WHEN c.op = 'I' OR (c.mask & {1 << i}) <> 0 THEN c.{q('n_' + info.columns[i].name)} "
        f"ELSE t.{q(info.columns[i].name)} END AS u{k}"
        for k, i in enumerate(u.columns)
    )
    nv = d.temp_name("_mm_tmp_uq")
    d.create_temp(
        conn,
        nv,
        f"SELECT c.ver AS ver, c.rid AS rid, s.{d.key_col} AS lkey, {sets_m} AS setsm, {vals} "
        f"FROM {cand} c LEFT JOIN {shadow} s ON s.rid = c.rid LEFT JOIN {_join(d, info)} "
        f"WHERE c.op = 'I' OR (c.op = 'U' AND (c.mask & {smask}) <> 0)",
        index=None,
    )
    ucols = [f"u{k}" for k in range(len(u.columns))]
    notnull = " AND ".join(f"n.{c} IS NOT NULL" for c in ucols)
    on = " AND ".join(f"x.{q(info.columns[i].name)} = n.u{k}" for k, i in enumerate(u.columns))
    # (MySQL reads a scratch table once per statement: the two checks are two statements)
    hits = conn.exec_driver_sql(
        f"SELECT n.ver, n.rid, n.lkey, n.setsm, x.{keyc} FROM {nv} n JOIN {t} x ON {on} "
        f"WHERE {notnull} AND (n.lkey IS NULL OR x.{keyc} <> n.lkey)"
    ).all()
    dups = conn.exec_driver_sql(
        f"SELECT {', '.join(ucols)} FROM {nv} n WHERE {notnull} GROUP BY {', '.join(ucols)} HAVING count(DISTINCT n.rid) > 1"
    ).all()
    colliding: dict[str, tuple[str, Any, int]] = {r[0]: (r[1], r[2], int(r[3])) for r in hits}
    holder_keys = {r[4] for r in hits}
    if dups:
        dupset = {tuple(r) for r in dups}
        for r in conn.exec_driver_sql(f"SELECT ver, rid, lkey, setsm, {', '.join(ucols)} FROM {nv}"):
            if tuple(r[4:]) in dupset:
                colliding[r[0]] = (r[1], r[2], int(r[3]))
    d.drop_temp(conn, nv)
    if not colliding:
        return
    if u.policy == PARK:
        # the rows holding the values, and the rows of colliding updates, leave the table now;
        # colliding inserts get their shadow row only (plan_parked); _settle decides them all
        keys = holder_keys | {lkey for _rid, lkey, _s in colliding.values() if lkey is not None}
        _park_keys(conn, d, info, keys)
        pend.park_inserts |= {rid for rid, lkey, _s in colliding.values() if lkey is None}
        pend.whole = True
        return
    # rows to vacate: those holding a colliding value, and those of updates not writing the mark column
    holder_keys.update(lkey for rid, lkey, setsm in colliding.values() if not setsm and lkey is not None)
    _vacate(conn, d, info, u, holder_keys, pend)
    ph = d.caps.placeholder
    mcol = q("n_" + info.columns[m].name)
    vers = [v for v, (_, _, setsm) in colliding.items() if setsm]
    new: list[tuple[str, Any]] = []
    for k in range(0, len(vers), 500):
        chunk = vers[k : k + 500]
        for ver, rid, val in conn.exec_driver_sql(
            f"SELECT ver, rid, {mcol} FROM {cand} WHERE ver IN ({', '.join([ph] * len(chunk))})", tuple(chunk)
        ).all():
            pend.rewritten.append((ver, rid, m, val))
            new.append((ver, mark_value(u, val, rid)))
    _set_candidates(conn, d, cand, mcol, new)


def _set_candidates(conn: Connection, d: Dialect, cand: str, col: str, values: list[tuple[str, Any]]) -> None:
    """Set `col` of the candidates named by version in `values` ((ver, value) pairs), in one
    statement through a scratch table (the candidates have no index on ver)."""
    if not values:
        return
    tmp = d.temp_name("_mm_tmp_uqv")
    d.create_temp(conn, tmp, f"SELECT ver, {col} AS v FROM {cand} WHERE 1 = 0", keys="ver", index=None)
    conn.exec_driver_sql(f"INSERT INTO {tmp} (ver, v) VALUES ({d.ph(2)})", values)
    d.update_from(conn, cand, [f"{col} = x.v"], f"{tmp} x", f"{cand}.ver = x.ver")
    d.drop_temp(conn, tmp)


def _vacate(conn: Connection, d: Dialect, info: TableInfo, u: UniqueSet, keys: set[Any], pend: Pending) -> None:
    """Give the rows of `keys` their mark value of set `u` now, remembering their value."""
    if not keys:
        return
    q = d.quote
    ph = d.caps.placeholder
    live = " AND deleted IS NULL" if not info.spec.renumber else ""
    rids = [
        r[0]
        for k in keys
        for r in conn.exec_driver_sql(f"SELECT rid FROM {d.obj(info.name).shadow} WHERE {d.key_col} = {ph}{live}", (k,))
    ]
    _lock(conn, d, info, rids)
    rows = _load(conn, d, info, rids)
    m = u.mark
    stored = _stored(conn, d, info)
    for r in rows.values():
        if not r.live or r.actual[m] is None:
            continue
        if m in stored.get(r.rid, {}) and stored[r.rid][m][0] == r.versions[m]:
            continue  # marked already (its value is remembered)
        _remember(conn, d, info, r.rid, m, r.versions[m], r.actual[m])
        conn.exec_driver_sql(
            f"UPDATE {q(info.name)} SET {q(info.columns[m].name)} = {ph} WHERE {q(info.key.name)} = {ph}",
            (mark_value(u, r.actual[m], r.rid), r.key),
        )


def _remember(conn: Connection, d: Dialect, info: TableInfo, rid: str, m: int, ver: str, value: Any) -> None:
    q = d.quote
    ph = d.caps.placeholder
    t = table_name(d, info.name)
    name = info.columns[m].name
    conn.exec_driver_sql(f"DELETE FROM {t} WHERE rid = {ph} AND col = {ph}", (rid, name))
    conn.exec_driver_sql(f"INSERT INTO {t} (rid, col, ver, {q('i_' + name)}) VALUES ({d.ph(4)})", (rid, name, ver, value))


# ---- after the apply ---------------------------------------------------------------------------


def after_apply(
    conn: Connection, site: Site, info: TableInfo, cand: str, pend: Pending | None, peers: Sequence[str] = ()
) -> list[ConflictRecord]:
    """The candidates get back the values before_apply replaced (they are relayed as they came);
    then every marked row and every claimant of their values is decided again (:func:`settle`).
    Returns the conflict records written. `peers`: whose snapshots hold the changes the orphan
    rule reads (docs/foreign-keys.md)."""
    if pend is None:
        return []
    d = site.dialect
    for m in sorted({m for _, _, m, _ in pend.rewritten}):
        _set_candidates(conn, d, cand, d.quote("n_" + info.columns[m].name), [(v, x) for v, _r, i, x in pend.rewritten if i == m])
    return _settle(conn, site, info, pend, write=True, peers=peers)[0]


def settle(conn: Connection, site: Site, info: TableInfo, peers: Sequence[str] = ()) -> list[ConflictRecord]:
    """In the reconcile transaction (capture guard set), with nothing to apply: decide the marked
    rows again (a value their holder released here, a mark an application's change ended, a
    reference a marked row wants to a row deleted here)."""
    if not info.uniques:
        return []
    _require(conn, site, info)
    d = site.dialect
    pend = Pending(was_marked={rid: set(m) for rid, m in _stored(conn, d, info).items()}, was_parked=set(_images(conn, d, info)))
    return _settle(conn, site, info, pend, write=True, peers=peers)[0]


def unsettled(conn: Connection, site: Site, info: TableInfo) -> bool:
    """Read-only: whether :func:`settle` would change anything (a marked row would regain its
    value, or its mark has ended)."""
    if not info.uniques:
        return False
    _require(conn, site, info)
    d = site.dialect
    images = _images(conn, d, info)
    if not images and conn.exec_driver_sql(f"SELECT 1 FROM {table_name(d, info.name)} LIMIT 1").first() is None:
        return False
    if set(images) - store.errorqueue.parked_rids(conn, d, info.name):
        return True  # a parked row without its queue entry (a site added from a copy): settle writes it
    pend = Pending(was_marked={rid: set(m) for rid, m in _stored(conn, d, info).items()}, was_parked=set(images))
    return _settle(conn, site, info, pend, write=False)[1]


def _intended(
    info: TableInfo, r: _Row, stored: dict[int, tuple[str, Any]], rewritten: dict[tuple[str, int], dict[str, Any]]
) -> dict[int, Any]:
    """The values row `r` is meant to hold: the table's, but for a mark column whose slot version
    is that of a replaced candidate value or of a remembered value."""
    out = dict(r.actual)
    for i in out:
        v = r.versions[i]
        if v in rewritten.get((r.rid, i), {}):
            out[i] = rewritten[(r.rid, i)][v]
        elif i in stored and stored[i][0] == v:
            out[i] = stored[i][1]
    return out


def _claims(info: TableInfo, r: _Row) -> dict[str, str]:
    return {u.name: max(r.versions[i] for i in u.columns) for u in info.uniques}


def _settle(
    conn: Connection, site: Site, info: TableInfo, pend: Pending, write: bool, peers: Sequence[str] = ()
) -> tuple[list[ConflictRecord], bool]:
    """Decide the marked and parked rows (and the rows `pend` replaced values of) and every
    claimant of their values again; when `write`, write the difference. Returns the conflict
    records and whether anything changes."""
    d = site.dialect
    stored = _stored(conn, d, info)
    dead = _dead_references(conn, site, info, stored, pend)
    if dead and not write:
        return [], True
    if dead:
        _orphan(conn, site, info, dead, pend, peers)
        stored = _stored(conn, d, info)
    images = _images(conn, d, info)
    rewritten: dict[tuple[str, int], dict[str, Any]] = {}
    for ver, rid, m, val in pend.rewritten:
        rewritten.setdefault((rid, m), {})[ver] = val
    seeds = set(stored) | set(images) | {rid for _, rid, _, _ in pend.rewritten}
    if not seeds:
        return [], False
    rows, intended = _gather(conn, d, info, seeds, stored, rewritten, write, images)
    live = [Claimant(rid, intended[rid], _claims(info, rows[rid])) for rid in sorted(intended)]
    res = resolve(info.uniques, live)
    changes, records = _decide(info, rows, live, res, stored, pend)
    desired = {
        c.rid: {i: (rows[c.rid].versions[i], c.values[i]) for i in res.marks.get(c.rid, {})}
        for c in live
        if c.rid not in res.parked
    }
    stale = any(
        set(desired.get(rid, {})) != set(stored.get(rid, {}))
        or any(stored[rid][i][0] != v or not _same(stored[rid][i][1], x) for i, (v, x) in desired.get(rid, {}).items())
        for rid in rows
    )
    park, back, gone = _park_moves(rows, res)
    if write:
        _write_parks(conn, d, info, rows, res, park, gone)
        _write(conn, d, info, [c for c in changes if c[4] not in back and c[4] not in res.parked], rows, desired)
        _write_returns(conn, d, info, rows, res, back, intended)
        store.conflicts.record(conn, d, records, {rid: r.key for rid, r in rows.items()})
    return records, bool(changes or stale or park or back or gone)


def _dead_references(
    conn: Connection, site: Site, info: TableInfo, stored: dict[str, dict[int, tuple[str, Any]]], pend: Pending
) -> list[tuple[str, Any, int, Ref, str]]:
    """The live marked rows whose wanted value of a reference column (remembered, or a candidate's
    that before_apply replaced), and the parked rows whose kept value of one, name a row of the
    referenced table that is gone: deleted here by an application (the database's referential
    action did not reach them: the table holds the mark's NULL, or not the parked row), or by a
    delete whose orphan rule found rows by their value. A natural key names a row of the same
    key written later too: the row they wanted is the one whose delete came after their value
    (its version is later). As (rid, key, column index, reference, the delete's version). Valid
    values only: a later change of the column ended the mark (docs/unique.md)."""
    refs = {r.column: r for r in (*info.refs, *info.natural_refs)}
    if not refs:
        return []
    want: dict[tuple[str, int], tuple[str, Any]] = {}
    for rid, marks in stored.items():
        for i, (ver, val) in marks.items():
            if info.columns[i].name in refs and val is not None:
                want[(rid, i)] = (ver, val)
    for ver, rid, i, val in pend.rewritten:
        if info.columns[i].name in refs and val is not None:
            want[(rid, i)] = (ver, val)
    parked = _parked_references(conn, site.dialect, info, refs)
    if not want and not parked:
        return []
    d = site.dialect
    rows = _load(conn, d, info, sorted({rid for rid, _ in want}))
    checks = []
    for (rid, i), (ver, val) in sorted(want.items(), key=lambda x: x[0]):
        r = rows.get(rid)
        if r is not None and r.live and r.versions[i] == ver:
            checks.append((rid, r.key, i, ver, val))
    out = []
    for rid, key, i, ver, val in checks + parked:
        ref = refs[info.columns[i].name]
        pinfo = info if ref.parent == info.name else site.known_info(ref.parent, conn)
        if pinfo is None:
            continue
        gone = _gone(conn, d, pinfo, val, ver)
        if gone is not None:
            out.append((rid, key, i, ref, gone or ver))
    return out


def _parked_references(
    conn: Connection, d: Dialect, info: TableInfo, refs: dict[str, Ref]
) -> list[tuple[str, Any, int, str, Any]]:
    """The parked rows' kept values of the reference columns `refs`, not NULL: (rid, key, column
    index, the version of the column's slot, the value)."""
    images = _images(conn, d, info)
    if not images:
        return []
    ph = d.caps.placeholder
    sh = d.obj(info.name).shadow
    idx = [i for i, c in enumerate(info.columns) if c.name in refs]
    slots = sorted({_slot_col(info, i) for i in idx})
    out = []
    for rid, img in sorted(images.items()):
        r = conn.exec_driver_sql(
            f"SELECT {d.key_col}{''.join(', ' + d.quote(v) for v in slots)} FROM {sh} WHERE rid = {ph} AND deleted IS NULL",
            (rid,),
        ).first()
        if r is None:
            continue
        vers = dict(zip(slots, r[1:]))
        for i in idx:
            if img[i] is not None:
                out.append((rid, r[0], i, str(vers[_slot_col(info, i)] or _default_ver(info, rid)), img[i]))
    return out


def _gone(conn: Connection, d: Dialect, pinfo: TableInfo, val: Any, ver: str) -> str | None:
    """Whether the row of `pinfo` a reference valid since version `ver` names by key `val` is gone:
    its delete's version ('' when no delete is recorded), or None while it is there. A natural key
    names the row of that key deleted after `ver` (not one written again since under that key)."""
    q = d.quote
    ph = d.caps.placeholder
    sh = d.obj(pinfo.name).shadow
    if not pinfo.spec.renumber:
        later = conn.exec_driver_sql(
            f"SELECT min(deleted) FROM {sh} WHERE {d.key_col} = {ph} AND deleted IS NOT NULL AND deleted > {ph}", (val, ver)
        ).scalar()
        if later is not None:
            return str(later)
    if conn.exec_driver_sql(f"SELECT 1 FROM {q(pinfo.name)} WHERE {q(pinfo.key.name)} = {ph}", (val,)).first() is not None:
        return None
    gone = conn.exec_driver_sql(
        f"SELECT max(deleted) FROM {sh} WHERE {d.key_col} = {ph} AND deleted IS NOT NULL", (val,)
    ).scalar()
    return str(gone) if gone is not None else ""


def _orphan(
    conn: Connection, site: Site, info: TableInfo, dead: list[tuple[str, Any, int, Ref, str]], pend: Pending, peers: Sequence[str]
) -> None:
    """Delete wins for the marked and parked rows `dead` (:func:`_dead_references`) as for any
    row: ON DELETE SET NULL, the value they want is NULL now (a marked row's mark's NULL stays, as
    a normal value; a parked row's kept value is NULL); any other action, they are deleted
    (engine/references.py ``orphan_marked``; a parked row: ``orphan_parked``, its kept values go
    when the rows are decided)."""
    d = site.dialect
    ph = d.caps.placeholder
    images = _images(conn, d, info)
    gone: dict[tuple[str, str], dict[Any, str]] = {}
    held: dict[tuple[str, str], dict[Any, tuple[str, list[Any], str]]] = {}
    for rid, key, i, ref, ver in dead:
        name = info.columns[i].name
        if rid in images:
            held.setdefault((ref.column, ref.on_delete), {})[key] = (rid, images[rid], ver)
        elif orphan_action(ref.on_delete) == "null":
            conn.exec_driver_sql(f"DELETE FROM {table_name(d, info.name)} WHERE rid = {ph} AND col = {ph}", (rid, name))
            pend.rewritten = [x for x in pend.rewritten if (x[1], x[2]) != (rid, i)]
        else:
            gone.setdefault((ref.column, ref.on_delete), {})[key] = ver
    for (column, on_delete), rows in gone.items():
        references.orphan_marked(conn, site, info, column, on_delete, rows, peers)
    for (column, on_delete), prows in held.items():
        if orphan_action(on_delete) == "null":
            conn.exec_driver_sql(
                f"UPDATE {parked_table(d, info.name)} SET {d.quote('c_' + column)} = NULL WHERE rid = {ph}",
                [(rid,) for rid, _img, _v in prows.values()],
            )
        references.orphan_parked(conn, site, info, column, on_delete, prows)


def _park_moves(rows: dict[str, _Row], res: Resolution) -> tuple[list[str], list[str], list[str]]:
    """The rows to take out of the table (parked now), to put back (no longer parked) and whose
    kept values go (their row was deleted)."""
    park = sorted(rid for rid in res.parked if rows[rid].image is None)
    back = sorted(rid for rid, r in rows.items() if r.image is not None and r.live and rid not in res.parked)
    gone = sorted(rid for rid, r in rows.items() if r.image is not None and not r.live)
    return park, back, gone


def _write_parks(
    conn: Connection, d: Dialect, info: TableInfo, rows: dict[str, _Row], res: Resolution, park: list[str], gone: list[str]
) -> None:
    """Take the rows `park` out of the table (their values kept), note every parked row's holder,
    and drop the kept values of deleted rows."""
    q = d.quote
    ph = d.caps.placeholder
    cols = ", ".join(q(c.name) for c in info.columns)
    for rid in park:
        r = rows[rid]
        vals = conn.exec_driver_sql(f"SELECT {cols} FROM {q(info.name)} WHERE {q(info.key.name)} = {ph}", (r.key,)).first()
        assert vals is not None  # a live row not parked is in the table
        _put_image(conn, d, info, rid, list(vals), "", "")
        conn.exec_driver_sql(f"DELETE FROM {q(info.name)} WHERE {q(info.key.name)} = {ph}", (r.key,))
    for rid, lost in res.parked.items():
        sname, holder = lost[0]
        conn.exec_driver_sql(
            f"UPDATE {parked_table(d, info.name)} SET sname = {ph}, holder = {ph} WHERE rid = {ph}", (sname, holder, rid)
        )
        _queue(conn, d, info, rows[rid], sname, holder)
    for rid in gone:
        conn.exec_driver_sql(f"DELETE FROM {parked_table(d, info.name)} WHERE rid = {ph}", (rid,))
        store.errorqueue.unpark(conn, d, info.name, rid)


def _queue(conn: Connection, d: Dialect, info: TableInfo, r: _Row, sname: str, holder: str) -> None:
    """The error queue's entry of parked row `r` (state ``parked``): what it wants and who holds it."""
    u = next(x for x in info.uniques if x.name == sname)
    want = ", ".join(f"{info.columns[i].name}={r.actual[i]!r}" for i in u.columns)
    text = f"UNIQUE ({', '.join(info.columns[i].name for i in u.columns)}): {want} is held by row {holder}; parked"
    store.errorqueue.park(conn, d, info.name, r.rid, max(r.versions[i] for i in u.columns), _origin_of(r.rid), text)


def _write_returns(
    conn: Connection,
    d: Dialect,
    info: TableInfo,
    rows: dict[str, _Row],
    res: Resolution,
    back: list[str],
    intended: dict[str, dict[int, Any]],
) -> None:
    """Put the rows `back` into the table (at the key their identity holds in the shadow), with
    their kept values and the marks the rule gives them; their kept values go."""
    q = d.quote
    ph = d.caps.placeholder
    names = [q(info.key.name)] + [q(c.name) for c in info.columns]
    for rid in back:
        r = rows[rid]
        assert r.image is not None
        vals = list(r.image)
        for i, v in intended[rid].items():  # a value a mark replaced before it was parked: the intended one
            vals[i] = v
        for i, v in res.marks.get(rid, {}).items():
            vals[i] = v
        conn.exec_driver_sql(f"INSERT INTO {q(info.name)} ({', '.join(names)}) VALUES ({d.ph(len(names))})", (r.key, *vals))
        conn.exec_driver_sql(f"DELETE FROM {parked_table(d, info.name)} WHERE rid = {ph}", (rid,))
        store.errorqueue.unpark(conn, d, info.name, rid)


def _origin_of(rid: str) -> str:
    tail = rid.rpartition(":")[2]
    return tail if ":" in rid else "-"


def _gather(
    conn: Connection,
    d: Dialect,
    info: TableInfo,
    seeds: set[str],
    stored: dict[str, dict[int, tuple[str, Any]]],
    rewritten: dict[tuple[str, int], dict[str, Any]],
    lock: bool,
    images: dict[str, list[Any]],
) -> tuple[dict[str, _Row], dict[str, dict[int, Any]]]:
    """The rows to decide: the seeds and, transitively, every row holding or claiming a value of
    one of theirs (locked first, when `lock`). Returns them and the live ones' intended values."""
    rows: dict[str, _Row] = {}
    intended: dict[str, dict[int, Any]] = {}
    todo = set(seeds)
    seen: set[tuple[str, tuple[Any, ...]]] = set()
    while todo:
        if lock:
            _lock(conn, d, info, sorted(todo))
        loaded = _load(conn, d, info, sorted(todo), images)
        todo = set()
        groups: dict[str, set[tuple[Any, ...]]] = {}
        for rid, r in loaded.items():
            rows[rid] = r
            if not r.live:
                continue
            intended[rid] = _intended(info, r, stored.get(rid, {}), rewritten)
            for u in info.uniques:
                g = group_key(u, intended[rid])
                if g is not None and (u.name, g) not in seen:
                    seen.add((u.name, g))
                    groups.setdefault(u.name, set()).add(g)
        for u in info.uniques:
            if u.name in groups:
                todo |= _holders(conn, d, info, u, groups[u.name]) - set(rows)
    return rows, intended


def _decide(
    info: TableInfo,
    rows: dict[str, _Row],
    live: list[Claimant],
    res: Resolution,
    stored: dict[str, dict[int, tuple[str, Any]]],
    pend: Pending,
) -> tuple[list[tuple[Any, int, Any, bool, str]], list[ConflictRecord]]:
    """What the table's rows get (key, column, value, is a mark, rid), marks first, and the conflict
    records: a row newly marked, a marked row regaining its value (not one whose mark a change of
    the column ended)."""
    by_name = {u.name: u for u in info.uniques}
    claim_of = {c.rid: c.claims for c in live}
    changes: list[tuple[Any, int, Any, bool, str]] = []
    records: list[ConflictRecord] = []
    for c in live:
        r = rows[c.rid]
        want = res.marks.get(c.rid, {})
        for sname, winner in res.parked.get(c.rid, [])[:1]:
            if c.rid not in pend.was_parked:
                records.append(_record(info, by_name[sname], c, claim_of[winner][sname], winner, "parked", None))
        if c.rid in pend.was_parked and c.rid not in res.parked:
            u = next(x for x in info.uniques if x.policy == PARK)
            records.append(_record(info, u, c, c.claims[u.name], c.rid, "returned", None))
        for i in _marks(info):
            target = want[i] if i in want else c.values[i]
            if not _same(r.actual[i], target):
                changes.append((r.key, i, target, i in want, c.rid))
        before = pend.was_marked.get(c.rid, set())
        for sname, winner in res.lost.get(c.rid, []):
            u = by_name[sname]
            if u.mark not in before:
                records.append(_record(info, u, c, claim_of[winner][sname], winner, "marked", want[u.mark]))
        for i in sorted(before - set(want)):
            still = stored.get(c.rid, {}).get(i)
            if still is not None and still[0] == r.versions[i]:
                u = next(x for x in info.uniques if x.mark == i)
                records.append(_record(info, u, c, c.claims[u.name], c.rid, "regained", c.values[i]))
    changes.sort(key=lambda x: not x[3])
    return changes, records


def _write(
    conn: Connection,
    d: Dialect,
    info: TableInfo,
    changes: list[tuple[Any, int, Any, bool, str]],
    rows: dict[str, _Row],
    desired: dict[str, dict[int, tuple[str, Any]]],
) -> None:
    """Write the marks, then the regains, to the table; ``_mm_unique_<t>`` holds `desired` for `rows`."""
    q = d.quote
    ph = d.caps.placeholder
    for key, i, val, _mark, _rid in changes:
        conn.exec_driver_sql(
            f"UPDATE {q(info.name)} SET {q(info.columns[i].name)} = {ph} WHERE {q(info.key.name)} = {ph}", (val, key)
        )
    rids = list(rows)
    for k in range(0, len(rids), 500):
        chunk = rids[k : k + 500]
        conn.exec_driver_sql(
            f"DELETE FROM {table_name(d, info.name)} WHERE rid IN ({', '.join([ph] * len(chunk))})", tuple(chunk)
        )
    for rid, marks in desired.items():
        for i, (ver, val) in sorted(marks.items()):
            _remember(conn, d, info, rid, i, ver, val)


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (bytes, bytearray, memoryview)) or isinstance(b, (bytes, bytearray, memoryview)):
        return bytes(a) == bytes(b)
    return bool(a == b)


def _record(
    info: TableInfo, u: UniqueSet, c: Claimant, winner_claim: str, winner: str, decision: str, now: Any
) -> ConflictRecord:
    cols = tuple(info.columns[i].name for i in u.columns)
    mark = info.columns[u.mark].name
    return ConflictRecord(
        table=info.name,
        rid=c.rid,
        kind="unique",
        slot=u.name,
        columns=cols,
        local_ver=winner_claim,
        local_values={"holder": winner},
        remote_ver=c.claims[u.name],
        remote_values={n: c.values[i] for n, i in zip(cols, u.columns)},
        policy=u.policy,
        decision=decision,
        local_row=None,
        remote_row={mark: now},
    )
