"""The Spark side of verify: read every site through JDBC, hash, compare all sites at once.

Everything table-sized stays in Spark. What comes back to the driver: one row of totals per
table (per-site row counts, fingerprints and difference counts), per-column difference counts,
the number of differing identities no waiting change touches, at most `sample_limit` differing
identities per kind with their values, and in checksum mode one (count, hash) pair per site and
key range.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import sqlalchemy as sa

from multimaster.core.values import ColumnType, differing
from multimaster.spark.jdbc import JdbcSource
from multimaster.spark.result import Sample
from multimaster.spark.schema import SPARK_TYPE, TablePlan, custom_schema, read_sql

__all__ = [
    "Bounds",
    "key_bounds",
    "SiteReader",
    "grouped",
    "pending_identities",
    "compare_full",
    "compare_checksum",
    "FullOutcome",
]

STATE = {0: "present", 1: "deleted", 2: "lost", None: "unknown"}


@dataclass
class Bounds:
    lo: int | None
    hi: int | None
    boundaries: list[str] | None = None  # string keys: split points for partitions


def key_bounds(plan: TablePlan, engines: dict[str, sa.Engine], sources: dict[str, JdbcSource], partitions: int) -> Bounds:
    """Smallest and largest key over every site (shadow and table), cheap with the key indexes."""
    if plan.key_kind == "long":
        lo = hi = None
        for site, eng in engines.items():
            src = sources[site]
            sh, skey = src.mm(f"_mm_shadow_{plan.table}"), src.dialect.key_col
            t, k = src.user(plan.table), src.user(plan.key)
            with eng.connect() as c:
                for q in (f"SELECT min({skey}), max({skey}) FROM {sh}", f"SELECT min({k}), max({k}) FROM {t}"):
                    a, b = c.execute(sa.text(q)).one()
                    if a is not None:
                        lo = int(a) if lo is None else min(lo, int(a))
                        hi = int(b) if hi is None else max(hi, int(b))
        return Bounds(lo, hi)
    # string keys: split points from the first site's shadow (any total order works: the
    # predicates built from them are complementary at every site)
    site = next(iter(engines))
    src = sources[site]
    sh, skey = src.mm(f"_mm_shadow_{plan.table}"), src.dialect.key_col
    with engines[site].connect() as c:
        n = c.execute(sa.text(f"SELECT count(*) FROM {sh}")).scalar_one()
        pts: list[str] = []
        for i in range(1, partitions):
            off = n * i // partitions
            v = c.execute(sa.text(f"SELECT {skey} FROM {sh} ORDER BY {skey} LIMIT 1 OFFSET {int(off)}")).scalar()
            if v is not None and (not pts or str(v) > pts[-1]):
                pts.append(str(v))
    return Bounds(None, None, pts)


def _lit(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def string_predicates(points: list[str]) -> list[str]:
    if not points:
        return ["1=1"]
    preds = [f"mm_key < {_lit(points[0])} OR mm_key IS NULL"]
    for a, b in zip(points, points[1:]):
        preds.append(f"mm_key >= {_lit(a)} AND mm_key < {_lit(b)}")
    preds.append(f"mm_key >= {_lit(points[-1])}")
    return preds


class SiteReader:
    """Builds the canonical DataFrame of one site: mm_rid, mm_key, mm_st, v0..vn (canonical types)."""

    def __init__(self, spark, src: JdbcSource, plan: TablePlan, bounds: Bounds, partitions: int):
        self.spark, self.src, self.plan, self.bounds, self.partitions = spark, src, plan, bounds, partitions

    def _options(self) -> dict[str, str]:
        opts = dict(self.src.properties)
        read_types = self.src.jdbc.read_types
        if read_types is not None:
            opts["customSchema"] = custom_schema(self.plan, read_types)
        return opts

    def read(self, predicates: list[str] | None = None):
        from pyspark.sql import functions as F

        table = f"({read_sql(self.src, self.plan)}) mm_q"
        opts = self._options()
        b = self.bounds
        if predicates is None and self.plan.key_kind == "string" and b.boundaries:
            predicates = string_predicates(b.boundaries)
        if predicates is not None:
            df = self.spark.read.jdbc(self.src.url, table, predicates=predicates, properties=opts)
        else:
            r = self.spark.read.format("jdbc").option("url", self.src.url).option("dbtable", table)
            for k, v in opts.items():
                r = r.option(k, v)
            if self.plan.key_kind == "long" and b.lo is not None and b.hi is not None and b.hi > b.lo and self.partitions > 1:
                r = (
                    r.option("partitionColumn", "mm_key")
                    .option("lowerBound", str(b.lo))
                    .option("upperBound", str(b.hi + 1))
                    .option("numPartitions", str(self.partitions))
                )
            df = r.load()
        key_t = "bigint" if self.plan.key_kind == "long" else "string"
        cols = [
            F.col("mm_rid").cast("string").alias("mm_rid"),
            F.col("mm_key").cast(key_t).alias("mm_key"),
            F.col("mm_st").cast("int").alias("mm_st"),
        ]
        for c in self.plan.columns:
            if c.kind == "binary":
                cols.append(F.hex(F.col(c.alias)).alias(c.alias))
            elif c.kind == "json":
                # the value, not its spelling: keys sorted, no spaces, 1.50 as 1.5 (PostgreSQL's
                # jsonb orders keys its own way, SQLite and MariaDB keep the text written); text
                # that is not JSON stays as it is, and JSON null apart from SQL NULL
                cols.append(F.expr(f"coalesce(to_json(try_parse_json({c.alias})), {c.alias})").alias(c.alias))
            else:
                cols.append(F.expr(f"try_cast({c.alias} AS {SPARK_TYPE[c.kind]})").alias(c.alias))
        return df.select(*cols)


def _row_hash(plan: TablePlan):
    from pyspark.sql import functions as F

    if not plan.columns:
        return F.lit(0).cast("bigint")
    return F.xxhash64(F.to_json(F.struct(*[F.col(c.alias) for c in plan.columns])))


def _jsonable(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return format(v.normalize(), "f")
    if isinstance(v, (_dt.datetime, _dt.date)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return v


@dataclass
class FullOutcome:
    rows: dict[str, int]
    fingerprints: dict[str, str]
    identities: int
    differing: int
    counts: dict[str, dict[str, int]]
    columns: dict[str, int]
    samples: list[Sample]
    unexplained: int = 0  # differing identities that no waiting change touches


def pending_identities(spark, sources: Mapping[str, JdbcSource], reads: list[tuple[str, str]]):
    """The distinct identities (``mm_rid``) that changes still on their way touch, read with Spark
    from each (site, query) of `reads` (spark.waiting.waiting_reads); None when nothing waits."""
    from pyspark.sql import functions as F

    if not reads:
        return None
    parts = []
    for site, sql in reads:
        src = sources[site]
        opts = dict(src.properties)
        if src.jdbc.read_types is not None:
            opts["customSchema"] = "mm_rid STRING"
        df = spark.read.jdbc(src.url, f"({sql}) mm_w", properties=opts)
        parts.append(df.select(F.col("mm_rid").cast("string").alias("mm_rid")))
    u = parts[0]
    for p in parts[1:]:
        u = u.unionByName(p)
    return u.distinct()


def _flag_waiting(diff, pending):
    """`diff` (one row per differing identity) with ``mm_wait``: a waiting change touches it."""
    from pyspark.sql import functions as F

    if pending is None:
        return diff.withColumn("mm_wait", F.lit(False))
    w = diff.join(pending.withColumn("mm_w", F.lit(True)), "mm_rid", "left")
    return w.withColumn("mm_wait", F.coalesce(F.col("mm_w"), F.lit(False))).drop("mm_w")


def _fp_hex(v: int | None) -> str:
    return f"{(v or 0) & 0xFFFFFFFFFFFFFFFF:016x}"


def grouped(sites: list[str], readers: Mapping[str, Callable[..., Any]], plan: TablePlan):
    """One row per identity over all sites: mm_rid, then st<i>, k<i>, h<i> per site i
    (state, key, value hash; NULL where site i does not know the identity). One shuffle."""
    from pyspark.sql import functions as F

    h = _row_hash(plan)
    parts = []
    for i, s in enumerate(sites):
        df = readers[s]()
        parts.append(df.select("mm_rid", "mm_key", "mm_st", h.alias("mm_h"), F.lit(i).alias("mm_site")))
    u = parts[0]
    for p in parts[1:]:
        u = u.unionByName(p)
    aggs = []
    for i in range(len(sites)):
        on = F.col("mm_site") == i
        aggs += [
            F.max(F.when(on, F.col("mm_st"))).alias(f"st{i}"),
            F.max(F.when(on, F.col("mm_key"))).alias(f"k{i}"),
            F.max(F.when(on, F.col("mm_h"))).alias(f"h{i}"),
        ]
    return u.groupBy("mm_rid").agg(*aggs)


def _differences(g, n: int):
    """Per identity, from the grouped rows of `n` sites: the site columns plus np (sites where the
    identity is present), anydead, and per site i p<i> (present), miss<i>, extra<i>, ka<i> / ha<i>
    (present sites agreeing with i on the key / the values), fp<i> (row fingerprint), kodd<i> /
    vodd<i> (i is in the minority); then keydiff, valdiff and anydiff."""
    from pyspark.sql import functions as F

    present = [F.coalesce(F.col(f"st{i}") == 0, F.lit(False)) for i in range(n)]
    dead = [F.coalesce(F.col(f"st{i}") == 1, F.lit(False)) for i in range(n)]
    npresent = sum((p.cast("int") for p in present[1:]), present[0].cast("int"))
    anydead = dead[0]
    for d in dead[1:]:
        anydead = anydead | d
    derived = [F.col("mm_rid")] + [F.col(f"{p}{i}") for i in range(n) for p in ("st", "k", "h")]
    derived.append(npresent.alias("np"))
    derived.append(anydead.alias("anydead"))

    def agree(prefix: str, i: int):
        terms = [
            (present[j] if j == i else present[j] & (F.col(f"{prefix}{j}") == F.col(f"{prefix}{i}"))).cast("int")
            for j in range(n)
        ]
        return sum(terms[1:], terms[0])

    for i in range(n):
        derived.append(present[i].alias(f"p{i}"))
        derived.append((~present[i] & (npresent > 0) & ~anydead).alias(f"miss{i}"))
        derived.append((present[i] & anydead).alias(f"extra{i}"))
        derived.append(agree("k", i).alias(f"ka{i}"))
        derived.append(agree("h", i).alias(f"ha{i}"))
        derived.append(F.when(present[i], F.xxhash64(F.col("mm_rid"), F.col(f"k{i}"), F.col(f"h{i}"))).alias(f"fp{i}"))
    d = g.select(*derived)
    keydiff = F.lit(False)
    valdiff = F.lit(False)
    for i in range(n):
        keydiff = keydiff | (F.col(f"p{i}") & (F.col(f"ka{i}") < F.col("np")))
        valdiff = valdiff | (F.col(f"p{i}") & (F.col(f"ha{i}") < F.col("np")))
    d = d.withColumn("keydiff", keydiff).withColumn("valdiff", valdiff)
    odd_cols = []
    for i in range(n):
        odd_cols.append((F.col("keydiff") & F.col(f"p{i}") & (F.col(f"ka{i}") * 2 <= F.col("np"))).alias(f"kodd{i}"))
        odd_cols.append((F.col("valdiff") & F.col(f"p{i}") & (F.col(f"ha{i}") * 2 <= F.col("np"))).alias(f"vodd{i}"))
    d = d.select("*", *odd_cols)
    anydiff = F.col("keydiff") | F.col("valdiff")
    for i in range(n):
        anydiff = anydiff | F.col(f"miss{i}") | F.col(f"extra{i}")
    return d.withColumn("anydiff", anydiff)


def _totals(d, n: int) -> dict[str, Any]:
    """One job: identities, differing, valdiff, and per site i rows<i>, fpx<i>, missing<i>,
    extra<i>, key<i>, values<i> over the difference columns `d` of `n` sites."""
    from pyspark.sql import functions as F

    def isum(c):
        return F.sum(F.col(c).cast("long"))

    tot = [F.count(F.lit(1)).alias("identities"), isum("anydiff").alias("differing"), isum("valdiff").alias("valdiff")]
    for i in range(n):
        tot += [
            isum(f"p{i}").alias(f"rows{i}"),
            F.bit_xor(F.col(f"fp{i}")).alias(f"fpx{i}"),
            isum(f"miss{i}").alias(f"missing{i}"),
            isum(f"extra{i}").alias(f"extra{i}"),
            isum(f"kodd{i}").alias(f"key{i}"),
            isum(f"vodd{i}").alias(f"values{i}"),
        ]
    return d.agg(*tot).collect()[0].asDict()


def _pick_samples(diff, n: int, counts: dict[str, dict[str, int]], sample_limit: int) -> list[tuple[str, Any]]:
    """One job: the first `sample_limit` differing identities of every kind present, those no
    waiting change touches first, then by rid; as (kind, row), those first again, then in kind
    order, then rid order."""
    from pyspark.sql import functions as F

    picked: list[tuple[str, Any]] = []
    kind_filters = {
        "missing": _any([F.col(f"miss{i}") for i in range(n)]),
        "extra": _any([F.col(f"extra{i}") for i in range(n)]),
        "key": F.col("keydiff"),
        "values": F.col("valdiff"),
    }
    wanted = [
        diff.filter(cond).orderBy("mm_wait", "mm_rid").limit(sample_limit).withColumn("mm_kind", F.lit(kind))
        for kind, cond in kind_filters.items()
        if sum(counts[kind].values()) and sample_limit > 0
    ]
    if wanted:
        sdf = wanted[0]
        for w in wanted[1:]:
            sdf = sdf.unionByName(w)
        got = sdf.collect()
        order = {k: i for i, k in enumerate(kind_filters)}
        for r in sorted(got, key=lambda r: (bool(r["mm_wait"]), order[r["mm_kind"]], r["mm_rid"])):
            picked.append((r["mm_kind"], r))
    return picked


def _sampled_values(
    readers: Mapping[str, Callable[..., Any]], sites: list[str], plan: TablePlan, rids: list[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """One job: the values of the identities `rids` present at each site, by site and rid (the rid
    filter reaches the JDBC query)."""
    from pyspark.sql import functions as F

    values: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in sites}
    if rids and plan.columns:
        vparts = [
            readers[s]().filter(F.col("mm_rid").isin(rids) & (F.col("mm_st") == 0)).withColumn("mm_site", F.lit(i))
            for i, s in enumerate(sites)
        ]
        vdf = vparts[0]
        for v in vparts[1:]:
            vdf = vdf.unionByName(v)
        for r in vdf.collect():
            values[sites[r["mm_site"]]][r["mm_rid"]] = {c.name: _jsonable(r[c.alias]) for c in plan.columns}
    return values


#: Spark's canonical kinds (spark/schema.py) as the column types values are compared as
#: (core/values.py): a sample's values come back as _jsonable made them (a decimal as text, a time
#: as ISO-8601, bytes as hex)
_AS_TYPE = {
    "long": ColumnType("int"),
    "double": ColumnType("float"),
    "decimal": ColumnType("decimal"),
    "boolean": ColumnType("bool"),
    "string": ColumnType("text"),
    "date": ColumnType("date"),
    "timestamp": ColumnType("timestamp"),
    "binary": ColumnType("text"),
}


def _sample(kind: str, r: Any, sites: list[str], values: dict[str, dict[str, dict[str, Any]]], plan: TablePlan) -> Sample:
    """A sampled identity of `kind`: per site its state, key and values; the sites it is counted
    against; for a values difference, the columns that differ."""
    per: dict[str, dict[str, Any]] = {}
    odd: list[str] = []
    for i, s in enumerate(sites):
        st = r[f"st{i}"]
        entry: dict[str, Any] = {"state": STATE.get(st, "unknown")}
        if st is not None:
            entry["key"] = _jsonable(r[f"k{i}"])
        if st == 0:
            entry["values"] = values[s].get(r["mm_rid"], {})
        per[s] = entry
        flag = {"missing": f"miss{i}", "extra": f"extra{i}", "key": f"kodd{i}", "values": f"vodd{i}"}[kind]
        if r[flag]:
            odd.append(s)
    cols: list[str] = []
    if kind == "values":
        vs = [per[s]["values"] for s in sites if per[s]["state"] == "present"]
        cols = [
            c.name
            for c in plan.columns
            if any(differing(vs[0], v, [c.name], {c.name: _AS_TYPE.get(c.kind, ColumnType())}) for v in vs[1:])
        ]
    return Sample(kind, r["mm_rid"], per, odd, cols, waiting=bool(r["mm_wait"]))


def _column_counts(diff, readers: Mapping[str, Callable[..., Any]], sites: list[str], plan: TablePlan) -> dict[str, int]:
    """Per column, the identities whose values differ in that column (columns with none left out)."""
    from pyspark.sql import functions as F

    vd = diff.filter(F.col("valdiff")).select("mm_rid")
    parts = []
    for s in sites:
        df = readers[s]().filter(F.col("mm_st") == 0).join(vd, "mm_rid", "left_semi")
        parts.append(df.select("mm_rid", *[F.xxhash64(F.to_json(F.struct(F.col(c.alias)))).alias(c.alias) for c in plan.columns]))
    uv = parts[0]
    for p in parts[1:]:
        uv = uv.unionByName(p)
    per_rid = uv.groupBy("mm_rid").agg(*[(F.min(c.alias) != F.max(c.alias)).alias(c.alias) for c in plan.columns])
    cr = per_rid.agg(*[F.sum(F.col(c.alias).cast("long")).alias(c.alias) for c in plan.columns]).collect()[0]
    return {c.name: int(cr[c.alias] or 0) for c in plan.columns if cr[c.alias]}


def compare_full(
    spark,
    sites: list[str],
    readers: Mapping[str, Callable[..., Any]],
    plan: TablePlan,
    sample_limit: int,
    pending: Callable[[], Any] | None = None,
) -> FullOutcome:
    """Compare every site at once. readers[site]() returns the site's canonical DataFrame;
    pending(), called only when something differs, the identities that changes on their way touch
    (pending_identities; None: nothing waits): the differing identities outside it are counted as
    `unexplained`."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    n = len(sites)
    d = _differences(grouped(sites, readers, plan), n)
    t = _totals(d, n)
    rows = {s: int(t[f"rows{i}"] or 0) for i, s in enumerate(sites)}
    fps = {s: _fp_hex(t[f"fpx{i}"]) for i, s in enumerate(sites)}
    counts = {k: {s: int(t[f"{k}{i}"] or 0) for i, s in enumerate(sites)} for k in ("missing", "extra", "key", "values")}
    identities, differing = int(t["identities"] or 0), int(t["differing"] or 0)
    columns: dict[str, int] = {}
    samples: list[Sample] = []
    if differing == 0:
        return FullOutcome(rows, fps, identities, 0, counts, columns, samples)

    waiting = pending() if pending is not None else None
    diff = _flag_waiting(d.filter(F.col("anydiff")), waiting).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        unexplained = differing if waiting is None else diff.filter(~F.col("mm_wait")).count()
        picked = _pick_samples(diff, n, counts, sample_limit)
        values = _sampled_values(readers, sites, plan, sorted({r["mm_rid"] for _, r in picked}))
        samples = [_sample(kind, r, sites, values, plan) for kind, r in picked]
        # per-column counts over every identity whose values differ
        if int(t["valdiff"] or 0) and plan.columns:
            columns = _column_counts(diff, readers, sites, plan)
    finally:
        diff.unpersist()
    return FullOutcome(rows, fps, identities, differing, counts, columns, samples, unexplained)


def _any(conds):
    out = conds[0]
    for c in conds[1:]:
        out = out | c
    return out


@dataclass
class ChecksumOutcome:
    rows: dict[str, int]
    fingerprints: dict[str, str]
    buckets: int
    differing_buckets: list[int]
    full: FullOutcome | None


def compare_checksum(
    spark,
    sites: list[str],
    readers: dict[str, SiteReader],
    plan: TablePlan,
    bounds: Bounds,
    buckets: int,
    sample_limit: int,
    partitions: int,
    pending: Callable[[], Any] | None = None,
) -> ChecksumOutcome:
    """Merkle-style: (count, bit_xor of row hashes) per site and key range; then a full compare
    restricted to the ranges whose hashes differ (`pending`: as compare_full's)."""
    from pyspark.sql import functions as F

    h = _row_hash(plan)
    # integer keys with bounds (key_bounds sets lo and hi together): buckets are key ranges
    lo, hi = bounds.lo, bounds.hi
    int_keys = plan.key_kind == "long" and lo is not None
    if int_keys:
        if lo is None or hi is None:
            raise ValueError(f"table '{plan.table}': key bounds have lo={lo!r} but hi={hi!r}")
        width = max(1, math.ceil((hi - lo + 1) / buckets))
        nb = math.ceil((hi - lo + 1) / width)
        bucket = F.floor((F.col("mm_key") - F.lit(lo)) / F.lit(width)).cast("int")
    else:
        width, nb = 0, buckets
        bucket = F.pmod(F.xxhash64(F.col("mm_rid")), F.lit(buckets)).cast("int")
    parts = []
    for i, s in enumerate(sites):
        df = readers[s].read().filter(F.col("mm_st") == 0)
        parts.append(
            df.select(
                F.lit(i).alias("mm_site"),
                bucket.alias("mm_b"),
                F.xxhash64(F.col("mm_rid"), F.col("mm_key"), h).alias("mm_fp"),
            )
        )
    u = parts[0]
    for p in parts[1:]:
        u = u.unionByName(p)
    res = u.groupBy("mm_site", "mm_b").agg(F.count(F.lit(1)).alias("n"), F.bit_xor("mm_fp").alias("x")).collect()
    per: dict[int, dict[int, tuple[int, int]]] = {}
    rows = {s: 0 for s in sites}
    fpx = {s: 0 for s in sites}
    for r in res:
        s = sites[r["mm_site"]]
        per.setdefault(r["mm_b"], {})[r["mm_site"]] = (int(r["n"]), int(r["x"]))
        rows[s] += int(r["n"])
        fpx[s] ^= int(r["x"])
    differing = sorted(b for b, m in per.items() if len(m) != len(sites) or len(set(m.values())) > 1)
    fps = {s: _fp_hex(v) for s, v in fpx.items()}
    if not differing:
        return ChecksumOutcome(rows, fps, nb, [], None)
    if int_keys and lo is not None:
        # merge adjacent ranges, spread them over at most `partitions` predicates
        ranges: list[list[int]] = []
        for b in differing:
            a, z = lo + b * width, lo + (b + 1) * width
            if ranges and ranges[-1][1] == a:
                ranges[-1][1] = z
            else:
                ranges.append([a, z])
        groups = [ranges[i :: max(1, partitions)] for i in range(min(len(ranges), max(1, partitions)))]
        preds = [" OR ".join(f"(mm_key >= {a} AND mm_key < {z})" for a, z in g) for g in groups if g]
        sub = {s: (lambda s=s: readers[s].read(predicates=preds)) for s in sites}
    else:
        keep = F.pmod(F.xxhash64(F.col("mm_rid")), F.lit(buckets)).cast("int").isin(differing)
        sub = {s: (lambda s=s: readers[s].read().filter(keep)) for s in sites}
    full = compare_full(spark, sites, sub, plan, sample_limit, pending)
    return ChecksumOutcome(rows, fps, nb, differing, full)


def elapsed(t0: float) -> float:
    return time.perf_counter() - t0
