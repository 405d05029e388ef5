"""Many writers at one site while it replicates: out-of-order commits, renumbering under load,
transient failures retried. Runs on every backend; SQLite's one-writer-at-a-time makes the
interleavings impossible there, so those tests only run on server databases."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from clusters import ITEMS, make_cluster
from sqlalchemy.exc import DBAPIError, OperationalError

from multimaster import api
from multimaster.dialects import get_dialect
from multimaster.engine.site import Site

BASE = [("items", k, f"base-{k}", k, float(k)) for k in (1, 2)]


def _servers_only(backend) -> None:  # type: ignore[no-untyped-def]
    if backend.name == "sqlite":
        pytest.skip("SQLite has one writer at a time: there is no interleaving to force")


def _concurrent(backend) -> bool:  # type: ignore[no-untyped-def]
    """Writers of one table capture without waiting for each other (Capabilities.concurrent_capture);
    otherwise the capture queues them until COMMIT."""
    return get_dialect(backend.name).caps.concurrent_capture


def test_a_change_committed_after_later_ones_were_pulled_is_not_skipped(backend, tmp_path):  # type: ignore[no-untyped-def]
    """Transaction A writes first and stays open; B writes and commits (or, where capture queues
    writers, waits for A); s2 pulls in between, then A commits. Nothing may be skipped, and nothing
    may be handed out that A could still precede."""
    _servers_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS, base={"s1": BASE, "s2": BASE})
    p = backend.param()
    a = cl.db("s1")
    a.cursor().execute(f"UPDATE items SET name = {p} WHERE id = 1", ("from-A",))  # A: first change, not committed

    def b() -> None:
        cl.execute("s1", "UPDATE items SET name = ? WHERE id = 2", ("from-B",))  # B: commits first

    tb = threading.Thread(target=b)
    tb.start()
    tb.join(timeout=5.0 if _concurrent(backend) else 1.0)
    assert tb.is_alive() != _concurrent(backend), "B waited for A" if tb.is_alive() else "B did not wait for A"
    res = cl.refresh("s2", "s1")  # pulls while A is still open
    assert res[0].pulled == 0, "a change was handed out while A, which precedes it, was running"
    a.commit()
    a.close()
    tb.join(timeout=30)
    assert not tb.is_alive()
    cl.refresh("s2", "s1")
    names = {r[0]: r[1] for r in cl.rows("s2", "items")}
    assert names == {1: "from-A", 2: "from-B"}


TAGS = {"tags": {"key": "code", "auto": False, "columns": {"label": "text"}}}


def _insert(backend, cur, table: str, tag: str, how: str) -> None:  # type: ignore[no-untyped-def]
    """Two rows into `table` (ITEMS: renumbered; TAGS: natural key) in one statement, written `how`."""
    p = backend.param()
    rows = [(f"{tag}-1", 1), (f"{tag}-2", 2)]
    if table == "items":
        cols, vals = "(name, qty, price)", [(n, q, 0.5) for n, q in rows]
    else:
        cols, vals = "(code, label)", [(n, n) for n, _ in rows]
    width = len(vals[0])
    if how == "values":
        one = "(" + ", ".join([p] * width) + ")"
        cur.execute(f"INSERT INTO {table} {cols} VALUES {one}, {one}", [v for r in vals for v in r])
    elif how == "select":
        sel = " UNION ALL ".join(["SELECT " + ", ".join(f"{p} AS c{i}" for i in range(width))] * 2)
        cur.execute(f"INSERT INTO {table} {cols} SELECT * FROM ({sel}) x", [v for r in vals for v in r])
    else:  # COPY (PostgreSQL)
        with cur.copy(f"COPY {table} {cols} FROM STDIN") as cp:
            for r in vals:
                cp.write_row(r)


@pytest.mark.parametrize("table", ["items", "tags"])
@pytest.mark.parametrize("how", ["values", "select", "copy"])
def test_an_insert_committed_after_later_ones_were_pulled_is_not_skipped(backend, tmp_path, table, how):  # type: ignore[no-untyped-def]
    """The same forced interleaving with multi-row inserts (VALUES, INSERT ... SELECT, COPY), into a
    renumbered and a natural-key table: B does not wait for A where capture is concurrent (else it
    queues until A commits), a peer pulling while A is open gets nothing of B's, and afterwards
    keys are ranks in insertion order at both sites."""
    _servers_only(backend)
    if how == "copy" and backend.name != "postgresql":
        pytest.skip("COPY is PostgreSQL's")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], {**ITEMS, **TAGS})
    a = cl.db("s1")
    try:
        _interleave(backend, cl, a, table, how)
    finally:
        a.close()
    cl.refresh("s2", "s1")
    got = sorted(r[1] for r in cl.rows("s2", table))
    assert got == ["A-1", "A-2", "B-1", "B-2"]
    if table == "items":  # keys in commit order at both sites
        assert [r[1] for r in cl.rows("s1", table)] == ["A-1", "A-2", "B-1", "B-2"]
    cl.assert_converged()


def _interleave(backend, cl, a, table: str, how: str) -> None:  # type: ignore[no-untyped-def]
    _insert(backend, a.cursor(), table, "A", how)  # A: first, not committed
    errors: list[BaseException] = []

    def b() -> None:
        c = cl.db("s1")
        try:
            _insert(backend, c.cursor(), table, "B", how)
            c.commit()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            c.close()

    tb = threading.Thread(target=b)
    tb.start()
    tb.join(timeout=5.0 if _concurrent(backend) else 1.0)
    try:
        if _concurrent(backend):
            assert not tb.is_alive() and not errors, f"B waited for A, which wrote the table first ({errors})"
        else:
            assert tb.is_alive(), f"B did not wait for A, which wrote the table first ({errors})"
        res = cl.refresh("s2", "s1")  # pulls while A is open
        assert res[0].pulled == 0, "a change was handed out while A, which precedes it, was running"
    except BaseException:
        a.rollback()
        tb.join(timeout=30)
        raise
    a.commit()
    tb.join(timeout=30)
    assert not tb.is_alive() and not errors, errors


def test_renumbering_while_applications_insert(backend, tmp_path):  # type: ignore[no-untyped-def]
    """Writers insert at both sites while refreshers pull both ways: no duplicate key, no lost
    row, every site ends with keys 1..N, and the table's sequence is past the highest key."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    for s in ("s1", "s2"):  # the applications update by name: index it, as an application would
        cl.execute(
            s,
            "CREATE INDEX items_name ON items (name(40))"
            if backend.name == "mysql"
            else "CREATE INDEX items_name ON items (name)",
        )
    n_threads, n_rows = (1, 15) if backend.name == "sqlite" else (3, 15)
    errors: list[BaseException] = []

    def app(site: str, sql: str, params: tuple) -> None:  # type: ignore[type-arg]
        # as InnoDB asks of every application: re-issue a transaction chosen as a deadlock victim
        # (an UPDATE that locked its row through a secondary index while the reconciler moves its key)
        for attempt in range(20):
            try:
                return cl.execute(site, sql, params)
            except Exception as e:  # noqa: BLE001
                if "Deadlock" not in str(e) and "deadlock" not in str(e):
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("still deadlocking")

    def writer(site: str, w: int) -> None:
        try:
            for i in range(n_rows):
                app(site, "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", (f"{site}-{w}-{i}", i, 0.5))
                if i % 3 == 0:
                    app(site, "UPDATE items SET qty = qty + 1 WHERE name = ?", (f"{site}-{w}-{i}",))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(s, w)) for s in ("s1", "s2") for w in range(n_threads)]
    errors += cl.run_while_refreshing(threads)
    assert not errors, errors
    cl.refresh_until_quiet()
    cl.assert_converged()
    total = 2 * n_threads * n_rows
    for s in ("s1", "s2"):
        rows = cl.rows(s, "items")
        assert [r[0] for r in rows] == list(range(1, total + 1)), s
        assert sorted(r[1] for r in rows) == sorted(
            f"{x}-{w}-{i}" for x in ("s1", "s2") for w in range(n_threads) for i in range(n_rows)
        )
        assert all(r[2] == (int(r[1].rsplit("-", 1)[1]) + (1 if int(r[1].rsplit("-", 1)[1]) % 3 == 0 else 0)) for r in rows)
        c = cl.db(s)
        cur = c.cursor()
        if backend.name == "postgresql":
            cur.execute("SELECT last_value FROM items_id_seq")
            assert cur.fetchone()[0] >= total, s
        elif backend.name == "mysql":
            cur.execute(
                "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'items'"
            )
            assert cur.fetchone()[0] > total, s
        c.close()


def test_child_rows_follow_a_renumbered_key(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A local (not replicated) child table whose foreign key is ON UPDATE CASCADE follows its
    parent when the reconciler moves the parent's key."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    q = "`" if backend.name == "mysql" else '"'
    fk = f"REFERENCES items({q}id{q}) ON UPDATE CASCADE"
    ddl = f"CREATE TABLE notes (nid INTEGER PRIMARY KEY, item_id INTEGER {fk}, note TEXT)"
    if backend.name == "mysql":
        ddl = f"CREATE TABLE notes (nid INT PRIMARY KEY, item_id INT, note TEXT, FOREIGN KEY (item_id) {fk}) ENGINE=InnoDB"
    cl.execute("s2", ddl)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('first', 1, 1)")  # earlier identity
    time.sleep(0.005)
    cl.execute("s2", "INSERT INTO items (name, qty, price) VALUES ('second', 2, 2)")  # key 1 at s2 for now
    cl.execute("s2", "INSERT INTO notes (nid, item_id, note) VALUES (1, 1, 'about second')")
    cl.refresh("s2", "s1")  # 'first' takes key 1: 'second' moves to 2, and its note with it
    assert [r[1] for r in cl.rows("s2", "items")] == ["first", "second"]
    c = cl.db("s2")
    cur = c.cursor()
    cur.execute("SELECT item_id FROM notes WHERE nid = 1")
    assert cur.fetchone()[0] == 2
    c.close()


def test_a_transient_failure_is_retried_and_leaves_nothing_half_done(backend, tmp_path):  # type: ignore[no-untyped-def]
    _servers_only(backend)
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    if backend.name == "postgresql":
        import psycopg

        transient: BaseException = psycopg.errors.DeadlockDetected("deadlock detected")
    else:
        import pymysql

        transient = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction")
    site = Site("s1", cl.urls["s1"])
    calls = []

    def batch(conn):  # type: ignore[no-untyped-def]
        calls.append(1)
        conn.exec_driver_sql("INSERT INTO _mm_links (peer) VALUES ('marker-%s')" % len(calls))
        if len(calls) < 3:
            raise OperationalError("INSERT ...", {}, transient)
        return len(calls)

    try:
        assert api.write_retrying(site, batch) == 3
        with site.read() as conn:
            marks = [r[0] for r in conn.exec_driver_sql("SELECT peer FROM _mm_links WHERE peer LIKE 'marker-%%'")]
        assert marks == ["marker-3"]  # the failed attempts left nothing
        with pytest.raises(DBAPIError):  # not transient: raised at once
            api.write_retrying(site, lambda conn: conn.exec_driver_sql("SELECT * FROM no_such_table"))
    finally:
        site.dispose()


def test_an_application_holding_a_row_is_neither_waited_behind_nor_rolled_back(backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """An application locks a row (SELECT ... FOR UPDATE) and thinks, while a refresh brings a
    peer's update of that row and a new row, so the reconciler takes the table's writers' lock.
    Another application's insert goes through meanwhile, and the first one's UPDATE and COMMIT
    succeed: holding the writers back, the reconciler waits for no row; it gives up, lets them go,
    and runs its batch again. Before: the insert waited behind the reconciler for as long as the
    application thought (on MariaDB up to innodb_lock_wait_timeout, on PostgreSQL up to the
    reconciler's lock_timeout, made long here), and MariaDB rolled the application back as the
    smaller transaction of a deadlock (its UPDATE waits for its slot, which the reconciler held)."""
    _servers_only(backend)
    if backend.name == "postgresql":  # however long the reconciler would wait for a lock
        monkeypatch.setattr("multimaster.dialects.postgresql.dialect.APPLY_LOCK_TIMEOUT", "60s")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS, base={"s1": BASE, "s2": BASE})
    cl.execute("s2", "UPDATE items SET name = ? WHERE id = 1", ("from-s2",))
    cl.execute("s2", "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", ("new-s2", 1, 1.0))
    holder = cl.db("s1")
    cur = holder.cursor()
    cur.execute("SELECT name FROM items WHERE id = 1 FOR UPDATE")  # the application's transaction
    done: list[Any] = []
    refresher = threading.Thread(target=lambda: done.append(api.refresh(cl.topo, "s1", "s2")))
    refresher.start()
    time.sleep(1.0)  # the refresh reaches row 1 while the application keeps it
    other = threading.Thread(
        target=cl.execute, args=("s1", "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", ("new-s1", 1, 1.0))
    )
    other.start()
    other.join(timeout=30)
    try:
        assert not other.is_alive(), "an insert waited behind the reconciler, which waited for the application's row"
        cur.execute(f"UPDATE items SET name = {backend.param()} WHERE id = 1", ("from-s1",))
        holder.commit()  # not rolled back as a deadlock victim
    finally:
        holder.close()
    refresher.join(120)
    other.join(60)
    assert done and not [r.error for r in done[0] if r.error]
    cl.refresh_until_quiet()
    cl.assert_converged()
    names = sorted(r[1] for r in cl.rows("s1", "items"))
    assert names == ["base-2", "from-s1", "new-s1", "new-s2"]
