"""Set-based apply of the changes whose outcome needs no decision.

Most changes in a batch are plain: an insert of a new identity that sorts after every identity
this site knows, an update whose old values are what this site holds and whose version is newer
than every version of the columns it touches (and sets no slot whose policy chooses among heads),
a delete of a row this site holds unchanged. For those
the planner (multimaster.core.planner) would decide exactly "apply it": no conflict, no renumbering. This
module applies them with a handful of INSERT ... SELECT / UPDATE ... FROM statements over a
candidate table, so the cost per change is SQL's, not Python's. Every other change — an identity
touched twice in the batch, a conflict, an insert that shifts keys, a tombstone, a natural key
with an incarnation known here or changed twice in the batch — is left in the candidate table for
the planner.

The fast path is a special case of the planner's rules, not a second set of rules: the property
tests run with it for every batch (MM_FASTPATH_MIN=0) and off (MM_FASTPATH=0) against the same
reference model. Its scratch tables cost more than the planner for a few changes (2-3 ms each on
PostgreSQL), so a batch takes it from Capabilities.fastpath_min changes on (docs/performance.md
"The fast path's threshold").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from multimaster.core.versions import BASE_VER
from multimaster.dialects.schema import TableInfo
from multimaster.engine.site import Site

__all__ = ["FastResult", "apply_fast", "enabled", "wanted"]


def enabled() -> bool:
    return os.environ.get("MM_FASTPATH", "1") != "0"


def wanted(site: Site, total: int) -> bool:
    """Whether `total` candidate changes go through the fast path at `site`: where the dialect
    applies set-based, and when there are at least Capabilities.fastpath_min of them (its scratch
    tables cost more than the planner for a few changes; MM_FASTPATH_MIN overrides the threshold)."""
    caps = site.dialect.caps
    low = int(os.environ.get("MM_FASTPATH_MIN", caps.fastpath_min))
    return enabled() and caps.set_based_apply and total >= low


@dataclass
class FastResult:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    keyed: str | None = None  # table (rid, key) of every new identity's key, when no shifts are needed
    done: str | None = None  # table (ver) of the changes applied here, when some are left
    left: int = -1  # changes left for the planner (-1: not known, the fast path did not run)


def apply_fast(conn: Connection, site: Site, info: TableInfo, cand: str, base_max: int, total: int) -> FastResult:
    """Apply the plain changes of `cand` (a table of candidate changes, one per version). Returns
    what it applied and, in `done`, which versions (when some are left for the planner). Applies
    nothing when keys would shift or a change must wait for its row. Runs inside the reconcile
    transaction with the capture guard set."""
    d = site.dialect
    q = d.quote
    spec = info.spec
    cols = info.column_names
    res = FastResult()
    multi = _multi_changed(conn, site, info, cand)
    # identities new to this site, with their keys when they all sort after every known one
    newids = d.temp_name("_mm_tmp_new")
    key_of_new = _new_identities(conn, site, info, cand, newids, base_max)
    if key_of_new is None:
        for name in (multi, newids):
            d.drop_temp(conn, name)
        return res  # the new identities interleave with known ones: keys shift, the planner does it
    if spec.renumber:
        res.keyed = newids
    single = f"NOT EXISTS (SELECT 1 FROM {multi} m WHERE m.rid = c.rid)"
    carry = "".join(f", c.{q('n_' + c)}" for c in cols)  # the new values travel with each scratch row
    upd = _updates(conn, site, info, cand, single, carry)
    # an update of an identity neither known here nor inserted by this batch waits, and with it
    # the later changes of its origin (in order): then the planner does the whole batch
    if (
        conn.exec_driver_sql(
            f"SELECT 1 FROM {upd} u WHERE u.lkey IS NULL AND NOT EXISTS (SELECT 1 FROM {newids} n WHERE n.rid = u.rid AND n.has_i = 1) LIMIT 1"
        ).first()
        is not None
    ):
        for name in (multi, newids, upd):
            d.drop_temp(conn, name)
        res.keyed = None
        return res
    ins = _inserts(conn, site, info, cand, newids, key_of_new, single, carry)
    res.inserted = _apply_inserts(conn, site, info, ins)
    res.updated = _apply_updates(conn, site, info, upd)
    dele = _deletes(conn, site, info, cand, single)
    res.deleted = _apply_deletes(conn, site, info, dele)
    res.left = total - res.inserted - res.updated - res.deleted
    if res.left:
        done = d.temp_name("_mm_tmp_done")
        d.create_temp(
            conn,
            done,
            f"SELECT ver FROM {ins} UNION ALL SELECT ver FROM {upd} WHERE ok = 1 UNION ALL SELECT ver FROM {dele}",
            keys="ver",
            index=None,
        )
        res.done = done
    for name in (multi, ins, upd, dele) + (() if res.keyed else (newids,)):
        d.drop_temp(conn, name)
    return res


def _multi_changed(conn: Connection, site: Site, info: TableInfo, cand: str) -> str:
    """Create and name the scratch table of the identities `cand` changes more than once: their
    changes go to the planner."""
    d = site.dialect
    multi = d.temp_name("_mm_tmp_multi")
    if info.spec.renumber:
        d.create_temp(conn, multi, f"SELECT rid FROM {cand} GROUP BY rid HAVING count(*) > 1")
    else:
        # natural keys: every change of a key changed more than once in the batch (another
        # incarnation of it may supersede this one) goes to the planner
        d.create_temp(
            conn,
            multi,
            f"SELECT DISTINCT c.rid AS rid FROM {cand} c WHERE c.{d.key_col} IN "
            f"(SELECT c2.{d.key_col} FROM {cand} c2 GROUP BY c2.{d.key_col} HAVING count(*) > 1)",
        )
    return multi


def _new_identities(conn: Connection, site: Site, info: TableInfo, cand: str, newids: str, base_max: int) -> str | None:
    """Create `newids`: the identities `cand` inserts or deletes that this site does not know
    (`has_i`: inserted by the batch) and, for a renumbered table, their keys. Returns the SQL
    expression of a new identity's key, or None when the new identities interleave with known ones
    (keys would shift: the planner does it)."""
    d = site.dialect
    shadow = d.obj(info.name).shadow
    fresh = (
        f"SELECT c.rid AS rid, max(CASE WHEN c.op = 'I' THEN 1 ELSE 0 END) AS has_i FROM {cand} c WHERE c.op IN ('I', 'D') "
        f"AND NOT EXISTS (SELECT 1 FROM {shadow} s WHERE s.rid = c.rid) GROUP BY c.rid"
    )
    if not info.spec.renumber:
        d.create_temp(conn, newids, fresh)
        return f"c.{d.key_col}"
    max_rid = conn.exec_driver_sql(f"SELECT max(rid) FROM {shadow}").scalar()
    max_key = conn.exec_driver_sql(f"SELECT max({d.key_col}) FROM {shadow}").scalar()
    start = max_key if max_key is not None else base_max
    d.create_temp(
        conn, newids, f"SELECT rid, has_i, {int(start)} + ROW_NUMBER() OVER (ORDER BY rid) AS {d.key_col} FROM ({fresh}) n"
    )
    low = conn.exec_driver_sql(f"SELECT min(rid) FROM {newids}").scalar()
    if low is not None and max_rid is not None and low < max_rid:
        return None
    return f"n.{d.key_col}"


def _updates(conn: Connection, site: Site, info: TableInfo, cand: str, single: str, carry: str) -> str:
    """Create and name the scratch table of the updates in `cand`, each with the key of its row here
    (`lkey`, NULL when unknown) and `ok` = 1 when it goes without conflict: its old values are what
    this site holds and its version is newer than every version of the slots it touches."""
    d = site.dialect
    q = d.quote
    spec = info.spec
    t = q(info.name)
    keyc = q(info.key.name)
    shadow = d.obj(info.name).shadow
    default_ver = "s.rid" if spec.renumber else f"'{BASE_VER}'"
    conds = []
    for i, col in enumerate(info.columns):
        c = col.name
        same = d.null_safe_eq(d.comparable(col, "t." + q(c)), d.comparable(col, "c." + q("o_" + c)))
        conds.append(f"((c.mask & {1 << i}) = 0 OR {same})")
    for s in spec.slots:
        smask = sum(1 << i for i in s.columns)
        if s.policy.chooses:  # the planner decides among the slot's heads (docs/conflicts.md "Concurrent heads")
            conds.append(f"(c.mask & {smask}) = 0")
        else:
            conds.append(f"((c.mask & {smask}) = 0 OR c.ver > coalesce(s.{q('v_' + s.name)}, {default_ver}))")
    ok = f"t.{keyc} IS NOT NULL AND s.deleted IS NULL AND {single} AND {' AND '.join(conds)}"
    upd = d.temp_name("_mm_tmp_fu")
    d.create_temp(
        conn,
        upd,
        f"SELECT c.ver AS ver, c.rid AS rid, s.{d.key_col} AS lkey, c.mask AS mask, CASE WHEN {ok} THEN 1 ELSE 0 END AS ok{carry} "
        f"FROM {cand} c LEFT JOIN {shadow} s ON s.rid = c.rid LEFT JOIN {t} t ON t.{keyc} = s.{d.key_col} WHERE c.op = 'U'",
        index=None,
    )
    return upd


def _inserts(
    conn: Connection, site: Site, info: TableInfo, cand: str, newids: str, key_of_new: str, single: str, carry: str
) -> str:
    """Create and name the scratch table of the plain inserts: new identities inserted once by the
    batch (for a natural key: one no incarnation of which is known here), each with its key."""
    d = site.dialect
    shadow = d.obj(info.name).shadow
    ins = d.temp_name("_mm_tmp_fi")
    # a natural key with any incarnation known here (alive or dead): the planner decides which lives
    first_life = "" if info.spec.renumber else f" AND NOT EXISTS (SELECT 1 FROM {shadow} s WHERE s.{d.key_col} = c.{d.key_col})"
    d.create_temp(
        conn,
        ins,
        f"SELECT c.ver AS ver, c.rid AS rid, {key_of_new} AS nkey{carry} "
        f"FROM {cand} c JOIN {newids} n ON n.rid = c.rid WHERE c.op = 'I' AND {single}{first_life}",
        index=None,
    )
    return ins


def _apply_inserts(conn: Connection, site: Site, info: TableInfo, ins: str) -> int:
    """Insert the rows of `ins` into the table and their identities into the shadow. Returns how many."""
    d = site.dialect
    q = d.quote
    spec = info.spec
    t = q(info.name)
    shadow = d.obj(info.name).shadow
    cols = info.column_names
    n_ins = conn.exec_driver_sql(f"SELECT count(*) FROM {ins}").scalar() or 0
    if n_ins:
        collist = ", ".join([q(info.key.name)] + [q(c) for c in cols])
        ncols = ", ".join(f"f.{q('n_' + c)}" for c in cols)
        conn.exec_driver_sql(f"INSERT INTO {t} ({collist}) SELECT f.nkey, {ncols} FROM {ins} f")
        slots = [q("v_" + s.name) for s in spec.slots]
        if spec.renumber:
            conn.exec_driver_sql(f"INSERT INTO {shadow} (rid, {d.key_col}) SELECT rid, nkey FROM {ins}")
        else:
            conn.exec_driver_sql(
                f"INSERT INTO {shadow} (rid, {d.key_col}{''.join(', ' + s for s in slots)}) "
                f"SELECT rid, nkey{''.join(', ver' for _ in slots)} FROM {ins}"
            )
    return int(n_ins)


def _apply_updates(conn: Connection, site: Site, info: TableInfo, upd: str) -> int:
    """Apply the updates of `upd` that go without conflict (`ok` = 1) to the table, and stamp the
    versions of the slots they touch in the shadow. Returns how many."""
    d = site.dialect
    q = d.quote
    spec = info.spec
    t = q(info.name)
    keyc = q(info.key.name)
    shadow = d.obj(info.name).shadow
    n_upd = conn.exec_driver_sql(f"SELECT count(*) FROM {upd} WHERE ok = 1").scalar() or 0
    if n_upd:
        sets = [
            f"{q(c)} = CASE WHEN (u.mask & {1 << i}) <> 0 THEN u.{q('n_' + c)} ELSE {t}.{q(c)} END"
            for i, c in enumerate(info.column_names)
        ]
        d.update_from(conn, t, sets, f"{upd} u", f"u.ok = 1 AND {t}.{keyc} = u.lkey")
        vsets = []
        for s in spec.slots:
            smask = sum(1 << i for i in s.columns)
            v = q("v_" + s.name)
            vsets.append(f"{v} = CASE WHEN (u.mask & {smask}) <> 0 THEN u.ver ELSE {shadow}.{v} END")
        # (a natural key's shadow holds every incarnation of the key: the row is the rid's)
        srow = f"{shadow}.{d.key_col} = u.lkey" if spec.renumber else f"{shadow}.rid = u.rid"
        d.update_from(conn, shadow, vsets, f"{upd} u", f"u.ok = 1 AND {srow}")
    return int(n_upd)


def _deletes(conn: Connection, site: Site, info: TableInfo, cand: str, single: str) -> str:
    """Create and name the scratch table of the plain deletes: of live rows this site holds with
    exactly the values the delete saw, each with the row's key here."""
    d = site.dialect
    q = d.quote
    spec = info.spec
    t = q(info.name)
    keyc = q(info.key.name)
    shadow = d.obj(info.name).shadow
    dconds = [
        d.null_safe_eq(d.comparable(col, "t." + q(col.name)), d.comparable(col, "c." + q("o_" + col.name)))
        for col in info.columns
    ]
    dele = d.temp_name("_mm_tmp_fd")
    d.create_temp(
        conn,
        dele,
        (
            f"SELECT c.ver AS ver, c.rid AS rid, s.{d.key_col} AS lkey FROM {cand} c "
            f"JOIN {shadow} s ON s.rid = c.rid JOIN {t} t ON t.{keyc} = s.{d.key_col} "
            f"WHERE c.op = 'D' AND c.mask = {spec.all_mask} AND {single} AND s.deleted IS NULL"
            + (f" AND {' AND '.join(dconds)}" if dconds else "")
        ),
        index=None,
    )
    return dele


def _apply_deletes(conn: Connection, site: Site, info: TableInfo, dele: str) -> int:
    """Delete the rows of `dele` from the table and mark their identities deleted in the shadow.
    Returns how many."""
    d = site.dialect
    q = d.quote
    t = q(info.name)
    keyc = q(info.key.name)
    shadow = d.obj(info.name).shadow
    n_del = conn.exec_driver_sql(f"SELECT count(*) FROM {dele}").scalar() or 0
    if n_del:
        conn.exec_driver_sql(f"DELETE FROM {t} WHERE {keyc} IN (SELECT lkey FROM {dele})")
        srow = f"{shadow}.{d.key_col} = u.lkey" if info.spec.renumber else f"{shadow}.rid = u.rid"
        d.update_from(conn, shadow, ["deleted = u.ver"], f"{dele} u", srow)
    return int(n_del)
