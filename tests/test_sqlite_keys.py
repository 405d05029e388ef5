"""The key a SQLite application is told of the row it inserted into a renumbered table
(`cursor.lastrowid`, `RETURNING`) is the row's key when the table has AUTOINCREMENT, also after
the newest row was deleted here or at another site; without AUTOINCREMENT it is not after such a
delete, and `init` says so per table (docs/sqlite.md "Keys the application is told")."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, make_cluster, mm

TABLES = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def _autoincrement(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    def create(url: str, table: str, key: str, columns: dict[str, str], auto: bool = True) -> None:
        with backend.connect(url) as c:
            c.execute(f'CREATE TABLE "{table}" ("{key}" INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, qty INTEGER)')

    monkeypatch.setattr(backend, "create_table", create)


def _insert(c: sqlite3.Connection, name: str, returning: bool) -> tuple[Any, Any]:
    """Insert a row as an application does; (the key it is told, the row's key)."""
    if returning:
        told = c.execute("INSERT INTO items (name, qty) VALUES (?, 1) RETURNING id", (name,)).fetchone()[0]
    else:
        told = c.execute("INSERT INTO items (name, qty) VALUES (?, 1)", (name,)).lastrowid
    c.commit()
    return told, c.execute("SELECT id FROM items WHERE name = ?", (name,)).fetchone()[0]


@pytest.mark.parametrize("returning", [False, True], ids=["lastrowid", "returning"])
def test_with_autoincrement_the_key_an_insert_is_told_is_its_rows(
    sqlite_backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, returning: bool
) -> None:
    _autoincrement(sqlite_backend, monkeypatch)
    cl = make_cluster(sqlite_backend, tmp_path, ["a", "b"], TABLES)
    c = sqlite3.connect(cl.urls["a"].removeprefix("sqlite:///"))
    told = [_insert(c, "x1", returning), _insert(c, "x2", returning)]
    c.execute("DELETE FROM items WHERE name = 'x2'")  # the newest row: its key is never given again
    c.commit()
    told.append(_insert(c, "x3", returning))
    cl.execute("b", "INSERT INTO items (name, qty) VALUES ('r1', 1)")  # never a row at a
    cl.execute("b", "DELETE FROM items WHERE name = 'r1'")
    cl.refresh_until_quiet()
    told.append(_insert(c, "x4", returning))
    cl.execute("b", "INSERT INTO items (name, qty) VALUES ('r2', 1)")
    cl.refresh_until_quiet()
    told.append(_insert(c, "x5", returning))
    assert [t for t, _ in told] == [k for _, k in told] == [1, 2, 3, 5, 7]
    cl.refresh_until_quiet()
    cl.assert_converged()


def test_without_autoincrement_init_says_what_the_application_is_told(
    sqlite_backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit itself (SQLite chooses one more than the highest key in the table, a deleted
    row's), and init's note naming the table at every site; none once the table has AUTOINCREMENT."""
    cl = make_cluster(sqlite_backend, tmp_path, ["a", "b"], TABLES)
    c = sqlite3.connect(cl.urls["a"].removeprefix("sqlite:///"))
    _insert(c, "x1", False)
    _insert(c, "x2", False)
    c.execute("DELETE FROM items WHERE name = 'x2'")
    c.commit()
    assert _insert(c, "x3", False) == (2, 3)
    r = mm("init", "-t", str(cl.topo.path))
    assert r.returncode == 0, r.stdout + r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note: ")]
    assert [n.split(":")[1].strip() for n in notes] == ["a", "b"]
    assert all("items has no AUTOINCREMENT here" in n and "docs/sqlite.md" in n for n in notes)

    _autoincrement(sqlite_backend, monkeypatch)
    (tmp_path / "auto").mkdir()
    other = make_cluster(sqlite_backend, tmp_path / "auto", ["a", "b"], TABLES)
    r = mm("init", "-t", str(other.topo.path))
    assert r.returncode == 0 and "note:" not in r.stderr, r.stdout + r.stderr


def test_a_server_application_is_told_how_to_read_a_new_key(backend: Backend, tmp_path: Path) -> None:
    """PostgreSQL and MariaDB: the key trigger gives a renumbered table's row its key from
    multimaster's counter. RETURNING and MariaDB's driver insert id report it; lastval() /
    currval() of the column's sequence (PostgreSQL) and LAST_INSERT_ID() (MariaDB) do not, and
    init names each such table with the way to read it (docs/postgresql.md, docs/mysql.md "Keys
    the application is told")."""
    if backend.name == "sqlite":
        pytest.skip("SQLite's keys: the tests above")
    cl = make_cluster(backend, tmp_path, ["a", "b"], TABLES)
    r = mm("init", "-t", str(cl.topo.path))
    assert r.returncode == 0, r.stdout + r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note: ")]
    assert [n.split(":")[1].strip() for n in notes] == ["a", "b"]
    assert all("items's key comes from multimaster's key counter" in n and "RETURNING" in n for n in notes)
    cl.execute("b", "INSERT INTO items (name, qty) VALUES (?, ?)", ("from-b", 1))
    c = cl.db("a")
    try:
        cur = c.cursor()
        p = backend.param()
        cur.execute(f"INSERT INTO items (name, qty) VALUES ({p}, 1) RETURNING id", ("r",))
        told = cur.fetchone()[0]
        cur.execute(f"SELECT id FROM items WHERE name = {p}", ("r",))
        assert told == cur.fetchone()[0]
        cur.execute(f"INSERT INTO items (name, qty) VALUES ({p}, 1)", ("s",))
        other = cur.lastrowid if backend.name == "mysql" else None
        cur.execute("SELECT LAST_INSERT_ID()" if backend.name == "mysql" else "SELECT lastval()")
        fn = cur.fetchone()[0]
        cur.execute(f"SELECT id FROM items WHERE name = {p}", ("s",))
        key = cur.fetchone()[0]
        if backend.name == "mysql":
            assert other == key  # the driver's insert id: the OK packet's, the key the row got
        assert fn != key  # the documented difference
        c.commit()
    finally:
        c.close()
