"""``_mm_running``: per link into this site (the peer pulled from), a refresh that is waiting for a
lock here now, as the refresh's lock watch saw it (engine/lockwatch.py): since when the refresh
runs, which process runs it, since when it waits, for whom, and until when the row counts
(`renew_by`: the watch renews it at every report; a process killed meanwhile leaves a row that
expires). `status` names it when the link is behind (core/waits.py behind_message): "a refresh
running since ... waits for a lock held by ...", instead of inferring it.

Written by the watch's own thread in a short transaction of its own, on server sites only (on
SQLite the watch would wait for the very write lock it reports), never by the refresh's batch
transaction (which a wait holds open). Nothing else reads it: a row left behind is harmless."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect

__all__ = ["Running", "install", "record", "clear", "read"]


@dataclass(frozen=True)
class Running:
    """A refresh of the link from `peer` waiting for a lock, as last recorded."""

    peer: str
    started_at: str  # when the refresh began (UTC, the bookkeeping's text)
    runner: str  # host:pid of the process running it
    wait_since: str  # when its current wait began
    waiting_for: str  # the watch's text: the lock and who holds it
    renew_by: str  # the row counts until then (renewed by every report)


def _t(d: Dialect) -> str:
    return d.mm_table("_mm_running")


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {_t(d)} (peer VARCHAR(64) PRIMARY KEY, started_at VARCHAR(32) NOT NULL, "
        "runner VARCHAR(255) NOT NULL, wait_since VARCHAR(32) NOT NULL, waiting_for TEXT NOT NULL, renew_by VARCHAR(32) NOT NULL)"
    )


def record(conn: Connection, d: Dialect, r: Running) -> None:
    """Store `r` as the link's refresh waiting now (replacing what another run left)."""
    sql, params = d.upsert(
        _t(d),
        {
            "peer": r.peer,
            "started_at": r.started_at,
            "runner": r.runner,
            "wait_since": r.wait_since,
            "waiting_for": r.waiting_for,
            "renew_by": r.renew_by,
        },
        ("peer",),
    )
    conn.exec_driver_sql(sql, params)


def clear(conn: Connection, d: Dialect, peer: str, runner: str) -> None:
    """The wait of `runner`'s refresh of the link from `peer` ended (a row another process
    recorded since stays)."""
    p = d.caps.placeholder
    conn.exec_driver_sql(f"DELETE FROM {_t(d)} WHERE peer = {p} AND runner = {p}", (peer, runner))


def read(conn: Connection, d: Dialect, peer: str, now: str) -> Running | None:
    """The link's refresh waiting now, if a row recorded it and has not expired at `now` (a site
    installed before the table has none)."""
    if d.table_kind(conn, "_mm_running") is None:
        return None
    p = d.caps.placeholder
    r = conn.exec_driver_sql(
        f"SELECT peer, started_at, runner, wait_since, waiting_for, renew_by FROM {_t(d)} WHERE peer = {p} AND renew_by >= {p}",
        (peer, now),
    ).first()
    return None if r is None else Running(*(str(v) for v in r))
