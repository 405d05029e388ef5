"""Secondary UNIQUE constraints: which row holds a value and which rows are marked (docs/unique.md).

Two sites may insert (or update to) the same value of a UNIQUE column set concurrently. The rule
is a pure function of each row's *intended* values (what last-writer-wins replication makes the
row hold, the same at every site once every site has every change), so every delivery order
ends in the same table:

- among the live rows whose intended values of one UNIQUE set are equal (none of them NULL: a NULL
  collides with nothing, as in SQL), the row whose *claim* is earliest holds them; the claim is
  the version of the change that last set a column of the set on that row (ties: the smaller
  identity);
- every other row of the group is *marked*: one column of the set, the set's *mark column*, gets
  a value that collides with nothing (policy ``suffix``: ``value~origin~token``, token derived
  from the row's identity; policy ``null``: NULL);
- policy ``park`` (a set with no column either policy could mark, e.g. ``sku INTEGER NOT NULL``):
  the losing row is *parked* instead: it leaves the table (its values are kept apart) and comes
  back when the value is free. A parked row keeps its claims: it still holds the values of its
  other park sets (so a row losing to it there stays parked too), and it takes part in no
  ``suffix``/``null`` group (it is not in the table);
- a marked row whose value is released (the holder changes it, or is deleted) holds it again: the
  rule, applied again to the group, picks the earliest remaining claimant.

The engine (``multimaster.engine.uniques``) reads the rows of the groups a batch touches, calls
:func:`resolve` and writes the difference; nothing here touches a database.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

__all__ = ["POLICIES", "UniqueSet", "Claimant", "Resolution", "group_key", "mark_value", "resolve", "set_name", "PARK"]

#: the policies of a UNIQUE set: what a losing row's mark column becomes
POLICIES = ("suffix", "null", "park")

#: the policy whose losing rows leave the table instead of being marked
PARK = "park"

#: a version (or the version part of an identity): 19 digits, ':', the origin site's name
_VERSION_TAIL = re.compile(r"\d{19}:([A-Za-z_][A-Za-z0-9_]*)\Z")


@dataclass(frozen=True)
class UniqueSet:
    """One UNIQUE constraint or unique index of a replicated table (not its primary key)."""

    name: str  #: its columns joined by '+', in TableSpec.columns order: the same at every site
    columns: tuple[int, ...]  #: indexes into TableSpec.columns, ascending
    policy: str  #: 'suffix', 'null' or 'park'
    mark: int  #: index (into TableSpec.columns) of the column a losing row's mark changes (park: the set's first column, unused)
    max_len: int | None = None  #: the mark column's declared length (suffix marks are cut to fit)


def set_name(columns: Iterable[str]) -> str:
    """The name of the UNIQUE set of `columns` (sorted): the same at every site, whatever the
    constraint or index is called there."""
    return "+".join(sorted(columns))


@dataclass(frozen=True)
class Claimant:
    """A live row as the rule sees it."""

    rid: str
    values: Mapping[int, Any]  #: intended value of every column of every set (column index -> value)
    claims: Mapping[str, str]  #: per set name, the version of the change that last set a column of it


@dataclass
class Resolution:
    """What :func:`resolve` decided."""

    #: per marked row, the value of each of its mark columns
    marks: dict[str, dict[int, Any]] = field(default_factory=dict)
    #: per marked row, (set name, the rid holding the value) of every set it loses
    lost: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: per parked row (policy ``park``), (set name, the rid holding the value) of every park set it loses
    parked: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def _norm(v: Any) -> Any:
    """A hashable, comparable form of a value (bytes-likes as bytes)."""
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    return v


def group_key(u: UniqueSet, values: Mapping[int, Any]) -> tuple[Any, ...] | None:
    """The values of set `u` in `values`, or None when one is NULL (NULLs collide with nothing)."""
    out = tuple(_norm(values.get(i)) for i in u.columns)
    return None if any(v is None for v in out) else out


def _origin(rid: str) -> str:
    m = _VERSION_TAIL.search(rid)
    return m.group(1) if m else "k"


def mark_value(u: UniqueSet, value: Any, rid: str) -> Any:
    """The value the mark column of a row losing set `u` gets: NULL (policy ``null``) or
    ``value~origin~token`` (``suffix``: `origin` the site that inserted the row, `token` derived
    from its identity, so two marked rows never collide; the value part is cut so the whole fits
    the column's declared length)."""
    if u.policy == "null":
        return None
    tail = f"~{_origin(rid)}~{hashlib.sha1(rid.encode()).hexdigest()[:8]}"
    text = value if isinstance(value, str) else str(value)
    if u.max_len is not None and len(text) + len(tail) > u.max_len:
        text = text[: max(0, u.max_len - len(tail))]
    return text + tail


def resolve(sets: Iterable[UniqueSet], rows: Iterable[Claimant]) -> Resolution:
    """Apply the rule to `rows`: every live claimant of every group any of them is in (the caller
    gathers them; rows outside those groups are not affected). Returns the parked rows (policy
    ``park``), the marked rows and what their mark columns hold; every other row holds its
    intended values."""
    sets = list(sets)
    rows = sorted(rows, key=lambda r: r.rid)
    res = Resolution()
    # park sets first, among every live row (a parked row keeps its claims: no fixpoint needed)
    for u in (x for x in sets if x.policy == PARK):
        for members in _groups(u, rows):
            winner = min(members, key=lambda r: (r.claims[u.name], r.rid))
            for r in members:
                if r is not winner:
                    res.parked.setdefault(r.rid, []).append((u.name, winner.rid))
    # then the marking sets, among the rows left in the table
    inside = [r for r in rows if r.rid not in res.parked]
    for u in (x for x in sets if x.policy != PARK):
        for members in _groups(u, inside):
            winner = min(members, key=lambda r: (r.claims[u.name], r.rid))
            for r in members:
                if r is winner:
                    continue
                res.lost.setdefault(r.rid, []).append((u.name, winner.rid))
                res.marks.setdefault(r.rid, {})[u.mark] = mark_value(u, r.values.get(u.mark), r.rid)
    return res


def _groups(u: UniqueSet, rows: list[Claimant]) -> list[list[Claimant]]:
    """The groups of `rows` with equal non-NULL values of set `u`, of two rows or more."""
    groups: dict[tuple[Any, ...], list[Claimant]] = {}
    for r in rows:
        g = group_key(u, r.values)
        if g is not None:
            groups.setdefault(g, []).append(r)
    return [m for m in groups.values() if len(m) > 1]
