"""The server-side work of capture, without the commit: inserts into a replicated table inside ONE
transaction, looped on the server (PL/pgSQL DO block / MariaDB stored procedure), so neither client
round trips nor the WAL flush of a commit are counted. Compared with the same inserts into an
untriggered table of the same shape. Servers of tests/clusters.py; databases dropped at the end.

    .venv/bin/python benchmarks/bench_capture_cpu.py [--rows 5000] [--rounds 5]

Prints microseconds per inserted row (the best of the rounds) per server. The single-row
transaction ratio of benchmarks/bench_servers.py is dominated by the commit; this shows what the
triggers themselves cost (docs/decisions.md, "The second-order log is a view over the change log").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import ITEMS, MySQLBackend, PostgresBackend, make_cluster  # noqa: E402


def measure(b, rows: int, rounds: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    cl = make_cluster(b, Path(tempfile.mkdtemp(prefix=f"mm-cpu-{b.name}-")), ["s1", "s2"], ITEMS)
    c = cl.db("s1")
    cur = c.cursor()
    if b.name == "mysql":
        cur.execute("CREATE TABLE plain (id INT AUTO_INCREMENT PRIMARY KEY, name TEXT, qty INT, price DOUBLE)")
        for t in ("items", "plain"):
            cur.execute(
                f"CREATE PROCEDURE bulk_{t}(n INT) BEGIN DECLARE i INT DEFAULT 0; "
                f"WHILE i < n DO INSERT INTO {t} (name, qty, price) VALUES (CONCAT('r', i), i, 0.5); "
                "SET i = i + 1; END WHILE; END"
            )
        call = "CALL bulk_{t}(%d)" % rows
    else:
        cur.execute("CREATE TABLE plain (id SERIAL PRIMARY KEY, name TEXT, qty INT, price DOUBLE PRECISION)")
        call = (
            "DO $$ BEGIN FOR i IN 1..%d LOOP INSERT INTO {t} (name, qty, price) VALUES ('r' || i, i, 0.5); END LOOP; END $$"
        ) % rows
    c.commit()
    best = {"with_triggers_us": float("inf"), "plain_us": float("inf")}
    for _ in range(rounds):
        for t, k in (("items", "with_triggers_us"), ("plain", "plain_us")):
            t0 = time.perf_counter()
            cur.execute(call.format(t=t))
            c.commit()
            best[k] = min(best[k], (time.perf_counter() - t0) / rows * 1e6)
    c.close()
    return {k: round(v, 1) for k, v in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for factory in (PostgresBackend, MySQLBackend):
        try:
            b = factory()
        except ConnectionError as e:
            print(f"== {factory.name}: skipped ({e})")
            continue
        try:
            print(f"== {b.name}: {measure(b, args.rows, args.rounds)} per inserted row, one transaction")
        finally:
            b.cleanup()


if __name__ == "__main__":
    main()
