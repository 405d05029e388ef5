"""Pull: read a peer's change log past the watermark and store it in this site's snapshot of it.

The reading runs at the peer (`pull_batch`, its own short read transaction); the storing runs in
the target's write transaction of the batch (`store_batch`), which also reconciles
(:mod:`multimaster.engine.reconcile`).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.core.schemas import decode_pending, encode_pending, translate
from multimaster.core.versions import now_iso
from multimaster.dialects.fit import Misfit
from multimaster.dialects.schema import TableInfo
from multimaster.engine import references
from multimaster.engine.held import HELD
from multimaster.engine.site import Site
from multimaster.errors import CorruptChange, EntryTooLarge
from multimaster.store.errorqueue import SCHEMA, Held

__all__ = ["LinkRead", "entry_groups", "log_select_columns", "pull_batch", "pull_link", "read_entries", "store_batch"]


def log_select_columns(site: Site, info: TableInfo, prefix: str = "") -> list[str]:
    """The change log's columns in the order the engine reads them: ver, origin, op, rid, key, mask,
    then n_<column> and o_<column> for every replicated column (quoted; `prefix` is an alias, 'l.'),
    then txn (the source transaction, docs/transactions.md; NULL in a SQLite site's own entries), then sup (the
    heads the change superseded, docs/conflicts.md "Concurrent heads"), always last."""
    q = site.dialect.quote
    cols = [f"{prefix}ver", f"{prefix}origin", f"{prefix}op", f"{prefix}rid", prefix + site.dialect.key_col, f"{prefix}mask"]
    cols += [prefix + q("n_" + c) for c in info.column_names]
    cols += [prefix + q("o_" + c) for c in info.column_names]
    cols += references.log_columns(site.dialect, info, prefix)  # identities of references (f_, fo_)
    cols.append(f"{prefix}txn")
    cols.append(f"{prefix}sup")  # last: engine/reconcile.py reads it there
    return cols


#: read_entries' `layouts` when not given: read there
_READ_HERE: Any = object()


def read_entries(
    sconn: Connection,
    source: Site,
    target: str,
    info: TableInfo,
    watermark: int,
    below: int | None = None,
    limit: int | None = None,
    have: Mapping[str, str] | None = None,
    layouts: Any = _READ_HERE,
) -> list[tuple[Any, ...]]:
    """On a connection to `source`: its second-order log entries past `watermark` (and below
    `below`), joined with the change-log rows they reference, in order, as rows (seq2, op2, seq,
    ver, origin, op, rid, key, mask, n..., o..., f..., fo..., txn, pending, sup) in the layout of `info`
    (the target's columns); entries of changes that originated at `target` come with change
    columns None, and so do those of an origin in `have` (origin -> the highest version of it the
    target applied, _mm_origins) at or below that version: the target would drop them as
    duplicates (engine/reconcile.py), so only their positions travel (docs/topologies.md "A mesh
    ships each change once").

    Each entry is carried by column name from the schema version it was written in
    (core/schemas.py translate, the source's ``_mm_schemas``): `pending` is None, or the values of
    columns the entry needs and the target does not have yet (the change waits for them). `sup`
    (the heads the change superseded) comes last, after `pending`, as the source's log holds it.

    The source's schema versions are read before its entries, each in a statement of its own: a
    version recorded (and its first entries committed) between the two is read again, and the
    entries with it (a site following its schema meanwhile records a version before its capture
    writes an entry of it, engine/evolve.py). `layouts`: the versions, read already in this
    transaction (store.schemas.layouts_all: pull_link reads every table's in one statement), for
    the first read; an entry of a version they lack has them read again as above."""
    unknown = _UnknownVersion(None, 0)
    for given in ([layouts] if layouts is not _READ_HERE else []) + [_READ_HERE] * 3:
        try:
            return _read_entries(sconn, source, target, info, watermark, below, limit, have, given)
        except _UnknownVersion as e:
            unknown = e
    raise CorruptChange(
        info.name, source.name, unknown.seq, f"written in schema version {unknown.version}, which the source does not record"
    )


class _UnknownVersion(Exception):
    """An entry of a schema version the source's versions, as read, do not hold."""

    def __init__(self, seq: Any, version: int) -> None:
        self.seq, self.version = seq, version


def _read_entries(
    sconn: Connection,
    source: Site,
    target: str,
    info: TableInfo,
    watermark: int,
    below: int | None,
    limit: int | None,
    have: Mapping[str, str] | None,
    given: Any,
) -> list[tuple[Any, ...]]:
    d = source.dialect
    o = d.obj(info.name)
    ph = d.caps.placeholder
    q = d.quote
    layouts = store.schemas.layouts(sconn, d, info.name) if given is _READ_HERE else given
    versioned = layouts is not None
    if layouts is None:  # a source installed before schema versions: its layout is the target's
        layouts = {1: list(info.column_names)}
    union = sorted({c for cols in layouts.values() for c in cols})
    cols = ["l.ver", "l.origin", "l.op", "l.rid", "l." + d.key_col, "l.mask"]
    cols += ["l." + q("n_" + c) for c in union] + ["l." + q("o_" + c) for c in union]
    cols += references.log_columns(d, info, "l.")  # identities of references (f_, fo_)
    cols += ["l.txn", "l.sv" if versioned else "NULL", "l.sup"]
    # origins the target applied up to a version: their entries up to it travel as positions
    had, had_args = store.origins.beyond(d, have)
    sql = (
        f"SELECT l2.seq2, l2.op, l2.seq, {', '.join(cols)} FROM {o.log2} l2 "
        f"LEFT JOIN {o.log} l ON l.seq = l2.seq AND l.origin <> {ph}{had} "
        f"WHERE l2.seq2 > {ph} {'' if below is None else f'AND l2.seq2 < {int(below)} '}"
        f"ORDER BY l2.seq2{'' if limit is None else f' LIMIT {int(limit)}'}"
    )
    raw = sconn.exec_driver_sql(sql, (target, *had_args, watermark))
    return _in_layout([tuple(r) for r in raw], info, union, layouts, min(layouts))


def _in_layout(
    raw: list[tuple[Any, ...]], info: TableInfo, union: list[str], layouts: dict[int, list[str]], first: int
) -> list[tuple[Any, ...]]:
    """read_entries' rows (their values in the source log's columns `union`) in `info`'s layout."""
    dst = list(info.column_names)
    nu, nd, nr = len(union), len(dst), 2 * len(info.refs)
    pos = {c: i for i, c in enumerate(union)}
    defaults = {c.name: c.default for c in info.columns}
    picks = {v: [pos[c] for c in cols] for v, cols in layouts.items()}
    identity = {v: cols == dst for v, cols in layouts.items()}
    out: list[tuple[Any, ...]] = []
    for r in raw:
        head, body = r[:3], r[3:]
        if body[0] is None:  # the target's own change: nothing to carry
            out.append((*head, *([None] * (6 + 2 * nd + nr)), None, None, None))
            continue
        n_all, o_all = body[6 : 6 + nu], body[6 + nu : 6 + 2 * nu]
        refs, txn, sv, sup = body[6 + 2 * nu : 6 + 2 * nu + nr], body[-3], body[-2], body[-1]
        v = first if sv is None else int(sv)
        if v not in picks:
            raise _UnknownVersion(r[2], v)
        new = tuple(n_all[i] for i in picks[v])
        old = tuple(o_all[i] for i in picks[v])
        op, mask = body[2], body[5]
        pending = None
        if identity[v] or mask is None or op not in ("I", "U", "D"):
            m, nv, ov = mask, new, old
            if not identity[v]:  # malformed: carried by name as it is, held as malformed
                nv = tuple(new[layouts[v].index(c)] if c in layouts[v] else None for c in dst)
                ov = tuple(old[layouts[v].index(c)] if c in layouts[v] else None for c in dst)
        else:
            t = translate(op, int(mask), new, old, layouts[v], dst, info.dropped, defaults)
            m, nv, ov = t.mask, t.new, t.old
            pending = encode_pending(t.pending) if t.pending else None
        out.append((*head, *body[:5], m, *nv, *ov, *refs, txn, pending, sup))
    return out


def pull_batch(
    source: Site, target: Site, target_conn: Connection | None, info: TableInfo, watermark: int, limit: int
) -> list[tuple[Any, ...]]:
    """Read up to `limit` second-order log entries of `source` past `watermark` (read_entries).

    Where writers capture concurrently, only entries below the source's horizon are read (read
    first, in a statement of its own): below it every entry is final, so none can appear later
    below the new watermark (docs/concepts.md "Many writers")."""
    with source.read() as sconn:
        horizon = source.dialect.read_horizons(sconn, [info.name])[info.name]
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
    #: the highest position of an entry of a `continuing` transaction (past what was read; None
    #: when none continues): a refresh that takes such a transaction in pieces ends its stretch
    #: only past it (core/batches.py stream_step)
    beyond: int | None = None


def pull_link(
    source: Site,
    target: str,
    infos: Sequence[TableInfo],
    watermarks: Mapping[str, int],
    window: int | None = None,
    have: Mapping[str, Mapping[str, str]] | None = None,
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
    tables may then arrive in two batches (docs/transactions.md "Limits").

    `have` (table -> origin -> version, read at the target): entries the target has applied travel
    as positions only (read_entries)."""
    with source.read() as sconn:
        hs = list(source.dialect.read_horizons(sconn, [i.name for i in infos]).values())
        horizon = min(h for h in hs if h is not None) if any(h is not None for h in hs) else None
        known = store.schemas.layouts_all(sconn, source.dialect, [i.name for i in infos])  # (one statement)
        rows = {
            i.name: read_entries(
                sconn, source, target, i, watermarks[i.name], limit=window, have=(have or {}).get(i.name), layouts=known[i.name]
            )
            for i in infos
        }
        own = [int(r[2]) for i in infos for r in rows[i.name] if r[4] == source.name]
        bounds = source.dialect.txn_bounds(sconn, min(own), max(own)) if own else None
        if bounds:
            rows = {i.name: _split_txns(rows[i.name], i, source.name, bounds) for i in infos}
        cut = [i for i in infos if window is not None and len(rows[i.name]) >= window]
        if not cut:
            return LinkRead(rows, horizon)
        if not source.dialect.caps.txn_column:
            return LinkRead(rows, horizon, more=True)
        end = min(int(rows[i.name][-1][2]) + 1 for i in cut)
        seen = {g for i in infos for pos, g in entry_groups(rows[i.name], i) if g is not None and pos < end}
        continuing: dict[Hashable, int] = {}
        for i in cut:
            for g, hi in _continuing(sconn, source, i, int(rows[i.name][-1][2]), seen, bounds or {}).items():
                continuing[g] = max(hi, continuing.get(g, hi))
        beyond = max(continuing.values(), default=None)
        return LinkRead(rows, horizon, end, frozenset(continuing), more=True, beyond=beyond)


def _split_txns(
    rows: list[tuple[Any, ...]], info: TableInfo, origin: str, bounds: Mapping[str, list[int]]
) -> list[tuple[Any, ...]]:
    """read_entries' rows with the source's own entries whose ``txn`` ('<connection>:<epoch>')
    may stand for several transactions (Dialect.txn_bounds) split at the connection's recorded
    bounds: an entry gets '<connection>:<epoch>:<b>', b the first bound at or past its position;
    an entry past every bound keeps its ``txn``.

    Each group stays a union of whole transactions, since every bound lies between two of the
    connection's transactions. And a writer that never pauses no longer holds every batch back: a
    horizon renews an epoch only while its connection is between transactions, so under a steady
    load one ``txn`` ran on without end, always past the horizon (docs/transactions.md "Bounds").
    What the target stores and relays keeps the split name; a group split coarser elsewhere (an
    add-site copy) is still whole transactions."""
    width = 3 + 6 + 2 * len(info.columns) + 2 * len(info.refs)  # entry_groups' txn column
    out: list[tuple[Any, ...]] = []
    for r in rows:
        if len(r) > width and r[4] == origin and r[width] is not None:
            txn = str(r[width])
            bs = bounds.get(txn.split(":", 1)[0])
            if bs and txn.count(":") == 1:
                k = bisect.bisect_left(bs, int(r[2]))
                if k < len(bs):
                    r = (*r[:width], f"{txn}:{bs[k]}", *r[width + 1 :])
        out.append(r)
    return out


#: transactions asked for in one statement (pull_link's look past a window)
_ASK = 500


def _continuing(
    sconn: Connection, source: Site, info: TableInfo, last: int, groups: set[Hashable], bounds: Mapping[str, list[int]]
) -> dict[Hashable, int]:
    """Of the transactions `groups` ((origin, txn)), those with an entry of `info`'s change log
    past position `last` at `source` (found through the log's index of transactions), each with
    the highest position of its entries there. A group
    _split_txns named with bound b holds the stored txn's entries up to b; an unsplit one of the
    source's own, its entries past the connection's last bound read."""
    d = source.dialect
    o = d.obj(info.name)
    stored: dict[tuple[Any, str], list[tuple[Any, str, int | None, int | None]]] = {}
    for g in groups:
        if not isinstance(g, tuple):
            continue
        origin, txn = g[0], str(g[1])
        if origin == source.name and txn.count(":") == 2:  # split: at or below its bound
            base, b = txn.rsplit(":", 1)
            stored.setdefault((origin, base), []).append((g, txn, None, int(b)))
        else:
            bs = bounds.get(txn.split(":", 1)[0]) if origin == source.name else None
            above = bs[-1] if bs else None
            stored.setdefault((origin, txn), []).append((g, txn, above, None))
    txns = sorted({t for _, t in stored})
    out: dict[Hashable, int] = {}
    for i in range(0, len(txns), _ASK):
        part = txns[i : i + _ASK]
        sql = (
            f"SELECT origin, txn, min(seq), max(seq) FROM {o.log} WHERE txn IN ({d.ph(len(part))}) AND seq > {int(last)} "
            "GROUP BY origin, txn"
        )
        for origin, txn, lo, hi in sconn.exec_driver_sql(sql, tuple(part)):
            for g, _, above, upto in stored.get((origin, str(txn)), []):
                if (upto is None or int(lo) <= upto) and (above is None or int(hi) > above):
                    top = int(hi) if upto is None else min(int(hi), upto)
                    out[g] = max(top, out.get(g, top))
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
    refused: list[dict[str, Any]] | None = None,
) -> tuple[int, int, int | None]:
    """Copy pulled rows into the snapshot of `peer`. Returns (stored, last seq2, lowest position
    stored or None). The second-order log is a view over the change log on every dialect, so every
    record is an append (``A``); purges are known from the source's horizon
    (`engine.refresh.check_not_purged`), not records. A position the snapshot holds already is
    skipped (add-site stores, as applied, the entries its copy already holds above its cut).

    `applied=True` stores them as applied: the caller reconciles them in the same transaction,
    telling them by the lowest position returned (reconcile_table's `fresh`), which saves marking
    every row afterwards; not when the snapshot held positions at or past the batch already.

    Each row keeps its source transaction (relays copy it on; on every dialect, SQLite's too since
    session 36); a row that came without one (a SQLite site's own change: its batch is one read of
    whole transactions) gets `txn`, the batch's own name (core/batches.py batch_txn), so what this
    site relays of it stays together for the cuts downstream — where this site's capture records
    transactions (not at a SQLite site: there it keeps none). The error queue takes that name for
    none (each such change is a unit of its own, core/errorqueue.py group_key).

    A change with a value this site cannot store exactly (Dialect.value_checks) is stored held, its
    values kept aside, and held in the error queue (:func:`misfits`); the changes held so are
    added to `refused` (as engine/held.py pending describes a change) when given."""
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
    # a SQLite site gives a change that came without a transaction none of its own (as before
    # session 36, when its snapshots had no txn): it holds such a change alone
    own_txn = d.caps.txn_column
    appended = []
    waiting: list[tuple[Any, ...]] = []
    adapters = [(i, f) for i, f in enumerate(d.value_adapters(info)) if f is not None]
    conv = [(6 + i, f) for i, f in adapters] + [(6 + ncols + i, f) for i, f in adapters]  # n_ and o_ values
    fits = [(i, f) for i, f in enumerate(d.value_checks(info)) if f is not None]
    key_fit = d.key_check(info)
    unfit: list[tuple[tuple[Any, ...], str]] = []  # (row, error): values this site cannot store exactly
    limit = d.entry_limit(conn) if rows else None
    for r in rows:
        _seq2, op2, seq = r[0], r[1], r[2]
        if op2 == "A":
            if r[3] is None or seq in held:
                continue  # the change came from this site, or was purged already, or is held already
            vals: Sequence[Any] = r[3 : 3 + width]
            if not isinstance(vals[0], str) or len(vals[0]) < 21 or vals[2] not in ("I", "U", "D") or vals[5] is None:
                raise CorruptChange(info.name, peer, seq, f"malformed change (ver={vals[0]!r}, op={vals[2]!r}, mask={vals[5]!r})")
            failed: dict[int, Misfit] = {}
            if conv:  # values as this site's driver stores them exactly (dialects/types.py)
                vals, failed = exact_values(vals, conv)
            if limit is not None and (size := entry_size(vals, limit - 4096)):  # room for the statement around it
                raise EntryTooLarge(site.name, info.name, peer, vals[4], size, limit)
            t = r[3 + width] if len(r) > 3 + width else None
            vals = (*vals, (txn if own_txn else None) if t is None else str(t))
            pending = r[4 + width] if len(r) > 4 + width else None
            vals = (*vals, r[5 + width] if len(r) > 5 + width else None)  # sup, the snapshot's last column (cols_of)
            bad = misfits(info, fits, vals, failed, key_fit) if fits or failed or key_fit else None
            if bad is not None:  # a value this site cannot store exactly: held, kept aside whole
                kept, stash, why = bad
                unfit.append(((seq, *kept, pending, stash), misfit_message(site, info, peer, vals[1], why)))
            elif pending is not None:  # needs a column this site does not have yet: waits for it
                waiting.append((seq, *vals, pending))
            else:
                appended.append((seq, *vals))
        else:
            raise CorruptChange(info.name, peer, seq, f"unknown second-order log record type {op2!r}")
    if appended:
        cols = cols_of(d, info)
        d.store_snapshot_rows(conn, o.snapshot(), cols, appended, applied)
    if waiting:
        _hold_for_columns(conn, site, info, peer, cols_of(d, info), waiting)
    if unfit:
        got = _hold_misfits(conn, site, info, peer, cols_of(d, info), unfit)
        if refused is not None:
            refused.extend(got)
    last = rows[-1][0] if rows else 0
    return len(appended) + len(waiting) + len(unfit), last, min((a[0] for a in appended), default=None) if applied else None


#: what a value converter (dialects/types.py) raises for a value it cannot convert exactly
CONVERT_ERRORS = (TypeError, ValueError, ArithmeticError)


def converted(f: Any, v: Any) -> tuple[Any, Misfit | None]:
    """`v` converted by `f` (a Dialect.value_adapters converter), or `v` as it came and why it
    cannot be: a value of no kind the column holds (SQLite keeps '12abc' in an INTEGER column, a
    blob in a TEXT one) no column of the kind at any site holds either (docs/types.md)."""
    try:
        return f(v), None
    except CONVERT_ERRORS as e:
        from multimaster.dialects.types import shown

        why = str(e) if shown(v) in str(e) else f"{shown(v)}: {type(e).__name__} {e}"
        return v, Misfit(f"{why}; no column of this kind holds it", never=True)


def exact_values(vals: Sequence[Any], conv: Sequence[tuple[int, Any]]) -> tuple[list[Any], dict[int, Misfit]]:
    """A change's snapshot values `vals` with those at the positions of `conv` (position,
    converter) converted; and, by position, why those that cannot be were kept as they came."""
    out = list(vals)
    failed: dict[int, Misfit] = {}
    for at, f in conv:
        if out[at] is not None:
            out[at], m = converted(f, out[at])
            if m is not None:
                failed[at] = m
    return out, failed


_ESCAPED = b"\x00\n\r\x1a'\"\\"


def entry_size(vals: Sequence[Any], room: int) -> int:
    """0 when a change's values surely take at most `room` bytes in a statement; else about how
    many they take (PyMySQL inlines each value, escaping these characters with a backslash): its
    texts and bytes exactly, the rest at 32."""
    bound = sum(4 * len(v) if isinstance(v, str) else 2 * len(v) if isinstance(v, (bytes, bytearray)) else 64 for v in vals)
    if bound <= room and not any(isinstance(v, memoryview) for v in vals):
        return 0
    n = 0
    for v in vals:
        if isinstance(v, str):
            b = v.encode("utf-8", "surrogatepass")
        elif isinstance(v, (bytes, bytearray, memoryview)):
            b = bytes(v)
        else:
            n += 32
            continue
        n += len(b) + 10 + sum(b.count(c) for c in _ESCAPED)
    return n if n > room else 0


def any_misfit(site: Site, info: TableInfo, rows: Sequence[tuple[Any, ...]]) -> bool:
    """Whether pulled `rows` (read_entries' layout) hold a value `site` cannot store exactly
    (Dialect.value_checks), or cannot convert to its column's kind at all: the batch is then
    applied in isolating mode, which holds the rest of such a change's source transaction and the
    later changes of its row (engine/isolate.py)."""
    d = site.dialect
    tests = d.value_checks(info)
    adapt = d.value_adapters(info)
    key_fit = d.key_check(info)
    cols = [i for i in range(len(info.columns)) if tests[i] is not None or adapt[i] is not None]
    if not (cols or key_fit) or not rows:
        return False
    n = len(info.columns)
    for r in rows:
        if r[1] != "A" or r[3] is None:
            continue
        if key_fit is not None and r[7] is not None and key_fit(r[7]) is not None:
            return True
        for i in cols:
            for at in (9 + i, 9 + n + i):
                if r[at] is not None and _misfit_of(adapt[i], tests[i], r[at]) is not None:
                    return True
    return False


def _misfit_of(adapt: Any, test: Any, v: Any) -> Misfit | None:
    m = None
    if adapt is not None:
        v, m = converted(adapt, v)
    return m if m is not None or test is None else test(v)


def misfits(
    info: TableInfo,
    fits: Sequence[tuple[int, Any]],
    vals: Sequence[Any],
    failed: Mapping[int, Misfit] | None = None,
    key_fit: Any = None,
) -> tuple[tuple[Any, ...], str, list[tuple[str, Misfit]]] | None:
    """Of a change's snapshot values `vals` (ver, origin, op, rid, key, mask, n..., o..., ...; as
    this site's driver is given them), those its columns cannot store exactly (`fits`: (column
    index, Dialect.value_checks test); `failed`: by position, values that could not be converted
    to their column's kind at all, exact_values): None when all fit; else the values with those
    set to NULL, the values taken out as the snapshot's ``misfit`` text (column -> (new, old),
    exact), and why each one does not fit. A natural key that does not fit (`key_fit`,
    Dialect.key_check) is taken out the same way, under the key column's name, its snapshot
    ``key`` NULL (the snapshot may declare it as the table does)."""
    n = len(info.columns)
    out = list(vals)
    stash: dict[str, tuple[Any, Any]] = {}
    why: list[tuple[str, Misfit]] = []
    failed = failed or {}
    if key_fit is not None and vals[4] is not None and (km := key_fit(vals[4])) is not None:
        stash[info.key.name] = (vals[4], vals[4])
        why.append((info.key.name, km))
        out[4] = None
    tests = dict(fits)
    for i in sorted(set(tests) | {(at - 6) % n for at in failed}):
        f = tests.get(i)
        for at in (6 + i, 6 + n + i):
            m = failed.get(at) or (f(vals[at]) if vals[at] is not None and f is not None else None)
            if m is None:
                continue
            name = info.columns[i].name
            if name not in stash:
                stash[name] = (vals[6 + i], vals[6 + n + i])
                why.append((name, m))
            out[6 + i] = out[6 + n + i] = None
    return None if not stash else (tuple(out), encode_pending(stash), why)


def misfit_message(site: Site, info: TableInfo, peer: str, origin: Any, why: Sequence[tuple[str, Misfit]]) -> str:
    """The error queue's message for a change with values `site` cannot store exactly (`why`:
    column, Misfit): the site, its database, the table, each column with its kind and the value,
    and the fix."""
    from multimaster.dialects.types import kind_of

    d = site.dialect
    kinds = {c.name: kind_of(d.name, c) for c in info.columns}
    kinds[info.key.name] = f"{kind_of(d.name, info.key)}, the key"
    what = "; ".join(f"{info.name}.{c} ({kinds.get(c)}): {m.why}" for c, m in why)
    head = (
        f"value refused: site '{site.name}' ({d.title}) cannot store exactly a value of this change (written at "
        f"'{origin}', pulled from '{peer}'): {what}. Nothing of the change was applied here"
    )
    if any(m.never for _, m in why):
        return (
            f"{head}. Fix: {d.title} has no column that holds it: write a value it can hold at '{origin}' (that update "
            f"follows this change), then drop this one: 'multimaster errors skip -t FILE --site {site.name} --id ID --reason TEXT'; "
            "'multimaster verify' shows the row until then (docs/types.md \"Values a site cannot store\")"
        )
    cols = ", ".join(c for c, _ in why)
    return (
        f"{head}. Fix: widen {info.name}.{cols} at '{site.name}' to hold it ('multimaster ddl', or ALTER TABLE there), then "
        f"'multimaster errors retry -t FILE --site {site.name} --id ID'; or drop it: 'multimaster errors skip -t FILE "
        f'--site {site.name} --id ID --reason TEXT\' (docs/types.md "Values a site cannot store")'
    )


def _hold_misfits(
    conn: Connection, site: Site, info: TableInfo, peer: str, cols: list[str], rows: Sequence[tuple[tuple[Any, ...], str]]
) -> list[dict[str, Any]]:
    """Store changes with values this site cannot store exactly (each: the snapshot row with
    those values NULL, then `pending` and ``misfit``, the values taken out; and the error) as held
    (``applied = 3``) and hold them in the error queue, ``failed``; a change here already (come
    over another route) is stored as seen, or held with its copy held here, as _hold_for_columns
    does. `errors retry` puts the values back once they fit (:func:`refit`); the refresh then
    holds the rest of their source transactions and the later changes of their rows
    (engine/isolate.py hold_waiting)."""
    d = site.dialect
    snap = d.obj(info.name, peer).snapshot()
    held_here, done = _here_already(conn, site, info, [str(r[1]) for r, _ in rows])
    conn.exec_driver_sql(
        d.insert_new_into(snap, ", ".join(cols) + ", applied, pending, misfit", f"VALUES ({d.ph(len(cols) + 3)})", "pseq"),
        [(*r[:-2], 1 if str(r[1]) in done else HELD, r[-2], r[-1]) for r, _ in rows],
    )
    fresh = [(r, e) for r, e in rows if str(r[1]) not in done and str(r[1]) not in held_here]
    hs = [(Held(info.name, peer, r[1], r[2], r[4], r[3], _txn_of(r, info)), e) for r, e in fresh]
    store.errorqueue.hold_new(conn, d, hs, "failed", now_iso())
    return [
        {"tbl": h.table, "peer": h.peer, "ver": h.ver, "origin": h.origin, "rid": h.rid, "op": h.op, "txn": h.txn} for h, _ in hs
    ]


def _txn_of(row: tuple[Any, ...], info: TableInfo) -> str | None:
    """The source transaction of a snapshot row as store_batch builds it (pseq, ver, ..., txn, sup, ...)."""
    t = row[1 + 6 + 2 * len(info.columns) + 2 * len(info.refs)]
    return None if t is None else str(t)


def refit(conn: Connection, site: Site, info: TableInfo, peer: str, vers: Collection[str]) -> dict[str, str]:
    """For `errors retry`: the held changes `vers` of `info` from `peer` with values taken out as
    they were stored (``misfit``) get them back in their snapshot row when this site's columns
    now hold them exactly (widened since); returns those that still do not fit, with the error."""
    d = site.dialect
    snap = d.obj(info.name, peer).snapshot()
    ph = d.caps.placeholder
    fits = dict((i, f) for i, f in enumerate(d.value_checks(info)) if f is not None)
    adapt = d.value_adapters(info)
    by = {c.name: i for i, c in enumerate(info.columns)}
    kname, key_fit = info.key.name, d.key_check(info)  # a key taken out (misfits) goes back to `key`
    still: dict[str, str] = {}
    want = set(vers)
    for ver, origin, text in conn.exec_driver_sql(
        f"SELECT ver, origin, misfit FROM {snap} WHERE misfit IS NOT NULL AND applied = {HELD}"
    ).all():
        if str(ver) not in want:
            continue
        stash = decode_pending(text)
        stash, why = _reconverted(stash, adapt, by)
        unconverted = {c for c, _ in why}
        why += [
            (c, m)
            for c, (new, old) in stash.items()
            if c not in unconverted
            for m in [_first_misfit(key_fit if c == kname else fits.get(by.get(c, -1)), new, old)]
            if m is not None
        ]
        if c_missing := [c for c in stash if c not in by and c != kname]:
            why += [(c, Misfit(f"column {c} is no longer at this site")) for c in c_missing]
        if why:
            still[str(ver)] = misfit_message(site, info, peer, origin, why)
            continue
        sets = [f"{d.quote(p + c)} = {ph}" for c in stash if c != kname for p in ("n_", "o_")]
        params = [v for c in stash if c != kname for v in stash[c]]
        if kname in stash:
            sets.append(f"{d.key_col} = {ph}")
            params.append(stash[kname][0])
        sp = conn.begin_nested()
        try:
            conn.exec_driver_sql(f"UPDATE {snap} SET {', '.join(sets)}, misfit = NULL WHERE ver = {ph}", (*params, ver))
            sp.commit()
        except DBAPIError as e:  # the snapshot's columns do not follow the table's yet (its schema follow failed)
            sp.rollback()
            err = str(getattr(e, "orig", e)).strip().splitlines()[0]
            still[str(ver)] = misfit_message(
                site, info, peer, origin, [(c, Misfit(f"the snapshot here refuses it: {err}")) for c in stash]
            )
    return still


def _reconverted(
    stash: dict[str, tuple[Any, Any]], adapt: Sequence[Any], by: Mapping[str, int]
) -> tuple[dict[str, tuple[Any, Any]], list[tuple[str, Misfit]]]:
    """The values taken out of a held change (``misfit``) converted as store_batch converts them
    (a value held because it could not be converted at all is still held), and why those that
    cannot be are still held."""
    out: dict[str, tuple[Any, Any]] = {}
    why: list[tuple[str, Misfit]] = []
    for c, pair in stash.items():
        f = adapt[by[c]] if c in by else None
        got = [(v, None) if v is None or f is None else converted(f, v) for v in pair]
        out[c] = (got[0][0], got[1][0])
        m = got[0][1] or got[1][1]
        if m is not None:
            why.append((c, m))
    return out, why


def _first_misfit(f: Any, new: Any, old: Any) -> Misfit | None:
    if f is None:
        return None
    return next((m for v in (new, old) if v is not None and (m := f(v)) is not None), None)


def cols_of(d: Any, info: TableInfo) -> list[str]:
    """The snapshot columns store_batch writes, in the order of its rows."""
    return (
        ["pseq", "ver", "origin", "op", "rid", d.key_col, "mask"]
        + [d.quote("n_" + c) for c in info.column_names]
        + [d.quote("o_" + c) for c in info.column_names]
        + references.log_columns(d, info)
        + ["txn"]
        + ["sup"]  # last, as log_select_columns reads it
    )


def _hold_for_columns(
    conn: Connection, site: Site, info: TableInfo, peer: str, cols: list[str], rows: list[tuple[Any, ...]]
) -> None:
    """Store changes that need columns this site does not have yet (their values in `pending`,
    ``applied = 3``) and hold them in the error queue, state ``schema``, naming the columns and
    the fix: they are applied when the site has the columns (engine/evolve.py); later changes of
    their rows wait behind them there."""
    d = site.dialect
    snap = d.obj(info.name, peer).snapshot()
    # a change here already (come over another route too): applied, it is stored as seen; held,
    # this copy is held with it (its values for the column too), not queued a second time
    held_here, done = _here_already(conn, site, info, [str(r[1]) for r in rows])
    conn.exec_driver_sql(
        d.insert_ignore_into(snap, ", ".join(cols) + ", applied, pending", f"VALUES ({d.ph(len(cols) + 2)})"),
        [(*r[:-1], 1, None) if str(r[1]) in done else (*r[:-1], HELD, r[-1]) for r in rows],
    )
    rows = [r for r in rows if str(r[1]) not in done and str(r[1]) not in held_here]
    # none of them is open in the queue (held_here): queued in one statement
    store.errorqueue.hold_new(
        conn,
        d,
        [
            (Held(info.name, peer, r[1], r[2], r[4], r[3]), schema_behind(site.name, info.name, sorted(decode_pending(r[-1]))))
            for r in rows
        ],
        SCHEMA,
        now_iso(),
    )


def _here_already(conn: Connection, site: Site, info: TableInfo, vers: Sequence[str]) -> tuple[set[str], set[str]]:
    """Of the versions `vers` of `info`'s changes, those this site holds (in the error queue, or
    held in a snapshot), and those it applied (in a snapshot, applied) and does not hold: they came
    over another route too (a mesh, a relay). Held again for a column, such a change would be
    applied a second time when released (the error queue's retry applies a held change whatever
    _mm_origins says), or wait behind itself."""
    d = site.dialect
    ph = d.caps.placeholder
    held_here = set(store.errorqueue.open_versions(conn, d, info.name, vers))
    done: set[str] = set()
    for p in sorted(store.watermarks.peers_of(conn, d, info.name)):
        snap = d.obj(info.name, p).snapshot()
        for i in range(0, len(vers), 500):
            part = list(vers[i : i + 500])
            for v, applied in conn.exec_driver_sql(
                f"SELECT ver, applied FROM {snap} WHERE ver IN ({', '.join([ph] * len(part))}) AND applied IN (1, {HELD})",
                tuple(part),
            ):
                (done if int(applied) == 1 else held_here).add(str(v))
    return held_here, done - held_here


def schema_behind(site: str, table: str, missing: Sequence[str]) -> str:
    """The error of a change waiting for columns `missing` of `table` at `site`."""
    cols = ", ".join(f"{table}.{c}" for c in missing)
    return (
        f"schema behind: site '{site}' lacks {cols}, which this change sets; add "
        f"{'it' if len(missing) == 1 else 'them'} at '{site}' (ALTER TABLE {table} ADD COLUMN ..., as declared at the "
        "other sites): the change is applied at the next refresh (docs/schema-changes.md)"
    )
