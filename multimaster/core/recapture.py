"""What ``multimaster recapture`` sends: the rows a site holds differently from a peer, as changes
captured at the site (docs/schema-changes.md "A table made again", engine/recapture.py).

A site whose capture of a table was missing for a while (the table was made again) holds writes
no other site has. Compared with a peer, row by row on the key, every difference is either such a
write or explained by a change on its way between the sites (in flight: pulled and not applied,
not pulled yet, held in an error queue). A difference explained by a change on its way is left
alone (run again once it has landed); every other one becomes a change captured at the site, so
that the peer, and every site after it, ends with the site's row:

- the site has the row and the peer has not: an insert;
- the peer has the row and the site has not: a delete;
- both have it and some shared column differs: an update of those columns.

Plain data in, plain data out: rows are mappings from column to a value as either site's driver
gave it, compared as the column's type says (core/values.py: 1.5 read from SQLite and
Decimal('1.50') read from PostgreSQL are the same decimal), keys are comparable with each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Any, Hashable, Mapping, Sequence

from multimaster.core.values import ColumnType, differing

__all__ = ["INSERT", "UPDATE", "DELETE", "Op", "Plan", "plan"]

INSERT, UPDATE, DELETE = "insert", "update", "delete"

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Op:
    """One change to capture at the site for the row of `key`. ``columns``: for an update, the
    shared columns whose values differ (sorted); for an insert or a delete, every shared column."""

    kind: str
    key: Hashable
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    ops: tuple[Op, ...]
    #: keys whose rows differ but a change on its way touches them (left alone, sorted)
    left: tuple[Hashable, ...]

    def count(self, kind: str) -> int:
        return sum(1 for o in self.ops if o.kind == kind)


def _order(keys: AbstractSet[Hashable]) -> list[Hashable]:
    try:
        return sorted(keys)  # type: ignore[type-var]
    except TypeError:  # keys of mixed types: a stable order all the same
        return sorted(keys, key=lambda k: (type(k).__name__, repr(k)))


def plan(
    here: Mapping[Hashable, Row],
    there: Mapping[Hashable, Row],
    columns: Sequence[str],
    in_flight: AbstractSet[Hashable],
    types: Mapping[str, ColumnType] | None = None,
) -> Plan:
    """The changes that make the peer's rows (`there`) the site's (`here`), over the shared
    `columns`, leaving out the keys of `in_flight` (a change on its way touches them). `types`:
    each column's type, what its values are compared as (core/values.py; none: `ColumnType()`)."""
    cols = tuple(sorted(columns))
    ops: list[Op] = []
    left: list[Hashable] = []
    for k in _order(set(here) | set(there)):
        h, t = here.get(k), there.get(k)
        if h is None and t is None:
            continue
        if h is not None and t is not None:
            diff = differing(h, t, cols, types)
            if not diff:
                continue
            op = Op(UPDATE, k, diff)
        else:
            op = Op(INSERT if t is None else DELETE, k, cols)
        if k in in_flight:
            left.append(k)
        else:
            ops.append(op)
    return Plan(tuple(ops), tuple(left))
