"""Introspection of replicated tables: what the database says (columns, declared types, the
primary key) checked against what the topology file says, as a :class:`TableInfo`; and the
comparison of a table across sites."""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Inspector

from multimaster.config.topology import TableConfig
from multimaster.core.planner import Slot, TableSpec
from multimaster.core.policies import make_policy
from multimaster.dialects.schema import MAX_COLUMNS, Column, TableInfo
from multimaster.errors import SchemaError

__all__ = ["introspect", "compare_schemas"]


def _is_integer(col: Column) -> bool:
    t = col.type_sql.upper()
    return "INT" in t


def _reflect_columns(conn: Connection, insp: Inspector, table: str) -> dict[str, Column]:
    """The columns of `table` as the database declares them, by name, each with its type as SQL
    of the site's dialect ('' when the database gives none)."""
    dialect = conn.dialect
    by_name: dict[str, Column] = {}
    for rc in insp.get_columns(table):
        try:
            type_sql = rc["type"].compile(dialect=dialect)
        except Exception:  # noqa: BLE001 - reflected NullType etc.
            type_sql = str(rc["type"]) if str(rc["type"]) != "NULL" else ""
        by_name[rc["name"]] = Column(rc["name"], rc["type"], type_sql, bool(rc.get("nullable", True)))
    return by_name


def _config_problems(site: str, table: str, cfg: TableConfig, by_name: dict[str, Column], pk: list[str]) -> list[str]:
    """Where the table's configuration names columns the table lacks, or a key that is not its
    single-column primary key."""
    problems: list[str] = []
    if cfg.key not in by_name:
        problems.append(f"site '{site}': table '{table}' has no column '{cfg.key}' (tables.{table}.key)")
    elif pk != [cfg.key]:
        problems.append(
            f"site '{site}': tables.{table}.key is '{cfg.key}' but the table's primary key is "
            f"{pk or 'missing'}; the key must be the single-column primary key"
        )
    for col in [*cfg.exclude, *cfg.columns, *(c for g in cfg.groups.values() for c in g.columns)]:
        if col not in by_name:
            problems.append(f"site '{site}': table '{table}' has no column '{col}' named in tables.{table}")
    return problems


def _slots(site: str, table: str, cfg: TableConfig, rep: list[Column]) -> list[Slot]:
    """The conflict slots of the replicated columns `rep`: one per configured group (columns
    present only), one per other column with its policy; sorted by name. Raises SchemaError for
    an additive policy on a column that is not numeric."""
    index = {c.name: i for i, c in enumerate(rep)}
    slots: list[Slot] = []
    grouped: set[str] = set()
    for gname, g in cfg.groups.items():
        cols_idx = tuple(sorted(index[c] for c in g.columns if c in index))
        if not cols_idx:
            continue
        grouped.update(g.columns)
        slots.append(Slot(gname, cols_idx, make_policy(g.policy)))
    for c in rep:
        if c.name in grouped:
            continue
        pol = make_policy(cfg.columns.get(c.name, cfg.policy))
        if pol.is_additive and not any(t in c.type_sql.upper() for t in ("INT", "NUM", "DEC", "REAL", "FLOAT", "DOUBLE")):
            raise SchemaError(
                [
                    f"site '{site}': tables.{table}.columns.{c.name}: 'additive' needs a numeric column, it is {c.type_sql or 'untyped'}"
                ]
            )
        slots.append(Slot(c.name, (index[c.name],), pol))
    slots.sort(key=lambda s: s.name)
    return slots


def introspect(conn: Connection, site: str, table: str, cfg: TableConfig) -> TableInfo:
    """Read `table` at `site` and check it against its configuration. Raises SchemaError."""
    insp = inspect(conn)
    if not insp.has_table(table):
        raise SchemaError([f"site '{site}': table '{table}' does not exist"])
    by_name = _reflect_columns(conn, insp, table)
    pk = insp.get_pk_constraint(table).get("constrained_columns") or []
    problems = _config_problems(site, table, cfg, by_name, pk)
    if problems:
        raise SchemaError(problems)
    key = by_name[cfg.key]
    renumber = cfg.renumber if cfg.renumber is not None else _is_integer(key)
    if renumber and not _is_integer(key):
        raise SchemaError([f"site '{site}': tables.{table}: renumber needs an integer key, '{cfg.key}' is {key.type_sql}"])
    rep = sorted((c for n, c in by_name.items() if n != cfg.key and n not in cfg.exclude), key=lambda c: c.name)
    if len(rep) > MAX_COLUMNS:
        raise SchemaError(
            [f"site '{site}': table '{table}' replicates {len(rep)} columns; at most {MAX_COLUMNS} are supported (exclude some)"]
        )
    slots = _slots(site, table, cfg, rep)
    spec = TableSpec(table, cfg.key, renumber, tuple(c.name for c in rep), tuple(slots))
    return TableInfo(table, key, tuple(rep), tuple(cfg.exclude), spec)


def _norm_type(t: str) -> str:
    t = t.upper().replace(" ", "")
    return t


def compare_schemas(table: str, infos: dict[str, TableInfo], same_dialect: dict[str, str]) -> list[str]:
    """Problems where a replicated table differs between sites (column names; types on one dialect;
    across dialects, columns whose values cannot be carried exactly: dialects/types.py)."""
    from multimaster.dialects.types import carry_problems

    problems: list[str] = carry_problems(table, infos, same_dialect)
    items = list(infos.items())
    if not items:
        return problems
    ref_site, ref = items[0]
    for site, info in items[1:]:
        a, b = set(ref.column_names) | {ref.key.name}, set(info.column_names) | {info.key.name}
        if a != b:
            only_a, only_b = sorted(a - b), sorted(b - a)
            detail = []
            if only_a:
                detail.append(f"only '{ref_site}' has {only_a}")
            if only_b:
                detail.append(f"only '{site}' has {only_b}")
            problems.append(f"table '{table}' differs between sites '{ref_site}' and '{site}': " + "; ".join(detail))
            continue
        if same_dialect[site] == same_dialect[ref_site]:
            for ca, cb in zip((ref.key, *ref.columns), (info.key, *info.columns)):
                if _norm_type(ca.type_sql) != _norm_type(cb.type_sql):
                    problems.append(
                        f"table '{table}', column '{ca.name}': type {ca.type_sql or 'untyped'} at '{ref_site}' "
                        f"but {cb.type_sql or 'untyped'} at '{site}'"
                    )
    return problems
