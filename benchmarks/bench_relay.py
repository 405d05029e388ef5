"""What relaying every applied change in a mesh costs the applying site (docs/performance.md
"Relaying in a mesh"), side by side in one run, interleaved.

    .venv/bin/python benchmarks/bench_relay.py                      # SQLite, PostgreSQL, MariaDB
    .venv/bin/python benchmarks/bench_relay.py --servers sqlite --changes 4000 --rounds 5
    .venv/bin/python benchmarks/bench_relay.py --servers postgresql,mysql --rules mesh --batch 10   # small batches

A mesh of three sites (a, b, c), one latest/additive table; b's applications write `--changes`
inserts and as many updates, in transactions of 10; a refreshes from b (pull + reconcile), timed.
Two settings, run alternately, each round on a fresh cluster:

- `need` (`refresh: {relay: needed}`, the rule before 2026-11-27): a mesh of latest/additive tables
  relays nothing (every puller pulls every origin directly);
- `mesh` (`relay: all`, the default): a applies b's changes and writes each into its own change
  log too, for c to get from a whichever of b's changes it lacks while b is away
  (engine/refresh.py relay_origins).

Prints per server the changes/s applied under each rule and the ratio mesh ÷ need (median of
rounds and the median of paired ratios), the log rows a holds afterwards, then a's pull by c:
rows that travelled with a body and as positions only (c had pulled b first). `--batch N`: a
refreshes in batches of N changes (the per-batch work: locks, checks, relay step) instead of the
topology's default; `--rules mesh` runs the default rule alone (a whole-process A/B of two trees).
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

import yaml  # noqa: E402
from clusters import MySQLBackend, PostgresBackend, SQLiteBackend  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.config.topology import load_topology  # noqa: E402

COLS = {"name": "text", "qty": "int"}


def _backends(names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in names:
        out[n] = {"sqlite": SQLiteBackend, "postgresql": PostgresBackend, "mysql": MySQLBackend}[n]()
    return out


def one_round(b: Any, tmp: Path, rule: str, n: int, batch: int | None = None) -> dict[str, float]:
    d = Path(tempfile.mkdtemp(dir=tmp))
    urls = {s: b.new_site(d, f"{d.name[-6:].lower()}_{s}") for s in ("a", "b", "c")}  # unique database names
    for u in urls.values():
        b.create_table(u, "items", "id", COLS)
    doc = {
        "sites": {s: {"url": u} for s, u in urls.items()},
        "tables": {"items": {"key": "id", "columns": {"qty": "additive"}}},
        "links": "mesh",
        "refresh": {"relay": "all" if rule == "mesh" else "needed"},
    }
    (d / "t.yaml").write_text(yaml.safe_dump(doc))
    topo = load_topology(d / "t.yaml")
    api.init(topo)
    p = b.param()
    c = b.connect(urls["b"])
    cur = c.cursor()
    for i in range(0, n, 10):
        for j in range(i, min(n, i + 10)):
            cur.execute(f"INSERT INTO items (name, qty) VALUES ({p}, {p})", (f"n{j}", j))
        c.commit()
    for i in range(0, n, 10):
        for j in range(i, min(n, i + 10)):
            cur.execute(f"UPDATE items SET qty = qty + 1 WHERE name = {p}", (f"n{j}",))
        c.commit()
    c.close()
    with api.Cluster(topo) as cl:
        api.refresh(cl, "c", "b")
        t0 = time.perf_counter()
        api.refresh(cl, "a", "b", batch_size=batch)
        dt = time.perf_counter() - t0
        s = cl.site("a")
        with s.read() as conn:
            logged = int(conn.exec_driver_sql(f"SELECT count(*) FROM {s.dialect.obj('items').log}").scalar() or 0)
        api.refresh(cl, "c", "a")
        sc = cl.site("c")
        with sc.read() as conn:
            snap = sc.dialect.obj("items", "a").snap
            bodies = int(conn.exec_driver_sql(f"SELECT count(*) FROM {snap} WHERE origin = 'b'").scalar() or 0)
    return {"rate": 2 * n / dt, "logged_at_a": logged, "bodies_at_c": bodies}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", default="sqlite,postgresql,mysql")
    ap.add_argument("--changes", type=int, default=2000, help="inserts at b (as many updates follow)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=None, help="a refreshes in batches of this many changes")
    ap.add_argument("--rules", default="need,mesh", help="need,mesh (side by side) or one of them")
    a = ap.parse_args()
    rules = a.rules.split(",")
    backends = _backends(a.servers.split(","))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, b in backends.items():
                res: dict[str, list[dict[str, float]]] = {r: [] for r in rules}
                for r in range(a.rounds):
                    for rule in rules if r % 2 == 0 else rules[::-1]:
                        res[rule].append(one_round(b, Path(tmp), rule, a.changes, a.batch))
                if len(rules) == 1:
                    rates = [x["rate"] for x in res[rules[0]]]
                    print(
                        f"{name}: {2 * a.changes} changes applied at a ({rules[0]}); {statistics.median(rates):,.0f}/s",
                        flush=True,
                    )
                    continue
                need = [x["rate"] for x in res["need"]]
                mesh = [x["rate"] for x in res["mesh"]]
                paired = [m / nd for m, nd in zip(mesh, need)]
                print(
                    f"{name}: {2 * a.changes} changes applied at a; need {statistics.median(need):,.0f}/s, "
                    f"mesh {statistics.median(mesh):,.0f}/s; ratio mesh/need {statistics.median(mesh) / statistics.median(need):.3f} "
                    f"(paired {statistics.median(paired):.3f}; rounds {', '.join(f'{x:.2f}' for x in paired)}); "
                    f"log rows at a: need {res['need'][0]['logged_at_a']}, mesh {res['mesh'][0]['logged_at_a']}; "
                    f"b's changes that reached c from a with a body: need {res['need'][0]['bodies_at_c']}, "
                    f"mesh {res['mesh'][0]['bodies_at_c']}",
                    flush=True,
                )
    finally:
        for b in backends.values():
            b.cleanup()


if __name__ == "__main__":
    main()
