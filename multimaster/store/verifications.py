"""``_mm_verifications``: one row per recorded verify run (scheduled by the daemon or
``verify --record``): when, how long, converged or not, the status per table, the result's counts
as JSON, the error of a run that could not complete. The cluster-level API (which site keeps
them, what a row means) is :mod:`multimaster.ops.verifications`."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect

__all__ = ["install", "exists", "insert", "last"]

_COLS = ("started_at", "seconds", "converged", "status", "table_status", "summary", "error", "source")


def install(conn: Connection, d: Dialect) -> None:
    """Create the table (idempotent), with the bookkeeping schema where there is one: a site may
    record a run before init."""
    if d.caps.bookkeeping_schema:
        conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {d.caps.bookkeeping_schema}")
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_verifications')} (id {d.caps.serial_pk}, started_at VARCHAR(40) NOT NULL, "
        "seconds DOUBLE PRECISION, converged SMALLINT, status VARCHAR(16) NOT NULL, table_status TEXT, summary TEXT, "
        "error TEXT, source VARCHAR(16))"
    )


def exists(conn: Connection, d: Dialect) -> bool:
    return d.table_kind(conn, "_mm_verifications") is not None


def insert(conn: Connection, d: Dialect, row: Sequence[Any], keep: int) -> int:
    """Store one run (`row`: started_at, seconds, converged, status, table_status, summary, error,
    source), keep the last `keep` runs; returns the new run's id."""
    table = d.mm_table("_mm_verifications")
    conn.exec_driver_sql(f"INSERT INTO {table} ({', '.join(_COLS)}) VALUES ({d.ph(len(_COLS))})", tuple(row))
    vid = int(conn.exec_driver_sql(f"SELECT max(id) FROM {table}").scalar() or 0)
    if vid > keep:
        conn.exec_driver_sql(f"DELETE FROM {table} WHERE id <= {d.caps.placeholder}", (vid - keep,))
    return vid


def last(conn: Connection, d: Dialect) -> tuple[Any, ...] | None:
    """The last run: (id, started_at, seconds, converged, status, table_status, summary, error,
    source), or None."""
    sql = f"SELECT id, {', '.join(_COLS)} FROM {d.mm_table('_mm_verifications')} ORDER BY id DESC LIMIT 1"
    r = conn.exec_driver_sql(sql).first()
    return None if r is None else tuple(r)
