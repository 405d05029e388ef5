"""Property tests: random histories at 2-5 sites, random topologies and random refresh schedules.

After a final quiet round every site must hold the same rows and keys, equal to a reference model
written here from the rules alone (it shares no code with the planner):
- a row's identity is its insert's version; its key is base_max + rank of the identity among every
  identity ever inserted (deleted ones included);
- a delete removes the row for good;
- each column under `latest` ends with the value of the change with the highest version that set it;
- an `additive` column ends with its inserted value plus every update's (new - old).
The model's input is what each site's capture triggers logged for the applications' own writes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from clusters import apply_path, make_cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SITE_NAMES = ["s1", "s2", "s3", "s4", "s5"]
COLS = ["name", "price", "qty"]  # sorted: bit i of a mask is COLS[i]


def table(additive: bool, grouped: bool = False) -> dict:  # type: ignore[type-arg]
    cfg: dict = {"columns": {"qty": "additive"}} if additive else {}  # type: ignore[type-arg]
    if grouped:  # name and price win together: the capture carries both, so the model needs no change
        cfg["groups"] = {"pair": {"columns": ["name", "price"]}}
    return {"items": {"key": "id", "columns": {"name": "text", "qty": "int", "price": "real"}, "config": cfg}}


op = st.one_of(
    st.tuples(
        st.just("ins"), st.integers(0, 4), st.sampled_from(["a", "b", "c", "ü", ""]), st.integers(-5, 50), st.integers(0, 9)
    ),
    st.tuples(
        st.just("upd"),
        st.integers(0, 4),
        st.integers(0, 50),
        st.sets(st.sampled_from(COLS), min_size=1),
        st.sampled_from(["x", "y", "z"]),
        st.integers(-3, 3),
        st.integers(0, 9),
    ),
    st.tuples(st.just("del"), st.integers(0, 4), st.integers(0, 50)),
    st.tuples(st.just("refresh"), st.integers(0, 40)),
)


def reference(cl, sites: list[str], base: list[tuple], additive: bool) -> list[tuple]:  # type: ignore[no-untyped-def, type-arg]
    base_max = max((r[1] for r in base), default=0)
    changes = []
    for s in sites:
        c = cl.db(s)
        changes += c.execute(
            "SELECT ver, op, rid, mask, n_name, n_price, n_qty, o_qty FROM _mm_log_items WHERE origin = ?", (s,)
        ).fetchall()
        c.close()
    changes.sort()
    rows: dict[str, dict] = {}  # type: ignore[type-arg]
    for r in base:
        rid = "0" * 19 + ":#" + str(r[1])
        rows[rid] = {"key": r[1], "name": ["", r[2]], "price": ["", r[4]], "qty": ["", r[3]], "alive": True}
    identities = set()
    for ver, op_, rid, mask, n_name, n_price, n_qty, o_qty in changes:
        if op_ == "I":
            identities.add(rid)
            rows.setdefault(rid, {"alive": True})
            rows[rid].update({"name": [ver, n_name], "price": [ver, n_price], "qty": [ver, n_qty]})
    for ver, op_, rid, mask, n_name, n_price, n_qty, o_qty in changes:
        if op_ == "D":
            rows[rid]["alive"] = False
        elif op_ == "U":
            row = rows[rid]
            for i, (col, val) in enumerate((("name", n_name), ("price", n_price), ("qty", n_qty))):
                if not mask >> i & 1:
                    continue
                if col == "qty" and additive:
                    row["qty"][1] += val - o_qty
                elif ver > row[col][0]:
                    row[col] = [ver, val]
    for i, rid in enumerate(sorted(identities)):
        rows[rid]["key"] = base_max + i + 1
    out = [(r["key"], r["name"][1], r["qty"][1], r["price"][1]) for r in rows.values() if r["alive"]]
    return sorted(out)


@settings(
    max_examples=int(os.environ.get("MM_PROPERTY_EXAMPLES", "35")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fast=st.booleans(),
    n_sites=st.integers(2, 5),
    links=st.sampled_from(["mesh", "ring", "star", "chain"]),
    base_n=st.integers(0, 3),
    additive=st.booleans(),
    grouped=st.booleans(),
    ops=st.lists(op, min_size=1, max_size=30),
)
def test_random_histories_converge_to_the_reference(sqlite_backend, n_sites, links, base_n, additive, grouped, ops, fast):  # type: ignore[no-untyped-def]
    sites = SITE_NAMES[:n_sites]
    link_doc = {"star": "s1"} if links == "star" else {"chain": sites} if links == "chain" else links
    tmp = Path(tempfile.mkdtemp(prefix="mm-prop-"))
    restore = apply_path(fast)  # the fast path or the planner alone: both are tested
    try:
        base = [("items", k, f"base{k}", k, float(k)) for k in range(1, base_n + 1)]
        cl = make_cluster(sqlite_backend, tmp, sites, table(additive, grouped), link_doc, base={s: base for s in sites})
        link_list = list(cl.topo.links)
        for o in ops:
            kind = o[0]
            if kind == "refresh":
                ln = link_list[o[1] % len(link_list)]
                cl.refresh(ln.target, ln.source)
                continue
            site = sites[o[1] % n_sites]
            if kind == "ins":
                cl.execute(site, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", (o[2], o[3], o[4] / 4))
                continue
            keys = [r[0] for r in cl.rows(site, "items")]
            if not keys:
                continue
            key = keys[o[2] % len(keys)]
            if kind == "del":
                cl.execute(site, "DELETE FROM items WHERE id = ?", (key,))
            else:
                _, _, _, cols, name, dq, price = o
                sets, params = [], []
                if "name" in cols:
                    sets.append("name = ?")
                    params.append(name)
                if "qty" in cols:
                    sets.append("qty = qty + ?")
                    params.append(dq)
                if "price" in cols:
                    sets.append("price = ?")
                    params.append(price / 4)
                cl.execute(site, f"UPDATE items SET {', '.join(sets)} WHERE id = ?", (*params, key))
        cl.refresh_until_quiet()
        expected = reference(cl, sites, base, additive)
        for s in sites:
            assert cl.rows(s, "items") == expected, f"site {s}"
    finally:
        restore()
        shutil.rmtree(tmp, ignore_errors=True)


# ---- natural keys ------------------------------------------------------------------------------
# A natural key's identity is an incarnation (docs/conflicts.md). The model, from the rules alone:
# group every change the sites logged by rid; a rid is alive iff it was inserted, never deleted, and
# no greater rid of the same key was inserted; its values come from its own inserts and updates
# (`latest` label: the highest version that set it; `additive` n: inserted values plus every
# update's delta); the table holds the alive rid of each key. A few keys, so lives collide.

NKEYS = ["a", "b", "c"]
TAGS = {
    "tags": {"key": "code", "auto": False, "columns": {"label": "text", "n": "int"}, "config": {"columns": {"n": "additive"}}}
}

nkey = st.sampled_from(["a", "a", "b", "c"])
nat_op = st.one_of(
    st.tuples(st.just("ins"), st.integers(0, 4), nkey, st.sampled_from(["p", "q", "r"]), st.integers(-5, 9)),
    st.tuples(
        st.just("upd"),
        st.integers(0, 4),
        nkey,
        st.sets(st.sampled_from(["label", "n"]), min_size=1),
        st.sampled_from(["x", "y", "z"]),
        st.integers(-3, 3),
    ),
    st.tuples(st.just("del"), st.integers(0, 4), nkey),
    # an application deleting a key and inserting it again (one transaction)
    st.tuples(st.just("again"), st.integers(0, 4), nkey, st.sampled_from(["p", "q"]), st.integers(0, 9)),
    # SQLite's INSERT OR REPLACE of a live key: no delete trigger fires, a new life all the same
    st.tuples(st.just("rep"), st.integers(0, 4), nkey, st.sampled_from(["p", "q"]), st.integers(0, 9)),
    st.tuples(st.just("refresh"), st.integers(0, 40)),
)


def natural_reference(cl, sites: list[str], base: list[tuple]) -> tuple[list[tuple], dict[str, bool]]:  # type: ignore[no-untyped-def, type-arg]
    """The rows every site must end with, and every rid with whether it is alive."""
    changes = []
    for s in sites:
        c = cl.db(s)
        changes += c.execute(
            "SELECT ver, op, rid, key, mask, n_label, n_n, o_n FROM _mm_log_tags WHERE origin = ?", (s,)
        ).fetchall()
        c.close()
    lives: dict[str, dict] = {}  # type: ignore[type-arg]
    for _, key, label, n in base:
        lives["k:" + key] = {"key": key, "ins": True, "del": False, "label": ("", label), "n": n}
    for ver, op_, rid, key, mask, n_label, n_n, o_n in sorted(changes):
        r = lives.setdefault(rid, {"key": key, "ins": False, "del": False, "label": None, "n": 0})
        assert r["key"] == key
        if op_ == "I":
            r["ins"] = True
            if r["label"] is None or ver > r["label"][0]:
                r["label"] = (ver, n_label)
            r["n"] += n_n
        elif op_ == "D":
            r["del"] = True
        else:
            if mask & 1 and (r["label"] is None or ver > r["label"][0]):
                r["label"] = (ver, n_label)
            if mask & 2:
                r["n"] += n_n - o_n
    alive = {
        rid: r["ins"]
        and not r["del"]
        and not any(o["key"] == r["key"] and o["ins"] and other > rid for other, o in lives.items())
        for rid, r in lives.items()
    }
    rows = sorted((r["key"], r["label"][1], r["n"]) for rid, r in lives.items() if alive[rid])
    assert len({k for k, _, _ in rows}) == len(rows), "two live incarnations of one key"
    return rows, alive


@settings(
    max_examples=int(os.environ.get("MM_PROPERTY_EXAMPLES", "35")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fast=st.booleans(),
    n_sites=st.sampled_from([2, 2, 3, 3, 4]),
    links=st.sampled_from(["mesh", "ring", "star", "chain"]),
    base_n=st.integers(0, 2),
    ops=st.lists(nat_op, min_size=1, max_size=40),
)
def test_natural_key_histories_converge_to_the_reference(sqlite_backend, n_sites, links, base_n, ops, fast):  # type: ignore[no-untyped-def]
    sites = SITE_NAMES[:n_sites]
    link_doc = {"star": "s1"} if links == "star" else {"chain": sites} if links == "chain" else links
    tmp = Path(tempfile.mkdtemp(prefix="mm-nat-"))
    restore = apply_path(fast)  # the fast path or the planner alone: both are tested
    try:
        base = [("tags", k, f"base-{k}", i) for i, k in enumerate(NKEYS[:base_n])]
        cl = make_cluster(sqlite_backend, tmp, sites, TAGS, link_doc, base={s: base for s in sites})
        link_list = list(cl.topo.links)
        for o in ops:
            kind = o[0]
            if kind == "refresh":
                ln = link_list[o[1] % len(link_list)]
                cl.refresh(ln.target, ln.source)
                continue
            site, key = sites[o[1] % n_sites], o[2]
            present = any(r[0] == key for r in cl.rows(site, "tags"))
            if kind == "ins" and not present:
                cl.execute(site, "INSERT INTO tags (code, label, n) VALUES (?, ?, ?)", (key, o[3], o[4]))
            elif kind == "rep" and present:
                cl.execute(site, "INSERT OR REPLACE INTO tags (code, label, n) VALUES (?, ?, ?)", (key, o[3], o[4]))
            elif kind == "again" and present:
                c = cl.db(site)
                c.execute("DELETE FROM tags WHERE code = ?", (key,))
                c.execute("INSERT INTO tags (code, label, n) VALUES (?, ?, ?)", (key, o[3], o[4]))
                c.commit()
                c.close()
            elif kind == "del":
                cl.execute(site, "DELETE FROM tags WHERE code = ?", (key,))
            elif kind == "upd":
                _, _, _, cols, label, dn = o
                sets = [s for c, s in (("label", "label = ?"), ("n", "n = n + ?")) if c in cols]
                params = [p for c, p in (("label", label), ("n", dn)) if c in cols]
                cl.execute(site, f"UPDATE tags SET {', '.join(sets)} WHERE code = ?", (*params, key))
        cl.refresh_until_quiet()
        expected, alive = natural_reference(cl, sites, base)
        shadows = []
        for s in sites:
            assert cl.rows(s, "tags") == expected, f"site {s}"
            c = cl.db(s)
            shadows.append(c.execute("SELECT rid, deleted FROM _mm_shadow_tags ORDER BY rid").fetchall())
            c.close()
            assert {rid: deleted is None for rid, deleted in shadows[-1]} == alive, f"incarnations at site {s}"
        # and their tombstones alike (the next life of a key is then named alike everywhere)
        assert all(sh == shadows[0] for sh in shadows), "tombstones differ"
    finally:
        restore()
        shutil.rmtree(tmp, ignore_errors=True)


# ---- foreign keys -----------------------------------------------------------------------------
# parent(id, name) <- child(id, name, parent_id REFERENCES parent ON DELETE CASCADE, pname): the
# application writes with foreign keys enforced and records in `pname`, in the same statement, the
# name of the parent it meant (names are unique). The model, from the rules alone (docs/foreign-keys.md):
# a parent lives iff never deleted; a child lives iff never deleted and no change of it named a
# parent that was deleted (delete wins, whichever arrives first); its pname is the latest set. At
# every site each live child's parent_id must name the parent called pname.

FK_TABLES = {
    "parent": {"key": "id", "columns": {"name": "text"}},
    "child": {
        "key": "id",
        "columns": {"name": "text", "parent_id": "INTEGER REFERENCES parent(id) ON DELETE CASCADE", "pname": "text"},
    },
}

fk_op = st.one_of(
    st.tuples(st.just("parent"), st.integers(0, 4)),
    st.tuples(st.just("child"), st.integers(0, 4), st.integers(0, 50)),
    st.tuples(st.just("move"), st.integers(0, 4), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("del_parent"), st.integers(0, 4), st.integers(0, 50)),
    st.tuples(st.just("del_child"), st.integers(0, 4), st.integers(0, 50)),
    st.tuples(st.just("refresh"), st.integers(0, 40)),
)


def fk_reference(cl, sites: list[str]) -> tuple[set[str], dict[str, str]]:  # type: ignore[no-untyped-def]
    """The live parents' names, and every live child's name -> its parent's name."""
    plog, clog = [], []
    for s in sites:
        c = cl.db(s)
        plog += c.execute("SELECT ver, op, rid, n_name FROM _mm_log_parent WHERE origin = ?", (s,)).fetchall()
        clog += c.execute("SELECT ver, op, rid, mask, n_name, n_pname FROM _mm_log_child WHERE origin = ?", (s,)).fetchall()
        c.close()
    pname_of = {rid: name for _, op_, rid, name in plog if op_ == "I"}
    dead_parents = {pname_of[rid] for _, op_, rid, _ in plog if op_ == "D"}
    children: dict[str, dict] = {}  # type: ignore[type-arg]
    for ver, op_, rid, mask, name, pname in sorted(clog):
        ch = children.setdefault(rid, {"alive": True, "named": set()})
        if op_ == "I":
            ch.update(name=name, pname=pname)
            ch["named"].add(pname)
        elif op_ == "D":
            ch["alive"] = False
        elif mask & 4:  # COLS of child, sorted: name, parent_id, pname
            ch["pname"] = pname
            ch["named"].add(pname)
    live = set(pname_of.values()) - dead_parents
    kids = {ch["name"]: ch["pname"] for ch in children.values() if ch["alive"] and not (ch["named"] & dead_parents)}
    return live, kids


@settings(
    max_examples=int(os.environ.get("MM_PROPERTY_EXAMPLES", "35")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fast=st.booleans(),
    n_sites=st.sampled_from([2, 3, 3, 4]),
    links=st.sampled_from(["mesh", "ring", "star", "chain"]),
    ops=st.lists(fk_op, min_size=1, max_size=30),
)
def test_foreign_key_histories_keep_every_child_with_its_parent(sqlite_backend, n_sites, links, ops, fast):  # type: ignore[no-untyped-def]
    sites = SITE_NAMES[:n_sites]
    link_doc = {"star": "s1"} if links == "star" else {"chain": sites} if links == "chain" else links
    tmp = Path(tempfile.mkdtemp(prefix="mm-fk-"))
    restore = apply_path(fast)  # the fast path or the planner alone: both are tested
    try:
        cl = make_cluster(sqlite_backend, tmp, sites, FK_TABLES, link_doc)
        link_list = list(cl.topo.links)
        made = 0

        def write(site: str, sql: str, params: tuple = ()) -> None:  # type: ignore[type-arg]
            c = cl.db(site)
            c.execute("PRAGMA foreign_keys = ON")
            c.execute(sql, params)
            c.commit()
            c.close()

        for o in ops:
            kind = o[0]
            if kind == "refresh":
                ln = link_list[o[1] % len(link_list)]
                cl.refresh(ln.target, ln.source)
                continue
            site = sites[o[1] % n_sites]
            parents = cl.rows(site, "parent")
            kids = cl.rows(site, "child")
            made += 1
            if kind == "parent":
                write(site, "INSERT INTO parent (name) VALUES (?)", (f"p{made}",))
            elif kind == "child" and parents:
                pid, pname = parents[o[2] % len(parents)]
                write(site, "INSERT INTO child (name, parent_id, pname) VALUES (?, ?, ?)", (f"c{made}", pid, pname))
            elif kind == "move" and parents and kids:
                pid, pname = parents[o[3] % len(parents)]
                write(site, "UPDATE child SET parent_id = ?, pname = ? WHERE id = ?", (pid, pname, kids[o[2] % len(kids)][0]))
            elif kind == "del_parent" and parents:
                write(site, "DELETE FROM parent WHERE id = ?", (parents[o[2] % len(parents)][0],))
            elif kind == "del_child" and kids:
                write(site, "DELETE FROM child WHERE id = ?", (kids[o[2] % len(kids)][0],))
        cl.refresh_until_quiet()
        live, kids_expected = fk_reference(cl, sites)
        for s in sites:
            c = cl.db(s)
            assert {r[0] for r in c.execute("SELECT name FROM parent")} == live, f"parents at {s}"
            got = dict(c.execute("SELECT c.name, p.name FROM child c LEFT JOIN parent p ON p.id = c.parent_id").fetchall())
            c.close()
            assert got == kids_expected, f"children at {s}"
        cl.assert_converged()
    finally:
        restore()
        shutil.rmtree(tmp, ignore_errors=True)
