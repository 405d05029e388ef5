"""The fixed cost of polling: one idle refresh round (every link of a 3-site mesh, 4 tables, nothing
to pull), in milliseconds, median of `--repeat` rounds (docs/performance.md "Following schemas").

    .venv/bin/python benchmarks/bench_idle.py                          # this tree, every database
    .venv/bin/python benchmarks/bench_idle.py --tree /work/wt-before --tree . --runs 3

With several `--tree`s (checkouts of other commits, each with the same .venv), each is measured in a
subprocess of its own with PYTHONPATH set to it, alternately, `--runs` times, on a fresh cluster
each time, and the ratio of every tree to the first is printed (median of the paired ratios).
An idle round is what a refresher pays every interval even when nothing changed: per link, the
follow of both ends' schemas (one catalog read of each table's columns and capture triggers,
once per site per round), the horizon and watermark reads, the pull that finds nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(backend: str, repeat: int, tree: Path) -> float:
    """Median ms of an idle refresh round, on a fresh 3-site mesh of `tree` (in-process; its
    package is first on PYTHONPATH)."""
    sys.path.insert(0, str(tree / "tests"))
    from clusters import BACKENDS, make_cluster

    from multimaster import api

    tables = {f"t{i}": {"key": "id", "columns": {"name": "text", "qty": "int"}} for i in range(4)}
    with tempfile.TemporaryDirectory() as tmp:
        cl = make_cluster(BACKENDS[backend](), Path(tmp), ["a", "b", "c"], tables)
        with api.Cluster(cl.topo) as c:
            api.refresh(c)
            xs = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                api.refresh(c)
                xs.append((time.perf_counter() - t0) * 1000)
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--databases", default="sqlite,postgresql,mysql")
    ap.add_argument("--repeat", type=int, default=15, help="idle rounds per measurement")
    ap.add_argument("--tree", action="append", help="a checkout to measure (repeatable); default: this one")
    ap.add_argument("--runs", type=int, default=3, help="alternations per tree")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a subprocess's single measurement
    a = ap.parse_args()
    if a.one:
        print(f"{measure(a.one, a.repeat, Path(os.environ['PYTHONPATH'])):.2f}")
        return
    trees = [Path(t).resolve() for t in a.tree or [str(ROOT)]]
    for db in a.databases.split(","):
        got: dict[Path, list[float]] = {t: [] for t in trees}
        for _ in range(a.runs):
            for t in trees:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", db, "--repeat", str(a.repeat)],
                    env={**os.environ, "PYTHONPATH": str(t)},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                got[t].append(float(out.stdout.strip().splitlines()[-1]))
        line = [f"{db:10s}"]
        for t in trees:
            line.append(f"{t.name}: {statistics.median(got[t]):7.1f} ms")
            if t != trees[0]:
                ratios = [x / y for x, y in zip(got[t], got[trees[0]])]
                line.append(f"ratio {statistics.median(ratios):.2f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
