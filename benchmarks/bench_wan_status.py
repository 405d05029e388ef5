"""`multimaster status` and a refresh with nothing to do, across a WAN: every site reached through
benchmarks/delay_proxy.py (a fixed one-way delay per chunk), timed as a user runs the commands,
this tree against another revision (`--against REV`, a git worktree) side by side, interleaved.

    .venv/bin/python benchmarks/bench_wan_status.py --against 3a28ede
    .venv/bin/python benchmarks/bench_wan_status.py --sites 3 --tables 4 --delay 0.05 --rounds 3 --against 3a28ede

One cluster of `--sites` PostgreSQL sites with `--tables` tables (made and initialised with this
tree; the installs of both revisions are the same), a proxy per site, and per round: `status`,
then `refresh` (every link, nothing to pull), with each revision's installed command
(`python -m multimaster.cli` with that tree first on PYTHONPATH). Prints per revision the median
seconds of each command and the ratio this / against.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from clusters import PostgresBackend, make_cluster  # noqa: E402


def _tree(rev: str, tmp: Path) -> Path:
    wt = tmp / "against-tree"
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(wt), rev], capture_output=True, text=True
    )
    if made.returncode:
        raise SystemExit(f"--against {rev}: git worktree add failed: {made.stderr.strip()}")
    return wt


def _timed(tree: Path, args: list[str]) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "multimaster.cli", *args], capture_output=True, text=True, env=env, cwd=str(tree))
    return time.perf_counter() - t0, r.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--delay", type=float, default=0.05, help="one-way delay per chunk, seconds (0.05: 100 ms round trips)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", help="a revision to run side by side (a git worktree of it)")
    a = ap.parse_args()
    b = PostgresBackend()
    tmp = Path(tempfile.mkdtemp())
    wt = None
    px = None
    try:
        tables = {f"t{i}": {"key": "id", "columns": {"name": "text", "qty": "int"}} for i in range(a.tables)}
        names = [chr(ord("a") + i) for i in range(a.sites)]
        cl = make_cluster(b, tmp, names, tables)
        for i in range(20):
            cl.execute("a", "INSERT INTO t0 (name, qty) VALUES (?, ?)", (f"x{i}", i))
        cl.refresh_until_quiet()
        doc = yaml.safe_load(cl.topo.path.read_text())
        maps = []
        for port, (n, site) in enumerate(doc["sites"].items(), start=16400):
            site["url"] = site["url"].replace("127.0.0.1:5432", f"127.0.0.1:{port}")
            maps += ["--map", f"{n}@127.0.0.1:{port}=127.0.0.1:5432"]
        slow = tmp / "wan.yaml"
        slow.write_text(yaml.safe_dump(doc, sort_keys=False))
        px = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "delay_proxy.py"), "--delay", str(a.delay), *maps])
        time.sleep(1.5)
        trees = {"this": ROOT}
        if a.against:
            wt = _tree(a.against, tmp)
            trees["against"] = wt
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(a.rounds):
            for which, tree in trees.items():
                for cmd in ("status", "refresh"):
                    s, code = _timed(tree, [cmd, "-t", str(slow)])
                    times.setdefault((which, cmd), []).append(s)
                    print(f"round {r + 1} {which:8s} {cmd:8s} {s:6.1f} s (exit {code})", flush=True)
        print(f"== {a.sites} PostgreSQL sites, {a.tables} tables, {2 * a.delay * 1000:.0f} ms round trips: median seconds")
        for cmd in ("status", "refresh"):
            this = statistics.median(times[("this", cmd)])
            line = f"{cmd:8s} this {this:6.1f}"
            if a.against:
                other = statistics.median(times[("against", cmd)])
                line += f"   against {other:6.1f}   ratio this/against {this / other:.2f}"
            print(line)
    finally:
        if px is not None:
            px.terminate()
        if wt is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], capture_output=True)
        b.cleanup()


if __name__ == "__main__":
    main()
