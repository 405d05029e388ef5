"""PostgreSQL columns that take two texts as one value (docs/postgresql.md "Collations").

PostgreSQL's deterministic collations (every one but those made with ``deterministic = false``)
take two texts as equal only when they are the same characters, as SQLite's BINARY and
multimaster do. Two kinds of column do not: ``citext`` (the extension's type compares ``lower()``
of each side: 'a' and 'A', 'É' and 'é' are one value) and a column with a nondeterministic ICU
collation (``CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic =
false)``: case, at ``ks-level1`` accents too). A key or UNIQUE column of either refuses the second
of two rows the other databases keep apart.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy.engine import Connection

from multimaster.dialects.schema import Collation, Column

__all__ = ["collations", "exact_sql", "duplicate", "CITEXT", "icu_merges"]

CITEXT = "letters differing only in case ('a' and 'A', 'É' and 'é': citext compares lower() of each)"


def icu_merges(locale: str) -> str:
    """What a nondeterministic ICU collation of `locale` takes as one value, from its strength
    (``ks-level1``: base letters only; ``ks-level2``: case ignored; ``ka-shifted``: punctuation
    and spaces ignored)."""
    loc = locale.lower()
    out = []
    if "ks-level1" in loc or "colstrength=primary" in loc:
        out.append("letters differing only in case or accents ('a' and 'A', 'e' and 'é')")
    elif "ks-level2" in loc or "colstrength=secondary" in loc:
        out.append("letters differing only in case ('a' and 'A')")
    if "ka-shifted" in loc or "alternate=shifted" in loc:
        out.append("texts differing only in spaces and punctuation")
    if not out:
        out.append(f"texts its ICU rules (locale {locale}) weigh alike (canonically equivalent forms, ignorable characters)")
    return " and ".join(out)


def collations(conn: Connection, table: str, quote: Any) -> dict[str, Collation]:
    """Per column of `table` that takes different texts as one value: citext (or a domain over it),
    or a nondeterministic collation. The fix named: citext to text; a nondeterministic collation
    to "C" (equality by bytes; any deterministic collation compares equality exactly)."""
    rows = conn.exec_driver_sql(
        "SELECT a.attname, t.typname, bt.typname, c.collname, c.collisdeterministic, to_jsonb(c)::text "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type bt ON bt.oid = t.typbasetype "
        "LEFT JOIN pg_collation c ON c.oid = a.attcollation "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
        (quote(table),),
    ).all()
    out: dict[str, Collation] = {}
    for name, typ, base, coll, deterministic, cj in rows:
        if "citext" in (typ, base):
            out[str(name)] = Collation("citext", "", CITEXT, False, "text")
        elif coll is not None and deterministic is False:
            cj = json.loads(cj) if cj else {}
            locale = str(cj.get("colliculocale") or cj.get("colllocale") or cj.get("collcollate") or "")
            out[str(name)] = Collation(str(coll), "", icu_merges(locale), False, '"C"')
    for name, coll in _index_collations(conn, table, quote).items():
        out.setdefault(name, coll)  # the column's own collation merges already: its fix comes first
    return out


def _index_collations(conn: Connection, table: str, quote: Any) -> dict[str, Collation]:
    """Per column of `table` that a unique index compares with a nondeterministic collation of its
    own (``CREATE UNIQUE INDEX i ON t (c COLLATE ci)``: ``pg_index.indcollation``, key columns
    only, not INCLUDE ones): that collation, the index named, and its definition without it."""
    rows = conn.exec_driver_sql(
        "SELECT a.attname, c.collname, to_jsonb(c)::text, ic.relname, pg_get_indexdef(i.indexrelid) "
        "FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) WITH ORDINALITY AS k(attnum, coll, n) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "JOIN pg_collation c ON c.oid = k.coll JOIN pg_class ic ON ic.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND k.n <= i.indnkeyatts AND NOT c.collisdeterministic "
        "AND c.oid <> a.attcollation ORDER BY ic.relname, k.n",
        (quote(table),),
    ).all()
    loose: dict[str, set[str]] = {}  # index -> its nondeterministic collations
    for _name, coll, _cj, index, _def in rows:
        loose.setdefault(str(index), set()).add(str(coll))
    out: dict[str, Collation] = {}
    for name, coll, cj, index, indexdef in rows:
        cj = json.loads(cj) if cj else {}
        locale = str(cj.get("colliculocale") or cj.get("colllocale") or cj.get("collcollate") or "")
        # the index made again without them (its deterministic COLLATEs kept)
        named = "|".join(rf'"{re.escape(c)}"|{re.escape(c)}\b' for c in sorted(loose[str(index)]))
        plain = re.sub(rf"\s+COLLATE\s+(?:[\w\"]+\.)?(?:{named})", "", str(indexdef))
        out.setdefault(str(name), Collation(str(coll), "", icu_merges(locale), False, '"C"', index=str(index), index_sql=plain))
    return out


def exact_sql(table: str, col: Column, quote: Any) -> str:
    """The ALTER that makes `col` compare exactly: citext becomes text, a nondeterministic
    collation "C" (the column's type kept)."""
    assert col.collation is not None
    if col.collation.index:  # the unique index names the collation, not the column
        return f"DROP INDEX {quote(col.collation.index)}; {col.collation.index_sql}"
    if col.collation.name == "citext":
        return f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(col.name)} TYPE text"
    ts = col.type_sql if col.type_sql and "CITEXT" not in col.type_sql.upper() else "text"
    ts = re.sub(r"\s+COLLATE\s+\S+", "", ts, flags=re.IGNORECASE)
    return f'ALTER TABLE {quote(table)} ALTER COLUMN {quote(col.name)} TYPE {ts} COLLATE "C"'


_DUP = re.compile(r"Key \((.+?)\)=\((.*)\) already exists", re.DOTALL)


def duplicate(e: BaseException) -> tuple[list[str], str] | None:
    """(the columns, the value) of a unique violation (23505) whose detail names them, or None."""
    orig = getattr(e, "orig", None) or e
    if getattr(orig, "sqlstate", None) != "23505":
        return None
    diag = getattr(orig, "diag", None)
    detail = str(getattr(diag, "message_detail", None) or orig)
    m = _DUP.search(detail)
    if m is None:
        return None
    return [c.strip().strip('"') for c in m.group(1).split(",")], m.group(2)
