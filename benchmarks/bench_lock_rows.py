"""MariaDB's reconciler locking the rows of a batch: through an IN subquery (today: each row before
its shadow row, the application's order) against the join it used before (which locked the shadow
rows first and deadlocked with applications updating the same rows; docs/decisions.md, session 27).

    .venv/bin/python benchmarks/bench_lock_rows.py [--updates 3000] [--rows 20000] [--rounds 4]

Two MariaDB sites holding `--rows` rows; per round and variant, `--updates` single-row UPDATEs at
the first site (committed 200 at a time), then one refresh of the second, timed. The variants run
interleaved (ABBA). Printed: the seconds per refresh and the median ratio today/before.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from clusters import BACKENDS, make_cluster  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.dialects.mysql.dialect import MySQLDialect  # noqa: E402


def _joined(self: Any, conn: Any, info: Any, tmp: str) -> None:
    """The lock before session 27: the rows through a join (InnoDB locks every table it reads)."""
    q, o, key = self.quote, self.obj(info.name), self.quote(info.key.name)
    conn.exec_driver_sql(
        f"SELECT 1 FROM {q(info.name)} t JOIN {o.shadow} s ON s.`key` = t.{key} JOIN {tmp} r ON r.rid = s.rid "
        f"ORDER BY t.{key} FOR UPDATE"
    ).all()
    conn.exec_driver_sql(f"SELECT 1 FROM {o.shadow} s JOIN {tmp} r ON r.rid = s.rid ORDER BY s.`key` FOR UPDATE").all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=3000)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    today = MySQLDialect.lock_rows
    variants = {"today": today, "before": _joined}
    backend = BACKENDS["mysql"]()
    try:
        stock = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
        base = [("stock", i, f"n{i}", 0) for i in range(1, a.rows + 1)]
        cl = make_cluster(backend, Path(tempfile.mkdtemp()), ["s1", "s2"], stock, base={"s1": base})
        cl.refresh_until_quiet()
        took: dict[str, list[float]] = {k: [] for k in variants}
        for rnd in range(a.rounds):
            for name in ("today", "before") if rnd % 2 == 0 else ("before", "today"):
                c = cl.db("s1")
                cur = c.cursor()
                for k in range(a.updates):
                    cur.execute("UPDATE stock SET qty = qty + 1 WHERE id = %s", (1 + (k * 7 + rnd) % a.rows,))
                    if k % 200 == 199:
                        c.commit()
                c.commit()
                c.close()
                MySQLDialect.lock_rows = variants[name]  # type: ignore[method-assign]
                t0 = time.perf_counter()
                res = api.refresh(cl.topo, "s2", "s1")
                took[name].append(time.perf_counter() - t0)
                MySQLDialect.lock_rows = today  # type: ignore[method-assign]
                assert not res[0].error, res[0].error
        cl.assert_converged()
        print({k: [round(x, 2) for x in v] for k, v in took.items()})
        print(
            f"refresh of {a.updates} updates: today/before = {statistics.median(took['today']) / statistics.median(took['before']):.3f}"
        )
    finally:
        MySQLDialect.lock_rows = today  # type: ignore[method-assign]
        backend.cleanup()


if __name__ == "__main__":
    main()
