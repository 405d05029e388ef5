"""The statements every store module shares: forget a table (`multimaster uninstall --table`), and
read one row of each of several SELECTs in one statement (`status` over a WAN)."""

from __future__ import annotations

from typing import Any, Sequence

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


#: at most this many SELECTs joined in one statement (SQLite allows 500 by default)
UNION_MAX = 100


def each_one(conn: Connection, selects: Sequence[tuple[str, Sequence[Any]]]) -> list[tuple[Any, ...]]:
    """The one row each of `selects` (SQL, parameters) returns — an aggregate without GROUP BY, as
    ``SELECT count(*), min(ver) FROM t`` — read together, UNION ALL, in one statement per
    UNION_MAX of them instead of one each (over a WAN each statement is a round trip); the rows
    in the order of `selects`. Every SELECT must give the same number of columns, of one type each."""
    out: list[tuple[Any, ...]] = []
    for start in range(0, len(selects), UNION_MAX):
        part = selects[start : start + UNION_MAX]
        sql = " UNION ALL ".join(f"SELECT {i} AS mm_i, q.* FROM ({s}) q" for i, (s, _) in enumerate(part))
        args = [a for _, ps in part for a in ps]
        rows = sorted((tuple(r) for r in conn.exec_driver_sql(sql, tuple(args))), key=lambda r: int(r[0]))
        if [int(r[0]) for r in rows] != list(range(len(part))):  # (an aggregate always gives one row)
            raise AssertionError(f"each_one: {len(rows)} row(s) for {len(part)} SELECTs")
        out += [r[1:] for r in rows]
    return out
