"""MariaDB / MySQL collations: what a text column's collation takes as one value, the collation of
its character set that compares exactly (docs/mysql.md "Collations").

PostgreSQL (deterministic collations), SQLite (BINARY) and multimaster itself (versions, identities,
the planner's key and UNIQUE comparisons) take two texts as one value only when they are the same
characters. A MariaDB column's collation may not: ``utf8mb4_general_ci``, the server's default,
takes 'a' and 'A' (and 'e' and 'é') as one value, and every PAD SPACE collation, ``utf8mb4_bin``
too, takes 'x' and 'x ' as one. A key or UNIQUE column with such a collation refuses the second of
two rows other databases hold side by side.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import Connection

from multimaster.dialects.schema import Collation, Column

__all__ = ["collations", "merges", "exact_sql", "duplicate"]

CASE = "letters differing only in case or accents ('a' and 'A', 'e' and 'é')"
CASE_ONLY = "letters differing only in case ('a' and 'A')"
ACCENTS = "letters differing only in accents ('e' and 'é')"
WEIGHTS = "texts its Unicode rules weigh alike (ignorable characters)"
PAD = "texts differing only in trailing spaces ('x' and 'x ')"


def merges(name: str) -> tuple[str, ...]:
    """What collation `name` takes as one value though the texts differ (empty: it compares
    exactly, byte for byte: a binary collation that does not pad). By MariaDB's and MySQL's
    naming: ``_bin`` binary, ``_ci`` / ``_ai`` case / accent insensitive, ``nopad`` and MySQL's
    ``_0900_`` collations NO PAD, every other one PAD SPACE."""
    n = name.lower()
    out: list[str] = []
    if not n.endswith("_bin") and n != "binary":
        ci, ai, as_ = n.endswith("_ci"), "_ai_" in n or n.endswith("_ai"), "_as_" in n
        if ci and (ai or not as_):  # utf8mb4_general_ci, _unicode_ci, _0900_ai_ci, uca1400_ai_ci
            out.append(CASE)
        elif ci:
            out.append(CASE_ONLY)
        elif ai:
            out.append(ACCENTS)
        else:
            out.append(WEIGHTS)
    if "nopad" not in n and "_0900_" not in n and n != "binary":
        out.append(PAD)
    return tuple(out)


def collations(conn: Connection, table: str) -> dict[str, Collation]:
    """Per text column of `table` (in the current database), its collation, what it takes as one
    value, and the binary collation of its character set, ``<charset>_bin``: the one multimaster's
    own tables use (utf8mb4_bin), which compares exactly but for trailing spaces (PAD SPACE).
    ``utf8mb4_nopad_bin`` (MariaDB) or ``utf8mb4_0900_bin`` (MySQL 8) would keep 'x' and 'x '
    apart too, but the server refuses to compare a column of either with one of multimaster's
    ("Illegal mix of collations", measured on MariaDB 10.11 with a UNIQUE column), and its tables
    hold the keys in utf8mb4_bin anyway."""
    rows = conn.exec_driver_sql(
        "SELECT COLUMN_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLLATION_NAME IS NOT NULL",
        (table,),
    ).all()
    out = {}
    for name, cs, coll in rows:
        m = merges(str(coll))
        clash = (
            f'the server refuses to compare {coll} with multimaster\'s utf8mb4_bin ("Illegal mix of collations", '
            "error 1267): every change of the table would be held"
            if cs == "utf8mb4" and str(coll).endswith("_bin") and coll != "utf8mb4_bin"
            else ""
        )
        out[str(name)] = Collation(str(coll), str(cs), " and ".join(m), m == (PAD,), f"{cs}_bin", clash)
    return out


def exact_sql(table: str, col: Column, quote: Any) -> str:
    """The statement that gives `col` of `table` the exact collation of its character set, the
    rest of its declaration as it is (its type, NOT NULL; a DEFAULT is to be restated by hand)."""
    assert col.collation is not None
    ts = re.sub(r"\s+(CHARACTER SET|CHARSET|COLLATE)\s+\S+", "", col.type_sql, flags=re.IGNORECASE)
    c = col.collation
    return (
        f"ALTER TABLE {quote(table)} MODIFY {quote(col.name)} {ts} CHARACTER SET {c.charset} COLLATE {c.exact}"
        + ("" if col.nullable else " NOT NULL")
        + (" DEFAULT ... (its default, restated)" if col.has_default else "")
    )


_DUP = re.compile(r"Duplicate entry '(.*)' for key '(?:[^']*\.)?([^'.]+)'", re.DOTALL)


def duplicate(e: BaseException) -> tuple[str, str] | None:
    """(the value, the index name) of a duplicate-key error (1062), or None."""
    orig = getattr(e, "orig", None) or e
    args = getattr(orig, "args", ())
    if not args or args[0] != 1062 or len(args) < 2:
        return None
    m = _DUP.search(str(args[1]))
    return (m.group(1), m.group(2)) if m else None
