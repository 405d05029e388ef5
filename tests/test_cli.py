"""The `multimaster` command run as a user runs it: a subprocess, real SQLite files written by the
sqlite3 module, exit codes and JSON output checked."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "multimaster")


def mm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture
def sites(tmp_path):  # type: ignore[no-untyped-def]
    for s in ("s1", "s2", "s3"):
        with sqlite3.connect(tmp_path / f"{s}.db") as c:
            c.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER)")
    topo = tmp_path / "topology.yaml"
    topo.write_text(
        "sites:\n"
        '  s1: {url: "sqlite:///s1.db"}\n  s2: {url: "sqlite:///s2.db"}\n  s3: {url: "sqlite:///s3.db"}\n'
        "tables:\n  items: {key: id, columns: {qty: additive}}\nlinks: mesh\n"
    )
    return tmp_path, topo


def rows(path: Path) -> list[tuple]:  # type: ignore[type-arg]
    with sqlite3.connect(path) as c:
        return c.execute("SELECT * FROM items ORDER BY id").fetchall()


def test_init_refresh_status_conflicts_uninstall(sites):  # type: ignore[no-untyped-def]
    d, topo = sites
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0, r.stderr
    assert "installed items" in r.stdout
    for s, n in (("s1", "a"), ("s2", "b"), ("s3", "c")):
        with sqlite3.connect(d / f"{s}.db") as c:
            c.execute("INSERT INTO items (name, qty) VALUES (?, 10)", (n,))
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 0, r.stderr
    rounds = json.loads(r.stdout)
    assert rounds[0]["links"] and all(link["error"] is None for rnd in rounds for link in rnd["links"])
    assert rows(d / "s1.db") == rows(d / "s2.db") == rows(d / "s3.db") == [(1, "a", 10), (2, "b", 10), (3, "c", 10)]
    # a conflict: two sites sell from the same stock
    for s in ("s1", "s2"):
        with sqlite3.connect(d / f"{s}.db") as c:
            c.execute("UPDATE items SET qty = qty - 1 WHERE id = 1")
    assert mm("refresh", "-t", str(topo), "--site", "s1", "--peer", "s2").returncode == 0
    assert rows(d / "s1.db")[0] == (1, "a", 8)
    r = mm("status", "-t", str(topo), "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["sites"]["s1"]["conflicts"] == 1
    link = next(ln for ln in st["links"] if ln["from"] == "s1" and ln["to"] == "s2")
    assert link["waiting"] >= 1 and link["oldest_waiting_age_s"] is not None
    assert mm("status", "-t", str(topo)).returncode == 0
    r = mm("status", "-t", str(topo), "--json", "--since", "1h")
    assert json.loads(r.stdout)["sites"]["s1"]["conflicts_since"] == 1
    r = mm("status", "-t", str(topo), "--json", "--since", "2999-01-01T00:00:00Z")
    assert json.loads(r.stdout)["sites"]["s1"]["conflicts_since"] == 0
    assert mm("status", "-t", str(topo), "--since", "yesterday").returncode == 2
    # --watch redraws until interrupted
    import signal
    import time

    p = subprocess.Popen(
        [CLI, "status", "-t", str(topo), "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    import threading

    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(p.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + 60  # until it has drawn the tables (a loaded host starts slowly)
    while time.monotonic() < deadline and "s1 → s2" not in "".join(seen):
        time.sleep(0.2)
    time.sleep(0.5)  # a redraw or two
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    reader.join(timeout=10)
    out = "".join(seen)
    assert p.returncode == 130 and "links" in out and "s1 → s2" in out, p.stderr.read()  # type: ignore[union-attr]
    r = mm("conflicts", "-t", str(topo), "--site", "s1", "--json")
    conf = json.loads(r.stdout)
    assert conf[0]["policy"] == "additive" and conf[0]["decision"] == "merged"
    assert mm("refresh", "-t", str(topo), "--no-reconcile").returncode == 0
    r = mm("reconcile", "-t", str(topo), "--json")
    assert r.returncode == 0, r.stderr
    assert rows(d / "s1.db") == rows(d / "s2.db") == rows(d / "s3.db")
    r = mm("uninstall", "-t", str(topo))
    assert r.returncode == 0 and rows(d / "s3.db")[0] == (1, "a", 8)


def test_bad_topology_exits_2_and_names_the_problem(sites):  # type: ignore[no-untyped-def]
    d, topo = sites
    topo.write_text(topo.read_text().replace("links: mesh", "links: [{from: s1, to: nowhere}]"))
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2
    assert "site 'nowhere' is not defined under sites" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "change, message",
    [
        ("items: {key: id,", "has no column 'id'"),
        ("items: {key: name,", "primary key"),
        ("missing_table", "table 'missing_table' does not exist"),
    ],
)
def test_schema_problems_exit_2_and_touch_nothing(sites, change, message):  # type: ignore[no-untyped-def]
    d, topo = sites
    text = topo.read_text()
    if change == "missing_table":
        text = text.replace("items:", "missing_table:")
    elif "key: id" in change:
        with sqlite3.connect(d / "s2.db") as c:
            c.execute("DROP TABLE items")
            c.execute("CREATE TABLE items (item_id INTEGER PRIMARY KEY, name TEXT, qty INTEGER)")
    else:
        text = text.replace("key: id", "key: name")
    topo.write_text(text)
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    for s in ("s1", "s2", "s3"):
        with sqlite3.connect(d / f"{s}.db") as c:
            assert not c.execute("SELECT name FROM sqlite_master WHERE name LIKE '\\_mm%' ESCAPE '\\'").fetchall()


def test_init_refuses_an_older_layout_and_names_it(sites):  # type: ignore[no-untyped-def]
    """A second-order log left as a table by an earlier multimaster is not silently adopted."""
    d, topo = sites
    with sqlite3.connect(d / "s3.db") as c:
        c.execute("CREATE TABLE _mm_log2_items (seq2 INTEGER PRIMARY KEY, seq INTEGER NOT NULL, op TEXT NOT NULL)")
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "site 's3'" in r.stderr and "_mm_log2_items" in r.stderr and "uninstall" in r.stderr
    for s in ("s1", "s2"):
        with sqlite3.connect(d / f"{s}.db") as c:
            assert not c.execute("SELECT name FROM sqlite_master WHERE name LIKE '\\_mm%' ESCAPE '\\'").fetchall()


def test_init_refuses_an_older_layout_on_servers_and_names_it(backend, tmp_path):  # type: ignore[no-untyped-def]
    """PostgreSQL and MariaDB too: a second-order log left as a table by an earlier multimaster (today
    a view over the change log) stops init before anything is written at any site."""
    if backend.name == "sqlite":
        pytest.skip("SQLite: test_init_refuses_an_older_layout_and_names_it")
    from clusters import ITEMS, make_cluster

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS, init=False)
    if backend.name == "postgresql":
        ddl = [
            "CREATE SCHEMA _mm",
            "CREATE TABLE _mm._mm_log2_items (seq2 bigint PRIMARY KEY, seq bigint NOT NULL, op char(1) NOT NULL)",
        ]
        left = "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '_mm' AND relkind <> 'i'"
    else:
        ddl = ["CREATE TABLE _mm_log2_items (seq2 BIGINT AUTO_INCREMENT PRIMARY KEY, seq BIGINT NOT NULL, op CHAR(1) NOT NULL)"]
        left = "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '\\_mm%'"
    for sql in ddl:
        cl.execute("s2", sql)
    r = mm("init", "-t", str(cl.topo.path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "site 's2'" in r.stderr and "_mm_log2_items" in r.stderr and "uninstall" in r.stderr
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute(left)
        assert not cur.fetchall()  # nothing was written at the other site
    finally:
        c.close()
    c = cl.db("s2")
    try:
        cur = c.cursor()
        cur.execute(left)
        assert [r[0] for r in cur.fetchall()] == ["_mm_log2_items"]  # nor next to the old table
    finally:
        c.close()


def test_unreachable_peer_fails_that_link_only(sites):  # type: ignore[no-untyped-def]
    d, topo = sites
    assert mm("init", "-t", str(topo)).returncode == 0
    with sqlite3.connect(d / "s1.db") as c:
        c.execute("INSERT INTO items (name, qty) VALUES ('a', 1)")
    shutil.move(d / "s3.db", d / "s3.db.away")
    r = mm("refresh", "-t", str(topo), "--site", "s2")
    assert r.returncode == 1
    assert "s3" in r.stdout and "cannot be reached" in r.stdout
    assert rows(d / "s2.db") == [(1, "a", 1)]  # the link from s1 still refreshed


def _columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as c:
        return [r[1] for r in c.execute("PRAGMA table_info(items)")]


def test_ddl_changes_no_site_while_one_cannot_be_reached(sites):  # type: ignore[no-untyped-def]
    """Before: ddl added the column at s1, then stopped at the unreachable s2 with one line, s3 not
    tried, and the cluster's schemas differed (explorer, session 34). Now every site is checked
    first: nothing changes, each site is reported, exit 1."""
    d, topo = sites
    assert mm("init", "-t", str(topo)).returncode == 0
    shutil.move(d / "s2.db", d / "s2.db.away")
    r = mm("ddl", "-t", str(topo), "--json", "ALTER TABLE items ADD COLUMN color TEXT")
    assert r.returncode == 1, r.stdout + r.stderr
    reps = {x["site"]: x for x in json.loads(r.stdout)}
    assert reps["s2"]["status"] == "failed" and "s2" in reps["s2"]["message"] and "no site was changed" in reps["s2"]["message"]
    for s in ("s1", "s3"):
        assert reps[s]["status"] == "not run" and "'s2'" in reps[s]["message"] and "--site" in reps[s]["message"]
        assert not reps[s]["ran"]
    shutil.move(d / "s2.db.away", d / "s2.db")
    assert [_columns(d / f"{s}.db") for s in ("s1", "s2", "s3")] == [["id", "name", "qty"]] * 3
    # --site still changes that one site alone, whatever the others' state
    shutil.move(d / "s3.db", d / "s3.db.away")
    r = mm("ddl", "-t", str(topo), "--site", "s1", "ALTER TABLE items ADD COLUMN color TEXT")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _columns(d / "s1.db") == ["id", "name", "qty", "color"]


def test_ddl_names_the_sites_it_did_not_change_and_how_to_finish(sites):  # type: ignore[no-untyped-def]
    """A site that fails after the check (here: the column is there already, made by hand) is
    reported, the sites after it are still changed, and stderr gives the command for the rest."""
    d, topo = sites
    assert mm("init", "-t", str(topo)).returncode == 0
    with sqlite3.connect(d / "s2.db") as c:
        c.execute("ALTER TABLE items ADD COLUMN color TEXT")
    r = mm("ddl", "-t", str(topo), "--json", "ALTER TABLE items ADD COLUMN color TEXT")
    assert r.returncode == 1
    reps = {x["site"]: x for x in json.loads(r.stdout)}
    assert [reps[s]["status"] for s in ("s1", "s2", "s3")] == ["applied", "failed", "applied"], reps
    assert "applied at s1, s3, not at s2" in r.stderr
    assert "--site s2 'ALTER TABLE items ADD COLUMN color TEXT'" in r.stderr
    assert all(_columns(d / f"{s}.db") == ["id", "name", "qty", "color"] for s in ("s1", "s2", "s3"))


def test_every_command_is_documented():  # type: ignore[no-untyped-def]
    from multimaster.cli import app

    doc = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    import typer.main

    group = typer.main.get_group(app)
    for name in group.commands:
        assert f"multimaster {name}" in doc, f"command '{name}' is not in docs/cli.md"


def test_demo_converges(tmp_path):  # type: ignore[no-untyped-def]
    r = mm("demo", "--dir", str(tmp_path / "demo"), "--size", "40", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["converged"] is True
    assert rep["last_seat"]["seats_left"] == -1 and rep["last_seat"]["overbooked"] is True
    assert all(v["identical"] for v in rep["comparison"].values())
    assert {c["kind"] for c in rep["conflicts"]} >= {"update_update", "delete_update"}
    r = mm("demo", "--dir", str(tmp_path / "demo2"), "--size", "20")
    assert r.returncode == 0 and "all three sites converged" in r.stdout


def test_wheel_carries_the_trigger_templates(tmp_path):  # type: ignore[no-untyped-def]
    import zipfile

    root = Path(__file__).parent.parent
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("multimaster-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for f in (root / "triggers").rglob("*.sql"):
        assert f"multimaster/triggers/{f.relative_to(root / 'triggers')}" in names


def test_conflicts_filters_and_purge_of_tombstones_and_conflicts(backend, tmp_path):  # type: ignore[no-untyped-def]
    """`conflicts` with --table/--kind/--since/--json, bad filters exit 2; `purge` drops the
    tombstones and conflict rows every site has once past the retention, and says so."""
    from clusters import make_cluster

    tables = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], tables)
    topo = str(tmp_path / "topology.yaml")
    with open(topo, "a") as f:
        f.write("purge: {tombstones_after: 0s, conflicts_after: 1h}\n")
    for n in ("a", "b", "c"):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, 1)", (n,))
    assert mm("refresh", "-t", topo, "--until-quiet").returncode == 0
    cl.execute("s1", "UPDATE items SET name = 'x' WHERE id = 1")
    cl.execute("s2", "UPDATE items SET name = 'y' WHERE id = 1")
    cl.execute("s2", "DELETE FROM items WHERE id = 2")
    assert mm("refresh", "-t", topo, "--until-quiet").returncode == 0
    r = mm("conflicts", "-t", topo, "--table", "items", "--kind", "update_update", "--since", "1h", "--json")
    assert r.returncode == 0, r.stderr
    conf = json.loads(r.stdout)
    assert {c["site"] for c in conf} == {"s1", "s2"}
    c1 = next(c for c in conf if c["site"] == "s1")
    assert c1["local_row"]["name"] == "x" and c1["remote_row"] == {"name": "y"}
    assert (c1["local_source"], c1["remote_source"], c1["remote_origin"], c1["rule"]) == ("local", "replicated", "s2", "latest")
    assert c1["winner"] == "remote"
    r = mm("conflicts", "-t", topo, "--kind", "update_update")
    assert r.returncode == 0 and "update_update" in r.stdout and "replicated" in r.stdout
    assert "shown" not in r.stderr  # 2 conflicts, fewer than the 50 shown at most
    r = mm("conflicts", "-t", topo, "--kind", "update_update", "--limit", "1", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 1
    assert "conflicts 1-1 of 2 shown, newest first; 1 older" in r.stderr and "--offset 1" in r.stderr, r.stderr
    assert json.loads(mm("conflicts", "-t", topo, "--kind", "delete_update", "--json").stdout) == []
    assert json.loads(mm("conflicts", "-t", topo, "--since", "2999-01-01T00:00:00Z", "--json").stdout) == []
    if backend.name == "sqlite":  # the options are checked before any database is read
        r = mm("conflicts", "-t", topo, "--kind", "sideways")
        assert r.returncode == 2 and "--kind: 'sideways' is not a conflict kind" in r.stderr
        r = mm("conflicts", "-t", topo, "--table", "nope")
        assert r.returncode == 2 and "table 'nope'" in r.stderr
        assert mm("conflicts", "-t", topo, "--since", "yesterday").returncode == 2
    # purge: the tombstone goes (retention 0s from the file), the conflicts stay (1h)
    r = mm("purge", "-t", topo, "--min-age", "0s", "--json")
    assert r.returncode == 0, r.stderr
    reps = {rep["site"]: rep for rep in json.loads(r.stdout)}
    assert {s: rep["tombstones"] for s, rep in reps.items()} == {"s1": 1, "s2": 1}
    assert all(rep["conflicts"] == 0 for rep in reps.values())
    # --conflicts-after overrides the file; the table output names what went
    r = mm("purge", "-t", topo, "--conflicts-after", "0s")
    assert r.returncode == 0, r.stderr
    assert "tombstones and conflict log" in r.stdout
    assert json.loads(mm("conflicts", "-t", topo, "--json").stdout) == []
    if backend.name == "sqlite":
        r = mm("purge", "-t", topo, "--tombstones-after", "soon")
        assert r.returncode == 2 and "--tombstones-after" in r.stderr
    cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('d', 1)")
    assert mm("refresh", "-t", topo, "--until-quiet").returncode == 0
    cl.assert_converged()
    assert [row[0] for row in cl.rows("s1", "items")] == [1, 3, 4]


def test_version_is_the_installed_package_version():  # type: ignore[no-untyped-def]
    from importlib.metadata import version

    r = mm("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"multimaster {version('multimaster')}"


def _x_from_s3_updated_at_s2(d: Path, topo: Path, also: tuple[str, int]) -> None:
    """init; s3 inserts x; s2 pulls it, adds 4 to it and inserts `also` (name, qty), then purges
    its snapshot of s3 (what it pulled of s3 is no longer there for another site)."""
    assert mm("init", "-t", str(topo)).returncode == 0
    with sqlite3.connect(d / "s3.db") as c:
        c.execute("INSERT INTO items (name, qty) VALUES ('x', 1)")
    assert mm("refresh", "-t", str(topo), "--site", "s2", "--peer", "s3").returncode == 0
    with sqlite3.connect(d / "s2.db") as c:
        c.execute("UPDATE items SET qty = qty + 4 WHERE name = 'x'")
        c.execute("INSERT INTO items (name, qty) VALUES (?, ?)", also)
    assert mm("purge", "-t", str(topo), "--site", "s2", "--min-age", "0s").returncode == 0


def test_a_site_removed_for_good_strands_nothing_in_a_mesh(sites):  # type: ignore[no-untyped-def]
    """The issue's case: s3 inserts x; s2 pulls it and updates it, inserts y, and purges its
    snapshot of s3; s3 dies before s1 got x and is removed with --force; s2 inserts z. s2 relayed
    x (a mesh relays every applied change), so s1 gets x, y and z from s2."""
    d, topo = sites
    _x_from_s3_updated_at_s2(d, topo, ("y", 2))
    (d / "s3.db").rename(d / "s3.lost")
    r = mm("remove-site", "-t", str(topo), "s3", "--force", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["behind"] == []
    topo.write_text(topo.read_text().replace('  s3: {url: "sqlite:///s3.db"}\n', ""))
    with sqlite3.connect(d / "s2.db") as c:
        c.execute("INSERT INTO items (name, qty) VALUES ('z', 7)")
    r = mm("refresh", "-t", str(topo), "--until-quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r[1:] for r in rows(d / "s1.db")) == sorted(r[1:] for r in rows(d / "s2.db")) == [("x", 5), ("y", 2), ("z", 7)]
    assert mm("status", "-t", str(topo)).returncode == 0


# not a mesh: s3 pulls s2 only, so s2 does not relay s3's changes (s1 pulls s3 directly)
NOT_A_MESH = """links:
  - {from: s1, to: s2}
  - {from: s2, to: s1}
  - {from: s3, to: s1}
  - {from: s3, to: s2}
  - {from: s2, to: s3}
"""


def test_a_link_that_cannot_progress_is_reported_stalled_with_its_fix(sites):  # type: ignore[no-untyped-def]
    """Not a mesh (s2 does not relay s3's changes). s3 inserts x; s2 pulls it and updates it, and
    purges its snapshot of s3; s3 is lost and removed with --force before s1 got x: no site holds
    x for s1 any more, which remove-site says (exit 1, s1 behind, the fix). s1 can never apply s2's
    update of x, and every later change of s2 waits behind it. That is not silent either: refresh
    and status exit 1 naming the link, what the change waits for and the fix; the fix (copy s1
    again from s2) clears it."""
    d, topo = sites
    topo.write_text(topo.read_text().replace("links: mesh\n", NOT_A_MESH) + "refresh: {stall_after: 1s}\n")
    _x_from_s3_updated_at_s2(d, topo, ("z", 7))
    r = mm("remove-site", "-t", str(topo), "s3", "--force")
    assert r.returncode == 1, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "behind: s1: 's1' applied 's3''s changes of table 'items' up to version (none)" in out
    assert "multimaster add-site -t FILE s1 --from s2 --replace" in out
    doc = topo.read_text().replace('  s3: {url: "sqlite:///s3.db"}\n', "")
    doc = "".join(ln for ln in doc.splitlines(keepends=True) if "s3, to" not in ln and "to: s3}" not in ln)
    topo.write_text(doc)
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    links = {(ln["from"], ln["to"]): ln for ln in json.loads(r.stdout)[-1]["links"]}
    assert links[("s2", "s1")]["waiting"] == 2 and "has not received" in links[("s2", "s1")]["waits_for"]
    time.sleep(1.2)
    r = mm("refresh", "-t", str(topo), "--site", "s1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "link s2 -> s1 stalled: 2 change(s) wait" in r.stderr and "update from s2 of row" in r.stderr
    assert "multimaster add-site -t FILE s1 --from PEER --replace" in r.stderr
    r = mm("status", "-t", str(topo), "--json")
    assert r.returncode == 1 and "link s2 -> s1 stalled" in r.stderr
    st = json.loads(r.stdout)
    (ln,) = [ln for ln in st["links"] if ln["to"] == "s1"]
    assert ln["parked"] == 2 and ln["stalled"]
    from multimaster.config.topology import load_topology
    from multimaster.ops.metrics import health, render

    text = render(health(load_topology(topo)))  # what the daemon's metrics endpoint serves
    assert 'multimaster_link_stalled{source="s2",target="s1"} 1' in text
    assert 'multimaster_link_parked_changes{source="s2",target="s1"} 2' in text
    # the fix it names
    r = mm("add-site", "-t", str(topo), "s1", "--from", "s2", "--replace")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mm("refresh", "-t", str(topo), "--until-quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert mm("status", "-t", str(topo)).returncode == 0
    assert sorted(r[1:] for r in rows(d / "s1.db")) == sorted(r[1:] for r in rows(d / "s2.db")) == [("x", 5), ("z", 7)]


def test_status_exits_1_while_a_site_is_down_or_a_link_keeps_failing(sites):  # type: ignore[no-untyped-def]
    """status exits 1 while a site cannot be reached (named on stderr; before: exit 0, the site
    marked unreachable in the table only), and once a link's refreshes have failed for
    refresh.stall_after, with the error they fail with; exit 0 again once both are over."""
    d, topo = sites
    topo.write_text(topo.read_text() + "refresh: {stall_after: 1s}\n")
    assert mm("init", "-t", str(topo)).returncode == 0
    with sqlite3.connect(d / "s1.db") as c:
        c.execute("INSERT INTO items (name, qty) VALUES ('x', 1)")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    assert mm("status", "-t", str(topo)).returncode == 0
    (d / "s3.db").rename(d / "away.db")
    r = mm("status", "-t", str(topo), "--json")
    assert r.returncode == 1 and "site 's3' not reached" in r.stderr, r.stderr
    assert json.loads(r.stdout)["failing"][0].startswith("site 's3' not reached")
    (d / "away.db").rename(d / "s3.db")
    assert mm("status", "-t", str(topo)).returncode == 0
    # s2's snapshot of s1 refuses every row (a trigger made by hand): every refresh of s1 -> s2 fails
    with sqlite3.connect(d / "s2.db") as c:
        c.execute("CREATE TRIGGER full_disk BEFORE INSERT ON _mm_snap_items__s1 BEGIN SELECT RAISE(ABORT, 'no space left'); END")
    with sqlite3.connect(d / "s1.db") as c:
        c.execute("INSERT INTO items (name, qty) VALUES ('y', 2)")
    assert mm("refresh", "-t", str(topo), "--site", "s2", "--peer", "s1").returncode == 1
    time.sleep(1.2)  # past refresh.stall_after since its last success
    r = mm("status", "-t", str(topo))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "link s1 -> s2 failing: no refresh of it succeeded since" in r.stderr and "no space left" in r.stderr
    with sqlite3.connect(d / "s2.db") as c:
        c.execute("DROP TRIGGER full_disk")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    assert mm("status", "-t", str(topo)).returncode == 0


def test_init_refuses_a_column_whose_log_names_the_database_would_cut(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A column of 63 characters is legal on PostgreSQL and MariaDB, but the change log names it
    behind two characters (n_, o_): MariaDB's install failed halfway (1059, other sites installed
    already, init not runnable again) and PostgreSQL cut the names. init now refuses it at its
    checks, naming the column and the fix, and writes nothing anywhere."""
    if backend.name == "sqlite":
        pytest.skip("SQLite has no limit on names")
    from clusters import ITEMS, make_cluster

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS, init=False)
    col = "c" + "x" * 62  # 63 characters
    for s in ("s1", "s2"):
        cl.execute(s, f"ALTER TABLE items ADD COLUMN {col} INTEGER")
    r = mm("init", "-t", str(cl.topo.path))
    assert r.returncode == 2, r.stdout + r.stderr
    out = " ".join(r.stderr.split())
    assert f"column '{col}' is too long to replicate" in out and "tables.items.exclude" in out, out
    for s in ("s1", "s2"):
        c = cl.db(s)
        try:
            cur = c.cursor()
            if backend.name == "postgresql":
                cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = '_mm'")
            else:
                cur.execute(
                    "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '\\_mm%'"
                )
            assert cur.fetchone()[0] == 0, s
        finally:
            c.close()


def test_a_key_typo_in_one_table_leaves_it_out_and_status_exits_1_at_once(backend, tmp_path):  # type: ignore[no-untyped-def]
    """`key: code` edited to `key: cod` in one table's entry (a column the table does not have):
    before, every refresh of every link failed for every table with the schema check, and status
    exited 0 until refresh.stall_after. Now that table alone is left out (named, with the fix), the
    others replicate, and status exits 1 at once naming it (the error needs an operator)."""
    from clusters import make_cluster

    tables = {
        "items": {"key": "id", "columns": {"name": "text"}},
        "cust": {"key": "code", "columns": {"city": "text"}, "auto": False},
    }
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], tables)
    topo = tmp_path / "topology.yaml"
    assert mm("status", "-t", str(topo)).returncode == 0
    topo.write_text(topo.read_text().replace("key: code", "key: cod"))
    cl.execute("s1", "INSERT INTO items (name) VALUES ('x')")
    r = mm("refresh", "-t", str(topo), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [ln["error"] for rnd in json.loads(r.stdout) for ln in rnd["links"]]
    assert all(e and "table(s) ['cust'] not refreshed" in e and "no column 'cod'" in e for e in errors), errors
    assert [row[1] for row in cl.rows("s2", "items")] == ["x"]  # items, the table without the typo, replicated
    r = mm("status", "-t", str(topo))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "link s1 -> s2 failing" in r.stderr and "tables.cust" in r.stderr and "no column 'cod'" in r.stderr, r.stderr
    topo.write_text(topo.read_text().replace("key: cod", "key: code"))
    assert mm("refresh", "-t", str(topo)).returncode == 0
    assert mm("status", "-t", str(topo)).returncode == 0


def test_two_sites_that_are_one_database_are_refused_before_anything_is_written(backend, tmp_path):  # type: ignore[no-untyped-def]
    """The same database under two site names, spelled differently (the port left out, another
    driver, `./` before a file's name): before, init installed at the first and crashed at the
    second with a raw IntegrityError, the first left installed. Now the file is refused, exit 2,
    naming both sites, and nothing is written."""
    from clusters import ITEMS, make_cluster

    cl = make_cluster(backend, tmp_path, ["s1"], ITEMS, init=False)
    url = cl.urls["s1"]
    if backend.name == "sqlite":
        other = f"sqlite:///{tmp_path}/./s1.db"
    elif backend.name == "postgresql":
        other = url.replace("postgresql+psycopg://", "postgresql://").replace(":5432/", "/")
    else:
        other = url.replace("mysql+pymysql://", "mariadb+pymysql://").replace("127.0.0.1", "localhost")
    assert other != url
    topo = tmp_path / "topology.yaml"
    topo.write_text(f'sites:\n  s1: {{url: "{url}"}}\n  s2: {{url: "{other}"}}\ntables:\n  items: {{key: id}}\nlinks: mesh\n')
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "sites.s2: the same database as site 's1'" in r.stderr, r.stderr
    c = cl.db("s1")
    try:
        cur = c.cursor()
        if backend.name == "sqlite":
            cur.execute("SELECT name FROM sqlite_master WHERE name LIKE '\\_mm%' ESCAPE '\\'")
        elif backend.name == "postgresql":
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = '_mm'")
        else:
            cur.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE '\\_mm%'"
            )
        assert list(cur.fetchall()) == []
    finally:
        c.close()


def test_a_key_written_twice_in_the_topology_file_is_refused_naming_it_and_its_lines(sites):  # type: ignore[no-untyped-def]
    """A site pasted twice under sites: (a copy-paste slip): before, YAML kept the last entry
    silently and every command went on with it (exit 0). Now any key written twice in one mapping
    is refused, exit 2, by its path and lines, before any database is touched."""
    d, topo = sites
    topo.write_text(
        "sites:\n"
        '  s1: {url: "sqlite:///s1.db"}\n  s2: {url: "sqlite:///s2.db"}\n  s1: {url: "sqlite:///s3.db"}\n'
        "tables:\n  items: {key: id, columns: {qty: additive, qty: latest}}\nlinks: mesh\n"
    )
    for cmd in (("topology", "show"), ("init",)):
        r = mm(*cmd, "-t", str(topo))
        assert r.returncode == 2, r.stdout + r.stderr
        assert "sites.s1: written twice (lines 2 and 4)" in r.stderr, r.stderr
        assert "tables.items.columns.qty: written twice (lines 6 and 6)" in r.stderr, r.stderr
    with sqlite3.connect(d / "s1.db") as c:
        assert not c.execute("SELECT name FROM sqlite_master WHERE name LIKE '\\_mm%' ESCAPE '\\'").fetchall()


def test_init_as_a_mariadb_login_without_drop_names_the_site_and_the_grant_and_leaves_nothing(  # type: ignore[no-untyped-def]
    mysql_backend, tmp_path
):
    """A login holding every privilege init checks but DROP: before, init stopped with the driver's
    `DROP command denied ... _mm_probe_history`, naming no site, and left its scratch tables
    `_mm_probe_rows` and `_mm_probe_history` behind. Now it is refused, exit 2, naming the site and
    the GRANT, and the database holds only the application's table."""
    import uuid

    from clusters import ITEMS, make_cluster
    from sqlalchemy.engine import make_url

    cl = make_cluster(mysql_backend, tmp_path, ["s1"], ITEMS, init=False)
    db = make_url(cl.urls["s1"]).database
    user = "mm_nodrop_" + uuid.uuid4().hex[:10]
    mysql_backend._admin(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'weakpw123'")
    try:
        mysql_backend._admin(
            "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, TRIGGER, CREATE VIEW, CREATE TEMPORARY TABLES, "
            f"CREATE ROUTINE, ALTER ROUTINE, EXECUTE, DELETE HISTORY ON `{db}`.* TO '{user}'@'%'"
        )
        url = make_url(cl.urls["s1"]).set(username=user, password="weakpw123").render_as_string(hide_password=False)
        with sqlite3.connect(tmp_path / "l.db") as c:
            c.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)")
        topo = tmp_path / "nodrop.yaml"
        topo.write_text(
            f'sites:\n  my: {{url: "{url}"}}\n  lite: {{url: "sqlite:///l.db"}}\ntables:\n  items: {{key: id}}\nlinks: mesh\n'
        )
        r = mm("init", "-t", str(topo))
        assert r.returncode == 2, r.stdout + r.stderr
        assert "site 'my'" in r.stderr and "may not DROP" in r.stderr and "GRANT DROP ON" in r.stderr, r.stderr
        c = cl.db("s1")
        try:
            cur = c.cursor()
            cur.execute("SHOW TABLES")
            assert [row[0] for row in cur.fetchall()] == ["items"]
        finally:
            c.close()
    finally:
        mysql_backend._admin(f"DROP USER IF EXISTS '{user}'@'%'")


def test_a_refresh_interval_below_100ms_is_refused(sites):  # type: ignore[no-untyped-def]
    """`refresh.interval: 0s` was taken (topology show exit 0, and the daemon refreshed in a busy
    loop). Now an interval below 100ms, in refresh: or on a link, is refused, exit 2, giving the
    minimum; 100ms itself is taken."""
    d, topo = sites
    head = 'sites:\n  s1: {url: "sqlite:///s1.db"}\n  s2: {url: "sqlite:///s2.db"}\ntables:\n  items: {key: id}\n'
    topo.write_text(head + "links: mesh\nrefresh: {interval: 0s, jitter: 0s}\n")
    for cmd in (("topology", "show"), ("run",)):
        r = mm(*cmd, "-t", str(topo))
        assert r.returncode == 2, r.stdout + r.stderr
        assert "refresh.interval: 0 s is below the shortest interval, 100ms" in r.stderr, r.stderr
    topo.write_text(head + "links:\n  - {from: s1, to: s2, interval: 50ms}\n  - {from: s2, to: s1}\n")
    r = mm("topology", "show", "-t", str(topo))
    assert r.returncode == 2 and "links[0].interval: 0.05 s is below the shortest interval, 100ms" in r.stderr, r.stderr
    topo.write_text(head + "links: mesh\nrefresh: {interval: 100ms}\n")
    assert mm("topology", "show", "-t", str(topo)).returncode == 0
