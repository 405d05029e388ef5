"""A UNIQUE set marked with NULL over a reference column (docs/unique.md, docs/foreign-keys.md):
`child.parent_id INTEGER UNIQUE REFERENCES parent(id)` (a one-to-one link; policy `null`, the
default for a set with no text column). Two sites link a child to the same parent concurrently: one
child holds it, the other is marked (its parent_id NULL in the table, the parent it wants kept in
`_mm_unique_child`). When the parent is deleted, delete wins for both children at every site.

Before session 35 the marked child was out of reach of the deleting site's own referential action
(its table row holds NULL): ON DELETE CASCADE left it alive there alone; ON DELETE SET NULL left
its remembered parent, which it then regained: a foreign-key failure at every refresh (SQLite,
PostgreSQL) or a child naming a deleted parent (MariaDB, whose checks are off while the reconciler
applies). And a remembered parent key did not move with the parent's keys: a marked child regained
the key another parent has now.

Applications write with plain clients, foreign keys enforced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, TestCluster, make_cluster
from test_foreign_keys import app

from multimaster import api


def _cluster(backend: Backend, tmp: Path, on_delete: str) -> TestCluster:
    tables: dict[str, dict[str, Any]] = {
        "parent": {"key": "id", "columns": {"name": "varchar(40)"}},
        "child": {
            "key": "id",
            "columns": {"name": "varchar(40)", "parent_id": f"INTEGER REFERENCES parent(id) ON DELETE {on_delete}"},
            "config": {"unique": {"parent_id": "null"}},
        },
    }
    cl = make_cluster(backend, tmp, ["a", "b", "c"], tables, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_child_parent ON child (parent_id)")
    api.init(cl.topo)
    return cl


def _children(cl: TestCluster, site: str) -> dict[str, Any]:
    """child name -> the name of the parent it references at `site` ('dangling' for a key no
    parent has, None for NULL)."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute("SELECT c.name, c.parent_id, p.name FROM child c LEFT JOIN parent p ON p.id = c.parent_id")
        return {n: (None if pid is None else (p if p is not None else "dangling")) for n, pid, p in cur.fetchall()}
    finally:
        c.close()


def _two_children_one_marked(cl: TestCluster, lagging: str | None = None) -> None:
    """Parent p everywhere; then a links ann to it and b links bob to it, concurrently: bob's claim
    is later, bob is marked (parent_id NULL) at every site but `lagging`, which has neither yet."""
    app(cl, "a", ("INSERT INTO parent (name) VALUES (?)", ("p",)))
    cl.refresh_until_quiet()
    for site, name in (("a", "ann"), ("b", "bob")):
        app(cl, site, ("INSERT INTO child (name, parent_id) SELECT ?, id FROM parent WHERE name = 'p'", (name,)))
    for t, p in (("a", "b"), ("b", "a"), ("c", "a"), ("c", "b")):
        if lagging not in (t, p):
            cl.refresh(t, p)
    for s in ("a", "b", "c"):
        if s != lagging:
            assert _children(cl, s) == {"ann": "p", "bob": None}, s


@pytest.mark.parametrize("on_delete", ["CASCADE", "SET NULL"])
@pytest.mark.parametrize("deleter,lagging", [("c", None), ("a", "c")], ids=["all-marked", "one-lagging"])
def test_a_parent_deleted_takes_its_marked_child_along_at_every_site(
    backend: Backend, tmp_path: Path, on_delete: str, deleter: str, lagging: str | None
) -> None:
    cl = _cluster(backend, tmp_path, on_delete)
    _two_children_one_marked(cl, lagging)
    app(cl, deleter, ("DELETE FROM parent WHERE name = 'p'", ()))
    cl.refresh_until_quiet()  # no link fails (before: the foreign key refused the regain, ON DELETE SET NULL)
    want = {} if on_delete == "CASCADE" else {"ann": None, "bob": None}
    for s in cl.urls:
        assert _children(cl, s) == want, s  # before: bob alive at the deleting site (CASCADE), or 'dangling' (MariaDB)
    cl.assert_converged()
    # and the cluster keeps working: a new parent and a new child reach every site
    app(cl, "b", ("INSERT INTO parent (name) VALUES (?)", ("q",)))
    cl.refresh_until_quiet()
    app(cl, "c", ("INSERT INTO child (name, parent_id) SELECT 'cid', id FROM parent WHERE name = 'q'", ()))
    cl.refresh_until_quiet()
    for s in cl.urls:
        assert _children(cl, s) == dict(want, cid="q"), s
    cl.assert_converged()


def test_a_marked_childs_parent_follows_the_parents_key(backend: Backend, tmp_path: Path) -> None:
    """The parent a marked child wants is kept as its key at this site; a parent inserted earlier
    elsewhere arriving moves that key, and the kept one moves with it: when the holder lets go, the
    marked child regains its own parent, at every site."""
    cl = _cluster(backend, tmp_path, "CASCADE")
    app(cl, "a", ("INSERT INTO parent (name) VALUES (?)", ("early",)))  # ranks first; b learns of it last
    app(cl, "b", ("INSERT INTO parent (name) VALUES (?)", ("p",)))  # key 1 at b, until 'early' arrives
    cl.refresh("c", "b")
    app(cl, "b", ("INSERT INTO child (name, parent_id) SELECT 'bob', id FROM parent WHERE name = 'p'", ()))
    app(cl, "c", ("INSERT INTO child (name, parent_id) SELECT 'cid', id FROM parent WHERE name = 'p'", ()))  # later: marked
    cl.refresh("b", "c")
    assert _children(cl, "b") == {"bob": "p", "cid": None}
    cl.refresh("b", "a")  # 'early' takes key 1 at b: p moves to 2, and so does what cid wants
    assert _children(cl, "b") == {"bob": "p", "cid": None}
    app(cl, "b", ("DELETE FROM child WHERE name = 'bob'", ()))  # the holder lets go: cid regains p
    cl.refresh_until_quiet()
    for s in cl.urls:
        assert _children(cl, s) == {"cid": "p"}, s  # before: cid regained key 1, 'early', at b
    cl.assert_converged()


def _park_cluster(backend: Backend, tmp: Path, on_delete: str) -> TestCluster:
    """child.sku UNIQUE (policy park, the default for an integer NOT NULL set), child.parent_id a
    reference to parent: a parked child keeps its parent's key in `_mm_parked_child`."""
    tables: dict[str, dict[str, Any]] = {
        "parent": {"key": "id", "columns": {"name": "varchar(40)"}},
        "child": {
            "key": "id",
            "columns": {
                "name": "varchar(40)",
                "sku": "INTEGER NOT NULL",
                "parent_id": f"INTEGER REFERENCES parent(id) ON DELETE {on_delete}",
            },
        },
    }
    cl = make_cluster(backend, tmp, ["a", "b", "c"], tables, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_child_sku ON child (sku)")
    api.init(cl.topo)
    return cl


@pytest.mark.parametrize("on_delete", ["CASCADE", "SET NULL"])
def test_a_parent_deleted_takes_its_parked_child_along_at_every_site(backend: Backend, tmp_path: Path, on_delete: str) -> None:
    """a and b insert a child with sku 7 under parent p concurrently: bob's claim is later, bob is
    parked at every site (out of the table, its values, parent p's key among them, kept apart).
    Then c deletes p. Delete wins for bob as for ann: CASCADE, both go at every site; SET NULL,
    both hold NULL, and bob, returning once ann lets go of sku 7, references nothing."""
    cl = _park_cluster(backend, tmp_path, on_delete)
    app(cl, "a", ("INSERT INTO parent (name) VALUES (?)", ("p",)))
    cl.refresh_until_quiet()
    for site, name in (("a", "ann"), ("b", "bob")):
        app(cl, site, ("INSERT INTO child (name, sku, parent_id) SELECT ?, 7, id FROM parent WHERE name = 'p'", (name,)))
    cl.refresh_until_quiet()
    for s in cl.urls:
        assert _children(cl, s) == {"ann": "p"}, s  # bob parked
    app(cl, "c", ("DELETE FROM parent WHERE name = 'p'", ()))
    cl.refresh_until_quiet()  # no link fails
    if on_delete == "SET NULL":
        app(cl, "a", ("UPDATE child SET sku = 8 WHERE name = 'ann'", ()))  # bob returns
        cl.refresh_until_quiet()
    want = {} if on_delete == "CASCADE" else {"ann": None, "bob": None}
    for s in cl.urls:
        assert _children(cl, s) == want, s
    cl.assert_converged()
    assert _held(cl) == ""


def _held(cl: TestCluster) -> str:
    """What `multimaster errors` shows when some change is held or a row parked at a site ('' when
    none: it exits 0)."""
    from typer.testing import CliRunner

    from multimaster.cli import app as cli

    r = CliRunner().invoke(cli, ["errors", "-t", str(cl.topo.path)])
    return "" if r.exit_code == 0 else r.output


@pytest.mark.parametrize("on_delete", ["CASCADE", "SET NULL"])
@pytest.mark.parametrize("deleter,lagging", [("c", None), ("a", "c")], ids=["all-marked", "one-lagging"])
def test_a_natural_key_parent_deleted_takes_its_marked_child_along_at_every_site(
    backend: Backend, tmp_path: Path, on_delete: str, deleter: str, lagging: str | None
) -> None:
    """As above with a natural-key parent (`parent.code`, given by the application, never
    renumbered): the marked child keeps the code it wants in `_mm_unique_child`."""
    tables: dict[str, dict[str, Any]] = {
        "parent": {"key": "code", "columns": {"name": "varchar(40)"}, "auto": False},
        "child": {
            "key": "id",
            "columns": {"name": "varchar(40)", "parent_code": f"varchar(20) REFERENCES parent(code) ON DELETE {on_delete}"},
            "config": {"unique": {"parent_code": "null"}},
        },
    }
    cl = make_cluster(backend, tmp_path, ["a", "b", "c"], tables, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX ux_child_parent ON child (parent_code)")
    api.init(cl.topo)
    cl.execute("a", "INSERT INTO parent (code, name) VALUES (?, ?)", ("P1", "p"))  # (app() returns an id)
    cl.refresh_until_quiet()
    for site, name in (("a", "ann"), ("b", "bob")):
        app(cl, site, ("INSERT INTO child (name, parent_code) VALUES (?, 'P1')", (name,)))
    for t, p in (("a", "b"), ("b", "a"), ("c", "a"), ("c", "b")):
        if lagging not in (t, p):
            cl.refresh(t, p)
    for s in ("a", "b", "c"):
        if s != lagging:
            assert _coded(cl, s) == {"ann": "p", "bob": None}, s
    app(cl, deleter, ("DELETE FROM parent WHERE code = 'P1'", ()))
    cl.refresh_until_quiet()  # no link fails
    want = {} if on_delete == "CASCADE" else {"ann": None, "bob": None}
    for s in cl.urls:
        assert _coded(cl, s) == want, s
    cl.assert_converged()
    assert _held(cl) == ""
    # the code used again: a new parent P1 is not the deleted one; no child regains it
    cl.execute("b", "INSERT INTO parent (code, name) VALUES (?, ?)", ("P1", "q"))
    cl.refresh_until_quiet()
    for s in cl.urls:
        assert _coded(cl, s) == want, s
    cl.assert_converged()


def _coded(cl: TestCluster, site: str) -> dict[str, Any]:
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute("SELECT c.name, c.parent_code, p.name FROM child c LEFT JOIN parent p ON p.code = c.parent_code")
        return {n: (None if pc is None else (p if p is not None else "dangling")) for n, pc, p in cur.fetchall()}
    finally:
        c.close()
