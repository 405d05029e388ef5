"""SQLite: the embedded default. SQL lives in triggers/sqlite/*.sql."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from multimaster.dialects.base import (
    Capabilities,
    Dialect,
    capture_fragments,
    capture_text_signature,
    read_only_message,
    shadow_key_index,
    table_relations,
)
from multimaster.dialects.liveness import Timeouts
from multimaster.dialects.schema import Collation, Column, TableInfo, names

_NOW_VER = "(SELECT ver FROM {log} ORDER BY seq DESC LIMIT 1)"  # inside a capture trigger, after its log insert
_HLC = (
    "max(hlc + 1, coalesce((SELECT CAST(substr(ver, 1, 19) AS INTEGER) FROM {log} ORDER BY seq DESC LIMIT 1), 0) + 1, "
    "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) * 65536)"
)


class SQLiteDialect(Dialect):
    name = "sqlite"
    title = "SQLite"
    caps = Capabilities(
        transactional_ddl=True,  # CREATE/DROP roll back with the transaction
        max_identifier_length=1000,  # no practical limit
        identifier_unit="characters",
        placeholder="?",
        single_writer=True,  # one writer per file: BEGIN IMMEDIATE before applying
        set_based_apply=True,  # BEGIN IMMEDIATE: the apply transaction is the only writer
        fastpath_min=64,  # below it the planner is faster (docs/performance.md "The fast path's threshold")
        concurrent_capture=False,  # positions and keys are given in commit order
        # no transaction id in triggers: a batch is one whole read (the change log and snapshots
        # still have txn: a relayed entry keeps its origin's, docs/transactions.md)
        txn_column=False,
        daemon_lock_sql=None,  # no server: the daemon locks a file next to the database
        serial_pk="INTEGER PRIMARY KEY",  # the rowid
        log_rid_column="xrid",  # rid is a generated column: coalesce(xrid, ver) (sqlite/table.sql)
        bookkeeping_schema=None,  # one schema per file
    )

    def greatest(self, *exprs: str) -> str:
        return f"max({', '.join(exprs)})"  # the scalar max() of two or more arguments

    def null_safe_eq(self, a: str, b: str) -> str:
        return f"{a} IS {b}"

    def insert_ignore_into(self, table: str, cols: str, source: str) -> str:
        return f"INSERT OR IGNORE INTO {table} ({cols}) {source}"

    def json_columns(self, conn: Connection, table: str) -> set[str]:
        """A column with a CHECK (json_valid(col)) in the table's CREATE statement (a column
        declared JSON is reflected as JSON already)."""
        from multimaster.dialects import types

        sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).scalar()
        return types.json_checked([str(sql or "")])

    def value_adapters(self, info: TableInfo) -> list[Any]:
        """ISO-8601 text for dates and times, decimals as exact text (dialects/types.py)."""
        from multimaster.dialects import types

        return [types.adapter(types.SQLITE, types.kind_of(self.name, c)) for c in info.columns]

    def is_retryable(self, exc: BaseException) -> bool:
        return "database is locked" in str(getattr(exc, "orig", exc))

    def names_missing_column(self, exc: BaseException) -> bool:
        return "no such column" in str(getattr(exc, "orig", exc))

    def temp_name(self, name: str) -> str:
        return f"temp.{self.quote(name)}"

    def create_temp(self, conn: Connection, name: str, select: str, keys: str | None = None, index: str | None = "rid") -> None:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        conn.exec_driver_sql(f"CREATE TEMP TABLE {name.removeprefix('temp.')} AS {select}")
        base = name.removeprefix("temp.").strip('"')
        if keys:
            conn.exec_driver_sql(f'CREATE UNIQUE INDEX temp."{base}_k" ON {name.removeprefix("temp.")} ({keys})')
        if index and index != keys:
            cols = [r[1] for r in conn.exec_driver_sql(f"PRAGMA temp.table_info({name.removeprefix('temp.')})")]
            if index in cols:
                conn.exec_driver_sql(f'CREATE INDEX temp."{base}_i" ON {name.removeprefix("temp.")} ({index})')

    def temp_rids(self, conn: Connection) -> str:
        conn.exec_driver_sql("CREATE TEMP TABLE IF NOT EXISTS _mm_tmp_rids (rid TEXT PRIMARY KEY)")
        return "temp._mm_tmp_rids"

    def engine_kwargs(self, url: str, timeouts: Timeouts | None = None) -> dict[str, Any]:
        # a local file: no server to wait for (its locks wait busy_timeout, 30 s)
        # isolation_level=None: we emit BEGIN ourselves (pysqlite's own handling defers it).
        return {"connect_args": {"timeout": 30, "isolation_level": None, "check_same_thread": False}}

    def prepare_engine(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout = 30000")
            cur.execute("PRAGMA foreign_keys = ON")
            # multimaster's own connections only: the reconciler's scratch tables stay in memory and
            # a batch's random updates of a large table and shadow hit a 64 MB page cache instead of
            # the default 2,000 pages (about 10% faster apply; docs/performance.md)
            cur.execute("PRAGMA temp_store = MEMORY")
            cur.execute("PRAGMA cache_size = -65536")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = "IMMEDIATE" if conn.get_execution_options().get("mm_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {mode}")

    def prepare_site(self, engine: Engine) -> None:
        raw = engine.raw_connection()
        try:
            raw.cursor().execute("PRAGMA journal_mode = WAL")
        finally:
            raw.close()

    # ---- install ---------------------------------------------------------------------------
    def install_site(self, conn: Connection, site: str) -> None:
        for sql in self.render("site"):
            conn.exec_driver_sql(sql)
        # a site installed before the error queue had a txn column (SQLite has no ADD COLUMN IF NOT EXISTS)
        if "txn" not in {r[1] for r in conn.exec_driver_sql("PRAGMA table_info(_mm_errors)")}:
            conn.exec_driver_sql("ALTER TABLE _mm_errors ADD COLUMN txn TEXT")
        conn.exec_driver_sql("INSERT INTO _mm_state (id, site) VALUES (1, ?) ON CONFLICT(id) DO NOTHING", (site,))

    def install_table(self, conn: Connection, info: TableInfo) -> None:
        q = self.quote
        o = self.obj(info.name)
        slotcols = "".join(f",\n  {q('v_' + s.name)} TEXT" for s in info.spec.slots)
        # renumbered keys are integers: the key is the shadow's rowid (one B-tree less per insert);
        # a natural key has one shadow row per incarnation: the key is indexed, not unique
        shadowkeys = (
            f"{self.key_col} INTEGER PRIMARY KEY,\n  rid TEXT NOT NULL UNIQUE"
            if info.spec.renumber
            else f"rid TEXT PRIMARY KEY,\n  {self.key_col} {info.key.type_sql} NOT NULL"
        )
        shadowindex = (
            ""
            if info.spec.renumber
            else f"CREATE INDEX IF NOT EXISTS {q(shadow_key_index(info.name))} ON {o.shadow} ({self.key_col})"
        )
        kept = self._unique_key_shadow(conn, info) if not info.spec.renumber else None
        for sql in self.render(
            "table",
            shadowkeys=shadowkeys,
            shadowindex=shadowindex,
            table=q(info.name),
            keytype=info.key.type_sql,
            logcols=self._log_cols(info),
            slotcols=slotcols,
            **o.mapping(),
        ):
            conn.exec_driver_sql(sql)
        # (a change log made by an earlier multimaster; txn: before session 36, upgrade_on_open)
        self.add_columns(conn, o.log, [("sv", "INTEGER"), ("txn", "TEXT")])
        if kept:
            cols = ", ".join(q(c) for c in kept)
            conn.exec_driver_sql(f"INSERT INTO {o.shadow} ({cols}) SELECT {cols} FROM temp._mm_tmp_shadow")
            conn.exec_driver_sql("DROP TABLE temp._mm_tmp_shadow")

    def install_snapshot(self, conn: Connection, info: TableInfo, peer: str) -> None:
        super().install_snapshot(conn, info, peer)
        self.add_columns(conn, self.obj(info.name, peer).snapshot(), [("txn", "TEXT")])  # (before session 36)

    def upgrade_on_open(self, engine: Engine) -> list[str]:
        """Until session 36 a SQLite site's change logs and snapshots had no ``txn`` column (a
        relayed entry lost its origin's transaction, docs/transactions.md): the first time a
        multimaster process opens such a site it adds it, in one write transaction (an O(1) change
        of the schema; nothing is rewritten). One read of the catalog when nothing lacks it."""
        find = (
            "SELECT m.name FROM sqlite_master m WHERE m.type = 'table' "
            "AND (m.name LIKE '\\_mm\\_log\\_%' ESCAPE '\\' OR m.name LIKE '\\_mm\\_snap\\_%\\_\\_%' ESCAPE '\\') "
            "AND EXISTS (SELECT 1 FROM pragma_table_info(m.name) p WHERE p.name = 'mask') "
            "AND NOT EXISTS (SELECT 1 FROM pragma_table_info(m.name) p WHERE p.name = 'txn') ORDER BY m.name"
        )
        with engine.connect() as conn:
            if not conn.exec_driver_sql(find).first():
                conn.rollback()
                return []
            conn.rollback()
            conn.execution_options(mm_write=True)
            with conn.begin():
                todo = [str(r[0]) for r in conn.exec_driver_sql(find)]
                for rel in todo:
                    conn.exec_driver_sql(f"ALTER TABLE {self.quote(rel)} ADD COLUMN txn TEXT")
            return todo

    def _unique_key_shadow(self, conn: Connection, info: TableInfo) -> list[str] | None:
        """Migration of a natural-key shadow made when a key had one shadow row (UNIQUE key): its
        rows move to a scratch table and it is dropped, with the view over it, for install_table to
        create it anew (SQLite cannot drop a constraint) and copy them back; the capture triggers
        are recreated by install_capture. Returns the columns kept, None when nothing to migrate."""
        shadow = names(info.name).shadow
        unique = False
        for row in conn.exec_driver_sql(f"PRAGMA index_list({self.quote(shadow)})").all():
            name, is_unique = row[1], row[2]
            if is_unique and [r[2] for r in conn.exec_driver_sql(f"PRAGMA index_info({self.quote(name)})")] == ["key"]:
                unique = True
        if not unique:
            return None
        o = self.obj(info.name)
        cols = [r[1] for r in conn.exec_driver_sql(f"PRAGMA table_info({o.shadow})")]
        conn.exec_driver_sql("DROP TABLE IF EXISTS temp._mm_tmp_shadow")
        conn.exec_driver_sql(f"CREATE TEMP TABLE _mm_tmp_shadow AS SELECT * FROM {o.shadow}")
        conn.exec_driver_sql(f"DROP VIEW IF EXISTS {o.tombstones}")
        conn.exec_driver_sql(f"DROP TABLE {o.shadow}")
        return cols

    def install_capture(self, conn: Connection, info: TableInfo) -> None:
        q = self.quote
        o = self.obj(info.name)
        key = q(info.key.name)
        spec = info.spec
        cols = info.columns
        own = [f"OLD.{q(c.name)} IS NOT NEW.{q(c.name)}" for c in cols]
        anychanged = " OR ".join(own) if own else "0"
        fr = capture_fragments(q, cols, spec, "NEW", "OLD", own)
        diff = fr["diff"]
        updmask = " | ".join(f"(({d}) << {i})" for i, d in enumerate(diff)) if diff else "0"
        now_ver = _NOW_VER.format(log=o.log)
        # evaluated twice in an insert (ver and rid): the same value, as 'now' is fixed per statement
        # and the log's last entry is read before the row goes in
        ver = f"(SELECT printf('%019d:%s', {_HLC.format(log=o.log)}, site) FROM _mm_state)"
        stamps = []
        for s in spec.slots:
            cond = diff[s.columns[0]]
            vcol = q("v_" + s.name)
            stamps.append(f"{vcol} = CASE WHEN {cond} THEN {now_ver} ELSE {vcol} END")
        # the heads an update supersedes (docs/conflicts.md "Concurrent heads"): for each slot it
        # sets whose policy chooses among heads, read from the shadow row before its update clears them
        clear, sup = self.heads_capture(spec, lambda s: diff[s.columns[0]])
        stamps += clear
        slotstamp = ", ".join(stamps) if stamps else "rid = rid"
        if spec.renumber:
            renumber = self._join_renumber(info)
            newkey = self._next_key(info)
            insrid = "NULL"  # rid = ver
            shadowinsert = ""
            live = ""
        else:
            renumber = ""
            newkey = f"NEW.{key}"
            # a natural key's incarnation (docs/conflicts.md): its first life is 'k:' || key, a later
            # one 'k:' || key || '@' || the highest delete version held for its earlier lives; one
            # still live here (INSERT OR REPLACE fires no delete trigger) ends at this insert's version
            insrid = (
                f"'k:' || NEW.{key} || coalesce('@' || (SELECT CASE WHEN max(deleted IS NULL) THEN {ver} "
                f"ELSE max(deleted) END FROM {o.shadow} WHERE {self.key_col} = NEW.{key}), '')"
            )
            slots = [q("v_" + s.name) for s in spec.slots]
            shadowinsert = (
                f"  UPDATE {o.shadow} SET deleted = {now_ver} WHERE {self.key_col} = NEW.{key} AND deleted IS NULL;\n"
                f"  INSERT INTO {o.shadow} (rid, {self.key_col}{''.join(', ' + v for v in slots)})\n"
                f"    SELECT rid, {self.key_col}{''.join(', ver' for _ in slots)} FROM {o.log} ORDER BY seq DESC LIMIT 1;"
            )
            # updates and deletes act on the live incarnation
            live = " AND deleted IS NULL"
        supcol = supval = ""
        if sup is not None:
            supcol, supval = ", sup", f", (SELECT {sup} FROM {o.shadow} WHERE {self.key_col} = NEW.{key}{live})"
        stmts = self.render(
            "capture",
            **fr,
            sv=str(int(info.version)),
            supcol=supcol,
            supval=supval,
            table=q(info.name),
            tablename=info.name.replace("'", ""),
            keyname=info.key.name.replace("'", ""),
            key=key,
            renumber=renumber,
            lastinsertkey=self._last_insert_key(info) if spec.renumber else "NULL",
            insrid=insrid,
            newkey=newkey,
            allmask=str(spec.all_mask),
            anychanged=anychanged,
            updmask=updmask,
            slotstamp=slotstamp,
            ver=ver,
            shadowinsert=shadowinsert,
            live=live,
            **o.mapping(),
        )
        # init recreates them: an earlier layout's bodies differ (natural keys' incarnations; the
        # heads of a slot whose policy became one that chooses among them)
        stmts = [f"DROP TRIGGER IF EXISTS {t}" for t in (o.cap_i, o.cap_u, o.cap_d)] + stmts
        if spec.renumber:
            stmts += self.render(
                "catchup",
                table=q(info.name),
                key=key,
                catchup=self._catchup_sql(info),
                lastinsertkey=self._last_insert_key(info),
                **o.mapping(),
            )
        for sql in stmts:
            conn.exec_driver_sql(sql)
        if spec.renumber:
            self.after_apply(conn, info)

    def guard_writes(self, conn: Connection, info: TableInfo, site: str, read_only: bool) -> None:
        o = self.obj(info.name)
        if not read_only:
            return self.drop_triggers(conn, info.name, (o.ro_i, o.ro_u, o.ro_d))
        message = "'" + read_only_message(site, info.name).replace("'", "''") + "'"
        for sql in self.render("readonly", table=self.quote(info.name), message=message, **o.mapping()):
            conn.exec_driver_sql(sql)

    def _next_key(self, info: TableInfo) -> str:
        """The rank of a new local row, evaluated in its insert trigger: one more than every
        identity known — the shadow's keys and the table's other rows (this site's rows inserted
        since the last catch-up are all still in the table: a delete catches the shadow up first)."""
        o = self.obj(info.name)
        q = self.quote
        key, table = q(info.key.name), q(info.name)
        others = (
            f"CASE WHEN (SELECT max({key}) FROM {table}) = NEW.{key} "
            f"THEN (SELECT {key} FROM {table} WHERE {key} < NEW.{key} ORDER BY {key} DESC LIMIT 1) "
            f"ELSE (SELECT max({key}) FROM {table}) END"
        )
        return f"(max(coalesce({others}, 0), coalesce((SELECT max({self.key_col}) FROM {o.shadow}), 0)) + 1)"

    def _last_insert_key(self, info: TableInfo) -> str:
        o = self.obj(info.name)
        return f"(SELECT CASE WHEN op = 'I' THEN {self.key_col} END FROM {o.log} ORDER BY seq DESC LIMIT 1)"

    def _join_renumber(self, info: TableInfo) -> str:
        q = self.quote
        return "\n".join(
            self.render("renumber", key=q(info.key.name), table=q(info.name), lastinsertkey=self._last_insert_key(info))
        )

    def _catchup_sql(self, info: TableInfo) -> str:
        o = self.obj(info.name)
        name = info.name.replace("'", "''")
        return (
            f"INSERT OR IGNORE INTO {o.shadow} (rid, {self.key_col}) SELECT rid, {self.key_col} FROM {o.log} "
            f"WHERE seq > (SELECT caught_up FROM _mm_tables WHERE tbl = '{name}') AND op = 'I' "
            f"AND origin = (SELECT site FROM _mm_state);\n"
            f"  UPDATE _mm_tables SET caught_up = (SELECT coalesce(max(seq), 0) FROM {o.log}) WHERE tbl = '{name}';"
        )

    def fresh_identities_select(self, table: str) -> str | None:
        o = self.obj(table)
        name = table.replace("'", "''")
        # natural-key tables keep their shadow eagerly: their log entries are all caught up
        return (
            f"SELECT rid, {self.key_col} FROM {o.log} WHERE seq > (SELECT caught_up FROM _mm_tables WHERE tbl = '{name}') "
            f"AND op = 'I' AND origin = (SELECT site FROM _mm_state) AND rid NOT LIKE 'k:%'"
        )

    def catch_up(self, conn: Connection, info: TableInfo) -> None:
        if info.spec.renumber:
            for stmt in self._catchup_sql(info).split(";\n"):
                conn.exec_driver_sql(stmt.strip().rstrip(";"))

    def read_table_kind(self, conn: Connection, name: str) -> str | None:
        v = conn.exec_driver_sql("SELECT type FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')", (name,)).scalar()
        return None if v is None else str(v)

    def read_table_kinds(self, conn: Connection, names_: Sequence[str]) -> dict[str, str]:
        rows = conn.exec_driver_sql(
            f"SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') AND name IN ({', '.join('?' * len(names_))})",
            tuple(names_),
        )
        return {str(n): str(k) for n, k in rows}

    def column_signature(self, conn: Connection, table: str) -> str:
        return repr([tuple(r)[1:5] for r in conn.exec_driver_sql(f"PRAGMA table_info({self.quote(table)})")])

    applying_flag = "(SELECT applying FROM _mm_state)"
    applying_marker = "_mm_state"

    def trigger_texts(self, conn: Connection, table: str) -> dict[str, str]:
        rows = conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (table,))
        return {str(r[0]): str(r[1]) for r in rows}

    def table_signature(self, conn: Connection, table: str) -> str:
        """As every dialect's, and a digest of the text of its capture triggers, read in the same
        statement as which exist: capture triggers made again in another text (of another schema
        version, another release, by hand) read as a change the follow looks at (engine/evolve.py:
        where DDL commits at once, a schema version can be recorded and its capture not made)."""
        return capture_text_signature(self.column_signature(conn, table), table, self.trigger_texts(conn, table))

    def triggers_on(self, conn: Connection, table: str) -> set[str]:
        rows = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (table,))
        return {str(r[0]) for r in rows}

    def retype_column(self, conn: Connection, obj: str, col: str, type_sql: str) -> None:
        """Nothing: a SQLite column's type is an affinity, it holds values of any length."""

    def uninstall(self, conn: Connection, tables: Sequence[str], peers: Sequence[str]) -> list[str]:
        dropped: list[str] = []
        rows = conn.exec_driver_sql(
            "SELECT type, name FROM sqlite_master WHERE name LIKE '\\_mm\\_%' ESCAPE '\\' "
            "AND type IN ('trigger', 'view', 'table') ORDER BY CASE type WHEN 'trigger' THEN 0 WHEN 'view' THEN 1 ELSE 2 END"
        ).all()
        for typ, name in rows:
            if name == "sqlite_sequence":
                continue
            conn.exec_driver_sql(f"DROP {typ.upper()} IF EXISTS {self.quote(name)}")
            dropped.append(f"{typ} {name}")
        if conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name='sqlite_sequence'").first():
            conn.exec_driver_sql("DELETE FROM sqlite_sequence WHERE name LIKE '\\_mm\\_%' ESCAPE '\\'")
        return dropped

    def uninstall_table(self, conn: Connection, table: str, peers: Sequence[str]) -> list[str]:
        """In the caller's transaction (BEGIN IMMEDIATE: writers wait for it): the triggers named
        ``_mm_*`` on the table and on its change log (reference capture), then its views and tables
        (their indexes go with them)."""
        views, tables = table_relations(table, peers)
        dropped: list[str] = []
        for (name,) in conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN (?, ?) "
            "AND name LIKE '\\_mm\\_%' ESCAPE '\\' ORDER BY tbl_name = ?, name",
            (table, names(table).log, names(table).log),
        ).all():
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {self.quote(name)}")
            dropped.append(f"trigger {name}")
        for kind, objs in (("view", views), ("table", tables)):
            for name in objs:
                if conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE type = ? AND name = ?", (kind, name)).first():
                    conn.exec_driver_sql(f"DROP {kind.upper()} IF EXISTS {self.quote(name)}")
                    dropped.append(f"{kind} {name}")
        gone = [d.split(" ", 1)[1] for d in dropped if d.startswith("table ")]
        if gone and conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").first():
            conn.exec_driver_sql(f"DELETE FROM sqlite_sequence WHERE name IN ({self.ph(len(gone))})", tuple(gone))
        return dropped

    def unique_sets(self, conn: Connection, table: str) -> list[tuple[str, list[str] | None, str | None]]:
        """From SQLite's own catalogue (the inspector misses a column's inline UNIQUE and skips
        expression indexes)."""
        out: list[tuple[str, list[str] | None, str | None]] = []
        for _seq, name, unique, origin, partial in conn.exec_driver_sql(f"PRAGMA index_list({self.quote(table)})").all():
            if not unique or origin == "pk":
                continue
            keys = [r for r in conn.exec_driver_sql(f"PRAGMA index_xinfo({self.quote(name)})").all() if r[5]]
            if partial:
                out.append((name, None, "a partial index (WHERE ...)"))
            elif any(r[1] == -2 for r in keys):
                out.append((name, None, "an expression index"))
            else:
                out.append((name, [r[2] for r in keys], None))
        return out

    # ---- apply -----------------------------------------------------------------------------
    def set_applying(self, conn: Connection, on: bool) -> None:
        conn.exec_driver_sql("UPDATE _mm_state SET applying = ?", (1 if on else 0,))

    def lock_rows(self, conn: Connection, info: TableInfo, tmp: str) -> None:
        """Nothing to lock: BEGIN IMMEDIATE made the apply transaction the only writer."""

    def after_apply(self, conn: Connection, info: TableInfo) -> None:
        """A renumbered table with AUTOINCREMENT: its sqlite_sequence past every identity's key,
        deleted ones included, so that SQLite gives a local insert its rank itself and
        `cursor.lastrowid` / `RETURNING` name the row's key (docs/sqlite.md "Keys the application
        is told"). A key inserted here moves the sequence by itself; an identity that was inserted
        and deleted at another site before this one pulled it never was a row here. A table
        without AUTOINCREMENT takes max(rowid) + 1, which nothing but a row moves."""
        if not info.spec.renumber or not self._autoincrement(conn, info.name):
            return
        shadow = self.obj(info.name).shadow
        top = conn.exec_driver_sql(f"SELECT max({self.key_col}) FROM {shadow}").scalar()
        if top is None:
            return
        n = conn.exec_driver_sql("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (int(top), info.name))
        if not n.rowcount:
            conn.exec_driver_sql("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (info.name, int(top)))

    def column_collations(self, conn: Connection, table: str) -> dict[str, Collation]:
        """The key and UNIQUE columns whose index compares them with NOCASE or RTRIM
        (docs/sqlite.md "Collations")."""
        from multimaster.dialects.sqlite import collations

        return collations.collations(conn, table, self.quote)

    def exact_collation_sql(self, table: str, col: Column) -> str:
        from multimaster.dialects.sqlite import collations

        return collations.exact_sql(table, col)

    def explain_rejection(self, conn: Connection, info: TableInfo, e: BaseException) -> str | None:
        """ "UNIQUE constraint failed" over a NOCASE / RTRIM column: the collation, what it merges and
        the fix (SQLite's message names the columns, not the value: the change's key and values
        are in the queue's row). Before session 35 the queue held the bare message."""
        from multimaster.dialects import loose
        from multimaster.dialects.sqlite import collations

        cols = collations.unique_failed(e)
        if cols is None:
            return None
        return loose.explain(
            info, cols, None, [], lambda c: self.exact_collation_sql(info.name, c), 'docs/sqlite.md "Collations"'
        )

    def insert_key_caveat(self, conn: Connection, info: TableInfo) -> str | None:
        if not info.spec.renumber or self._autoincrement(conn, info.name):
            return None
        return (
            f"{info.name} has no AUTOINCREMENT here: after its newest row is deleted (here, or at another site "
            "before this one pulled it), the next insert's cursor.lastrowid and RETURNING name the key SQLite chose, "
            "not the row's key, which is one more; declare the key INTEGER PRIMARY KEY AUTOINCREMENT where "
            "applications use them (docs/sqlite.md)"
        )

    @staticmethod
    def _autoincrement(conn: Connection, table: str) -> bool:
        """Whether `table` was created with AUTOINCREMENT (it then has a row in sqlite_sequence from
        its first insert on, and SQLite never gives a key below that row's seq again)."""
        sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).scalar()
        return bool(sql) and "AUTOINCREMENT" in str(sql).upper()

    def advance_clock(self, conn: Connection, hlc: int, table: str | None = None) -> None:
        """The site's floor ``_mm_state.hlc``, which every capture trigger reads."""
        conn.exec_driver_sql("UPDATE _mm_state SET hlc = max(hlc, ?)", (hlc,))

    def append_log(
        self,
        conn: Connection,
        table: str,
        cols: Sequence[str],
        select: str | None = None,
        rows: Sequence[tuple[Any, ...]] = (),
        params: tuple[Any, ...] = (),
    ) -> None:
        """As the default, after moving the floor ``_mm_state.hlc`` up to the last entry's clock. A
        capture takes "the last entry's clock + 1" as one of its bounds (_HLC): entries appended
        here are another origin's, with older versions, and would hide this site's last capture
        from its next one, which could then take the same version again (when the floor is ahead
        of the wall clock, or within one millisecond) and be dropped by every peer as a
        duplicate of the first."""
        log = self.obj(table).log
        conn.exec_driver_sql(
            "UPDATE _mm_state SET hlc = max(hlc, coalesce((SELECT CAST(substr(ver, 1, 19) AS INTEGER) "
            f"FROM {log} ORDER BY seq DESC LIMIT 1), 0))"
        )
        super().append_log(conn, table, cols, select, rows, params)

    def read_clock(self, conn: Connection) -> int | None:
        v = conn.exec_driver_sql("SELECT hlc FROM _mm_state").scalar()
        return None if v is None else int(v)

    # ---- foreign keys between replicated tables (docs/foreign-keys.md) -------------------------
    def foreign_keys(self, conn: Connection, table: str) -> list[dict[str, Any]]:
        """From PRAGMA foreign_key_list, which (unlike SQLAlchemy's reflection) gives the actions."""
        fks: dict[int, dict[str, Any]] = {}
        for r in conn.exec_driver_sql(f"PRAGMA foreign_key_list({self.quote(table)})"):
            fid, _seq, parent, col, pcol, on_update, on_delete = r[0], r[1], r[2], r[3], r[4], r[5], r[6]
            fk = fks.setdefault(
                fid,
                {
                    "name": None,
                    "constrained_columns": [],
                    "referred_table": parent,
                    "referred_columns": [],
                    "options": {"onupdate": on_update, "ondelete": on_delete},
                },
            )
            fk["constrained_columns"].append(col)
            fk["referred_columns"].append(pcol)
        return list(fks.values())

    def install_reference_capture(self, conn: Connection, info: TableInfo) -> None:
        """An AFTER INSERT trigger on the change log fills the identities of the entries this site
        captures (an insert's shadow row is written lazily: a parent inserted here since the last
        catch-up is found in its change log past `caught_up`, where its key has not moved)."""
        q = self.quote
        o = self.obj(info.name)
        trig = q("_mm_refs_" + info.name)
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trig}")
        if not info.refs:
            return
        bit = {c: i for i, c in enumerate(info.column_names)}
        sets = []
        for r in info.refs:
            po = self.obj(r.parent)
            pname = r.parent.replace("'", "''")

            def rid_of(v: str, po: Any = po, pname: str = pname) -> str:
                return (
                    f"coalesce((SELECT rid FROM {po.shadow} WHERE {self.key_col} = {v}), "
                    f"(SELECT rid FROM {po.log} WHERE seq > (SELECT caught_up FROM _mm_tables WHERE tbl = '{pname}') "
                    f"AND op = 'I' AND {self.key_col} = {v} AND origin = NEW.origin ORDER BY seq DESC LIMIT 1))"
                )

            m = 1 << bit[r.column]
            sets.append(
                f"{q('f_' + r.column)} = CASE WHEN NEW.op <> 'D' AND (NEW.mask & {m}) <> 0 THEN {rid_of('NEW.' + q('n_' + r.column))} END"
            )
            sets.append(
                f"{q('fo_' + r.column)} = CASE WHEN NEW.op <> 'I' AND (NEW.mask & {m}) <> 0 THEN {rid_of('NEW.' + q('o_' + r.column))} END"
            )
        conn.exec_driver_sql(
            f"CREATE TRIGGER {trig} AFTER INSERT ON {o.log} "
            f"WHEN NEW.origin = (SELECT site FROM _mm_state) AND (SELECT applying FROM _mm_state) = 0 "
            f"BEGIN UPDATE {o.log} SET {', '.join(sets)} WHERE seq = NEW.seq; END"
        )

    def defer_foreign_keys(self, conn: Connection, on: bool) -> bool:
        """PRAGMA defer_foreign_keys (reset by COMMIT); the engine's connections enforce foreign
        keys (prepare_engine), so ON UPDATE CASCADE still runs."""
        if on:
            conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
        return bool(conn.exec_driver_sql("PRAGMA foreign_keys").scalar())

    # ---- outside the engine: verify and repair (multimaster/spark/), grants, site files ----------
    jdbc = Dialect.Jdbc(
        driver="org.sqlite.JDBC",
        jar="sqlite-jdbc.jar",
        package="libxerial-sqlite-jdbc-java",
        scheme="jdbc:sqlite",
        default_port=None,  # a file: jdbc:sqlite:/abs/path.db
        # the driver types a column from the value in its first row (SQLite columns have affinities,
        # not types), so every read names its types: exact decimals and dates arrive as their text
        read_types={
            "long": "BIGINT",
            "double": "DOUBLE",
            "decimal": "STRING",
            "boolean": "BIGINT",
            "string": "STRING",
            "date": "STRING",
            "timestamp": "STRING",
            "binary": "BINARY",
            "json": "STRING",
        },
    )
    has_logins = False  # who may read the file is the file system's business
    #: one writer per file: repair takes the write lock up front, so no application write commits
    #: between what it reads and what it writes (a deferred transaction would fail to upgrade)
    writer_begin = "BEGIN IMMEDIATE"

    def database_file(self, url: str) -> str | None:
        from sqlalchemy.engine import make_url

        db = make_url(url).database
        # "file:" names an SQLite URI filename, opened by its own rules, not a path
        return db if db and db != ":memory:" and not db.startswith("file:") else None

    def writer_engine_kwargs(self) -> dict[str, Any]:
        # isolation_level=None: pysqlite issues no BEGIN of its own, writer_begin does; wait up to
        # 30 s for the write lock
        return {"connect_args": {"isolation_level": None, "timeout": 30}}

    def pull_grants(self, site: str, peer: str, login: str, database: str, objects: Sequence[str]) -> list[str]:
        return [
            f"-- {site} is a SQLite file: give '{peer}' read access to {database} (and its -wal/-shm files) "
            "at the file-system level; SQLite has no logins"
        ]


DIALECT = SQLiteDialect()
