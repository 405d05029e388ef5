"""The conflict log operators work with: both row images, the rule, which side won and whether
each side was written here or replicated, filters by time, table and kind; and the columns added
to an existing conflict log by `init` (docs/conflicts.md, "The conflict log")."""

from __future__ import annotations

import time

import pytest
from clusters import make_cluster

from multimaster import api
from multimaster.errors import ConfigError
from multimaster.ops.metrics import parse_since

TABLES = {
    "items": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}},
    "notes": {"key": "id", "columns": {"body": "text"}},
}


def _drop_image_columns(cl, site):  # type: ignore[no-untyped-def]
    """Make `site`'s conflict log look like one created before the row images (and the heads)
    existed."""
    t = "_mm._mm_conflicts" if cl.backend.name == "postgresql" else "_mm_conflicts"
    for col in ("local_row", "remote_row", "heads"):
        cl.execute(site, f"ALTER TABLE {t} DROP COLUMN {col}")


def test_conflict_rows_carry_both_images_and_filters_work(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    _drop_image_columns(cl, "s1")
    api.init(cl.topo)  # the upgrade path: init adds what the new version needs, data kept
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('bolts', 10)")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('hello')")
    cl.refresh_until_quiet()
    before = parse_since("0s")
    time.sleep(1.1)  # detected_at has a resolution finer than this; --since compares to the second
    cl.execute("s1", "UPDATE items SET name = 'nuts', qty = qty - 1 WHERE id = 1")
    cl.execute("s2", "UPDATE items SET name = 'screws', qty = qty - 2 WHERE id = 1")
    cl.execute("s1", "UPDATE notes SET body = 'one' WHERE id = 1")
    cl.execute("s2", "DELETE FROM notes WHERE id = 1")
    cl.refresh_until_quiet()
    cl.assert_converged()
    rows = api.conflicts(cl.topo, "s1")
    kinds = sorted((r["tbl"], r["kind"], r["slot"]) for r in rows)
    assert kinds == [("items", "update_update", "name"), ("items", "update_update", "qty"), ("notes", "delete_update", None)]
    name = next(r for r in rows if r["slot"] == "name")
    # both row images: the row here before the change, and what the incoming change carried
    assert name["local_row"] == {"name": "nuts", "qty": 9}
    assert name["remote_row"] == {"name": "screws", "qty": 8}
    assert name["local_values"] == {"name": "nuts"} and name["remote_values"] == {"name": "screws"}
    assert (name["local_origin"], name["local_source"]) == ("s1", "local")
    assert (name["remote_origin"], name["remote_source"]) == ("s2", "replicated")
    assert name["rule"] == "latest" and name["winner"] == "remote"  # s2 wrote last
    qty = next(r for r in rows if r["slot"] == "qty")
    assert (qty["rule"], qty["winner"]) == ("additive", "both")
    dele = next(r for r in rows if r["kind"] == "delete_update")
    assert dele["local_row"] == {"body": "one"} and dele["remote_row"] is None and dele["winner"] == "delete"
    # at s2 its own version is the local one
    at_s2 = next(r for r in api.conflicts(cl.topo, "s2") if r["slot"] == "name")
    assert (at_s2["local_source"], at_s2["remote_origin"]) == ("local", "s1")
    # filters
    assert {r["tbl"] for r in api.conflicts(cl.topo, table="notes")} == {"notes"}
    assert {r["kind"] for r in api.conflicts(cl.topo, kind="update_update")} == {"update_update"}
    assert len(api.conflicts(cl.topo, "s1", since=before)) == 3
    assert api.conflicts(cl.topo, since=parse_since("2999-01-01T00:00:00Z")) == []
    assert len(api.conflicts(cl.topo, "s1", limit=1)) == 1
    with pytest.raises(ConfigError) as e:
        api.conflicts(cl.topo, "s9", table="nope", kind="sideways")
    assert len(e.value.problems) == 3


def test_init_adds_the_image_columns_once(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    from multimaster import store
    from multimaster.engine.site import Site

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TABLES)
    _drop_image_columns(cl, "s1")
    s = Site("s1", cl.urls["s1"])
    try:
        with s.write() as conn:
            assert store.conflicts.install(conn, s.dialect) == ["local_row", "remote_row", "heads"]
        with s.write() as conn:
            assert store.conflicts.install(conn, s.dialect) == []
    finally:
        s.dispose()


def test_the_conflict_logs_of_the_sites_reached_are_listed_when_one_is_down(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    """`multimaster conflicts` with one site down lists the others' logs, names the site not
    reached on stderr and exits 1 (before: exit 1 with nothing listed)."""
    import json

    from clusters import mm
    from test_remove_dead_site import kill

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], TABLES)
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('hello')")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE notes SET body = 'from s1' WHERE id = 1")
    cl.execute("s2", "UPDATE notes SET body = 'from s2' WHERE id = 1")
    cl.refresh_until_quiet()
    kill(cl, "s3", tmp_path)
    r = mm("conflicts", "-t", str(cl.topo.path), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not reached: site 's3'" in r.stderr
    rows = json.loads(r.stdout)
    assert {x["site"] for x in rows} == {"s1", "s2"} and {x["kind"] for x in rows} == {"update_update"}
    with pytest.raises(Exception, match="s3"):
        api.conflicts(cl.topo)  # the function without a place for the sites not reached raises
