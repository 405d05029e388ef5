"""The seam between the engine and each database: one small module per dialect.

A dialect is a folder ``multimaster/dialects/<sqlalchemy dialect name>/``: ``dialect.py`` exposing
``DIALECT``, an instance of a :class:`Dialect` subclass, beside its SQL templates (``*.sql``,
``$placeholders`` only; identifiers and column lists are built in Python, every identifier
quoted). A dialect holds what differs per database and nothing else: SQL syntax, one complete
:class:`Capabilities` object, install (objects and triggers), locking and the clock, connections.
The bookkeeping tables (``_mm_*``) are read and written by :mod:`multimaster.store`, with this
syntax. The engine never branches on a dialect's name: it calls these methods and reads the
capabilities. See docs/adding-a-dialect.md.

The defaults here are standard SQL, or what two built-in dialects share, or "nothing to do";
never one database's own behaviour. What every database does its own way raises
NotImplementedError here.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

from sqlalchemy.engine import Connection, Engine

from multimaster.core.progress import Blocker
from multimaster.dialects.liveness import Timeouts
from multimaster.dialects.schema import Collation, Column, Names, TableInfo, names
from multimaster.errors import SchemaError

__all__ = [
    "BRIEF_EARLY",
    "BRIEF_NOW",
    "BRIEF_WAITS",
    "Capabilities",
    "Dialect",
    "get_dialect",
    "templates_dir",
    "shadow_key_index",
    "read_only_message",
    "table_relations",
]


@dataclass(frozen=True)
class Capabilities:
    """What a database can do and how the framework must talk to it, declared once per dialect
    (every field, no defaults), each with the reason it matters. Code and tests branch on these,
    never on a dialect's name."""

    #: DDL runs inside a transaction and rolls back with it: init is then all-or-nothing per site
    #: (otherwise it is idempotent, and checks what it can before writing: Dialect.install_problems)
    transactional_ddl: bool
    #: longest object name, counted in `identifier_unit`; the names of the objects made for a table
    #: are checked against it at init (a database that truncated them would mix two tables' objects)
    max_identifier_length: int
    #: what max_identifier_length counts: "bytes" or "characters"
    identifier_unit: str
    #: parameter marker used with exec_driver_sql (the driver's DB-API paramstyle); with "%s" a
    #: literal % in a statement is written %% (rendered templates are escaped so)
    placeholder: str
    #: one writer at a time per database: the apply transaction takes the write lock up front
    #: (BEGIN IMMEDIATE) and excludes every other writer
    single_writer: bool
    #: the reconciler may apply plain changes set-based (engine/fastpath.py): where the apply
    #: transaction is the only writer (single_writer), or after locking the candidate rows
    #: (lock_rows) where applications write concurrently; elsewhere the planner's path
    set_based_apply: bool
    #: writers of one replicated table capture concurrently, without a table lock: change-log
    #: positions are drawn before COMMIT, so a peer reads only below read_horizon(); local inserts
    #: into a renumbered table draw keys from a counter, and the reconciler ranks them
    #: (engine/apply.py normalize_keys) while it holds lock_writers (docs/concepts.md)
    concurrent_capture: bool
    #: the site's own capture records ``txn``, the source transaction that wrote an entry, and
    #: positions are one site-wide order: a puller cuts a link's batches at transaction boundaries
    #: below the horizon (core/batches.py). Without it a batch is one whole read of the source,
    #: whose read transaction holds only whole transactions (docs/transactions.md). Every
    #: dialect's change log and snapshots have the column: a relayed entry keeps its origin's
    #: ``txn`` (and a SQLite site's own entries have none). An id is never 32 lowercase hex
    #: digits: that is a batch's own name (core/batches.py batch_txn)
    txn_column: bool
    #: SQL taking a session-level lock named by its one parameter without waiting, returning a true
    #: value when taken: at most one daemon per site (ops/daemon.py). None: the daemon locks a file
    #: next to the database
    daemon_lock_sql: str | None
    #: column definition of a generated primary key (the verification log's id)
    serial_pk: str
    #: the change-log column an entry's identity is written to (read back as ``rid``): a dialect
    #: may store it elsewhere and derive ``rid`` (SQLite: ``xrid``, rid = coalesce(xrid, ver), so a
    #: capture trigger computes a new row's version once)
    log_rid_column: str
    #: the schema holding every object multimaster creates, apart from the user's tables (None: the
    #: connection's own schema; bookkeeping tables are then named unqualified)
    bookkeeping_schema: str | None
    #: where set_based_apply: the fewest candidate changes worth the fast path's scratch tables
    #: (fewer go through the planner, which costs less for them: docs/performance.md "The fast
    #: path's threshold"); MM_FASTPATH_MIN overrides it
    fastpath_min: int = 0


def templates_dir(dialect: str) -> Path:
    """Where the SQL templates of `dialect` are: its own folder, beside its Python
    (multimaster/dialects/<name>/*.sql)."""
    return Path(__file__).resolve().parent / dialect


#: how far (in clock units, 1/65536 ms) a capture's draw of a server's shared clock may lag the
#: wall clock before it moves the clock there: one millisecond (docs/clock.md "Rules"; rendered
#: into PostgreSQL's _mm_tick and MariaDB's _mm_draw, site.sql)
CLOCK_SLACK = 65536
#: the objects of :func:`names` that are relations (tables, views): they live in the bookkeeping
#: schema; triggers and indexes take no schema qualifier
_RELATIONS = ("log", "log2", "shadow", "tombstones", "snap", "keyseq")
#: an install template's ALTER TABLE <relation> ADD COLUMN IF NOT EXISTS <column> (Dialect.run_install)
_ADD_IF_MISSING = re.compile(r"\s*ALTER\s+TABLE\s+(\S+)\s+ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS\s+(\S+)", re.I)


#: execution option of a write transaction (Site.write(brief=True)): once it holds the writers'
#: lock of a table (Dialect.lock_writers), its lock waits give up at once (a retryable error)
BRIEF_WAITS = "mm_brief_waits"
#: execution option of a write transaction (Site.write(early=True)), an attempt between the first
#: and the last: its lock waits give up at once already from the table's reconcilers' lock on
#: (Dialect.lock_for_apply; MariaDB), so a row an application keeps locked is waited out in the
#: first attempt (the lock watch names its holder) and the last, not in every one
BRIEF_EARLY = "mm_brief_early"
#: Connection.info key: this transaction's lock waits are brief now (the dialect set them so)
BRIEF_NOW = "mm_brief_now"


#: the bookkeeping tables of a whole site: `init` makes them and only `uninstall` drops them
#: (none is made or dropped per replicated table), so that one found in a scope of catalog_once()
#: stays there for the rest of it
SITE_TABLES = (
    "_mm_tables",
    "_mm_schemas",
    "_mm_errors",
    "_mm_gaps",
    "_mm_retired",
    "_mm_skew",
    "_mm_watermarks",
    "_mm_verifications",
    "_mm_snap_horizons",
)

#: inside catalog_once(): per site (its engine), the SITE_TABLES found there, with their kind
_FOUND: ContextVar[dict[Engine, dict[str, str]] | None] = ContextVar("mm_site_tables_found", default=None)


@contextmanager
def catalog_once() -> Iterator[None]:
    """A scope (one refresh of a link, engine/refresh.py) in which Dialect.table_kind reads which of
    a site's SITE_TABLES exist once, in one statement, instead of one catalogue read per question:
    a refresh asked 5-15 times per site (over a WAN each a round trip). A table not found is asked
    again each time, as outside the scope (init may make it meanwhile). Nested scopes share the
    outer one; a thread started inside it shares it when it runs in a copy of the context
    (engine/cluster.py each)."""
    if _FOUND.get() is not None:
        yield
        return
    token = _FOUND.set({})
    try:
        yield
    finally:
        _FOUND.reset(token)


#: conn.info's key of txn_memo's record
_TXN_MEMO = "mm_txn_memo"


def txn_memo(conn: Connection) -> dict[Any, Any]:
    """What the transaction open on `conn` did already and need not do again (a lock it holds, a
    setting it made), for a dialect to note and read: one dict per transaction and savepoint level,
    a new one when a transaction begins or a savepoint is entered or left (what a rollback to a
    savepoint undoes is not remembered past it). Outside a transaction: a new dict each time."""
    root = conn.get_transaction()
    if root is None:
        return {}
    level = (root, conn.get_nested_transaction())
    memo = conn.info.get(_TXN_MEMO)
    if memo is None or memo[0][0] is not level[0] or memo[0][1] is not level[1]:
        memo = (level, {})
        conn.info[_TXN_MEMO] = memo
    return memo[1]  # type: ignore[no-any-return]


class Dialect:
    #: the SQLAlchemy dialect name (its folder under multimaster/dialects/)
    name: str = ""
    #: the database's name in messages
    title: str = ""
    caps: Capabilities

    # ---- SQL syntax --------------------------------------------------------------------------
    def quote(self, ident: str) -> str:
        return '"' + ident.replace('"', '""') + '"'

    @property
    def key_col(self) -> str:
        """The column ``key`` of multimaster's own tables (shadow, change log, snapshots, conflict
        log), quoted: every statement the framework builds names it so (``key`` is a reserved word
        in MySQL). Not to be confused with ``_mm_tables.key_col``, the user table's key column."""
        return self.quote("key")

    def ph(self, n: int) -> str:
        """`n` parameter markers, comma-separated."""
        return ", ".join([self.caps.placeholder] * n)

    def mm_table(self, name: str) -> str:
        """The name to use in SQL for the bookkeeping table (or replication object) `name`: qualified
        by the bookkeeping schema when there is one."""
        s = self.caps.bookkeeping_schema
        return f"{s}.{name}" if s else name

    def obj(self, table: str, peer: str | None = None) -> Names:
        """The objects of `table` (and of the snapshot of `peer`), quoted, relations qualified."""
        return names(table, peer).map(lambda k, v: self.mm_table(self.quote(v)) if k in _RELATIONS else self.quote(v))

    def concat(self, *parts: str) -> str:
        return " || ".join(parts)

    def cast_text(self, expr: str) -> str:
        return f"CAST({expr} AS TEXT)"

    def greatest(self, *exprs: str) -> str:
        """The largest of `exprs` (none of them NULL: databases disagree on NULLs)."""
        return f"GREATEST({', '.join(exprs)})"

    def null_safe_eq(self, a: str, b: str) -> str:
        """`a` equals `b`, two NULLs being equal."""
        return f"{a} IS NOT DISTINCT FROM {b}"

    def insert_ignore_into(self, table: str, cols: str, source: str) -> str:
        """INSERT of `source` (``VALUES (...)`` or a SELECT) into `table` (`cols`), skipping rows whose
        unique key already exists."""
        raise NotImplementedError

    def insert_new_into(self, table: str, cols: str, source: str, key: str) -> str:
        """INSERT of `source` into `table` (`cols`) skipping the rows whose unique `key` exists, and
        nothing else: a value the table cannot hold fails the statement, never cut or rounded to
        fit (a snapshot holds what the peer sent, docs/decisions.md). Default: insert_ignore_into
        (PostgreSQL's ON CONFLICT DO NOTHING and SQLite's OR IGNORE skip conflicts only)."""
        return self.insert_ignore_into(table, cols, source)

    def value_checks(self, info: TableInfo) -> list[Any]:
        """Per replicated column of `info` here, a test of a value as value_adapters gives it: None
        when the column stores it exactly, else a :class:`~multimaster.dialects.fit.Misfit` saying
        why not; None for a column where every value of its kind fits (dialects/fit.py)."""
        from multimaster.dialects import fit, types

        return fit.checks(self.name, self.title, info.columns, [types.kind_of(self.name, c) for c in info.columns])

    def key_check(self, info: TableInfo) -> Any:
        """The same test for the key of `info`, where a change's key is stored here as it came (a
        natural key: a text past the column's length, a character its character set lacks); None
        for a renumbered key (this site gives its own) or where every key of its kind fits."""
        from multimaster.dialects import fit, types

        if info.spec.renumber:
            return None
        return fit.checks(self.name, self.title, [info.key], [types.kind_of(self.name, info.key)])[0]

    def upsert(self, table: str, row: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        """(statement, parameters) inserting `row` (column -> value) into `table`, or, when a row
        with the same `keys` exists, setting its other columns to `row`'s values."""
        cols = list(row)
        sets = ", ".join(f"{c} = excluded.{c}" for c in cols if c not in keys)
        return (
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({self.ph(len(cols))}) "
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}",
            tuple(row.values()),
        )

    def temp_name(self, name: str) -> str:
        """The name to use for a connection-local scratch table."""
        return self.quote(name)

    def create_temp(self, conn: Connection, name: str, select: str, keys: str | None = None, index: str | None = "rid") -> None:
        """Create a connection-local table from a SELECT; `keys` becomes unique, `index` indexed
        (when the SELECT has such a column)."""
        raise NotImplementedError

    def drop_temp(self, conn: Connection, name: str) -> None:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")

    def temp_rids(self, conn: Connection) -> str:
        """Create (if needed) and name a connection-local table with one TEXT column `rid`."""
        raise NotImplementedError

    def update_from(self, conn: Connection, target: str, sets: list[str], from_clause: str, where: str) -> None:
        """UPDATE target SET ... FROM from_clause WHERE where (the join condition); a SET expression
        refers to the target's current value as ``<target>.<column>``."""
        conn.exec_driver_sql(f"UPDATE {target} SET {', '.join(sets)} FROM {from_clause} WHERE {where}")

    def bulk_update(self, conn: Connection, table: str, set_cols: list[str], where_col: str, rows: list[tuple[Any, ...]]) -> None:
        """UPDATE table SET set_cols WHERE where_col = ..., for many rows: each row is the new values
        followed by the where value."""
        p = self.caps.placeholder
        sets = ", ".join(f"{c} = {p}" for c in set_cols)
        conn.exec_driver_sql(f"UPDATE {table} SET {sets} WHERE {where_col} = {p}", rows)

    def entry_limit(self, conn: Connection) -> int | None:
        """The most bytes one statement may carry to this site (None: no limit that matters)."""
        return None

    def store_snapshot_rows(
        self, conn: Connection, snap: str, cols: list[str], rows: list[tuple[Any, ...]], applied: bool
    ) -> None:
        """Insert pulled change-log rows into a snapshot, skipping rows already there (same pseq)."""
        # every value a parameter: drivers batch an executemany of a plain VALUES list (PyMySQL
        # rewrites it into multi-row INSERTs only then)
        flag = 1 if applied else 0
        conn.exec_driver_sql(
            self.insert_new_into(snap, ", ".join(cols) + ", applied", f"VALUES ({self.ph(len(cols) + 1)})", "pseq"),
            [(*r, flag) for r in rows],
        )

    def log_write_columns(self, cols: Sequence[str]) -> list[str]:
        """`cols` (change log columns as read) as the columns to write them to."""
        return [self.caps.log_rid_column if c == "rid" else c for c in cols]

    def append_log(
        self,
        conn: Connection,
        table: str,
        cols: Sequence[str],
        select: str | None = None,
        rows: Sequence[tuple[Any, ...]] = (),
        params: tuple[Any, ...] = (),
    ) -> None:
        """Append change-log entries of `table` that this site did not capture (the reconciler's
        relay, add-site's copy), each at a new position, in the order given: the rows of `select`
        (a SELECT of `cols`, as read, with `params`) or `rows` (tuples of `cols`). Default: the
        change log numbers its rows itself (single writer: positions are in commit order)."""
        target = f"INSERT INTO {self.obj(table).log} ({', '.join(self.log_write_columns(cols))}) "
        if select is not None:
            conn.exec_driver_sql(target + select, params)
        elif rows:
            conn.exec_driver_sql(target + f"VALUES ({self.ph(len(cols))})", list(rows))

    def comparable(self, col: Column, expr: str) -> str:
        """`expr`, a value of column `col`, as capture's change test and the apply's comparisons
        with a change's old values compare it: where the column's equality is not identity, or it
        has none, a form whose equality is (PostgreSQL: json, interval, citext as text). Default:
        as it is."""
        return expr

    def column_collations(self, conn: Connection, table: str) -> dict[str, Collation]:
        """Per text column of `table`, its character set and collation, where the database declares
        them per column (docs/mysql.md "Collations"): init names a key or UNIQUE column whose
        collation takes different texts as one value, and a value the column's character set
        cannot hold is held (dialects/fit.py). Default: none (the database compares text as
        codepoints and holds every character)."""
        return {}

    def exact_collation_sql(self, table: str, col: Column) -> str:
        """The statement that makes `col` (with a `collation`, column_collations) of `table`
        compare exactly: its character set's exact collation, the rest of its declaration kept."""
        raise NotImplementedError(f"{self.name} declares no collation per column")

    def explain_rejection(self, conn: Connection, info: TableInfo, e: BaseException) -> str | None:
        """Why this site rejected a change of `info` with `e`, in words naming the value, the
        column and the fix, where the database's own message does not say it (a duplicate that is
        one only under the column's collation, docs/mysql.md "Collations"); None: the database's
        message is kept. Read after the change was rolled back."""
        return None

    def explain_identity_collision(self, conn: Connection, info: TableInfo, e: BaseException) -> str | None:
        """The same for `e` raised writing `info`'s shadow (add-site's copy of it): two identities
        multimaster's own tables here take as one (MariaDB's utf8mb4_bin ignores trailing spaces:
        'k:x' and 'k:x '); None where they compare exactly."""
        return None

    def json_columns(self, conn: Connection, table: str) -> set[str]:
        """The columns of `table` that hold JSON though the database reflects another type (a
        text with a ``json_valid`` CHECK: MariaDB's JSON, SQLite's TEXT); introspection types
        them JSON, keeping their declared type (docs/types.md). Default: none."""
        return set()

    def value_adapters(self, info: TableInfo) -> list[Any]:
        """Per replicated column of `info` at this site, a converter from a value as any peer's
        driver returned it to one this site's driver stores exactly, or None (dialects/types.py)."""
        raise NotImplementedError

    def render(self, template: str, **values: Any) -> list[str]:
        """Render <dialect>/<template>.sql for the driver (render_text): with a "%s" paramstyle a
        literal % comes out as %%."""
        stmts = self.render_text(template, **values)
        return [sql.replace("%", "%%") for sql in stmts] if self.caps.placeholder == "%s" else stmts

    def render_text(self, template: str, **values: Any) -> list[str]:
        """The statements of <dialect>/<template>.sql as SQL text (to splice into another template):
        statements are separated by a line '--', lines starting with '--' are comments, ``$name``
        is a placeholder and ``$$`` passes through unchanged (PL/pgSQL dollar quoting)."""
        text = (templates_dir(self.name) / f"{template}.sql").read_text().replace("$$", "\x00")
        stmts = []
        for chunk in text.split("\n--\n"):
            lines = [ln for ln in chunk.splitlines() if not ln.lstrip().startswith("--")]
            sql = Template("\n".join(lines)).substitute(**values).strip().replace("\x00", "$$")
            if sql:
                stmts.append(sql)
        return stmts

    # ---- connections -------------------------------------------------------------------------
    def engine_kwargs(self, url: str, timeouts: Timeouts | None = None) -> dict[str, Any]:
        """Extra arguments of create_engine for this database; `timeouts`: the site's bounds on a
        new connection and on a wait that hears nothing from the server (dialects/liveness.py)."""
        return {}

    def guard_engine(self, engine: Engine, timeouts: Timeouts) -> None:
        """Make every wait of `engine`'s connections on their server end within `timeouts.bound`
        once the server stops answering (dialects/liveness.py). Default: nothing (a local file)."""

    def prepare_engine(self, engine: Engine) -> None:
        """Install connection event hooks (session settings, transaction begin). Default: none."""

    def prepare_site(self, engine: Engine) -> None:
        """One-time settings outside any transaction, before install. Default: none."""

    def upgrade_on_open(self, engine: Engine) -> list[str]:
        """What an earlier multimaster installed that this release reads differently, brought up to
        date when a process first opens the site (engine/site.py): before any read of it, so a site
        not through `init` again keeps working. Returns the relations changed. Default: none."""
        return []

    def is_retryable(self, exc: BaseException) -> bool:
        """A transient failure (deadlock, serialization failure, lock timeout): roll back and retry."""
        raise NotImplementedError

    def names_missing_column(self, exc: BaseException) -> bool:
        """The statement named a column the table does not have: the engine's description of the
        table is older than the table (an ALTER ... DROP COLUMN ran since it was read), never a
        change the site rejects (engine/isolate.py permanent)."""
        return False

    # ---- lock waits (engine/lockwatch.py, docs/cli.md "Progress and lock waits") ---------------
    def backend_id(self, dbapi_conn: Any) -> int | None:
        """The server's id of the session of a DB-API connection, as the driver knows it (no
        query): what lock_blockers asks about. Default None: no sessions to ask about; a write
        transaction then waits only where it takes the database's write lock, at BEGIN
        (caps.single_writer), and the engine sees that wait itself."""
        return None

    def lock_blockers(self, conn: Connection, backend: int) -> list[Blocker]:
        """The sessions holding the locks that session `backend` waits for now, read on `conn` (a
        connection of its own): [] when it waits for none. A wait whose holder the database does
        not name is one Blocker without a session, its `state` saying what is waited for."""
        raise NotImplementedError

    def unique_sets(self, conn: Connection, table: str) -> list[tuple[str, list[str] | None, str | None]]:
        """The UNIQUE constraints and unique indexes of `table` other than its primary key, each as
        (name, its columns or None, why it cannot be replicated or None: a partial or expression
        index). Default: SQLAlchemy's inspector."""
        from sqlalchemy import inspect

        insp = inspect(conn)
        pk = set(insp.get_pk_constraint(table).get("constrained_columns") or [])
        out: list[tuple[str, list[str] | None, str | None]] = []
        for uc in insp.get_unique_constraints(table):
            out.append((str(uc["name"]), list(uc["column_names"]), None))
        for ix in insp.get_indexes(table):
            if not ix.get("unique") or ix.get("duplicates_constraint"):
                continue
            opts = ix.get("dialect_options") or {}
            cols = list(ix.get("column_names") or [])
            if any(c is None for c in cols) or ix.get("expressions"):
                out.append((str(ix["name"]), None, "an expression index"))
            elif any(k.endswith("_where") and v is not None for k, v in opts.items()):
                out.append((str(ix["name"]), None, "a partial index (WHERE ...)"))
            elif opts.get("postgresql_nulls_not_distinct"):
                out.append((str(ix["name"]), None, "NULLS NOT DISTINCT"))
            else:
                out.append((str(ix["name"]), [str(c) for c in cols], None))
        return [u for u in out if u[1] is None or set(u[1]) != pk]

    # ---- install -----------------------------------------------------------------------------
    def install_site(self, conn: Connection, site: str) -> None:
        """The site's own objects (site template: state, clock, bookkeeping tables) and its name."""
        raise NotImplementedError

    def lock_for_install(self, conn: Connection, tables: Sequence[str]) -> None:
        """At the start of `init`'s transaction at a site: make the applications writing `tables`
        wait for it, before it touches anything their capture uses (a writer holds its table, then
        the bookkeeping its capture writes; init, taking them the other way round, would deadlock
        with it). Nothing where DDL cannot run inside a transaction anyway."""

    def lock_table_writes(self, conn: Connection, table: str) -> None:
        """Hold back every other writer of `table` until this transaction ends (multimaster
        recapture compares and rewrites its rows). Default: as init (lock_for_install); SQLite's
        BEGIN IMMEDIATE already holds every writer back."""
        self.lock_for_install(conn, [table])

    def install_table(self, conn: Connection, info: TableInfo) -> None:
        """Change log, second-order log view, shadow and tombstones of a replicated table."""
        raise NotImplementedError

    def install_snapshot(self, conn: Connection, info: TableInfo, peer: str) -> None:
        """The snapshot of `peer`'s change log of `info` (snapshot template)."""
        self._check_names(info, [peer])
        self.run_install(
            conn,
            self.render(
                "snapshot",
                table=self.quote(info.name),
                peer=peer,
                keytype=self._keytype(info),
                logcols=self._log_cols(info),
                **self.obj(info.name, peer).mapping(),
            ),
        )
        # (a snapshot made by an earlier multimaster has no `pending`, `sup` or `misfit` column yet;
        # misfit: the values of a held change this site cannot store exactly, engine/pull.py)
        self.add_columns(
            conn,
            self.obj(info.name, peer).snapshot(),
            [("pending", self.long_text), ("sup", self.long_text), ("misfit", self.long_text)],
        )

    def install_heads(self, conn: Connection, info: TableInfo) -> None:
        """The columns of concurrent heads (docs/conflicts.md "Concurrent heads"): the change log's
        ``sup`` (the versions an update superseded, written by capture for the slots whose policy
        chooses among heads) and, in the shadow, per such slot ``h_<slot>`` (the versions of the
        slot's heads other than the one the row holds, space-separated) and ``x_<slot>`` (their
        values, JSON; only the reconciler reads it). Idempotent; `init` and a schema change add
        what a table made earlier lacks."""
        o = self.obj(info.name)
        self.add_columns(conn, o.log, [("sup", self.long_text)])
        picks = [s for s in info.spec.slots if s.policy.chooses]
        self.add_columns(conn, o.shadow, [(p + s.name, self.long_text) for s in picks for p in ("h_", "x_")])
        # a slot whose policy no longer chooses forgets its heads: its capture stops clearing them,
        # and heads kept from before would come back, stale, were the policy to choose again
        have = self.existing_columns(conn, o.shadow)
        for s in info.spec.slots:
            h, x = self.quote("h_" + s.name), self.quote("x_" + s.name)
            if not s.policy.chooses and "h_" + s.name in have:
                conn.exec_driver_sql(f"UPDATE {o.shadow} SET {h} = NULL, {x} = NULL WHERE {h} IS NOT NULL")

    def install_capture(self, conn: Connection, info: TableInfo) -> None:
        """The capture triggers of `info` (and the key guard, the rank trigger of a renumbered table)."""
        raise NotImplementedError

    @contextmanager
    def starting_capture(self, conn: Connection, info: TableInfo) -> Iterator[None]:
        """Around what starts capturing `info` at this site (init: its base rows copied in and
        given their identities, then install_capture): the table's writers wait until it is
        done, so that every row is a base row with its identity or a captured one, and a renumbered
        table's key counter is past every key before an insert draws from it. Default: nothing
        more, where the install is one transaction that holds them back already (lock_for_install)."""
        yield

    def capture_without(self, conn: Connection, info: TableInfo, columns: Collection[str]) -> None:
        """Where DDL commits at once (not caps.transactional_ddl), just before an ALTER that drops
        `columns`: the capture triggers of `info` as they are, but naming none of those columns
        (captured as not set: an insert leaves them to each site's default, an update never carries
        them), so that no application write fails between the ALTER and the capture's follow
        (`multimaster ddl`). Where DDL is transactional the triggers are dropped and made again in
        the ALTER's transaction instead, and this is never called."""
        raise NotImplementedError

    def guard_writes(self, conn: Connection, info: TableInfo, site: str, read_only: bool) -> None:
        """At a read-only site (`read_only`, docs/topologies.md "Read-only sites"): triggers named
        ``ro_i``, ``ro_u``, ``ro_d`` refusing every local INSERT, UPDATE and DELETE of `info` with
        :func:`read_only_message`, except the reconciler's own (under the capture guard,
        set_applying); not read-only: none. Idempotent: `init` run again switches it either way."""
        raise NotImplementedError

    def uninstall(self, conn: Connection, tables: Sequence[str], peers: Sequence[str]) -> list[str]:
        """Drop every object multimaster created; returns what was dropped ("kind name")."""
        raise NotImplementedError

    def uninstall_table(self, conn: Connection, table: str, peers: Sequence[str]) -> list[str]:
        """Drop the replication objects of `table` only (docs/schema-changes.md "Stop replicating a
        table"): every trigger multimaster put on it (capture, key guard, catch-up, read-only guards,
        rank), the change log with the triggers on it, the second-order log, shadow and tombstones,
        the snapshot of each of `peers`, the key counter and its functions. The user's table and
        rows stay, and so does everything of the other tables; the bookkeeping rows of `table` are
        forget_table's and the store's. Capture goes first: no write of `table` meets a trigger
        whose change log is gone. Drops only what exists: where DDL is not transactional, a re-run
        after a failure in the middle finishes the job. Returns what was dropped ("kind name")."""
        raise NotImplementedError

    def forget_table(self, conn: Connection, table: str) -> dict[str, int]:
        """Delete the rows of this dialect's own site objects keyed by `table` (after
        uninstall_table); returns the rows deleted per object. Default: none kept."""
        return {}

    def table_kind(self, conn: Connection, name: str) -> str | None:
        """What the object `name` (unqualified, in the bookkeeping schema) is: "view", "table" (any
        other relation) or None when there is none. Inside :func:`catalog_once`, a bookkeeping
        table of the whole site (SITE_TABLES) is answered from one read of them all, a table
        found there not asked again."""
        found = _FOUND.get()
        if found is None or name not in SITE_TABLES:
            return self.read_table_kind(conn, name)
        have = found.get(conn.engine)
        if have is None:
            have = found[conn.engine] = self.read_table_kinds(conn, SITE_TABLES)
        kind = have.get(name)
        if kind is None:  # not there when read (init makes it later, or an earlier release's site): asked each time
            kind = self.read_table_kind(conn, name)
            if kind is not None:
                have[name] = kind
        return kind

    def read_table_kind(self, conn: Connection, name: str) -> str | None:
        """table_kind read from the catalogue."""
        raise NotImplementedError

    def read_table_kinds(self, conn: Connection, names_: Sequence[str]) -> dict[str, str]:
        """table_kind of each of `names_` that exists, in one statement."""
        raise NotImplementedError

    def install_problems(self, conn: Connection, tables: Sequence[str]) -> list[str]:
        """What stops `init` at this site before anything is written, one message per problem: a
        table installed by an earlier multimaster whose second-order log is a table (today a view
        over the change log: its positions do not carry over, init must not adopt them)."""
        out = []
        for t in tables:
            name = names(t).log2
            if self.table_kind(conn, name) == "table":
                out.append(self.older_layout(t, self.mm_table(name)))
        return out

    @staticmethod
    def older_layout(table: str, obj: str) -> str:
        """The install problem of a site whose second-order log `obj` is still the table an earlier
        multimaster kept (today a view over the change log, docs/decisions.md): its positions do
        not carry over, so init must not adopt it."""
        return (
            f"table '{table}' was installed by an earlier multimaster whose second-order log was a table "
            f"({obj}); its positions do not carry over to today's layout. Refresh every site until "
            "quiet, run 'multimaster uninstall' and then 'multimaster init' again"
        )

    def _check_names(self, info: TableInfo, peers: Sequence[str] = ()) -> None:
        """Refuse a table whose objects' or log columns' names the database would not take whole
        (name_problems)."""
        problems = self.name_problems(info, peers)
        if problems:
            raise SchemaError(problems)

    def name_problems(self, info: TableInfo, peers: Sequence[str] = ()) -> list[str]:
        """Names init would make for `info` (and its snapshots of `peers`) that the database would
        not take whole: its objects (the tombstones view's name is the longest of a table's own),
        and the columns of its change log and snapshots, a replicated column's name behind two
        characters (``n_``/``o_`` its values after and before, ``f_`` a reference's identity; a
        slot's ``v_``/``h_``/``x_``). Found by init's checks, before any site is written (before
        session 33 a long column failed MariaDB's install halfway, 1059, and PostgreSQL cut the
        names, two columns sharing their first 61 bytes colliding)."""
        limit, unit = self.caps.max_identifier_length, self.caps.identifier_unit
        size = (lambda x: len(x.encode())) if unit == "bytes" else len
        long = sorted({v for p in (None, *peers) for v in names(info.name, p).mapping().values() if size(v) > limit})
        out = [
            f"table '{info.name}': object name '{n}' is longer than {self.title}'s {limit} {unit}; use a shorter table or site name"
            for n in long
        ]
        derived = {c.name: [p + c.name for p in ("n_", "o_", "f_")] for c in info.columns}
        for sl in info.spec.slots:
            derived.setdefault(sl.name, []).extend(p + sl.name for p in ("v_", "h_", "x_"))
        for col, made in sorted(derived.items()):
            if any(size(m) > limit for m in made):
                out.append(
                    f"table '{info.name}': column '{col}' is too long to replicate: multimaster's logs name it "
                    f"'{made[0]}', longer than {self.title}'s {limit} {unit}; rename it to at most {limit - 2} {unit}, "
                    f"or keep it out (tables.{info.name}.exclude)"
                )
        return out

    def wide_type(self, type_sql: str) -> str:
        """The type a change log or snapshot keeps a column's values in: its own, but a text of
        bounded length is kept as unbounded text and a smaller integer as BIGINT, so a column
        widened at one site (docs/schema-changes.md) is captured, and carried to a site that has
        not widened it yet, whole."""
        t = type_sql.strip().upper()
        if re.match(r"^(CHARACTER VARYING|VARCHAR|NVARCHAR|CHARACTER|CHAR|NCHAR)\s*\(\s*\d+\s*\)", t) and "BINARY" not in t:
            return self.long_text
        if re.match(r"^(SMALLINT|MEDIUMINT|INT|INTEGER|INT2|INT4)(\s*\(\d+\))?(\s+UNSIGNED)?$", t):
            return "BIGINT"
        return type_sql

    def _log_cols(self, info: TableInfo) -> str:
        """The n_/o_ column pairs of a change log or snapshot, as declared in their templates."""
        q = self.quote
        parts = []
        for c in info.columns:
            t = f" {self.wide_type(c.type_sql)}" if c.type_sql else ""
            parts.append(f",\n  {q('n_' + c.name)}{t},\n  {q('o_' + c.name)}{t}")
        return "".join(parts)

    def _keytype(self, info: TableInfo) -> str:
        """The type the framework's own tables (shadow, change log, snapshots) keep a key in."""
        return info.key.type_sql

    # ---- schema changes (docs/schema-changes.md, engine/evolve.py) -----------------------------
    #: the type of a snapshot's ``pending`` column (JSON text of any length)
    long_text: str = "TEXT"
    #: the type of a version column (the shadow's ``v_<slot>``)
    version_type: str = "TEXT"

    def column_signature(self, conn: Connection, table: str) -> str:
        """One cheap catalog read of `table`'s columns (names, declared types, nullability,
        defaults) as text: when it differs from the one recorded with the current schema version,
        the table changed (engine/evolve.py)."""
        raise NotImplementedError

    def triggers_on(self, conn: Connection, table: str) -> set[str]:
        """The names of the triggers on `table` (one cheap catalog read)."""
        raise NotImplementedError

    def table_signature(self, conn: Connection, table: str) -> str:
        """`table`'s columns (column_signature) and which of its capture triggers exist: a table
        made again (a migration tool's copy on SQLite, DROP and CREATE) or whose capture was
        dropped reads differently from the signature recorded when its capture was made, even
        with the same columns (engine/evolve.py, docs/schema-changes.md "A table made again")."""
        return f"{self.column_signature(conn, table)} capture={','.join(self.capture_present(conn, table))}"

    def table_signatures(self, conn: Connection, tables: Sequence[str]) -> dict[str, str]:
        """:meth:`table_signature` of each of `tables` (`status`, engine/evolve.py changed_tables);
        a dialect reads them in one statement per kind where it can (over a WAN each statement is
        a round trip)."""
        return {t: self.table_signature(conn, t) for t in tables}

    def capture_lacks(self, conn: Connection, info: TableInfo) -> list[str]:
        """The columns of `info` (its current schema version) its insert capture trigger does not
        write (its text names no change-log column of theirs): a capture made for an earlier
        version. [] where the trigger is missing (a table made again: the follow finds that)."""
        text = self.trigger_texts(conn, info.name).get(names(info.name).cap_i)
        return [] if text is None else [c.name for c in info.columns if self.quote("n_" + c.name) not in text]

    def capture_present(self, conn: Connection, table: str) -> list[str]:
        """The capture triggers of `table` that exist (sorted; all three when capture works)."""
        o = names(table)
        return sorted({o.cap_i, o.cap_u, o.cap_d} & self.triggers_on(conn, table))

    def existing_columns(self, conn: Connection, obj: str) -> set[str]:
        """The columns of relation `obj` (as written in SQL)."""
        res = conn.exec_driver_sql(f"SELECT * FROM {obj} WHERE 1 = 0")
        return set(res.keys())

    def run_install(self, conn: Connection, stmts: Sequence[str]) -> None:
        """Run an install template's statements, leaving out each ``ALTER TABLE t ADD COLUMN IF NOT
        EXISTS c`` whose table has the column already (the templates create their tables whole;
        the ALTERs are there for tables an earlier version made): MariaDB takes ~20 ms for such a
        statement even when it changes nothing, and init runs dozens."""
        have: dict[str, set[str]] = {}
        for sql in stmts:
            m = _ADD_IF_MISSING.match(sql)
            if m:
                obj = m.group(1)
                if obj not in have:
                    have[obj] = self.existing_columns(conn, obj)
                if m.group(2).strip('`"') in have[obj]:
                    continue
                have.pop(obj)  # read again after the column is added
            conn.exec_driver_sql(sql)

    def add_columns(self, conn: Connection, obj: str, cols: Sequence[tuple[str, str]]) -> None:
        """Add the columns (name, type SQL) that relation `obj` lacks."""
        have = self.existing_columns(conn, obj)
        for name, type_sql in cols:
            if name not in have:
                conn.exec_driver_sql(f"ALTER TABLE {obj} ADD COLUMN {self.quote(name)} {type_sql}".rstrip())

    def retype_column(self, conn: Connection, obj: str, col: str, type_sql: str) -> None:
        """Give column `col` of relation `obj` the type `type_sql` (a widened type)."""
        conn.exec_driver_sql(f"ALTER TABLE {obj} ALTER COLUMN {self.quote(col)} TYPE {type_sql}")

    def drop_capture(self, conn: Connection, info: TableInfo) -> None:
        """Drop the capture triggers of `info` (the only objects naming its columns), for a schema
        change that the database refuses while a trigger names the column, or that would break them;
        install_capture makes them again. Default: DROP TRIGGER by name."""
        o = self.obj(info.name)
        self.drop_triggers(conn, info.name, (o.cap_i, o.cap_u, o.cap_d))

    def lock_follow(self, conn: Connection, table: str) -> None:
        """Before a follow of `table`'s schema (engine/evolve.py): keep every other follow of it
        out until unlock_follow, also across the commits DDL makes. Default: none (DDL is
        transactional: the follow's transaction holds its locks to the end)."""

    def unlock_follow(self, conn: Connection, table: str) -> None:
        """After a follow of `table`: what lock_follow took. Default: none."""

    @contextmanager
    def short_ddl_waits(self, conn: Connection) -> Iterator[None]:
        """Around a follow's DDL: where a DDL statement waiting for a table's metadata lock makes
        every later statement on the table queue behind it (MariaDB), it waits briefly and fails
        as a lock wait, which the caller retries. Default: nothing (DDL takes its locks inside the
        follow's transaction, in the order the follow takes them)."""
        yield

    def drop_triggers(self, conn: Connection, table: str, names: Sequence[str]) -> None:
        """DROP TRIGGER IF EXISTS each trigger of `names` (on `table`, where the database names
        triggers per table)."""
        for t in names:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {t}")

    # ---- apply: capture guard, locks, keys, clock ---------------------------------------------
    def set_applying(self, conn: Connection, on: bool) -> None:
        """Set (or reset) the capture guard for this transaction: while set, the capture triggers
        skip the changes the reconciler applies. Invisible to every other connection."""
        raise NotImplementedError

    def lock_for_apply(self, conn: Connection, info: TableInfo) -> None:
        """Called first when reconciling `info` at this site: serialize the reconcilers of the
        table (a relay must write an origin's changes in version order). Default: none (the write
        transaction is the only writer)."""

    def lock_writers(self, conn: Connection, info: TableInfo) -> None:
        """Wait for the local writers of renumbered `info` in flight and hold back new ones until
        the transaction ends: taken by the reconciler before it gives keys (new identities, key
        shifts, normalize_keys) and before it locks any row, so the identities it ranks are all
        there. Default: none (the write transaction is the only writer).

        In a write transaction with brief waits (the BRIEF_WAITS execution option, Site.write),
        every lock wait after it, for the rest of the transaction, gives up at once instead of
        waiting (a retryable error, and the caller runs the transaction again): holding back the
        table's writers, the reconciler never waits for a row an application holds, so no
        application waits behind a reconciler that waits for another application, and none is
        the victim of a deadlock with it (a writer that locked its row before the lock the
        reconciler holds). The wait for the writers' lock itself, and lock_for_apply's, stay
        patient. docs/concepts.md "Many writers"."""

    def read_horizon(self, conn: Connection, table: str) -> int | None:
        """The position below which every change-log entry of `table` at this site is final: its
        transaction committed (the entry is visible to a statement started after this call) or
        rolled back (it never will be). Run in its own statement, before the statement reading
        the entries. None: every committed entry is final (positions are given in commit order)."""
        return None

    def read_horizons(self, conn: Connection, tables: Sequence[str]) -> dict[str, int | None]:
        """read_horizon of each of `tables`, then what the dialect settles before entries below
        them are read (MariaDB stamps the entries' transaction ids). A reader of several tables
        reads all their horizons through this one call."""
        return {tb: self.read_horizon(conn, tb) for tb in tables}

    def txn_bounds(self, conn: Connection, lo: int, hi: int) -> dict[str, list[int]] | None:
        """Where a change-log entry's ``txn`` may name several transactions of one connection (the
        connection and an epoch, MariaDB): per connection, in increasing order, the recorded bounds
        between its transactions that a reader of positions `lo`..`hi` needs (those in the range
        and the first past it): every entry of the connection at or below a bound belongs to a
        transaction that ended there or before, every later one to a later transaction, so a reader
        splits the connection's ``txn`` at each (engine/pull.py _split_txns). None: ``txn`` names
        one transaction (or none is recorded)."""
        return None

    @dataclass(frozen=True)
    class OpenWriter:
        """The transaction at a site that holds its horizon lowest (status: "held at the source")."""

        who: str  # 'backend pid 4242' / 'connection 57'
        open_s: float | None  # how long its transaction has been open
        state: str | None  # what the session does now ('idle in transaction', its statement)
        fix: str  # the statement that ends it, run at the site

    def open_writer(self, conn: Connection) -> "Dialect.OpenWriter | None":
        """Where writers capture concurrently: the capturing transaction still open that holds
        this site's horizon lowest (every change committed after it began waits for it at every
        puller), None when none is open. Default: None (no horizon)."""
        return None

    def trim_txn_bounds(self, conn: Connection, below: int | None) -> None:
        """Forget the transaction bounds below position `below`, the lowest the change logs still
        hold (None: they hold none); purge calls it. Default: none are kept."""

    #: registry_rows past which `status` warns (docs/mysql.md "The transaction registry")
    REGISTRY_WARN = 1_000_000

    def registry_rows(self, conn: Connection, exact: bool = False) -> int | None:
        """Rows of the server's record of the transactions capture ran in, which multimaster
        cannot trim row by row (MariaDB's mysql.transaction_registry): the server's estimate
        unless `exact`; None: no such record (or no right to read it)."""
        return None

    def trim_registry(self, conn: Connection) -> str | None:
        """Empty that record where it is allowed and safe (purge calls it, on a connection outside
        any transaction: it may be DDL); returns what it did or why it did not. None: nothing to do."""
        return None

    def lock_rows(self, conn: Connection, info: TableInfo, tmp: str) -> None:
        """Lock the rows (user table, then shadow) of the identities listed in `tmp`, before they are
        read, so an application's concurrent update waits instead of being overwritten."""
        raise NotImplementedError

    #: the catalogue (table_kind) hides a table the login may not read (MariaDB's information_schema)
    hides_unreadable = False

    def is_permission_denied(self, exc: BaseException) -> bool:
        """Whether `exc` is the database refusing this login a privilege."""
        return False

    def lock_keys(self, conn: Connection, info: TableInfo, keys: Sequence[int]) -> None:
        """Before the reconciler moves the keys `keys` of `info` (apply.normalize_keys): lock
        their rows where a plain UPDATE's wait would not do (MariaDB with brief waits,
        _lock_or_retry). Default: nothing (the UPDATE's own wait is bounded)."""

    def shift_keys(self, conn: Connection, info: TableInfo, shifts: Iterable[tuple[int, int | None, int]], offset: int) -> None:
        """Move existing keys: rows with low < key <= high get key + delta, in the user table and the
        shadow, without ever colliding with a unique key on the way (two passes through `offset`)."""
        q = self.quote
        p = self.caps.placeholder
        for tbl, col in ((q(info.name), q(info.key.name)), (self.obj(info.name).shadow, self.key_col)):
            for low, high, delta in shifts:
                if high is None:
                    conn.exec_driver_sql(
                        f"UPDATE {tbl} SET {col} = {col} + {p} WHERE {col} > {p} AND {col} < {p}", (delta + offset, low, offset)
                    )
                else:
                    conn.exec_driver_sql(
                        f"UPDATE {tbl} SET {col} = {col} + {p} WHERE {col} > {p} AND {col} <= {p}", (delta + offset, low, high)
                    )
            conn.exec_driver_sql(f"UPDATE {tbl} SET {col} = {col} - {p} WHERE {col} > {p}", (offset, offset))

    def after_apply(self, conn: Connection, info: TableInfo) -> None:
        """Follow-ups after keys were assigned: move whatever gives a plain insert its key (a
        sequence, a counter) past the highest key (forward only: local inserts may be in flight)."""
        raise NotImplementedError

    #: how an application's own trigger tells the reconciler's writes from the site's own: the
    #: capture guard (set_applying) as a trigger reads it (docs/operations.md "Your own triggers")
    applying_flag: str = ""
    #: the text an application trigger guarded that way contains (matched ignoring case)
    applying_marker: str = ""

    def trigger_texts(self, conn: Connection, table: str) -> dict[str, str]:
        """The triggers on `table` that fire (disabled ones left out), each name with its whole
        text: the trigger's definition and, where a trigger calls a function, the function's."""
        raise NotImplementedError

    def unguarded_caveats(self, conn: Connection, table: str) -> list[str]:
        """What init says of each application trigger on replicated `table` that does not read the
        capture guard: it fires for the peers' changes the reconciler applies, too."""
        found = unguarded_triggers(self.trigger_texts(conn, table), self.applying_marker)
        return [unguarded_trigger_message(t, table, self.applying_flag) for t in found]

    def insert_key_caveat(self, conn: Connection, info: TableInfo) -> str | None:
        """What an application inserting into renumbered table `info` here is told of the new
        row's key that may not be its key (init says it); None: the key it is told is the row's
        until the next reconcile moves it (as it moves any key)."""
        return None

    def before_capture_again(self, conn: Connection, info: TableInfo) -> None:
        """Just before the capture of a table made again is installed (engine/evolve.py): where
        DDL commits at once, applications keep inserting between the statements that make the
        triggers. Default: nothing (DDL in the same transaction as the rest)."""

    def heads_capture(self, spec: Any, cond: Callable[[Any], str], old: str = "") -> tuple[list[str], str | None]:
        """What an update trigger adds for the slots whose policy chooses among concurrent heads
        (docs/conflicts.md "Concurrent heads"), `cond(slot)` being the SQL condition that the
        update sets the slot and `old` the shadow row's alias (with its dot) where the dialect
        needs one: the SET items that clear each such slot's other heads (``h_``, ``x_``) when it
        is set, and the expression of ``sup`` over the shadow row before the update (for each such
        slot set: its ``v_``, ``=`` when NULL, and its ``h_``, space-separated; NULL when none is
        set), None when the table has no such slot."""
        q = self.quote
        picks = [(s, cond(s)) for s in spec.slots if s.policy.chooses]
        clear = [
            f"{q(p + s.name)} = CASE WHEN {c} THEN NULL ELSE {old}{q(p + s.name)} END" for s, c in picks for p in ("h_", "x_")
        ]
        if not picks:
            return clear, None
        space = "' '"
        pieces = []
        for s, c in picks:
            ver = f"coalesce({old}{q('v_' + s.name)}, '=')"
            others = f"coalesce({self.concat(space, old + q('h_' + s.name))}, '')"
            pieces.append(f"coalesce(CASE WHEN {c} THEN {self.concat(ver, others)} END, '')")
        joined = self.concat(*[x for piece in pieces for x in (piece, space)][:-1])
        return clear, f"nullif(trim({joined}), '')"

    def reset_key_counter(self, conn: Connection, info: TableInfo, top: int) -> None:
        """Under lock_writers, after normalize_keys: the next local insert into `info` (renumbered)
        takes key top + 1 where the counter can be moved back. A counter that a rollback does not
        move back (a sequence) must not go below any key a rollback of the transaction would bring
        back: the caller's `top` accounts for that (engine/apply.py keys_ranked_now). It leaves
        every counter at least where after_apply would (a reconcile that gives keys calls this
        one, not both). Default: after_apply's forward move."""
        self.after_apply(conn, info)

    def advance_clock(self, conn: Connection, hlc: int, table: str | None = None) -> None:
        """Move this site's clock to at least `hlc` (a version of `table` received from a peer; no
        table: the whole site's clock, as add-site does)."""
        raise NotImplementedError

    def read_clock(self, conn: Connection) -> int | None:
        """This site's clock: at least every version it gave or received (None: not installed)."""
        raise NotImplementedError

    def catch_up(self, conn: Connection, info: TableInfo) -> None:
        """Bring the shadow of `info` up to date with this site's own changes, for dialects whose
        capture triggers write the shadow lazily (SQLite, renumbered tables). Inside a write
        transaction. Default: nothing (the capture triggers keep the shadow)."""

    def fresh_identities_select(self, table: str) -> str | None:
        """A SELECT of (rid, key) for this site's own rows not yet in the shadow (see catch_up), for
        readers that cannot write (verify). Default: None (the shadow is kept eagerly)."""
        return None

    def fresh_identities(self, conn: Connection, info: TableInfo) -> list[tuple[Any, ...]]:
        """(rid, key) of this site's own rows not yet in the shadow (see catch_up); read-only."""
        sql = self.fresh_identities_select(info.name) if info.spec.renumber else None
        return [] if sql is None else [tuple(r) for r in conn.exec_driver_sql(f"{sql} ORDER BY rid")]

    # ---- foreign keys between replicated tables (docs/foreign-keys.md) -------------------------
    #: the type of a change log's or snapshot's ``f_<col>`` / ``fo_<col>`` columns (an identity)
    reference_type: str = "TEXT"

    def foreign_keys(self, conn: Connection, table: str) -> list[dict[str, Any]]:
        """The declared foreign keys of `table`, as SQLAlchemy's inspector gives them
        (constrained_columns, referred_table, referred_columns, name, options with ``ondelete`` /
        ``onupdate`` when declared)."""
        from sqlalchemy import inspect

        return list(inspect(conn).get_foreign_keys(table))  # type: ignore[arg-type]

    def install_reference_capture(self, conn: Connection, info: TableInfo) -> None:
        """Make this site's capture write, for every reference of `info` (``info.refs``), the
        identity of the referenced row beside the key: ``f_<col>`` for the new value (inserts,
        updates of the column), ``fo_<col>`` for the old one (updates of the column, deletes),
        looked up in the parent's shadow (and, where it is written lazily, in the parent's change
        log past its catch-up point). Only entries this site captures (origin = this site).
        Idempotent."""
        raise NotImplementedError

    def make_foreign_key_deferrable(self, conn: Connection, table: str, name: str) -> None:
        """Make foreign key `name` of `table` (one referencing a renumbered table) deferrable where
        the database needs it for defer_foreign_keys (applications see no difference). Default:
        nothing."""

    def defer_foreign_keys(self, conn: Connection, on: bool) -> bool:
        """`on`: from now until this transaction ends, foreign-key checks wait for COMMIT (or, where
        the database cannot defer them, are off for this session until called with False).
        Returns whether the database still carries out ON UPDATE CASCADE actions meanwhile."""
        raise NotImplementedError

    # ---- outside the engine: verify's readers and repair (multimaster/spark/), pull grants ----
    # (multimaster/grants.py) and site files (site.py, topology.py). Each dialect declares these in
    # one section at the end of its class; nothing outside multimaster/dialects/ branches on a name.

    @dataclass(frozen=True)
    class Jdbc:
        """How Spark's JDBC source reads a site of this database (plain data: no PySpark, no JVM).
        A dialect declares ``jdbc = Dialect.Jdbc(...)``."""

        #: the JDBC driver class, passed as the `driver` property so Spark loads exactly this one
        driver: str
        #: the driver's jar file name under /usr/share/java (MM_JDBC_JARS overrides it) ...
        jar: str
        #: ... and the Debian package that installs it, named in the error when the jar is missing
        package: str
        #: JDBC URL prefix; Spark also chooses its own SQL dialect (quoting, types) from it
        scheme: str
        #: port used when the SQLAlchemy URL names none, in ``<scheme>://host:port/database``;
        #: None: the database is a file and the URL is ``<scheme>:<absolute path>`` (database_file)
        default_port: int | None = None
        #: the Spark SQL type the driver is asked to return for each canonical value kind
        #: (multimaster/spark/schema.py), as the read's `customSchema`, before verify's own cast;
        #: None: the driver reports the declared column types, which are right
        read_types: dict[str, str] | None = None

    #: how Spark reads this database; None: verify cannot read it
    jdbc: Jdbc | None = None
    #: the database has logins that privileges are granted to (False: access is the file's)
    has_logins: bool = True
    #: the statement opening repair's write transaction on an engine made with
    #: `writer_engine_kwargs` (None: SQLAlchemy's own begin)
    writer_begin: str | None = None

    def mm_name(self, name: str) -> str:
        """The quoted name of multimaster object `name`, qualified by the bookkeeping schema if any
        (for connections without multimaster's search path: verify's readers, repair)."""
        return self.mm_table(self.quote(name))

    def database_file(self, url: str) -> str | None:
        """The path of the file `url`'s database lives in, as written in the URL (connecting to a
        missing one would create it empty; a relative one resolves against the topology file's
        folder); None for a server database or one that is no plain file."""
        return None

    def writer_engine_kwargs(self) -> dict[str, Any]:
        """create_engine options of a plain engine (none of multimaster's connection hooks) that
        writes at a site with the capture guard set: verify's repair."""
        return {}

    def pull_grants(self, site: str, peer: str, login: str, database: str, objects: Sequence[str]) -> list[str]:
        """Statements run at `site` by its owner (idempotent) creating `login`, the login `peer`'s
        refresher pulls with, allowed to SELECT `objects` (multimaster objects, unqualified: the
        change logs, second-order logs and purge horizon) and nothing else; comments (``--``) where
        the database has no logins."""
        raise NotImplementedError


def table_relations(table: str, peers: Sequence[str]) -> tuple[list[str], list[str]]:
    """The views and the tables multimaster makes for replicated `table` (names as created): the
    second-order log and tombstones; the change log, shadow and the snapshot of each of `peers`."""
    n = names(table)
    return [n.log2, n.tombstones], [n.log, n.shadow, *(names(table, p).snapshot() for p in peers)]


def unguarded_triggers(texts: Mapping[str, str], marker: str) -> list[str]:
    """The application triggers among `texts` (name -> text; multimaster's own are named
    ``_mm_...``) whose text does not contain `marker` (ignoring case), sorted."""
    return sorted(n for n, text in texts.items() if not n.startswith("_mm_") and marker.lower() not in text.lower())


def unguarded_trigger_message(trigger: str, table: str, flag: str) -> str:
    """init's note on an application trigger of replicated `table` that does not read `flag`."""
    return (
        f"trigger {trigger} on {table} also fires when multimaster applies a peer's change (it does not read {flag}): "
        "a trigger that sets a column (updated_at) makes the sites differ, an audit trigger records the peers' "
        'changes; docs/operations.md "Your own triggers" shows the guard'
    )


def read_only_message(site: str, table: str) -> str:
    """The error a read-only site's triggers give an application writing replicated `table`."""
    return f"multimaster: site '{site}' is read-only: table '{table}' is written only by replication"


def shadow_key_index(table: str) -> str:
    """Name of the (non-unique) index on the key of a natural-key table's shadow, which holds one
    row per incarnation of a key (docs/conflicts.md). No longer than the tombstones view's name."""
    return f"_mm_shadowk_{table}"


def capture_fragments(
    quote: Any, cols: Any, spec: Any, new: str, old: str, own: list[str], absent: Collection[str] = ()
) -> dict[str, Any]:
    """The column lists every dialect's capture triggers splice into their templates: `new` / `old`
    name the row references (NEW/OLD, or transition-table aliases), `own` is each column's own
    "changed" condition in the dialect's SQL. `absent`: columns about to be dropped, which the
    triggers must not name (their values NULL, their `own` conditions FALSE: Dialect.capture_without)."""
    diff = group_diffs(own, spec)

    def val(row: str, c: Any) -> str:
        return "NULL" if c.name in absent else f"{row}.{quote(c.name)}"

    return {
        "ncols": "".join(f", {quote('n_' + c.name)}" for c in cols),
        "ocols": "".join(f", {quote('o_' + c.name)}" for c in cols),
        "newvals": "".join(f", {val(new, c)}" for c in cols),
        "oldvals": "".join(f", {val(old, c)}" for c in cols),
        "diff": diff,
        "updnew": "".join(f", CASE WHEN {d} THEN {val(new, c)} END" for d, c in zip(diff, cols)),
        "updold": "".join(f", CASE WHEN {d} THEN {val(old, c)} END" for d, c in zip(diff, cols)),
    }


def group_diffs(own: list[str], spec: Any) -> list[str]:
    """Per column, the SQL condition under which a captured update carries it: its own change, or
    for a column of a group any change in the group (the change then carries the whole group, old
    and new, which is what "win together" compares)."""
    diff = list(own)
    for s in spec.slots:
        if len(s.columns) > 1:
            cond = "(" + " OR ".join(own[i] for i in s.columns) + ")"
            for i in s.columns:
                diff[i] = cond
    return diff


_cache: dict[str, Dialect] = {}


def get_dialect(name: str) -> Dialect:
    """The dialect object for a SQLAlchemy dialect name ('sqlite', 'postgresql', 'mysql')."""
    if name not in _cache:
        try:
            mod = importlib.import_module(f"multimaster.dialects.{name}")
        except ModuleNotFoundError:
            from multimaster.errors import ConfigError

            raise ConfigError([f"database '{name}' is not supported (supported: sqlite, postgresql, mysql)"]) from None
        _cache[name] = mod.DIALECT
    return _cache[name]


def capture_text_signature(columns: str, table: str, texts: Mapping[str, str]) -> str:
    """Dialect.table_signature of `table` with `columns` (column_signature), its triggers' `texts`
    (trigger_texts) and a digest of those of its capture."""
    o = names(table)
    caps = sorted({o.cap_i, o.cap_u, o.cap_d} & set(texts))
    digest = hashlib.md5("\n".join(f"{n}:{texts[n]}" for n in caps).encode()).hexdigest()
    return f"{columns} capture={','.join(caps)} text={digest}"
