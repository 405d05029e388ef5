"""A site: one database of the cluster, its SQLAlchemy engine and its dialect."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Hashable, Iterable, Iterator
from weakref import WeakKeyDictionary

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine, RootTransaction, make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import Topology, hidden_url
from multimaster.dialects import Dialect, get_dialect
from multimaster.dialects.base import BRIEF_EARLY, BRIEF_NOW, BRIEF_WAITS
from multimaster.dialects.liveness import Timeouts
from multimaster.dialects.schema import TableInfo
from multimaster.engine.lockwatch import LockWatch
from multimaster.engine.references import discover
from multimaster.engine.schema import introspect
from multimaster.errors import NotInstalled, SiteUnreachable

__all__ = ["Site", "after_commit", "open_sites"]

#: per write transaction open in Site.write: what to run once it has committed (after_commit)
_after_commit: WeakKeyDictionary[RootTransaction, dict[Hashable, Callable[[Connection], None]]] = WeakKeyDictionary()


def after_commit(conn: Connection, key: Hashable, fn: Callable[[Connection], None]) -> None:
    """Run `fn` once the write transaction open on `conn` (Site.write) has committed, in a
    transaction of its own on the same connection; once per `key` (the last `fn` given). Nothing
    runs if the transaction rolls back. Meant for work that must not share the transaction's fate:
    a failure of `fn` is ignored (it must leave the site correct either way), and the transaction
    it follows has committed whatever `fn` does."""
    txn = conn.get_transaction()
    if txn is not None:
        _after_commit.setdefault(txn, {})[key] = fn


class Site:
    def __init__(self, name: str, url: str, *, create: bool = False, timeouts: Timeouts | None = None):
        self.name = name
        self.url = url
        self.create = create
        #: the bounds on a new connection and on a wait that hears nothing from the server
        #: (topology: connect_timeout, read_timeout; dialects/liveness.py)
        self.timeouts = timeouts or Timeouts()
        u = make_url(url)
        self.dialect: Dialect = get_dialect(u.get_backend_name())
        self._engine: Engine | None = None
        self._connecting = threading.Lock()
        self._infos: dict[str, TableInfo] = {}  # complete descriptions only: threads share them
        #: per thread, the tables it is describing now, without their references yet (info())
        self._describing = threading.local()
        self._topo: Topology | None = None

    def __repr__(self) -> str:
        return f"Site({self.name!r}, {hidden_url(self.url)!r})"

    @property
    def display_url(self) -> str:
        return hidden_url(self.url)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            with self._connecting:  # threads (status, the daemon's links) connect a site once
                return self._connect()
        return self._engine

    def _connect(self) -> Engine:
        if self._engine is None:
            u = make_url(self.url)
            db = self.dialect.database_file(self.url)  # connecting would create it empty
            if db is not None and not self.create and not os.path.exists(db):
                raise SiteUnreachable(self.name, self.display_url, f"the database file {db} does not exist")
            eng = create_engine(self.url, **self.dialect.engine_kwargs(self.url, self.timeouts))
            self.dialect.guard_engine(eng, self.timeouts)
            self.dialect.prepare_engine(eng)
            try:
                with eng.connect() as c:
                    c.exec_driver_sql("SELECT 1")
            except SQLAlchemyError as e:
                eng.dispose()
                reason = (
                    str(getattr(e, "orig", e)).strip().splitlines()[0] if str(getattr(e, "orig", e)).strip() else type(e).__name__
                )
                raise SiteUnreachable(self.name, self.display_url, redact(reason.replace(u.password or "\0", "***"))) from None
            self._upgrade(eng)
            self._engine = eng
        return self._engine

    def _upgrade(self, eng: Engine) -> None:
        """What an earlier multimaster installed here brought up to date (Dialect.upgrade_on_open:
        a SQLite site's change logs and snapshots get ``txn``, docs/transactions.md)."""
        try:
            self.dialect.upgrade_on_open(eng)
        except SQLAlchemyError as e:
            eng.dispose()
            if self.dialect.is_retryable(e):
                raise
            reason = (
                str(getattr(e, "orig", e)).strip().splitlines()[0] if str(getattr(e, "orig", e)).strip() else type(e).__name__
            )
            raise NotInstalled(
                self.name,
                "txn column in its change logs and snapshots (installed by a multimaster before session 36), and adding "
                f"it failed ({redact(reason)})",
            ) from None

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            with conn.begin():
                yield conn

    @contextmanager
    def write(self, watch: LockWatch | None = None, *, brief: bool = False, early: bool = False) -> Iterator[Connection]:
        """A write transaction that takes the site's write lock up front (SQLite: BEGIN IMMEDIATE);
        once it committed, what it registered with after_commit runs, each in a transaction of its
        own. `watch`: the operation's lock watch (engine/lockwatch.py), told of the transaction's
        session and of its BEGIN. `brief`: once the transaction holds a table's writers' lock, its
        lock waits give up at once (Dialect.lock_writers); for a caller that runs it again. `early`:
        already once it holds the table's reconcilers' lock (BRIEF_EARLY)."""
        with self.engine.connect() as conn:
            conn.execution_options(mm_write=True, **{BRIEF_WAITS: brief, BRIEF_EARLY: early})
            conn.info.pop(BRIEF_NOW, None)  # (a transaction before on this session set it)
            if watch is None:
                txn = conn.begin()
            else:
                watch.attach(conn.connection.dbapi_connection)
                with watch.beginning():
                    txn = conn.begin()  # SQLite waits here for the file's write lock
            with txn:
                yield conn
            for fn in _after_commit.pop(txn, {}).values():
                try:
                    with conn.begin():
                        fn(conn)
                except SQLAlchemyError:  # (after_commit: the committed work stands either way)
                    pass

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def info(self, conn: Connection, table: str, topo: Topology, *, anew: bool = False) -> TableInfo:
        """`table` as this site has it (columns, key, references), described once and kept;
        `anew`: described on `conn` whatever is kept (a follow, for the version it just recorded).

        The daemon's link refreshers share one Site and describe its tables concurrently when it
        starts. Only complete descriptions are shared: a table being described is seen without its
        references only by the thread describing it (a parent referencing it back, found while
        discovering them). Shared in the making, another link's refresher took it from there
        without its references, pulled the change log without the referenced rows' identities and
        applied the origin's keys as they were: a child then named another row here (session 34).

        A description of an older schema version than the one kept is not kept: a refresher that
        read the version before a follow recorded the next one, and finished after, replaced the
        follow's description with its own."""
        self._topo = topo
        done = None if anew else self._infos.get(table)
        if done is not None:
            return done
        mine: dict[str, TableInfo] = self._describing.__dict__.setdefault("tables", {})
        if table in mine:  # this thread is describing it: a reference cycle back to it
            return mine[table]
        # every version in one read: the current one's columns, and those an earlier one had
        vs = store.schemas.versions(conn, self.dialect, table) if store.schemas.exists(conn, self.dialect) else {}
        only = {c.name for c in vs[max(vs)]} if vs else None
        base = introspect(conn, self.name, table, topo.tables[table], only)
        if vs:
            base = replace(base, version=max(vs), dropped=store.schemas.dropped_of(vs))
        mine[table] = base
        try:
            refs, natural = discover(conn, self, base, topo)
            full = replace(base, refs=refs, natural_refs=natural)
        finally:
            del mine[table]
        kept = self._infos.get(table)
        if kept is None or kept.version <= full.version:
            self._infos[table] = full
        return full

    def forget(self, table: str | None = None) -> None:
        """Describe `table` (every table: None) anew at the next info(): its schema changed."""
        if table is None:
            self._infos.clear()
        else:
            self._infos.pop(table, None)

    def known_info(self, table: str, conn: Connection | None = None) -> TableInfo | None:
        """`table` as info() described it at this site (read on `conn` when not yet, if it is a
        table of the topology info() was last given), or None: not a replicated table."""
        if table not in self._infos and conn is not None and self._topo is not None and table in self._topo.tables:
            return self.info(conn, table, self._topo)
        return self._infos.get(table)

    def installed_tables(self, conn: Connection) -> list[str]:
        return store.tables.installed(conn, self.dialect)

    def require_installed(self, conn: Connection, topo: Topology, have: Iterable[str] | None = None) -> None:
        """Raise NotInstalled naming the tables of `topo` this site has no replication objects
        for; `have`: the tables installed here, read already (store.tables.installed)."""
        have = set(self.installed_tables(conn) if have is None else have)
        missing = [t for t in topo.tables if t not in have]
        if missing:
            raise NotInstalled(self.name, f"replication objects for table(s) {missing}", missing)


def open_sites(topo: Topology, names: list[str] | None = None, *, create: bool = False) -> dict[str, Site]:
    """The sites `names` (all: None) opened on their database urls (engine/cluster.py open_site
    also opens sites reached through an agent)."""
    out = {}
    for n in names or list(topo.sites):
        out[n] = Site(n, topo.sites[n].url, create=create, timeouts=topo.timeouts(n))
    return out


def is_operational(e: BaseException) -> bool:
    return isinstance(e, OperationalError)
