"""PostgreSQL capture and the plans a session keeps: bulk writes and single-row writes in one session.

    .venv/bin/python benchmarks/bench_pg_capture_plans.py [--rows 5000] [--singles 200] [--rounds 3]

A plpgsql trigger function plans each statement once per session and keeps the plan, made for the
transition table it first saw (docs/postgresql.md "Capture and plans"). An application's pooled
connection does bulk and single-row writes in the same session, so this script does too, on a plain
database and on a multimaster site (renumbered table), interleaved round by round:

- ``single after bulk``: a session writes `--rows` rows in bulk (INSERT ... SELECT, UPDATE of every
  row, DELETE of half), then `--singles` single-row UPDATEs, DELETEs and INSERTs, one transaction
  each: the time per single-row transaction;
- ``bulk after single``: a session first writes one row of each kind, then the bulk INSERT, UPDATE
  and DELETE: the time of each.

Printed: medians per server, and the ratio plain / multimaster (1.0: capture costs nothing).
Run it in two trees to compare two versions (the figures in docs/performance.md were taken so).
Databases are created with unique names and dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import ITEMS, PostgresBackend, make_cluster  # noqa: E402

BULK = {
    "insert": "INSERT INTO items (name, qty, price) SELECT 'n' || g, g, 0.5 FROM generate_series(1, %s) g",
    "update": "UPDATE items SET qty = qty + 1",
    "delete": "DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY id LIMIT %s)",
}
SINGLE = {
    "update": "UPDATE items SET qty = qty + 1 WHERE id = (SELECT max(id) FROM items)",
    "delete": "DELETE FROM items WHERE id = (SELECT max(id) FROM items)",
    "insert": "INSERT INTO items (name, qty, price) VALUES ('one', 1, 1.5)",
}


def _bulk(cur: Any, c: Any, op: str, n: int) -> float:
    t0 = time.perf_counter()
    cur.execute(BULK[op], (n,) if "%s" in BULK[op] else None)
    c.commit()
    return time.perf_counter() - t0


def _singles(cur: Any, c: Any, op: str, k: int) -> float:
    t0 = time.perf_counter()
    for _ in range(k):
        cur.execute(SINGLE[op])
        c.commit()
    return (time.perf_counter() - t0) / k


def single_after_bulk(backend: PostgresBackend, url: str, n: int, k: int) -> dict[str, float]:
    """Seconds per single-row transaction, in a session that wrote in bulk first."""
    c = backend.connect(url)
    cur = c.cursor()
    _bulk(cur, c, "insert", n)
    _bulk(cur, c, "update", n)
    _bulk(cur, c, "delete", n // 2)
    out = {op: _singles(cur, c, op, k) for op in ("update", "delete", "insert")}
    _bulk(cur, c, "delete", 10 * n)  # empty again
    c.close()
    return out


def bulk_after_single(backend: PostgresBackend, url: str, n: int) -> dict[str, float]:
    """Seconds per bulk statement, in a session that wrote single rows first."""
    c = backend.connect(url)
    cur = c.cursor()
    for op in ("insert", "update", "delete", "insert"):
        _singles(cur, c, op, 1)
    out = {"insert": _bulk(cur, c, "insert", n), "update": _bulk(cur, c, "update", n), "delete": _bulk(cur, c, "delete", 10 * n)}
    c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5000, help="rows of a bulk statement")
    ap.add_argument("--singles", type=int, default=200, help="single-row transactions per kind")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    backend = PostgresBackend()
    tables = {"items": {**ITEMS["items"], "auto": True}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plain = backend.new_site(Path(tmp), "plain")
            backend.create_table(plain, "items", "id", tables["items"]["columns"], True)
            cl = make_cluster(backend, Path(tmp), ["s1", "s2"], tables)
            urls = {"plain": plain, "multimaster": cl.urls["s1"]}
            single: dict[str, dict[str, list[float]]] = {k: {} for k in urls}
            bulk: dict[str, dict[str, list[float]]] = {k: {} for k in urls}
            for _ in range(args.rounds):
                for name, url in urls.items():
                    for op, s in single_after_bulk(backend, url, args.rows, args.singles).items():
                        single[name].setdefault(op, []).append(s)
                    for op, s in bulk_after_single(backend, url, args.rows).items():
                        bulk[name].setdefault(op, []).append(s)
            print(f"PostgreSQL, renumbered table; {args.rounds} rounds; bulk statements of {args.rows} rows")
            print(f"{'':46} {'plain':>10} {'multimaster':>12} {'plain / mm':>11}")
            for title, res, unit, scale in (
                ("single-row, after bulk in the session", single, "µs", 1e6),
                ("bulk, after single-row in the session", bulk, "s", 1.0),
            ):
                for op in res["plain"]:
                    p = statistics.median(res["plain"][op])
                    m = statistics.median(res["multimaster"][op])
                    label = f"{title}: {op}"
                    print(f"{label:46} {p * scale:8.3g} {unit:2} {m * scale:9.3g} {unit:2} {p / m:11.3f}")
    finally:
        backend.cleanup()


if __name__ == "__main__":
    main()
