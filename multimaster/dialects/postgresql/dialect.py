"""PostgreSQL 12+: objects in the schema ``_mm``, PL/pgSQL capture, concurrent writers.

SQL lives in triggers/postgresql/*.sql. What differs from SQLite, and why (docs/postgresql.md):

- many writers at once, none waiting for another (docs/concepts.md "Many writers"): a change's
  position in the change log is a tick of the clock, and its version that tick; a writing
  transaction registers a lower bound of its ticks as a shared advisory lock until it ends, and a
  peer reads only below the horizon (`_mm._mm_horizon`), under which every position is final;
  local inserts into a renumbered table draw keys from a counter, ranked by the reconciler while
  it holds the table's writers' lock (shared for writing transactions, exclusive for it);
- the clock is a sequence (`_mm._mm_tick`), so writers never queue on it; the reconciler pushes
  the floor (the highest version received) into it;
- the echo guard is ``SET LOCAL mm.applying = 'on'``, invisible to every other session.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Sequence

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from multimaster.core.progress import Blocker, lock_roots
from multimaster.dialects.base import (
    BRIEF_NOW,
    BRIEF_WAITS,
    CLOCK_SLACK,
    Capabilities,
    Dialect,
    capture_fragments,
    shadow_key_index,
    table_relations,
    txn_memo,
)
from multimaster.dialects.liveness import Address, Guard, Timeouts
from multimaster.dialects.schema import Collation, Column, TableInfo, names

SCHEMA = "_mm"
#: first key of the advisory locks on a table (second key: its oid; 0: the clock's jumps): the
#: writers' lock of a renumbered table (writers shared, the reconciler exclusive when it gives keys) ...
LOCK_CLASS = 28013
#: ... and the reconcilers' own lock (exclusive; no application writer takes it)
APPLY_LOCK_CLASS = 28014
#: how long the reconciler waits for any lock (the writers' lock, a row) before giving up and
#: retrying the batch: shorter than PostgreSQL's default deadlock_timeout (1 s), so in a deadlock
#: with an application transaction the reconciler is normally the one that gives up
APPLY_LOCK_TIMEOUT = "500ms"
#: ... and, with brief waits, once it holds a table's writers' lock (lock_writers): any lock wait
#: (a row an application locked) gives up at once and the batch is retried, the writers' lock
#: given back meanwhile (PostgreSQL's smallest lock_timeout; 0 would mean no timeout)
HELD_LOCK_TIMEOUT = "1ms"
#: sqlstates worth a retry: serialization_failure, deadlock_detected, lock_not_available
_RETRY_STATES = {"40001", "40P01", "55P03"}
#: the wall clock in ticks of the clock (whole milliseconds << 16), what the clock's rule compares
#: a tick with (site.sql _mm_tick, clock.sql's draw): date_part's double precision, not extract's
#: numeric, whose arithmetic cost a draw 1,700 instructions more (counted; docs/decisions.md,
#: session 25); both round to the nearest millisecond
WALL_TICKS = "(date_part('epoch', clock_timestamp()) * 1000)::bigint << 16"


#: a captured INSERT or DELETE of at most this many rows runs its capture function's cached
#: statement (a plan made for a few rows); a larger one runs the same text planned for its size
#: (capture.sql, docs/postgresql.md "Capture and plans")
FEW_ROWS = 16
#: pulled rows stored in a snapshot by a plain INSERT ... VALUES (executemany) rather than COPY
#: through a scratch table (store_snapshot_rows): below it the scratch table costs more
FEW_SNAPSHOT_ROWS = 64
#: types psycopg reads as Python objects that do not hold the value exactly, read as their text
#: instead, which PostgreSQL takes back unchanged (docs/types.md): json / jsonb (a JSON string is
#: read as the bare string, JSON null as None, and a number binds back as smallint), interval
#: (months and years folded into days: '1 year 2 mons' became '425 days'); their arrays too
TEXT_LOADED = ("json", "jsonb", "interval")


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _own(app: str) -> str:
    """An SQL condition true when the application_name `app` (an SQL expression) is one of
    multimaster's own sessions (prepare_engine sets it)."""
    return f"({app} = 'multimaster' OR {app} LIKE 'multimaster (%%')"


_APP = "current_setting('application_name')"


class _AbortedPipeline(logging.Filter):
    """psycopg runs an executemany in a pipeline; when a row is rejected it raises the database's
    error and, ending the pipeline, logs a warning that it is aborted ("error ignored terminating
    <psycopg.Pipeline ...>: pipeline aborted"), which Python prints on stderr when nothing
    configured logging. The error itself is raised and handled (a rejected change is held,
    engine/isolate.py): the warning only repeats it, so it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "error ignored terminating %r: %s" and "pipeline aborted" in record.getMessage())


logging.getLogger("psycopg").addFilter(_AbortedPipeline())


def _guarded_connection(guard: Guard) -> Any:
    """A psycopg Connection class whose every wait on its server (a statement, COMMIT, a fetch, a
    COPY) is watched by `guard` (dialects/liveness.py): cut when the server stops answering, with
    the guard's message."""
    import psycopg

    class GuardedConnection(psycopg.Connection):  # type: ignore[type-arg]
        _mm_addr: Address | None = None

        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().connect(*args, **kwargs)
            except psycopg.errors.ConnectionTimeout as e:  # (psycopg: "connection timeout expired")
                raise psycopg.errors.ConnectionTimeout(
                    f"no connection within {guard.timeouts.connect:g} s (connect_timeout): the server is down, "
                    "frozen or cut off by the network"
                ) from e

        def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                fd = self.pgconn.socket
            except psycopg.OperationalError:
                return super().wait(gen, *args, **kwargs)
            if self._mm_addr is None:
                host, port = self.info.hostaddr or self.info.host, int(self.info.port or 5432)
                self._mm_addr = ("unix", f"{host}/.s.PGSQL.{port}", 0) if host.startswith("/") else ("tcp", host, port)
            with guard.waiting(fd, self._mm_addr) as w:
                try:
                    return super().wait(gen, *args, **kwargs)
                except Exception as e:
                    if w.cut is None:
                        raise
                    self.close()  # (SQLAlchemy: a closed connection is a disconnect, discarded)
                    raise psycopg.OperationalError(guard.message(w)) from e

    return GuardedConnection


#: declared types whose equality is not identity, or that have none, and arrays of them: compared
#: as text (Dialect.comparable). json has no equality operator (capture's IS DISTINCT FROM failed
#: on every update); interval's equality holds '1 mon' = '30 days' and citext's ignores case, so
#: an update between such values was not captured and sites kept different values
_TEXT_COMPARED = re.compile(r"^(JSON|INTERVAL|CITEXT)\b", re.I)


def _load_as_text(dbapi_conn: Any) -> None:
    """Read the TEXT_LOADED types as their text on this psycopg 3 connection (its own adapters)."""
    adapters = getattr(dbapi_conn, "adapters", None)
    if adapters is None or not hasattr(dbapi_conn, "pgconn"):  # psycopg 3 (or a subclass: _guarded_connection)
        return
    from psycopg.types.string import TextLoader

    for name in TEXT_LOADED:
        adapters.register_loader(name, TextLoader)
    for name, loader in _special_loaders().items():
        adapters.register_loader(name, loader)


def _special_loaders() -> dict[str, Any]:
    """Loaders of date, timestamp and timestamptz that give a value Python's datetime cannot hold
    ('infinity', '-infinity', a BC date, a year past 9999) as PostgreSQL's text of it instead of
    failing the whole read ("timestamp too large"): another PostgreSQL site stores that text
    as it is (bound untyped, it takes the column's type); a site of another database cannot
    convert it and holds the change naming it (dialects/types.py, docs/types.md)."""
    from psycopg import DataError
    from psycopg.types import datetime as pdt

    def special(base: Any) -> Any:
        class Special(base):  # type: ignore[misc, valid-type]
            def load(self, data: Any) -> Any:
                try:
                    return super().load(data)
                except DataError:
                    return bytes(data).decode()

        return Special

    return {
        "date": special(pdt.DateLoader),
        "timestamp": special(pdt.TimestampLoader),
        "timestamptz": special(pdt.TimestamptzLoader),
    }


class PostgreSQLDialect(Dialect):
    name = "postgresql"
    title = "PostgreSQL"
    caps = Capabilities(
        transactional_ddl=True,  # CREATE/DROP roll back with the transaction: init is all-or-nothing
        max_identifier_length=63,  # NAMEDATALEN - 1: longer names are silently truncated, so refuse them
        identifier_unit="bytes",
        placeholder="%s",  # psycopg
        single_writer=False,  # many writers: capture takes no lock beyond the rows it writes
        #: after the candidate rows are locked (engine/fastpath.py); new identities of a renumbered
        #: table are keyed under the writers' lock (lock_writers)
        set_based_apply=True,
        fastpath_min=256,  # a temporary table costs ~3 ms of catalog writes (docs/performance.md "The fast path's threshold")
        concurrent_capture=True,  # positions below _mm._mm_horizon(); keys from a counter
        txn_column=True,  # txn: pg_current_xact_id() (capture.sql)
        daemon_lock_sql="SELECT pg_try_advisory_lock(hashtext(%s))",
        serial_pk="BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        log_rid_column="rid",
        bookkeeping_schema=SCHEMA,  # out of the user's schema; search_path ends with it (prepare_engine)
    )

    # ---- names -----------------------------------------------------------------------------
    def _fn(self, table: str) -> dict[str, str]:
        """Names of the per-table trigger functions (in _mm, named like their triggers)."""
        n = names(table)
        out = {f"fn_{k}": f"{SCHEMA}.{self.quote(getattr(n, k))}" for k in ("cap_i", "cap_u", "cap_d")}
        out["fn_rank"] = f"{SCHEMA}.{self.quote('_mm_rank_' + table)}"
        out["lock"] = self.quote("_mm_lock_" + table)
        out["rank"] = self.quote("_mm_rank_" + table)
        return out

    # ---- connections -----------------------------------------------------------------------
    def engine_kwargs(self, url: str, timeouts: Timeouts | None = None) -> dict[str, Any]:
        # libpq's connect_timeout bounds a new connection (psycopg's default is 130 s); TCP
        # keepalives find a peer gone while a connection sits idle, and tcp_user_timeout a path
        # that stopped acknowledging what was sent; a server that answers nothing while its kernel
        # still acknowledges (frozen) is found by the guard (guard_engine)
        t = timeouts or Timeouts()
        return {
            "connect_args": {
                "connect_timeout": max(2, math.ceil(t.connect)),  # (libpq: whole seconds, at least 2)
                "keepalives": 1,
                "keepalives_idle": max(1, math.ceil(t.read)),
                "keepalives_interval": max(1, math.ceil(t.read / 3)),
                "keepalives_count": 3,
                "tcp_user_timeout": int(t.bound * 1000),
            }
        }

    def guard_engine(self, engine: Engine, timeouts: Timeouts) -> None:
        cls = _guarded_connection(Guard("postgresql", timeouts))

        @event.listens_for(engine, "do_connect")
        def _connect(_dialect: Any, _rec: Any, cargs: Any, cparams: Any) -> Any:
            return cls.connect(*cargs, **cparams)

    def prepare_engine(self, engine: Engine) -> None:
        if engine.dialect.driver == "psycopg":
            # json read as text (_load_as_text): SQLAlchemy's own typed queries (its reflection
            # builds JSON objects) decode it themselves, on this engine's dialect only
            engine.dialect.supports_native_json_deserialization = False

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            # _mm last: user tables keep resolving (and reflecting) in the URL's default schema
            prev = dbapi_conn.autocommit
            dbapi_conn.autocommit = True
            with dbapi_conn.cursor() as cur:
                # in one statement (a round trip each over a WAN: docs/performance.md "`status`
                # across a WAN"): timestamptz values come back in UTC; every statement planned for
                # its parameters: psycopg prepares a statement run five times, and PostgreSQL then
                # keeps a generic plan made with the statistics of bookkeeping tables that grow
                # within the transaction (the error queue from 0 to 20,000 rows while a batch is
                # held); a generic plan cannot hash an IN list of parameters, and such a lookup took
                # 180 ms where its custom plan takes 5 ms (docs/performance.md "Holding and
                # releasing many changes")
                # application_name 'multimaster' ('multimaster (<the URL's>)' when the URL names
                # one) marks the session as multimaster's own (open_writer; lock waits show it)
                cur.execute(
                    "SELECT set_config('search_path', current_setting('search_path') || ', _mm', false), "
                    "set_config('TimeZone', 'UTC', false), set_config('plan_cache_mode', 'force_custom_plan', false), "
                    f"set_config('application_name', CASE WHEN {_own(_APP)} THEN current_setting('application_name') "
                    "WHEN current_setting('application_name') = '' THEN 'multimaster' "
                    "ELSE 'multimaster (' || current_setting('application_name') || ')' END, false)"
                )
            dbapi_conn.autocommit = prev
            _load_as_text(dbapi_conn)

    def comparable(self, col: Column, expr: str) -> str:
        return f"({expr})::text" if _TEXT_COMPARED.match(col.type_sql.strip()) else expr

    def value_adapters(self, info: TableInfo) -> list[Any]:
        """A JSON value is bound as its text (PostgreSQL casts it to the column's json / jsonb)."""
        from multimaster.dialects import types

        return [types.pg_special(types.adapter(types.NATIVE, types.kind_of(self.name, c))) for c in info.columns]

    def is_retryable(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        return getattr(orig, "sqlstate", None) in _RETRY_STATES

    def names_missing_column(self, exc: BaseException) -> bool:
        return getattr(getattr(exc, "orig", exc), "sqlstate", None) == "42703"  # undefined_column

    def backend_id(self, dbapi_conn: Any) -> int | None:
        info = getattr(dbapi_conn, "info", None)  # psycopg 3
        pid = getattr(info, "backend_pid", None)
        if pid is None and hasattr(dbapi_conn, "get_backend_pid"):  # psycopg2
            pid = dbapi_conn.get_backend_pid()
        return None if pid is None else int(pid)

    def lock_blockers(self, conn: Connection, backend: int) -> list[Blocker]:
        """pg_blocking_pids of the session while it waits for a lock (heavyweight locks: rows,
        tables, advisory locks), each described by pg_stat_activity. pg_blocking_pids names the
        sessions waiting ahead in the lock's queue besides its holders (a row's: the one waiting
        for the row's holder to end): each is followed through its own pg_blocking_pids to the
        sessions at the root, which wait for nothing; those come first, and a queued one follows
        them as "itself waiting for" its roots (core/progress.py lock_roots; before, it was named
        as the holder: the soak's D5). pg_blocking_pids briefly locks the lock manager: it is
        called only from a session found waiting, and for the sessions it names."""
        rows = conn.exec_driver_sql(
            "WITH RECURSIVE chain(pid, waits_for) AS ("
            " SELECT x.pid, pg_blocking_pids(x.pid) FROM pg_stat_activity w CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS x(pid)"
            "  WHERE w.pid = %s AND w.wait_event_type = 'Lock'"
            " UNION"
            " SELECT y.pid, pg_blocking_pids(y.pid) FROM chain c CROSS JOIN LATERAL unnest(c.waits_for) AS y(pid))"
            "SELECT DISTINCT ON (b.xact_start, b.pid) b.pid, c.waits_for, b.application_name, b.usename, host(b.client_addr),"
            " b.state, EXTRACT(EPOCH FROM clock_timestamp() - b.xact_start)::float8, left(b.query, 200) "
            "FROM chain c JOIN pg_stat_activity b ON b.pid = c.pid "
            "WHERE b.pid <> %s ORDER BY b.xact_start NULLS LAST, b.pid",
            (backend, backend),
        ).all()
        edges = {int(r[0]): {int(x) for x in r[1]} for r in rows if r[1]}
        roots, queued = lock_roots({backend: {int(r[0]) for r in rows}, **edges}, backend)
        first = [r for r in rows if int(r[0]) in roots] + [r for r in rows if int(r[0]) in queued]
        out = []
        for pid, _, app, user, addr, state, age, query in first:
            who = ", ".join(([f"application '{app}'"] if app else []) + ([f"user {user}"] if user else []))
            if int(pid) in queued:
                below = queued[int(pid)]
                state = "itself waiting for " + (", ".join(f"pid {p}" for p in below) if below else "a lock")
            out.append(
                Blocker(
                    session=f"pid {pid}",
                    who=who or None,
                    client=addr or ("local socket" if pid else None),
                    state=state,
                    txn_seconds=None if age is None else float(age),
                    query=query or None,
                )
            )
        return out

    def temp_rids(self, conn: Connection) -> str:
        if conn.exec_driver_sql("SELECT to_regclass('pg_temp._mm_tmp_rids')").scalar() is None:
            conn.exec_driver_sql('CREATE TEMP TABLE _mm_tmp_rids (rid text COLLATE "C" PRIMARY KEY)')
        return "pg_temp._mm_tmp_rids"

    def insert_ignore_into(self, table: str, cols: str, source: str) -> str:
        return f"INSERT INTO {table} ({cols}) {source} ON CONFLICT DO NOTHING"

    def create_temp(self, conn: Connection, name: str, select: str, keys: str | None = None, index: str | None = "rid") -> None:
        base = name.strip('"')
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {name} AS {select}")
        if keys:
            conn.exec_driver_sql(f"CREATE UNIQUE INDEX {self.quote(base + '_k')} ON {name} ({keys})")
        if index and index != keys and f" {index}" in select.replace(",", " ").replace(".", " "):
            conn.exec_driver_sql(f"CREATE INDEX {self.quote(base + '_i')} ON {name} ({index})")

    # ---- install ---------------------------------------------------------------------------
    def _site_name(self, conn: Connection) -> str:
        return str(conn.exec_driver_sql(f"SELECT site FROM {SCHEMA}._mm_state").scalar())

    def _clock(self) -> tuple[str, str]:
        """clock.sql's registration and draw, as plpgsql statements to splice into a function."""
        register, draw = self.render_text("clock", slack=str(CLOCK_SLACK), wall=WALL_TICKS)
        return register, draw

    def install_site(self, conn: Connection, site: str) -> None:
        register, _ = self._clock()
        self.run_install(
            conn, self.render("site", site_lit=_lit(site), slack=str(CLOCK_SLACK), wall=WALL_TICKS, register=register)
        )
        conn.exec_driver_sql(f"INSERT INTO {SCHEMA}._mm_state (id, site) VALUES (1, %s) ON CONFLICT (id) DO NOTHING", (site,))
        self._install_schema_guard(conn)

    def _install_schema_guard(self, conn: Connection) -> bool:
        """The event trigger that keeps capture working through a hand-run ALTER TABLE of a
        replicated table, in the ALTER's own transaction (schema.sql, docs/schema-changes.md).
        Only a superuser may create an event trigger: without one, returns False (capture follows
        at the next refresh; drop columns with `multimaster ddl`)."""
        from sqlalchemy.exc import DBAPIError

        sp = conn.begin_nested()
        try:
            for sql in self.render("schema"):
                conn.exec_driver_sql(sql)
        except DBAPIError:
            sp.rollback()
            return False
        sp.commit()
        return True

    def column_collations(self, conn: Connection, table: str) -> dict[str, Collation]:
        """citext columns and columns with a nondeterministic collation (docs/postgresql.md
        "Collations"): the rest compare exactly."""
        from multimaster.dialects.postgresql import collations

        return collations.collations(conn, table, self.quote)

    def exact_collation_sql(self, table: str, col: Column) -> str:
        from multimaster.dialects.postgresql import collations

        return collations.exact_sql(table, col, self.quote)

    def explain_rejection(self, conn: Connection, info: TableInfo, e: BaseException) -> str | None:
        """A unique violation (23505) over a citext column or one with a nondeterministic collation:
        the value refused, the row's value here it equals, the collation and the fix. Before
        session 35 the queue held the bare "duplicate key value violates unique constraint"."""
        from multimaster.dialects import loose
        from multimaster.dialects.postgresql import collations

        dup = collations.duplicate(e)
        if dup is None:
            return None
        cols, value = dup
        refused: str | None = value
        held: list[str] = []
        by = {c.name: c for c in (info.key, *info.columns)}
        if len(cols) == 1 and cols[0] in by:
            q = self.quote
            coll = by[cols[0]].collation
            # under the collation the index compares with, where it names its own
            cmp = f" COLLATE {q(coll.name)}" if coll is not None and coll.index else ""
            rows = [
                str(r[0])
                for r in conn.exec_driver_sql(
                    f"SELECT {q(cols[0])}::text FROM {q(info.name)} WHERE {q(cols[0])}{cmp} = %s LIMIT 3", (value,)
                )
            ]
            held = [r for r in rows if r != value]
            if not held and value in rows:  # the detail named the value a row here holds, not the one refused
                refused, held = None, [value]
        return loose.explain(
            info, cols, refused, held, lambda c: self.exact_collation_sql(info.name, c), 'docs/postgresql.md "Collations"'
        )

    def insert_key_caveat(self, conn: Connection, info: TableInfo) -> str | None:
        if not info.spec.renumber:
            return None
        return (
            f"{info.name}'s key comes from multimaster's key counter: an application reads the new row's key with "
            "INSERT ... RETURNING; lastval() returns the capture's clock and currval() of the column's own sequence "
            'an unused value (docs/postgresql.md "Keys the application is told")'
        )

    def lock_for_install(self, conn: Connection, tables: Sequence[str]) -> None:
        """Every lock the install will take on the tables, up front: SHARE ROW EXCLUSIVE (what
        CREATE TRIGGER takes; it waits for every writer) on a table without capture yet, ACCESS
        EXCLUSIVE on one whose triggers init replaces (DROP TRIGGER takes it). Taking the weaker
        one first and the stronger at the DROP was an upgrade: an application that had read the
        table (ACCESS SHARE) and then wrote it waited for init, init for it, and PostgreSQL's
        deadlock check rolled back whichever had waited longer, often the application. Each lock
        is waited for at most APPLY_LOCK_TIMEOUT (below deadlock_timeout, so init gives up
        first and is run again: ops/install.py), then the transaction's own timeout is back."""
        q = self.quote
        existing = [t for t in tables if conn.exec_driver_sql("SELECT to_regclass(%s)", (q(t),)).scalar() is not None]
        if not existing:
            return
        captured = [
            t
            for t in existing
            if conn.exec_driver_sql(
                "SELECT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
                "JOIN pg_namespace s ON s.oid = p.pronamespace WHERE t.tgrelid = %s::regclass AND s.nspname = %s "
                "AND NOT t.tgisinternal)",
                (q(t), SCHEMA),
            ).scalar()
        ]
        was = conn.exec_driver_sql("SELECT current_setting('lock_timeout')").scalar()
        self._lock_timeout(conn, APPLY_LOCK_TIMEOUT)
        for mode, group in (("ACCESS EXCLUSIVE", captured), ("SHARE ROW EXCLUSIVE", [t for t in existing if t not in captured])):
            if group:
                conn.exec_driver_sql(f"LOCK TABLE {', '.join(q(t) for t in group)} IN {mode} MODE")
        self._lock_timeout(conn, str(was))

    def install_table(self, conn: Connection, info: TableInfo) -> None:
        self._check_names(info)
        q = self.quote
        slotcols = "".join(f',\n  {q("v_" + s.name)} text COLLATE "C"' for s in info.spec.slots)
        relid = conn.exec_driver_sql("SELECT %s::regclass::oid::int", (q(info.name),)).scalar_one()
        o = self.obj(info.name)
        natural = not info.spec.renumber
        # a natural key has one shadow row per incarnation (docs/conflicts.md): indexed, not unique
        shadowindex = (
            f"CREATE INDEX IF NOT EXISTS {q(shadow_key_index(info.name))} ON {o.shadow} ({self.key_col})" if natural else ""
        )
        stmts = self.render(
            "table",
            table=q(info.name),
            keytype=info.key.type_sql,
            logcols=self._log_cols(info),
            slotcols=slotcols,
            relid=str(int(relid)),
            keyunique="" if natural else " UNIQUE",
            shadowindex=shadowindex,
            **o.mapping(),
            **self._fn(info.name),
        )
        self.run_install(conn, stmts)
        # earlier versions checked the change log's op (table.sql says why no longer)
        self._drop_column_constraints(conn, o.log, "c", "op")
        if natural:
            # an earlier layout kept one shadow row per natural key (UNIQUE key): drop the constraint
            self._drop_column_constraints(conn, o.shadow, "u", "key")

    def _drop_column_constraints(self, conn: Connection, table: str, contype: str, column: str) -> None:
        """Drop `table`'s constraints of kind `contype` ('c' CHECK, 'u' UNIQUE) on `column` alone,
        those of earlier layouts (a catalog change, no rewrite)."""
        for (con,) in conn.exec_driver_sql(
            "SELECT c.conname FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) "
            "WHERE c.conrelid = %s::regclass AND c.contype = %s AND a.attname = %s AND cardinality(c.conkey) = 1",
            (table, contype, column),
        ).all():
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP CONSTRAINT {self.quote(con)}")

    def install_capture(self, conn: Connection, info: TableInfo) -> None:
        q = self.quote
        o = self.obj(info.name)
        key = q(info.key.name)
        spec = info.spec
        cols = info.columns
        site = _lit(self._site_name(conn))
        diffs = [f"{self.comparable(c, 'o.' + q(c.name))} IS DISTINCT FROM {self.comparable(c, 'n.' + q(c.name))}" for c in cols]
        fr = capture_fragments(q, cols, spec, "n", "o", diffs)
        # an update is captured per row (capture.sql): its mask, values and slot stamps from NEW / OLD
        own = [
            f"{self.comparable(c, 'OLD.' + q(c.name))} IS DISTINCT FROM {self.comparable(c, 'NEW.' + q(c.name))}" for c in cols
        ]
        row = capture_fragments(q, cols, spec, "NEW", "OLD", own)
        rowmask = " | ".join(f"((CASE WHEN {d} THEN 1 ELSE 0 END)::bigint << {i})" for i, d in enumerate(row["diff"])) or "0"
        stamps = []
        for s in spec.slots:
            smask = sum(1 << i for i in s.columns)
            vcol = q("v_" + s.name)
            stamps.append(f"{vcol} = CASE WHEN mm_m & {smask} <> 0 THEN mm_v ELSE s.{vcol} END")
        # the heads an update supersedes (docs/conflicts.md "Concurrent heads"): read before the
        # shadow row's update clears them, for each slot it sets whose policy chooses among heads
        clear, sup = self.heads_capture(spec, lambda s: f"mm_m & {sum(1 << i for i in s.columns)} <> 0", old="s.")
        stamps += clear
        rowslotstamp = ", ".join(stamps) if stamps else "rid = s.rid"
        rowsup = "" if sup is None else f"SELECT {sup} INTO mm_sup FROM {o.shadow} s WHERE s.key = NEW.{key}$live;"
        # the delete statement computes every value in a subquery that draws one tick per row (OFFSET
        # 0 keeps it apart), under the names mm_k, mm_o<i>; the outer SELECT adds the version
        delvals = "".join(f", o.{q(c.name)} AS mm_o{i}" for i, c in enumerate(cols))
        xdel = "".join(f", x.mm_o{i}" for i in range(len(cols)))
        fns = self._fn(info.name)
        # a one-row insert or delete: its values from the transition table's one row, mm_r (capture.sql)
        rowvals = "".join(f", mm_r.{q(c.name)}" for c in cols)
        if spec.renumber:
            insrid, slotnames, slotinit, replaced, live = "n.mm_v", "", "", "", ""
            rowinsrid, rowreplaced, rowslotinit = "mm_v", "", ""
        else:
            # a natural key's incarnation (docs/conflicts.md): its first life is 'k:' || key, a later
            # one 'k:' || key || '@' || the highest delete version held for its earlier lives; one
            # still live here (never, short of a capture gap) ends at this insert's version
            insrid = (
                f"'k:' || CAST(n.{key} AS text) || coalesce('@' || (SELECT CASE WHEN bool_or(s.deleted IS NULL) "
                f"THEN n.mm_v ELSE max(s.deleted) END FROM {o.shadow} s WHERE s.{self.key_col} = n.{key}), '')"
            )
            slotnames = "".join(f", {q('v_' + s.name)}" for s in spec.slots)
            slotinit = "".join(", ver" for _ in spec.slots)
            rowslotinit = "".join(", mm_v" for _ in spec.slots)
            replaced = (
                f",\n  x AS (UPDATE {o.shadow} s SET deleted = l.ver FROM l "
                f"WHERE s.{self.key_col} = l.{self.key_col} AND s.deleted IS NULL)"
            )
            rowinsrid = (
                f"'k:' || CAST(mm_r.{key} AS text) || coalesce('@' || (SELECT CASE WHEN bool_or(s.deleted IS NULL) "
                f"THEN mm_v ELSE max(s.deleted) END FROM {o.shadow} s WHERE s.{self.key_col} = mm_r.{key}), '')"
            )
            rowreplaced = (
                f"\n    UPDATE {o.shadow} s SET deleted = mm_v WHERE s.{self.key_col} = mm_r.{key} AND s.deleted IS NULL;"
            )
            # updates and deletes act on the live incarnation
            live = " AND s.deleted IS NULL"
        values = dict(
            **fr,
            sv=str(int(info.version)),
            table=q(info.name),
            key=key,
            keyname_lit=_lit(info.key.name),
            site_lit=site,
            insrid=insrid,
            allmask=str(spec.all_mask),
            delvals=delvals,
            xdel=xdel,
            slotnames=slotnames,
            slotinit=slotinit,
            replaced=replaced,
            live=live,
            rowmask=rowmask,
            rowslotstamp=rowslotstamp,
            rowsup=rowsup.replace("$live", live),
            rowupdnew=row["updnew"],
            rowupdold=row["updold"],
            rowvals=rowvals,
            rowinsrid=rowinsrid,
            rowreplaced=rowreplaced,
            rowslotinit=rowslotinit,
            few=str(FEW_ROWS),
            **o.mapping(),
            **fns,
        )
        # the set-based statements, each spliced twice into capture.sql (its render escapes them)
        ins_stmt, del_stmt = self.render_text("capture_rows", **values)
        register, draw = self._clock()
        stmts = self.render(
            "capture",
            **values,
            ins_stmt=ins_stmt,
            del_stmt=del_stmt,
            ins_lit=_lit(ins_stmt),
            del_lit=_lit(del_stmt),
            register=register,
            draw=draw,
        )
        if spec.renumber:
            stmts += self.render("renumber", table=q(info.name), key=key, keyseq=o.keyseq, keyseq_lit=_lit(o.keyseq), **fns)
        else:
            stmts += [f"DROP TRIGGER IF EXISTS {fns['rank']} ON {q(info.name)}"]
        for sql in stmts:
            conn.exec_driver_sql(sql)
        if spec.renumber:
            self.after_apply(conn, info)  # the key counter starts past every key

    def guard_writes(self, conn: Connection, info: TableInfo, site: str, read_only: bool) -> None:
        o = self.obj(info.name)
        if not read_only:
            return self.drop_triggers(conn, info.name, (o.ro_i, o.ro_u, o.ro_d))
        for sql in self.render("readonly", table=self.quote(info.name), site_lit=_lit(site), **o.mapping()):
            conn.exec_driver_sql(sql)

    version_type = 'text COLLATE "C"'

    def unique_sets(self, conn: Connection, table: str) -> list[tuple[str, list[str] | None, str | None]]:
        """One catalog read (the inspector's three reflections took 17 ms a table, at every
        refresh's introspection): every unique index of `table` but the primary key's; a UNIQUE
        constraint is its index, under the same name. Same answer as the base's inspector reading
        (tests/test_server_compat.py)."""
        nnd = "ix.indnullsnotdistinct" if (conn.dialect.server_version_info or (0,)) >= (15,) else "false"
        rows = conn.exec_driver_sql(
            "SELECT i.relname, ix.indexprs IS NOT NULL OR 0 = ANY (ix.indkey::int2[]), ix.indpred IS NOT NULL, "
            f"{nnd}, ARRAY(SELECT a.attname::text FROM unnest(ix.indkey::int2[]) WITH ORDINALITY k(attnum, n) "
            "JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum ORDER BY k.n) "
            "FROM pg_index ix JOIN pg_class i ON i.oid = ix.indexrelid "
            "WHERE ix.indrelid = %s::regclass AND ix.indisunique AND NOT ix.indisprimary ORDER BY i.relname",
            (self.quote(table),),
        ).all()
        pk = {
            str(r[0])
            for r in conn.exec_driver_sql(
                "SELECT a.attname FROM pg_index ix JOIN pg_attribute a ON a.attrelid = ix.indrelid "
                "AND a.attnum = ANY (ix.indkey::int2[]) WHERE ix.indrelid = %s::regclass AND ix.indisprimary",
                (self.quote(table),),
            )
        }
        out: list[tuple[str, list[str] | None, str | None]] = []
        for name, expr, partial, nulls_nd, cols in rows:
            if expr:
                out.append((str(name), None, "an expression index"))
            elif partial:
                out.append((str(name), None, "a partial index (WHERE ...)"))
            elif nulls_nd:
                out.append((str(name), None, "NULLS NOT DISTINCT"))
            elif set(cols) != pk:
                out.append((str(name), [str(c) for c in cols], None))
        return out

    def column_signature(self, conn: Connection, table: str) -> str:
        rows = conn.exec_driver_sql(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid) "
            "FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (self.quote(table),),
        ).all()
        return repr([tuple(r) for r in rows])

    def table_signatures(self, conn: Connection, tables: Sequence[str]) -> dict[str, str]:
        if not tables:
            return {}
        each = "FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, i) "
        cols: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(1, len(tables) + 1)}
        for r in conn.exec_driver_sql(
            "SELECT t.i, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid) "
            + each
            + "JOIN pg_attribute a ON a.attrelid = t.name::regclass "
            "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE a.attnum > 0 AND NOT a.attisdropped ORDER BY t.i, a.attnum",
            ([self.quote(t) for t in tables],),
        ):
            cols[int(r[0])].append(tuple(r[1:]))
        trig: dict[int, set[str]] = {i: set() for i in cols}
        for i, name in conn.exec_driver_sql(
            "SELECT t.i, g.tgname " + each + "JOIN pg_trigger g ON g.tgrelid = t.name::regclass AND NOT g.tgisinternal",
            ([self.quote(t) for t in tables],),
        ):
            trig[int(i)].add(str(name))
        out = {}
        for i, t in enumerate(tables, start=1):  # as column_signature and capture_present give them
            o = names(t)
            out[t] = f"{cols[i]!r} capture={','.join(sorted({o.cap_i, o.cap_u, o.cap_d} & trig[i]))}"
        return out

    applying_flag = "current_setting('mm.applying', true)"
    applying_marker = "mm.applying"

    def trigger_texts(self, conn: Connection, table: str) -> dict[str, str]:
        # enabled in the origin role (O) or always (A): the reconciler applies in the origin role
        rows = conn.exec_driver_sql(
            "SELECT t.tgname, pg_get_triggerdef(t.oid) || ' ' || p.prosrc FROM pg_trigger t "
            "JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid = %s::regclass AND NOT t.tgisinternal AND t.tgenabled IN ('O', 'A')",
            (self.quote(table),),
        )
        return {str(r[0]): str(r[1]) for r in rows}

    def triggers_on(self, conn: Connection, table: str) -> set[str]:
        rows = conn.exec_driver_sql(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", (self.quote(table),)
        )
        return {str(r[0]) for r in rows}

    def retype_column(self, conn: Connection, obj: str, col: str, type_sql: str) -> None:
        conn.exec_driver_sql(
            f"ALTER TABLE {obj} ALTER COLUMN {self.quote(col)} TYPE {type_sql} USING {self.quote(col)}::{type_sql}"
        )

    def drop_triggers(self, conn: Connection, table: str, names: Sequence[str]) -> None:
        for t in names:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {t} ON {self.quote(table)}")

    def read_table_kind(self, conn: Connection, name: str) -> str | None:
        kind = conn.exec_driver_sql(
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (SCHEMA, name),
        ).scalar()
        return None if kind is None else "view" if kind == "v" else "table"

    def read_table_kinds(self, conn: Connection, names_: Sequence[str]) -> dict[str, str]:
        rows = conn.exec_driver_sql(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = ANY(%s)",
            (SCHEMA, list(names_)),
        )
        return {str(n): "view" if k == "v" else "table" for n, k in rows}

    def uninstall(self, conn: Connection, tables: Sequence[str], peers: Sequence[str]) -> list[str]:
        if conn.exec_driver_sql(f"SELECT to_regnamespace('{SCHEMA}')").scalar() is None:
            return []
        dropped = [
            f"trigger {r[0]}"
            for r in conn.exec_driver_sql(
                "SELECT t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = %s AND NOT t.tgisinternal ORDER BY 1",
                (SCHEMA,),
            )
        ]
        kinds = {"r": "table", "v": "view", "S": "sequence", "i": None, "t": None}
        for name, kind in conn.exec_driver_sql(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s ORDER BY 1",
            (SCHEMA,),
        ):
            if kinds.get(kind):
                dropped.append(f"{kinds[kind]} {name}")
        dropped += [
            f"function {r[0]}"
            for r in conn.exec_driver_sql(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1",
                (SCHEMA,),
            )
        ]
        # the triggers on user tables depend on functions in _mm: CASCADE drops them with the schema
        conn.exec_driver_sql(f"DROP SCHEMA {SCHEMA} CASCADE")
        dropped.append(f"schema {SCHEMA}")
        return dropped

    def uninstall_table(self, conn: Connection, table: str, peers: Sequence[str]) -> list[str]:
        """In the caller's transaction (all or nothing). The table is locked first as install
        locks it (SHARE ROW EXCLUSIVE, what DROP TRIGGER takes anyway): its writers wait for this
        transaction instead of deadlocking with it (a writer holds the table, then its change log);
        writers of other tables are not touched. Then the triggers on it whose function is in
        _mm, the reference capture on its change log, its views, tables and key counter, and its
        own functions (capture, rank, references)."""
        if conn.exec_driver_sql(f"SELECT to_regnamespace('{SCHEMA}')").scalar() is None:
            return []
        q = self.quote
        n = names(table)
        dropped: list[str] = []
        if conn.exec_driver_sql("SELECT to_regclass(%s)", (q(table),)).scalar() is not None:
            conn.exec_driver_sql(f"LOCK TABLE {q(table)} IN SHARE ROW EXCLUSIVE MODE")
            for (tg,) in conn.exec_driver_sql(
                "SELECT t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace s ON s.oid = p.pronamespace "
                "WHERE t.tgrelid = %s::regclass AND s.nspname = %s AND NOT t.tgisinternal ORDER BY 1",
                (q(table), SCHEMA),
            ).all():
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {q(tg)} ON {q(table)}")
                dropped.append(f"trigger {tg}")
        views, tables = table_relations(table, peers)
        kinds: dict[str, str] = dict(
            conn.exec_driver_sql(
                "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace "
                "WHERE s.nspname = %s AND c.relname = ANY (%s)",
                (SCHEMA, [*views, *tables, n.keyseq]),
            ).all()
        )
        if n.log in kinds:  # the reference capture (install_reference_capture)
            for (tg,) in conn.exec_driver_sql(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY 1",
                (self.obj(table).log,),
            ).all():
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {q(tg)} ON {self.obj(table).log}")
                dropped.append(f"trigger {tg}")
        for kind, sql, objs in (("view", "VIEW", views), ("table", "TABLE", tables), ("sequence", "SEQUENCE", [n.keyseq])):
            for name in objs:
                if name in kinds:
                    conn.exec_driver_sql(f"DROP {sql} IF EXISTS {SCHEMA}.{q(name)}")
                    dropped.append(f"{kind} {name}")
        own = [n.cap_i, n.cap_u, n.cap_d, "_mm_rank_" + table, "_mm_refs_" + table]
        for (fn,) in conn.exec_driver_sql(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace "
            "WHERE s.nspname = %s AND p.proname = ANY (%s) ORDER BY 1",
            (SCHEMA, own),
        ).all():
            conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {SCHEMA}.{q(fn)}()")
            dropped.append(f"function {fn}")
        return dropped

    # ---- apply -----------------------------------------------------------------------------
    def set_applying(self, conn: Connection, on: bool) -> None:
        conn.exec_driver_sql("SELECT set_config('mm.applying', %s, true)", ("on" if on else "off",))

    def store_snapshot_rows(
        self, conn: Connection, snap: str, cols: list[str], rows: list[tuple[Any, ...]], applied: bool
    ) -> None:
        # COPY into a scratch table, then one INSERT ... ON CONFLICT DO NOTHING: several times the
        # rate of a row-by-row executemany, in the same transaction. Not for a few rows: the scratch
        # table's CREATE and DROP write the catalogs (~4 ms), more than a few INSERTs cost
        if len(rows) <= FEW_SNAPSHOT_ROWS:
            return super().store_snapshot_rows(conn, snap, cols, rows, applied)
        collist = ", ".join(cols)
        conn.exec_driver_sql("DROP TABLE IF EXISTS pg_temp._mm_tmp_copy")
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE _mm_tmp_copy AS SELECT {collist} FROM {snap} WHERE false")
        raw = conn.connection.dbapi_connection
        with raw.cursor() as cur:  # type: ignore[union-attr]
            with cur.copy(f"COPY pg_temp._mm_tmp_copy ({collist}) FROM STDIN") as cp:
                for r in rows:
                    cp.write_row(r)
        conn.exec_driver_sql(
            f"INSERT INTO {snap} ({collist}, applied) SELECT {collist}, {1 if applied else 0} FROM pg_temp._mm_tmp_copy "
            "ON CONFLICT DO NOTHING"
        )
        conn.exec_driver_sql("DROP TABLE pg_temp._mm_tmp_copy")

    def lock_for_apply(self, conn: Connection, info: TableInfo) -> None:
        """Serialize with the other reconcilers of the table, then bound every lock wait of the
        rest of the transaction (APPLY_LOCK_TIMEOUT): an application transaction that locks rows in
        another order than the reconciler, or waits for the writers' lock while holding a row the
        reconciler needs, is not the deadlock victim — the reconciler gives up first and its batch
        is retried (is_retryable)."""
        brief = bool(conn.info.get(BRIEF_NOW))
        want = HELD_LOCK_TIMEOUT if brief else APPLY_LOCK_TIMEOUT
        memo = txn_memo(conn)
        if memo.get(("apply_lock", info.name)) and memo.get("lock_timeout") == want:
            return  # held already (a batch takes it before it stores, the reconcile again), the waits bounded alike
        if brief:  # (this transaction holds another table's writers' lock: lock_writers)
            self._lock_timeout(conn, APPLY_LOCK_TIMEOUT)
        conn.exec_driver_sql(
            f"SELECT pg_advisory_xact_lock({APPLY_LOCK_CLASS}, %s::regclass::oid::int)", (self.quote(info.name),)
        )
        memo[("apply_lock", info.name)] = True
        self._lock_timeout(conn, want)

    @staticmethod
    def _lock_timeout(conn: Connection, value: str) -> None:
        """The transaction's lock_timeout from here on, noted (txn_memo) for lock_for_apply."""
        conn.exec_driver_sql("SELECT set_config('lock_timeout', %s, true)", (value,))
        txn_memo(conn)["lock_timeout"] = value

    def lock_writers(self, conn: Connection, info: TableInfo) -> None:
        """The table's writers' lock, exclusively (waiting APPLY_LOCK_TIMEOUT for it). With brief
        waits (Dialect.lock_writers), every lock wait after it gives up after HELD_LOCK_TIMEOUT:
        a reconciler that waited APPLY_LOCK_TIMEOUT for a row an application had locked (FOR
        UPDATE, FOR SHARE, a foreign key's check) held every writer of the table back that long."""
        brief = bool(conn.info.get(BRIEF_NOW))
        if brief:
            self._lock_timeout(conn, APPLY_LOCK_TIMEOUT)
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, %s::regclass::oid::int)", (self.quote(info.name),))
        if brief or conn.get_execution_options().get(BRIEF_WAITS):
            self._lock_timeout(conn, HELD_LOCK_TIMEOUT)
            conn.info[BRIEF_NOW] = True

    def open_writer(self, conn: Connection) -> Dialect.OpenWriter | None:
        """The registered transaction with the lowest bound (the advisory lock _mm_horizon reads,
        site.sql), with what pg_stat_activity shows of its session (its query only to its own
        role or pg_read_all_stats). None when that is multimaster's own session (its
        application_name, prepare_engine: a refresh relaying changes here, append_log): its work
        ends by itself, and its lock watch names what it waits for (the soak's D4: `status`
        advised terminating it)."""
        r = conn.exec_driver_sql(
            "SELECT l.pid, extract(epoch FROM clock_timestamp() - a.xact_start), a.state, left(a.query, 120), "
            f"{_own('a.application_name')} "
            "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.classid >= 262144 AND l.classid < 2147483648 "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY (l.classid::bigint << 32) | l.objid::bigint LIMIT 1"
        ).first()
        if r is None or r[4]:
            return None
        pid, age, state, query, _ = r
        doing = None if state is None else f"{state}: {query}" if query else str(state)
        return Dialect.OpenWriter(
            f"backend pid {pid}", None if age is None else float(age), doing, f"SELECT pg_terminate_backend({int(pid)})"
        )

    def read_horizon(self, conn: Connection, table: str) -> int | None:
        return int(conn.exec_driver_sql(f"SELECT {SCHEMA}._mm_horizon()").scalar_one())

    def append_log(
        self,
        conn: Connection,
        table: str,
        cols: Sequence[str],
        select: str | None = None,
        rows: Sequence[tuple[Any, ...]] = (),
        params: tuple[Any, ...] = (),
    ) -> None:
        """Register as a writer (site.sql), then give every row a tick as its position, in order."""
        if select is None and not rows:
            return
        conn.exec_driver_sql(f"SELECT {SCHEMA}._mm_register()")
        target = f"INSERT INTO {self.obj(table).log} (seq, {', '.join(self.log_write_columns(cols))}) "
        if select is not None:
            conn.exec_driver_sql(target + f"SELECT {SCHEMA}._mm_tick(), c.* FROM ({select} OFFSET 0) c", params)
        else:
            conn.exec_driver_sql(target + f"VALUES ({SCHEMA}._mm_tick(), {self.ph(len(cols))})", list(rows))

    def lock_rows(self, conn: Connection, info: TableInfo, tmp: str) -> None:
        q = self.quote
        o = self.obj(info.name)
        key = q(info.key.name)
        # a temporary table has no statistics unless analyzed (autovacuum never sees it): the
        # planner then guessed it large and scanned the whole shadow and table for a refresh of two
        # changes (15 ms a statement at 100,000 rows, docs/performance.md "A small refresh of a large table")
        conn.exec_driver_sql(f"ANALYZE {tmp}")
        conn.exec_driver_sql(
            f"SELECT 1 FROM {q(info.name)} t JOIN {o.shadow} s ON s.{self.key_col} = t.{key} JOIN {tmp} r ON r.rid = s.rid "
            f"ORDER BY t.{key} FOR UPDATE OF t"
        ).all()
        conn.exec_driver_sql(
            f"SELECT 1 FROM {o.shadow} s JOIN {tmp} r ON r.rid = s.rid ORDER BY s.{self.key_col} FOR UPDATE OF s"
        ).all()

    def advance_clock(self, conn: Connection, hlc: int, table: str | None = None) -> None:
        """Record the floor in ``_mm_state.hlc`` and move the clock sequence past it (``_mm_tick``
        with ``wait_``: strictly, whatever the slack captures allow themselves), so every change
        captured afterwards sorts after `hlc`; the capture functions read only the sequence."""
        conn.exec_driver_sql(f"UPDATE {SCHEMA}._mm_state SET hlc = GREATEST(hlc, %s)", (hlc,))
        conn.exec_driver_sql(f"SELECT {SCHEMA}._mm_tick(%s, true)", (hlc,))

    def read_clock(self, conn: Connection) -> int | None:
        v = conn.exec_driver_sql(f"SELECT GREATEST(c.last_value, s.hlc) FROM {SCHEMA}._mm_clock c, {SCHEMA}._mm_state s").scalar()
        return None if v is None else int(v)

    def after_apply(self, conn: Connection, info: TableInfo) -> None:
        """Move the key column's sequence (serial or identity) and, for a renumbered table, its key
        counter past the highest key, so a plain INSERT never collides even with the capture
        triggers disabled or removed. Forward only: a local insert may have drawn a value."""
        q = self.quote
        keys = (
            f"GREATEST((SELECT coalesce(max({q(info.key.name)}), 0) FROM {q(info.name)}), "
            f"(SELECT coalesce(max({self.key_col}), 0) FROM {self.obj(info.name).shadow}))"
        )
        serial = conn.exec_driver_sql("SELECT pg_get_serial_sequence(%s, %s)", (q(info.name), info.key.name)).scalar()
        # (a serial's sequence starts at 1: setval cannot take 0; the key counter's can)
        seqs = [(serial, f"GREATEST({keys}, 1)")] if serial else []
        if info.spec.renumber:
            seqs.append((self.obj(info.name).keyseq, keys))
        for seq, top in seqs:
            conn.exec_driver_sql(
                f"SELECT setval(%s, m) FROM (SELECT {top} AS m) t WHERE m >= (SELECT last_value FROM {seq})", (seq,)
            )

    def reset_key_counter(self, conn: Connection, info: TableInfo, top: int) -> None:
        self.after_apply(conn, info)
        conn.exec_driver_sql("SELECT setval(%s, %s)", (self.obj(info.name).keyseq, max(top, 0)))

    # ---- foreign keys between replicated tables (docs/foreign-keys.md) -------------------------
    reference_type = 'text COLLATE "C"'

    def install_reference_capture(self, conn: Connection, info: TableInfo) -> None:
        """A BEFORE INSERT row trigger on the change log sets the identities of the entries this
        site captures, from the parents' shadows (written by the parents' capture)."""
        q = self.quote
        o = self.obj(info.name)
        fn = f"{SCHEMA}.{q('_mm_refs_' + info.name)}"
        trig = q("_mm_refs_" + info.name)
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trig} ON {o.log}")
        if not info.refs:
            conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {fn}()")
            return
        bit = {c: i for i, c in enumerate(info.column_names)}
        body = []
        for r in info.refs:
            sh = self.obj(r.parent).shadow
            m = 1 << bit[r.column]
            body.append(
                f"  IF (NEW.mask & {m}) <> 0 THEN\n"
                f"    IF NEW.op <> 'D' THEN NEW.{q('f_' + r.column)} := (SELECT rid FROM {sh} WHERE key = NEW.{q('n_' + r.column)}); END IF;\n"
                f"    IF NEW.op <> 'I' THEN NEW.{q('fo_' + r.column)} := (SELECT rid FROM {sh} WHERE key = NEW.{q('o_' + r.column)}); END IF;\n"
                f"  END IF;"
            )
        conn.exec_driver_sql(
            f"CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql "
            f"SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$\nBEGIN\n"
            + "\n".join(body)
            + "\n  RETURN NEW;\nEND\n$$"
        )
        conn.exec_driver_sql(f"REVOKE ALL ON FUNCTION {fn}() FROM PUBLIC")
        conn.exec_driver_sql(
            f"CREATE TRIGGER {trig} BEFORE INSERT ON {o.log} FOR EACH ROW "
            f"WHEN (NEW.origin = {_lit(self._site_name(conn))}) EXECUTE FUNCTION {fn}()"
        )

    def make_foreign_key_deferrable(self, conn: Connection, table: str, name: str) -> None:
        """SET CONSTRAINTS defers only deferrable constraints: the foreign key becomes DEFERRABLE
        INITIALLY IMMEDIATE (checked at each statement for applications, as before)."""
        conn.exec_driver_sql(
            f"ALTER TABLE {self.quote(table)} ALTER CONSTRAINT {self.quote(name)} DEFERRABLE INITIALLY IMMEDIATE"
        )

    def defer_foreign_keys(self, conn: Connection, on: bool) -> bool:
        """SET CONSTRAINTS ALL DEFERRED, for this transaction; referential actions still run."""
        if on:
            conn.exec_driver_sql("SET CONSTRAINTS ALL DEFERRED")
        return True

    # ---- outside the engine: verify and repair (multimaster/spark/), grants, site files ----------
    jdbc = Dialect.Jdbc(
        driver="org.postgresql.Driver",
        jar="postgresql.jar",
        package="libpostgresql-jdbc-java",
        scheme="jdbc:postgresql",
        default_port=5432,
        read_types=None,  # the driver reports each column's declared type
    )
    #: verify's and repair's plain connections do not have multimaster's search path (prepare_engine)

    def pull_grants(self, site: str, peer: str, login: str, database: str, objects: Sequence[str]) -> list[str]:
        # a role, not a user with a password: the owner sets it (never printed); USAGE on the schema
        # is needed to reach anything in it
        tables = ", ".join(f"{SCHEMA}.{self.quote(o)}" for o in objects)
        return [
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{login}') THEN "
            f"CREATE ROLE {login} LOGIN; END IF; END $$",
            f"GRANT CONNECT ON DATABASE {self.quote(database)} TO {login}",
            f"GRANT USAGE ON SCHEMA {SCHEMA} TO {login}",
            f"GRANT SELECT ON {tables} TO {login}",
            # the horizon a puller reads below (site.sql); it runs as its owner
            f"GRANT EXECUTE ON FUNCTION {SCHEMA}._mm_horizon() TO {login}",
        ]


DIALECT = PostgreSQLDialect()
