"""``_mm_purges`` (per table, the highest second-order position purged from this site's change log:
a puller whose watermark is below it has missed changes), ``_mm_pullers`` (the last watermark
seen of every site that pulls from this one, when it last refreshed and when a purge last reached it) and
``_mm_snap_horizons`` (per peer and table, the position up to which this site's snapshot of the
peer may lack entries it pulled: above it, up to the watermark, it holds every one; remove-site
gives them to the peer's other pullers, docs/operations.md "Removing a site"). See ops/purge.py."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy.engine import Connection

from multimaster.core.versions import now_iso
from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = [
    "install",
    "horizon",
    "horizons",
    "record_horizon",
    "pullers",
    "record_puller",
    "forget_puller",
    "snapshot_horizon",
    "ensure_snapshot_horizon",
    "raise_snapshot_horizon",
    "forget_snapshot_horizons",
    "forget_table",
]

_SNAP = "_mm_snap_horizons"


def install(conn: Connection, d: Dialect) -> None:
    for sql in (
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_purges')} (tbl VARCHAR(64) NOT NULL PRIMARY KEY, "
        "horizon BIGINT NOT NULL DEFAULT 0, purged BIGINT NOT NULL DEFAULT 0, purged_at VARCHAR(32))",
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_pullers')} (peer VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, "
        "seq2 BIGINT NOT NULL DEFAULT 0, last_success_at VARCHAR(32), first_seen_at VARCHAR(32), checked_at VARCHAR(32), "
        "PRIMARY KEY (peer, tbl))",
        f"CREATE TABLE IF NOT EXISTS {d.mm_table(_SNAP)} (peer VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, "
        "horizon BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (peer, tbl))",
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


def horizons(conn: Connection, d: Dialect, tables: Sequence[str]) -> dict[str, int]:
    """:func:`horizon` of every table of `tables`, in one statement."""
    rows = conn.exec_driver_sql(f"SELECT tbl, horizon FROM {d.mm_table('_mm_purges')}")
    have = {str(tb): int(h or 0) for tb, h in rows}
    return {tb: have.get(tb, 0) for tb in tables}


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


def pullers(conn: Connection, d: Dialect) -> dict[tuple[str, str], tuple[int, str | None, str | None, str | None]]:
    """(peer, table) -> (watermark, last_success_at, first_seen_at, checked_at) of every puller
    recorded; checked_at: the last time a purge reached it (rows written before session 35: the
    last purge, reached or not)."""
    return {
        (r[0], r[1]): (int(r[2] or 0), r[3], r[4], r[5])
        for r in conn.exec_driver_sql(
            f"SELECT peer, tbl, seq2, last_success_at, first_seen_at, checked_at FROM {d.mm_table('_mm_pullers')}"
        )
    }


def record_puller(
    conn: Connection,
    d: Dialect,
    peer: str,
    table: str,
    seq2: int,
    last_success_at: str | None,
    first_seen_at: str | None,
    checked_at: str | None,
    *,
    new: bool,
) -> None:
    """Write what was read of a puller: a `new` row, or the update of the recorded one (its
    first_seen_at stays). `checked_at`: the last time a purge reached it (ops/purge.py keeps the
    recorded one while it cannot be reached: how long it has been out of touch decides whether it
    is given up)."""
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


# ---- snapshot horizons -------------------------------------------------------------------------
# A site's snapshot of peer P holds what it pulled from P's change log, by position (pseq), up to
# its watermark. Purge drops the applied rows; the horizon is the highest position that may be
# missing since: above it, every entry pulled is still there (entries of this site's own changes,
# which it never stores, excepted). A snapshot without a row (made by an earlier version, before
# `multimaster init` ran again) holds nothing known: its horizon is its watermark.


def _has_snapshot_horizons(conn: Connection, d: Dialect) -> bool:
    return d.table_kind(conn, _SNAP) is not None


def snapshot_horizon(conn: Connection, d: Dialect, peer: str, table: str) -> int | None:
    """The horizon of this site's snapshot of `peer` for `table`; None when none is recorded."""
    if not _has_snapshot_horizons(conn, d):
        return None
    ph = d.caps.placeholder
    r = conn.exec_driver_sql(f"SELECT horizon FROM {d.mm_table(_SNAP)} WHERE peer = {ph} AND tbl = {ph}", (peer, table)).first()
    return None if r is None else int(r[0])


def ensure_snapshot_horizon(conn: Connection, d: Dialect, peer: str, table: str, position: int) -> None:
    """Record the horizon `position` unless one is recorded (a snapshot being made, or one an
    earlier version made: then `position` is its watermark, below which nothing is known).
    Creates the table on a site installed before it existed (DDL: call it where the transaction
    does DDL anyway, or before any write)."""
    if not _has_snapshot_horizons(conn, d):
        install(conn, d)
    if snapshot_horizon(conn, d, peer, table) is None:
        conn.exec_driver_sql(
            f"INSERT INTO {d.mm_table(_SNAP)} (peer, tbl, horizon) VALUES ({d.ph(3)})", (peer, table, int(position))
        )


def raise_snapshot_horizon(conn: Connection, d: Dialect, peer: str, table: str, position: int) -> None:
    """Entries at positions up to `position` may be gone from the snapshot (purged, or kept in a
    layout no longer current): raise its recorded horizon to it. A snapshot without one stays
    without (its horizon is its watermark, which is past `position`)."""
    if _has_snapshot_horizons(conn, d):
        ph = d.caps.placeholder
        conn.exec_driver_sql(
            f"UPDATE {d.mm_table(_SNAP)} SET horizon = {ph} WHERE peer = {ph} AND tbl = {ph} AND horizon < {ph}",
            (int(position), peer, table, int(position)),
        )


def forget_snapshot_horizons(conn: Connection, d: Dialect, peer: str) -> None:
    """This site no longer keeps a snapshot of `peer`."""
    if _has_snapshot_horizons(conn, d):
        conn.exec_driver_sql(f"DELETE FROM {d.mm_table(_SNAP)} WHERE peer = {d.caps.placeholder}", (peer,))


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_purges``, ``_mm_pullers``, ``_mm_snap_horizons`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_purges", "_mm_pullers", "_mm_snap_horizons", table=table)
