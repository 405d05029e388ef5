"""PostgreSQL 12+: objects in the schema ``_mm``, PL/pgSQL capture, concurrent writers.

SQL lives in triggers/postgresql/*.sql. What differs from SQLite, and why (docs/postgresql.md):

- many writers at once: every captured statement takes its table's transaction-level advisory
  lock (so does the reconciler): writers of one table queue until COMMIT, writers of different
  tables never wait; versions, ranks and change-log entries are then in commit order, which is
  what the reconciler's per-origin order and a peer's read need, and what lets the second-order
  log be a view over the change log (seq2 = seq);
- the clock is a sequence (`_mm._mm_tick`), so writers of different tables never queue on it; the
  reconciler pushes the floor (the highest version received) into it;
- the echo guard is ``SET LOCAL mm.applying = 'on'``, invisible to every other session.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from multimaster.dialects.base import Capabilities, Dialect, capture_fragments, shadow_key_index, templates_dir
from multimaster.dialects.schema import TableInfo, names
from multimaster.errors import SchemaError

SCHEMA = "_mm"
#: first key of every advisory lock multimaster takes ('mm'); the second is the table's oid (0: clock)
LOCK_CLASS = 28013
_TABLES = ("log", "log2", "shadow", "tombstones", "snap")
#: sqlstates worth a retry: serialization_failure, deadlock_detected, lock_not_available
_RETRY_STATES = {"40001", "40P01", "55P03"}


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class PostgreSQLDialect(Dialect):
    name = "postgresql"
    caps = Capabilities(
        transactional_ddl=True,  # CREATE/DROP roll back with the transaction: init is all-or-nothing
        max_identifier_length=63,  # NAMEDATALEN - 1: longer names are silently truncated, so refuse them
        placeholder="%s",  # psycopg
        single_writer=False,  # many writers: capture locks per table (inserts) and per row only
    )
    insert_ignore = "INSERT"
    greatest = "GREATEST"
    #: every writer of the change log holds the table's advisory lock until COMMIT and its seq comes
    #: from a sequence with CACHE 1, so entries commit in seq (= seq2) order: everything committed
    #: may be read (see docs/postgresql.md)
    log2_horizon = None
    #: the second-order log is a view over the change log, seq2 = seq (triggers/postgresql/table.sql)
    log2_is_view = True
    #: lock_for_apply takes the table's advisory lock, which every captured statement holds until
    #: COMMIT: while the reconciler applies, no application write to the table can commit
    set_based_apply = True
    daemon_lock_sql = "SELECT pg_try_advisory_lock(hashtext(%s))"

    # ---- names -----------------------------------------------------------------------------
    def obj(self, table: str, peer: str | None = None) -> dict[str, str]:
        out = {}
        for k, v in names(table, peer).items():
            out[k] = f"{SCHEMA}.{self.quote(v)}" if k in _TABLES else self.quote(v)
        return out

    def _fn(self, table: str) -> dict[str, str]:
        """Names of the per-table trigger functions (in _mm, named like their triggers)."""
        n = names(table)
        out = {f"fn_{k}": f"{SCHEMA}.{self.quote(n[k])}" for k in ("cap_i", "cap_u", "cap_d")}
        out["fn_rank"] = f"{SCHEMA}.{self.quote('_mm_rank_' + table)}"
        out["lock"] = self.quote("_mm_lock_" + table)
        out["rank"] = self.quote("_mm_rank_" + table)
        return out

    def render(self, template: str, **values: Any) -> list[str]:
        """Like the base, but ``$$`` (PL/pgSQL dollar quoting) passes through unchanged."""
        from string import Template

        text = (templates_dir(self.name) / f"{template}.sql").read_text().replace("$$", "\x00")
        stmts = []
        for chunk in text.split("\n--\n"):
            lines = [ln for ln in chunk.splitlines() if not ln.lstrip().startswith("--")]
            sql = Template("\n".join(lines)).substitute(**values).strip().replace("\x00", "$$")
            if sql:
                stmts.append(sql.replace("%", "%%"))  # run through the driver's paramstyle
        return stmts

    # ---- connections -----------------------------------------------------------------------
    def prepare_engine(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            # _mm last: user tables keep resolving (and reflecting) in the URL's default schema
            prev = dbapi_conn.autocommit
            dbapi_conn.autocommit = True
            with dbapi_conn.cursor() as cur:
                cur.execute("SELECT set_config('search_path', current_setting('search_path') || ', _mm', false)")
                cur.execute("SET TIME ZONE 'UTC'")  # timestamptz values come back in UTC
            dbapi_conn.autocommit = prev

    def value_adapters(self, info: TableInfo) -> list[Any]:
        from psycopg.types.json import Jsonb

        from multimaster.dialects import types

        table = {**types.NATIVE, "json": lambda v: Jsonb(types._json_obj(v))}
        return [types.adapter(table, types.kind_of(self.name, c)) for c in info.columns]

    def is_retryable(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        return getattr(orig, "sqlstate", None) in _RETRY_STATES

    def temp_rids(self, conn: Connection) -> str:
        if conn.exec_driver_sql("SELECT to_regclass('pg_temp._mm_tmp_rids')").scalar() is None:
            conn.exec_driver_sql('CREATE TEMP TABLE _mm_tmp_rids (rid text COLLATE "C" PRIMARY KEY)')
        return "pg_temp._mm_tmp_rids"

    def insert_ignore_into(self, table: str, cols: str, source: str) -> str:
        return f"INSERT INTO {table} ({cols}) {source} ON CONFLICT DO NOTHING"

    def cast_text(self, expr: str) -> str:
        return f"CAST({expr} AS text)"

    # ---- install ---------------------------------------------------------------------------
    def _site_name(self, conn: Connection) -> str:
        return str(conn.exec_driver_sql(f"SELECT site FROM {SCHEMA}._mm_state").scalar())

    def install_site(self, conn: Connection, site: str) -> None:
        for sql in self.render("site", site_lit=_lit(site)):
            conn.exec_driver_sql(sql)
        conn.exec_driver_sql(f"INSERT INTO {SCHEMA}._mm_state (id, site) VALUES (1, %s) ON CONFLICT (id) DO NOTHING", (site,))

    def install_ops(self, conn: Connection) -> None:
        # the base creates its tables unqualified: let them land in _mm for this one call
        prev = conn.exec_driver_sql("SELECT current_setting('search_path')").scalar()
        conn.exec_driver_sql(f"SELECT set_config('search_path', '{SCHEMA}', true)")
        try:
            super().install_ops(conn)
        finally:
            conn.exec_driver_sql("SELECT set_config('search_path', %s, true)", (prev,))

    verifications_table = f"{SCHEMA}._mm_verifications"

    def install_verifications(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")  # a site recording before init
        prev = conn.exec_driver_sql("SELECT current_setting('search_path')").scalar()
        conn.exec_driver_sql(f"SELECT set_config('search_path', '{SCHEMA}', true)")
        try:
            super().install_verifications(conn)
        finally:
            conn.exec_driver_sql("SELECT set_config('search_path', %s, true)", (prev,))

    def has_verifications(self, conn: Connection) -> bool:
        return conn.exec_driver_sql(f"SELECT to_regclass('{SCHEMA}._mm_verifications')").scalar() is not None

    def _check_names(self, info: TableInfo, peers: Sequence[str] = ()) -> None:
        long = [v for p in (None, *peers) for v in names(info.name, p).values() if len(v.encode()) > self.caps.max_identifier_length]
        long += [n for n in ("_mm_rank_" + info.name, "_mm_lock_" + info.name) if len(n.encode()) > self.caps.max_identifier_length]
        if long:
            raise SchemaError([
                f"table '{info.name}': object name '{n}' is longer than PostgreSQL's {self.caps.max_identifier_length} "
                "bytes; use a shorter table or site name" for n in sorted(set(long))
            ])

    def _log_cols(self, info: TableInfo) -> str:
        q = self.quote
        return "".join(f",\n  {q('n_' + c.name)} {c.type_sql},\n  {q('o_' + c.name)} {c.type_sql}" for c in info.columns)

    def install_table(self, conn: Connection, info: TableInfo) -> None:
        self._check_names(info)
        q = self.quote
        slotcols = "".join(f",\n  {q('v_' + s.name)} text COLLATE \"C\"" for s in info.spec.slots)
        relid = conn.exec_driver_sql("SELECT %s::regclass::oid::int", (q(info.name),)).scalar()
        o = self.obj(info.name)
        natural = not info.spec.renumber
        # a natural key has one shadow row per incarnation (docs/conflicts.md): indexed, not unique
        shadowindex = f"CREATE INDEX IF NOT EXISTS {q(shadow_key_index(info.name))} ON {o['shadow']} (key)" if natural else ""
        for sql in self.render("table", table=q(info.name), keytype=info.key.type_sql, logcols=self._log_cols(info),
                               slotcols=slotcols, relid=str(int(relid)), keyunique="" if natural else " UNIQUE",
                               shadowindex=shadowindex, **o, **self._fn(info.name)):
            conn.exec_driver_sql(sql)
        if natural:
            # an earlier layout kept one shadow row per natural key (UNIQUE key): drop the constraint
            for (con,) in conn.exec_driver_sql(
                "SELECT c.conname FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) "
                "WHERE c.conrelid = %s::regclass AND c.contype = 'u' AND a.attname = 'key' AND cardinality(c.conkey) = 1",
                (o["shadow"],),
            ).all():
                conn.exec_driver_sql(f"ALTER TABLE {o['shadow']} DROP CONSTRAINT {q(con)}")

    def install_snapshot(self, conn: Connection, info: TableInfo, peer: str) -> None:
        self._check_names(info, [peer])
        for sql in self.render("snapshot", table=self.quote(info.name), peer=peer, keytype=info.key.type_sql,
                               logcols=self._log_cols(info), **self.obj(info.name, peer)):
            conn.exec_driver_sql(sql)

    def install_capture(self, conn: Connection, info: TableInfo) -> None:
        q = self.quote
        o = self.obj(info.name)
        key = q(info.key.name)
        spec = info.spec
        cols = info.columns
        site = _lit(self._site_name(conn))
        own = [f"o.{q(c.name)} IS DISTINCT FROM n.{q(c.name)}" for c in cols]
        anychanged = " OR ".join(own) if own else "false"
        fr = capture_fragments(q, cols, spec, "n", "o", own)
        ncols, ocols, newvals, oldvals, diff = fr["ncols"], fr["ocols"], fr["newvals"], fr["oldvals"], fr["diff"]
        updmask = " | ".join(f"((CASE WHEN {d} THEN 1 ELSE 0 END)::bigint << {i})" for i, d in enumerate(diff)) if diff else "0"
        updnew, updold = fr["updnew"], fr["updold"]
        stamps = []
        for s in spec.slots:
            smask = sum(1 << i for i in s.columns)
            vcol = q("v_" + s.name)
            stamps.append(f"{vcol} = CASE WHEN l.mask & {smask} <> 0 THEN l.ver ELSE s.{vcol} END")
        slotstamp = ", ".join(stamps) if stamps else "rid = s.rid"
        fns = self._fn(info.name)
        if spec.renumber:
            insrid, slotnames, slotinit, replaced, live = "n.mm_v", "", "", "", ""
        else:
            # a natural key's incarnation (docs/conflicts.md): its first life is 'k:' || key, a later
            # one 'k:' || key || '@' || the highest delete version held for its earlier lives; one
            # still live here (never, short of a capture gap) ends at this insert's version
            insrid = (f"'k:' || CAST(n.{key} AS text) || coalesce('@' || (SELECT CASE WHEN bool_or(s.deleted IS NULL) "
                      f"THEN n.mm_v ELSE max(s.deleted) END FROM {o['shadow']} s WHERE s.key = n.{key}), '')")
            slotnames = "".join(f", {q('v_' + s.name)}" for s in spec.slots)
            slotinit = "".join(", ver" for _ in spec.slots)
            replaced = (f",\n  x AS (UPDATE {o['shadow']} s SET deleted = l.ver FROM l "
                        f"WHERE s.key = l.key AND s.deleted IS NULL)")
            # updates and deletes act on the live incarnation
            live = " AND s.deleted IS NULL"
        # renumbered tables: the rank trigger takes the table's lock before every inserted row, so the
        # statement-level lock is needed for UPDATE and DELETE only (one trigger call less per INSERT)
        lockevents = "UPDATE OR DELETE" if spec.renumber else "INSERT OR UPDATE OR DELETE"
        stmts = self.render(
            "capture", table=q(info.name), key=key, keyname_lit=_lit(info.key.name), site_lit=site, insrid=insrid,
            lockevents=lockevents,
            allmask=str(spec.all_mask), ncols=ncols, ocols=ocols, newvals=newvals, oldvals=oldvals, anychanged=anychanged,
            updmask=updmask, updnew=updnew, updold=updold, slotstamp=slotstamp, slotnames=slotnames, slotinit=slotinit,
            replaced=replaced, live=live, **o, **fns,
        )
        if spec.renumber:
            seq = conn.exec_driver_sql("SELECT pg_get_serial_sequence(%s, %s)", (q(info.name), info.key.name)).scalar()
            seqfix = (f"\n  IF NEW.{key} IS NULL OR NEW.{key} < k THEN\n    PERFORM setval({_lit(seq)}, k);\n  END IF;"
                      if seq else "")
            stmts += self.render("renumber", table=q(info.name), key=key, shadow=o["shadow"], seqfix=seqfix, **fns)
        else:
            stmts += [f"DROP TRIGGER IF EXISTS {fns['rank']} ON {q(info.name)}"]
        for sql in stmts:
            conn.exec_driver_sql(sql)

    def installed_tables(self, conn: Connection) -> list[str]:
        if conn.exec_driver_sql(f"SELECT to_regclass('{SCHEMA}._mm_tables')").scalar() is None:
            return []
        return [r[0] for r in conn.exec_driver_sql(f"SELECT tbl FROM {SCHEMA}._mm_tables ORDER BY tbl")]

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
        dropped += [f"function {r[0]}" for r in conn.exec_driver_sql(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1", (SCHEMA,))]
        # the triggers on user tables depend on functions in _mm: CASCADE drops them with the schema
        conn.exec_driver_sql(f"DROP SCHEMA {SCHEMA} CASCADE")
        dropped.append(f"schema {SCHEMA}")
        return dropped

    # ---- apply -----------------------------------------------------------------------------
    def set_applying(self, conn: Connection, on: bool) -> None:
        conn.exec_driver_sql("SELECT set_config('mm.applying', %s, true)", ("on" if on else "off",))

    def store_snapshot_rows(self, conn: Connection, snap: str, cols: list[str], rows: list[tuple[Any, ...]], applied: bool) -> None:
        # COPY into a scratch table, then one INSERT ... ON CONFLICT DO NOTHING: several times the
        # rate of a row-by-row executemany, in the same transaction
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
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, %s::regclass::oid::int)", (self.quote(info.name),))

    def lock_rows(self, conn: Connection, info: TableInfo, tmp: str) -> None:
        q = self.quote
        o = self.obj(info.name)
        key = q(info.key.name)
        conn.exec_driver_sql(
            f"SELECT 1 FROM {q(info.name)} t JOIN {o['shadow']} s ON s.key = t.{key} JOIN {tmp} r ON r.rid = s.rid "
            f"ORDER BY t.{key} FOR UPDATE OF t"
        ).all()
        conn.exec_driver_sql(f"SELECT 1 FROM {o['shadow']} s JOIN {tmp} r ON r.rid = s.rid ORDER BY s.key FOR UPDATE OF s").all()

    def advance_clock(self, conn: Connection, hlc: int, table: str | None = None) -> None:
        """Record the floor in ``_mm_state.hlc`` and move the clock sequence past it (``_mm_tick``
        with ``wait_``: strictly, whatever the slack captures allow themselves), so every change
        captured afterwards sorts after `hlc`; the capture functions read only the sequence."""
        conn.exec_driver_sql(f"UPDATE {SCHEMA}._mm_state SET hlc = GREATEST(hlc, %s)", (hlc,))
        conn.exec_driver_sql(f"SELECT {SCHEMA}._mm_tick(%s, true)", (hlc,))

    def record_relayed(self, conn: Connection, info: TableInfo, after_seq: int) -> None:
        """Nothing to do: the second-order log is a view in which every change log entry is its
        own append record (triggers/postgresql/table.sql)."""

    def install_problems(self, conn: Connection, tables: Sequence[str]) -> list[str]:
        """A site installed by an earlier multimaster, whose second-order log is a table: its
        positions do not carry over to the view (init must not adopt them)."""
        out = []
        for t in tables:
            name = names(t)["log2"]
            kind = conn.exec_driver_sql(
                "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (SCHEMA, name)).scalar()
            if kind is not None and kind != "v":
                out.append(self.older_layout(t, f"{SCHEMA}.{name}"))
        return out

    def read_clock(self, conn: Connection) -> int | None:
        v = conn.exec_driver_sql(f"SELECT GREATEST(c.last_value, s.hlc) FROM {SCHEMA}._mm_clock c, {SCHEMA}._mm_state s").scalar()
        return None if v is None else int(v)

    def upsert_watermark(self, conn: Connection, peer: str, table: str, seq2: int) -> None:
        conn.exec_driver_sql(
            f"INSERT INTO {SCHEMA}._mm_watermarks (peer, tbl, seq2, pulled_at) "
            "VALUES (%s, %s, %s, to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')) "
            "ON CONFLICT (peer, tbl) DO UPDATE SET seq2 = excluded.seq2, pulled_at = excluded.pulled_at",
            (peer, table, seq2),
        )

    def after_apply(self, conn: Connection, info: TableInfo) -> None:
        """Move the key column's sequence (serial or identity) past the highest key, so a plain
        INSERT never collides even with the capture triggers disabled or removed."""
        q = self.quote
        seq = conn.exec_driver_sql("SELECT pg_get_serial_sequence(%s, %s)", (q(info.name), info.key.name)).scalar()
        if seq:
            conn.exec_driver_sql(
                f"SELECT setval(%s, GREATEST((SELECT coalesce(max({q(info.key.name)}), 0) FROM {q(info.name)}), "
                "(SELECT coalesce(max(key), 0) FROM " + self.obj(info.name)["shadow"] + "), 1))",
                (seq,),
            )

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
    mm_schema = SCHEMA

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
        ]


DIALECT = PostgreSQLDialect()
