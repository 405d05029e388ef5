"""Relaying (reconciler step 6): the changes this site applied that its peers need enter its change
log, with their own version and origin — in each origin's version order, also past a change held
here.

Invariant (D) of docs/concepts.md: every route delivers an origin's changes in version order, so a
site's ``_mm_origins`` (the highest version applied per origin) recognises every duplicate. A change
held in this site's error queue (docs/errors.md) is not applied here, and the later changes of its
origin to other rows are. Relaying those at once would let a peer apply them, raise its
``_mm_origins`` past the held change, and then drop the held change as a duplicate when it arrives
over another route (or from here, once applied): lost there, with nothing held and nothing said.

So a change applied here while an earlier change of its origin to the same table is held here waits
to be relayed: its snapshot rows are ``applied = 4`` (:data:`RELAY_WAITS`). It is relayed, in
version order, as soon as no earlier change of its origin to the table is held (applied by a retry
or a release, or skipped): :func:`released` runs after every retry of the queue
(engine/isolate.py) and before every relay.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.dialects import Dialect
from multimaster.dialects.schema import TableInfo
from multimaster.engine.pull import log_select_columns
from multimaster.engine.site import Site

__all__ = ["RELAY_WAITS", "relay", "relay_one", "released"]

#: `applied` of a snapshot row applied here whose relay waits behind an earlier held change of its origin
RELAY_WAITS = 4


def _behind(d: Dialect, lows: Mapping[str, str], relay_to: Sequence[str] | None) -> tuple[str, list[Any]]:
    """SQL (and its parameters): a row of an origin of `lows` (origin -> its lowest version held
    here) at a version above it; '' when no origin relayed has one."""
    ph = d.caps.placeholder
    waits = [(o, v) for o, v in sorted(lows.items()) if relay_to is None or o in relay_to]
    if not waits:
        return "", []
    return " OR ".join(f"(origin = {ph} AND ver > {ph})" for _ in waits), [x for w in waits for x in w]


def _to(d: Dialect, relay_to: Sequence[str] | None) -> tuple[str, list[Any]]:
    """SQL (and its parameters): the row's origin is relayed (`relay_to`; None: all)."""
    if relay_to is None:
        return "1 = 1", []
    return f"origin IN ({', '.join([d.caps.placeholder] * len(relay_to))})", list(relay_to)


def relay(
    conn: Connection,
    site: Site,
    info: TableInfo,
    cand: str,
    lcols: Sequence[str],
    relay_to: Sequence[str] | None,
    snaps: Sequence[str],
) -> None:
    """The changes just applied (the scratch table `cand`, columns `lcols`) whose origin is in
    `relay_to` (None: all) enter the change log in version order, with their own version and origin,
    written in this site's current schema version (each entry is its own second-order record: the
    second-order log is a view) — but for those with an earlier change of their origin held here:
    their snapshot rows (in `snaps`) wait, ``applied = 4``. What waited and is free now goes first
    (its versions are below every change just applied of its origin: those were above what
    ``_mm_origins`` recorded)."""
    d = site.dialect
    released(conn, site, info, snaps, relay_to)
    to, params = _to(d, relay_to)
    behind, bparams = _behind(d, store.errorqueue.lowest_open(conn, d, info.name), relay_to)
    if behind:
        vers = [
            str(r[0]) for r in conn.exec_driver_sql(f"SELECT ver FROM {cand} WHERE ({to}) AND ({behind})", (*params, *bparams))
        ]
        _mark(conn, d, snaps, vers, 1, RELAY_WAITS)
        to = f"({to}) AND NOT ({behind})"
        params += bparams
    _append(conn, d, info, lcols, cand, f"{to} ORDER BY ver", params)


def relay_one(
    conn: Connection,
    site: Site,
    info: TableInfo,
    snap: str,
    snaps: Sequence[str],
    ver: str,
    origin: str,
    relay_to: Sequence[str] | None,
) -> None:
    """The change `ver` of `origin`, just applied (its entry read from snapshot `snap`), enters the
    change log when `relay_to` (None: every origin) has its origin, as :func:`relay` does; or
    waits (``applied = 4`` in `snaps`) behind an earlier change of its origin held here."""
    d = site.dialect
    if relay_to is not None and origin not in relay_to:
        return
    low = store.errorqueue.lowest_open(conn, d, info.name).get(origin)
    if low is not None and ver > low:
        _mark(conn, d, snaps, [ver], 1, RELAY_WAITS)
        return
    _append(conn, d, info, log_select_columns(site, info), snap, f"ver = {d.caps.placeholder}", [ver])


def released(conn: Connection, site: Site, info: TableInfo, snaps: Sequence[str], relay_to: Sequence[str] | None) -> int:
    """The changes of `info` waiting to be relayed (``applied = 4`` in a snapshot of `snaps`) with no
    earlier change of their origin held here any more enter the change log, in version order (once
    each, whatever snapshots hold them), and their snapshot rows become applied. Reads one row per
    snapshot when none waits. Returns how many."""
    d = site.dialect
    present = [s for s in snaps if conn.exec_driver_sql(f"SELECT 1 FROM {s} WHERE applied = {RELAY_WAITS} LIMIT 1").first()]
    if not present:
        return 0
    behind, bparams = _behind(d, store.errorqueue.lowest_open(conn, d, info.name), None)
    free = f"applied = {RELAY_WAITS}" + (f" AND NOT ({behind})" if behind else "")
    lcols = log_select_columns(site, info)
    cols = ", ".join(lcols)
    tmp = d.temp_name("_mm_tmp_relay")
    d.create_temp(conn, tmp, f"SELECT {cols} FROM {present[0]} WHERE 1 = 0", keys="ver", index=None)
    try:
        for s in present:
            conn.exec_driver_sql(d.insert_ignore_into(tmp, cols, f"SELECT {cols} FROM {s} WHERE {free}"), tuple(bparams))
        vers = [str(r[0]) for r in conn.exec_driver_sql(f"SELECT ver FROM {tmp}")]
        if relay_to is None or relay_to:
            to, params = _to(d, relay_to)
            _append(conn, d, info, lcols, tmp, f"{to} ORDER BY ver", params)
        _mark(conn, d, present, vers, RELAY_WAITS, 1)
    finally:
        d.drop_temp(conn, tmp)
    return len(vers)


def _append(
    conn: Connection, d: Dialect, info: TableInfo, lcols: Sequence[str], source: str, where: str, params: Sequence[Any]
) -> None:
    """The rows of `source` (a snapshot or a scratch table with the change log's columns `lcols`)
    matching `where` enter the change log, written in this site's current schema version."""
    d.append_log(
        conn,
        info.name,
        [*lcols, "sv"],
        select=f"SELECT {', '.join(lcols)}, {int(info.version)} FROM {source} WHERE {where}",
        params=tuple(params),
    )


def _mark(conn: Connection, d: Dialect, snaps: Sequence[str], vers: Sequence[str], was: int, now: int) -> None:
    """Snapshot rows of `vers` with ``applied = was`` get ``applied = now`` (500 versions a statement)."""
    ph = d.caps.placeholder
    for i in range(0, len(vers), 500):
        part = tuple(vers[i : i + 500])
        for snap in snaps:
            conn.exec_driver_sql(
                f"UPDATE {snap} SET applied = {int(now)} WHERE applied = {int(was)} AND ver IN ({', '.join([ph] * len(part))})",
                part,
            )
