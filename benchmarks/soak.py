"""Soak (issue #13; not in CI): a steady load on a 3-site cluster with one `multimaster run`
daemon per site, purge on, for a long time; does anything grow without bound?

    .venv/bin/python benchmarks/soak.py --minutes 3                    # a quick check, SQLite
    .venv/bin/python benchmarks/soak.py                                # an hour, SQLite
    .venv/bin/python benchmarks/soak.py --servers --minutes 60         # SQLite, then PostgreSQL
    .venv/bin/python benchmarks/soak.py --databases mysql,postgresql --minutes 20
    .venv/bin/python benchmarks/soak.py --minutes 10 --out soak.md

The load: at every site one plain-client writer (sqlite3 / psycopg / PyMySQL) runs `--rate` transactions a
second: while its site holds fewer than `--rows` rows it inserts, otherwise it updates a random
row (an additive quantity, a latest-wins label) or deletes one and inserts another, so the table
stays about `--rows` rows and every delete leaves a tombstone. Concurrent updates of one row at
two sites make conflict-log rows. The daemons run with `--purge-every 20s --min-age 10s`, and the
topology's `purge.tombstones_after` / `purge.conflicts_after` are 30 s, so purge has something
to drop all along.

Every `--every` seconds (15) it samples: per link the changes waiting and the age of the oldest
change not applied (`status`), the RSS of every daemon process (/proc), and the row count of every
`_mm_*` table at every site (and of the replicated table). At the end it prints, and writes as
Markdown to `--out`, per series: its first value, the maximum over the first third of the run,
the maximum over the last third, and whether it stays bounded: the last third's maximum is at
most 1.25 x the first third's plus a slack (rows: 100; RSS: 8 MB; lag: 3 s, 200 changes). A
series that is not bounded is named; with SQLite the databases are files under a temporary folder
(kept with --keep).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import BACKENDS, Backend, TestCluster, make_cluster  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.engine.site import Site  # noqa: E402

TABLE = {
    "items": {
        "key": "id",
        "columns": {"name": "text", "qty": "int", "label": "text"},
        "config": {"columns": {"qty": "additive"}},
    }
}
SLACK = {"rows": 100.0, "rss_mb": 8.0, "lag_s": 3.0, "waiting": 200.0}


def writer(cl: TestCluster, site: str, rate: float, rows: int, stop: threading.Event, seed: int, stats: dict[str, int]) -> None:
    r = random.Random(seed)
    p = cl.backend.param()
    conn = cl.db(site)
    n = 0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            n += 1
            try:
                cur = conn.cursor()
                cur.execute("SELECT name FROM items")
                names = [x[0] for x in cur.fetchall()]
                conn.rollback()
                if len(names) < rows:
                    cur.execute(f"INSERT INTO items (name, qty, label) VALUES ({p}, 1, 'new')", (f"{site}-{seed}-{n}",))
                else:
                    x = r.random()
                    name = r.choice(names)
                    if x < 0.6:
                        cur.execute(f"UPDATE items SET qty = qty + 1, label = {p} WHERE name = {p}", (f"{site}-{n}", name))
                    else:
                        cur.execute(f"DELETE FROM items WHERE name = {p}", (name,))
                        cur.execute(f"INSERT INTO items (name, qty, label) VALUES ({p}, 1, 'new')", (f"{site}-{seed}-{n}",))
                conn.commit()
                stats["txns"] = stats.get("txns", 0) + 1
            except Exception:  # noqa: BLE001 - busy / deadlock: the application tries again later
                conn.rollback()
                stats["retries"] = stats.get("retries", 0) + 1
            time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - t0)))
    finally:
        conn.close()


def mm_tables(cl: TestCluster, site: str) -> dict[str, int]:
    """Row counts of every `_mm_*` base table at `site`, and of the replicated table."""
    s = Site(site, cl.urls[site])
    out: dict[str, int] = {}
    try:
        with s.read() as conn:
            d = s.dialect
            name = cl.backend.name
            if name == "sqlite":
                q = "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '\\_mm\\_%' ESCAPE '\\'"
            elif name == "postgresql":
                q = "SELECT table_name FROM information_schema.tables WHERE table_schema = '_mm' AND table_type = 'BASE TABLE'"
            else:
                q = (  # the clock _mm_tick is system-versioned: its history counts too
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() "
                    "AND table_type IN ('BASE TABLE', 'SYSTEM VERSIONED') AND LEFT(table_name, 4) = '_mm_'"
                )
            tables = sorted(r[0] for r in conn.exec_driver_sql(q))
            for t in tables:
                every = " FOR SYSTEM_TIME ALL" if name == "mysql" and t == "_mm_tick" else ""
                out[t] = int(conn.exec_driver_sql(f"SELECT count(*) FROM {d.mm_table(t)}{every}").scalar() or 0)
            if name == "mysql":  # one row per capturing transaction, server-wide; purge truncates it
                out["mysql.transaction_registry"] = int(d.registry_rows(conn, exact=True) or 0)
            out["items"] = int(conn.exec_driver_sql("SELECT count(*) FROM items").scalar() or 0)
    finally:
        s.dispose()
    return out


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def sample(cl: TestCluster, daemons: dict[str, subprocess.Popen[bytes]]) -> dict[str, float]:
    out: dict[str, float] = {}
    st = api.status(cl.topo)
    for ln in st["links"]:
        link = f"{ln['from']}->{ln['to']}"
        out[f"lag_s {link}"] = float(ln.get("oldest_waiting_age_s") or 0.0)
        out[f"waiting {link}"] = float(ln.get("waiting") or 0)
    for site, p in daemons.items():
        out[f"rss_mb daemon {site}"] = rss_mb(p.pid)
    for site in cl.urls:
        for t, n in mm_tables(cl, site).items():
            out[f"rows {site} {t}"] = float(n)
    return out


def bounded(kind: str, series: list[float]) -> tuple[float, float, float, bool]:
    k = max(1, len(series) // 3)
    first, last = max(series[:k]), max(series[-k:])
    return series[0], first, last, last <= 1.25 * first + SLACK[kind]


def soak(backend: Backend, minutes: float, every: float, rate: float, rows: int, keep: bool) -> tuple[str, list[str]]:
    tmp = Path(tempfile.mkdtemp(prefix=f"mm-soak-{backend.name}-"))
    settings = {
        "refresh": {"interval": "1s", "jitter": "200ms"},
        "purge": {"tombstones_after": "30s", "conflicts_after": "30s"},
    }
    cl = make_cluster(backend, tmp, ["s1", "s2", "s3"], TABLE, settings=settings)
    idx = "CREATE INDEX items_name ON items (name(64))" if backend.name == "mysql" else "CREATE INDEX items_name ON items (name)"
    for s in cl.urls:
        cl.execute(s, idx)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    daemons: dict[str, subprocess.Popen[bytes]] = {}
    logs = []
    stop = threading.Event()
    stats: dict[str, int] = {}
    threads = [
        threading.Thread(target=writer, args=(cl, s, rate, rows, stop, i + 1, stats), daemon=True) for i, s in enumerate(cl.urls)
    ]
    samples: list[tuple[float, dict[str, float]]] = []
    t0 = time.monotonic()
    try:
        for s in cl.urls:
            fh = open(tmp / f"daemon-{s}.log", "wb")
            logs.append(fh)
            daemons[s] = subprocess.Popen(
                [sys.executable, "-m", "multimaster.cli", "run", "-t", str(cl.topo.path), "--site", s, "--log-format", "json"]
                + ["--purge-every", "20s", "--min-age", "10s"],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
            )
        for t in threads:
            t.start()
        end = t0 + minutes * 60
        while time.monotonic() < end:
            time.sleep(max(0.0, min(every, end - time.monotonic())))
            for s, p in daemons.items():
                if p.poll() is not None:
                    raise RuntimeError(f"the daemon of {s} exited with {p.returncode}: see {tmp}/daemon-{s}.log")
            x = sample(cl, daemons)
            samples.append((time.monotonic() - t0, x))
            w = [v for k, v in x.items() if k.startswith("waiting")]
            print(
                f"  {samples[-1][0]:7.0f}s  txns {stats.get('txns', 0)}  waiting max {max(w):.0f}  "
                f"rss {', '.join(f'{v:.0f}' for k, v in x.items() if k.startswith('rss'))} MB  "
                f"log rows {sum(v for k, v in x.items() if k.endswith('_mm_log_items')):.0f}",
                flush=True,
            )
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for p in daemons.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
        for fh in logs:
            fh.close()
    names = sorted({k for _, x in samples for k in x})
    lines = [
        f"### {backend.name}: {minutes:g} min, 3 sites, {rate:g} txn/s per site, ~{rows} rows, "
        f"{len(samples)} samples every {every:g} s, {stats.get('txns', 0)} transactions ({stats.get('retries', 0)} retried)",
        "",
        "| series | first | max, first third | max, last third | bounded |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    unbounded = []
    for n in names:
        series = [x[n] for _, x in samples if n in x]
        if len(series) < 3:
            continue
        kind = n.split(" ")[0]
        first, a, b, ok = bounded(kind, series)
        fmt = (lambda v: f"{v:.1f}") if kind in ("rss_mb", "lag_s") else (lambda v: f"{v:.0f}")
        lines.append(f"| {n} | {fmt(first)} | {fmt(a)} | {fmt(b)} | {'yes' if ok else '**no**'} |")
        if not ok:
            unbounded.append(n)
    if not keep:
        backend.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept: {tmp}")
    return "\n".join(lines), unbounded


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    ap.add_argument("--rate", type=float, default=10.0, help="transactions per second per site")
    ap.add_argument("--rows", type=int, default=500, help="rows the load keeps in the table")
    ap.add_argument("--servers", action="store_true", help="also PostgreSQL (after SQLite)")
    ap.add_argument("--databases", help="comma-separated, in order (sqlite, postgresql, mysql); overrides --servers")
    ap.add_argument("--out", default="soak.md", help="the Markdown table (default: soak.md here)")
    ap.add_argument("--keep", action="store_true", help="keep the SQLite files and server databases")
    a = ap.parse_args()
    parts, bad = [], []
    names = a.databases.split(",") if a.databases else ["sqlite", "postgresql"] if a.servers else ["sqlite"]
    for name in names:
        print(f"{name}: {a.minutes:g} min", flush=True)
        md, unbounded = soak(BACKENDS[name](), a.minutes, a.every, a.rate, a.rows, a.keep)
        parts.append(md)
        bad += [f"{name}: {u}" for u in unbounded]
    text = "\n\n".join(parts) + "\n"
    Path(a.out).write_text(text)
    print()
    print(text)
    print("unbounded: " + (", ".join(bad) if bad else "none"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
