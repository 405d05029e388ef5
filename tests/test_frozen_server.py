"""A PostgreSQL server that stops answering (frozen with SIGSTOP: its kernel still accepts and
acknowledges, the server sends nothing) while `status`, `refresh` and the daemon use it: each
answers within the site's bounds (refresh.connect_timeout + read_timeout, docs/configuration.md),
names the site, the daemon records the error, keeps its other link, and recovers by itself once
the server answers again, with every change applied once. And a statement the server is busy
with for longer than read_timeout is not cut.

The server is a PostgreSQL instance of the test's own (initdb in a temporary folder, its own
port), never the shared one. Every wait is for a state with a generous deadline; the only time
checked is that a command finished within its bound plus a generous margin."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from multimaster.config.topology import load_topology
from multimaster.engine.site import Site

CONNECT, READ = 2, 3  # the topology's bounds (seconds)
BOUND = CONNECT + READ + CONNECT  # a connect, or a wait and the check of the server
MARGIN = 25.0  # generous: a loaded machine, the CLI's start-up
DEADLINE = 90.0


def _bindir() -> Path | None:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return Path(out) if (Path(out) / "initdb").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgInstance:
    """A throwaway PostgreSQL server (trust, loopback, its own port)."""

    def __init__(self, base: Path, bindir: Path):
        self.bindir, self.dir = bindir, base / "pg"
        self.data = self.dir / "data"
        self.dir.mkdir()
        self.port = _free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")
            os.chmod(base, 0o755)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"fsync = off\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.dir}'\n")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, prog: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bindir / prog), *args], check=True, capture_output=True)

    def pids(self) -> list[int]:
        """The postmaster and every process under it."""
        root = int((self.data / "postmaster.pid").read_text().split()[0])
        parents: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = Path(f"/proc/{d}/stat").read_text()
                except OSError:
                    continue
                parents[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
        out, todo = [], [root]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += [c for c, pp in parents.items() if pp == p]
        return out

    def signal(self, sig: int) -> None:
        for p in self.pids():
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


@pytest.fixture
def pg() -> Iterator[PgInstance]:
    bindir = _bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's server binaries (pg_config --bindir) are not installed")
    base = Path(tempfile.mkdtemp(prefix="mm-frozen-"))  # (tmp_path's parents are closed to the user postgres)
    try:
        inst = PgInstance(base, bindir)
        try:
            yield inst
        finally:
            inst.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def wait_for(cond: Callable[[], Any], what: str, deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def mm(topo: Path, *args: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-c", "from multimaster.cli import main; main()", *args, "-t", str(topo)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"'multimaster {' '.join(args)}' did not finish within {timeout:g} s") from e
    return p, time.monotonic() - t0


def _cluster(tmp: Path, pg: PgInstance, **refresh: Any) -> Path:
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres", autocommit=True) as c:
        c.execute("CREATE TABLE items (id bigint PRIMARY KEY, v text)")
    for s in ("s2", "s3"):
        with sqlite3.connect(tmp / f"{s}.db") as c:
            c.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, v TEXT)")
    sites = ["s1", "s2", "s3"]
    topo = {
        "sites": {"s1": {"url": pg.url}, "s2": {"url": f"sqlite:///{tmp}/s2.db"}, "s3": {"url": f"sqlite:///{tmp}/s3.db"}},
        "tables": {"items": {"key": "id"}},
        "links": [{"from": a, "to": b, "interval": "1s", "jitter": 0} for a in sites for b in sites if a != b],
        "refresh": {"connect_timeout": f"{CONNECT}s", "read_timeout": f"{READ}s", **refresh},
    }
    path = tmp / "topology.yaml"
    path.write_text(json.dumps(topo))  # (JSON is YAML)
    p, _ = mm(path, "init", timeout=120)
    assert p.returncode == 0, p.stderr
    return path


def values(topo: Path, site: str) -> list[str]:
    s = Site(site, load_topology(topo).sites[site].url)
    try:
        with s.read() as c:
            return sorted(r[0] for r in c.exec_driver_sql("SELECT v FROM items"))
    finally:
        s.dispose()


def insert(topo: Path, site: str, v: str) -> None:
    s = Site(site, load_topology(topo).sites[site].url)
    try:
        with s.write() as c:
            c.exec_driver_sql("INSERT INTO items (v) VALUES (?)" if site != "s1" else "INSERT INTO items (v) VALUES (%s)", (v,))
    finally:
        s.dispose()


def test_a_frozen_server_is_reported_within_the_bounds_and_the_daemon_recovers(tmp_path: Path, pg: PgInstance) -> None:
    topo = _cluster(tmp_path, pg)
    insert(topo, "s1", "a1")
    insert(topo, "s2", "b1")
    p, _ = mm(topo, "refresh", "--until-quiet", timeout=120)
    assert p.returncode == 0, p.stderr
    log = tmp_path / "daemon.log"
    with open(log, "w") as fh:
        d = subprocess.Popen(
            [sys.executable, "-c", "from multimaster.cli import main; main()", "run", "-t", str(topo), "--site", "s2"]
            + ["--log-format", "json", "--max-backoff", "2s"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for(lambda: '"started"' in log.read_text(), "the daemon to start")
        wait_for(lambda: values(topo, "s2") == ["a1", "b1"], "s2 to have every row")
        pg.signal(signal.SIGSTOP)
        try:
            # status: exits 1 within the bound, naming the frozen site
            p, took = mm(topo, "status", timeout=BOUND * 3 + MARGIN)
            assert p.returncode == 1, p.stdout + p.stderr
            assert "'s1'" in p.stderr, p.stderr
            print(f"status took {took:.1f} s: {p.stderr}")
            # refresh: fails the links of s1 with a clear message, refreshes the others
            insert(topo, "s3", "c1")
            p, took = mm(topo, "refresh", "--site", "s2", "--json", timeout=BOUND * 3 + MARGIN)
            assert p.returncode == 1, p.stdout + p.stderr
            print(f"refresh took {took:.1f} s: {p.stderr}")
            links = {(x["from"], x["to"]): x for r in json.loads(p.stdout) for x in r["links"]}
            assert "s1" in (links[("s1", "s2")]["error"] or ""), links
            assert not links[("s3", "s2")]["error"], links
            # the daemon: its link from s1 fails and is recorded at s2 (status shows it), the
            # link from s3 keeps running
            insert(topo, "s3", "c2")
            wait_for(lambda: "c2" in values(topo, "s2"), "the daemon to bring s3's change to s2")

            def recorded() -> bool:
                q, _ = mm(topo, "status", "--json", timeout=BOUND * 3 + MARGIN)
                doc = json.loads(q.stdout)
                return any(ln["from"] == "s1" and ln["to"] == "s2" and ln["last_error"] for ln in doc["links"])

            wait_for(recorded, "status to show the failing link s1 -> s2's error")
            events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
            errors = [e for e in events if e.get("event") == "refresh" and e.get("link") == "s1->s2" and e.get("error")]
            assert errors, log.read_text()
            assert any(w in errors[0]["error"] for w in ("did not answer", "connect_timeout", "cannot be reached")), errors[0]
        finally:
            pg.signal(signal.SIGCONT)
        # back: the daemon recovers by itself, every change once
        insert(topo, "s1", "a2")
        wait_for(lambda: values(topo, "s2") == ["a1", "a2", "b1", "c1", "c2"], "s2 to catch up with s1 after the thaw")
        p, _ = mm(topo, "refresh", "--until-quiet", timeout=120)
        assert p.returncode == 0, p.stderr
        assert values(topo, "s1") == values(topo, "s2") == values(topo, "s3") == ["a1", "a2", "b1", "c1", "c2"]
        p, _ = mm(topo, "status", timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
        assert d.wait(DEADLINE) == 0, log.read_text()


def test_a_busy_server_is_not_cut(tmp_path: Path, pg: PgInstance) -> None:
    """A statement the server works on, silently, for three times read_timeout ends normally: the
    server answers the check."""
    topo = _cluster(tmp_path, pg)
    t = load_topology(topo)
    s = Site("s1", t.sites["s1"].url, timeouts=t.timeouts("s1"))
    try:
        with s.read() as c:
            assert c.exec_driver_sql(f"SELECT pg_sleep({READ * 3}), 7").one()[1] == 7
    finally:
        s.dispose()


def test_timeouts_are_validated(tmp_path: Path) -> None:
    from multimaster.errors import ConfigError

    base = {"tables": {"items": {"key": "id"}}}
    bad = {
        **base,
        "sites": {
            "a": {"url": "sqlite:///a.db", "read_timeout": "soon"},
            "b": {"url": "sqlite:///b.db", "connect_timeout": "0s"},
        },
        "refresh": {"read_timeout": "2d"},
    }
    path = tmp_path / "t.yaml"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError) as e:
        load_topology(path)
    msg = str(e.value)
    assert "sites.a.read_timeout: 'soon' is not a duration" in msg, msg
    assert "sites.b.connect_timeout: 0 s is out of range" in msg, msg
    assert "refresh.read_timeout: 172800 s is out of range" in msg, msg
    good = {**base, "sites": {"a": {"url": "sqlite:///a.db", "read_timeout": "1m"}, "b": {"url": "sqlite:///b.db"}}}
    good["refresh"] = {"connect_timeout": "5s"}
    path.write_text(json.dumps(good))
    t = load_topology(path)
    assert (t.timeouts("a").connect, t.timeouts("a").read) == (5.0, 60.0)
    assert (t.timeouts("b").connect, t.timeouts("b").read) == (5.0, 15.0)
