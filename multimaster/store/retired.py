"""``_mm_retired``: the sites removed from the cluster (``multimaster remove-site`` records the site
at every other site it reaches). A change whose origin is such a site may still be on its way,
relayed by a site that had it: it is applied as any other. A change whose origin is neither a site
of the topology nor a retired one is held in the error queue (docs/errors.md, "Changes from an
unknown origin")."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect
from multimaster.store import watermarks

__all__ = ["install", "record", "read", "removed", "known_origins"]


def _t(d: Dialect) -> str:
    return d.mm_table("_mm_retired")


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {_t(d)} (site VARCHAR(64) NOT NULL PRIMARY KEY, retired_at VARCHAR(32) NOT NULL)"
    )


def record(conn: Connection, d: Dialect, site: str, at: str) -> None:
    """`site` was removed from the cluster at `at` (idempotent: the first time stays; the table is
    created on a site installed before it existed)."""
    install(conn, d)
    p = d.caps.placeholder
    if conn.exec_driver_sql(f"SELECT 1 FROM {_t(d)} WHERE site = {p}", (site,)).first() is None:
        conn.exec_driver_sql(f"INSERT INTO {_t(d)} (site, retired_at) VALUES ({p}, {p})", (site, at))


def read(conn: Connection, d: Dialect) -> set[str]:
    """The sites recorded as removed (none on a site installed before the table existed)."""
    if d.table_kind(conn, "_mm_retired") is None:
        return set()
    return {str(r[0]) for r in conn.exec_driver_sql(f"SELECT site FROM {_t(d)}")}


def removed(conn: Connection, d: Dialect, here: str) -> set[str]:
    """The sites recorded as removed at site `here` that are still out of the cluster: not `here`
    itself (a site added again copies its source's records) and none this site keeps a snapshot
    of (a site added again with add-site --replace is pulled from again; its old record stays for
    the changes of its first life still on their way)."""
    return {g for g in read(conn, d) if g != here and not watermarks.tables_of(conn, d, g)}


def known_origins(conn: Connection, d: Dialect, sites: list[str]) -> frozenset[str]:
    """The origins a change pulled into this site may have: the topology's `sites` and the sites
    removed from the cluster."""
    return frozenset(set(sites) | read(conn, d))
