"""Many writers of one replicated table at one site, none waiting for another (issue "Concurrent
writers"; docs/concepts.md "Many writers"). Forced interleavings — transactions that capture in
one order and commit in another, roll back, or stay open across many refreshes — and a
randomized stress run with refreshers pulling all the while, each checked against a reference
model of the committed writes. Runs where writers capture concurrently
(Capabilities.concurrent_capture); test_server_concurrency.py covers the queued design too."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from clusters import MySQLBackend, make_cluster

from multimaster import api
from multimaster.dialects import get_dialect

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}}}


def _concurrent_only(backend) -> None:  # type: ignore[no-untyped-def]
    if not get_dialect(backend.name).caps.concurrent_capture:
        pytest.skip(f"{backend.name}: writers of one table capture one at a time")


class _Writer:
    """One application connection at a site, written to as an application does (plain client)."""

    def __init__(self, cl, site: str) -> None:  # type: ignore[no-untyped-def]
        self.cl, self.conn, self.p = cl, cl.db(site), cl.backend.param()

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self.conn.cursor().execute(sql.replace("?", self.p), params)

    def in_thread(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        """Run `sql` and commit in another thread; fail if it has to wait (for 10 s)."""
        err: list[BaseException] = []

        def go() -> None:
            try:
                self.run(sql, params)
                self.conn.commit()
            except BaseException as e:  # noqa: BLE001 - reported below
                err.append(e)

        t = threading.Thread(target=go)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), f"{sql!r} waited for another writer of the table"
        assert not err, err

    def close(self) -> None:
        self.conn.close()


def _names(cl, site: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {r[1]: r[2] for r in cl.rows(site, "stock")}


def test_a_rolled_back_writer_and_a_rolled_back_savepoint(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A inserts and stays open; B inserts and commits without waiting; a peer pulls nothing of B's
    while A runs; A rolls back. C rolls back a savepoint that inserted and commits the rest. At
    both sites: exactly B's and C's committed rows, with keys 1..3 (the keys A drew are not kept)."""
    _concurrent_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    a, b, c = _Writer(cl, "s1"), _Writer(cl, "s1"), _Writer(cl, "s1")
    try:
        a.run("INSERT INTO stock (name, qty) VALUES ('a1', 1), ('a2', 2)")
        b.in_thread("INSERT INTO stock (name, qty) VALUES ('b1', 3)")
        assert cl.refresh("s2", "s1")[0].pulled == 0, "B's change was handed out while A, registered before it, ran"
        a.conn.rollback()
        c.run("INSERT INTO stock (name, qty) VALUES ('c1', 4)")
        c.run("SAVEPOINT sp")
        c.run("INSERT INTO stock (name, qty) VALUES ('c-gone', 5)")
        c.run("ROLLBACK TO SAVEPOINT sp")
        c.run("INSERT INTO stock (name, qty) VALUES ('c2', 6)")
        c.conn.commit()
    finally:
        for w in (a, b, c):
            w.close()
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2"):
        assert _names(cl, s) == {"b1": 3, "c1": 4, "c2": 6}, s
        assert [r[0] for r in cl.rows(s, "stock")] == [1, 2, 3], s


def test_a_long_transaction_holds_back_only_what_follows_it(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A updates row 1 and stays open across five refreshes while B commits five inserts; every
    refresh pulls nothing (each of B's changes follows A's registration). B renames row 2 and
    commits; then A renames row 2 too and commits: A wrote after reading B's committed write, so
    A's rename is the later one at every site. Everything arrives once."""
    _concurrent_only(backend)
    base = [("stock", 1, "x", 10), ("stock", 2, "y", 20)]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": base, "s2": base})
    a, b = _Writer(cl, "s1"), _Writer(cl, "s1")
    try:
        a.run("UPDATE stock SET qty = qty + 1 WHERE id = 1")
        for i in range(5):
            b.in_thread("INSERT INTO stock (name, qty) VALUES (?, ?)", (f"b{i}", i))
            assert cl.refresh("s2", "s1")[0].pulled == 0, f"round {i}: a change after A's registration was handed out"
        b.in_thread("UPDATE stock SET name = 'from-B' WHERE id = 2")
        a.run("UPDATE stock SET name = 'from-A' WHERE id = 2")
        a.conn.commit()
    finally:
        a.close()
        b.close()
    res = cl.refresh("s2", "s1")
    assert res[0].pulled == 8  # A's two updates, B's five inserts and its rename
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _names(cl, "s2") == {"x": 11, "from-A": 20, **{f"b{i}": i for i in range(5)}}


def test_random_writers_at_two_sites_match_a_reference_model(backend, tmp_path):  # type: ignore[no-untyped-def]
    """Three writer threads per site, each running random transactions — insert, add to a row's
    quantity (additive), delete — of one to three statements with application think time inside,
    a fifth of them rolled back, while a refresher pulls both ways all along. Afterwards every site
    holds exactly the committed writes: the rows inserted and not deleted, each quantity its
    initial value plus every committed addition, keys unique ranks of the identities (1..N less
    the deleted ones), the same at both sites, and each key counter past the highest key."""
    _concurrent_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    rnd = random.Random(20261123)
    model_lock = threading.Lock()
    inserted: dict[str, int] = {}  # name -> initial qty, committed inserts
    added: dict[str, int] = {}  # name -> sum of committed additions
    deleted: set[str] = set()
    errors: list[BaseException] = []
    deadlocks: list[BaseException] = []
    n_tx = 25
    if backend.name == "mysql":  # the applications update and delete by name: index it, as an application would
        for s in ("s1", "s2"):
            cl.execute(s, "CREATE INDEX stock_name ON stock (name(40))")

    def writer(site: str, w: int, seed: int) -> None:
        r = random.Random(seed)
        conn = cl.db(site)
        cur = conn.cursor()
        p = backend.param()
        try:
            for t in range(n_tx):
                ins: dict[str, int] = {}
                add: dict[str, int] = {}
                dele: set[str] = set()
                try:
                    _transaction(r, cur, p, site, w, t, ins, add, dele)
                except Exception as e:  # noqa: BLE001
                    # InnoDB (REPEATABLE READ) also picks deadlock victims among applications
                    # whose statements take gap locks (inserts next to updated rows), with or
                    # without multimaster; it rolls the whole transaction back, as an application's
                    # retry would start over. On PostgreSQL, whose applications here lock rows in
                    # one order, any deadlock is one with multimaster: a failure
                    if "eadlock" not in str(e) or backend.name != "mysql":
                        raise
                    conn.rollback()
                    deadlocks.append(e)
                    continue
                if r.random() < 0.2:
                    conn.rollback()
                    continue
                conn.commit()
                with model_lock:
                    inserted.update(ins)
                    for k, v in add.items():
                        added[k] = added.get(k, 0) + v
                    deleted.update(dele)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            conn.rollback()
        finally:
            conn.close()

    def _transaction(
        r: random.Random, cur: Any, p: str, site: str, w: int, t: int, ins: dict[str, int], add: dict[str, int], dele: set[str]
    ) -> None:
        cur.execute("SELECT name FROM stock")
        visible = sorted(x[0] for x in cur.fetchall())
        cur.connection.rollback()  # (the read is not part of the transaction below)
        # the transaction's statements: inserts first, then updates and deletes in name order, so
        # the applications' own transactions lock rows in one order
        plan: list[tuple[int, str]] = []
        for _ in range(r.randint(1, 3)):
            op = r.random()
            if op < 0.5 or not visible:
                plan.append((0, f"{site}-{w}-{t}-{len(plan)}"))
            else:
                plan.append((1 if op < 0.92 else 2, r.choice(visible)))
        plan.sort(key=lambda x: (x[0] != 0, x[1]))
        for kind, name in plan:
            if kind == 0:
                q = r.randint(0, 50)
                cur.execute(f"INSERT INTO stock (name, qty) VALUES ({p}, {p})", (name, q))
                ins[name] = q
            elif kind == 1:
                d = r.randint(1, 9)
                cur.execute(f"UPDATE stock SET qty = qty + {p} WHERE name = {p}", (d, name))
                if cur.rowcount:
                    add[name] = add.get(name, 0) + d
            else:
                cur.execute(f"DELETE FROM stock WHERE name = {p}", (name,))
                if cur.rowcount:
                    dele.add(name)
            time.sleep(r.random() * 0.004)  # application work inside the transaction

    threads = [threading.Thread(target=writer, args=(s, w, rnd.randrange(1 << 30))) for s in ("s1", "s2") for w in range(3)]
    errors += cl.run_while_refreshing(threads)
    assert not errors, errors
    assert len(deadlocks) < n_tx, deadlocks  # a few victims at most: most transactions run through
    cl.refresh_until_quiet()
    cl.assert_converged()
    want = {n: q + added.get(n, 0) for n, q in inserted.items() if n not in deleted}
    for s in ("s1", "s2"):
        rows = cl.rows(s, "stock")
        assert {r[1]: r[2] for r in rows} == want, s
        keys = [r[0] for r in rows]
        assert len(set(keys)) == len(keys) and all(1 <= k <= len(inserted) for k in keys), s
    # every site gave the same identities the same keys, and a new row takes a key past them all
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('last', 0)")
    assert max(r[0] for r in cl.rows("s1", "stock")) == len(inserted) + 1


TAGS = {"tags": {"key": "code", "auto": False, "columns": {"label": "text"}}}


def test_replace_and_on_duplicate_key_update_capture_concurrently(backend, tmp_path):  # type: ignore[no-untyped-def]
    """MariaDB's REPLACE (a delete and an insert of the key) and INSERT ... ON DUPLICATE KEY UPDATE
    (an update, or an insert) on a natural-key table: A replaces a row and stays open; B upserts an
    existing and a new key and commits without waiting; a peer pulls nothing while A, registered
    first, runs; after A commits every site holds both, the replaced row as a new incarnation."""
    if backend.name != "mysql":
        pytest.skip("REPLACE and ON DUPLICATE KEY UPDATE are MariaDB's")
    _concurrent_only(backend)
    base = [("tags", "x", "x0"), ("tags", "y", "y0")]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TAGS, base={"s1": base, "s2": base})
    a, b = _Writer(cl, "s1"), _Writer(cl, "s1")
    try:
        a.run("REPLACE INTO tags (code, label) VALUES ('x', 'A')")
        b.in_thread("INSERT INTO tags (code, label) VALUES ('y', 'B'), ('z', 'B') ON DUPLICATE KEY UPDATE label = 'B'")
        assert cl.refresh("s2", "s1")[0].pulled == 0, "B's changes were handed out while A, registered before it, ran"
        a.conn.commit()
    finally:
        a.close()
        b.close()
    cl.refresh_until_quiet()
    cl.assert_converged()
    for s in ("s1", "s2"):
        assert {r[0]: r[1] for r in cl.rows(s, "tags")} == {"x": "A", "y": "B", "z": "B"}, s
    c = cl.db("s2")
    try:  # REPLACE ended the first incarnation of 'x' and began a second one
        cur = c.cursor()
        cur.execute("SELECT count(*), sum(deleted IS NULL) FROM _mm_shadow_tags WHERE `key` = 'x'")
        assert tuple(int(v) for v in cur.fetchone()) == (2, 1)
    finally:
        c.close()


def test_a_connections_next_transaction_is_held_back_by_its_committed_slot(backend, tmp_path):  # type: ignore[no-untyped-def]
    """MariaDB's slots: a connection that captured before (its slot is committed) opens a new
    transaction and captures; another commits after it. The horizon must stay below the open
    transaction's positions, which its slot shows only uncommitted, and may pass the previous
    transaction's (the slot's committed value): a peer pulls the first transaction's change and
    nothing after, until A commits."""
    if backend.name != "mysql":
        pytest.skip("the slots are MariaDB's")
    _concurrent_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    a, b = _Writer(cl, "s1"), _Writer(cl, "s1")
    try:
        a.run("INSERT INTO stock (name, qty) VALUES ('a1', 1)")
        a.conn.commit()  # a's slot now exists, committed
        a.run("UPDATE stock SET qty = qty + 1 WHERE id = 1")  # a's second transaction, open (by key: no scan locks)
        b.in_thread("INSERT INTO stock (name, qty) VALUES ('b1', 2)")
        assert cl.refresh("s2", "s1")[0].pulled == 1, "only A's first, committed transaction may be handed out"
        a.conn.commit()
    finally:
        a.close()
        b.close()
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _names(cl, "s2") == {"a1": 2, "b1": 2}


def test_the_clock_rows_below_the_horizon_are_trimmed_by_a_pull(backend, tmp_path):  # type: ignore[no-untyped-def]
    """MariaDB's clock (_mm_tick) keeps a row per position drawn until a peer's pull trims those
    below the horizon (their transactions ended); the newest row stays, and the clock reads on."""
    if backend.name != "mysql":
        pytest.skip("the clock table is MariaDB's")
    _concurrent_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(30):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))

    def ticks() -> tuple[int, int]:
        c = cl.db("s1")
        try:
            cur = c.cursor()
            cur.execute("SELECT count(*), max(t) FROM _mm_tick")
            n, top = cur.fetchone()
            return int(n), int(top)
        finally:
            c.close()

    n0, top0 = ticks()
    assert n0 >= 30
    cl.refresh_until_quiet()
    n1, top1 = ticks()
    assert n1 <= 2 and top1 >= top0, (n0, n1)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('later', 1)")
    cl.refresh_until_quiet()
    assert _names(cl, "s2")["later"] == 1
    cl.assert_converged()


def test_add_site_cuts_the_log_exactly_while_a_writer_is_open(backend, tmp_path):  # type: ignore[no-untyped-def]
    """add-site copies s1 while A (registered first, still open) and B (committed after A
    registered) both wrote: B's change is in the copy although its position is past the cut, and
    A's is not. Afterwards s3 holds each change exactly once (the quantities are additive: a change
    applied twice, or skipped, shows)."""
    _concurrent_only(backend)
    from test_add_site import grow

    from multimaster.ops.instantiate import add_site

    base = [("stock", 1, "counter", 0), ("stock", 2, "widgets", 10)]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": base, "s2": base})
    big = grow(cl, tmp_path, "s3")
    a, b = _Writer(cl, "s1"), _Writer(cl, "s1")
    try:
        a.run("UPDATE stock SET qty = qty + 1 WHERE id = 1")
        b.in_thread("UPDATE stock SET qty = qty + 10 WHERE id = 2")
        b.in_thread("INSERT INTO stock (name, qty) VALUES ('from-B', 5)")
        add_site(big.topo, "s3", "s1")
        a.run("INSERT INTO stock (name, qty) VALUES ('from-A', 7)")
        a.conn.commit()
    finally:
        a.close()
        b.close()
    big.refresh_until_quiet()
    big.assert_converged()
    for s in ("s1", "s2", "s3"):
        assert _names(big, s) == {"counter": 1, "widgets": 20, "from-B": 5, "from-A": 7}, s


def test_the_clock_moves_to_the_wall_clock_at_most_once_every_two_milliseconds(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A capture draws the next value of the clock and moves the clock to the wall clock only when
    that value is more than one millisecond (65536) behind it (PostgreSQL's jump, MariaDB's
    catch-up; docs/clock.md "Rules"). The wall clock is read in whole milliseconds and a move goes
    past it, so the next move waits for the millisecond after next: one connection inserting 300
    rows, one statement each, as fast as it can, moves the clock at most once every two
    milliseconds (plus one), and every version is within 1 ms of the wall clock at its draw. The
    code before moved it whenever the value was behind at all: at every millisecond's first draw
    (a move costs 34,000-68,000 instructions; docs/decisions.md, session 24). A move shows as a gap
    between consecutive positions: without one, a draw takes the next value."""
    _concurrent_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    log = "_mm._mm_log_stock" if backend.name == "postgresql" else "_mm_log_stock"
    w = _Writer(cl, "s1")
    try:
        t0 = time.time()
        for i in range(300):
            w.run("INSERT INTO stock (name, qty) VALUES (?, ?)", (f"w{i}", i))
        w.conn.commit()
        t1 = time.time()
        cur = w.conn.cursor()
        cur.execute(f"SELECT seq FROM {log} ORDER BY seq")
        seqs = [int(r[0]) for r in cur.fetchall()]
        w.conn.commit()
    finally:
        w.close()
    assert len(seqs) == 300
    w0, w1 = int(t0 * 1000) << 16, (int(t1 * 1000) + 1) << 16
    assert all(w0 - 65536 <= p <= w1 + 65536 for p in seqs), (w0, w1, seqs[0], seqs[-1])
    moves = sum(1 for a, b in zip(seqs, seqs[1:]) if b - a > 1)
    assert moves <= (t1 - t0) * 1000 / 2 + 2, (moves, t1 - t0)
    cl.refresh_until_quiet()
    assert len(_names(cl, "s2")) == 300


def test_an_open_insert_or_update_holds_off_the_reconciler_giving_keys(backend, tmp_path):  # type: ignore[no-untyped-def]
    """The writers' lock of a renumbered table (Dialect.lock_writers): the reconciler takes it
    before it gives keys and cannot while an application's INSERT or UPDATE of the table is in an
    open transaction (PostgreSQL: an inserted row takes it in the key function, an UPDATE or
    DELETE in a statement trigger; MariaDB: the writer's slot), so every local key it ranks is
    committed. Once the writer commits, the reconciler takes it at once."""
    _concurrent_only(backend)
    from sqlalchemy.exc import OperationalError

    from multimaster.engine.site import Site

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('x', 1)")
    short = "SET lock_timeout = '300ms'" if backend.name == "postgresql" else "SET innodb_lock_wait_timeout = 1"
    site = Site("s1", cl.urls["s1"])
    try:
        for stmt in ("INSERT INTO stock (name, qty) VALUES ('a', 1)", "UPDATE stock SET qty = qty + 1 WHERE name = 'x'"):
            w = _Writer(cl, "s1")
            try:
                w.run(stmt)
                with pytest.raises(OperationalError), site.write() as conn:
                    conn.exec_driver_sql(short)
                    site.dialect.lock_writers(conn, site.info(conn, "stock", cl.topo))
                w.conn.commit()
            finally:
                w.close()
            with site.write() as conn:
                conn.exec_driver_sql(short)
                site.dialect.lock_writers(conn, site.info(conn, "stock", cl.topo))
    finally:
        site.dispose()
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _names(cl, "s2") == {"x": 2, "a": 1}


def test_writers_that_draw_in_one_millisecond_do_not_wait_for_each_other(backend, tmp_path):  # type: ignore[no-untyped-def]
    """MariaDB's clock follows the wall clock by an explicit value that moves _mm_tick's counter.
    Two open transactions whose draws fall in one millisecond must not meet on that value: A
    captures, B captures, A captures again while B is still open, many times over; A's second
    capture never waits for B (it gives up after 2 s of waiting and the test fails)."""
    if backend.name != "mysql":
        pytest.skip("the clock table is MariaDB's")
    _concurrent_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    a, b = _Writer(cl, "s1"), _Writer(cl, "s1")
    try:
        a.run("SET SESSION innodb_lock_wait_timeout = 2")
        for i in range(150):
            a.run("INSERT INTO stock (name, qty) VALUES (?, 1)", (f"a{i}",))
            b.run("INSERT INTO stock (name, qty) VALUES (?, 1)", (f"b{i}",))
            a.run("INSERT INTO stock (name, qty) VALUES (?, 2)", (f"A{i}",))
            a.conn.commit()
            b.conn.commit()
    finally:
        a.close()
        b.close()
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _names(cl, "s2") == {**{f"{w}{i}": 1 for w in "ab" for i in range(150)}, **{f"A{i}": 2 for i in range(150)}}


def _busy_writer(backend, tmp_path, clock: str, t2_ends_early: bool):  # type: ignore[no-untyped-def]
    """The scenario of the two tests below: A's T1 writes a1 and commits; A writes a2 and a horizon
    (s3's pull) runs while A's transaction is open; with `t2_ends_early` that transaction (T2) commits
    here and a3 goes into a third (T3); B opens (its registration holds the horizon down); A writes
    a3 and commits. Returns the cluster and s2's pull of s1 made then, after which B commits and
    every site converges with all four rows."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK)
    a, b = _Writer(cl, "s1"), _Writer(cl, "s1")
    try:
        if clock:
            a.run(clock)
        a.run("INSERT INTO stock (name, qty) VALUES ('a1', 1)")
        a.conn.commit()
        a.run("INSERT INTO stock (name, qty) VALUES ('a2', 1)")
        assert cl.refresh("s3", "s1")[0].pulled == 1  # a horizon while A is inside a transaction
        if t2_ends_early:
            a.conn.commit()
        b.run("INSERT INTO stock (name, qty) VALUES ('b1', 1)")
        a.run("INSERT INTO stock (name, qty) VALUES ('a3', 1)")
        a.conn.commit()
        res = cl.refresh("s2", "s1")[0]
        pulled = _names(cl, "s2")
        b.conn.commit()
    finally:
        a.close()
        b.close()
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _names(cl, "s2") == {"a1": 1, "a2": 1, "a3": 1, "b1": 1}
    return res, pulled


@pytest.mark.parametrize("clock", ["", "SET timestamp = 1800000000"], ids=["", "fixed-timestamp"])
def test_a_writer_that_never_pauses_does_not_hold_its_committed_transactions_back(backend, tmp_path, clock):  # type: ignore[no-untyped-def]
    """A connection under a steady load is inside a transaction whenever a horizon looks. A's T1
    commits; A's T2 writes a2, a horizon (s3's pull) runs while T2 is open, B opens, T2 writes a3
    past B's registration and commits. s2's pull must take T1 (a1) and hold T2 back whole (a3
    lies past the horizon B holds). MariaDB named a transaction by its connection and an epoch a
    horizon renews only while the connection is idle: T1 and T2 shared one, and nothing was taken
    until A paused (replication under 16 busy clients applied nothing while they wrote).
    fixed-timestamp: a MariaDB session whose NOW() stands still (SET timestamp), so the
    transaction count is read once for good and T1 and T2 share a name: the bound the horizon
    recorded while T2 was open still cuts between them."""
    _concurrent_only(backend)
    if clock and backend.name != "mysql":
        pytest.skip("SET timestamp is MariaDB's")
    res, pulled = _busy_writer(backend, tmp_path, clock, t2_ends_early=False)
    assert res.error is None
    assert res.pulled == 1 and pulled == {"a1": 1}, "T1 is whole below the horizon; T2 is not"


def test_each_transaction_of_a_connection_is_its_own_group(backend, tmp_path):  # type: ignore[no-untyped-def]
    """T1 commits; T2 writes a2 (a horizon runs meanwhile: s3's pull) and commits; B opens; T3, of
    the same connection, writes a3 past B's registration and commits, no horizon between T2 and
    T3. s2's pull takes T1 and T2 and holds T3 back: on MariaDB T2 and T3 differ only by the
    session's count of COMMITs (a bound the horizon records cuts only where it looked, after T3)."""
    _concurrent_only(backend)
    res, pulled = _busy_writer(backend, tmp_path, "", t2_ends_early=True)
    assert res.error is None
    assert res.pulled == 2 and pulled == {"a1": 1, "a2": 1}, "T1 and T2 lie whole below the horizon"


def test_a_transactions_entries_share_one_txn_and_autocommitted_statements_do_not(backend, tmp_path):  # type: ignore[no-untyped-def]
    """MariaDB's txn: the statements of one transaction (a multi-row INSERT, an UPDATE after it)
    share one; two transactions of a connection with no horizon between them differ; so do two
    autocommitted statements."""
    if backend.name != "mysql":
        pytest.skip("the session's transaction count is MariaDB's")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    a = _Writer(cl, "s1")
    try:
        a.run("INSERT INTO stock (name, qty) VALUES ('t1a', 1), ('t1b', 1)")
        a.run("UPDATE stock SET qty = 2 WHERE id = (SELECT max(id) FROM (SELECT id FROM stock) s)")
        a.conn.commit()
        a.run("INSERT INTO stock (name, qty) VALUES ('t2', 1)")
        a.conn.commit()
        a.conn.autocommit(True)
        a.run("INSERT INTO stock (name, qty) VALUES ('s1', 1)")
        a.run("INSERT INTO stock (name, qty) VALUES ('s2', 1)")
        MySQLBackend.stamp(a.conn, "stock")  # a reader stamps the ids in before it reads (site.sql)
        cur = a.conn.cursor()
        cur.execute("SELECT txn FROM _mm_log_stock ORDER BY seq")
        txns = [r[0] for r in cur.fetchall()]
    finally:
        a.close()
    assert len(txns) == 6, txns
    assert txns[0] == txns[1] == txns[2], txns
    assert len({txns[0], txns[3], txns[4], txns[5]}) == 4, txns


def _age_capture(cl, site: str) -> None:  # type: ignore[no-untyped-def]
    """Make the capture triggers of `stock` at `site` differ from the ones init makes, as a site
    installed by an earlier release has them, so that init replaces them: the same body with one
    more condition that is always true (MariaDB, whose init leaves unchanged triggers alone;
    PostgreSQL and SQLite make theirs in one transaction)."""
    if cl.backend.name != "mysql":
        return
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(
            "SELECT TRIGGER_NAME, ACTION_TIMING, EVENT_MANIPULATION, ACTION_STATEMENT FROM information_schema.TRIGGERS "
            "WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = 'stock' AND TRIGGER_NAME LIKE '\\_mm\\_%'"
        )
        triggers = cur.fetchall()
        assert len(triggers) == 4, triggers  # the key trigger and the three capture triggers
        for name, timing, event, body in triggers:
            aged = body.replace("IF coalesce(@mm_applying, 0) = 0 THEN", "IF coalesce(@mm_applying, 0) = 0 AND TRUE THEN", 1)
            assert aged != body, name
            cur.execute(f"CREATE OR REPLACE TRIGGER {name} {timing} {event} ON stock FOR EACH ROW {aged}")
    finally:
        c.close()


def test_init_run_again_while_applications_write_loses_no_write(backend, tmp_path):  # type: ignore[no-untyped-def]
    """An upgrade: init runs again on a site in use, and the capture it makes differs from the one
    there. Three application connections insert, update and delete all the while, one statement a
    transaction. MariaDB's DDL commits as it goes: init dropped a changed trigger and then created
    it, so a write in between went by uncaptured, and an insert that fell between the key
    trigger's DROP and CREATE failed (`Column 'seq' cannot be null`). Now no write fails, and the
    other site ends with exactly the committed writes."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    if backend.name == "mysql":  # the applications update and delete by name: index it, as an application would
        cl.execute("s1", "CREATE INDEX stock_name ON stock (name(40))")
    stop = threading.Event()
    lock = threading.Lock()
    model: dict[str, int] = {}
    errors: list[BaseException] = []
    p = backend.param()

    def writer(w: int) -> None:
        conn = cl.db("s1")
        cur = conn.cursor()
        mine: list[str] = []
        i = 0
        try:
            while not stop.is_set() or i < 30:
                name = f"w{w}-{i}"
                cur.execute(f"INSERT INTO stock (name, qty) VALUES ({p}, {p})", (name, i))
                conn.commit()
                with lock:
                    model[name] = i
                mine.append(name)
                if i % 3 == 2:
                    cur.execute(f"UPDATE stock SET qty = qty + 100 WHERE name = {p}", (mine[-2],))
                    conn.commit()
                    with lock:
                        model[mine[-2]] += 100
                if i % 5 == 4:
                    gone = mine.pop(0)
                    cur.execute(f"DELETE FROM stock WHERE name = {p}", (gone,))
                    conn.commit()
                    with lock:
                        del model[gone]
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(6):
            _age_capture(cl, "s1")
            api.init(cl.topo)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _names(cl, "s2") == model


def test_init_run_again_while_applications_read_then_write(backend, tmp_path):  # type: ignore[no-untyped-def]
    """init runs again on a site whose applications read a row and then update it, in one
    transaction. On PostgreSQL init locked the table SHARE ROW EXCLUSIVE, then DROP TRIGGER took
    ACCESS EXCLUSIVE: an application holding ACCESS SHARE from its read waited for init at its
    UPDATE, init for it at the DROP, and the deadlock check failed one of them (init, or the
    application). Now init takes the strongest lock first, gives up waiting before a deadlock
    check would run and runs again: every init and every application transaction succeeds."""
    if backend.name == "sqlite":
        pytest.skip("SQLite has one writer at a time: a read then a write waits for the file's lock")
    if backend.name == "mysql":
        pytest.skip(
            "MariaDB: a changed trigger's CREATE OR REPLACE waits for the table's metadata lock, and the "
            "deadlock a read-then-write application closes rolls the application back (docs/mysql.md Limits)"
        )
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK)
    p = backend.param()
    for i in range(5):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"r{i}", 0))
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0]

    def app(w: int) -> None:
        conn = cl.db("s1")
        cur = conn.cursor()
        try:
            while not stop.is_set():
                cur.execute(f"SELECT qty FROM stock WHERE name = {p}", (f"r{w}",))
                cur.fetchall()
                time.sleep(0.01)  # the application's work between its read and its write
                cur.execute(f"UPDATE stock SET qty = qty + 1 WHERE name = {p}", (f"r{w}",))
                conn.commit()
                done[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=app, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(6):
            _age_capture(cl, "s1")
            api.init(cl.topo)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert sum(_names(cl, "s2").values()) == done[0]
