"""A reference model of multimaster's replication rules, written from the documentation
(docs/concepts.md, docs/conflicts.md) and shares no code with `multimaster.planner` or
`multimaster.policies`.

The planner decides change by change, in whatever order the changes arrive. The model gets the
whole *set* of changes and computes the state the table must end in:

- versions are strings ``'%019d:%s' % (hlc, origin)`` and are compared as strings;
- a renumbered row's identity is its insert's version; rows present at ``init`` (the common base)
  are ``'0000000000000000000:#<key>'`` and keep their keys; every other identity's key is
  ``base_max + its rank among all identities ever inserted`` (deleted ones included);
- a natural key's identity is an incarnation: ``'k:<key>'`` for the first life,
  ``'k:<key>@E'`` for a life inserted after the inserting site held dead lives of the key, E
  being the highest of their deletion stamps. A life is dead when it was deleted or a greater life
  of its key exists; its deletion stamp is the lowest of its delete versions and of the E of the
  greater lives;
- a delete wins over every update of its identity, earlier or later;
- each slot (a column, or a group of columns that win together) gets its value from the changes
  that set it (the insert or inserts of the identity, the base row, and the updates that carried
  it): ``latest`` takes the change with the highest version; ``additive`` (a single column) adds
  every insert's value and every update's ``new - old``; the other policies pick among the
  slot's *heads* -- the changes no other change of the slot had seen (the concurrent last
  writes) -- by their own total order: ``earliest`` the lowest version, ``priority`` the origin
  listed first (then the highest version), ``maximum`` / ``minimum`` the larger / smaller values
  (NULL loses; ties by the highest version), ``custom`` the greatest under the resolver's key.

A change carries ``seen``: the versions of every change its author had seen when it made it (its
causal past). Only the heads rule needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Container, Iterable

BASE_VER = "0" * 19 + ":"


def ver(hlc: int, origin: str) -> str:
    return "%019d:%s" % (hlc, origin)


def hlc_of(v: str) -> int:
    return int(v.split(":", 1)[0])


def base_rid(key: Any) -> str:
    return BASE_VER + "#" + str(key)


def first_life(key: str) -> str:
    return "k:" + key


def later_life(key: str, e: str) -> str:
    return "k:" + key + "@" + e


def life_e(key: str, rid: str) -> str | None:
    """E of a later life of `key` (None for its first life)."""
    prefix = "k:" + key + "@"
    return rid[len(prefix) :] if rid.startswith(prefix) else None


@dataclass(frozen=True)
class Event:
    """One captured change."""

    ver: str
    origin: str
    op: str  # "I", "U" or "D"
    rid: str
    key: Any  # natural tables: the key; renumbered: the key at the origin (informational)
    new: dict[str, Any]  # I: every column; U: the columns it carried; D: {}
    old: dict[str, Any]  # U: the columns it carried; D: every column; I: {}
    seen: frozenset[str]  # versions of every change its author had seen (base rows excluded)


@dataclass(frozen=True)
class Slot:
    name: str
    columns: tuple[str, ...]
    # "latest" | "earliest" | "maximum" | "minimum" | "additive" | ("priority", (site, ...)) |
    # ("custom", key): key(values, ver, origin) -> sortable, the greatest wins
    policy: Any


@dataclass(frozen=True)
class Table:
    renumber: bool
    columns: tuple[str, ...]
    slots: tuple[Slot, ...]

    def slot_of(self, column: str) -> Slot:
        return next(s for s in self.slots if column in s.columns)


@dataclass
class Row:
    rid: str
    key: Any
    deleted: str | None  # None: alive
    values: dict[str, Any] | None  # None when dead (or not asked for)
    versions: dict[str, str]  # slot -> version of the value it holds (alive rows only)

    @property
    def alive(self) -> bool:
        return self.deleted is None


@dataclass(frozen=True)
class Write:
    """A change setting one slot: its values, version, origin and causal past."""

    values: tuple[Any, ...]
    ver: str
    origin: str
    seen: frozenset[str]
    base: bool = False


def policy_name(policy: Any) -> str:
    return policy if isinstance(policy, str) else policy[0]


def heads(writes: list[Write]) -> list[Write]:
    """The writes no other write had seen (the base row is seen by every change)."""
    out = []
    for w in writes:
        if w.base and len(writes) > 1:
            continue
        if any(w.ver in o.seen for o in writes if o is not w):
            continue
        out.append(w)
    return out


def pick(policy: Any, cands: list[Write]) -> Write:
    name = policy_name(policy)
    latest = max(cands, key=lambda w: w.ver)
    if name == "latest":
        return latest
    if name == "earliest":
        return min(cands, key=lambda w: w.ver)
    if name == "priority":
        order = list(policy[1])
        rank = {s: i for i, s in enumerate(order)}
        best = min(rank.get(w.origin, len(order)) for w in cands)
        return max((w for w in cands if rank.get(w.origin, len(order)) == best), key=lambda w: w.ver)
    if name in ("maximum", "minimum"):
        full = [w for w in cands if None not in w.values]
        if not full:  # NULL loses; among NULLs, the latest
            return latest
        target = max(w.values for w in full) if name == "maximum" else min(w.values for w in full)
        return max((w for w in full if w.values == target), key=lambda w: w.ver)
    if name == "custom":
        key: Callable[[tuple[Any, ...], str, str], Any] = policy[1]
        return max(cands, key=lambda w: key(w.values, w.ver, w.origin))
    raise ValueError(f"model: unknown policy {policy!r}")


def final_state(
    table: Table, base: dict[Any, dict[str, Any]], events: Iterable[Event], only: Container[str] | None = None
) -> dict[str, Row]:
    """Every identity the changes and the base name, with the state it must end in. `base`: the
    rows present at init, key -> column -> value (a renumbered table's base keys are 1..n).
    `only`: compute the values of these identities only (the others' are None, alive or not)."""
    events = list(events)
    by_rid: dict[str, list[Event]] = {}
    for e in events:
        by_rid.setdefault(e.rid, []).append(e)
    base_of: dict[str, Any] = {}  # rid -> key of a base row
    for k in base:
        base_of[base_rid(k) if table.renumber else first_life(k)] = k
    rids = set(by_rid) | set(base_of)
    key_of: dict[str, Any] = {}
    if table.renumber:
        base_max = max(base, default=0)
        for rid in base_of:
            key_of[rid] = base_of[rid]
        for rank, rid in enumerate(sorted(r for r in rids if r not in base_of), start=1):
            key_of[rid] = base_max + rank
    else:
        for rid in rids:
            key_of[rid] = base_of[rid] if rid in base_of else by_rid[rid][0].key
            assert all(e.key == key_of[rid] for e in by_rid.get(rid, [])), rid
    later_e: dict[str, list[str]] = {}  # natural keys: rid -> E of every greater life of its key
    if not table.renumber:
        lives: dict[Any, list[str]] = {}
        for rid in rids:
            lives.setdefault(key_of[rid], []).append(rid)
        for k, rs in lives.items():
            for rid in rs:
                later = [life_e(k, o) for o in rs if o > rid]
                assert None not in later, (rid, rs)
                later_e[rid] = later  # type: ignore[assignment]
    out: dict[str, Row] = {}
    for rid in sorted(rids):
        evs = by_rid.get(rid, [])
        key = key_of[rid]
        stamps = [e.ver for e in evs if e.op == "D"] + later_e.get(rid, [])
        inserted = rid in base_of or any(e.op == "I" for e in evs)
        assert inserted, f"{rid} was never inserted (its changes' authors had all seen its insert)"
        if stamps or (only is not None and rid not in only):
            out[rid] = Row(rid, key, min(stamps) if stamps else None, None, {})
            continue
        values: dict[str, Any] = {}
        versions: dict[str, str] = {}
        for slot in table.slots:
            writes: list[Write] = []
            if rid in base_of:
                bv = rid if table.renumber else BASE_VER
                writes.append(Write(tuple(base[base_of[rid]][c] for c in slot.columns), bv, bv[20:], frozenset(), True))
            for e in evs:
                if e.op == "I" or (e.op == "U" and any(c in e.new for c in slot.columns)):
                    writes.append(Write(tuple(e.new[c] for c in slot.columns), e.ver, e.origin, e.seen))
            versions[slot.name] = max(w.ver for w in writes)
            if slot.policy == "additive":
                (col,) = slot.columns
                total = 0
                if rid in base_of:
                    total += base[base_of[rid]][col]
                for e in evs:
                    if e.op == "I":
                        total += e.new[col]
                    elif e.op == "U" and col in e.new:
                        total += e.new[col] - e.old[col]
                values[col] = total
                continue
            won = pick(slot.policy, heads(writes))
            values.update(zip(slot.columns, won.values))
            versions[slot.name] = won.ver
        out[rid] = Row(rid, key, None, values, versions)
    return out


def table_rows(table: Table, state: dict[str, Row]) -> dict[Any, tuple[Any, ...]]:
    """The user table: key -> values (in `table.columns` order) of every live identity."""
    rows: dict[Any, tuple[Any, ...]] = {}
    for r in state.values():
        if r.alive:
            assert r.values is not None and r.key not in rows, f"two live identities with key {r.key!r}"
            rows[r.key] = tuple(r.values[c] for c in table.columns)
    return rows


def next_life(state: dict[str, Row], key: str) -> str:
    """The rid a site holding `state` gives a new life of `key` (no life of it is live there)."""
    stamps = [r.deleted for r in state.values() if r.key == key]
    assert None not in stamps, f"{key!r} is live"
    return later_life(key, max(stamps)) if stamps else first_life(key)  # type: ignore[type-var]
