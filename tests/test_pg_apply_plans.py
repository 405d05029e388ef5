"""PostgreSQL: a small refresh of a large table reads it by index (docs/performance.md "A small
refresh of a large table").

The reconciler locks the rows it will touch by joining a temporary table of their identities with
the table and its shadow. A temporary table has no statistics unless it is analyzed (autovacuum
never sees it), so the planner guessed it large and chose to scan the whole shadow and table: a
refresh of two changes cost 77 ms at 20,000 rows and 125 ms at 200,000, growing with the table.
This test refreshes two changes into a 20,000-row table and reads the target's scan counters.
"""

from __future__ import annotations

import time
from typing import Any

from clusters import ITEMS, make_cluster

from multimaster import api

N = 20000


def _scans(cl: Any, site: str) -> dict[str, tuple[int, int]]:
    """(seq_scan, idx_scan) of the user table and its shadow at `site`, as flushed so far."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(
            "SELECT relname, seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE (schemaname = 'public' AND relname = 'items') OR (schemaname = '_mm' AND relname = '_mm_shadow_items')"
        )
        return {r[0]: (int(r[1]), int(r[2])) for r in cur.fetchall()}
    finally:
        c.close()


def _settled(cl: Any, site: str) -> dict[str, tuple[int, int]]:
    """_scans once two readings half a second apart agree (at most 10 s)."""
    last = _scans(cl, site)
    for _ in range(20):
        time.sleep(0.5)
        now = _scans(cl, site)
        if now == last:
            break
        last = now
    return last


def test_a_refresh_of_two_changes_reads_a_large_table_by_index(pg_backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(pg_backend, tmp_path, ["p1", "p2"], ITEMS, init=False)
    for s in ("p1", "p2"):
        c = cl.db(s)
        c.cursor().execute(f"INSERT INTO items (id, name, qty, price) SELECT g, 'r' || g, g, 0.5 FROM generate_series(1, {N}) g")
        c.commit()
        c.close()
    api.init(cl.topo)
    cl.refresh_until_quiet()
    cl.execute("p1", "UPDATE items SET qty = -1 WHERE id = 7")
    cl.execute("p1", "UPDATE items SET qty = -2 WHERE id = 19000")
    before = _settled(cl, "p2")  # init's and the first refreshes' counters in (their sessions ended)
    cl.refresh("p2", "p1")  # its connections close at the end: their counters are flushed
    deadline = time.monotonic() + 30
    while True:
        after = _scans(cl, "p2")
        if after["_mm_shadow_items"][1] > before["_mm_shadow_items"][1] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert after["_mm_shadow_items"][1] > before["_mm_shadow_items"][1], "the refresh's statistics never arrived"
    assert cl.rows("p2", "items")[6][2] == -1 and cl.rows("p2", "items")[18999][2] == -2
    for rel in ("items", "_mm_shadow_items"):
        assert after[rel][0] == before[rel][0], (
            f"{rel} was scanned whole {after[rel][0] - before[rel][0]} times: {before} -> {after}"
        )
