"""`multimaster init` installing a site while its applications write there (docs/cli.md "multimaster
init": applications may keep writing while init runs, and every transaction they commit arrives
once). Six application connections insert (without a key), update and delete, one transaction at a
time, in a renumbered table (AUTO_INCREMENT / serial key) and a natural-key table, at a full site
while init installs it for the first time (the empty site is copied from it), and again while init
runs over capture triggers that differ from the ones it makes (an upgrade).

On MariaDB, whose DDL commits as it goes, the first install gave the applications errors (session
34): an insert into the renumbered table after its key trigger existed and before the key counter
was moved past every key failed with a duplicate key (1062, keys 1, 2, ...), and an update or delete
of a row inserted after the base rows got their identities and before the capture triggers existed
failed with `Column 'rid' cannot be null` (1048), then and ever after; init itself then failed
ranking the keys those rows held. Now no application transaction fails, and the sites end equal,
keys included, holding exactly what the applications committed."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from clusters import TestCluster, make_cluster

from multimaster import api

TABLES = {
    "items": {"key": "id", "columns": {"name": "text", "qty": "int"}},  # renumbered: keys from the key counter
    "tags": {"key": "code", "columns": {"val": "int"}, "auto": False, "config": {"renumber": False}},
}
BASE_ROWS = 200
WRITERS = 6


class Applications:
    """WRITERS connections at one site, each running transactions until stopped: an insert into
    both tables (items without its key; names start with `round`), or an update or a delete of a
    row it inserted before, in both tables, from the rows `before` left (else the base rows). The
    model (`items`: name -> qty; `tags`: code -> val) is what they committed, `errors`
    what any statement or COMMIT raised, as the application sees it."""

    def __init__(self, cl: TestCluster, site: str, round: str, before: "Applications | None" = None) -> None:
        self.cl, self.site, self.round = cl, site, round
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.items = dict(before.items) if before else {f"base-{i}": i for i in range(BASE_ROWS)}
        self.tags = dict(before.tags) if before else dict(self.items)
        self.errors: list[str] = []
        self.commits = [0] * WRITERS
        self.threads = [threading.Thread(target=self._run, args=(w,)) for w in range(WRITERS)]

    def _run(self, w: int) -> None:
        p = self.cl.backend.param()
        rnd = random.Random(w)
        conn = self.cl.db(self.site)
        cur = conn.cursor()
        mine: list[str] = []
        i = 0
        try:
            while not self.stop.is_set():
                i += 1
                name = f"{self.round}-w{w}-{i}"
                op = "insert" if len(mine) < 3 or rnd.random() < 0.5 else rnd.choice(["update", "delete"])
                try:
                    if op == "insert":
                        cur.execute(f"INSERT INTO items (name, qty) VALUES ({p}, {p})", (name, i))
                        cur.execute(f"INSERT INTO tags (code, val) VALUES ({p}, {p})", (name, i))
                    else:
                        name = rnd.choice(mine)
                        if op == "update":
                            cur.execute(f"UPDATE items SET qty = qty + 1 WHERE name = {p}", (name,))
                            cur.execute(f"UPDATE tags SET val = val + 1 WHERE code = {p}", (name,))
                        else:
                            cur.execute(f"DELETE FROM items WHERE name = {p}", (name,))
                            cur.execute(f"DELETE FROM tags WHERE code = {p}", (name,))
                    conn.commit()
                except Exception as e:  # noqa: BLE001 - what the application sees, asserted on
                    self.errors.append(f"{op} {name}: {type(e).__name__}: {e}")
                    conn.rollback()
                    continue
                self._committed(w, op, name, i, mine)
        finally:
            conn.close()

    def _committed(self, w: int, op: str, name: str, i: int, mine: list[str]) -> None:
        with self.lock:
            self.commits[w] += 1
            if op == "insert":
                self.items[name] = self.tags[name] = i
                mine.append(name)
            elif op == "update":
                self.items[name] += 1
                self.tags[name] += 1
            else:
                del self.items[name], self.tags[name]
                mine.remove(name)

    def wait_commits(self, more: int) -> None:
        """Until every application committed `more` transactions past this call (or one failed)."""
        with self.lock:
            want = [c + more for c in self.commits]
        while not self.errors and any(t.is_alive() for t in self.threads):
            with self.lock:
                if all(c >= n for c, n in zip(self.commits, want)):
                    return
            self.stop.wait(0.01)

    def __enter__(self) -> "Applications":
        for t in self.threads:
            t.start()
        self.wait_commits(3)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wait_commits(3)  # (and writing after init, on the capture it made)
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def _age_capture(cl: TestCluster, site: str) -> None:
    """Make every capture trigger at MariaDB `site` differ from the one init makes, as a site
    installed by an earlier release has them (one more condition, always true), so that init run
    again replaces each while the applications write (PostgreSQL: init makes every trigger again
    in its one transaction anyway)."""
    if cl.backend.name != "mysql":
        return
    c = cl.db(site)
    try:
        cur = c.cursor()
        cur.execute(
            "SELECT TRIGGER_NAME, ACTION_TIMING, EVENT_MANIPULATION, EVENT_OBJECT_TABLE, ACTION_STATEMENT "
            "FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE IN ('items', 'tags')"
        )
        triggers = cur.fetchall()
        assert len(triggers) == 7, triggers  # items: the key trigger and three capture triggers; tags: three
        for name, timing, event, table, body in triggers:
            aged = body.replace("IF coalesce(@mm_applying, 0) = 0 THEN", "IF coalesce(@mm_applying, 0) = 0 AND TRUE THEN", 1)
            assert aged != body, name
            cur.execute(f"CREATE OR REPLACE TRIGGER {name} {timing} {event} ON {table} FOR EACH ROW {aged}")
    finally:
        c.close()


def _assert_every_commit_arrived(cl: TestCluster, apps: Applications) -> None:
    assert not apps.errors, f"{len(apps.errors)} application transaction(s) failed while init ran: {apps.errors[:10]}"
    cl.refresh_until_quiet()
    cl.assert_converged()  # keys included
    for s in cl.urls:
        items = cl.rows(s, "items")
        assert len({r[0] for r in items}) == len(items)
        assert {r[1]: r[2] for r in items} == apps.items, f"items at {s}"
        assert len(items) == len(apps.items), f"items at {s}: a row twice"
        assert dict(cl.rows(s, "tags")) == apps.tags, f"tags at {s}"


@pytest.mark.parametrize("backend_name", ["mysql", "postgresql"])
def test_init_while_applications_write_fails_none_of_them(backend_name, request, tmp_path):  # type: ignore[no-untyped-def]
    """First install of a full site (and an empty one copied from it) while six applications write
    at the full site; then init again, over changed capture triggers, while they write."""
    backend = request.getfixturevalue({"mysql": "mysql_backend", "postgresql": "pg_backend"}[backend_name])
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES, init=False)
    if backend.name == "mysql":  # the applications update and delete by name: indexed, as an application would
        cl.execute("s1", "CREATE INDEX items_name ON items (name(40))")
    else:
        cl.execute("s1", "CREATE INDEX items_name ON items (name)")
    for i in range(BASE_ROWS):  # items without their key: the table's own counter gives it
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, ?)", (f"base-{i}", i))
        cl.execute("s1", "INSERT INTO tags (code, val) VALUES (?, ?)", (f"base-{i}", i))

    with Applications(cl, "s1", "first") as apps:
        rep = api.init(cl.topo)
    assert rep.copied["items"]["s2"] >= BASE_ROWS and rep.copied["tags"]["s2"] >= BASE_ROWS
    _assert_every_commit_arrived(cl, apps)

    _age_capture(cl, "s1")
    with Applications(cl, "s1", "again", apps) as again:
        api.init(cl.topo)
    _assert_every_commit_arrived(cl, again)
