"""A reference never applies as the origin's raw key (docs/foreign-keys.md "A reference without its
identity").

A change setting a column that references a renumbered table carries the referenced row's
identity (``f_<col>``); its key (``n_<col>``) is the row's key at the origin when the change was
written, which may name another row at the site applying it. Session 34 saw maria apply six orders
of a SQLite laptop with that key, each then referencing another customer than at every other site,
with `status` green: the first refresh after maria's daemon restarted had described `orders`
without its reference (another link's refresher was describing it at that moment, engine/site.py
`Site.info`), pulled the laptop's change log without the identities, and applied the keys as they
were. Both are forced here on every backend: a change-log entry whose identity is empty is held in
the error queue (and `status` exits 1), and a description in the making is not handed to another
thread.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from clusters import Backend, TestCluster, make_cluster, mm

from multimaster import api
from multimaster.engine import site as site_module
from multimaster.engine.refresh import refresh_link
from multimaster.engine.site import Site

TABLES = {
    "parent": {"key": "id", "columns": {"name": "text"}},
    "child": {"key": "id", "columns": {"name": "text", "parent_id": "INTEGER REFERENCES parent(id)"}},
}


def _q(cl: TestCluster) -> str:
    return "`" if cl.backend.name == "mysql" else '"'


def _app(cl: TestCluster, site: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    """One application transaction at `site`, foreign keys enforced."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        if cl.backend.name == "sqlite":
            cur.execute("PRAGMA foreign_keys = ON")
        cur.execute(sql.replace("?", cl.backend.param()), params)
        c.commit()
    finally:
        c.close()


def _one(cl: TestCluster, site: str, sql: str) -> Any:
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(sql)
        return cur.fetchall()
    finally:
        c.close()


def _parents_of_children(cl: TestCluster, site: str) -> set[tuple[Any, Any]]:
    """(child, its parent) by name at `site`, following the keys; a dangling reference as None."""
    return set(tuple(r) for r in _one(cl, site, "SELECT c.name, p.name FROM child c LEFT JOIN parent p ON p.id = c.parent_id"))


def _two_keys(cl: TestCluster) -> None:
    """p-b inserted at b, then p-a at a: once both sites have both, p-b (the older identity) has
    key 1 and p-a key 2 everywhere, while at a, before it pulls from b, p-a has key 1."""
    q = _q(cl)
    _app(cl, "b", f"INSERT INTO parent ({q}name{q}) VALUES ('p-b')")
    _app(cl, "a", f"INSERT INTO parent ({q}name{q}) VALUES ('p-a')")


def _empty_identity(cl: TestCluster, site: str, where: str) -> None:
    """Empty the identity of the referenced row in `site`'s change log entries of child `where`."""
    log = Site(site, cl.urls[site]).dialect.obj("child").log
    cl.execute(site, f"UPDATE {log} SET f_parent_id = NULL WHERE {where}")


def test_a_change_setting_a_reference_without_its_identity_is_held(backend: Backend, tmp_path: Path) -> None:
    """a's insert of a child of p-a (key 1 at a), its identity emptied in a's change log: at b,
    where key 1 is p-b, it is held in the error queue, not applied as key 1 (before session 34 b's
    child referenced p-b, every other site's p-a, and `status` exited 0). The rest of the batch
    flows; status exits 1 naming the hold; a retry refuses it again; a skip drops it. An update
    of the reference without its identity is held the same way."""
    cl = make_cluster(backend, tmp_path, ["a", "b"], TABLES)
    topo = str(tmp_path / "topology.yaml")
    q = _q(cl)
    _two_keys(cl)
    _app(cl, "a", f"INSERT INTO child ({q}name{q}, parent_id) VALUES ('c-a', (SELECT id FROM parent WHERE {q}name{q} = 'p-a'))")
    _app(cl, "a", f"INSERT INTO child ({q}name{q}, parent_id) VALUES ('c-ok', (SELECT id FROM parent WHERE {q}name{q} = 'p-a'))")
    _empty_identity(cl, "a", "n_name = 'c-a'")
    cl.refresh_until_quiet()  # no link error: the change is held, the link flows
    assert _parents_of_children(cl, "b") == {("c-ok", "p-a")}  # c-a is not there, and never as p-b's
    assert _parents_of_children(cl, "a") == {("c-a", "p-a"), ("c-ok", "p-a")}
    held = json.loads(mm("errors", "-t", topo, "--json", "--site", "b").stdout)
    assert [(h["table"], h["state"], h["origin"]) for h in held] == [("child", "failed", "a")]
    for part in ("table 'child'", "column 'parent_id'", "origin 'a'", "'parent' row", "f_parent_id is empty", "errors skip"):
        assert part in held[0]["error"], held[0]["error"]
    st = mm("status", "-t", topo)
    assert st.returncode == 1 and "held in the error queue" in st.stderr, st.stderr
    r = mm("errors", "retry", "-t", topo, "--site", "b", "--id", str(held[0]["id"]))
    assert r.returncode == 1 and "f_parent_id is empty" in r.stdout, r.stdout
    assert _parents_of_children(cl, "b") == {("c-ok", "p-a")}
    assert mm("errors", "skip", "-t", topo, "--site", "b", "--id", str(held[0]["id"]), "--reason", "no identity").returncode == 0
    # an update of the reference, its identity emptied: held the same way
    _app(cl, "a", f"UPDATE child SET parent_id = (SELECT id FROM parent WHERE {q}name{q} = 'p-b') WHERE {q}name{q} = 'c-ok'")
    _empty_identity(cl, "a", "op = 'U'")
    cl.refresh_until_quiet()
    assert _parents_of_children(cl, "b") == {("c-ok", "p-a")}
    held = json.loads(mm("errors", "-t", topo, "--json", "--site", "b").stdout)
    assert [(h["state"], h["op"]) for h in held] == [("failed", "U")]
    assert "the update" in held[0]["error"] and "set child.parent_id of the row again" in held[0]["error"]


def test_a_description_in_the_making_is_not_shared(backend: Backend, tmp_path: Path) -> None:
    """The daemon's first refreshes after a start: one Site of b, links c -> b and a -> b refreshed
    concurrently. The c -> b refresher is describing `child` (discovering its references) while
    the a -> b refresher describes the link's tables: a's child of p-a (key 1 at a, p-b's key at
    b) reaches b with its identity and references p-a there. Before session 34 the a -> b
    refresher took c -> b's description in the making, without its reference: the identities
    were not pulled (the snapshot's f_parent_id NULL) and b's child referenced p-b."""
    cl = make_cluster(backend, tmp_path, ["a", "b", "c"], TABLES)
    q = _q(cl)
    _two_keys(cl)
    _app(cl, "a", f"INSERT INTO child ({q}name{q}, parent_id) VALUES ('c-a', (SELECT id FROM parent WHERE {q}name{q} = 'p-a'))")
    real = site_module.discover
    inside, go_on = threading.Event(), threading.Event()

    def discovering(conn: Any, site: Any, info: Any, topo: Any) -> Any:
        if info.name == "child" and threading.current_thread().name == "c->b" and not inside.is_set():
            inside.set()
            assert go_on.wait(120), "the a -> b refresh did not end"
        return real(conn, site, info, topo)

    errors: list[BaseException] = []
    with api.Cluster(cl.topo) as shared:  # one daemon at b: its link refreshers share its sites

        def c_to_b() -> None:
            try:
                refresh_link(shared, "b", "c")
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        site_module.discover = discovering
        try:
            t = threading.Thread(target=c_to_b, name="c->b")
            t.start()
            assert inside.wait(120), "the c -> b refresh never described child"
            try:
                res = refresh_link(shared, "b", "a")
            finally:
                go_on.set()
                t.join()
        finally:
            site_module.discover = real
    assert not errors and res.error is None, (errors, res.error)
    log = Site("b", cl.urls["b"]).dialect.obj("child", "a").snapshot()
    assert _one(cl, "b", f"SELECT f_parent_id FROM {log}") != [(None,)]
    assert _parents_of_children(cl, "b") == {("c-a", "p-a")}
    cl.refresh_until_quiet()
    for s in ("a", "b", "c"):
        assert _parents_of_children(cl, s) == {("c-a", "p-a")}, s
    cl.assert_converged()


def test_a_retried_held_insert_references_the_row_its_identity_names(backend: Backend, tmp_path: Path) -> None:
    """A held insert of a renumbered table keeps its rank, and `errors retry` inserts its row there
    itself, not through the reconciler: its reference goes in as the key here of the row its
    identity names. a's child of p-a (key 1 at a, p-b's key at b) is held at b (its origin is made
    unknown, as a damaged peer's would be); once the origin is known, the retry gives it p-a.
    Before session 34 the retry inserted the origin's key: b's child referenced p-b."""
    from multimaster import store

    cl = make_cluster(backend, tmp_path, ["a", "b"], TABLES)
    topo = str(tmp_path / "topology.yaml")
    q = _q(cl)
    _two_keys(cl)
    cl.refresh("b", "a")  # p-a at b (key 2 there); a does not hear of p-b yet
    _app(cl, "a", f"INSERT INTO child ({q}name{q}, parent_id) VALUES ('c-a', (SELECT id FROM parent WHERE {q}name{q} = 'p-a'))")
    log = Site("a", cl.urls["a"]).dialect.obj("child").log
    ver = "substr(ver, 1, 20) || 's9'" if cl.backend.name != "mysql" else "CONCAT(substr(ver, 1, 20), 's9')"
    cl.execute("a", f"UPDATE {log} SET origin = 's9', ver = {ver} WHERE op = 'I'")
    cl.refresh("b", "a")
    held = json.loads(mm("errors", "-t", topo, "--json", "--site", "b").stdout)
    assert [(h["table"], h["state"], h["origin"]) for h in held] == [("child", "failed", "s9")]
    assert cl.rows("b", "child") == []  # held, its rank kept (its shadow row only)
    s = Site("b", cl.urls["b"])
    with s.write() as conn:  # s9 turns out to be a site removed from the cluster
        store.retired.record(conn, s.dialect, "s9", "2026-01-01T00:00:00Z")
    s.dispose()
    r = mm("errors", "retry", "-t", topo, "--site", "b", "--id", str(held[0]["id"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert _parents_of_children(cl, "b") == {("c-a", "p-a")}
    cl.refresh_until_quiet()
    for site in ("a", "b"):
        assert _parents_of_children(cl, site) == {("c-a", "p-a")}, site
    cl.assert_converged()
