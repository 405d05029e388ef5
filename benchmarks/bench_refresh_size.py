"""A small refresh of a large table: does its time grow with the table?

    .venv/bin/python benchmarks/bench_refresh_size.py [--servers postgresql,mysql,sqlite]
                                                      [--sizes 40,20000,200000] [--refreshes 8]

Per server and table size: two sites holding the same `--sizes` rows (copied in before init), then
`--refreshes` times: two single-row UPDATEs at the first site and one refresh of the second from
it. Printed: the median milliseconds per refresh and its ratio to the smallest table's (1.0: the
table's size does not matter, as it should not for two changes). Databases are created with unique
names and dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import BACKENDS, ITEMS, make_cluster  # noqa: E402

from multimaster import api  # noqa: E402


def one(backend: object, n: int, k: int) -> float:
    """Median seconds of a refresh of two changes into a table of `n` rows."""
    tmp = Path(tempfile.mkdtemp(prefix="mm-bench-size-"))
    a, b = f"a{n}", f"b{n}"
    cl = make_cluster(backend, tmp, [a, b], ITEMS, init=False)  # type: ignore[arg-type]
    ph = backend.param()  # type: ignore[attr-defined]
    rows = [(i + 1, f"r{i}", i, 0.5) for i in range(n)]
    for s in (a, b):
        c = cl.db(s)
        cur = c.cursor()
        for i in range(0, n, 5000):
            cur.executemany(f"INSERT INTO items (id, name, qty, price) VALUES ({ph}, {ph}, {ph}, {ph})", rows[i : i + 5000])
        c.commit()
        c.close()
    api.init(cl.topo)
    times = []
    with api.Cluster(cl.topo) as cc:
        api.refresh(cc)
        for j in range(k):
            cl.execute(a, f"UPDATE items SET qty = qty + 1 WHERE id = {j + 1}")
            cl.execute(a, f"UPDATE items SET qty = qty + 1 WHERE id = {n - j}")
            t0 = time.perf_counter()
            res = api.refresh(cc, b, a)
            times.append(time.perf_counter() - t0)
            assert not res[0].error, res[0].error
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default="postgresql,mysql,sqlite")
    ap.add_argument("--sizes", default="40,20000,200000")
    ap.add_argument("--refreshes", type=int, default=8)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    for server in a.servers.split(","):
        backend = BACKENDS[server]()
        try:
            med = {n: one(backend, n, a.refreshes) for n in sizes}
        finally:
            backend.cleanup()
        base = med[sizes[0]]
        print(f"{server:10s} " + ", ".join(f"{n} rows {med[n] * 1000:.1f} ms ({med[n] / base:.2f})" for n in sizes))


if __name__ == "__main__":
    main()
