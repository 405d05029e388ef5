"""Stop replicating one table online (docs/schema-changes.md "Stop replicating a table"): the user
removes it from tables:, `status` and `init` name it as still installed, `multimaster uninstall
--table T` drops its objects and bookkeeping at every site while applications write both tables
and refreshers run; its rows stay, its later writes are not captured, the other table keeps
replicating. On every database, and once on a mixed cluster through the installed command."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import BACKENDS, Backend, TestCluster, make_cluster, mm, mm_process, server_unavailable
from test_error_queue import MixedCluster

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.engine.site import Site

TABLES = {
    "items": {"key": "id", "columns": {"name": "text", "qty": "int"}},
    "audit": {"key": "id", "columns": {"body": "text"}},
}

#: the bookkeeping tables with rows per replicated table (column tbl); the last three MariaDB's own
_BOOKKEEPING = (
    "_mm_tables",
    "_mm_watermarks",
    "_mm_origins",
    "_mm_schemas",
    "_mm_purges",
    "_mm_pullers",
    "_mm_snap_horizons",
    "_mm_fences",
    "_mm_errors",
    "_mm_conflicts",
    "_mm_keymoves",
)
_MYSQL_BOOKKEEPING = ("_mm_gates", "_mm_clock", "_mm_slots", "_mm_stamps")


def _kind(cl: TestCluster, site: str) -> str:
    return cl.backend_of(site).name if isinstance(cl, MixedCluster) else cl.backend.name


def _leftovers(cl: TestCluster, site: str, table: str) -> list[str]:
    """Every replication object of `table` at `site`, read from the database's catalog (names
    containing the table's name, triggers on it), and every bookkeeping row of it."""
    kind = _kind(cl, site)
    c = cl.db(site)
    try:
        cur = c.cursor()
        if kind == "sqlite":
            cur.execute(
                "SELECT type || ' ' || name FROM sqlite_master WHERE name LIKE '\\_mm\\_%' ESCAPE '\\' "
                "AND (instr(name, ?) > 0 OR tbl_name = ?)",
                (table, table),
            )
        elif kind == "postgresql":
            cur.execute(
                "SELECT 'relation ' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = '_mm' AND position(%s in c.relname) > 0 "
                "UNION ALL SELECT 'function ' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = '_mm' AND position(%s in p.proname) > 0 "
                "UNION ALL SELECT 'trigger ' || t.tgname FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s) AND NOT t.tgisinternal",
                (table, table, table),
            )
        else:
            cur.execute(
                "SELECT CONCAT('relation ', TABLE_NAME) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME LIKE %s AND INSTR(TABLE_NAME, %s) > 0 "
                "UNION ALL SELECT CONCAT('trigger ', TRIGGER_NAME) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() "
                "AND (EVENT_OBJECT_TABLE = %s OR (TRIGGER_NAME LIKE %s AND INSTR(TRIGGER_NAME, %s) > 0)) "
                "UNION ALL SELECT CONCAT('routine ', ROUTINE_NAME) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() "
                "AND INSTR(ROUTINE_NAME, %s) > 0",
                ("\\_mm\\_%", table, table, "\\_mm\\_%", table, table),
            )
        out = [str(r[0]) for r in cur.fetchall()]
        prefix = "_mm." if kind == "postgresql" else ""
        p = "?" if kind == "sqlite" else "%s"
        for bk in _BOOKKEEPING + (_MYSQL_BOOKKEEPING if kind == "mysql" else ()):
            cur.execute(f"SELECT count(*) FROM {prefix}{bk} WHERE tbl = {p}", (table,))
            n = cur.fetchone()[0]
            if n:
                out.append(f"{n} row(s) in {bk}")
        return out
    finally:
        c.close()


def _drop_from_file(path: Path, table: str) -> None:
    doc = yaml.safe_load(path.read_text())
    del doc["tables"][table]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _bodies(cl: TestCluster, site: str) -> set[str]:
    return {r[1] for r in cl.rows(site, "audit")}


def _wait(cond: Any, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_stop_replicating_a_table_while_applications_write_and_refreshers_run(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    path = tmp_path / "topology.yaml"
    topo = str(path)
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('apple', 1)")
    cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('pear', 2)")
    for body in ("seed-1", "seed-2", "hot"):
        cl.execute("s1", "INSERT INTO audit (body) VALUES (?)", (body,))
    cl.execute("s2", "INSERT INTO audit (body) VALUES ('seed-3')")
    cl.refresh_until_quiet()
    seeds = {"seed-1", "seed-2", "seed-3"}
    assert _bodies(cl, "s1") == _bodies(cl, "s2") == seeds | {"hot"}

    stop, changed = threading.Event(), threading.Event()
    rounds_after = [0]
    phase = ["before"]
    failures: list[str] = []
    committed: dict[str, list[str]] = {"s1": [], "s2": []}
    ph = backend.param()

    def writer(site: str) -> None:
        c = cl.db(site)
        step = "connect"

        def txn(*stmts: tuple[str, tuple[Any, ...]]) -> None:
            # as InnoDB asks of every application: a transaction chosen as a deadlock victim (two
            # sites' updates of one row meet the reconciler) is issued again
            for attempt in range(20):
                try:
                    cur = c.cursor()
                    for sql, params in stmts:
                        cur.execute(sql, params)
                    c.commit()
                    return
                except Exception as e:
                    c.rollback()
                    if "deadlock" not in str(e).lower() or attempt == 19:
                        raise
                    time.sleep(0.02)

        try:
            i = 0
            while not stop.is_set():
                i += 1
                step = "insert items"
                txn((f"INSERT INTO items (name, qty) VALUES ({ph}, {ph})", (f"{site}-{i}", i)))
                step = "insert audit"
                txn((f"INSERT INTO audit (body) VALUES ({ph})", (f"{site}-{i}",)))
                committed[site].append(f"{site}-{i}")
                if i % 3 == 0:  # both sites update one row of each table: conflicts are logged
                    step = "update audit"
                    txn((f"UPDATE audit SET body = {ph} WHERE body LIKE {ph}", (f"hot-{site}-{i}", "hot%")))
                    step = "update items"
                    txn((f"UPDATE items SET qty = {ph} WHERE name = 'apple'", (i,)))
                time.sleep(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(f"writer {site} ({step}, uninstall: {phase[0]}): {e!r}")
        finally:
            c.close()

    def refresher() -> None:
        # a refresher as `multimaster run` is one: it reads the topology file at every round
        try:
            while not stop.is_set():
                after = changed.is_set()
                for r in api.refresh(load_topology(path)):
                    if r.error:
                        failures.append(f"refresh {r.peer} -> {r.site}: {r.error}")
                if after:
                    rounds_after[0] += 1
        except BaseException as e:  # noqa: BLE001
            failures.append(f"refresher: {e!r}")

    threads = [threading.Thread(target=writer, args=(s,)) for s in ("s1", "s2")] + [threading.Thread(target=refresher)]
    for t in threads:
        t.start()
    try:
        _wait(lambda: min(len(v) for v in committed.values()) >= 5 or failures, "the applications' first writes")
        _drop_from_file(path, "audit")
        cl.topo = load_topology(path)
        changed.set()
        _wait(lambda: rounds_after[0] >= 1, "a refresh round with the new file")

        # removed from the file only: status names it at every site and exits 1
        r = mm("status", "-t", topo, "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        for s in ("s1", "s2"):
            assert f"table 'audit' is installed at {s} but not under tables" in r.stderr
            assert json.loads(r.stdout)["sites"][s]["untracked"] == ["audit"]
        assert "multimaster uninstall -t FILE --table audit" in r.stderr

        # a table still under tables: is refused, nothing dropped
        r = mm("uninstall", "-t", topo, "--table", "items")
        assert r.returncode == 2, r.stdout + r.stderr
        assert "still under tables" in r.stderr

        phase[0] = "running"
        r = mm("uninstall", "-t", topo, "--table", "audit", "--json")
        phase[0] = "done"
        assert r.returncode == 0, r.stdout + r.stderr
        rep = json.loads(r.stdout)
        done_at = {s: len(v) for s, v in committed.items()}
        for s in ("s1", "s2"):
            assert "trigger _mm_cap_i_audit" in rep[s]["objects"], rep[s]
            assert "table _mm_log_audit" in rep[s]["objects"], rep[s]
            assert f"table _mm_snap_audit__{'s2' if s == 's1' else 's1'}" in rep[s]["objects"], rep[s]
            assert rep[s]["rows"]["_mm_tables"] == 1 and rep[s]["rows"]["_mm_watermarks"] >= 1, rep[s]
            assert "_mm_log_items" not in " ".join(rep[s]["objects"])

        # the applications keep writing both tables past the uninstall
        _wait(lambda: all(len(committed[s]) >= done_at[s] + 5 for s in committed) or failures, "writes after the uninstall")
        assert failures == []
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []

    cl.refresh_until_quiet()
    # items still replicates and converges
    assert cl.rows("s1", "items") == cl.rows("s2", "items")
    assert {r[1] for r in cl.rows("s1", "items")} >= {f"{s}-{i}" for s in committed for i in range(1, len(committed[s]) + 1)}
    for s, other in (("s1", "s2"), ("s2", "s1")):
        have = _bodies(cl, s)
        # the rows stay: those replicated before, and every one written here
        assert seeds <= have and set(committed[s]) <= have
        # writes after the uninstall are not captured: they never reach the other site
        assert not set(committed[s][done_at[s] :]) & _bodies(cl, other)
        assert _leftovers(cl, s, "audit") == []
        assert _leftovers(cl, s, "items") != []  # (the catalog check sees replication objects)

    r = mm("status", "-t", topo, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads(r.stdout)
    assert st["untracked"] == [] and all(st["sites"][s]["installed"] for s in ("s1", "s2"))

    # a re-run finds nothing left
    r = mm("uninstall", "-t", topo, "--table", "audit", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == {s: {"objects": [], "rows": {}} for s in ("s1", "s2")}


def test_a_run_stopped_half_way_is_finished_by_the_next(backend: Backend, tmp_path: Path) -> None:
    """A run that dropped the objects at a site and stopped before its bookkeeping rows (MariaDB
    commits each DROP): the table still shows as installed there, and the next run finishes it."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    cl.execute("s1", "INSERT INTO audit (body) VALUES ('x')")
    cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('y', 1)")
    cl.refresh_until_quiet()
    path = tmp_path / "topology.yaml"
    _drop_from_file(path, "audit")
    cl.topo = load_topology(path)
    site = Site("s2", cl.urls["s2"])
    try:
        with site.write() as conn:  # the objects only, as a run stopped before the rows
            dropped = site.dialect.uninstall_table(conn, "audit", ["s1"])
        assert "table _mm_log_audit" in dropped
    finally:
        site.dispose()
    left = _leftovers(cl, "s2", "audit")
    assert left and all("row(s) in" in x for x in left), left  # its bookkeeping rows only

    r = mm("status", "-t", str(path))
    assert r.returncode == 1 and "table 'audit' is installed at s2" in r.stderr, r.stdout + r.stderr
    r = mm("uninstall", "-t", str(path), "--table", "audit", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["s2"]["objects"] == [] and rep["s2"]["rows"]["_mm_tables"] == 1
    assert "table _mm_log_audit" in rep["s1"]["objects"]
    assert _leftovers(cl, "s1", "audit") == [] and _leftovers(cl, "s2", "audit") == []
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('z', 2)")
    cl.execute("s2", "INSERT INTO audit (body) VALUES ('after')")  # no capture, no failure
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == cl.rows("s2", "items")
    assert "after" not in _bodies(cl, "s1")
    assert mm("status", "-t", str(path)).returncode == 0


@pytest.fixture
def mixed(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[Backend] = []
    backends: dict[str, Backend] = {}
    for site, name in (("s1", "postgresql"), ("s2", "sqlite")):
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


def test_stop_replicating_on_a_mixed_cluster_with_the_installed_command(mixed: MixedCluster, tmp_path: Path) -> None:
    cl = mixed
    path = tmp_path / "topology.yaml"
    cl.execute("s1", "INSERT INTO audit (body) VALUES ('pg')")
    cl.execute("s2", "INSERT INTO audit (body) VALUES ('lite')")
    cl.execute("s2", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.refresh_until_quiet()
    _drop_from_file(path, "audit")
    cl.topo = load_topology(path)

    # init goes on for the other tables, and names the one left installed at each site
    r = mm("init", "-t", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    for s in ("s1", "s2"):
        assert f"table 'audit' is installed at {s} but not under tables" in r.stderr
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('b', 2)")
    cl.refresh_until_quiet()  # refresh works meanwhile
    assert cl.rows("s1", "items") == cl.rows("s2", "items")

    r = mm_process("uninstall", "-t", str(path), "--table", "audit")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "s1: table audit: dropped" in r.stdout and "s2: table audit: dropped" in r.stdout
    for s in ("s1", "s2"):
        assert _leftovers(cl, s, "audit") == []
        assert {"pg", "lite"} <= _bodies(cl, s)
    cl.execute("s1", "INSERT INTO audit (body) VALUES ('later')")
    cl.execute("s2", "UPDATE items SET qty = 5 WHERE name = 'b'")
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == cl.rows("s2", "items")
    assert "later" not in _bodies(cl, "s2")
    r = mm_process("status", "-t", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    r = mm_process("uninstall", "-t", str(path), "--table", "audit")
    assert r.returncode == 0 and r.stdout.count("nothing of table audit left") == 2, r.stdout + r.stderr


def test_a_table_whose_identities_a_replicated_table_reads_is_refused(sqlite_backend: Backend, tmp_path: Path) -> None:
    """A replicated table with a foreign key to the renumbered table: its capture looks up the
    table's identities, so the table's objects stay until the foreign key goes (docs/foreign-keys.md)."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], {"items": TABLES["items"]}, init=False)
    for s in ("s1", "s2"):
        cl.execute(s, "CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT)")
        cl.execute(s, "CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent (id), note TEXT)")
    path = tmp_path / "topology.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["tables"].update({"parent": {"key": "id"}, "child": {"key": "id"}})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    api.init(load_topology(path))
    _drop_from_file(path, "parent")
    r = mm("uninstall", "-t", str(path), "--table", "parent")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "replicated table 'child' references 'parent'" in r.stderr
    assert any("_mm_log_parent" in x for x in _leftovers(cl, "s1", "parent"))
    # stopping both is allowed
    _drop_from_file(path, "child")
    for tb in ("child", "parent"):
        r = mm("uninstall", "-t", str(path), "--table", tb)
        assert r.returncode == 0, r.stdout + r.stderr
    assert _leftovers(cl, "s1", "parent") == [] and _leftovers(cl, "s2", "child") == []
    assert mm("status", "-t", str(path)).returncode == 0
