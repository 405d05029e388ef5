"""MariaDB names each capturing transaction by its InnoDB id (docs/transactions.md "MariaDB's
transaction id"): the clock `_mm_tick` is system-versioned, transaction-precise, so the row a
capture draws carries its transaction's id, which a reader adds to the entries (`_mm_stamp`)
before it reads them. MariaDB records each such transaction in
mysql.transaction_registry, which no DELETE may touch: `purge` truncates it, unless another table
keeps transaction-precise history, and `status` warns when it grows (docs/mysql.md "The
transaction registry")."""

from __future__ import annotations

import time
import uuid
from typing import Any

from clusters import MySQLBackend, make_cluster, mm

from multimaster import api
from multimaster.dialects.base import Dialect

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def _one(conn: Any, sql: str) -> Any:
    cur = conn.cursor()
    cur.execute(sql)
    return cur.fetchall()


def test_each_transaction_is_named_by_its_innodb_id_even_with_a_fixed_timestamp(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """Three transactions of one connection back to back, no horizon between them, the session's
    clock fixed (SET timestamp: NOW() never changes), then two autocommitted statements: every
    entry of a transaction has one txn, ending in the id of the transaction that drew it (the
    clock row's ROW START); no two transactions share one."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute("SET timestamp = 1700000000")
        for i in range(3):
            cur.execute("INSERT INTO stock (name, qty) VALUES (%s, 1), (%s, 2)", (f"t{i}a", f"t{i}b"))
            cur.execute("UPDATE stock SET qty = qty + 10 WHERE name = %s", (f"t{i}a",))
            c.commit()
        c.autocommit(True)
        cur.execute("INSERT INTO stock (name, qty) VALUES ('auto1', 1)")
        cur.execute("INSERT INTO stock (name, qty) VALUES ('auto2', 1)")
        # capture leaves the id to the reader: every entry ends in '.' until a reader stamps it
        assert {str(r[0]).rsplit(".", 1)[1] for r in _one(c, "SELECT txn FROM _mm_log_stock")} == {""}
        MySQLBackend.stamp(c, "stock")
        txns = [str(r[0]) for r in _one(c, "SELECT txn FROM _mm_log_stock ORDER BY seq")]
        drew = {int(r[0]) for r in _one(c, "SELECT trx FROM _mm_tick FOR SYSTEM_TIME ALL")}
    finally:
        c.close()
    assert len(txns) == 11, txns
    groups = [txns[0:3], txns[3:6], txns[6:9], [txns[9]], [txns[10]]]
    assert all(len(set(g)) == 1 for g in groups), txns
    assert len({g[0] for g in groups}) == 5, txns
    assert {int(t.rsplit(".", 1)[1]) for t in txns} <= drew, (txns, drew)
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_purge_truncates_the_registry_unless_another_table_keeps_history(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """Through the CLI: while a table of the user's keeps transaction-precise history, purge leaves
    mysql.transaction_registry alone and says why (naming the table); once it is gone, purge
    truncates it, and none of the site's capturing transactions is left in it."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK)
    topo = str(tmp_path / "topology.yaml")
    hist = "audit_" + uuid.uuid4().hex[:8]
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute(
            f"CREATE TABLE {hist} (id INT PRIMARY KEY, s BIGINT UNSIGNED AS ROW START INVISIBLE, "
            "e BIGINT UNSIGNED AS ROW END INVISIBLE, PERIOD FOR SYSTEM_TIME(s, e)) WITH SYSTEM VERSIONING"
        )
        c.autocommit(True)
        for i in range(5):
            cur.execute("INSERT INTO stock (name, qty) VALUES (%s, %s)", (f"n{i}", i))
        MySQLBackend.stamp(c, "stock")
        ours = sorted({str(r[0]).rsplit(".", 1)[1] for r in _one(c, "SELECT txn FROM _mm_log_stock")})
        assert len(ours) == 5
        kept = mm("purge", "-t", topo, "--site", "s1", "--min-age", "0s")
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert "not truncated" in kept.stdout and f"{hist}" in kept.stdout, kept.stdout
        cur.execute(f"DROP TABLE {hist}")
        done = mm("purge", "-t", topo, "--site", "s1", "--min-age", "0s", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        left = _one(c, f"SELECT count(*) FROM mysql.transaction_registry WHERE transaction_id IN ({','.join(ours)})")[0][0]
    finally:
        c.close()
    assert left == 0, done.stdout
    assert '"registry": null' in done.stdout or "mysql.transaction_registry truncated" in done.stdout, done.stdout
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_status_warns_of_a_large_registry(mysql_backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Past Dialect.REGISTRY_WARN rows (lowered here), status names the site and says what to run."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('a', 1)")
    monkeypatch.setattr(Dialect, "REGISTRY_WARN", -1)
    with api.Cluster(cl.topo) as c:
        st = api.status(c)
    assert any("site 's1': mysql.transaction_registry holds" in w and "multimaster purge" in w for w in st["registry_warnings"])
    monkeypatch.setattr(Dialect, "REGISTRY_WARN", 10**12)
    with api.Cluster(cl.topo) as c:
        assert api.status(c)["registry_warnings"] == []


def test_a_site_installed_before_gets_a_versioned_clock_and_keeps_its_counter(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """A site whose clock is the plain table of earlier releases: init again makes it
    transaction-precise, the counter (the clock) stays, and capture names transactions again."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('before', 1)")
    c = cl.db("s1")
    try:
        cur = c.cursor()
        top = _one(
            c, "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '_mm_tick'"
        )
        # the clock as earlier releases created it, at the same counter, holding its newest row
        cur.execute("RENAME TABLE _mm_tick TO _mm_tick_was")
        cur.execute(f"CREATE TABLE _mm_tick (t BIGINT AUTO_INCREMENT PRIMARY KEY) ENGINE=InnoDB AUTO_INCREMENT={int(top[0][0])}")
        cur.execute("INSERT INTO _mm_tick (t) SELECT max(t) FROM _mm_tick_was")
        cur.execute("DROP TABLE _mm_tick_was")
        c.commit()
        assert _one(c, "SHOW CREATE TABLE _mm_tick")[0][1].find("SYSTEM VERSIONING") < 0
    finally:
        c.close()
    r = mm("init", "-t", str(tmp_path / "topology.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('after', 1)")
    c = cl.db("s1")
    try:
        kind = _one(
            c, "SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '_mm_tick'"
        )
        seqs = [int(x[0]) for x in _one(c, "SELECT seq FROM _mm_log_stock ORDER BY seq")]
        MySQLBackend.stamp(c, "stock")
        last = str(_one(c, "SELECT txn FROM _mm_log_stock ORDER BY seq DESC LIMIT 1")[0][0])
    finally:
        c.close()
    assert kind[0][0] == "SYSTEM VERSIONED"
    assert seqs[-1] >= int(top[0][0]) and seqs == sorted(seqs), (seqs, top)
    assert last.rsplit(".", 1)[1].isdigit(), last
    cl.refresh_until_quiet()
    assert sorted(r[1] for r in cl.rows("s2", "stock")) == ["after", "before"]


def test_init_refuses_a_user_who_may_not_trim_the_clocks_history(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """The horizon trims the clock's history (DELETE HISTORY, a privilege of its own) as the user
    who ran init, init creates routines (CREATE ROUTINE, ALTER ROUTINE, EXECUTE) and holds a table
    with LOCK TABLES while its capture starts: init run by a user granted the usual privileges one
    by one, without them, stops before writing anything, naming each GRANT; with them granted,
    init and replication go on."""
    import yaml

    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK)
    user = "mm_site_" + uuid.uuid4().hex[:8]
    db = cl.urls["s1"].rsplit("/", 1)[1].split("?")[0]
    grants = "CREATE, DROP, ALTER, INDEX, TRIGGER, CREATE VIEW, CREATE TEMPORARY TABLES"
    mysql_backend._admin(f"CREATE USER '{user}'@'%'")
    try:
        mysql_backend._admin(f"GRANT {grants} ON `{db}`.* TO '{user}'@'%'")
        path = tmp_path / "topology.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["sites"]["s1"]["url"] = cl.urls["s1"].replace("//root@", f"//{user}@")
        as_user = tmp_path / "as-user.yaml"
        as_user.write_text(yaml.safe_dump(doc, sort_keys=False))
        # DDL grants alone (session 33: init wrote tables, then stopped at _mm_state with the
        # driver's 1142, and could not be run again): refused first, naming the rows' GRANT
        r = mm("init", "-t", str(as_user))
        assert r.returncode == 2, r.stdout + r.stderr
        out = " ".join((r.stdout + r.stderr).split())
        assert f"GRANT SELECT, INSERT, UPDATE, DELETE, LOCK TABLES ON `{db}`.* TO '{user}'@'%'" in out, out
        assert "Traceback" not in out and "OperationalError" not in out.split("cannot be read:")[0], out
        mysql_backend._admin(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.* TO '{user}'@'%'")
        r = mm("init", "-t", str(as_user))  # LOCK TABLES, with which init holds a table while its capture starts
        assert r.returncode == 2, r.stdout + r.stderr
        out = " ".join((r.stdout + r.stderr).split())
        assert f"GRANT LOCK TABLES ON `{db}`.* TO '{user}'@'%'" in out, out
        mysql_backend._admin(f"GRANT LOCK TABLES ON `{db}`.* TO '{user}'@'%'")
        r = mm("init", "-t", str(as_user))
        assert r.returncode != 0, r.stdout + r.stderr
        out = " ".join((r.stdout + r.stderr).split())
        assert "may not DELETE HISTORY" in out and f"GRANT DELETE HISTORY ON `{db}`.* TO '{user}'@'%'" in out, out
        assert "may not create, replace and call routines" in out, out
        assert f"GRANT CREATE ROUTINE, ALTER ROUTINE, EXECUTE ON `{db}`.* TO '{user}'@'%'" in out, out
        mysql_backend._admin(f"GRANT DELETE HISTORY, CREATE ROUTINE, ALTER ROUTINE, EXECUTE ON `{db}`.* TO '{user}'@'%'")
        r = mm("init", "-t", str(as_user))
        assert r.returncode == 0, r.stdout + r.stderr
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('x', 1)")
        for _ in range(2):  # the second pull's horizon trims the clock as that user
            r = mm("refresh", "-t", str(as_user))
            assert r.returncode == 0, r.stdout + r.stderr
        assert [row[1] for row in cl.rows("s2", "stock")] == ["x"]
    finally:
        mysql_backend._admin(f"DROP USER IF EXISTS '{user}'@'%'")


TWO = {**STOCK, "notes": {"key": "id", "columns": {"body": "text"}}}


def test_a_tables_entries_keep_their_clock_rows_until_a_reader_stamps_them(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """One transaction writes two tables. A reader that stamps (and trims the clock for) one of
    them leaves the other's clock rows: when the other table is stamped later, its entries get the
    same transaction id as the first table's, the id of the transaction that drew them."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], TWO)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        for i in range(3):
            cur.execute("INSERT INTO stock (name, qty) VALUES (%s, 1)", (f"s{i}",))
            cur.execute("INSERT INTO notes (body) VALUES (%s)", (f"n{i}",))
            c.commit()
        drew = {int(r[0]) for r in _one(c, "SELECT trx FROM _mm_tick FOR SYSTEM_TIME ALL")}
    finally:
        c.close()
    r = cl.db("s1")  # a reader's own session: its first stamping trims the clock
    try:
        MySQLBackend.stamp(r, "stock")
        _one(r, "SET @mm_trimmed = NULL")  # a second trim at once: it empties the clock's history too
        MySQLBackend.stamp(r, "stock")
        stock = [str(x[0]) for x in _one(r, "SELECT txn FROM _mm_log_stock ORDER BY seq")]
        assert all(t.rsplit(".", 1)[1] for t in stock), stock
        left = _one(r, "SELECT count(*) FROM _mm_tick FOR SYSTEM_TIME ALL WHERE t IN (SELECT seq FROM _mm_log_notes)")[0][0]
        assert left == 3, "the clock rows of entries not stamped yet stay"
        MySQLBackend.stamp(r, "notes")
        notes = [str(x[0]) for x in _one(r, "SELECT txn FROM _mm_log_notes ORDER BY seq")]
    finally:
        r.close()
    assert notes == stock and len(set(stock)) == 3, (stock, notes)
    assert {int(t.rsplit(".", 1)[1]) for t in stock} <= drew
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_a_draw_behind_the_wall_clock_keeps_its_explicit_value_as_the_position(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """site.sql _mm_draw: a capture that finds the clock behind the wall clock inserts an explicit
    value of the current millisecond, w + 32768 + the connection's hash, and that value is the
    entry's position: two rows in the clock for the draw (not three), the entry at exactly that
    value, the transaction's next capture past it, and each position the one row of the clock at
    its value (current or history), also after refreshes moved the clock (advance_clock keeps its
    rows), so the stamp reads one transaction id for it."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK)
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('from-s2', 1)")
    cl.refresh_until_quiet()  # s1 applies s2's change: its clock is moved past s2's version
    c = cl.db("s1")
    try:
        cur = c.cursor()
        cur.execute("INSERT INTO stock (name, qty) VALUES ('warm', 1)")  # the connection's slot
        c.commit()
        (conn_id,) = _one(c, "SELECT CONNECTION_ID()")[0]
        hash_ = int(conn_id) * 40503 % 32768
        time.sleep(0.01)  # the clock is behind the wall clock now
        rows = int(_one(c, "SELECT count(*) FROM _mm_tick FOR SYSTEM_TIME ALL")[0][0])
        (before,) = _one(c, "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)")[0]
        cur.execute("INSERT INTO stock (name, qty) VALUES ('first', 1)")
        drew = int(_one(c, "SELECT count(*) FROM _mm_tick FOR SYSTEM_TIME ALL")[0][0]) - rows
        (after,) = _one(c, "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)")[0]
        cur.execute("INSERT INTO stock (name, qty) VALUES ('second', 1)")
        c.commit()
        first, second = (int(_one(c, f"SELECT seq FROM _mm_log_stock WHERE n_name = '{n}'")[0][0]) for n in ("first", "second"))
        MySQLBackend.stamp(c, "stock")
        per_seq = _one(
            c,
            "SELECT l.seq, count(k.t), max(k.trx), max(l.txn) FROM _mm_log_stock l "
            "LEFT JOIN _mm_tick FOR SYSTEM_TIME ALL k ON k.t = l.seq WHERE l.origin = 's1' GROUP BY l.seq",
        )
    finally:
        c.close()
    assert drew == 2, drew
    assert first % 65536 == 32768 + hash_, (first, hash_)
    assert int(before) <= first // 65536 <= int(after), (before, first, after)
    assert second > first
    assert per_seq and all(n == 1 for _, n, _, _ in per_seq), per_seq
    assert all(str(txn).endswith(f".{trx}") for _, _, trx, txn in per_seq), per_seq
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_the_stamp_gives_every_entry_of_a_transaction_one_name_whichever_release_wrote_it(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """Capture writes '<connection>:0.' (no epoch read: docs/transactions.md). The capture trigger
    of the release before wrote the connection's epoch instead, and init replaces one table's
    triggers after the other's: a transaction across both tables can then carry '<c>:5.' in one
    and '<c>:0.' in the other, or be stamped in part by the _mm_stamp before ('<c>:5.<id>'). The
    stamp makes every such name '<c>:0.<id>': one name per transaction, and a peer applies it
    whole."""
    tables = {
        "orders": {"key": "id", "columns": {"ref": "text"}},
        "olines": {"key": "id", "columns": {"ref": "text"}},
    }
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], tables)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        for t in ("T1", "T2"):
            cur.execute("INSERT INTO orders (ref) VALUES (%s)", (t,))
            cur.execute("INSERT INTO olines (ref) VALUES (%s), (%s)", (t, t))
            c.commit()
        (conn_id,) = _one(c, "SELECT CONNECTION_ID()")[0]
        assert {r[0] for r in _one(c, "SELECT txn FROM _mm_log_orders UNION SELECT txn FROM _mm_log_olines")} == {f"{conn_id}:0."}
        # T1 as the release before wrote it in one table; T2 stamped in part by the stamp before
        cur.execute("UPDATE _mm_log_orders SET txn = %s WHERE n_ref = 'T1'", (f"{conn_id}:5.",))
        trx = _one(
            c, "SELECT k.trx FROM _mm_log_olines l JOIN _mm_tick FOR SYSTEM_TIME ALL k ON k.t = l.seq WHERE n_ref = 'T2' LIMIT 1"
        )[0][0]
        cur.execute("UPDATE _mm_log_olines SET txn = %s WHERE n_ref = 'T2'", (f"{conn_id}:7.{trx}",))
        c.commit()
        MySQLBackend.stamp(c, "orders", "olines")
        names: dict[str, set[str]] = {}
        for t in ("orders", "olines"):
            for ref, txn in _one(c, f"SELECT n_ref, txn FROM _mm_log_{t}"):
                names.setdefault(ref, set()).add(str(txn))
    finally:
        c.close()
    assert {k: len(v) for k, v in names.items()} == {"T1": 1, "T2": 1}, names
    (t1,), (t2,) = names["T1"], names["T2"]
    assert t1 != t2 and t1.startswith(f"{conn_id}:0.") and t2 == f"{conn_id}:0.{trx}", names
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_a_trim_that_fails_gives_the_session_its_lock_wait_timeout_back(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """The stamping's trim of the clock waits for no lock (innodb_lock_wait_timeout 0 for its
    DELETEs). When it fails for another reason, the error reaches the reader and the session's
    timeout is the one it had: left at 0, every later lock wait of that pooled connection (a
    refresh's locked watermark read, the reconciler's row locks) would fail at once."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK)
    for i in range(3):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    r = cl.db("s1")
    try:
        _one(
            r,
            "CREATE TRIGGER refuse_trim BEFORE DELETE ON _mm_tick FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no trim'",
        )
        _one(r, "SET SESSION innodb_lock_wait_timeout = 7")
        _one(r, "SET @mm_trimmed = NULL")
        try:
            MySQLBackend.stamp(r, "stock")
        except Exception as e:  # noqa: BLE001 - the server's error, whatever the driver's class
            failed = str(e)
        else:
            failed = ""
        assert "no trim" in failed, failed
        assert int(_one(r, "SELECT @@session.innodb_lock_wait_timeout")[0][0]) == 7
        _one(r, "DROP TRIGGER refuse_trim")
    finally:
        r.close()
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s2", "stock")) == 3
