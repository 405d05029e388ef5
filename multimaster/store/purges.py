"""``_mm_purges`` (per table, the highest second-order position purged from this site's change log:
a puller whose watermark is below it has missed changes) and ``_mm_pullers`` (the last watermark
seen of every site that pulls from this one, and when it last refreshed). See ops/purge.py."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from multimaster.core.versions import now_iso
from multimaster.dialects.base import Dialect

__all__ = ["install", "horizon", "record_horizon", "pullers", "record_puller", "forget_puller"]


def install(conn: Connection, d: Dialect) -> None:
    for sql in (
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_purges')} (tbl VARCHAR(64) NOT NULL PRIMARY KEY, "
        "horizon BIGINT NOT NULL DEFAULT 0, purged BIGINT NOT NULL DEFAULT 0, purged_at VARCHAR(32))",
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_pullers')} (peer VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, "
        "seq2 BIGINT NOT NULL DEFAULT 0, last_success_at VARCHAR(32), first_seen_at VARCHAR(32), checked_at VARCHAR(32), "
        "PRIMARY KEY (peer, tbl))",
    ):
        conn.exec_driver_sql(sql)


def horizon(conn: Connection, d: Dialect, table: str) -> int:
    """The highest second-order sequence number purged from this site's log of `table`."""
    return int(
        conn.exec_driver_sql(
            f"SELECT horizon FROM {d.mm_table('_mm_purges')} WHERE tbl = {d.caps.placeholder}", (table,)
        ).scalar()
        or 0
    )


def record_horizon(conn: Connection, d: Dialect, table: str, horizon: int, purged: int) -> None:
    """Remember the highest second-order position purged (pullers below it missed changes:
    :func:`multimaster.engine.refresh.check_not_purged`) and add `purged` entries to the count."""
    ph = d.caps.placeholder
    t = d.mm_table("_mm_purges")
    if conn.exec_driver_sql(f"SELECT 1 FROM {t} WHERE tbl = {ph}", (table,)).first() is None:
        conn.exec_driver_sql(
            f"INSERT INTO {t} (tbl, horizon, purged, purged_at) VALUES ({d.ph(4)})", (table, horizon, purged, now_iso())
        )
    else:
        conn.exec_driver_sql(
            f"UPDATE {t} SET horizon = {d.greatest('horizon', ph)}, purged = purged + {ph}, purged_at = {ph} WHERE tbl = {ph}",
            (horizon, purged, now_iso(), table),
        )


def pullers(conn: Connection, d: Dialect) -> dict[tuple[str, str], tuple[int, str | None, str | None]]:
    """(peer, table) -> (watermark, last_success_at, first_seen_at) of every puller recorded."""
    return {
        (r[0], r[1]): (int(r[2] or 0), r[3], r[4])
        for r in conn.exec_driver_sql(f"SELECT peer, tbl, seq2, last_success_at, first_seen_at FROM {d.mm_table('_mm_pullers')}")
    }


def record_puller(
    conn: Connection,
    d: Dialect,
    peer: str,
    table: str,
    seq2: int,
    last_success_at: str | None,
    first_seen_at: str | None,
    checked_at: str,
    *,
    new: bool,
) -> None:
    """Write what was read of a puller: a `new` row, or the update of the recorded one (its
    first_seen_at stays)."""
    ph = d.caps.placeholder
    t = d.mm_table("_mm_pullers")
    if new:
        conn.exec_driver_sql(
            f"INSERT INTO {t} (peer, tbl, seq2, last_success_at, first_seen_at, checked_at) VALUES ({d.ph(6)})",
            (peer, table, seq2, last_success_at, first_seen_at, checked_at),
        )
    else:
        conn.exec_driver_sql(
            f"UPDATE {t} SET seq2 = {ph}, last_success_at = {ph}, checked_at = {ph} WHERE peer = {ph} AND tbl = {ph}",
            (seq2, last_success_at, checked_at, peer, table),
        )


def forget_puller(conn: Connection, d: Dialect, peer: str) -> None:
    """`peer` no longer pulls from this site: the log entries kept for it are released."""
    conn.exec_driver_sql(f"DELETE FROM {d.mm_table('_mm_pullers')} WHERE peer = {d.caps.placeholder}", (peer,))
