"""A removed site's change log as its pullers hold it (remove-site, docs/operations.md "Removing a
site"): what each holds (:func:`survey`), and the entries one holds given to another, applied
there as if pulled from the removed site (:func:`give`). Which site gives what to whom is decided
by :mod:`multimaster.core.salvage`.

A puller's snapshot of site S holds the entries of S's change log it pulled, by position, up to
its watermark; above its horizon (``_mm_snap_horizons``, raised by purge and by a change of the
table's layout) it holds every one of them, save those of its own changes (it never stores them:
the receiving site gets them from it directly). The entries are read from the giver's snapshot in
the layout a read of S's change log has (engine/pull.py read_entries) and applied at the receiver
through the refresh's own batch (engine/refresh.py apply_entries): snapshot rows, watermark,
reconcile, relay, error queue, in one transaction. Duplicates are recognised by ``_mm_origins``
as for any pull.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.core.salvage import Copy
from multimaster.dialects.schema import TableInfo, names
from multimaster.engine import references
from multimaster.engine.cluster import Cluster
from multimaster.engine.refresh import apply_entries
from multimaster.engine.relays import RELAY_WAITS
from multimaster.engine.remote import AgentSite
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly

__all__ = ["Held", "Survey", "survey", "read_held", "give", "GiverPurged", "count_changes", "unpulled"]


@dataclass(frozen=True)
class Held:
    """What one puller holds of the removed site's change log of one table."""

    position: int | None  # its watermark (None: it keeps no snapshot of the site)
    kept: int  # its snapshot's horizon (at most `position`): above it every entry pulled is there
    applied: str | None  # the highest version of the site's own changes applied here (_mm_origins)
    waiting: int  # snapshot rows not applied here (waiting, or held in the error queue)
    layout: tuple[Any, ...]  # the table's columns and references here: a giver must have the receiver's
    held: int = 0  # changes that came from the site still held in the error queue here (values in the snapshot)
    relays: int = 0  # snapshot rows applied here whose relay waits behind a change held here


@dataclass
class Survey:
    """What one puller holds of the removed site, per table."""

    site: str
    tables: dict[str, Held] = field(default_factory=dict)


def _layout(info: TableInfo) -> tuple[Any, ...]:
    return (tuple(info.column_names), tuple(r.column for r in info.refs))


def survey(cl: Cluster, site: str, source: str) -> Survey:
    """Read at `site` what it holds of `source`'s change log, every table in one read. Raises
    (SiteUnreachable, AgentOnly, a driver's error) when it cannot be read."""
    s = cl.site(site)
    if isinstance(s, AgentSite):
        raise AgentOnly(site, cl.topo.sites[site].url, "remove-site (it reads and writes the snapshots of the removed site)")
    t = cl.topo
    out = Survey(site)
    with s.read() as conn:
        s.require_installed(conn, t)
        d = s.dialect
        top = store.origins.of_origin(conn, d, source)
        held = store.errorqueue.open_from(conn, d, source)
        for tb in t.tables:
            info = s.info(conn, tb, t)
            wm = store.watermarks.find(conn, d, source, tb)
            if wm is None or d.table_kind(conn, names(tb, source).snapshot()) is None:
                out.tables[tb] = Held(None, 0, top.get(tb), 0, _layout(info))
                continue
            h = store.purges.snapshot_horizon(conn, d, source, tb)
            kept = wm if h is None else max(0, min(h, wm))
            waiting, relays = conn.exec_driver_sql(
                f"SELECT count(*), coalesce(sum(CASE WHEN applied = {RELAY_WAITS} THEN 1 ELSE 0 END), 0) "
                f"FROM {d.obj(tb, source).snapshot()} WHERE applied <> 1"
            ).one()
            out.tables[tb] = Held(wm, kept, top.get(tb), int(waiting), _layout(info), held.get(tb, 0), int(relays))
    return out


class GiverPurged(Exception):
    """The giver's snapshot lost entries the copy needs while they were read (a purge ran): plan again."""


def _snapshot_columns(d: Any, info: TableInfo) -> list[str]:
    """The giver's snapshot columns, in read_entries' order after (seq2, op2, seq)."""
    q = d.quote
    cols = ["pseq", "ver", "origin", "op", "rid", d.key_col, "mask"]
    cols += [q("n_" + c) for c in info.column_names] + [q("o_" + c) for c in info.column_names]
    cols += references.log_columns(d, info)
    cols += ["txn", "pending", "sup"]
    return cols


def read_held(conn: Connection, giver: Site, info: TableInfo, source: str, target: str, copy: Copy) -> list[tuple[Any, ...]]:
    """On a connection to `giver`: the entries of `source`'s change log its snapshot holds at the
    positions in (copy.after, copy.upto], as engine/pull.py read_entries returns a read of
    `source` for `target` (`info`: the giver's layout, which is the target's): rows (seq2, op2,
    seq, ver, origin, op, rid, key, mask, n..., o..., f..., fo..., txn, pending, sup); an entry of
    `target`'s own change comes with its change columns None, and the last position, when the
    snapshot holds no entry there (the giver's own change), as such a row too, so the target's
    watermark moves to it."""
    d = giver.dialect
    ph = d.caps.placeholder
    cols = _snapshot_columns(d, info)
    width = len(cols) - 1  # everything but pseq
    raw = conn.exec_driver_sql(
        f"SELECT {', '.join(cols)} FROM {d.obj(info.name, source).snapshot()} WHERE pseq > {ph} AND pseq <= {ph} ORDER BY pseq",
        (int(copy.after), int(copy.upto)),
    )
    out: list[tuple[Any, ...]] = []
    for r in raw:
        pos = int(r[0])
        if r[2] == target:  # the target's own change, which the source relayed: nothing to carry
            out.append((pos, "A", pos, *([None] * width)))
        else:
            out.append((pos, "A", pos, *r[1:]))
    if not out or out[-1][0] < copy.upto:
        out.append((int(copy.upto), "A", int(copy.upto), *([None] * width)))
    return out


def give(
    cl: Cluster, target: str, source: str, copies: Mapping[str, Copy], wms: Mapping[str, int]
) -> tuple[int, dict[str, int]] | None:
    """Give `target` the entries of `source`'s change log that `copies` name (per table: the giver
    and the positions, continuing from the target's watermark in `wms`), read from each giver's
    snapshot and applied at `target` in one transaction (engine/refresh.py apply_entries).
    Returns (changes stored, per table the changes applied), or None when one of the target's
    watermarks moved meanwhile. Raises GiverPurged when a giver's horizon passed a copy's start
    while its entries were read (they may be incomplete): nothing was written."""
    t = cl.topo
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for tb, c in copies.items():
        g = cl.site(c.donor)
        with g.read() as conn:
            info = g.info(conn, tb, t)
            rows[tb] = read_held(conn, g, info, source, target, c)
        with g.read() as conn:  # read after the rows: a purge that raced the read is seen
            h = store.purges.snapshot_horizon(conn, g.dialect, source, tb)
        if h is None or h > c.after:
            raise GiverPurged(f"site '{c.donor}' purged its snapshot of '{source}' past position {c.after} of table '{tb}'")
    done = apply_entries(cl, target, source, rows, {tb: int(wms[tb]) for tb in t.tables})
    if done is None:
        return None
    stored, results = done
    return stored, {tb: r.applied for tb, r in results.items()}


def count_changes(conn: Connection, site: Site, table: str, source: str, after: str | None, upto: str) -> int:
    """On a connection to `site`: the changes of `source` (its own) with a version in (`after`,
    `upto`] its snapshot of `source` holds."""
    d = site.dialect
    ph = d.caps.placeholder
    snap = d.obj(table, source).snapshot()
    # (no version sorts below the empty string)
    sql = f"SELECT count(*) FROM {snap} WHERE origin = {ph} AND ver > {ph} AND ver <= {ph}"
    return int(conn.exec_driver_sql(sql, (source, after or "", upto)).scalar() or 0)


def unpulled(cl: Cluster, source: str, positions: Mapping[str, int]) -> dict[str, int]:
    """At `source` (which answers), per table its own changes in its change log past `positions`
    (the furthest any of its pullers pulled): what none of them has. Raises when it cannot be read."""
    s = cl.site(source)
    out: dict[str, int] = {}
    with s.read() as conn:
        d = s.dialect
        ph = d.caps.placeholder
        for tb, pos in positions.items():
            sql = f"SELECT count(*) FROM {d.obj(tb).log} WHERE seq > {ph} AND origin = {ph}"
            out[tb] = int(conn.exec_driver_sql(sql, (int(pos), source)).scalar() or 0)
    return out
