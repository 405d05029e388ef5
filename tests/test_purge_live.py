"""Purge never deletes what a registered peer that is up has not pulled, whatever `--retention`
says; only a peer that purge could not reach, and that did not refresh, for longer than the
retention (at least an hour) is given up, and then purge, status and the peer's own refresh name
it with the commands that bring it back (docs/operations.md "Log purge and retention").

Time passing is simulated by ageing the bookkeeping times a real wait would have aged (a puller's
last refresh at the puller, what the source recorded of it): an hour is not waited for."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, TestCluster, make_cluster, mm, unreachable_topology

from multimaster import api
from multimaster.errors import ConfigError
from multimaster.ops.purge import PurgePolicy

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
HOURS_AGO_2 = 2 * 3600


def _iso_ago(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds))


def _exec(cl: TestCluster, site: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    """One statement on `site`'s bookkeeping, through multimaster's own connection (`{t}` in
    `sql` names the table as the site's dialect spells it)."""
    with api.Cluster(cl.topo) as c:
        s = c.site(site)
        with s.write() as conn:
            conn.exec_driver_sql(sql.replace("?", s.dialect.caps.placeholder), params)


def _mm(cl: TestCluster, site: str, name: str) -> str:
    with api.Cluster(cl.topo) as c:
        return c.site(site).dialect.mm_table(name)


def _age_last_refresh(cl: TestCluster, puller: str, source: str, seconds: float) -> None:
    """`puller` last refreshed from `source` `seconds` ago (it is up, its refresher is not running)."""
    _exec(
        cl, puller, f"UPDATE {_mm(cl, puller, '_mm_links')} SET last_success_at = ? WHERE peer = ?", (_iso_ago(seconds), source)
    )


def _log(cl: TestCluster, site: str) -> int:
    return int(api.status(cl.topo)["sites"][site]["tables"]["stock"]["log"])


def _three_sites_s3_behind(backend: Backend, tmp: Path) -> TestCluster:
    """s1, s2, s3 (a mesh); s3 pulled s1's first 3 rows, s2 all 6."""
    cl = make_cluster(backend, tmp, ["s1", "s2", "s3"], STOCK)
    for i in range(3):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"a{i}", i))
    cl.refresh_until_quiet()
    for i in range(3):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"b{i}", i))
    cl.refresh("s2", "s1")
    return cl


def test_a_live_peer_that_has_not_refreshed_for_longer_than_the_retention_keeps_its_entries(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s3 is up (its database answers) but last refreshed from s1 two hours ago (its daemon is
    stopped): a purge with a one-hour retention keeps every entry s3 has not pulled (before
    session 35 it was 'expired' and s1 purged them: s3's link failed for good, exit 0)."""
    cl = _three_sites_s3_behind(backend, tmp_path)
    topo = str(cl.topo.path)
    _age_last_refresh(cl, "s3", "s1", HOURS_AGO_2)
    r = mm("purge", "-t", topo, "--retention", "1h", "--min-age", "0s", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = {x["site"]: x for x in json.loads(r.stdout)}
    assert rep["s1"]["expired"] == []
    assert rep["s1"]["tables"]["stock"]["held_by"] == ["s3"]
    assert rep["s1"]["tables"]["stock"]["purged"] <= 3  # at most what s3 pulled, never the three it has not
    s3 = [p for p in rep["s1"]["pullers"] if p["peer"] == "s3"][0]
    assert s3["reachable"] and not s3["expired"] and s3["away_s"] >= 3600
    assert _log(cl, "s1") >= 3
    # s3's refresher comes back: nothing is missing, no re-instantiation
    r = mm("refresh", "-t", topo, "--site", "s3", "--peer", "s1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert mm("status", "-t", topo).returncode == 0
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s3", "stock")) == 6


def test_a_retention_shorter_than_the_minimum_is_refused(backend, tmp_path):  # type: ignore[no-untyped-def]
    """`--retention 1s` used to give up every peer that had not refreshed in the last second (s3,
    up and pulling, lost s1's changes, exit 0): it is refused, nothing purged."""
    cl = _three_sites_s3_behind(backend, tmp_path)
    topo = str(cl.topo.path)
    time.sleep(1.1)  # the last refresh is more than one second old (no timing is asserted)
    before = _log(cl, "s1")
    r = mm("purge", "-t", topo, "--retention", "1s", "--min-age", "0s")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--retention" in r.stderr and "at least 1h" in r.stderr
    assert _log(cl, "s1") == before
    assert mm("watch", "-t", topo, "--once", "--retention", "10m").returncode == 2
    r = mm("refresh", "-t", topo, "--site", "s3")
    assert r.returncode == 0, r.stdout + r.stderr
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_policy_minimum_retention():  # type: ignore[no-untyped-def]
    from multimaster.ops.purge import MIN_RETENTION

    assert MIN_RETENTION == 3600
    assert PurgePolicy.parse("1h").retention == 3600
    with pytest.raises(ConfigError, match="--retention: 59m is below the minimum"):
        PurgePolicy.parse("59m")
    with pytest.raises(ConfigError, match="retention"):
        PurgePolicy(retention=1)


def test_a_peer_down_past_the_retention_is_given_up_and_told(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s3 cannot be reached: within the retention it holds its entries back (counted from the
    last time a purge reached it, not from its last refresh); past it, it is given up: purge says
    so (exit 1, the commands that bring it back), status exits 1 naming the link and the fix at
    once, and the fix works."""
    cl = _three_sites_s3_behind(backend, tmp_path)
    topo = str(cl.topo.path)
    down = str(unreachable_topology(cl, tmp_path, "s3"))
    # s3 last refreshed from s1 two hours ago, but a purge reached it a moment ago: not down long
    _age_last_refresh(cl, "s3", "s1", HOURS_AGO_2)
    assert mm("purge", "-t", topo, "--site", "s1", "--retention", "1h", "--min-age", "0s").returncode == 0
    r = mm("purge", "-t", down, "--site", "s1", "--retention", "1h", "--min-age", "0s", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)[0]
    assert rep["expired"] == [] and rep["tables"]["stock"]["held_by"] == ["s3"]
    assert mm("status", "-t", topo).returncode == 0
    # two hours pass without s1's purge reaching s3
    pullers = _mm(cl, "s1", "_mm_pullers")
    _exec(
        cl, "s1", f"UPDATE {pullers} SET checked_at = ?, first_seen_at = ? WHERE peer = ?", (_iso_ago(7000), _iso_ago(7000), "s3")
    )
    r = mm("purge", "-t", down, "--site", "s1", "--retention", "1h", "--min-age", "0s")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "'s3'" in r.stderr and "given up" in r.stderr
    assert f"multimaster remove-site -t {down} s3 --force" in r.stderr
    assert f"multimaster add-site -t {down} s3 --from s1 --replace" in r.stderr
    assert _log(cl, "s1") == 1  # s3 no longer held anything back
    # s3 is back: status names the link s1 -> s3 and the fix before any refresh of it ran
    r = mm("status", "-t", topo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "link s1 -> s3" in r.stderr and "purged changes of table 'stock'" in r.stderr
    assert "add-site" in r.stderr and "--replace" in r.stderr
    r = mm("refresh", "-t", topo, "--site", "s3", "--peer", "s1")
    assert r.returncode == 1 and "purged changes" in r.stdout
    # the fix it names
    assert mm("remove-site", "-t", topo, "s3", "--force").returncode in (0, 1)
    r = mm("add-site", "-t", topo, "s3", "--from", "s1", "--replace")
    assert r.returncode == 0, r.stdout + r.stderr
    cl.refresh_until_quiet()
    r = mm("status", "-t", topo)
    assert r.returncode == 0, r.stdout + r.stderr
    cl.assert_converged()
    assert len(cl.rows("s3", "stock")) == 6


def test_the_daemons_purge_job_keeps_what_a_live_peer_has_not_pulled(backend, tmp_path, caplog):  # type: ignore[no-untyped-def]
    """`run --purge-every`: the same rule. s3 is up, its refresher stopped two hours ago; the
    daemons of s1 and s2 purge over and over and keep what s3 has not pulled."""
    import logging

    from multimaster.ops.daemon import Daemon

    cl = _three_sites_s3_behind(backend, tmp_path)
    _age_last_refresh(cl, "s3", "s1", HOURS_AGO_2)
    d = Daemon(cl.topo, ["s1", "s2"], purge_every=0.2, purge_policy=PurgePolicy(retention=3600, min_age=0))
    caplog.set_level(logging.INFO, logger="multimaster")
    d.start()
    try:
        end = time.monotonic() + 60
        while sum(1 for x in caplog.records if x.getMessage().startswith("purge site=s1")) < 3:
            assert time.monotonic() < end, "the purge job did not run"
            time.sleep(0.05)
    finally:
        d.stop()
    runs = [x.getMessage() for x in caplog.records if x.getMessage().startswith("purge site=s1")]
    assert not any("expired=s3" in m for m in runs), runs
    assert _log(cl, "s1") >= 3
    cl.refresh("s3", "s1")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s3", "stock")) == 6


def test_the_daemon_tells_a_given_up_peer_once_as_an_error_with_the_commands(backend, tmp_path, caplog):  # type: ignore[no-untyped-def]
    """`run --purge-every`: s3 cannot be reached and has been down for two hours. The daemon of s1
    and s2 purges over and over; s1 gives s3 up, a loss of replication: it is logged once at ERROR
    (not at every purge), with the commands that bring s3 back. (Before, only the purge job's INFO
    line carried `expired=s3`, at every run.) When s3 answers again, that is logged once too."""
    import logging

    from multimaster.config.topology import load_topology
    from multimaster.ops.daemon import Daemon

    cl = _three_sites_s3_behind(backend, tmp_path)
    down = unreachable_topology(cl, tmp_path, "s3")
    _age_last_refresh(cl, "s3", "s1", HOURS_AGO_2)
    assert mm("purge", "-t", str(cl.topo.path), "--site", "s1", "--retention", "1h", "--min-age", "0s").returncode == 0
    pullers = _mm(cl, "s1", "_mm_pullers")
    _exec(
        cl, "s1", f"UPDATE {pullers} SET checked_at = ?, first_seen_at = ? WHERE peer = ?", (_iso_ago(7000), _iso_ago(7000), "s3")
    )
    caplog.set_level(logging.INFO, logger="multimaster")

    def purges(n: int) -> None:
        start = len(caplog.records)
        end = time.monotonic() + 60
        while sum(1 for x in caplog.records[start:] if x.getMessage().startswith("purge site=s1")) < n:
            assert time.monotonic() < end, "the purge job did not run"
            time.sleep(0.05)

    d = Daemon(load_topology(down), ["s1", "s2"], purge_every=0.2, purge_policy=PurgePolicy(retention=3600, min_age=0))
    d.start()
    try:
        purges(3)
        given_up = [x for x in caplog.records if x.getMessage().startswith("purge site=s1") and "expired=s3" in x.getMessage()]
        assert len(given_up) >= 3
        # s3 answers again (the file edited back, taken by the running daemon)
        down.write_text(Path(str(cl.topo.path)).read_text())
        assert d.reload() is True
        purges(3)
    finally:
        d.stop()
    told = [x for x in caplog.records if x.getMessage().startswith("given_up ")]
    assert len(told) == 2, [x.getMessage() for x in told]
    assert told[0].levelno == logging.ERROR
    msg = told[0].getMessage()
    assert "site=s1" in msg and "peer=s3" in msg and "given up by 's1'" in msg
    assert f"multimaster remove-site -t {down} s3 --force" in msg
    assert f"multimaster add-site -t {down} s3 --from s1 --replace" in msg
    assert told[1].levelno == logging.WARNING and "peer=s3" in told[1].getMessage()
    assert "no longer given up" in told[1].getMessage() and "multimaster status" in told[1].getMessage()


def test_a_pending_puller_that_answers_is_never_given_up(sqlite_backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """add-site of s3 on its host, s1 reached through its agent: s1 is left pending (its snapshot of
    s3 is made on its host). s3's purge reaches s1's agent, which answers: s1 holds no watermark of
    s3 yet, it needs every entry from position 0. Two hours later it is still pending, and s3's
    purge keeps every entry (before, s1 counted as unreachable: given up, s3's entries purged, and
    s1, connected, never got s3's rows)."""
    from test_add_site_agent import TOKENS, grow, host_file
    from test_agent import TOKEN, running_agent

    from multimaster.config.topology import load_topology
    from multimaster.ops.instantiate import add_site, connect_site
    from multimaster.ops.purge import purge

    monkeypatch.setenv("MM_AGENT_TOKEN", TOKEN)
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, site_settings=TOKENS)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('a', 1)")
    cl.refresh_until_quiet()
    big = grow(cl, tmp_path, ["s3"], sqlite_backend)
    with running_agent(big.topo, "s1") as url:
        here = load_topology(host_file(tmp_path, "s3.yaml", {"s1": url}))
        rep = add_site(here, "s3", "s1")
        assert [p["site"] for p in rep.pending] == ["s1"]
        for i in range(3):
            big.execute("s3", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"c{i}", i))
        big.refresh("s2", "s3")
        policy = PurgePolicy(retention=3600, min_age=0)
        first = purge(here, "s3", policy)[0]
        assert not first.error, first.error
        # two hours pass, s1 still pending
        with api.Cluster(big.topo) as c, c.site("s3").write() as conn:
            conn.exec_driver_sql(
                f"UPDATE {c.site('s3').dialect.mm_table('_mm_pullers')} SET checked_at = ?, first_seen_at = ? WHERE peer = ?",
                (_iso_ago(7000), _iso_ago(7000), "s1"),
            )
        later = purge(here, "s3", policy)[0]
        assert not later.error, later.error
        assert later.expired == [] and later.given_up == []
        s1 = [p for p in later.pullers if p.peer == "s1"]
        assert s1 and all(p.reachable and not p.expired and p.watermark == 0 for p in s1)
        assert later.tables["stock"].held_by == ["s1"] and later.tables["stock"].purged == 0
    # s1 connected on its host: it gets every row s3 wrote
    r = connect_site(big.topo, "s3", ["s1"])
    assert r.connected == ["s1"]
    big.refresh_until_quiet()
    big.assert_converged()
    assert len(big.rows("s1", "stock")) == 4
