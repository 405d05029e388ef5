"""``_mm_schemas``: per replicated table, every schema version this site's capture has written
(docs/design/schema-changes.md). Version *v* is the list of replicated columns (sorted by name,
with type, nullability and default) the capture triggers of that version were made for: bit *i* of
an entry's mask, written with ``sv = v``, is the *i*-th of them. Versions are only ever added; the
highest is the current one, and ``sig`` the table's catalog signature it was made from (a cheap
way to notice that the table changed since, Dialect.table_signature: the columns, whether its capture triggers exist,
and on MariaDB and SQLite a digest of their text).

Peers read this table with the change log, to carry each entry by column name.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from sqlalchemy.engine import Connection

from multimaster.core.schemas import Col
from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = [
    "install",
    "exists",
    "record",
    "set_sig",
    "mark_capturing",
    "capturing",
    "current",
    "current_versions",
    "current_sigs",
    "current_heads",
    "versions",
    "layouts",
    "layouts_all",
    "dropped",
    "dropped_of",
    "to_json",
    "forget_table",
]

#: a signature no table has: its capture is being made again (mark_capturing)
_CAPTURING = "capture being made again: "


def _t(d: Dialect) -> str:
    return d.mm_table("_mm_schemas")


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {_t(d)} (tbl VARCHAR(64) NOT NULL, version INTEGER NOT NULL, columns TEXT NOT NULL, "
        "sig TEXT NOT NULL, PRIMARY KEY (tbl, version))"
    )


def exists(conn: Connection, d: Dialect) -> bool:
    return d.table_kind(conn, "_mm_schemas") is not None


def to_json(cols: list[Col]) -> str:
    return json.dumps([[c.name, c.type_sql, c.nullable, c.has_default] for c in cols])


def _cols(text: str) -> list[Col]:
    return [Col(str(c[0]), str(c[1]), bool(c[2]), bool(c[3])) for c in json.loads(text)]


def record(conn: Connection, d: Dialect, table: str, version: int, cols: list[Col], sig: str) -> None:
    """Add version `version` of `table` (its columns `cols`, sorted by name; the table's `sig`)."""
    conn.exec_driver_sql(
        f"INSERT INTO {_t(d)} (tbl, version, columns, sig) VALUES ({d.ph(4)})", (table, int(version), to_json(cols), sig)
    )


def set_sig(conn: Connection, d: Dialect, table: str, version: int, sig: str) -> None:
    """Record that `table`'s catalog signature is `sig` with version `version` (followed)."""
    p = d.caps.placeholder
    conn.exec_driver_sql(f"UPDATE {_t(d)} SET sig = {p} WHERE tbl = {p} AND version = {p}", (sig, table, int(version)))


def mark_capturing(conn: Connection, d: Dialect, table: str, version: int, missing: list[str], sig: str) -> None:
    """Record, before `table`'s capture triggers `missing` are made again, that the follow making
    them has not captured the rows inserted meanwhile nor opened the gap yet; `sig`: the signature
    recorded before. Where DDL commits at once (MariaDB) the triggers' DDL commits this with them,
    and the triggers outlive a rollback of the rest of the follow (a lock wait, a crash): the table
    then reads as changed (no table has this signature), and the next follow finds the triggers
    that were missing here (`capturing`) though they exist, and finishes (set_sig)."""
    set_sig(conn, d, table, version, _CAPTURING + json.dumps([sorted(missing), sig]))


def capturing(sig: str) -> tuple[list[str], str]:
    """(the capture triggers a follow found missing and had not finished making again, the
    signature recorded before it) of a recorded signature `sig` (mark_capturing); ([], `sig`) for
    any other signature."""
    if not sig.startswith(_CAPTURING):
        return [], sig
    missing, before = json.loads(sig[len(_CAPTURING) :])
    return [str(m) for m in missing], str(before)


def current(conn: Connection, d: Dialect, table: str) -> tuple[int, list[Col], str] | None:
    """(version, columns, sig) of `table`'s current version, None when it has none."""
    p = d.caps.placeholder
    r = conn.exec_driver_sql(
        f"SELECT version, columns, sig FROM {_t(d)} WHERE tbl = {p} ORDER BY version DESC LIMIT 1", (table,)
    ).first()
    return None if r is None else (int(r[0]), _cols(r[1]), str(r[2]))


def current_versions(conn: Connection, d: Dialect) -> dict[str, int]:
    """The number of each table's current version, in one statement (tables without one are absent)."""
    return {str(tb): int(v) for tb, v in conn.exec_driver_sql(f"SELECT tbl, max(version) FROM {_t(d)} GROUP BY tbl")}


def current_sigs(conn: Connection, d: Dialect) -> dict[str, str]:
    """The recorded signature (`sig`) of each table's current version, in one statement."""
    return {tb: sig for tb, (_v, sig) in current_heads(conn, d).items()}


def current_heads(conn: Connection, d: Dialect) -> dict[str, tuple[int, str]]:
    """(number, recorded signature) of each table's current version, in one statement."""
    t = _t(d)
    sql = f"SELECT s.tbl, s.version, s.sig FROM {t} s WHERE s.version = (SELECT max(m.version) FROM {t} m WHERE m.tbl = s.tbl)"
    return {str(tb): (int(v), str(sig)) for tb, v, sig in conn.exec_driver_sql(sql)}


def current_version(conn: Connection, d: Dialect, table: str) -> int | None:
    """The number of `table`'s current version (None when it has none)."""
    v = conn.exec_driver_sql(f"SELECT max(version) FROM {_t(d)} WHERE tbl = {d.caps.placeholder}", (table,)).scalar()
    return None if v is None else int(v)


def versions(conn: Connection, d: Dialect, table: str) -> dict[int, list[Col]]:
    """Every version of `table`: version -> its columns."""
    p = d.caps.placeholder
    return {
        int(v): _cols(c)
        for v, c in conn.exec_driver_sql(f"SELECT version, columns FROM {_t(d)} WHERE tbl = {p} ORDER BY version", (table,))
    }


def layouts(conn: Connection, d: Dialect, table: str) -> dict[int, list[str]] | None:
    """Every version of `table` as its column names (the layout of the entries written with it);
    None when this site keeps no versions (installed by an earlier multimaster, before init ran)."""
    if not exists(conn, d):
        return None
    out = {v: [c.name for c in cols] for v, cols in versions(conn, d, table).items()}
    return out or None


def layouts_all(conn: Connection, d: Dialect, tables: Sequence[str]) -> dict[str, dict[int, list[str]] | None]:
    """:func:`layouts` of each of `tables`, in one statement."""
    if not exists(conn, d):
        return {tb: None for tb in tables}
    out: dict[str, dict[int, list[str]]] = {}
    for tb, v, c in conn.exec_driver_sql(f"SELECT tbl, version, columns FROM {_t(d)} ORDER BY tbl, version"):
        out.setdefault(str(tb), {})[int(v)] = [col.name for col in _cols(c)]
    return {tb: out.get(tb) or None for tb in tables}


def dropped(conn: Connection, d: Dialect, table: str) -> frozenset[str]:
    """The columns some earlier version of `table` had and the current one has not."""
    return dropped_of(versions(conn, d, table))


def dropped_of(vs: dict[int, list[Col]]) -> frozenset[str]:
    """:func:`dropped`, of a table's versions read already (:func:`versions`)."""
    if not vs:
        return frozenset()
    cur = {c.name for c in vs[max(vs)]}
    return frozenset(c.name for cols in vs.values() for c in cols if c.name not in cur)


def column_types(conn: Connection, d: Dialect, table: str) -> dict[str, Any]:
    """The type each column had in the latest version that had it (for messages)."""
    out: dict[str, Any] = {}
    for _v, cols in sorted(versions(conn, d, table).items()):
        for c in cols:
            out[c.name] = c.type_sql
    return out


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_schemas`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_schemas", table=table)
