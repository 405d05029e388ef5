"""The one statement every store module uses to forget a table (`multimaster uninstall --table`)."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect


def forget(conn: Connection, d: Dialect, *objs: str, table: str) -> dict[str, int]:
    """Delete the rows of `table` (column ``tbl``) from each bookkeeping table of `objs` that
    exists (a site installed by an earlier version may lack one); the rows deleted per object,
    those with none left out."""
    out = {}
    for obj in objs:
        if d.table_kind(conn, obj) is None:
            continue
        n = conn.exec_driver_sql(f"DELETE FROM {d.mm_table(obj)} WHERE tbl = {d.caps.placeholder}", (table,)).rowcount
        if n:
            out[obj] = int(n)
    return out
