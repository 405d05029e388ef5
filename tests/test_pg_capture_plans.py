"""PostgreSQL's capture and the plans a session keeps (docs/postgresql.md "Capture and plans").

A plpgsql trigger function plans each of its statements once per session and keeps the plan, made
for the transition table it first saw. Before capture.sql split statements by size and captured
updates per row, one bulk write in a session (a connection of a pool, say) left every later
single-row write of that session scanning the whole shadow: 0.3 s for a single-row UPDATE of a
20,000-row table. These tests write in bulk and then one row at a time in one session, as an
application's pooled connection does, and check that the small writes find their shadow rows by
index (the transaction's own scan counters), and that everything written either way replicates.
"""

from __future__ import annotations

from typing import Any

import pytest
from clusters import ITEMS, make_cluster

from multimaster.dialects.postgresql.dialect import FEW_ROWS

TAGS = {"tags": {"key": "code", "auto": False, "columns": {"label": "text"}}}
N = 3000


def _shadow_seq_scans(cur: Any, table: str) -> int:
    """Sequential scans of `table`'s shadow counted by this session and not yet flushed to the
    statistics (they include earlier transactions' until a flush, which only a transaction's end
    makes: compare two readings within one transaction)."""
    cur.execute(
        "SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables WHERE schemaname = '_mm' AND relname = %s",
        (f"_mm_shadow_{table}",),
    )
    return int(cur.fetchone()[0])


def _writes(table: str, rnd: int) -> dict[str, str]:
    """The statements of round `rnd` of the test, bulk and single-row, for the renumbered `items`
    or the natural-key `tags` (%s: a row number)."""
    if table == "items":
        return {
            "bulk insert": f"INSERT INTO items (name, qty, price) SELECT 'n' || g, g, 0.5 FROM generate_series(1, {N}) g",
            "bulk update": "UPDATE items SET qty = qty + 1",
            "bulk delete": "DELETE FROM items WHERE qty % 2 = 0",
            "insert": "INSERT INTO items (name, qty, price) VALUES ('one-' || %s, 7, 1.5)",
            "update": "UPDATE items SET qty = qty + 10 WHERE id = (SELECT min(id) FROM items) AND %s > 0",
            "delete": "DELETE FROM items WHERE id = (SELECT max(id) FROM items WHERE name NOT LIKE 'one-%%') AND %s > 0",
        }
    return {
        "bulk insert": f"INSERT INTO tags (code, label) SELECT 'k{rnd}-' || g, 'l' || g FROM generate_series(1, {N}) g",
        "bulk update": "UPDATE tags SET label = label || 'x'",
        "bulk delete": "DELETE FROM tags WHERE length(code) % 2 = 0",
        "insert": "INSERT INTO tags (code, label) VALUES ('one-' || %s, 'single')",
        "update": "UPDATE tags SET label = 'changed' WHERE code = (SELECT min(code) FROM tags) AND %s > 0",
        "delete": "DELETE FROM tags WHERE code = (SELECT max(code) FROM tags WHERE code NOT LIKE 'one-%%') AND %s > 0",
    }


@pytest.mark.parametrize("table", ["items", "tags"])
def test_single_row_writes_after_bulk_ones_find_their_shadow_rows_by_index(backend, tmp_path, table):  # type: ignore[no-untyped-def]
    """In one session: a bulk INSERT, UPDATE and DELETE (each far above FEW_ROWS), then single-row
    ones, twice over. Every single-row write's capture reads the shadow by index (no sequential
    scan of it in its transaction); afterwards the peer holds what the site holds."""
    if backend.name != "postgresql":
        pytest.skip("plans cached per session by the capture functions are PostgreSQL's")
    assert N > FEW_ROWS
    tables = ITEMS if table == "items" else TAGS
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], tables)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        for rnd in range(2):
            w = _writes(table, rnd)
            for op in ("bulk insert", "bulk update", "bulk delete"):
                cur.execute(w[op])
                c.commit()
            for i, op in enumerate(("insert", "update", "delete")):
                before = _shadow_seq_scans(cur, table)
                cur.execute(w[op], (rnd * 10 + i + 1,))
                assert cur.rowcount == 1, op
                scans = _shadow_seq_scans(cur, table) - before
                assert scans == 0, f"round {rnd}: a single-row {op} after bulk ones scanned the shadow"
                c.commit()
    finally:
        c.close()
    cl.refresh_until_quiet()
    assert cl.rows("s2", table) == cl.rows("s1", table)
    assert len(cl.rows("s1", table)) >= N // 2


def test_a_statement_on_either_side_of_few_rows_is_captured_whole(backend, tmp_path):  # type: ignore[no-untyped-def]
    """Inserts and deletes of FEW_ROWS rows run the function's cached statement, of FEW_ROWS + 1
    its EXECUTEd copy; both capture every row (one change-log entry each, one transaction)."""
    if backend.name != "postgresql":
        pytest.skip("the capture's split by statement size is PostgreSQL's")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    c = cl.db("s1")
    try:
        cur = c.cursor()
        for n in (FEW_ROWS, FEW_ROWS + 1, 1, 5 * FEW_ROWS):
            cur.execute("INSERT INTO items (name, qty, price) SELECT 'b' || g, g, 0 FROM generate_series(1, %s) g", (n,))
            c.commit()
            cur.execute("DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY id DESC LIMIT %s)", (n,))
            c.commit()
        cur.execute("SELECT op, count(*) FROM _mm._mm_log_items GROUP BY op ORDER BY op")
        counts = dict(cur.fetchall())
        total = FEW_ROWS + FEW_ROWS + 1 + 1 + 5 * FEW_ROWS
        assert counts == {"D": total, "I": total}
        cur.execute("SELECT count(DISTINCT txn) FROM _mm._mm_log_items")
        assert cur.fetchone()[0] == 8  # one transaction per statement
    finally:
        c.close()
    cl.refresh_until_quiet()
    assert cl.rows("s2", "items") == cl.rows("s1", "items") == []


def _history(cur: Any, c: Any, table: str, key: str, rows: list[tuple[str, str]]) -> None:
    """Insert `rows` (key, value) in one statement, delete them in one, insert them again."""
    val = "label" if table == "tags" else "name"
    cols = f"({key}, {val})" if table == "tags" else "(name, qty, price)"
    tup = "(%s, %s)" if table == "tags" else "(%s, 1, 0)"
    flat = [x for r in rows for x in (r if table == "tags" else (r[0],))]
    for again in (False, True):
        cur.execute(f"INSERT INTO {table} {cols} VALUES " + ", ".join([tup] * len(rows)), flat)
        c.commit()
        if not again:
            by = key if table == "tags" else "name"
            cur.execute(f"DELETE FROM {table} WHERE {by} IN ({', '.join(['%s'] * len(rows))})", [r[0] for r in rows])
            c.commit()


def _entries(cur: Any, table: str, who: str) -> list[tuple[Any, ...]]:
    """The change-log entries of the row named `who`, in order, with every version replaced by the
    op of the entry that has it (a rid or a shadow's deleted names an entry, not a time)."""
    val = "label" if table == "tags" else "name"
    cur.execute(f"SELECT ver, op, rid, mask, n_{val}, o_{val} FROM _mm._mm_log_{table} ORDER BY seq")
    log = [r for r in cur.fetchall() if who in (r[4], r[5]) or who in str(r[2])]
    names = {r[0]: f"{r[1]}{i}" for i, r in enumerate(log)}

    def norm(v: Any) -> Any:
        s = str(v)
        for ver, name in names.items():
            s = s.replace(ver, name)
        return s.replace(who, "<row>")

    out = [(op, norm(rid), mask, norm(n), norm(o)) for _, op, rid, mask, n, o in log]
    key = "code" if table == "tags" else "id"
    cur.execute(
        f"SELECT s.rid, s.deleted FROM _mm._mm_shadow_{table} s WHERE s.rid IN ({', '.join(['%s'] * len(log))}) "
        f"OR s.rid LIKE %s ORDER BY s.rid",
        [r[2] for r in log] + [f"k:{who}%"],
    )
    return out + sorted((norm(r), norm(d)) for r, d in cur.fetchall()) + [key]  # type: ignore[list-item]


def test_a_one_row_statement_is_captured_as_the_set_based_statement_captures_it(backend, tmp_path):  # type: ignore[no-untyped-def]
    """An INSERT or DELETE of one row takes capture.sql's one-row path (two plain statements), of
    two rows the set-based statement: on a renumbered and on a natural-key table the same history
    (insert, delete, insert again) leaves the same change-log entries and shadow rows either way,
    the natural key's second incarnation included, and replicates."""
    if backend.name != "postgresql":
        pytest.skip("the capture's split by statement size is PostgreSQL's")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], {**ITEMS, **TAGS})
    c = cl.db("s1")
    try:
        cur = c.cursor()
        for table, key in (("items", "id"), ("tags", "code")):
            _history(cur, c, table, key, [("alpha", "x")])
            _history(cur, c, table, key, [("beta", "x"), ("gamma", "y")])
            one, two = _entries(cur, table, "alpha"), _entries(cur, table, "beta")
            assert [e[0] for e in one[:3]] == ["I", "D", "I"], one
            assert one == two, table
            cur.execute(f"SELECT count(*) FROM _mm._mm_log_{table}")
            assert cur.fetchone()[0] == 9
    finally:
        c.close()
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert len(cl.rows("s2", "tags")) == 3 and len(cl.rows("s2", "items")) == 3
