"""The bookkeeping tables every site keeps (``_mm_*``), one module per concern; each module is the
only code that reads or writes its tables:

- :mod:`~multimaster.store.watermarks` ``_mm_watermarks``: per peer and table, the position pulled;
- :mod:`~multimaster.store.links` ``_mm_links``: per peer, the last success, the last error, totals;
  and a link's lag (changes waiting at the peer, unapplied here);
- :mod:`~multimaster.store.origins` ``_mm_origins``: per table and origin, the highest version
  applied (the duplicate filter);
- :mod:`~multimaster.store.conflicts` ``_mm_conflicts``: the conflict log;
- :mod:`~multimaster.store.purges` ``_mm_purges``, ``_mm_pullers``, ``_mm_snap_horizons``: the purge
  horizon, the pullers, how far each snapshot may lack entries it pulled;
- :mod:`~multimaster.store.fences` ``_mm_fences``: observations of the other sites, what tombstones
  and conflict-log rows are purged with;
- :mod:`~multimaster.store.verifications` ``_mm_verifications``: recorded verify runs;
- :mod:`~multimaster.store.keymoves` ``_mm_keymoves``: the key history of renumbered tables;
- :mod:`~multimaster.store.tables` ``_mm_tables``: the replicated tables, their base; site counts;
- :mod:`~multimaster.store.errorqueue` ``_mm_errors``: the error queue (changes held, not applied);
- :mod:`~multimaster.store.schemas` ``_mm_schemas``: the schema versions of each replicated table;
- :mod:`~multimaster.store.retired` ``_mm_retired``: the sites removed from the cluster;
- :mod:`~multimaster.store.skew` ``_mm_skew``: per link and origin, a clock found ahead past
  refresh.clock_warn;
- :mod:`~multimaster.store.running` ``_mm_running``: per link into the site, a refresh waiting for
  a lock there now (its lock watch records it; status names it).

Every function takes ``(conn, d: Dialect, ...)`` and builds its SQL with the dialect's syntax only
(placeholder, quoting, upsert, qualified names). What is database mechanics stays in the dialect:
the clock, key shifts, locks, the capture guard, catch-up, the objects made at install
(``_mm_state`` and the tables of each dialect's site template).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect
from multimaster.store import (
    _rows,
    conflicts,
    errorqueue,
    fences,
    gaps,
    keymoves,
    links,
    origins,
    purges,
    retired,
    running,
    schemas,
    skew,
    tables,
    verifications,
    watermarks,
)

__all__ = [
    "conflicts",
    "errorqueue",
    "fences",
    "gaps",
    "keymoves",
    "links",
    "origins",
    "purges",
    "retired",
    "running",
    "schemas",
    "skew",
    "tables",
    "verifications",
    "watermarks",
    "install",
    "forget_table",
    "with_rows",
]


def install(conn: Connection, d: Dialect) -> None:
    """The bookkeeping tables that are the same SQL on every database (idempotent), after the
    dialect's install_site: ``_mm_origins``, ``_mm_purges``, ``_mm_pullers``, ``_mm_snap_horizons``, ``_mm_fences``,
    ``_mm_verifications``, ``_mm_retired``, ``_mm_skew``, ``_mm_gaps``, ``_mm_running``; and the columns a later version added to ``_mm_conflicts``."""
    origins.install(conn, d)
    purges.install(conn, d)
    fences.install(conn, d)
    verifications.install(conn, d)
    conflicts.install(conn, d)
    keymoves.install(conn, d)
    schemas.install(conn, d)
    retired.install(conn, d)
    skew.install(conn, d)
    gaps.install(conn, d)
    running.install(conn, d)


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every bookkeeping row of `table` (`multimaster uninstall --table`, after its objects
    were dropped): watermarks, origins, purge horizons and pullers, observations, key moves, schema
    versions, the error queue's and the conflict log's entries of it, and last its registration in
    ``_mm_tables`` (what makes it an installed table: a site where a run stopped half-way still
    names it). Links (per peer), recorded verify runs and clock skew are not per table. Returns the
    rows deleted per bookkeeping table."""
    out: dict[str, int] = {}
    for mod in (watermarks, origins, purges, fences, keymoves, schemas, gaps, errorqueue, conflicts, tables):
        out.update(mod.forget_table(conn, d, table))
    return out


def with_rows(conn: Connection, d: Dialect, objs: dict[str, str]) -> set[str]:
    """Of the bookkeeping tables `objs` (name -> a condition on its rows, "" for none) that exist
    at this site, those with a row meeting it, in one statement: a refresh asks this of the tables
    that are almost always empty (open capture gaps, removed sites, clock warnings) and reads only
    those that are not, instead of one statement each (over a WAN each is a round trip)."""
    have = [o for o in objs if d.table_kind(conn, o) is not None]
    if not have:
        return set()
    rows = _rows.each_one(
        conn, [(f"SELECT count(*) FROM {d.mm_table(o)}" + (f" WHERE {objs[o]}" if objs[o] else ""), ()) for o in have]
    )
    return {o for o, r in zip(have, rows) if r[0]}
