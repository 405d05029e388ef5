"""What verify reads at each site: replicated columns, one canonical type per column, the read SQL.

Reflection uses SQLAlchemy (no Spark). The canonical type of a column is decided from every site's
declared type, so an INTEGER column at a SQLite site and a BIGINT at a PostgreSQL site hash alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import types as T

from multimaster.errors import SchemaError
from multimaster.spark.jdbc import JdbcSource

__all__ = ["ColumnSpec", "TablePlan", "reflect_table", "read_sql", "canonical_kind"]

# canonical kinds -> Spark SQL type names
SPARK_TYPE = {
    "long": "BIGINT",
    "double": "DOUBLE",
    "decimal": "DECIMAL(38,10)",
    "boolean": "BOOLEAN",
    "string": "STRING",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "binary": "BINARY",
    "json": "STRING",  # compared by value: its text made canonical (compare.py)
}


def canonical_kind(t: T.TypeEngine) -> str:
    if isinstance(t, T.JSON):
        return "json"
    if isinstance(t, T.Boolean):
        return "boolean"
    if isinstance(t, T.Integer):
        return "long"
    if isinstance(t, T.Float):
        return "double"
    if isinstance(t, T.Numeric):
        return "decimal" if getattr(t, "asdecimal", True) else "double"
    if isinstance(t, T.DateTime):
        return "timestamp"
    if isinstance(t, T.Date):
        return "date"
    if isinstance(t, (T.LargeBinary, T._Binary)):
        return "binary"
    name = type(t).__name__.upper()
    if name in ("DOUBLE", "DOUBLE_PRECISION", "REAL"):
        return "double"
    return "string"


def _merge(kinds: list[str]) -> str:
    s = set(kinds)
    if len(s) == 1:
        return kinds[0]
    if s <= {"long", "boolean"}:
        return "boolean"
    if s <= {"long", "double", "decimal", "boolean"}:
        return "double" if "double" in s else "decimal"
    if s <= {"date", "timestamp"}:
        return "timestamp"
    if s <= {"json", "string"}:  # JSON at one site, its text at another: compared as JSON
        return "json"
    return "string"


@dataclass
class ColumnSpec:
    name: str
    alias: str  # v0, v1 ... in every query, so user names never clash or need quoting in Spark
    kind: str  # canonical kind


@dataclass
class TablePlan:
    table: str
    key: str
    key_kind: str  # 'long' (numeric key: range partitions) or 'string'
    columns: list[ColumnSpec]
    shadow_columns: dict[str, list[str]]  # site -> shadow column names (for repair)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def _mm_schema_kw(src: JdbcSource) -> dict:
    return {"schema": src.mm_schema} if src.mm_schema else {}


def reflect_table(
    table: str, key: str, exclude: list[str], engines: dict[str, sa.Engine], sources: dict[str, JdbcSource]
) -> TablePlan:
    """Reflect `table` and its shadow at every site; raise SchemaError listing every problem."""
    problems: list[str] = []
    cols_by_site: dict[str, dict[str, str]] = {}
    shadow_cols: dict[str, list[str]] = {}
    key_kinds: list[str] = []
    for site, eng in engines.items():
        insp = sa.inspect(eng)
        try:
            cols = insp.get_columns(table)
        except sa.exc.NoSuchTableError:
            problems.append(f"site '{site}': table '{table}' does not exist")
            continue
        try:
            shadow = insp.get_columns(f"_mm_shadow_{table}", **_mm_schema_kw(sources[site]))
        except sa.exc.NoSuchTableError:
            problems.append(f"site '{site}': '_mm_shadow_{table}' does not exist (run 'multimaster init' first)")
            continue
        shadow_cols[site] = [c["name"] for c in shadow]
        kinds = {c["name"]: canonical_kind(c["type"]) for c in cols}
        with eng.connect() as conn:  # JSON kept as text with a json_valid CHECK (MariaDB's JSON)
            kinds.update({n: "json" for n in sources[site].dialect.json_columns(conn, table) if n in kinds})
        if key not in kinds:
            problems.append(f"site '{site}': table '{table}' has no key column '{key}'")
            continue
        key_kinds.append(kinds[key])
        generated = {c["name"] for c in cols if c.get("computed") is not None}  # each site computes them
        cols_by_site[site] = {n: k for n, k in kinds.items() if n != key and n not in exclude and n not in generated}
    if problems:
        raise SchemaError(problems)
    sites = list(cols_by_site)
    first = cols_by_site[sites[0]]
    for site in sites[1:]:
        a, b = set(first), set(cols_by_site[site])
        if a != b:
            problems.append(
                f"table '{table}': replicated columns differ between '{sites[0]}' and '{site}' "
                f"(only at {sites[0]}: {sorted(a - b)}, only at {site}: {sorted(b - a)})"
            )
    if problems:
        raise SchemaError(problems)
    columns = [ColumnSpec(name, f"v{i}", _merge([cols_by_site[s][name] for s in sites])) for i, name in enumerate(first)]
    kk = _merge(key_kinds)
    return TablePlan(table, key, "long" if kk == "long" else "string", columns, shadow_cols)


def read_sql(src: JdbcSource, plan: TablePlan) -> str:
    """The query each site is read with: one row per shadow identity (present, deleted or lost)
    plus table rows that have no shadow row (identity '?key:<key>').

    mm_st: 0 the row is in the table, 1 deleted (tombstone), 2 shadow row without a table row.
    Only a live shadow row (deleted IS NULL) owns the table row of its key: a natural key keeps the
    tombstones of its earlier lives next to the live one (docs/conflicts.md), and a table row whose
    key has only tombstones is an orphan.
    """
    d = src.dialect
    t = src.user(plan.table)
    sh = src.mm(f"_mm_shadow_{plan.table}")
    k = src.user(plan.key)
    skey = src.dialect.key_col
    vals = ", ".join(f"t.{src.user(c.name)} AS {c.alias}" for c in plan.columns)
    vals = (", " + vals) if vals else ""
    orphan_rid = d.concat("'?key:'", d.cast_text(f"t.{k}"))
    # a site's own rows inserted since its shadow last caught up (SQLite writes the shadow lazily)
    # have their identity in the change log
    fresh = d.fresh_identities_select(plan.table)
    if fresh:
        orphan_rid = f"coalesce(f.rid, {orphan_rid})"
        orphan_from = f"{t} t LEFT JOIN ({fresh}) f ON f.{skey} = t.{k}"
    else:
        orphan_from = f"{t} t"
    return (
        f"SELECT s.rid AS mm_rid, s.{skey} AS mm_key, "
        f"CASE WHEN t.{k} IS NOT NULL THEN 0 WHEN s.deleted IS NOT NULL THEN 1 ELSE 2 END AS mm_st{vals} "
        f"FROM {sh} s LEFT JOIN {t} t ON t.{k} = s.{skey} AND s.deleted IS NULL "
        f"UNION ALL "
        f"SELECT {orphan_rid} AS mm_rid, t.{k} AS mm_key, 0 AS mm_st{vals} "
        f"FROM {orphan_from} WHERE NOT EXISTS (SELECT 1 FROM {sh} s WHERE s.{skey} = t.{k} AND s.deleted IS NULL)"
    )


def custom_schema(plan: TablePlan, read_types: dict[str, str]) -> str:
    """customSchema of a read whose driver is told the types (`Dialect.Jdbc.read_types`: kind ->
    Spark type; SQLite's driver would guess them from the first row)."""
    key = "BIGINT" if plan.key_kind == "long" else "STRING"
    parts = ["mm_rid STRING", f"mm_key {key}", "mm_st INT"]
    parts += [f"{c.alias} {read_types[c.kind]}" for c in plan.columns]
    return ", ".join(parts)
