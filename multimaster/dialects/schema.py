"""What multimaster knows of a replicated table at a site, and the names of every object it creates.

A :class:`TableInfo` joins what the topology file says about a table with what the database says
(columns, their declared types, the primary key). It is computed once per site and table and
carries the :class:`~multimaster.core.planner.TableSpec` the pure planner works on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multimaster.core.planner import TableSpec

__all__ = ["Column", "TableInfo", "names", "MAX_COLUMNS"]

MAX_COLUMNS = 62  # bits of the change mask


@dataclass(frozen=True)
class Column:
    name: str
    type: Any  # the SQLAlchemy type reflected from the site
    type_sql: str  # the type as declared at this site's dialect
    nullable: bool


@dataclass(frozen=True)
class TableInfo:
    name: str
    key: Column
    columns: tuple[Column, ...]  # replicated columns, key excluded, sorted by name
    excluded: tuple[str, ...]
    spec: TableSpec

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def names(table: str, peer: str | None = None) -> dict[str, str]:
    """Names of the objects multimaster creates for `table` (and for the snapshot of `peer`)."""
    n = {
        "log": f"_mm_log_{table}",
        "log2": f"_mm_log2_{table}",
        "shadow": f"_mm_shadow_{table}",
        "tombstones": f"_mm_tombstones_{table}",
        "cap_i": f"_mm_cap_i_{table}",
        "cap_u": f"_mm_cap_u_{table}",
        "cap_d": f"_mm_cap_d_{table}",
        "keyguard": f"_mm_key_{table}",
        "catch_u": f"_mm_catch_u_{table}",
        "catch_d": f"_mm_catch_d_{table}",
    }
    if peer is not None:
        n["snap"] = f"_mm_snap_{table}__{peer}"
        n["snap_idx"] = f"_mm_snapi_{table}__{peer}"
    return n
