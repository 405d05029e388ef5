"""Foreign keys between replicated tables (docs/foreign-keys.md), on every backend.

parent(id auto) <- child(parent_id) <- grand(child_id), each replicated and renumbered. Applications
write with plain clients, foreign keys enforced (SQLite: PRAGMA foreign_keys = ON on their
connection); every site must end with the same rows, and every child with the same parent *by
identity* (its name here), whatever order links are refreshed in.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import BACKENDS, Backend, TestCluster, make_cluster, server_unavailable

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.errors import SchemaError


def _tables(on_update: str = "", on_delete: str = "") -> dict[str, dict[str, Any]]:
    act = (f" ON DELETE {on_delete}" if on_delete else "") + (f" ON UPDATE {on_update}" if on_update else "")
    return {
        "parent": {"key": "id", "columns": {"name": "text"}},
        "child": {"key": "id", "columns": {"name": "text", "parent_id": f"INTEGER REFERENCES parent(id){act}"}},
        "grand": {"key": "id", "columns": {"name": "text", "child_id": f"INTEGER REFERENCES child(id){act}"}},
    }


@dataclass
class MixedCluster(TestCluster):
    """A cluster whose sites are on different databases (backend per site)."""

    backends: dict[str, Backend] = field(default_factory=dict)

    def db(self, site: str) -> Any:
        return self.backends[site].connect(self.urls[site])


def _be(cl: TestCluster, site: str) -> Backend:
    return cl.backends[site] if isinstance(cl, MixedCluster) else cl.backend


def _q(cl: TestCluster, site: str = "a") -> str:
    return "`" if _be(cl, site).name == "mysql" else '"'


def app(cl: TestCluster, site: str, *stmts: tuple[str, Any]) -> list[Any]:
    """One application transaction at `site` with foreign keys enforced; returns each statement's
    new row id (the key the application was given). Params may be a function of the ids so far."""
    c = cl.db(site)
    ids = []
    try:
        cur = c.cursor()
        be = _be(cl, site)
        if be.name == "sqlite":
            cur.execute("PRAGMA foreign_keys = ON")
            c.execute("BEGIN")
        for sql, params in stmts:
            params = params(ids) if callable(params) else params
            sql = sql.replace("?", be.param())
            if be.name == "postgresql" and sql.lstrip().upper().startswith("INSERT"):
                sql += " RETURNING id"
                cur.execute(sql, params)
                ids.append(cur.fetchone()[0])
            else:
                cur.execute(sql, params)
                ids.append(getattr(cur, "lastrowid", None))
        c.commit()
    finally:
        c.close()
    return ids


def add_family(cl: TestCluster, site: str, tag: str) -> None:
    """Insert parent p-<tag>, its child c-<tag> and grandchild g-<tag> at `site`, one transaction each."""
    q = _q(cl, site)
    (pid,) = app(cl, site, (f"INSERT INTO parent ({q}name{q}) VALUES (?)", (f"p-{tag}",)))
    (cid,) = app(cl, site, (f"INSERT INTO child ({q}name{q}, parent_id) VALUES (?, ?)", (f"c-{tag}", pid)))
    app(cl, site, (f"INSERT INTO grand ({q}name{q}, child_id) VALUES (?, ?)", (f"g-{tag}", cid)))


def parent_key(cl: TestCluster, site: str, name: str) -> Any:
    """The key parent `name` has at `site`."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(f"SELECT id FROM parent WHERE name = '{name}'")
        return cur.fetchone()[0]
    finally:
        c.close()


def families(cl: TestCluster, site: str) -> set[tuple[Any, ...]]:
    """(grandchild, child, parent) by name, following the keys at `site`; a dangling reference
    shows as None."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(
            "SELECT g.name, c.name, p.name FROM grand g LEFT JOIN child c ON c.id = g.child_id "
            "LEFT JOIN parent p ON p.id = c.parent_id"
        )
        out = {tuple(r) for r in cur.fetchall()}
        cur.execute("SELECT c.name, p.name FROM child c LEFT JOIN parent p ON p.id = c.parent_id")
        return out | {("-", *r) for r in cur.fetchall()}
    finally:
        c.close()


def expected(tags: list[str]) -> set[tuple[Any, ...]]:
    return {(f"g-{t}", f"c-{t}", f"p-{t}") for t in tags} | {("-", f"c-{t}", f"p-{t}") for t in tags}


def fk_cluster(backend: Backend, tmp: Path, sites: list[str], tables: dict[str, Any] | None = None, **kw: Any) -> TestCluster:
    return make_cluster(backend, tmp, sites, tables or _tables(), **kw)


def check(cl: TestCluster, tags: list[str]) -> None:
    for s in cl.urls:
        assert families(cl, s) == expected(tags), s
    cl.assert_converged()


ORDERS = list(itertools.permutations(["a", "b", "c"]))


@pytest.mark.parametrize("order", ORDERS, ids=["".join(o) for o in ORDERS])
def test_concurrent_families_every_order(backend: Backend, tmp_path: Path, order: tuple[str, ...]) -> None:
    """Three sites each insert a parent, a child of it and a grandchild of that, concurrently;
    links are refreshed one by one in `order` (targets) with peers in reverse: renumbering moves
    keys at every site, and every child still has its own parent everywhere."""
    if backend.name != "sqlite" and ORDERS.index(order) != {"postgresql": 0, "mysql": 1}[backend.name]:
        pytest.skip("every order runs on SQLite; one on each server, whose clusters cost more")
    cl = fk_cluster(backend, tmp_path, ["a", "b", "c"])
    for s in ("a", "b", "c"):
        add_family(cl, s, s)
    for _ in range(2):
        for target in order:
            for peer in reversed(order):
                if peer != target:
                    cl.refresh(target, peer)
    check(cl, ["a", "b", "c"])
    # a second wave on top of renumbered keys
    for s in ("c", "a"):
        add_family(cl, s, s + "2")
    cl.refresh_until_quiet()
    check(cl, ["a", "b", "c", "a2", "c2"])


# c pulls a and b, b pulls a only (c's changes reach b through a): b does not relay a's changes,
# c has them from a directly, so c can hear of b's child before it hears of a's parent. (In a mesh
# every site relays what it applies, and b's log holds the parent before the child.)
NOT_A_MESH = [{"from": x, "to": y} for x, y in (("a", "b"), ("b", "a"), ("a", "c"), ("c", "a"), ("b", "c"))]


def test_child_before_parent_waits(backend: Backend, tmp_path: Path) -> None:
    """c hears of b's child (of a's parent) before it hears of the parent: the child waits in its
    snapshot, and the refresh from a, which brings the parent but no child, applies it."""
    cl = fk_cluster(backend, tmp_path, ["a", "b", "c"], links=NOT_A_MESH)
    q = _q(cl)
    (pid,) = app(cl, "a", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-x",)))
    cl.refresh("b", "a")
    bpid = parent_key(cl, "b", "p-x")
    (cid,) = app(cl, "b", (f"INSERT INTO child ({q}name{q}, parent_id) VALUES (?, ?)", ("c-x", bpid)))
    app(cl, "b", (f"INSERT INTO grand ({q}name{q}, child_id) VALUES (?, ?)", ("g-x", cid)))
    cl.refresh("c", "b")
    assert cl.rows("c", "child") == [] and cl.rows("c", "grand") == []  # waiting for p-x
    cl.refresh("c", "a")
    assert families(cl, "c") == expected(["x"])
    cl.refresh_until_quiet()
    check(cl, ["x"])


def test_reconcile_applies_parents_first(backend: Backend, tmp_path: Path) -> None:
    """`refresh --no-reconcile` then `reconcile`, with the children's tables listed first in the
    topology: one reconcile applies every family (parents first, as a refresh does); and when the
    parent is not there yet, 600 children wait together and arrive with it."""
    cl = fk_cluster(
        backend,
        tmp_path,
        ["b", "c", "a"],
        links=[{"from": x, "to": y} for x, y in (("b", "c"), ("c", "b"), ("b", "a"), ("c", "a"), ("a", "b"))],
    )  # c's parent is not relayed by b to a
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["tables"] = {t: doc["tables"][t] for t in ("grand", "child", "parent")}
    (tmp_path / "reordered.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    cl.topo = load_topology(tmp_path / "reordered.yaml")
    add_family(cl, "b", "x")
    api.refresh(cl.topo, "a", "b", reconcile_=False)
    api.reconcile(cl.topo, "a")
    assert families(cl, "a") == expected(["x"])
    q = _q(cl)
    (pid,) = app(cl, "c", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-y",)))
    cl.refresh("b", "c")
    bpid = parent_key(cl, "b", "p-y")
    app(cl, "b", *[(f"INSERT INTO child ({q}name{q}, parent_id) VALUES (?, ?)", (f"c-y{i}", bpid)) for i in range(600)])
    cl.refresh("a", "b")
    assert len(cl.rows("a", "child")) == 1  # c-x only: the 600 wait for p-y
    cl.refresh("a", "c")
    assert len(cl.rows("a", "child")) == 601
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_self_reference(backend: Backend, tmp_path: Path) -> None:
    """A table referencing itself (a tree): concurrent inserts of a node and its child at two sites,
    each a chain of three in one batch."""
    tables = {"node": {"key": "id", "columns": {"name": "text", "up": "INTEGER REFERENCES node(id)"}}}
    cl = make_cluster(backend, tmp_path, ["a", "b"], tables)
    q = _q(cl)
    for s in ("a", "b"):
        (r,) = app(cl, s, (f"INSERT INTO node ({q}name{q}, up) VALUES (?, NULL)", (f"{s}0",)))
        (m,) = app(cl, s, (f"INSERT INTO node ({q}name{q}, up) VALUES (?, ?)", (f"{s}1", r)))
        app(cl, s, (f"INSERT INTO node ({q}name{q}, up) VALUES (?, ?)", (f"{s}2", m)))
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("a", "b"):
        c = cl.db(s)
        try:
            cur = c.cursor()
            cur.execute("SELECT n.name, u.name FROM node n LEFT JOIN node u ON u.id = n.up")
            got = set(cur.fetchall())
        finally:
            c.close()
        assert got == {("a0", None), ("a1", "a0"), ("a2", "a1"), ("b0", None), ("b1", "b0"), ("b2", "b1")}, s


def test_on_update_cascade(backend: Backend, tmp_path: Path) -> None:
    """ON UPDATE CASCADE references follow moved keys too (the database or the reconciler moves
    them, never both)."""
    cl = fk_cluster(backend, tmp_path, ["a", "b", "c"], _tables(on_update="CASCADE"))
    for s in ("b", "c", "a"):
        add_family(cl, s, s)
    cl.refresh_until_quiet()
    check(cl, ["a", "b", "c"])


def test_update_moves_reference(backend: Backend, tmp_path: Path) -> None:
    """An application moves a child to another parent after renumbering: the move arrives by identity."""
    cl = fk_cluster(backend, tmp_path, ["a", "b"])
    for s in ("a", "b"):
        add_family(cl, s, s)
    cl.refresh_until_quiet()
    q = _q(cl)
    c = cl.db("b")
    try:
        cur = c.cursor()
        cur.execute("SELECT id FROM parent WHERE name = 'p-a'")
        pa = cur.fetchone()[0]
    finally:
        c.close()
    app(cl, "b", (f"UPDATE child SET parent_id = ? WHERE {q}name{q} = 'c-b'", (pa,)))
    add_family(cl, "a", "a3")  # a's keys move again meanwhile
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("a", "b"):
        fam = families(cl, s)
        assert ("-", "c-b", "p-a") in fam and ("g-b", "c-b", "p-a") in fam, s


def test_refused_at_init(backend: Backend, tmp_path: Path) -> None:
    """A replicated table referencing a table with an auto-counter key that is not replicated is
    refused at init, naming both."""
    tables = {
        "parent": {"key": "id", "columns": {"name": "text"}},
        "child": {"key": "id", "columns": {"name": "text", "parent_id": "INTEGER REFERENCES parent(id)"}},
    }
    cl = make_cluster(backend, tmp_path, ["a", "b"], tables, init=False)
    cl.topo.tables.pop("parent")
    with pytest.raises(SchemaError) as e:
        api.init(cl.topo)
    msg = str(e.value)
    assert "'child'" in msg and "'parent'" in msg and "not replicated" in msg


def test_keys_history(backend: Backend, tmp_path: Path) -> None:
    """Renumbering is recorded: the key an application was given finds its row again."""
    cl = fk_cluster(backend, tmp_path, ["a", "b"])
    q = _q(cl)
    app(cl, "a", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-a",)))
    (pb,) = app(cl, "b", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-b",)))
    cl.refresh_until_quiet()
    cl.assert_converged()
    now = api.current_key(cl.topo, "b", "parent", pb)
    c = cl.db("b")
    try:
        cur = c.cursor()
        cur.execute(f"SELECT {q}name{q} FROM parent WHERE id = {cl.backend.param()}", (now,))
        assert cur.fetchone()[0] == "p-b"
    finally:
        c.close()
    assert now != pb  # a's insert came first: b's parent moved
    hist = api.key_history(cl.topo, "b", "parent", pb)
    assert [(h["old_key"], h["new_key"]) for h in hist] == [(pb, now)]
    assert hist[0]["reason"] in ("shift", "rank")


@pytest.mark.parametrize("on_delete", ["", "CASCADE", "SET NULL"])
def test_parent_deleted_while_child_inserted(backend: Backend, tmp_path: Path, on_delete: str) -> None:
    """a deletes a parent while b inserts a child (and grandchild) of it: delete wins at every site,
    in either arrival order: the child is deleted (or its reference set NULL), with an `orphan`
    record in the conflict log."""
    cl = fk_cluster(backend, tmp_path, ["a", "b"], _tables(on_delete=on_delete))
    add_family(cl, "a", "x")
    add_family(cl, "a", "y")
    cl.refresh_until_quiet()
    q = _q(cl)
    app(
        cl,
        "a",
        (
            "DELETE FROM grand WHERE child_id IN (SELECT id FROM child WHERE parent_id IN (SELECT id FROM parent WHERE name = 'p-x'))",
            (),
        ),
    )
    app(cl, "a", ("DELETE FROM child WHERE parent_id IN (SELECT id FROM parent WHERE name = 'p-x')", ()))
    app(cl, "a", (f"DELETE FROM parent WHERE {q}name{q} = 'p-x'", ()))
    c = cl.db("b")
    try:
        cur = c.cursor()
        cur.execute("SELECT id FROM parent WHERE name = 'p-x'")
        px = cur.fetchone()[0]
    finally:
        c.close()
    (cid,) = app(cl, "b", (f"INSERT INTO child ({q}name{q}, parent_id) VALUES (?, ?)", ("c-new", px)))
    if cid is None:  # PostgreSQL: RETURNING gave it
        raise AssertionError("no key")
    app(cl, "b", (f"INSERT INTO grand ({q}name{q}, child_id) VALUES (?, ?)", ("g-new", cid)))
    cl.refresh_until_quiet()
    cl.assert_converged()
    want = expected(["y"])
    if on_delete == "SET NULL":
        want |= {("-", "c-new", None), ("g-new", "c-new", None)}
    for s in ("a", "b"):
        assert families(cl, s) == want, s
    kinds = [r["kind"] for r in api.conflicts(cl.topo, kind="orphan")]
    assert kinds, "no orphan recorded"


def test_keys_command(backend: Backend, tmp_path: Path) -> None:
    """`multimaster keys` as a user runs it: every move of a table, one key's row and its key now
    (--json), and clear refusals of an unknown table or site (exit 2)."""
    from clusters import mm

    cl = fk_cluster(backend, tmp_path, ["a", "b"])
    q = _q(cl)
    app(cl, "a", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-a",)))
    (pb,) = app(cl, "b", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-b",)))
    (cb,) = app(cl, "b", (f"INSERT INTO child ({q}name{q}, parent_id) VALUES (?, ?)", ("c-b", pb)))
    topo = str(tmp_path / "topology.yaml")
    assert mm("refresh", "-t", topo, "--until-quiet").returncode == 0
    r = mm("keys", "-t", topo, "--site", "b", "--table", "parent", "--key", str(pb), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["current_key"] == pb + 1 and [(m["old_key"], m["new_key"]) for m in out["moves"]] == [(pb, pb + 1)]
    assert out["moves"][0]["reason"] == "shift"
    r = mm("keys", "-t", topo, "--site", "b", "--table", "parent")
    assert r.returncode == 0 and "shift" in r.stdout, r.stdout + r.stderr
    # the child followed its parent: it names p-b by its new key
    c = cl.db("b")
    try:
        cur = c.cursor()
        cur.execute(f"SELECT parent_id FROM child WHERE id = {cl.backend.param()}", (cb,))
        assert cur.fetchone()[0] == out["current_key"]
    finally:
        c.close()
    # the key history goes with the conflict log's retention
    r = mm("purge", "-t", topo, "--conflicts-after", "0s", "--min-age", "0s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert api.key_history(cl.topo, "b", "parent") == []
    r = mm("keys", "-t", topo, "--site", "b", "--table", "nope")
    assert r.returncode == 2 and "nope" in (r.stdout + r.stderr)
    r = mm("keys", "-t", topo, "--site", "zz", "--table", "parent")
    assert r.returncode == 2 and "zz" in (r.stdout + r.stderr)


def _rows(cl: TestCluster, site: str, table: str) -> list[tuple[Any, ...]]:
    q = _q(cl, site)
    cols = ["id", *cl.tables[table]["columns"]]
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(f"SELECT {', '.join(q + x + q for x in cols)} FROM {q}{table}{q} ORDER BY {q}id{q}")
        return [tuple(r) for r in cur.fetchall()]
    finally:
        c.close()


def _family_sites(tmp: Path, kinds: dict[str, str], backends: dict[str, Backend]) -> tuple[dict[str, Any], dict[str, str]]:
    """A database per site of `kinds` (site -> backend name) holding the test's tables (_tables),
    each backend put in `backends` as it is made (the caller cleans them up): (tables, urls)."""
    for site, name in kinds.items():
        try:
            backends[site] = BACKENDS[name]()
        except ConnectionError as e:
            server_unavailable(name, str(e))
    tables = _tables()
    urls = {}
    for site, be in backends.items():
        urls[site] = be.new_site(tmp, site)
        for tb, spec in tables.items():
            be.create_table(urls[site], tb, spec["key"], spec["columns"])
    return tables, urls


def test_mixed_cluster(tmp_path: Path) -> None:
    """SQLite, PostgreSQL and MariaDB sites, each inserting families concurrently, twice: the same
    rows and the same parent of every child everywhere."""
    backends: dict[str, Backend] = {}
    try:
        tables, urls = _family_sites(tmp_path, {"lite": "sqlite", "pg": "postgresql", "maria": "mysql"}, backends)
        doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {tb: {"key": "id"} for tb in tables}, "links": "mesh"}
        (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
        cl = MixedCluster(backends["lite"], load_topology(tmp_path / "topology.yaml"), urls, tables, backends=backends)
        api.init(cl.topo)
        tags = []
        for wave in ("1", "2"):
            for s in ("maria", "lite", "pg"):
                add_family(cl, s, s + wave)
                tags.append(s + wave)
            cl.refresh_until_quiet()
        for s in urls:
            assert families(cl, s) == expected(tags), s
        for tb in tables:
            ref = _rows(cl, "lite", tb)
            for s in urls:
                assert _rows(cl, s, tb) == ref, (tb, s)
    finally:
        for be in backends.values():
            be.cleanup()


def test_add_site(backend: Backend, tmp_path: Path) -> None:
    """A site added to a running cluster copies the identities of references with the change log,
    and its own families and its peers' converge with the right parents."""
    from multimaster.ops.instantiate import add_site

    cl = fk_cluster(backend, tmp_path, ["a", "b"])
    for s in ("a", "b"):
        add_family(cl, s, s)
    cl.refresh_until_quiet()
    add_family(cl, "b", "b2")  # not pulled by a yet: c gets it from b's log
    url = backend.new_site(tmp_path, "c")
    for tb, spec in _tables().items():
        backend.create_table(url, tb, spec["key"], spec["columns"])
    path = tmp_path / "topology.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["sites"]["c"] = {"url": url}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cl.topo = load_topology(path)
    cl.urls["c"] = url
    add_site(cl.topo, "c", "a")
    add_family(cl, "c", "c")
    add_family(cl, "a", "a2")
    cl.refresh_until_quiet()
    check(cl, ["a", "b", "b2", "c", "a2"])


COPY_KINDS = [("postgresql", "sqlite"), ("postgresql", "postgresql"), ("postgresql", "mysql"), ("mysql", "mysql")]


@pytest.mark.parametrize("source,target", COPY_KINDS, ids=[f"{s}-to-{t}" for s, t in COPY_KINDS])
def test_add_site_from_a_peer_with_unranked_keys_and_holes(tmp_path: Path, source: str, target: str) -> None:
    """add-site copies a peer (PostgreSQL, MariaDB: keys drawn by concurrent writers are ranked by
    its next reconcile) whose local keys are not ranked yet and have holes (rolled-back inserts:
    the key counter is not transactional). The new site ranks the copied keys, and every column
    referencing them moves with them: each child keeps its parent. Before, the children were
    copied with the peer's keys: c-two named p-three (silently, exit 0), g-two a child key nobody
    held (a foreign-key error at add-site)."""
    from multimaster.ops.instantiate import add_site

    backends: dict[str, Backend] = {}
    try:
        tables, urls = _family_sites(tmp_path, {"a": source, "b": "sqlite", "c": target}, backends)
        doc = {
            "sites": {s: {"url": urls[s]} for s in ("a", "b")},
            "tables": {tb: {"key": "id"} for tb in tables},
            "links": "mesh",
        }
        (tmp_path / "two.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        cl = MixedCluster(
            backends["b"], load_topology(tmp_path / "two.yaml"), {s: urls[s] for s in ("a", "b")}, tables, backends=backends
        )
        api.init(cl.topo)
        q = _q(cl, "a")

        def rolled_back(table: str, values: str) -> None:
            c = cl.db("a")
            try:
                c.cursor().execute(f"INSERT INTO {table} ({q}name{q}{values}) VALUES ('rolled back'{', NULL' if values else ''})")
                c.rollback()
            finally:
                c.close()

        ins_p = f"INSERT INTO parent ({q}name{q}) VALUES (?)"
        ins_c = f"INSERT INTO child ({q}name{q}, parent_id) VALUES (?, ?)"
        (p_one,) = app(cl, "a", (ins_p, ("p-one",)))
        rolled_back("parent", "")
        (p_two,) = app(cl, "a", (ins_p, ("p-two",)))
        app(cl, "a", (ins_p, ("p-three",)))  # holds c-two's parent key once ranked
        app(cl, "a", (ins_c, ("c-one", p_one)))
        rolled_back("child", ", parent_id")
        (c_two,) = app(cl, "a", (ins_c, ("c-two", p_two)))
        # no child holds g-two's child key once ranked
        app(cl, "a", (f"INSERT INTO grand ({q}name{q}, child_id) VALUES (?, ?)", ("g-two", c_two)))
        want = {("-", "c-one", "p-one"), ("-", "c-two", "p-two"), ("g-two", "c-two", "p-two")}
        assert families(cl, "a") == want

        doc["sites"]["c"] = {"url": urls["c"]}
        (tmp_path / "three.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        cl.topo = load_topology(tmp_path / "three.yaml")
        cl.urls["c"] = urls["c"]
        add_site(cl.topo, "c", "a")
        assert families(cl, "c") == want
        cl.refresh_until_quiet()
        for s in urls:
            assert families(cl, s) == want, s
        for tb in tables:
            ref = _rows(cl, "a", tb)
            assert [k for k, *_ in ref] == list(range(1, len(ref) + 1)), tb  # ranked: no hole left
            for s in urls:
                assert _rows(cl, s, tb) == ref, (tb, s)
    finally:
        for be in backends.values():
            be.cleanup()


def test_many_writers_while_refreshing(backend: Backend, tmp_path: Path) -> None:
    """Applications insert families from several threads at two sites while a refresher loops:
    keys drawn concurrently are ranked and moved, and every reference follows."""
    import threading

    cl = fk_cluster(backend, tmp_path, ["a", "b"])
    tags: list[str] = []
    failures: list[BaseException] = []

    q = _q(cl)

    def writer(site: str, w: int) -> None:
        # a family per transaction: keys read in an earlier transaction may have moved since
        # (api.current_key translates them)
        try:
            for i in range(4):
                tag = f"{site}{w}-{i}"
                app(
                    cl,
                    site,
                    (f"INSERT INTO parent ({q}name{q}) VALUES (?)", (f"p-{tag}",)),
                    (f"INSERT INTO child ({q}name{q}, parent_id) VALUES (?, ?)", lambda ids, t=tag: (f"c-{t}", ids[0])),
                    (f"INSERT INTO grand ({q}name{q}, child_id) VALUES (?, ?)", lambda ids, t=tag: (f"g-{t}", ids[1])),
                )
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = []
    for s in ("a", "b"):
        for w in range(3):
            threads.append(threading.Thread(target=writer, args=(s, w)))
            tags += [f"{s}{w}-{i}" for i in range(4)]
    errors = cl.run_while_refreshing(threads)
    assert not errors and not failures, (errors, failures)
    cl.refresh_until_quiet()
    check(cl, tags)


@pytest.mark.parametrize("first", ["a", "c"])
def test_child_moved_away_from_a_parent_deleted_concurrently(backend: Backend, tmp_path: Path, first: str) -> None:
    """b inserts a child of p1 and then moves it to p2, while a deletes p1: the child referenced a
    deleted row, so it goes at every site — also where it had moved away before the delete
    arrived, and whether its insert and its move arrive in one batch or in two."""
    tables = {k: v for k, v in _tables().items() if k != "grand"}
    cl = fk_cluster(backend, tmp_path, ["a", "b", "c"], tables)
    q = _q(cl)
    for n in ("p1", "p2", "p3"):
        app(cl, "a", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", (n,)))
    cl.refresh_until_quiet()
    app(cl, "a", (f"DELETE FROM parent WHERE {q}name{q} = 'p1'", ()))
    app(cl, "b", ("INSERT INTO child (name, parent_id) SELECT 'c-moved', id FROM parent WHERE name = 'p1'", ()))
    app(cl, "b", ("UPDATE child SET parent_id = (SELECT id FROM parent WHERE name = 'p2') WHERE name = 'c-moved'", ()))
    app(cl, "b", ("INSERT INTO child (name, parent_id) SELECT 'c-kept', id FROM parent WHERE name = 'p3'", ()))
    if first == "a":
        cl.refresh("a", "b", batch_size=1)  # the insert alone: its parent is dead here already
        cl.refresh("b", "a")  # b hears of the delete after the child moved away
    else:
        cl.refresh("c", "b")  # c applies insert and move together, then hears of the delete
        cl.refresh("c", "a")
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("a", "b", "c"):
        assert {r[1] for r in cl.rows(s, "child")} == {"c-kept"}, s


def test_table_not_replicated_referencing_a_renumbered_one(backend: Backend, tmp_path: Path) -> None:
    """A local table (not replicated) whose rows reference a replicated, renumbered one: its
    references move with the keys too."""
    cl = fk_cluster(backend, tmp_path, ["a", "b"], init=False)
    q = _q(cl)
    for s in ("a", "b"):
        c = cl.db(s)
        c.cursor().execute(
            f"CREATE TABLE notes (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id), {q}txt{q} TEXT)"
        )
        c.commit()
        c.close()
    api.init(cl.topo)
    for s in ("a", "b"):
        add_family(cl, s, s)
    app(cl, "b", ("INSERT INTO notes (id, parent_id, txt) SELECT 1, id, 'about p-b' FROM parent WHERE name = 'p-b'", ()))
    cl.refresh_until_quiet()
    check(cl, ["a", "b"])
    c = cl.db("b")
    try:
        cur = c.cursor()
        cur.execute("SELECT p.name FROM notes n JOIN parent p ON p.id = n.parent_id")
        assert [tuple(r) for r in cur.fetchall()] == [("p-b",)]
    finally:
        c.close()


def test_refused_actions_at_init(backend: Backend, tmp_path: Path) -> None:
    """A reference to a renumbered table that would not follow a moved key is refused, named."""
    tables = {
        "parent": {"key": "id", "columns": {"name": "text"}},
        "child": {"key": "id", "columns": {"name": "text", "parent_id": "INTEGER REFERENCES parent(id) ON UPDATE SET NULL"}},
    }
    cl = make_cluster(backend, tmp_path, ["a", "b"], tables, init=False)
    with pytest.raises(SchemaError) as e:
        api.init(cl.topo)
    assert "'child'" in str(e.value) and "'parent'" in str(e.value) and "ON UPDATE SET NULL" in str(e.value)


#: how an application locks the row it read a key of, per database (docs/foreign-keys.md "Keys read
#: by an application"); SQLite: a write transaction from its start (BEGIN IMMEDIATE) instead
SHARE_LOCK = {"postgresql": " FOR SHARE", "mysql": " LOCK IN SHARE MODE", "sqlite": ""}


def test_a_key_read_under_a_share_lock_stays_the_rows_until_commit(backend: Backend, tmp_path: Path) -> None:
    """An application reads a parent's key, then inserts a child with it, in one transaction, while
    a refresh ranks an earlier parent from another site before it. The parent's key moves only
    after COMMIT when the transaction locked the row it read (SHARE_LOCK): the child it inserted
    references that parent at every site. (A plain read does not hold the key: the reconciler
    moves keys while no *writer* of the table is in flight.)"""
    import threading
    import time

    cl = fk_cluster(backend, tmp_path, ["a", "b"])
    q = _q(cl, "a")
    app(cl, "b", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-b",)))  # the earlier one: ranks first
    app(cl, "a", (f"INSERT INTO parent ({q}name{q}) VALUES (?)", ("p-a",)))
    be = _be(cl, "a")
    c = cl.db("a")
    done: list[Any] = []
    try:
        cur = c.cursor()
        if be.name == "sqlite":
            cur.execute("PRAGMA foreign_keys = ON")
            c.execute("BEGIN IMMEDIATE")
        cur.execute(f"SELECT id FROM parent WHERE {q}name{q} = 'p-a'{SHARE_LOCK[be.name]}")
        (pid,) = cur.fetchone()
        assert pid == 1
        t = threading.Thread(target=lambda: done.append(api.refresh(cl.topo, "a", "b")))
        t.start()
        time.sleep(1.0)  # the refresh reaches the parent's move and waits for this transaction
        cur.execute(f"INSERT INTO child ({q}name{q}, parent_id) VALUES ({be.param()}, {be.param()})", ("c-a", pid))
        c.commit()
    finally:
        c.close()
    t.join(120)
    assert done and not [r.error for r in done[0] if r.error]
    cl.refresh_until_quiet()
    for s in cl.urls:
        assert families(cl, s) == {("-", "c-a", "p-a")}, s
    assert parent_key(cl, "a", "p-a") == 2
    cl.assert_converged()


def test_a_child_deleted_by_cascade_has_no_current_key_anywhere(backend: Backend, tmp_path: Path) -> None:
    """A parent deleted where children reference it ON DELETE CASCADE: `keys --key` of a child says
    null at every site, MariaDB's included, whose cascade runs no trigger and leaves the child's
    identity live in its shadow (before: its key, for a row that is gone)."""
    from clusters import mm

    cl = fk_cluster(backend, tmp_path, ["a", "b"], _tables(on_delete="CASCADE"))
    add_family(cl, "a", "a")
    cl.refresh_until_quiet()
    cid = parent_key(cl, "a", "p-a")
    q = _q(cl)
    app(cl, "a", (f"DELETE FROM parent WHERE {q}name{q} = ?", ("p-a",)))
    cl.refresh_until_quiet()
    topo = str(tmp_path / "topology.yaml")
    for s in ("a", "b"):
        for tb in ("child", "grand"):
            r = mm("keys", "-t", topo, "--site", s, "--table", tb, "--key", str(cid), "--json")
            assert r.returncode == 0, r.stdout + r.stderr
            assert json.loads(r.stdout)["current_key"] is None, (s, tb)
    cl.assert_converged()


@pytest.mark.parametrize("on_update", ["CASCADE", "NO ACTION"])
def test_a_key_shift_keeps_a_unique_index_over_the_referencing_column(backend: Backend, tmp_path: Path, on_update: str) -> None:
    """order_items UNIQUE (order_id, product_id), each of b's orders with one line for product 7;
    a's order, inserted first, arrives at b and shifts b's order keys up by one: the lines move
    (1, 7) -> (2, 7) while (2, 7) is not moved yet. MariaDB checks the index row by row, and one
    UPDATE through the key map held the change for good (Duplicate entry '2-7'): the lines move
    through keys above every key instead (references._move_column)."""
    tables = {
        "orders": {"key": "id", "columns": {"note": "text"}},
        "order_items": {
            "key": "id",
            "columns": {"order_id": f"INTEGER REFERENCES orders(id) ON UPDATE {on_update}", "product_id": "int"},
        },
    }
    cl = make_cluster(backend, tmp_path, ["a", "b"], tables, init=False)
    for s in cl.urls:
        cl.execute(s, "CREATE UNIQUE INDEX order_product ON order_items (order_id, product_id)")
    api.init(cl.topo)
    app(cl, "a", ("INSERT INTO orders (note) VALUES (?)", ("a-first",)))
    for i in range(3):
        app(
            cl,
            "b",
            ("INSERT INTO orders (note) VALUES (?)", (f"b-{i}",)),
            ("INSERT INTO order_items (order_id, product_id) VALUES (?, 7)", lambda ids: (ids[0],)),
        )
    cl.refresh_until_quiet()
    assert api.list_errors(cl.topo) == []
    cl.assert_converged()
    for s in cl.urls:
        c = cl.db(s)
        try:
            cur = c.cursor()
            cur.execute("SELECT o.id, o.note, i.product_id FROM order_items i JOIN orders o ON o.id = i.order_id ORDER BY o.id")
            assert [tuple(r) for r in cur.fetchall()] == [(2, "b-0", 7), (3, "b-1", 7), (4, "b-2", 7)], s
        finally:
            c.close()
