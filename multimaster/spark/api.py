"""verify(): the Python API of the convergence checker (what the CLI and scheduled checks call)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from multimaster.config.secrets import redact
from multimaster.config.topology import Topology, hidden_url, load_topology
from multimaster.errors import AgentOnly, ConfigError, SiteUnreachable
from multimaster.spark.jdbc import MissingDependency, dialect_of, find_jars, jdbc_source
from multimaster.spark.result import TableResult, VerifyResult, table_status

__all__ = ["verify", "DEFAULT_PARTITIONS", "DEFAULT_SAMPLE", "DEFAULT_BUCKETS"]

DEFAULT_PARTITIONS = 4
DEFAULT_SAMPLE = 20
DEFAULT_BUCKETS = 64


def _engines(topo: Topology, sites: list[str]) -> dict[str, sa.Engine]:
    engines = {}
    for s in sites:
        url = topo.sites[s].url
        db = dialect_of(url).database_file(url)
        if db is not None and not Path(db).exists():  # connecting would create an empty file
            raise SiteUnreachable(s, hidden_url(url), f"the database file {db} does not exist")
        eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with eng.connect() as c:
                c.execute(sa.text("SELECT 1"))
        except Exception as e:  # noqa: BLE001 - any driver error means unreachable here
            reason = str(getattr(e, "orig", e)).splitlines()[0][:300] if str(e) else type(e).__name__
            raise SiteUnreachable(s, hidden_url(url), redact(reason)) from None
        engines[s] = eng
    return engines


def verify(
    topology: Topology | str | os.PathLike[str],
    tables: list[str] | None = None,
    master: str = "local[*]",
    partitions: int = DEFAULT_PARTITIONS,
    sample_limit: int = DEFAULT_SAMPLE,
    checksum_only: bool = False,
    buckets: int = DEFAULT_BUCKETS,
    *,
    spark=None,
    jars: list[str] | None = None,
    sites: list[str] | None = None,
    fetchsize: int = 10_000,
    spark_conf: dict[str, str] | None = None,
) -> VerifyResult:
    """Check that every site holds the same rows (identities, keys, replicated column values).

    topology: a loaded Topology or the path of a topology file.
    tables: replicated tables to check (default: all). sites: sites to check (default: every site
    whose `verify` is not false). partitions: JDBC reads per site, split by key range.
    sample_limit: differing identities returned per kind. checksum_only: hash `buckets` key
    ranges per site first and compare rows only in the ranges that differ.
    spark: an existing SparkSession to use (its spark.jars must hold the JDBC drivers).
    jars: extra/override JDBC jar paths (MM_JDBC_JARS does the same from the environment).

    Raises ConfigError (bad topology / unknown table or site), MissingDependency (Java, PySpark or a
    JDBC jar), SchemaError, SiteUnreachable. Store `result.to_dict()` for later.
    """
    t_start = time.perf_counter()
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    names = list(tables) if tables else list(topo.tables)
    unknown = [t for t in names if t not in topo.tables]
    if unknown:
        raise ConfigError([f"table '{t}' is not under 'tables' in the topology (known: {sorted(topo.tables)})" for t in unknown])
    chosen = list(sites) if sites else [s for s, cfg in topo.sites.items() if cfg.verify]
    bad = [s for s in chosen if s not in topo.sites]
    if bad:
        raise ConfigError([f"site '{s}' is not under 'sites' in the topology" for s in bad])
    remote = [s for s in chosen if topo.sites[s].agent]
    if remote:  # Spark reads every site's tables over JDBC; an agent serves change logs only
        raise AgentOnly(remote[0], topo.sites[remote[0]].url, "verify (Spark reads every site's tables over JDBC)")
    if len(chosen) < 2:
        raise ConfigError(["verify needs at least two sites to compare (sites with 'verify: false' are skipped)"])
    if partitions < 1 or buckets < 1:
        raise ConfigError(["partitions and buckets must be at least 1"])
    sources = {s: jdbc_source(s, topo.sites[s].url, fetchsize) for s in chosen}
    jar_paths = find_jars({src.dialect for src in sources.values()}, jars)

    from multimaster.core.versions import started_at_now as now_iso
    from multimaster.spark.compare import SiteReader, compare_checksum, compare_full, key_bounds, pending_identities
    from multimaster.spark.schema import reflect_table
    from multimaster.spark.session import get_spark, planning
    from multimaster.spark.waiting import waiting_changes, waiting_reads

    started = now_iso()
    engines = _engines(topo, chosen)
    plans = contextlib.ExitStack()
    try:
        if spark is None:
            spark = get_spark(master, jar_paths, partitions, spark_conf)
        used_master = spark.sparkContext.master
        results: dict[str, TableResult] = {}
        plans.enter_context(planning(spark))
        for name in names:
            t0 = time.perf_counter()
            cfg = topo.tables[name]
            plan = reflect_table(name, cfg.key, list(cfg.exclude), engines, sources)
            bounds = key_bounds(plan, engines, sources, partitions)
            readers = {s: SiteReader(spark, sources[s], plan, bounds, partitions) for s in chosen}
            waiting = waiting_changes(topo, name, engines)
            # the bounds of what is on its way are read before the rows, the identities after:
            # a change in flight at any moment of the compare explains its row (docs/verify.md)
            reads = waiting_reads(topo, name, engines)

            def pending(reads: list[tuple[str, str]] = reads) -> Any:
                return pending_identities(spark, sources, reads)

            if checksum_only:
                co = compare_checksum(spark, chosen, readers, plan, bounds, buckets, sample_limit, partitions, pending)
                full = co.full
                rows, fps = co.rows, co.fingerprints
                identities = max(rows.values()) if rows else 0
                if full is not None:
                    identities = max(identities, full.identities)
            else:
                full = compare_full(spark, chosen, {s: readers[s].read for s in chosen}, plan, sample_limit, pending)
                rows, fps, identities = full.rows, full.fingerprints, full.identities
            differing = full.differing if full else 0
            unexplained = full.unexplained if full else 0
            results[name] = TableResult(
                table=name,
                status=table_status(differing, unexplained),
                rows=rows,
                fingerprints=fps,
                identities=identities,
                differing=differing,
                counts=full.counts if full else {k: {s: 0 for s in chosen} for k in ("missing", "extra", "key", "values")},
                columns=full.columns if full else {},
                samples=full.samples if full else [],
                waiting=waiting,
                mode="checksum" if checksum_only else "full",
                buckets=co.buckets if checksum_only else 0,
                buckets_differing=len(co.differing_buckets) if checksum_only else 0,
                seconds=time.perf_counter() - t0,
                unexplained=unexplained,
            )
    finally:
        plans.close()
        for e in engines.values():
            e.dispose()
    return VerifyResult(
        sites=chosen,
        tables=results,
        master=used_master,
        mode="checksum" if checksum_only else "full",
        started_at=started,
        seconds=time.perf_counter() - t_start,
    )


__all__ += ["MissingDependency"]
