"""Read-only (pull-only) sites (docs/topologies.md "Read-only sites"): a site marked `read_only`
receives every change, no link pulls from it, and its triggers refuse applications' writes to the
replicated tables while the reconciler's applies pass. Driven through the CLI, applications
writing with plain DB-API clients, on every database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, TestCluster, make_cluster
from typer.testing import CliRunner

from multimaster.cli import app
from multimaster.dialects.base import read_only_message

ITEMS = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def mm(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _set_read_only(path: Path, on: bool, site: str = "r1") -> None:
    doc = yaml.safe_load(path.read_text())
    doc["sites"][site]["read_only"] = on
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _refused(cl: TestCluster, site: str, sql: str) -> str:
    """Run `sql` at `site` as an application; return the database's error (it must fail)."""
    try:
        cl.execute(site, sql)
    except Exception as e:  # noqa: BLE001 - each driver has its own error class
        return str(e)
    raise AssertionError(f"{sql!r} was not refused at {site}")


def test_a_read_only_site_receives_everything_and_refuses_local_writes(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "r1"], ITEMS, init=False)
    topo = tmp_path / "topology.yaml"
    t = str(topo)
    _set_read_only(topo, True)
    shown = mm("topology", "show", "-t", t, "--json")
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.stdout)
    assert view["read_only"] == ["r1"] and not [ln for ln in view["links"] if ln["from"] == "r1"]
    assert sorted(ln["from"] for ln in view["links"] if ln["to"] == "r1") == ["s1", "s2"]
    run = mm("init", "-t", t)
    assert run.exit_code == 0, run.output
    message = read_only_message("r1", "items")
    assert message in _refused(cl, "r1", "INSERT INTO items (name, qty) VALUES ('local', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('b', 2)")
    run = mm("refresh", "-t", t, "--until-quiet")
    assert run.exit_code == 0, run.output
    cl.execute("s2", "UPDATE items SET qty = 5 WHERE name = 'a'")
    cl.execute("s1", "DELETE FROM items WHERE name = 'b'")
    assert mm("refresh", "-t", t, "--until-quiet").exit_code == 0
    assert cl.rows("r1", "items") == cl.rows("s1", "items") == cl.rows("s2", "items") == [(1, "a", 5)]
    assert message in _refused(cl, "r1", "UPDATE items SET qty = 7")
    assert message in _refused(cl, "r1", "DELETE FROM items")
    st = mm("status", "-t", t, "--json")
    assert st.exit_code == 0, st.output
    status = json.loads(st.stdout)
    assert status["sites"]["r1"]["read_only"] and status["converging"]
    assert not [ln for ln in status["links"] if ln["from"] == "r1"]
    assert "no site pulls from 'r1' (it is read-only)" in mm("grants", "-t", t, "--site", "r1").stdout
    pg = mm("purge", "-t", t, "--json", "--min-age", "0s")
    assert pg.exit_code == 0, pg.output
    purged = {r["site"]: r for r in json.loads(pg.stdout)}
    assert all(r["error"] is None for r in purged.values())
    # r1's watermarks of s1 count at s1; nothing waits for a watermark of r1's own log
    assert "r1" in purged["s1"]["tables"]["items"]["held_by"] and not purged["r1"]["pullers"]

    # made writable: init drops the guard, r1's writes replicate
    _set_read_only(topo, False)
    assert mm("init", "-t", t).exit_code == 0
    cl.execute("r1", "INSERT INTO items (name, qty) VALUES ('from r1', 3)")
    if backend.name == "sqlite":  # (the check reads bookkeeping the same way on every database)
        # read-only again before its change left: refused, naming the site that has not pulled it
        _set_read_only(topo, True)
        run = mm("init", "-t", t)
        assert run.exit_code == 2 and "site 'r1' is read_only now, but site 's1' has not pulled 1 change(s)" in run.stderr
        _set_read_only(topo, False)
    assert mm("refresh", "-t", t, "--until-quiet").exit_code == 0
    assert [r[1] for r in cl.rows("s1", "items")] == ["a", "from r1"]
    _set_read_only(topo, True)
    run = mm("init", "-t", t)
    assert run.exit_code == 0, run.output
    assert message in _refused(cl, "r1", "INSERT INTO items (name, qty) VALUES ('local', 1)")
    cl.execute("s1", "UPDATE items SET qty = 9 WHERE name = 'from r1'")
    assert mm("refresh", "-t", t, "--until-quiet").exit_code == 0
    cl.assert_converged()


@pytest.mark.parametrize(
    "links, sites, problem",
    [
        (
            [{"from": "s1", "to": "r1"}, {"from": "r1", "to": "s1"}],
            {"r1": True},
            "links[1]: link r1 -> s1 pulls from site 'r1', which is read_only (sites.r1.read_only)",
        ),
        ({"star": "r1"}, {"r1": True}, "links.star: the hub 'r1' is read_only"),
        ({"chain": ["s1", "r1", "s2"]}, {"r1": True}, "links: site 's2' never receives changes from ['s1']"),
        ("mesh", {"s1": True, "r1": True}, "sites: every site is read_only"),
    ],
)
def test_topologies_a_read_only_site_breaks_are_refused(tmp_path: Path, links: Any, sites: dict[str, bool], problem: str) -> None:
    doc: dict[str, Any] = {
        "sites": {s: {"url": f"sqlite:///{s}.db", **({"read_only": True} if sites.get(s) else {})} for s in ("s1", "r1")},
        "tables": {"items": {"key": "id"}},
        "links": links,
    }
    if "s2" in json.dumps(links):
        doc["sites"]["s2"] = {"url": "sqlite:///s2.db"}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    run = mm("topology", "show", "-t", str(path))
    assert run.exit_code == 2, run.output
    assert str(path) in run.stderr and problem in run.stderr, run.stderr


def test_the_daemon_of_a_read_only_site(sqlite_backend: Backend, tmp_path: Path) -> None:
    """`multimaster run --site r1`: refreshes r1 from the writable sites and purges it."""
    import time

    from multimaster.ops.daemon import Daemon

    links = [
        {"from": a, "to": b, "interval": "100ms", "jitter": 0}
        for a, b in (("s1", "s2"), ("s2", "s1"), ("s1", "r1"), ("s2", "r1"))
    ]
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "r1"], ITEMS, links=links, site_settings={"r1": {"read_only": True}})
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    d = Daemon(cl.topo, ["r1"], purge_every=0.2)
    d.start()
    try:
        end = time.monotonic() + 30
        while not (cl.rows("r1", "items") and d.stats.purged) and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        d.stop()
    assert cl.rows("r1", "items") == [(1, "a", 1)] and d.stats.purged
