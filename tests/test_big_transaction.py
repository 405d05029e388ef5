"""One source transaction larger than a refresh's window arrives whole, in bounded memory
(docs/transactions.md "Large transactions").

A bulk job writes an order and thousands of its lines in ONE transaction at a server site
(PostgreSQL, MariaDB); a peer refreshes with a small batch_size (a window of 4 x batch_size entries
per table). The refresh must read the transaction in pieces (no read larger than the window: the
memory a refresher holds), and apply all of it in one target transaction: a reader polling the
target meanwhile sees none of the lines or all of them, never part. A refresher killed midway
leaves nothing (its target transaction rolls back) and the next refresh takes it all, once. Small
transactions committed while the big one ran (positions interleaved with its) arrive with it; a
stretch that reaches the source's horizon (a transaction still open there) is held back whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import BACKENDS, Backend, server_unavailable
from test_agent import TOKEN, running_agent

from multimaster import api
from multimaster.config.topology import Topology, load_topology
from multimaster.engine import reconcile as Rc
from multimaster.engine import refresh as R
from multimaster.engine.pull import pull_link

TABLES = {
    "orders": {"key": "id", "columns": {"oref": "text", "nlines": "int"}},
    "olines": {"key": "id", "columns": {"oref": "text", "n": "int"}},
}
# orders whose line count is wrong, lines whose order is missing: one statement, one snapshot
CHECK = (
    "SELECT (SELECT count(*) FROM orders o WHERE o.nlines <> (SELECT count(*) FROM olines l WHERE l.oref = o.oref)), "
    "(SELECT count(*) FROM olines l WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.oref = l.oref))"
)
BATCH = 25  # a window of 100 entries per table
BIG = 1500  # lines of the big order: 15 windows


class Pair:
    """A source site `a` and a target site `b` (a mesh; the tests refresh b from a), applications using plain clients."""

    def __init__(self, tmp: Path, backends: dict[str, Backend], tables: dict[str, dict[str, Any]] = TABLES) -> None:
        self.tmp = tmp
        self.backends = backends
        self.urls = {s: b.new_site(tmp, s) for s, b in backends.items()}
        for s, url in self.urls.items():
            for tb, spec in tables.items():
                backends[s].create_table(url, tb, spec["key"], spec["columns"], auto=spec.get("auto", True))
                if not spec.get("auto", True) and backends[s].name == "mysql":  # a key compared exactly (docs/mysql.md)
                    c = backends[s].connect(url)
                    c.cursor().execute(f"ALTER TABLE `{tb}` MODIFY `{spec['key']}` VARCHAR(191) COLLATE utf8mb4_bin NOT NULL")
                    c.close()
        doc = {
            "sites": {s: {"url": u, **({"token": "${MM_AGENT_TOKEN}"} if s == "a" else {})} for s, u in self.urls.items()},
            "tables": {
                tb: {"key": spec["key"], **({} if spec.get("auto", True) else {"renumber": False})} for tb, spec in tables.items()
            },
            "links": "mesh",
        }
        self.path = tmp / "topology.yaml"
        self.path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.topo: Topology = load_topology(self.path)
        api.init(self.topo)

    def connect(self, site: str) -> Any:
        return self.backends[site].connect(self.urls[site])

    def ph(self, site: str) -> str:
        return self.backends[site].param()

    def one(self, site: str, sql: str) -> tuple[Any, ...]:
        c = self.connect(site)
        try:
            cur = c.cursor()
            cur.execute(sql)
            r = tuple(cur.fetchone())
            c.rollback()
            return r
        finally:
            c.close()

    def read(self, site: str, *queries: str) -> tuple[list[tuple[Any, ...]], ...]:
        """The rows of each of `queries` at `site`, read in one transaction."""
        c = self.connect(site)
        try:
            cur = c.cursor()
            out = []
            for q in queries:
                cur.execute(q)
                out.append([tuple(r) for r in cur.fetchall()])
            c.rollback()
            return tuple(out)
        finally:
            c.close()

    def rows(self, site: str) -> tuple[list[tuple[Any, ...]], ...]:
        return self.read(site, "SELECT oref, nlines FROM orders ORDER BY oref", "SELECT oref, n FROM olines ORDER BY oref, n")


def order(p: Pair, c: Any, oref: str, k: int, commit: bool = True) -> None:
    """An order and its k lines in the transaction open on `c` (lines in statements of 100 rows)."""
    ph = p.ph("a")
    cur = c.cursor()
    cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({ph}, {ph})", (oref, k))
    for i in range(0, k, 100):
        cur.executemany(f"INSERT INTO olines (oref, n) VALUES ({ph}, {ph})", [(oref, n) for n in range(i, min(k, i + 100))])
    if commit:
        c.commit()


PAIRS = [("postgresql", "mysql"), ("mysql", "postgresql"), ("postgresql", "sqlite"), ("mysql", "mysql")]


def _made(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tables: dict[str, Any]
) -> Iterator[Pair]:
    monkeypatch.setenv("MM_AGENT_TOKEN", TOKEN)  # site a's token (its agent checks it)
    made: dict[str, Backend] = {}
    try:
        for name in dict.fromkeys(request.param):
            try:
                made[name] = BACKENDS[name]()
            except ConnectionError as e:
                server_unavailable(name, str(e))
        src, tgt = request.param
        yield Pair(tmp_path, {"a": made[src], "b": made[tgt]}, tables)
    finally:
        for b in made.values():
            b.cleanup()


@pytest.fixture(params=PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def pair(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    yield from _made(request, tmp_path, monkeypatch, TABLES)


# an auto-counter table (keys renumbered to global insertion order) and a natural-key one
MIXED = {
    "items": {"key": "id", "columns": {"name": "text", "n": "int"}},
    "codes": {"key": "code", "columns": {"name": "text", "n": "int"}, "auto": False},
}
# every database as a target: MariaDB (the planner), PostgreSQL and SQLite (the set-based fast path)
MIXED_PAIRS = [("postgresql", "mysql"), ("mysql", "postgresql"), ("postgresql", "sqlite"), ("postgresql", "postgresql")]


@pytest.fixture(params=MIXED_PAIRS, ids=[f"{a}-to-{b}" for a, b in MIXED_PAIRS])
def mixed(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    yield from _made(request, tmp_path, monkeypatch, MIXED)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most entries of one table each read of a link returned (what a refresher holds)."""
    seen: list[int] = []
    real = R.read_link

    def counted(*a: Any, **kw: Any) -> Any:
        got = real(*a, **kw)
        seen.append(max((len(v) for v in got.rows.values()), default=0))
        return got

    monkeypatch.setattr(R, "read_link", counted)
    monkeypatch.setenv("MM_PLAN_PIECE", "40")  # the reconciler plans in pieces of 40 changes
    return seen


def watched(p: Pair, fn: Any) -> tuple[Any, list[Any], int]:
    """Run `fn` while a reader polls the target: what it returned, what the reader saw wrong (an
    order without all its lines, lines without their order), and how many polls it made."""
    stop = threading.Event()
    seen: list[Any] = []
    polls = [0]

    def reader() -> None:
        try:
            while not stop.is_set():
                bad = p.one("b", CHECK)
                polls[0] += 1
                if tuple(int(x) for x in bad) != (0, 0):
                    seen.append(bad)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            seen.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        out = fn()
    finally:
        stop.set()
        t.join()
    return out, seen, polls[0]


def test_a_transaction_longer_than_the_window_arrives_whole_in_bounded_reads(pair: Pair, reads: list[int]) -> None:
    p = pair
    c = p.connect("a")
    order(p, c, "first", 2)
    order(p, c, "big", BIG)  # one transaction: 1 order, 1,500 lines
    order(p, c, "after", 3)
    c.close()
    res, seen, polls = watched(p, lambda: api.refresh(p.topo, "b", "a", batch_size=BATCH))
    assert res[0].error is None, res[0].error
    assert seen == [], seen
    assert polls > 0
    assert max(reads) <= 4 * BATCH, f"a read of {max(reads)} entries of one table: the window grew to hold the transaction"
    assert res[0].batches >= BIG // (4 * BATCH)  # read in pieces
    assert res[0].pulled == 3 + 2 + BIG + 3
    assert p.rows("b") == p.rows("a")


def test_a_refresher_killed_midway_leaves_nothing_and_the_next_takes_it_once(pair: Pair, tmp_path: Path) -> None:
    p = pair
    c = p.connect("a")
    order(p, c, "big", BIG)
    c.close()
    script = tmp_path / "dying.py"
    script.write_text(
        "import os, signal, sys\n"
        "from multimaster import api\n"
        "from multimaster.config.topology import load_topology\n"
        "from multimaster.engine import refresh as R\n"
        "real, n = R._apply_batch, [0]\n"
        "def dying(conn, **kw):\n"
        "    n[0] += 1\n"
        "    if n[0] == 6:  # five pieces stored and applied in the open target transaction\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(conn, **kw)\n"
        "R._apply_batch = dying\n"
        f"api.refresh(load_topology(sys.argv[1]), 'b', 'a', batch_size={BATCH})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(R.__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, str(script), str(p.path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr[-2000:])
    assert p.rows("b") == ([], [])  # its one target transaction rolled back: nothing of it
    res = api.refresh(p.topo, "b", "a", batch_size=BATCH)
    assert res[0].error is None, res[0].error
    orders, lines = p.rows("b")
    assert orders == [("big", BIG)]
    assert lines == [("big", n) for n in range(BIG)]  # every line once
    assert api.refresh(p.topo, "b", "a", batch_size=BATCH)[0].pulled == 0


def test_small_transactions_committed_while_a_large_one_ran_arrive_with_it(pair: Pair, reads: list[int]) -> None:
    p = pair
    big, small = p.connect("a"), p.connect("a")
    try:
        ph = p.ph("a")
        cur = big.cursor()
        cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({ph}, {ph})", ("big", BIG))
        for i in range(0, BIG, 100):  # the big one writes on; small ones commit between its statements
            cur.executemany(f"INSERT INTO olines (oref, n) VALUES ({ph}, {ph})", [("big", n) for n in range(i, i + 100)])
            order(p, small, f"s{i:05d}", 2)
        big.commit()
        order(p, small, "last", 1)
    finally:
        big.close()
        small.close()
    res, seen, polls = watched(p, lambda: api.refresh(p.topo, "b", "a", batch_size=BATCH))
    assert res[0].error is None, res[0].error
    assert seen == [], seen
    assert polls > 0
    assert max(reads) <= 4 * BATCH, f"a read of {max(reads)} entries of one table"
    assert p.rows("b") == p.rows("a")
    assert len(p.rows("b")[0]) == 2 + BIG // 100


def test_a_stretch_reaching_the_horizon_is_held_back_whole(pair: Pair, reads: list[int]) -> None:
    """The big transaction commits while another, begun amid its statements, stays open: the
    source's horizon lies inside the big one's stretch. Nothing of it is applied (not a piece)
    until the other ends; then all of it."""
    p = pair
    if p.backends["a"].name == "sqlite":
        pytest.skip("one writer at a time")
    big, other = p.connect("a"), p.connect("a")
    ph = p.ph("a")
    try:
        cur = big.cursor()
        cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({ph}, {ph})", ("big", BIG))
        cur.executemany(f"INSERT INTO olines (oref, n) VALUES ({ph}, {ph})", [("big", n) for n in range(300)])
        other.cursor().execute(f"INSERT INTO orders (oref, nlines) VALUES ({ph}, 0)", ("open",))
        for i in range(300, BIG, 100):
            cur.executemany(f"INSERT INTO olines (oref, n) VALUES ({ph}, {ph})", [("big", n) for n in range(i, i + 100)])
        big.commit()
        res = api.refresh(p.topo, "b", "a", batch_size=BATCH)
        assert res[0].error is None, res[0].error
        assert p.rows("b") == ([], [])
        assert res[0].held_back
        other.commit()
    finally:
        big.close()
        other.close()
    res = api.refresh(p.topo, "b", "a", batch_size=BATCH)
    assert res[0].error is None, res[0].error
    assert p.rows("b") == p.rows("a")
    assert max(reads) <= 4 * BATCH


def test_an_agent_serves_a_large_transaction_in_pieces(pair: Pair, reads: list[int]) -> None:
    """A source read through its agent (docs/agent.md): the agent reads from the position it is
    sent, inside the transaction, and says how far the transactions continuing past its window
    reach; the refresh takes the big one in pieces, whole, as from the database."""
    p = pair
    c = p.connect("a")
    order(p, c, "big", BIG)
    order(p, c, "after", 1)
    c.close()
    with running_agent(p.topo, "a") as url:
        doc = yaml.safe_load(p.path.read_text())
        doc["sites"]["a"] = {"url": url, "token": "${MM_AGENT_TOKEN}"}
        (p.tmp / "peer.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        peer = load_topology(p.tmp / "peer.yaml")
        with api.Cluster(p.topo) as direct, api.Cluster(peer) as remote:
            with direct.site("b").read() as conn:
                infos = [direct.site("b").info(conn, tb, p.topo) for tb in TABLES]
            wms = {"orders": 0, "olines": 0}
            a, b = pull_link(direct.site("a"), "b", infos, wms, 4 * BATCH), remote.site("a").pull_link("b", infos, wms, 4 * BATCH)
            assert a.more and a.continuing and a.beyond is not None
            assert (a.end, a.continuing, a.beyond) == (b.end, b.continuing, b.beyond)
        res, seen, polls = watched(p, lambda: api.refresh(peer, "b", "a", batch_size=BATCH))
    assert res[0].error is None, res[0].error
    assert seen == [], seen
    assert polls > 0
    assert max(reads) <= 4 * BATCH, f"a read of {max(reads)} entries of one table"
    assert p.rows("b") == p.rows("a")


def test_the_reconciler_plans_a_large_transaction_in_pieces(
    pair: Pair, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows inserted and updated in the same transaction, decided by the planner (the set-based fast
    path turned off: MM_FASTPATH_MIN), are planned in pieces of MM_PLAN_PIECE changes, each plan
    executed before the next piece is read: the plan's memory is bounded too."""
    p = pair
    monkeypatch.setenv("MM_FASTPATH_MIN", str(10**9))
    sizes: list[int] = []
    real = Rc.plan

    def counted(spec: Any, changes: Any, states: Any, held: Any = ()) -> Any:
        changes = list(changes)
        sizes.append(len(changes))
        return real(spec, changes, states, held)

    monkeypatch.setattr(Rc, "plan", counted)
    c = p.connect("a")
    ph = p.ph("a")
    cur = c.cursor()
    cur.execute(f"INSERT INTO orders (oref, nlines) VALUES ({ph}, {ph})", ("big", BIG))
    for i in range(0, BIG, 100):
        cur.executemany(f"INSERT INTO olines (oref, n) VALUES ({ph}, {ph})", [("big", -n - 1) for n in range(i, i + 100)])
        cur.execute(f"UPDATE olines SET n = -n - 1 WHERE oref = {ph} AND n < 0", ("big",))
    c.commit()
    c.close()
    res, seen, polls = watched(p, lambda: api.refresh(p.topo, "b", "a", batch_size=BATCH))
    assert res[0].error is None, res[0].error
    assert seen == [], seen
    assert polls > 0
    assert sum(sizes) >= 2 * BIG  # the planner decided the lines' inserts and updates ...
    assert max(sizes) <= 40, f"a plan of {max(sizes)} changes"  # ... 40 at a time (MM_PLAN_PIECE)
    assert p.rows("b") == p.rows("a")
    assert p.rows("b")[1] == [("big", n) for n in range(BIG)]


def mixed_rows(p: Pair, site: str) -> tuple[list[tuple[Any, ...]], ...]:
    """Every row of both MIXED tables at `site`, with its key."""
    return p.read(site, "SELECT id, name, n FROM items ORDER BY id", "SELECT code, name, n FROM codes ORDER BY code")


def big_mixed(p: Pair, local: bool) -> int:
    """ONE transaction at `a` inserting BIG rows into each MIXED table, in statements of 100 rows;
    with `local`, between its statements the target's applications insert a row into each table
    and commit (their identities interleave with the big one's: keys must shift), one of them a
    code the big transaction inserts too (an insert_insert conflict). Returns the local rows."""
    big, there = p.connect("a"), p.connect("b")
    pa, pb = p.ph("a"), p.ph("b")
    made = 0
    try:
        cur, lcur = big.cursor(), there.cursor()
        for i in range(0, BIG, 100):
            cur.executemany(f"INSERT INTO items (name, n) VALUES ({pa}, {pa})", [(f"big-{n}", n) for n in range(i, i + 100)])
            cur.executemany(
                f"INSERT INTO codes (code, name, n) VALUES ({pa}, {pa}, {pa})",
                [(f"c{n:05d}", f"big-{n}", n) for n in range(i, i + 100)],
            )
            if local:
                lcur.execute(f"INSERT INTO items (name, n) VALUES ({pb}, {pb})", (f"local-{i}", -i))
                code = "c00150" if i == 0 else f"l{i:05d}"  # c00150: the big one's next statement inserts it too
                lcur.execute(f"INSERT INTO codes (code, name, n) VALUES ({pb}, {pb}, {pb})", (code, f"local-{i}", -i))
                there.commit()
                made += 1
        big.commit()
    finally:
        big.close()
        there.close()
    return made


def test_a_large_transaction_in_pieces_with_local_inserts_at_the_target_ends_with_equal_rows_and_keys(
    mixed: Pair, reads: list[int]
) -> None:
    """An auto-counter table and a natural-key one, a transaction of BIG rows each read in pieces
    (MM_PLAN_PIECE 40), while the target's applications insert before and during the refresh: the
    target's rows move behind or among the big one's as their identities sort (keys are ranks in
    global insertion order), and after refreshes both ways both sites hold the same rows under the
    same keys, 1..N."""
    p = mixed
    local = big_mixed(p, local=True)
    stop, errors, during = threading.Event(), [], [0]

    def writer() -> None:  # an application at the target, inserting while the refresh runs
        c = p.connect("b")
        ph = p.ph("b")
        try:
            while not stop.is_set() and during[0] < 20:
                k = during[0]
                c.cursor().execute(f"INSERT INTO items (name, n) VALUES ({ph}, {ph})", (f"during-{k}", 10_000 + k))
                c.cursor().execute(
                    f"INSERT INTO codes (code, name, n) VALUES ({ph}, {ph}, {ph})", (f"d{k:05d}", f"during-{k}", k)
                )
                c.commit()
                during[0] += 1
                stop.wait(0.05)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            c.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        res = api.refresh(p.topo, "b", "a", batch_size=BATCH)
    finally:
        stop.set()
        t.join()
    assert errors == [], errors
    assert res[0].error is None, res[0].error
    assert max(reads) <= 4 * BATCH, f"a read of {max(reads)} entries of one table"
    assert res[0].batches >= BIG // (4 * BATCH)  # read in pieces
    for _ in range(5):  # both ways until nothing moves
        pulled = [
            r.pulled for s, o in (("a", "b"), ("b", "a")) for r in api.refresh(p.topo, s, o, batch_size=BATCH) if not r.error
        ]
        if not any(pulled):
            break
    a_rows, b_rows = mixed_rows(p, "a"), mixed_rows(p, "b")
    assert a_rows == b_rows
    items, codes = a_rows
    assert len(items) == BIG + local + during[0]
    assert [r[0] for r in items] == list(range(1, len(items) + 1))  # keys: ranks, no hole, no collision
    assert len(codes) == BIG + local - 1 + during[0]  # c00150 once: one side's insert won
    assert {r[1] for r in items} >= {f"local-{i}" for i in range(0, BIG, 100)}


def test_the_later_pieces_of_a_large_transaction_take_the_fast_path(
    mixed: Pair, reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the target applies set-based (PostgreSQL, SQLite), every piece's inserts go through
    the fast path, not only the first's: a piece's new identities sort after every identity the
    target knows, those the stretch's earlier pieces inserted included (an origin's positions and
    versions rise together), so no key shifts (docs/transactions.md "Large transactions")."""
    p = mixed
    if not _set_based(p):
        pytest.skip("the target applies through the planner (Capabilities.set_based_apply)")
    monkeypatch.setenv("MM_FASTPATH_MIN", "0")  # pieces of 100 changes take it too
    fast: list[int] = []
    real = Rc.fastpath.apply_fast

    def counted(*a: Any, **kw: Any) -> Any:
        fr = real(*a, **kw)
        fast.append(fr.inserted)
        return fr

    monkeypatch.setattr(Rc.fastpath, "apply_fast", counted)
    big_mixed(p, local=False)
    res = api.refresh(p.topo, "b", "a", batch_size=BATCH)
    assert res[0].error is None, res[0].error
    assert res[0].batches >= BIG // (4 * BATCH)
    assert sum(fast) == 2 * BIG, fast  # every insert set-based ...
    assert len([n for n in fast if n]) >= 2 * (BIG // (4 * BATCH))  # ... in every piece of both tables
    assert mixed_rows(p, "b") == mixed_rows(p, "a")


def _set_based(p: Pair) -> bool:
    with api.Cluster(p.topo) as cl:
        return bool(cl.site("b").dialect.caps.set_based_apply)
