"""Nothing silent (docs/cli.md "Progress and lock waits"): a refresh whose write transaction waits
for an application's lock names the holder while it waits (PostgreSQL: its pid and
application_name; MariaDB: its connection id; SQLite: the database file), then completes once the
holder commits; refresh, init and add-site report progress as plain lines when stderr is no
terminal, and `--json` stays JSON. The multimaster command runs as a user runs it (a subprocess);
the applications are plain DB-API connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from clusters import Backend, TestCluster, make_cluster

from multimaster.config.topology import load_topology
from multimaster.core.progress import Blocker, ProgressEvent, progress_line, wait_text

ITEMS = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def cli(*args: str, every: str = "0") -> subprocess.CompletedProcess[str]:
    """`python -m multimaster.cli ARGS`, stdout and stderr pipes (no terminal), a progress line per batch."""
    env = {**os.environ, "COLUMNS": "250", "MM_PROGRESS_EVERY": every}
    return subprocess.run([sys.executable, "-m", "multimaster.cli", *args], capture_output=True, text=True, env=env, timeout=300)


# ---- the wording ---------------------------------------------------------------------------------


def test_progress_lines() -> None:
    e = ProgressEvent("pull", "s1 -> s2", done=120_000, applied=119_500, batches=12, seconds=3.0)
    assert str(e) == progress_line(e) == "s1 -> s2: 120,000 changes pulled, 119,500 applied, 12 batches (40,000/s)"
    e = ProgressEvent("pull", "s1 -> s2", done=0, applied=0, batches=1, seconds=0.01)
    assert str(e) == "s1 -> s2: 0 changes pulled, 0 applied, 1 batch"
    e = ProgressEvent("pull", "s1 -> s2", done=1, applied=1, batches=1, seconds=2.5)
    assert str(e) == "s1 -> s2: 1 change pulled, 1 applied, 1 batch (0.4/s)"
    e = ProgressEvent("copy", "s1 -> s3", table="items", done=50_000, total=200_000, unit="rows", seconds=2.0)
    assert str(e) == "s1 -> s3 items: 50,000 of 200,000 rows copied (25%, 25,000/s)"
    e = ProgressEvent("copy", "s1 -> s3", table="items", done=7, unit="change-log entries")
    assert str(e) == "s1 -> s3 items: 7 change-log entries copied"


def test_lock_wait_lines() -> None:
    pg = Blocker(
        session="pid 4242",
        who="application 'billing', user app",
        client="10.0.0.7",
        state="idle in transaction",
        txn_seconds=12.04,
        query="SELECT *\n  FROM items WHERE id = 1 FOR UPDATE " + "x" * 100,
    )
    text = wait_text("s1 -> s2", "s2", 2.25, [pg])
    assert text.startswith("s1 -> s2: waiting 2.2 s for a lock at s2, held by pid 4242 (application 'billing', user app, ")
    assert "client 10.0.0.7, idle in transaction, transaction open 12.0 s, query: SELECT * FROM items WHERE id = 1" in text
    assert text.endswith("x...)") and "\n" not in text
    many = [Blocker(session=f"connection {i}") for i in range(5)]
    assert wait_text("init at s1", "s1", 3, many).endswith("held by connection 0; connection 1; connection 2; and 2 more")
    assert wait_text("s1 -> s2", "s2", 3, [Blocker(state="Waiting for table metadata lock")]).endswith(
        "held by a session the database does not name (Waiting for table metadata lock)"
    )
    assert wait_text("s1 -> s2", "s2", 3, file="/data/s2.db") == (
        "s1 -> s2: waiting 3.0 s for a lock at s2: the database file /data/s2.db is locked by another connection "
        "(SQLite cannot tell which)"
    )
    assert wait_text("s1 -> s2", "s2", 3) == "s1 -> s2: waiting 3.0 s for a lock at s2 (the database does not name its holder)"
    assert wait_text("s1 -> s2", "s2", 4.0, [pg], ended=True) == "s1 -> s2: no longer waiting for a lock at s2 (waited 4.0 s)"


def test_lock_wait_warn_setting(tmp_path: Path) -> None:
    def load(value: Any) -> Any:
        doc = {"sites": {"s1": {"url": "sqlite:///s1.db"}}, "tables": {"t": {"key": "id"}}, "refresh": {"lock_wait_warn": value}}
        (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
        return load_topology(tmp_path / "t.yaml").refresh.lock_wait_warn_seconds()

    assert load("500ms") == 0.5 and load(3) == 3.0 and load("off") is None and load(False) is None
    for bad in ("soon", 0):
        try:
            load(bad)
        except Exception as e:  # noqa: BLE001 - the topology's error names the setting
            assert "refresh.lock_wait_warn" in str(e)
        else:
            raise AssertionError(f"{bad!r} accepted")


# ---- a lock held by an application -------------------------------------------------------------


class _Holder:
    """An application transaction at a site holding the lock the refresh needs: the row with
    id 1 locked FOR UPDATE on a server, the database's write lock (BEGIN IMMEDIATE) on SQLite.
    `name`: what the refresh's message must say of it."""

    def __init__(self, cl: TestCluster, site: str, tmp: Path):
        self.conn = cl.db(site)
        kind = cl.backend.name
        cur = self.conn.cursor()
        if kind == "postgresql":
            cur.execute("SET application_name = 'mm-test-holder'")
            cur.execute('SELECT * FROM "items" WHERE "id" = 1 FOR UPDATE')
            self.names = [f"pid {self.conn.info.backend_pid}", "application 'mm-test-holder'", "idle in transaction"]
        elif kind == "mysql":
            cur.execute("SELECT CONNECTION_ID()")
            cid = cur.fetchone()[0]
            cur.execute("SELECT * FROM `items` WHERE `id` = 1 FOR UPDATE")
            self.names = [f"connection {cid}"]
        else:
            cur.execute("BEGIN IMMEDIATE")
            self.names = [f"the database file {tmp / f'{site}.db'} is locked by another connection"]

    def release(self) -> None:
        self.conn.commit()
        self.conn.close()


def _refresh_telling_waits(cl: Any, site: str) -> tuple[Any, list[str], threading.Event, threading.Thread]:
    """`multimaster refresh --site SITE` run as a user runs it, its stderr read line by line:
    (the process, the lines so far, set once a line says it is waiting, the reading thread)."""
    env = {**os.environ, "COLUMNS": "250"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "multimaster.cli", "refresh", "-t", str(cl.topo.path), "--site", site],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    err: list[str] = []
    named = threading.Event()

    def read() -> None:
        for line in iter(proc.stderr.readline, ""):  # type: ignore[union-attr]
            err.append(line)
            if "waiting" in line:
                named.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, err, named, reader


def test_a_refresh_names_the_lock_it_waits_for(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS, settings={"refresh": {"lock_wait_warn": "300ms"}})
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.refresh("s2")
    cl.execute("s1", "UPDATE items SET qty = 2 WHERE id = 1")
    holder = _Holder(cl, "s2", tmp_path)
    p, err, named, reader = _refresh_telling_waits(cl, "s2")
    try:
        # the refresh says whom it waits for while it waits (a loaded host starts the command slowly)
        assert named.wait(90), "".join(err)
    finally:
        time.sleep(0.3)
        holder.release()
    p.wait(timeout=120)
    reader.join(timeout=10)
    out = p.stdout.read()  # type: ignore[union-attr]
    text = "".join(err)
    assert p.returncode == 0, out + text
    (line,) = [ln for ln in err if "waiting" in ln][:1]
    assert line.startswith("s1 -> s2: waiting ") and " for a lock at s2" in line, text
    for name in holder.names:
        assert name in line, (name, line)
    assert "s1 -> s2: no longer waiting for a lock at s2 (waited " in text, text
    assert [r[1:] for r in cl.rows("s2", "items")] == [("a", 2)]


def _session(cl: TestCluster, conn: Any) -> str:
    """How a lock wait names the session of an application's connection."""
    cur = conn.cursor()
    if cl.backend.name == "postgresql":
        return f"pid {conn.info.backend_pid}"
    cur.execute("SELECT CONNECTION_ID()")
    return f"connection {cur.fetchone()[0]}"


def _waits(cl: TestCluster, site: str, session: str) -> bool:
    """Whether the application session `session` waits for a lock now."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        sid = int(session.split()[-1])
        if cl.backend.name == "postgresql":
            cur.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (sid,))
        else:
            cur.execute(
                "SELECT trx_state = 'LOCK WAIT' FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = %s", (sid,)
            )
        row = cur.fetchone()
        return bool(row and row[0])
    finally:
        c.close()


def test_a_refresh_names_the_transaction_holding_the_row_not_one_queued_for_it(backend: Backend, tmp_path: Path) -> None:
    """The soak's D5: application A holds a row (idle in transaction), application B waits for it,
    and a refresh waits for the row too. The refresh's message named B (queued before it, itself
    waiting: MariaDB's INNODB_LOCK_WAITS and PostgreSQL's pg_blocking_pids both name the waiters
    ahead in the queue), so ending B would not have let it go. It names A first now, B only as
    itself waiting for A."""
    if backend.name == "sqlite":
        return  # one writer at a time: the database file is what a refresh waits for (above)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS, settings={"refresh": {"lock_wait_warn": "300ms"}})
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('b', 1)")
    cl.refresh("s2")
    cl.execute("s1", "UPDATE items SET qty = 2 WHERE id = 1")
    p = cl.backend.param()
    queued, holder = cl.db("s2"), cl.db("s2")
    b, a = _session(cl, queued), _session(cl, holder)
    queued.cursor().execute("UPDATE items SET qty = 3 WHERE id = 2")  # B's transaction began first ...
    time.sleep(1.1)  # (INNODB_TRX's trx_started counts seconds)
    holder.cursor().execute("SELECT * FROM items WHERE id = 1 FOR UPDATE")  # ... A holds the row ...
    blocked = threading.Thread(target=lambda: queued.cursor().execute(f"UPDATE items SET qty = {p} WHERE id = 1", (4,)))
    blocked.start()  # ... and B waits for it
    end = time.monotonic() + 60
    while time.monotonic() < end and not _waits(cl, "s2", b):
        time.sleep(0.05)
    assert _waits(cl, "s2", b)
    r, err, named, reader = _refresh_telling_waits(cl, "s2")
    try:
        assert named.wait(90), "".join(err)
    finally:
        holder.commit()
        holder.close()
        blocked.join(60)
        queued.commit()
        queued.close()
    r.wait(timeout=120)
    reader.join(timeout=10)
    text = "".join(err)
    assert r.returncode == 0, r.stdout.read() + text  # type: ignore[union-attr]
    (line,) = [ln for ln in err if "waiting" in ln][:1]
    assert f"held by {a} (" in line, (a, b, line)  # the root holder first: what to end
    assert f"{b} (" not in line or f"waiting for {a}" in line, (a, b, line)  # B only as queued behind it


# ---- progress -----------------------------------------------------------------------------------


def test_progress_of_init_refresh_and_add_site_without_a_terminal(sqlite_backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], ITEMS, init=False)
    t = str(cl.topo.path)
    with cl.db("s1") as c:  # base rows at s1 only: init copies them to s2
        c.executemany("INSERT INTO items (name, qty) VALUES (?, ?)", [(f"r{i}", i) for i in range(12_000)])
    r = cli("init", "-t", t)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "s1 -> s2 items: 10,000 of 12,000 rows copied (83%" in r.stderr, r.stderr
    assert "s1 -> s2 items: 12,000 of 12,000 rows copied (100%" in r.stderr
    assert "copied 12000 base rows of items to s2" in r.stdout and "rows copied" not in r.stdout

    with cl.db("s1") as c:  # a few thousand changes, refreshed in batches of 500
        c.executemany("INSERT INTO items (name, qty) VALUES (?, ?)", [(f"n{i}", i) for i in range(3000)])
    r = cli("refresh", "-t", t, "--site", "s2", "--batch-size", "500")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("s1 -> s2: ")]
    assert lines and lines[-1].startswith("s1 -> s2: 3,000 changes pulled, 3,000 applied, "), r.stderr
    assert all("changes pulled" in ln for ln in lines) and "changes pulled" not in r.stdout

    with cl.db("s1") as c:
        c.execute("UPDATE items SET qty = qty + 1 WHERE id <= 2000")
    r = cli("refresh", "-t", t, "--site", "s2", "--batch-size", "500", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    (rnd,) = json.loads(r.stdout)  # stdout is the JSON alone
    assert rnd["links"][0]["pulled"] == 2000
    assert "s1 -> s2: 2,000 changes pulled" in r.stderr

    # the default: at most a line every 5 s per link; a quick refresh prints none
    with cl.db("s1") as c:
        c.execute("UPDATE items SET qty = qty + 1 WHERE id <= 100")
    r = cli("refresh", "-t", t, "--site", "s2", every="")
    assert r.returncode == 0 and "changes pulled" not in r.stderr, r.stderr

    # add-site: a third site copied from s1, rows per table of the total
    url = sqlite_backend.new_site(tmp_path, "s3")
    sqlite_backend.create_table(url, "items", "id", ITEMS["items"]["columns"])
    doc = yaml.safe_load(Path(t).read_text())
    doc["sites"]["s3"] = {"url": url}
    grown = tmp_path / "grown.yaml"
    grown.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = cli("add-site", "-t", str(grown), "s3", "--from", "s1", "--batch-size", "5000")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "s1 -> s3 items: 5,000 of 15,000 rows copied (33%" in r.stderr, r.stderr
    assert "s1 -> s3 items: 15,000 of 15,000 rows copied (100%" in r.stderr
    assert "change-log entries copied" in r.stderr
    r = cli("add-site", "-t", str(grown), "s3", "--from", "s1", "--json", "--replace")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["rows"] == {"items": 15_000} and "rows copied" in r.stderr


# ---- the daemon ---------------------------------------------------------------------------------


def test_the_daemon_logs_a_lock_wait(sqlite_backend: Backend, tmp_path: Path) -> None:
    links = [{"from": a, "to": b, "interval": "100ms", "jitter": 0} for a, b in (("s1", "s2"), ("s2", "s1"))]
    cl = make_cluster(
        sqlite_backend, tmp_path, ["s1", "s2"], ITEMS, links=links, settings={"refresh": {"lock_wait_warn": "300ms"}}
    )
    log = tmp_path / "daemon.log"
    with open(log, "w") as fh:
        p = subprocess.Popen(
            [sys.executable, "-m", "multimaster.cli", "run", "-t", str(cl.topo.path), "--site", "s2", "--log-format", "json"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:

            def events(name: str) -> list[dict[str, Any]]:
                out = []
                for line in log.read_text().splitlines():
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if e.get("event") == name:
                        out.append(e)
                return out

            def until(name: str) -> dict[str, Any]:
                end = time.monotonic() + 90
                while time.monotonic() < end and not events(name):
                    assert p.poll() is None, log.read_text()
                    time.sleep(0.1)
                assert events(name), log.read_text()
                return events(name)[0]

            until("started")
            holder = _Holder(cl, "s2", tmp_path)
            cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
            e = until("lock_wait")
            assert e["link"] == "s1->s2" and e["site"] == "s2" and e["waited_s"] >= 0.3
            assert holder.names[0] in e["message"], e
            holder.release()
            assert until("lock_wait_ended")["link"] == "s1->s2"
            end = time.monotonic() + 90
            while time.monotonic() < end and cl.rows("s2", "items") != [(1, "a", 1)]:
                time.sleep(0.1)
            assert cl.rows("s2", "items") == [(1, "a", 1)]
        finally:
            p.terminate()
            p.wait(60)
