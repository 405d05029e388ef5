"""Bounded state: tombstones and conflict-log rows are purged once every site has them and they
are past their retention; a late copy of a change of a purged row neither resurrects it nor
diverges the sites; a site that is down holds the purge back (docs/operations.md, "Tombstones
and the conflict log")."""

from __future__ import annotations

import dataclasses

from clusters import make_cluster

from multimaster import api
from multimaster.config.topology import SiteConfig
from multimaster.ops.purge import PurgePolicy, purge_site

ITEMS = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
# 'earliest' needs causal delivery: every site relays every change it applies, so a change
# reaches a site over two routes (docs/concepts.md)
ITEMS_RELAYED = {"items": {**ITEMS["items"], "config": {"columns": {"name": "earliest"}}}}
NOW = PurgePolicy(min_age=0, tombstones_after=0, conflicts_after=0)  # every retention elapsed
SITES = ["s1", "s2", "s3"]


def _state(cl, site):  # type: ignore[no-untyped-def]
    """(tombstones, conflict-log rows) of `items` at `site`."""
    d = api.status(cl.topo)["sites"][site]
    return d["tables"]["items"]["tombstones"], d["conflicts"]


def _purge(topo, site, policy=NOW):  # type: ignore[no-untyped-def]
    with api.Cluster(topo) as c:
        return purge_site(c, site, policy).tables["items"]


def _down(cl, site):  # type: ignore[no-untyped-def]
    """The cluster's topology with `site` pointing at a database that does not exist."""
    url = cl.urls[site]
    bad = url.replace(".db", "-gone.db") if cl.backend.name == "sqlite" else url.replace(f"_{site}", f"_{site}_gone")
    return dataclasses.replace(cl.topo, sites={**cl.topo.sites, site: SiteConfig(url=bad)})


def _conflict(cl):  # type: ignore[no-untyped-def]
    """s1 and s2 rename row 1 concurrently; s1 and s2 each log the conflict once both pulled."""
    cl.execute("s1", "UPDATE items SET name = 'from-s1' WHERE id = 1")
    cl.execute("s2", "UPDATE items SET name = 'from-s2' WHERE id = 1")


def test_purged_only_once_every_site_has_them_and_past_retention(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, SITES, ITEMS)
    for i in range(4):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh_until_quiet()
    _conflict(cl)
    cl.execute("s2", "DELETE FROM items WHERE id = 2")
    cl.refresh("s1")  # s1 has the delete and the conflict; s3 has neither yet
    assert _state(cl, "s1") == (1, 1)
    tp = _purge(cl.topo, "s1")
    assert (tp.tombstones, tp.conflicts) == (0, 0)
    assert tp.tombstones_held == 1 and tp.conflicts_held == 1
    assert "s3" in tp.state_held_by
    assert _state(cl, "s1") == (1, 1)
    cl.refresh_until_quiet()  # every site has everything now
    # within the retention nothing goes
    for s in SITES:
        tp = _purge(cl.topo, s, PurgePolicy(min_age=0, tombstones_after=3600, conflicts_after=3600))
        assert (tp.tombstones, tp.conflicts, tp.tombstones_held, tp.conflicts_held) == (0, 0, 0, 0)
    assert _state(cl, "s2") == (1, 1)
    # a dry run counts what would go and changes nothing
    with api.Cluster(cl.topo) as c:
        tp = purge_site(c, "s1", NOW, dry_run=True).tables["items"]
    assert (tp.tombstones, tp.conflicts) == (1, _state(cl, "s1")[1]) and _state(cl, "s1")[0] == 1
    # past it, everything goes at every site, and the report says so
    for s in SITES:
        logged = _state(cl, s)[1]
        assert logged >= (1 if s != "s3" else 0)
        tp = _purge(cl.topo, s)
        assert tp.tombstones == 1 and tp.tombstones_left == 0 and tp.tombstones_held == 0
        assert tp.conflicts == logged and tp.conflicts_held == 0
        assert tp.state_held_by == {}
        assert _state(cl, s) == (0, 0)
    # the cluster goes on: new rows take the same keys everywhere
    for s in SITES:
        cl.execute(s, "INSERT INTO items (name, qty) VALUES (?, ?)", (f"after-{s}", 1))
    cl.execute("s3", "DELETE FROM items WHERE id = 4")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert [r[0] for r in cl.rows("s1", "items")] == [1, 3, 5, 6, 7]


def test_late_copy_of_a_change_to_a_purged_row_does_not_resurrect_it(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s3's update of x reaches s1 through s2 (relayed); s2 deletes x; once every site has the
    delete, s1 drops the tombstone; then s1 pulls s3's own copy of the update, and s2's copy of
    the delete arrives at s3 through s1: duplicates, nothing resurrects or waits, all sites agree."""
    cl = make_cluster(backend, tmp_path, SITES, ITEMS_RELAYED)
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('x', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('y', 2)")
    cl.refresh_until_quiet()
    cl.execute("s3", "UPDATE items SET qty = 30 WHERE id = 1")
    cl.refresh("s2", "s3")
    cl.refresh("s1", "s2")  # s1 has s3's update, relayed by s2
    cl.execute("s2", "DELETE FROM items WHERE id = 1")
    cl.refresh("s1", "s2")
    cl.refresh("s3", "s2")  # every site has the delete; s1 has not pulled from s3 directly
    tp = _purge(cl.topo, "s1")
    assert tp.tombstones == 1 and _state(cl, "s1")[0] == 0
    cl.refresh("s1", "s3")  # the direct copy of s3's update (and s2's delete, relayed by s3)
    cl.refresh("s3", "s1")
    cl.refresh("s2", "s1")
    assert [r[1] for r in cl.rows("s1", "items")] == ["y"]
    st = api.status(cl.topo)
    assert all(ln["tables"]["items"]["unapplied"] == 0 for ln in st["links"]), "a change waits for the purged row"
    cl.refresh_until_quiet()
    for s in SITES:  # the others drop theirs too; then new rows still rank alike everywhere
        _purge(cl.topo, s)
    for s in ("s3", "s2", "s1"):
        cl.execute(s, "INSERT INTO items (name, qty) VALUES (?, ?)", (f"z-{s}", 0))
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert [r[1] for r in cl.rows("s2", "items")] == ["y", "z-s3", "z-s2", "z-s1"]
    assert [r[0] for r in cl.rows("s2", "items")] == [2, 3, 4, 5]


def test_a_site_that_wrote_to_a_row_before_the_delete_holds_its_tombstone(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s3 updates x, then applies s2's delete of x before anyone pulled the update: until s1 has
    s3's update, s1 keeps x's tombstone (the update would otherwise find no row and wait)."""
    cl = make_cluster(backend, tmp_path, SITES, ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('x', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('y', 2)")
    cl.refresh_until_quiet()
    cl.execute("s3", "UPDATE items SET qty = 5 WHERE id = 1")
    cl.execute("s2", "DELETE FROM items WHERE id = 1")
    cl.refresh("s1", "s2")
    cl.refresh("s3", "s2")
    tp = _purge(cl.topo, "s1")
    assert tp.tombstones == 0 and tp.tombstones_held == 1
    assert "not applied everything" in tp.state_held_by["s3"]
    cl.refresh_until_quiet()
    tp = _purge(cl.topo, "s1")
    assert tp.tombstones == 1
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows("s3", "items") == [(2, "y", 2)]


def test_a_site_that_is_down_holds_the_purge_back(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, SITES, ITEMS)
    for i in range(3):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh_until_quiet()
    for s in SITES:
        _purge(cl.topo, s)  # every site observed once, with nothing to purge
    _conflict(cl)
    cl.execute("s1", "DELETE FROM items WHERE id = 2")
    cl.refresh("s2")  # s3 goes down before it pulls any of it
    assert _state(cl, "s2") == (1, 1)
    down = _down(cl, "s3")
    with api.Cluster(down) as c:
        rep = purge_site(c, "s2", NOW)
    tp = rep.tables["items"]
    assert (tp.tombstones, tp.conflicts) == (0, 0)
    assert (tp.tombstones_held, tp.conflicts_held) == (1, 1)
    assert "unreachable" in tp.state_held_by["s3"]
    assert _state(cl, "s2") == (1, 1)
    # the purge report names it (JSON as the CLI prints it)
    assert "unreachable" in rep.as_dict()["tables"]["items"]["state_held_by"]["s3"]
    # s3 comes back and catches up: now they go
    cl.refresh_until_quiet()
    tp = _purge(cl.topo, "s2")
    assert (tp.tombstones, tp.conflicts, tp.state_held_by) == (1, 1, {})
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_the_greatest_identity_stays_for_the_ranks(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    """The only identity of a table, deleted: its tombstone stays (the next key counts from it)."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('x', 1)")
    cl.refresh_until_quiet()
    cl.execute("s2", "DELETE FROM items WHERE id = 1")
    cl.refresh_until_quiet()
    with api.Cluster(cl.topo) as c:
        tp = purge_site(c, "s1", NOW).tables["items"]
    assert (tp.tombstones, tp.tombstones_held, tp.tombstones_left) == (0, 0, 1)
    cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('y', 2)")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows("s1", "items") == [(2, "y", 2)]


def test_natural_key_tombstones_stay(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    """A natural key's dead lives name its next life (docs/conflicts.md): not purged."""
    codes = {"codes": {"key": "code", "auto": False, "columns": {"label": "text"}}}
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], codes)
    cl.execute("s1", "INSERT INTO codes (code, label) VALUES ('a', 'x')")
    cl.refresh_until_quiet()
    cl.execute("s2", "DELETE FROM codes WHERE code = 'a'")
    cl.refresh_until_quiet()
    with api.Cluster(cl.topo) as c:
        tp = purge_site(c, "s1", NOW).tables["codes"]
    assert (tp.tombstones, tp.tombstones_left) == (0, 1)
