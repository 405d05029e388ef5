"""Network bytes per change, per topology and number of sites (docs/performance.md "Network").

    .venv/bin/python benchmarks/bench_network.py            # mesh, star, chain × 3, 5, 8 sites
    .venv/bin/python benchmarks/bench_network.py --quick    # 3 and 5 sites, fewer changes

Every site is a SQLite database behind its agent (`multimaster serve`, in threads of this process);
every link `a -> b` goes through a counting TCP proxy of its own (benchmarks/delay_proxy.py, no
delay), so the bytes of each site connection are counted at the application layer (HTTP with its
JSON lines; TCP/IP headers not included). Each site writes `--changes` changes (inserts, then
updates of its own rows), then every site refreshes its links, round after round, until a round
pulls nothing. Per setup:

- bytes per change: all bytes over all links ÷ changes written (every change must reach n − 1 sites);
- bytes per change delivered: ÷ (changes × (n − 1));
- rows shipped per change per site: the change-log rows pulled over all links ÷ (changes × (n − 1)):
  1.00 when no site receives a change twice (relayed changes a site already has are not shipped);
- the bytes of one idle round (nothing to pull), per link: the fixed cost of polling.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402
from delay_proxy import Map, serve  # noqa: E402

from multimaster import api  # noqa: E402
from multimaster.config.topology import load_topology  # noqa: E402
from multimaster.ops import agent as agent_mod  # noqa: E402

TOKEN = "network-bench-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _links_doc(shape: str, sites: list[str]) -> Any:
    return {"mesh": "mesh", "star": {"star": sites[0]}, "chain": {"chain": sites}}[shape]


class Proxies:
    """Counting proxies in an asyncio loop of their own thread."""

    def __init__(self, maps: list[Map]) -> None:
        self.maps = maps
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self.ready = threading.Event()
        self.thread.start()
        self.ready.wait(10)

    async def _main(self) -> None:
        self.stop = asyncio.Event()
        task = asyncio.ensure_future(serve(self.maps, 0.0, None, self.stop))
        await asyncio.sleep(0.2)
        self.ready.set()
        await task
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def total(self) -> int:
        return sum(m.up + m.down for m in self.maps)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def run_setup(shape: str, n: int, changes: int, tmp: Path, causal: bool = False) -> dict[str, Any]:
    sites = [f"s{i + 1}" for i in range(n)]
    dbs = {s: tmp / f"{shape}{n}-{s}.db" for s in sites}
    for db in dbs.values():
        with sqlite3.connect(db) as c:
            c.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)")
    entry = {s: {"url": f"sqlite:///{dbs[s]}", "token": "${MM_NET_TOKEN}"} for s in sites}
    table: dict[str, Any] = {"key": "id"}
    if causal:  # a policy that needs causal delivery: every site relays what it applies
        table["columns"] = {"name": "earliest"}
    common = {"tables": {"items": table}, "links": _links_doc(shape, sites)}
    setup = tmp / f"{shape}{n}.yaml"
    setup.write_text(yaml.safe_dump({"sites": entry, **common}, sort_keys=False))
    topo = load_topology(setup)
    api.init(topo)
    links = [(ln.source, ln.target) for ln in topo.links]
    # agents
    servers, agent_port = [], {}
    for s in sites:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        agent_port[s] = sock.getsockname()[1]
        server = agent_mod.make_server(topo, s, f"127.0.0.1:{agent_port[s]}")
        t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        t.start()
        servers.append((server, t, sock))
    for server, _t, _s in servers:
        while not server.started:
            time.sleep(0.01)
    # a proxy per link; per target a file reaching every other site through its link's proxy
    maps = {(a, b): Map(f"{a}->{b}", ("127.0.0.1", _free_port()), ("127.0.0.1", agent_port[a])) for a, b in links}
    proxies = Proxies(list(maps.values()))
    files = {}
    for t in sites:
        doc_sites = {}
        for s in sites:
            m = maps.get((s, t))
            doc_sites[s] = (
                entry[s] if s == t or m is None else {"url": f"http://127.0.0.1:{m.listen[1]}", "token": "${MM_NET_TOKEN}"}
            )
        p = tmp / f"{shape}{n}-{t}.yaml"
        p.write_text(yaml.safe_dump({"sites": doc_sites, **common}, sort_keys=False))
        files[t] = load_topology(p)
    try:
        # writes: at every site, inserts then updates of its own rows
        per_site = max(1, changes // n)
        for s in sites:
            with sqlite3.connect(dbs[s]) as c:
                ids = []
                for i in range(per_site - per_site // 3):
                    cur = c.execute("INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", (f"{s}-item-{i:06d}", i, i * 0.25))
                    ids.append(cur.lastrowid)
                    c.commit()
                for i in range(per_site // 3):
                    c.execute("UPDATE items SET qty = qty + 1, price = price * 1.1 WHERE id = ?", (ids[i % len(ids)],))
                    c.commit()
        written = per_site * n
        pulled: dict[tuple[str, str], int] = {ln: 0 for ln in links}
        rounds = 0
        t0 = time.perf_counter()
        while True:
            rounds += 1
            moved = 0
            for t in sites:
                if not any(b == t for _a, b in links):
                    continue
                for r in api.refresh(files[t], t):
                    assert r.error is None, r.error
                    pulled[(r.peer, r.site)] += r.pulled
                    moved += r.pulled
            if moved == 0 or rounds > 3 * n:
                break
        seconds = time.perf_counter() - t0
        busy = proxies.total()
        for t in sites:  # one idle round: the fixed cost of polling
            if any(b == t for _a, b in links):
                api.refresh(files[t], t)
        idle = proxies.total() - busy
        rows = {}
        for s in sites:
            with sqlite3.connect(dbs[s]) as c:
                rows[s] = c.execute("SELECT id, name, qty, price FROM items ORDER BY id").fetchall()
        converged = all(rows[s] == rows[sites[0]] for s in sites)
        per_target: dict[str, int] = {}
        for (_a, b), k in pulled.items():
            per_target[b] = per_target.get(b, 0) + k
        foreign = written - per_site  # what each site must receive
        return {
            "shape": shape,
            "sites": n,
            "links": len(links),
            "changes": written,
            "rounds": rounds,
            "seconds": seconds,
            "bytes": busy,
            "bytes_per_change": busy / written,
            "bytes_per_delivery": busy / (written * (n - 1)),
            "shipped_per_delivery": sum(pulled.values()) / (foreign * n),
            "max_target_shipped": max(per_target.values()) / foreign,
            "idle_per_link": idle / len(links),
            "converged": converged,
        }
    finally:
        proxies.close()
        for server, t, sock in servers:
            server.should_exit = True
            t.join(10)
            sock.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--changes", type=int, help="changes written in all (default 2400, --quick 600)")
    ap.add_argument("--shapes", default="mesh,star,chain")
    ap.add_argument("--sites", help="comma-separated site counts (default 3,5,8; --quick 3,5)")
    ap.add_argument("--causal", action="store_true", help="the table needs causal delivery (name: earliest): every site relays")
    a = ap.parse_args()
    import os

    os.environ.setdefault("MM_NET_TOKEN", TOKEN)
    changes = a.changes or (600 if a.quick else 2400)
    counts = [int(x) for x in (a.sites or ("3,5" if a.quick else "3,5,8")).split(",")]
    print(
        "| topology | sites | links | changes | rounds | bytes per change | bytes per change delivered | "
        "rows shipped per delivery (max at one site) | idle round, bytes per link | converged |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="mm-net-") as tmp:
        for shape in a.shapes.split(","):
            for n in counts:
                r = run_setup(shape, n, changes, Path(tmp), a.causal)
                print(
                    f"| {shape} | {n} | {r['links']} | {r['changes']} | {r['rounds']} | {r['bytes_per_change']:,.0f} | "
                    f"{r['bytes_per_delivery']:,.0f} | {r['shipped_per_delivery']:.2f} ({r['max_target_shipped']:.2f}) | "
                    f"{r['idle_per_link']:,.0f} | {'yes' if r['converged'] else 'NO'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
