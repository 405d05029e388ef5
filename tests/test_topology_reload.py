"""A running daemon takes an edit of its topology file (docs/operations.md "Editing the topology
file"); a table one site of a link does not replicate blocks only itself, with both fixes named;
`status` names a link whose last refresh failed for a reason that needs action at once. The
daemon runs as a user runs it (a subprocess); waits poll for a state with a generous deadline."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, make_cluster, mm, mm_process
from test_daemon import Proc, wait_for

from multimaster import api
from multimaster.config.topology import load_topology

TABLES = {
    "items": {"key": "id", "columns": {"name": "text"}},
    "logs": {"key": "id", "columns": {"msg": "text"}},
}
FAST = {"refresh": {"interval": "100ms", "jitter": 0, "follow_every": "off"}}


@pytest.fixture
def procs() -> Any:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def _edit(path: Path, change: Any) -> None:
    """Change the topology file as an operator does: read, change, write it whole at once."""
    doc = yaml.safe_load(path.read_text())
    change(doc)
    tmp = path.with_suffix(".new")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)


def _names(cl: Any, site: str, table: str = "items") -> set[str]:
    return {r[1] for r in cl.rows(site, table)}


def _events(d: Proc, event: str) -> list[dict[str, Any]]:
    return [e for e in d.events() if e.get("event") == event]


def test_a_running_daemon_takes_edits_of_its_topology_file(sqlite_backend: Backend, tmp_path: Path, procs: Any) -> None:
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TABLES, settings=FAST)
    path, topo = tmp_path / "topology.yaml", str(tmp_path / "topology.yaml")
    d = Proc(tmp_path, path)  # every site
    procs.append(d)
    wait_for(lambda: d.has("started"), "the daemon to start")

    # stop replicating logs as docs/schema-changes.md says: the file first, then uninstall
    _edit(path, lambda doc: doc["tables"].pop("logs"))
    wait_for(lambda: d.has("topology_reloaded", tables_removed="logs"), "the daemon to take the edit")
    r = mm("uninstall", "-t", topo, "--table", "logs")
    assert r.returncode == 0, r.stdout + r.stderr
    cl.execute("s1", "INSERT INTO items (name) VALUES ('after the uninstall')")
    wait_for(lambda: "after the uninstall" in _names(cl, "s2"), "items to go on replicating")
    r = mm_process("status", "-t", topo)
    assert r.returncode == 0, r.stdout + r.stderr

    # a broken edit: logged with every problem, the daemon keeps the topology it had
    _edit(path, lambda doc: doc.setdefault("refresh", {}).update(batch_size=0, max_clock_offset="2s", clock_warn="3s"))
    wait_for(lambda: d.has("topology_refused"), "the broken edit to be refused")
    refused = _events(d, "topology_refused")[-1]
    assert any("batch_size" in p for p in refused["problems"]), refused
    assert any("clock_warn" in p for p in refused["problems"]), refused
    assert "keeping" in refused and "error" in refused
    cl.execute("s1", "INSERT INTO items (name) VALUES ('while the file is broken')")
    wait_for(lambda: "while the file is broken" in _names(cl, "s2"), "items to replicate on the last good topology")
    assert len(_events(d, "topology_refused")) == 1  # logged once, not at every look

    # the fix, adding a table: taken; until init ran, only the new table's part of each link fails
    for s in ("s1", "s2"):
        cl.execute(s, "CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT)")
    cl.tables["notes"] = {"key": "id", "columns": {"body": "text"}}

    def add_notes(doc: dict[str, Any]) -> None:
        doc["refresh"] = FAST["refresh"]
        doc["tables"]["notes"] = {"key": "id"}

    _edit(path, add_notes)
    wait_for(lambda: d.has("topology_reloaded", tables_added="notes"), "the daemon to take the fixed file")
    wait_for(
        lambda: any("['notes']" in (e.get("error") or "") for e in _events(d, "refresh")), "a link to name the missing table"
    )
    err = next(e["error"] for e in _events(d, "refresh") if "['notes']" in (e.get("error") or ""))
    assert "its other tables were" in err and "run 'multimaster init -t FILE'" in err, err
    assert "remove them from tables:" in err, err
    cl.execute("s1", "INSERT INTO items (name) VALUES ('before init')")
    wait_for(lambda: "before init" in _names(cl, "s2"), "items to replicate while notes is not installed")
    r = mm_process("status", "-t", topo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "has no replication objects for table(s) ['notes']" in r.stderr, r.stderr
    assert "run 'multimaster init -t FILE'" in r.stderr, r.stderr

    r = mm("init", "-t", topo)
    assert r.returncode == 0, r.stdout + r.stderr
    cl.execute("s2", "INSERT INTO notes (body) VALUES ('a note')")
    wait_for(lambda: _names(cl, "s1", "notes") == {"a note"}, "the new table to replicate after init")
    wait_for(lambda: mm_process("status", "-t", topo).returncode == 0, "status to exit 0 once every link refreshes")

    # a change of the daemon's own site: refused, naming the restart
    _edit(path, lambda doc: doc["sites"]["s2"].update(url=doc["sites"]["s2"]["url"] + "?timeout=5"))
    wait_for(lambda: len(_events(d, "topology_refused")) == 2, "the edit of an own site to be refused")
    refused = _events(d, "topology_refused")[-1]
    assert "restart the daemon" in refused["error"] and any("'s2'" in p for p in refused["problems"]), refused

    # SIGHUP reads the file at once (here refused again: it still changes s2's url)
    d.p.send_signal(signal.SIGHUP)
    wait_for(lambda: len(_events(d, "topology_refused")) == 3, "SIGHUP to read the file again")
    assert d.stop() == 0


def test_a_table_a_site_no_longer_replicates_blocks_only_itself(backend: Backend, tmp_path: Path) -> None:
    """A refresher reading a copy of the file that still lists a table `uninstall --table` stopped:
    the other tables go on, the link's error names the table with both fixes, `status` exits 1 at
    once (not after stall_after) and 0 again once a refresh with the edited file succeeded."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    path, topo = tmp_path / "topology.yaml", str(tmp_path / "topology.yaml")
    stale = load_topology(path)
    _edit(path, lambda doc: doc["tables"].pop("logs"))
    r = mm("uninstall", "-t", topo, "--table", "logs", "--site", "s2")
    assert r.returncode == 0, r.stdout + r.stderr

    cl.execute("s1", "INSERT INTO items (name) VALUES ('a')")
    cl.execute("s2", "INSERT INTO items (name) VALUES ('b')")
    results = api.refresh(stale)
    assert _names(cl, "s1") == _names(cl, "s2") == {"a", "b"}
    for res in results:
        assert res.error is not None and "table(s) ['logs'] not refreshed on this link" in res.error, res.error
        assert "site 's2' has no replication objects for table(s) ['logs']" in res.error
        assert "run 'multimaster init -t FILE'" in res.error and "remove them from tables:" in res.error
    assert sum(res.applied for res in results) == 2

    r = mm("status", "-t", topo, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    failing = json.loads(r.stdout)["failing"]
    assert len(failing) == 2 and all("failing: its last refresh" in f and "['logs']" in f for f in failing), failing
    links = json.loads(r.stdout)["links"]
    assert all(ln["last_error"].startswith("needs action: ") for ln in links), links

    results = api.refresh(load_topology(path))
    assert [res.error for res in results] == [None, None]
    r = mm("uninstall", "-t", topo, "--table", "logs", "--site", "s1")  # (status names it until then)
    assert r.returncode == 0, r.stdout + r.stderr
    r = mm("status", "-t", topo)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_link_failing_for_a_passing_reason_is_named_after_stall_after_only(sqlite_backend: Backend, tmp_path: Path) -> None:
    """A failure that passes on its own (here a peer's database file gone for a moment) is not a
    `needs action` one: status keeps its grace (the link was refreshed before)."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], {"items": TABLES["items"]})
    topo = str(tmp_path / "topology.yaml")
    api.refresh(cl.topo)
    db = Path(cl.topo.sites["s1"].url.removeprefix("sqlite:///"))
    away = db.with_suffix(".away")
    db.rename(away)
    try:
        res = api.refresh(load_topology(topo), site="s2")
        assert res[0].error is not None
    finally:
        away.rename(db)
    r = mm("status", "-t", topo, "--json")
    links = {(ln["from"], ln["to"]): ln for ln in json.loads(r.stdout)["links"]}
    assert links[("s1", "s2")]["last_error"] and not links[("s1", "s2")]["last_error"].startswith("needs action")
    assert r.returncode == 0, r.stdout + r.stderr
