"""What multimaster knows of a replicated table at a site, and the names of every object it creates.

A :class:`TableInfo` joins what the topology file says about a table with what the database says
(columns, their declared types, the primary key). It is computed once per site and table and
carries the :class:`~multimaster.core.planner.TableSpec` the pure planner works on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from multimaster.core.planner import TableSpec
from multimaster.core.references import Ref
from multimaster.core.unique import UniqueSet

__all__ = ["Collation", "Column", "TableInfo", "Names", "names", "MAX_COLUMNS"]

MAX_COLUMNS = 62  # bits of the change mask


@dataclass(frozen=True)
class Collation:
    """A text column's character set and collation, where the database declares them per column
    (MariaDB / MySQL; docs/mysql.md "Collations"): what it compares as one value, and the
    collation of the same character set that compares exactly."""

    name: str  #: utf8mb4_general_ci
    charset: str  #: utf8mb4
    #: what the collation takes as one value though the text differs ('' when it compares exactly,
    #: byte for byte): "letters differing in case or accents ('a' and 'A')", "trailing spaces ..."
    merges: str
    #: it takes texts as one value only when they differ in trailing spaces (a binary PAD SPACE
    #: collation: utf8mb4_bin)
    pads_only: bool
    #: the binary collation of `charset`, the one multimaster's own tables use (the fix to name)
    exact: str
    #: why multimaster's statements cannot compare this column with its own tables' columns
    #: ('' when they can): a second binary collation of the same character set
    clash: str = ""
    #: the unique index that names this collation itself, the column's own being exact
    #: (PostgreSQL ``CREATE UNIQUE INDEX i ON t (c COLLATE ci)``), else ''
    index: str = ""
    #: that index's definition without the collation (the fix: the index made again)
    index_sql: str = ""

    @property
    def shown(self) -> str:
        """The collation as messages name it (with the index that names it, where one does)."""
        return f"{self.name} (named by its unique index {self.index})" if self.index else self.name


@dataclass(frozen=True)
class Column:
    name: str
    type: Any  # the SQLAlchemy type reflected from the site
    type_sql: str  # the type as declared at this site's dialect
    nullable: bool
    #: the column has a default (docs/schema-changes.md: a new column needs one, or NULL, while
    #: other sites still insert rows without it)
    has_default: bool = False
    #: the default's value when it is a constant (what an insert from a site that lacks the column
    #: gets here), else None
    default: Any = None
    #: a text column's character set and collation where the database declares them per column
    #: (Dialect.column_collations), else None
    collation: Collation | None = None


@dataclass(frozen=True)
class TableInfo:
    name: str
    key: Column
    columns: tuple[Column, ...]  # replicated columns, key excluded, sorted by name
    excluded: tuple[str, ...]
    spec: TableSpec
    #: its UNIQUE constraints and unique indexes other than the key, sorted by name (docs/unique.md)
    uniques: tuple[UniqueSet, ...] = ()
    #: declared foreign keys to renumbered replicated tables (engine/references.py discovers them)
    refs: tuple[Ref, ...] = ()
    #: declared foreign keys to the key of a natural-key replicated table: nothing to resolve (the
    #: key is the same at every site), but a row whose reference is kept apart (a UNIQUE mark, a
    #: parked row: engine/uniques.py) follows the referenced row's delete by them
    natural_refs: tuple[Ref, ...] = ()
    #: the schema version this site's capture writes (store/schemas.py; 1 before any change)
    version: int = 1
    #: columns an earlier schema version of this site had and it dropped since: values other
    #: sites still send for them are dropped here (core/schemas.py translate)
    dropped: frozenset[str] = frozenset()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True)
class Names:
    """The objects multimaster creates for one replicated table (and, when a peer is named, the
    snapshot of that peer's change log): as created (``names()``), or as written in SQL at a site,
    quoted and qualified (``Dialect.obj()``)."""

    log: str  #: the change log (first-order log)
    log_txn: str  #: the change log's index of source transactions (dialects that record them)
    log2: str  #: the second-order log (a view over the change log)
    shadow: str  #: identities, keys, tombstones and slot versions
    tombstones: str  #: the deleted identities (a view over the shadow)
    cap_i: str  #: capture trigger of inserts
    cap_u: str  #: capture trigger of updates
    cap_d: str  #: capture trigger of deletes
    keyguard: str  #: the trigger refusing updates of a renumbered key
    catch_u: str  #: SQLite's lazy-shadow catch-up trigger of updates
    catch_d: str  #: SQLite's lazy-shadow catch-up trigger of deletes
    keyseq: str  #: the key counter of local inserts into a renumbered table (dialects with concurrent capture)
    ro_i: str  #: at a read-only site, the trigger refusing local inserts (docs/topologies.md "Read-only sites")
    ro_u: str  #: ... local updates
    ro_d: str  #: ... local deletes
    snap: str | None = None  #: the snapshot of the peer's change log
    snap_idx: str | None = None  #: the snapshot's index of rows not applied yet
    snap_ver: str | None = None  #: the snapshot's index of versions (a held change is found by it)

    def mapping(self) -> dict[str, str]:
        """The names by field (those given), for the SQL templates' ``$placeholders``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def snapshot(self) -> str:
        """The snapshot of the peer's change log; only names made with a peer have one."""
        if self.snap is None:
            raise ValueError(f"no snapshot name: the names of {self.log!r} were made without a peer")
        return self.snap

    def map(self, fn: Callable[[str, str], str]) -> "Names":
        """The same objects with each name passed through ``fn(field, name)``."""
        return Names(**{k: fn(k, v) for k, v in self.mapping().items()})


def names(table: str, peer: str | None = None) -> Names:
    """Names of the objects multimaster creates for `table` (and for the snapshot of `peer`)."""
    return Names(
        log=f"_mm_log_{table}",
        log_txn=f"_mm_logt_{table}",
        log2=f"_mm_log2_{table}",
        shadow=f"_mm_shadow_{table}",
        tombstones=f"_mm_tombstones_{table}",
        cap_i=f"_mm_cap_i_{table}",
        cap_u=f"_mm_cap_u_{table}",
        cap_d=f"_mm_cap_d_{table}",
        keyguard=f"_mm_key_{table}",
        catch_u=f"_mm_catch_u_{table}",
        catch_d=f"_mm_catch_d_{table}",
        keyseq=f"_mm_keyseq_{table}",
        ro_i=f"_mm_ro_i_{table}",
        ro_u=f"_mm_ro_u_{table}",
        ro_d=f"_mm_ro_d_{table}",
        snap=None if peer is None else f"_mm_snap_{table}__{peer}",
        snap_idx=None if peer is None else f"_mm_snapi_{table}__{peer}",
        snap_ver=None if peer is None else f"_mm_snapv_{table}__{peer}",
    )
