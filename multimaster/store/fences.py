"""``_mm_fences``: per other site and table, the observation of it this site purges tombstones
and conflict-log rows with (:class:`multimaster.core.retention.Observation`): the highest version
the site had applied per origin and the highest it had written itself, read together, and when.
See ops/purge.py and docs/operations.md ("Tombstones and the conflict log")."""

from __future__ import annotations

import json

from sqlalchemy.engine import Connection

from multimaster.core.retention import Observation
from multimaster.core.versions import now_iso
from multimaster.dialects.base import Dialect
from multimaster.store import _rows, origins

__all__ = ["install", "observe", "read", "write", "forget", "forget_except", "forget_table"]


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {d.mm_table('_mm_fences')} (peer VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, "
        "own_ver VARCHAR(96), applied TEXT NOT NULL, observed_at VARCHAR(32) NOT NULL, PRIMARY KEY (peer, tbl))"
    )


def observe(conn: Connection, d: Dialect, table: str, site: str) -> Observation:
    """This site (named `site`) now: what it applied per origin of `table`, then (no earlier) the
    highest version it wrote itself: in its change log, or purged from it (purge raises
    ``_mm_origins`` of the site's own origin to the highest version it purged)."""
    applied = dict(origins.read(conn, d, table))
    logged = origins.newest_own(conn, d, table, site)
    own = max((v for v in (logged, applied.get(site)) if v), default=None)
    return Observation(site, applied, own, now_iso())


def read(conn: Connection, d: Dialect, table: str) -> dict[str, Observation]:
    """The stored observation of every other site, for `table`."""
    rows = conn.exec_driver_sql(
        f"SELECT peer, own_ver, applied, observed_at FROM {d.mm_table('_mm_fences')} WHERE tbl = {d.caps.placeholder}", (table,)
    ).all()
    return {r[0]: Observation(r[0], json.loads(r[2]), r[1], r[3]) for r in rows}


def write(conn: Connection, d: Dialect, table: str, obs: Observation) -> None:
    """Store `obs` as the observation of its site for `table` (replacing the one stored)."""
    sql, params = d.upsert(
        d.mm_table("_mm_fences"),
        {"peer": obs.site, "tbl": table, "own_ver": obs.own, "applied": json.dumps(dict(obs.applied)), "observed_at": obs.at},
        ("peer", "tbl"),
    )
    conn.exec_driver_sql(sql, params)


def forget(conn: Connection, d: Dialect, peer: str) -> None:
    """Drop every observation of `peer` (it left, or is being instantiated again)."""
    conn.exec_driver_sql(f"DELETE FROM {d.mm_table('_mm_fences')} WHERE peer = {d.caps.placeholder}", (peer,))


def forget_except(conn: Connection, d: Dialect, sites: list[str]) -> int:
    """Drop the observations of sites not in `sites` (no longer in the topology)."""
    t = d.mm_table("_mm_fences")
    gone = [r[0] for r in conn.exec_driver_sql(f"SELECT DISTINCT peer FROM {t}") if r[0] not in sites]
    for p in gone:
        forget(conn, d, p)
    return len(gone)


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_fences`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_fences", table=table)
