"""Log purge: bounded logs under a steady workload, nothing purged that a live peer still needs,
late copies over another route stay duplicates after their log entry is gone, expired peers."""

from __future__ import annotations

import random
import threading
import time

import pytest
from clusters import keep_refreshing, keep_writing, make_cluster, unreachable_topology

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.ops.purge import PurgePolicy, purge, purge_site

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}}}
# a policy that needs causal delivery: every site relays every change it applies (docs/concepts.md)
STOCK_RELAYED = {"stock": {**STOCK["stock"], "config": {"columns": {"qty": "additive", "name": "earliest"}}}}
NOW = PurgePolicy(min_age=0)  # tests purge everything that is safe, whatever its age


def _log_sizes(cl):  # type: ignore[no-untyped-def]
    st = api.status(cl.topo)
    return {s: (d["tables"]["stock"]["log"], d["tables"]["stock"]["log2"]) for s, d in st["sites"].items()}


def _snap_rows(cl, site):  # type: ignore[no-untyped-def]
    from multimaster.ops.metrics import health

    return health(cl.topo, [site])["sites"][site]["tables"]["stock"]["snapshot_rows"]


def _count(cl, site: str, table: str) -> int:  # type: ignore[no-untyped-def]
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(f"SELECT count(*) FROM {table}")
        return int(cur.fetchone()[0])
    finally:
        c.close()


def test_log_stays_bounded_under_steady_workload(backend, tmp_path):  # type: ignore[no-untyped-def]
    sites = ["s1", "s2", "s3"]
    cl = make_cluster(backend, tmp_path, sites, STOCK, base={"s1": [("stock", 1, "bolts", 100)]})
    per_round = 8
    sizes: list[int] = []
    bounds: list[int] = []
    with api.Cluster(cl.topo) as c:
        for rnd in range(12):
            for i, s in enumerate(sites):
                cl.execute(s, "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"r{rnd}-{s}", i))
                cl.execute(s, "UPDATE stock SET qty = qty + 1 WHERE id = 1")
            for _ in range(2):
                api.refresh(c)
            purge(c, policy=NOW)
            sizes.append(max(max(v) for v in _log_sizes(cl).values()))
            assert all(_snap_rows(cl, s) <= 3 * per_round for s in sites)
            if backend.name == "mysql":  # the bounds between transactions the horizons record
                bounds.append(max(_count(cl, s, "_mm_bounds") for s in sites))
    # every round appends about the same number of entries everywhere; purge keeps the logs at
    # the size of what is still in transit, whatever the number of rounds
    assert max(sizes[3:]) <= 3 * per_round, sizes
    assert sizes[-1] <= max(sizes[:4]) + per_round, sizes
    if bounds:  # purge keeps them at what the logs still hold too
        assert bounds[-1] <= max(bounds[:4]) + per_round, bounds
    cl.refresh_until_quiet()
    cl.assert_converged()
    # additive quantities: 100 + one per site and round, none lost or applied twice
    assert cl.rows("s1", "stock")[0] == (1, "bolts", 100 + 12 * 3)
    assert len(cl.rows("s2", "stock")) == 1 + 12 * 3


def test_no_entry_purged_while_a_live_peer_needs_it(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK)
    for i in range(5):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh("s2")  # s3 does not refresh: it still needs everything s1 logged
    with api.Cluster(cl.topo) as c:
        rep = purge_site(c, "s1", NOW)
    assert rep.tables["stock"].purged == 0
    assert "s3" in rep.tables["stock"].held_by
    assert _log_sizes(cl)["s1"][0] == 5
    # s3 catches up: now every entry but the newest may go
    cl.refresh_until_quiet()
    with api.Cluster(cl.topo) as c:
        rep = purge_site(c, "s1", NOW)
    assert rep.tables["stock"].purged == 4
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s3", "stock")) == 5


def test_unreachable_peer_keeps_its_entries(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    """A puller that cannot be reached holds entries back with the last watermark recorded."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], STOCK)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('a', 1)")
    cl.refresh_until_quiet()
    with api.Cluster(cl.topo) as c:
        purge_site(c, "s1", NOW)  # records s3's watermark
    for i in range(4):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"b{i}", i))
    cl.refresh("s2")
    path = tmp_path / "s3.db"
    path.rename(tmp_path / "s3.away")
    try:
        with api.Cluster(cl.topo) as c:
            rep = purge_site(c, "s1", NOW)
        s3 = [p for p in rep.pullers if p.peer == "s3"][0]
        assert not s3.reachable and not s3.expired
        assert rep.tables["stock"].held_by == ["s3"]
        assert rep.tables["stock"].purged <= 1  # at most the entry s3 already had
    finally:
        (tmp_path / "s3.away").rename(path)
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s3", "stock")) == 5


def test_late_copy_after_purge_is_still_a_duplicate(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s3 gets s1's change through s2, purges it, then the copy from s1 arrives: applied once."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK_RELAYED, base={"s1": [("stock", 1, "bolts", 10)]})
    cl.execute("s1", "UPDATE stock SET qty = qty + 5 WHERE id = 1")
    cl.refresh("s2", "s1")
    cl.refresh("s3", "s2")
    cl.refresh("s1", "s3")
    cl.refresh("s2", "s3")
    with api.Cluster(cl.topo) as c:
        rep = purge_site(c, "s3", NOW)
    assert rep.tables["stock"].purged == 0  # the newest entry always stays
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('nuts', 1)")  # a newer entry at s3 after the next pull
    cl.refresh("s3", "s2")
    cl.refresh("s1", "s3")
    cl.refresh("s2", "s3")
    with api.Cluster(cl.topo) as c:
        rep = purge_site(c, "s3", NOW)
    assert rep.tables["stock"].purged >= 1
    cl.refresh("s3", "s1")  # the late copy of s1's +5
    assert cl.rows("s3", "stock")[0] == (1, "bolts", 15)
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows("s1", "stock")[0] == (1, "bolts", 15)


def test_expired_peer_is_reported_and_refused(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(3):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    policy = PurgePolicy(retention=3600, min_age=0)
    with api.Cluster(cl.topo) as c:  # s2 answers: never given up, however long it has not refreshed
        rep = purge_site(c, "s1", policy, now=time.time() + 30 * 86400)
    assert rep.expired == [] and rep.tables["stock"].purged == 0 and rep.given_up == []
    with api.Cluster(load_topology(unreachable_topology(cl, tmp_path, "s2"))) as c:
        rep = purge_site(c, "s1", policy)
        assert rep.expired == [] and rep.tables["stock"].purged == 0
        # two hours later s1's purge has still not reached s2, nor has s2 refreshed: it is given up
        rep = purge_site(c, "s1", policy, now=time.time() + 2 * 3600)
    assert rep.expired == ["s2"]
    assert rep.given_up and "'s2' is given up by 's1'" in rep.given_up[0] and "add-site" in rep.given_up[0]
    assert rep.tables["stock"].purged == 2
    res = api.refresh(cl.topo, "s2", "s1")
    assert res[0].error and "purged changes" in res[0].error and "add-site" in res[0].error


def test_dry_run_changes_nothing(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(4):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh_until_quiet()
    before = _log_sizes(cl)
    reps = purge(cl.topo, policy=NOW, dry_run=True)
    assert reps[0].purged == 3
    assert _log_sizes(cl) == before


def test_policy_parse_rejects_bad_durations():  # type: ignore[no-untyped-def]
    from multimaster.errors import ConfigError

    assert PurgePolicy.parse("2d", "10m").retention == 2 * 86400
    with pytest.raises(ConfigError, match="--min-age"):
        PurgePolicy.parse("1d", "soon")


def test_own_inserts_purged_before_the_shadow_caught_up_keep_their_identity(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    """SQLite writes a local row's shadow lazily, from its insert's log entry: purge catches the
    shadow up before that entry goes, so a later update or delete of the row names its identity
    (it used to name none: the update waited forever at the peers, the delete never arrived)."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(3):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh_until_quiet()  # s1 receives nothing, so no reconcile catches its shadow up
    with api.Cluster(cl.topo) as c:
        assert purge_site(c, "s1", NOW).tables["stock"].purged == 2
    cl.execute("s1", "UPDATE stock SET qty = 7 WHERE id = 1")
    cl.execute("s1", "DELETE FROM stock WHERE id = 2")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows("s2", "stock") == [(1, "n0", 7), (3, "n2", 2)]


def test_a_pullers_uncommitted_progress_lets_no_entry_go(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A refresh at s2 moves its watermark inside its transaction, before it commits (and it may
    roll back: killed, a deadlock). A purge of s1 that runs meanwhile must see only what s2
    committed, also on the connections to s2 that just served a pull from s2 (MariaDB's horizon
    procedure once left them READ UNCOMMITTED): else it purges entries s2 then never gets, and the
    link s1->s2 stops for good asking to re-instantiate s2."""
    from multimaster.engine.site import Site

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(5):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES (?, ?)", ("at s2", 9))
    wms = Site("s2", cl.urls["s2"]).dialect.mm_table("_mm_watermarks")
    p = cl.backend.param()
    with api.Cluster(cl.topo) as c:
        assert api.refresh(c, "s1", "s2")[0].pulled == 1  # reads s2's log on s2's connections
        if backend.name == "mysql":
            with c.site("s2").read() as conn:
                level = conn.exec_driver_sql("SELECT @@session.tx_isolation").scalar()
            assert level == "READ-COMMITTED", level
            # and a pooled connection some statement left at another level goes back at the engine's
            alone = Site("s2", cl.urls["s2"])
            with alone.read() as conn:
                first = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
                conn.exec_driver_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
            with alone.read() as conn:
                again = conn.exec_driver_sql("SELECT CONNECTION_ID(), @@session.tx_isolation").first()
            alone.engine.dispose()
            assert again is not None and again[0] == first and again[1] == "READ-COMMITTED", (first, again)
        pulling = cl.db("s2")  # s2's refresh, moved past all five, not committed yet
        try:
            pulling.cursor().execute(f"UPDATE {wms} SET seq2 = {1 << 62} WHERE peer = {p}", ("s1",))
            rep = purge_site(c, "s1", NOW)
        finally:
            pulling.rollback()
            pulling.close()
    assert rep.tables["stock"].purged == 0, rep.as_dict()
    assert _log_sizes(cl)["s1"][0] == 5
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s2", "stock")) == 6


def test_a_refresher_overtaken_by_another_and_a_purge_reads_again(backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Two refreshers of one link (the daemon and a `refresh` run by hand while it catches up): one
    reads the source's log, the other applies the same entries and commits, and the source purges
    them. The first then finds entries purged past the watermark it read: that is not a peer left
    behind (the target has them), so it reads again instead of failing with "re-instantiate"."""
    from multimaster.engine import refresh as refresh_mod

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(5):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    real = refresh_mod.read_link
    overtaken: list[int] = []

    def read_then_overtaken(*args, **kw):  # type: ignore[no-untyped-def]
        read = real(*args, **kw)
        if not overtaken:
            overtaken.append(1)
            with api.Cluster(cl.topo) as other:  # the other refresher, then the source's purge
                assert api.refresh(other, "s2", "s1")[0].pulled == 5
                assert purge_site(other, "s1", NOW).tables["stock"].purged == 4
        return read

    monkeypatch.setattr(refresh_mod, "read_link", read_then_overtaken)
    res = api.refresh(cl.topo, "s2", "s1")
    assert overtaken and [r.error for r in res] == [None], [r.error for r in res]
    monkeypatch.undo()
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s2", "stock")) == 5


def test_two_refreshers_of_one_link_never_move_its_watermark_back(backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Refresher A read the link and checked its watermark; refresher B then pulls everything and
    commits; A commits its first batch. Had A moved the watermark to the end of its batch, it would
    go back below B's (a purge at the source may have taken what lay between, and a refresh killed
    there would leave the link asking for re-instantiation: seen on PostgreSQL with three
    refreshers and a purge). A holds the watermark from its check to its commit: B waits, then
    reads again from where A left it."""
    import threading

    from multimaster.engine import refresh as refresh_mod
    from multimaster.engine.site import Site

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(6):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    s2 = Site("s2", cl.urls["s2"])
    seen: list[int] = []

    def watermark() -> int:
        from multimaster import store

        with s2.read() as conn:
            return store.watermarks.read(conn, s2.dialect, "s1", "stock")

    b_errors: list[str | None] = []

    def b() -> None:
        with api.Cluster(cl.topo) as c:
            b_errors.extend(r.error for r in api.refresh(c, "s2", "s1"))

    real = refresh_mod.store_batch
    main = threading.get_ident()
    calls: list[int] = []
    other: list[threading.Thread] = []

    def store_then_overtaken(*args, **kw):  # type: ignore[no-untyped-def]
        if threading.get_ident() == main:
            calls.append(1)
            if len(calls) == 1:  # A checked the watermark: B runs now (or waits for A, given 3 s)
                other.append(threading.Thread(target=b))
                other[0].start()
                other[0].join(3)
                seen.append(watermark())
            else:
                seen.append(watermark())  # A's first batch committed
        return real(*args, **kw)

    monkeypatch.setattr(refresh_mod, "store_batch", store_then_overtaken)
    res = api.refresh(cl.topo, "s2", "s1", batch_size=2)
    other[0].join(60)
    monkeypatch.undo()
    seen.append(watermark())
    assert [r.error for r in res] == [None] and b_errors == [None], b_errors
    # (SQLite: one writer; A's read, one whole transaction of the link, is one batch)
    assert len(calls) >= (1 if backend.name == "sqlite" else 2) and seen == sorted(seen), seen
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s2", "stock")) == 6


def test_writers_refreshers_and_purges_all_at_once(backend, tmp_path):  # type: ignore[no-untyped-def]
    """Applications at both sites (new rows, and a hot row every one of them adds to), two
    refreshers per link (the daemon and a `refresh` by hand), a purge per site with no minimum
    age, all at once for a while: no application write fails, no refresh errs or holds a change,
    and the sites converge with the sum exact. (It found, each in seconds: a lost update of a
    watermark on PostgreSQL; MariaDB applications rolled back as deadlock victims of the
    reconciler; docs/decisions.md, session 27.)"""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": [("stock", 1, "bolts", 100)]})
    cl.refresh_until_quiet()
    stop = threading.Event()
    problems: list[str] = []
    added = [0, 0, 0, 0]

    def writer(w: int, site: str) -> None:
        def step(rnd: random.Random, i: int) -> None:
            if rnd.random() < 0.5:
                cl.execute(site, "INSERT INTO stock (name, qty) VALUES (?, 0)", (f"{site}-{w}-{i}",))
            else:
                cl.execute(site, "UPDATE stock SET qty = qty + 1 WHERE id = 1")
                added[w] += 1

        keep_writing(stop, problems, site, w, step)

    def refresher(site: str, batch: int) -> None:
        keep_refreshing(cl, stop, problems, site, batch_size=batch)

    def purger(site: str) -> None:
        with api.Cluster(cl.topo) as c:
            while not stop.is_set():
                rep = purge_site(c, site, NOW)
                if rep.error:
                    problems.append(f"purge {site}: {rep.error}")
                time.sleep(0.1)

    threads = [threading.Thread(target=writer, args=(w, ("s1", "s2")[w % 2])) for w in range(4)]
    threads += [threading.Thread(target=refresher, args=(s, b)) for s in ("s1", "s2") for b in (3, 200)]
    threads += [threading.Thread(target=purger, args=(s,)) for s in ("s1", "s2")]
    for t in threads:
        t.start()
    time.sleep(12)
    stop.set()
    for t in threads:
        t.join(120)
    assert not problems, problems[:5]
    cl.refresh_until_quiet(20)
    assert not api.list_errors(cl.topo)
    cl.assert_converged()
    assert cl.rows("s1", "stock")[0] == (1, "bolts", 100 + sum(added))


def test_a_tombstone_whose_key_is_not_ranked_yet_stays_until_it_is(backend, tmp_path):  # type: ignore[no-untyped-def]
    """Where writers capture concurrently (PostgreSQL, MariaDB) a local insert draws its key from a
    counter and the next reconcile at its site ranks it, counting every identity above the keys
    ranked so far. Before, a purge could drop such an identity's tombstone first (here: s1
    inserts two rows, deletes the first, s2 applies both and s1 purges before any reconcile at
    s1): the next reconcile at s1 then gave the second row key 1, which s2 holds at 2."""
    items = {"items": {"key": "id", "columns": {"name": "text"}}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], items)
    cl.execute("s1", "INSERT INTO items (name) VALUES ('first')")
    cl.execute("s1", "INSERT INTO items (name) VALUES ('second')")
    cl.execute("s1", "DELETE FROM items WHERE name = 'first'")
    cl.refresh("s2", "s1")  # s2 applies them; s1 reconciles nothing
    policy = PurgePolicy(min_age=0, tombstones_after=0)
    with api.Cluster(cl.topo) as c:
        purge_site(c, "s1", policy)
        purge_site(c, "s1", policy)  # observed, then passed
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == cl.rows("s2", "items") == [(2, "second")]


def test_a_site_of_the_topology_not_added_yet_does_not_stop_the_others_purge(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A site written into the topology file before `add-site` ran has no snapshot at its peers
    yet: purge of the others goes on (before: a raw 'no such table: _mm_snap_stock__s3' at the first
    site, no site purged, exit 1), and the new site is reported as not installed, exit 1."""
    import yaml
    from clusters import cli

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('a', 1)")
    cl.refresh_until_quiet()
    url = backend.new_site(tmp_path, "s3")
    backend.create_table(url, "stock", "id", STOCK["stock"]["columns"])
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["sites"]["s3"] = {"url": url}
    three = tmp_path / "three.yaml"
    three.write_text(yaml.safe_dump(doc, sort_keys=False))
    reps = {r.site: r for r in purge(load_topology(three), policy=NOW)}
    assert reps["s1"].error is None and reps["s2"].error is None
    assert "stock" in reps["s1"].tables and "stock" in reps["s2"].tables
    assert reps["s3"].error and "init" in reps["s3"].error
    out = cli("purge", "-t", str(three))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no such table" not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert "s3" in out.stdout + out.stderr
