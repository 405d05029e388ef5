"""The error queue (docs/errors.md): a change a site rejects is held there with the database's
error, later changes of its row wait behind it, and everything else of the link goes on; `multimaster
errors` lists them, `errors retry` applies them once the cause is fixed, `errors skip` drops one on
purpose; `status` exits 1 while changes are held. On every database and on a mixed cluster, with
applications writing through plain clients and the commands run as a user runs them."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from clusters import BACKENDS, Backend, TestCluster, make_cluster, mm, server_unavailable
from hypothesis import given
from hypothesis import strategies as st

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.core.errorqueue import in_halves, is_version, malformed, shortest_failing
from multimaster.engine import isolate
from multimaster.engine.site import Site
from multimaster.ops.metrics import health, render

TABLES = {
    "items": {"key": "id", "columns": {"name": "text", "qty": "int"}},
    "notes": {"key": "id", "columns": {"body": "text"}},
}


# ---- the rule a site enforces and the other does not: a CHECK (an application trigger on SQLite)


def reject_negative_qty(cl: TestCluster, site: str) -> None:
    kind = _kind(cl, site)
    if kind == "sqlite":  # SQLite cannot add a CHECK to a table: an application's trigger
        for ev in ("INSERT", "UPDATE"):
            cl.execute(
                site,
                f"CREATE TRIGGER qty_ok_{ev.lower()} BEFORE {ev} ON items WHEN NEW.qty < 0 "
                "BEGIN SELECT RAISE(ABORT, 'qty must not be negative'); END",
            )
    else:
        cl.execute(site, "ALTER TABLE items ADD CONSTRAINT qty_ok CHECK (qty >= 0)")


def allow_negative_qty(cl: TestCluster, site: str) -> None:
    if _kind(cl, site) == "sqlite":
        for ev in ("insert", "update"):
            cl.execute(site, f"DROP TRIGGER qty_ok_{ev}")
    else:
        cl.execute(site, "ALTER TABLE items DROP CONSTRAINT qty_ok")


def _kind(cl: TestCluster, site: str) -> str:
    return cl.backend_of(site).name if isinstance(cl, MixedCluster) else cl.backend.name


class MixedCluster(TestCluster):
    """A cluster whose sites are on different databases (one backend per site)."""

    __test__ = False

    def __init__(self, backends: dict[str, Backend], tmp: Path, tables: dict[str, Any], links: Any = "mesh"):
        import yaml

        self.backends = backends
        urls = {s: b.new_site(tmp, s) for s, b in backends.items()}
        for s, url in urls.items():
            for tb, spec in tables.items():
                backends[s].create_table(url, tb, spec["key"], spec["columns"])
        doc = {
            "sites": {s: {"url": u} for s, u in urls.items()},
            "tables": {tb: {"key": spec["key"]} for tb, spec in tables.items()},
            "links": links,
        }
        path = tmp / "topology.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        super().__init__(next(iter(backends.values())), load_topology(path), urls, tables)
        api.init(self.topo)

    def backend_of(self, site: str) -> Backend:
        return self.backends[site]

    def db(self, site: str) -> Any:
        return self.backends[site].connect(self.urls[site])

    def execute(self, site: str, sql: str, params: tuple[Any, ...] = ()) -> None:
        c = self.db(site)
        try:
            c.cursor().execute(sql.replace("?", self.backends[site].param()), params)
            c.commit()
        finally:
            c.close()

    def rows(self, site: str, table: str, order: str | None = None) -> list[tuple[Any, ...]]:
        q = "`" if self.backends[site].name == "mysql" else '"'
        cols = [self.tables[table]["key"], *self.tables[table]["columns"]]
        c = self.db(site)
        try:
            cur = c.cursor()
            cur.execute(f"SELECT {', '.join(q + x + q for x in cols)} FROM {q}{table}{q} ORDER BY {q}{order or cols[0]}{q}")
            return [tuple(r) for r in cur.fetchall()]
        finally:
            c.close()


@pytest.fixture
def mixed(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[Backend] = []
    backends: dict[str, Backend] = {}
    for site, name in (("s1", "sqlite"), ("s2", "postgresql"), ("s3", "mysql")):
        try:
            b = BACKENDS[name]()
        except ConnectionError as e:
            for m in made:
                m.cleanup()
            server_unavailable(name, str(e))
        made.append(b)
        backends[site] = b
    yield MixedCluster(backends, tmp_path, TABLES)
    for m in made:
        m.cleanup()


def _topology_file(tmp: Path) -> str:
    return str(tmp / "topology.yaml")


def _errors(topo: str, *args: str) -> list[dict[str, Any]]:
    r = mm("errors", "-t", topo, "--json", *args)
    rows = json.loads(r.stdout)
    # exit 1 while a change is held (docs/cli.md "Exit codes"), 0 when none is
    assert r.returncode == (1 if any(h["state"] in ("failed", "waiting", "txn", "parked") for h in rows) else 0), r.stderr
    return rows


def _seed(cl: TestCluster) -> None:
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('apple', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('pear', 2)")
    cl.refresh_until_quiet()


def _reject_one(cl: TestCluster, target: str) -> None:
    """s1 writes a change `target` rejects (apple's qty -5), then unrelated changes (the same table
    and another) and a later change of apple (which must wait behind the rejected one)."""
    reject_negative_qty(cl, target)
    cl.execute("s1", "UPDATE items SET qty = -5 WHERE name = 'apple'")
    cl.execute("s1", "UPDATE items SET qty = 7 WHERE name = 'pear'")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('hello')")
    cl.execute("s1", "UPDATE items SET name = 'green apple' WHERE name = 'apple'")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('plum', 3)")


def _scenario(cl: TestCluster, tmp: Path, target: str) -> None:
    topo = _topology_file(tmp)
    _seed(cl)
    _reject_one(cl, target)
    # the link goes on: no link error, the unrelated changes arrive, apple stays as it was
    cl.refresh_until_quiet()
    rows = cl.rows(target, "items")
    assert rows == [(1, "apple", 1), (2, "pear", 7), (3, "plum", 3)]
    assert cl.rows(target, "notes") == [(1, "hello")]
    # `errors` names the rejected change with the database's error, and the one waiting behind it
    held = _errors(topo, "--site", target)
    assert [(h["state"], h["op"], h["table"]) for h in held] == [("failed", "U", "items"), ("waiting", "U", "items")]
    failed, waiting = held
    assert "qty" in failed["error"].lower(), failed["error"]
    assert failed["change"] == {"key": 1, "values": {"qty": -5}}
    assert waiting["blocked_by"] == failed["id"] and waiting["change"]["values"] == {"name": "green apple"}
    assert failed["first_at"] and failed["attempts"] == 1
    table = mm("errors", "-t", topo)
    assert table.returncode == 1 and "waiting behind" in table.stdout and "errors retry" in table.stdout
    # status says so, exits 1, names the command; the metrics count them
    st = mm("status", "-t", topo)
    assert st.returncode == 1 and "multimaster errors" in st.stderr, st.stderr
    assert json.loads(mm("status", "-t", topo, "--json").stdout)["held_errors"] == 2
    text = render(health(cl.topo))
    assert f'multimaster_error_queue_changes{{site="{target}",state="failed"}} 1' in text
    assert f'multimaster_error_queue_changes{{site="{target}",state="waiting"}} 1' in text
    # retry before the cause is fixed: still held, exit 1, attempts counted
    r = mm("errors", "retry", "-t", topo, "--all")
    assert r.returncode == 1 and "still held" in r.stdout
    assert [h["attempts"] for h in _errors(topo, "--site", target)][0] == 2
    # fix the cause: retry applies both, in order; the sites converge
    allow_negative_qty(cl, target)
    r = mm("errors", "retry", "-t", topo, "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _errors(topo) == []
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows(target, "items")[0] == (1, "green apple", -5)
    assert mm("status", "-t", topo).returncode == 0


def test_rejected_change_is_held_and_retried(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    _scenario(cl, tmp_path, "s2")


def test_rejected_change_is_held_and_retried_on_a_mixed_cluster(mixed: MixedCluster, tmp_path: Path) -> None:
    # the CHECK at the MariaDB site; SQLite and PostgreSQL sites relay nothing it needs
    _scenario(mixed, tmp_path, "s3")


def test_skip_drops_one_logged_and_applies_what_waited(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topology_file(tmp_path)
    _seed(cl)
    _reject_one(cl, "s2")
    cl.refresh_until_quiet()
    failed = _errors(topo, "--site", "s2")[0]
    # a skip without a reason is refused, naming the option; nothing changes
    r = mm("errors", "skip", "-t", topo, "--site", "s2", "--id", str(failed["id"]), "--reason", " ")
    assert r.returncode == 2 and "--reason" in r.stderr
    r = mm("errors", "skip", "-t", topo, "--id", "999", "--reason", "gone")
    assert r.returncode == 2 and "999" in r.stderr
    r = mm("errors", "skip", "-t", topo, "--site", "s2", "--id", str(failed["id"]), "--reason", "negative stock is a typo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skipped" in r.stdout
    # the change behind it applied; the skipped one never is, and stays logged with its reason
    assert cl.rows("s2", "items")[0] == (1, "green apple", 1)
    assert _errors(topo) == []
    logged = _errors(topo, "--all")
    assert [(h["id"], h["state"], h["reason"]) for h in logged] == [(failed["id"], "skipped", "negative stock is a typo")]
    assert mm("status", "-t", topo).returncode == 0
    # later changes of the row flow as usual
    cl.execute("s1", "UPDATE items SET qty = 4 WHERE id = 1")
    cl.refresh_until_quiet()
    cl.assert_converged()


@pytest.mark.parametrize("then", ["retry", "skip"])
def test_a_rejected_insert_keeps_its_rank(backend: Backend, tmp_path: Path, then: str) -> None:
    """A held insert of a renumbered table keeps its rank at the site holding it: the keys of every
    later row (received or inserted there) agree with the other sites' while it is held; a retry
    inserts it at its key; a skip leaves its rank as a deleted row's."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topology_file(tmp_path)
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('apple', 1)")
    cl.refresh_until_quiet()
    reject_negative_qty(cl, "s2")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('bad', -1)")
    cl.refresh_until_quiet()
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('plum', 3)")
    cl.execute("s1", "UPDATE items SET qty = 2 WHERE name = 'bad'")
    cl.refresh_until_quiet()
    cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('kiwi', 4)")  # an application at the holding site
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == [(1, "apple", 1), (2, "bad", 2), (3, "plum", 3), (4, "kiwi", 4)]
    assert cl.rows("s2", "items") == [(1, "apple", 1), (3, "plum", 3), (4, "kiwi", 4)]
    held = _errors(topo, "--site", "s2")
    assert [(h["state"], h["op"], h["change"]["key"]) for h in held] == [("failed", "I", 2), ("waiting", "U", 2)]
    if then == "retry":
        allow_negative_qty(cl, "s2")
        r = mm("errors", "retry", "-t", topo, "--site", "s2", "--id", str(held[0]["id"]))
        assert r.returncode == 0, r.stdout + r.stderr
        cl.refresh_until_quiet()
        cl.assert_converged()
    else:
        r = mm("errors", "skip", "-t", topo, "--site", "s2", "--id", str(held[0]["id"]), "--reason", "not wanted here")
        assert r.returncode == 0, r.stdout + r.stderr
        cl.refresh_until_quiet()
        assert cl.rows("s2", "items") == [(1, "apple", 1), (3, "plum", 3), (4, "kiwi", 4)]  # its rank stays free
        cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('fig', 5)")
        cl.refresh_until_quiet()
        assert cl.rows("s1", "items")[-1] == cl.rows("s2", "items")[-1] == (5, "fig", 5)
    assert _errors(topo) == []


def test_the_daemon_does_not_retry_a_held_change(backend: Backend, tmp_path: Path) -> None:
    """Under the daemon, a rejected change is held once; the link keeps refreshing without an
    error, later changes arrive, and the held change is not tried again (one attempt)."""
    from multimaster.ops.daemon import Daemon

    links = [{"from": a, "to": b, "interval": "100ms", "jitter": 0} for a, b in (("s1", "s2"), ("s2", "s1"))]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES, links=links)
    _seed(cl)
    reject_negative_qty(cl, "s2")
    cl.execute("s1", "UPDATE items SET qty = -5 WHERE name = 'apple'")
    d = Daemon(cl.topo, ["s2"])
    d.start()
    try:
        _wait(lambda: api.list_errors(cl.topo), "the change to be held")
        runs = d.stats.links["s1->s2"].runs
        cl.execute("s1", "UPDATE items SET qty = 6 WHERE name = 'pear'")
        _wait(lambda: cl.rows("s2", "items")[1] == (2, "pear", 6), "a later change to arrive")
        _wait(lambda: d.stats.links["s1->s2"].runs >= runs + 5, "more refreshes of the link")
    finally:
        d.stop()
    assert d.stats.links["s1->s2"].errors == 0
    held = api.list_errors(cl.topo)
    assert [(h["state"], h["attempts"]) for h in held] == [("failed", 1)]


def _wait(cond: Any, what: str, deadline: float = 120.0) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_reconcile_holds_a_rejected_change_pulled_without_reconciling(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topology_file(tmp_path)
    _seed(cl)
    _reject_one(cl, "s2")
    assert mm("refresh", "-t", topo, "--site", "s2", "--no-reconcile").returncode == 0
    r = mm("reconcile", "-t", topo, "--site", "s2")
    assert r.returncode == 0, r.stderr
    assert cl.rows("s2", "items") == [(1, "apple", 1), (2, "pear", 7), (3, "plum", 3)]
    assert [h["state"] for h in _errors(topo, "--site", "s2")] == ["failed", "waiting"]


def test_init_adds_the_error_queue_to_a_site_installed_before_it(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topology_file(tmp_path)
    site = Site("s2", cl.urls["s2"])
    with site.write() as conn:  # as an earlier version left it
        conn.exec_driver_sql(f"DROP TABLE {site.dialect.mm_table('_mm_errors')}")
    site.dispose()
    r = mm("init", "-t", topo)
    assert r.returncode == 0, r.stderr
    _seed(cl)
    _reject_one(cl, "s2")
    cl.refresh_until_quiet()
    assert [h["state"] for h in _errors(topo, "--site", "s2")] == ["failed", "waiting"]


KEEP_APPLE = {
    "sqlite": [
        "CREATE TRIGGER keep_apple BEFORE DELETE ON items WHEN OLD.name = 'apple' BEGIN SELECT RAISE(ABORT, 'apple is kept'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION keep_apple() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF OLD.name = 'apple' THEN RAISE EXCEPTION 'apple is kept'; END IF; RETURN OLD; END $$",
        "CREATE TRIGGER keep_apple BEFORE DELETE ON items FOR EACH ROW EXECUTE FUNCTION keep_apple()",
    ],
    "mysql": [
        "CREATE TRIGGER keep_apple BEFORE DELETE ON items FOR EACH ROW BEGIN IF OLD.name = 'apple' THEN "
        "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'apple is kept'; END IF; END"
    ],
}


def test_an_application_trigger_rejecting_a_delete(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topology_file(tmp_path)
    _seed(cl)
    for sql in KEEP_APPLE[backend.name]:
        cl.execute("s2", sql)
    cl.execute("s1", "DELETE FROM items WHERE name = 'apple'")
    cl.execute("s1", "DELETE FROM items WHERE name = 'pear'")
    cl.refresh_until_quiet()
    assert cl.rows("s2", "items") == [(1, "apple", 1)]
    held = _errors(topo, "--site", "s2")
    assert [(h["state"], h["op"]) for h in held] == [("failed", "D")] and "apple is kept" in held[0]["error"]
    cl.execute("s2", "DROP TRIGGER keep_apple" + (" ON items" if backend.name == "postgresql" else ""))
    r = mm("errors", "retry", "-t", topo, "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows("s2", "items") == []


def test_held_changes_are_not_on_their_way_and_add_site_refuses_their_holder(sqlite_backend: Backend, tmp_path: Path) -> None:
    """verify does not count a held change as in flight (it is a difference until retried or
    skipped), and add-site will not copy a site that holds changes: its copy would lack them."""
    import sqlalchemy as sa

    from multimaster.spark.waiting import waiting_changes, waiting_reads

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TABLES)
    _seed(cl)
    _reject_one(cl, "s2")
    cl.refresh_until_quiet()
    engines = {s: sa.create_engine(u) for s, u in cl.urls.items()}
    try:
        w = {(x.source, x.target): x for x in waiting_changes(cl.topo, "items", engines)}
        assert w[("s1", "s2")].unapplied == 0
        assert all(site != "s2" or "_mm_snap_" not in q for site, q in waiting_reads(cl.topo, "items", engines))
    finally:
        for e in engines.values():
            e.dispose()
    from test_add_site import grow

    grown = grow(cl, tmp_path, "s3").topo.path
    r = mm("add-site", "-t", str(grown), "s3", "--from", "s2")
    assert r.returncode == 1 and "error queue" in r.stderr and "errors retry" in r.stderr, r.stderr
    assert cl.rows("s1", "items")  # nothing changed; from a site holding nothing it goes ahead
    assert mm("add-site", "-t", str(grown), "s3", "--from", "s1").returncode == 0


def _corrupt_log_entry(cl: TestCluster, site: str) -> None:
    """Make the newest entry of `site`'s change log of items malformed by hand (a version that is none)."""
    d = Site(site, cl.urls[site]).dialect
    log = d.obj("items").log
    cl.execute(
        site,
        f"UPDATE {log} SET ver = 'hand-made-entry-not-a-version' WHERE seq = (SELECT m FROM (SELECT max(seq) AS m FROM {log}) x)",
    )


def test_a_corrupt_change_log_entry_is_held_not_blocking(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topology_file(tmp_path)
    _seed(cl)
    cl.execute("s1", "UPDATE items SET qty = 9 WHERE name = 'apple'")
    _corrupt_log_entry(cl, "s1")
    cl.execute("s1", "UPDATE items SET qty = 8 WHERE name = 'pear'")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('still flowing')")
    cl.refresh_until_quiet()  # no link error
    assert cl.rows("s2", "items") == [(1, "apple", 1), (2, "pear", 8)]
    assert cl.rows("s2", "notes") == [(1, "still flowing")]
    held = _errors(topo, "--site", "s2")
    assert len(held) == 1 and held[0]["op"] == "?" and "hand-made-entry" in held[0]["error"] and held[0]["change"] is None
    # it can never apply: retry keeps it (exit 1); skip drops it
    r = mm("errors", "retry", "-t", topo, "--site", "s2", "--id", str(held[0]["id"]))
    assert r.returncode == 1 and "malformed" in r.stdout
    r = mm("errors", "skip", "-t", topo, "--site", "s2", "--id", str(held[0]["id"]), "--reason", "hand-made entry")
    assert r.returncode == 0, r.stderr
    assert _errors(topo) == []


def test_a_site_added_from_a_peer_with_a_corrupt_entry_gets_its_later_changes(backend: Backend, tmp_path: Path) -> None:
    """A version damaged by hand in s1's change log sorts above every version: add-site of s3 from
    s1 took it for s1's newest change applied, and every later change of s1 was then dropped at s3
    as a duplicate, with nothing held and `status` green. The copy now counts s1's well-formed
    versions only (store.origins.newest_own)."""
    from test_add_site import grow

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    _seed(cl)
    cl.execute("s1", "UPDATE items SET qty = 9 WHERE name = 'apple'")
    _corrupt_log_entry(cl, "s1")
    cl.refresh_until_quiet()
    big = grow(cl, tmp_path, "s3")
    grown = big.topo.path
    r = mm("add-site", "-t", str(grown), "s3", "--from", "s1")
    assert r.returncode == 0, r.stdout + r.stderr
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('plum', 3)")
    cl.execute("s1", "UPDATE items SET qty = 7 WHERE name = 'pear'")
    big.refresh_until_quiet()
    assert big.rows("s3", "items") == big.rows("s1", "items") == [(1, "apple", 9), (2, "pear", 7), (3, "plum", 3)]
    held = _errors(str(grown), "--site", "s2")
    assert [h["op"] for h in held] == ["?"]  # the damaged entry, held where it was pulled


def test_a_lock_held_by_an_application_is_waited_for_not_held(backend: Backend, tmp_path: Path) -> None:
    """A transient failure (a lock another connection holds: lock timeout, busy) keeps the backoff:
    the change applies once the lock goes, nothing enters the error queue."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    _seed(cl)
    cl.execute("s1", "UPDATE items SET qty = 11 WHERE name = 'apple'")
    app = cl.db("s2")
    cur = app.cursor()
    if backend.name == "sqlite":
        app.isolation_level = None
        cur.execute("BEGIN IMMEDIATE")  # the database's write lock
    cur.execute("UPDATE items SET qty = qty WHERE id = 1")  # the row's lock, not committed
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(api.refresh(cl.topo, "s2", "s1")))
    t.start()
    time.sleep(1.5)  # the refresher waits (PostgreSQL: its lock timeout fails attempts, retried with backoff)
    app.commit() if backend.name != "sqlite" else cur.execute("COMMIT")
    app.close()
    t.join()
    assert [r.error for r in results[0]] == [None]
    assert cl.rows("s2", "items")[0] == (1, "apple", 11)
    assert api.list_errors(cl.topo) == []


def test_transient_and_permanent_errors_are_told_apart(backend: Backend, tmp_path: Path) -> None:
    """Dialect.is_retryable errors (a lock timeout) are not held; a constraint's error is."""
    from sqlalchemy.exc import DBAPIError

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    _seed(cl)
    site = Site("s2", cl.urls["s2"])
    app = cl.db("s2")
    cur = app.cursor()
    if backend.name == "sqlite":
        app.isolation_level = None
        cur.execute("BEGIN IMMEDIATE")
    cur.execute("UPDATE items SET qty = qty WHERE id = 1")
    short = {
        "sqlite": "PRAGMA busy_timeout = 1",
        "postgresql": "SET lock_timeout = '50ms'",
        "mysql": "SET innodb_lock_wait_timeout = 1",
    }[backend.name]
    try:
        with site.engine.connect() as conn:
            conn.exec_driver_sql(short)
            conn.commit()
            conn.execution_options(mm_write=True)  # SQLite: BEGIN IMMEDIATE, as a reconciler's transaction
            with pytest.raises(DBAPIError) as transient:
                with conn.begin():
                    conn.exec_driver_sql("UPDATE items SET qty = 0 WHERE id = 1")
        assert not isolate.permanent(site.dialect, transient.value)
    finally:
        app.rollback() if backend.name != "sqlite" else cur.execute("ROLLBACK")
        app.close()
    reject_negative_qty(cl, "s2")
    with site.engine.connect() as conn:
        with pytest.raises(DBAPIError) as rejected:
            with conn.begin():
                conn.exec_driver_sql("UPDATE items SET qty = -1 WHERE id = 1")
    assert isolate.permanent(site.dialect, rejected.value)
    site.dispose()


# ---- the pure part


@given(st.integers(min_value=0, max_value=10**19 - 1), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True))
def test_every_version_is_a_version(hlc: int, origin: str) -> None:
    v = "%019d:%s" % (hlc, origin)
    assert is_version(v)
    assert malformed(v, origin, "U", "r", 1) is None


@given(st.one_of(st.none(), st.text(max_size=30), st.integers()))
def test_anything_else_is_not(v: Any) -> None:
    if isinstance(v, str) and len(v) > 20 and v[:19].isdigit() and v[19] == ":" and v[20:].isidentifier() and v[20:].isascii():
        return
    assert not is_version(v)
    assert malformed(v, "s1", "U", "r", 1) is not None


def test_malformed_names_every_problem() -> None:
    why = malformed("0000000000000000001:s1", "s1", "X", None, None)
    assert why is not None and "op='X'" in why and "rid=None" in why and "mask=None" in why


@given(st.integers(0, 200), st.data(), st.booleans())
def test_in_halves_applies_every_unit_once_in_order_and_the_rejected_ones_alone(n, data, whole):  # type: ignore[no-untyped-def]
    """core.errorqueue.in_halves against a reference: units 0..n-1, some rejected by the database
    (`bad`); a span goes at once exactly when it holds no rejected unit. Every unit is handled
    once, in order; a rejected one only on its own; and the attempts stay logarithmic per
    rejected unit (one at a time, a batch of 2,000 with one rejected took minutes)."""
    bad = set(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=5))) if n else set()
    handled: list[int] = []
    alone: list[int] = []
    tries = []

    def together(lo: int, hi: int) -> bool:
        assert 0 <= lo < hi <= n and hi - lo >= 2
        tries.append((lo, hi))
        if bad & set(range(lo, hi)):
            return False
        handled.extend(range(lo, hi))
        return True

    def one(i: int) -> None:
        handled.append(i)
        alone.append(i)

    in_halves(n, together, one, whole)
    assert handled == list(range(n))
    assert bad <= set(alone)
    if not bad and n >= 2:  # nothing rejected: the whole at once, or (it failed already) its two halves
        assert len(tries) == (1 if whole else sum(1 for h in (n // 2, n - n // 2) if h >= 2))
    depth = max(1, n.bit_length())
    assert len(tries) <= 1 + 2 * max(len(bad), 1) * depth


@given(st.integers(0, 120), st.data(), st.booleans())
def test_in_halves_stopped_and_resumed_is_one_run(n, data, whole):  # type: ignore[no-untyped-def]
    """in_halves with `stop` (engine/isolate.py's time budget: a transaction that holds writers
    back ends, the next one goes on): every run handles a prefix of the units it is given, each
    once, nothing past it; resumed from the first unit left until none is, the units are handled
    exactly as in one run (in order, each once, a rejected one only on its own)."""
    bad = set(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=6))) if n else set()
    handled: list[int] = []
    alone: list[int] = []
    start = 0
    runs = 0
    while start < n:
        runs += 1
        assert runs <= n + 1
        limit = data.draw(st.integers(0, 8))  # attempts this run may make, then stop says so
        calls = [0]
        before = len(handled)
        base = start

        def together(lo: int, hi: int) -> bool:
            calls[0] += 1
            if bad & set(range(base + lo, base + hi)):
                return False
            handled.extend(range(base + lo, base + hi))
            return True

        def one(i: int) -> None:
            calls[0] += 1
            handled.append(base + i)
            alone.append(base + i)

        def stop() -> bool:  # as the budget: only once something was handled this run
            return len(handled) > before and calls[0] >= limit

        k = in_halves(n - start, together, one, whole and start == 0, stop)
        assert handled[before:] == list(range(start, start + k))  # a prefix, in order, each once
        assert k > 0  # a run always gets somewhere
        start += k
    assert handled == list(range(n))
    assert bad <= set(alone)


@given(st.integers(1, 500), st.data())
def test_shortest_failing_finds_the_change_at_fault_in_logarithmic_tries(n, data):  # type: ignore[no-untyped-def]
    """core.errorqueue.shortest_failing against a reference: a unit of n changes fails from the
    change at fault on (a prefix fails once it holds it); the search names it, trying only
    prefixes shorter than n, about log2(n) of them."""
    fault = data.draw(st.integers(0, n - 1))
    tried: list[int] = []

    def fails(k: int) -> bool:
        assert 1 <= k < n
        tried.append(k)
        return k > fault

    assert shortest_failing(n, fails) - 1 == fault
    assert len(tried) <= max(1, n.bit_length())


def test_a_long_retry_reads_its_versions_from_a_scratch_table(backend: Backend, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`errors retry --all` tries every held change together; past engine.held.ONLY_INLINE
    versions (1000; 4 here) the versions are a scratch table, not a list in the statement's text
    (a list of 500,000 is past MariaDB's max_allowed_packet). Every change applies but the one
    still rejected, which is found by halving and stays held alone; a change pulled meanwhile and
    not applied yet is left to the next reconcile."""
    from multimaster.engine import held

    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topology_file(tmp_path)
    _seed(cl)
    for i in range(1, 13):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh_until_quiet()
    reject_negative_qty(cl, "s2")
    for i in range(1, 13):  # updates: a held insert of a renumbered table goes in at its rank, alone
        cl.execute("s1", "UPDATE items SET qty = ? WHERE name = ?", (-i, f"n{i}"))
    cl.execute("s1", "UPDATE items SET qty = -30 WHERE name = 'n3'")
    cl.refresh_until_quiet()
    assert len(_errors(topo, "--site", "s2")) == 13
    allow_negative_qty(cl, "s2")
    if _kind(cl, "s2") == "sqlite":
        cl.execute(
            "s2", "CREATE TRIGGER no_seven BEFORE UPDATE ON items WHEN NEW.qty = -7 BEGIN SELECT RAISE(ABORT, 'no seven'); END"
        )
    else:
        cl.execute("s2", "ALTER TABLE items ADD CONSTRAINT no_seven CHECK (qty <> -7)")
    # a change pulled and not applied yet is not one of them: the retry leaves it to the reconcile
    cl.execute("s1", "UPDATE items SET qty = 100 WHERE name = 'pear'")
    assert mm("refresh", "-t", topo, "--site", "s2", "--no-reconcile").returncode == 1  # (s2 holds changes)
    monkeypatch.setattr(held, "ONLY_INLINE", 4)
    made: list[str | None] = []
    only_table = held.only_table
    monkeypatch.setattr(held, "only_table", lambda *a: made.append(only_table(*a)) or made[-1])
    (r,) = api.retry_errors(cl.topo, site="s2", all_=True)
    assert len(r["applied"]) == 12 and len(r["held"]) == 1, r
    assert any(made), made
    assert ("pear", 2) in [(n, q) for _k, n, q in cl.rows("s2", "items")]
    assert mm("reconcile", "-t", topo, "--site", "s2").returncode == 0
    left = _errors(topo, "--site", "s2")
    assert [(h["op"], h["change"]["values"]["qty"]) for h in left] == [("U", -7)]
    want = [(k, n, 7 if n == "n7" else q) for k, n, q in cl.rows("s1", "items")]
    assert cl.rows("s2", "items") == want  # keys too
    assert ("n3", -30) in [(n, q) for _k, n, q in want] and ("pear", 100) in [(n, q) for _k, n, q in want]
