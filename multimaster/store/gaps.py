"""``_mm_gaps``: the times a replicated table's capture was found missing at this site
(docs/schema-changes.md "A table made again"). A migration tool that copies a table into a new one
(SQLite's way of changing most things about a table, used by alembic's batch mode and Django),
DROP and CREATE, or a dropped trigger leaves the table without capture triggers: the writes made
until the site's capture is made again are not captured, and no peer gets them. Following its
schema (engine/evolve.py) makes the capture again and opens a gap here; the gap stays open, and
``status`` and ``refresh`` exit 1 naming it, until ``multimaster recapture`` has sent the rows the
site holds differently from a peer (engine/recapture.py), which closes it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from multimaster.dialects.base import Dialect
from multimaster.store import _rows

__all__ = ["install", "open_gap", "read_open", "close", "forget_table"]


def _t(d: Dialect) -> str:
    return d.mm_table("_mm_gaps")


def install(conn: Connection, d: Dialect) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {_t(d)} (tbl VARCHAR(64) NOT NULL, found VARCHAR(32) NOT NULL, "
        "missing VARCHAR(255) NOT NULL, unseen INTEGER NOT NULL, refused TEXT, closed VARCHAR(32), note TEXT, "
        "PRIMARY KEY (tbl, found))"
    )


def open_gap(
    conn: Connection, d: Dialect, table: str, found: str, missing: list[str], unseen: int = 0, refused: str | None = None
) -> None:
    """`table`'s capture triggers `missing` were found missing at `found` (the table is created on
    a site installed before it existed); `unseen` rows inserted meanwhile were captured then
    (renumbered tables), or `refused` says why they were not. An open gap of the table stays open
    with its first time, adding what was captured since."""
    install(conn, d)
    p = d.caps.placeholder
    if conn.exec_driver_sql(f"SELECT 1 FROM {_t(d)} WHERE tbl = {p} AND closed IS NULL", (table,)).first() is None:
        conn.exec_driver_sql(
            f"INSERT INTO {_t(d)} (tbl, found, missing, unseen, refused) VALUES ({d.ph(5)})",
            (table, found, ",".join(missing), int(unseen), refused),
        )
    else:
        conn.exec_driver_sql(
            f"UPDATE {_t(d)} SET unseen = unseen + {p}, refused = {p} WHERE tbl = {p} AND closed IS NULL",
            (int(unseen), refused, table),
        )


def read_open(conn: Connection, d: Dialect) -> list[dict[str, Any]]:
    """The open gaps, oldest first: ``tbl``, ``found``, ``missing``, ``unseen``, ``refused`` (none on
    a site installed before the table existed)."""
    if d.table_kind(conn, "_mm_gaps") is None:
        return []
    rows = conn.exec_driver_sql(
        f"SELECT tbl, found, missing, unseen, refused FROM {_t(d)} WHERE closed IS NULL ORDER BY found, tbl"
    )
    return [
        {"tbl": str(r[0]), "found": str(r[1]), "missing": str(r[2]).split(","), "unseen": int(r[3]), "refused": r[4]}
        for r in rows
    ]


def close(conn: Connection, d: Dialect, table: str, at: str, note: str) -> int:
    """Close `table`'s open gap (recaptured at `at`; `note` says what was sent); how many closed."""
    if d.table_kind(conn, "_mm_gaps") is None:
        return 0
    p = d.caps.placeholder
    return int(
        conn.exec_driver_sql(
            f"UPDATE {_t(d)} SET closed = {p}, note = {p} WHERE tbl = {p} AND closed IS NULL", (at, note, table)
        ).rowcount
    )


def forget_table(conn: Connection, d: Dialect, table: str) -> dict[str, int]:
    """Delete every row of `table` (multimaster uninstall --table)."""
    return _rows.forget(conn, d, "_mm_gaps", table=table)
