"""What the change log's index of source transactions costs a writer (PostgreSQL, MariaDB).

    .venv/bin/python benchmarks/bench_txn_index.py [--rows 3000] [--rounds 5] [--clients 1,8]

A refresh reads a long backlog in windows and asks the source which transactions it saw continue
past a window by that index (engine/pull.py pull_link, docs/transactions.md). Every captured row
adds one entry to it. One multimaster site per server (a 2-site cluster, nobody pulling); each
round times `--rows` single-row INSERT transactions (no think time: the worst case for capture
cost) by `--clients` connections with the index, then with it dropped, interleaved; printed: the
median over rounds of with ÷ without, per server and client count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import ITEMS, MySQLBackend, PostgresBackend, make_cluster  # noqa: E402

from multimaster.dialects import get_dialect  # noqa: E402


def run(cl, backend, rows: int, clients: int) -> float:
    """Inserts per second by `clients` connections, `rows` in all, one row per transaction."""
    ph = backend.param()
    per = rows // clients

    def work() -> None:
        c = cl.db("s1")
        cur = c.cursor()
        for i in range(per):
            cur.execute(f"INSERT INTO items (name, qty, price) VALUES ({ph}, {ph}, 0)", (f"r{i}", i))
            c.commit()
        c.close()

    ts = [threading.Thread(target=work) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return per * clients / (time.perf_counter() - t0)


def index_sql(name: str, present: bool) -> str:
    d = get_dialect(name)
    o = d.obj("items")
    if present:
        return f"CREATE INDEX {o.log_txn} ON {o.log} (txn)"
    return f"DROP INDEX {d.mm_table(o.log_txn)}" if name == "postgresql" else f"DROP INDEX {o.log_txn} ON {o.log}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", default="1,8")
    args = ap.parse_args()
    for backend in (PostgresBackend(), MySQLBackend()):
        with tempfile.TemporaryDirectory() as tmp:
            cl = make_cluster(backend, Path(tmp), ["s1", "s2"], ITEMS)
            try:
                for clients in [int(x) for x in args.clients.split(",")]:
                    ratios, w, wo = [], [], []
                    for _ in range(args.rounds):
                        a = run(cl, backend, args.rows, clients)
                        cl.execute("s1", index_sql(backend.name, False))  # DDL: one "transaction" of its own
                        b = run(cl, backend, args.rows, clients)
                        cl.execute("s1", index_sql(backend.name, True))
                        w.append(a)
                        wo.append(b)
                        ratios.append(a / b)
                    print(
                        f"{backend.name:10} clients={clients:<3} with index {statistics.median(w):8.0f}/s  "
                        f"without {statistics.median(wo):8.0f}/s  with/without = {statistics.median(ratios):.3f} "
                        f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})"
                    )
            finally:
                backend.cleanup()


if __name__ == "__main__":
    main()
