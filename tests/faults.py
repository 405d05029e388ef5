"""Fault injection (issue #13): applications writing at every site while refreshers and daemons are
SIGKILLed at random moments, a site going down and coming back, a site removed for good, a clock
running ahead, a hand-corrupted change-log row. Every scenario ends with the sites compared with a
reference model of what the applications' transactions committed.

The pieces, reused by tests/test_faults.py (short mode, CI) and benchmarks/faults.py (long mode):

- :class:`Model`: every committed transaction, as its writer recorded it after COMMIT returned.
  The workload's final state does not depend on the order changes arrive in, so the model is a
  fold over the committed transactions: a row (its `name` is a unique payload) is present iff
  its insert committed and no delete of it committed (delete wins); `qty` is additive (its inserted
  value plus every committed addition, from any site); `label` is written only by the writer that
  inserted the row (its insert, then its own updates), so its last committed label is the final one.
- :class:`Writers`: plain client threads (sqlite3, psycopg, PyMySQL: never multimaster) running
  random transactions of one to three statements (insert; add to any visible row; relabel an own
  row; delete any visible row), rolling back a few on purpose and retrying what the database
  rejected for a transient reason (SQLite busy, MariaDB deadlock victims).
- :class:`Killer`: keeps one `multimaster run --site S` or `multimaster refresh --site S
  --until-quiet` subprocess per live site and SIGKILLs it at a random moment, then starts another.
- :func:`compare`: each site's rows against the model: rows missing or quantities short (lost),
  rows twice, rows back from the dead or quantities too high (duplicated).
- :func:`scenario`: builds the cluster and starts its applications and killer together, stopping
  them if the scenario's body fails; :meth:`Scenario.finish` converges and compares.
- scenario functions (:func:`kills`, :func:`down_and_back`, :func:`remove_dead_site`,
  :func:`clock_ahead`), each returning a :class:`Result`.

A scenario's randomness comes from one seed: ``MM_FAULT_SEED=<n>`` replays it (the seed is printed
and named in every failure). Threads and processes still interleave differently from run to run,
so a replay repeats the choices (statements, kill delays), not the exact timing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from clusters import Backend, TestCluster, make_cluster

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.engine.site import Site

ROOT = Path(__file__).resolve().parent.parent
SEED_ENV = "MM_FAULT_SEED"

TABLE = {
    "items": {
        "key": "id",
        "columns": {"name": "text", "qty": "int", "label": "text"},
        "config": {"columns": {"qty": "additive"}},
    }
}
CORRUPT_VER = "hand-made-entry-not-a-version"


def seed_from_env(default: int | None = None) -> int:
    """The scenario's seed: MM_FAULT_SEED if set, else `default`, else a fresh random one."""
    v = os.environ.get(SEED_ENV)
    if v:
        return int(v)
    return default if default is not None else random.SystemRandom().randrange(1, 1 << 31)


def say(msg: str) -> None:
    print(msg, flush=True)


# ---- the reference model ------------------------------------------------------------------------


@dataclass
class Txn:
    """One committed application transaction: what it did, as its writer saw it succeed."""

    site: str
    writer: int
    n: int
    inserts: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (qty, label)
    adds: dict[str, int] = field(default_factory=dict)  # name -> total added
    labels: dict[str, str] = field(default_factory=dict)  # own rows relabelled (the last label)
    deletes: set[str] = field(default_factory=set)
    changes: int = 0  # row changes captured (one change-log entry each)
    at: float = 0.0  # time.monotonic() after COMMIT returned


class Model:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.txns: list[Txn] = []

    def commit(self, t: Txn) -> None:
        t.at = time.monotonic()
        with self.lock:
            self.txns.append(t)

    def changes(self, keep: Callable[[Txn], bool] = lambda t: True) -> int:
        with self.lock:
            return sum(t.changes for t in self.txns if keep(t))

    def inserted(self) -> set[str]:
        with self.lock:
            return {n for t in self.txns for n in t.inserts}

    def expected(self, keep: Callable[[Txn], bool] = lambda t: True) -> dict[str, tuple[int, str]]:
        """name -> (qty, label) of every row the committed transactions (those `keep` accepts)
        leave: order-independent by construction (additive qty, delete wins, one labeller per row)."""
        ins: dict[str, tuple[int, str]] = {}
        add: dict[str, int] = {}
        lab: dict[str, str] = {}
        dead: set[str] = set()
        with self.lock:
            txns = [t for t in self.txns if keep(t)]
        for t in txns:  # appended in commit order per writer: a writer's later label wins
            ins.update(t.inserts)
            for k, v in t.adds.items():
                add[k] = add.get(k, 0) + v
            lab.update(t.labels)
            dead |= t.deletes
        return {n: (q + add.get(n, 0), lab.get(n, lb)) for n, (q, lb) in ins.items() if n not in dead}


# ---- the applications ---------------------------------------------------------------------------

TRANSIENT = ("database is locked", "database table is locked", "busy", "eadlock", "lock wait timeout")


class Writers:
    """`per_site` plain-client writer threads at each site, until stop(). A site's writers can be
    paused (the application is down with its site: they close their connections) and resumed,
    or retired for good."""

    def __init__(self, cl: TestCluster, model: Model, seed: int, per_site: int = 2, pace: float = 0.05) -> None:
        self.cl, self.model, self.seed, self.per_site, self.pace = cl, model, seed, per_site, pace
        self.state: dict[str, str] = {s: "run" for s in cl.urls}
        self.stop_ev = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.retries = 0
        self.rolled_back = 0
        self.lock = threading.Lock()
        self.avoid: set[str] = set()  # rows no writer may touch (a scenario's own)
        self._idle: dict[tuple[str, int], bool] = {}

    def start(self) -> None:
        rnd = random.Random(self.seed)
        for s in self.cl.urls:
            for w in range(self.per_site):
                t = threading.Thread(target=self._run, args=(s, w, rnd.randrange(1 << 30)), daemon=True)
                t.start()
                self.threads.append(t)

    def stop(self) -> None:
        self.stop_ev.set()
        for t in self.threads:
            t.join(60)

    def pause(self, site: str) -> None:
        """Return once every writer of `site` is idle with its connection closed."""
        self.state[site] = "pause"
        self._wait_idle(site)

    def resume(self, site: str) -> None:
        self.state[site] = "run"

    def retire(self, site: str) -> None:
        self.state[site] = "gone"
        self._wait_idle(site)

    def _wait_idle(self, site: str) -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if all(self._idle.get((site, w)) for w in range(self.per_site)):
                return
            time.sleep(0.02)
        raise AssertionError(f"the writers of {site} did not stop")

    def _run(self, site: str, w: int, seed: int) -> None:
        r = random.Random(seed)
        p = self.cl.backend.param()
        conn: Any = None
        visible: list[str] = []
        own: list[str] = []
        n = 0
        try:
            while not self.stop_ev.is_set():
                if self.state[site] != "run":
                    if conn is not None:
                        conn.close()
                        conn = None
                    self._idle[(site, w)] = True
                    if self.state[site] == "gone":
                        return
                    time.sleep(0.02)
                    continue
                self._idle[(site, w)] = False
                if conn is None:
                    conn = self.cl.db(site)
                cur = conn.cursor()
                n += 1
                try:
                    if n % 6 == 1 or not visible:
                        cur.execute("SELECT name FROM items")
                        visible = sorted(x[0] for x in cur.fetchall() if not x[0].startswith("victim"))
                        conn.rollback()
                    t = Txn(site, w, n)
                    self._transaction(r, cur, p, t, visible, own)
                    if r.random() < 0.05:
                        conn.rollback()
                        with self.lock:
                            self.rolled_back += 1
                    else:
                        conn.commit()
                        self.model.commit(t)
                        own += list(t.inserts)
                        if t.deletes:
                            own = [x for x in own if x not in t.deletes]
                except Exception as e:  # noqa: BLE001 - classified below
                    try:
                        conn.rollback()
                    except Exception:  # noqa: BLE001
                        conn = None
                    msg = str(e).lower()
                    if any(x in msg for x in TRANSIENT) and not (self.cl.backend.name == "postgresql" and "eadlock" in msg):
                        with self.lock:
                            self.retries += 1
                    else:
                        with self.lock:
                            self.errors.append(f"{site}/{w}: {type(e).__name__}: {e}")
                        if conn is not None:
                            conn.close()
                        conn = None
                time.sleep(r.random() * self.pace)
        finally:
            if conn is not None:
                conn.close()
            self._idle[(site, w)] = True

    def _transaction(self, r: random.Random, cur: Any, p: str, t: Txn, visible: list[str], own: list[str]) -> None:
        # inserts first, then updates and deletes in name order: the applications lock rows in one order
        plan: list[tuple[int, str]] = []
        for _ in range(r.randint(1, 3)):
            x = r.random()
            if x < 0.45 or not visible:
                plan.append((0, f"{self.seed}-{t.site}-{t.writer}-{t.n}-{len(plan)}"))
            elif x < 0.80:
                plan.append((1, r.choice(visible)))
            elif x < 0.93 and own:
                plan.append((2, r.choice(own)))
            else:
                plan.append((3, r.choice(visible)))
        plan.sort(key=lambda k: (k[0] != 0, k[1]))
        for kind, name in plan:
            if name in self.avoid or name in t.deletes:
                continue
            if kind == 0:
                q, lb = r.randint(0, 50), f"l{t.n}"
                cur.execute(f"INSERT INTO items (name, qty, label) VALUES ({p}, {p}, {p})", (name, q, lb))
                t.inserts[name] = (q, lb)
                t.changes += 1
            elif kind == 1:
                d = r.randint(1, 9)
                cur.execute(f"UPDATE items SET qty = qty + {p} WHERE name = {p}", (d, name))
                if cur.rowcount:
                    t.adds[name] = t.adds.get(name, 0) + d
                    t.changes += cur.rowcount
            elif kind == 2:
                lb = f"{t.site}-{t.writer}-{t.n}"
                cur.execute(f"UPDATE items SET label = {p} WHERE name = {p}", (lb, name))
                if cur.rowcount and t.labels.get(name) != lb:
                    # (the same row relabelled twice in one transaction: the second UPDATE changes
                    # nothing, and capture records no entry for an update that changes nothing)
                    t.labels[name] = lb
                    t.changes += cur.rowcount
            else:
                cur.execute(f"DELETE FROM items WHERE name = {p}", (name,))
                if cur.rowcount:
                    t.deletes.add(name)
                    t.changes += cur.rowcount
            time.sleep(r.random() * 0.003)  # application work inside the transaction


# ---- refreshers and daemons, killed -------------------------------------------------------------


@dataclass
class Proc:
    p: subprocess.Popen[bytes]
    kind: str
    log: Path
    t0: float
    delay: float  # killed this long after it is ready
    ready: float | None = None


class Killer:
    """One refresher process per live site, SIGKILLed `life` seconds (uniform) after its start-up,
    then replaced. `mode`: 'run' (the daemon), 'refresh' (`refresh --until-quiet`) or 'mixed'."""

    def __init__(
        self,
        topo: Path,
        sites: list[str],
        logdir: Path,
        seed: int,
        mode: str = "mixed",
        life: tuple[float, float] = (0.05, 2.0),
        purge: bool = True,
    ) -> None:
        self.topo, self.sites, self.logdir, self.mode, self.life, self.purge = topo, list(sites), logdir, mode, life, purge
        self.rnd = random.Random(seed)
        self.kills = 0
        self.exits: list[tuple[str, str, int]] = []  # (site, kind, return code) of processes that ended by themselves
        self.started = 0
        self.last_kill = 0.0
        self.procs: dict[str, Proc] = {}
        self.kills_in_work = 0  # kills of a process past its start-up
        self.startups: list[float] = []
        self.logs: list[Path] = []
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.killing = True
        self.thread: threading.Thread | None = None
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        self.env["PYTHONUNBUFFERED"] = "1"

    def _start(self, site: str) -> None:
        kind = self.mode if self.mode != "mixed" else self.rnd.choice(["run", "refresh"])
        log = self.logdir / f"{kind}-{site}-{self.started}.log"
        self.logs.append(log)
        cmd = [sys.executable, "-m", "multimaster.cli"]
        if kind == "run":
            cmd += ["run", "-t", str(self.topo), "--site", site, "--max-backoff", "1s", "--log-format", "json"]
            cmd += ["--purge-every", "1s", "--min-age", "2s"] if self.purge else ["--purge-every", "off"]
        else:
            cmd += ["refresh", "-t", str(self.topo), "--site", site, "--until-quiet", "--max-rounds", "100"]
        with open(log, "wb") as fh:
            p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env, cwd=str(self.logdir))
        self.started += 1
        self.procs[site] = Proc(p, kind, log, time.monotonic(), self.rnd.uniform(*self.life))

    def _ready(self, pr: "Proc", now: float) -> bool:
        """Whether the process is past its start-up (importing, connecting): a daemon once it
        logged `started` (its first refreshes begin at once); a refresh after the start-up time
        daemons took so far. Kills are timed from then, so they land in the work."""
        if pr.ready is None:
            if pr.kind == "run":
                if pr.log.stat().st_size > 0 and b'"started"' in pr.log.read_bytes()[:4096]:
                    pr.ready = now
                    self.startups.append(now - pr.t0)
            elif now - pr.t0 >= (sum(self.startups[-8:]) / len(self.startups[-8:]) if self.startups else 1.5):
                pr.ready = now
        return pr.ready is not None

    def _kill(self, pr: "Proc") -> None:
        if pr.p.poll() is None:
            pr.p.send_signal(signal.SIGKILL)
            pr.p.wait()
            self.kills += 1
            self.last_kill = time.monotonic()
            if pr.ready is not None:
                self.kills_in_work += 1

    def _loop(self) -> None:
        while not self.stop_ev.is_set():
            with self.lock:
                now = time.monotonic()
                for site in self.sites:
                    pr = self.procs.get(site)
                    if pr is None:
                        self._start(site)
                        continue
                    if pr.p.poll() is not None:
                        self.exits.append((site, pr.kind, pr.p.returncode))
                        del self.procs[site]
                    elif self.killing and self._ready(pr, now) and now >= (pr.ready or now) + pr.delay:
                        self._kill(pr)
                        del self.procs[site]
                    elif now - pr.t0 > 60:  # never got going: kill it all the same
                        self._kill(pr)
                        del self.procs[site]
            time.sleep(0.02)

    def start(self) -> "Killer":
        self.stop_ev.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop and SIGKILL whatever still runs (counted as kills)."""
        self.stop_ev.set()
        if self.thread is not None:
            self.thread.join(30)
        with self.lock:
            for pr in list(self.procs.values()):
                self._kill(pr)
            self.procs.clear()

    def set_sites(self, sites: list[str]) -> None:
        """Only these sites' refreshers from now on (the others' are killed)."""
        with self.lock:
            for s in list(self.procs):
                if s not in sites:
                    self._kill(self.procs.pop(s))
            self.sites = list(sites)

    def wait_kills(self, n: int, deadline: float = 300.0) -> None:
        end = time.monotonic() + deadline
        while self.kills < n:
            if time.monotonic() > end:
                raise AssertionError(f"only {self.kills} of {n} kills in {deadline:.0f}s")
            time.sleep(0.05)

    def crashes(self) -> list[str]:
        """Processes that died of something else than our SIGKILL: a traceback in their output."""
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace") if log.exists() else ""
            if "Traceback" in text:
                out.append(f"{log.name}: {text[-1500:]}")
        return out


# ---- checks -------------------------------------------------------------------------------------


@dataclass
class Comparison:
    lost: int = 0
    duplicated: int = 0
    diffs: list[str] = field(default_factory=list)


def site_rows(cl: TestCluster, site: str) -> list[tuple[Any, ...]]:
    """(name, qty, label) of every row at `site`."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute("SELECT name, qty, label FROM items")
        return [tuple(r) for r in cur.fetchall()]
    finally:
        c.close()


def compare(
    cl: TestCluster, sites: list[str], want: dict[str, dict[str, tuple[int, str]]], inserted: set[str] | None = None
) -> Comparison:
    """Each site's rows against the model (`want`: site -> expected rows; `inserted`: every name
    whose insert committed). Lost: a row missing, a quantity short, a label not the last committed
    one, a row whose delete committed still there. Duplicated: a row twice, a row no committed
    transaction inserted, a quantity too high."""
    out = Comparison()
    for s in sites:
        exp = want[s]
        seen: dict[str, tuple[int, str]] = {}
        for name, qty, label in site_rows(cl, s):
            if name in seen:
                out.duplicated += 1
                out.diffs.append(f"{s}: {name} twice")
            seen[name] = (qty, label)
        for name, (q, lb) in exp.items():
            if name not in seen:
                out.lost += 1
                out.diffs.append(f"{s}: {name} missing")
                continue
            gq, glb = seen[name]
            if gq < q:
                out.lost += 1
                out.diffs.append(f"{s}: {name} qty {gq} < {q}")
            elif gq > q:
                out.duplicated += 1
                out.diffs.append(f"{s}: {name} qty {gq} > {q}")
            if glb != lb:
                out.lost += 1
                out.diffs.append(f"{s}: {name} label {glb!r} != {lb!r}")
        for name in seen.keys() - exp.keys():
            if inserted is not None and name in inserted:
                out.lost += 1
                out.diffs.append(f"{s}: {name} present, its delete lost")
            else:
                out.duplicated += 1
                out.diffs.append(f"{s}: {name} present, never inserted by a committed transaction")
    return out


def keyed_rows(cl: TestCluster, site: str) -> list[tuple[Any, ...]]:
    """(key, name) of every row, by key: the same at every site once converged."""
    return [(r[0], r[1]) for r in cl.rows(site, "items")]


def converge(cl: TestCluster, rounds: int = 60) -> float:
    """Refresh every link until a whole round pulls nothing; the seconds it took. A link error
    fails."""
    t0 = time.monotonic()
    with api.Cluster(cl.topo) as c:
        for _ in range(rounds):
            res = api.refresh(c)
            if os.environ.get("MM_FAULT_EXPLAIN"):
                say(
                    f"[faults] converge round at {time.monotonic() - t0:.2f}s: {[(r.peer, r.site, r.pulled, round(r.seconds, 2)) for r in res]}"
                )
            errors = [f"{r.peer}->{r.site}: {r.error}" for r in res if r.error]
            assert not errors, errors
            if all(r.pulled == 0 for r in res):
                return time.monotonic() - t0
    raise AssertionError(f"the cluster did not go quiet in {rounds} rounds")


@dataclass
class Result:
    backend: str
    scenario: str
    seed: int
    sites: int = 0
    kills: int = 0
    exits: int = 0
    txns: int = 0
    changes: int = 0
    lost: int = 0
    duplicated: int = 0
    converge_s: float = 0.0
    seconds: float = 0.0
    retries: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    diffs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # writer errors, crashes, unexpected held changes

    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and not self.diffs and not self.problems

    def summary(self) -> str:
        return (
            f"{self.backend} {self.scenario} seed={self.seed}: {self.kills} kills, {self.exits} exits, {self.txns} txns, {self.changes} changes, "
            f"lost {self.lost}, duplicated {self.duplicated}, converged {self.converge_s:.2f}s after the last kill"
            + (f"; {self.notes}" if self.notes else "")
        )

    def failure(self) -> str:
        return (
            f"{self.summary()}\nreplay: {SEED_ENV}={self.seed}\n"
            + "\n".join(self.problems[:10])
            + ("\n" if self.problems else "")
            + "\n".join(self.diffs[:20])
        )


# ---- building blocks of scenarios ---------------------------------------------------------------


def cluster(backend: Backend, tmp: Path, n_sites: int, extra: dict[str, Any] | None = None) -> TestCluster:
    sites = [f"s{i}" for i in range(1, n_sites + 1)]
    settings: dict[str, Any] = {"refresh": {"interval": "200ms", "jitter": "50ms", "batch_size": 25}}
    for k, v in (extra or {}).items():
        settings[k] = {**settings.get(k, {}), **v}
    cl = make_cluster(backend, tmp, sites, TABLE, settings=settings)
    if backend.name == "mysql":
        _own_logins(cl)
    idx = "CREATE INDEX items_name ON items (name(64))" if backend.name == "mysql" else "CREATE INDEX items_name ON items (name)"
    for s in sites:  # the applications update and delete by name: index it, as an application would
        cl.execute(s, idx)
    return cl


def _login(cl: TestCluster, site: str) -> str:
    return f"{cl.urls[site].rsplit('/', 1)[1].split('?')[0]}_login"


def _own_logins(cl: TestCluster) -> None:
    """MariaDB: each site's database is reached by a login of its own (the test's admin connection
    stays root), so that :func:`site_down` can lock exactly that site out, as PostgreSQL's
    ALLOW_CONNECTIONS does. The topology file is rewritten with them."""
    from sqlalchemy.engine import make_url

    b: Any = cl.backend
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    for s, url in list(cl.urls.items()):
        login = _login(cl, s)
        b._admin(f"CREATE USER IF NOT EXISTS '{login}'@'%'")
        b._admin(f"GRANT ALL PRIVILEGES ON *.* TO '{login}'@'%'")
        b.users.append(login)
        cl.urls[s] = make_url(url).set(username=login).render_as_string(hide_password=False)
        doc["sites"][s]["url"] = cl.urls[s]
    Path(cl.topo.path).write_text(yaml.safe_dump(doc, sort_keys=False))
    cl.topo = load_topology(cl.topo.path)


def _held(cl: TestCluster) -> list[dict[str, Any]]:
    return api.list_errors(cl.topo)


def finish(
    res: Result,
    cl: TestCluster,
    model: Model,
    writers: Writers,
    killer: Killer,
    sites: list[str],
    want: Callable[[], dict[str, dict[str, tuple[int, str]]]] | None = None,
    held_ok: Callable[[dict[str, Any]], bool] = lambda h: False,
    same_keys: bool = True,
) -> Result:
    """Stop the applications and the refreshers, refresh until quiet, compare with the model."""
    writers.stop()
    killer.stop()
    t = time.monotonic()
    converge(cl)
    res.converge_s = time.monotonic() - (killer.last_kill or t)
    exp = model.expected()
    cmp = compare(cl, sites, want() if want else {s: exp for s in sites}, model.inserted())
    res.lost, res.duplicated, res.diffs = cmp.lost, cmp.duplicated, cmp.diffs
    res.kills, res.exits = killer.kills, len(killer.exits)
    res.notes.setdefault("kills_in_work", killer.kills_in_work)
    res.txns, res.changes = len(model.txns), model.changes()
    res.retries = writers.retries
    res.problems += writers.errors + killer.crashes()
    res.problems += [f"held at {h['site']}: {h['state']} {h['op']} {h['error']}" for h in _held(cl) if not held_ok(h)]
    if res.diffs and os.environ.get("MM_FAULT_EXPLAIN"):
        names = sorted({d.split(": ")[1].split(" ")[0] for d in res.diffs})[:6]
        res.problems += explain(cl, model, names)
    if same_keys and not res.diffs:
        ref = keyed_rows(cl, sites[0])
        for s in sites[1:]:
            if keyed_rows(cl, s) != ref:
                res.diffs.append(f"keys differ between {sites[0]} and {s}")
    return res


def _run_until(killer: Killer, kills: int, seconds: float) -> None:
    """Let the writers write and the killer kill until `kills` more kills and `seconds` passed."""
    end = time.monotonic() + seconds
    killer.wait_kills(killer.kills + kills)
    while time.monotonic() < end:
        time.sleep(0.05)


@dataclass
class Scenario:
    """One running scenario: its cluster, the applications writing at every site and the killer of
    refreshers, started together by :func:`scenario`."""

    res: Result
    cl: TestCluster
    sites: list[str]
    model: Model
    writers: Writers
    killer: Killer
    t0: float

    def finish(
        self,
        sites: list[str] | None = None,
        want: Callable[[], dict[str, dict[str, tuple[int, str]]]] | None = None,
        held_ok: Callable[[dict[str, Any]], bool] = lambda h: False,
    ) -> Result:
        """Stop everything, converge, compare with the model (:func:`finish`), time the run."""
        res = finish(self.res, self.cl, self.model, self.writers, self.killer, sites or self.sites, want, held_ok)
        res.seconds = time.monotonic() - self.t0
        return res


@contextmanager
def scenario(
    backend: Backend,
    tmp: Path,
    seed: int,
    name: str,
    *,
    n_sites: int = 3,
    extra: dict[str, Any] | None = None,
    per_site: int = 2,
    avoid: tuple[str, ...] = (),
    **killer_kw: Any,
) -> Iterator[Scenario]:
    """Build an `n_sites` cluster, start its applications (`per_site` writers each, never touching
    the names in `avoid`) and a killer of its refreshers (`killer_kw`: :class:`Killer`'s options),
    and yield them. The body drives the scenario; if it raises, applications and killer stop before
    the error goes on (a passing body ends with :meth:`Scenario.finish`, which stops them)."""
    t0 = time.monotonic()
    res = Result(backend.name, name, seed, sites=n_sites)
    say(f"[faults] {name} on {backend.name}: {SEED_ENV}={seed}")
    cl = cluster(backend, tmp, n_sites, extra)
    sites = list(cl.urls)
    model = Model()
    writers = Writers(cl, model, seed, per_site)
    writers.avoid.update(avoid)
    killer = Killer(cl.topo.path, sites, tmp, seed + 1, **killer_kw)
    writers.start()
    killer.start()
    try:
        yield Scenario(res, cl, sites, model, writers, killer, t0)
    except BaseException:
        writers.stop()
        killer.stop()
        raise


# ---- scenarios ----------------------------------------------------------------------------------


def kills(
    backend: Backend,
    tmp: Path,
    seed: int,
    *,
    n_sites: int = 3,
    n_kills: int = 12,
    per_site: int = 2,
    mode: str = "mixed",
    life: tuple[float, float] = (0.05, 2.0),
    min_seconds: float = 0.0,
    corrupt: bool = False,
) -> Result:
    """Writers at every site; every site's refresher or daemon SIGKILLed at random `n_kills` times
    in all. With `corrupt`, one update at s1 has its change-log entry corrupted by hand in the
    transaction that made it: every other site must hold it in its error queue (malformed) and
    agree on everything else."""
    victim = f"victim-{seed}"
    name = "kills" + ("+corrupt" if corrupt else "")
    with scenario(backend, tmp, seed, name, n_sites=n_sites, per_site=per_site, avoid=(victim,), mode=mode, life=life) as sc:
        _run_until(sc.killer, n_kills // 2, min_seconds / 2)
        if corrupt:
            corrupt_update(sc.cl, "s1", victim, sc.model, sc.killer)
        _run_until(sc.killer, n_kills - n_kills // 2, min_seconds / 2)
    cl, sites, model = sc.cl, sc.sites, sc.model
    want = None
    held_ok: Callable[[dict[str, Any]], bool] = lambda h: False  # noqa: E731
    if corrupt:

        def want() -> dict[str, dict[str, tuple[int, str]]]:
            exp = model.expected()
            out = {s: dict(exp) for s in sites}
            for s in sites[1:]:
                out[s][victim] = (1, "before")  # the corrupt update never applies there
            return out

        held_ok = lambda h: h["site"] != "s1" and h["state"] == "failed" and CORRUPT_VER in str(h["error"])  # noqa: E731
    res = sc.finish(want=want, held_ok=held_ok)
    if corrupt:
        held = _held(cl)
        per_site = {s: [h for h in held if h["site"] == s] for s in sites}
        res.notes["held"] = {s: len(v) for s, v in per_site.items()}
        for s in sites[1:]:
            if len(per_site[s]) != 1:
                res.problems.append(f"{s} holds {len(per_site[s])} changes, expected the one corrupt entry: {per_site[s]}")
        if per_site["s1"]:
            res.problems.append(f"s1 holds changes: {per_site['s1']}")
    return res


def corrupt_update(cl: TestCluster, site: str, victim: str, model: Model, killer: Killer | None = None) -> None:
    """Insert `victim` at `site` (a normal, replicated change), then, in one transaction, update
    it and corrupt that update's change-log entry by hand (its version is none): no peer can ever
    read the entry uncorrupted."""
    p = cl.backend.param()
    t = Txn(site, -1, 0, inserts={victim: (1, "before")}, changes=1)
    _retrying(lambda: cl.execute(site, "INSERT INTO items (name, qty, label) VALUES (?, 1, 'before')", (victim,)))
    model.commit(t)
    # the insert reaches every other site first: a malformed entry holds every change of its row
    # a peer has not applied yet (its version, hence its place among them, is unknown). The
    # killer holds its fire meanwhile: under a heavy load, refreshers killed every second or two
    # may take long to work through the backlog in front of it
    if killer is not None:
        killer.killing = False
    end = time.monotonic() + 120
    while any(victim not in {r[0] for r in site_rows(cl, s)} for s in cl.urls if s != site):
        assert time.monotonic() < end, f"{victim} did not reach the other sites"
        time.sleep(0.1)
    if killer is not None:
        killer.killing = True
    log = Site(site, cl.urls[site]).dialect.obj("items").log

    def update_and_corrupt() -> None:
        c = cl.db(site)
        try:
            cur = c.cursor()
            cur.execute(f"UPDATE items SET label = 'after' WHERE name = {p}", (victim,))
            cur.execute(f"UPDATE {log} SET ver = '{CORRUPT_VER}' WHERE op = 'U' AND n_label = 'after'")
            assert cur.rowcount == 1, cur.rowcount
            c.commit()
        finally:
            c.close()

    _retrying(update_and_corrupt)
    # the origin holds the update; the model of the origin's rows says so
    model.commit(Txn(site, -1, 1, labels={victim: "after"}, changes=1))


def _retrying(fn: Callable[[], None], attempts: int = 20) -> None:
    """Run one application transaction, again when the database picked it as a deadlock victim
    or found it busy (it rolled back)."""
    for i in range(attempts):
        try:
            fn()
            return
        except Exception as e:  # noqa: BLE001 - transient ones retried
            if i == attempts - 1 or not any(x in str(e).lower() for x in TRANSIENT):
                raise
            time.sleep(0.05)


def site_down(cl: TestCluster, site: str, away: Path) -> None:
    """The site's database stops answering (SQLite: its files moved away; PostgreSQL: the database
    refuses connections and every session of it is terminated)."""
    if cl.backend.name == "sqlite":
        away.mkdir(exist_ok=True)
        path = Path(cl.urls[site].removeprefix("sqlite:///"))
        for f in path.parent.glob(path.name + "*"):
            f.rename(away / f.name)
    elif cl.backend.name == "postgresql":
        db = cl.urls[site].rsplit("/", 1)[1].split("?")[0]
        cl.backend._admin(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false")  # type: ignore[attr-defined]
        cl.backend._admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")  # type: ignore[attr-defined]
    elif cl.backend.name == "mysql":  # its login locked, every session of it killed (_own_logins)
        import pymysql

        login = _login(cl, site)
        cl.backend._admin(f"ALTER USER '{login}'@'%' ACCOUNT LOCK")  # type: ignore[attr-defined]
        c = pymysql.connect(**cl.backend._kw(None), autocommit=True)  # type: ignore[attr-defined]
        try:
            cur = c.cursor()
            cur.execute("SELECT id FROM information_schema.PROCESSLIST WHERE user = %s", (login,))
            for (pid,) in cur.fetchall():
                try:
                    cur.execute(f"KILL CONNECTION {int(pid)}")
                except pymysql.err.OperationalError:  # it ended meanwhile
                    pass
        finally:
            c.close()
    else:
        raise NotImplementedError(f"site_down on {cl.backend.name}")


def site_up(cl: TestCluster, site: str, away: Path) -> None:
    if cl.backend.name == "sqlite":
        path = Path(cl.urls[site].removeprefix("sqlite:///"))
        for f in away.glob(path.name + "*"):
            f.rename(path.parent / f.name)
    elif cl.backend.name == "postgresql":
        db = cl.urls[site].rsplit("/", 1)[1].split("?")[0]
        cl.backend._admin(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")  # type: ignore[attr-defined]
    elif cl.backend.name == "mysql":
        cl.backend._admin(f"ALTER USER '{_login(cl, site)}'@'%' ACCOUNT UNLOCK")  # type: ignore[attr-defined]
    else:
        raise NotImplementedError(f"site_up on {cl.backend.name}")


def down_and_back(backend: Backend, tmp: Path, seed: int, *, n_kills: int = 6, down_s: float = 3.0) -> Result:
    """Three sites; s3 goes down (its applications with it) while the others write and their
    refreshers are killed; it comes back, writes again; all converge to the model."""
    away = tmp / "away"
    with scenario(backend, tmp, seed, "down-and-back") as sc:
        killer = sc.killer
        _run_until(killer, n_kills // 3, 0)
        sc.writers.pause("s3")
        killer.set_sites(["s1", "s2"])
        killer.stop()  # every process that may hold a connection to s3 goes
        site_down(sc.cl, "s3", away)
        killer.start()
        _run_until(killer, n_kills // 3, down_s)
        killer.stop()
        site_up(sc.cl, "s3", away)
        killer.set_sites(sc.sites)
        killer.start()
        sc.writers.resume("s3")
        _run_until(killer, n_kills - 2 * (n_kills // 3), 0)
    return sc.finish()


def remove_dead_site(backend: Backend, tmp: Path, seed: int, *, n_kills: int = 6) -> Result:
    """Three sites. Every refresher stops and s1 and s2 pull all of s3's changes; s3's applications
    then commit more, which nobody pulls, and s3 dies for good (its files move away). With s1 and
    s2 writing and their refreshers killed, `remove-site s3 --force` retires it: it reports s3 as
    not reached (the only thing it cannot clean), the changes s3 made after its peers last
    pulled are lost — exactly them, counted in its change log — and s1 and s2 converge to the
    model of every other committed transaction."""
    away = tmp / "away"
    with scenario(backend, tmp, seed, "remove-site") as sc:
        cl, writers, killer, res = sc.cl, sc.writers, sc.killer, sc.res
        _run_until(killer, n_kills // 2, 0)
        writers.pause("s3")
        killer.stop()
        _drain_origin(cl, ["s1", "s2"], "s3")  # s1 and s2 pull and apply everything s3 made
        last_pull = time.monotonic()
        writers.resume("s3")
        time.sleep(1.0)  # s3 writes on, nobody pulls it
        writers.retire("s3")
        before = {s: _origin_max(cl, s, "s3") for s in ("s1", "s2")}
        site_down(cl, "s3", away)
        killer.set_sites(["s1", "s2"])
        killer.start()
        _run_until(killer, n_kills - n_kills // 2, 0)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-m", "multimaster.cli", "remove-site", "-t", str(cl.topo.path), "s3", "--force", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if out.returncode != 0:
            res.problems.append(f"remove-site exited {out.returncode}: {out.stderr[-2000:]}")
        else:
            rep = json.loads(out.stdout)
            res.notes["remove_site"] = {"unreachable": rep["unreachable"], "cleaned": sorted(rep["cleaned"])}
            if rep["unreachable"] != ["s3"] or sorted(rep["cleaned"]) != ["s1", "s2"]:
                res.problems.append(f"remove-site reported {rep}")
        # the file without s3: restart the refreshers on it
        killer.stop()
        doc = yaml.safe_load(Path(cl.topo.path).read_text())
        del doc["sites"]["s3"]
        Path(cl.topo.path).write_text(yaml.safe_dump(doc, sort_keys=False))
        cl.topo = load_topology(cl.topo.path)
        s3_url = cl.urls.pop("s3")
        killer.start()
        _run_until(killer, 2, 0)
    model = sc.model
    lost_txn = lambda t: t.site == "s3" and t.at > last_pull  # noqa: E731

    def want() -> dict[str, dict[str, tuple[int, str]]]:
        exp = model.expected(lambda t: not lost_txn(t))
        return {"s1": exp, "s2": exp}

    res = sc.finish(["s1", "s2"], want)
    # what was lost is exactly what s3 committed after its peers last pulled it
    lost_changes = model.changes(lost_txn)
    in_log = _entries_after(cl, away, "s3", s3_url, before)
    res.notes["lost_with_s3"] = lost_changes
    if before["s1"] != before["s2"] or in_log != lost_changes or not lost_changes:
        res.problems.append(
            f"s3's unpulled changes: {in_log} in its log, {lost_changes} committed after the last pull ({before})"
        )
    return res


def _drain_origin(cl: TestCluster, sites: list[str], origin: str, rounds: int = 200) -> None:
    """Refresh every one of `sites` from `origin` until a round where none pulled anything, none
    failed and nothing of `origin` waits at any of them (a change pulled but held for its row or
    an earlier change is not applied yet: `_mm_origins` would not count it). Each round also
    refreshes them from one another: a change of `origin` to a row another of them inserted
    waits for that row, which `origin` does not relay (their own writes go on meanwhile, so what
    those links pull does not count)."""
    last: list[str] = []
    with api.Cluster(cl.topo) as c:
        for _ in range(rounds):
            for s in sites:
                for p in sites:
                    if p != s:
                        api.refresh(c, s, p)
            res = [r for s in sites for r in api.refresh(c, s, origin)]  # every site, every round
            last = [f"{r.site}<-{r.peer}: {r.error}" for r in res if r.error] + [
                f"{r.site}<-{r.peer}: {r.waiting} waiting ({r.waits_for})" for r in res if r.waiting
            ]
            if not last and not any(r.pulled for r in res):
                return
            time.sleep(0.05 if last else 0)
    raise AssertionError(f"{', '.join(sites)} never caught up with {origin}: {'; '.join(last)}")


def _origin_max(cl: TestCluster, site: str, origin: str) -> str:
    c = cl.db(site)
    try:
        cur = c.cursor()
        d = Site(site, cl.urls[site]).dialect
        cur.execute(f"SELECT max_ver FROM {d.mm_table('_mm_origins')} WHERE tbl = 'items' AND origin = '{origin}'")
        row = cur.fetchone()
        return str(row[0]) if row else ""
    finally:
        c.close()


def _entries_after(cl: TestCluster, away: Path, site: str, url: str, before: dict[str, str]) -> int:
    """Entries of the dead `site`'s own change log past what its peers applied, read from its
    remains: its SQLite file (moved away), or its server database, let in again for this read
    (nothing of the cluster reaches it any more)."""
    import sqlite3

    if cl.backend.name == "sqlite":
        c: Any = sqlite3.connect(away / f"{site}.db")
    else:
        cl.urls[site] = url
        site_up(cl, site, away)
        del cl.urls[site]
        c = cl.backend.connect(url)
    try:
        cur = c.cursor()
        log = Site(site, url).dialect.obj("items").log
        p = cl.backend.param()
        cur.execute(f"SELECT count(*) FROM {log} WHERE origin = {p} AND ver > {p}", (site, max(before.values())))
        return int(cur.fetchone()[0])
    finally:
        c.close()


def clock_ahead(backend: Backend, tmp: Path, seed: int, *, ahead_s: float = 8.0, offset: str = "2s") -> Result:
    """Three sites; s2's clock is set `ahead_s` seconds ahead of the wall clock, past
    refresh.max_clock_offset, while every site writes and daemons run (one killed now and then).
    s1 and s3 hold s2's changes — `status` shows the held link, their clocks are not dragged
    ahead — until the wall clock is within the offset again; then everything flows and all
    sites converge to the model."""
    extra = {"refresh": {"max_clock_offset": offset}}
    with scenario(backend, tmp, seed, "clock-ahead", extra=extra, mode="run", life=(1.0, 4.0)) as sc:
        cl, res = sc.cl, sc.res
        time.sleep(1.0)
        fast = Site("s2", cl.urls["s2"])
        with fast.write() as conn:
            fast.dialect.advance_clock(conn, (int((time.time() + ahead_s) * 1000)) << 16)
        fast.dispose()
        release = time.time() + ahead_s  # s2's changes from now on are within the offset only then
        seen = None
        while time.time() < release - 2.5:
            st = api.status(cl.topo)
            held = [ln for ln in st["links"] if ln["from"] == "s2" and "max_clock_offset" in str(ln.get("last_error"))]
            if held:
                seen = held
                break
            time.sleep(0.2)
        if not seen:
            res.problems.append("status never showed a link from s2 held by max_clock_offset")
        else:
            res.notes["held_links"] = sorted(f"{ln['from']}->{ln['to']}" for ln in seen)
        for s in ("s1", "s3"):
            site = Site(s, cl.urls[s])
            with site.read() as conn:
                clock_ms = (site.dialect.read_clock(conn) or 0) >> 16
            site.dispose()
            if clock_ms > (time.time() + 2.5) * 1000:
                res.problems.append(f"{s}'s clock was dragged {clock_ms / 1000 - time.time():.1f}s ahead")
        while time.time() < release + 1.0:
            time.sleep(0.1)
        _run_until(sc.killer, 1, 1.0)
    return sc.finish()


def explain(cl: TestCluster, model: Model, names: list[str]) -> list[str]:
    """For a failure: what the model holds of each name (every committed transaction touching
    it) and each site's change-log entries of its row."""
    out = []
    with model.lock:
        txns = list(model.txns)
    for name in names:
        out.append(f"== {name}")
        for t in txns:
            parts = []
            if name in t.inserts:
                parts.append(f"insert {t.inserts[name]}")
            if name in t.adds:
                parts.append(f"add {t.adds[name]}")
            if name in t.labels:
                parts.append(f"label {t.labels[name]}")
            if name in t.deletes:
                parts.append("delete")
            if parts:
                out.append(f"  model: {t.site}/{t.writer} txn {t.n} at {t.at:.3f}: {', '.join(parts)}")
        for s in cl.urls:
            d = Site(s, cl.urls[s]).dialect
            log = d.obj("items").log
            c = cl.db(s)
            try:
                cur = c.cursor()
                p = cl.backend.param()
                cur.execute(f"SELECT rid FROM {log} WHERE op = 'I' AND n_name = {p}", (name,))
                rids = [r[0] for r in cur.fetchall()]
                for rid in rids:
                    cur.execute(
                        f"SELECT seq, ver, origin, op, mask, n_qty, o_qty, n_label FROM {log} WHERE rid = {p} ORDER BY seq",
                        (rid,),
                    )
                    for r in cur.fetchall():
                        out.append(f"  {s} log: {tuple(r)}")
            finally:
                c.close()
    return out
