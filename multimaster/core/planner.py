"""The reconciler's decisions, as pure functions of plain data.

Given a table's spec, the new remote changes (deduplicated, in version order) and the state this
site holds for the identities they touch, :func:`plan` decides what happens to every row: which
identities are new, which rows are deleted (a delete wins over every update of its row), which column
values change and which conflicts were resolved how. :func:`assign_keys` turns new identities into
auto-counter keys (their rank in global insertion order) and the key shifts of existing rows.

A natural key (``renumber: false``) is not one identity but a series of *incarnations*: the first
life of key k is ``'k:' || k``, a life inserted after this site held deleted incarnations of k is
``'k:' || k || '@' || E`` with E the highest delete version it held (docs/conflicts.md). Each
incarnation is an identity like a renumbered row's: once deleted it stays dead. Among the
incarnations of one key the greatest rid supersedes every smaller one, so the table holds at most
the greatest live incarnation of each key. For such tables `states` must hold every incarnation of
the keys the changes touch.

Nothing here touches a database; ``multimaster.engine.reconcile`` reads the inputs and ``multimaster.engine.apply``
executes the plan with set-based SQL through the site's dialect. The same plan runs on every dialect.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable, Sequence

from multimaster.core.policies import Candidate, Conflict, Policy
from multimaster.core.schemas import decode_value, encode_value
from multimaster.core.versions import BASE_VER

__all__ = [
    "Slot",
    "TableSpec",
    "Change",
    "RowState",
    "ConflictRecord",
    "Plan",
    "plan",
    "same_json",
    "assign_keys",
    "KeyAssignment",
    "incarnation_of",
    "parse_sup",
    "heads_text",
    "heads_of",
]

#: the suffix of a natural key's later incarnation: '@' and a version (site names are identifiers)
_INCARNATION = re.compile(r"@(\d{19}:[A-Za-z_][A-Za-z0-9_]*)\Z")


def incarnation_of(rid: str) -> str | None:
    """E of a natural key's later incarnation ``'k:<key>@E'`` (the delete version it was inserted
    after), None for a first life ``'k:<key>'``."""
    m = _INCARNATION.search(rid)
    return m.group(1) if m else None


def _key_id(key: Any) -> Any:
    """A hashable form of a key value, to group the incarnations of one key."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        return ("b", bytes(key))
    return key


@dataclass(frozen=True)
class Slot:
    """A unit of conflict resolution: one column, or a group of columns that win together."""

    name: str
    columns: tuple[int, ...]  # indexes into TableSpec.columns
    policy: Policy


@dataclass(frozen=True)
class TableSpec:
    name: str
    key: str
    renumber: bool
    columns: tuple[str, ...]  # replicated columns (key excluded), sorted: bit i of a mask = columns[i]
    slots: tuple[Slot, ...]
    #: the columns (indexes into `columns`) that hold JSON: their values are compared as JSON
    #: values, however each site spells them (same_json; docs/types.md)
    json: frozenset[int] = frozenset()

    @property
    def slot_of(self) -> dict[int, int]:
        return {c: i for i, s in enumerate(self.slots) for c in s.columns}

    @property
    def all_mask(self) -> int:
        return (1 << len(self.columns)) - 1


@dataclass(frozen=True)
class Change:
    """One change from a change log. `new`/`old` are indexed like TableSpec.columns; only the
    columns whose bit is set in `mask` are meaningful."""

    ver: str
    origin: str
    op: str  # 'I', 'U' or 'D'
    rid: str
    key: Any
    mask: int
    new: tuple[Any, ...]
    old: tuple[Any, ...]
    #: the versions the change superseded in the slots it set whose policy chooses among heads
    #: (capture writes the writer's heads of those slots: docs/conflicts.md "Concurrent heads");
    #: "=" stands for the row's default version (a renumbered row's insert, a natural key's base).
    #: None: not recorded (an entry captured before heads were kept): its old values decide.
    sup: frozenset[str] | None = None


@dataclass
class RowState:
    """What this site knows of one identity. `values` is None when the row is not in the table."""

    rid: str
    key: Any
    deleted: str | None
    versions: dict[str, str | None]
    values: list[Any] | None
    existed: bool = True
    #: per slot whose policy chooses among heads, its concurrent heads other than the one the row
    #: holds: version -> the slot's values (in the slot's column order)
    heads: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)
    # filled in by plan()
    alive_before: bool = field(default=False)
    changed: set[int] = field(default_factory=set)
    changed_slots: set[str] = field(default_factory=set)
    deleted_changed: bool = False
    heads_changed: set[str] = field(default_factory=set)  # slots whose other heads changed

    def __post_init__(self) -> None:
        self.alive_before = self.existed and self.values is not None


@dataclass(frozen=True)
class ConflictRecord:
    table: str
    rid: str
    kind: str  # update_update | insert_insert | update_delete | delete_update | insert_replaces
    slot: str | None
    columns: tuple[str, ...]
    local_ver: str | None
    local_values: dict[str, Any] | None
    remote_ver: str
    remote_values: dict[str, Any] | None
    policy: str
    decision: str  # local | remote | merged | delete
    #: the row at this site before the change (every replicated column; None: it was not there)
    local_row: dict[str, Any] | None = None
    #: what the incoming change carried (every column of an insert, the changed ones of an update)
    remote_row: dict[str, Any] | None = None
    #: a slot under a policy that chooses among concurrent heads: every head the policy chose
    #: among, version -> the slot's values (the record names two of them; re-resolve needs all)
    heads: dict[str, dict[str, Any]] | None = None


@dataclass
class Plan:
    rows: dict[str, RowState]
    processed: list[Change]
    parked: list[Change]
    conflicts: list[ConflictRecord]

    @property
    def new_rids(self) -> list[str]:
        return sorted(r for r, s in self.rows.items() if not s.existed)


#: a token of `sup` / `h_<slot>`: a version, or "=" (the row's default version)
_HEAD = re.compile(r"=|\d{19}:[A-Za-z_0-9]*(#.*)?\Z")


def parse_sup(text: Any) -> frozenset[str] | None:
    """A change-log entry's ``sup`` (space-separated versions, "=" for the row's default version)
    as the Change field; None stays None. Raises ValueError naming a token that is not a version."""
    if text is None:
        return None
    toks = str(text).split()
    for t in toks:
        if not _HEAD.match(t):
            raise ValueError(f"sup holds {t!r}, which is not a version")
    return frozenset(toks)


def heads_text(heads: dict[str, tuple[Any, ...]] | None) -> tuple[str | None, str | None]:
    """A slot's other heads as the shadow keeps them: (``h_<slot>``, the versions space-separated
    in order; ``x_<slot>``, JSON of version -> the values), (None, None) when there are none."""
    if not heads:
        return None, None
    vers = sorted(heads)
    return " ".join(vers), json.dumps({v: [encode_value(x) for x in heads[v]] for v in vers}, separators=(",", ":"))


def heads_of(h: Any, x: Any) -> dict[str, tuple[Any, ...]]:
    """The shadow's ``h_<slot>`` and ``x_<slot>`` as heads_text made them: version -> values. The
    versions of ``h_`` are the heads (capture clears both columns when a local write supersedes
    them); a version whose values ``x_`` lacks is not kept."""
    if not h or not x:
        return {}
    vals = json.loads(x)
    return {v: tuple(decode_value(e) for e in vals[v]) for v in str(h).split() if v in vals}


def _same(a: Any, b: Any, json_value: bool = False) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if json_value:
        return same_json(a, b)
    if isinstance(a, (bytes, bytearray, memoryview)) or isinstance(b, (bytes, bytearray, memoryview)):
        return bytes(a) == bytes(b)
    return bool(a == b)


def _json_key(v: Any) -> Any:
    """A decoded JSON value as a key that is equal for equal JSON values only: numbers by value
    (1.50 is 1.5, 1 is 1.0), objects whatever their keys' order, true apart from 1."""
    if v is None or isinstance(v, (bool, str)):
        return (type(v).__name__, v)
    if isinstance(v, float):
        v = Decimal(repr(v))
    if isinstance(v, (int, Decimal)):
        d = Decimal(v)
        return ("num", d.normalize()) if d.is_finite() else ("const", str(d))
    if isinstance(v, list):
        return ("list", tuple(_json_key(x) for x in v))
    if isinstance(v, dict):
        return ("obj", tuple(sorted((str(k), _json_key(x)) for k, x in v.items())))
    return ("const", repr(v))


def same_json(a: Any, b: Any) -> bool:
    """Whether two values of a JSON column are the same JSON value, however spelled (key order,
    spaces, escapes, 1.50 or 1.5). A value is its JSON text as a site reads it, or a number (SQLite
    keeps one as INTEGER or REAL in a column declared JSON). A text that is not JSON is equal only
    to the same text."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) and isinstance(b, str) and a == b:
        return True
    try:
        return bool(_json_key(_json_decoded(a)) == _json_key(_json_decoded(b)))
    except ValueError:
        return False


def _json_decoded(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        v = bytes(v).decode("utf-8", "replace")
    if isinstance(v, str):
        return json.loads(v, parse_float=Decimal, parse_constant=lambda c: ("const", c))
    return v


def _bits(mask: int) -> list[int]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


def _default_ver(spec: TableSpec, st: RowState) -> str:
    return st.rid if spec.renumber else BASE_VER


def plan(spec: TableSpec, changes: Iterable[Change], states: dict[str, RowState], held: Iterable[str] = ()) -> Plan:
    """Decide the effect of `changes` (in version order, none already applied here) on `states`.

    `states` must hold a RowState for every rid of `changes` that this site already knows (for a
    natural-key table: for every incarnation of their keys); it is updated in place and returned in
    the plan together with the new identities.

    An update of an identity this site has not seen inserted waits (`parked`) and so do the later
    changes of its origin: an origin's changes are applied in version order, which is what lets a
    site recognise a duplicate by the highest version applied per origin. `held`: origins with a
    change parked already (by the plan of an earlier piece of the same changes): theirs wait too.
    """
    rows = states
    processed: list[Change] = []
    parked: list[Change] = []
    conflicts: list[ConflictRecord] = []
    slot_of = spec.slot_of
    natural = not spec.renumber
    # natural keys: every incarnation known here, per key
    lives: dict[Any, list[RowState]] = {}
    if natural:
        for st0 in rows.values():
            lives.setdefault(_key_id(st0.key), []).append(st0)
    waiting: set[str] = set(held)  # origins with a change waiting: their later changes wait too (in order)
    for ch in changes:
        if ch.origin in waiting:
            parked.append(ch)
            continue
        st = rows.get(ch.rid)
        if ch.op == "I":
            _plan_insert(spec, ch, st, rows, lives, conflicts, slot_of)
        elif ch.op == "U":
            if st is None:
                parked.append(ch)
                waiting.add(ch.origin)
                continue
            _plan_update(spec, ch, st, conflicts, slot_of)
        elif ch.op == "D":
            _plan_delete(spec, ch, st, rows, lives, conflicts)
        else:
            raise ValueError(f"unknown change type {ch.op!r} in change {ch.ver}")
        processed.append(ch)
    return Plan(rows, processed, parked, conflicts)


def _plan_insert(
    spec: TableSpec,
    ch: Change,
    st: RowState | None,
    rows: dict[str, RowState],
    lives: dict[Any, list[RowState]],
    conflicts: list[ConflictRecord],
    slot_of: dict[int, int],
) -> None:
    """An insert: a new identity (a natural key: a new incarnation) unless this site knows it; a
    known deleted one stays dead; a natural key's live incarnation inserted at two sites merges."""
    if st is None:
        if not spec.renumber:
            _new_incarnation(spec, ch, rows, lives, conflicts)
        else:
            rows[ch.rid] = RowState(ch.rid, ch.key, None, {}, list(ch.new), existed=False)
            rows[ch.rid].changed = set(range(len(spec.columns)))
    elif st.values is None:
        pass  # a deleted identity (or incarnation) stays dead: the insert changes nothing
    elif not spec.renumber:
        # the same incarnation inserted at two sites (both had seen the same history)
        _merge(spec, st, ch, spec.all_mask, conflicts, "insert_insert", slot_of)


def _plan_update(spec: TableSpec, ch: Change, st: RowState, conflicts: list[ConflictRecord], slot_of: dict[int, int]) -> None:
    """An update of a known identity: discarded if it is deleted (a delete wins), else merged
    slot by slot."""
    cols = spec.columns
    if st.values is None:
        conflicts.append(
            ConflictRecord(
                spec.name,
                ch.rid,
                "update_delete",
                None,
                tuple(cols[i] for i in _bits(ch.mask)),
                st.deleted,
                None,
                ch.ver,
                {cols[i]: ch.new[i] for i in _bits(ch.mask)},
                "delete-wins",
                "delete",
                None,
                _carried(spec, ch),
            )
        )
    else:
        _merge(spec, st, ch, ch.mask, conflicts, "update_update", slot_of)


def _plan_delete(
    spec: TableSpec,
    ch: Change,
    st: RowState | None,
    rows: dict[str, RowState],
    lives: dict[Any, list[RowState]],
    conflicts: list[ConflictRecord],
) -> None:
    """A delete: of an unknown identity, a tombstone (a natural key: a dead incarnation); of a
    deleted one, the lowest delete version is kept; of a live row, it goes, whatever was updated
    concurrently (a `delete_update` conflict)."""
    cols = spec.columns
    if st is None:
        if not spec.renumber:
            _new_incarnation(spec, ch, rows, lives, conflicts)
        else:
            rows[ch.rid] = RowState(ch.rid, ch.key, ch.ver, {}, None, existed=False)
    elif st.values is None:
        if st.deleted is None or ch.ver < st.deleted:
            st.deleted = ch.ver
            st.deleted_changed = True
    else:
        diff = [i for i in _bits(ch.mask) if not _same(ch.old[i], st.values[i], i in spec.json)]
        if diff:
            conflicts.append(
                ConflictRecord(
                    spec.name,
                    ch.rid,
                    "delete_update",
                    None,
                    tuple(cols[i] for i in diff),
                    None,
                    {cols[i]: st.values[i] for i in diff},
                    ch.ver,
                    None,
                    "delete-wins",
                    "delete",
                    dict(zip(cols, st.values)),
                    None,
                )
            )
        st.values = None
        st.deleted = ch.ver
        st.deleted_changed = True


def _new_incarnation(
    spec: TableSpec, ch: Change, rows: dict[str, RowState], lives: dict[Any, list[RowState]], conflicts: list[ConflictRecord]
) -> None:
    """A change (insert or delete) of a natural key's incarnation this site has not seen.

    The greatest incarnation of a key supersedes every smaller one. If a greater one is known
    (alive or dead), this one is dead on arrival; else it is the key's live row (an insert) or a
    tombstone (a delete of a life inserted elsewhere). Every smaller incarnation is dead.

    A dead incarnation's `deleted` is the lowest of its delete versions and of the E of the
    greater incarnations known (E: the version a later life was inserted after): the same value at
    every site that knows the same changes, whatever their order, so sites that saw the same
    history name the key's next life alike."""
    cols = spec.columns
    sibs = lives.setdefault(_key_id(ch.key), [])
    greater = [s for s in sibs if s.rid > ch.rid]
    all_cols = {c: v for c, v in zip(cols, ch.new)} if ch.op == "I" else None
    if greater:
        first = min(greater, key=lambda s: s.rid)
        stamp = incarnation_of(first.rid) or first.deleted or ch.ver
        if ch.op == "D":
            stamp = min(stamp, ch.ver)
        st = RowState(ch.rid, ch.key, stamp, {}, None, existed=False)
        if ch.op == "I":
            top = max(greater, key=lambda s: s.rid)
            conflicts.append(
                ConflictRecord(
                    spec.name,
                    ch.rid,
                    "insert_replaces",
                    None,
                    cols,
                    _last_ver(top) if top.values is not None else top.deleted,
                    None if top.values is None else dict(zip(cols, top.values)),
                    ch.ver,
                    all_cols,
                    "latest-incarnation",
                    "local",
                    None if top.values is None else dict(zip(cols, top.values)),
                    all_cols,
                )
            )
    elif ch.op == "I":
        st = RowState(ch.rid, ch.key, None, {s.name: ch.ver for s in spec.slots}, list(ch.new), existed=False)
        st.changed = set(range(len(cols)))
    else:
        st = RowState(ch.rid, ch.key, ch.ver, {}, None, existed=False)
    # every smaller incarnation ended where this one began (a live one only if this is the greatest)
    stamp = incarnation_of(ch.rid) or ch.ver
    for s in sibs:
        if s.rid < ch.rid:
            if s.values is not None:
                conflicts.append(
                    ConflictRecord(
                        spec.name,
                        s.rid,
                        "insert_replaces",
                        None,
                        cols,
                        _last_ver(s),
                        dict(zip(cols, s.values)),
                        ch.ver,
                        all_cols,
                        "latest-incarnation",
                        "remote",
                        dict(zip(cols, s.values)),
                        all_cols,
                    )
                )
                s.values = None
                s.deleted = stamp
                s.deleted_changed = True
            elif s.deleted is None or stamp < s.deleted:
                s.deleted = stamp
                s.deleted_changed = True
    rows[ch.rid] = st
    sibs.append(st)


def _last_ver(st: RowState) -> str | None:
    vs = [v for v in st.versions.values() if v]
    return max(vs) if vs else None


def _merge(
    spec: TableSpec, st: RowState, ch: Change, mask: int, conflicts: list[ConflictRecord], kind: str, slot_of: dict[int, int]
) -> None:
    """Merge the columns of `mask` of change `ch` into the live row `st`, slot by slot: a slot's
    change clashes when the row's value is not the change's "before" value (an `insert_insert`
    always clashes); additive slots add deltas, the others keep the version their policy picks."""
    assert st.values is not None
    images = (dict(zip(spec.columns, st.values)), _carried(spec, ch, mask))
    by_slot: dict[int, list[int]] = {}
    for i in _bits(mask):
        by_slot.setdefault(slot_of[i], []).append(i)
    for si, idx in by_slot.items():
        slot = spec.slots[si]
        local_ver = st.versions.get(slot.name) or _default_ver(spec, st)
        if kind == "insert_insert":
            clash = True
        else:
            clash = not all(_same(ch.old[i], st.values[i], i in spec.json) for i in idx)
        if slot.policy.is_additive:
            _merge_additive(spec, st, ch, slot, idx[0], local_ver, clash, kind, conflicts, images)
        elif slot.policy.chooses and (kind == "insert_insert" or ch.sup is not None):
            _merge_heads(spec, st, ch, slot, idx, local_ver, kind, conflicts, images)
        else:
            _merge_by_policy(spec, st, ch, slot, idx, local_ver, clash, kind, conflicts, images)


def _carried(spec: TableSpec, ch: Change, mask: int | None = None) -> dict[str, Any]:
    """The columns change `ch` carried (those of `mask`, default its own) with their new values."""
    return {spec.columns[i]: ch.new[i] for i in _bits(ch.mask if mask is None else mask)}


def _merge_additive(
    spec: TableSpec,
    st: RowState,
    ch: Change,
    slot: Slot,
    i: int,
    local_ver: str,
    clash: bool,
    kind: str,
    conflicts: list[ConflictRecord],
    images: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """An additive column `i`: the row keeps its value plus the change's delta (both inserts'
    values for an `insert_insert`); a clash is recorded as `merged`."""
    assert st.values is not None
    cols = spec.columns
    pol = slot.policy
    old_v, new_v, cur_v = ch.old[i], ch.new[i], st.values[i]
    if kind == "insert_insert":
        merged = new_v if cur_v is None else cur_v if new_v is None else cur_v + new_v
    elif _same(old_v, cur_v, i in spec.json):
        merged = new_v  # nothing concurrent: exactly the new value (no float drift)
    elif cur_v is None or old_v is None or new_v is None:
        merged = new_v if ch.ver > local_ver else cur_v
    else:
        merged = cur_v + (new_v - old_v)
    if clash:
        conflicts.append(
            ConflictRecord(
                spec.name,
                st.rid,
                kind,
                slot.name,
                (cols[i],),
                local_ver,
                {cols[i]: cur_v},
                ch.ver,
                {cols[i]: new_v},
                pol.name,
                "merged",
                *images,
            )
        )
    if not _same(merged, cur_v, i in spec.json):
        st.values[i] = merged
        st.changed.add(i)
    if ch.ver > local_ver:
        st.versions[slot.name] = ch.ver
        st.changed_slots.add(slot.name)


def _merge_by_policy(
    spec: TableSpec,
    st: RowState,
    ch: Change,
    slot: Slot,
    idx: list[int],
    local_ver: str,
    clash: bool,
    kind: str,
    conflicts: list[ConflictRecord],
    images: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """A slot of columns `idx` under a choosing policy: a newer change without a clash wins
    outright; otherwise the policy picks between the row's values and the change's, and a clash
    (or a remote change that lost) is recorded."""
    assert st.values is not None
    cols = spec.columns
    pol = slot.policy
    cur = [st.values[i] for i in idx]
    new = [ch.new[i] for i in idx]
    if not clash and ch.ver > local_ver:
        winner_remote = True
    else:
        names = tuple(cols[i] for i in idx)
        local_c = Candidate(dict(zip(names, cur)), local_ver, local_ver[20:])
        remote_c = Candidate(dict(zip(names, new)), ch.ver, ch.origin)
        won = pol.resolve(Conflict(spec.name, st.key, st.rid, names, local_c, remote_c))
        winner_remote = won is remote_c
        if clash or not winner_remote:
            conflicts.append(_slot_conflict(spec, st, kind, slot, local_c, remote_c, winner_remote, images))
    if winner_remote:
        _take(st, slot, idx, new, ch.ver)


def _merge_heads(
    spec: TableSpec,
    st: RowState,
    ch: Change,
    slot: Slot,
    idx: list[int],
    local_ver: str,
    kind: str,
    conflicts: list[ConflictRecord],
    images: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """A slot under a policy that chooses among concurrent heads (earliest, maximum, minimum,
    priority, custom): the slot's heads are the writes of it no other write had seen. The change
    supersedes the heads its writer held (`ch.sup`; none for an insert of an incarnation another
    site inserted too) and becomes a head itself; the row holds the policy's pick of the heads and
    the shadow keeps the others. With causal delivery every site holding the same changes holds
    the same heads, so the pick is the same whatever order they arrived in (docs/conflicts.md
    "Concurrent heads")."""
    assert st.values is not None
    cols = spec.columns
    pol = slot.policy
    names = tuple(cols[i] for i in idx)
    cur = tuple(st.values[i] for i in idx)
    new = tuple(ch.new[i] for i in idx)
    before = st.heads.get(slot.name, {})
    held = {**before, local_ver: cur}
    gone: set[str] = set()
    if kind != "insert_insert" and ch.sup is not None:
        default = _default_ver(spec, st)
        gone = {default if v == "=" else v for v in ch.sup}
    heads = {v: vals for v, vals in held.items() if v not in gone}
    heads[ch.ver] = new
    cands = [Candidate(dict(zip(names, vals)), v, v[20:]) for v, vals in sorted(heads.items())]
    won = _pick(spec, st, names, pol, cands)
    if len(cands) > 1:
        remote_c = next(c for c in cands if c.ver == ch.ver)
        rivals = [c for c in cands if c.ver != ch.ver]
        if won is not remote_c:
            local_c = won
        elif local_ver in heads:
            local_c = next(c for c in rivals if c.ver == local_ver)
        else:
            local_c = _pick(spec, st, names, pol, rivals)
        chose = {c.ver: c.values for c in cands}
        conflicts.append(_slot_conflict(spec, st, kind, slot, local_c, remote_c, won is remote_c, images, chose))
    if won.ver != local_ver:
        _take(st, slot, idx, tuple(won.values[c] for c in names), won.ver)
    others = {v: vals for v, vals in heads.items() if v != won.ver}
    if others.keys() != before.keys():
        if others:
            st.heads[slot.name] = others
        else:
            st.heads.pop(slot.name, None)
        st.heads_changed.add(slot.name)


def _slot_conflict(
    spec: TableSpec,
    st: RowState,
    kind: str,
    slot: Slot,
    local_c: Candidate,
    remote_c: Candidate,
    remote_won: bool,
    images: tuple[dict[str, Any], dict[str, Any]],
    heads: dict[str, dict[str, Any]] | None = None,
) -> ConflictRecord:
    """The record of a slot's conflict decided by its policy, between `local_c` (what this site
    held) and `remote_c` (the arriving change); `heads`: every head the policy chose among."""
    return ConflictRecord(
        spec.name,
        st.rid,
        kind,
        slot.name,
        tuple(local_c.values),
        local_c.ver,
        local_c.values,
        remote_c.ver,
        remote_c.values,
        slot.policy.name,
        "remote" if remote_won else "local",
        *images,
        heads,
    )


def _take(st: RowState, slot: Slot, idx: list[int], values: Sequence[Any], ver: str) -> None:
    """The row holds `values` (of the slot's columns `idx`) at version `ver`."""
    assert st.values is not None
    for i, v in zip(idx, values):
        if not _same(st.values[i], v):
            st.values[i] = v
            st.changed.add(i)
    st.versions[slot.name] = ver
    st.changed_slots.add(slot.name)


def _pick(spec: TableSpec, st: RowState, names: tuple[str, ...], pol: Policy, cands: list[Candidate]) -> Candidate:
    """The policy's pick of `cands` (sorted by version): pairwise, in version order (the built-in
    policies are total orders, so any order gives the same; a custom resolver gets the same pairs
    at every site)."""
    won = cands[0]
    for c in cands[1:]:
        won = pol.resolve(Conflict(spec.name, st.key, st.rid, names, won, c))
    return won


@dataclass(frozen=True)
class KeyAssignment:
    """Keys of new identities and the shifts of existing ones.

    `keys[rid]` is the new identity's key. `shifts` lists (low, high, delta): every existing
    identity whose key k satisfies low < k <= high (high None = no upper bound) moves to k + delta.
    """

    keys: dict[str, int]
    shifts: list[tuple[int, int | None, int]]


def assign_keys(new_rids: list[str], below: list[int], base_max: int) -> KeyAssignment:
    """Rank new identities into the global insertion order.

    `new_rids` are sorted; `below[i]` is how many identities this site already knew that sort before
    `new_rids[i]` (not counting base rows). Existing keys are ``base_max + rank``, so a new identity
    with j new ones before it gets ``base_max + below + j + 1`` and an existing identity moves up by the
    number of new identities that sort before it.
    """
    keys: dict[str, int] = {}
    shifts: list[tuple[int, int | None, int]] = []
    n = len(new_rids)
    for j, (rid, b) in enumerate(zip(new_rids, below)):
        keys[rid] = base_max + b + j + 1
    # existing identities with rank in (below[j], below[j+1]] move up by j+1
    for j in range(n):
        low = base_max + below[j]
        high = base_max + below[j + 1] if j + 1 < n else None
        if high is not None and high <= low:
            continue
        shifts.append((low, high, j + 1))
    return KeyAssignment(keys, shifts)


def reference_keys(all_rids: list[str], base_max: int) -> dict[str, int]:
    """The key every identity must end with: base_max + rank (for tests and verification)."""
    ordered = sorted(r for r in all_rids)
    return {r: base_max + i + 1 for i, r in enumerate(ordered)}


def count_below(sorted_existing: list[str], rid: str) -> int:
    return bisect_left(sorted_existing, rid)
