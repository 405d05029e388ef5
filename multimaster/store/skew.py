"""``_mm_skew``: per link (the peer pulled from) and origin, how far ahead of this site's wall
clock the versions of that origin were when the link's last refresh that pulled changes received
them, when past refresh.clock_warn (docs/clock.md "Clock discipline"). `status` and the metrics
show them; a refresh of the link that pulls changes replaces its rows (none: all is well)."""

from __future__ import annotations

from typing import Any, Mapping

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect

__all__ = ["install", "replace", "read"]


def _t(d: Dialect) -> str:
    return d.mm_table("_mm_skew")


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {_t(d)} (peer VARCHAR(64) NOT NULL, origin VARCHAR(64) NOT NULL, "
        "ahead_ms BIGINT NOT NULL, observed_at VARCHAR(32) NOT NULL, PRIMARY KEY (peer, origin))"
    )


def replace(conn: Connection, d: Dialect, peer: str, ahead: Mapping[str, float], at: str) -> None:
    """The link from `peer` received, at `at`, versions of each origin of `ahead` that many
    seconds ahead of this site's wall clock (past the warning); nothing of other origins."""
    if d.table_kind(conn, "_mm_skew") is None:
        return
    p = d.caps.placeholder
    conn.exec_driver_sql(f"DELETE FROM {_t(d)} WHERE peer = {p}", (peer,))
    if ahead:
        conn.exec_driver_sql(
            f"INSERT INTO {_t(d)} (peer, origin, ahead_ms, observed_at) VALUES ({d.ph(4)})",
            [(peer, o, int(round(s * 1000)), at) for o, s in sorted(ahead.items())],
        )


def read(conn: Connection, d: Dialect) -> list[dict[str, Any]]:
    """Every link's warning rows: peer, origin, ahead_s, observed_at."""
    if d.table_kind(conn, "_mm_skew") is None:
        return []
    return [
        {"peer": r[0], "origin": r[1], "ahead_s": int(r[2]) / 1000.0, "observed_at": r[3]}
        for r in conn.exec_driver_sql(f"SELECT peer, origin, ahead_ms, observed_at FROM {_t(d)} ORDER BY peer, origin")
    ]
