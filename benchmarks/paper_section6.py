"""The paper's section 6 experiment, with three real separate hosts (docs/paper-section6.md).

    .venv/bin/python benchmarks/paper_section6.py --quick     # under 5 minutes
    .venv/bin/python benchmarks/paper_section6.py             # all 16 setups on LAN, Fig. 9's 8 on WAN

Three sites, each a SQLite database in its own network namespace (a veth pair to a bridge in a hub
namespace), behind its agent (`multimaster serve`), with its refresher daemon (`multimaster run
--site`) and an application server executing the users' writes (one single-row transaction per
request). Each site's processes run in a CPU cgroup of their own capped at `--quota` of a core:
the paper's "server" with its single CPU. Every connection between hosts goes through a delaying
proxy (benchmarks/delay_proxy.py) in the connecting host: 0 s on the LAN, `--wan-delay` (5 s, as the
paper) one way on the WAN.

- **uni-directional**: s1 is the master, s2 and s3 are `read_only: true` and pull s1; the users at
  s2 and s3 send their writes to s1's application server across the network.
- **multi-directional**: a mesh; every user writes at its own site.

X is the request rate that saturates one site (measured first: one site alone, writes as fast as it
commits them). Each run offers a total of X/9, X/3, X or 3X requests/s for `--duration` seconds,
split over one user per site, with 0/33/67/100 % updates of the user's own earlier rows (the rest
inserts). Per run: each site's CPU availability (the share of 100 ms scheduler periods in which the
site did not use up its CPU: cgroup `nr_throttled`), its CPU use, bytes over the network (counted in
the proxies, and on the wire from the hosts' veth counters), the run time from the first request to
the end of reconciliation (every write visible at every site), and the wait-time for up-to-date data
at the nearest site: per write and per site, from the moment the user issued the write to the
moment a query at that site sees it (sampled every 50 ms), averaged. Root and `ip netns` needed.

Internal roles (run by the benchmark inside the namespaces): `--role appserver`, `--role user`.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
AGENT_PORT, APP_PORT, PROXY_BASE = 8470, 7000, 9000
TOKEN = "section6-token-0123456789abcdef"
BASE_KEYS = 40  # rows per user at the start (updates need rows)
STRESS = [("X/9", 1 / 9), ("X/3", 1 / 3), ("X", 1.0), ("3X", 3.0)]
UPDATES = [0, 33, 67, 100]


# ---- roles run inside the namespaces --------------------------------------------------------


def role_appserver(a: argparse.Namespace) -> None:
    """The site's application server: one line of JSON per request, one transaction each, in order."""
    conn = sqlite3.connect(a.db, isolation_level=None, timeout=60)
    conn.execute("PRAGMA busy_timeout = 60000")
    conn.execute("PRAGMA synchronous = NORMAL")  # WAL: no fsync per commit (as multimaster's own connections)

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while line := await r.readline():
            m = json.loads(line)
            while True:  # a refresh holding the file's write lock longer than the busy timeout: wait on
                try:
                    if m["op"] == "i":
                        conn.execute(
                            "INSERT INTO items (k, writer, seq, issued, payload) VALUES (?, ?, ?, ?, ?)",
                            (m["k"], m["w"], m["seq"], m["t"], m["p"]),
                        )
                    else:
                        conn.execute(
                            "UPDATE items SET seq = ?, issued = ?, payload = ? WHERE k = ?", (m["seq"], m["t"], m["p"], m["k"])
                        )
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) and "busy" not in str(e):
                        raise
            w.write(f"{m['seq']} {time.time():.6f}\n".encode())
            await w.drain()
        w.close()

    async def main() -> None:
        host, _, port = a.listen.rpartition(":")
        server = await asyncio.start_server(handle, host, int(port))
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def role_user(a: argparse.Namespace) -> None:
    """One user: requests at a fixed rate (open loop: not waiting for answers), or as fast as the
    server answers with `--inflight` outstanding; prints every request's issue and answer times."""
    rnd = random.Random(a.seed)

    async def main() -> None:
        r, w = await asyncio.open_connection(*a.target.rsplit(":", 1))
        issued: dict[int, tuple[float, str]] = {}
        out: list[list[Any]] = []
        slots = asyncio.Semaphore(a.inflight) if a.inflight else None
        nkeys = a.nkeys
        sent = 0

        async def answers() -> None:
            while line := await r.readline():
                seq_s, commit_s = line.split()
                seq = int(seq_s)
                t, op = issued[seq]
                out.append([seq, t, time.time(), float(commit_s), op])
                if slots:
                    slots.release()
                if sent_all.is_set() and len(out) == sent:
                    return

        sent_all = asyncio.Event()
        reader = asyncio.create_task(answers())
        t0 = time.time()
        seq = a.seq0
        while True:
            if a.rate:
                due = t0 + (seq - a.seq0) / a.rate
                if due >= t0 + a.duration:
                    break
                if due > time.time():
                    await asyncio.sleep(due - time.time())
            elif time.time() >= t0 + a.duration:
                break
            if slots:
                await slots.acquire()
            seq += 1
            if rnd.random() * 100 < a.updates:
                op, k = "u", f"{a.writer}:{rnd.randrange(nkeys)}"
            else:
                op, k = "i", f"{a.writer}:{nkeys}"
                nkeys += 1
            now = time.time()
            issued[seq] = (now, op)
            w.write((json.dumps({"op": op, "k": k, "w": a.writer, "seq": seq, "t": now, "p": "x" * 40}) + "\n").encode())
            sent += 1
            await w.drain()
        sent_all.set()
        if len(out) < sent:
            try:
                await asyncio.wait_for(reader, a.timeout)
            except asyncio.TimeoutError:
                pass
        w.close()
        print(json.dumps({"writer": a.writer, "sent": sent, "last_seq": seq, "nkeys": nkeys, "t0": t0, "writes": out}))

    asyncio.run(main())


# ---- the orchestrator -----------------------------------------------------------------------


class Cgroup:
    """A CPU cgroup (v1 `cpu` and `cpuacct` hierarchies) capped at `quota` of a core."""

    def __init__(self, name: str, quota: float) -> None:
        self.cpu = Path("/sys/fs/cgroup/cpu") / name
        self.acct = Path("/sys/fs/cgroup/cpuacct") / name
        for d in (self.cpu, self.acct):
            d.mkdir(exist_ok=True)
        period = int((self.cpu / "cpu.cfs_period_us").read_text())
        (self.cpu / "cpu.cfs_quota_us").write_text(str(int(period * quota)))
        self.period = period / 1e6

    def join(self) -> None:
        """preexec_fn: put the starting process into the cgroup."""
        for d in (self.cpu, self.acct):
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def sample(self) -> dict[str, float]:
        st = dict(line.split() for line in (self.cpu / "cpu.stat").read_text().splitlines())
        return {
            "t": time.time(),
            "throttled": float(st["nr_throttled"]),
            "usage": int((self.acct / "cpuacct.usage").read_text()) / 1e9,
        }

    def remove(self) -> None:
        for d in (self.cpu, self.acct):
            try:
                d.rmdir()
            except OSError:
                pass


class Sampler(threading.Thread):
    """Polls one site's database every 50 ms: per writer the highest request number visible."""

    def __init__(self, db: Path) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.seen: dict[str, list[tuple[float, int]]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        conn = sqlite3.connect(self.db, timeout=60)
        while not self.stop.is_set():
            t = time.time()
            for writer, top in conn.execute("SELECT writer, max(seq) FROM items GROUP BY writer"):
                hist = self.seen.setdefault(writer, [])
                if not hist or top > hist[-1][1]:
                    hist.append((t, top))
            conn.rollback()
            self.stop.wait(0.05)
        conn.close()

    def top(self, writer: str) -> int:
        h = self.seen.get(writer)
        return h[-1][1] if h else 0

    def visible_at(self, writer: str, seq: int) -> float | None:
        h = self.seen.get(writer, [])
        i = bisect.bisect_left([x[1] for x in h], seq)
        return h[i][0] if i < len(h) else None


def _cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MM_S6_TOKEN": TOKEN}


def _probe(host: Any, addr: str, port: int, deadline: float, proc: Any = None) -> None:
    code = f"import socket; socket.create_connection(('{addr}', {port}), 1).close()"
    while host.run(PY, "-c", code).returncode != 0:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"a process in {host.ns} ended: {Path(proc.args[-1]).name}")
        if time.time() > deadline:
            raise RuntimeError(f"{addr}:{port} did not answer in {host.ns}")
        time.sleep(0.2)


class Cluster:
    """Three sites on three hosts for one model and one network delay."""

    def __init__(self, lab: Any, hosts: list[Any], cgroups: list[Cgroup], model: str, delay: float, a: argparse.Namespace):
        import yaml

        from multimaster import api
        from multimaster.config.topology import load_topology

        self.hosts, self.cgroups, self.model, self.delay, self.lab = hosts, cgroups, model, delay, lab
        self.dir = Path(tempfile.mkdtemp(prefix=f"s6-{model}-", dir=a.workdir))
        self.names = [f"s{i + 1}" for i in range(len(hosts))]
        self.dbs = {s: self.dir / f"{s}.db" for s in self.names}
        for s, db in self.dbs.items():
            with sqlite3.connect(db) as c:
                c.execute("PRAGMA journal_mode = WAL")
                c.execute(
                    "CREATE TABLE items (id INTEGER PRIMARY KEY, k TEXT, writer TEXT, seq INTEGER, issued REAL, payload TEXT)"
                )
                c.execute("CREATE INDEX items_k ON items (k)")
                c.execute("CREATE INDEX items_ws ON items (writer, seq)")
                if s == "s1":  # the common base, copied to the others by init
                    c.executemany(
                        "INSERT INTO items (k, writer, seq, issued, payload) VALUES (?, ?, 0, 0, 'base')",
                        [(f"u{u}:{n}", f"u{u}") for u in range(1, len(hosts) + 1) for n in range(BASE_KEYS)],
                    )
        self.procs: list[Any] = []
        self.writer_target: dict[str, str] = {}
        common = {
            "tables": {"items": {"key": "id"}},
            "links": "mesh",
            "refresh": {"interval": a.interval},
        }
        ro = {"read_only": True} if model == "uni" else {}
        db_entry = {s: {"url": f"sqlite:///{self.dbs[s]}", "token": "${MM_S6_TOKEN}", "insecure_http": True} for s in self.names}
        for s in self.names[1:]:
            db_entry[s].update(ro)
        setup = {"sites": db_entry, **common}
        (self.dir / "setup.yaml").write_text(yaml.safe_dump(setup, sort_keys=False))
        api.init(load_topology(self.dir / "setup.yaml"))
        # per host: its own database, the others through the proxy in this host
        for i, (s, h) in enumerate(zip(self.names, hosts)):
            sites = {}
            maps = []
            for j, (t, ht) in enumerate(zip(self.names, hosts)):
                if t == s:
                    sites[t] = db_entry[t]
                    continue
                port = PROXY_BASE + j
                sites[t] = {"url": f"http://127.0.0.1:{port}", "token": "${MM_S6_TOKEN}", **(ro if j > 0 else {})}
                maps.append(f"agent-{t}@127.0.0.1:{port}={ht.addr}:{AGENT_PORT}")
            if model == "uni" and i > 0:  # this host's users write at the master, across the network
                maps.append(f"app-s1@127.0.0.1:{PROXY_BASE + 100}={hosts[0].addr}:{APP_PORT}")
                self.writer_target[s] = f"127.0.0.1:{PROXY_BASE + 100}"
            else:
                self.writer_target[s] = f"127.0.0.1:{APP_PORT}"
            (self.dir / f"{s}.yaml").write_text(yaml.safe_dump({"sites": sites, **common}, sort_keys=False))
            stats = self.dir / f"proxy-{s}.json"
            self._start(h, None, f"proxy-{s}", PY, str(ROOT / "benchmarks" / "delay_proxy.py"), "--delay", str(delay),
                        "--stats", str(stats), *[x for m in maps for x in ("--map", m)])  # fmt: skip
        deadline = time.time() + 60
        agents = []
        for s, h, cg in zip(self.names, hosts, cgroups):
            yml = str(self.dir / f"{s}.yaml")
            agents.append(self._start(h, cg, f"agent-{s}", PY, "-m", "multimaster.cli", "serve", "-t", yml, "--site", s,
                                      "--listen", f"{h.addr}:{AGENT_PORT}"))  # fmt: skip
            if s == "s1" or model == "multi":
                app = self._start(h, cg, f"app-{s}", PY, __file__, "--role", "appserver", "--db", str(self.dbs[s]),
                                  "--listen", f"0.0.0.0:{APP_PORT}")  # fmt: skip
                _probe(h, "127.0.0.1", APP_PORT, deadline, app)
        for h, agent in zip(hosts, agents):  # every agent answers across the network before a refresher starts
            _probe(hosts[0] if h is not hosts[0] else hosts[1], h.addr, AGENT_PORT, deadline, agent)
        for s, h, cg in zip(self.names, hosts, cgroups):
            if model == "multi" or s != "s1":  # the uni-directional master pulls nothing
                yml = str(self.dir / f"{s}.yaml")
                self._start(h, cg, f"run-{s}", PY, "-m", "multimaster.cli", "run", "-t", yml, "--site", s, "--purge-every", "off")
        # warm up: every daemon started and past its first refreshes (their start-up, mostly imports,
        # is CPU of the site's cgroup: not to be counted in the first run)
        for s in self.names:
            log = self.dir / f"run-{s}.log"
            while log.exists() and "started" not in log.read_text():
                if time.time() > deadline:
                    raise RuntimeError(f"the refresher of {s} did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        time.sleep(2 + 2 * delay)
        self.seq = {f"u{i + 1}": 0 for i in range(len(hosts))}
        self.nkeys = {f"u{i + 1}": BASE_KEYS for i in range(len(hosts))}

    def _start(self, host: Any, cg: Cgroup | None, name: str, *cmd: str) -> Any:
        log = open(self.dir / f"{name}.log", "w")
        p = host.start(*cmd, env=_cli_env(), stdout=log, stderr=subprocess.STDOUT, preexec_fn=cg.join if cg else None)
        self.procs.append(p)
        return p

    def proxy_bytes(self) -> dict[str, int]:
        tot: dict[str, int] = {"agent": 0, "app": 0}
        for s in self.names:
            try:
                d = json.loads((self.dir / f"proxy-{s}.json").read_text())
            except (OSError, ValueError):
                continue
            for name, st in d.items():
                tot[name.split("-")[0]] += st["up"] + st["down"]
        return tot

    def wire_bytes(self) -> int:
        return sum(self.lab.link_bytes(h)["tx"] for h in self.hosts)

    def settle(self, timeout: float) -> None:
        """Until every site shows every writer's last request."""
        samplers = [Sampler(self.dbs[s]) for s in self.names]
        for x in samplers:
            x.start()
        deadline = time.time() + timeout
        try:
            while time.time() < deadline:
                time.sleep(0.2)
                if all(x.top(w) >= self.seq[w] for x in samplers for w in self.seq):
                    return
        finally:
            for x in samplers:
                x.stop.set()

    def run(self, total_rate: float, updates: int, duration: float, timeout: float, inflight: int = 0) -> dict[str, Any]:
        self.settle(timeout)
        samplers = {s: Sampler(self.dbs[s]) for s in self.names}
        for x in samplers.values():
            x.start()
        cpu0 = [cg.sample() for cg in self.cgroups]
        net0, wire0 = self.proxy_bytes(), self.wire_bytes()
        users = []
        start = time.time()
        writers = list(self.seq)
        for s, h, w in zip(self.names, self.hosts, writers):
            rate = total_rate / len(writers) if total_rate else 0
            if total_rate == 0 and s != "s1":
                continue  # measuring X: one user at s1
            p = h.start(PY, __file__, "--role", "user", "--target", self.writer_target[s], "--writer", w, "--rate", str(rate),
                        "--duration", str(duration), "--updates", str(updates), "--seq0", str(self.seq[w]),
                        "--nkeys", str(self.nkeys[w]), "--inflight", str(inflight), "--timeout", str(min(timeout, 30 + 2 * self.delay)),
                        "--seed", str(self.seq[w]), stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
            users.append((w, p))
        results = {}
        for w, p in users:
            out, err = p.communicate(timeout=duration + timeout + 30)
            if p.returncode != 0:
                raise RuntimeError(f"user {w}: {err[-2000:]}")
            results[w] = json.loads(out)
            self.seq[w] = results[w]["last_seq"]
            self.nkeys[w] = results[w]["nkeys"]
        # reconciliation ends when every site shows every writer's last answered request
        last = {w: max((x[0] for x in r["writes"]), default=0) for w, r in results.items()}
        deadline = time.time() + timeout
        while time.time() < deadline and not all(x.top(w) >= last[w] for x in samplers.values() for w in results):
            time.sleep(0.05)
        end = max((x.visible_at(w, last[w]) or time.time()) for x in samplers.values() for w in results)
        reconciled = all(x.top(w) >= last[w] for x in samplers.values() for w in results)
        time.sleep(0.1)
        for x in samplers.values():
            x.stop.set()
        cpu1 = [cg.sample() for cg in self.cgroups]
        net1, wire1 = self.proxy_bytes(), self.wire_bytes()
        # per site: CPU availability and use over the run
        sites = {}
        for s, cg, a0, a1 in zip(self.names, self.cgroups, cpu0, cpu1):
            periods = (a1["t"] - a0["t"]) / cg.period
            quota = float((cg.cpu / "cpu.cfs_quota_us").read_text()) / 1e6 / cg.period
            sites[s] = {
                "available": 1 - (a1["throttled"] - a0["throttled"]) / periods,
                "busy": (a1["usage"] - a0["usage"]) / (a1["t"] - a0["t"]) / quota,
            }
        waits, own, acks, n = [], [], [], 0
        for w, res in results.items():
            home = f"s{w[1:]}"
            for seq, issued, acked, _commit, _op in res["writes"]:
                n += 1
                acks.append(acked - issued)
                for s, x in samplers.items():
                    v = x.visible_at(w, seq)
                    if v is None:
                        continue
                    waits.append(max(0.0, v - issued))
                    if s == home:
                        own.append(max(0.0, v - issued))
        last_issue = max((r["writes"][-1][1] for r in results.values() if r["writes"]), default=start)
        committed = [c for r in results.values() for _s, _i, _a, c, _o in r["writes"]]
        return {
            "requests": n,
            "sent": sum(r["sent"] for r in results.values()),
            "rate_offered": total_rate,
            "rate_committed": n / (max(committed) - start) if committed else 0.0,
            "run_time": end - start,
            "tail": end - last_issue,
            "reconciled": reconciled,
            "sites": sites,
            "bytes_replication": net1["agent"] - net0["agent"],
            "bytes_writes": net1["app"] - net0["app"],
            "bytes_wire": wire1 - wire0,
            "wait_mean": statistics.fmean(waits) if waits else None,
            "wait_p95": statistics.quantiles(waits, n=20)[-1] if len(waits) >= 20 else None,
            "wait_own": statistics.fmean(own) if own else None,
            "ack_mean": statistics.fmean(acks) if acks else None,
        }

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 15)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(5)
        for h in self.hosts:
            h.procs = [p for p in h.procs if p.poll() is None]


def measure_x(cl: Cluster, a: argparse.Namespace) -> float:
    """Requests/s one site commits at most: one user at s1 with 16 requests outstanding, the
    site's refresher and agent running (the first cluster, before its runs)."""
    r = cl.run(0, 0, a.x_seconds, 60, inflight=16)
    print(f"X: one site committed {r['rate_committed']:.0f} requests/s (CPU use {r['sites']['s1']['busy']:.0%} of its quota, "
          f"available {r['sites']['s1']['available']:.0%})", flush=True)  # fmt: skip
    return float(r["rate_committed"])


def plan(quick: bool) -> list[tuple[str, str, str, int]]:
    """(model, net, stress, updates) in run order."""
    runs = []
    lan_updates = [67] if quick else UPDATES
    for model in ("multi", "uni"):  # X is measured on the first cluster
        for st, _f in STRESS:
            for u in lan_updates:
                runs.append((model, "lan", st, u))
        wan = [("X/3", 67)] if quick else [(st, u) for st, _f in STRESS for u in (33, 67)]
        for st, u in wan:
            runs.append((model, "wan", st, u))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["appserver", "user"])
    ap.add_argument("--db")
    ap.add_argument("--listen")
    ap.add_argument("--target")
    ap.add_argument("--writer")
    ap.add_argument("--rate", type=float, default=0)
    ap.add_argument("--updates", type=float, default=0)
    ap.add_argument("--seq0", type=int, default=0)
    ap.add_argument("--nkeys", type=int, default=BASE_KEYS)
    ap.add_argument("--inflight", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--quick", action="store_true", help="4 LAN setups (67 %% updates) and 1 WAN setup per model, 3 s each")
    ap.add_argument("--duration", type=float, help="seconds of requests per run (default 10, --quick 3)")
    ap.add_argument("--quota", type=float, default=0.3, help="each site's CPU, in cores (default 0.3)")
    ap.add_argument("--interval", default="1s", help="refresh interval of every link (default 1s)")
    ap.add_argument("--wan-delay", type=float, default=5.0, help="one-way WAN delay in seconds (default 5, as the paper)")
    ap.add_argument("--x", type=float, help="skip measuring X, use this rate")
    ap.add_argument("--x-seconds", type=float, default=4.0)
    ap.add_argument("--only", choices=["lan", "wan"], help="run only the LAN or only the WAN setups")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "paper_section6.json"), help="raw results")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "paper-section6.md"))
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    os.environ.setdefault("MM_S6_TOKEN", TOKEN)
    if a.role == "appserver":
        return role_appserver(a)
    if a.role == "user":
        a.duration = a.duration or 3.0
        return role_user(a)
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from netns import Lab, unavailable

    why = unavailable()
    if why:
        sys.exit(f"paper_section6: {why}")
    try:  # the figures are drawn at the end: say so now, not after the runs
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("paper_section6: the figures need matplotlib: .venv/bin/pip install '.[bench]'")
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop: the finally clauses remove the hosts
    a.duration = a.duration or (3.0 if a.quick else 10.0)
    t_start = time.time()
    lab = Lab("mms6")
    hosts = lab.star(3)
    cgroups = [Cgroup(f"mms6{lab.run_id}s{i + 1}", a.quota) for i in range(3)]
    results: list[dict[str, Any]] = []
    try:
        x: float = a.x or 0.0
        runs = [r for r in plan(a.quick) if not a.only or r[1] == a.only]
        for (model, net), group in _groups(runs):
            delay = a.wan_delay if net == "wan" else 0.0
            print(f"== {model}-directional, {net.upper()} ({delay:g} s one way)", flush=True)
            cl = Cluster(lab, hosts, cgroups, model, delay, a)
            try:
                if not x:
                    x = measure_x(cl, a)
                for _m, _n, st, u in group:
                    factor = dict(STRESS)[st]
                    timeout = 60.0  # past it, a run is reported as not reconciled
                    r = cl.run(x * factor, u, a.duration, timeout)
                    r.update(model=model, net=net, stress=st, updates=u, x=x, delay=delay)
                    results.append(r)
                    print(_line(r), flush=True)
            finally:
                cl.close()
    finally:
        lab.close()
        for cg in cgroups:
            cg.remove()
    meta = {
        "quick": a.quick,
        "duration": a.duration,
        "quota": a.quota,
        "interval": a.interval,
        "wan_delay": a.wan_delay,
        "x": x,
        "seconds": time.time() - t_start,
    }
    Path(a.json).write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    try:
        from paper_section6_report import write_report
    except ImportError:
        return
    write_report(meta, results, Path(a.doc), Path(a.doc).parent / "img")  # the figures beside the document
    print(f"done in {meta['seconds']:.0f} s: {a.json}, {a.doc}", flush=True)


def _groups(runs: list[tuple[str, str, str, int]]) -> list[tuple[tuple[str, str], list[tuple[str, str, str, int]]]]:
    out: list[tuple[tuple[str, str], list[tuple[str, str, str, int]]]] = []
    for r in runs:
        if out and out[-1][0] == (r[0], r[1]):
            out[-1][1].append(r)
        else:
            out.append(((r[0], r[1]), [r]))
    return out


def _line(r: dict[str, Any]) -> str:
    av = " ".join(f"{s}:{v['available']:.0%}/{v['busy']:.0%}" for s, v in r["sites"].items())
    return (
        f"  {r['stress']:>3} {r['updates']:>3}% upd: {r['requests']:5d} req, run {r['run_time']:6.1f} s (tail {r['tail']:5.1f}), "
        f"avail/busy {av}, net {r['bytes_replication'] / 1e3:7.0f} kB repl + {r['bytes_writes'] / 1e3:5.0f} kB writes "
        f"(wire {r['bytes_wire'] / 1e3:7.0f} kB), wait {r['wait_mean'] or 0:6.2f} s (own {r['wait_own'] or 0:5.2f})"
        + ("" if r["reconciled"] else "  NOT RECONCILED")
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
