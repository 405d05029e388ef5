"""`multimaster ddl` while applications write and refreshers run: what the applications see
(docs/performance.md "multimaster ddl under load").

    .venv/bin/python benchmarks/bench_ddl_load.py                        # MariaDB, 3 rounds
    .venv/bin/python benchmarks/bench_ddl_load.py --servers mysql,postgresql --rounds 2 --writers 3

Two sites of one server, a and b, one renumbered table `items` (name, qty; a hot row every writer
adds to). At each site `--writers` application connections write all along (40 % inserts, the
rest increments of the hot row, one transaction each; a deadlock victim is counted apart, as
the application would retry it, and any other failure is what an application sees), and each site's refresher runs over and over (the daemon's loop). After a second, `--rounds`
times: `multimaster ddl` ADD COLUMN x<i>, then DROP COLUMN x<i>, each at every site, half a second
apart. Printed per server: how many ddl calls applied (of how many), application writes done and
failed (with the first errors), the longest and the 99th-percentile write, and, after the writers
stop and the sites are refreshed until quiet, the changes left held and whether the sites are equal
with the hot row's sum exact.

Session 32 found on MariaDB, with the code before it: writes failing during every DROP ("Unknown
column 'x0' in 'NEW'"), ddl failing at MariaDB against a refresher's follow ("Duplicate column
name"), changes held for good, writes stalled for innodb_lock_wait_timeout. To compare two trees,
run this script from each (its own tree is the one imported).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
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


def _exec(b: Any, url: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    c = b.connect(url)
    try:
        c.cursor().execute(sql.replace("?", b.param()), params)
        c.commit()
    finally:
        c.close()


def _rows(b: Any, url: str) -> list[tuple[Any, ...]]:
    c = b.connect(url)
    try:
        cur = c.cursor()
        cur.execute("SELECT id, name, qty FROM items ORDER BY id")
        return [tuple(r) for r in cur.fetchall()]
    finally:
        c.close()


def run(b: Any, tmp: Path, writers: int, rounds: int) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(dir=tmp))
    urls = {s: b.new_site(d, f"{d.name[-6:].lower()}_{s}") for s in ("a", "b")}
    for u in urls.values():
        b.create_table(u, "items", "id", {"name": "text", "qty": "int"})
    _exec(b, urls["a"], "INSERT INTO items (name, qty) VALUES ('hot', 0)")
    doc = {
        "sites": {s: {"url": u} for s, u in urls.items()},
        "tables": {"items": {"key": "id", "columns": {"qty": "additive"}}},
        "links": "mesh",
    }
    path = d / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    topo = load_topology(path)
    api.init(topo)
    api.refresh(topo)
    stop = threading.Event()
    lat: list[float] = []
    failed: list[str] = []
    victims = [0]
    added = [0]
    lock = threading.Lock()

    def writer(site: str, seed: int) -> None:
        rnd = random.Random(seed)
        c = b.connect(urls[site])
        i = 0
        try:
            while not stop.is_set():
                i += 1
                t0 = time.perf_counter()
                try:
                    cur = c.cursor()
                    if rnd.random() < 0.4:
                        cur.execute(f"INSERT INTO items (name, qty) VALUES ({b.param()}, 0)", (f"{site}{seed}-{i}",))
                        inc = 0
                    else:
                        cur.execute("UPDATE items SET qty = qty + 1 WHERE name = 'hot'")
                        inc = 1
                    c.commit()
                    with lock:
                        lat.append(time.perf_counter() - t0)
                        added[0] += inc
                except Exception as e:  # noqa: BLE001 - what an application sees
                    c.rollback()
                    text = str(getattr(e, "orig", e)).splitlines()[0][:120]
                    with lock:
                        if "Deadlock" in text or "deadlock" in text:
                            victims[0] += 1  # rolled back whole; an application retries it (docs/transactions.md)
                        else:
                            failed.append(f"{site}: {type(e).__name__}: {text}")
        finally:
            c.close()

    def refresher(site: str) -> None:
        with api.Cluster(topo) as cl:
            while not stop.is_set():
                api.refresh(cl, site)

    threads = [threading.Thread(target=writer, args=(s, k)) for s in urls for k in range(writers)]
    threads += [threading.Thread(target=refresher, args=(s,)) for s in urls]
    for t in threads:
        t.start()
    reports: list[tuple[str, str, str, str | None]] = []
    try:
        time.sleep(1)
        for i in range(rounds):
            for stmt in (f"ALTER TABLE items ADD COLUMN x{i} VARCHAR(40)", f"ALTER TABLE items DROP COLUMN x{i}"):
                reports += [(stmt, r.site, r.status, r.message) for r in api.ddl(load_topology(path), stmt)]
                time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    with api.Cluster(topo) as cl:
        for _ in range(10):
            if not any(r.pulled for r in api.refresh(cl)):
                break
    held = len(api.list_errors(topo))
    ra, rb = _rows(b, urls["a"]), _rows(b, urls["b"])
    hot = next((r[2] for r in ra if r[1] == "hot"), None)
    lat.sort()
    return {
        "ddl": reports,
        "writes": len(lat),
        "failed": failed,
        "victims": victims[0],
        "longest_s": lat[-1] if lat else 0.0,
        "p99_s": lat[int(0.99 * (len(lat) - 1))] if lat else 0.0,
        "median_ms": 1000 * statistics.median(lat) if lat else 0.0,
        "held": held,
        "equal": ra == rb,
        "sum_exact": hot == added[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="mysql", help="comma-separated: mysql, postgresql, sqlite")
    ap.add_argument("--writers", type=int, default=3, help="application connections per site")
    ap.add_argument("--rounds", type=int, default=3, help="ADD then DROP COLUMN, this many times")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.servers.split(","):
            b = BACKENDS[name]()
            try:
                out = run(b, Path(tmp), args.writers, args.rounds)
            finally:
                b.cleanup()
            bad = [r for r in out["ddl"] if r[2] != "applied"]
            print(f"== {name}: {args.writers} writers a site, {args.rounds} rounds of ddl ADD and DROP COLUMN")
            print(f"   ddl applied {len(out['ddl']) - len(bad)} of {len(out['ddl'])}")
            for stmt, site, status, msg in bad[:6]:
                print(f"     {status} at {site}: {stmt}: {msg}")
            print(
                f"   writes {out['writes']}, failed {len(out['failed'])} "
                f"(besides {out['victims']} deadlock victims, which an application retries)"
            )
            for f in sorted(set(out["failed"]))[:4]:
                print(f"     {f}")
            print(
                f"   write latency median {out['median_ms']:.1f} ms, p99 {out['p99_s']:.2f} s, longest {out['longest_s']:.2f} s"
            )
            print(f"   after: held {out['held']}, sites equal {out['equal']}, hot row's sum exact {out['sum_exact']}")


if __name__ == "__main__":
    main()
