"""Helpers shared by the spark tests: edit sites with or without capture."""

from __future__ import annotations

import os

import pytest

from contextlib import contextmanager

from multimaster.spark.fixtures import sql_site
from multimaster.config.topology import load_topology


@contextmanager
def uncaptured(topo_path, site):
    """Edit a site behind replication's back (capture guard on): creates divergence."""
    c = sql_site(load_topology(topo_path).sites[site].url)
    c.execute("BEGIN IMMEDIATE")
    c.execute("UPDATE _mm_state SET applying = 1")
    yield c
    c.execute("UPDATE _mm_state SET applying = 0")
    c.execute("COMMIT")
    c.close()


def captured(topo_path, site, *sql):
    """Ordinary application writes: captured into the change log (waiting for the peers)."""
    c = sql_site(load_topology(topo_path).sites[site].url)
    for s in sql:
        c.execute(s)
    c.close()


def make_every_kind(cluster):
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

def require_server(kind: str, probe) -> None:
    """Skip (or fail with MM_REQUIRE_SERVERS=1) when a database server does not answer."""
    try:
        probe()
    except Exception as e:  # noqa: BLE001
        msg = f"{kind} at 127.0.0.1 does not answer ({type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''})"
        if os.environ.get("MM_REQUIRE_SERVERS") == "1":
            pytest.fail(msg + " and MM_REQUIRE_SERVERS=1")
        pytest.skip(msg)
