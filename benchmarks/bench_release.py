"""What applying many held changes at once costs: the release that follows a column added at a
site, and `multimaster errors retry` (docs/performance.md "Releasing held changes").

    .venv/bin/python benchmarks/bench_release.py                          # SQLite, PostgreSQL, MariaDB
    .venv/bin/python benchmarks/bench_release.py --servers mysql --changes 600 --rounds 3

Two sites, a and b, one renumbered table `items` (name, qty). a adds a column `note` and its
applications insert `--changes` rows that set it, one transaction each; b pulls them and holds
them all (b lacks the column), then b's applications insert as many rows of their own, which rank
after a's. b adds the column, and b's next refresh follows it and applies every held change: that
refresh is timed. Prints per server the seconds and the changes/s of the release (median of
rounds), and checks both sites end equal.

Until session 30 a release (and `errors retry`) applied the held changes one source transaction
at a time, each with a reconcile of its own: on a renumbered table each one shifted the keys of
every later row again, so the cost grew with the square of the changes. To compare two trees, run
this script from each (its own tree is the one imported), alternately.
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
from clusters import MySQLBackend, PostgresBackend, SQLiteBackend  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.config.topology import load_topology  # noqa: E402

BACKENDS = {"sqlite": SQLiteBackend, "postgresql": PostgresBackend, "mysql": MySQLBackend}


def _write(b: Any, url: str, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """One application transaction per row."""
    c = b.connect(url)
    try:
        cur = c.cursor()
        for r in rows:
            cur.execute(sql.replace("?", b.param()), r)
            c.commit()
    finally:
        c.close()


def _rows(b: Any, url: str) -> list[tuple[Any, ...]]:
    c = b.connect(url)
    try:
        cur = c.cursor()
        cur.execute("SELECT id, name, qty, note FROM items ORDER BY id")
        return [tuple(r) for r in cur.fetchall()]
    finally:
        c.close()


def one_round(b: Any, tmp: Path, n: int) -> tuple[float, float]:
    d = Path(tempfile.mkdtemp(dir=tmp))
    urls = {s: b.new_site(d, f"{d.name[-6:].lower()}_{s}") for s in ("a", "b")}  # unique database names
    for u in urls.values():
        b.create_table(u, "items", "id", {"name": "text", "qty": "int"})
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"items": {"key": "id"}}, "links": "mesh"}
    path = d / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    topo = load_topology(path)
    api.init(topo)
    col = "note TEXT" if b.name == "sqlite" else "note VARCHAR(40)"
    _write(b, urls["a"], f"ALTER TABLE items ADD COLUMN {col}", [()])
    api.refresh(topo, site="a")  # a follows its own column
    _write(b, urls["a"], "INSERT INTO items (name, qty, note) VALUES (?, ?, ?)", [(f"a{i}", i, f"n{i}") for i in range(n)])
    t0 = time.perf_counter()
    api.refresh(topo, site="b")  # b holds them all: it lacks the column
    hold = time.perf_counter() - t0
    held = len(api.list_errors(topo))
    if held < n:
        raise SystemExit(f"b held {held} changes, not {n}: the scenario did not happen")
    _write(b, urls["b"], "INSERT INTO items (name, qty) VALUES (?, ?)", [(f"b{i}", i) for i in range(n)])
    _write(b, urls["b"], f"ALTER TABLE items ADD COLUMN {col}", [()])
    t0 = time.perf_counter()
    api.refresh(topo, site="b")  # follows the column and applies what waited for it
    dt = time.perf_counter() - t0
    left = api.list_errors(topo)
    if left:
        raise SystemExit(f"{len(left)} changes still held after the release")
    api.refresh(topo, site="a")
    ra, rb = _rows(b, urls["a"]), _rows(b, urls["b"])
    if ra != rb or len(ra) != 2 * n:
        raise SystemExit(f"the sites differ after the release: {len(ra)} and {len(rb)} rows")
    return hold, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="sqlite,postgresql,mysql")
    ap.add_argument("--changes", type=int, default=400, help="held inserts released (and as many local rows)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {"changes": args.changes}
    for name in args.servers.split(","):
        try:
            b = BACKENDS[name]()
        except ConnectionError as e:
            out[name] = {"skipped": str(e)}
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f"mm-bench-release-{name}-"))
        try:
            both = [one_round(b, tmp, args.changes) for _ in range(args.rounds)]
        finally:
            b.cleanup()
        holds, times = [h for h, _ in both], [t for _, t in both]
        med, hmed = statistics.median(times), statistics.median(holds)
        out[name] = {
            "seconds": [round(t, 3) for t in times],
            "median_s": round(med, 3),
            "changes_per_s": round(args.changes / med, 1),
            "hold_seconds": [round(t, 3) for t in holds],
            "hold_median_s": round(hmed, 3),
        }
        if not args.json:
            print(
                f"{name}: holding {args.changes} changes (the refresh that pulls them): median {hmed:.2f} s, rounds {out[name]['hold_seconds']}; "
                f"release of them: median {med:.2f} s ({args.changes / med:.0f} changes/s), rounds {out[name]['seconds']}",
                flush=True,
            )
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
