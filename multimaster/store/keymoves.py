"""``_mm_keymoves``: the key history of renumbered tables. Every time the reconciler moves a row's
key (a rank given to local inserts, ``rank``; a shift made room for identities that sort before
it, ``shift``) one row records (table, identity, old key, new key, when, why). Read by
``multimaster keys`` and ``api.current_key`` (docs/foreign-keys.md)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Sequence

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = ["install", "record", "history", "moves_from", "delete_before", "forget_table"]


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_keymoves')} (tbl VARCHAR(64) NOT NULL, rid VARCHAR(255) NOT NULL, "
        "old_key BIGINT NOT NULL, new_key BIGINT NOT NULL, moved_at VARCHAR(40) NOT NULL, reason VARCHAR(16) NOT NULL, "
        # a primary key on every table multimaster creates (replication tools and MariaDB clusters
        # need one): one move of a row from a key to another at one time
        "PRIMARY KEY (tbl, rid, old_key, new_key, moved_at))"
    )
    # (every supported database takes CREATE INDEX IF NOT EXISTS; the index lives in the table's schema)
    conn.exec_driver_sql(
        f"CREATE INDEX IF NOT EXISTS {d.quote('_mm_keymoves_old')} ON {d.mm_table('_mm_keymoves')} (tbl, old_key)"
    )


def _now() -> str:
    """The current UTC time as ``moved_at`` is written: like the conflict log's ``detected_at``
    ('2026-01-02T03:04:05.678Z', sorts as text), so both are purged with one cut."""
    t = datetime.now(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{t.microsecond // 1000:03d}Z"


def record(conn: Connection, d: Dialect, table: str, moves: Sequence[tuple[str, int, int]], reason: str) -> None:
    """Record the key moves (identity, old key, new key) of `table`, now."""
    at = _now()
    if moves:
        conn.exec_driver_sql(
            f"INSERT INTO {d.mm_table('_mm_keymoves')} (tbl, rid, old_key, new_key, moved_at, reason) VALUES ({d.ph(6)})",
            [(table, rid, int(old), int(new), at, reason) for rid, old, new in moves],
        )


def history(conn: Connection, d: Dialect, table: str) -> list[tuple[Any, ...]]:
    """Every recorded move of `table`: (rid, old key, new key, moved_at, reason), oldest first."""
    return [
        tuple(r)
        for r in conn.exec_driver_sql(
            f"SELECT rid, old_key, new_key, moved_at, reason FROM {d.mm_table('_mm_keymoves')} WHERE tbl = {d.caps.placeholder} "
            "ORDER BY moved_at, rid",
            (table,),
        )
    ]


def moves_from(conn: Connection, d: Dialect, table: str, key: int) -> list[tuple[Any, ...]]:
    """The moves of `table` away from `key`: (rid, old key, new key, moved_at, reason), oldest first."""
    p = d.caps.placeholder
    return [
        tuple(r)
        for r in conn.exec_driver_sql(
            f"SELECT rid, old_key, new_key, moved_at, reason FROM {d.mm_table('_mm_keymoves')} WHERE tbl = {p} AND old_key = {p} "
            "ORDER BY moved_at, rid",
            (table, int(key)),
        )
    ]


def delete_before(conn: Connection, d: Dialect, table: str, before: str) -> int:
    """Delete the moves of `table` recorded before `before` (UTC, as moved_at is written). Returns how many."""
    p = d.caps.placeholder
    n = conn.exec_driver_sql(
        f"DELETE FROM {d.mm_table('_mm_keymoves')} WHERE tbl = {p} AND moved_at < {p}", (table, before)
    ).rowcount
    return int(n or 0)


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_keymoves`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_keymoves", table=table)
