"""A link that makes no progress while changes wait for it is never silent (docs/operations.md
"Links behind"): an application holding a lock at the target keeps the link's refresh from
finishing; once no refresh has succeeded for refresh.stall_after while changes wait, `status` calls
the link behind, says for how long and what is known of why, and exits 1. A refresh failing only on
such a lock is tried again at the link's schedule by the daemon, not backed off as from a down
peer. Applications write with plain clients; the CLI runs as a user runs it. States are asserted,
never durations."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

import pytest
from clusters import make_cluster, mm

from multimaster import api
from multimaster.core.versions import now_iso
from multimaster.ops.daemon import Daemon
from multimaster.ops.metrics import health, render

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
LINKS = [
    {"from": "s1", "to": "s2", "interval": "100ms", "jitter": 0},
    {"from": "s2", "to": "s1", "interval": "100ms", "jitter": 0},
]


def _held_back(backend: Any, tmp_path: Any) -> tuple[Any, Any]:
    """Two sites in step, then an application at s2 holding the row that s1's next change updates."""
    settings = {"refresh": {"stall_after": "1s", "lock_wait_warn": "300ms"}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, links=LINKS, settings=settings)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('bolts', 1)")
    cl.refresh_until_quiet()
    app = cl.db("s2")
    app.cursor().execute("UPDATE stock SET qty = 5 WHERE name = 'bolts'")  # open: the row stays locked
    cl.execute("s1", "UPDATE stock SET qty = 9 WHERE name = 'bolts'")
    return cl, app


def test_a_link_whose_refresh_waits_on_an_application_lock_is_behind(backend, tmp_path):  # type: ignore[no-untyped-def]
    if backend.name == "sqlite":
        pytest.skip("sqlite: an application holding the database's write lock is covered by its busy timeout")
    cl, app = _held_back(backend, tmp_path)
    topo = str(tmp_path / "topology.yaml")
    holder = app_backend_id(backend, app)
    done: list[Any] = []
    th = threading.Thread(target=lambda: done.append(api.refresh(cl.topo, "s2", "s1")), daemon=True)
    try:
        th.start()
        seen = None
        # the refresh waits for the application's lock meanwhile; its lock watch records the wait
        # at s2 (store/running.py) once it passes lock_wait_warn
        while seen is None and th.is_alive():
            st = mm("status", "-t", topo, "--json")
            (link,) = [ln for ln in json.loads(st.stdout)["links"] if ln["from"] == "s1" and ln["to"] == "s2"]
            if link.get("behind") and link.get("running"):
                seen = (st, link)
            else:
                time.sleep(0.2)
        assert seen is not None, f"status never called the link behind, naming the refresh waiting: {link}"
        st, link = seen
        assert st.returncode == 1, st.stdout + st.stderr
        assert link["behind"] in json.loads(st.stdout)["behind"] and link["behind"] in st.stderr, st.stderr
        assert link["behind"].startswith("link s1 -> s2 behind: 1 change(s) wait at 's1'"), link["behind"]
        assert "--site s2 --peer s1" in link["behind"] and link["behind_s"] >= 1, link
        assert link["last_error"] is None, link  # nothing failed yet: before, status exited 0 here
        # which refresh, since when, and who holds the lock (before: "one is running and not
        # finishing ..., or no refresher runs", inferred)
        run = link["running"]
        assert run["process"] == f"{socket.gethostname()}:{os.getpid()}", run
        assert run["started_at"] <= run["waiting_since"] <= now_iso(), run
        assert f"a refresh of it running since {run['started_at']} (process {run['process']})" in link["behind"]
        assert "waiting" in run["waiting_for"] and "for a lock at s2, held by" in run["waiting_for"], run
        assert str(holder) in run["waiting_for"], (run, holder)
        assert run["waiting_for"] in link["behind"], link["behind"]
        metrics = render(json.loads(st.stdout))  # the figures of that moment (the refresh may end since)
        assert 'multimaster_link_behind_seconds{source="s1",target="s2"} ' in metrics, metrics
        assert 'multimaster_link_behind_seconds{source="s1",target="s2"} 0\n' not in metrics, metrics
        assert 'multimaster_link_refresh_lock_wait_seconds{source="s1",target="s2"} 0\n' not in metrics, metrics
    finally:
        app.rollback()
        app.close()
        th.join()
    cl.refresh_until_quiet()
    assert mm("status", "-t", topo).returncode == 0
    assert [r[2] for r in cl.rows("s2", "stock")] == [9]
    # the wait ended: its record went with it
    with api.Cluster(cl.topo) as c, c.site("s2").read() as conn:
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {c.site('s2').dialect.mm_table('_mm_running')}").scalar() == 0
    metrics = render(health(cl.topo))
    assert 'multimaster_link_behind_seconds{source="s1",target="s2"} 0\n' in metrics, metrics


def app_backend_id(backend: Any, app: Any) -> int:
    """The server session of the application's connection (what a lock holder is named by)."""
    cur = app.cursor()
    cur.execute("SELECT pg_backend_pid()" if backend.name == "postgresql" else "SELECT CONNECTION_ID()")
    return int(cur.fetchone()[0])


def test_a_refresh_failing_on_a_lock_is_retried_at_its_interval(pg_backend, tmp_path):  # type: ignore[no-untyped-def]
    cl, app = _held_back(pg_backend, tmp_path)
    d = Daemon(cl.topo, ["s2"], max_backoff=300)
    try:
        st = d.stats.links["s1->s2"]
        st.failures = 6  # as after six failures in a row: a down peer would now wait 64 intervals
        d._refresh(st)  # PostgreSQL gives up the row after its lock_timeout, on every retry
        assert st.failures == 7 and "lock timeout" in (st.last_error or ""), st
        assert st.transient and d.backoff(st) == 1.0, st
        app.rollback()
        st.retry_at = 0.0
        d._refresh(st)
        assert st.failures == 0 and not st.transient, st
    finally:
        app.rollback()
        app.close()
        d.cluster.close()
    assert [r[2] for r in cl.rows("s2", "stock")] == [9]


def test_a_mariadb_refresh_waits_out_an_applications_lock_only_in_its_last_attempt(mysql_backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A natural-key table at a MariaDB target, a row an application keeps locked: the attempts
    of the refresh between the first and the last give up at once (brief waits from the
    reconcilers' lock on, BRIEF_EARLY), and the link goes on once the application ends. Before
    (session 36) brief waits began only with a renumbered table's writers' lock, so each of the ten
    attempts waited out innodb_lock_wait_timeout (50 s): 500 s behind one application's transaction.
    The first attempt still waits (the lock watch names the holder meanwhile:
    tests/test_progress_and_waits.py); here every attempt but the last runs as the middle ones do,
    so the test does not wait out the first one's 50 s."""
    from multimaster.dialects.mysql import dialect as my
    from multimaster.engine.site import Site

    write = Site.write

    def middle(self, watch=None, *, brief=False, early=False):  # type: ignore[no-untyped-def]
        return write(self, watch, brief=brief, early=brief)

    monkeypatch.setattr(Site, "write", middle)

    codes = {"codes": {"key": "code", "columns": {"qty": "int"}, "auto": False}}
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], codes)
    cl.execute("s1", "INSERT INTO codes (code, qty) VALUES ('a', 1)")
    cl.refresh_until_quiet()
    quick: list[int] = []
    real = my.MySQLDialect._lock_or_retry

    def counted(self, conn, *a, **k):  # type: ignore[no-untyped-def]
        try:
            return real(self, conn, *a, **k)
        except Exception:
            quick.append(1 if conn.info.get(my.BRIEF_NOW) else 0)
            raise

    monkeypatch.setattr(my.MySQLDialect, "_lock_or_retry", counted)
    app = cl.db("s2")
    app.cursor().execute("UPDATE codes SET qty = 5 WHERE code = 'a'")  # open: the row stays locked
    cl.execute("s1", "UPDATE codes SET qty = 9 WHERE code = 'a'")
    th = threading.Thread(target=lambda: api.refresh(cl.topo, "s2", "s1"), daemon=True)
    try:
        th.start()
        for _ in range(200):  # before: the first attempt alone waited 50 s without failing
            if sum(quick) >= 3 or not th.is_alive():
                break
            time.sleep(0.1)
        assert sum(quick) >= 3, f"attempts that gave up at once: {quick}"
    finally:
        app.rollback()
        app.close()
    th.join()
    cl.refresh_until_quiet()
    assert [r[1] for r in cl.rows("s2", "codes")] == [9]
