"""The seam between the engine and each database: one small module per dialect.

A dialect module ``multimaster/dialects/<sqlalchemy dialect name>.py`` exposes ``DIALECT``, an
instance of a :class:`Dialect` subclass, and its SQL lives in ``triggers/<name>/*.sql`` templates
with ``$placeholders`` only (identifiers and column lists are built in Python, every identifier
quoted). The engine never branches on a dialect's name: it calls these methods and reads the
capabilities. See docs/adding-a-dialect.md.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, Iterable, Sequence

from sqlalchemy.engine import Connection, Engine

from multimaster.core.versions import BASE_VER
from multimaster.dialects.schema import TableInfo, names

__all__ = ["Capabilities", "Dialect", "get_dialect", "templates_dir", "shadow_key_index"]


@dataclass(frozen=True)
class Capabilities:
    """What a database can do, each with the reason it matters to the engine."""

    #: DDL runs inside a transaction and rolls back with it (init is then all-or-nothing per site).
    transactional_ddl: bool
    #: longest identifier; object names are checked against it at init.
    max_identifier_length: int
    #: parameter marker used with exec_driver_sql (DB-API paramstyle).
    placeholder: str
    #: one writer at a time: the apply transaction takes the write lock up front.
    single_writer: bool


def templates_dir(dialect: str) -> Path:
    """Where the SQL templates of `dialect` are: its own folder, beside its Python
    (multimaster/dialects/<name>/*.sql)."""
    return Path(__file__).resolve().parent / dialect


class Dialect:
    name: str = ""
    caps: Capabilities
    #: INSERT that skips rows whose unique key exists ("INSERT OR IGNORE", "INSERT IGNORE", ...)
    insert_ignore: str = "INSERT"
    #: the two-argument maximum function ("max" in SQLite, "GREATEST" elsewhere)
    greatest: str = "GREATEST"

    #: SQL expression: exclusive upper bound of the second-order log `seq2` a peer may read now,
    #: so an entry committed later can never land below a watermark already handed out (None: every
    #: committed entry is final, as with SQLite's single writer).
    log2_horizon: str | None = None

    #: the second-order log is a view over the change log (every entry its own append record,
    #: seq2 = seq; SQLite, docs/decisions.md) rather than a table filled by a trigger on the log:
    #: purge then has no second-order rows to delete and records its horizon from the log alone
    log2_is_view: bool = False

    #: the reconciler may apply plain changes set-based (multimaster/fastpath.py), reading rows and
    #: then writing them without row locks: only true where no other writer of the table can commit
    #: while the apply transaction runs
    set_based_apply: bool = False

    #: null-safe equality operator
    null_safe_eq: str = "IS NOT DISTINCT FROM"

    def temp_name(self, name: str) -> str:
        """The name to use for a connection-local scratch table."""
        return self.quote(name)

    def create_temp(self, conn: Connection, name: str, select: str, keys: str | None = None, index: str | None = "rid") -> None:
        """Create a connection-local table from a SELECT; `keys` becomes unique, `index` indexed
        (when the SELECT has such a column)."""
        base = name.strip('"').strip("`")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {name} AS {select}")
        if keys:
            conn.exec_driver_sql(f"CREATE UNIQUE INDEX {self.quote(base + '_k')} ON {name} ({keys})")
        if index and index != keys and f" {index}" in select.replace(",", " ").replace(".", " "):
            conn.exec_driver_sql(f"CREATE INDEX {self.quote(base + '_i')} ON {name} ({index})")

    def drop_temp(self, conn: Connection, name: str) -> None:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")

    def update_from(self, conn: Connection, target: str, sets: list[str], from_clause: str, where: str) -> None:
        """UPDATE target SET ... FROM from_clause WHERE where (the join condition)."""
        conn.exec_driver_sql(f"UPDATE {target} SET {', '.join(sets)} FROM {from_clause} WHERE {where}")

    def update_target_ref(self, target: str, column: str) -> str:
        """How a SET expression of update_from refers to the target's current value."""
        return f"{target}.{column}"

    def temp_rids(self, conn: Connection) -> str:
        """Create (if needed) and name a connection-local table with one TEXT column `rid`."""
        raise NotImplementedError

    def insert_ignore_into(self, table: str, cols: str, source: str) -> str:
        """INSERT of `source` (``VALUES (...)`` or a SELECT) into `table` (`cols`), skipping rows whose
        unique key already exists."""
        return f"{self.insert_ignore} INTO {table} ({cols}) {source}"

    def value_adapters(self, info: TableInfo) -> list[Any]:
        """Per replicated column of `info` at this site, a converter from a value as any peer's
        driver returned it to one this site's driver stores exactly, or None (dialects/types.py).
        The default is SQLite's (ISO-8601 text for dates and times, decimals as exact text)."""
        from multimaster.dialects import types

        return [types.adapter(types.SQLITE, types.kind_of(self.name, c)) for c in info.columns]

    def is_retryable(self, exc: BaseException) -> bool:
        """A transient failure (deadlock, serialization failure, lock timeout): roll back and retry."""
        return "database is locked" in str(getattr(exc, "orig", exc))

    # ---- templates -------------------------------------------------------------------------
    def render(self, template: str, **values: Any) -> list[str]:
        """Render triggers/<dialect>/<template>.sql; statements are separated by a line '--'."""
        text = (templates_dir(self.name) / f"{template}.sql").read_text()
        stmts = []
        for chunk in text.split("\n--\n"):
            lines = [ln for ln in chunk.splitlines() if not ln.lstrip().startswith("--")]
            sql = Template("\n".join(lines)).substitute(**values).strip()
            if sql:
                stmts.append(sql)
        return stmts

    def quote(self, ident: str) -> str:
        return '"' + ident.replace('"', '""') + '"'

    # ---- connections -----------------------------------------------------------------------
    def prepare_engine(self, engine: Engine) -> None:
        """Install connection event hooks (pragmas, transaction begin)."""

    def engine_kwargs(self, url: str) -> dict[str, Any]:
        return {}

    def begin_write(self, conn: Connection) -> None:
        """Called first in every transaction that writes replicated data (takes locks early)."""

    # ---- install ---------------------------------------------------------------------------
    def install_site(self, conn: Connection, site: str) -> None:
        raise NotImplementedError

    def install_table(self, conn: Connection, info: TableInfo) -> None:
        raise NotImplementedError

    def install_snapshot(self, conn: Connection, info: TableInfo, peer: str) -> None:
        raise NotImplementedError

    def install_capture(self, conn: Connection, info: TableInfo) -> None:
        raise NotImplementedError

    def uninstall(self, conn: Connection, tables: Sequence[str], peers: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def installed_tables(self, conn: Connection) -> list[str]:
        raise NotImplementedError

    # ---- apply -----------------------------------------------------------------------------
    def set_applying(self, conn: Connection, on: bool) -> None:
        raise NotImplementedError

    def upsert_watermark(self, conn: Connection, peer: str, table: str, seq2: int) -> None:
        raise NotImplementedError

    def shift_keys(self, conn: Connection, info: TableInfo, shifts: Iterable[tuple[int, int | None, int]], offset: int) -> None:
        """Move existing keys: rows with low < key <= high get key + delta, in the user table and the
        shadow, without ever colliding with a unique key on the way (two passes through `offset`)."""
        q = self.quote
        p = self.caps.placeholder
        for tbl, col in ((q(info.name), q(info.key.name)), (self.obj(info.name)["shadow"], q("key"))):
            for low, high, delta in shifts:
                if high is None:
                    conn.exec_driver_sql(f"UPDATE {tbl} SET {col} = {col} + {p} WHERE {col} > {p} AND {col} < {p}", (delta + offset, low, offset))
                else:
                    conn.exec_driver_sql(f"UPDATE {tbl} SET {col} = {col} + {p} WHERE {col} > {p} AND {col} <= {p}", (delta + offset, low, high))
            conn.exec_driver_sql(f"UPDATE {tbl} SET {col} = {col} - {p} WHERE {col} > {p}", (offset, offset))

    def after_apply(self, conn: Connection, info: TableInfo) -> None:
        """Dialect follow-ups after keys were assigned (move a sequence past the highest key)."""

    def lock_for_apply(self, conn: Connection, info: TableInfo) -> None:
        """Called first when reconciling `info` at this site: take whatever lock the capture
        triggers take to give keys and versions (SQLite: none, BEGIN IMMEDIATE already holds it)."""

    def lock_rows(self, conn: Connection, info: TableInfo, tmp: str) -> None:
        """Lock the rows (user table, then shadow) of the identities listed in `tmp`, before they are
        read, so an application's concurrent update waits instead of being overwritten."""

    def advance_clock(self, conn: Connection, hlc: int, table: str | None = None) -> None:
        """Move this site's clock to at least `hlc` (a version of `table` received from a peer)."""
        conn.exec_driver_sql(f"UPDATE _mm_state SET hlc = {self.greatest}(hlc, {self.caps.placeholder})", (hlc,))

    def read_clock(self, conn: Connection) -> int | None:
        v = conn.exec_driver_sql("SELECT hlc FROM _mm_state").scalar()
        return None if v is None else int(v)

    def mark_applied(self, conn: Connection, table: str, origin: str, ver: str) -> None:
        """Raise `_mm_origins.max_ver` of (table, origin) to at least `ver`."""
        p = self.caps.placeholder
        cur = conn.exec_driver_sql(f"SELECT max_ver FROM _mm_origins WHERE tbl = {p} AND origin = {p}", (table, origin)).first()
        if cur is None:
            conn.exec_driver_sql(f"INSERT INTO _mm_origins (tbl, origin, max_ver) VALUES ({p}, {p}, {p})", (table, origin, ver))
        elif cur[0] < ver:
            conn.exec_driver_sql(f"UPDATE _mm_origins SET max_ver = {p} WHERE tbl = {p} AND origin = {p}", (ver, table, origin))

    def bulk_update(self, conn: Connection, table: str, set_cols: list[str], where_col: str, rows: list[tuple[Any, ...]]) -> None:
        """UPDATE table SET set_cols WHERE where_col = ..., for many rows: each row is the new values
        followed by the where value."""
        p = self.caps.placeholder
        sets = ", ".join(f"{c} = {p}" for c in set_cols)
        conn.exec_driver_sql(f"UPDATE {table} SET {sets} WHERE {where_col} = {p}", rows)

    def store_snapshot_rows(self, conn: Connection, snap: str, cols: list[str], rows: list[tuple[Any, ...]], applied: bool) -> None:
        """Insert pulled change-log rows into a snapshot, skipping rows already there (same pseq)."""
        # every value a parameter: drivers batch an executemany of a plain VALUES list (PyMySQL
        # rewrites it into multi-row INSERTs only then)
        flag = 1 if applied else 0
        conn.exec_driver_sql(
            self.insert_ignore_into(snap, ", ".join(cols) + ", applied", f"VALUES ({self.ph(len(cols) + 1)})"),
            [(*r, flag) for r in rows])

    def record_relayed(self, conn: Connection, info: TableInfo, after_seq: int) -> None:
        """Second-order records for the change-log entries the reconciler just relayed (seq >
        `after_seq`). Default: nothing, the trigger on the change log writes them."""

    def fresh_identities_select(self, table: str) -> str | None:
        """A SELECT of (rid, key) for this site's own rows not yet in the shadow, for readers that
        cannot write (verify); None where the shadow is kept eagerly."""
        return None

    def fresh_identities(self, conn: Connection, info: TableInfo) -> list[tuple[Any, ...]]:
        """(rid, key) of this site's own rows not yet in the shadow (see catch_up); read-only."""
        return []

    def catch_up(self, conn: Connection, info: TableInfo) -> None:
        """Bring the shadow of `info` up to date with this site's own changes, for dialects whose
        capture triggers write the shadow lazily (SQLite, renumbered tables). Inside a write
        transaction; a no-op where the shadow is kept eagerly."""

    # ---- bookkeeping shared by SQL dialects (plain SQL, overridable) -------------------------
    def prepare_site(self, engine: Engine) -> None:
        """One-time settings outside any transaction (SQLite: WAL journal)."""

    def concat(self, *parts: str) -> str:
        return " || ".join(parts)

    def ensure_link(self, conn: Connection, peer: str, table: str) -> None:
        p = self.caps.placeholder
        if conn.exec_driver_sql(f"SELECT 1 FROM _mm_watermarks WHERE peer = {p} AND tbl = {p}", (peer, table)).first() is None:
            conn.exec_driver_sql(f"INSERT INTO _mm_watermarks (peer, tbl, seq2) VALUES ({p}, {p}, 0)", (peer, table))
        if conn.exec_driver_sql(f"SELECT 1 FROM _mm_links WHERE peer = {p}", (peer,)).first() is None:
            conn.exec_driver_sql(f"INSERT INTO _mm_links (peer) VALUES ({p})", (peer,))

    def register_table(self, conn: Connection, info: TableInfo) -> None:
        """Record the table and give its base rows their identities (the common base)."""
        import json

        q = self.quote
        o = self.obj(info.name)
        key = q(info.key.name)
        base_max = 0
        if info.spec.renumber:
            base_max = conn.exec_driver_sql(f"SELECT coalesce(max({key}), 0) FROM {q(info.name)}").scalar() or 0
            rid = self.concat(f"'{BASE_VER}#'", self.cast_text(key))
        else:
            rid = self.concat("'k:'", self.cast_text(key))
        conn.exec_driver_sql(f"INSERT INTO {o['shadow']} (rid, key) SELECT {rid}, {key} FROM {q(info.name)}")
        conn.exec_driver_sql(
            f"INSERT INTO _mm_tables (tbl, key_col, renumber, columns, base_max) VALUES ({self.ph(5)})",
            (info.name, info.key.name, 1 if info.spec.renumber else 0, json.dumps(list(info.column_names)), int(base_max)),
        )

    def cast_text(self, expr: str) -> str:
        return f"CAST({expr} AS TEXT)"

    def base_max(self, conn: Connection, table: str) -> int:
        p = self.caps.placeholder
        return int(conn.exec_driver_sql(f"SELECT base_max FROM _mm_tables WHERE tbl = {p}", (table,)).scalar() or 0)

    def watermark(self, conn: Connection, peer: str, table: str) -> int:
        p = self.caps.placeholder
        v = conn.exec_driver_sql(f"SELECT seq2 FROM _mm_watermarks WHERE peer = {p} AND tbl = {p}", (peer, table)).scalar()
        return int(v or 0)

    def link_stats(self, conn: Connection, peer: str, pulled: int, applied: int, conflicts: int, at: str) -> None:
        p = self.caps.placeholder
        conn.exec_driver_sql(
            f"UPDATE _mm_links SET pulled = pulled + {p}, applied = applied + {p}, conflicts = conflicts + {p}, "
            f"last_success_at = {p} WHERE peer = {p}",
            (pulled, applied, conflicts, at, peer),
        )

    def link_error(self, conn: Connection, peer: str, message: str, at: str) -> None:
        p = self.caps.placeholder
        conn.exec_driver_sql(f"UPDATE _mm_links SET last_error = {p}, last_error_at = {p} WHERE peer = {p}", (message[:2000], at, peer))

    def link_row(self, conn: Connection, peer: str) -> dict[str, Any]:
        p = self.caps.placeholder
        r = conn.exec_driver_sql(
            f"SELECT last_success_at, last_error, last_error_at, pulled, applied, conflicts FROM _mm_links WHERE peer = {p}", (peer,)
        ).first()
        keys = ("last_success_at", "last_error", "last_error_at", "pulled", "applied", "conflicts")
        return dict(zip(keys, r)) if r else dict.fromkeys(keys)

    def unapplied(self, conn: Connection, table: str, peer: str) -> tuple[int, str | None]:
        snap = self.obj(table, peer)["snap"]
        r = conn.exec_driver_sql(f"SELECT count(*), min(ver) FROM {snap} WHERE applied <> 1").first()
        return (int(r[0] or 0), r[1]) if r else (0, None)

    def waiting(self, conn: Connection, table: str, watermark: int, puller: str) -> tuple[int, str | None]:
        """Changes in this site's logs past `watermark` that `puller` has not pulled yet."""
        o = self.obj(table)
        p = self.caps.placeholder
        r = conn.exec_driver_sql(
            f"SELECT count(*), min(l.ver) FROM {o['log2']} l2 JOIN {o['log']} l ON l.seq = l2.seq "
            f"WHERE l2.seq2 > {p} AND l2.op = 'A' AND l.origin <> {p}",
            (watermark, puller),
        ).first()
        return (int(r[0] or 0), r[1]) if r else (0, None)

    def site_status(self, conn: Connection, tables: list[str]) -> dict[str, Any]:
        st = conn.exec_driver_sql("SELECT site FROM _mm_state").first()
        out: dict[str, Any] = {"name": st[0] if st else None, "hlc": self.read_clock(conn) if st else None, "tables": {}}
        out["conflicts"] = int(conn.exec_driver_sql("SELECT count(*) FROM _mm_conflicts").scalar() or 0)
        for t in tables:
            o = self.obj(t)
            out["tables"][t] = {
                "log": int(conn.exec_driver_sql(f"SELECT count(*) FROM {o['log']}").scalar() or 0),
                "log2": int(conn.exec_driver_sql(f"SELECT count(*) FROM {o['log2']}").scalar() or 0),
                "tombstones": int(conn.exec_driver_sql(f"SELECT count(*) FROM {o['shadow']} WHERE deleted IS NOT NULL").scalar() or 0),
                "rows": int(conn.exec_driver_sql(f"SELECT count(*) FROM {self.quote(t)}").scalar() or 0),
            }
        return out

    def conflicts_since(self, conn: Connection, since: str) -> int:
        """Conflicts recorded at or after `since` (UTC 'YYYY-MM-DDTHH:MM:SS'; detected_at sorts as text)."""
        p = self.caps.placeholder
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM _mm_conflicts WHERE detected_at >= {p}", (since,)).scalar() or 0)

    def conflict_rows(self, conn: Connection, table: str | None, limit: int) -> list[Any]:
        p = self.caps.placeholder
        where = f"WHERE tbl = {p}" if table else ""
        params = (table,) if table else ()
        lim = f" LIMIT {int(limit)}" if limit else ""
        return [
            r._mapping
            for r in conn.exec_driver_sql(
                "SELECT id, detected_at, tbl, rid, key, kind, slot, columns, local_ver, local_values, remote_ver, "
                f"remote_values, policy, decision FROM _mm_conflicts {where} ORDER BY id DESC{lim}",
                params,
            )
        ]

    # ---- operations: log purge and the daemon lock (multimaster/purge.py, daemon.py) ----------
    #: SQL taking a session-level lock named by its one parameter without waiting, returning a
    #: true value when taken (PostgreSQL: pg_try_advisory_lock(hashtext(%s)); MariaDB:
    #: GET_LOCK(%s, 0)). None: the daemon locks a file next to the database (SQLite).
    daemon_lock_sql: str | None = None
    #: column type of a generated primary key (the verification log's id)
    serial_pk: str = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    #: where recorded verify runs are kept (multimaster/verifications.py)
    verifications_table: str = "_mm_verifications"

    def install_ops(self, conn: Connection) -> None:
        """The purge bookkeeping every site keeps (idempotent): `_mm_origins` (per table and
        origin, the highest version purged: the dedupe record once its log entry is gone),
        `_mm_purges` (per table, the highest second-order sequence purged: a puller whose
        watermark is below it has missed changes) and `_mm_pullers` (the last watermark seen of
        every site that pulls from this one)."""
        for sql in (
            "CREATE TABLE IF NOT EXISTS _mm_origins (tbl VARCHAR(64) NOT NULL, origin VARCHAR(64) NOT NULL, "
            "max_ver VARCHAR(96) NOT NULL, PRIMARY KEY (tbl, origin))",
            "CREATE TABLE IF NOT EXISTS _mm_purges (tbl VARCHAR(64) NOT NULL PRIMARY KEY, horizon BIGINT NOT NULL DEFAULT 0, "
            "purged BIGINT NOT NULL DEFAULT 0, purged_at VARCHAR(32))",
            "CREATE TABLE IF NOT EXISTS _mm_pullers (peer VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, "
            "seq2 BIGINT NOT NULL DEFAULT 0, last_success_at VARCHAR(32), first_seen_at VARCHAR(32), checked_at VARCHAR(32), "
            "PRIMARY KEY (peer, tbl))",
        ):
            conn.exec_driver_sql(sql)
        self.install_verifications(conn)

    def install_verifications(self, conn: Connection) -> None:
        """`_mm_verifications` (idempotent): one row per recorded verify run (scheduled by the daemon
        or `verify --record`): when, how long, converged or not, the status per table, the result's
        counts as JSON, the error of a run that could not complete. See multimaster/verifications.py."""
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS _mm_verifications (id {self.serial_pk}, started_at VARCHAR(40) NOT NULL, "
            "seconds DOUBLE PRECISION, converged SMALLINT, status VARCHAR(16) NOT NULL, table_status TEXT, summary TEXT, "
            "error TEXT, source VARCHAR(16))"
        )

    def has_verifications(self, conn: Connection) -> bool:
        from sqlalchemy import inspect

        return bool(inspect(conn).has_table("_mm_verifications"))

    #: the change log column an entry's row identity is written to (read back as ``rid``); SQLite
    #: stores it in ``xrid`` and derives ``rid`` from the version when it is NULL (a new row's
    #: identity is its insert's version: the capture trigger then computes the version once)
    log_rid_column: str = "rid"

    def log_write_columns(self, cols: Sequence[str]) -> list[str]:
        """`cols` (change log columns as read) as the columns to write them to."""
        return [self.log_rid_column if c == "rid" else c for c in cols]

    def install_problems(self, conn: Connection, tables: Sequence[str]) -> list[str]:
        """What stops `init` at this site before anything is written (e.g. objects in an older
        layout that the new one cannot take over). One message per problem."""
        return []

    @staticmethod
    def older_layout(table: str, obj: str) -> str:
        """The install problem of a site whose second-order log `obj` is still the table an earlier
        multimaster kept (today a view over the change log, docs/decisions.md): its positions do
        not carry over, so init must not adopt it."""
        return (f"table '{table}' was installed by an earlier multimaster whose second-order log was a table "
                f"({obj}); its positions do not carry over to today's layout. Refresh every site until "
                "quiet, run 'multimaster uninstall' and then 'multimaster init' again")

    def purge_horizon(self, conn: Connection, table: str) -> int:
        """The highest second-order sequence number purged from this site's log of `table`."""
        p = self.caps.placeholder
        return int(conn.exec_driver_sql(f"SELECT horizon FROM _mm_purges WHERE tbl = {p}", (table,)).scalar() or 0)

    # ---- helpers shared by SQL dialects ---------------------------------------------------
    def obj(self, table: str, peer: str | None = None) -> dict[str, str]:
        return {k: self.quote(v) for k, v in names(table, peer).items()}

    def ph(self, n: int) -> str:
        return ", ".join([self.caps.placeholder] * n)

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
    #: the schema multimaster's objects live in, for connections that do not have multimaster's
    #: search path (verify's readers, repair); None: next to the replicated tables
    mm_schema: str | None = None
    #: the database has logins that privileges are granted to (False: access is the file's)
    has_logins: bool = True
    #: the statement opening repair's write transaction on an engine made with
    #: `writer_engine_kwargs` (None: SQLAlchemy's own begin)
    writer_begin: str | None = None

    def mm_name(self, name: str) -> str:
        """The quoted name of multimaster object `name`, qualified with `mm_schema` if any."""
        return f"{self.quote(self.mm_schema)}.{self.quote(name)}" if self.mm_schema else self.quote(name)

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


def shadow_key_index(table: str) -> str:
    """Name of the (non-unique) index on the key of a natural-key table's shadow, which holds one
    row per incarnation of a key (docs/conflicts.md). No longer than the tombstones view's name."""
    return f"_mm_shadowk_{table}"


def capture_fragments(quote: Any, cols: Any, spec: Any, new: str, old: str, own: list[str]) -> dict[str, Any]:
    """The column lists every dialect's capture triggers splice into their templates: `new` / `old`
    name the row references (NEW/OLD, or transition-table aliases), `own` is each column's own
    "changed" condition in the dialect's SQL."""
    diff = group_diffs(own, spec)
    return {
        "ncols": "".join(f", {quote('n_' + c.name)}" for c in cols),
        "ocols": "".join(f", {quote('o_' + c.name)}" for c in cols),
        "newvals": "".join(f", {new}.{quote(c.name)}" for c in cols),
        "oldvals": "".join(f", {old}.{quote(c.name)}" for c in cols),
        "diff": diff,
        "updnew": "".join(f", CASE WHEN {d} THEN {new}.{quote(c.name)} END" for d, c in zip(diff, cols)),
        "updold": "".join(f", CASE WHEN {d} THEN {old}.{quote(c.name)} END" for d, c in zip(diff, cols)),
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
