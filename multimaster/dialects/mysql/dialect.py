"""MariaDB 10.6+ / MySQL 8.0.13+: objects named ``_mm_*`` in the site's database, row triggers.

SQL lives in triggers/mysql/*.sql. What differs from SQLite, and why (docs/mysql.md):

- many writers at once, none waiting for another (docs/mysql.md "How capture works with many
  writers"): a change's position in the change log is a value of the site's clock (the
  AUTO_INCREMENT of ``_mm_tick``, kept at or past the wall clock), and its version that value; each captured row locks its connection's slot of the
  table (``_mm_slots``) before it draws, and a peer reads only below the horizon (``_mm_horizon``),
  under which every position is final; local inserts into a renumbered table draw keys from a
  per-table SEQUENCE, ranked by the reconciler while it holds every slot of the table
  (MariaDB 10.6+: sequences, SKIP LOCKED);
- the echo guard is the session variable ``@mm_applying``;
- ``key`` is a reserved word: every statement naming the column ``key`` of multimaster's own tables
  quotes it (:attr:`Dialect.key_col`, the templates write `` `key` ``);
- DDL commits implicitly: ``init`` is not all-or-nothing per site (it is idempotent: rerun it).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from contextlib import contextmanager, suppress
from typing import Any, Collection, Iterator, Mapping, Sequence

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from multimaster.core.progress import Blocker, lock_roots
from multimaster.dialects.base import (
    BRIEF_EARLY,
    BRIEF_NOW,
    BRIEF_WAITS,
    CLOCK_SLACK,
    Capabilities,
    Dialect,
    capture_fragments,
    capture_text_signature,
    read_only_message,
    shadow_key_index,
    table_relations,
)
from multimaster.dialects.liveness import Address, Guard, Timeouts
from multimaster.dialects.schema import Collation, Column, TableInfo, names
from multimaster.errors import MultimasterError, SchemaError

#: MySQL error numbers worth a retry: deadlock, lock wait timeout, the "try restarting" family, and
#: a table skipped by information_schema while concurrent DDL modifies it (1684)
_RETRY_CODES = {1213, 1205, 1020, 1412, 1684}
#: seconds a follow of a table's schema waits for another process's follow of it (lock_follow)
FOLLOW_LOCK_WAIT = 300
#: the name of the named lock (GET_LOCK) every connection of multimaster holds while it lives, of
#: a connection id (an SQL expression): how `status` tells multimaster's own sessions from the
#: applications' (open_writer). Server-wide like every named lock: any database's multimaster.
OWN_LOCK = "CONCAT('mm-own-', {})"
#: seconds a follow's DDL waits for a table's metadata lock before it fails as a lock wait and the
#: follow is tried again (short_ddl_waits): the longest an application's statement waits behind it
DDL_LOCK_WAIT = 1
#: how many times init tries LOCK TABLES on a table whose capture it starts (starting_capture),
#: each try waiting at most DDL_LOCK_WAIT, then a backoff (20 ms doubling to 1 s): about two minutes
START_LOCK_TRIES = 60
#: every session's isolation level: each statement of the reconciler sees what was committed
#: before it (engine_kwargs), set again on each connection going back to the pool (prepare_engine)
_LEVEL = "READ COMMITTED"
_TEXTLIKE = ("CHAR", "TEXT", "ENUM", "SET", "JSON")


def _on(v: Any) -> bool:
    """A server variable's boolean value (1/0, or ON/OFF as some versions return it)."""
    return str(v).strip().upper() in ("1", "ON", "TRUE", "YES")


def _lit(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "''") + "'"


def _utc_timestamp(v: Any) -> Any:
    import datetime as dt

    import pymysql.converters as pc

    d = pc.convert_datetime(v)
    return d.replace(tzinfo=dt.timezone.utc) if isinstance(d, dt.datetime) else d


def as_bytes(type_sql: str, expr: str) -> str:
    """`expr` as the change test compares it: a string column as bytes, so a case-insensitive or
    PAD SPACE collation cannot hide a change of letter case or trailing spaces. ``CAST(x AS BINARY)``,
    not the ``BINARY x`` operator (deprecated in MySQL 8.0.27)."""
    return f"CAST({expr} AS BINARY)" if any(t in type_sql.upper() for t in _TEXTLIKE) else expr


def trigger_privilege_problem(log_bin: bool, trust_function_creators: bool, has_super: bool) -> str | None:
    """Why `init` could not create triggers here, or None. With binary logging on, MySQL and MariaDB
    let only a user with SUPER create triggers unless ``log_bin_trust_function_creators = 1``
    (error 1419); MySQL 8.0.3+ turns binary logging on by default. DDL commits as it goes, so init
    checks this before it creates anything."""
    if not log_bin or trust_function_creators or has_super:
        return None
    return (
        "binary logging is on (log_bin = ON) and the user running init has no SUPER privilege, so the server "
        "would refuse to create the capture triggers (error 1419) after init had created some tables. Either set "
        "log_bin_trust_function_creators = 1 (SET GLOBAL log_bin_trust_function_creators = 1, and in the server's "
        "option file to keep it after a restart), or run init as a user with the SUPER privilege"
    )


#: a SHOW GRANTS line giving SUPER on every database: ALL [PRIVILEGES] or a list naming SUPER, ON *.*
_GRANT_SUPER = re.compile(r"^GRANT\s+(ALL(\s+PRIVILEGES)?|([A-Z_ ]+,\s*)*SUPER(\s*,\s*[A-Z_ ]+)*)\s+ON\s+\*\.\*\s", re.I)


def _guarded_connection(guard: Guard) -> Any:
    """A PyMySQL Connection class whose every read and write on its server (the greeting and the
    login included) is watched by `guard` (dialects/liveness.py): cut when the server stops
    answering, with the guard's message."""
    import pymysql
    from pymysql.constants import CR

    class GuardedConnection(pymysql.connections.Connection):  # type: ignore[misc]
        def _guarded(self, fn: Any, arg: Any) -> Any:
            sock = self._sock
            if sock is None:
                return fn(arg)
            addr: Address = ("unix", self.unix_socket, 0) if self.unix_socket else ("tcp", self.host, int(self.port))
            with guard.waiting(sock.fileno(), addr) as w:
                try:
                    return fn(arg)
                except Exception as e:
                    if w.cut is None:
                        raise
                    self._force_close()
                    # CR_SERVER_LOST: SQLAlchemy takes it for a disconnect and discards the connection
                    raise pymysql.err.OperationalError(CR.CR_SERVER_LOST, guard.message(w)) from e

        def _read_bytes(self, num_bytes: int) -> Any:
            return self._guarded(super()._read_bytes, num_bytes)

        def _write_bytes(self, data: Any) -> Any:
            return self._guarded(super()._write_bytes, data)

    return GuardedConnection


class MySQLDialect(Dialect):
    name = "mysql"
    title = "MySQL"
    caps = Capabilities(
        transactional_ddl=False,  # CREATE/DROP commit implicitly: init is idempotent instead
        max_identifier_length=64,
        identifier_unit="characters",
        placeholder="%s",  # PyMySQL / mysqlclient
        single_writer=False,  # many writers: capture locks only the rows it writes and its own slot
        #: not set-based: its statements would lock rows in another order than applications do and
        #: make them deadlock victims (measured); the planner's path locks rows in key order first
        set_based_apply=False,
        concurrent_capture=True,  # positions below _mm_horizon; keys from a counter
        txn_column=True,  # txn: connection, epoch 0 and the InnoDB transaction id (site.sql _mm_stamp, docs/transactions.md)
        # GET_LOCK's names are server-wide, not per database: the database's name goes into it, so
        # clusters in two databases of one server may each name a site alike (names: 64 characters)
        daemon_lock_sql="SELECT GET_LOCK(CONCAT('mm-daemon-', MD5(CONCAT(%s, '@', DATABASE()))), 0)",
        serial_pk="BIGINT AUTO_INCREMENT PRIMARY KEY",
        log_rid_column="rid",
        bookkeeping_schema=None,  # the site's database
    )

    def quote(self, ident: str) -> str:
        return "`" + ident.replace("`", "``") + "`"

    def concat(self, *parts: str) -> str:
        return "CONCAT(" + ", ".join(parts) + ")"

    def cast_text(self, expr: str) -> str:
        return f"CAST({expr} AS CHAR)"

    def null_safe_eq(self, a: str, b: str) -> str:
        return f"{a} <=> {b}"

    def insert_ignore_into(self, table: str, cols: str, source: str) -> str:
        return f"INSERT IGNORE INTO {table} ({cols}) {source}"

    def insert_new_into(self, table: str, cols: str, source: str, key: str) -> str:
        # not INSERT IGNORE: besides duplicate keys it turns every strict-mode error into a warning
        # and stores the value cut to fit (a TEXT of 100,000 characters as 65,535 bytes)
        return f"INSERT INTO {table} ({cols}) {source} ON DUPLICATE KEY UPDATE {key} = {key}"

    def upsert(self, table: str, row: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        cols = list(row)
        upd = [c for c in cols if c not in keys]
        # not VALUES(col): deprecated in MySQL 8.0.20; the new values are passed again
        return (
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({self.ph(len(cols))}) "
            f"ON DUPLICATE KEY UPDATE {', '.join(f'{c} = %s' for c in upd)}",
            (*row.values(), *(row[c] for c in upd)),
        )

    # ---- connections -----------------------------------------------------------------------
    def engine_kwargs(self, url: str, timeouts: Timeouts | None = None) -> dict[str, Any]:
        # READ COMMITTED: each statement of the reconciler sees what was committed before it, after
        # the locks it waited for (InnoDB's default REPEATABLE READ would read an older snapshot)
        import pymysql.converters as pc
        from pymysql.constants import FIELD_TYPE

        # TIMESTAMP columns hold instants: read them as aware UTC datetimes (sessions run in UTC)
        conv = dict(pc.conversions)
        conv[FIELD_TYPE.TIMESTAMP] = _utc_timestamp
        # connect_timeout bounds the TCP connect; the greeting, the login and every later read or
        # write are watched by the guard (guard_engine), not cut by a socket timeout (read_timeout
        # would cut a statement the server is busy with: it sends nothing until it ends)
        args: dict[str, Any] = {"conv": conv, "connect_timeout": max(1, math.ceil((timeouts or Timeouts()).connect))}
        if _plain_loopback(url):
            args["ssl_disabled"] = True
        return {"isolation_level": _LEVEL, "pool_pre_ping": True, "connect_args": args}

    def guard_engine(self, engine: Engine, timeouts: Timeouts) -> None:
        cls = _guarded_connection(Guard("mysql", timeouts))

        @event.listens_for(engine, "do_connect")
        def _connect(_dialect: Any, _rec: Any, cargs: Any, cparams: Any) -> Any:
            return cls(*cargs, **cparams)

    def prepare_engine(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            cur = dbapi_conn.cursor()
            # strict for every table: a value a column cannot hold fails the statement (held in
            # the error queue, docs/errors.md) instead of being stored cut or clamped with a warning
            # the named lock OWN_LOCK marks the session as multimaster's own (open_writer, any
            # session asks IS_USED_LOCK of it, no privilege needed); held until it disconnects
            cur.execute(
                "SET SESSION time_zone = '+00:00', @mm_applying = NULL, "
                "sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES'), "
                f"@mm_own = GET_LOCK({OWN_LOCK.format('CONNECTION_ID()')}, 0)"
            )
            cur.close()

        @event.listens_for(engine, "reset")
        def _on_reset(dbapi_conn: Any, _rec: Any, _state: Any = None) -> None:
            # a connection going back to the pool never keeps the capture guard set, the checks
            # off, a level other than the engine's (a procedure that left one: _keeping_isolation),
            # or the brief lock waits of a reconciler (lock_writers)
            try:
                cur = dbapi_conn.cursor()
                cur.execute(
                    f"SET @mm_applying = NULL, foreign_key_checks = 1, SESSION tx_isolation = '{_LEVEL.replace(' ', '-')}', "
                    "SESSION innodb_lock_wait_timeout = CAST(coalesce(@mm_rwait, @@SESSION.innodb_lock_wait_timeout) AS UNSIGNED), "
                    "@mm_rwait = NULL"
                )
                _rec.info.pop(BRIEF_NOW, None)
                cur.close()
            except Exception:  # noqa: BLE001 - a broken connection is discarded by the pool anyway
                pass

    def column_collations(self, conn: Connection, table: str) -> dict[str, Collation]:
        from multimaster.dialects.mysql import collations

        return collations.collations(conn, table)

    def exact_collation_sql(self, table: str, col: Column) -> str:
        from multimaster.dialects.mysql import collations

        return collations.exact_sql(table, col, self.quote)

    def explain_rejection(self, conn: Connection, info: TableInfo, e: BaseException) -> str | None:
        """A duplicate key (1062) of an index whose columns' collation takes different texts as one
        value: the value refused, the value a row here holds that it equals under the collation,
        the collation and the fix (docs/mysql.md "Collations"). Before session 35 the queue held
        the driver's bare "Duplicate entry 'A' for key 'PRIMARY'"."""
        from multimaster.dialects.mysql import collations

        dup = collations.duplicate(e)
        if dup is None:
            return None
        value, index = dup
        cols = [
            str(r[0])
            for r in conn.exec_driver_sql(
                "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME = %s AND INDEX_NAME = %s ORDER BY SEQ_IN_INDEX",
                (info.name, index),
            )
        ]
        by = {c.name: c for c in (info.key, *info.columns)}
        loose = [(by[c], coll) for c in cols if c in by and (coll := by[c].collation) is not None and coll.merges]
        q = self.quote
        if not loose:
            return self._identity_collision(conn, info, value)
        what = f"{info.name}.{cols[0]}" if len(cols) == 1 else f"{info.name} ({', '.join(cols)})"
        held = ""
        if len(cols) == 1:
            rows = conn.exec_driver_sql(
                f"SELECT {q(cols[0])} FROM {q(info.name)} WHERE {q(cols[0])} = %s LIMIT 3", (value,)
            ).all()
            if any(r[0] == value for r in rows):
                # the very same text: no collation made it equal (before session 37 this was blamed
                # on the collation's trailing spaces, and the advice to skip lost the transaction)
                return (
                    f"{what} = {value!r}: a row here holds exactly this value, byte for byte (not a collation "
                    "difference). multimaster decides who holds a UNIQUE value by its rule (docs/unique.md); a row "
                    "written here outside it (an application, meanwhile) is decided again by a retry. Fix: retry "
                    "the change; a skip would drop it with every other change of its source transaction at this "
                    "site only, which the other sites keep"
                )
            if rows:
                held = ", ".join(repr(r[0]) for r in rows)
                held = f" the same value as {held}, which a row here holds,"
        sides = "; ".join(f"{c.name}'s collation {coll.name} takes {coll.merges} as one value" for c, coll in loose)
        head = (
            f"{what} = {value!r} is{held or ' a duplicate'} under the column's collation, not as text: {sides}, "
            f'where other databases and multimaster compare texts exactly (docs/mysql.md "Collations"). Fix: '
        )
        if all(coll.pads_only for _, coll in loose):
            return head + (
                "change one of the two values at its origin (trailing spaces trimmed), then skip this change: a skip "
                "drops it with every other change of its source transaction at this site only (listed by 'multimaster "
                "errors' as held with it), which the other sites keep: the sites then differ by them"
            )
        fix = "; ".join(self.exact_collation_sql(info.name, c) for c, _ in loose)
        return head + (
            f"give the column the binary collation here ({fix}), then retry the change; or change one of "
            f"the two values at its origin and skip this one (a skip drops it with every other change of its "
            f"source transaction at this site only, which the other sites keep)"
        )

    def explain_identity_collision(self, conn: Connection, info: TableInfo, e: BaseException) -> str | None:
        from multimaster.dialects.mysql import collations

        dup = collations.duplicate(e)
        return None if dup is None else self._identity_collision(conn, info, dup[0])

    def _identity_collision(self, conn: Connection, info: TableInfo, value: str) -> str | None:
        """A duplicate identity of a natural key in multimaster's own tables, whose collation
        (utf8mb4_bin) ignores trailing spaces: the key 'x ' beside 'x' (identities 'k:x ' and
        'k:x'; identities compare as bytes otherwise, so nothing else collides there)."""
        if info.spec.renumber or not value.startswith("k:"):
            return None
        got = conn.exec_driver_sql(
            f"SELECT rid FROM {self.obj(info.name).shadow} WHERE rid = %s AND CAST(rid AS BINARY) <> CAST(%s AS BINARY) LIMIT 1",
            (value, value),
        ).first()
        other = f"the key {str(got[0])[2:]!r}, which a row here has," if got else "another key of the same source transaction"
        return (
            f"{info.name}: the key {value[2:]!r} differs from {other} only in trailing spaces, which multimaster's own "
            "tables at this site (collation utf8mb4_bin) ignore: keys differing only in trailing spaces cannot both be "
            'held at a MariaDB / MySQL site (docs/mysql.md "Collations"). Fix: change one of the two keys at its origin '
            "(trailing spaces trimmed), then skip this change"
        )

    def json_columns(self, conn: Connection, table: str) -> set[str]:
        """MariaDB's JSON is LONGTEXT with a CHECK (json_valid(col)) (MySQL's own JSON type is
        reflected as JSON already)."""
        from multimaster.dialects import types

        rows = conn.exec_driver_sql(
            "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
            "WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (table,),
        ).all()
        return types.json_checked(str(r[0]) for r in rows)

    def entry_limit(self, conn: Connection) -> int | None:
        """This session's max_allowed_packet: a statement longer than it makes the server drop
        the connection ("server has gone away"), which no retry gets past. Read once per
        connection (a session cannot change its own, and SET GLOBAL changes only later sessions')."""
        if "mm_max_packet" not in conn.info:
            conn.info["mm_max_packet"] = int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())
        return int(conn.info["mm_max_packet"])

    def value_adapters(self, info: TableInfo) -> list[Any]:
        from multimaster.dialects import types

        return [types.adapter(types.NATIVE, types.kind_of(self.name, c)) for c in info.columns]

    def is_retryable(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        args: tuple[Any, ...] = getattr(orig, "args", ())
        return bool(args) and isinstance(args[0], int) and args[0] in _RETRY_CODES

    hides_unreadable = True

    def is_permission_denied(self, exc: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(getattr(exc, "orig", exc), "args", ())
        return bool(args) and args[0] in (1142, 1143, 1044)  # table, column, database access denied

    def names_missing_column(self, exc: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(getattr(exc, "orig", exc), "args", ())
        return bool(args) and args[0] == 1054  # ER_BAD_FIELD_ERROR: Unknown column

    def backend_id(self, dbapi_conn: Any) -> int | None:
        tid = getattr(dbapi_conn, "thread_id", None)  # PyMySQL, mysqlclient: CONNECTION_ID()
        return int(tid()) if callable(tid) else None

    def lock_blockers(self, conn: Connection, backend: int) -> list[Blocker]:
        """InnoDB's lock waits of the session's transaction (rows, gaps, InnoDB table locks) and
        the transactions holding them, each with its connection (PROCESSLIST): MariaDB's
        information_schema.INNODB_LOCK_WAITS, or MySQL 8's performance_schema.data_lock_waits.
        Those name every transaction ahead in the lock's queue, the ones waiting for it too: each
        of them is followed to the transactions at the root of the chain, which wait for nothing
        (core/progress.py lock_roots); those come first, and a queued one follows them as "itself waiting for"
        its roots (before, a queued application was named as the holder: the soak's D5).
        Waiting for another lock (a metadata lock of DDL or LOCK TABLES, GET_LOCK): the session's
        state names it, not its holder. Needs the PROCESS privilege."""
        edges = self._lock_waits(conn)
        roots, queued = lock_roots(edges, backend)
        out = self._trx_sessions(conn, roots, {})
        out += self._trx_sessions(conn, set(queued), queued)
        if out:
            return out
        state = conn.exec_driver_sql("SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = %s", (backend,)).scalar()
        if state and str(state).lower().startswith("waiting for") and "lock" in str(state).lower():
            return [Blocker(state=str(state))]  # e.g. "Waiting for table metadata lock"
        return []

    @staticmethod
    def _lock_waits(conn: Connection) -> dict[int, set[int]]:
        """Every InnoDB lock wait now, as the connections each waiting connection waits for."""
        from sqlalchemy.exc import DBAPIError

        sql = (
            "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id FROM {} "
            "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.{} "
            "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.{}"
        )
        waits = (
            sql.format("information_schema.INNODB_LOCK_WAITS w", "requesting_trx_id", "blocking_trx_id"),
            # MySQL 8.0 dropped INNODB_LOCK_WAITS for performance_schema
            sql.format(
                "performance_schema.data_lock_waits w", "REQUESTING_ENGINE_TRANSACTION_ID", "BLOCKING_ENGINE_TRANSACTION_ID"
            ),
        )
        for i, q in enumerate(waits):
            try:
                rows = conn.exec_driver_sql(q).all()
                break
            except DBAPIError as e:  # 1109: unknown table (the other server kind)
                orig = getattr(e, "orig", e)
                if i == len(waits) - 1 or getattr(orig, "args", (None,))[0] not in (1109, 1146):
                    raise
                conn.rollback()
        edges: dict[int, set[int]] = {}
        for r, b in rows:
            if r is not None and b is not None and int(r) != int(b):
                edges.setdefault(int(r), set()).add(int(b))
        return edges

    @staticmethod
    def _trx_sessions(conn: Connection, ids: set[int], waiting_for: dict[int, list[int]]) -> list[Blocker]:
        """The open transactions of connections `ids` (the oldest first), a session of
        multimaster's own said so (OWN_LOCK); one of `waiting_for` said to wait for its roots."""
        if not ids:
            return []
        own = f"IS_USED_LOCK({OWN_LOCK.format('b.trx_mysql_thread_id')}) <=> b.trx_mysql_thread_id"
        rows = conn.exec_driver_sql(
            f"SELECT b.trx_mysql_thread_id, p.USER, p.HOST, p.COMMAND, p.STATE, {own}, "
            "TIMESTAMPDIFF(MICROSECOND, b.trx_started, NOW(6)) / 1000000, COALESCE(b.trx_query, p.INFO) "
            "FROM information_schema.INNODB_TRX b LEFT JOIN information_schema.PROCESSLIST p ON p.ID = b.trx_mysql_thread_id "
            f"WHERE b.trx_mysql_thread_id IN ({', '.join(str(int(c)) for c in sorted(ids))}) "
            "ORDER BY b.trx_started, b.trx_mysql_thread_id"
        ).all()
        out = []
        for tid, user, host, command, state, mine, age, query in rows:
            who = ", ".join((["multimaster's own session"] if mine else []) + ([f"user {user}"] if user else []))
            doing = state or (str(command).lower() if command else None)
            if int(tid) in waiting_for:
                roots = waiting_for[int(tid)]
                doing = "itself waiting for " + (", ".join(f"connection {c}" for c in roots) if roots else "a lock")
            out.append(
                Blocker(
                    session=f"connection {tid}",
                    who=who or None,
                    client=host or None,
                    state=doing,
                    txn_seconds=None if age is None else float(age),
                    query=query or None,
                )
            )
        return out

    def temp_rids(self, conn: Connection) -> str:
        conn.exec_driver_sql(
            "CREATE TEMPORARY TABLE IF NOT EXISTS _mm_tmp_rids (rid VARCHAR(255) PRIMARY KEY) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        return "_mm_tmp_rids"

    def create_temp(self, conn: Connection, name: str, select: str, keys: str | None = None, index: str | None = "rid") -> None:
        # CREATE INDEX and a DROP TABLE without TEMPORARY commit implicitly in MySQL: keys are
        # declared in the CREATE TEMPORARY TABLE itself, drops say TEMPORARY
        self.drop_temp(conn, name)
        conn.exec_driver_sql(self.temp_ddl(name, select, keys, index))

    #: the generated primary key of a scratch table without a natural one (readers name their columns)
    TEMP_ROW_ID = "_mm_row"

    def temp_ddl(self, name: str, select: str, keys: str | None = None, index: str | None = "rid") -> str:
        """CREATE TEMPORARY TABLE ... SELECT with a primary key (MySQL 8.0.13+ with
        ``sql_require_primary_key = ON`` refuses tables without one, temporary ones too): `keys`
        when given (never NULL), else a generated AUTO_INCREMENT column, declared first."""
        parts = [f"PRIMARY KEY ({keys})"] if keys else [f"{self.TEMP_ROW_ID} BIGINT AUTO_INCREMENT PRIMARY KEY"]
        if index and index != keys and f" {index}" in select.replace(",", " ").replace(".", " "):
            parts.append(f"INDEX ({index})")
        return f"CREATE TEMPORARY TABLE {name} ({', '.join(parts)}) ENGINE=InnoDB {select}"

    def bulk_update(self, conn: Connection, table: str, set_cols: list[str], where_col: str, rows: list[tuple[Any, ...]]) -> None:
        # PyMySQL sends an UPDATE executemany row by row: load the values with one batched
        # multi-row INSERT into a scratch table (typed like the target) and join once
        if len(rows) < 64:
            return super().bulk_update(conn, table, set_cols, where_col, rows)
        tmp = "`_mm_tmp_upd`"
        names = [f"v{i}" for i in range(len(set_cols))]
        sel = ", ".join(f"t.{c} AS {n}" for c, n in zip(set_cols, names))
        self.create_temp(conn, tmp, f"SELECT {sel}, t.{where_col} AS w FROM {table} t WHERE 1 = 0", index=None)
        conn.exec_driver_sql(f"INSERT INTO {tmp} ({', '.join(names)}, w) VALUES ({self.ph(len(names) + 1)})", rows)
        sets = ", ".join(f"{table}.{c} = u.{n}" for c, n in zip(set_cols, names))
        conn.exec_driver_sql(f"UPDATE {table} JOIN {tmp} u ON {table}.{where_col} = u.w SET {sets}")
        self.drop_temp(conn, tmp)

    def update_from(self, conn: Connection, target: str, sets: list[str], from_clause: str, where: str) -> None:
        conn.exec_driver_sql(f"UPDATE {target} JOIN {from_clause} ON {where} SET {', '.join(sets)}")

    def drop_temp(self, conn: Connection, name: str) -> None:
        conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {name}")

    # ---- install ---------------------------------------------------------------------------
    def install_site(self, conn: Connection, site: str) -> None:
        if self._table_type(conn, "_mm_tick") == "BASE TABLE":
            # a site installed before this change (2026-11-27): its clock learns to name transactions (site.sql);
            # the ALTER keeps the counter (AUTO_INCREMENT). It runs in autocommit mode (it commits
            # anyway): outside it MariaDB 10.11 records the ALTER's transaction in
            # mysql.transaction_registry twice and fails with a duplicate key
            conn.exec_driver_sql("SET autocommit = 1")
            try:
                conn.exec_driver_sql(
                    "ALTER TABLE _mm_tick ADD COLUMN trx BIGINT UNSIGNED GENERATED ALWAYS AS ROW START INVISIBLE, "
                    "ADD COLUMN trx_end BIGINT UNSIGNED GENERATED ALWAYS AS ROW END INVISIBLE, "
                    "ADD PERIOD FOR SYSTEM_TIME(trx, trx_end), ADD SYSTEM VERSIONING"
                )
            finally:
                conn.exec_driver_sql("SET autocommit = 0")
        self.run_install(conn, self.render("site", slack=str(CLOCK_SLACK)))
        conn.exec_driver_sql("INSERT INTO _mm_state (id, site) VALUES (1, %s) ON DUPLICATE KEY UPDATE id = id", (site,))
        # the clock starts past every version an earlier layout gave (capture keeps it at or past
        # the wall clock itself)
        floor = conn.exec_driver_sql(
            "SELECT GREATEST((SELECT coalesce(max(hlc), 0) FROM _mm_clock), (SELECT hlc FROM _mm_state WHERE id = 1))"
        ).scalar()
        self._sync_clock(conn, int(floor or 0))

    @staticmethod
    def _table_var(prefix: str, table: str) -> str:
        """A session variable of `table`'s own, `@<prefix>_<hash>`: a name of fixed length,
        whatever the table's, that no other table's triggers set."""
        return f"@{prefix}_" + hashlib.sha1(table.encode()).hexdigest()[:16]

    @classmethod
    def _slot_flag(cls, table: str) -> str:
        """The session variable telling that this connection's slot of `table` exists."""
        return cls._table_var("mm_s", table)

    @classmethod
    def _position_var(cls, table: str) -> str:
        """The session variable through which the key trigger of renumbered `table` hands the
        position it drew for a row to the insert trigger of the same row (renumber.sql,
        capture.sql): one per table, so a trigger of another table firing in between cannot
        overwrite it."""
        return cls._table_var("mm_h", table)

    #: the wall clock in clock units (ms * 65536), as the capture triggers read it
    WALL = "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536"

    def _draw(self, table: str, gated: bool = False) -> str:
        """Trigger SQL drawing the next position into @mm_p through this connection's slot of
        `table` (site.sql _mm_slots, _mm_draw): one UPDATE locks the slot, then draws the position
        into its cur (InnoDB locks the row before it evaluates SET). A connection's first capture
        of the table inserts its slot with INSERT ... ON DUPLICATE KEY UPDATE (an UPDATE that
        misses would leave a gap lock), then draws. `gated` (the key trigger of a renumbered table,
        before the row is inserted): a slot not created through the table's gate passes it first
        (LOCK IN SHARE MODE), so a local insert cannot start while the reconciler holds the gate
        (lock_writers); updates and deletes, which have locked their row already, never wait there.
        The session variable is 1 for a slot known to exist, 2 once it passed the gate.
        The entry's txn is the connection and epoch 0, completed with its transaction's id by a
        reader (site.sql _mm_stamp, docs/transactions.md): no epoch is read, and no table but the
        slots (and the gate) is named here; every table a trigger names costs every statement
        that fires it, whichever branch runs."""
        t, flag = _lit(table), self._slot_flag(table)
        upd = f"UPDATE _mm_slots SET cur = (@mm_p := _mm_draw()) WHERE tbl = {t} AND conn = CONNECTION_ID();"
        known = f"{flag} = 2" if gated else f"{flag} >= 1"
        lines = ["SET @mm_p = NULL;", f"IF {known} THEN", f"  {upd}", "END IF;", "IF @mm_p IS NULL THEN"]
        if gated:
            lines.append(f"  SELECT 1 INTO @mm_gate FROM _mm_gates WHERE tbl = {t} LOCK IN SHARE MODE;")
        lines += [
            f"  INSERT INTO _mm_slots (tbl, conn, lo, cur) VALUES ({t}, CONNECTION_ID(), _mm_draw(), 0)",
            "    ON DUPLICATE KEY UPDATE cur = (@mm_p := _mm_draw());",
            "  IF @mm_p IS NULL THEN",
            f"    {upd}",
            "  END IF;",
            f"  SET {flag} = {2 if gated else 1};",
            "END IF;",
        ]
        return "\n      ".join(lines)

    def _sync_clock(self, conn: Connection, at_least: int) -> None:
        """Move the clock (_mm_tick's AUTO_INCREMENT) past `at_least`. The counter is drawn first
        and, only when it is not past already, an explicit value moves it. Drawing first keeps the
        explicit insert, which would wait for an open writer's transaction that holds the same
        value, off the common path (site.sql _mm_draw). Both rows stay until a pull's trim: a row
        deleted here would let a writer's explicit value go in again at the same value, and a
        position must be the one row of the clock at its value (site.sql _mm_draw, _mm_stamp)."""
        conn.exec_driver_sql("INSERT INTO _mm_tick (t) VALUES (NULL)")
        drawn = int(conn.exec_driver_sql("SELECT LAST_INSERT_ID()").scalar() or 0)
        if drawn > at_least:
            return
        conn.exec_driver_sql("INSERT IGNORE INTO _mm_tick (t) VALUES (%s)", (int(at_least),))

    @staticmethod
    def _table_type(conn: Connection, name: str) -> str | None:
        """information_schema's TABLE_TYPE of `name` here: BASE TABLE, VIEW, SYSTEM VERSIONED (the
        clock, site.sql), None when there is none."""
        kind = conn.exec_driver_sql(
            "SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", (name,)
        ).scalar()
        return None if kind is None else str(kind)

    def read_table_kind(self, conn: Connection, name: str) -> str | None:
        kind = self._table_type(conn, name)
        return None if kind is None else "view" if kind == "VIEW" else "table"

    def read_table_kinds(self, conn: Connection, names_: Sequence[str]) -> dict[str, str]:
        rows = conn.exec_driver_sql(
            "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
            f"AND TABLE_NAME IN ({', '.join(['%s'] * len(names_))})",
            tuple(names_),
        )
        return {str(n): "view" if k == "VIEW" else "table" for n, k in rows}

    def install_problems(self, conn: Connection, tables: Sequence[str]) -> list[str]:
        """Found before init writes anything, since MySQL's DDL cannot be rolled back: the base's
        (an earlier layout), a user who may not trim the clock's history (DELETE HISTORY), and
        capture triggers that could not be created (binary logging on, creators not trusted, no
        SUPER)."""
        out = super().install_problems(conn, tables)
        drop = self._drop_problem(conn)
        if drop:  # the scratch tables below could not be dropped again: not made
            out.append(drop)
        else:
            rows = self._rows_problem(conn)
            out += [rows] if rows else []
            history = self._history_problem(conn)
            out += [history] if history else []
        routines = self._routine_problem(conn)
        out += [routines] if routines else []
        row = conn.exec_driver_sql("SELECT @@log_bin, @@log_bin_trust_function_creators").one()
        log_bin, trust = _on(row[0]), _on(row[1])
        if not log_bin or trust:
            return out  # no need to look at privileges
        msg = trigger_privilege_problem(log_bin, trust, self.has_super(conn))
        return out + ([msg] if msg else [])

    def _rows_problem(self, conn: Connection) -> str | None:
        """init and every refresh read and write their own tables (`_mm_state`, the change logs,
        the snapshots...) and the replicated ones: SELECT, INSERT, UPDATE and DELETE on the
        database, which a list of DDL grants lacks (session 33: init stopped at `_mm_state` with
        the driver's 1142, tables made, and a second init refused the site as half-installed), and
        LOCK TABLES, with which init holds a table while its capture starts (starting_capture).
        Tried on a scratch table, each statement apart, so every privilege missing is named."""
        probe = "_mm_probe_rows"
        missing: list[str] = []
        try:
            conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {probe} (id INT PRIMARY KEY) ENGINE=InnoDB")
            for priv, sql in (
                ("SELECT", f"SELECT id FROM {probe} WHERE id = 1"),
                ("INSERT", f"INSERT INTO {probe} (id) VALUES (1)"),
                ("UPDATE", f"UPDATE {probe} SET id = 2 WHERE id = 1"),
                ("DELETE", f"DELETE FROM {probe} WHERE id = 2"),
                ("LOCK TABLES", f"LOCK TABLES {probe} WRITE"),  # (starting_capture)
            ):
                try:
                    conn.exec_driver_sql(sql)
                except DBAPIError as e:
                    if not (e.orig is not None and e.orig.args and e.orig.args[0] in (1142, 1143, 1044)):
                        raise
                    missing.append(priv)
        except DBAPIError as e:
            if not (e.orig is not None and e.orig.args and e.orig.args[0] in (1142, 1044)):
                raise
            missing = ["CREATE"]  # (the list of grants says which: CREATE, then the rest)
        finally:
            with suppress(DBAPIError):
                conn.exec_driver_sql("UNLOCK TABLES")
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {probe}")
        if not missing:
            return None
        return self._grant_needed(
            conn, ", ".join(missing),
            "multimaster reads and writes its own tables there and the replicated ones, and holds a table's writers back "
            "while its capture starts (LOCK TABLES; docs/mysql.md)",
            ", ".join(missing),
        )  # fmt: skip

    def _grant_needed(self, conn: Connection, may_not: str, why: str, grant: str) -> str:
        """An install problem: the user running init may not do `may_not` in this database, `why`
        it must, and the GRANT an administrator runs."""
        user = str(conn.exec_driver_sql("SELECT CURRENT_USER()").scalar())
        name, _, host = user.rpartition("@")
        db = self.quote(str(conn.exec_driver_sql("SELECT DATABASE()").scalar()))
        return (
            f"the user running init, {user}, may not {may_not} in {db}: {why}. As an administrator: "
            f"GRANT {grant} ON {db}.* TO '{name}'@'{host}'"
        )

    def _drop_problem(self, conn: Connection) -> str | None:
        """multimaster drops what it made (its views and tables replaced by init, recapture and
        uninstall) and the scratch tables of the checks below: DROP on the database, which a list
        of grants may lack. Tried with a DROP TABLE IF EXISTS of a table that does not exist (the
        privilege is checked first, a role's included), so nothing is made that could not be
        dropped again (until session 34 init made the scratch tables, failed to drop them with the
        driver's 1142, naming no site, and left them behind)."""
        try:
            conn.exec_driver_sql("DROP TABLE IF EXISTS _mm_probe_drop")
        except DBAPIError as e:
            if not (e.orig is not None and e.orig.args and e.orig.args[0] in (1142, 1044)):
                raise
            return self._grant_needed(
                conn, "DROP", "multimaster drops the views and tables it replaces, and uninstall drops all it made", "DROP"
            )
        return None

    def _history_problem(self, conn: Connection) -> str | None:
        """The clock is system-versioned and the horizon, running as the user who ran init, trims
        its history with DELETE HISTORY (site.sql), a privilege of its own that explicit grants
        often lack (ALL PRIVILEGES has it). Tried on a scratch table, so a privilege held through
        a role counts too; the table is dropped again at once."""
        probe = "_mm_probe_history"
        try:
            conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {probe} (id INT PRIMARY KEY) ENGINE=InnoDB WITH SYSTEM VERSIONING")
            conn.exec_driver_sql(f"DELETE HISTORY FROM {probe}")
        except DBAPIError as e:
            if not (e.orig is not None and e.orig.args and e.orig.args[0] in (1142, 1044)):
                raise
            return self._grant_needed(
                conn, "DELETE HISTORY",
                'the clock _mm_tick is system-versioned and every pull trims its history (docs/mysql.md "The transaction registry")',
                "DELETE HISTORY",
            )  # fmt: skip
        finally:
            with suppress(DBAPIError):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {probe}")
        return None

    def _routine_problem(self, conn: Connection) -> str | None:
        """init creates a function (`_mm_draw`, called by every capture trigger) and procedures
        (`_mm_horizon`, `_mm_stamp`, called by every reader): CREATE ROUTINE, and ALTER ROUTINE
        and EXECUTE to replace and call them, privileges a list of grants often lacks. Tried on a
        scratch function, so a privilege held through a role counts too, before anything is
        written (until session 32 init stopped at `_mm_draw` with the driver's error, tables made
        and no triggers, and a second init refused the site as half-installed). Where binary logging
        keeps a user without SUPER from creating routines at all (error 1419), the trigger check
        below says so instead."""
        probe = "_mm_probe_routine"
        try:
            conn.exec_driver_sql(f"CREATE OR REPLACE FUNCTION {probe}() RETURNS INT DETERMINISTIC NO SQL RETURN 1")
            conn.exec_driver_sql(f"SELECT {probe}()")
            conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {probe}")
        except DBAPIError as e:
            code = e.orig.args[0] if e.orig is not None and e.orig.args else None
            if code == 1419:
                return None
            if code not in (1044, 1142, 1370):
                raise
            return self._grant_needed(
                conn, "create, replace and call routines",
                "capture draws through the function _mm_draw and every reader calls the procedures _mm_horizon and "
                "_mm_stamp (docs/mysql.md)",
                "CREATE ROUTINE, ALTER ROUTINE, EXECUTE",
            )  # fmt: skip
        return None

    def has_super(self, conn: Connection) -> bool:
        """The current user holds SUPER globally: a row of information_schema.USER_PRIVILEGES for
        CURRENT_USER(), else a line of SHOW GRANTS (``ALL PRIVILEGES`` or a list naming SUPER, ``ON *.*``)."""
        user, _, host = str(conn.exec_driver_sql("SELECT CURRENT_USER()").scalar() or "").rpartition("@")
        if (
            conn.exec_driver_sql(
                "SELECT 1 FROM information_schema.USER_PRIVILEGES WHERE PRIVILEGE_TYPE = 'SUPER' AND GRANTEE = %s",
                (f"'{user}'@'{host}'",),
            ).first()
            is not None
        ):
            return True
        try:
            grants = [str(r[0]) for r in conn.exec_driver_sql("SHOW GRANTS").all()]
        except Exception:  # noqa: BLE001 - cannot tell beyond USER_PRIVILEGES
            return False
        return any(_GRANT_SUPER.match(g) for g in grants)

    long_text = "LONGTEXT"
    version_type = "VARCHAR(255)"

    def column_signature(self, conn: Connection, table: str) -> str:
        rows = conn.exec_driver_sql(
            "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (table,),
        ).all()
        return repr([tuple(r) for r in rows])

    def lock_table_writes(self, conn: Connection, table: str) -> None:
        """Every row of `table` and the gaps between them (a locking read of the whole key index
        takes next-key locks up to the supremum): updates, deletes and inserts wait."""
        for _ in conn.exec_driver_sql(f"SELECT 1 FROM {self.quote(table)} FOR UPDATE"):
            pass

    applying_flag = "@mm_applying"
    applying_marker = "@mm_applying"

    def trigger_texts(self, conn: Connection, table: str) -> dict[str, str]:
        rows = conn.exec_driver_sql(
            "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS "
            "WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = %s",
            (table,),
        )
        return {str(r[0]): str(r[1]) for r in rows}

    def table_signature(self, conn: Connection, table: str) -> str:
        """As every dialect's, and a digest of the text of its capture triggers, read in the same
        statement as which exist: capture triggers made again in another text (of another schema
        version, another release, by hand) read as a change the follow looks at (engine/evolve.py:
        where DDL commits at once, a schema version can be recorded and its capture not made)."""
        return capture_text_signature(self.column_signature(conn, table), table, self.trigger_texts(conn, table))

    def triggers_on(self, conn: Connection, table: str) -> set[str]:
        rows = conn.exec_driver_sql(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS "
            "WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = %s",
            (table,),
        )
        return {str(r[0]) for r in rows}

    #: tables whose signatures table_signatures reads in one statement per kind
    SIGNATURES_AT_ONCE = 50

    def table_signatures(self, conn: Connection, tables: Sequence[str]) -> dict[str, str]:
        """:meth:`table_signature` of each of `tables`, one statement per kind (and per
        SIGNATURES_AT_ONCE tables): column_signature's and trigger_texts's SELECT once per table,
        joined by UNION ALL (each keeps its lookup by name in information_schema, which an IN list
        would turn into a read of every table of the database)."""
        out: dict[str, str] = {}
        for start in range(0, len(tables), self.SIGNATURES_AT_ONCE):
            part = list(tables[start : start + self.SIGNATURES_AT_ONCE])
            cols: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(len(part))}
            sql = " UNION ALL ".join(
                f"SELECT {i} AS mm_i, ORDINAL_POSITION, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT "
                "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
                for i in range(len(part))
            )
            for r in conn.exec_driver_sql(sql + " ORDER BY mm_i, ORDINAL_POSITION", tuple(part)):
                cols[int(r[0])].append(tuple(r[2:]))
            trig: dict[int, dict[str, str]] = {i: {} for i in cols}
            sql = " UNION ALL ".join(
                f"SELECT {i} AS mm_i, TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS "
                "WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = %s"
                for i in range(len(part))
            )
            for i, name, body in conn.exec_driver_sql(sql, tuple(part)):
                trig[int(i)][str(name)] = str(body)
            for i, t in enumerate(part):  # as table_signature gives them
                out[t] = capture_text_signature(repr(cols[i]), t, trig[i])
        return out

    def retype_column(self, conn: Connection, obj: str, col: str, type_sql: str) -> None:
        conn.exec_driver_sql(f"ALTER TABLE {obj} MODIFY COLUMN {self.quote(col)} {type_sql}")

    def _keytype(self, info: TableInfo) -> str:
        t = info.key.type_sql
        # a TEXT key cannot be indexed without a length: the shadow keeps it as VARCHAR
        return "VARCHAR(255)" if t.upper().endswith("TEXT") else t

    def install_table(self, conn: Connection, info: TableInfo) -> None:
        self._check_names(info)
        q = self.quote
        slotcols = "".join(f",\n  {q('v_' + s.name)} VARCHAR(255)" for s in info.spec.slots)
        natural = not info.spec.renumber
        # a natural key has one shadow row per incarnation (docs/conflicts.md): indexed, not unique
        keyindex = f"KEY {q(shadow_key_index(info.name))} (`key`)" if natural else "UNIQUE KEY (`key`)"
        o = self.obj(info.name)
        stmts = self.render(
            "table",
            table=q(info.name),
            tbl_lit=_lit(info.name),
            keytype=self._keytype(info),
            logcols=self._log_cols(info),
            slotcols=slotcols,
            keyindex=keyindex,
            **o.mapping(),
        )
        self.run_install(conn, stmts)
        if natural:
            # an earlier layout kept one shadow row per natural key (UNIQUE key): replace that index
            idx = conn.exec_driver_sql(
                "SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s "
                "AND NON_UNIQUE = 0 AND INDEX_NAME <> 'PRIMARY' GROUP BY INDEX_NAME "
                "HAVING count(*) = 1 AND max(COLUMN_NAME) = 'key'",
                (names(info.name).shadow,),
            ).all()
            for (name,) in idx:
                conn.exec_driver_sql(f"ALTER TABLE {o.shadow} DROP INDEX {q(name)}")
            if (
                idx
                and not conn.exec_driver_sql(
                    "SELECT 1 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND INDEX_NAME = %s",
                    (names(info.name).shadow, shadow_key_index(info.name)),
                ).first()
            ):
                conn.exec_driver_sql(f"ALTER TABLE {o.shadow} ADD INDEX {q(shadow_key_index(info.name))} (`key`)")

    def capture_without(self, conn: Connection, info: TableInfo, columns: Collection[str]) -> None:
        self.install_capture(conn, info, absent=frozenset(columns))

    def install_capture(self, conn: Connection, info: TableInfo, absent: Collection[str] = ()) -> None:
        """The capture triggers of `info`; `absent`: columns they must not name (capture_without)."""
        q = self.quote
        o = self.obj(info.name)
        key = q(info.key.name)
        spec = info.spec
        cols = info.columns
        site = _lit(str(conn.exec_driver_sql("SELECT site FROM _mm_state").scalar()))

        def differs(c: Any) -> str:
            if c.name in absent:
                return "FALSE"
            return f"NOT ({as_bytes(c.type_sql, 'OLD.' + q(c.name))} <=> {as_bytes(c.type_sql, 'NEW.' + q(c.name))})"

        own = [differs(c) for c in cols]
        anychanged = " OR ".join(own) if own else "FALSE"
        fr = capture_fragments(q, cols, spec, "NEW", "OLD", own, absent)
        allmask = spec.all_mask & ~sum(1 << i for i, c in enumerate(cols) if c.name in absent)
        diff = fr["diff"]
        updmask = " | ".join(f"((CASE WHEN {d} THEN 1 ELSE 0 END) << {i})" for i, d in enumerate(diff)) if diff else "0"
        stamps = []
        for s in spec.slots:
            vcol = q("v_" + s.name)
            stamps.append(f"{vcol} = CASE WHEN {diff[s.columns[0]]} THEN mm_v ELSE {vcol} END")
        # the heads an update supersedes (docs/conflicts.md "Concurrent heads"), read below
        clear, sup = self.heads_capture(spec, lambda s: diff[s.columns[0]])
        stamps += clear
        slotstamp = "".join(", " + s for s in stamps)
        if spec.renumber:
            insrid, ridvar, ridinit, live = "mm_v", "", "", ""
            shadowins = f"\n    INSERT INTO {o.shadow} (rid, `key`) VALUES (mm_v, NEW.{key});"
        else:
            # a natural key's incarnation (docs/conflicts.md): its first life is 'k:' || key, a later
            # one 'k:' || key || '@' || the highest delete version held for its earlier lives; one
            # still live here (never, short of a capture gap) ends at this insert's version. The
            # first life's shadow row goes in without a read (ON DUPLICATE KEY tells it was there)
            insrid = "mm_r"
            ridvar = "\n  DECLARE mm_r VARCHAR(255);"
            slotnames = "".join(f", {q('v_' + s.name)}" for s in spec.slots)
            slotinit = "".join(", mm_v" for _ in spec.slots)
            ins = f"INSERT INTO {o.shadow} (rid, `key`{slotnames}) VALUES (mm_r, NEW.{key}{slotinit})"
            ridinit = (
                f"\n    SET mm_r = CONCAT('k:', CAST(NEW.{key} AS CHAR)), @mm_dup = NULL;"
                f"\n    {ins} ON DUPLICATE KEY UPDATE rid = (@mm_dup := rid);"
                "\n    IF @mm_dup IS NOT NULL THEN"
                f"\n      SET mm_r = CONCAT(mm_r, coalesce(CONCAT('@', (SELECT CASE WHEN "
                f"max(deleted IS NULL) = 1 THEN mm_v ELSE max(deleted) END FROM {o.shadow} WHERE `key` = NEW.{key})), ''));"
                f"\n      UPDATE {o.shadow} SET deleted = mm_v WHERE `key` = NEW.{key} AND deleted IS NULL;"
                f"\n      {ins};"
                "\n    END IF;"
            )
            shadowins = ""
            # updates and deletes act on the live incarnation
            live = " AND deleted IS NULL"
        msg = (
            f"multimaster: the key column {info.key.name} of {info.name} is managed by replication and cannot be "
            "updated; delete and insert the row instead"
        )
        supcol = supval = supread = ""
        if sup is not None:  # read before the shadow's UPDATE clears the heads it supersedes
            supread = f"\n    SET @mm_sup = (SELECT {sup} FROM {o.shadow} WHERE `key` = NEW.{key}{live});"
            supcol, supval = ", sup", ", @mm_sup"
        rank = self.quote("_mm_rank_" + info.name)
        draw = self._draw(info.name)
        # the position the key trigger drew for this very row (renumbered tables; renumber.sql)
        posvar = self._position_var(info.name)
        insdraw = f"SET @mm_p = {posvar}, {posvar} = NULL;" if spec.renumber else draw
        stmts = self.render(
            "capture",
            **fr,
            sv=str(int(info.version)),
            table=q(info.name),
            tbl_lit=_lit(info.name),
            key=key,
            site_lit=site,
            insrid=insrid,
            insdraw=insdraw,
            posvar=posvar,
            allmask=str(allmask),
            anychanged=anychanged,
            updmask=updmask,
            slotstamp=slotstamp,
            supcol=supcol,
            supval=supval,
            supread=supread,
            ridvar=ridvar,
            ridinit=ridinit,
            shadowins=shadowins,
            live=live,
            keyguard_msg=_lit(msg[:128]),
            draw=draw,
            **o.mapping(),
        )
        if spec.renumber:
            # the key trigger first: the insert trigger of the release before still finds the
            # position it reads (renumber.sql)
            stmts = (
                self.render(
                    "renumber",
                    table=q(info.name),
                    tbl_lit=_lit(info.name),
                    key=key,
                    rank=rank,
                    draw=self._draw(info.name, gated=True),
                    keyseq=o.keyseq,
                    posvar=posvar,
                )
                + stmts
            )
            self._key_counter(conn, info)  # past every key before the key trigger draws from it
        else:
            stmts += [f"DROP TRIGGER IF EXISTS {rank}"]
        _run_keeping_unchanged(conn, stmts)
        # where _mm_stamp completes the entries' txn (site.sql); a table made again keeps its upto
        conn.exec_driver_sql(
            "INSERT INTO _mm_stamps (tbl, log) VALUES (%s, %s) ON DUPLICATE KEY UPDATE log = %s", (info.name, o.log, o.log)
        )
        if spec.renumber:
            self.after_apply(conn, info)  # the key counter starts past every key

    @contextmanager
    def starting_capture(self, conn: Connection, info: TableInfo) -> Iterator[None]:
        """MariaDB commits DDL as it goes, so init's install of a table is not one transaction, and
        applications wrote between its steps: an insert into a renumbered table after its key
        trigger existed and before the key counter was moved past every key failed with a
        duplicate key (1062), and a row inserted after the base rows got their identities and
        before the capture triggers existed was captured by no one, its updates and deletes
        failing with `Column 'rid' cannot be null` (1048) ever after (session 34). So the table
        and what the steps write are held with LOCK TABLES ... WRITE, which the DDL's implicit
        commits do not give back: the table's writers wait (a metadata-lock wait) until UNLOCK
        TABLES, which commits. What the steps did since their last commit is rolled back first when
        they fail. Only where the table's capture is not complete: init run again on a site in
        use swaps each changed trigger in one statement (_run_keeping_unchanged), holding no
        writer back for longer."""
        if self._capture_complete(conn, info):
            yield
            return
        o = self.obj(info.name)
        held = [f"{self.quote(info.name)} WRITE", f"{o.shadow} WRITE", "_mm_tables WRITE", "_mm_stamps WRITE", "_mm_state READ"]
        if info.spec.renumber:
            self._key_counter(conn, info)  # (made first: LOCK TABLES locks what exists)
            held.append(f"{o.keyseq} WRITE")
        self._lock_tables(conn, held)
        try:
            yield
        except BaseException:
            with suppress(DBAPIError):
                conn.exec_driver_sql("ROLLBACK")
                self._unlock_tables(conn)
            raise
        self._unlock_tables(conn)

    def _capture_complete(self, conn: Connection, info: TableInfo) -> bool:
        """Every capture trigger of `info` exists (and the key trigger of a renumbered table)."""
        o = names(info.name)
        want = {o.cap_i, o.cap_u, o.cap_d} | ({"_mm_rank_" + info.name} if info.spec.renumber else set())
        return want <= self.triggers_on(conn, info.name)

    def _lock_tables(self, conn: Connection, held: Sequence[str]) -> None:
        """LOCK TABLES `held`, each try waiting at most DDL_LOCK_WAIT for the metadata locks of the
        transactions open on them (short_ddl_waits: the applications' statements queue behind a
        waiting LOCK TABLES, and one whose transaction holds the table while it waits for a row
        another holds is a cycle no deadlock check sees), again after a backoff while that wait is
        what fails it (START_LOCK_TRIES)."""
        delay = 0.02
        for attempt in range(START_LOCK_TRIES):
            try:
                with self.short_ddl_waits(conn):
                    conn.exec_driver_sql("LOCK TABLES " + ", ".join(held))
                return
            except DBAPIError as e:
                if attempt == START_LOCK_TRIES - 1 or not self.is_retryable(e):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    @staticmethod
    def _unlock_tables(conn: Connection) -> None:
        """UNLOCK TABLES (it commits); a session that could not is never used again (a pooled
        connection still holding tables would hold back their writers)."""
        try:
            conn.exec_driver_sql("UNLOCK TABLES")
        except DBAPIError:
            conn.invalidate()
            raise

    def _key_counter(self, conn: Connection, info: TableInfo) -> None:
        """The key counter of renumbered `info` (a CYCLE sequence, made where it is missing), at or
        past every key the table and its shadow hold."""
        if self._table_type(conn, names(info.name).keyseq) is None:
            conn.exec_driver_sql(
                f"CREATE SEQUENCE IF NOT EXISTS {self.obj(info.name).keyseq} START WITH 1 MINVALUE 0 "
                "MAXVALUE 9223372036854775806 INCREMENT BY 1 CACHE 100 CYCLE"
            )
        self._counter_forward(conn, info, self._key_top(conn, info))

    def guard_writes(self, conn: Connection, info: TableInfo, site: str, read_only: bool) -> None:
        o = self.obj(info.name)
        if not read_only:
            return self.drop_triggers(conn, info.name, (o.ro_i, o.ro_u, o.ro_d))
        rank = "_mm_rank_" + info.name  # the key trigger of a renumbered table (renumber.sql)
        has_rank = conn.exec_driver_sql(
            "SELECT 1 FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = %s", (rank,)
        ).first()
        stmts = self.render(
            "readonly",
            table=self.quote(info.name),
            message=_lit(read_only_message(site, info.name)[:128]),  # MESSAGE_TEXT holds 128 characters
            precedes=f"PRECEDES {self.quote(rank)}" if has_rank else "",
            **o.mapping(),
        )
        _run_keeping_unchanged(conn, stmts)

    def uninstall(self, conn: Connection, tables: Sequence[str], peers: Sequence[str]) -> list[str]:
        dropped: list[str] = []
        pat = "\\_mm\\_%"
        for (name,) in conn.exec_driver_sql(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME LIKE %s "
            "ORDER BY 1",
            (pat,),
        ).all():
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {self.quote(name)}")
            dropped.append(f"trigger {name}")
        for name, typ in conn.exec_driver_sql(
            "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE %s "
            "ORDER BY TABLE_TYPE DESC, 1",
            (pat,),
        ).all():
            kind = "view" if typ == "VIEW" else "table"
            conn.exec_driver_sql(f"DROP {kind.upper()} IF EXISTS {self.quote(name)}")
            dropped.append(f"{kind} {name}")
        for name, kind in conn.exec_driver_sql(
            "SELECT ROUTINE_NAME, ROUTINE_TYPE FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() "
            "AND ROUTINE_NAME LIKE %s ORDER BY 1",
            (pat,),
        ).all():
            conn.exec_driver_sql(f"DROP {kind} IF EXISTS {self.quote(name)}")
            dropped.append(f"{str(kind).lower()} {name}")
        return dropped

    def uninstall_table(self, conn: Connection, table: str, peers: Sequence[str]) -> list[str]:
        """Each DROP commits by itself (MariaDB's DDL is not transactional), so the order is what
        keeps it safe: first the triggers named ``_mm_*`` on the table (capture, key guard, rank,
        read-only guards: from then on no write of it is captured, and a DROP TRIGGER waits only
        for the transactions using the table), then the reference capture on its change log, its
        views, tables and key counter. Every step drops what is there: a re-run finishes the job."""
        q = self.quote
        n = names(table)
        dropped: list[str] = []
        for (name,) in conn.exec_driver_sql(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE IN (%s, %s) "
            "AND TRIGGER_NAME LIKE %s ORDER BY EVENT_OBJECT_TABLE = %s, 1",
            (table, n.log, "\\_mm\\_%", n.log),
        ).all():
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {q(name)}")
            dropped.append(f"trigger {name}")
        views, tables = table_relations(table, peers)
        kinds = {
            str(name): str(typ)
            for name, typ in conn.exec_driver_sql(
                "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                f"AND TABLE_NAME IN ({self.ph(len(views) + len(tables) + 1)})",
                (*views, *tables, n.keyseq),
            ).all()
        }
        for kind, sql, objs in (("view", "VIEW", views), ("table", "TABLE", tables), ("sequence", "SEQUENCE", [n.keyseq])):
            for name in objs:
                if name in kinds:
                    conn.exec_driver_sql(f"DROP {sql} IF EXISTS {q(name)}")
                    dropped.append(f"{kind} {name}")
        return dropped

    def forget_table(self, conn: Connection, table: str) -> dict[str, int]:
        """The table's reconcilers' lock row (_mm_clock), its writers' gate and slots, its stamp
        mark (site.sql)."""
        out = {}
        for obj in ("_mm_slots", "_mm_gates", "_mm_clock", "_mm_stamps"):
            if self.table_kind(conn, obj) is not None:
                n = conn.exec_driver_sql(f"DELETE FROM {obj} WHERE tbl = %s", (table,)).rowcount
                if n:
                    out[obj] = int(n)
        return out

    # ---- apply -----------------------------------------------------------------------------
    def set_applying(self, conn: Connection, on: bool) -> None:
        conn.exec_driver_sql("SET @mm_applying = %s", (1 if on else None,))

    def lock_follow(self, conn: Connection, table: str) -> None:
        """A named lock (GET_LOCK: held by the session, not the transaction, so the commits each
        DDL statement makes do not release it), waited for up to FOLLOW_LOCK_WAIT seconds: two
        processes following the table at once (a site's refresher, a refresher of a link from it)
        each altered the change log and recorded the version (Duplicate column name, Duplicate
        entry for the schema's key; session 29)."""
        got = conn.exec_driver_sql(
            "SELECT GET_LOCK(CONCAT('mm-follow-', MD5(CONCAT(%s, '@', DATABASE()))), %s)", (table, FOLLOW_LOCK_WAIT)
        ).scalar()
        if got != 1:
            raise SchemaError(
                [
                    f"table '{table}': another process has been following its schema for {FOLLOW_LOCK_WAIT} s; the next refresh tries again"
                ]
            )

    def unlock_follow(self, conn: Connection, table: str) -> None:
        conn.exec_driver_sql("SELECT RELEASE_LOCK(CONCAT('mm-follow-', MD5(CONCAT(%s, '@', DATABASE()))))", (table,)).scalar()

    @contextmanager
    def short_ddl_waits(self, conn: Connection) -> Iterator[None]:
        """`lock_wait_timeout` (metadata locks) at DDL_LOCK_WAIT seconds, given back after. An
        ALTER or CREATE TRIGGER that waits for a table's metadata lock makes every statement on
        the table that comes after it wait too; an application's transaction holding that lock
        and waiting for a row a reconciler holds, while that reconciler waits behind the DDL,
        is a cycle neither InnoDB nor the metadata locks see: the server's default (a day) left
        applications failing with InnoDB's lock wait timeout (50 s; session 30)."""
        was = int(conn.exec_driver_sql("SELECT @@SESSION.lock_wait_timeout").scalar() or 0)
        conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {DDL_LOCK_WAIT}")
        try:
            yield
        finally:
            with suppress(DBAPIError):  # (a connection that broke is discarded by the pool)
                conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {was}")

    def insert_key_caveat(self, conn: Connection, info: TableInfo) -> str | None:
        if not info.spec.renumber:
            return None
        return (
            f"{info.name}'s key comes from multimaster's key counter: an application reads the new row's key with "
            "INSERT ... RETURNING or the driver's insert id (cursor.lastrowid, mysql_insert_id()); LAST_INSERT_ID() "
            'does not return it (docs/mysql.md "Keys the application is told")'
        )

    def lock_for_apply(self, conn: Connection, info: TableInfo) -> None:
        """The table's _mm_clock row, which only reconcilers lock (waited for patiently). In an
        attempt between the first and the last (BRIEF_EARLY), every lock wait after it gives up at
        once (_brief_from_now), as after lock_writers: a row an application keeps locked is waited
        out in the first attempt (the lock watch names its holder meanwhile) and in the last, not
        in every one. Before (session 36) brief waits began only with a renumbered table's writers'
        lock, so a refresh of a natural-key table waited out innodb_lock_wait_timeout (50 s) in
        each of its ten attempts: 500 s behind one application's long transaction."""
        with self._patiently(conn):
            conn.exec_driver_sql("SELECT hlc FROM _mm_clock WHERE tbl = %s FOR UPDATE", (info.name,)).all()
        if conn.get_execution_options().get(BRIEF_EARLY):
            self._brief_from_now(conn)

    @staticmethod
    def _brief_from_now(conn: Connection) -> None:
        """In a transaction run with brief waits (BRIEF_WAITS, Site.write), every lock wait from
        here on gives up at once (innodb_lock_wait_timeout 0: 1205, retried); the session's own
        timeout is kept in @mm_rwait for the framework's own locks (_patiently) and comes back when
        the connection goes back to the pool."""
        if not conn.info.get(BRIEF_NOW) and conn.get_execution_options().get(BRIEF_WAITS):
            conn.exec_driver_sql("SET @mm_rwait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = 0")
            conn.info[BRIEF_NOW] = True

    @contextmanager
    def _patiently(self, conn: Connection) -> Iterator[None]:
        """A wait for one of the framework's own locks at the session's own lock wait timeout,
        also in a transaction whose waits are brief already (lock_writers), brief again after."""
        brief = bool(conn.info.get(BRIEF_NOW))
        if brief:
            conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = @mm_rwait")
        yield
        if brief:
            conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 0")

    def lock_writers(self, conn: Connection, info: TableInfo) -> None:
        """The table's gate, then every slot of the table (site.sql): waits for the transactions
        that captured a change of it and are still running, and holds back every new one (an
        existing slot is locked, a new one needs the gate) until this transaction ends.

        With brief waits (Dialect.lock_writers), every lock wait after it fails at once
        (innodb_lock_wait_timeout 0: error 1205, retried): an application's UPDATE or DELETE locks
        its row before its trigger locks its slot, so a reconciler that waited for that row while
        holding the slots was a deadlock InnoDB broke by rolling the application back (the
        smaller transaction), and one that waited for a row an application had read FOR UPDATE
        held every writer of the table back meanwhile. The session's own timeout comes back for
        the next framework lock (lock_for_apply, lock_writers) and when the connection goes back
        to the pool (prepare_engine's reset)."""
        with self._patiently(conn):
            conn.exec_driver_sql("SELECT tbl FROM _mm_gates WHERE tbl = %s FOR UPDATE", (info.name,)).all()
            conn.exec_driver_sql("SELECT count(*) FROM _mm_slots WHERE tbl = %s FOR UPDATE", (info.name,)).all()
        self._brief_from_now(conn)

    def open_writer(self, conn: Connection) -> Dialect.OpenWriter | None:
        """Of the connections whose slot some transaction holds (a read that skips the free ones,
        site.sql), the one whose transaction began first (information_schema.INNODB_TRX, a cache
        at most 0.1 s old), with what PROCESSLIST shows of it (other users' sessions only with
        the PROCESS privilege). None when that is multimaster's own session (OWN_LOCK: a refresh
        applying here, relaying, or holding its writers' lock, which locks every slot of the
        table: lock_writers), or when none of them has a transaction open (their slots are locked
        by such a refresh): its work ends by itself, and its lock watch names what it waits for.
        Before, the first busy slot's connection was named (`KILL` of a refresh, or of an
        application's connection long closed: the soak's D4)."""
        free = {int(c) for (c,) in conn.exec_driver_sql("SELECT conn FROM _mm_slots LOCK IN SHARE MODE SKIP LOCKED")}
        conn.exec_driver_sql("ROLLBACK")
        # every slot, those created by transactions still running too (READ UNCOMMITTED)
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        busy = {int(c) for (c,) in conn.exec_driver_sql("SELECT DISTINCT conn FROM _mm_slots")} - free
        conn.exec_driver_sql("ROLLBACK")
        if not busy:
            return None
        ids = ", ".join(str(c) for c in sorted(busy))
        own = f"IS_USED_LOCK({OWN_LOCK.format('t.trx_mysql_thread_id')}) <=> t.trx_mysql_thread_id"
        try:
            r = conn.exec_driver_sql(
                "SELECT t.trx_mysql_thread_id, TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6, p.COMMAND, p.INFO, "
                f"{own} FROM information_schema.INNODB_TRX t "
                "LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                f"WHERE t.trx_mysql_thread_id IN ({ids}) ORDER BY t.trx_started LIMIT 1"
            ).first()
        except DBAPIError:  # INNODB_TRX needs the PROCESS privilege: the connection is known, not its age
            conn.rollback()
            cols = ", ".join(f"IS_USED_LOCK({OWN_LOCK.format(c)}) <=> {c}" for c in sorted(busy))
            if any(conn.exec_driver_sql(f"SELECT {cols}").one()):  # one of them is multimaster's own
                return None
            c = min(busy)
            return Dialect.OpenWriter(f"connection {c}", None, None, f"KILL {c}")
        if r is None or r[4]:
            return None
        c, age, command, info, _ = r
        doing = None if command is None else "idle in transaction" if command == "Sleep" else f"{command}: {info}"
        return Dialect.OpenWriter(f"connection {int(c)}", None if age is None else float(age), doing, f"KILL {int(c)}")

    def read_horizon(self, conn: Connection, table: str) -> int | None:
        with _keeping_isolation(conn):
            return _horizon(conn, table)

    def read_horizons(self, conn: Connection, tables: Sequence[str]) -> dict[str, int | None]:
        """The horizons, then each table's entries stamped with their transaction's id (site.sql
        _mm_stamp: capture leaves it to the reader), after every horizon was read: a transaction
        with an entry below one of them had ended before, so all its entries, in every table, are
        stamped alike. A site whose `init` predates the stamps has no _mm_stamp; its capture names
        transactions itself."""
        with _keeping_isolation(conn):
            return self._read_horizons(conn, tables)

    def _read_horizons(self, conn: Connection, tables: Sequence[str]) -> dict[str, int | None]:
        hs: dict[str, int | None] = {tb: _horizon(conn, tb) for tb in tables}
        for tb, h in hs.items():
            try:
                conn.exec_driver_sql("CALL _mm_stamp(%s, %s)", (tb, int(h or 0)))
            except DBAPIError as e:
                code = getattr(e.orig, "args", (None,))[0]
                if code == 1305:  # no such procedure: an earlier layout
                    conn.rollback()
                    break
                if code == 1370:  # no EXECUTE on it
                    raise MultimasterError(
                        f"this login may not run _mm_stamp at the source ({e.orig}); run `multimaster grants` and apply "
                        'what it prints (docs/mysql.md "Requirements and privileges")'
                    ) from e
                raise
        return hs

    def txn_bounds(self, conn: Connection, lo: int, hi: int) -> dict[str, list[int]] | None:
        """The bounds _mm_horizon recorded (site.sql _mm_bounds): those in `lo`..`hi` and, per
        connection, the first past `hi`. None where the site has no such table yet (installed
        before it: `init` creates it) or the pull login may not read it (`multimaster grants`
        grants it): the names are then split by the transaction count alone (capture.sql)."""
        try:
            rows = conn.exec_driver_sql(
                "SELECT conn, upto FROM _mm_bounds WHERE upto >= %s AND upto <= %s "
                "UNION ALL SELECT conn, min(upto) FROM _mm_bounds WHERE upto > %s GROUP BY conn",
                (int(lo), int(hi), int(hi)),
            ).all()
        except DBAPIError as e:
            if getattr(e.orig, "args", (None,))[0] in (1142, 1146):  # no such table / no SELECT on it
                return None
            raise
        out: dict[str, list[int]] = {}
        for c, b in rows:
            out.setdefault(str(c), []).append(int(b))
        return {c: sorted(bs) for c, bs in out.items()}

    def registry_rows(self, conn: Connection, exact: bool = False) -> int | None:
        sql = (
            "SELECT count(*) FROM mysql.transaction_registry"
            if exact
            else "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'mysql' AND TABLE_NAME = 'transaction_registry'"
        )
        try:
            n = conn.exec_driver_sql(sql).scalar()
        except DBAPIError:  # no right to read it
            return None
        return None if n is None else int(n)

    def trim_registry(self, conn: Connection) -> str | None:
        """TRUNCATE mysql.transaction_registry (a DELETE of it is refused: error 1556), unless a
        table outside multimaster's clocks keeps transaction-precise history, whose AS OF queries
        read it. Commits go on meanwhile (measured: 16 writers, commit p99 4 ms)."""
        rows = self.registry_rows(conn, exact=True)
        if not rows:
            return None
        others = (
            conn.exec_driver_sql(
                "SELECT DISTINCT CONCAT(TABLE_SCHEMA, '.', TABLE_NAME) FROM information_schema.COLUMNS "
                "WHERE GENERATION_EXPRESSION = 'ROW START' AND DATA_TYPE = 'bigint' AND TABLE_NAME <> '_mm_tick' ORDER BY 1 LIMIT 3"
            )
            .scalars()
            .all()
        )
        if others:
            return (
                f"mysql.transaction_registry ({rows} rows) not truncated: {', '.join(map(str, others))} keep transaction-precise "
                'history, which reads it (docs/mysql.md "The transaction registry")'
            )
        try:
            conn.exec_driver_sql("TRUNCATE TABLE mysql.transaction_registry")
        except DBAPIError as e:
            user = conn.exec_driver_sql("SELECT CURRENT_USER()").scalar()
            name, _, host = str(user).rpartition("@")
            return (
                f"mysql.transaction_registry ({rows} rows) not truncated: {e.orig}; an administrator grants it with "
                f"GRANT DROP ON mysql.transaction_registry TO '{name}'@'{host}' (docs/mysql.md \"The transaction registry\")"
            )
        return f"mysql.transaction_registry truncated ({rows} rows)"

    def trim_txn_bounds(self, conn: Connection, below: int | None) -> None:
        if below is None:
            conn.exec_driver_sql("DELETE FROM _mm_bounds")
        else:
            conn.exec_driver_sql("DELETE FROM _mm_bounds WHERE upto < %s", (int(below),))

    def _register(self, conn: Connection, table: str) -> None:
        """Lock this connection's slot of `table` (creating it behind the gate), as capture does
        before it draws a position (site.sql, capture.sql)."""
        conn.exec_driver_sql("SELECT 1 FROM _mm_gates WHERE tbl = %s LOCK IN SHARE MODE", (table,)).all()
        conn.exec_driver_sql(
            "INSERT INTO _mm_slots (tbl, conn, lo, cur) VALUES (%s, CONNECTION_ID(), _mm_draw(), 0) "
            "ON DUPLICATE KEY UPDATE cur = cur",
            (table,),
        )

    #: rows per INSERT statement of append_log
    APPEND_CHUNK = 500

    def append_log(
        self,
        conn: Connection,
        table: str,
        cols: Sequence[str],
        select: str | None = None,
        rows: Sequence[tuple[Any, ...]] = (),
        params: tuple[Any, ...] = (),
    ) -> None:
        """Lock this connection's slot of `table`, then give the rows positions in order: a
        multi-row INSERT into _mm_tick takes consecutive AUTO_INCREMENT values (a simple insert
        of known size), the first of them LAST_INSERT_ID(), after the counter was moved to the
        wall clock."""
        if select is not None:
            rows = [tuple(r) for r in conn.exec_driver_sql(select, params)]
        if not rows:
            return
        self._register(conn, table)
        wall = int(conn.exec_driver_sql(f"SELECT {self.WALL}").scalar() or 0)
        self._sync_clock(conn, wall)
        target = f"INSERT INTO {self.obj(table).log} (seq, {', '.join(self.log_write_columns(cols))}) VALUES "
        for i in range(0, len(rows), self.APPEND_CHUNK):
            part = rows[i : i + self.APPEND_CHUNK]
            conn.exec_driver_sql("INSERT INTO _mm_tick (t) VALUES " + ", ".join(["(NULL)"] * len(part)))
            first = int(conn.exec_driver_sql("SELECT LAST_INSERT_ID()").scalar() or 0)
            vals = ", ".join(f"({first + j}, {self.ph(len(cols))})" for j in range(len(part)))
            conn.exec_driver_sql(target + vals, tuple(v for r in part for v in r))
        # the slot's committed cur: this transaction's last position (drawn after the rows')
        conn.exec_driver_sql("UPDATE _mm_slots SET cur = _mm_draw() WHERE tbl = %s AND conn = CONNECTION_ID()", (table,))

    def lock_rows(self, conn: Connection, info: TableInfo, tmp: str) -> None:
        """The rows, in key order (the order an application's multi-row UPDATE takes them), then
        their shadow rows: the order an application's write takes them in too (its row, then its
        trigger's shadow row). A join locks every table it reads, in the join's order: a join of
        the shadow and the table locked the shadow row first and deadlocked with an application
        updating the same row (MariaDB rolled the application back: docs/decisions.md, session
        27). So the shadow rows of `tmp` are read first, without locking (READ COMMITTED: a
        consistent read), into a scratch table in key order (_keyed_rows), and the table's rows,
        then the shadow's, are locked through it. With brief waits (lock_writers), none is waited
        for (_lock_or_retry)."""
        o = self.obj(info.name)
        held = self._keyed_rows(conn, f"{tmp} r STRAIGHT_JOIN {o.shadow} s ON s.rid = r.rid")
        self._lock_or_retry(conn, self._table_rows(info, held), "h._mm_row")
        self._lock_or_retry(conn, f"{held} h STRAIGHT_JOIN {o.shadow} s ON s.rid = h.rid", "h._mm_row")
        self.drop_temp(conn, held)
        if info.spec.renumber:
            # rows whose key a new identity may shift: those with a later identity than the earliest new one
            first_new = conn.exec_driver_sql(
                f"SELECT r.rid FROM {tmp} r LEFT JOIN {o.shadow} s ON s.rid = r.rid WHERE s.rid IS NULL ORDER BY r.rid LIMIT 1"
            ).scalar()
            if first_new is not None:
                held = self._keyed_rows(conn, f"{o.shadow} s WHERE s.rid > %s", (first_new,))
                self._lock_or_retry(conn, self._table_rows(info, held), "h._mm_row")
                self.drop_temp(conn, held)

    def _keyed_rows(self, conn: Connection, rows: str, params: tuple[Any, ...] = ()) -> str:
        """Create and name a scratch table of the shadow rows `rows` selects (FROM ... with the
        shadow as `s`): (rid, kv), numbered `_mm_row` in key order. It drives the locking joins
        (lock_rows), so that they read only these rows: the table's rows named through an IN
        subquery of the shadow were read by MariaDB's semi-join scanning the whole table's key
        index, on every call (a large transaction applied in pieces: each piece's locks cost more
        than the last, docs/performance.md "One large transaction")."""
        held = self.temp_name("_mm_tmp_lock")
        self.drop_temp(conn, held)
        conn.exec_driver_sql(
            self.temp_ddl(held, f"SELECT s.rid AS rid, s.`key` AS kv FROM {rows} ORDER BY s.`key`, s.rid", index=None), params
        )
        return held

    def _table_rows(self, info: TableInfo, held: str) -> str:
        """The table's rows of the shadow rows in `held` (_keyed_rows), read through it, in its order."""
        q = self.quote
        return f"{held} h STRAIGHT_JOIN {q(info.name)} t ON t.{q(info.key.name)} = h.kv"

    def lock_keys(self, conn: Connection, info: TableInfo, keys: Sequence[int]) -> None:
        """With brief waits: lock the rows whose keys move, waiting for none (_lock_or_retry). An
        application that updates a row it has just inserted locks the row, then waits for its
        slot: the reconciler's UPDATE of that row's key would be a deadlock it loses."""
        if not conn.info.get(BRIEF_NOW):
            return
        t, key = self.quote(info.name), self.quote(info.key.name)
        for i in range(0, len(keys), 1000):
            part = ", ".join(str(int(k)) for k in keys[i : i + 1000])
            self._lock_or_retry(conn, f"{t} t WHERE t.{key} IN ({part})", f"t.{key}")

    def _lock_or_retry(self, conn: Connection, rows: str, order: str, params: tuple[Any, ...] = ()) -> None:
        """Lock `rows` (FROM ... WHERE ...) FOR UPDATE, in `order`. With brief waits (this
        transaction holds a table's writers' lock: lock_writers), wait for none of them: InnoDB
        checks a wait for deadlocks before it times out, and an application whose UPDATE locked
        its row and now waits for its slot would be rolled back as the smaller transaction. So
        the rows are locked SKIP LOCKED, and when fewer were locked than there are, the statement
        fails with 1205 (lock wait timeout): the batch is rolled back, the slots given back, and
        run again (is_retryable)."""
        if not conn.info.get(BRIEF_NOW):
            conn.exec_driver_sql(f"SELECT 1 FROM {rows} ORDER BY {order} FOR UPDATE", params).all()
            return
        # (at the session's own timeout inside the block: at 0, the block's failure made MariaDB
        # 10.11 roll the whole transaction back with 1180 "Operation not permitted during COMMIT")
        conn.exec_driver_sql(
            "BEGIN NOT ATOMIC DECLARE n, m BIGINT; SET SESSION innodb_lock_wait_timeout = @mm_rwait; "
            f"SELECT count(*) INTO n FROM {rows}; "
            f"SELECT count(*) INTO m FROM {rows} FOR UPDATE SKIP LOCKED; "
            "IF m < n THEN SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, "
            "MESSAGE_TEXT = 'multimaster: a row this batch changes is locked by another transaction; the batch runs again'; "
            "END IF; SET SESSION innodb_lock_wait_timeout = 0; END",
            params + params,
        )

    def advance_clock(self, conn: Connection, hlc: int, table: str | None = None) -> None:
        """Move the clock past `hlc`, and the site's floor ``_mm_state.hlc`` with it when no table
        is given (add-site)."""
        self._sync_clock(conn, hlc)
        if table is None:
            conn.exec_driver_sql("UPDATE _mm_state SET hlc = GREATEST(hlc, %s)", (hlc,))

    def read_clock(self, conn: Connection) -> int | None:
        v = conn.exec_driver_sql("SELECT GREATEST(hlc, (SELECT coalesce(max(t), 0) FROM _mm_tick)) FROM _mm_state").scalar()
        return None if v is None else int(v)

    def _key_top(self, conn: Connection, info: TableInfo) -> int:
        q = self.quote
        return int(
            conn.exec_driver_sql(
                f"SELECT GREATEST((SELECT coalesce(max({q(info.key.name)}), 0) FROM {q(info.name)}), "
                f"(SELECT coalesce(max(`key`), 0) FROM {self.obj(info.name).shadow}))"
            ).scalar()
            or 0
        )

    def after_apply(self, conn: Connection, info: TableInfo) -> None:
        """The key counter of a renumbered table past the highest key (forward only: a local
        insert may have drawn a value). AUTO_INCREMENT needs no move: InnoDB moves it past every key
        inserted."""
        if info.spec.renumber:
            self._counter_forward(conn, info, self._key_top(conn, info))

    def _counter_forward(self, conn: Connection, info: TableInfo, top: int) -> None:
        """The key counter of `info` at `top` or past it (forward only). SETVAL ignores a value
        given for an earlier round of a CYCLE sequence, and reset_key_counter starts a new round
        at every reset: a SETVAL without the current round was a no-op from the first reset on,
        which left the counter below keys taken meanwhile (a local insert then failed with
        `Duplicate entry` until the next reconcile ranked the keys)."""
        seq = self.obj(info.name).keyseq
        rnd = int(conn.exec_driver_sql(f"SELECT cycle_count FROM {seq}").scalar() or 0)
        conn.exec_driver_sql(f"SELECT SETVAL({seq}, {int(top)}, 1, {rnd})").all()

    #: how far past every key the counter of a table made again starts (before_capture_again)
    RECAPTURE_KEY_MARGIN = 1_000_000

    def before_capture_again(self, conn: Connection, info: TableInfo) -> None:
        """The key counter of a renumbered table made again, far past every key its rows took
        while no trigger drew keys (AUTO_INCREMENT, which may be past the highest key) before the
        key trigger exists: an application insert that draws from it in the moment the capture is
        made again cannot take a key an uncaptured row holds (`Duplicate entry`), unless a million
        rows went in within that moment. The keys it draws meanwhile are ranked at the next
        reconcile, as every local key is (engine/apply.py normalize_keys)."""
        seq = names(info.name).keyseq
        if (
            not info.spec.renumber
            or not conn.exec_driver_sql(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", (seq,)
            ).first()
        ):
            return  # (no counter yet: install_capture makes it past every key)
        ai = conn.exec_driver_sql(
            "SELECT coalesce(AUTO_INCREMENT, 1) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (info.name,),
        ).scalar()
        self._counter_forward(conn, info, max(self._key_top(conn, info), int(ai or 1) - 1) + self.RECAPTURE_KEY_MARGIN)

    def reset_key_counter(self, conn: Connection, info: TableInfo, top: int) -> None:
        """Back to the highest key: SETVAL moves a sequence back only into a later round (the key
        counter is a CYCLE sequence whose rounds count these resets). A sequence is not
        transactional: the caller passes a `top` no lower than any key a rollback of this
        transaction would bring back (engine/apply.py keys_ranked_now, rewind_key_counter)."""
        seq = self.obj(info.name).keyseq
        top = max(int(top), self._key_top(conn, info))
        rnd = int(conn.exec_driver_sql(f"SELECT cycle_count FROM {seq}").scalar() or 0)
        conn.exec_driver_sql(f"SELECT SETVAL({seq}, {top}, 1, {rnd + 1})").all()

    # ---- foreign keys between replicated tables (docs/foreign-keys.md) -------------------------
    reference_type = "VARCHAR(255)"

    def install_reference_capture(self, conn: Connection, info: TableInfo) -> None:
        """A BEFORE INSERT row trigger on the change log sets the identities of the entries this
        site captures, from the parents' shadows (written by the parents' capture)."""
        q = self.quote
        o = self.obj(info.name)
        trig = q("_mm_refs_" + info.name)
        drop = f"DROP TRIGGER IF EXISTS {trig}"
        if not info.refs:
            conn.exec_driver_sql(drop)
            return
        site = _lit(str(conn.exec_driver_sql("SELECT site FROM _mm_state").scalar()))
        bit = {c: i for i, c in enumerate(info.column_names)}
        body = []
        for r in info.refs:
            sh = self.obj(r.parent).shadow
            m = 1 << bit[r.column]
            body.append(
                f"  IF (NEW.mask & {m}) <> 0 THEN\n"
                f"    IF NEW.op <> 'D' THEN SET NEW.{q('f_' + r.column)} = (SELECT rid FROM {sh} WHERE `key` = NEW.{q('n_' + r.column)}); END IF;\n"
                f"    IF NEW.op <> 'I' THEN SET NEW.{q('fo_' + r.column)} = (SELECT rid FROM {sh} WHERE `key` = NEW.{q('o_' + r.column)}); END IF;\n"
                f"  END IF;"
            )
        create = (
            f"CREATE TRIGGER {trig} BEFORE INSERT ON {o.log} FOR EACH ROW\nBEGIN\n  IF NEW.origin = {site} THEN\n"
            + "\n".join(body)
            + "\n  END IF;\nEND"
        )
        # left alone when unchanged, replaced in one statement otherwise: no entry captured while
        # init runs again goes in without its identities (_run_keeping_unchanged)
        _run_keeping_unchanged(conn, [drop, create])

    def defer_foreign_keys(self, conn: Connection, on: bool) -> bool:
        """InnoDB checks every row at once and cannot defer: the checks are off for this session
        while the reconciler moves keys and applies references (it resolves them itself), and so
        are referential actions (the reset of a pooled connection turns them back on)."""
        conn.exec_driver_sql(f"SET SESSION foreign_key_checks = {0 if on else 1}")
        return False

    # ---- outside the engine: verify and repair (multimaster/spark/), grants, site files ----------
    jdbc = Dialect.Jdbc(
        driver="org.mariadb.jdbc.Driver",  # reads MariaDB and MySQL alike
        jar="mariadb-java-client.jar",
        package="libmariadb-java",
        # not jdbc:mariadb: Spark picks its MySQL dialect (backquotes, types) only for jdbc:mysql
        scheme="jdbc:mysql",
        default_port=3306,
        read_types=None,  # the driver reports each column's declared type
    )

    def pull_grants(self, site: str, peer: str, login: str, database: str, objects: Sequence[str]) -> list[str]:
        # a user without a password (the owner sets it, never printed), from any host
        user = f"'{login}'@'%'"
        return (
            [f"CREATE USER IF NOT EXISTS {user}"]
            + [f"GRANT SELECT ON {self.quote(database)}.{self.quote(o)} TO {user}" for o in objects]
            # the horizon a puller reads below (site.sql); it runs as its definer
            + [f"GRANT EXECUTE ON PROCEDURE {self.quote(database)}.`_mm_horizon` TO {user}"]
            # the stamping of the entries' transactions a puller runs before it reads them (site.sql)
            + [f"GRANT EXECUTE ON PROCEDURE {self.quote(database)}.`_mm_stamp` TO {user}"]
            # the bounds between a connection's transactions the horizon records (site.sql)
            + [f"GRANT SELECT ON {self.quote(database)}.`_mm_bounds` TO {user}"]
        )


DIALECT = MySQLDialect()


#: DROP TRIGGER [IF EXISTS] name / CREATE TRIGGER name ... (group 1: the name)
_TRIGGER_DDL = re.compile(r"\s*(?:DROP TRIGGER(?: IF EXISTS)?|CREATE TRIGGER)\s+(\S+)", re.IGNORECASE)
_CREATE_TRIGGER = re.compile(
    r"\s*CREATE TRIGGER\s+(\S+)\s.*?\sFOR EACH ROW\s+(?:(?:FOLLOWS|PRECEDES)\s+\S+\s+)?(.*)\Z", re.IGNORECASE | re.DOTALL
)


def _created_triggers(stmts: Sequence[str]) -> dict[str, str]:
    """The triggers `stmts` create: name -> body (what follows FOR EACH ROW [FOLLOWS|PRECEDES x])."""
    out = {}
    for sql in stmts:
        m = _CREATE_TRIGGER.match(_uncommented(sql))
        if m:
            out[m.group(1).strip("`")] = m.group(2).strip().rstrip(";").strip()
    return out


def _unchanged_triggers(conn: Connection, wanted: dict[str, str]) -> set[str]:
    """The triggers of `wanted` (_created_triggers) that exist in this database with the same body:
    MariaDB / MySQL DDL is not transactional, so between a DROP TRIGGER and its CREATE an
    application's write would go by uncaptured (and an insert of a renumbered table would get its
    key from AUTO_INCREMENT): `init` run again on a site in use must leave unchanged triggers alone."""
    if not wanted:
        return set()
    have = conn.exec_driver_sql(
        "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()"
    ).all()
    return {str(n) for n, body in have if str(n) in wanted and str(body).strip().rstrip(";").strip() == wanted[str(n)]}


def _uncommented(sql: str) -> str:
    """`sql` without the comment lines before its first statement line."""
    lines = sql.lstrip().splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines)


#: URL query parameters by which a user asks PyMySQL for TLS settings of their own
_TLS_PARAMS = ("ssl", "ssl_ca", "ssl_capath", "ssl_cert", "ssl_key", "ssl_verify_cert", "ssl_verify_identity", "ssl_disabled")


def _plain_loopback(url: str) -> bool:
    """A connection to a server on this host's loopback (or its socket) that asks for no TLS
    setting: PyMySQL 2 would negotiate TLS without checking any certificate (its PREFERRED mode),
    which protects nothing on loopback and costs each new connection a TLS context and handshake
    (40 ms here). Any ssl_* parameter in the URL's query keeps PyMySQL's own handling."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if any(k in u.query for k in _TLS_PARAMS):
        return False
    return "unix_socket" in u.query or (u.host or "localhost") in ("localhost", "127.0.0.1", "::1")


def _run_keeping_unchanged(conn: Connection, stmts: Sequence[str]) -> None:
    """Run a template's statements, leaving out the DROP and CREATE of each trigger that exists
    unchanged (_unchanged_triggers): dropping and re-creating it would let writes in between go
    by it (init run again while applications write). A trigger that changed (a new release's
    capture, a column added) is replaced in one statement, CREATE OR REPLACE TRIGGER, not dropped
    and then created: MariaDB swaps it under the table's exclusive metadata lock, so every write
    fires the old trigger or the new one. Between a DROP and its CREATE an application's write
    went by uncaptured, and an insert into a renumbered table whose key trigger was being made
    again failed (`Column 'seq' cannot be null`: the insert trigger found no position;
    tests/test_server_many_writers.py). A DROP with no CREATE of the same name after it (a
    trigger of an earlier release) runs as written."""
    created = _created_triggers(stmts)
    same = _unchanged_triggers(conn, created)
    for sql in stmts:
        u = _uncommented(sql)
        m = _TRIGGER_DDL.match(u)
        name = m.group(1).rstrip(";").strip("`") if m else None
        if name in same:
            continue
        if name in created:
            if not u.upper().startswith("CREATE"):
                continue  # its DROP: the CREATE below replaces it
            sql = re.sub(r"\ACREATE TRIGGER", "CREATE OR REPLACE TRIGGER", u, count=1, flags=re.IGNORECASE)
        conn.exec_driver_sql(sql)


def _horizon(conn: Connection, table: str) -> int:
    """site.sql _mm_horizon: every position of `table` below it is final."""
    return int(conn.exec_driver_sql("CALL _mm_horizon(%s)", (table,)).scalar_one())


@contextmanager
def _keeping_isolation(conn: Connection) -> Iterator[None]:
    """The session's isolation level as it was, after what runs inside: the horizon procedure of a
    site whose `init` predates 2026-11-29 leaves its session READ UNCOMMITTED (site.sql
    _mm_horizon), and a pooled connection that served a pull went on reading what other
    transactions had not committed (a puller's watermark still moving: a purge took entries that
    puller never got). Two statements a pull; the procedure since restores it itself."""
    level = conn.exec_driver_sql("SELECT @@session.tx_isolation").scalar()
    try:
        yield
    except BaseException:
        try:  # what failed is what the caller hears of, not a connection that is gone
            conn.exec_driver_sql("SET SESSION tx_isolation = %s", (level,))
        except DBAPIError:
            pass
        raise
    conn.exec_driver_sql("SET SESSION tx_isolation = %s", (level,))
