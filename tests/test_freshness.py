"""Freshness for callers (docs/cli.md "Freshness: token and wait"): a writer takes a token at its
site, a reader waits until the token's changes are visible at other sites, through the CLI as a
user runs it, applications writing with plain DB-API clients. The reader's site is read-only and
receives the writer's changes relayed by a third site."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from clusters import Backend, make_cluster
from typer.testing import CliRunner

from multimaster import api
from multimaster.cli import app

ITEMS = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
# r1 pulls only from s2: changes of s1 reach it relayed by s2
LINKS = [{"from": "s1", "to": "s2"}, {"from": "s2", "to": "s1"}, {"from": "s2", "to": "r1"}]


def mm(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_token_and_wait(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(
        backend, tmp_path, ["s1", "s2", "r1"], ITEMS, links=LINKS, init=False, site_settings={"r1": {"read_only": True}}
    )
    assert cl.topo.read_only == {"r1"}
    t = str(tmp_path / "topology.yaml")
    assert mm("init", "-t", t).exit_code == 0

    # a site that wrote nothing: nothing to wait for
    run = mm("token", "-t", t, "--site", "s1")
    assert run.exit_code == 0, run.output
    empty = run.stdout.strip()
    assert empty.endswith(":s1") and len(empty) == 22
    assert mm("wait", "-t", t, "--token", empty, "--sites", "s2,r1", "--timeout", "0").exit_code == 0

    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('b', 2)")
    tok = mm("token", "-t", t, "--site", "s1").stdout.strip()
    assert tok > empty
    # nobody pulled yet: the deadline passes, each site named with what it lacks
    run = mm("wait", "-t", t, "--token", tok, "--sites", "s2,r1", "--timeout", "0.3")
    assert run.exit_code == 1, run.output
    assert "timed out" in run.stderr and "behind: s2: 2 change(s) of s1 not applied yet (items 2)" in run.stderr
    assert "behind: r1: 2 change(s) of s1 not applied yet" in run.stderr

    # s2 pulls: one of two is enough with --k 1; both are not, and only r1 is behind
    assert mm("refresh", "-t", t, "--site", "s2").exit_code == 0
    run = mm("wait", "-t", t, "--token", tok, "--sites", "s2,r1", "--k", "1", "--json")
    assert run.exit_code == 0, run.output
    run = mm("wait", "-t", t, "--token", tok, "--sites", "s2,r1", "--timeout", "0.2")
    assert run.exit_code == 1 and "behind: r1:" in run.stderr and "behind: s2" not in run.stderr, run.stderr

    # a wait in progress returns once the refresh that brings the changes (relayed by s2) is done
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(api.wait_visible(cl.topo, tok, ["r1"], timeout=30)))
    waiter.start()
    time.sleep(0.2)
    assert mm("refresh", "-t", t, "--site", "r1").exit_code == 0
    waiter.join()
    assert got[0].met and got[0].visible == ["r1"] and got[0].waited_s < 30
    run = mm("wait", "-t", t, "--token", tok, "--sites", "s2,r1")
    assert run.exit_code == 0 and "visible at s2, r1" in run.stdout, run.output
    assert [r[1] for r in cl.rows("r1", "items")] == ["a", "b"]

    # bad input: exit 2, named
    for args, text in (
        (["--token", "12:s1"], "is not a token"),
        (["--token", tok.replace(":s1", ":zz")], "the token's site 'zz' is not defined"),
        (["--token", tok, "--sites", "s2,s9"], "site 's9' is not defined"),
        (["--token", tok, "--sites", "s2", "--k", "2"], "--k: 2 is not between 1 and"),
    ):
        run = mm("wait", "-t", t, *args)
        assert run.exit_code == 2 and text in run.stderr, (args, run.output)
    run = mm("token", "-t", t, "--site", "s9")
    assert run.exit_code == 2 and "site 's9' is not defined" in run.stderr
