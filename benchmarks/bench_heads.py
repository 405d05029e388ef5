"""What keeping concurrent heads costs an application's updates (docs/conflicts.md "Concurrent heads").

    .venv/bin/python benchmarks/bench_heads.py [--servers sqlite,postgresql,mysql] [--rows 1000]
                                                [--updates 400] [--rounds 3]

A slot whose policy chooses among concurrent heads (earliest, maximum, minimum, priority, custom)
makes the capture of an update read the heads it supersedes from the shadow row; `latest` and
`additive` slots capture as before. On each server, three databases side by side: plain (no
multimaster), a multimaster site whose `qty` is `latest` (the default), and one whose `qty` is
`maximum`. One connection each runs `--updates` transactions of one UPDATE of `qty` of a random row
(of `--rows`), round by round, interleaved. Printed: the median seconds per transaction and the
ratios plain / latest, plain / maximum and latest / maximum (1.0: no cost). SQLite runs in WAL
with synchronous=NORMAL, as bench_sqlite.py: with an fsync per commit the disk's noise hides
the capture.
Databases are created with unique names and dropped at the end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import BACKENDS, ITEMS, make_cluster  # noqa: E402


def _updates(backend: Any, url: str, rows: int, k: int, seed: int) -> float:
    """Seconds per transaction of one UPDATE of a random row."""
    rnd = random.Random(seed)
    c = backend.connect(url)
    if backend.name == "sqlite":  # as bench_sqlite.py: commits without an fsync each (WAL)
        c.execute("PRAGMA synchronous = NORMAL")
    cur = c.cursor()
    ph = backend.param()
    t0 = time.perf_counter()
    for _ in range(k):
        cur.execute(f"UPDATE items SET qty = qty + 1 WHERE id = {ph}", (rnd.randint(1, rows),))
        c.commit()
    dt = (time.perf_counter() - t0) / k
    c.close()
    return dt


def run(server: str, rows: int, k: int, rounds: int) -> dict[str, Any]:
    backend = BACKENDS[server]()
    try:
        tmp = Path(tempfile.mkdtemp(prefix="mm-bench-heads-"))
        urls = {}
        plain = backend.new_site(tmp, "plain")
        backend.create_table(plain, "items", "id", ITEMS["items"]["columns"], True)
        if server == "sqlite":  # as init leaves a site's file: WAL (a property of the file)
            c = backend.connect(plain)
            c.execute("PRAGMA journal_mode = WAL")
            c.close()
        urls["plain"] = plain
        for name, cfg in (("latest", {}), ("maximum", {"columns": {"qty": "maximum"}})):
            d = tmp / name
            d.mkdir()
            cl = make_cluster(backend, d, [f"{name}1", f"{name}2"], {"items": {**ITEMS["items"], "config": cfg}})
            urls[name] = cl.urls[f"{name}1"]
        for url in urls.values():
            c = backend.connect(url)
            cur = c.cursor()
            ph = backend.param()
            cur.executemany(
                f"INSERT INTO items (name, qty, price) VALUES ({ph}, {ph}, {ph})", [(f"r{i}", i, 0.5) for i in range(rows)]
            )
            c.commit()
            c.close()
        times: dict[str, list[float]] = {n: [] for n in urls}
        for r in range(rounds):
            for name in urls if r % 2 == 0 else reversed(list(urls)):
                times[name].append(_updates(backend, urls[name], rows, k, seed=r))
        med = {n: statistics.median(v) for n, v in times.items()}
        return {
            "server": server,
            "ms": {n: round(v * 1000, 3) for n, v in med.items()},
            "plain/latest": round(med["plain"] / med["latest"], 2),
            "plain/maximum": round(med["plain"] / med["maximum"], 2),
            "latest/maximum": round(med["latest"] / med["maximum"], 2),
        }
    finally:
        backend.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default="sqlite,postgresql,mysql")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for server in a.servers.split(","):
        res = run(server, a.rows, a.updates, a.rounds)
        ms = ", ".join(f"{n} {v} ms" for n, v in res["ms"].items())
        print(
            f"{server:10s} per update: {ms}; plain/latest {res['plain/latest']}, plain/maximum {res['plain/maximum']}, "
            f"latest/maximum {res['latest/maximum']}"
        )


if __name__ == "__main__":
    main()
