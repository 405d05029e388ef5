"""Engine behaviour through real databases, on every backend: capture, relay, redelivery, clock,
renumbering, delete-wins, policies, natural keys, init and uninstall."""

from __future__ import annotations

import time

import pytest
from clusters import ITEMS, make_cluster

from multimaster import api
from multimaster.dialects.base import get_dialect
from multimaster.errors import BaseRowsDiffer, SchemaError


def log_rows(cl, site, origin=None):  # type: ignore[no-untyped-def]
    c = cl.db(site)
    try:
        cur = c.cursor()
        ph = cl.backend.param()
        sql = "SELECT op, origin, rid, mask FROM " + ("_mm." if cl.backend.name == "postgresql" else "") + "_mm_log_items"
        if origin:
            cur.execute(sql + f" WHERE origin = {ph} ORDER BY seq", (origin,))
        else:
            cur.execute(sql + " ORDER BY seq")
        return cur.fetchall()
    finally:
        c.close()


def test_every_kind_of_write_is_captured(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", ("a", 1, 1.0))
    cl.execute("s1", "UPDATE items SET qty = 2 WHERE id = 1")
    cl.execute("s1", "UPDATE items SET qty = 2 WHERE id = 1")  # changes nothing: not a change
    cl.execute("s1", "DELETE FROM items WHERE id = 1")
    rows = log_rows(cl, "s1")
    assert [r[0] for r in rows] == ["I", "U", "D"]
    assert rows[1][3] == 1 << 2  # only qty (columns sorted: name, price, qty)
    assert len({r[2] for r in rows}) == 1  # one identity for the three changes


def test_applied_changes_relay_but_are_not_captured_again(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS, links={"chain": ["s1", "s2", "s3"]})
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.execute("s1", "UPDATE items SET name = 'b' WHERE id = 1")
    cl.refresh("s2", "s1")
    # s2 relays s1's changes with their origin; none is logged as s2's own
    assert [(r[0], r[1]) for r in log_rows(cl, "s2")] == [("I", "s1"), ("U", "s1")]
    cl.refresh("s3", "s2")  # s3 only hears from s1 through s2
    assert cl.rows("s3", "items") == [(1, "b", 1, 1.0)]
    cl.refresh_until_quiet()
    assert all(r[1] == "s1" for s in ("s1", "s2", "s3") for r in log_rows(cl, s))
    cl.assert_converged()


def test_redelivery_and_double_routes_apply_once(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(
        backend, tmp_path, ["s1", "s2", "s3"], {"items": {**ITEMS["items"], "config": {"columns": {"qty": "additive"}}}}
    )
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 10, 1.0)")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET qty = qty - 1 WHERE id = 1")
    cl.refresh("s2", "s1")
    cl.refresh("s3", "s2")  # s3 gets it via s2 ...
    cl.refresh("s3", "s1")  # ... and directly: applied once
    assert cl.rows("s3", "items") == [(1, "a", 9, 1.0)]
    # redelivery: rewind every watermark and pull everything again
    from multimaster.engine.site import Site

    for s in ("s1", "s2", "s3"):
        site = Site(s, cl.urls[s])
        with site.write() as conn:
            conn.exec_driver_sql(f"UPDATE {'_mm.' if backend.name == 'postgresql' else ''}_mm_watermarks SET seq2 = 0")
        site.dispose()
    cl.refresh_until_quiet()
    for s in ("s1", "s2", "s3"):
        assert cl.rows(s, "items") == [(1, "a", 9, 1.0)]


def test_concurrent_inserts_are_renumbered_to_global_insertion_order(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS)
    order = []
    for i in range(6):
        s = ("s1", "s2", "s3")[i % 3]
        cl.execute(s, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", (f"{s}-{i}", i, 0.0))
        order.append(f"{s}-{i}")
        time.sleep(0.002)
    cl.refresh_until_quiet()
    for s in ("s1", "s2", "s3"):
        assert [(r[0], r[1]) for r in cl.rows(s, "items")] == [(k + 1, n) for k, n in enumerate(order)]


def test_deleted_rows_keep_their_place_so_keys_are_never_reused(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    for n in ("a", "b", "c"):
        cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, 0, 0)", (n,))
    cl.execute("s1", "DELETE FROM items WHERE id = 3")
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('d', 0, 0)")
    assert [r[:2] for r in cl.rows("s1", "items")] == [(1, "a"), (2, "b"), (4, "d")]
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_application_cannot_change_a_managed_key(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 0, 0)")
    with pytest.raises(Exception, match="managed by replication"):
        cl.execute("s1", "UPDATE items SET id = 50 WHERE id = 1")


def test_a_site_ten_minutes_fast_keeps_causality(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s2's clock runs ten minutes ahead. s1 edits a row after seeing s2's edit: with wall clocks
    s1's later edit would lose (its timestamp is smaller); the hybrid clock moved past s2's. (The
    topology allows the offset: by default a site that far ahead is held, see below.)"""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS, settings={"refresh": {"max_clock_offset": "15m"}})
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 0, 0)")
    cl.refresh_until_quiet()
    from multimaster.engine.site import Site

    fast = Site("s2", cl.urls["s2"])
    ten_min = 10 * 60 * 1000
    with fast.write() as conn:  # s2's clock ten minutes ahead, set where each dialect keeps it
        fast.dialect.advance_clock(conn, (int(time.time() * 1000) + ten_min) << 16)
    fast.dispose()
    cl.execute("s2", "UPDATE items SET name = 'from the fast site' WHERE id = 1")
    cl.refresh("s1", "s2")
    cl.execute("s1", "UPDATE items SET name = 'seen it, changed it' WHERE id = 1")
    # a fresh insert at s1 now also sorts after everything s1 has seen
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('later', 0, 0)")
    cl.execute("s3", "INSERT INTO items (name, qty, price) VALUES ('s3-before-sync', 0, 0)")
    cl.refresh_until_quiet()
    for s in ("s1", "s2", "s3"):
        rows = cl.rows(s, "items")
        assert rows[0][1] == "seen it, changed it"
        assert [r[1] for r in rows[1:]] == ["s3-before-sync", "later"]


def test_a_site_whose_clock_is_too_far_ahead_is_held_not_followed(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s2's clock runs ten minutes ahead, past the default refresh.max_clock_offset (5 s): s1 holds
    s2's changes — the refresh fails naming the site and its offset, nothing is applied, s1's clock
    is not dragged ahead, status reports the link — and a later, unrelated change of s2 waits
    behind it. With the offset raised, everything flows."""
    from pathlib import Path

    import yaml

    from multimaster.config.topology import load_topology
    from multimaster.engine.site import Site

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    fast = Site("s2", cl.urls["s2"])
    with fast.write() as conn:
        fast.dialect.advance_clock(conn, (int(time.time() * 1000) + 10 * 60 * 1000) << 16)
    fast.dispose()
    cl.execute("s2", "INSERT INTO items (name, qty, price) VALUES ('from the fast site', 0, 0)")
    res = api.refresh(cl.topo, "s1", "s2")
    assert res[0].error and "site 's1' holds the changes of table 'items' from peer 's2'" in res[0].error
    assert "origin 's2'" in res[0].error and "max_clock_offset (5 s)" in res[0].error
    assert cl.rows("s1", "items") == []
    s1 = Site("s1", cl.urls["s1"])
    with s1.read() as conn:
        assert (s1.dialect.read_clock(conn) or 0) >> 16 < int(time.time() * 1000) + 5_000
    s1.dispose()
    held = [e for e in api.status(cl.topo)["links"] if "max_clock_offset" in str(e.get("last_error"))]
    assert len(held) == 1 and "'s2'" in held[0]["last_error"], held
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    doc["refresh"] = {"max_clock_offset": "15m"}
    Path(cl.topo.path).write_text(yaml.safe_dump(doc))
    cl.topo = load_topology(cl.topo.path)
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert [r[1] for r in cl.rows("s1", "items")] == ["from the fast site"]


def test_the_reconciler_moves_the_clock_strictly_past_a_version_received(backend, tmp_path):  # type: ignore[no-untyped-def]
    """PostgreSQL keeps the floor in the clock sequence (captures read nothing else): advance_clock
    moves it past the version received even when it is only a few ticks behind, where a capture's
    own tick would allow itself 1024 ticks of slack."""
    if backend.name != "postgresql":
        pytest.skip("the clock sequence is PostgreSQL's")
    from multimaster.engine.site import Site

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    ahead = (int(time.time() * 1000) + 3_600_000) << 16  # an hour ahead: the wall clock plays no part
    site = Site("s1", cl.urls["s1"])
    try:
        with site.write() as conn:
            conn.exec_driver_sql("SELECT setval('_mm._mm_clock', %s)", (ahead,))
            site.dialect.advance_clock(conn, ahead + 10, "items")
        cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('after', 0, 0)")
        with site.read() as conn:
            ver = conn.exec_driver_sql("SELECT ver FROM _mm._mm_log_items ORDER BY seq DESC LIMIT 1").scalar()
        assert int(ver.split(":")[0]) > ahead + 10
    finally:
        site.dispose()


def test_concurrent_edits_of_different_columns_both_survive(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET name = 'renamed' WHERE id = 1")
    cl.execute("s2", "UPDATE items SET price = 9.5 WHERE id = 1")
    cl.refresh_until_quiet()
    for s in ("s1", "s2"):
        assert cl.rows(s, "items") == [(1, "renamed", 1, 9.5)]


def test_latest_timestamp_wins_and_the_conflict_is_logged(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    cl.execute("s2", "UPDATE items SET name = 'first' WHERE id = 1")
    time.sleep(0.003)
    cl.execute("s1", "UPDATE items SET name = 'second' WHERE id = 1")
    cl.refresh_until_quiet()
    assert cl.rows("s2", "items")[0][1] == "second"
    cl.assert_converged()
    conf = api.conflicts(cl.topo, limit=0)
    assert {(c["site"], c["decision"]) for c in conf} == {("s1", "local"), ("s2", "remote")}
    c = next(c for c in conf if c["site"] == "s2")
    assert c["local_values"] == {"name": "first"} and c["remote_values"] == {"name": "second"}
    assert c["policy"] == "latest" and c["kind"] == "update_update"


@pytest.mark.parametrize(
    "policy, expected",
    [("earliest", "from-s2"), ("maximum", "from-s2"), ("minimum", "from-s1"), ({"priority": ["s1", "s2"]}, "from-s1")],
)
def test_built_in_policies(backend, tmp_path, policy, expected):  # type: ignore[no-untyped-def]
    if backend.name != "sqlite" and policy not in ({"postgresql": "maximum", "mysql": "minimum"}[backend.name],):
        pytest.skip("the policies are decided in Python (core/policies.py); one runs on each server")
    cl = make_cluster(
        backend, tmp_path, ["s1", "s2", "s3"], {"items": {**ITEMS["items"], "config": {"columns": {"name": policy}}}}
    )
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    cl.execute("s2", "UPDATE items SET name = 'from-s2' WHERE id = 1")
    time.sleep(0.003)
    cl.execute("s1", "UPDATE items SET name = 'from-s1' WHERE id = 1")
    cl.refresh("s3", "s1")  # s3 hears s1 first, s2 later: same result
    cl.refresh_until_quiet()
    for s in ("s1", "s2", "s3"):
        assert cl.rows(s, "items")[0][1] == expected


def test_additive_seats_two_sites_each_sell_one(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], {"items": {**ITEMS["items"], "config": {"columns": {"qty": "additive"}}}})
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('flight', 10, 0)")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET qty = qty - 1 WHERE id = 1")
    cl.execute("s2", "UPDATE items SET qty = qty - 1 WHERE id = 1")
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items")[0][2] == 8 and cl.rows("s2", "items")[0][2] == 8


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_column_group_wins_together(backend, tmp_path):  # type: ignore[no-untyped-def]
    """SQLite only: which write a group takes is the planner's decision (core/planner.py), and what
    it applies, columns of one row from two origins, is the path every database runs in
    test_concurrent_edits_of_different_columns_both_survive."""
    cfg = {"groups": {"pair": {"columns": ["name", "price"]}}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], {"items": {**ITEMS["items"], "config": cfg}})
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET name = 'n-s1' WHERE id = 1")
    time.sleep(0.003)
    cl.execute("s2", "UPDATE items SET price = 7.5 WHERE id = 1")  # later: the group goes to s2
    cl.refresh_until_quiet()
    for s in ("s1", "s2"):
        assert cl.rows(s, "items")[0] == (1, "a", 1, 7.5)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_custom_resolver(backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """SQLite only: the resolver is the application's Python function, called by the planner
    (core/policies.py); an update_update conflict on a text column, the path around it, runs on
    every database in test_latest_timestamp_wins_and_the_conflict_is_logged."""
    import sys
    import types

    mod = types.ModuleType("mm_test_resolvers")

    def longest(conflict):  # type: ignore[no-untyped-def]
        a, b = conflict.local, conflict.remote
        la, lb = len(a.values["name"] or ""), len(b.values["name"] or "")
        return (a if la > lb else b) if la != lb else (a if a.ver > b.ver else b)

    mod.longest = longest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mm_test_resolvers", mod)
    from multimaster.core.policies import check_resolver

    assert check_resolver("mm_test_resolvers.longest", [("ab", "abc"), ("x", "y"), (None, "z")], column="name") == []
    cl = make_cluster(
        backend,
        tmp_path,
        ["s1", "s2"],
        {"items": {**ITEMS["items"], "config": {"columns": {"name": {"custom": "mm_test_resolvers.longest"}}}}},
    )
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET name = 'a much longer name' WHERE id = 1")
    time.sleep(0.003)
    cl.execute("s2", "UPDATE items SET name = 'short' WHERE id = 1")
    cl.refresh_until_quiet()
    for s in ("s1", "s2"):
        assert cl.rows(s, "items")[0][1] == "a much longer name"


def test_check_resolver_finds_an_order_dependent_resolver():  # type: ignore[no-untyped-def]
    from multimaster.core.policies import check_resolver

    problems = check_resolver(lambda c: c.local)  # "keep mine": depends on who is local
    assert problems and "depends on which one arrived first" in problems[0]


def test_natural_key_table_same_key_inserted_at_two_sites(backend, tmp_path):  # type: ignore[no-untyped-def]
    tables = {"skus": {"key": "sku", "auto": False, "columns": {"name": "text", "stock": "int"}}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], tables)
    cl.execute("s1", "INSERT INTO skus (sku, name, stock) VALUES ('A-1', 'from s1', 5)")
    time.sleep(0.003)
    cl.execute("s2", "INSERT INTO skus (sku, name, stock) VALUES ('A-1', 'from s2', 7)")
    cl.execute("s2", "INSERT INTO skus (sku, name, stock) VALUES ('B-2', 'only s2', 1)")
    cl.refresh_until_quiet()
    for s in ("s1", "s2"):
        assert cl.rows(s, "skus") == [("A-1", "from s2", 7), ("B-2", "only s2", 1)]
    kinds = {c["kind"] for c in api.conflicts(cl.topo, limit=0)}
    assert kinds == {"insert_insert"}
    # delete then re-insert of a natural key: the later insert brings it back everywhere
    cl.execute("s1", "DELETE FROM skus WHERE sku = 'B-2'")
    cl.refresh_until_quiet()
    time.sleep(0.003)
    cl.execute("s2", "INSERT INTO skus (sku, name, stock) VALUES ('B-2', 'back', 2)")
    cl.refresh_until_quiet()
    for s in ("s1", "s2"):
        assert cl.rows(s, "skus")[1] == ("B-2", "back", 2)


def test_init_copies_the_only_non_empty_site_and_is_idempotent(backend, tmp_path):  # type: ignore[no-untyped-def]
    base = [("items", 1, "a", 1, 1.0), ("items", 5, "b", 2, 2.0)]
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS, base={"s2": base})
    for s in ("s1", "s2", "s3"):
        assert cl.rows(s, "items") == [(1, "a", 1, 1.0), (5, "b", 2, 2.0)]
    rep = api.init(cl.topo)  # again: nothing new, nothing broken
    assert rep.sites == {"s1": [], "s2": [], "s3": []}
    cl.execute("s3", "INSERT INTO items (name, qty, price) VALUES ('c', 3, 3.0)")
    cl.refresh_until_quiet()
    for s in ("s1", "s2", "s3"):
        assert cl.rows(s, "items")[-1] == (6, "c", 3, 3.0)  # keys continue from the base
    assert log_rows(cl, "s1") == log_rows(cl, "s1", "s3")  # the copied base was not captured


def test_init_refuses_sites_with_different_rows_and_touches_nothing(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(
        backend,
        tmp_path,
        ["s1", "s2"],
        ITEMS,
        init=False,
        base={"s1": [("items", 1, "a", 1, 1.0)], "s2": [("items", 1, "a", 1, 2.0)]},
    )
    with pytest.raises(BaseRowsDiffer, match=r"key 1"):
        api.init(cl.topo)
    from multimaster.engine.site import Site

    for s in ("s1", "s2"):
        site = Site(s, cl.urls[s])
        with site.read() as conn:
            assert site.installed_tables(conn) == []
        site.dispose()


def test_init_refuses_a_table_whose_columns_differ(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS, init=False)
    cl.execute("s2", "ALTER TABLE items ADD COLUMN extra TEXT")
    with pytest.raises(SchemaError, match=r"only 's2' has \['extra'\]"):
        api.init(cl.topo)


def test_excluded_columns_stay_local(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], {"items": {**ITEMS["items"], "config": {"exclude": ["price"]}}})
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 5.0)")
    cl.refresh_until_quiet()
    assert cl.rows("s2", "items") == [(1, "a", 1, None)]
    cl.execute("s2", "UPDATE items SET price = 1.0 WHERE id = 1")  # not a replicated change
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == [(1, "a", 1, 5.0)]


def test_uninstall_leaves_user_data_intact(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    before = {s: cl.rows(s, "items") for s in ("s1", "s2")}
    api.uninstall(cl.topo)
    for s in ("s1", "s2"):
        assert cl.rows(s, "items") == before[s]
        cl.execute(s, "INSERT INTO items (name, qty, price) VALUES ('after', 0, 0)")  # no trigger left
    from sqlalchemy import inspect

    from multimaster.engine.site import Site

    site = Site("s1", cl.urls["s1"])
    with site.read() as conn:
        insp = inspect(conn)
        left = [n for n in insp.get_table_names() + insp.get_view_names() if n.startswith("_mm")]
    site.dispose()
    assert left == []


def test_interrupted_refresh_leaves_nothing_half_done(backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    import multimaster.engine.reconcile as eng

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    for i in range(30):
        cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, ?, 0)", (f"r{i}", i))
    calls = {"n": 0}
    real = eng.execute_plan
    # a source that records transactions is cut into batches of 10 single-row transactions; one
    # that does not (SQLite) is one batch, the whole read (docs/transactions.md)
    whole_read = not get_dialect(backend.name).caps.txn_column
    crash_at = 1 if whole_read else 2

    def crash_on_second_batch(*a, **k):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == crash_at:
            raise RuntimeError("power cut")
        return real(*a, **k)

    monkeypatch.setattr(eng, "execute_plan", crash_on_second_batch)
    res = api.refresh(cl.topo, "s2", "s1", batch_size=10)
    assert res[0].error and "power cut" in res[0].error
    # the batches before the crash committed, the one it hit rolled back whole
    assert len(cl.rows("s2", "items")) == (0 if whole_read else 10)
    monkeypatch.setattr(eng, "execute_plan", real)
    cl.refresh_until_quiet()
    assert len(cl.rows("s2", "items")) == 30
    cl.assert_converged()


def test_backlog_pulls_in_bounded_batches(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    c = cl.db("s1")
    cur = c.cursor()
    ph = backend.param()
    for i in range(250):  # 250 transactions, each by a client of its own
        cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, ?, 0)", (f"r{i}", i))
    cur.executemany(f"INSERT INTO items (name, qty, price) VALUES ({ph}, {ph}, 0)", [(f"t{i}", i) for i in range(100)])
    c.commit()  # and one of 100 rows
    c.close()
    res = cl.refresh("s2", "s1", batch_size=40)
    # cut at transaction boundaries into batches of at most 40 (6 of 40, the 10 single-row
    # transactions left, the 100-row one whole), read in windows of 4 batches (160 entries); a
    # source that records no transactions: a window is one batch (160, 160, 30)
    expected = 3 if not get_dialect(backend.name).caps.txn_column else 8
    assert res[0].batches == expected and res[0].pulled == 350
    cl.assert_converged()


def test_a_window_never_ends_inside_a_transaction(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A refresh reads a backlog in windows (4 batches' worth per table). A transaction the
    window's end cuts through is held back whole, found by asking the source which transactions it
    saw continue past the window; a transaction longer than the window is read in pieces, applied
    in one target transaction (docs/transactions.md "Large transactions")."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    for i in range(30):  # 30 single-row transactions
        cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, ?, 0)", (f"r{i}", i))
    c = cl.db("s1")
    ph = backend.param()
    c.cursor().executemany(f"INSERT INTO items (name, qty, price) VALUES ({ph}, {ph}, 0)", [(f"t{i}", i) for i in range(20)])
    c.commit()  # one of 20 rows: the window of 40 ends inside it
    c.close()
    c = cl.db("s1")  # (MariaDB tells a connection's transactions apart only across a horizon)
    c.cursor().executemany(f"INSERT INTO items (name, qty, price) VALUES ({ph}, {ph}, 0)", [(f"u{i}", i) for i in range(90)])
    c.commit()  # one of 90 rows: longer than the window
    c.close()
    res = cl.refresh("s2", "s1", batch_size=10)
    # transactions recorded: 3 batches of 10 singles, the 20-row one whole, the 90-row one in 3
    # pieces of its window (40, 40, 10) applied in one target transaction; none recorded
    # (SQLite): every window is one batch (40, 40, 40, 20)
    expected = 4 if not get_dialect(backend.name).caps.txn_column else 7
    assert res[0].batches == expected and res[0].pulled == 140
    cl.assert_converged()


def test_rows_pulled_without_reconciling_are_applied_by_the_next_refresh(backend, tmp_path):  # type: ignore[no-untyped-def]
    """`refresh --no-reconcile` stores what it pulls; a later plain refresh that pulls nothing new
    applies it (it used to wait, silently, for a refresh that brought something)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh("s2", "s1", reconcile_=False)
    assert cl.rows("s2", "items") == []
    res = cl.refresh("s2", "s1")
    assert res[0].pulled == 0 and res[0].applied == 1
    assert cl.rows("s2", "items") == [(1, "a", 1, 1.0)]
