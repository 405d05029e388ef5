"""SQLite collations on a key or UNIQUE column (docs/sqlite.md "Collations").

SQLite compares text with BINARY unless a column or an index says otherwise: ``COLLATE NOCASE``
takes 'a' and 'A' as one value (ASCII letters only: 'é' and 'É' stay apart), ``COLLATE RTRIM``
'x' and 'x '. A PRIMARY KEY or UNIQUE index over such a column refuses the second of two rows that
PostgreSQL (deterministic collations) and multimaster keep apart. What the uniqueness uses is the
index's collation (``PRAGMA index_xinfo``: the column's own unless the index names another), so
that is what is read. SQLite cannot change a column's collation in place: the table is made again.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import Connection

from multimaster.dialects.mysql.collations import PAD
from multimaster.dialects.schema import Collation, Column

__all__ = ["collations", "exact_sql", "unique_failed", "NOCASE"]

NOCASE = "ASCII letters differing only in case ('a' and 'A'; not 'é' and 'É')"

_MERGES = {"NOCASE": NOCASE, "RTRIM": PAD}


def collations(conn: Connection, table: str, quote) -> dict[str, Collation]:  # type: ignore[no-untyped-def]
    """Per column of `table` in its PRIMARY KEY or a UNIQUE index, the collation that index compares
    it with, where that is NOCASE or RTRIM (BINARY and collations an application registers on its
    own connections are left out: the first compares exactly, the second are unknown here)."""
    out: dict[str, Collation] = {}
    for _seq, name, unique, _origin, _partial in conn.exec_driver_sql(f"PRAGMA index_list({quote(table)})").all():
        if not unique:
            continue
        for row in conn.exec_driver_sql(f"PRAGMA index_xinfo({quote(name)})").all():
            col, coll, key = row[2], str(row[4] or "BINARY").upper(), row[5]
            if not key or col is None or coll not in _MERGES or col in out:
                continue
            out[str(col)] = Collation(coll, "", _MERGES[coll], False, "BINARY")
    return out


def exact_sql(table: str, col: Column) -> str:
    """SQLite cannot change a column's collation (ALTER TABLE cannot): the table is made again."""
    assert col.collation is not None
    c = col.collation.name
    return (
        f"SQLite cannot change a column's collation in place: make table {table} again without COLLATE {c} on "
        f"{col.name} (and on any UNIQUE index over it): CREATE TABLE {table}_new (... {col.name} {col.type_sql or 'TEXT'} ..., "
        f"no COLLATE {c}); INSERT INTO {table}_new SELECT * FROM {table}; DROP TABLE {table}; "
        f"ALTER TABLE {table}_new RENAME TO {table}; its indexes and triggers made again"
    )


_FAILED = re.compile(r"UNIQUE constraint failed: (.+)$")


def unique_failed(e: BaseException) -> list[str] | None:
    """The columns named by SQLite's "UNIQUE constraint failed: t.a, t.b", or None."""
    m = _FAILED.search(str(getattr(e, "orig", None) or e).strip())
    if m is None:
        return None
    return [p.strip().split(".", 1)[-1] for p in m.group(1).split(",")]
