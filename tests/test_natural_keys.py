"""Natural keys (`renumber: false`): a key's identity is an incarnation (docs/conflicts.md).

The first life of key k is 'k:<k>', a later one 'k:<k>@E' with E the highest delete version the
inserting site held for the earlier lives. An incarnation once deleted stays dead; the greatest
incarnation of a key supersedes every smaller one. The final state never depends on the order the
changes arrive in: every scenario below delivers them in different orders at different sites and
asserts the exact values the rules give.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import TestCluster, make_cluster

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.ops.instantiate import add_site

TAGS = {
    "tags": {"key": "code", "auto": False, "columns": {"label": "text", "n": "int"}, "config": {"columns": {"n": "additive"}}}
}


def tick() -> None:
    time.sleep(0.003)  # versions of successive writes at different sites in wall-clock order


def shadow(cl: TestCluster, site: str) -> list[tuple[Any, ...]]:
    """(rid, key, deleted) of every incarnation `site` knows, by rid."""
    name = {"postgresql": "_mm._mm_shadow_tags"}.get(cl.backend.name, "_mm_shadow_tags")
    key = "`key`" if cl.backend.name == "mysql" else "key"
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(f"SELECT rid, {key}, deleted FROM {name} ORDER BY rid")
        return [tuple(r) for r in cur.fetchall()]
    finally:
        c.close()


def kinds(cl: TestCluster, site: str) -> list[tuple[str, str]]:
    return sorted((c["kind"], c["decision"]) for c in api.conflicts(cl.topo, site=site, limit=0))


def assert_rows(cl: TestCluster, expected: list[tuple[Any, ...]]) -> None:
    for s in cl.urls:
        assert cl.rows(s, "tags") == expected, f"site {s}"


def test_reinsert_does_not_merge_an_older_concurrent_insert(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s1 and s2 insert x; s1 deletes it and inserts it again before hearing of s2's insert. s2's
    insert belongs to the first life, which s1's delete ended: the second life holds s1's values."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 's1', 1)")
    tick()
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('x', 's2', 1)")
    tick()
    cl.execute("s1", "DELETE FROM tags WHERE code = 'x'")
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 's1', 5)")
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "s1", 5)])
    for s in ("s1", "s2"):
        sh = shadow(cl, s)
        assert [r[0] for r in sh][0] == "k:x" and sh[0][2] is not None, sh  # the first life: dead
        assert sh[1][0] == "k:x@" + sh[0][2] and sh[1][2] is None, sh  # the second: after that delete
        assert len(sh) == 2
    assert shadow(cl, "s1") == shadow(cl, "s2")


def test_update_of_an_old_life_is_lost_in_every_arrival_order(backend, tmp_path):  # type: ignore[no-untyped-def]
    """All three sites hold x. s2 deletes x and inserts it again; s3, not having seen that, updates
    x. The update acted on the first life, which s2's delete ended: every site ends with s2's new
    row, whether the update arrived before the delete (s1), after the new life (s2) or was local (s3)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'base', 1)")
    cl.refresh_until_quiet()
    tick()
    cl.execute("s2", "DELETE FROM tags WHERE code = 'x'")
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('x', 'new', 10)")
    tick()
    cl.execute("s3", "UPDATE tags SET label = 's3', n = n + 3 WHERE code = 'x'")
    cl.refresh("s1", "s3")  # s1: the update first, on the old row
    assert cl.rows("s1", "tags") == [("x", "s3", 4)]
    cl.refresh("s1", "s2")  # then the delete and the new life
    cl.refresh("s2", "s3")  # s2: the update after its own new life
    cl.refresh("s3", "s2")
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "new", 10)])
    assert ("update_delete", "delete") in kinds(cl, "s2")


def test_late_delete_of_an_old_life_leaves_the_new_one(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s1 deletes x; later s2 (not having seen that) deletes x and inserts it again. s1's delete is
    older than the new life but acted on the first one: wherever it arrives, last or first, the new
    life stays."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'base', 1)")
    cl.refresh_until_quiet()
    cl.execute("s1", "DELETE FROM tags WHERE code = 'x'")
    tick()
    cl.execute("s2", "DELETE FROM tags WHERE code = 'x'")
    tick()
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('x', 's2', 7)")
    cl.refresh("s3", "s2")  # s3: the new life first ...
    assert cl.rows("s3", "tags") == [("x", "s2", 7)]
    cl.refresh("s3", "s1")  # ... then the older delete
    cl.refresh("s1", "s2")  # s1: its own delete first, then the new life
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "s2", 7)])
    sh = shadow(cl, "s1")
    assert sh == shadow(cl, "s2") == shadow(cl, "s3")
    # every site holds the lowest delete of the first life, whatever came first
    assert sh[0][0] == "k:x" and sh[0][2] < sh[1][0].removeprefix("k:x@")


def test_delete_and_reinsert_while_another_site_updates(backend, tmp_path):  # type: ignore[no-untyped-def]
    """An application at s1 deletes and re-inserts a key while s2 updates it: the new life keeps its
    own values; s2's update is discarded wherever it arrives (update_delete), and s2 deletes its
    updated row (delete_update)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('y', 'one', 1)")
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('z', 'keep', 2)")
    cl.refresh_until_quiet()
    tick()
    cl.execute("s2", "UPDATE tags SET label = 'two', n = n + 1 WHERE code = 'y'")
    tick()
    c = cl.db("s1")
    try:  # one application transaction
        cur = c.cursor()
        cur.execute("DELETE FROM tags WHERE code = 'y'")
        cur.execute("INSERT INTO tags (code, label, n) VALUES ('y', 'three', 30)")
        c.commit()
    finally:
        c.close()
    tick()
    cl.execute("s2", "UPDATE tags SET n = n + 100 WHERE code = 'z'")
    cl.refresh_until_quiet()
    assert_rows(cl, [("y", "three", 30), ("z", "keep", 102)])
    assert ("update_delete", "delete") in kinds(cl, "s1")
    assert ("delete_update", "delete") in kinds(cl, "s2")
    # and the new life replicates like any row afterwards
    cl.execute("s2", "UPDATE tags SET n = n + 1 WHERE code = 'y'")
    cl.execute("s1", "UPDATE tags SET n = n + 2 WHERE code = 'y'")
    cl.refresh_until_quiet()
    assert_rows(cl, [("y", "three", 33), ("z", "keep", 102)])


def test_concurrent_reinserts_after_different_deletes_the_greater_life_wins(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s1 and s2 each delete x and insert it again without hearing of the other. Their new lives
    follow different deletes: the greater one supersedes the other at every site (insert_replaces:
    'remote' where the smaller life was live, 'local' where it arrived dead)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'base', 1)")
    cl.refresh_until_quiet()
    cl.execute("s1", "DELETE FROM tags WHERE code = 'x'")
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 's1', 10)")
    tick()
    cl.execute("s2", "DELETE FROM tags WHERE code = 'x'")
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('x', 's2', 20)")
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "s2", 20)])
    assert kinds(cl, "s1") == [("insert_replaces", "remote")]
    assert kinds(cl, "s2") == [("insert_replaces", "local")]
    sh = shadow(cl, "s1")
    assert sh == shadow(cl, "s2") and [r[2] is None for r in sh] == [False, False, True]
    # the next life, inserted at either site, follows every delete both know: the same identity
    cl.execute("s2", "DELETE FROM tags WHERE code = 'x'")
    cl.refresh_until_quiet()
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'a', 1)")
    tick()
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('x', 'b', 2)")
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "b", 3)])  # one life inserted twice: merged by policy (additive n)
    assert shadow(cl, "s1") == shadow(cl, "s2") and len(shadow(cl, "s1")) == 4


def test_same_history_reinserts_are_one_life(backend, tmp_path):  # type: ignore[no-untyped-def]
    """Two sites that saw the same delete insert the key again concurrently: the same incarnation,
    an insert_insert conflict resolved per column (latest label, additive n)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'base', 1)")
    cl.refresh_until_quiet()
    cl.execute("s2", "DELETE FROM tags WHERE code = 'x'")
    cl.refresh_until_quiet()
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'a', 4)")
    tick()
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('x', 'b', 5)")
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "b", 9)])
    assert {k for k, _ in kinds(cl, "s1")} == {"insert_insert"}


def test_replace_statement_starts_a_new_life(backend, tmp_path):  # type: ignore[no-untyped-def]
    """REPLACE of a live key (SQLite's fires no delete trigger; MariaDB's does): a new life that
    supersedes the old one at every site, and a concurrent update of the old one is lost."""
    if backend.name == "postgresql":
        pytest.skip("PostgreSQL has no REPLACE statement")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'base', 1)")
    cl.refresh_until_quiet()
    cl.execute("s2", "UPDATE tags SET n = n + 5 WHERE code = 'x'")
    tick()
    cl.execute("s1", "REPLACE INTO tags (code, label, n) VALUES ('x', 'replaced', 2)")
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "replaced", 2)])
    sh = shadow(cl, "s1")
    assert sh == shadow(cl, "s2") and [r[2] is None for r in sh] == [False, True]


def test_add_site_copies_every_incarnation(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'one', 1)")
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('y', 'one', 1)")
    cl.refresh_until_quiet()
    for life in range(2):
        cl.execute("s1", "DELETE FROM tags WHERE code = 'x'")
        cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', ?, ?)", (f"life{life + 2}", life + 2))
        cl.refresh_until_quiet()
    cl.execute("s2", "DELETE FROM tags WHERE code = 'y'")
    cl.refresh_until_quiet()
    # s3 joins from s1 (copying its shadow); meanwhile s2 starts another life of x
    url = backend.new_site(tmp_path, "s3")
    backend.create_table(url, "tags", "code", TAGS["tags"]["columns"], False)
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    doc["sites"]["s3"] = {"url": url}
    path = tmp_path / "grown.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    big = TestCluster(backend, load_topology(path), {**cl.urls, "s3": url}, cl.tables)
    cl.execute("s2", "DELETE FROM tags WHERE code = 'x'")
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('x', 's2', 9)")
    add_site(big.topo, "s3", "s1")
    assert len(shadow(big, "s3")) == len(shadow(big, "s1")) == 4  # x: three lives, y: one
    big.execute("s3", "UPDATE tags SET n = n + 1 WHERE code = 'x'")  # on the life s3 holds: lost
    big.refresh_until_quiet()
    for s in big.urls:
        assert big.rows(s, "tags") == [("x", "s2", 9)], s
    assert shadow(big, "s1") == shadow(big, "s2") == shadow(big, "s3")
    big.execute("s3", "DELETE FROM tags WHERE code = 'x'")
    big.execute("s3", "INSERT INTO tags (code, label, n) VALUES ('x', 's3', 3)")
    big.refresh_until_quiet()
    for s in big.urls:
        assert big.rows(s, "tags") == [("x", "s3", 3)], s


def _old_layout(cl: TestCluster, site: str) -> None:
    """Make `site`'s natural-key shadow look like an installation made before incarnations:
    UNIQUE(key), no key index (and on SQLite, an earlier insert trigger)."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        if cl.backend.name == "sqlite":
            cur.execute('DROP INDEX "_mm_shadowk_tags"')
            cur.execute("CREATE TABLE old_shadow AS SELECT * FROM _mm_shadow_tags")
            cur.execute("DROP VIEW _mm_tombstones_tags")
            cur.execute("DROP TABLE _mm_shadow_tags")
            cur.execute(
                "CREATE TABLE _mm_shadow_tags (rid TEXT PRIMARY KEY, key TEXT NOT NULL UNIQUE, deleted TEXT, "
                "v_label TEXT, v_n TEXT)"
            )
            cur.execute("INSERT INTO _mm_shadow_tags SELECT * FROM old_shadow")
            cur.execute("DROP TABLE old_shadow")
            cur.execute(
                "CREATE VIEW _mm_tombstones_tags AS SELECT rid, key, deleted FROM _mm_shadow_tags WHERE deleted IS NOT NULL"
            )
            cur.execute("DROP TRIGGER _mm_cap_i_tags")  # an earlier body: the first life's identity only
            cur.execute(
                "CREATE TRIGGER _mm_cap_i_tags AFTER INSERT ON tags WHEN (SELECT applying FROM _mm_state) = 0 BEGIN "
                "SELECT RAISE(ABORT, 'the old trigger'); END"
            )
        elif cl.backend.name == "postgresql":
            cur.execute('DROP INDEX _mm."_mm_shadowk_tags"')
            cur.execute('ALTER TABLE _mm."_mm_shadow_tags" ADD CONSTRAINT "_mm_shadow_tags_key_key" UNIQUE (key)')
        else:
            cur.execute("ALTER TABLE _mm_shadow_tags DROP INDEX `_mm_shadowk_tags`, ADD UNIQUE KEY (`key`)")
        c.commit()
    finally:
        c.close()


def _key_indexes(cl: TestCluster, site: str) -> set[tuple[str, bool]]:
    """(index name, unique) of the indexes on the shadow's key column alone."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        if cl.backend.name == "sqlite":
            out = set()
            for r in cur.execute("PRAGMA index_list(_mm_shadow_tags)").fetchall():
                if [i[2] for i in cur.execute(f'PRAGMA index_info("{r[1]}")').fetchall()] == ["key"]:
                    out.add((r[1], bool(r[2])))
            return out
        if cl.backend.name == "postgresql":
            cur.execute(
                "SELECT i.relname, x.indisunique FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] "
                "WHERE x.indrelid = '_mm._mm_shadow_tags'::regclass AND x.indnatts = 1 AND a.attname = 'key'"
            )
            return {(r[0], bool(r[1])) for r in cur.fetchall()}
        cur.execute(
            "SELECT INDEX_NAME, NON_UNIQUE = 0 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = '_mm_shadow_tags' GROUP BY INDEX_NAME, NON_UNIQUE HAVING count(*) = 1 AND max(COLUMN_NAME) = 'key'"
        )
        return {(r[0], bool(r[1])) for r in cur.fetchall()}
    finally:
        c.close()


def test_init_migrates_a_shadow_with_a_unique_key(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS)
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'one', 1)")
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('y', 'one', 1)")
    cl.execute("s1", "DELETE FROM tags WHERE code = 'y'")
    cl.refresh_until_quiet()
    for s in ("s1", "s2"):
        _old_layout(cl, s)
        assert _key_indexes(cl, s) and all(u for _, u in _key_indexes(cl, s))
    before = {s: shadow(cl, s) for s in ("s1", "s2")}
    rep = api.init(cl.topo)  # idempotent init migrates
    assert rep.sites == {"s1": [], "s2": []}
    for s in ("s1", "s2"):
        assert _key_indexes(cl, s) == {("_mm_shadowk_tags", False)}, s
        assert shadow(cl, s) == before[s]
    api.init(cl.topo)  # and again: nothing left to do
    assert _key_indexes(cl, "s1") == {("_mm_shadowk_tags", False)}
    # several incarnations of a key now fit, and the triggers are today's
    cl.execute("s1", "DELETE FROM tags WHERE code = 'x'")
    cl.execute("s1", "INSERT INTO tags (code, label, n) VALUES ('x', 'two', 2)")
    cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('y', 'two', 2)")
    cl.refresh_until_quiet()
    assert_rows(cl, [("x", "two", 2), ("y", "two", 2)])
    assert [r[0].split("@")[0] for r in shadow(cl, "s1")] == ["k:x", "k:x", "k:y", "k:y"]
    assert shadow(cl, "s1") == shadow(cl, "s2")
