"""``_mm_links``: per peer this site pulls from, the last success, the last error and running
totals; and a link's lag read from the logs and snapshots (for status)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sqlalchemy.engine import Connection

from multimaster.core.waits import NEEDS_ACTION, Wait
from multimaster.dialects.base import Dialect
from multimaster.store import _rows, origins, watermarks

__all__ = [
    "ensure",
    "stats",
    "error",
    "row",
    "forget",
    "unapplied",
    "unapplied_all",
    "waiting",
    "waiting_all",
    "waiting_from",
    "parked",
    "parked_all",
]

_ROW = ("last_success_at", "last_error", "last_error_at", "pulled", "applied", "conflicts")


def ensure(conn: Connection, d: Dialect, peer: str, table: str) -> None:
    """The link from `peer` exists for `table`: its watermark row and its statistics row."""
    watermarks.ensure(conn, d, peer, table)
    links = d.mm_table("_mm_links")
    if conn.exec_driver_sql(f"SELECT 1 FROM {links} WHERE peer = {d.caps.placeholder}", (peer,)).first() is None:
        conn.exec_driver_sql(f"INSERT INTO {links} (peer) VALUES ({d.caps.placeholder})", (peer,))


def stats(conn: Connection, d: Dialect, peer: str, pulled: int, applied: int, conflicts: int, at: str) -> None:
    """A successful refresh from `peer` at `at`: add its counts. The last error stays, without its
    NEEDS_ACTION mark (the times are to the second: a success and an error may share one, and the
    mark then tells that the error came last)."""
    p = d.caps.placeholder
    conn.exec_driver_sql(
        f"UPDATE {d.mm_table('_mm_links')} SET pulled = pulled + {p}, applied = applied + {p}, conflicts = conflicts + {p}, "
        f"last_success_at = {p}, last_error = CASE WHEN last_error LIKE {p} THEN SUBSTR(last_error, {p}) "
        f"ELSE last_error END WHERE peer = {p}",
        (pulled, applied, conflicts, at, NEEDS_ACTION + "%", len(NEEDS_ACTION) + 1, peer),
    )


def error(conn: Connection, d: Dialect, peer: str, message: str, at: str) -> None:
    """A failed refresh from `peer` at `at` (the message is cut to 2,000 characters)."""
    p = d.caps.placeholder
    conn.exec_driver_sql(
        f"UPDATE {d.mm_table('_mm_links')} SET last_error = {p}, last_error_at = {p} WHERE peer = {p}", (message[:2000], at, peer)
    )


def row(conn: Connection, d: Dialect, peer: str) -> dict[str, Any]:
    """The link's row: last_success_at, last_error, last_error_at, pulled, applied, conflicts
    (all None when there is none)."""
    r = conn.exec_driver_sql(
        f"SELECT {', '.join(_ROW)} FROM {d.mm_table('_mm_links')} WHERE peer = {d.caps.placeholder}", (peer,)
    ).first()
    return dict(zip(_ROW, r)) if r else dict.fromkeys(_ROW)


def forget(conn: Connection, d: Dialect, peer: str) -> None:
    """Drop the link from `peer` and its watermarks."""
    watermarks.forget(conn, d, peer)
    conn.exec_driver_sql(f"DELETE FROM {d.mm_table('_mm_links')} WHERE peer = {d.caps.placeholder}", (peer,))


def unapplied(conn: Connection, d: Dialect, table: str, peer: str) -> tuple[int, str | None]:
    """Changes of `peer` in this site's snapshot not applied yet: how many, the oldest version."""
    r = conn.exec_driver_sql(f"SELECT count(*), min(ver) FROM {d.obj(table, peer).snap} WHERE applied NOT IN (1, 3)").first()
    return (int(r[0] or 0), r[1]) if r else (0, None)


def unapplied_all(conn: Connection, d: Dialect, tables: Sequence[str], peer: str) -> dict[str, tuple[int, str | None]]:
    """:func:`unapplied` of every table of `tables`, in one statement."""
    sql = "SELECT count(*) AS n, min(ver) AS v FROM {} WHERE applied NOT IN (1, 3)"
    rows = _rows.each_one(conn, [(sql.format(d.obj(tb, peer).snap), ()) for tb in tables])
    return {tb: (int(r[0] or 0), r[1]) for tb, r in zip(tables, rows)}


def waiting_all(
    conn: Connection, d: Dialect, watermarks_: Mapping[str, int], puller: str, have: Mapping[str, Mapping[str, str]] | None = None
) -> dict[str, tuple[int, str | None]]:
    """:func:`waiting` of every table of `watermarks_` (table -> the puller's watermark; `have`:
    per table, as there), in one statement."""
    selects = [_waiting_sql(d, tb, wm, puller, (have or {}).get(tb)) for tb, wm in watermarks_.items()]
    rows = _rows.each_one(conn, selects)
    return {tb: (int(r[0] or 0), None if r[1] is None else str(r[1])) for tb, r in zip(watermarks_, rows)}


def _waiting_sql(
    d: Dialect, table: str, watermark: int, puller: str, have: Mapping[str, str] | None, origin: str | None = None
) -> tuple[str, list[Any]]:
    o = d.obj(table)
    p = d.caps.placeholder
    had, had_args = origins.beyond(d, have)
    only, only_args = (f" AND l.origin = {p}", [origin]) if origin is not None else ("", [])
    sql = (
        f"SELECT count(*) AS n, min(l.ver) AS v, min(l2.seq2) AS s FROM {o.log2} l2 JOIN {o.log} l ON l.seq = l2.seq "
        f"WHERE l2.seq2 > {p} AND l2.op = 'A' AND l.origin <> {p}{had}{only}"
    )
    return sql, [watermark, puller, *had_args, *only_args]


def waiting(
    conn: Connection,
    d: Dialect,
    table: str,
    watermark: int,
    puller: str,
    have: Mapping[str, str] | None = None,
    origin: str | None = None,
) -> tuple[int, str | None]:
    """Changes in this site's logs past `watermark` that `puller` has not pulled yet: how many, the
    oldest version. `have` (origin -> the highest version of it `puller` applied): entries at or
    below it are not counted (in a mesh, relayed changes the puller has: they travel as positions
    only, engine/pull.py read_entries). `origin`: only that origin's changes."""
    n, oldest, _ = waiting_from(conn, d, table, watermark, puller, have, origin)
    return n, oldest


def waiting_from(
    conn: Connection,
    d: Dialect,
    table: str,
    watermark: int,
    puller: str,
    have: Mapping[str, str] | None = None,
    origin: str | None = None,
) -> tuple[int, str | None, int | None]:
    """:func:`waiting`, and the lowest position of those changes (None: none)."""
    sql, args = _waiting_sql(d, table, watermark, puller, have, origin)
    r = conn.exec_driver_sql(sql, tuple(args)).first()
    if not r:
        return 0, None, None
    return int(r[0] or 0), None if r[1] is None else str(r[1]), None if r[2] is None else int(r[2])


def parked(conn: Connection, d: Dialect, table: str, peer: str) -> Wait | None:
    """The oldest change of `peer` in this site's snapshot of `table` that waits (``applied = 2``:
    for its row, a referenced row or an earlier change of its origin) and how many wait; None when
    none does."""
    snap = d.obj(table, peer).snap
    r = conn.exec_driver_sql(f"SELECT count(*), min(ver) FROM {snap} WHERE applied = 2").first()
    return _parked(conn, d, table, peer, r)


def parked_all(conn: Connection, d: Dialect, tables: Sequence[str], peer: str) -> list[Wait | None]:
    """:func:`parked` of every table of `tables`, in their order: the counts in one statement (the
    oldest waiting change then read for the tables where some wait)."""
    sql = "SELECT count(*) AS n, min(ver) AS v FROM {} WHERE applied = 2"
    rows = _rows.each_one(conn, [(sql.format(d.obj(tb, peer).snap), ()) for tb in tables])
    return [_parked(conn, d, tb, peer, r) for tb, r in zip(tables, rows)]


def _parked(conn: Connection, d: Dialect, table: str, peer: str, r: Any) -> Wait | None:
    """parked, given the count and oldest version of the changes waiting (`r`)."""
    if not r or not r[0]:
        return None
    snap = d.obj(table, peer).snap
    ph = d.caps.placeholder
    first = conn.exec_driver_sql(f"SELECT origin, op, rid FROM {snap} WHERE applied = 2 AND ver = {ph}", (r[1],)).first()
    if first is None:
        return None
    known = conn.exec_driver_sql(f"SELECT 1 FROM {d.obj(table).shadow} WHERE rid = {ph}", (first[2],)).first() is not None
    return Wait(int(r[0]), table, str(r[1]), str(first[0]), str(first[1]), str(first[2]), known)
