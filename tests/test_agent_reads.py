"""Reads through site agents (docs/agent.md "What works through an agent"): `token` and `wait`
(ops/freshness.py), the `errors` and `conflicts` listings. Each read is the function a direct read
runs, run by the agent at its site: the answers equal the direct reads, on SQLite and PostgreSQL
(and MariaDB for the listings); an agent that is down or refuses is named; writes stay on the
site's host (AgentOnly)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from clusters import Backend, TestCluster, make_cluster, mm, opened
from test_agent import running_agent
from test_error_queue import reject_negative_qty

from multimaster import api
from multimaster.config.topology import Topology, load_topology
from multimaster.engine.remote import AgentSite
from multimaster.errors import AgentError, AgentOnly
from multimaster.ops.freshness import applied_at, missing_at, need_at

TOKEN = "agent-reads-token-0123456789"
ITEMS = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
TABLES = {
    "items": {"key": "id", "columns": {"name": "text", "qty": "int", "price": "decimal", "at": "timestamp"}},
    "notes": {"key": "id", "columns": {"body": "text"}},
}
AGENTS = {"s1": {"token": "${MM_READS_TOKEN}"}, "s2": {"token": "${MM_READS_TOKEN}"}}


def _cli(*args: str, check: bool = True) -> Any:
    """A `multimaster` command in this process (clusters.mm: what these tests check is the reads
    through the agents, not the command's process; tests/test_agent.py runs it as a subprocess);
    `check`: it must exit 0."""
    r = mm(*args)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_READS_TOKEN", TOKEN)


@pytest.fixture(params=["sqlite", "postgresql"])
def lite_or_pg(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from opened(request.param)


@contextlib.contextmanager
def agents(topo: Topology, *sites: str) -> Iterator[dict[str, str]]:
    """An agent per site of `sites`; yields their urls."""
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(running_agent(topo, s)) for s in sites}


def _peer(tmp: Path, urls: dict[str, str], name: str = "peer.yaml", token: str = "${MM_READS_TOKEN}") -> Path:
    """The cluster's topology file as a host reaching the sites of `urls` through their agents has it."""
    doc = yaml.safe_load((tmp / "topology.yaml").read_text())
    for s, url in urls.items():
        doc["sites"][s] = {"url": url, "token": token}
    (tmp / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp / name


def _own_newest(cl: TestCluster, site: str, table: str) -> str:
    """The newest version of `site`'s own changes of `table` in its change log (read directly)."""
    with api.Cluster(cl.topo) as c:
        s = c.site(site)
        with s.read() as conn:
            v = conn.exec_driver_sql(
                f"SELECT max(ver) FROM {s.dialect.obj(table).log} WHERE origin = {s.dialect.caps.placeholder}", (site,)
            ).scalar()
    return str(v)


def test_token_and_wait_through_agents(lite_or_pg: Backend, tmp_path: Path) -> None:
    """s1 (the writer) and s2 are reached through their agents, s3 directly: the token is s1's
    as read at s1; a wait before the refresh times out (exit 1) naming each site behind and what
    it lacks (counted at s1, through its agent), and succeeds once they pulled."""
    cl = make_cluster(lite_or_pg, tmp_path, ["s1", "s2", "s3"], ITEMS, site_settings=AGENTS)
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('b', 2)")
    with agents(cl.topo, "s1", "s2") as urls:
        peer = _peer(tmp_path, urls)
        topo = load_topology(peer)
        # (a) the token through the agent: between two direct reads, past the change written before
        before = api.token(cl.topo, "s1")
        via = api.token(topo, "s1")
        after = api.token(cl.topo, "s1")
        assert before <= via <= after and via.endswith(":s1"), (before, via, after)
        assert via >= _own_newest(cl, "s1", "items")
        cli = _cli("token", "-t", str(peer), "--site", "s1").stdout.strip()
        assert via <= cli <= api.token(cl.topo, "s1")
        # each read through an agent is the direct read
        with api.Cluster(cl.topo) as direct, api.Cluster(topo) as remote:
            s1, s2 = remote.site("s1"), remote.site("s2")
            assert isinstance(s1, AgentSite) and isinstance(s2, AgentSite)
            need = need_at(direct.site("s1"), cl.topo, via)
            assert need["items"] == _own_newest(cl, "s1", "items")
            assert s1.need(via) == need
            assert s2.applied_of("s1") == applied_at(direct.site("s2"), "s1") == ({}, {})
            assert s1.missing({}, need) == missing_at(direct.site("s1"), {}, need)
            assert s1.missing({}, need)[0] == {"items": 2}
            refused = "site 's1'.*refused the request: the token is one of site 's3'; this agent serves site 's1'"
            with pytest.raises(AgentError, match=refused):
                s1.need(via.replace(":s1", ":s3"))  # a token of another site: refused, named

        # (b) nobody pulled: a wait through the agents times out, each site named with what it lacks
        run = _cli("wait", "-t", str(peer), "--token", via, "--sites", "s2,s3", "--timeout", "0.3", check=False)
        assert run.returncode == 1, run.stdout + run.stderr
        assert "behind: s2: 2 change(s) of s1 not applied yet (items 2)" in run.stderr, run.stderr
        assert "behind: s3: 2 change(s) of s1 not applied yet (items 2)" in run.stderr, run.stderr
        assert "agent" not in run.stderr  # behind, not unreadable

        cl.refresh("s2", "s1")
        res = api.wait_visible(topo, via, ["s2", "s3"], k=1, timeout=5)
        assert res.met and res.visible == ["s2"]
        cl.refresh("s3", "s1")
        run = _cli("wait", "-t", str(peer), "--token", via, "--sites", "s2,s3", "--timeout", "5")
        assert "visible at s2, s3" in run.stdout, run.stdout

        # a wait in progress returns once the refresh bringing the change is done
        cl.execute("s1", "UPDATE items SET qty = 3 WHERE name = 'a'")
        tok = api.token(topo, "s1")
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(api.wait_visible(topo, tok, ["s2"], timeout=30)))
        waiter.start()
        time.sleep(0.3)
        assert not got
        cl.refresh("s2", "s1")
        waiter.join()
        assert got[0].met and got[0].visible == ["s2"] and got[0].waited_s < 30

        # a token of a site reached directly (s3), waited for at the agent-sites
        cl.execute("s3", "INSERT INTO items (name, qty) VALUES ('c', 4)")
        t3 = api.token(topo, "s3")
        res = api.wait_visible(topo, t3, ["s1", "s2"], timeout=0.2)
        behind = [(b.site, sum(b.missing.values()), b.error) for b in res.behind]
        assert not res.met and behind == [("s1", 1, None), ("s2", 1, None)]
        cl.refresh("s1", "s3")
        cl.refresh("s2", "s3")
        assert api.wait_visible(topo, t3, ["s1", "s2"], timeout=5).met


def test_an_agent_down_or_refusing_during_wait_is_named(sqlite_backend: Backend, tmp_path: Path) -> None:
    """A waited-at site whose agent is down is behind with an error naming the site and its agent
    (exit 1), the others are still read; an agent refusing the token fails the read that needs it,
    naming both."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], ITEMS, site_settings=AGENTS)
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.refresh("s3", "s1")
    with agents(cl.topo, "s1", "s2") as urls:
        tok = api.token(cl.topo, "s1")
        with agents(cl.topo, "s2") as again:
            peer = _peer(tmp_path, {"s1": urls["s1"], "s2": again["s2"]})
        # s2's agent is gone; s1's answers
        run = _cli("wait", "-t", str(peer), "--token", tok, "--sites", "s2,s3", "--timeout", "0.5", "--json", check=False)
        assert run.returncode == 1, run.stdout + run.stderr
        out = json.loads(run.stdout)
        assert 0.5 <= out["waited_s"] < 3, out
        assert out["visible"] == ["s3"] and [b["site"] for b in out["behind"]] == ["s2"]
        error = out["behind"][0]["error"]
        assert "site 's2'" in error and again["s2"] in error and "cannot be reached" in error, error
        run = _cli("wait", "-t", str(peer), "--token", tok, "--sites", "s2,s3", "--timeout", "0.2", check=False)
        assert run.returncode == 1 and f"behind: s2: site 's2' (agent {again['s2']})" in run.stderr, run.stderr

        # a wrong token: s2's agent refuses it, s2 is behind, named; s1's refuses it, the wait fails, named
        wrong = load_topology(_peer(tmp_path, {"s2": urls["s2"]}, "wrong2.yaml", token="not-the-token-of-any-agent"))
        res = api.wait_visible(wrong, tok, ["s2", "s3"], timeout=0.1)
        (b,) = res.behind
        assert b.site == "s2" and b.error and "refused the token" in b.error and urls["s2"] in b.error, b.error
        assert "not-the-token" not in b.error and res.visible == ["s3"]
        wrong1 = str(_peer(tmp_path, {"s1": urls["s1"]}, "wrong1.yaml", token="not-the-token-of-any-agent"))
        for args in (["wait", "-t", wrong1, "--token", tok, "--sites", "s3"], ["token", "-t", wrong1, "--site", "s1"]):
            run = _cli(*args, check=False)
            assert run.returncode == 1, run.stdout + run.stderr
            assert f"site 's1' (agent {urls['s1']}): the agent refused the token" in run.stderr, run.stderr
            assert "not-the-token" not in run.stderr


def _held_and_conflicts(cl: TestCluster) -> None:
    """s2 holds changes of s1 it rejects (one failed, one waiting behind it); both sites logged
    conflicts of items and of notes."""
    cl.execute("s1", "INSERT INTO items (name, qty, price, at) VALUES ('apple', 1, '1.50', '2024-02-29 23:59:58.123456')")
    cl.execute("s1", "INSERT INTO items (name, qty, price, at) VALUES ('pear', 2, '2.25', '2024-03-01 00:00:00')")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('hello')")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET name = 'nuts', price = '9.99' WHERE name = 'pear'")
    cl.execute("s2", "UPDATE items SET name = 'screws', price = '8.88' WHERE name = 'pear'")
    cl.execute("s1", "UPDATE notes SET body = 'one' WHERE id = 1")
    cl.execute("s2", "DELETE FROM notes WHERE id = 1")
    cl.refresh_until_quiet()
    reject_negative_qty(cl, "s2")
    cl.execute("s1", "UPDATE items SET qty = -5 WHERE name = 'apple'")
    cl.execute("s1", "UPDATE items SET name = 'green apple', price = '1.75' WHERE name = 'apple'")
    cl.refresh_until_quiet()


def test_errors_and_conflicts_listed_through_an_agent(backend: Backend, tmp_path: Path) -> None:
    """The error queue and the conflict log of s2, read through its agent, are what they are read
    directly (values typed alike), with every filter; a wait counts what s2 holds through the
    agent; writes at s2 (errors retry and skip, conflicts --apply) stay on its host."""
    if backend.name == "mysql":
        pytest.skip("the listings cross the wire as PostgreSQL's typed values do; kept lean")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES, site_settings={"s2": AGENTS["s2"]})
    _held_and_conflicts(cl)
    direct = cl.topo
    with agents(cl.topo, "s2") as urls:
        peer = _peer(tmp_path, urls)
        topo = load_topology(peer)
        held = api.list_errors(direct, "s2")
        assert [(h["state"], h["op"]) for h in held] == [("failed", "U"), ("waiting", "U")], held
        assert held[1]["change"]["values"]["name"] == "green apple"
        for site in (None, "s2"):
            for table in (None, "items", "notes"):
                assert api.list_errors(topo, site, table) == api.list_errors(direct, site, table)
        logged = api.conflicts(direct, "s2")
        assert {(r["tbl"], r["kind"]) for r in logged} >= {("items", "update_update"), ("notes", "update_delete")}
        assert any(r["local_row"] and r["local_row"].get("name") == "screws" for r in logged), logged
        for kw in ({}, {"site": "s2"}, {"table": "notes"}, {"kind": "update_update"}, {"limit": 1}, {"limit": 0}):
            assert api.conflicts(topo, **kw) == api.conflicts(direct, **kw), kw
        assert api.conflicts(topo, since="2999-01-01T00:00:00") == []
        # the CLI as a user runs it
        for args in (
            ["errors", "--json"],
            ["errors", "--site", "s2", "--table", "items", "--json"],
            ["errors", "--limit", "1", "--offset", "1", "--json"],  # a page: the agent's queue is paged here
            ["conflicts", "--json"],
        ):
            a = _cli(args[0], "-t", str(peer), *args[1:], check=False)
            b = _cli(args[0], "-t", str(tmp_path / "topology.yaml"), *args[1:], check=False)
            assert json.loads(a.stdout) == json.loads(b.stdout), args
            # `errors` exits 1 while changes are held (docs/cli.md "Exit codes"), through the agent too
            assert a.returncode == b.returncode == (1 if args[0] == "errors" else 0), (args, a.stderr, b.stderr)
            assert a.stderr == b.stderr, args  # the page's place, counted the same
        # a page of conflicts: the same rows; the agent's site is counted as far as it was read
        a = _cli("conflicts", "-t", str(peer), "--limit", "1", "--offset", "1", "--json")
        b = _cli("conflicts", "-t", str(tmp_path / "topology.yaml"), "--limit", "1", "--offset", "1", "--json")
        assert json.loads(a.stdout) == json.loads(b.stdout) and len(json.loads(a.stdout)) == 1
        assert "conflicts 2-2 of " in a.stderr and "+ shown" in a.stderr and "or more older" in a.stderr, a.stderr
        assert "conflicts 2-2 of " in b.stderr and "+" not in b.stderr, b.stderr
        table = mm("errors", "-t", str(peer))  # a wide terminal
        assert table.returncode == 1 and "waiting behind" in table.stdout and "green apple" in table.stdout, table.stdout
        dry = api.re_resolve_conflicts(topo, "earliest", table="items")
        assert dry == api.re_resolve_conflicts(direct, "earliest", table="items") and dry["outcomes"]

        # a wait reads what s2 holds through its agent
        tok = api.token(direct, "s1")
        res = api.wait_visible(topo, tok, ["s2"], timeout=0.1)
        assert not res.met and res.behind[0].held == 2 and res.behind[0].error is None
        (b,) = api.wait_visible(direct, tok, ["s2"], timeout=0.1).behind
        assert res.behind[0].as_dict() | {"lag_s": None} == b.as_dict() | {"lag_s": None}

        # (e) writes stay on the site's host, with their messages; nothing changed
        failed = held[0]["id"]
        with pytest.raises(AgentOnly, match="site 's2' is reached through its agent"):
            api.retry_errors(topo, "s2", all_=True)
        with pytest.raises(AgentOnly, match="site 's2' is reached through its agent"):
            api.skip_error(topo, failed, "typo", site="s2")
        with pytest.raises(AgentOnly, match="site 's2' is reached through its agent.*conflicts --apply"):
            api.re_resolve_conflicts(topo, "earliest", table="items", apply=True, at="s2")
        run = _cli("errors", "retry", "-t", str(peer), "--site", "s2", "--all", check=False)
        assert run.returncode == 1 and "reached through its agent" in run.stderr, run.stdout + run.stderr
        assert api.list_errors(direct) == held

        # skipped on the site's host: listed through the agent with --all, its reason too
        api.skip_error(direct, failed, "negative stock is a typo", site="s2")
        every = api.list_errors(direct, include_skipped=True)
        assert any(h["state"] == "skipped" and h["reason"] == "negative stock is a typo" for h in every)
        assert api.list_errors(topo, include_skipped=True) == every
        assert api.list_errors(topo) == api.list_errors(direct) == []
    # s2's agent gone: the listings name it (exit 1) and list s1's all the same
    run = _cli("conflicts", "-t", str(peer), "--json", check=False)
    assert run.returncode == 1 and f"not reached: site 's2' (agent {urls['s2']})" in run.stderr, run.stdout + run.stderr
    assert {r["site"] for r in json.loads(run.stdout)} == {"s1"}
    run = _cli("errors", "-t", str(peer), "--all", "--json", check=False)
    assert run.returncode == 1 and "not reached: site 's2'" in run.stderr and json.loads(run.stdout) == []
