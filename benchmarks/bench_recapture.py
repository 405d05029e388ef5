"""What `multimaster recapture` costs on a large table (docs/schema-changes.md "A table made again"):
seconds and peak memory of one run comparing `--rows` rows of a 2-site cluster, 1 % of them changed
while capture was missing.

    .venv/bin/python benchmarks/bench_recapture.py                    # 100,000 rows, every database
    .venv/bin/python benchmarks/bench_recapture.py --rows 20000 --databases sqlite

The table is made again at site a (a copy into a new table, as alembic's batch mode does on SQLite;
DROP and CREATE elsewhere), then 1 % of its rows are updated there without capture; one refresh
finds the gap; recapture is timed (it reads both sites' rows and sends the updates).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import BACKENDS, make_cluster  # noqa: E402
from test_recapture import _remake  # noqa: E402

from multimaster import api  # noqa: E402


def run(db: str, rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cl = make_cluster(
            BACKENDS[db](), Path(tmp), ["a", "b"], {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
        )
        c = cl.db("a")
        cur = c.cursor()
        p = cl.backend.param()
        cur.executemany(f"INSERT INTO items (name, qty) VALUES ({p}, {p})", [(f"r{i}", i) for i in range(rows)])
        c.commit()
        c.close()
        cl.refresh_until_quiet()
        _remake(cl, "a")
        cl.execute("a", "UPDATE items SET qty = qty + 1 WHERE MOD(id, 100) = 0")
        api.refresh(cl.topo)
        t0 = time.perf_counter()
        (rep,) = api.recapture(cl.topo, "a", ["items"])
        dt = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{db:10s} rows {rows:>9,}  recapture {dt:6.2f} s  ({rows / dt:,.0f} rows/s compared)  "
            f"updates sent {len(rep.updated):,}  closed {rep.closed}  process peak {peak:,.0f} MB",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--databases", default="sqlite,postgresql,mysql")
    a = ap.parse_args()
    for db in a.databases.split(","):
        run(db, a.rows)


if __name__ == "__main__":
    main()
