"""``_mm_errors``: the error queue (docs/errors.md). One row per change this site held instead of
applying: ``failed`` (the database rejected it: the error text, when first and last, how many
attempts), ``waiting`` (a later change of a row whose earlier change is held; ``blocked_by`` names
the row it waits behind), ``txn`` (held with its source transaction: ``blocked_by`` names the
change of that transaction the others are held with, ``txn`` the transaction), ``skipped``
(dropped on purpose by ``multimaster errors skip``, with the reason). The change itself stays in the snapshot it came in, ``applied = 3``; a change-log entry
too malformed to be stored there (``op = '?'``) is described in ``error`` alone.

The table is created by each dialect's site template (``init`` adds it to a site installed before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sqlalchemy.engine import Connection

from multimaster.core.batches import source_txn
from multimaster.core.schemas import decode_pending
from multimaster.core.versions import now_iso
from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = [
    "Held",
    "OPEN",
    "hold",
    "hold_new",
    "blocker",
    "open_versions",
    "any_open",
    "open_rids",
    "rows",
    "get",
    "failed_again",
    "held_with",
    "waits_behind",
    "release",
    "skip",
    "counts",
    "counts_of",
    "HELD",
    "held_total",
    "open_of_origin",
    "lowest_open",
    "open_versions_sql",
    "park",
    "unpark",
    "parked_rids",
    "PARKED",
    "SCHEMA",
    "schema_waits",
    "waiting_tables",
    "ready",
    "changes",
    "ready_failed",
    "forget_table",
]

#: the state of a row a ``park`` UNIQUE set holds out of its table (docs/unique.md): not a change
#: to retry; it comes back by itself when its value is free, or is skipped (a replicated delete)
PARKED = "parked"

#: the state of a change that needs columns this site does not have yet (docs/schema-changes.md):
#: applied when the site has them (engine/evolve.py), not by `errors retry`
SCHEMA = "schema"

#: the states of a change still held (retried by `errors retry`, but for `schema`); `skipped` rows are history
OPEN = ("failed", "waiting", "txn", SCHEMA)

#: the states `status` and `refresh` count as held in the error queue (exit 1; `schema` waits for
#: a column and is reported as "schema behind" instead)
HELD = ("failed", "waiting", "txn", PARKED)


def held_total(counts: Mapping[str, int]) -> int:
    """How many changes of :func:`counts` are held (HELD)."""
    return sum(counts.get(k, 0) for k in HELD)


#: SQL: the open states, as a list of literals
_OPEN_SQL = ", ".join(f"'{s}'" for s in OPEN)

_COLS = (
    "id",
    "tbl",
    "peer",
    "ver",
    "origin",
    "rid",
    "op",
    "state",
    "blocked_by",
    "error",
    "first_at",
    "last_at",
    "attempts",
    "reason",
    "txn",
)


@dataclass(frozen=True)
class Held:
    """One change to hold: where it came from and what it is."""

    table: str
    peer: str
    ver: str
    origin: str
    rid: str
    op: str
    txn: str | None = None  # its source transaction (None where the source records none)

    def __post_init__(self) -> None:
        # a batch's name (core/batches.py batch_txn) is no source transaction: queued as none, so
        # the change is a unit of its own and `errors` names no transaction for it
        object.__setattr__(self, "txn", source_txn(self.txn))


def _t(d: Dialect) -> str:
    return d.mm_table("_mm_errors")


def hold(
    conn: Connection, d: Dialect, h: Held, state: str, at: str, error: str | None = None, blocked_by: int | None = None
) -> int:
    """Queue `h` as `state` ('failed' with the database's `error`, 'waiting' behind the row
    `blocked_by`, or 'txn': held with `blocked_by`, a change of its source transaction). Returns
    its id. A change queued already (the same table and version, still
    open) is updated instead: its error, last time and attempts."""
    p = d.caps.placeholder
    t = _t(d)
    cur = conn.exec_driver_sql(
        f"SELECT id FROM {t} WHERE tbl = {p} AND ver = {p} AND state IN ({_OPEN_SQL})", (h.table, h.ver)
    ).first()
    if cur is not None:
        conn.exec_driver_sql(
            f"UPDATE {t} SET state = {p}, error = {p}, blocked_by = {p}, last_at = {p}, attempts = attempts + 1 WHERE id = {p}",
            (state, _cut(error), blocked_by, at, cur[0]),
        )
        return int(cur[0])
    _insert(conn, d, [(h.table, h.peer, h.ver, h.origin, h.rid, h.op, state, blocked_by, _cut(error), at, at, h.txn)])
    return int(conn.exec_driver_sql(f"SELECT max(id) FROM {t} WHERE tbl = {p} AND ver = {p}", (h.table, h.ver)).scalar_one())


def hold_new(conn: Connection, d: Dialect, held: Sequence[tuple[Held, str | None]], state: str, at: str) -> None:
    """Queue each change of `held` (with its error) as `state`, in one executemany: changes the
    caller knows are not open in the queue (:func:`open_versions`), which :func:`hold` would have
    looked up one by one."""
    if held:
        _insert(conn, d, [(h.table, h.peer, h.ver, h.origin, h.rid, h.op, state, None, _cut(e), at, at, h.txn) for h, e in held])


def _insert(conn: Connection, d: Dialect, rows: Sequence[tuple[Any, ...]]) -> None:
    """New queue rows (tbl, peer, ver, origin, rid, op, state, blocked_by, error, first_at,
    last_at, txn), one attempt each: an executemany when several."""
    conn.exec_driver_sql(
        f"INSERT INTO {_t(d)} (tbl, peer, ver, origin, rid, op, state, blocked_by, error, first_at, last_at, attempts, txn) "
        f"VALUES ({d.ph(11)}, 1, {d.caps.placeholder})",
        rows[0] if len(rows) == 1 else list(rows),
    )


def _cut(msg: str | None) -> str | None:
    return None if msg is None else msg[:2000]


def any_open(conn: Connection, d: Dialect, table: str | None = None) -> bool:
    """Whether `table` (None: any table) has a change held here (failed, waiting or txn)."""
    where, params = ("", ()) if table is None else (f"tbl = {d.caps.placeholder} AND ", (table,))
    return conn.exec_driver_sql(f"SELECT 1 FROM {_t(d)} WHERE {where}state IN ({_OPEN_SQL}) LIMIT 1", params).first() is not None


def open_rids(d: Dialect, table: str) -> str:
    """SQL: (rid, first) of every row of `table` with an open change held: `first` the version of
    its earliest one (a change of the row before it does not wait behind it)."""
    return f"SELECT rid, min(ver) AS first FROM {_t(d)} WHERE tbl = '{table}' AND state IN ({_OPEN_SQL}) GROUP BY rid"


def open_versions(conn: Connection, d: Dialect, table: str, vers: Sequence[str]) -> set[str]:
    """Of the versions `vers` of `table`'s changes, those held here (open)."""
    p = d.caps.placeholder
    out: set[str] = set()
    for i in range(0, len(vers), 500):
        part = vers[i : i + 500]
        out |= {
            str(r[0])
            for r in conn.exec_driver_sql(
                f"SELECT ver FROM {_t(d)} WHERE tbl = {p} AND ver IN ({', '.join([p] * len(part))}) AND state IN ({_OPEN_SQL})",
                (table, *part),
            )
        }
    return out


def blocker(conn: Connection, d: Dialect, table: str, rid: str) -> int | None:
    """The id of the earliest held change of identity `rid` of `table` (later changes of the row
    wait behind it), None when none is held."""
    p = d.caps.placeholder
    r = conn.exec_driver_sql(
        f"SELECT id FROM {_t(d)} WHERE tbl = {p} AND rid = {p} AND state IN ({_OPEN_SQL}) ORDER BY ver LIMIT 1",
        (table, rid),
    ).first()
    return None if r is None else int(r[0])


def rows(
    conn: Connection,
    d: Dialect,
    table: str | None = None,
    states: Sequence[str] = OPEN,
    ids: Sequence[int] = (),
    *,
    limit: int = 0,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """The queue's rows (of `table`, in `states`, or with `ids`), in version order per table; with
    `limit`, at most that many, past the first `offset` (a page of `multimaster errors`)."""
    p = d.caps.placeholder
    where = [f"state IN ({', '.join([p] * len(states))})"]
    params: list[Any] = list(states)
    if table is not None:
        where.append(f"tbl = {p}")
        params.append(table)
    if ids:
        where.append(f"id IN ({', '.join([p] * len(ids))})")
        params += list(ids)
    sql = f"SELECT {', '.join(_COLS)} FROM {_t(d)} WHERE {' AND '.join(where)} ORDER BY tbl, ver, id"
    if limit:
        sql += f" LIMIT {int(limit)} OFFSET {int(offset)}"
    return [dict(zip(_COLS, r)) for r in conn.exec_driver_sql(sql, tuple(params))]


def get(conn: Connection, d: Dialect, id_: int) -> dict[str, Any] | None:
    """The row `id_`, None when there is none."""
    r = conn.exec_driver_sql(f"SELECT {', '.join(_COLS)} FROM {_t(d)} WHERE id = {d.caps.placeholder}", (id_,)).first()
    return None if r is None else dict(zip(_COLS, r))


def failed_again(conn: Connection, d: Dialect, id_: int, error: str, at: str) -> None:
    """A retry of `id_` failed: it is `failed` (again), with this error."""
    p = d.caps.placeholder
    conn.exec_driver_sql(
        f"UPDATE {_t(d)} SET state = 'failed', blocked_by = NULL, error = {p}, last_at = {p}, attempts = attempts + 1 "
        f"WHERE id = {p}",
        (_cut(error), at, id_),
    )


def waits_behind(conn: Connection, d: Dialect, id_: int, blocked_by: int, at: str) -> None:
    """`id_` waits (again) behind `blocked_by`, a held change of its row."""
    p = d.caps.placeholder
    conn.exec_driver_sql(
        f"UPDATE {_t(d)} SET state = 'waiting', blocked_by = {p}, last_at = {p} WHERE id = {p}", (blocked_by, at, id_)
    )


def held_with(conn: Connection, d: Dialect, id_: int, head: int, at: str, attempt: bool) -> None:
    """`id_` is held (again) with `head`, a change of its source transaction (state 'txn');
    `attempt`: its transaction was tried (one more attempt)."""
    p = d.caps.placeholder
    more = ", attempts = attempts + 1" if attempt else ""
    conn.exec_driver_sql(
        f"UPDATE {_t(d)} SET state = 'txn', blocked_by = {p}, last_at = {p}{more} WHERE id = {p}", (head, at, id_)
    )


def release(conn: Connection, d: Dialect, ids: Sequence[int]) -> None:
    """`ids` were applied: they leave the queue, 500 a statement."""
    p = d.caps.placeholder
    for i in range(0, len(ids), 500):
        part = tuple(ids[i : i + 500])
        conn.exec_driver_sql(f"DELETE FROM {_t(d)} WHERE id IN ({', '.join([p] * len(part))})", part)


def skip(conn: Connection, d: Dialect, id_: int, reason: str, at: str) -> None:
    """`id_` is dropped on purpose: state `skipped`, with `reason`, at `at` (kept as history)."""
    p = d.caps.placeholder
    conn.exec_driver_sql(
        f"UPDATE {_t(d)} SET state = 'skipped', reason = {p}, last_at = {p}, blocked_by = NULL WHERE id = {p}",
        (reason, at, id_),
    )


def park(conn: Connection, d: Dialect, table: str, rid: str, claim: str, origin: str, text: str) -> None:
    """Row `rid` of `table` is parked (op ``P``, state ``parked``): one entry per parked row, its
    text (the values it wants and the row holding them) kept up to date, its id stable."""
    p = d.caps.placeholder
    t = _t(d)
    at = now_iso()
    cur = conn.exec_driver_sql(
        f"SELECT id, error FROM {t} WHERE tbl = {p} AND rid = {p} AND state = 'parked'", (table, rid)
    ).first()
    if cur is None:
        hold(conn, d, Held(table, "-", claim, origin, rid, "P"), PARKED, at, text)
    elif cur[1] != text:
        conn.exec_driver_sql(
            f"UPDATE {t} SET error = {p}, ver = {p}, last_at = {p} WHERE id = {p}", (_cut(text), claim, at, cur[0])
        )


def unpark(conn: Connection, d: Dialect, table: str, rid: str) -> None:
    """Row `rid` of `table` is back in its table (or deleted): its ``parked`` entry goes."""
    p = d.caps.placeholder
    conn.exec_driver_sql(f"DELETE FROM {_t(d)} WHERE tbl = {p} AND rid = {p} AND state = 'parked'", (table, rid))


def parked_rids(conn: Connection, d: Dialect, table: str) -> set[str]:
    """The identities of `table` with a ``parked`` entry."""
    p = d.caps.placeholder
    return {r[0] for r in conn.exec_driver_sql(f"SELECT rid FROM {_t(d)} WHERE tbl = {p} AND state = 'parked'", (table,))}


def counts(conn: Connection, d: Dialect) -> dict[str, int]:
    """How many rows per state ('failed', 'waiting', 'txn', 'schema', 'skipped', 'parked')."""
    out = dict.fromkeys(("failed", "waiting", "txn", SCHEMA, "skipped", PARKED), 0)
    for state, n in conn.exec_driver_sql(f"SELECT state, count(*) FROM {_t(d)} GROUP BY state"):
        out[str(state)] = int(n)
    return out


def counts_of(conn: Connection, d: Dialect, table: str | None = None) -> dict[str, int]:
    """:func:`counts`, of `table` only when given."""
    if table is None:
        return counts(conn, d)
    out = dict.fromkeys(("failed", "waiting", "txn", SCHEMA, "skipped", PARKED), 0)
    sql = f"SELECT state, count(*) FROM {_t(d)} WHERE tbl = {d.caps.placeholder} GROUP BY state"
    for state, n in conn.exec_driver_sql(sql, (table,)):
        out[str(state)] = int(n)
    return out


def open_of_origin(conn: Connection, d: Dialect, origin: str) -> dict[str, tuple[str, int]]:
    """Per table, the lowest version and the number of the changes of `origin` still held here
    (the open states: not applied; `multimaster wait` counts them as not visible)."""
    rows = conn.exec_driver_sql(
        f"SELECT tbl, min(ver), count(*) FROM {_t(d)} WHERE origin = {d.caps.placeholder} AND state IN ({_OPEN_SQL}) "
        "GROUP BY tbl",
        (origin,),
    ).all()
    return {str(t): (str(v), int(n)) for t, v, n in rows}


def open_from(conn: Connection, d: Dialect, peer: str) -> dict[str, int]:
    """Per table, how many changes that came over the link from `peer` are still held here (the
    open states); their values are in this site's snapshot of `peer`."""
    rows = conn.exec_driver_sql(
        f"SELECT tbl, count(*) FROM {_t(d)} WHERE peer = {d.caps.placeholder} AND state IN ({_OPEN_SQL}) GROUP BY tbl",
        (peer,),
    ).all()
    return {str(t): int(n) for t, n in rows}


def lowest_open(conn: Connection, d: Dialect, table: str) -> dict[str, str]:
    """Per origin, the lowest version of its changes of `table` still held here (the open states;
    not a malformed entry, which has no version)."""
    rows = conn.exec_driver_sql(
        f"SELECT origin, min(ver) FROM {_t(d)} WHERE tbl = {d.caps.placeholder} AND state IN ({_OPEN_SQL}) AND op <> '?' "
        "GROUP BY origin",
        (table,),
    ).all()
    return {str(o): str(v) for o, v in rows}


def open_versions_sql(d: Dialect, table: str) -> str:
    """SQL: the versions of the changes of `table` held here (the open states). `table` is a
    checked plain identifier."""
    return f"SELECT ver FROM {_t(d)} WHERE tbl = '{table}' AND state IN ({_OPEN_SQL})"


def changes(
    conn: Connection, d: Dialect, table: str, peer: str, vers: Sequence[str], columns: Sequence[str], key: str = ""
) -> dict[str, dict[str, Any]]:
    """The held changes `vers` as the snapshot of `peer` holds them (ver -> its key and the new
    values of the columns it set; `columns`: the replicated columns, bit i of the mask =
    columns[i]); a version the snapshot does not hold (a malformed entry) is absent. 500 a
    statement: `multimaster errors` of 20,000 held changes read them one by one in 8 s. `key`: the
    table's key column, under whose name a key this site cannot store is kept aside."""
    ncols = ", ".join(d.quote("n_" + c) for c in columns)
    p = d.caps.placeholder
    out: dict[str, dict[str, Any]] = {}
    for i in range(0, len(vers), 500):
        part = tuple(dict.fromkeys(vers[i : i + 500]))
        for r in conn.exec_driver_sql(
            f"SELECT ver, {d.key_col}, mask, misfit{', ' + ncols if ncols else ''} FROM {d.obj(table, peer).snapshot()} "
            f"WHERE ver IN ({', '.join([p] * len(part))})",
            part,
        ):
            mask = int(r[2] or 0)
            # values this site cannot store exactly are kept aside (engine/pull.py store_batch)
            aside = {c: nv for c, (nv, _ov) in decode_pending(r[3]).items()} if r[3] is not None else {}
            out[str(r[0])] = {
                "key": aside[key] if r[1] is None and key in aside else r[1],
                "values": {c: aside.get(c, r[4 + k]) for k, c in enumerate(columns) if mask >> k & 1},
            }
    return out


def schema_waits(conn: Connection, d: Dialect, table: str | None = None) -> list[dict[str, Any]]:
    """The changes waiting for columns this site does not have yet (state ``schema``), in version
    order."""
    return rows(conn, d, table, states=(SCHEMA,))


def waiting_tables(conn: Connection, d: Dialect) -> list[str]:
    """The tables with changes waiting for columns (``schema``) or ready to be applied since the
    site has them (``failed`` without an error, :func:`ready`, :func:`ready_failed`)."""
    return [
        str(r[0])
        for r in conn.exec_driver_sql(
            f"SELECT DISTINCT tbl FROM {_t(d)} WHERE state = '{SCHEMA}' OR (state = 'failed' AND error IS NULL AND op <> '?')"
        )
    ]


def ready(conn: Connection, d: Dialect, ids: Sequence[int], at: str) -> None:
    """`ids` waited for columns the site has now: they are held as ``failed`` (no error) until
    they are applied (engine/evolve.py), like any held change. One statement per 500."""
    p = d.caps.placeholder
    for i in range(0, len(ids), 500):
        part = tuple(ids[i : i + 500])
        conn.exec_driver_sql(
            f"UPDATE {_t(d)} SET state = 'failed', error = NULL, last_at = {p} WHERE id IN ({', '.join([p] * len(part))})",
            (at, *part),
        )


def ready_failed(conn: Connection, d: Dialect, table: str, at: str) -> int:
    """Every change of `table` held ``failed`` (the database refused it) is to be tried again (no
    error: engine/evolve.py release): the table's schema changed. Returns how many."""
    p = d.caps.placeholder
    n = (
        conn.exec_driver_sql(
            f"SELECT count(*) FROM {_t(d)} WHERE tbl = {p} AND state = 'failed' AND op <> '?'", (table,)
        ).scalar()
        or 0
    )
    conn.exec_driver_sql(
        f"UPDATE {_t(d)} SET error = NULL, last_at = {p} WHERE tbl = {p} AND state = 'failed' AND op <> '?'", (at, table)
    )
    return int(n)


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` from ``_mm_errors`` (multimaster uninstall --table); the rows deleted."""
    return _rows.forget(conn, d, "_mm_errors", table=table)
