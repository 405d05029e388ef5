"""What newer servers and stricter setups demand, checked on the servers run here (MariaDB 10.11,
PostgreSQL 15) and, where a setting cannot be switched on here, at the level of the SQL emitted:

- MySQL 8 deprecations: text changes are compared with ``CAST(x AS BINARY)`` (not the ``BINARY``
  operator), and no ``VALUES(col)`` in ``ON DUPLICATE KEY UPDATE``; ``@v := expr`` (deprecated in
  8.0.13, still supported) only in the capture triggers' draw of a position, on purpose (docs/mysql.md);
- ``key`` is reserved in MySQL: no statement multimaster sends names its tables' column ``key``
  unquoted (nothing rewrites statements on the way);
- MariaDB capture: an insert takes the key trigger's position only for its own table and row;
- binary logging without SUPER: init refuses before writing anything (``install_problems``);
- ``sql_require_primary_key = ON`` (MySQL 8.0.13+): every table the MySQL dialect creates,
  temporary or not, has a primary key;
- PostgreSQL applications need no privilege on ``_mm``: the capture functions run as their owner.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from clusters import TestCluster, make_cluster
from sqlalchemy import event
from sqlalchemy.engine import Engine

from multimaster import api, store
from multimaster.dialects.mysql import dialect as my

TEXTS = {"notes": {"key": "id", "columns": {"name": "VARCHAR(100)", "body": "text"}}}


def _log_count(cl: TestCluster, site: str, table: str) -> int:
    with api.Cluster(cl.topo) as c, c.site(site).read() as conn:
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM {c.site(site).dialect.obj(table).log}").scalar() or 0)


@contextmanager
def _pg_app_role(pg_backend: Any, url: str, *grants: str) -> Iterator[tuple[Any, str, dict[str, Any]]]:
    """A login role at the database of `url` holding `grants` (each "PRIVILEGES ON OBJECTS"), as an
    application's: yields an autocommit admin connection, the role and the role's connection
    arguments; the role goes at the end with everything it owns."""
    from sqlalchemy.engine import make_url

    role = "mm_app_" + uuid.uuid4().hex[:10]
    admin = pg_backend.connect(url)
    admin.autocommit = True
    try:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        for g in grants:
            admin.execute(f"GRANT {g} TO {role}")
        yield admin, role, {**pg_backend._dsn(make_url(url).database), "user": role, "password": None}
    finally:
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")
        admin.close()


# ---- text changes compared as bytes ----------------------------------------------------------


def test_change_of_letter_case_or_trailing_spaces_is_captured_and_replicated(backend, tmp_path):  # type: ignore[no-untyped-def]
    """On MariaDB the columns use the database's default collation (case-insensitive, PAD SPACE):
    only a byte comparison sees these changes."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TEXTS, base={"s1": [("notes", 1, "Widget", "body")]})
    if backend.name == "mysql":
        c = cl.db("s1")
        try:
            cur = c.cursor()
            cur.execute("SELECT name = 'WIDGET  ', body = 'BODY' FROM notes WHERE id = 1")
            assert cur.fetchone() == (1, 1), "the collation should hide case and trailing spaces"
        finally:
            c.close()
    steps = [
        ("UPDATE notes SET name = 'WIDGET' WHERE id = 1", (1, "WIDGET", "body")),  # letter case only
        ("UPDATE notes SET name = 'WIDGET  ' WHERE id = 1", (1, "WIDGET  ", "body")),  # trailing spaces only
        ("UPDATE notes SET body = 'BODY ' WHERE id = 1", (1, "WIDGET  ", "BODY ")),  # both, TEXT column
    ]
    for sql, want in steps:
        before = _log_count(cl, "s1", "notes")
        cl.execute("s1", sql)
        assert _log_count(cl, "s1", "notes") == before + 1, f"not captured: {sql}"
        cl.refresh_until_quiet()
        assert cl.rows("s2", "notes") == [want]
    before = _log_count(cl, "s1", "notes")
    cl.execute("s1", "UPDATE notes SET name = 'WIDGET  ', body = 'BODY ' WHERE id = 1")  # the same bytes
    assert _log_count(cl, "s1", "notes") == before, "an update to the same bytes was captured"


def test_mysql_sql_avoids_mysql8_deprecations(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """No BINARY operator (deprecated in MySQL 8.0.27) and no VALUES(col) in ON DUPLICATE KEY UPDATE
    (8.0.20): neither in the installed triggers nor in the statements multimaster sends."""
    tables = {
        "tags": {
            "key": "code",
            "auto": False,
            "columns": {"label": "VARCHAR(50)", "n": "int"},
            "config": {"columns": {"n": "additive"}},
        },
        **TEXTS,
    }
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], tables, base={"s1": [("notes", 1, "a", "b")]})
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        for s in ("s1", "s2"):
            cl.execute(s, "INSERT INTO tags (code, label, n) VALUES (?, ?, 1)", (s, s))
        cl.refresh_until_quiet()
        cl.execute("s1", "DELETE FROM tags WHERE code = 's2'")
        cl.refresh_until_quiet()
        cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('s2', 'again', 5)")  # revives the shadow row
        cl.execute("s2", "UPDATE notes SET name = 'A' WHERE id = 1")
        cl.refresh_until_quiet()
        cl.assert_converged()
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute("SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()")
        bodies = [r[0] for r in cur.fetchall()]
    finally:
        c.close()
    assert bodies and any("CAST(OLD." in b for b in bodies)
    for sql in bodies + sent:
        assert not re.search(r"\bBINARY\s+(OLD|NEW)\.", sql, re.I), sql
        # each ON DUPLICATE KEY UPDATE clause, up to the end of its statement
        odku = [part.split(";")[0] for part in re.split(r"ON DUPLICATE KEY UPDATE", sql, flags=re.I)[1:]]
        assert not any(re.search(r"\bVALUES\s*\(", part, re.I) for part in odku), sql
    # the one deprecated form used on purpose (docs/mysql.md): `@v := expr` in the triggers' draw of a
    # position through the slot (an UPDATE of _mm_slots, or the ON DUPLICATE KEY UPDATE of the
    # slot's INSERT), in the ON DUPLICATE KEY UPDATE telling a natural key's first shadow row was there,
    # and in the UPDATE of an updated or deleted row's shadow row, which reads its rid (capture.sql)
    for sql in sent:
        assert ":=" not in sql or sql.lstrip().upper().startswith("CREATE TRIGGER"), sql
    for body in bodies:
        # (until session 23 the slot's UPDATE also read the connection's epoch into @mm_x)
        uses = re.findall(r"(\w+) = \(@(\w+) :=", body)
        assert body.count(":=") == len(uses), body
        assert set(uses) <= {("cur", "mm_p"), ("rid", "mm_dup"), ("rid", "mm_rid")}, body
        assert all(
            re.search(r"(UPDATE _mm_slots SET|ON DUPLICATE KEY UPDATE|UPDATE `_mm_shadow_\w+` SET rid = \(@mm_rid)[^;]*:=", stmt)
            for stmt in body.split(";")
            if ":=" in stmt
        ), body


def test_mysql_insert_takes_the_key_triggers_position_only_for_its_own_row(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """On a renumbered table the insert trigger takes its position from the key trigger, which
    drew it before the key, through a session variable of the table's own. A user trigger that
    inserts into another renumbered table in between (BEFORE INSERT, created after init: it fires
    after the key trigger) draws that table's position with the same key, and sets that table's
    variable: the insert trigger still takes its own row's. Every entry's version is its position,
    all past a clock moved ahead."""
    import time

    from clusters import ITEMS

    from multimaster.engine.site import Site

    cl = make_cluster(
        mysql_backend,
        tmp_path,
        ["s1", "s2"],
        {**ITEMS, "other": {"key": "id", "columns": {"name": "text"}}},
        settings={"refresh": {"max_clock_offset": "2h"}},  # the clock is set an hour ahead below
    )
    cl.execute("s1", "CREATE TRIGGER user_between BEFORE INSERT ON items FOR EACH ROW INSERT INTO other (name) VALUES (NEW.name)")
    ahead = (int(time.time() * 1000) + 3_600_000) << 16  # the clock an hour ahead (a version received)
    site = Site("s1", cl.urls["s1"])
    with site.write() as conn:
        site.dialect.advance_clock(conn, ahead, "items")
    site.dispose()
    for n in ("a", "b"):
        cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, 1, 1.0)", (n,))
    c = cl.db("s1")
    try:
        cur = c.cursor()
        seqs = {}
        for t in ("items", "other"):
            cur.execute(f"SELECT seq, ver FROM _mm_log_{t} ORDER BY seq")
            rows = cur.fetchall()
            assert len(rows) == 2 and all(v == f"{s:019d}:s1" and s > ahead for s, v in rows), (t, rows)
            seqs[t] = {s for s, _ in rows}
        assert not seqs["items"] & seqs["other"], seqs  # no entry took the other table's position
    finally:
        c.close()
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_mysql_key_trigger_still_serves_the_insert_trigger_of_the_release_before(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """init replaces the key trigger of a renumbered table before its insert trigger, and the key
    trigger still sets what the insert trigger of the release before read (@mm_h, when @mm_t and
    @mm_k name the table and the row): an insert between the two steps is captured at the
    position its key trigger drew. The earlier insert trigger is stood in for by one that refuses
    the insert when it would have had to draw a position of its own."""
    from clusters import ITEMS

    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], ITEMS)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute(
            "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() "
            "AND TRIGGER_NAME = '_mm_cap_i_items'"
        )
        body = cur.fetchone()[0]
        took = re.search(r"SET @mm_p = (@mm_h_\w+), \1 = NULL;", body)
        assert took, body
        old = body.replace(
            took.group(0),
            "IF @mm_t = 'items' AND @mm_k = NEW.`id` THEN SET @mm_p = @mm_h, @mm_t = NULL; "
            "ELSE SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the earlier insert trigger drew a position'; END IF;",
        )
        cur.execute("DROP TRIGGER _mm_cap_i_items")
        cur.execute(f"CREATE TRIGGER _mm_cap_i_items AFTER INSERT ON items FOR EACH ROW {old}")
        c.commit()
        cur.execute("INSERT INTO items (name, qty, price) VALUES ('between', 1, 1.0), ('steps', 2, 2.0)")
        c.commit()
        cur.execute("SELECT count(*) FROM _mm_log_items WHERE n_name IN ('between', 'steps')")
        assert cur.fetchone()[0] == 2
    finally:
        c.close()
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_mariadb_update_trigger_refuses_key_changes_and_init_drops_the_old_guard(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """MariaDB has no BEFORE UPDATE OF <column> trigger: the update capture trigger refuses a
    change of the key itself (no guard trigger of its own, which fired for every updated row). A
    refused update leaves the row and the change log as they were, in a multi-row statement too,
    and a permitted one next to it is captured. init run over a site carrying the earlier
    release's guard (`_mm_key_<t>`) drops it."""
    from clusters import ITEMS

    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], ITEMS)
    for n in ("a", "b"):
        cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, 1, 1.0)", (n,))
    before = _log_count(cl, "s1", "items")
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute("SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()")
        assert "_mm_key_items" not in {r[0] for r in cur.fetchall()}
        for sql in ("UPDATE items SET id = 50 WHERE id = 1", "UPDATE items SET id = id + 100, qty = 7"):
            with pytest.raises(Exception, match="managed by replication"):
                cur.execute(sql)
            c.rollback()
        cur.execute("SELECT id, qty FROM items ORDER BY id")
        assert cur.fetchall() == ((1, 1), (2, 1))
        # the earlier release's guard, as its init made it
        cur.execute(
            "CREATE TRIGGER _mm_key_items BEFORE UPDATE ON items FOR EACH ROW BEGIN "
            "IF coalesce(@mm_applying, 0) = 0 AND NOT (OLD.id <=> NEW.id) THEN "
            "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'old guard'; END IF; END"
        )
        c.commit()
    finally:
        c.close()
    assert _log_count(cl, "s1", "items") == before
    api.init(cl.topo)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute("SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()")
        assert "_mm_key_items" not in {r[0] for r in cur.fetchall()}
        with pytest.raises(Exception, match="managed by replication"):
            cur.execute("UPDATE items SET id = 50 WHERE id = 1")
        c.rollback()
    finally:
        c.close()
    cl.execute("s1", "UPDATE items SET qty = 5 WHERE id = 2")
    assert _log_count(cl, "s1", "items") == before + 1
    cl.refresh_until_quiet()
    cl.assert_converged()


# ---- binary logging without SUPER ---------------------------------------------------------


@pytest.mark.parametrize("log_bin,trust,has_super", list(itertools.product([False, True], repeat=3)))
def test_trigger_privilege_problem_decision(log_bin: bool, trust: bool, has_super: bool) -> None:
    msg = my.trigger_privilege_problem(log_bin, trust, has_super)
    if log_bin and not trust and not has_super:
        assert msg is not None
        assert "log_bin_trust_function_creators = 1" in msg and "SUPER" in msg and "1419" in msg
    else:
        assert msg is None


@pytest.mark.parametrize(
    "line,has",
    [
        ("GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION", True),
        ("GRANT SUPER ON *.* TO `mm`@`%`", True),
        ("GRANT SELECT, RELOAD, SUPER, BINLOG ADMIN ON *.* TO `mm`@`%`", True),
        ("GRANT SELECT, INSERT, CREATE, TRIGGER ON *.* TO `mm`@`%`", False),
        ("GRANT ALL PRIVILEGES ON `app`.* TO `mm`@`%`", False),
        ("GRANT USAGE ON *.* TO `mm`@`%` IDENTIFIED BY PASSWORD '*X'", False),
        ("GRANT `admin`@`%` TO `mm`@`%`", False),
    ],
)
def test_show_grants_line_giving_super(line: str, has: bool) -> None:
    assert bool(my._GRANT_SUPER.match(line)) is has


class _FakeConn:
    """Answers the statements install_problems sends, from fixed server state."""

    def __init__(self, log_bin: Any, trust: Any, super_row: bool, grants: list[str]):
        self.state = (log_bin, trust)
        self.super_row = super_row
        self.grants = grants

    def exec_driver_sql(self, sql: str, params: Any = None) -> Any:
        class R:
            def __init__(self, rows: list[tuple[Any, ...]]):
                self.rows = rows

            def first(self) -> Any:
                return self.rows[0] if self.rows else None

            def one(self) -> Any:
                assert len(self.rows) == 1, self.rows
                return self.rows[0]

            def scalar(self) -> Any:
                return self.rows[0][0] if self.rows else None

            def all(self) -> list[tuple[Any, ...]]:
                return self.rows

        if "@@log_bin" in sql:
            return R([self.state])
        if "CURRENT_USER()" in sql:
            return R([("mm@%",)])
        if "USER_PRIVILEGES" in sql:
            assert params == ("'mm'@'%'",)
            return R([(1,)] if self.super_row else [])
        if sql == "SHOW GRANTS":
            return R([(g,) for g in self.grants])
        if "information_schema.TABLES" in sql:  # an older layout's second-order log table: none here
            return R([])
        if "_mm_probe_history" in sql:  # the DELETE HISTORY probe: allowed here (denied: test_mariadb_transaction_ids.py)
            return R([])
        if "_mm_probe_routine" in sql:  # the routines probe: allowed here (denied: test_mariadb_transaction_ids.py)
            return R([])
        if "_mm_probe_rows" in sql:  # the rows probe: allowed here (denied: test_mariadb_transaction_ids.py)
            return R([])
        if sql == "UNLOCK TABLES":  # (after the rows probe's LOCK TABLES)
            return R([])
        if "_mm_probe_drop" in sql:  # the DROP probe: allowed here (denied: test_cli.py)
            return R([])
        raise AssertionError(sql)


@pytest.mark.parametrize(
    "log_bin,trust,super_row,grants,problem",
    [
        (0, 0, False, [], False),
        ("OFF", "OFF", False, [], False),
        (1, 1, False, [], False),
        (1, 0, True, [], False),
        (1, 0, False, ["GRANT ALL PRIVILEGES ON *.* TO `mm`@`%`"], False),
        (1, 0, False, ["GRANT SELECT, TRIGGER ON `app`.* TO `mm`@`%`"], True),
        ("ON", "OFF", False, [], True),
    ],
)
def test_install_problems_reads_the_server_state(
    log_bin: Any, trust: Any, super_row: bool, grants: list[str], problem: bool
) -> None:
    out = my.DIALECT.install_problems(_FakeConn(log_bin, trust, super_row, grants), ["t"])  # type: ignore[arg-type]
    assert bool(out) is problem
    if problem:
        assert "log_bin_trust_function_creators" in out[0]


def test_install_problems_on_the_real_server(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """Binary logging is off on the MariaDB run here (and its root has SUPER anyway): no problem."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1"], TEXTS, init=False)
    with api.Cluster(cl.topo) as c, c.site("s1").read() as conn:
        d = c.site("s1").dialect
        log_bin = conn.exec_driver_sql("SELECT @@log_bin").scalar()
        assert d.install_problems(conn, ["notes"]) == []
        assert d.has_super(conn), "root should hold SUPER"
    if not my._on(log_bin):
        api.init(cl.topo)  # and init goes ahead


# ---- primary keys on every table (sql_require_primary_key) ----------------------------------


def test_temporary_table_ddl_has_a_primary_key() -> None:
    d = my.DIALECT
    keyed = d.temp_ddl("`_mm_tmp_cand`", "SELECT ver, rid FROM s WHERE 1 = 0", keys="ver", index=None)
    assert "PRIMARY KEY (ver)" in keyed and "UNIQUE" not in keyed
    plain = d.temp_ddl("`_mm_tmp_upd`", "SELECT t.a AS v0, t.id AS w FROM t t WHERE 1 = 0", index=None)
    assert "_mm_row BIGINT AUTO_INCREMENT PRIMARY KEY" in plain
    indexed = d.temp_ddl("`x`", "SELECT ver, rid FROM s", index="rid")
    assert "PRIMARY KEY" in indexed and "INDEX (rid)" in indexed


# ---- `key`, a reserved word in MySQL ----------------------------------------------------------
_LITERAL_OR_QUOTED = re.compile(r"('(?:[^'\\]|\\.|'')*'|`[^`]*`|\"(?:[^\"\\]|\\.)*\")", re.S)
_BARE_KEY = re.compile(r"(?<![\w$@])key(?![\w$(])")


def bare_key(sql: str) -> bool:
    """Whether `sql` names `key` unquoted outside string literals and quoted identifiers (keywords
    such as ``PRIMARY KEY`` are upper case)."""
    parts = _LITERAL_OR_QUOTED.split(sql)
    return any(_BARE_KEY.search(parts[i]) for i in range(0, len(parts), 2))


def test_bare_key_finds_unquoted_key_only() -> None:
    assert bare_key("SELECT rid, key FROM _mm_shadow_t")
    assert bare_key("UPDATE s SET deleted = 1 WHERE s.key = %s")
    assert not bare_key("SELECT rid, `key` FROM _mm_shadow_t WHERE note = 'key'")
    assert not bare_key('CREATE TABLE t (id INT PRIMARY KEY, "key" TEXT, keyed INT, mykey INT, maxkey INT)')


def test_no_statement_multimaster_sends_names_key_bare(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """No rewriting of statements on their way to MariaDB/MySQL: every statement multimaster sends
    quotes the column `key` of its own tables (Dialect.key_col). Recorded over init, refreshes with
    key shifts, conflicts, a natural key deleted and inserted again, and the conflict listing."""
    tables = {
        "tags": {
            "key": "code",
            "auto": False,
            "columns": {"label": "VARCHAR(50)", "n": "int"},
            "config": {"columns": {"n": "additive"}},
        },
        **TEXTS,
    }
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if conn.dialect.name in ("mysql", "mariadb"):
            sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], tables, base={"s1": [("notes", 1, "a", "b")]})
        for s in ("s1", "s2"):
            cl.execute(s, "INSERT INTO tags (code, label, n) VALUES (?, ?, 1)", (s, s))
            cl.execute(s, "INSERT INTO tags (code, label, n) VALUES ('both', ?, 1)", (s,))  # one key, two lives
            cl.execute(s, "INSERT INTO notes (name, body) VALUES (?, 'x')", (s,))  # ranks interleave: keys shift
            cl.execute(s, "UPDATE notes SET name = ? WHERE id = 1", (s,))  # a conflict
        cl.refresh_until_quiet()
        cl.execute("s1", "DELETE FROM tags WHERE code = 's2'")
        cl.refresh_until_quiet()
        cl.execute("s2", "INSERT INTO tags (code, label, n) VALUES ('s2', 'again', 5)")  # a later incarnation
        cl.refresh_until_quiet()
        cl.assert_converged()
        assert api.conflicts(cl.topo)
        api.status(cl.topo)
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert any("key" in sql for sql in sent)
    assert [sql for sql in sent if bare_key(sql)] == []


def test_every_table_the_mysql_dialect_creates_has_a_primary_key(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """MariaDB has no sql_require_primary_key: check what MySQL 8.0.13+ would enforce. Permanent
    tables through information_schema after init and refreshes; temporary ones through the DDL sent
    (the planner's scratch tables: candidates from one peer and from several, the bulk update)."""
    items = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
    cl = make_cluster(
        mysql_backend, tmp_path, ["s1", "s2", "s3"], items, base={"s1": [("items", i, f"n{i}", 0) for i in range(1, 101)]}
    )
    created: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if re.match(r"\s*CREATE\s+TEMPORARY\s+TABLE", statement, re.I):
            created.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('new', 1)")
        cl.execute("s2", "UPDATE items SET qty = qty + 1 WHERE id <= 100")  # 100 changes: the bulk update
        cl.refresh("s3", reconcile_=False)  # pulled from both peers, then applied together:
        api.reconcile(cl.topo, "s3")  # candidates from two snapshots, de-duplicated by version
        cl.refresh_until_quiet()
        cl.assert_converged()
        with api.Cluster(cl.topo) as c, c.site("s1").write() as conn:
            store.verifications.install(conn, c.site("s1").dialect)
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert created
    for sql in created:
        assert "PRIMARY KEY" in sql, sql
    names = {m.group(1) for sql in created if (m := re.search(r"TEMPORARY TABLE (?:IF NOT EXISTS )?`?(\w+)", sql))}
    assert {"_mm_tmp_cand", "_mm_tmp_upd"} <= names, names
    assert any("PRIMARY KEY (ver)" in sql for sql in created)
    for site in cl.urls:
        c = cl.db(site)
        try:
            cur = c.cursor()
            cur.execute(
                "SELECT t.TABLE_NAME FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA = DATABASE() "
                "AND t.TABLE_TYPE = 'BASE TABLE' AND t.TABLE_NAME LIKE '\\_mm%%' AND NOT EXISTS (SELECT 1 FROM "
                "information_schema.TABLE_CONSTRAINTS k WHERE k.TABLE_SCHEMA = t.TABLE_SCHEMA AND k.TABLE_NAME = t.TABLE_NAME "
                "AND k.CONSTRAINT_TYPE = 'PRIMARY KEY')"
            )
            assert cur.fetchall() == (), f"tables without a primary key at {site}"
            cur.execute(
                "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '\\_mm%%' "
                "AND TABLE_TYPE = 'BASE TABLE'"
            )
            assert cur.fetchone()[0] >= 12
        finally:
            c.close()


# ---- what an application needs: nothing on multimaster's objects -----------------------


def test_postgresql_application_needs_no_privilege_on_mm(pg_backend, tmp_path):  # type: ignore[no-untyped-def]
    """A role holding exactly what docs/postgresql.md lists for applications (privileges on its own
    tables and the key's sequence, nothing on `_mm`) inserts, updates and deletes rows of replicated
    tables, renumbered and natural-key; every change is captured and reaches the other site. The
    citext column compares as text in the capture functions (their search_path is pg_catalog only):
    a change of letter case is captured too."""
    import psycopg

    tables = {
        "items": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}},
        "tags": {"key": "code", "auto": False, "columns": {"label": "citext"}},
    }
    urls = {s: pg_backend.new_site(tmp_path, s) for s in ("s1", "s2")}
    for url in urls.values():  # citext before the tables are created
        with pg_backend.connect(url) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS citext")
            c.commit()
    pg_backend.new_site = lambda _tmp, s: urls[s]  # type: ignore[method-assign]
    cl = make_cluster(pg_backend, tmp_path, ["s1", "s2"], tables, base={"s1": [("items", 1, "base", 10)]})
    # exactly the documented list: the application's own tables and its key's sequence
    grants = ("SELECT, INSERT, UPDATE, DELETE ON items, tags", "USAGE ON SEQUENCE items_id_seq")
    with _pg_app_role(pg_backend, cl.urls["s1"], *grants) as (admin, role, dsn):
        assert not admin.execute("SELECT has_schema_privilege(%s, '_mm', 'USAGE')", (role,)).fetchone()[0]
        with psycopg.connect(**dsn) as app:
            assert app.execute("SELECT current_user").fetchone()[0] == role
            app.execute("INSERT INTO items (name, qty) VALUES ('a', 1), ('b', 2)")
            app.execute("UPDATE items SET qty = qty + 5 WHERE id = 1")
            app.execute("DELETE FROM items WHERE name = 'b'")
            app.execute("INSERT INTO tags (code, label) VALUES ('x', 'Red'), ('y', 'Blue')")
            app.execute("UPDATE tags SET label = 'RED' WHERE code = 'x'")  # a change of case only
            app.execute("DELETE FROM tags WHERE code = 'y'")
            app.commit()
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT count(*) FROM _mm._mm_log_items")
        assert _log_count(cl, "s1", "items") == 4  # 2 inserts, 1 update, 1 delete
        assert _log_count(cl, "s1", "tags") == 4
        cl.refresh_until_quiet()
        cl.assert_converged()
        assert cl.rows("s2", "items") == [(1, "base", 15), (2, "a", 1)]
        assert cl.rows("s2", "tags") == [("x", "RED")]


def test_postgresql_a_callers_search_path_cannot_reach_into_the_key_function(pg_backend, tmp_path):  # type: ignore[no-untyped-def]
    """The key function of a renumbered table runs as its owner (SECURITY DEFINER) without a fixed
    search_path (renumber.sql): every name in it is schema-qualified. An application role that puts
    a schema of its own first in its search_path, holding look-alikes of every function and the
    operator the function uses (each records who ran it), inserts a row: none of them runs, the row
    takes its key from the counter, and the insert is captured."""
    import psycopg

    cl = make_cluster(pg_backend, tmp_path, ["s1", "s2"], {"items": {"key": "id", "columns": {"name": "text"}}})
    grants = ("SELECT, INSERT ON items", "USAGE ON SEQUENCE items_id_seq")
    with _pg_app_role(pg_backend, cl.urls["s1"], *grants) as (admin, role, dsn):
        admin.execute(f"CREATE SCHEMA evil AUTHORIZATION {role}")  # (dropped with the role's objects)
        with psycopg.connect(**dsn, autocommit=True) as app:
            app.execute("CREATE TABLE evil.ran (who text)")
            app.execute("GRANT INSERT ON evil.ran TO PUBLIC")
            app.execute("GRANT USAGE ON SCHEMA evil TO PUBLIC")
            app.execute(
                "CREATE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS "
                "$$ INSERT INTO evil.ran VALUES (current_user); SELECT 4242::bigint $$"
            )
            app.execute(
                "CREATE FUNCTION evil.current_setting(text, boolean) RETURNS text LANGUAGE sql AS "
                "$$ INSERT INTO evil.ran VALUES (current_user); SELECT 'on'::text $$"
            )
            app.execute(
                "CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE sql AS "
                "$$ INSERT INTO evil.ran VALUES (current_user); SELECT true $$"
            )
            app.execute("CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq)")
            app.execute("SET search_path = evil, public, pg_catalog")
            app.execute("INSERT INTO items (name) VALUES ('a')")
            assert app.execute("SELECT who FROM evil.ran").fetchall() == []
        assert cl.rows("s1", "items") == [(1, "a")]  # the counter's key, not the look-alike's 4242
        assert _log_count(cl, "s1", "items") == 1


def test_mariadb_application_needs_no_privilege_on_mm_tables(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """Triggers run with their definer's rights (the user who ran init): a user holding privileges
    on its own tables only writes replicated tables, and every change is captured (docs/mysql.md)."""
    import pymysql
    from sqlalchemy.engine import make_url

    tables = {
        "items": {"key": "id", "columns": {"name": "text", "qty": "int"}},
        "tags": {"key": "code", "auto": False, "columns": {"label": "text"}},
    }
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], tables)
    user = "mm_app_" + uuid.uuid4().hex[:10]
    db = make_url(cl.urls["s1"]).database
    mysql_backend._admin(f"CREATE USER '{user}'@'%'")
    try:
        for tb in tables:
            mysql_backend._admin(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.`{tb}` TO '{user}'@'%'")
        app = pymysql.connect(**{**mysql_backend._kw(db), "user": user, "password": ""}, autocommit=True)
        try:
            cur = app.cursor()
            cur.execute("INSERT INTO items (name, qty) VALUES ('a', 1), ('b', 2)")
            cur.execute("UPDATE items SET qty = qty + 5 WHERE name = 'a'")
            cur.execute("DELETE FROM items WHERE name = 'b'")
            cur.execute("INSERT INTO tags (code, label) VALUES ('x', 'Red'), ('y', 'Blue')")
            cur.execute("UPDATE tags SET label = 'RED' WHERE code = 'x'")
            cur.execute("DELETE FROM tags WHERE code = 'y'")
            with pytest.raises(pymysql.err.OperationalError):
                cur.execute("SELECT count(*) FROM _mm_log_items")
        finally:
            app.close()
        assert _log_count(cl, "s1", "items") == 4 and _log_count(cl, "s1", "tags") == 4
        cl.refresh_until_quiet()
        cl.assert_converged()
        assert cl.rows("s2", "items") == [(1, "a", 6)]
        assert cl.rows("s2", "tags") == [("x", "RED")]
    finally:
        mysql_backend._admin(f"DROP USER IF EXISTS '{user}'@'%'")


@pytest.mark.parametrize(
    "url, plain",
    [
        ("mysql+pymysql://u@127.0.0.1:3306/db", True),
        ("mysql+pymysql://u@localhost/db", True),
        ("mysql+pymysql://u@[::1]:3306/db", True),
        ("mysql+pymysql://u@db.example.com:3306/db?unix_socket=/run/mysqld/mysqld.sock", True),
        ("mysql+pymysql://u@db.example.com:3306/db", False),
        ("mysql+pymysql://u@127.0.0.1:3306/db?ssl_ca=/etc/ca.pem", False),
        ("mysql+pymysql://u@127.0.0.1:3306/db?ssl_verify_cert=true", False),
    ],
)
def test_tls_is_left_out_only_on_loopback_without_tls_settings(url: str, plain: bool) -> None:
    from multimaster.dialects import get_dialect

    args = get_dialect("mysql").engine_kwargs(url)["connect_args"]
    assert args.get("ssl_disabled", False) is plain


def test_a_loopback_site_connects_without_tls_unless_its_url_asks(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """PyMySQL 2 negotiates unverified TLS by default; multimaster's connections to a loopback
    server do not (docs/mysql.md "TLS"), and a URL asking for TLS gets it."""
    import sqlalchemy as sa

    from multimaster.dialects import get_dialect

    url = mysql_backend.new_site(tmp_path, "tls")
    d = get_dialect("mysql")
    eng = sa.create_engine(url, **d.engine_kwargs(url))
    try:
        with eng.connect() as c:
            assert c.connection.driver_connection.ssl is False  # type: ignore[union-attr]
            assert not c.exec_driver_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").one()[1]
            offers_tls = c.exec_driver_sql("SELECT @@have_ssl").scalar() == "YES"
    finally:
        eng.dispose()
    tls = url + "&ssl_verify_cert=false"
    eng = sa.create_engine(tls, **d.engine_kwargs(tls))
    try:
        if offers_tls:
            with eng.connect() as c:
                assert c.exec_driver_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").one()[1]
        else:  # the URL's request is kept: TLS required, refused by a server without it
            with pytest.raises(sa.exc.OperationalError, match="SSL is required"):
                eng.connect()
    finally:
        eng.dispose()


def test_postgresql_unique_sets_read_from_the_catalog_agree_with_the_inspector(pg_backend, tmp_path):  # type: ignore[no-untyped-def]
    """PostgreSQL reads a table's unique sets in one catalog query; the answer is the base
    dialect's (SQLAlchemy's inspector) for every kind of unique index and constraint."""
    import sqlalchemy as sa

    from multimaster.dialects import get_dialect
    from multimaster.dialects.base import Dialect

    url = pg_backend.new_site(tmp_path, "uq")
    eng = sa.create_engine(url)
    try:
        with eng.begin() as c:
            for sql in (
                'CREATE TABLE "Odd" (id int PRIMARY KEY, "Sku" text UNIQUE, a int, b int, c text, d int, '
                "CONSTRAINT ab_pair UNIQUE (b, a))",
                'CREATE UNIQUE INDEX odd_c_lower ON "Odd" (lower(c))',
                'CREATE UNIQUE INDEX odd_d_partial ON "Odd" (d) WHERE d > 0',
                'CREATE UNIQUE INDEX odd_c_nnd ON "Odd" (c) NULLS NOT DISTINCT',
                'CREATE UNIQUE INDEX odd_id_again ON "Odd" (id)',
                'CREATE INDEX odd_plain ON "Odd" (a)',
                "CREATE TABLE nothing (id int PRIMARY KEY, v text)",
            ):
                c.exec_driver_sql(sql)
        d = get_dialect("postgresql")
        with eng.connect() as c:
            for table in ("Odd", "nothing"):
                got = d.unique_sets(c, table)
                want = Dialect.unique_sets(d, c, table)
                assert sorted(got, key=str) == sorted(want, key=str), (table, got, want)
            assert {u[0] for u in d.unique_sets(c, "Odd")} == {
                "Odd_Sku_key",
                "ab_pair",
                "odd_c_lower",
                "odd_d_partial",
                "odd_c_nnd",
            }
            assert ("ab_pair", ["b", "a"], None) in d.unique_sets(c, "Odd")
    finally:
        eng.dispose()
