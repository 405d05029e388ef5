"""The worked example of section 4.2 of the paper (sites S1..S3, times t1..t6), on every backend.

At time t the three sites are synchronized and R's highest auto-counter key is x. Then:
t1 S1 inserts a row (key x+1); t2 S1 updates it; t3 S2 inserts a row (also key x+1, unaware of S1's);
t4 S2 updates its row; t5 S2 deletes the row with key x; t6 S1 updates the row with key x.
After replication every site holds: the rows below x unchanged, x deleted (the delete wins over the
later update t6), S1's row at x+1 as updated at t2 and S2's row at x+2 as updated at t4 — for both
orders in which S3 can receive the changes.
"""

from __future__ import annotations

import time

import pytest
from clusters import ITEMS, make_cluster

X = 3
BASE = [("items", k, f"base-{k}", 10 * k, 1.0 * k) for k in range(1, X + 1)]


def _history(cl):  # type: ignore[no-untyped-def]
    step = lambda: time.sleep(0.003)  # noqa: E731 - distinct milliseconds: t1 < t2 < ... < t6
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", ("t1-from-s1", 1, 1.5))
    step()
    cl.execute("s1", "UPDATE items SET qty = ? WHERE id = ?", (2, X + 1))
    step()
    cl.execute("s2", "INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", ("t3-from-s2", 3, 3.5))
    step()
    cl.execute("s2", "UPDATE items SET price = ? WHERE id = ?", (4.5, X + 1))
    step()
    cl.execute("s2", "DELETE FROM items WHERE id = ?", (X,))
    step()
    cl.execute("s1", "UPDATE items SET name = ? WHERE id = ?", ("t6-update-of-x", X))


EXPECTED = [
    *[(k, f"base-{k}", 10 * k, 1.0 * k) for k in range(1, X)],
    (X + 1, "t1-from-s1", 2, 1.5),
    (X + 2, "t3-from-s2", 3, 4.5),
]


@pytest.mark.parametrize("s3_first", ["s1", "s2"])
def test_section_4_2(backend, tmp_path, s3_first):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS, base={"s1": BASE, "s2": BASE, "s3": BASE})
    _history(cl)
    # before any refresh both S1 and S2 use key x+1 for their own new row
    assert cl.rows("s1", "items")[-1][:2] == (X + 1, "t1-from-s1")
    assert cl.rows("s2", "items")[-1][:2] == (X + 1, "t3-from-s2")

    # S1 receives S2's log (figure 6): S2's insert becomes x+2, x is deleted
    cl.refresh("s1", "s2")
    assert cl.rows("s1", "items") == EXPECTED
    # S2 receives S1's log (figure 7): its own row moves to x+2, S1's row takes x+1, t6 is disregarded
    cl.refresh("s2", "s1")
    assert cl.rows("s2", "items") == EXPECTED
    # S3 receives the two logs in either order
    other = "s2" if s3_first == "s1" else "s1"
    cl.refresh("s3", s3_first)
    cl.refresh("s3", other)
    assert cl.rows("s3", "items") == EXPECTED
    cl.refresh_until_quiet()
    for s in ("s1", "s2", "s3"):
        assert cl.rows(s, "items") == EXPECTED


def test_section_4_2_records_the_lost_update(backend, tmp_path):  # type: ignore[no-untyped-def]
    from multimaster import api

    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS, base={"s1": BASE, "s2": BASE, "s3": BASE})
    _history(cl)
    cl.refresh_until_quiet()
    kinds = {(c["site"], c["kind"]) for c in api.conflicts(cl.topo, limit=0)}
    # S1 updated x (t6) that S2 had deleted (t5): S1 sees its update overruled by the delete,
    # S2 and S3 see an update arriving for a deleted row. The delete wins everywhere.
    assert ("s1", "delete_update") in kinds
    assert ("s2", "update_delete") in kinds
