"""A follow's capture triggers are made for the schema version it records (engine/evolve.py).

Soak of 2026-11-30 (D1): at a busy MariaDB site whose daemon ran the follow beside two refreshers,
a hand-run ADD COLUMN was followed (version 2 recorded with the column, the change log given its
columns, the signature recorded) but the capture triggers stayed those of version 1: every insert
made there since was captured without the column (sv = 1), and 695 rows kept their value at that
site only, with status saying nothing.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from clusters import make_cluster

from multimaster import api


def _items() -> dict[str, Any]:
    return {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


@pytest.mark.parametrize("backend", ["sqlite", "mysql"], indirect=True)
def test_a_table_described_by_another_thread_during_its_follow_gets_the_new_versions_capture(backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The daemon's follow and its link refreshers share one Site, and its description of each
    table (Site.info). The follow forgets the table's description, alters the change log, records
    the new version, then describes the table to make the capture; a refresher that described the
    table in between (reading the version recorded before) left its description there, and the
    follow made the capture of version 1 from it: unchanged triggers (MariaDB keeps them as they
    are), a version 2 no entry is written in, and the signature recorded as followed. Here the
    refresher's description is made at the moment the follow's first DDL has run."""
    from multimaster.engine import evolve
    from multimaster.engine import refresh as R

    cl = make_cluster(backend, tmp_path, ["a", "b"], _items())
    col = "color TEXT" if backend.name == "sqlite" else "color VARCHAR(20)"
    cl.execute("b", f"ALTER TABLE items ADD COLUMN {col}")
    cl.refresh_until_quiet()  # b follows: version 2 there
    cl.execute("a", f"ALTER TABLE items ADD COLUMN {col}")
    real = evolve._add_columns
    described: list[int] = []

    with api.Cluster(cl.topo) as other:  # the daemon: one Site per site for every thread
        site = other.site("a")

        def describe() -> None:  # a refresher of a link to or from a, in a thread of its own
            with site.read() as c:
                described.append(site.info(c, "items", other.topo).version)

        def add_columns(conn, s, live, ev, old_cols, rels):  # type: ignore[no-untyped-def]
            real(conn, s, live, ev, old_cols, rels)
            if s is site and not described:
                t = threading.Thread(target=describe)
                t.start()
                t.join(10)  # (PostgreSQL: the follow's table lock holds it until the follow commits)

        monkeypatch.setattr(evolve, "_add_columns", add_columns)
        assert [p for ev in R.follow_site(other, "a") for p in ev.problems] == []
        monkeypatch.setattr(evolve, "_add_columns", real)
        assert R.follow_site(other, "a") == []  # followed: nothing left to do
    assert described

    cl.execute("a", "INSERT INTO items (name, qty, color) VALUES ('red one', 3, 'red')")
    cl.refresh_until_quiet()
    cl.tables["items"]["columns"] = {"name": "text", "qty": "int", "color": "text"}
    assert cl.rows("b", "items") == cl.rows("a", "items") == [(1, "red one", 3, "red")]


def _capture_sql(cl: Any, site: str) -> list[str]:
    """The statements that make the capture triggers of items at `site` as they are now."""
    c = cl.db(site)
    try:
        cur = c.cursor()
        out = []
        for t in ("_mm_cap_i_items", "_mm_cap_u_items", "_mm_cap_d_items"):
            if cl.backend.name == "sqlite":
                cur.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (t,))
                out += [f"DROP TRIGGER {t}", cur.fetchone()[0]]
            else:
                cur.execute(f"SHOW CREATE TRIGGER `{t}`")
                out.append(cur.fetchone()[2].replace("CREATE DEFINER", "CREATE OR REPLACE DEFINER", 1))
        return out
    finally:
        c.close()


@pytest.mark.parametrize("backend", ["sqlite", "mysql"], indirect=True)
def test_a_capture_left_in_the_previous_version_is_made_again_by_the_next_follow(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A site in the state the soak left (MariaDB; SQLite could be left so by the race above):
    version 2 recorded with the column and the signature recorded as followed, the capture
    triggers those of version 1. Every insert was then captured without the column, and no follow
    ever looked again (the signature named only which capture triggers exist), nor did status. Now
    the signature names the triggers' text: status names the table, the next follow makes its
    capture again, and the values written there meanwhile reach the other site."""
    cl = make_cluster(backend, tmp_path, ["a", "b"], _items())
    old = _capture_sql(cl, "a")  # version 1's
    col = "color TEXT" if backend.name == "sqlite" else "color VARCHAR(20)"
    for s in ("a", "b"):
        cl.execute(s, f"ALTER TABLE items ADD COLUMN {col}")
    assert not [r.error for r in api.refresh(cl.topo) if r.error]  # both follow: version 2
    c = cl.db("a")
    try:  # the capture of version 1 back, as the soak found it
        for sql in old:
            c.cursor().execute(sql)
        c.commit()
    finally:
        c.close()
    cl.execute("a", "INSERT INTO items (name, qty, color) VALUES ('red one', 3, 'red')")  # captured without color

    st = api.status(cl.topo)
    assert st["sites"]["a"]["schema_unfollowed"] == ["items"]
    cl.refresh_until_quiet()
    cl.execute("a", "INSERT INTO items (name, qty, color) VALUES ('blue one', 4, 'blue')")
    cl.refresh_until_quiet()
    cl.tables["items"]["columns"] = {"name": "text", "qty": "int", "color": "text"}
    assert cl.rows("b", "items") == cl.rows("a", "items") == [(1, "red one", 3, "red"), (2, "blue one", 4, "blue")]
    assert api.status(cl.topo)["sites"]["a"]["schema_unfollowed"] == []
