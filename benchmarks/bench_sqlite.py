"""SQLite speed and memory, measured side by side in one run (WAL, synchronous=NORMAL).

    .venv/bin/python benchmarks/bench_sqlite.py            # full size (1M-row table, 1M backlog)
    .venv/bin/python benchmarks/bench_sqlite.py --quick    # a tenth of everything

Prints three figures with their targets (issue "Core engine"):
1. capture overhead: single-row-transaction insert rate with capture triggers / without (>= 0.5);
2. apply rate: reconciling N remote inserts + N remote updates into a big table / a plain
   executemany of the same inserts and updates into the same table (>= 0.15);
3. peak memory of a refresh pulling a backlog of M changes (< 500 MB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multimaster import api  # noqa: E402
from multimaster.config.topology import parse_topology  # noqa: E402

SCHEMA = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)"


def connect(path: Path) -> sqlite3.Connection:
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = NORMAL")
    return c


def topology(d: Path, sites: list[str]):  # type: ignore[no-untyped-def]
    return parse_topology(
        {
            "sites": {s: {"url": f"sqlite:///{d / (s + '.db')}"} for s in sites},
            "tables": {"items": {"key": "id"}},
            "links": "mesh",
        },
        base=d,
    )


def single_row_rate(path: Path, n: int) -> float:
    c = connect(path)
    t0 = time.perf_counter()
    for i in range(n):
        c.execute("BEGIN")
        c.execute("INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", (f"name-{i}", i, i * 0.5))
        c.execute("COMMIT")
    dt = time.perf_counter() - t0
    c.close()
    return n / dt


def capture_overhead(d: Path, n: int, repeats: int = 3) -> dict[str, float]:
    plain, trig = d / "plain.db", d / "trig.db"
    for p in (plain, trig):
        connect(p).execute(SCHEMA)
    connect(d / "peer.db").execute(SCHEMA)
    t = parse_topology(
        {
            "sites": {"trig": {"url": f"sqlite:///{trig}"}, "peer": {"url": f"sqlite:///{d / 'peer.db'}"}},
            "tables": {"items": {"key": "id"}},
            "links": "mesh",
        }
    )
    api.init(t)
    without, with_ = [], []
    for _ in range(repeats):  # interleaved: the machine's noise hits both alike
        without.append(single_row_rate(plain, n))
        with_.append(single_row_rate(trig, n))
    a, b = statistics.median(without), statistics.median(with_)
    return {"rows_per_s_without": round(a), "rows_per_s_with_capture": round(b), "ratio": round(b / a, 3)}


def make_base(path: Path, rows: int) -> None:
    c = connect(path)
    c.execute(SCHEMA)
    c.execute("BEGIN")
    c.executemany(
        "INSERT INTO items (id, name, qty, price) VALUES (?, ?, ?, ?)",
        ((i, f"base-{i}", i % 100, i * 0.25) for i in range(1, rows + 1)),
    )
    c.execute("COMMIT")
    c.close()


def workload(rows: int, n: int) -> tuple[list[tuple], list[tuple]]:  # type: ignore[type-arg]
    inserts = [(f"new-{i}", i % 7, i * 0.1) for i in range(n)]
    step = max(1, rows // n)
    updates = [(i % 50, i * 0.3, 1 + (i * step) % rows) for i in range(n)]
    return inserts, updates


def apply_rate(d: Path, rows: int, n: int) -> dict[str, float]:
    base = d / "base.db"
    make_base(base, rows)
    for s in ("a", "b"):
        shutil.copy(base, d / f"{s}.db")
    shutil.copy(base, d / "plain.db")
    t = topology(d, ["a", "b"])
    api.init(t)
    inserts, updates = workload(rows, n)
    # the remote site's applications write (captured by triggers)
    c = connect(d / "b.db")
    c.execute("BEGIN")
    c.executemany("INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", inserts)
    c.executemany("UPDATE items SET qty = ?, price = ? WHERE id = ?", updates)
    c.execute("COMMIT")
    c.close()
    # baseline: the same inserts and updates, plain executemany into the same table
    c = connect(d / "plain.db")
    t0 = time.perf_counter()
    c.execute("BEGIN")
    c.executemany("INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", inserts)
    c.executemany("UPDATE items SET qty = ?, price = ? WHERE id = ?", updates)
    c.execute("COMMIT")
    plain_s = time.perf_counter() - t0
    c.close()
    # pull into the snapshot, then reconcile (timed separately), batches of 200k
    with api.Cluster(t) as cl:
        t0 = time.perf_counter()
        api.refresh(cl, "a", "b", batch_size=1_000_000, reconcile_=False)
        pull_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = api.reconcile(cl, "a")
        rec_s = time.perf_counter() - t0
    applied = res["a"]["items"].applied
    assert applied == 2 * n, applied
    plain_rate = 2 * n / plain_s
    rec_rate = 2 * n / rec_s
    return {
        "changes": 2 * n,
        "table_rows": rows,
        "plain_executemany_changes_per_s": round(plain_rate),
        "reconcile_changes_per_s": round(rec_rate),
        "pull_changes_per_s": round(2 * n / pull_s),
        "ratio": round(rec_rate / plain_rate, 3),
        "ratio_including_pull": round((2 * n / (pull_s + rec_s)) / plain_rate, 3),
    }


def backlog_memory(d: Path, n: int) -> dict[str, float]:
    for s in ("a", "b"):
        connect(d / f"{s}.db").execute(SCHEMA)
    t = topology(d, ["a", "b"])
    api.init(t)
    c = connect(d / "b.db")
    c.execute("BEGIN")
    c.executemany("INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", ((f"n{i}", i, 0.5) for i in range(n)))
    c.execute("COMMIT")
    c.close()
    (d / "t.yaml").write_text(
        json.dumps(
            {
                "sites": {s: {"url": f"sqlite:///{d / (s + '.db')}"} for s in ("a", "b")},
                "tables": {"items": {"key": "id"}},
                "links": "mesh",
            }
        )
    )
    code = (
        "import resource, time, sys; from multimaster import api; from multimaster.config.topology import load_topology;"
        f"t=load_topology({str(d / 't.yaml')!r}); t0=time.perf_counter();"
        "r=api.refresh(t, 'a', 'b'); dt=time.perf_counter()-t0;"
        "print(r[0].pulled, r[0].applied, r[0].batches, dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    pulled, applied, batches, secs, rss_kb = int(out[0]), int(out[1]), int(out[2]), float(out[3]), int(out[4])
    assert pulled == n and applied == n
    return {
        "backlog": n,
        "batches": batches,
        "seconds": round(secs, 1),
        "changes_per_s": round(n / secs),
        "peak_rss_mb": round(rss_kb / 1024, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a tenth of every size")
    ap.add_argument("--only", choices=["capture", "apply", "memory"])
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="mm-bench-") as tmp:
        d = Path(tmp)
        if args.only in (None, "capture"):
            (d / "cap").mkdir()
            out["capture"] = capture_overhead(d / "cap", 20_000 // scale)
            print("capture overhead  :", out["capture"], "target ratio >= 0.5", flush=True)
        if args.only in (None, "apply"):
            (d / "apply").mkdir()
            out["apply"] = apply_rate(d / "apply", 1_000_000 // scale, 100_000 // scale)
            print("apply rate        :", out["apply"], "target ratio >= 0.15", flush=True)
        if args.only in (None, "memory"):
            (d / "mem").mkdir()
            out["memory"] = backlog_memory(d / "mem", 1_000_000 // scale)
            print("backlog memory    :", out["memory"], "target peak < 500 MB", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
