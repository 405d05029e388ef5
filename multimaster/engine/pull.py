"""Pull: read a peer's change log past the watermark and store it in this site's snapshot of it.

The reading runs at the peer (`pull_batch`, its own short read transaction); the storing runs in
the target's write transaction of the batch (`store_batch`), which also reconciles
(:mod:`multimaster.engine.reconcile`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from multimaster.dialects.schema import TableInfo
from multimaster.engine.site import Site
from multimaster.errors import CorruptChange

__all__ = ["log_select_columns", "pull_batch", "store_batch"]


def log_select_columns(site: Site, info: TableInfo, prefix: str = "") -> list[str]:
    """The change log's columns in the order the engine reads them: ver, origin, op, rid, key, mask,
    then n_<column> and o_<column> for every replicated column (quoted; `prefix` is an alias, 'l.')."""
    q = site.dialect.quote
    cols = [f"{prefix}ver", f"{prefix}origin", f"{prefix}op", f"{prefix}rid", prefix + site.dialect.key_col, f"{prefix}mask"]
    cols += [prefix + q("n_" + c) for c in info.column_names]
    cols += [prefix + q("o_" + c) for c in info.column_names]
    return cols


def pull_batch(
    source: Site, target: Site, target_conn: Connection | None, info: TableInfo, watermark: int, limit: int
) -> list[tuple[Any, ...]]:
    """Read up to `limit` second-order log entries of `source` past `watermark`, joined with the
    change log rows they reference. Returns rows (seq2, op2, seq, ver, origin, op, rid, key, mask,
    n..., o...). Entries for changes that originated at `target` are kept (to advance the
    watermark) but their change columns are None."""
    o = source.dialect.obj(info.name)
    q = source.dialect.quote
    ph = source.dialect.caps.placeholder
    cols = ", ".join(log_select_columns(source, info, "l."))
    sql = (
        f"SELECT l2.seq2, l2.op, l2.seq, {cols} FROM {o.log2} l2 "
        f"LEFT JOIN {o.log} l ON l.seq = l2.seq AND l.origin <> {ph} "
        f"WHERE l2.seq2 > {ph} "
        f"ORDER BY l2.seq2 LIMIT {int(limit)}"
    )
    del q
    with source.read() as sconn:
        return [tuple(r) for r in sconn.exec_driver_sql(sql, (target.name, watermark))]


def store_batch(
    conn: Connection, site: Site, info: TableInfo, peer: str, rows: list[tuple[Any, ...]], applied: bool = False
) -> tuple[int, int]:
    """Copy pulled rows into the snapshot of `peer`. Returns (stored, last seq2). The second-order
    log is a view over the change log on every dialect, so every record is an append (``A``);
    purges are known from the source's horizon (`engine.refresh.check_not_purged`), not records.

    `applied=True` stores them as applied: the caller reconciles them in the same transaction (see
    reconcile_table's `fresh`), which saves marking every row afterwards."""
    d = site.dialect
    o = d.obj(info.name, peer)
    ncols = len(info.columns)
    width = 6 + 2 * ncols
    appended = []
    adapters = [(i, f) for i, f in enumerate(d.value_adapters(info)) if f is not None]
    conv = [(6 + i, f) for i, f in adapters] + [(6 + ncols + i, f) for i, f in adapters]  # n_ and o_ values
    for r in rows:
        _seq2, op2, seq = r[0], r[1], r[2]
        if op2 == "A":
            if r[3] is None:
                continue  # the change came from this site, or was purged already
            vals: Sequence[Any] = r[3 : 3 + width]
            if not isinstance(vals[0], str) or len(vals[0]) < 21 or vals[2] not in ("I", "U", "D") or vals[5] is None:
                raise CorruptChange(info.name, peer, seq, f"malformed change (ver={vals[0]!r}, op={vals[2]!r}, mask={vals[5]!r})")
            if conv:  # values as this site's driver stores them exactly (dialects/types.py)
                exact = list(vals)
                for i, f in conv:
                    exact[i] = f(exact[i])
                vals = exact
            appended.append((seq, *vals))
        else:
            raise CorruptChange(info.name, peer, seq, f"unknown second-order log record type {op2!r}")
    if appended:
        cols = (
            ["pseq", "ver", "origin", "op", "rid", d.key_col, "mask"]
            + [d.quote("n_" + c) for c in info.column_names]
            + [d.quote("o_" + c) for c in info.column_names]
        )
        d.store_snapshot_rows(conn, o.snapshot(), cols, appended, applied)
    last = rows[-1][0] if rows else 0
    return len(appended), last
