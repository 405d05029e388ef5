"""remove-site --force of a site that died while the sites pulling from it had applied different
prefixes of its change log: before anything of it is dropped, the sites behind get what another
still holds in its snapshot of it, applied as if pulled from it (core/salvage.py,
engine/salvage.py); what no site holds any more is reported, site by site, with the fix, and the
command exits 1 (docs/operations.md "Removing a site").

The clusters here are not meshes: s3 pulls s1 only, so s1 does not relay s3's changes to s2, which
pulls s3 directly, and s2 can lack what s1 applied of s3. In a mesh every site relays what it
applies, and a survivor gets what another applied of the dead site from that one's change log
(tests/test_mesh_relay.py)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import BACKENDS, Backend, TestCluster, make_cluster, mm, server_unavailable

from multimaster import api, store
from multimaster.config.topology import load_topology
from multimaster.engine.site import Site
from multimaster.ops.purge import PurgePolicy, purge_site

LINKS = [{"from": a, "to": b} for a, b in (("s1", "s2"), ("s2", "s1"), ("s3", "s1"), ("s3", "s2"), ("s1", "s3"))]

TABLES = {
    "items": {
        "key": "id",
        "columns": {"name": "text", "qty": "int", "label": "text"},
        "config": {"columns": {"qty": "additive"}},
    }
}


def kill(cl: TestCluster, site: str, tmp: Path) -> None:
    """`site` dies for good: its SQLite files move away, its server database is dropped."""
    url = cl.urls[site]
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        away = tmp / "away"
        away.mkdir(exist_ok=True)
        for f in path.parent.glob(path.name + "*"):
            shutil.move(str(f), str(away / f.name))
        return
    db = url.rsplit("/", 1)[1].split("?")[0]
    backend = cl.backends[site] if isinstance(cl, MixedCluster) else cl.backend
    backend._drop(db)  # type: ignore[attr-defined]


def without(cl: TestCluster, site: str) -> None:
    """Remove `site` and its links from the topology file (step 3 of removing a site)."""
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    del doc["sites"][site]
    if isinstance(doc["links"], list):
        doc["links"] = [ln for ln in doc["links"] if site not in (ln["from"], ln["to"])]
    Path(cl.topo.path).write_text(yaml.safe_dump(doc, sort_keys=False))
    cl.topo = load_topology(cl.topo.path)
    del cl.urls[site]


def origin_top(cl: TestCluster, site: str, origin: str) -> str | None:
    """The highest version of `origin`'s changes of items applied at `site` (_mm_origins)."""
    s = Site(site, cl.urls[site])
    try:
        with s.read() as conn:
            return store.origins.of_origin(conn, s.dialect, origin).get("items")
    finally:
        s.dispose()


def prefixes(cl: TestCluster) -> None:
    """s1 and s2 pull s3's first changes; s1 pulls twice more, with writes in between, s2 not;
    every site writes the rows s3 made meanwhile (an additive quantity; a label, latest wins);
    s3 makes more changes no one pulls."""
    cl.execute("s3", "INSERT INTO items (name, qty, label) VALUES ('a', 1, 'a@s3')")
    cl.refresh("s1", "s3")
    cl.refresh("s2", "s3")
    cl.refresh_until_quiet()
    cl.execute("s3", "UPDATE items SET qty = qty + 5 WHERE name = 'a'")
    cl.execute("s3", "INSERT INTO items (name, qty, label) VALUES ('b', 2, 'b@s3')")
    cl.refresh("s1", "s3")  # s1 pulls further ...
    cl.execute("s2", "UPDATE items SET qty = qty + 100, label = 'a@s2' WHERE name = 'a'")
    cl.execute("s3", "INSERT INTO items (name, qty, label) VALUES ('c', 3, 'c@s3')")
    cl.execute("s3", "UPDATE items SET label = 'b again@s3' WHERE name = 'b'")
    cl.execute("s3", "UPDATE items SET label = 'a again@s3' WHERE name = 'a'")
    cl.refresh("s1", "s3")  # ... and further; s2 not
    cl.execute("s1", "INSERT INTO items (name, qty, label) VALUES ('d', 4, 'd@s1')")
    cl.execute("s3", "INSERT INTO items (name, qty, label) VALUES ('lost', 9, 'never pulled')")
    # s1 and s2 exchange their own changes, never s3's: s2 still lacks what s1 pulled of s3 after 'a'
    cl.refresh("s1", "s2")
    cl.refresh("s2", "s1")


def names_at(cl: TestCluster, site: str) -> list[tuple[Any, ...]]:
    return sorted((r[1], r[2], r[3]) for r in cl.rows(site, "items"))


EXPECTED = [("a", 106, "a again@s3"), ("b", 2, "b again@s3"), ("c", 3, "c@s3"), ("d", 4, "d@s1")]


def _converge_without_s3(cl: TestCluster) -> None:
    without(cl, "s3")
    cl.refresh_until_quiet()
    assert names_at(cl, "s1") == names_at(cl, "s2") == EXPECTED
    assert cl.rows("s1", "items") == cl.rows("s2", "items")


def test_the_sites_behind_get_what_another_pulled_before_the_site_died(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], TABLES, links=LINKS)
    prefixes(cl)
    assert ("c", 3, "c@s3") in names_at(cl, "s1") and ("c", 3, "c@s3") not in names_at(cl, "s2")
    kill(cl, "s3", tmp_path)
    r = mm("remove-site", "-t", str(cl.topo.path), "s3", "--force", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["behind"] == [] and rep["unreachable"] == ["s3"] and sorted(rep["cleaned"]) == ["s1", "s2"]
    assert [(g["site"], g["table"], g["from"]) for g in rep["relayed"]] == [("s2", "items", "s1")]
    assert rep["relayed"][0]["applied"] == 5  # the two inserts and three updates of s3 that s2 lacked
    assert rep["not_pulled"] is None and rep["kept"] == [] and rep["dropped"] == {}
    # s2 applied them as pulled from s3: s3's versions, conflicts resolved the same way
    assert origin_top(cl, "s2", "s3") == origin_top(cl, "s1", "s3")
    _converge_without_s3(cl)


def test_a_site_behind_whose_missing_changes_no_site_holds_is_named_with_the_fix(backend: Backend, tmp_path: Path) -> None:
    """s1 purged its snapshot of s3 after applying it: what s2 lacks is nowhere any more. remove-site
    says so, names s2, the versions and the fix, and exits 1; the fix (copy s2 again from s1) works."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], TABLES, links=LINKS)
    prefixes(cl)
    with api.Cluster(cl.topo) as c:
        assert purge_site(c, "s1", PurgePolicy(min_age=0)).tables["items"].snapshot_rows >= 5
    kill(cl, "s3", tmp_path)
    r = mm("remove-site", "-t", str(cl.topo.path), "s3", "--force", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert not rep["ok"] and rep["relayed"] == [] and rep["unreachable"] == ["s3"]
    (b,) = rep["behind"]
    assert (b["site"], b["table"], b["furthest"], b["top"]) == ("s2", "items", "s1", origin_top(cl, "s1", "s3"))
    assert b["has"] == origin_top(cl, "s2", "s3") < b["top"]
    assert "no site holds positions" in b["reason"] and "purged" in b["reason"]
    assert "multimaster add-site -t FILE s2 --from s1 --replace" in b["fix"]
    # the fix, as the report says: the file without s3, then s2 copied again from s1
    without(cl, "s3")
    r = mm("add-site", "-t", str(cl.topo.path), "s2", "--from", "s1", "--replace")
    assert r.returncode == 0, r.stdout + r.stderr
    cl.refresh_until_quiet()
    assert names_at(cl, "s1") == names_at(cl, "s2") == EXPECTED


def test_entries_kept_in_a_layout_before_a_schema_change_are_not_given(sqlite_backend: Backend, tmp_path: Path) -> None:
    """s1 added a column after it applied s3's entries: their masks are in the layout before, so
    its snapshot gives none of them (its horizon moved to its watermark); s2 is reported behind."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], TABLES, links=LINKS)
    prefixes(cl)
    kill(cl, "s3", tmp_path)
    for s in ("s1", "s2"):
        cl.execute(s, "ALTER TABLE items ADD COLUMN note TEXT")
    cl.refresh("s1", "s2")
    cl.refresh("s2", "s1")
    r = mm("remove-site", "-t", str(cl.topo.path), "s3", "--force", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["relayed"] == [] and [(b["site"], b["furthest"]) for b in rep["behind"]] == [("s2", "s1")]
    assert "in the layout the table had before a schema change" in rep["behind"][0]["reason"]


def test_the_report_in_words_names_the_site_behind_and_the_fix(sqlite_backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], TABLES, links=LINKS)
    prefixes(cl)
    with api.Cluster(cl.topo) as c:
        purge_site(c, "s1", PurgePolicy(min_age=0))
    kill(cl, "s3", tmp_path)
    r = mm("remove-site", "-t", str(cl.topo.path), "s3", "--force")
    assert r.returncode == 1, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "behind: s2:" in out and "'s2' applied 's3''s changes of table 'items' up to version" in out
    assert "fix: remove 's3' and its links from the topology file, then copy s2 again from s1" in out


def test_a_survivor_not_reached_keeps_the_snapshots_until_a_second_run(sqlite_backend: Backend, tmp_path: Path) -> None:
    """s2 is down too when s3 is removed: remove-site cannot tell what s2 lacks, names it and exits
    1, and keeps s1's snapshot of s3; run again once s2 answers, it gives s2 what it lacks."""
    import faults

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], TABLES, links=LINKS)
    prefixes(cl)
    kill(cl, "s3", tmp_path)
    faults.site_down(cl, "s2", tmp_path / "down")
    r = mm("remove-site", "-t", str(cl.topo.path), "s3", "--force", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert sorted(rep["unreachable"]) == ["s2", "s3"] and rep["kept"] and rep["relayed"] == []
    (b,) = rep["behind"]
    assert b["site"] == "s2" and b["table"] is None and "not reached" in b["reason"]
    assert "run 'multimaster remove-site -t FILE s3 --force' again once s2 answers" in b["fix"]
    assert not any("snapshot" in x for x in rep["cleaned"]["s1"])
    faults.site_up(cl, "s2", tmp_path / "down")
    r = mm("remove-site", "-t", str(cl.topo.path), "s3", "--force", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert [(g["site"], g["from"]) for g in rep["relayed"]] == [("s2", "s1")] and rep["kept"] == []
    _converge_without_s3(cl)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_applications_write_at_the_survivors_while_it_runs(kind: str, tmp_path: Path) -> None:
    """Plain clients update s3's row 'a' (additive) and insert rows at s1 and s2 throughout
    remove-site: nothing they commit is lost or applied twice, and s2 still gets what s1 held."""
    try:
        backend = BACKENDS[kind]()
    except ConnectionError as e:
        server_unavailable(kind, str(e))
        raise
    try:
        cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], TABLES, links=LINKS)
        prefixes(cl)
        kill(cl, "s3", tmp_path)
        stop = threading.Event()
        added = {"s1": 0, "s2": 0}
        errors: list[str] = []

        def write(site: str) -> None:
            c = cl.db(site)
            p = backend.param()
            try:
                while not stop.is_set():
                    try:
                        cur = c.cursor()
                        cur.execute(f"UPDATE items SET qty = qty + 1 WHERE name = {p}", ("a",))
                        cur.execute(
                            f"INSERT INTO items (name, qty, label) VALUES ({p}, 0, {p})", (f"w{site}-{added[site]}", site)
                        )
                        c.commit()
                        added[site] += 1
                    except Exception as e:  # noqa: BLE001 - a busy SQLite or a deadlock victim is retried
                        c.rollback()
                        if not any(x in str(e).lower() for x in ("locked", "busy", "deadlock")):
                            errors.append(f"{site}: {e}")
                            return
                    time.sleep(0.005)
            finally:
                c.close()

        threads = [threading.Thread(target=write, args=(s,)) for s in ("s1", "s2")]
        for t in threads:
            t.start()
        try:
            time.sleep(0.2)
            r = mm("remove-site", "-t", str(cl.topo.path), "s3", "--force", "--json")
            time.sleep(0.2)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors
        assert r.returncode == 0, r.stdout + r.stderr
        rep = json.loads(r.stdout)
        assert [(g["site"], g["from"]) for g in rep["relayed"]] == [("s2", "s1")] and rep["ok"]
        assert min(added.values()) > 0
        without(cl, "s3")
        cl.refresh_until_quiet()
        assert cl.rows("s1", "items") == cl.rows("s2", "items")
        got = {r[0]: (r[1], r[2]) for r in names_at(cl, "s2")}
        assert got["a"] == (106 + added["s1"] + added["s2"], "a again@s3")
        assert {n: got[n] for n in ("b", "c", "d")} == {r[0]: (r[1], r[2]) for r in EXPECTED[1:]}
        assert len(got) == len(EXPECTED) + added["s1"] + added["s2"]
    finally:
        backend.cleanup()


class MixedCluster(TestCluster):
    """A cluster whose sites run on different databases: each site's application statements,
    quoting and placeholders are its own database's."""

    __test__ = False

    def __init__(self, backends: dict[str, Backend], topo: Any, urls: dict[str, str]) -> None:
        super().__init__(backends["s1"], topo, urls, TABLES)
        self.backends = backends

    def db(self, site: str) -> Any:
        return self.backends[site].connect(self.urls[site])

    def execute(self, site: str, sql: str, params: tuple[Any, ...] = ()) -> None:
        c = self.db(site)
        try:
            c.cursor().execute(sql.replace("?", self.backends[site].param()), params)
            c.commit()
        finally:
            c.close()

    def rows(self, site: str, table: str, order: str | None = None) -> list[tuple[Any, ...]]:
        q = "`" if self.backends[site].name == "mysql" else '"'
        c = self.db(site)
        try:
            cur = c.cursor()
            cur.execute(f"SELECT {q}id{q}, {q}name{q}, {q}qty{q}, {q}label{q} FROM {q}{table}{q} ORDER BY {q}id{q}")
            return [tuple(r) for r in cur.fetchall()]
        finally:
            c.close()


@pytest.mark.parametrize(
    "kinds", [("postgresql", "sqlite", "sqlite"), ("mysql", "postgresql", "sqlite")], ids=["pg-to-sqlite", "mariadb-to-pg"]
)
def test_entries_cross_dialects_from_the_survivor_ahead(kinds: tuple[str, str, str], tmp_path: Path) -> None:
    """s1 pulled further than s2, on another database: s1's snapshot rows reach s2 with their
    values as s2's database stores them, as a pull from s3 would have brought them."""
    made: dict[str, Backend] = {}
    try:
        for k in set(kinds):
            try:
                made[k] = BACKENDS[k]()
            except ConnectionError as e:
                server_unavailable(k, str(e))
        backends = {s: made[k] for s, k in zip(("s1", "s2", "s3"), kinds)}
        urls = {s: b.new_site(tmp_path, s) for s, b in backends.items()}
        spec = TABLES["items"]
        for s, url in urls.items():
            backends[s].create_table(url, "items", spec["key"], spec["columns"])
        doc = {
            "sites": {s: {"url": u} for s, u in urls.items()},
            "tables": {"items": {"key": "id", **spec["config"]}},  # type: ignore[dict-item]
            "links": LINKS,
        }
        path = tmp_path / "topology.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        cl = MixedCluster(backends, load_topology(path), urls)
        api.init(cl.topo)
        prefixes(cl)
        kill(cl, "s3", tmp_path)
        r = mm("remove-site", "-t", str(path), "s3", "--force", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        rep = json.loads(r.stdout)
        assert [(g["site"], g["from"], g["applied"]) for g in rep["relayed"]] == [("s2", "s1", 5)] and rep["ok"]
        _converge_without_s3(cl)
    finally:
        for b in made.values():
            b.cleanup()


HELD_LINKS = [{"from": a, "to": b} for a, b in (("a", "b"), ("b", "a"), ("b", "c"), ("c", "b"))]


def _held_at_b_then_a_dies(backend: Backend, tmp_path: Path) -> TestCluster:
    """a -> b -> c (c hears of a only through b). b rejects a's first insert (held in its error
    queue) and applies the second, whose relay to c waits behind the held one; then a dies."""
    from test_error_queue import reject_negative_qty

    cl = make_cluster(backend, tmp_path, ["a", "b", "c"], TABLES, links=HELD_LINKS)
    reject_negative_qty(cl, "b")
    cl.execute("a", "INSERT INTO items (name, qty, label) VALUES ('owed', -1, 'x')")
    cl.execute("a", "INSERT INTO items (name, qty, label) VALUES ('paid', 1, 'y')")
    cl.refresh_until_quiet()
    assert [r[1] for r in cl.rows("b", "items")] == ["paid"] and cl.rows("c", "items") == []
    kill(cl, "a", tmp_path)
    return cl


def test_changes_held_from_a_dead_site_keep_its_snapshots_until_retried(backend: Backend, tmp_path: Path) -> None:
    """remove-site --force of a whose changes b holds in its error queue (and one b applied whose
    relay waits behind them) keeps b's snapshot of a, where their values are, names them with the
    fix and exits 1: before, it dropped the snapshot and exited 0, `errors` then failed on the
    missing table, the held change could never be retried, and c never got the change b applied
    (b and c differed for good, nothing said). `errors` lists b's queue although a is gone; once
    the cause is fixed and the change retried, a second run drops everything and c gets both."""
    from test_error_queue import allow_negative_qty

    cl = _held_at_b_then_a_dies(backend, tmp_path)
    topo = str(cl.topo.path)
    r = mm("remove-site", "-t", topo, "a", "--force", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    (why,) = rep["kept"]
    assert "'b' has, in table 'items', 1 change(s) from 'a' held in its error queue" in why
    assert "1 change(s) applied from 'a' whose relay waits behind a change held there" in why
    assert "multimaster errors retry -t FILE --site b --all" in why and rep["dropped"] == {}
    assert not any("snapshot" in x for x in rep["cleaned"]["b"])
    r = mm("errors", "-t", topo, "--json")
    assert r.returncode == 1 and "not reached:" in r.stderr and "site 'a'" in r.stderr, r.stdout + r.stderr
    (held,) = json.loads(r.stdout)
    assert held["site"] == "b" and held["change"]["values"]["name"] == "owed" and "qty" in held["error"]
    allow_negative_qty(cl, "b")
    r = mm("errors", "retry", "-t", topo, "--site", "b", "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mm("remove-site", "-t", topo, "a", "--force", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["kept"] == [] and rep["dropped"] == {}
    without(cl, "a")
    cl.refresh_until_quiet()
    assert sorted(r[1] for r in cl.rows("c", "items")) == ["owed", "paid"]
    assert cl.rows("b", "items") == cl.rows("c", "items")


def test_changes_held_from_a_dead_site_skipped_let_what_waited_behind_them_through(
    sqlite_backend: Backend, tmp_path: Path
) -> None:
    """The other way out: the held change skipped at b, remove-site again drops a's snapshots and
    exits 0, and the change that waited behind it reaches c. A queue row whose snapshot is gone
    (as an earlier release's remove-site left it) is still listed, its values unknown."""
    cl = _held_at_b_then_a_dies(sqlite_backend, tmp_path)
    topo = str(cl.topo.path)
    assert mm("remove-site", "-t", topo, "a", "--force").returncode == 1
    r = mm("errors", "-t", topo, "--site", "b", "--json")
    assert r.returncode == 1, r.stdout + r.stderr  # a change is held
    (held,) = json.loads(r.stdout)
    r = mm("errors", "skip", "-t", topo, "--site", "b", "--id", str(held["id"]), "--reason", "a is gone")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mm("remove-site", "-t", topo, "a", "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    without(cl, "a")
    cl.refresh_until_quiet()
    # (the key differs: b kept the skipped insert's rank, as a deleted row's; c never heard of it)
    assert [r[1:] for r in cl.rows("b", "items")] == [r[1:] for r in cl.rows("c", "items")] == [("paid", 1, "y")]
    r = mm("errors", "-t", topo, "--all", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    (skipped,) = json.loads(r.stdout)
    assert skipped["state"] == "skipped" and skipped["change"] is None
