"""``_mm_conflicts``: every conflict the planner resolved, with both versions, the values of the
slot, both row images (``local_row``: the row here before the change; ``remote_row``: the
columns the incoming change carried), the policy and the decision, and for a slot whose policy
chooses among concurrent heads every head it chose among (``heads``, version -> values) (docs/conflicts.md).

The table is created by each dialect's site template; :func:`install` adds the columns later
versions brought to a table created before them (``multimaster init`` runs it on every site)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from sqlalchemy.engine import Connection

from multimaster.core.planner import ConflictRecord
from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = ["install", "record", "count", "count_since", "count_matching", "rows", "expired", "delete", "forget_table"]

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
    "local_row",
    "remote_row",
    "heads",
)

#: columns added after the first release, each with the column whose type it takes
_ADDED = (("local_row", "local_values"), ("remote_row", "remote_values"), ("heads", "remote_values"))


def install(conn: Connection, d: Dialect) -> list[str]:
    """Add the columns of `_ADDED` missing from an existing conflict log, each with the type of
    the column it mirrors (idempotent). Returns the columns added."""
    from sqlalchemy import inspect

    if {c for c, _ in _ADDED} <= d.existing_columns(conn, d.mm_table("_mm_conflicts")):
        return []  # (the site templates create them; the inspector costs init ~30 ms a site)
    name = d.mm_table("_mm_conflicts").rsplit(".", 1)[-1]
    cols = {c["name"]: c for c in inspect(conn).get_columns(name, schema=d.caps.bookkeeping_schema)}
    added = []
    for col, like in _ADDED:
        if col not in cols:
            typ = cols[like]["type"].compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {d.mm_table('_mm_conflicts')} ADD COLUMN {col} {typ}")
            added.append(col)
    return added


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
                _values(c.local_row),
                _values(c.remote_row),
                None if c.heads is None else json.dumps({v: {k: _json(x) for k, x in h.items()} for v, h in c.heads.items()}),
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


def _where(d: Dialect, table: str | None, since: str | None, kind: str | None) -> tuple[list[str], list[Any]]:
    """The conditions (and their parameters) of a listing of `table`, since `since`, of `kind`."""
    ph = d.caps.placeholder
    conds: list[str] = []
    params: list[Any] = []
    for col, v in (("tbl", table), ("kind", kind)):
        if v is not None:
            conds.append(f"{col} = {ph}")
            params.append(v)
    if since is not None:
        conds.append(f"detected_at >= {ph}")
        params.append(since)
    return conds, params


def count_matching(conn: Connection, d: Dialect, table: str | None, since: str | None = None, kind: str | None = None) -> int:
    """How many conflicts :func:`rows` lists with these filters and no limit."""
    conds, params = _where(d, table, since, kind)
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    sql = f"SELECT count(*) FROM {d.mm_table('_mm_conflicts')}{where}"
    return int(conn.exec_driver_sql(sql, tuple(params)).scalar() or 0)


def rows(
    conn: Connection,
    d: Dialect,
    table: str | None,
    limit: int,
    *,
    since: str | None = None,
    kind: str | None = None,
    ids: Sequence[int] | None = None,
) -> list[Any]:
    """The last `limit` conflicts (all with 0), newest first, as mappings; only of `table`, of
    `kind`, recorded at or after `since` (UTC 'YYYY-MM-DDTHH:MM:SS'), with an id in `ids`, when
    given."""
    conds, params = _where(d, table, since, kind)
    if ids is not None:
        if not ids:
            return []
        conds.append(f"id IN ({d.ph(len(ids))})")
        params.extend(int(i) for i in ids)
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    lim = f" LIMIT {int(limit)}" if limit else ""
    return [
        r._mapping
        for r in conn.exec_driver_sql(
            f"SELECT id, detected_at, tbl, rid, {d.key_col}, kind, slot, columns, local_ver, local_values, remote_ver, "
            f"remote_values, policy, decision, local_row, remote_row, heads FROM {d.mm_table('_mm_conflicts')} {where} "
            f"ORDER BY id DESC{lim}",
            tuple(params),
        )
    ]


def expired(conn: Connection, d: Dialect, table: str, before: str) -> list[tuple[int, str | None, str]]:
    """(id, local_ver, remote_ver) of the conflicts of `table` recorded before `before`."""
    ph = d.caps.placeholder
    return [
        (int(r[0]), r[1], r[2])
        for r in conn.exec_driver_sql(
            f"SELECT id, local_ver, remote_ver FROM {d.mm_table('_mm_conflicts')} WHERE tbl = {ph} AND detected_at < {ph}",
            (table, before),
        )
    ]


def delete(conn: Connection, d: Dialect, ids: Sequence[int]) -> int:
    """Delete the conflicts `ids`; returns how many."""
    if ids:
        conn.exec_driver_sql(f"DELETE FROM {d.mm_table('_mm_conflicts')} WHERE id = {d.caps.placeholder}", [(i,) for i in ids])
    return len(ids)


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_conflicts`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_conflicts", table=table)
