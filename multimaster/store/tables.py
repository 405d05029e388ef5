"""``_mm_tables``: per replicated table, its key column, renumbering on/off, replicated columns
(JSON), the base's highest key (``caught_up`` belongs to the SQLite dialect's catch-up); and the
counts `status` shows per site."""

from __future__ import annotations

import json
from typing import Any, Sequence

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster.core.versions import BASE_VER
from multimaster.dialects.base import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.store import _rows

__all__ = [
    "installed",
    "base_maxes",
    "register",
    "set_columns",
    "base_max",
    "keys_ranked",
    "set_keys_ranked",
    "registration",
    "copy_in",
    "site_status",
    "forget_table",
]

_REG = ("key_col", "renumber", "columns", "base_max")


def installed(conn: Connection, d: Dialect) -> list[str]:
    """The tables replicated at this site (none when it is not installed)."""
    if not _registered(conn, d):
        return []
    return [r[0] for r in conn.exec_driver_sql(f"SELECT tbl FROM {d.mm_table('_mm_tables')} ORDER BY tbl")]


def base_maxes(conn: Connection, d: Dialect) -> dict[str, int]:
    """:func:`base_max` of every table replicated at this site, in one statement (in the order of
    :func:`installed`, its keys; {} when the site is not installed)."""
    if not _registered(conn, d):
        return {}
    sql = f"SELECT tbl, base_max FROM {d.mm_table('_mm_tables')} ORDER BY tbl"
    return {str(tb): int(m or 0) for tb, m in conn.exec_driver_sql(sql)}


def _registered(conn: Connection, d: Dialect) -> bool:
    """Whether this site has ``_mm_tables`` (is installed); raises when this login may not read it."""
    if d.table_kind(conn, "_mm_tables") is None:
        if d.hides_unreadable:  # (a login that may not read it does not see it: say so, not "not installed")
            with conn.begin_nested():
                try:
                    conn.exec_driver_sql(f"SELECT 1 FROM {d.mm_table('_mm_tables')} LIMIT 1").all()
                except DBAPIError as e:
                    if d.is_permission_denied(e):
                        raise
                    return False
        else:
            return False
    return True


def register(conn: Connection, d: Dialect, info: TableInfo) -> None:
    """Record the table and give its base rows their identities (the common base)."""
    q = d.quote
    o = d.obj(info.name)
    key = q(info.key.name)
    base_max = 0
    if info.spec.renumber:
        base_max = conn.exec_driver_sql(f"SELECT coalesce(max({key}), 0) FROM {q(info.name)}").scalar() or 0
        rid = d.concat(f"'{BASE_VER}#'", d.cast_text(key))
    else:
        rid = d.concat("'k:'", d.cast_text(key))
    conn.exec_driver_sql(f"INSERT INTO {o.shadow} (rid, {d.key_col}) SELECT {rid}, {key} FROM {q(info.name)}")
    renumber = 1 if info.spec.renumber else 0
    copy_in(conn, d, info.name, (info.key.name, renumber, json.dumps(list(info.column_names)), int(base_max)))


def set_columns(conn: Connection, d: Dialect, table: str, columns: Sequence[str]) -> None:
    """The replicated columns of `table` now (its current schema version, store/schemas.py)."""
    ph = d.caps.placeholder
    conn.exec_driver_sql(
        f"UPDATE {d.mm_table('_mm_tables')} SET columns = {ph} WHERE tbl = {ph}", (json.dumps(list(columns)), table)
    )


def base_max(conn: Connection, d: Dialect, table: str) -> int:
    """The highest key of the common base (keys above it are base_max + rank)."""
    return int(
        conn.exec_driver_sql(
            f"SELECT base_max FROM {d.mm_table('_mm_tables')} WHERE tbl = {d.caps.placeholder}", (table,)
        ).scalar()
        or 0
    )


def keys_ranked(conn: Connection, d: Dialect, table: str) -> int:
    """The key up to which every key of renumbered `table` is base_max + rank (dialects whose
    writers capture concurrently: keys above it were drawn by local inserts and wait for
    engine/apply.py normalize_keys)."""
    return int(
        conn.exec_driver_sql(
            f"SELECT keys_ranked FROM {d.mm_table('_mm_tables')} WHERE tbl = {d.caps.placeholder}", (table,)
        ).scalar()
        or 0
    )


def set_keys_ranked(conn: Connection, d: Dialect, table: str, top: int) -> None:
    ph = d.caps.placeholder
    conn.exec_driver_sql(f"UPDATE {d.mm_table('_mm_tables')} SET keys_ranked = {ph} WHERE tbl = {ph}", (top, table))


def registration(conn: Connection, d: Dialect, table: str) -> tuple[Any, ...] | None:
    """(key_col, renumber, columns, base_max) of `table`, None when it is not registered."""
    r = conn.exec_driver_sql(
        f"SELECT {', '.join(_REG)} FROM {d.mm_table('_mm_tables')} WHERE tbl = {d.caps.placeholder}", (table,)
    ).first()
    return None if r is None else tuple(r)


def copy_in(conn: Connection, d: Dialect, table: str, reg: Sequence[Any]) -> None:
    """Register `table` with `reg` (a registration(), e.g. read at another site by add-site)."""
    conn.exec_driver_sql(
        f"INSERT INTO {d.mm_table('_mm_tables')} (tbl, {', '.join(_REG)}) VALUES ({d.ph(1 + len(_REG))})", (table, *reg)
    )


def site_status(conn: Connection, d: Dialect, tables: Sequence[str]) -> dict[str, Any]:
    """The site's name and clock, its conflicts, and per table the change log, second-order log,
    tombstone and row counts."""
    st = conn.exec_driver_sql(f"SELECT site FROM {d.mm_table('_mm_state')}").first()
    out: dict[str, Any] = {"name": st[0] if st else None, "hlc": d.read_clock(conn) if st else None, "tables": {}}
    kinds = ("log", "log2", "tombstones", "rows")
    counts = [f"SELECT count(*) AS n FROM {d.mm_table('_mm_conflicts')}"]
    for t in tables:  # every count in one statement (status over a WAN: a round trip each)
        o = d.obj(t)
        counts += [f"SELECT count(*) AS n FROM {x}" for x in (o.log, o.log2, o.shadow + " WHERE deleted IS NOT NULL", d.quote(t))]
    n = [int(r[0] or 0) for r in _rows.each_one(conn, [(sql, ()) for sql in counts])]
    out["conflicts"] = n[0]
    for i, t in enumerate(tables):
        out["tables"][t] = dict(zip(kinds, n[1 + 4 * i : 5 + 4 * i]))
    return out


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_tables`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_tables", table=table)
