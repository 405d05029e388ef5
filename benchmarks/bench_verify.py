"""Benchmark of `multimaster verify` (Spark, local mode) on SQLite sites.

    .venv/bin/python benchmarks/bench_verify.py                    # 3 x 1M rows, checksum on 3 x 10M
    .venv/bin/python benchmarks/bench_verify.py --rows 100000 --big-rows 1000000   # quicker

Measures, on three converged SQLite sites of --rows rows each (set up by `multimaster init`):
  - full compare (Spark local[*]): seconds cold (incl. session start) and warm, rows compared/s;
  - peak memory: the Python driver process (ru_maxrss) and the JVM (VmHWM);
  - the same comparison by a plain single-process Python script (sqlite3, dicts) as the baseline;
and on three converged sites of --big-rows rows: checksum-only time vs the full compare.
Prints a Markdown table and writes JSON next to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from multimaster import api  # noqa: E402
from multimaster.config.topology import load_topology  # noqa: E402

BASELINE = r"""
import sqlite3, sys, time, resource, json
paths = sys.argv[1:]
t0 = time.perf_counter()
Q = ("SELECT s.rid, s.key, t.name, t.qty, t.price FROM _mm_shadow_items s "
     "JOIN items t ON t.id = s.key")
ref = {}
c = sqlite3.connect(paths[0])
for rid, key, *vals in c.execute(Q):
    ref[rid] = (key, hash(tuple(vals)))
c.close()
diffs = 0
for p in paths[1:]:
    seen = 0
    c = sqlite3.connect(p)
    for rid, key, *vals in c.execute(Q):
        r = ref.get(rid)
        seen += 1
        if r is None or r[0] != key or r[1] != hash(tuple(vals)):
            diffs += 1
    c.close()
    diffs += len(ref) - seen if seen <= len(ref) else 0
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "diffs": diffs, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def jvm_peak_mb(spark) -> float | None:
    try:
        pid = spark.sparkContext._gateway.proc.pid
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except Exception:  # noqa: BLE001
        return None
    return None


def make_sqlite_cluster(directory: Path, n_sites: int, rows: int) -> Path:
    """n SQLite sites s1..sn (mesh) holding the same `rows` rows of items(id, name, qty, price),
    then `multimaster init` (the rows are the common base): a converged cluster."""
    import shutil

    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    names = [f"s{i + 1}" for i in range(n_sites)]
    first = directory / "s1.db"
    for p in directory.glob("s*.db*"):
        p.unlink()
    c = sqlite3.connect(first, isolation_level=None)
    c.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)")
    c.execute("BEGIN")
    c.executemany(
        "INSERT INTO items VALUES (?,?,?,?)", ((i, f"item {i}", i % 97, round(i * 0.25, 2)) for i in range(1, rows + 1))
    )
    c.execute("COMMIT")
    c.close()
    for s in names[1:]:
        shutil.copyfile(first, directory / f"{s}.db")
    doc = {
        "sites": {s: {"url": f"sqlite:///{directory / (s + '.db')}"} for s in names},
        "tables": {"items": {"key": "id"}},
        "links": "mesh",
    }
    path = directory / "topology.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    api.init(load_topology(path))
    return path


def build(directory: Path, rows: int) -> Path:
    t0 = time.perf_counter()
    topo = make_sqlite_cluster(directory, 3, rows)
    print(f"  built 3 x {rows:,} rows in {time.perf_counter() - t0:.1f}s", flush=True)
    return topo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--big-rows", type=int, default=10_000_000, help="rows per site for checksum-only vs full (0: skip)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--dir", default=None, help="where the SQLite files go (default: a temp dir, removed)")
    ap.add_argument("--out", default=None, help="write the JSON figures here")
    a = ap.parse_args()
    base = Path(a.dir or tempfile.mkdtemp(prefix="mm-bench-verify-"))
    fig: dict = {"rows_per_site": a.rows, "sites": 3, "partitions": a.partitions, "cores": os.cpu_count()}

    print(f"[1] three SQLite sites of {a.rows:,} rows", flush=True)
    topo = build(base / "m", a.rows)
    from multimaster.spark import verify

    t0 = time.perf_counter()
    r = verify(topo, partitions=a.partitions)
    fig["full_cold_s"] = time.perf_counter() - t0
    assert r.converged, r.to_dict()
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        r = verify(topo, spark=spark, partitions=a.partitions)
        times.append(time.perf_counter() - t0)
    fig["full_warm_s"] = min(times)
    fig["rows_compared_per_s"] = 3 * a.rows / fig["full_warm_s"]
    t0 = time.perf_counter()
    r = verify(topo, spark=spark, partitions=a.partitions, checksum_only=True)
    fig["checksum_warm_s_small"] = time.perf_counter() - t0
    fig["driver_python_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fig["jvm_peak_mb"] = jvm_peak_mb(spark)

    t = load_topology(topo)
    paths = [t.sites[s].url.replace("sqlite:///", "") for s in t.sites]
    out = subprocess.run([sys.executable, "-c", BASELINE, *paths], capture_output=True, text=True, check=True)
    b = json.loads(out.stdout)
    fig["python_baseline_s"] = b["seconds"]
    fig["python_baseline_peak_mb"] = b["maxrss_mb"]
    fig["python_rows_per_s"] = 3 * a.rows / b["seconds"]
    fig["spark_vs_python_speedup"] = b["seconds"] / fig["full_warm_s"]

    if a.big_rows:
        print(f"[2] three SQLite sites of {a.big_rows:,} rows: checksum-only vs full", flush=True)
        import shutil

        shutil.rmtree(base / "m", ignore_errors=True)
        big = build(base / "big", a.big_rows)
        t0 = time.perf_counter()
        r = verify(big, spark=spark, partitions=a.partitions, checksum_only=True)
        fig["big_checksum_s"] = time.perf_counter() - t0
        assert r.converged
        t0 = time.perf_counter()
        r = verify(big, spark=spark, partitions=a.partitions)
        fig["big_full_s"] = time.perf_counter() - t0
        assert r.converged
        fig["big_rows_per_site"] = a.big_rows
        fig["big_full_over_checksum"] = fig["big_full_s"] / fig["big_checksum_s"]
        fig["jvm_peak_mb"] = jvm_peak_mb(spark)
        fig["driver_python_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if not a.dir:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(fig, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(fig, indent=2))
    print("\n| measure | value |\n| --- | --- |")
    for k, v in fig.items():
        print(f"| {k} | {v:,.2f} |" if isinstance(v, float) else f"| {k} | {v} |")


if __name__ == "__main__":
    main()
