"""Helpers shared by the spark tests: clusters built by `multimaster init`, and edits of a site
with or without capture, through the plain clients an application uses (sqlite3, psycopg, PyMySQL).

Divergence is made the way it happens in real life: a write a site's capture does not see. Each
dialect's echo guard (docs/concepts.md) is what the reconciler sets while it applies peers' changes:

- SQLite: ``_mm_state.applying = 1`` inside the write transaction (``BEGIN IMMEDIATE``), reset
  before COMMIT: the capture triggers fire only ``WHEN (SELECT applying FROM _mm_state) = 0``;
- PostgreSQL: ``set_config('mm.applying', 'on', true)`` (``SET LOCAL``: this transaction only);
- MariaDB/MySQL: the session variable ``@mm_applying = 1``, reset to NULL.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from clusters import ITEMS, SQLiteBackend, make_cluster
from sqlalchemy.engine import make_url

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.core.versions import BASE_VER


def row(i: int) -> tuple[Any, ...]:
    """Row i of the test tables: items(id, name, qty, price)."""
    return (i, f"item {i}", i % 97, round(i * 0.25, 2))


def base_rid(key: int) -> str:
    """The identity `init` gives a row that was in the table before (the common base)."""
    return f"{BASE_VER}#{key}"


def write_topology(path: Path, urls: dict[str, str], links: object = "mesh", tables: dict | None = None) -> Path:
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": tables or {"items": {"key": "id"}}, "links": links}
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False))
    return Path(path)


def make_sqlite_cluster(directory: Path, n_sites: int = 3, rows: int = 100) -> Path:
    """n SQLite sites s1..sn (mesh), each with the same `rows` rows of items(id, name, qty, price)
    before `multimaster init`: a converged cluster. Returns the topology file's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cl = make_cluster(SQLiteBackend(), directory, [f"s{i + 1}" for i in range(n_sites)], ITEMS, init=False)
    for url in cl.urls.values():
        c = sql_site(url)
        c.execute("BEGIN")
        c.executemany("INSERT INTO items (id, name, qty, price) VALUES (?, ?, ?, ?)", [row(i) for i in range(1, rows + 1)])
        c.execute("COMMIT")
        c.close()
    api.init(cl.topo)
    return directory / "topology.yaml"


def sql_site(url: str) -> sqlite3.Connection:
    """A plain sqlite3 connection (autocommit) to a SQLite site."""
    return sqlite3.connect(make_url(url).database, isolation_level=None, timeout=30)


def client(url: str) -> Any:
    """A plain DB-API connection to a site, as an application opens it (autocommit for SQLite)."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        return sql_site(url)
    if backend == "postgresql":
        import psycopg

        return psycopg.connect(
            host=u.host, port=u.port or 5432, user=u.username, password=u.password, dbname=u.database, connect_timeout=5
        )
    import pymysql

    return pymysql.connect(
        host=u.host,
        port=u.port or 3306,
        user=u.username,
        password=u.password or "",
        database=u.database,
        charset="utf8mb4",
        connect_timeout=5,
    )


def _url(topo_or_url: Any, site: str | None) -> str:
    return load_topology(topo_or_url).sites[site].url if site is not None else str(topo_or_url)


@contextmanager
def uncaptured(topo_or_url: Any, site: str | None = None) -> Iterator[Any]:
    """Edit a site behind replication's back, in one transaction with the site's capture guard on:
    creates divergence. `topo_or_url`: a topology file with `site`, or a site's URL. Yields a cursor."""
    url = _url(topo_or_url, site)
    backend = make_url(url).get_backend_name()
    c = client(url)
    cur = c.cursor()
    try:
        if backend == "sqlite":
            cur.execute("BEGIN IMMEDIATE")
            cur.execute("UPDATE _mm_state SET applying = 1")
        elif backend == "postgresql":
            cur.execute("SELECT set_config('mm.applying', 'on', true)")
        else:
            cur.execute("SET @mm_applying = 1")
        yield cur
        if backend == "sqlite":
            cur.execute("UPDATE _mm_state SET applying = 0")
            cur.execute("COMMIT")
        else:
            if backend != "postgresql":
                cur.execute("SET @mm_applying = NULL")
            c.commit()
    except BaseException:
        if backend == "sqlite":
            if c.in_transaction:
                c.execute("ROLLBACK")
        else:
            c.rollback()
        raise
    finally:
        c.close()


def captured(topo_path: Any, site: str, *sql: str) -> None:
    """Ordinary application writes: captured into the change log (waiting for the peers)."""
    c = sql_site(load_topology(topo_path).sites[site].url)
    for s in sql:
        c.execute(s)
    c.close()


def make_every_kind(cluster: Path) -> None:
    with uncaptured(cluster, "s2") as c:  # s2 never heard of identity 5
        c.execute("DELETE FROM items WHERE id = 5")
        c.execute("DELETE FROM _mm_shadow_items WHERE key = 5")
    with uncaptured(cluster, "s3") as c:  # s3 deleted 7: s1, s2 still have it
        c.execute("DELETE FROM items WHERE id = 7")
        c.execute("UPDATE _mm_shadow_items SET deleted = '0000000009999999999:s3' WHERE key = 7")
    with uncaptured(cluster, "s1") as c:  # s1 has identity 9 under another key
        c.execute("UPDATE items SET id = 100009 WHERE id = 9")
        c.execute("UPDATE _mm_shadow_items SET key = 100009 WHERE key = 9")
    with uncaptured(cluster, "s3") as c:  # s3 has other values for 11
        c.execute("UPDATE items SET qty = 999, name = NULL WHERE id = 11")


def require_server(kind: str, probe) -> None:  # type: ignore[no-untyped-def]
    """Skip (or fail with MM_REQUIRE_SERVERS=1) when a database server does not answer."""
    try:
        probe()
    except Exception as e:  # noqa: BLE001
        msg = f"{kind} at 127.0.0.1 does not answer ({type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''})"
        if os.environ.get("MM_REQUIRE_SERVERS") == "1":
            pytest.fail(msg + " and MM_REQUIRE_SERVERS=1")
        pytest.skip(msg)
