"""``_mm_origins``: per table and origin site, the highest version applied here (or purged from
the change log): the reconciler's duplicate filter. Every route delivers an origin's changes in
version order, so "version <= max_ver" identifies every duplicate."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.engine import Connection

from multimaster.core.errorqueue import is_version
from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = ["install", "mark_applied", "not_applied", "read", "have", "of_origin", "copy_in", "forget_table", "beyond"]


def beyond(d: Dialect, have: Mapping[str, str] | None, alias: str = "l") -> tuple[str, list[Any]]:
    """A condition (starting with AND, or empty) and its parameters on change-log rows `alias`:
    their version is past what `have` (origin -> the highest version of it some site applied, as
    read from that site's ``_mm_origins``) holds for their origin; rows of other origins pass."""
    if not have:
        return "", []
    p = d.caps.placeholder
    sql = f" AND {alias}.ver > CASE {alias}.origin {' '.join(f'WHEN {p} THEN {p}' for _ in have)} ELSE '' END"
    return sql, [x for o, v in sorted(have.items()) for x in (o, v)]


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_origins')} (tbl VARCHAR(64) NOT NULL, origin VARCHAR(64) NOT NULL, "
        "max_ver VARCHAR(96) NOT NULL, PRIMARY KEY (tbl, origin))"
    )


def mark_applied(conn: Connection, d: Dialect, table: str, origin: str, ver: str) -> None:
    """Raise ``max_ver`` of (table, origin) to at least `ver` (compared as Python strings, the order
    versions sort in, whatever the column's collation)."""
    p = d.caps.placeholder
    t = d.mm_table("_mm_origins")
    cur = conn.exec_driver_sql(f"SELECT max_ver FROM {t} WHERE tbl = {p} AND origin = {p}", (table, origin)).first()
    if cur is None:
        conn.exec_driver_sql(f"INSERT INTO {t} (tbl, origin, max_ver) VALUES ({p}, {p}, {p})", (table, origin, ver))
    elif cur[0] < ver:
        conn.exec_driver_sql(f"UPDATE {t} SET max_ver = {p} WHERE tbl = {p} AND origin = {p}", (ver, table, origin))


def not_applied(d: Dialect, table: str, alias: str) -> str:
    """SQL condition: the change row `alias` (with ``origin`` and ``ver``) is past what this site
    applied from its origin. `table` is a checked plain identifier."""
    return (
        f"NOT EXISTS (SELECT 1 FROM {d.mm_table('_mm_origins')} g WHERE g.tbl = '{table}' AND g.origin = {alias}.origin "
        f"AND g.max_ver >= {alias}.ver)"
    )


def newest_own(conn: Connection, d: Dialect, table: str, site: str, upto_seq: int | None = None) -> str | None:
    """The highest version of `site`'s own changes in its change log of `table` (at positions up to
    `upto_seq` when given), None when there is none. Only a well-formed version of `site` counts: an
    entry whose version was damaged by hand ('garbage' sorts above every version) is held by every
    puller as malformed, and taken for the newest here it would make every later change look
    applied (add-site's copy, docs/errors.md)."""
    ph = d.caps.placeholder
    where = f"origin = {ph}"
    params: list[Any] = [site]
    if upto_seq is not None:
        where += f" AND seq <= {ph}"
        params.append(upto_seq)
    res = conn.exec_driver_sql(f"SELECT ver FROM {d.obj(table).log} WHERE {where} ORDER BY ver DESC", tuple(params))
    try:
        while part := res.fetchmany(100):
            for (v,) in part:
                if is_version(v) and v[20:] == site:
                    return str(v)
        return None
    finally:
        res.close()


def read(conn: Connection, d: Dialect, table: str) -> list[tuple[str, str]]:
    """(origin, max_ver) of every origin of `table`."""
    return [
        (o, v)
        for o, v in conn.exec_driver_sql(
            f"SELECT origin, max_ver FROM {d.mm_table('_mm_origins')} WHERE tbl = {d.caps.placeholder}", (table,)
        ).all()
    ]


def have(conn: Connection, d: Dialect, tables: Iterable[str]) -> dict[str, dict[str, str]]:
    """Per table of `tables`, origin -> max_ver: what this site applied, as a pull or a waiting
    count sends it to the source (:func:`beyond`)."""
    out: dict[str, dict[str, str]] = {tb: {} for tb in tables}
    for tb, o, v in conn.exec_driver_sql(f"SELECT tbl, origin, max_ver FROM {d.mm_table('_mm_origins')}"):  # one statement
        if tb in out:
            out[tb][o] = v
    return out


def of_origin(conn: Connection, d: Dialect, origin: str) -> dict[str, str]:
    """Per table, the highest version of `origin` applied here (or purged from the change log)."""
    rows = conn.exec_driver_sql(
        f"SELECT tbl, max_ver FROM {d.mm_table('_mm_origins')} WHERE origin = {d.caps.placeholder}", (origin,)
    ).all()
    return {str(t): str(v) for t, v in rows}


def copy_in(conn: Connection, d: Dialect, table: str, rows: list[tuple[str, str]]) -> None:
    """Insert (origin, max_ver) rows of `table` read at another site (add-site: none here yet)."""
    if rows:
        conn.exec_driver_sql(
            f"INSERT INTO {d.mm_table('_mm_origins')} (tbl, origin, max_ver) VALUES ({d.ph(3)})", [(table, o, v) for o, v in rows]
        )


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_origins`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_origins", table=table)
