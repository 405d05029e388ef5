"""``_mm_watermarks``: per peer this site pulls from and table, the last second-order position
pulled (``seq2``) and when."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy.engine import Connection

from multimaster.core.versions import now_iso
from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = [
    "read",
    "read_all",
    "read_locked",
    "find",
    "tables_of",
    "peers_of",
    "added",
    "by_peer",
    "write",
    "ensure",
    "forget",
    "forget_table",
]


def find(conn: Connection, d: Dialect, peer: str, table: str, *, lock: bool = False) -> int | None:
    """The watermark of (peer, table), None when there is no row; `lock`: see :func:`read_locked`."""
    p = d.caps.placeholder
    sql = f"SELECT seq2 FROM {d.mm_table('_mm_watermarks')} WHERE peer = {p} AND tbl = {p}"
    if lock and not d.caps.single_writer:
        sql += " FOR UPDATE"
    r = conn.exec_driver_sql(sql, (peer, table)).first()
    return None if r is None else int(r[0] or 0)


def tables_of(conn: Connection, d: Dialect, peer: str) -> set[str]:
    """The tables with a watermark row for `peer`: those whose link from `peer` is installed here
    (its snapshot made, store/links.py ensure)."""
    sql = f"SELECT tbl FROM {d.mm_table('_mm_watermarks')} WHERE peer = {d.caps.placeholder}"
    return {str(r[0]) for r in conn.exec_driver_sql(sql, (peer,))}


def peers_of(conn: Connection, d: Dialect, table: str) -> set[str]:
    """The peers this site keeps a watermark of `table` for: those it has a snapshot of."""
    if d.table_kind(conn, "_mm_watermarks") is None:
        return set()
    sql = f"SELECT peer FROM {d.mm_table('_mm_watermarks')} WHERE tbl = {d.caps.placeholder}"
    return {str(r[0]) for r in conn.exec_driver_sql(sql, (table,))}


def added(conn: Connection, d: Dialect, peers: Sequence[str]) -> list[str]:
    """The peers of `peers` (in their order) this site holds a snapshot of: those it keeps a
    watermark for (the snapshot and its watermark rows are made and dropped together: init,
    add-site, remove-site). A site the topology file lists before `add-site` added it (docs/
    operations.md "Adding a site", step 2), or whose puller add-site left to be connected on its
    host, has none here yet: it sent nothing here, and a reconcile, relay, retry or purge that
    read its snapshot failed (``no such table: _mm_snap_<table>__<site>``) on every link. Its
    caller has this site's multimaster tables installed (require_installed)."""
    if not peers:
        return []
    have = by_peer(conn, d)
    return [p for p in peers if p in have]


def by_peer(conn: Connection, d: Dialect) -> dict[str, set[str]]:
    """Per peer, the tables this site keeps a watermark of it for (:func:`tables_of` of every
    peer, in one statement)."""
    out: dict[str, set[str]] = {}
    for peer, tb in conn.exec_driver_sql(f"SELECT peer, tbl FROM {d.mm_table('_mm_watermarks')}"):
        out.setdefault(str(peer), set()).add(str(tb))
    return out


def read(conn: Connection, d: Dialect, peer: str, table: str) -> int:
    """The watermark of (peer, table); 0 when nothing was pulled yet."""
    return find(conn, d, peer, table) or 0


def read_all(conn: Connection, d: Dialect, peer: str, tables: Sequence[str]) -> dict[str, int]:
    """:func:`read` of every table of `tables`, in one statement."""
    sql = f"SELECT tbl, seq2 FROM {d.mm_table('_mm_watermarks')} WHERE peer = {d.caps.placeholder}"
    have = {str(tb): int(seq2 or 0) for tb, seq2 in conn.exec_driver_sql(sql, (peer,))}
    return {tb: have.get(tb, 0) for tb in tables}


def read_locked(conn: Connection, d: Dialect, peer: str, table: str) -> int:
    """The watermark of (peer, table), its row locked until this transaction ends: the refresher
    that read it is then the only one to move it, from the value it read. Without the lock, a
    refresher that read it while another one's move was not committed yet moved it afterwards to
    its own end, below the other's: the watermark went back (a purge at the source may already
    have taken what lay between). SQLite's write transaction excludes every other writer."""
    return find(conn, d, peer, table, lock=True) or 0


def write(conn: Connection, d: Dialect, peer: str, table: str, seq2: int) -> None:
    """Set the watermark of (peer, table) to `seq2`, stamped now."""
    sql, params = d.upsert(
        d.mm_table("_mm_watermarks"), {"peer": peer, "tbl": table, "seq2": seq2, "pulled_at": now_iso()}, ("peer", "tbl")
    )
    conn.exec_driver_sql(sql, params)


def ensure(conn: Connection, d: Dialect, peer: str, table: str) -> None:
    """A watermark row for (peer, table), at 0 when new."""
    if find(conn, d, peer, table) is None:
        conn.exec_driver_sql(f"INSERT INTO {d.mm_table('_mm_watermarks')} (peer, tbl, seq2) VALUES ({d.ph(2)}, 0)", (peer, table))


def forget(conn: Connection, d: Dialect, peer: str) -> None:
    """Drop every watermark of `peer` (it no longer is a peer of this site)."""
    conn.exec_driver_sql(f"DELETE FROM {d.mm_table('_mm_watermarks')} WHERE peer = {d.caps.placeholder}", (peer,))


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_watermarks`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_watermarks", table=table)
