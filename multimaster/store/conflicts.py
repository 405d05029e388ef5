"""``_mm_conflicts``: every conflict the planner resolved, with both versions, their values, the
policy and the decision (docs/conflicts.md)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from sqlalchemy.engine import Connection

from multimaster.core.planner import ConflictRecord
from multimaster.dialects.base import Dialect

__all__ = ["record", "count", "count_since", "rows"]

_COLS = (
    "tbl",
    "rid",
    "key",
    "kind",
    "slot",
    "columns",
    "local_ver",
    "local_values",
    "remote_ver",
    "remote_values",
    "policy",
    "decision",
)


def _collist(d: Dialect) -> str:
    """The columns of `_COLS`, `key` quoted (a reserved word in MySQL)."""
    return ", ".join(d.key_col if c == "key" else c for c in _COLS)


def _json(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$hex": bytes(v).hex()}
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def _values(values: Mapping[str, Any] | None) -> str | None:
    return None if values is None else json.dumps({k: _json(v) for k, v in values.items()})


def record(conn: Connection, d: Dialect, conflicts: Sequence[ConflictRecord], key_of: Mapping[str, Any]) -> None:
    """Log the planner's conflict records; `key_of` gives each identity's key after the plan."""
    if not conflicts:
        return
    conn.exec_driver_sql(
        f"INSERT INTO {d.mm_table('_mm_conflicts')} ({_collist(d)}) VALUES ({d.ph(len(_COLS))})",
        [
            (
                c.table,
                c.rid,
                None if key_of.get(c.rid) is None else str(key_of.get(c.rid)),
                c.kind,
                c.slot,
                json.dumps(list(c.columns)),
                c.local_ver,
                _values(c.local_values),
                c.remote_ver,
                _values(c.remote_values),
                c.policy,
                c.decision,
            )
            for c in conflicts
        ],
    )


def count(conn: Connection, d: Dialect) -> int:
    """Conflicts recorded at this site."""
    return int(conn.exec_driver_sql(f"SELECT count(*) FROM {d.mm_table('_mm_conflicts')}").scalar() or 0)


def count_since(conn: Connection, d: Dialect, since: str) -> int:
    """Conflicts recorded at or after `since` (UTC 'YYYY-MM-DDTHH:MM:SS'; detected_at sorts as text)."""
    sql = f"SELECT count(*) FROM {d.mm_table('_mm_conflicts')} WHERE detected_at >= {d.caps.placeholder}"
    return int(conn.exec_driver_sql(sql, (since,)).scalar() or 0)


def rows(conn: Connection, d: Dialect, table: str | None, limit: int) -> list[Any]:
    """The last `limit` conflicts (all with 0), of `table` only if given, newest first, as mappings."""
    where = f"WHERE tbl = {d.caps.placeholder}" if table else ""
    params = (table,) if table else ()
    lim = f" LIMIT {int(limit)}" if limit else ""
    return [
        r._mapping
        for r in conn.exec_driver_sql(
            f"SELECT id, detected_at, tbl, rid, {d.key_col}, kind, slot, columns, local_ver, local_values, remote_ver, "
            f"remote_values, policy, decision FROM {d.mm_table('_mm_conflicts')} {where} ORDER BY id DESC{lim}",
            params,
        )
    ]
