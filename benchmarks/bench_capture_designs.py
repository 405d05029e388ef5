"""Capture cost on PostgreSQL and MariaDB next to a Bucardo-like trigger, measured side by side.

    .venv/bin/python benchmarks/bench_capture_designs.py            # 3,000 rows x 5 rounds per design
    .venv/bin/python benchmarks/bench_capture_designs.py -n 1000 --rounds 3

Three databases per server, each with the same table `items`: no trigger; multimaster as `init`
installs it (a two-site topology); and a Bucardo-like trigger that writes only the primary key into
one delta table (Bucardo 5's design: values are read from the table at replication time, conflicts
settled whole-row). Each round opens one connection per design and runs single-row transactions
(INSERT + COMMIT) round-robin in blocks of 100 rows, so the machine's slow bursts fall on every
design alike; the median of the rounds is printed as rows/s and as a ratio to no trigger.
Why multimaster captures more than the key: docs/decisions.md.
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

from bench_servers import COLS, _sql, _topo  # noqa: E402
from clusters import MySQLBackend, PostgresBackend  # noqa: E402

from multimaster import api  # noqa: E402

BUCARDO = {
    "postgresql": [
        "CREATE TABLE delta_items (id INTEGER NOT NULL, txntime TIMESTAMPTZ NOT NULL DEFAULT now())",
        "CREATE INDEX delta_items_t ON delta_items (txntime)",
        "CREATE FUNCTION delta_items() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN "
        "INSERT INTO delta_items (id) VALUES (NEW.id); RETURN NULL; END $f$",
        "CREATE TRIGGER delta_items AFTER INSERT OR UPDATE OR DELETE ON items FOR EACH ROW EXECUTE FUNCTION delta_items()",
    ],
    "mysql": [
        "CREATE TABLE delta_items (seq BIGINT AUTO_INCREMENT PRIMARY KEY, id INTEGER NOT NULL, "
        "txntime TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (txntime))",
        "CREATE TRIGGER delta_items AFTER INSERT ON items FOR EACH ROW INSERT INTO delta_items (id) VALUES (NEW.id)",
    ],
}


def designs(b, tmp: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    plain = b.new_site(tmp, "plain")
    b.create_table(plain, "items", "id", COLS)
    buc = b.new_site(tmp, "bucardo")
    b.create_table(buc, "items", "id", COLS)
    c = b.connect(buc)
    cur = c.cursor()
    for s in BUCARDO[b.name]:
        cur.execute(s)
    c.commit()
    c.close()
    s1, s2 = b.new_site(tmp, "c1"), b.new_site(tmp, "c2")
    for u in (s1, s2):
        b.create_table(u, "items", "id", COLS)
    api.init(_topo(tmp, {"c1": s1, "c2": s2}))
    return {"no trigger": plain, "Bucardo-like (key only)": buc, "multimaster": s1}


def measure(b, urls: dict[str, str], n: int, rounds: int, block: int = 100) -> dict[str, float]:  # type: ignore[no-untyped-def]
    sql = _sql(b, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)")
    res: dict[str, list[float]] = {k: [] for k in urls}
    for r in range(rounds + 1):  # round 0 warms every design up
        conns = {k: b.connect(u) for k, u in urls.items()}
        spent = dict.fromkeys(urls, 0.0)
        keys = list(urls)
        for i in range(0, n if r else n // 10, block):
            for k in keys[i // block % len(keys) :] + keys[: i // block % len(keys)]:
                c = conns[k]
                cur = c.cursor()
                t0 = time.perf_counter()
                for j in range(i, i + block):
                    cur.execute(sql, (f"row-{r}-{j}", j, j * 0.5))
                    c.commit()
                spent[k] += time.perf_counter() - t0
        for c in conns.values():
            c.close()
        if r:
            for k in keys:
                res[k].append(n / spent[k])
    return {k: statistics.median(v) for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for backend in (PostgresBackend(), MySQLBackend()):
        with tempfile.TemporaryDirectory(prefix="mm-capd-") as tmp:
            try:
                urls = designs(backend, Path(tmp))
                rates = measure(backend, urls, args.n, args.rounds)
            finally:
                backend.cleanup()
        base = rates["no trigger"]
        print(f"{backend.name}:")
        for k, v in rates.items():
            print(f"  {k:26s} {v:8.0f} rows/s  ratio {v / base:.2f}")


if __name__ == "__main__":
    main()
