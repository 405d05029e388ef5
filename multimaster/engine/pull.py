"""Pull: read a peer's change log past the watermark and store it in this site's snapshot of it.

The reading runs at the peer (`pull_batch`, its own short read transaction); the storing runs in
the target's write transaction of the batch (`store_batch`), which also reconciles
(:mod:`multimaster.engine.reconcile`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from multimaster.dialects.schema import TableInfo
from multimaster.engine import references
from multimaster.engine.site import Site
from multimaster.errors import CorruptChange

__all__ = ["LinkRead", "entry_groups", "log_select_columns", "pull_batch", "pull_link", "read_entries", "store_batch"]


def log_select_columns(site: Site, info: TableInfo, prefix: str = "") -> list[str]:
    """The change log's columns in the order the engine reads them: ver, origin, op, rid, key, mask,
    then n_<column> and o_<column> for every replicated column (quoted; `prefix` is an alias, 'l.'),
    then txn where the dialect records source transactions (docs/transactions.md)."""
    q = site.dialect.quote
    cols = [f"{prefix}ver", f"{prefix}origin", f"{prefix}op", f"{prefix}rid", prefix + site.dialect.key_col, f"{prefix}mask"]
    cols += [prefix + q("n_" + c) for c in info.column_names]
    cols += [prefix + q("o_" + c) for c in info.column_names]
    cols += references.log_columns(site.dialect, info, prefix)  # identities of references (f_, fo_)
    if site.dialect.caps.txn_column:
        cols.append(f"{prefix}txn")
    return cols


def read_entries(
    sconn: Connection,
    source: Site,
    target: str,
    info: TableInfo,
    watermark: int,
    below: int | None = None,
    limit: int | None = None,
) -> list[tuple[Any, ...]]:
    """On a connection to `source`: its second-order log entries past `watermark` (and below
    `below`), joined with the change-log rows they reference, in order, as rows (seq2, op2, seq,
    ver, origin, op, rid, key, mask, n..., o...); entries of changes that originated at `target`
    come with change columns None."""
    o = source.dialect.obj(info.name)
    ph = source.dialect.caps.placeholder
    cols = ", ".join(log_select_columns(source, info, "l."))
    sql = (
        f"SELECT l2.seq2, l2.op, l2.seq, {cols} FROM {o.log2} l2 "
        f"LEFT JOIN {o.log} l ON l.seq = l2.seq AND l.origin <> {ph} "
        f"WHERE l2.seq2 > {ph} {'' if below is None else f'AND l2.seq2 < {int(below)} '}"
        f"ORDER BY l2.seq2{'' if limit is None else f' LIMIT {int(limit)}'}"
    )
    return [tuple(r) for r in sconn.exec_driver_sql(sql, (target, watermark))]


def pull_batch(
    source: Site, target: Site, target_conn: Connection | None, info: TableInfo, watermark: int, limit: int
) -> list[tuple[Any, ...]]:
    """Read up to `limit` second-order log entries of `source` past `watermark` (read_entries).

    Where writers capture concurrently, only entries below the source's horizon are read (read
    first, in a statement of its own): below it every entry is final, so none can appear later
    below the new watermark (docs/concepts.md "Many writers")."""
    with source.read() as sconn:
        horizon = source.dialect.read_horizon(sconn, info.name)
        return read_entries(sconn, source, target.name, info, watermark, horizon, limit)


@dataclass
class LinkRead:
    """What one read at a link's source returned: per table (in the order asked) the entries past
    the target's watermark, as read_entries returns them, and the source's horizon (None: every
    entry read is final, and the read holds only whole transactions).

    A read takes at most a window of entries per table (pull_link). When a table's read was cut by
    it, `more` is True (read again after applying what this read allows), and where the source
    records transactions, `end` is the window's end (positions at or past it were not all read)
    and `continuing` the transactions read below `end` that have entries past what was read: a
    batch must not take them yet (core/batches.py, as if they continued past the horizon)."""

    rows: dict[str, list[tuple[Any, ...]]]
    horizon: int | None
    end: int | None = None
    continuing: frozenset[Hashable] = frozenset()
    more: bool = False


def pull_link(
    source: Site, target: str, infos: Sequence[TableInfo], watermarks: Mapping[str, int], window: int | None = None
) -> LinkRead:
    """Read every table's entries past its watermark at `source`, all in one read: at most
    `window` entries per table (None: all of them).

    Where writers capture concurrently, the horizon of every table is read first (each in a
    statement of its own) and the lowest is the link's: every entry below it is final. Entries at
    or past it are read too (within the window): they tell which transactions continue there, so a
    batch never ends inside one (core/batches.py). Elsewhere the read is one read transaction,
    which holds only whole transactions (SQLite: one writer, a reader sees commits whole).

    A table whose read the window cut ends the read at its last entry: positions are one site-wide
    order where transactions are recorded, so the read is whole below the lowest such end; the
    transactions seen below it that have entries past a cut table's last entry read are asked for
    by transaction (the change log's index of them) and returned as `continuing`. Where positions
    are a table's own (SQLite), a cut table is read on in the next read: a transaction across
    tables may then arrive in two batches (docs/transactions.md "Limits")."""
    with source.read() as sconn:
        hs = [source.dialect.read_horizon(sconn, i.name) for i in infos]
        horizon = min(h for h in hs if h is not None) if any(h is not None for h in hs) else None
        rows = {i.name: read_entries(sconn, source, target, i, watermarks[i.name], limit=window) for i in infos}
        cut = [i for i in infos if window is not None and len(rows[i.name]) >= window]
        if not cut:
            return LinkRead(rows, horizon)
        if not source.dialect.caps.txn_column:
            return LinkRead(rows, horizon, more=True)
        end = min(int(rows[i.name][-1][2]) + 1 for i in cut)
        seen = {g for i in infos for pos, g in entry_groups(rows[i.name], i) if g is not None and pos < end}
        continuing: set[Hashable] = set()
        for i in cut:
            continuing |= _continuing(sconn, source, i, int(rows[i.name][-1][2]), seen)
        return LinkRead(rows, horizon, end, frozenset(continuing), more=True)


#: transactions asked for in one statement (pull_link's look past a window)
_ASK = 500


def _continuing(sconn: Connection, source: Site, info: TableInfo, last: int, groups: set[Hashable]) -> set[Hashable]:
    """Of the transactions `groups` ((origin, txn)), those with an entry of `info`'s change log
    past position `last` at `source` (found through the log's index of transactions)."""
    d = source.dialect
    o = d.obj(info.name)
    txns = sorted({str(g[1]) for g in groups if isinstance(g, tuple)})
    out: set[Hashable] = set()
    for i in range(0, len(txns), _ASK):
        part = txns[i : i + _ASK]
        sql = f"SELECT DISTINCT origin, txn FROM {o.log} WHERE txn IN ({d.ph(len(part))}) AND seq > {int(last)}"
        out |= {(origin, txn) for origin, txn in sconn.exec_driver_sql(sql, tuple(part)) if (origin, txn) in groups}
    return out


def entry_groups(rows: Sequence[tuple[Any, ...]], info: TableInfo) -> list[tuple[int, Hashable | None]]:
    """(position, source transaction) of each row read_entries returned: the transaction as (origin,
    txn), None when the row carries none (an entry of the target's own change, or one recorded
    without a transaction)."""
    width = 3 + 6 + 2 * len(info.columns) + 2 * len(info.refs)  # txn comes after the references (log_select_columns)
    out: list[tuple[int, Hashable | None]] = []
    for r in rows:
        txn = r[width] if len(r) > width else None
        out.append((int(r[2]), None if txn is None or r[4] is None else (r[4], txn)))
    return out


def store_batch(
    conn: Connection,
    site: Site,
    info: TableInfo,
    peer: str,
    rows: list[tuple[Any, ...]],
    applied: bool = False,
    txn: str | None = None,
) -> tuple[int, int, int | None]:
    """Copy pulled rows into the snapshot of `peer`. Returns (stored, last seq2, lowest position
    stored or None). The second-order log is a view over the change log on every dialect, so every
    record is an append (``A``); purges are known from the source's horizon
    (`engine.refresh.check_not_purged`), not records. A position the snapshot holds already is
    skipped (add-site stores, as applied, the entries its copy already holds above its cut).

    `applied=True` stores them as applied: the caller reconciles them in the same transaction,
    telling them by the lowest position returned (reconcile_table's `fresh`), which saves marking
    every row afterwards; not when the snapshot held positions at or past the batch already.

    Where this site records source transactions, each row keeps its transaction (relays copy it
    on); a row that came without one (from a site that records none, whose batch is one read of
    whole transactions) gets `txn`, the batch's own, so what this site relays of it stays together."""
    d = site.dialect
    o = d.obj(info.name, peer)
    held: set[int] = set()
    if rows:
        held = {
            int(r[0])
            for r in conn.exec_driver_sql(f"SELECT pseq FROM {o.snapshot()} WHERE pseq >= {d.caps.placeholder}", (rows[0][2],))
        }
        # positions held at or past this batch: the caller cannot tell new rows by position, so
        # they are stored as not applied yet (and no lowest position is returned)
        applied = applied and not held
    ncols = len(info.columns)
    width = 6 + 2 * ncols + 2 * len(info.refs)
    keep_txn = d.caps.txn_column
    appended = []
    adapters = [(i, f) for i, f in enumerate(d.value_adapters(info)) if f is not None]
    conv = [(6 + i, f) for i, f in adapters] + [(6 + ncols + i, f) for i, f in adapters]  # n_ and o_ values
    for r in rows:
        _seq2, op2, seq = r[0], r[1], r[2]
        if op2 == "A":
            if r[3] is None or seq in held:
                continue  # the change came from this site, or was purged already, or is held already
            vals: Sequence[Any] = r[3 : 3 + width]
            if not isinstance(vals[0], str) or len(vals[0]) < 21 or vals[2] not in ("I", "U", "D") or vals[5] is None:
                raise CorruptChange(info.name, peer, seq, f"malformed change (ver={vals[0]!r}, op={vals[2]!r}, mask={vals[5]!r})")
            if conv:  # values as this site's driver stores them exactly (dialects/types.py)
                exact = list(vals)
                for i, f in conv:
                    exact[i] = f(exact[i])
                vals = exact
            if keep_txn:
                t = r[3 + width] if len(r) > 3 + width else None
                vals = (*vals, txn if t is None else str(t))
            appended.append((seq, *vals))
        else:
            raise CorruptChange(info.name, peer, seq, f"unknown second-order log record type {op2!r}")
    if appended:
        cols = (
            ["pseq", "ver", "origin", "op", "rid", d.key_col, "mask"]
            + [d.quote("n_" + c) for c in info.column_names]
            + [d.quote("o_" + c) for c in info.column_names]
            + references.log_columns(d, info)
            + (["txn"] if keep_txn else [])
        )
        d.store_snapshot_rows(conn, o.snapshot(), cols, appended, applied)
    last = rows[-1][0] if rows else 0
    return len(appended), last, min((a[0] for a in appended), default=None) if applied else None
