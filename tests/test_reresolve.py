"""`multimaster conflicts --re-resolve --policy P [--apply]` (docs/conflicts.md "Re-resolving
logged conflicts"), end to end through the CLI: two sites update the same row concurrently, the
default rule (latest) decides; a dry run shows that `earliest` would have kept the other value;
--apply writes it at one site as an ordinary update, which replicates to every site; a row changed
since is skipped and reported. The decision itself is tested in tests/core/test_reresolve.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clusters import Backend, make_cluster, mm

TABLES = {
    "items": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}},
    "notes": {"key": "id", "columns": {"body": "text"}},
}


def test_re_resolve_shows_and_applies_another_rule(backend: Backend, tmp_path: Path) -> None:
    if backend.name == "mysql":
        pytest.skip("the same path as PostgreSQL's; kept lean")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = str(tmp_path / "topology.yaml")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('bolts', 10)")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('hello')")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET name = 'nuts', qty = qty - 1 WHERE id = 1")  # earlier
    cl.execute("s2", "UPDATE items SET name = 'screws', qty = qty - 2 WHERE id = 1")  # later: latest keeps it
    cl.execute("s1", "UPDATE notes SET body = 'one' WHERE id = 1")
    cl.execute("s2", "DELETE FROM notes WHERE id = 1")
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == cl.rows("s2", "items") == [(1, "screws", 7)]
    # the dry run: the name conflict (logged at both sites) would go to s1's value; qty was merged
    r = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "earliest", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    by = {(o["table"], o["slot"]): o for o in rep["outcomes"]}
    name = by[("items", "name")]
    assert name["status"] == "change" and len(name["records"]) == 2  # one conflict, seen at both sites
    assert name["logged"]["values"] == {"name": "screws"} and name["logged"]["origin"] == "s2"
    assert name["new"]["values"] == {"name": "nuts"} and name["new"]["origin"] == "s1"
    assert name["logged_rule"] == "latest" and "action" not in name
    assert by[("items", "qty")]["status"] == "skip" and "merged" in by[("items", "qty")]["why"]
    assert by[("notes", None)]["status"] == "skip" and "delete_update" in by[("notes", None)]["why"]
    assert cl.rows("s1", "items") == [(1, "screws", 7)]  # a dry run writes nothing
    table = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "earliest", "--table", "items")
    assert table.returncode == 0 and "would change" in table.stdout and "dry run" in table.stdout
    assert "latest" in mm("conflicts", "-t", topo, "--re-resolve", "--policy", "latest", "--table", "items").stdout
    # --apply: written at s1 (the first site that logged it), replicated by an ordinary refresh
    r = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "earliest", "--table", "items", "--apply", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    done = next(o for o in json.loads(r.stdout)["outcomes"] if o["slot"] == "name")
    assert (done["action"], done["at"]) == ("applied", "s1")
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == cl.rows("s2", "items") == [(1, "nuts", 7)]
    # again: the row no longer holds the logged winner: skipped, reported, exit 1
    r = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "earliest", "--table", "items", "--apply")
    assert r.returncode == 1 and "changed since" in r.stderr, r.stdout + r.stderr
    assert cl.rows("s2", "items") == [(1, "nuts", 7)]


def test_re_resolve_refuses_what_it_cannot_do(sqlite_backend: Backend, tmp_path: Path) -> None:
    make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TABLES)
    topo = str(tmp_path / "topology.yaml")
    r = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "additive")
    assert r.returncode == 2 and "value both started from" in r.stderr
    assert mm("conflicts", "-t", topo, "--re-resolve").returncode == 2
    assert mm("conflicts", "-t", topo, "--apply").returncode == 2
    r = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "latest", "--kind", "orphan")
    assert r.returncode == 2 and "decided by a column policy" in r.stderr


def test_a_write_continued_at_each_site_is_re_resolved_among_the_last_heads(backend: Backend, tmp_path: Path) -> None:
    """`qty: maximum`, s1 sets 5 then 2, s2 sets 3 then 4 (tests/test_heads.py): the heads are 4
    and 2, and 5 and 3 were written over at their own sites. Re-resolved to `minimum`, the logged
    winner is 4 (what both sites hold) and the new one 2, never 3 (which lost nothing but is no
    head any more); each record names the heads it chose among."""
    from test_heads import continued_writes

    cl = continued_writes(backend, tmp_path)
    topo = str(tmp_path / "topology.yaml")
    logged = [c for c in json.loads(mm("conflicts", "-t", topo, "--json").stdout) if c["kind"] == "update_update"]
    assert logged and all(len(c["heads"]) >= 2 for c in logged), logged
    r = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "minimum", "--json")
    assert r.returncode == 0, r.stderr
    [o] = json.loads(r.stdout)["outcomes"]
    assert o["status"] == "change", o
    assert sorted(c["values"]["qty"] for c in o["candidates"]) == [2, 4]
    assert sorted(c["values"]["qty"] for c in o["superseded"]) == [3, 5]
    assert o["logged"]["values"] == {"qty": 4} and o["new"]["values"] == {"qty": 2}
    table = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "minimum")
    assert table.returncode == 0 and "written over" in table.stdout, table.stdout
    r = mm("conflicts", "-t", topo, "--re-resolve", "--policy", "minimum", "--apply", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == cl.rows("s2", "items") == [(1, "a", 2, 1.0)]
