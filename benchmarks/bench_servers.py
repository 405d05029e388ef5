"""PostgreSQL and MariaDB speed, measured side by side in one run (servers of tests/clusters.py).

    .venv/bin/python benchmarks/bench_servers.py            # full size
    .venv/bin/python benchmarks/bench_servers.py --quick    # a fifth of everything
    .venv/bin/python benchmarks/bench_servers.py --capture-only   # only 1. (repeat it: the host is noisy)

Prints, per server (targets from issue #3):
1. capture overhead: single-row-transaction insert rate with capture triggers / without (>= 0.5);
2. apply rate: refresh (pull + reconcile) of N remote inserts + N remote updates / a plain
   executemany of the same inserts and updates in one transaction (>= 0.25);
and a concurrency run: 8 client connections writing single-row transactions at one PostgreSQL site
while it replicates with two others (each site's refresher in its own thread): sustained changes/s
replicated, and p50/p95 delay from commit at the origin to visibility at the other sites.
Databases are created with unique names and dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from clusters import MySQLBackend, PostgresBackend  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.config.topology import load_topology  # noqa: E402

COLS = {"name": "text", "qty": "int", "price": "real"}


def _topo(tmp: Path, urls: dict[str, str]):  # type: ignore[no-untyped-def]
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"items": {"key": "id"}}, "links": "mesh"}
    p = tmp / f"topo-{len(list(tmp.iterdir()))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_topology(p)


def _sql(b, sql: str) -> str:  # type: ignore[no-untyped-def]
    return sql.replace("?", b.param())


def single_row_rate(b, url: str, n: int) -> float:  # type: ignore[no-untyped-def]
    c = b.connect(url)
    cur = c.cursor()
    sql = _sql(b, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)")
    t0 = time.perf_counter()
    for i in range(n):
        cur.execute(sql, (f"row-{i}", i, i * 0.5))
        c.commit()
    dt = time.perf_counter() - t0
    c.close()
    return n / dt


def capture(b, tmp: Path, n: int) -> dict:  # type: ignore[no-untyped-def, type-arg]
    plain = b.new_site(tmp, "plain")
    b.create_table(plain, "items", "id", COLS)
    s1, s2 = b.new_site(tmp, "c1"), b.new_site(tmp, "c2")
    for u in (s1, s2):
        b.create_table(u, "items", "id", COLS)
    api.init(_topo(tmp, {"c1": s1, "c2": s2}))
    single_row_rate(b, plain, n // 10)  # warm up
    without = single_row_rate(b, plain, n)
    with_ = single_row_rate(b, s1, n)
    return {"without_rows_s": round(without), "with_rows_s": round(with_), "ratio": round(with_ / without, 3), "target": 0.5}


def apply_rate(b, tmp: Path, n: int) -> dict:  # type: ignore[no-untyped-def, type-arg]
    a1, a2, plain = b.new_site(tmp, "a1"), b.new_site(tmp, "a2"), b.new_site(tmp, "aplain")
    for u in (a1, a2, plain):
        b.create_table(u, "items", "id", COLS)
    topo = _topo(tmp, {"a1": a1, "a2": a2})
    api.init(topo)
    rows = [(f"row-{i}", i, i * 0.25) for i in range(n)]
    c = b.connect(a1)
    cur = c.cursor()
    cur.executemany(_sql(b, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)"), rows)
    c.commit()
    cur.executemany(_sql(b, "UPDATE items SET qty = qty + 1 WHERE id = ?"), [(i + 1,) for i in range(n)])
    c.commit()
    c.close()
    with api.Cluster(topo) as cl:
        t0 = time.perf_counter()
        res = api.refresh(cl, "a2", "a1", batch_size=5000)
        dt = time.perf_counter() - t0
    assert not res[0].error, res[0].error
    changes = res[0].applied
    c = b.connect(plain)
    cur = c.cursor()
    t0 = time.perf_counter()
    cur.executemany(
        _sql(b, "INSERT INTO items (id, name, qty, price) VALUES (?, ?, ?, ?)"), [(i + 1, *r) for i, r in enumerate(rows)]
    )
    cur.executemany(_sql(b, "UPDATE items SET qty = qty + 1 WHERE id = ?"), [(i + 1,) for i in range(n)])
    c.commit()
    pdt = time.perf_counter() - t0
    c.close()
    return {
        "changes": changes,
        "apply_changes_s": round(changes / dt),
        "plain_changes_s": round(2 * n / pdt),
        "ratio": round((changes / dt) / (2 * n / pdt), 3),
        "target": 0.25,
    }


def concurrency(b, tmp: Path, seconds: float, clients: int = 8) -> dict:  # type: ignore[no-untyped-def, type-arg]
    urls = {s: b.new_site(tmp, s) for s in ("r1", "r2", "r3")}
    for u in urls.values():
        b.create_table(u, "items", "id", COLS)
    topo = _topo(tmp, urls)
    api.init(topo)
    committed: dict[str, float] = {}
    seen: dict[str, dict[str, float]] = {"r2": {}, "r3": {}}
    stop = threading.Event()
    writes = [0] * clients
    errors: list[BaseException] = []

    def client(w: int) -> None:
        c = b.connect(urls["r1"])
        cur = c.cursor()
        ins = _sql(b, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)")
        upd = _sql(b, "UPDATE items SET qty = qty + 1 WHERE name = ?")
        i = 0
        try:
            while not stop.is_set():
                name = f"w{w}-{i}"
                cur.execute(ins, (name, i, 0.5))
                c.commit()
                committed[name] = time.time()
                cur.execute(upd, (name,))
                c.commit()
                writes[w] += 2
                i += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            c.close()

    applied = {"r2": 0, "r3": 0}

    def refresher(site: str) -> None:
        c = b.connect(urls[site])
        try:
            with api.Cluster(topo) as cl:
                while not stop.is_set():
                    res = api.refresh(cl, site)
                    for r in res:
                        if r.error:
                            print("ERR", site, r.error, file=sys.stderr)
                    applied[site] += sum(r.applied for r in res)
                    now = time.time()
                    cur = c.cursor()
                    cur.execute("SELECT name FROM items")
                    c.commit()
                    for (name,) in cur.fetchall():
                        if name not in seen[site]:
                            seen[site][name] = now
                    if not any(r.pulled for r in res):
                        time.sleep(0.005)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            c.close()

    for u in urls.values():  # an index for the clients' update by name, as an application would have
        c = b.connect(u)
        c.cursor().execute("CREATE INDEX items_name ON items (name)")
        c.commit()
        c.close()
    threads = [threading.Thread(target=client, args=(w,)) for w in range(clients)]
    threads += [threading.Thread(target=refresher, args=(s,)) for s in ("r2", "r3")]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    delays = sorted((seen[s][n] - committed[n]) * 1000 for s in seen for n in seen[s] if n in committed)
    q = statistics.quantiles(delays, n=20) if len(delays) > 20 else [float("nan")] * 19
    return {
        "clients": clients,
        "seconds": round(dt, 1),
        "written_changes_s": round(sum(writes) / dt),
        "replicated_changes_s_per_site": round(sum(applied.values()) / 2 / dt),
        "delay_ms_p50": round(statistics.median(delays), 1) if delays else None,
        "delay_ms_p95": round(q[18], 1),
    }


def bulk_transaction(b, tmp: Path, n: int) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Bucardo's published workload: one transaction of `n` inserted rows at one site of three; the
    time until both other sites hold them (each pulls with its own refresher, in parallel, as one
    daemon per site would)."""
    urls = {s: b.new_site(tmp, s) for s in ("b1", "b2", "b3")}
    for u in urls.values():
        b.create_table(u, "items", "id", COLS)
    topo = _topo(tmp, urls)
    api.init(topo)
    c = b.connect(urls["b1"])
    cur = c.cursor()
    cur.executemany(
        _sql(b, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)"), [(f"bulk-{i}", i, i * 0.5) for i in range(n)]
    )
    c.commit()
    c.close()
    done: dict[str, float] = {}

    def pull(site: str) -> None:
        with api.Cluster(topo) as cl:
            r = api.refresh(cl, site, "b1", batch_size=10_000)
            assert not r[0].error, r[0].error
            done[site] = time.perf_counter() - t0

    t0 = time.perf_counter()
    threads = [threading.Thread(target=pull, args=(s,)) for s in ("b2", "b3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = max(done.values())
    return {"rows": n, "seconds_until_both_sites": round(secs, 2), "rows_s": round(n / secs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--capture-only", action="store_true", help="only the capture overhead (1.), e.g. to repeat it")
    args = ap.parse_args()
    k = 5 if args.quick else 1
    out: dict[str, dict] = {}  # type: ignore[type-arg]
    for name, factory in (("postgresql", PostgresBackend), ("mysql", MySQLBackend)):
        try:
            b = factory()
        except ConnectionError as e:
            out[name] = {"skipped": str(e)}
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f"mm-bench-{name}-"))
        try:
            out[name] = {"capture": capture(b, tmp, 3000 // k)}
            if args.capture_only:
                continue
            out[name]["apply"] = apply_rate(b, tmp, 20000 // k)
            if name == "postgresql":
                out[name]["concurrency"] = concurrency(b, tmp, 20.0 / k)
                out[name]["bulk_transaction"] = bulk_transaction(b, tmp, 50_000 // k)
        finally:
            b.cleanup()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, r in out.items():
        print(f"== {name}")
        for part, fig in r.items():
            print(f"  {part}: {fig}")


if __name__ == "__main__":
    main()
