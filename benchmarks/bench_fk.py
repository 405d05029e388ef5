"""The apply cost of a foreign key between replicated tables (docs/foreign-keys.md), measured side
by side on SQLite, PostgreSQL and MariaDB.

    .venv/bin/python benchmarks/bench_fk.py                       # 2,000 parents, 4 children each
    .venv/bin/python benchmarks/bench_fk.py --quick               # a fifth of it
    .venv/bin/python benchmarks/bench_fk.py --backends sqlite     # one database

Two replicated auto-counter tables, `parent(id, name)` and `child(id, parent_id, qty)`, twice: once
with `child.parent_id REFERENCES parent(id)` declared (multimaster carries the reference by the
parent's identity and resolves it at apply), once the same column without the declaration (a plain
integer: nothing to resolve, and after a renumbering it points at the wrong parent). Two cases,
each timed on the target's reconcile only (the pull is done before, untimed):

- `new`: the source inserted N parents and K children of each; the target holds nothing new;
- `keys_move`: the same, and the target inserted N/4 parents with K children each *after* the
  source's rows were written, so every one of them moves (the reconcile renumbers them; with the
  foreign key the target's children move with their parents).

Variants run interleaved (plain, fk, plain, fk, ...), --repeat times; the median of each is
reported with the ratio fk / plain. The children are checked after each fk run: every child
points at the parent it was written with.
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
from clusters import BACKENDS  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.config.topology import load_topology  # noqa: E402

AUTO = {"sqlite": "INTEGER PRIMARY KEY", "postgresql": "SERIAL PRIMARY KEY", "mysql": "INT AUTO_INCREMENT PRIMARY KEY"}


def _ddl(backend: str, fk: bool) -> list[str]:
    ref = " REFERENCES parent(id)" if fk else ""
    return [
        f"CREATE TABLE parent (id {AUTO[backend]}, name VARCHAR(40))",
        f"CREATE TABLE child (id {AUTO[backend]}, parent_id INTEGER{ref}, qty INTEGER)",
    ]


def _exec(b: Any, url: str, statements: list[str]) -> None:
    c = b.connect(url)
    try:
        cur = c.cursor()
        if b.name == "sqlite":
            cur.execute("PRAGMA foreign_keys = ON")
        for s in statements:
            cur.execute(s)
        c.commit()
    finally:
        c.close()


def _family(b: Any, url: str, n: int, k: int, tag: str) -> None:
    """`n` parents named tag-i, each with `k` children whose qty is i, written by an application
    that reads each parent's key back (as applications do) — one transaction."""
    c = b.connect(url)
    try:
        cur = c.cursor()
        if b.name == "sqlite":
            cur.execute("PRAGMA foreign_keys = ON")
        p = b.param()
        for i in range(n):
            if b.name == "postgresql":
                cur.execute(f"INSERT INTO parent (name) VALUES ({p}) RETURNING id", (f"{tag}-{i}",))
                pid = cur.fetchone()[0]
            else:
                cur.execute(f"INSERT INTO parent (name) VALUES ({p})", (f"{tag}-{i}",))
                pid = cur.lastrowid
            cur.executemany(f"INSERT INTO child (parent_id, qty) VALUES ({p}, {p})", [(pid, i)] * k)
        c.commit()
    finally:
        c.close()


def _check(b: Any, url: str, children: int) -> None:
    c = b.connect(url)
    try:
        cur = c.cursor()
        cur.execute("SELECT p.name, c.qty FROM child c JOIN parent p ON p.id = c.parent_id")
        bad = [(name, qty) for name, qty in cur.fetchall() if int(name.rsplit("-", 1)[1]) != qty]
        cur.execute("SELECT count(*) FROM child WHERE parent_id NOT IN (SELECT id FROM parent)")
        orphans = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM child")
        count = cur.fetchone()[0]
    finally:
        c.close()
    if bad or orphans or count != children:
        raise SystemExit(
            f"wrong apply: {len(bad)} children at the wrong parent, {orphans} orphans, {count} children of {children}"
        )


def run(backend: str, tmp: Path, fk: bool, case: str, n: int, k: int) -> float:
    b = BACKENDS[backend]()
    try:
        urls = {s: b.new_site(tmp, s) for s in ("a", "b")}
        for u in urls.values():
            _exec(b, u, _ddl(backend, fk))
        doc = {
            "sites": {s: {"url": u} for s, u in urls.items()},
            "tables": {"parent": {"key": "id"}, "child": {"key": "id"}},
            "links": "mesh",
        }
        path = tmp / f"topo-{backend}-{fk}-{case}-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(doc))
        t = load_topology(path)
        api.init(t)
        _family(b, urls["b"], n, k, "b")
        if case == "keys_move":
            _family(b, urls["a"], n // 4, k, "a")  # written later: these move behind b's
        with api.Cluster(t) as cl:
            api.refresh(cl, "a", "b", batch_size=1_000_000, reconcile_=False)
            t0 = time.perf_counter()
            api.reconcile(cl, "a")
            dt = time.perf_counter() - t0
        if fk:
            _check(b, urls["a"], n * k + (n // 4 * k if case == "keys_move" else 0))
        return dt
    finally:
        b.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a fifth of every size")
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant, interleaved; the median is reported")
    ap.add_argument("--backends", default="sqlite,postgresql,mysql")
    ap.add_argument("--children", type=int, default=4, help="children per parent")
    args = ap.parse_args()
    n = 400 if args.quick else 2000
    k = args.children
    out: dict[str, Any] = {}
    for backend in args.backends.split(","):
        for case in ("new", "keys_move"):
            times: dict[str, list[float]] = {"plain": [], "fk": []}
            for r in range(args.repeat):
                for name in ("plain", "fk"):
                    with tempfile.TemporaryDirectory(prefix="mm-bench-fk-") as tmp:
                        dt = run(backend, Path(tmp), name == "fk", case, n, k)
                    times[name].append(dt)
                    print(f"{backend:10} {case:9} run {r + 1} {name:5}: {dt:.3f} s", flush=True)
            med = {name: statistics.median(v) for name, v in times.items()}
            changes = n * (1 + k)
            out[f"{backend}/{case}"] = {
                "changes": changes,
                "plain_changes_per_s": round(changes / med["plain"]),
                "fk_changes_per_s": round(changes / med["fk"]),
                "fk/plain": round(med["plain"] / med["fk"], 3),
            }
            print(json.dumps({f"{backend}/{case}": out[f"{backend}/{case}"]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
