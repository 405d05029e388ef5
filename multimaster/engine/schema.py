"""Introspection of replicated tables: what the database says (columns, declared types, the
primary key) checked against what the topology file says, as a :class:`TableInfo`; and the
comparison of a table across sites."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Collection, Sequence

from sqlalchemy import inspect
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import Connection, Inspector

from multimaster.config.topology import TableConfig, unique_columns
from multimaster.core.planner import Slot, TableSpec
from multimaster.core.policies import make_policy
from multimaster.core.schemas import literal_default
from multimaster.core.unique import UniqueSet, set_name
from multimaster.core.values import ColumnType
from multimaster.dialects import get_dialect
from multimaster.dialects.schema import MAX_COLUMNS, Column, TableInfo
from multimaster.dialects.types import kind_of
from multimaster.errors import SchemaError

__all__ = ["introspect", "compare_schemas", "collation_findings", "value_types"]


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
        default = rc.get("default")
        has_default = default is not None and str(default).strip().upper() != "NULL"
        _const, value = literal_default(None if default is None else str(default))
        by_name[rc["name"]] = Column(rc["name"], rc["type"], type_sql, bool(rc.get("nullable", True)), has_default, value)
    # columns holding JSON under another declared type (MariaDB's JSON is LONGTEXT with a
    # json_valid CHECK): typed JSON, their declared type kept (dialects/types.py kind_of)
    for name in get_dialect(dialect.name).json_columns(conn, table):
        if name in by_name:
            by_name[name] = replace(by_name[name], type=sqltypes.JSON())
    # text columns' character sets and collations, where declared per column (MariaDB / MySQL)
    for name, coll in get_dialect(dialect.name).column_collations(conn, table).items():
        if name in by_name:
            by_name[name] = replace(by_name[name], collation=coll)
    return by_name


def _generated(insp: Inspector, table: str) -> set[str]:
    """The generated (computed) columns of `table`: never replicated, each site computes them from
    the columns that are (docs/types.md "Generated columns")."""
    return {rc["name"] for rc in insp.get_columns(table) if rc.get("computed") is not None}


def _config_problems(
    site: str,
    table: str,
    cfg: TableConfig,
    by_name: dict[str, Column],
    pk: list[str],
    generated: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[str]:
    """Where the table's configuration names columns the table lacks, a key that is not its
    single-column primary key, or a policy for a generated column (which is not replicated)."""
    problems: list[str] = []
    if cfg.key in generated:
        problems.append(f"site '{site}': tables.{table}.key '{cfg.key}' is a generated column; the key must be stored")
    for col in sorted({*cfg.columns, *(c for g in cfg.groups.values() for c in g.columns)} & generated):
        problems.append(
            f"site '{site}': table '{table}': column '{col}' is generated (each site computes it, it is not "
            f"replicated): take it out of tables.{table}.columns / groups"
        )
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


def introspect(conn: Connection, site: str, table: str, cfg: TableConfig, only: Collection[str] | None = None) -> TableInfo:
    """Read `table` at `site` and check it against its configuration. Raises SchemaError.
    `only`: replicate these columns alone (those of the schema version the site's capture
    writes, store/schemas.py; a column added since is replicated once engine/evolve.py took it)."""
    insp = inspect(conn)
    if not insp.has_table(table):
        raise SchemaError([f"site '{site}': table '{table}' does not exist"])
    by_name = _reflect_columns(conn, insp, table)
    generated = _generated(insp, table)
    pk = insp.get_pk_constraint(table).get("constrained_columns") or []
    problems = _config_problems(site, table, cfg, by_name, pk, generated)
    if problems:
        raise SchemaError(problems)
    key = by_name[cfg.key]
    renumber = cfg.renumber if cfg.renumber is not None else _is_integer(key)
    if renumber and not _is_integer(key):
        raise SchemaError([f"site '{site}': tables.{table}: renumber needs an integer key, '{cfg.key}' is {key.type_sql}"])
    excluded = (*cfg.exclude, *sorted(generated - set(cfg.exclude)))
    rep = sorted(
        (c for n, c in by_name.items() if n != cfg.key and n not in excluded and (only is None or n in only)),
        key=lambda c: c.name,
    )
    if len(rep) > MAX_COLUMNS:
        raise SchemaError(
            [f"site '{site}': table '{table}' replicates {len(rep)} columns; at most {MAX_COLUMNS} are supported (exclude some)"]
        )
    slots = _slots(site, table, cfg, rep)
    json_cols = frozenset(i for i, c in enumerate(rep) if kind_of(get_dialect(conn.dialect.name).name, c) == "json")
    spec = TableSpec(table, cfg.key, renumber, tuple(c.name for c in rep), tuple(slots), json_cols)
    uniques = _unique_sets(conn, site, table, cfg, rep, slots)
    return TableInfo(table, key, tuple(rep), excluded, spec, uniques)


def _is_text(col: Column) -> bool:
    t = col.type_sql.upper()
    return any(x in t for x in ("CHAR", "TEXT", "CLOB", "STRING")) and "BINARY" not in t


def _declared_length(col: Column) -> int | None:
    m = re.search(r"\((\d+)\)", col.type_sql)
    return int(m.group(1)) if m and "CHAR" in col.type_sql.upper() else None


def _unique_sets(
    conn: Connection, site: str, table: str, cfg: TableConfig, rep: list[Column], slots: list[Slot]
) -> tuple[UniqueSet, ...]:
    """The UNIQUE constraints and unique indexes of `table` other than its key, each with the
    policy its losing rows get (docs/unique.md). Raises SchemaError for one that cannot be kept
    the same at every site: a partial or expression index, a set with an excluded column, a
    policy the set's columns do not allow, a mark column sharing a conflict group."""
    where = f"site '{site}': table '{table}'"
    index = {c.name: i for i, c in enumerate(rep)}
    by_name = {c.name: c for c in rep}
    problems: list[str] = []
    found: dict[str, list[str]] = {}
    for name, cols, why in get_dialect(conn.dialect.name).unique_sets(conn, table):
        if cols is None:
            problems.append(
                f"{where}: unique index '{name}' is {why}, which cannot be kept unique the same way at every site; "
                "replace it with a UNIQUE constraint on plain columns, or drop it"
            )
        elif any(c not in index for c in cols):
            if cfg.key not in cols:
                problems.append(
                    f"{where}: UNIQUE '{name}' ({', '.join(cols)}) has a column that is not replicated "
                    f"(tables.{table}.exclude); replicate every column of a UNIQUE set, or drop it"
                )
        else:
            found.setdefault(set_name(cols), sorted(cols, key=lambda c: index[c]))
    configured = {set_name(unique_columns(k)): (k, v) for k, v in cfg.unique.items()}
    for sname, (k, _) in configured.items():
        if sname not in found:
            have = "; ".join(",".join(c) for c in found.values()) or "none"
            problems.append(
                f"site '{site}': tables.{table}.unique.{k}: no UNIQUE set of table '{table}' has exactly these columns (its UNIQUE sets: {have})"
            )
    grouped = {rep[i].name for s in slots if len(s.columns) > 1 for i in s.columns}
    out = []
    for sname, cols in sorted(found.items()):
        policy = configured[sname][1] if sname in configured else _default_policy([by_name[c] for c in cols])
        if policy == "park":
            # the losing row leaves the table: no column is marked (`mark` names the first, unused)
            out.append(UniqueSet(sname, tuple(sorted(index[c] for c in cols)), policy, index[cols[0]]))
            continue
        if policy == "suffix":
            marks = [c for c in cols if _is_text(by_name[c])]
            need = "text column"
        else:
            marks = [c for c in cols if by_name[c].nullable]
            need = "nullable column"
        if not marks:
            problems.append(
                f"{where}: UNIQUE ({', '.join(cols)}) has no {need} for policy '{policy}' to mark a row losing its value; "
                f"set tables.{table}.unique.{','.join(cols)} to another policy (park needs no column), or make one column nullable"
            )
            continue
        mark = marks[0]
        if mark in grouped:
            problems.append(
                f"{where}: column '{mark}' marks the rows losing UNIQUE ({', '.join(cols)}) and cannot be in a column group "
                f"(tables.{table}.groups); take it out of the group"
            )
            continue
        ml = _declared_length(by_name[mark]) if policy == "suffix" else None
        if ml is not None and ml < 24:
            key = ",".join(cols)
            instead = (
                f"set tables.{table}.unique.{key}: null"
                if any(by_name[c].nullable for c in cols)
                else f"set tables.{table}.unique.{key}: park (no column of it is nullable, so null cannot mark it)"
            )
            problems.append(
                f"{where}: column '{mark}' ({by_name[mark].type_sql}) is too short for a suffix mark (24 characters at least); "
                f"{instead}, or widen the column"
            )
            continue
        out.append(UniqueSet(sname, tuple(sorted(index[c] for c in cols)), policy, index[mark], ml))
    if problems:
        raise SchemaError(problems)
    return tuple(out)


def park_references(conn: Connection, site: str, infos: dict[str, TableInfo]) -> list[str]:
    """The problems of a table with a ``park`` UNIQUE set that another replicated table references
    by foreign key (docs/unique.md): a parked row leaves its table, and a row referencing it would
    then be refused (or cascade) at one site and not another."""
    from sqlalchemy import inspect

    parks = {tb: [u.name for u in info.uniques if u.policy == "park"] for tb, info in infos.items()}
    parks = {tb: names for tb, names in parks.items() if names}
    if not parks:
        return []
    insp = inspect(conn)
    out = []
    for tb in sorted(infos):
        for fk in insp.get_foreign_keys(tb):
            ref = fk.get("referred_table")
            if ref in parks:
                sets = ", ".join("(" + n.replace("+", ", ") + ")" for n in parks[ref])
                out.append(
                    f"site '{site}': table '{tb}' references table '{ref}' by foreign key, and UNIQUE {sets} of '{ref}' "
                    f"has policy 'park' (a parked row leaves '{ref}', so the rows of '{tb}' referencing it could not be "
                    f"kept the same at every site); set tables.{ref}.unique.<columns>: suffix or null (add a text or "
                    f"nullable column to the set if it has none), or drop the foreign key"
                )
    return out


def _default_policy(cols: list[Column]) -> str:
    """docs/unique.md: ``suffix`` for a set with a text column, else ``null`` for one with a
    nullable column, else ``park``."""
    if any(_is_text(c) for c in cols):
        return "suffix"
    return "null" if any(c.nullable for c in cols) else "park"


def collation_findings(
    table: str, infos: dict[str, TableInfo], dialects: dict[str, str], installed: bool
) -> tuple[list[str], list[str]]:
    """(problems, warnings): the key and UNIQUE columns of `table` whose collation at a site takes
    different texts as one value ('a' and 'A' under MariaDB's default utf8mb4_general_ci, 'x' and
    'x ' under every PAD SPACE collation), docs/mysql.md "Collations". Refused where another site
    replicating the table compares that column otherwise (another database, another collation) and
    the collation merges more than trailing spaces: two rows that site holds side by side could
    never both be stored here. A warning otherwise (every site merges them alike: concurrent
    writes of two such values at two sites are held; trailing spaces only; or the table is
    replicated already (`installed`), where a refusal would stop its upgrade)."""
    problems: list[str] = []
    warnings: list[str] = []
    alike: dict[tuple[str, str], list[str]] = {}  # (column, collation) named already, every site alike
    for site, info in infos.items():
        d = get_dialect(dialects[site])
        for col, role in keyed_columns(info):
            coll = col.collation
            if coll is not None and coll.clash and role != "the key":
                problems.append(
                    f"site '{site}': table '{table}', column '{col.name}' ({role}) has collation {coll.name}: {coll.clash}. "
                    f"Fix, at '{site}': {d.exact_collation_sql(table, col)}; then run init again"
                )
                continue
            if coll is None or not coll.merges:
                continue
            others = sorted(s for s in infos if s != site and _compares(infos[s], col.name) != coll.merges)
            fix = (
                "keep values that differ only in trailing spaces out of it (its collation is binary already, as "
                "multimaster's own tables are)"
                if coll.pads_only
                else d.exact_collation_sql(table, col)
            )
            where = f"site '{site}': table '{table}', column '{col.name}' ({role}) has collation {coll.shown}, which takes {coll.merges} as one value"
            if others:
                apart = ", ".join(f"'{o}' ({get_dialect(dialects[o]).title})" for o in others)
                said = (
                    f"{where}, while {apart} {'keeps' if len(others) == 1 else 'keep'} them apart: two rows written there with such "
                    f"values could never both be stored at '{site}' (the second would be held in its error queue). "
                    + (f"At '{site}': {fix}" if coll.pads_only else f"Fix, at '{site}': {fix}; then run init again")
                )
                (warnings if installed or coll.pads_only else problems).append(said)
            elif not coll.pads_only and not alike.get((col.name, coll.shown)):
                alike[(col.name, coll.shown)] = sorted(infos)
                warnings.append(
                    f"table '{table}', column '{col.name}' ({role}) has collation {coll.shown} at "
                    f"{', '.join(repr(s) for s in sorted(infos))}, which takes {coll.merges} as one value: two such values "
                    f"written concurrently at two sites collide and are held in the error queue, each site keeping its own. "
                    + f"To tell case and accents apart: {fix}, at every site"
                )
    return problems, warnings


def keyed_columns(info: TableInfo) -> list[tuple[Column, str]]:
    """The key of `info` and every column of a UNIQUE set, each with its role in words."""
    out = [(info.key, "the key")]
    for u in info.uniques:
        for i in u.columns:
            c = info.columns[i]
            if all(c.name != o.name for o, _ in out):
                out.append((c, f"in UNIQUE ({u.name.replace('+', ', ')})"))
    return out


def _compares(info: TableInfo, name: str) -> str:
    """What column `name` of `info` takes as one value though the texts differ ('': exactly)."""
    c = next((c for c in (info.key, *info.columns) if c.name == name), None)
    return c.collation.merges if c is not None and c.collation is not None else ""


def _norm_type(t: str) -> str:
    t = t.upper().replace(" ", "")
    return t


def compare_schemas(
    table: str, infos: dict[str, TableInfo], same_dialect: dict[str, str], common_only: bool = False
) -> list[str]:
    """Problems where a replicated table differs between sites (column names; types on one dialect;
    across dialects, columns whose values cannot be carried exactly: dialects/types.py).
    `common_only`: sites may have different columns (a schema change going round the cluster,
    docs/schema-changes.md); the columns they share must agree."""
    from multimaster.dialects.types import carry_problems

    if common_only:
        shared = set.intersection(*(set(i.column_names) for i in infos.values())) if infos else set()
        infos = {s: _only(i, shared) for s, i in infos.items()}
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
        if ref.uniques != info.uniques and not common_only:
            problems.append(
                f"table '{table}': its UNIQUE sets differ between sites '{ref_site}' ({_show_uniques(ref)}) and '{site}' "
                f"({_show_uniques(info)}); declare the same UNIQUE constraints (and lengths of their text columns) at every site"
                + _unbounded_hint(ref_site, ref, site, info)
            )
        if same_dialect[site] == same_dialect[ref_site] and not common_only:  # (a type may be widened site by site)
            for ca, cb in zip((ref.key, *ref.columns), (info.key, *info.columns)):
                if _norm_type(ca.type_sql) != _norm_type(cb.type_sql):
                    problems.append(
                        f"table '{table}', column '{ca.name}': type {ca.type_sql or 'untyped'} at '{ref_site}' "
                        f"but {cb.type_sql or 'untyped'} at '{site}'"
                    )
    return problems


def _only(info: TableInfo, names: set[str]) -> TableInfo:
    """`info` with only the columns `names` (for comparing what sites share)."""
    return replace(info, columns=tuple(c for c in info.columns if c.name in names), uniques=())


def _unbounded_hint(a_site: str, a: TableInfo, b_site: str, b: TableInfo) -> str:
    """Where the sets are the same but for a mark column's length that one site does not declare
    (SQLite's TEXT: the usual DDL there), how to say it: the mark is cut to that length, and every
    site must cut it alike."""
    if [(u.name, u.policy) for u in a.uniques] != [(u.name, u.policy) for u in b.uniques]:
        return ""
    out = []
    for ua, ub in zip(a.uniques, b.uniques):
        if ua.max_len == ub.max_len or (ua.max_len is not None and ub.max_len is not None):
            continue
        (site, info, n) = (a_site, a, ub.max_len) if ua.max_len is None else (b_site, b, ua.max_len)
        col = info.columns[ua.mark].name
        out.append(
            f"'{site}' declares no length for {col}: declare it VARCHAR({n}) there (SQLite keeps the text whatever the "
            "length; multimaster cuts a losing row's mark to it, the same at every site)"
        )
    return ("; " + "; ".join(out)) if out else ""


def _show_uniques(info: TableInfo) -> str:
    return "; ".join(f"{u.name} {u.policy}" + (f" max {u.max_len}" if u.max_len else "") for u in info.uniques) or "none"


def value_types(sides: Sequence[tuple[str, TableInfo]]) -> dict[str, ColumnType]:
    """Per column of the tables `sides` ((dialect name, the table there), one per site compared),
    what its values are compared as (core/values.py): the column's kind (dialects/types.py; the
    first site's that has one) and, for a decimal, the smallest scale a site declares (what every
    site can hold)."""
    kinds: dict[str, str | None] = {}
    scales: dict[str, int] = {}
    for dialect, info in sides:
        for c in (info.key, *info.columns):
            k = kind_of(dialect, c)
            if kinds.get(c.name) in (None, "any"):
                kinds[c.name] = k
            s = getattr(c.type, "scale", None) if k == "decimal" else None
            if isinstance(s, int):
                scales[c.name] = min(s, scales.get(c.name, s))
    return {n: ColumnType(k, scales.get(n) if k == "decimal" else None) for n, k in kinds.items()}
