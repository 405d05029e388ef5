"""The apply cost of a secondary UNIQUE column (docs/unique.md), SQLite, measured side by side.

    .venv/bin/python benchmarks/bench_unique.py            # 200,000-row table, 20,000 + 20,000 changes
    .venv/bin/python benchmarks/bench_unique.py --quick    # a tenth of it

The same table (id, email, name, qty) twice: once with a UNIQUE index on email, once without. A
remote site inserts N rows (new emails) and updates the email of N others; the target pulls them
and then reconciles (timed). Prints the reconcile rates (median of --repeat interleaved runs) and their ratio (unique / plain), and the
same with 1% of the inserts colliding with an email the target holds (those rows are marked).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multimaster import api  # noqa: E402
from multimaster.config.topology import parse_topology  # noqa: E402


def connect(path: Path) -> sqlite3.Connection:
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = NORMAL")
    return c


def run(d: Path, rows: int, n: int, unique: bool, collide: float) -> dict[str, float]:
    base = d / "base.db"
    c = connect(base)
    c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT, name TEXT, qty INTEGER)")
    if unique:
        c.execute("CREATE UNIQUE INDEX users_email ON users (email)")
    else:
        c.execute("CREATE INDEX users_email ON users (email)")  # the same lookups, no constraint
    c.execute("BEGIN")
    c.executemany("INSERT INTO users VALUES (?, ?, ?, ?)", ((i, f"u{i}@x", f"n{i}", i % 100) for i in range(1, rows + 1)))
    c.execute("COMMIT")
    c.close()
    for s in ("a", "b"):
        shutil.copy(base, d / f"{s}.db")
    t = parse_topology(
        {
            "sites": {s: {"url": f"sqlite:///{d / (s + '.db')}"} for s in ("a", "b")},
            "tables": {"users": {"key": "id"}},
            "links": "mesh",
        },
        base=d,
    )
    api.init(t)
    clash = int(n * collide)
    # the target's own rows with the emails some remote inserts will carry (concurrent inserts)
    c = connect(d / "a.db")
    c.execute("BEGIN")
    c.executemany("INSERT INTO users (email, name, qty) VALUES (?, ?, ?)", ((f"new{i}@x", "local", 0) for i in range(clash)))
    c.execute("COMMIT")
    c.close()
    c = connect(d / "b.db")
    c.execute("BEGIN")
    c.executemany("INSERT INTO users (email, name, qty) VALUES (?, ?, ?)", ((f"new{i}@x", f"r{i}", i % 7) for i in range(n)))
    step = max(1, rows // n)
    c.executemany("UPDATE users SET email = ? WHERE id = ?", ((f"moved{i}@x", 1 + (i * step) % rows) for i in range(n)))
    c.execute("COMMIT")
    c.close()
    with api.Cluster(t) as cl:
        api.refresh(cl, "a", "b", batch_size=1_000_000, reconcile_=False)
        t0 = time.perf_counter()
        res = api.reconcile(cl, "a")
        rec_s = time.perf_counter() - t0
    r = res["a"]["users"]
    assert r.applied == 2 * n, r.applied
    return {"changes": 2 * n, "seconds": round(rec_s, 3), "changes_per_s": round(2 * n / rec_s), "marked": len(r.conflicts)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a tenth of every size")
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant, interleaved; the median is reported")
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    rows, n = 200_000 // scale, 20_000 // scale
    out: dict[str, dict[str, float]] = {}
    runs: dict[str, list[dict[str, float]]] = {}
    for k in range(args.repeat):
        for name, unique, collide in (("plain", False, 0.0), ("unique", True, 0.0), ("unique_1pct_collide", True, 0.01)):
            with tempfile.TemporaryDirectory(prefix="mm-bench-") as tmp:
                r = run(Path(tmp), rows, n, unique, collide)
            runs.setdefault(name, []).append(r)
            print(f"run {k + 1} {name:20}:", r, flush=True)
    for name, rs in runs.items():
        out[name] = sorted(rs, key=lambda r: r["changes_per_s"])[len(rs) // 2]
    out["ratio"] = {
        "unique/plain": round(out["unique"]["changes_per_s"] / out["plain"]["changes_per_s"], 3),
        "unique_1pct_collide/plain": round(out["unique_1pct_collide"]["changes_per_s"] / out["plain"]["changes_per_s"], 3),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
