"""Test clusters over real databases, one backend class per database.

A test asks for the `backend` fixture (parametrized in conftest.py) and builds a cluster with
:func:`make_cluster`. Applications' writes go through plain DB-API clients (sqlite3, psycopg,
PyMySQL) from :meth:`TestCluster.db`, never through multimaster.
"""

from __future__ import annotations

import atexit
import os
import random
import sqlite3
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from multimaster import api
from multimaster.config.topology import Topology, load_topology

# generic column types -> per-backend DDL
SQLITE_TYPES = {
    "int": "INTEGER",
    "bigint": "INTEGER",
    "text": "TEXT",
    "real": "REAL",
    "decimal": "NUMERIC(12,2)",
    "bool": "BOOLEAN",
    "blob": "BLOB",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
}


class Backend:
    name = ""

    def new_site(self, tmp: Path, site: str) -> str:
        """Create an empty database for `site`; return its SQLAlchemy URL."""
        raise NotImplementedError

    def create_table(self, url: str, table: str, key: str, columns: dict[str, str], auto: bool = True) -> None:
        raise NotImplementedError

    def connect(self, url: str) -> Any:
        """A plain DB-API connection, as an application would open."""
        raise NotImplementedError

    def param(self) -> str:
        return "?"

    def cleanup(self) -> None:
        pass


class SQLiteBackend(Backend):
    name = "sqlite"

    def new_site(self, tmp: Path, site: str) -> str:
        path = tmp / f"{site}.db"
        sqlite3.connect(path).close()
        return f"sqlite:///{path}"

    def create_table(self, url: str, table: str, key: str, columns: dict[str, str], auto: bool = True) -> None:
        cols = [f'"{key}" INTEGER PRIMARY KEY' if auto else f'"{key}" TEXT PRIMARY KEY']
        cols += [f'"{c}" {SQLITE_TYPES.get(t, t)}' for c, t in columns.items()]
        with self.connect(url) as c:
            c.execute(f'CREATE TABLE "{table}" ({", ".join(cols)})')

    def connect(self, url: str) -> Any:
        c = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        c.execute("PRAGMA busy_timeout = 30000")
        return c


@dataclass
class TestCluster:
    backend: Backend
    topo: Topology
    urls: dict[str, str]
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    __test__ = False

    def db(self, site: str) -> Any:
        return self.backend.connect(self.urls[site])

    def execute(self, site: str, sql: str, params: tuple[Any, ...] = ()) -> None:
        """One application transaction at `site`."""
        sql = sql.replace("?", self.backend.param())
        c = self.db(site)
        try:
            cur = c.cursor()
            cur.execute(sql, params)
            c.commit()
        finally:
            c.close()

    def rows(self, site: str, table: str, order: str | None = None) -> list[tuple[Any, ...]]:
        key = self.tables[table]["key"]
        cols = [key, *self.tables[table]["columns"]]
        c = self.db(site)
        try:
            cur = c.cursor()
            q = '"' if self.backend.name != "mysql" else "`"
            cur.execute(f"SELECT {', '.join(q + x + q for x in cols)} FROM {q}{table}{q} ORDER BY {q}{order or key}{q}")
            return [tuple(r) for r in cur.fetchall()]
        finally:
            c.close()

    def refresh(self, site: str | None = None, peer: str | None = None, **kw: Any) -> list[Any]:
        res = api.refresh(self.topo, site, peer, **kw)
        errors = [r.error for r in res if r.error]
        assert not errors, errors
        return res

    def refresh_until_quiet(self, rounds: int = 10) -> int:
        with api.Cluster(self.topo) as cl:
            for i in range(rounds):
                res = api.refresh(cl)
                errors = [r.error for r in res if r.error]
                assert not errors, errors
                if all(r.pulled == 0 for r in res):
                    return i + 1
        raise AssertionError("the cluster did not go quiet")

    def run_while_refreshing(self, threads: list[threading.Thread]) -> list[BaseException]:
        """Run `threads` (applications writing) to their end while one more thread refreshes every
        link over and over; returns what the refresher raised or reported (a link's error)."""
        stop = threading.Event()
        errors: list[BaseException] = []

        def refresher() -> None:
            try:
                with api.Cluster(self.topo) as c:
                    while not stop.is_set():
                        for r in api.refresh(c):
                            assert r.error is None, r.error
            except BaseException as e:  # noqa: BLE001 - returned to the test
                errors.append(e)

        rt = threading.Thread(target=refresher)
        rt.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        rt.join()
        return errors

    def assert_converged(self) -> None:
        for tb in self.tables:
            ref = self.rows(next(iter(self.urls)), tb)
            for s in self.urls:
                assert self.rows(s, tb) == ref, f"{tb} differs at {s}"


def keep_writing(
    stop: threading.Event, problems: list[str], site: str, seed: int, step: Callable[[random.Random, int], None]
) -> None:
    """An application at `site` until `stop` is set: `step(rnd, i)` runs its i-th transaction;
    what one raises is what the application would see, recorded in `problems`."""
    rnd = random.Random(seed)
    i = 0
    while not stop.is_set():
        i += 1
        try:
            step(rnd, i)
        except Exception as e:  # noqa: BLE001 - what an application would see
            problems.append(f"application at {site}: {type(e).__name__}: {e}")


def keep_refreshing(cl: TestCluster, stop: threading.Event, problems: list[str], site: str, **kw: Any) -> None:
    """A refresher of `site` (the daemon's loop) until `stop` is set; every link's error is recorded
    in `problems`."""
    with api.Cluster(cl.topo) as c:
        while not stop.is_set():
            problems.extend(f"refresh {r.peer}->{r.site}: {r.error}" for r in api.refresh(c, site, **kw) if r.error)


def apply_path(fast: bool) -> Any:
    """Make every refresh from now on apply its changes through the fast path (`fast`:
    MM_FASTPATH_MIN=0, whatever the batch's size) or through the planner alone (MM_FASTPATH=0),
    so a property test covers both (engine/fastpath.py is a special case of the planner's rules).
    Returns the function that puts the environment back."""
    keys = ("MM_FASTPATH", "MM_FASTPATH_MIN")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({"MM_FASTPATH_MIN": "0"} if fast else {"MM_FASTPATH": "0"})

    def restore() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    return restore


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`multimaster ARGS` in this process: :func:`mm`. (It was a `python -m multimaster.cli`
    subprocess, ~1 s of CPU a call to import the packages, in tests that are not about the
    command's process; a test of the front door runs :func:`mm_process`.)"""
    return mm(*args)


def make_cluster(
    backend: Backend,
    tmp: Path,
    sites: list[str],
    tables: dict[str, dict[str, Any]],
    links: Any = "mesh",
    base: dict[str, list[tuple[Any, ...]]] | None = None,
    init: bool = True,
    settings: dict[str, Any] | None = None,
    site_settings: dict[str, dict[str, Any]] | None = None,
) -> TestCluster:
    """tables: name -> {"key": "id", "columns": {"name": "text", ...}, "auto": True, "config": {...}};
    settings: further top-level sections of the topology file (e.g. {"refresh": {...}});
    site_settings: further fields of a site's entry (e.g. {"r1": {"read_only": True}})."""
    urls = {s: backend.new_site(tmp, s) for s in sites}
    for url in urls.values():
        for tb, spec in tables.items():
            backend.create_table(url, tb, spec["key"], spec["columns"], spec.get("auto", True))
    topo_doc = {
        "sites": {s: {"url": u, **(site_settings or {}).get(s, {})} for s, u in urls.items()},
        "tables": {tb: {"key": spec["key"], **spec.get("config", {})} for tb, spec in tables.items()},
        "links": links,
        **(settings or {}),
    }
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topo_doc, sort_keys=False))
    cl = TestCluster(backend, load_topology(path), urls, tables)
    for site, rows in (base or {}).items():
        for tb_row in rows:
            tb, row = tb_row[0], tb_row[1:]
            cols = [tables[tb]["key"], *tables[tb]["columns"]]
            q = '"' if backend.name != "mysql" else "`"
            cl.execute(
                site, f"INSERT INTO {q}{tb}{q} ({', '.join(q + c + q for c in cols)}) VALUES ({', '.join('?' * len(cols))})", row
            )
    if init:
        api.init(cl.topo)
    return cl


def unreachable_topology(cl: TestCluster, tmp: Path, site: str) -> Path:
    """A copy of `cl`'s topology file in which `site` cannot be reached (its file's directory
    gone, or its server's port closed): what a process that cannot reach it sees."""
    from sqlalchemy.engine import make_url

    doc = yaml.safe_load(Path(str(cl.topo.path)).read_text())
    url = doc["sites"][site]["url"]
    doc["sites"][site]["url"] = (
        f"sqlite:///{tmp}/gone/{site}.db" if url.startswith("sqlite") else make_url(url).set(port=1).render_as_string(False)
    )
    path = tmp / f"without-{site}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


ITEMS = {"items": {"key": "id", "columns": {"name": "text", "qty": "int", "price": "real"}}}


PG_TYPES = {
    "int": "INTEGER",
    "bigint": "BIGINT",
    "text": "TEXT",
    "real": "DOUBLE PRECISION",
    "decimal": "NUMERIC(12,2)",
    "bool": "BOOLEAN",
    "blob": "BYTEA",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamptz": "TIMESTAMPTZ",
}
MYSQL_TYPES = {
    "int": "INT",
    "bigint": "BIGINT",
    "text": "TEXT",
    "real": "DOUBLE",
    "decimal": "DECIMAL(12,2)",
    "bool": "BOOLEAN",
    "blob": "LONGBLOB",
    "date": "DATE",
    "timestamp": "DATETIME(6)",
    "timestamptz": "TIMESTAMP(6)",
}


class _Dropper:
    """One thread per test process dropping databases in the order tests gave them up;
    :meth:`drain` (conftest.py, at the session's end) waits for the last."""

    def __init__(self) -> None:
        import queue

        self.q: queue.Queue[tuple[Any, str] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.failed: list[str] = []

    def put(self, drop: Any, db: str) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="drop-databases", daemon=True)
            self.thread.start()
        self.q.put((drop, db))

    def _run(self) -> None:
        while (job := self.q.get()) is not None:
            drop, db = job
            try:
                drop(db)
            except Exception as e:  # noqa: BLE001 - reported by drain, never fails a test
                self.failed.append(f"{db}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")

    def drain(self) -> list[str]:
        """Wait until every database handed over is dropped; the ones that could not be."""
        if self.thread is not None:
            self.q.put(None)
            self.thread.join()
            self.thread = None
        return self.failed


DROPPER = _Dropper()


class _Spares:
    """PostgreSQL's CREATE DATABASE copies template1 through the WAL: ~0.3 s on a server busy with
    the other worker's tests, twice or three times per test. One thread per test process keeps a
    few databases created ahead (`mm_spare_<pid>_<n>`, created empty like any test database), and a
    site takes one by renaming it, in a millisecond. What is left at the end goes to DROPPER."""

    KEEP = 3

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.ready: list[tuple[Any, str]] = []  # (backend, name) created and not yet taken
        self.thread: threading.Thread | None = None
        self.backend: Any = None
        self.stopping = False
        self.n = 0

    def take(self, backend: Any) -> str | None:
        """The name of a spare database of `backend`'s server, no longer a spare; None when none is
        ready (the caller creates one), and from then on one is made ahead."""
        with self.cv:
            if self.backend is None:
                self.backend = backend
            elif self.backend.server != backend.server:
                return None  # another server (MM_POSTGRESQL_URL changed mid-run): not pooled
            if self.thread is None and not self.stopping:
                self.thread = threading.Thread(target=self._run, name="spare-databases", daemon=True)
                self.thread.start()
            got = self.ready.pop(0)[1] if self.ready else None
            self.cv.notify_all()
            return got

    def _run(self) -> None:

        while True:
            with self.cv:
                while not self.stopping and len(self.ready) >= self.KEEP:
                    self.cv.wait()
                if self.stopping:
                    return
                self.n += 1
                name = f"mm_spare_{os.getpid()}_{self.n}"
            try:
                self.backend._admin(f"CREATE DATABASE {name}{self.backend.create_options}")
            except Exception:  # noqa: BLE001 - a site then creates its own database
                with self.cv:
                    self.stopping = True
                return
            with self.cv:
                self.ready.append((self.backend, name))
                self.cv.notify_all()

    def drain(self) -> None:
        """Stop making spares; the ones left are dropped (through DROPPER)."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
            thread = self.thread
        if thread is not None:
            thread.join()
        with self.cv:
            for b, name in self.ready:
                DROPPER.put(b._drop, name)
            self.ready = []


SPARES = _Spares()
# a benchmark (or any script) that used a server backend ends after its databases are dropped, not
# with them left behind half-way through the queue (pytest drains in conftest.py first); atexit
# runs the last registered first: the spares go to DROPPER before it drains
atexit.register(DROPPER.drain)
atexit.register(SPARES.drain)


class _ServerBackend(Backend):
    """A server database: one uniquely named database per site, dropped in cleanup()."""

    env = ""
    default = ""
    create_options = ""

    def __init__(self) -> None:
        import os
        import uuid

        from sqlalchemy.engine import make_url

        self.server = make_url(os.environ.get(self.env) or self.default)
        self.prefix = "mm_" + uuid.uuid4().hex[:10]
        self.databases: list[str] = []
        self.users: list[str] = []  # logins a test created (MySQLBackend drops them with the databases)
        try:
            self._admin("SELECT 1")
        except Exception as e:  # noqa: BLE001 - any failure to talk to the server means: not available
            raise ConnectionError(
                f"{self.server.render_as_string(hide_password=True)}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
            ) from None

    def url(self, db: str) -> str:
        return self.server.set(database=db).render_as_string(hide_password=False)

    def new_site(self, tmp: Path, site: str) -> str:
        db = f"{self.prefix}_{site}".lower()
        self._admin(f"CREATE DATABASE {db}{self.create_options}")
        self.databases.append(db)
        return self.url(db)

    def cleanup(self) -> None:
        """Drop the test's databases in the background (:data:`DROPPER`): PostgreSQL's DROP DATABASE
        forces a checkpoint, which on a server busy with the other worker's tests takes seconds
        the next test need not wait for."""
        for db in self.databases:
            DROPPER.put(self._drop, db)
        self.databases = []

    def param(self) -> str:
        return "%s"


class PostgresBackend(_ServerBackend):
    name = "postgresql"
    env = "MM_POSTGRESQL_URL"
    default = "postgresql+psycopg://postgres@127.0.0.1:5432/"

    def _dsn(self, db: str | None) -> dict[str, Any]:
        u = self.server
        return {
            "host": u.host or "127.0.0.1",
            "port": u.port or 5432,
            "user": u.username or "postgres",
            "password": u.password or None,
            "dbname": db or "postgres",
            "connect_timeout": 3,
        }

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(**self._dsn(None), autocommit=True) as c:
            c.execute(sql)

    def new_site(self, tmp: Path, site: str) -> str:
        spare = SPARES.take(self)
        if spare is None:
            return super().new_site(tmp, site)
        db = f"{self.prefix}_{site}".lower()
        try:
            self._admin(f"ALTER DATABASE {spare} RENAME TO {db}")
        except Exception:  # noqa: BLE001 - a name already taken, say: the test's own error comes from CREATE
            DROPPER.put(self._drop, spare)
            return super().new_site(tmp, site)
        self.databases.append(db)
        return self.url(db)

    def _drop(self, db: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")

    def create_table(self, url: str, table: str, key: str, columns: dict[str, str], auto: bool = True) -> None:
        cols = [f'"{key}" SERIAL PRIMARY KEY' if auto else f'"{key}" TEXT PRIMARY KEY']
        cols += [f'"{c}" {PG_TYPES.get(t, t)}' for c, t in columns.items()]
        with self.connect(url) as c:
            c.execute(f'CREATE TABLE "{table}" ({", ".join(cols)})')
            c.commit()

    def connect(self, url: str) -> Any:
        import psycopg
        from sqlalchemy.engine import make_url

        return psycopg.connect(**self._dsn(make_url(url).database))


class MySQLBackend(_ServerBackend):
    name = "mysql"
    env = "MM_MYSQL_URL"
    default = "mysql+pymysql://root@127.0.0.1:3306/"
    create_options = " CHARACTER SET utf8mb4"

    def _kw(self, db: str | None) -> dict[str, Any]:
        u = self.server
        kw: dict[str, Any] = {
            "host": u.host or "127.0.0.1",
            "port": u.port or 3306,
            "user": u.username or "root",
            "password": u.password or "",
            "charset": "utf8mb4",
            "connect_timeout": 3,
            # the test server is on loopback: PyMySQL 2's unverified TLS would cost each of the
            # suite's thousands of connections 40 ms (the product does the same: mysql/dialect.py)
            "ssl_disabled": (u.host or "127.0.0.1") in ("127.0.0.1", "localhost", "::1"),
        }
        if db:
            kw["database"] = db
        return kw

    def _admin(self, sql: str) -> None:
        import pymysql

        c = pymysql.connect(**self._kw(None), autocommit=True)
        try:
            c.cursor().execute(sql)
        finally:
            c.close()

    def _drop(self, db: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {db}")

    def cleanup(self) -> None:
        super().cleanup()
        for u in self.users:
            DROPPER.put(lambda name: self._admin(f"DROP USER IF EXISTS '{name}'@'%'"), u)
        self.users = []

    def new_site(self, tmp: Path, site: str) -> str:
        return super().new_site(tmp, site) + "?charset=utf8mb4"

    def create_table(self, url: str, table: str, key: str, columns: dict[str, str], auto: bool = True) -> None:
        cols = [f"`{key}` INT AUTO_INCREMENT PRIMARY KEY" if auto else f"`{key}` VARCHAR(191) PRIMARY KEY"]
        cols += [f"`{c}` {MYSQL_TYPES.get(t, t)}" for c, t in columns.items()]
        with self.connect(url) as c:
            c.cursor().execute(f"CREATE TABLE `{table}` ({', '.join(cols)})")
            c.commit()

    def connect(self, url: str) -> Any:
        import pymysql
        from sqlalchemy.engine import make_url

        return pymysql.connect(**self._kw(make_url(url).database))

    @staticmethod
    def stamp(conn: Any, *tables: str) -> None:
        """What a pulling peer runs at a site before it reads (Dialect.read_horizons), on a plain
        connection `conn`: every table's horizon, then its entries stamped with their
        transactions' ids (site.sql _mm_stamp)."""
        cur = conn.cursor()
        hs = {}
        for tb in tables:
            cur.execute("CALL _mm_horizon(%s)", (tb,))
            hs[tb] = int(cur.fetchall()[0][0])
            while cur.nextset():
                pass
        for tb in tables:
            cur.execute("CALL _mm_stamp(%s, %s)", (tb, hs[tb]))
            while cur.nextset():
                pass


#: name -> factory. Server backends register here (their factories raise ConnectionError when the
#: server does not answer, and conftest turns that into a skip, or a failure under CI).
BACKENDS: dict[str, Any] = {"sqlite": SQLiteBackend, "postgresql": PostgresBackend, "mysql": MySQLBackend}

REQUIRE_SERVERS = os.environ.get("MM_REQUIRE_SERVERS") == "1"


def server_unavailable(name: str, reason: str) -> None:
    msg = f"{name} server not reachable ({reason}); set MM_{name.upper()}_URL or start it"
    if REQUIRE_SERVERS:
        pytest.fail(msg + " — MM_REQUIRE_SERVERS=1 makes this a failure", pytrace=False)
    pytest.skip(msg)


def made(name: str) -> Backend:
    """The backend `name`; the test skipped (failed under MM_REQUIRE_SERVERS) when its server does
    not answer. The caller drops its databases (`cleanup`)."""
    try:
        return BACKENDS[name]()  # type: ignore[no-any-return]
    except ConnectionError as e:
        server_unavailable(name, str(e))
        raise


def query(b: Backend, url: str, sql: str, params: tuple[Any, ...] = (), *, qmark: bool = False) -> list[tuple[Any, ...]]:
    """Run `sql` at the database `url` of backend `b` as a plain client does (its own connection,
    committed), returning the rows it read; `qmark`: the statement writes `?` for parameters, made
    the backend's own."""
    c = b.connect(url)
    try:
        cur = c.cursor()
        cur.execute(sql.replace("?", b.param()) if qmark else sql, params)
        rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
        c.commit()
        return rows
    finally:
        c.close()


#: what a reader sees of order 'A' (the order, its lines): all of a source transaction or none of it
SEE_A = "SELECT (SELECT count(*) FROM orders WHERE oref = 'A'), (SELECT count(*) FROM olines WHERE oref = 'A')"


def see_a(cl: Any, site: str) -> tuple[int, int]:
    """(orders, lines) of order 'A' at `site` of cluster `cl`, as an application reads them."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(SEE_A)
        r = cur.fetchone()
        c.rollback()
        return int(r[0]), int(r[1])
    finally:
        c.close()


def opened(name: str) -> Iterator[Backend]:
    """A fixture's body: the backend `name` (skipped, or failed under MM_REQUIRE_SERVERS, when its
    server does not answer), its databases dropped after the test."""
    b = made(name)
    yield b
    b.cleanup()


#: the multimaster command of this interpreter's environment
CLI = str(Path(sys.executable).parent / "multimaster")


def mm_process(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `multimaster ARGS` as a user does: a subprocess, a 250-column terminal width."""
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=300)


#: MM_TEST_CLI=process runs every :func:`mm` as a subprocess
CLI_IN_PROCESS = os.environ.get("MM_TEST_CLI", "") != "process"


def mm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `multimaster ARGS`: the CLI's own Typer application in this process (its argument
    parsing, output and exit code as a user gets them), with a 250-column terminal width.

    A subprocess costs each call ~0.8 s of CPU for the interpreter to import the package, and the
    suite makes hundreds of such calls; the tests of the front door itself (tests/test_cli.py,
    tests/test_passwords.py, tests/test_examples.py, ...) run the installed `multimaster` command
    as a subprocess (:func:`mm_process`), and MM_TEST_CLI=process makes every call one. An
    exception the command did not turn into an exit code is printed to its stderr with exit 1, as
    the interpreter would."""
    if not CLI_IN_PROCESS:
        return mm_process(*args)
    import traceback

    from typer.testing import CliRunner

    from multimaster.cli import app
    from multimaster.cli.common import console, err

    widths = console._width, err._width  # Rich read COLUMNS when the CLI module was imported
    console.width = err.width = 250
    try:
        r = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"}, catch_exceptions=True)
    finally:
        console._width, err._width = widths
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        stderr += "".join(traceback.format_exception(r.exception))
    return subprocess.CompletedProcess([CLI, *args], r.exit_code, r.stdout, stderr)
