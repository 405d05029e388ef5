"""The refresher daemon, run as a subprocess like a user would: refreshes on schedule, survives a
peer going away and coming back, stops cleanly on SIGTERM in the middle of a refresh, refuses a
second daemon for the same site. Waits poll for a state with a generous deadline; no assertion
depends on how long anything took."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
from clusters import make_cluster

from multimaster import api
from multimaster.ops.daemon import Daemon, DaemonAlreadyRunning, cron_trigger

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}}}
DEADLINE = 60.0


def fast_links(sites: list[str], interval: str = "100ms") -> list[dict[str, Any]]:
    return [{"from": a, "to": b, "interval": interval, "jitter": 0} for a in sites for b in sites if a != b]


def wait_for(cond: Callable[[], Any], what: str, deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Proc:
    def __init__(self, tmp: Path, topo: Path, *args: str):
        self.log = tmp / f"daemon-{time.monotonic_ns()}.log"
        self.fh = open(self.log, "w")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.p = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from multimaster.cli import main; main()",
                "run",
                "-t",
                str(topo),
                "--log-format",
                "json",
                *args,
            ],
            stdout=self.fh,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": "text", "line": line})
        return out

    def has(self, event: str, **match: Any) -> bool:
        if event == "started" and self.p.poll() is not None:
            raise AssertionError(f"the daemon exited with {self.p.returncode}:\n{self.log.read_text()}")
        return any(e.get("event") == event and all(e.get(k) == v for k, v in match.items()) for e in self.events())

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(DEADLINE)
        finally:
            self.fh.close()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.fh.close()


@pytest.fixture
def procs():  # type: ignore[no-untyped-def]
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def count(cl, site: str) -> int:  # type: ignore[no-untyped-def]
    return len(cl.rows(site, "stock"))


def test_daemon_refreshes_on_schedule_and_stops_on_sigterm(backend, tmp_path, procs):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, links=fast_links(["s1", "s2"]))
    d = Proc(tmp_path, cl.topo.path, "--site", "s2", "-v")
    procs.append(d)
    wait_for(lambda: d.has("started"), "the daemon to start")
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('bolts', 5)")
    wait_for(lambda: count(cl, "s2") == 1, "s2 to receive s1's insert")
    cl.execute("s1", "UPDATE stock SET qty = qty + 2 WHERE id = 1")
    wait_for(lambda: cl.rows("s2", "stock") == [(1, "bolts", 7)], "s2 to receive s1's update")
    refreshes = [e for e in d.events() if e.get("event") == "refresh" and e.get("pulled")]
    assert refreshes and all(e["link"] == "s1->s2" for e in refreshes)
    assert {"pulled", "applied", "conflicts", "seconds"} <= set(refreshes[0])
    assert d.stop() == 0
    assert d.has("stopped")


def test_second_daemon_for_a_site_is_refused(sqlite_backend, tmp_path, procs):  # type: ignore[no-untyped-def]
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, links=fast_links(["s1", "s2"]))
    first = Proc(tmp_path, cl.topo.path, "--site", "s2")
    procs.append(first)
    wait_for(lambda: first.has("started"), "the first daemon to start")
    second = Proc(tmp_path, cl.topo.path, "--site", "s2")
    procs.append(second)
    assert second.p.wait(DEADLINE) == 1
    assert "already running" in second.log.read_text()
    # another site is fine
    other = Proc(tmp_path, cl.topo.path, "--site", "s1")
    procs.append(other)
    wait_for(lambda: other.has("started"), "the s1 daemon to start")
    assert other.stop() == 0 and first.stop() == 0
    # once the first is gone, a new one starts
    again = Proc(tmp_path, cl.topo.path, "--site", "s2")
    procs.append(again)
    wait_for(lambda: again.has("started"), "a new daemon after the first stopped")
    assert again.stop() == 0


def test_peer_going_away_and_coming_back(sqlite_backend, tmp_path, procs):  # type: ignore[no-untyped-def]
    sites = ["s1", "s2", "s3"]
    cl = make_cluster(sqlite_backend, tmp_path, sites, STOCK, links=fast_links(sites))
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('from-s1-before', 1)")
    away = tmp_path / "away"
    away.mkdir()
    files = [f for f in tmp_path.glob("s1.db*")]
    for f in files:
        f.rename(away / f.name)
    d = Proc(tmp_path, cl.topo.path, "--site", "s3", "--max-backoff", "1s")
    procs.append(d)
    wait_for(lambda: d.has("started"), "the daemon to start")
    # s1 is away: its link fails and backs off, the link from s2 keeps working
    wait_for(
        lambda: any(e.get("link") == "s1->s3" and e.get("error") and e.get("retry_in_s") for e in d.events()),
        "the s1 link to fail and back off",
    )
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('from-s2', 2)")
    wait_for(lambda: count(cl, "s3") == 1, "s3 to receive s2's insert while s1 is away")
    for f in away.iterdir():
        f.rename(tmp_path / f.name)
    wait_for(lambda: count(cl, "s3") == 2, "s3 to receive s1's change once s1 is back")
    cl.execute("s1", "UPDATE stock SET qty = qty + 10 WHERE name = 'from-s1-before'")
    wait_for(lambda: (1, "from-s1-before", 11) in cl.rows("s3", "stock"), "s3 to receive s1's update")
    assert d.stop() == 0
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_sigterm_in_the_middle_of_a_refresh_leaves_nothing_half_applied(sqlite_backend, tmp_path, procs):  # type: ignore[no-untyped-def]
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, links=fast_links(["s1", "s2"]))
    n = 6000
    c = cl.db("s1")
    c.executemany("INSERT INTO stock (name, qty) VALUES (?, ?)", [(f"item-{i}", i) for i in range(n)])
    c.commit()
    c.close()
    d = Proc(tmp_path, cl.topo.path, "--site", "s2", "--batch-size", "10")
    procs.append(d)
    wait_for(lambda: count(cl, "s2") > 0, "the first batches to be applied at s2")
    assert d.stop(signal.SIGTERM) == 0
    assert d.has("stopping") and d.has("stopped")
    # what was applied is exactly what the watermark covers: every pulled change applied, each once
    c = cl.db("s2")
    try:
        unapplied = c.execute('SELECT count(*) FROM "_mm_snap_stock__s1" WHERE applied <> 1').fetchone()[0]
        pulled = c.execute('SELECT count(*), max(ver) FROM "_mm_snap_stock__s1"').fetchone()
        known = c.execute("SELECT max_ver FROM _mm_origins WHERE tbl = 'stock' AND origin = 's1'").fetchone()[0]
        rows = c.execute("SELECT count(*), count(DISTINCT name) FROM stock").fetchone()
        wm = c.execute("SELECT seq2 FROM _mm_watermarks WHERE peer = 's1' AND tbl = 'stock'").fetchone()[0]
    finally:
        c.close()
    assert unapplied == 0
    assert rows[0] == rows[1] == pulled[0] == wm
    assert known == pulled[1]  # the dedupe record covers exactly what was applied
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert count(cl, "s2") == n


# ---- in-process: schedules, backoff, metrics --------------------------------------------------


def test_cron_links_and_backoff(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    links = [{"from": "s1", "to": "s2", "cron": "*/5 * * * *", "jitter": "2s"}, {"from": "s2", "to": "s1", "interval": "30s"}]
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, links=links)
    trig = cron_trigger("*/5 * * * *", 2.0)
    assert trig.jitter == 2.0
    assert "second='0'" in str(cron_trigger("0 */5 * * * *")) or "second" in repr(cron_trigger("0 */5 * * * *"))
    with pytest.raises(ValueError, match="5 fields"):
        cron_trigger("* *")
    d = Daemon(cl.topo, ["s1"], max_backoff=300)
    st = d.stats.links["s2->s1"]
    assert [d.backoff(_fail(st, k)) for k in (1, 2, 3, 4, 5, 6)] == [30, 60, 120, 240, 300, 300]
    d.cluster.close()


def _fail(st, k):  # type: ignore[no-untyped-def]
    st.failures = k
    return st


def test_two_daemons_in_one_process_are_refused_too(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, links=fast_links(["s1", "s2"], "1h"))
    a = Daemon(cl.topo, ["s1"])
    a.start()
    try:
        b = Daemon(cl.topo, ["s1", "s2"])
        with pytest.raises(DaemonAlreadyRunning, match="'s1'"):
            b.start()
        b.cluster.close()
    finally:
        a.stop()


def test_metrics_endpoint(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, links=fast_links(["s1", "s2"], "100ms"))
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('bolts', 5)")
    d = Daemon(cl.topo, ["s2"], metrics_port=0, purge_every=0.2)
    d.start()
    try:
        wait_for(lambda: count(cl, "s2") == 1, "the daemon to refresh s2")
        wait_for(lambda: d.stats.purged, "the purge job to run")
        port = d._metrics.port
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    finally:
        d.stop()
    for name in (
        "multimaster_link_waiting_changes",
        "multimaster_link_visibility_delay_seconds",
        "multimaster_link_last_success_timestamp_seconds",
        "multimaster_change_log_entries",
        "multimaster_site_conflicts_total",
        "multimaster_daemon_refreshes_total",
        "multimaster_puller_expired",
    ):
        assert f"# TYPE {name} " in text, name
    assert 'multimaster_link_waiting_changes{source="s1",target="s2"} 0' in text
    assert 'site="s1"' not in text.split("multimaster_change_log_entries")[1].split("# HELP")[0]  # only the daemon's site
    st = api.status(cl.topo)
    assert st["converging"]


def test_the_purge_job_drops_tombstones_and_conflicts_every_site_has(backend, tmp_path, caplog):  # type: ignore[no-untyped-def]
    """The daemon's purge schedule runs the bounded-state purge too, and logs what it dropped."""

    from multimaster.ops.purge import PurgePolicy

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, links=fast_links(["s1", "s2"], "100ms"))
    for n in ("a", "b", "c"):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, 1)", (n,))
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE stock SET name = 'x' WHERE id = 1")
    cl.execute("s2", "UPDATE stock SET name = 'y' WHERE id = 1")
    cl.execute("s2", "DELETE FROM stock WHERE id = 2")
    policy = PurgePolicy(min_age=0, tombstones_after=0, conflicts_after=0)
    d = Daemon(cl.topo, ["s1", "s2"], purge_every=0.3, purge_policy=policy)
    caplog.set_level(logging.INFO, logger="multimaster")
    d.start()
    try:

        def state() -> list[tuple[int, int]]:
            st = api.status(cl.topo)["sites"]
            return [(st[s]["tables"]["stock"]["tombstones"], st[s]["conflicts"]) for s in ("s1", "s2")]

        wait_for(lambda: cl.rows("s1", "stock") == cl.rows("s2", "stock") and len(cl.rows("s1", "stock")) == 2, "convergence")
        wait_for(lambda: state() == [(0, 0), (0, 0)], "the purge job to drop the tombstones and conflict rows")
    finally:
        d.stop()
    assert any("purge" in r.getMessage() and "tombstones=1" in r.getMessage() for r in caplog.records)


def test_a_follow_that_keeps_failing_is_logged_once_in_one_line(sqlite_backend, tmp_path, caplog, monkeypatch):  # type: ignore[no-untyped-def]
    """The schema follow runs every refresh.follow_every (1 s): a site that is down logged its error
    every second, with the driver's statement over several lines. Now one line, and the same error
    again only after FOLLOW_ERROR_REPEAT; a new error, or the same one after it cleared, at once."""

    import multimaster.ops.daemon as dm

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK)
    d = Daemon(cl.topo, ["s1"])
    fail = [RuntimeError("no connection\n[SQL: SELECT a long statement]")]

    def follow(cl_, n, tables=None):  # type: ignore[no-untyped-def]
        if fail:
            raise fail[0]
        return []

    monkeypatch.setattr(dm, "follow_site", follow)
    caplog.set_level(logging.INFO, logger="multimaster.ops.daemon")
    try:
        for _ in range(3):
            d._follow()
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schema")]
        assert lines == ["schema site=s1 error=RuntimeError: no connection"]
        fail[0] = RuntimeError("another cause")
        d._follow()
        fail.clear()
        d._follow()  # cleared
        fail.append(RuntimeError("another cause"))
        d._follow()
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schema")]
        assert lines[1:] == ["schema site=s1 error=RuntimeError: another cause"] * 2
    finally:
        d.cluster.close()


def test_a_daemon_waits_for_its_site_to_answer_at_start(pg_backend, tmp_path, caplog):  # type: ignore[no-untyped-def]
    """A daemon started while its site's database does not answer (a server that starts after it,
    a restart) waits for it, logging `site_down` once, and runs once it answers (`site_up`); it
    stops cleanly if asked while it waits. Before, it exited at once."""
    import threading

    cl = make_cluster(pg_backend, tmp_path, ["s1", "s2"], STOCK, links=fast_links(["s1", "s2"]))
    db = cl.urls["s2"].rsplit("/", 1)[1].split("?")[0]
    pg_backend._admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")
    pg_backend._admin(f"ALTER DATABASE {db} RENAME TO {db}_away")
    caplog.set_level(logging.INFO, logger="multimaster.ops.daemon")
    d = Daemon(cl.topo, ["s2"])
    started = threading.Thread(target=d.start)
    started.start()
    try:
        time.sleep(2.5)
        assert started.is_alive()  # waiting, not failed
        logged = [r.getMessage() for r in caplog.records]
        assert sum(m.startswith("site_down site=s2") for m in logged) == 1, logged
        pg_backend._admin(f"ALTER DATABASE {db}_away RENAME TO {db}")
        started.join(60)
        assert not started.is_alive()
        assert any(m.startswith("site_up site=s2") for m in (r.getMessage() for r in caplog.records))
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('after', 1)")
        deadline = time.time() + 30
        while time.time() < deadline and [r[1] for r in cl.rows("s2", "stock")] != ["after"]:
            time.sleep(0.2)
        assert [r[1] for r in cl.rows("s2", "stock")] == ["after"]
    finally:
        d.stop()
    # asked to stop while it waits: it returns, and stops with nothing scheduled
    pg_backend._admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")
    pg_backend._admin(f"ALTER DATABASE {db} RENAME TO {db}_away")
    try:
        d2 = Daemon(cl.topo, ["s2"])
        waiting = threading.Thread(target=d2.start)
        waiting.start()
        time.sleep(1.5)
        d2.request_stop("test")
        waiting.join(30)
        assert not waiting.is_alive()
        d2.stop()
    finally:
        pg_backend._admin(f"ALTER DATABASE {db}_away RENAME TO {db}")


def test_json_log_keeps_the_schedulers_lines_json() -> None:
    """`run --log-format json`: APScheduler's own warnings (a link's run skipped while the one
    before still runs, every interval on a slow link) were printed as plain text between the JSON
    events; they are events now (`scheduler`), and text logs keep the text format."""
    import io

    from multimaster.ops.daemon import setup_logging

    for fmt in ("json", "text"):
        out = io.StringIO()
        setup_logging(fmt, stream=out)
        try:
            logging.getLogger("apscheduler.scheduler").info("Added job")  # below WARNING: not shown
            logging.getLogger("apscheduler.executors.default").warning(
                'Execution of job "refresh a->b" skipped: maximum number of running instances reached (1)'
            )
            logging.getLogger("multimaster.ops.daemon").info(json.dumps({"event": "refresh"}) if fmt == "json" else "refresh")
        finally:
            setup_logging("text")
        lines = out.getvalue().splitlines()
        assert len(lines) == 2, lines
        if fmt == "json":
            events = [json.loads(ln) for ln in lines]
            assert events[0]["event"] == "scheduler" and events[0]["level"] == "warning"
            assert "skipped" in events[0]["message"] and events[1] == {"event": "refresh"}
        else:
            assert "WARNING" in lines[0] and "skipped" in lines[0]


def test_a_link_of_a_removed_site_says_so_in_the_daemons_log(sqlite_backend, tmp_path, caplog):  # type: ignore[no-untyped-def]
    """After `remove-site s3` (the file still lists it), the daemon's refresh of a link of s3 logs
    that s3 was removed and the file must drop it, as `status` and `refresh` say, not the fixes of
    a site never installed or connected (before: 'run multimaster init' / 'add-site')."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], STOCK, links=fast_links(["s1", "s2", "s3"], "1h"))
    cl.refresh_until_quiet()
    r = subprocess.run(
        [sys.executable, "-m", "multimaster.cli", "remove-site", "-t", str(cl.topo.path), "s3"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    caplog.set_level(logging.INFO, logger="multimaster.ops.daemon")
    d = Daemon(cl.topo, ["s1"])
    try:
        d._refresh(d.stats.links["s3->s1"])
    finally:
        d.cluster.close()
    errors = [r.getMessage() for r in caplog.records if "s3->s1" in r.getMessage()]
    assert errors and all("'s3' was removed from the cluster" in m for m in errors), errors
    assert not any("multimaster init" in m or "add-site" in m for m in errors), errors
