"""What one rejected change costs a large batch (docs/performance.md "One rejected change in a
large batch"): the refresh that finds it and holds it in the error queue, against the same batch
with nothing rejected, side by side in one run.

    .venv/bin/python benchmarks/bench_isolate.py                          # SQLite, PostgreSQL, MariaDB
    .venv/bin/python benchmarks/bench_isolate.py --servers mysql --changes 2000 --rounds 3

Two sites; b's table has a CHECK (qty >= 0) that a's lacks. a's applications insert `--changes`
rows, one transaction each; in the `rejected` case the middle one has qty = -1, which b refuses.
b's refresh (one batch) is timed; afterwards b must hold exactly that change and every other row.
Prints per server the median seconds of each case and their ratio.

Until session 30 the refresh, once the batch failed, applied it again one source transaction at a
time, a reconcile each: the cost grew with the batch (2,000 changes: 52 s on MariaDB, 246 s on
PostgreSQL, for one rejected change). It now applies halves of the batch, and halves of a half that
fails, down to the transaction at fault (core/errorqueue.py `in_halves`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from clusters import MySQLBackend, PostgresBackend, SQLiteBackend  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.config.topology import load_topology  # noqa: E402

BACKENDS = {"sqlite": SQLiteBackend, "postgresql": PostgresBackend, "mysql": MySQLBackend}


def _sql(b: Any, url: str, sql: str, rows: list[tuple[Any, ...]], one_txn: bool = False) -> None:
    """One transaction per row (`one_txn`: all rows in one)."""
    c = b.connect(url)
    try:
        cur = c.cursor()
        for r in rows:
            cur.execute(sql.replace("?", b.param()), r)
            if not one_txn:
                c.commit()
        c.commit()
    finally:
        c.close()


def one_round(b: Any, tmp: Path, n: int, rejected: bool, one_txn: bool = False) -> float:
    d = Path(tempfile.mkdtemp(dir=tmp))
    urls = {s: b.new_site(d, f"{d.name[-6:].lower()}_{s}") for s in ("a", "b")}  # unique database names
    b.create_table(urls["a"], "items", "id", {"name": "text", "qty": "int"})
    if b.name == "sqlite":  # SQLite adds a CHECK only when it creates the table
        _sql(
            b,
            urls["b"],
            "CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, qty INTEGER CHECK (qty >= 0))",
            [()],
        )
    else:
        b.create_table(urls["b"], "items", "id", {"name": "text", "qty": "int"})
        _sql(b, urls["b"], "ALTER TABLE items ADD CONSTRAINT qty_ok CHECK (qty >= 0)", [()])
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"items": {"key": "id"}}, "links": "mesh"}
    path = d / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    topo = load_topology(path)
    api.init(topo)
    bad = n // 2 if rejected else -1
    _sql(
        b, urls["a"], "INSERT INTO items (name, qty) VALUES (?, ?)", [(f"r{i}", -1 if i == bad else i) for i in range(n)], one_txn
    )
    t0 = time.perf_counter()
    res = api.refresh(topo, site="b")
    dt = time.perf_counter() - t0
    errors = [r.error for r in res if r.error]
    held = api.list_errors(topo)
    # a source transaction is held whole (a SQLite source records none: each change is one alone)
    want = (n if one_txn and b.name != "sqlite" else 1) if rejected else 0
    if errors or len(held) != want:
        raise SystemExit(f"unexpected outcome: link errors {errors}, {len(held)} held, {want} expected")
    c = b.connect(urls["b"])
    try:
        cur = c.cursor()
        cur.execute("SELECT count(*) FROM items")
        got = cur.fetchone()[0]
    finally:
        c.close()
    if got != n - want:
        raise SystemExit(f"b holds {got} rows, not {n - want}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="sqlite,postgresql,mysql")
    ap.add_argument("--changes", type=int, default=2000, help="inserts in the batch")
    ap.add_argument("--rounds", type=int, default=3, help="pairs (nothing rejected, one rejected), alternated")
    ap.add_argument(
        "--one-txn", action="store_true", help="a's rows in one transaction (held whole: its inserts keep their rank)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {"changes": args.changes}
    for name in args.servers.split(","):
        try:
            b = BACKENDS[name]()
        except ConnectionError as e:
            out[name] = {"skipped": str(e)}
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f"mm-bench-isolate-{name}-"))
        clean: list[float] = []
        one: list[float] = []
        try:
            for _ in range(args.rounds):
                clean.append(one_round(b, tmp, args.changes, False, args.one_txn))
                one.append(one_round(b, tmp, args.changes, True, args.one_txn))
        finally:
            b.cleanup()
        mc, mo = statistics.median(clean), statistics.median(one)
        out[name] = {"clean_s": round(mc, 3), "one_rejected_s": round(mo, 3), "ratio": round(mo / mc, 1)}
        if not args.json:
            print(
                f"{name}: batch of {args.changes}: nothing rejected {mc:.2f} s, one rejected {mo:.2f} s (ratio {mo / mc:.1f})",
                flush=True,
            )
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
