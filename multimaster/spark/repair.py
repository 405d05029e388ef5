"""Repair: make every other site equal to a reference site, as a plan (plain data) + an executor.

Planning finds the differing identities with Spark (nothing table-sized reaches the driver but
the differing identities themselves, capped by `max_ops`) and reads the reference's rows and
shadow rows for them with SQLAlchemy. Per target site and table, the plan holds:

- delete: the target has a row the reference has not (it is gone there, or never existed);
- insert: the reference has a row the target has not;
- rekey:  both have the row under different keys (delete + insert with the reference's key);
- update: same key, different values (the replicated columns are set to the reference's).

Every op also replaces the target's shadow row by the reference's (rid, key, deleted, versions),
or removes it when the reference has none. The executor applies one transaction per site (all
its tables), the reference's values converted for the site's database by its dialect's value
adapters (as replication converts them), with the capture guard set (the dialect's `set_applying`, as the reconciler does: SQLite:
`_mm_state.applying = 1` inside BEGIN IMMEDIATE, reset before COMMIT; PostgreSQL: `mm.applying`
set locally; MariaDB: `@mm_applying`), so the repair is not captured as new changes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from multimaster.config.topology import Topology, load_topology
from multimaster.errors import ConfigError, MultimasterError
from multimaster.spark.jdbc import dialect_of, find_jars, jdbc_source

__all__ = [
    "RepairOp",
    "RepairPlan",
    "RepairResult",
    "SiteRepair",
    "RepairFailed",
    "plan_repair",
    "apply_plan",
    "TooManyDifferences",
]

OPS = ("delete", "insert", "rekey", "update")


class TooManyDifferences(MultimasterError):
    pass


@dataclass
class RepairOp:
    op: str  # delete | insert | rekey | update
    rid: str
    key: Any  # the reference's key (None for delete)
    old_key: Any  # the target's key (None for insert)
    values: dict[str, Any] | None = None  # replicated column values at the reference
    shadow: dict[str, Any] | None = None  # the reference's shadow row (None: remove the target's)


@dataclass
class RepairPlan:
    reference: str
    ops: dict[str, dict[str, list[RepairOp]]] = field(default_factory=dict)  # site -> table -> ops
    columns: dict[str, list[str]] = field(default_factory=dict)  # table -> replicated columns
    keys: dict[str, str] = field(default_factory=dict)  # table -> key column

    def counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """site -> table -> op -> number of ops."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for site, tabs in self.ops.items():
            for t, ops in tabs.items():
                c = {o: 0 for o in OPS}
                for op in ops:
                    c[op.op] += 1
                out.setdefault(site, {})[t] = c
        return out

    @property
    def total(self) -> int:
        return sum(len(ops) for tabs in self.ops.values() for ops in tabs.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "total": self.total,
            "counts": self.counts(),
            "keys": dict(self.keys),
            "columns": {t: list(c) for t, c in self.columns.items()},
            "ops": {s: {t: [_jsonable_op(o) for o in ops] for t, ops in tabs.items()} for s, tabs in self.ops.items()},
        }


def _jsonable_op(o: RepairOp) -> dict[str, Any]:
    from multimaster.spark.compare import _jsonable

    d = asdict(o)
    for k in ("values", "shadow"):
        if d[k] is not None:
            d[k] = {c: _jsonable(v) for c, v in d[k].items()}
    d["key"], d["old_key"] = _jsonable(d["key"]), _jsonable(d["old_key"])
    return d


def _mm(url: str, name: str) -> str:
    return dialect_of(url).mm_name(name)


def _chunks(xs: list, n: int = 500):
    for i in range(0, len(xs), n):
        yield xs[i : i + n]


def plan_repair(
    topology: Topology | str | os.PathLike[str],
    reference: str,
    tables: list[str] | None = None,
    *,
    master: str = "local[*]",
    partitions: int = 4,
    spark=None,
    jars: list[str] | None = None,
    sites: list[str] | None = None,
    max_ops: int = 1_000_000,
) -> RepairPlan:
    """Plan the changes that make every other site (or `sites`) equal to `reference`."""
    from pyspark.sql import functions as F

    from multimaster.spark.api import _engines
    from multimaster.spark.compare import SiteReader, grouped, key_bounds
    from multimaster.spark.schema import reflect_table
    from multimaster.spark.session import get_spark, planning

    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    # every site's shadow up to date with its own rows, so the plan copies real shadow rows
    from multimaster.engine.refresh import catch_up

    catch_up(topo)
    if reference not in topo.sites:
        raise ConfigError([f"--repair-from: site '{reference}' is not under 'sites' in the topology"])
    names = list(tables) if tables else list(topo.tables)
    unknown = [t for t in names if t not in topo.tables]
    if unknown:
        raise ConfigError([f"table '{t}' is not under 'tables' in the topology" for t in unknown])
    targets = [s for s in (sites or [s for s, c in topo.sites.items() if c.verify]) if s != reference]
    chosen = [reference] + targets
    sources = {s: jdbc_source(s, topo.sites[s].url) for s in chosen}
    jar_paths = find_jars({src.dialect for src in sources.values()}, jars)
    engines = _engines(topo, chosen)
    plan = RepairPlan(reference)
    plans = contextlib.ExitStack()
    try:
        if spark is None:
            spark = get_spark(master, jar_paths, partitions)
        plans.enter_context(planning(spark))
        for name in names:
            cfg = topo.tables[name]
            tp = reflect_table(name, cfg.key, list(cfg.exclude), engines, sources)
            plan.columns[name] = tp.names
            plan.keys[name] = cfg.key
            bounds = key_bounds(tp, engines, sources, partitions)
            readers = {s: SiteReader(spark, sources[s], tp, bounds, partitions).read for s in chosen}
            g = grouped(chosen, readers, tp)
            pr = F.coalesce(F.col("st0") == 0, F.lit(False))
            parts = []
            for i in range(1, len(chosen)):
                pi = F.coalesce(F.col(f"st{i}") == 0, F.lit(False))
                op = (
                    F.when(pi & ~pr, F.lit("delete"))
                    .when(pr & ~pi, F.lit("insert"))
                    .when(pr & pi & (F.col(f"k{i}") != F.col("k0")), F.lit("rekey"))
                    .when(pr & pi & (F.col(f"h{i}") != F.col("h0")), F.lit("update"))
                )
                parts.append(
                    g.select(
                        F.lit(i).alias("site"),
                        F.col("mm_rid").alias("rid"),
                        op.alias("op"),
                        F.col("k0").alias("key"),
                        F.col(f"k{i}").alias("old_key"),
                    ).filter(F.col("op").isNotNull())
                )
            u = parts[0]
            for p in parts[1:]:
                u = u.unionByName(p)
            rows = u.limit(max_ops + 1).collect()
            if len(rows) > max_ops:
                raise TooManyDifferences(
                    f"table '{name}': more than {max_ops} rows differ from '{reference}'; "
                    "re-create the stale sites from the reference instead (or raise max_ops)"
                )
            if not rows:
                continue
            ref_vals, ref_shadow = _reference_rows(engines[reference], topo.sites[reference].url, tp, rows)
            for r in rows:
                site = chosen[r["site"]]
                o = r["op"]
                ro = RepairOp(
                    op=o,
                    rid=r["rid"],
                    key=r["key"] if o != "delete" else None,
                    old_key=r["old_key"] if o != "insert" else None,
                    values=ref_vals.get(r["key"]) if o != "delete" else None,
                    shadow=ref_shadow.get(r["rid"]),
                )
                plan.ops.setdefault(site, {}).setdefault(name, []).append(ro)
            for tabs in plan.ops.values():
                if name in tabs:
                    tabs[name].sort(key=lambda x: (OPS.index(x.op), str(x.rid)))
    finally:
        plans.close()
        for e in engines.values():
            e.dispose()
    return plan


def _reference_rows(eng: sa.Engine, url: str, tp, rows) -> tuple[dict[Any, dict], dict[str, dict]]:
    q = dialect_of(url).quote
    keys = sorted({r["key"] for r in rows if r["op"] != "delete" and r["key"] is not None})
    rids = sorted({r["rid"] for r in rows})
    vals: dict[Any, dict] = {}
    shadow: dict[str, dict] = {}
    cols = ", ".join([q(tp.key)] + [q(c) for c in tp.names])
    with eng.connect() as c:
        for ch in _chunks(keys):
            stmt = sa.text(f"SELECT {cols} FROM {q(tp.table)} WHERE {q(tp.key)} IN :ks").bindparams(
                sa.bindparam("ks", expanding=True)
            )
            for r in c.execute(stmt, {"ks": ch}):
                vals[r[0]] = dict(zip(tp.names, r[1:]))
        sh = _mm(url, f"_mm_shadow_{tp.table}")
        for ch in _chunks(rids):
            stmt = sa.text(f"SELECT * FROM {sh} WHERE rid IN :rs").bindparams(sa.bindparam("rs", expanding=True))
            res = c.execute(stmt, {"rs": ch})
            names = list(res.keys())
            for r in res:
                shadow[r[0] if names[0] == "rid" else r[names.index("rid")]] = dict(zip(names, r))
    return vals, shadow


@dataclass
class SiteRepair:
    """What applying a plan did at one site: `applied` (every op of every table, in one
    transaction) or `failed` (nothing: rolled back; `error` says why)."""

    site: str
    status: str  # applied | failed
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> op -> number of ops
    error: str | None = None
    #: the rows left as they were because a reference value of theirs is one this site cannot
    #: store exactly: {table, key, column, value, why, fix, message} (dialects/fit.py)
    unfit: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RepairResult:
    """Per target site, what applying a plan did (`apply_plan`)."""

    reference: str
    sites: dict[str, SiteRepair] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, SiteRepair]:
        return {s: r for s, r in self.sites.items() if r.status != "applied"}

    @property
    def unfit(self) -> list[dict[str, Any]]:
        """Every row left as it was at a site for a value it cannot store (SiteRepair.unfit)."""
        return [u for r in self.sites.values() for u in r.unfit]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.unfit

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "ok": self.ok, "sites": {s: r.to_dict() for s, r in self.sites.items()}}


class RepairFailed(MultimasterError):
    """Applying a repair plan failed at some sites (each rolled back); the others were repaired."""

    exit_code = 2

    def __init__(self, result: RepairResult):
        self.result = result
        done = [s for s in result.sites if s not in result.failed]
        lines = [f"repair from '{result.reference}' failed at site '{s}': {r.error}" for s, r in result.failed.items()]
        lines.append(
            f"(nothing was changed there; repaired: {', '.join(repr(s) for s in done)})" if done else "(nothing was changed)"
        )
        super().__init__("\n".join(lines))


def apply_plan(topology: Topology | str | os.PathLike[str], plan: RepairPlan, *, check: bool = True) -> RepairResult:
    """Execute `plan`: one transaction per site (all its tables), capture guard on, the
    reference's values converted for the site's database as replication converts them (the
    dialect's value adapters, dialects/types.py). A site whose transaction fails is rolled back
    and the next one is repaired all the same. Returns what was done per site; with `check`,
    raises RepairFailed (naming each failed site) when any failed."""
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    out = RepairResult(plan.reference)
    counts = plan.counts()
    for site, tabs in plan.ops.items():
        try:
            unfit = _apply_site(topo, site, tabs, plan)
        except Exception as e:  # noqa: BLE001 - any failure of one site's transaction: reported per site
            from multimaster.config.secrets import redact

            orig = getattr(e, "orig", None) or e
            msg = str(orig).strip().splitlines()[0][:500] if str(orig).strip() else ""
            out.sites[site] = SiteRepair(site, "failed", counts.get(site, {}), redact(f"{type(orig).__name__}: {msg}"))
        else:
            out.sites[site] = SiteRepair(site, "applied", _less(counts.get(site, {}), unfit), unfit=unfit)
    if check and not out.ok:
        raise RepairFailed(out)
    return out


def _less(counts: dict[str, dict[str, int]], unfit: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """`counts` (table -> op -> number) without the ops left for a value the site cannot store."""
    out = {t: dict(c) for t, c in counts.items()}
    for u in {(u["table"], u["key"], u["op"]) for u in unfit}:
        out[u[0]][u[2]] -= 1
    return out


def _apply_site(topo: Topology, site: str, tabs: dict[str, list[RepairOp]], plan: RepairPlan) -> list[dict[str, Any]]:
    """Apply the ops of every table of `tabs` at `site`, in one transaction with the capture guard
    set; returns the rows left for a value the site cannot store exactly (SiteRepair.unfit)."""
    unfit: list[dict[str, Any]] = []
    url = topo.sites[site].url
    d = dialect_of(url)
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool, **d.writer_engine_kwargs())
    try:
        with eng.connect() as conn:
            if d.writer_begin:
                conn.exec_driver_sql(d.writer_begin)
                tx = None
            else:
                tx = conn.begin()
            try:
                d.set_applying(conn, True)  # the capture guard: nothing below is captured
                for table, ops in tabs.items():
                    unfit += _apply_table(conn, d, topo, site, table, ops, plan)
                d.set_applying(conn, False)
                if tx is not None:
                    tx.commit()
                else:
                    conn.exec_driver_sql("COMMIT")
            except BaseException:
                if tx is not None:
                    tx.rollback()
                else:
                    conn.exec_driver_sql("ROLLBACK")
                raise
    finally:
        eng.dispose()
    return unfit


def _adapters(conn: sa.Connection, d: Any, topo: Topology, site: str, table: str, cols: list[str]) -> dict[str, Any]:
    """Per column of `table` at `site` (its key included), the converter of a value as the
    reference's driver returned it into what this site's driver stores exactly (None: as is),
    and the test that the column stores it exactly (None: every value; dialects/fit.py)."""
    from dataclasses import replace

    from multimaster.engine.schema import introspect

    info = introspect(conn, site, table, topo.tables[table])
    by_name = {c.name: c for c in info.columns}
    shown = replace(info, columns=(info.key, *(by_name[c] for c in cols if c in by_name)))
    return {c.name: (f, t) for c, f, t in zip(shown.columns, d.value_adapters(shown), d.value_checks(shown))}


def _unfit(site: str, table: str, o: RepairOp, column: str, value: Any, misfit: Any, reference: str) -> dict[str, Any]:
    """The report of the row of `o` left as it was at `site`: its reference value of `column`
    is one the site cannot store exactly (`misfit`: dialects/fit.py Misfit)."""
    from multimaster.dialects.types import shown

    again = f"then run 'multimaster verify -t FILE --repair-from {reference} --apply' again"
    fix = f"write a value '{site}' can hold in {table}.{column} at '{reference}'; {again}"
    if not misfit.never:
        fix = f"widen {table}.{column} at '{site}' to hold it (ALTER TABLE there), or {fix}"
    key = o.key if o.key is not None else o.old_key
    msg = (
        f"site '{site}': table '{table}', key {key!r}, column '{column}': not repaired: '{site}' cannot store exactly "
        f"the value {shown(value)} of '{reference}' ({misfit.why}); the row was left as it is there. Fix: {fix} "
        '(docs/types.md "Values a site cannot store")'
    )
    return {
        "table": table,
        "key": key,
        "op": o.op,
        "column": column,
        "value": shown(value),
        "why": misfit.why,
        "fix": fix,
        "message": msg,
    }


def _fitting(
    site: str, table: str, ops: list[RepairOp], key: str, cols: list[str], conv: dict[str, Any], reference: str
) -> tuple[list[RepairOp], list[dict[str, Any]]]:
    """The ops of `ops` whose reference values `site` stores exactly, and the reports of the
    others (left out whole: nothing of such a row, its shadow row neither, is changed)."""
    from multimaster.engine.pull import converted

    ok: list[RepairOp] = []
    bad: list[dict[str, Any]] = []
    for o in ops:
        vals = {} if o.values is None else {key: o.key, **o.values}
        found = None
        for c in [key, *cols]:
            f, test = conv.get(c, (None, None))
            v = vals.get(c)
            if v is None or (f is None and test is None):
                continue
            w, m = converted(f, v) if f is not None else (v, None)
            m = m if m is not None or test is None else test(w)
            if m is not None:
                found = _unfit(site, table, o, c, v, m, reference)
                break
        if found is None:
            ok.append(o)
        else:
            bad.append(found)
    return ok, bad


def _apply_table(
    conn: sa.Connection, d: Any, topo: Topology, site: str, table: str, ops: list[RepairOp], plan: RepairPlan
) -> list[dict[str, Any]]:
    """The ops of `table` at `site`, on `conn` (in the site's transaction, guard set), but those
    with a reference value the site cannot store exactly: their reports (left as they are)."""
    q = d.quote
    url = topo.sites[site].url
    key, cols = plan.keys[table], plan.columns[table]
    sh = _mm(url, f"_mm_shadow_{table}")
    conv = _adapters(conn, d, topo, site, table, cols)
    ops, unfit = _fitting(site, table, ops, key, cols, conv, plan.reference)

    def val(c: str, v: Any) -> Any:
        f = conv.get(c, (None, None))[0]
        return v if f is None or v is None else f(v)

    def kv(v: Any) -> Any:
        return val(key, v)

    shadow_cols = [
        c["name"]
        for c in sa.inspect(conn).get_columns(
            f"_mm_shadow_{table}", **({"schema": d.caps.bookkeeping_schema} if d.caps.bookkeeping_schema else {})
        )
    ]
    gone = [kv(o.old_key) for o in ops if o.op in ("delete", "rekey")]
    for ch in _chunks(gone):
        conn.execute(
            sa.text(f"DELETE FROM {q(table)} WHERE {q(key)} IN :ks").bindparams(sa.bindparam("ks", expanding=True)),
            {"ks": ch},
        )
    for ch in _chunks([o.rid for o in ops]):
        conn.execute(
            sa.text(f"DELETE FROM {sh} WHERE rid IN :rs").bindparams(sa.bindparam("rs", expanding=True)),
            {"rs": ch},
        )
    taken = [kv(o.shadow["key"]) for o in ops if o.shadow and "key" in o.shadow]
    # the shadow row holding a key the reference gives another identity goes; a natural key's
    # tombstones of earlier lives ('k:' rids) stay: their own ops (same rid) decide them
    for ch in _chunks(taken):
        conn.execute(
            sa.text(f"DELETE FROM {sh} WHERE {d.key_col} IN :ks AND (deleted IS NULL OR rid NOT LIKE 'k:%')").bindparams(
                sa.bindparam("ks", expanding=True)
            ),
            {"ks": ch},
        )
    srows = [{c: (kv(o.shadow.get(c)) if c == "key" else o.shadow.get(c)) for c in shadow_cols} for o in ops if o.shadow]
    if srows:
        collist = ", ".join(q(c) for c in shadow_cols)
        params = ", ".join(f":p{i}" for i in range(len(shadow_cols)))
        conn.execute(
            sa.text(f"INSERT INTO {sh} ({collist}) VALUES ({params})"),
            [{f"p{i}": r[c] for i, c in enumerate(shadow_cols)} for r in srows],
        )
    ins = [(o.key, o.values) for o in ops if o.op in ("insert", "rekey") and o.values is not None]
    if ins:
        allc = [key] + cols
        collist = ", ".join(q(c) for c in allc)
        params = ", ".join(f":p{i}" for i in range(len(allc)))
        conn.execute(
            sa.text(f"INSERT INTO {q(table)} ({collist}) VALUES ({params})"),
            [{f"p{i}": v for i, v in enumerate([kv(k)] + [val(c, vals.get(c)) for c in cols])} for k, vals in ins],
        )
    upd = [(o.key, o.values) for o in ops if o.op == "update" and o.values is not None]
    if upd and cols:
        sets = ", ".join(f"{q(c)} = :p{i}" for i, c in enumerate(cols))
        conn.execute(
            sa.text(f"UPDATE {q(table)} SET {sets} WHERE {q(key)} = :k"),
            [{"k": kv(k), **{f"p{i}": val(c, vals.get(c)) for i, c in enumerate(cols)}} for k, vals in upd],
        )
    return unfit
