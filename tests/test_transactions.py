"""Source transactions stay atomic at every peer (docs/transactions.md).

An application writes an order and its lines (two tables) in one transaction with a plain client;
a reader at another site polls, in a loop, while that site refreshes with batch sizes small enough
to cut inside a transaction: it must never see lines without their order, or an order without all
its lines. Over SQLite, PostgreSQL, MariaDB and a cluster mixing the three; with concurrent
writers; through a relay (chain).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import BACKENDS, Backend, server_unavailable

from multimaster import api
from multimaster.config.topology import Topology, load_topology
from multimaster.dialects.base import get_dialect

TABLES = {
    "orders": {"key": "id", "columns": {"oref": "text", "nlines": "int"}},
    "olines": {"key": "id", "columns": {"oref": "text", "n": "int"}},
}

# orders whose line count is wrong, lines whose order is missing: one statement, one snapshot
CHECK = (
    "SELECT (SELECT count(*) FROM orders o WHERE o.nlines <> (SELECT count(*) FROM olines l WHERE l.oref = o.oref)), "
    "(SELECT count(*) FROM olines l WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.oref = l.oref))"
)


class Cluster:
    """Sites over one or several backends; applications use plain clients."""

    def __init__(self, tmp: Path, sites: dict[str, Backend], links: Any) -> None:
        self.backends = sites
        self.urls = {s: b.new_site(tmp, s) for s, b in sites.items()}
        for s, url in self.urls.items():
            for tb, spec in TABLES.items():
                sites[s].create_table(url, tb, spec["key"], spec["columns"])
            # the application's index: its updates and deletes by order find their rows
            c = sites[s].connect(url)
            col = "oref(64)" if sites[s].name == "mysql" else "oref"
            for tb in TABLES:
                c.cursor().execute(f"CREATE INDEX {tb}_oref ON {tb} ({col})")
            c.commit()
            c.close()
        doc = {
            "sites": {s: {"url": u} for s, u in self.urls.items()},
            "tables": {tb: {"key": spec["key"]} for tb, spec in TABLES.items()},
            "links": links,
        }
        (tmp / "topology.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        self.topo: Topology = load_topology(tmp / "topology.yaml")
        api.init(self.topo)

    def connect(self, site: str) -> Any:
        return self.backends[site].connect(self.urls[site])

    def ph(self, site: str) -> str:
        return self.backends[site].param()

    def violations(self, site: str) -> tuple[int, int]:
        c = self.connect(site)
        try:
            cur = c.cursor()
            cur.execute(CHECK)
            bad = cur.fetchone()
            c.rollback()
            return int(bad[0]), int(bad[1])
        finally:
            c.close()

    def rows(self, site: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        c = self.connect(site)
        try:
            cur = c.cursor()
            cur.execute("SELECT oref, nlines FROM orders ORDER BY oref")
            orders = [tuple(r) for r in cur.fetchall()]
            cur.execute("SELECT oref, n FROM olines ORDER BY oref, n")
            lines = [tuple(r) for r in cur.fetchall()]
            c.rollback()
            return orders, lines
        finally:
            c.close()

    def refresh_until_quiet(self) -> None:
        with api.Cluster(self.topo) as cl:
            for _ in range(10):
                res = api.refresh(cl)
                assert not [r.error for r in res if r.error]
                if all(r.pulled == 0 for r in res):
                    return
        raise AssertionError("the cluster did not go quiet")


def new_order(cl: Cluster, site: str, c: Any, oref: str, k: int) -> None:
    """One transaction: an order and its k lines (statements apart, so concurrent writers'
    positions interleave)."""
    p = cl.ph(site)
    cur = c.cursor()
    cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({p}, {p})", (oref, k))
    for n in range(k):
        time.sleep(random.random() * 0.002)
        cur.execute(f"INSERT INTO olines (oref, n) VALUES ({p}, {p})", (oref, n))
    c.commit()


def add_line(cl: Cluster, site: str, c: Any, oref: str, n: int) -> None:
    p = cl.ph(site)
    cur = c.cursor()
    cur.execute(f"INSERT INTO olines (oref, n) VALUES ({p}, {p})", (oref, n))
    time.sleep(random.random() * 0.002)
    cur.execute(f"UPDATE orders SET nlines = nlines + 1 WHERE oref = {p}", (oref,))
    c.commit()


def drop_order(cl: Cluster, site: str, c: Any, oref: str) -> None:
    p = cl.ph(site)
    cur = c.cursor()
    cur.execute(f"DELETE FROM orders WHERE oref = {p}", (oref,))
    time.sleep(random.random() * 0.002)
    cur.execute(f"DELETE FROM olines WHERE oref = {p}", (oref,))
    c.commit()


def retrying(c: Any, fn: Any, *args: Any) -> None:
    """Run one application transaction, again when the database chose it as a deadlock victim (as
    applications on these databases do)."""
    for attempt in range(20):
        try:
            fn(*args)
            return
        except Exception as e:
            c.rollback()
            msg = str(e).lower()
            if attempt == 19 or not ("deadlock" in msg or "serializ" in msg or "lock wait" in msg):
                raise
            time.sleep(0.01 * (attempt + 1))


def writer(cl: Cluster, site: str, name: str, count: int, errors: list[BaseException]) -> threading.Thread:
    """An application at `site` writing `count` transactions: new orders, lines added to them (the
    order's count raised with them), orders deleted with their lines."""

    def run() -> None:
        rnd = random.Random(name)
        try:
            c = cl.connect(site)
            mine: dict[str, int] = {}
            for i in range(count):
                roll = rnd.random()
                if mine and roll < 0.25:
                    oref = rnd.choice(sorted(mine))
                    retrying(c, add_line, cl, site, c, oref, mine[oref])
                    mine[oref] += 1
                elif mine and roll < 0.35:
                    oref = rnd.choice(sorted(mine))
                    retrying(c, drop_order, cl, site, c, oref)
                    del mine[oref]
                else:
                    oref = f"{name}-{i}"
                    k = rnd.randint(1, 6)
                    retrying(c, new_order, cl, site, c, oref, k)
                    mine[oref] = k
            c.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    return threading.Thread(target=run)


def watch(cl: Cluster, readers: list[str], writers: list[threading.Thread], batch_size: int) -> tuple[list[Any], int]:
    """Run the writers while one thread refreshes every link over and over with `batch_size` and
    one more polls the readers' sites; returns what was seen wrong (or raised) and the polls."""
    stop = threading.Event()
    seen: list[Any] = []
    polls = [0]

    def refresher() -> None:
        try:
            with api.Cluster(cl.topo) as c:
                while not stop.is_set():
                    for r in api.refresh(c, batch_size=batch_size):
                        assert r.error is None, r.error
        except BaseException as e:  # noqa: BLE001 - reported by the test
            seen.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                for s in readers:
                    bad = cl.violations(s)
                    polls[0] += 1
                    if bad != (0, 0):
                        seen.append((s, bad))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            seen.append(e)

    helpers = [threading.Thread(target=refresher), threading.Thread(target=reader)]
    for t in helpers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in helpers:
        t.join()
    return seen, polls[0]


def check_converged(cl: Cluster) -> None:
    cl.refresh_until_quiet()
    ref = cl.rows(next(iter(cl.urls)))
    assert ref[0], "no order written"
    for s in cl.urls:
        assert cl.violations(s) == (0, 0), s
        assert cl.rows(s) == ref, f"{s} differs"


def test_a_reader_never_sees_part_of_a_transaction(backend: Backend, tmp_path: Path) -> None:
    cl = Cluster(tmp_path, {"a": backend, "b": backend}, "mesh")
    errors: list[BaseException] = []
    n = 1 if backend.name == "sqlite" else 3  # concurrent writers interleave their positions
    writers = [writer(cl, "a", f"w{i}", 25, errors) for i in range(n)]
    seen, polls = watch(cl, ["b"], writers, batch_size=2)
    assert not errors, errors
    assert seen == [], seen
    assert polls > 0
    check_converged(cl)


def test_a_relay_keeps_transactions_whole(backend: Backend, tmp_path: Path) -> None:
    cl = Cluster(tmp_path, {"s1": backend, "s2": backend, "s3": backend}, {"chain": ["s1", "s2", "s3"]})
    errors: list[BaseException] = []
    writers = [writer(cl, "s1", "w1", 20, errors), writer(cl, "s3", "w3", 10, errors)]
    seen, polls = watch(cl, ["s2", "s3", "s1"], writers, batch_size=3)
    assert not errors, errors
    assert seen == [], seen
    assert polls > 0
    check_converged(cl)


def test_a_transaction_larger_than_the_batch_is_one_batch(backend: Backend, tmp_path: Path) -> None:
    cl = Cluster(tmp_path, {"a": backend, "b": backend}, "mesh")
    for oref, k in (("big", 9), ("small", 1)):  # two clients
        c = cl.connect("a")
        new_order(cl, "a", c, oref, k)
        c.close()
    res = api.refresh(cl.topo, "b", "a", batch_size=1)
    assert res[0].error is None and res[0].pulled == 12
    # the big transaction is longer than the window of 4 entries: it is read in pieces (4 of its
    # lines, 4, then the rest and the small one), all applied in one target transaction; a source
    # that records no transactions (SQLite) alike, window after window. A batch counts a piece.
    assert res[0].batches == 3
    assert cl.rows("b") == cl.rows("a")


def test_a_transaction_straddling_the_horizon_is_held_back_whole(backend: Backend, tmp_path: Path) -> None:
    """T writes the order, U starts (registers below T's lines), T writes the lines and commits;
    U is still open: the horizon lies between T's order and its lines. The peer applies neither
    until U ends, then both."""
    if not get_dialect(backend.name).caps.concurrent_capture:
        pytest.skip("one writer at a time: no transaction is open while another commits")
    cl = Cluster(tmp_path, {"a": backend, "b": backend}, "mesh")
    p = cl.ph("a")
    ct, cu = cl.connect("a"), cl.connect("a")
    try:
        t, u = ct.cursor(), cu.cursor()
        t.execute(f"INSERT INTO orders (oref, nlines) VALUES ({p}, 2)", ("T",))
        u.execute(f"INSERT INTO orders (oref, nlines) VALUES ({p}, 0)", ("U",))
        t.execute(f"INSERT INTO olines (oref, n) VALUES ({p}, 0)", ("T",))
        t.execute(f"INSERT INTO olines (oref, n) VALUES ({p}, 1)", ("T",))
        ct.commit()
        res = api.refresh(cl.topo, "b", "a", batch_size=1)
        assert res[0].error is None
        assert cl.rows("b") == ([], [])  # T's order is below the horizon, its lines are not: none of it
        cu.commit()
    finally:
        ct.close()
        cu.close()
    res = api.refresh(cl.topo, "b", "a", batch_size=1)
    assert res[0].error is None
    assert cl.rows("b") == ([("T", 2), ("U", 0)], [("T", 0), ("T", 1)])


@pytest.fixture
def three() -> dict[str, Backend]:
    out = {}
    for name in ("sqlite", "postgresql", "mysql"):
        try:
            out[name] = BACKENDS[name]()
        except ConnectionError as e:
            for b in out.values():
                b.cleanup()
            server_unavailable(name, str(e))
    yield out
    for b in out.values():
        b.cleanup()


def test_mixed_databases_keep_transactions_whole(three: dict[str, Backend], tmp_path: Path) -> None:
    sites = {"lite": three["sqlite"], "pg": three["postgresql"], "maria": three["mysql"]}
    cl = Cluster(tmp_path, sites, {"chain": ["pg", "lite", "maria"]})
    errors: list[BaseException] = []
    writers = [writer(cl, "pg", "p1", 15, errors), writer(cl, "pg", "p2", 15, errors), writer(cl, "maria", "m1", 15, errors)]
    seen, polls = watch(cl, ["lite", "maria", "pg"], writers, batch_size=2)
    assert not errors, errors
    assert seen == [], seen
    assert polls > 0
    check_converged(cl)


def test_every_entry_of_a_transaction_has_its_txn_and_transactions_apart_differ(backend: Backend, tmp_path: Path) -> None:
    """One connection writes T1 (an order, a horizon read by a puller in the middle, its line),
    then, after another horizon, T2: as a puller reads them (MariaDB's entries stamped with their
    transaction's id first), T1's entries share one txn, T2's another."""
    d = get_dialect(backend.name)
    if not d.caps.txn_column:
        pytest.skip("no transaction recorded: a SQLite source's read is one batch")
    cl = Cluster(tmp_path, {"a": backend, "b": backend}, "mesh")
    p = cl.ph("a")
    src = api.Cluster(cl.topo)
    try:
        site = src.site("a")

        def horizon() -> None:
            with site.read() as conn:
                site.dialect.read_horizon(conn, "orders")

        c = cl.connect("a")
        cur = c.cursor()
        cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({p}, 1)", ("T1",))
        horizon()  # a reader in the middle of T1 does not wait for it, nor change its txn
        cur.execute(f"INSERT INTO olines (oref, n) VALUES ({p}, 0)", ("T1",))
        c.commit()
        horizon()
        cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({p}, 0)", ("T2",))
        c.commit()
        c.close()
        with site.read() as conn:  # what a puller reads through
            site.dialect.read_horizons(conn, ["orders", "olines"])
        txns = {}
        r = cl.connect("a")
        rc = r.cursor()
        for tb in ("orders", "olines"):
            rc.execute(f"SELECT n_oref, txn FROM {d.obj(tb).log}")
            for oref, txn in rc.fetchall():
                txns.setdefault(oref, set()).add(txn)
        r.close()
        assert len(txns["T1"]) == 1 and None not in txns["T1"]
        assert len(txns["T2"]) == 1 and txns["T2"] != txns["T1"]
    finally:
        src.close()


def test_a_slow_read_from_a_sqlite_source_does_not_hold_the_sqlite_targets_writers(
    sqlite_backend: Backend, tmp_path: Path
) -> None:
    """A SQLite source records no transactions, so its link is applied in one target transaction
    (window after window). Its first read from the source (over a WAN, through an agent: seconds)
    happens before that transaction begins: while it is under way an application at the target
    commits with a short busy timeout. The refresh still applies what it read, and the
    application's row stays."""
    from multimaster.engine import refresh as refresh_mod

    cl = Cluster(tmp_path, {"a": sqlite_backend, "b": sqlite_backend}, "mesh")
    w = cl.connect("b")
    w.cursor().execute("INSERT INTO orders (oref, nlines) VALUES (?, 0)", ("from-b",))
    w.commit()
    w.close()
    real = refresh_mod.read_link
    during: list[str] = []

    def slow_read(src: Any, target: str, *a: Any, **k: Any) -> Any:
        got = real(src, target, *a, **k)
        if target == "a" and not during:  # the application at the target writes meanwhile
            import sqlite3

            app = sqlite3.connect(cl.urls["a"].removeprefix("sqlite:///"), timeout=0.3)
            try:
                app.execute("INSERT INTO orders (oref, nlines) VALUES (?, 0)", ("at-a",))
                app.commit()
                during.append("committed")
            except sqlite3.OperationalError as e:
                during.append(str(e))
            finally:
                app.close()
        return got

    refresh_mod.read_link = slow_read  # type: ignore[assignment]
    try:
        with api.Cluster(cl.topo) as c:
            (res,) = api.refresh(c, "a", "b")
    finally:
        refresh_mod.read_link = real  # type: ignore[assignment]
    assert during == ["committed"], during
    assert res.error is None and res.pulled == 1
    r = cl.connect("a")
    assert sorted(x for (x,) in r.cursor().execute("SELECT oref FROM orders").fetchall()) == ["at-a", "from-b"]
    r.close()
