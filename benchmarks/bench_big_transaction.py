"""One large source transaction: the refresher's peak memory, before and after, side by side.

    .venv/bin/python benchmarks/bench_big_transaction.py [--rows 100000,300000]
                                                         [--pairs postgresql:mysql,mysql:postgresql,postgresql:sqlite]
                                                         [--against main] [--batch-size 10000]

Per pair (source:target) and row count: two sites with an `items` table; one transaction at the
source inserts `--rows` rows (a bulk job); then ONE refresh of the target from the source runs in a
process of its own, and its peak RSS (getrusage ru_maxrss) and time are printed. Each is measured
with this tree's code and with `--against`'s (a git revision, checked out in a temporary worktree
of this repository; '' skips it), side by side. Databases are created with unique names and
dropped at the end. docs/performance.md "One large transaction" has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the refresh, alone in a process of the tree's code: its peak RSS is what the refresher needs
REFRESH = """
import json, resource, sys, time
from multimaster import api
from multimaster.config.topology import load_topology
t0 = time.perf_counter()
res = api.refresh(load_topology(sys.argv[1]), "b", "a", batch_size=int(sys.argv[2]))
assert res[0].error is None, res[0].error
print(json.dumps({"rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds": time.perf_counter() - t0,
                  "pulled": res[0].pulled, "batches": res[0].batches}))
"""


def child(tree: Path, src: str, tgt: str, rows: int, batch: int) -> dict[str, float]:
    """In a process whose imports come from `tree`: make the two sites, write the transaction,
    run the refresh in a process of its own, check the target, drop the databases."""
    sys.path[:0] = [str(tree), str(tree / "tests")]
    from clusters import BACKENDS, ITEMS, TestCluster  # the tree's helpers

    from multimaster import api

    made = {n: BACKENDS[n]() for n in dict.fromkeys((src, tgt))}
    tmp = Path(tempfile.mkdtemp(prefix="mm-bench-bigtxn-"))
    try:
        import yaml

        from multimaster.config.topology import load_topology

        urls = {"a": made[src].new_site(tmp, "a"), "b": made[tgt].new_site(tmp, "b")}
        for s, name in (("a", src), ("b", tgt)):
            made[name].create_table(urls[s], "items", "id", ITEMS["items"]["columns"])
        doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"items": {"key": "id"}}, "links": "mesh"}
        (tmp / "topology.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        topo = load_topology(tmp / "topology.yaml")
        api.init(topo)
        cl = TestCluster(made[src], topo, urls, ITEMS)
        c = cl.db("a")
        ph = made[src].param()
        cur = c.cursor()
        for i in range(0, rows, 5000):  # ONE transaction
            cur.executemany(
                f"INSERT INTO items (name, qty, price) VALUES ({ph}, {ph}, {ph})",
                [(f"bulk-{n}", n, n * 0.5) for n in range(i, min(rows, i + 5000))],
            )
        c.commit()
        c.close()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run(
            [sys.executable, "-c", REFRESH, str(tmp / "topology.yaml"), str(batch)],
            env=env,
            cwd=str(tree),  # (python -c imports from the working directory first)
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise SystemExit(f"the refresh failed ({tree}): {out.stderr[-2000:]}")
        got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
        tc = made[tgt].connect(urls["b"])
        n = tc.cursor()
        n.execute("SELECT count(*) FROM items")
        assert int(n.fetchone()[0]) == rows, "the target does not hold every row"
        tc.close()
        return got
    finally:
        for b in made.values():
            b.cleanup()


def measure(tree: Path, pair: str, rows: int, batch: int) -> dict[str, float]:
    src, tgt = pair.split(":")
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), "--pairs", pair, "--rows", str(rows), "--batch-size", str(batch)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="100000")
    ap.add_argument("--pairs", default="postgresql:mysql")
    ap.add_argument("--against", default="main", help="a git revision measured too ('' for none)")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        src, tgt = a.pairs.split(":")
        print(json.dumps(child(Path(a.child), src, tgt, int(a.rows), a.batch_size)))
        return
    trees: list[tuple[str, Path]] = []
    made_tree: Path | None = None
    if a.against:
        made_tree = Path(tempfile.mkdtemp(prefix="mm-bench-against-")) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(made_tree), a.against], check=True, capture_output=True
        )
        trees.append((a.against, made_tree))
    trees.append(("this tree", ROOT))
    try:
        print(f"one transaction of N inserts at the source, one refresh (batch_size {a.batch_size}): peak RSS, seconds")
        for pair in a.pairs.split(","):
            for rows in (int(x) for x in a.rows.split(",")):
                cells = []
                for label, tree in trees:
                    r = measure(tree, pair, rows, a.batch_size)
                    cells.append(f"{label}: {r['rss_mib']:.0f} MiB, {r['seconds']:.1f} s, {int(r['batches'])} batches")
                print(f"{pair.replace(':', ' -> '):24s} {rows:>8,} rows   " + "   |   ".join(cells), flush=True)
    finally:
        if made_tree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(made_tree)], capture_output=True)


if __name__ == "__main__":
    main()
