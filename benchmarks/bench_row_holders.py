"""Applications that hold a row while a refresh applies a peer's changes to it: what the other
applications of the table see (docs/performance.md "Rows held by applications").

    .venv/bin/python benchmarks/bench_row_holders.py                       # both servers, 20 s each
    .venv/bin/python benchmarks/bench_row_holders.py --servers mysql --seconds 30

Two sites of one server, a and b, one renumbered table `items` (name, qty) seeded with 100 rows.
At a, 3 "holder" connections lock a random one of the 100 rows (SELECT ... FOR UPDATE), think
300 ms, update it and commit, over and over; 2 "inserter" connections insert a row every 20 ms.
At b, 2 connections insert a row and update a random one of the 100, every 20 ms. A refresher
pulls b into a (and a into b) over and over, as the daemon does. Printed per server: the
holders' transactions committed and those rolled back as deadlock victims, the inserters' latency
(p50 / p99 / max), and whether both sites are equal once refreshed until quiet.

Session 33 found, with the code before it: on MariaDB a holder's UPDATE, waiting for its slot,
deadlocked with the reconciler that held every slot and waited for the holder's row (InnoDB
rolled the holder back: 10-31 per 20 s), and on both servers every insert waited behind that
reconciler for as long as the holder thought (p99 360 ms on MariaDB, 520 ms on PostgreSQL). To
compare two trees, run this script from each (its own tree is the one imported).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import psycopg  # noqa: E402
import pymysql  # noqa: E402

URL = {"mysql": "mysql+pymysql://root@127.0.0.1/{db}", "postgresql": "postgresql+psycopg://postgres@127.0.0.1/{db}"}
KEY = {"mysql": "INT AUTO_INCREMENT", "postgresql": "SERIAL"}


class _Pg:
    def __init__(self, db: str) -> None:
        self.c = psycopg.connect(f"host=127.0.0.1 user=postgres dbname={db}", autocommit=True)

    def run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self.c.execute(sql, args)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def close(self) -> None:
        self.c.close()


class _My:
    def __init__(self, db: str | None) -> None:
        self.c = pymysql.connect(host="127.0.0.1", user="root", password="", database=db, autocommit=True)

    def run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self.c.cursor()
        cur.execute(sql, args)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def close(self) -> None:
        self.c.close()


def connect(server: str, db: str | None) -> Any:
    return _Pg(db or "postgres") if server == "postgresql" else _My(db)


def deadlock(e: BaseException) -> bool:
    return isinstance(e, psycopg.errors.DeadlockDetected) or (isinstance(e, pymysql.err.OperationalError) and e.args[0] == 1213)


def mm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "multimaster.cli", *args], capture_output=True, text=True, cwd=ROOT, env=env)


def one(server: str, seconds: float, tmp: Path) -> str:
    dbs = [f"mm_holders_{secrets.token_hex(3)}_{s}" for s in ("a", "b")]
    admin = connect(server, None)
    for db in dbs:
        admin.run(f"CREATE DATABASE {db}")
        c = connect(server, db)
        c.run(f"CREATE TABLE items (id {KEY[server]} PRIMARY KEY, name VARCHAR(60), qty INT)")
        c.close()
    topo = tmp / f"{server}.yaml"
    sites = "\n".join(f'  {s}: {{url: "{URL[server].format(db=db)}"}}' for s, db in zip("ab", dbs))
    topo.write_text(f"sites:\n{sites}\ntables:\n  items: {{key: id, columns: {{qty: additive}}}}\nlinks: mesh\n")
    try:
        r = mm("init", "-t", str(topo))
        assert r.returncode == 0, r.stdout + r.stderr
        c = connect(server, dbs[0])
        for i in range(100):
            c.run("INSERT INTO items (name, qty) VALUES (%s, 0)", (f"seed{i}",))
        c.close()
        mm("refresh", "-t", str(topo), "--until-quiet")
        return _load(server, dbs, topo, seconds)
    finally:
        for db in dbs:
            admin.run(f"DROP DATABASE IF EXISTS {db}" + (" WITH (FORCE)" if server == "postgresql" else ""))
        admin.close()


def _load(server: str, dbs: list[str], topo: Path, seconds: float) -> str:
    stop = threading.Event()
    st: dict[str, Any] = {"held": 0, "victims": 0, "other": 0, "ins": []}
    mu = threading.Lock()

    def holder(n: int) -> None:
        rnd, c = random.Random(n), connect(server, dbs[0])
        while not stop.is_set():
            i = rnd.randint(1, 100)
            try:
                c.run("BEGIN")
                c.run("SELECT qty FROM items WHERE id = %s FOR UPDATE", (i,))
                time.sleep(0.3)
                c.run("UPDATE items SET qty = qty + 1 WHERE id = %s", (i,))
                c.run("COMMIT")
                k = "held"
            except Exception as e:  # noqa: BLE001 - counted
                c.run("ROLLBACK")
                k = "victims" if deadlock(e) else "other"
            with mu:
                st[k] += 1
        c.close()

    def inserter(n: int) -> None:
        c, k = connect(server, dbs[0]), 0
        while not stop.is_set():
            k += 1
            t0 = time.perf_counter()
            c.run("INSERT INTO items (name, qty) VALUES (%s, 0)", (f"a{n}-{k}",))
            with mu:
                st["ins"].append(time.perf_counter() - t0)
            time.sleep(0.02)
        c.close()

    def remote(n: int) -> None:
        rnd, c, k = random.Random(100 + n), connect(server, dbs[1]), 0
        while not stop.is_set():
            k += 1
            try:
                c.run("INSERT INTO items (name, qty) VALUES (%s, 0)", (f"b{n}-{k}",))
                c.run("UPDATE items SET qty = qty + 1 WHERE id = %s", (rnd.randint(1, 100),))
            except Exception:  # noqa: BLE001, S110 - a deadlock victim at b: the application would retry
                pass
            time.sleep(0.02)
        c.close()

    def refresher() -> None:
        while not stop.is_set():
            mm("refresh", "-t", str(topo))
            time.sleep(0.2)

    threads = [threading.Thread(target=f, args=(n,)) for f, m in ((holder, 3), (inserter, 2), (remote, 2)) for n in range(m)]
    threads.append(threading.Thread(target=refresher))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    mm("refresh", "-t", str(topo), "--until-quiet")
    rows = []
    for db in dbs:
        c = connect(server, db)
        rows.append(sorted(c.run("SELECT id, name, qty FROM items")))
        c.close()
    ins = sorted(st["ins"])

    def pct(p: float) -> float:
        return ins[min(len(ins) - 1, int(p * len(ins)))] * 1000

    return (
        f"holders committed {st['held']}, deadlock victims {st['victims']}, other failures {st['other']}; "
        f"inserts {len(ins)}: p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, max {ins[-1] * 1000:.0f} ms; "
        f"sites {'equal' if rows[0] == rows[1] else 'DIFFER'} ({len(rows[0])} rows)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="mysql,postgresql")
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for server in a.servers.split(","):
            print(f"{server}: {one(server, a.seconds, Path(tmp))}", flush=True)


if __name__ == "__main__":
    main()
