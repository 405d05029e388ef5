"""Pure property tests of the planner: no database.

Random histories of changes are made by 2-4 writing sites (inserts, updates of some columns,
deletes, and for natural keys re-inserts and REPLACEs; sites learn each other's changes at random
points, so changes are concurrent). Each writer's view of the table is the reference model
(`model.py`) of the changes it has seen, which gives the changes' old values and rids as the
capture triggers would. The changes are then delivered to one more site in several orders and
batchings -- per-origin version order with nothing else (a mesh of `latest`/`additive` renumbered
tables relays nothing) or causal order (every other table, docs/concepts.md "Relaying") -- and
that site runs `planner.plan` (and `planner.assign_keys`) on each batch, keeping its table and
shadow in dicts changed only the way `engine._execute` changes the database. Every delivery must
end in the same state (a), and that state must be the reference model's (b).

Slots whose policy picks among concurrent writes (earliest, maximum, minimum, priority, custom)
pick among the slot's concurrent heads: an update carries the heads its writer held (`sup`,
sup_of), and the site keeps the heads it does not show (docs/conflicts.md "Concurrent heads").

`pytest --hypothesis-show-statistics` shows how many examples met conflicts of each kind, waiting
changes and key shifts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import model as m
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from multimaster.config.topology import CustomPolicy, PriorityPolicy
from multimaster.core import planner, policies

SITES = ("s1", "s2", "s3", "s4")
COLS = ("a", "b", "c")  # sorted: bit i of a mask is COLS[i]
NKEYS = ("x", "y")
PICK = ("earliest", "maximum", "minimum", "priority", "custom")

# ---------------------------------------------------------------------------------------------
# a custom resolver (a total order: a score, then the version), and the same order for the model


def _score(values: tuple[Any, ...], ver: str, origin: str) -> tuple[int, str]:
    return (sum((v * 7) % 5 for v in values if v is not None) - 10 * sum(v is None for v in values), ver)


def odd_score(conflict: policies.Conflict) -> policies.Candidate:
    a, b = conflict.local, conflict.remote
    sa = _score(tuple(a.values.values()), a.ver, a.origin)
    sb = _score(tuple(b.values.values()), b.ver, b.origin)
    return a if sa > sb else b


# ---------------------------------------------------------------------------------------------
# tables: the model's description and the planner's TableSpec of the same table


def planner_policy(p: Any) -> policies.Policy:
    if isinstance(p, str):
        return policies.make_policy(p)
    if p[0] == "priority":
        return policies.make_policy(PriorityPolicy(priority=list(p[1])))
    return policies.make_policy(CustomPolicy(custom=f"{odd_score.__module__}.{odd_score.__name__}"))


def planner_spec(t: m.Table) -> planner.TableSpec:
    slots = tuple(
        planner.Slot(s.name, tuple(t.columns.index(c) for c in s.columns), planner_policy(s.policy))
        for s in sorted(t.slots, key=lambda s: s.name)
    )
    return planner.TableSpec("t", "id", t.renumber, t.columns, slots)


PRIORITIES = (("priority", ("s2", "s1")), ("priority", ("s3",)), ("priority", ("s4", "s1", "s3", "s2")))


def policies_of(kinds: tuple[str, ...]) -> tuple[Any, ...]:
    """Every policy of these kinds, in the model's form."""
    out: list[Any] = []
    for k in kinds:
        out += PRIORITIES if k == "priority" else [("custom", _score)] if k == "custom" else [k]
    return tuple(out)


def _grouped(renumber: bool, p: tuple[Any, Any]) -> m.Table:
    return m.Table(renumber, COLS, (m.Slot("ab", ("a", "b"), p[0]), m.Slot("c", ("c",), p[1])))


def _single(renumber: bool, p: tuple[Any, ...]) -> m.Table:
    return m.Table(renumber, COLS, tuple(m.Slot(c, (c,), x) for c, x in zip(COLS, p)))


def table_st(renumber: bool, kinds: tuple[str, ...]) -> st.SearchStrategy[m.Table]:
    """Columns a, b, c with a policy each, or a group of a and b (never additive) and c."""
    pols = st.sampled_from(policies_of(kinds))
    group_pols = st.sampled_from(policies_of(tuple(k for k in kinds if k != "additive")))
    # (named functions, not lambdas: hypothesis would read a lambda's source for every example)
    return st.one_of(
        st.tuples(pols, pols, pols).map(partial(_single, renumber)), st.tuples(group_pols, pols).map(partial(_grouped, renumber))
    )


# ---------------------------------------------------------------------------------------------
# histories: writing sites whose view is the model of what they have seen


@dataclass
class Writer:
    name: str
    known: dict[str, m.Event] = field(default_factory=dict)
    clock: int = 0


class History:
    def __init__(self, table: m.Table, base: dict[Any, dict[str, Any]], n_sites: int):
        self.table, self.base = table, base
        self.writers = [Writer(s) for s in SITES[:n_sites]]
        self.events: list[m.Event] = []

    def view(self, w: Writer, only: set[str] | frozenset[str] = frozenset()) -> dict[str, m.Row]:
        """The model of what `w` has seen (the values of the identities in `only`)."""
        return m.final_state(self.table, self.base, w.known.values(), only)

    def stamp(self, w: Writer, jitter: int) -> str:
        w.clock = max([w.clock, *(m.hlc_of(v) for v in w.known)]) + 1 + jitter
        return m.ver(w.clock, w.name)

    def add(self, w: Writer, e: m.Event) -> None:
        w.known[e.ver] = e
        self.events.append(e)

    def value(self, col: str, v: int, old: Any = None) -> Any:
        if self.table.slot_of(col).policy == "additive":
            return v if old is None else old + v - 1  # an update adds v - 1
        return None if v < 0 else v

    def live(self, w: Writer, view: dict[str, m.Row], key: Any = None, pick: int = 0) -> m.Row | None:
        """One live row of `w`'s view, with its values: of `key` (natural keys), else the
        `pick`-th by key."""
        live = sorted((r for r in view.values() if r.alive and (key is None or r.key == key)), key=lambda r: r.key)
        if not live:
            return None
        rid = live[pick % len(live)].rid
        return self.view(w, {rid})[rid]

    def insert(self, w: Writer, vals: tuple[int, ...], jitter: int, rid_of: Any = None, key: Any = None) -> None:
        """`rid_of(ver)`: a natural key's rid (renumbered: the version itself)."""
        seen = frozenset(w.known)
        if self.table.renumber:
            key = max(self.base, default=0) + 1 + sum(1 for e in w.known.values() if e.op == "I")
        v = self.stamp(w, jitter)
        rid = v if self.table.renumber else rid_of(v)
        self.add(w, m.Event(v, w.name, "I", rid, key, {c: self.value(c, x) for c, x in zip(COLS, vals)}, {}, seen))

    def update(self, w: Writer, row: m.Row, bits: int, vals: tuple[int, ...], jitter: int) -> None:
        assert row.values is not None
        seen = frozenset(w.known)
        new = {}
        for i, c in enumerate(COLS):
            if bits >> i & 1:
                x = self.value(c, vals[i], row.values[c])
                if x != row.values[c]:
                    new[c] = x
        for s in self.table.slots:  # a change of any column of a group carries the whole group
            if any(c in new for c in s.columns):
                for c in s.columns:
                    new.setdefault(c, row.values[c])
        if not new:
            return  # nothing changed: the capture logs nothing
        v = self.stamp(w, jitter)
        self.add(w, m.Event(v, w.name, "U", row.rid, row.key, new, {c: row.values[c] for c in new}, seen))

    def delete(self, w: Writer, row: m.Row, jitter: int) -> None:
        assert row.values is not None
        seen = frozenset(w.known)
        v = self.stamp(w, jitter)
        self.add(w, m.Event(v, w.name, "D", row.rid, row.key, {}, dict(row.values), seen))

    def run(self, script: bytes) -> list[m.Event]:
        kinds = RENUMBERED_KINDS if self.table.renumber else NATURAL_KINDS
        for i in range(0, len(script) - 3, 4):
            op = decode(script[i : i + 4], kinds)
            kind, w = op[0], self.writers[op[1] % len(self.writers)]
            if kind == "sync":
                src = self.writers[op[2] % len(self.writers)]
                w.known.update(src.known)
                continue
            view = self.view(w)
            if self.table.renumber:
                row = None if kind == "ins" else self.live(w, view, pick=op[2])
                if kind == "ins":
                    self.insert(w, op[2], op[3])
                elif row is not None and kind == "upd":
                    self.update(w, row, op[3], op[4], op[5])
                elif row is not None and kind == "del":
                    self.delete(w, row, op[3])
                continue
            key = NKEYS[op[2] % len(NKEYS)]
            row = self.live(w, view, key)
            if kind == "ins" and row is None:
                nxt = m.next_life(view, key)
                self.insert(w, op[3], op[4], lambda v: nxt, key)
            elif kind == "rep" and row is not None:  # SQLite's INSERT OR REPLACE: a new life, E = its own version
                self.insert(w, op[3], op[4], lambda v: m.later_life(key, v), key)
            elif kind == "again" and row is not None:  # delete and insert again
                self.delete(w, row, 0)
                nxt = m.next_life(self.view(w), key)
                self.insert(w, op[3], op[4], lambda v: nxt, key)
            elif kind == "upd" and row is not None:
                self.update(w, row, op[3], op[4], op[5])
            elif kind == "del" and row is not None:
                self.delete(w, row, op[3])
        return self.events


# A history is a byte string (cheap to generate, and it shrinks towards short runs of "s1 inserts
# zeros"), four bytes an operation: the kind (weighted), the writing site, which row or key, which
# columns, the values (-1 is NULL except in additive columns), the clock's jitter.
RENUMBERED_KINDS = ["ins"] * 5 + ["upd"] * 7 + ["del"] * 2 + ["sync"] * 6
NATURAL_KINDS = ["ins"] * 4 + ["rep"] * 1 + ["again"] * 2 + ["upd"] * 6 + ["del"] * 2 + ["sync"] * 5


def decode(op: bytes, kinds: list[str]) -> tuple[Any, ...]:
    b0, b1, b2, b3 = op
    kind = kinds[b0 % 20]
    site, pick, jitter = b1 & 3, b1 >> 2 & 7, (b1 >> 5) % 3
    bits = 1 + b2 % 7
    vals = (b2 // 7 % 6 - 1, b3 % 6 - 1, b3 // 6 % 6 - 1)
    if kind == "sync":
        return ("sync", site, pick)
    if kind == "upd":
        return ("upd", site, pick, bits, vals, jitter)
    if kind == "del":
        return ("del", site, pick, jitter)
    if kind == "ins" and kinds is RENUMBERED_KINDS:
        return ("ins", site, vals, jitter)
    return (kind, site, pick, vals, jitter)


script_st = st.binary(min_size=40, max_size=100)


def base_rows(table: m.Table, n: int) -> dict[Any, dict[str, Any]]:
    keys = list(range(1, n + 1)) if table.renumber else list(NKEYS[:n])
    return {k: {c: i + j for j, c in enumerate(COLS)} for i, k in enumerate(keys)}


# ---------------------------------------------------------------------------------------------
# the receiving site: table and shadow in dicts, changed as engine._execute changes them


def to_change(
    e: m.Event,
    cols: tuple[str, ...] = COLS,
    table: m.Table | None = None,
    known: dict[str, m.Event] | None = None,
    base: Any = (),
) -> planner.Change:
    """A model change as the change log holds it: a mask, new and old values by column index, and
    for an update of a slot whose policy chooses among heads what capture records (`sup`, see
    sup_of; needs `table`, every event by version in `known`, and the base keys)."""
    n = len(cols)
    if e.op == "I":
        return planner.Change(e.ver, e.origin, "I", e.rid, e.key, (1 << n) - 1, tuple(e.new[c] for c in cols), (None,) * n)
    if e.op == "D":
        return planner.Change(e.ver, e.origin, "D", e.rid, e.key, (1 << n) - 1, (None,) * n, tuple(e.old[c] for c in cols))
    mask = sum(1 << i for i, c in enumerate(cols) if c in e.new)
    sup = sup_of(table, known or {}, base, e) if table is not None else None
    return planner.Change(
        e.ver, e.origin, "U", e.rid, e.key, mask, tuple(e.new.get(c) for c in cols), tuple(e.old.get(c) for c in cols), sup
    )


def sup_of(table: m.Table, known: dict[str, m.Event], base: Any, e: m.Event) -> frozenset[str] | None:
    """What the capture of update `e` records as superseded: for every slot it sets whose policy
    chooses among heads, the heads of that slot its writer held (the model's heads of the writes
    it had seen; the row's default version, the base row's, as "="). None when it sets no such slot."""
    out: set[str] = set()
    hit = False
    for slot in table.slots:
        if m.policy_name(slot.policy) not in PICK or not any(c in e.new for c in slot.columns):
            continue
        hit = True
        writes = []
        in_base = e.rid in {m.base_rid(k) if table.renumber else m.first_life(k) for k in base}
        if in_base:
            writes.append(m.Write((), e.rid if table.renumber else m.BASE_VER, "", frozenset(), True))
        for v in e.seen:
            x = known[v]
            if x.rid == e.rid and (x.op == "I" or (x.op == "U" and any(c in x.new for c in slot.columns))):
                writes.append(m.Write((), x.ver, x.origin, x.seen))
        for w in m.heads(writes):
            out.add("=" if w.base or (table.renumber and w.ver == e.rid) else w.ver)
    return frozenset(out) if hit else None


@dataclass
class ShadowRow:
    key: Any
    deleted: str | None
    versions: dict[str, str | None]
    heads: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)  # h_<slot> / x_<slot>


KINDS = {"update_update", "insert_insert", "update_delete", "delete_update", "insert_replaces"}


class Site:
    def __init__(self, spec: planner.TableSpec, base: dict[Any, dict[str, Any]]):
        self.spec = spec
        self.base_max = max(base, default=0) if spec.renumber else 0
        self.table: dict[Any, list[Any]] = {k: [r[c] for c in spec.columns] for k, r in base.items()}
        self.shadow: dict[str, ShadowRow] = {
            (m.base_rid(k) if spec.renumber else m.first_life(k)): ShadowRow(k, None, {s.name: None for s in spec.slots})
            for k in base
        }
        self.applied: dict[str, str] = {}  # _mm_origins: origin -> highest version applied
        self.waiting: list[planner.Change] = []  # snapshot rows with applied = 2

    def reconcile(self, batch: list[planner.Change]) -> planner.Plan:
        """engine.reconcile_table without the fast path: candidates (waiting ones again), less the
        duplicates, in version order, through the planner."""
        cand = {c.ver: c for c in [*self.waiting, *batch] if c.ver > self.applied.get(c.origin, "")}
        ordered = sorted(cand.values(), key=lambda c: c.ver)
        states = self.load_states(ordered)
        p = planner.plan(self.spec, ordered, states)
        assert sorted(c.ver for c in [*p.processed, *p.parked]) == [c.ver for c in ordered]
        for c in p.conflicts:
            assert c.kind in KINDS and c.decision in ("local", "remote", "merged", "delete"), c
        self.execute(p)
        self.waiting = list(p.parked)
        for c in p.processed:
            self.applied[c.origin] = max(self.applied.get(c.origin, ""), c.ver)
        return p

    def load_states(self, changes: list[planner.Change]) -> dict[str, planner.RowState]:
        """engine._load_states: shadow rows of the changes' rids (natural keys: of every
        incarnation of their keys) with the table's values (natural keys: of the live one)."""
        rids = {c.rid for c in changes} & set(self.shadow)
        if not self.spec.renumber:
            keys = {c.key for c in changes}
            rids |= {r for r, s in self.shadow.items() if s.key in keys}
        out = {}
        for rid in rids:
            s = self.shadow[rid]
            present = s.key in self.table and (self.spec.renumber or s.deleted is None)
            out[rid] = planner.RowState(
                rid, s.key, s.deleted, dict(s.versions), list(self.table[s.key]) if present else None, heads=dict(s.heads)
            )
        return out

    def execute(self, p: planner.Plan) -> None:
        """engine._execute on dicts; the asserts are the database's unique keys."""
        new = p.new_rids
        if new and self.spec.renumber:
            max_key = max((s.key for s in self.shadow.values()), default=self.base_max)
            by_rid = sorted(self.shadow)
            if not by_rid or new[0] > by_rid[-1]:
                below = [max(0, max_key - self.base_max)] * len(new)
            else:
                below = []
                for rid in new:
                    prev = [r for r in by_rid if r < rid]
                    pk = self.shadow[prev[-1]].key if prev else self.base_max
                    below.append(max(0, pk - self.base_max))
            ka = planner.assign_keys(new, below, self.base_max)
            moving = [s for s in ka.shifts if (s[1] is None or s[1] > s[0]) and s[0] < max_key]

            def moved(k: int) -> int:
                for low, high, delta in moving:
                    if k > low and (high is None or k <= high):
                        return k + delta
                return k

            for s in self.shadow.values():
                s.key = moved(s.key)
            self.table = {moved(k): v for k, v in self.table.items()}
            for st_ in p.rows.values():
                if st_.existed:
                    st_.key = moved(st_.key)
            for rid in new:
                p.rows[rid].key = ka.keys[rid]
        for st_ in p.rows.values():  # deletes
            if st_.existed and st_.alive_before and st_.values is None:
                assert st_.key in self.table, ("delete of a missing row", st_)
                del self.table[st_.key]
        for st_ in p.rows.values():  # inserts
            if st_.values is not None and not st_.alive_before:
                assert st_.key not in self.table, ("duplicate key", st_)
                self.table[st_.key] = list(st_.values)
        for st_ in p.rows.values():  # updates
            if st_.alive_before and st_.values is not None and st_.changed:
                row = self.table[st_.key]
                for i in st_.changed:
                    row[i] = st_.values[i]
        slots = [s.name for s in self.spec.slots]
        for rid, st_ in p.rows.items():  # shadow
            if not st_.existed:
                assert rid not in self.shadow, ("duplicate rid", rid)
                self.shadow[rid] = ShadowRow(st_.key, st_.deleted, {s: st_.versions.get(s) for s in slots}, dict(st_.heads))
            elif st_.changed_slots or st_.deleted_changed or st_.heads_changed:
                sh = self.shadow[rid]
                if st_.deleted_changed:
                    sh.deleted = st_.deleted
                for s in st_.changed_slots:
                    sh.versions[s] = st_.versions[s]
                for s in st_.heads_changed:
                    if s in st_.heads:
                        sh.heads[s] = st_.heads[s]
                    else:
                        sh.heads.pop(s, None)
        if self.spec.renumber:
            keys = [s.key for s in self.shadow.values()]
            assert len(keys) == len(set(keys)), "two identities with one key"

    def state(self) -> tuple[dict[str, tuple[Any, str | None]], dict[Any, tuple[Any, ...]], dict[str, dict[str, str]]]:
        """(rid -> (key, deleted), key -> values, live rid -> slot -> version)."""
        default = (lambda rid: rid) if self.spec.renumber else (lambda rid: m.BASE_VER)
        live = {rid: s for rid, s in self.shadow.items() if s.deleted is None}
        assert {s.key for s in live.values()} == set(self.table), "the table is not the live identities"
        assert len(live) == len(self.table), "two live incarnations of one key"
        versions = {rid: {n: v or default(rid) for n, v in s.versions.items()} for rid, s in live.items()}
        return ({r: (s.key, s.deleted) for r, s in self.shadow.items()}, {k: tuple(v) for k, v in self.table.items()}, versions)


def expected(table: m.Table, base: dict[Any, dict[str, Any]], events: list[m.Event]) -> tuple[Any, ...]:
    ref = m.final_state(table, base, events)
    return (
        {r.rid: (r.key, r.deleted) for r in ref.values()},
        m.table_rows(table, ref),
        {r.rid: dict(r.versions) for r in ref.values() if r.values is not None},
    )


# ---------------------------------------------------------------------------------------------
# deliveries


def batches(events: list[m.Event], choices: bytes, causal: bool, newest_first: bool = False) -> list[list[m.Event]]:
    """Deliver `events` one at a time: each step takes one of the changes allowed next (its
    origin's earlier changes delivered; causal: every change its author had seen delivered), as
    `choices` say, and may end the batch. `newest_first`: always the allowed change with the
    highest version, one per batch (the order most unlike version order)."""
    pending = sorted(events, key=lambda e: e.ver)
    done: set[str] = set()
    out: list[list[m.Event]] = []
    cur: list[m.Event] = []
    for i in range(len(pending)):
        if causal:
            ready = [e for e in pending if e.seen <= done]
        else:
            ready = [e for e in pending if not any(o.origin == e.origin and o.ver < e.ver for o in pending)]
        c = (len(ready) - 1 + 8) if newest_first else choices[i] if i < len(choices) else 0
        e = ready[c % len(ready)]
        pending.remove(e)
        done.add(e.ver)
        cur.append(e)
        if c >> 3 & 1:
            out.append(cur)
            cur = []
    return out + [cur]


def replay(
    spec: planner.TableSpec, base: dict[Any, dict[str, Any]], deliveries: list[list[planner.Change]], seen: set[str] | None = None
) -> tuple[Any, ...]:
    site = Site(spec, base)
    for b in deliveries:
        p = site.reconcile(b)
        if seen is not None:
            seen.update(c.kind for c in p.conflicts)
            seen.update(["waited"] if p.parked else [])
            seen.update(
                ["renumbered"] if p.new_rids and spec.renumber and any(s.existed and s.key > 0 for s in p.rows.values()) else []
            )
    for _ in range(3):  # what still waits for its row is retried by every reconcile
        if site.waiting:
            site.reconcile([])
    assert not site.waiting, f"changes still waiting: {site.waiting}"
    return site.state()


def describe(events: list[m.Event]) -> str:
    return "\n".join(
        f"  {e.ver} {e.op} {e.rid} key={e.key!r} new={e.new} old={e.old} seen={sorted(e.seen)}"
        for e in sorted(events, key=lambda e: e.ver)
    )


def check(table: m.Table, base: dict[Any, dict[str, Any]], events: list[m.Event], orders: bytes, causal: bool) -> None:
    """(a) every delivery ends in the same state; (b) that state is the reference model's."""
    spec = planner_spec(table)
    by_ver = sorted(events, key=lambda e: e.ver)
    deliveries = {
        "all in one batch": [by_ver],
        "one by one, newest allowed first": batches(events, b"", causal, newest_first=True),
        **{f"random order {i}": batches(events, o, causal) for i, o in enumerate((orders[::2], orders[1::2]))},
    }
    known = {e.ver: e for e in events}
    change = {e.ver: to_change(e, COLS, table, known, base) for e in events}
    seen: set[str] = set()
    got = {name: replay(spec, base, [[change[e.ver] for e in b] for b in d], seen) for name, d in deliveries.items()}
    first = next(iter(got))
    for name, g in got.items():
        assert g == got[first], (
            f"{name!r} and {first!r} end differently:\n{g}\n{got[first]}\n"
            f"{name}: {[[e.ver for e in b] for b in deliveries[name]]}\nchanges:\n{describe(events)}"
        )
    want = expected(table, base, events)
    assert got[first][:2] == want[:2], (
        f"rows/identities differ from the model:\n{got[first]}\n{want}\nchanges:\n{describe(events)}"
    )
    assert got[first][2] == want[2], f"slot versions differ from the model:\n{got[first][2]}\n{want[2]}"
    event(f"changes: {len(events) // 8 * 8}+")
    for k in sorted(seen):
        event(k)


orders_st = st.binary(max_size=80)  # two delivery orders: its first and second half
SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    table=table_st(True, ("latest", "additive")),
    n_sites=st.integers(2, 4),
    base_n=st.integers(0, 3),
    script=script_st,
    orders=orders_st,
)
def test_renumbered_latest_additive_any_per_origin_order(
    table: m.Table, n_sites: int, base_n: int, script: bytes, orders: bytes
) -> None:
    """latest/additive tables are delivered in per-origin order only (no relaying in a mesh):
    updates and deletes arrive before their row's insert, wait or leave tombstones."""
    base = base_rows(table, base_n)
    events = History(table, base, n_sites).run(script)
    check(table, base, events, orders, causal=False)


@SETTINGS
@given(
    table=table_st(True, ("latest", "additive", *PICK)),
    n_sites=st.integers(2, 4),
    base_n=st.integers(0, 3),
    script=script_st,
    orders=orders_st,
)
def test_renumbered_every_policy_causal_order(table: m.Table, n_sites: int, base_n: int, script: bytes, orders: bytes) -> None:
    base = base_rows(table, base_n)
    events = History(table, base, n_sites).run(script)
    check(table, base, events, orders, causal=True)


@SETTINGS
@given(
    table=table_st(False, ("latest", "additive", *PICK)),
    n_sites=st.integers(2, 4),
    base_n=st.integers(0, 2),
    script=script_st,
    orders=orders_st,
)
def test_natural_keys_every_policy_causal_order(table: m.Table, n_sites: int, base_n: int, script: bytes, orders: bytes) -> None:
    base = base_rows(table, base_n)
    events = History(table, base, n_sites).run(script)
    check(table, base, events, orders, causal=True)


# ---------------------------------------------------------------------------------------------
# Concurrent heads (docs/conflicts.md): two sites change the same column twice each while apart:
# s1 makes U1 then U3 (having seen U1), s2 makes U2 then U4 (having seen U2). The slot's heads
# are U3 and U4, and the policy picks between them. Before heads were kept, the planner compared
# each arriving change with the value the site held only, and a change whose old value equalled it
# won as a plain successor: a site applying U2, U4, U1, U3 let U1 beat U4 and then U3 follow U1,
# and ended with U3 where a site applying U1, U2, U3, U4 ended with the pick of U3 and U4. Both
# orders are causal. latest (the greatest version always wins) and additive (deltas commute) were
# never affected.

# policy, values (base, U1, U2, U3, U4), the origin of U3
CONTINUED = [
    pytest.param("earliest", (0, 1, 2, 3, 4), "s1", id="earliest"),  # versions U1 < U2 < U4 < U3
    pytest.param("maximum", (1, 5, 3, 2, 4), "s1", id="maximum"),
    pytest.param("minimum", (9, 1, 3, 4, 2), "s1", id="minimum"),
    pytest.param(("priority", ("s1", "s2", "s3")), (0, 1, 2, 3, 4), "s3", id="priority"),  # U3 made at s3 after U1
    pytest.param(("custom", _score), (1, 2, 3, 0, 4), "s1", id="custom"),  # scores U3 0 < U2 1 < U4 3 < U1 4
]


@dataclass
class Continued:
    """The scenario above for one policy: the table, its base row, U1..U4, the planner's spec and
    each event as the change it arrives as (by version)."""

    table: m.Table
    base: dict[Any, dict[str, Any]]
    events: tuple[m.Event, m.Event, m.Event, m.Event]
    spec: planner.TableSpec
    change: dict[str, planner.Change]

    #: four causal orders a site may hear U1..U4 in (as indexes into events)
    ORDERS = ((0, 1, 2, 3), (1, 3, 0, 2), (0, 2, 1, 3), (1, 0, 3, 2))

    def orders(self) -> list[tuple[m.Event, ...]]:
        return [tuple(self.events[i] for i in o) for o in self.ORDERS]


def continued(policy: Any, vals: tuple[int, ...], u3_origin: str) -> Continued:
    """U1..U4 of CONTINUED's `policy`, `vals` (base, U1..U4) and U3's origin."""
    table = m.Table(True, ("a",), (m.Slot("a", ("a",), policy),))
    base = {1: {"a": vals[0]}}
    b = m.base_rid(1)
    u1 = m.Event(m.ver(11, "s1"), "s1", "U", b, 1, {"a": vals[1]}, {"a": vals[0]}, frozenset())
    u2 = m.Event(m.ver(12, "s2"), "s2", "U", b, 1, {"a": vals[2]}, {"a": vals[0]}, frozenset())
    u4 = m.Event(m.ver(13, "s2"), "s2", "U", b, 1, {"a": vals[4]}, {"a": vals[2]}, frozenset({u2.ver}))
    u3 = m.Event(m.ver(14, u3_origin), u3_origin, "U", b, 1, {"a": vals[3]}, {"a": vals[1]}, frozenset({u1.ver}))
    spec = planner.TableSpec("t", "id", True, ("a",), (planner.Slot("a", (0,), planner_policy(policy)),))
    known = {e.ver: e for e in (u1, u2, u3, u4)}
    ch = {e.ver: to_change(e, ("a",), table, known, base) for e in (u1, u2, u3, u4)}
    return Continued(table, base, (u1, u2, u3, u4), spec, ch)


@pytest.mark.parametrize("policy, vals, u3_origin", CONTINUED)
def test_pick_policies_when_a_concurrent_write_is_continued(policy: Any, vals: tuple[int, ...], u3_origin: str) -> None:
    sc = continued(policy, vals, u3_origin)
    table, base, spec, ch = sc.table, sc.base, sc.spec, sc.change
    u1, u2, u3, u4 = sc.events
    want = m.table_rows(table, m.final_state(table, base, [u1, u2, u3, u4]))
    assert want == {1: (vals[4],)}  # the policy's pick of the last writes U3 and U4
    assert ch[u1.ver].sup == ch[u2.ver].sup == {"="} and ch[u3.ver].sup == {u1.ver} and ch[u4.ver].sup == {u2.ver}
    got = {}
    for order in sc.orders():
        site = Site(spec, base)
        for e in order:
            site.reconcile([ch[e.ver]])
        got["".join("U" + str([u1, u2, u3, u4].index(e) + 1) for e in order)] = site.state()[1]
    assert got == {k: want for k in got}


def test_a_change_without_recorded_heads_is_decided_by_its_old_values() -> None:
    """An entry captured before heads were kept (`sup` None) is decided as before: by its old
    values against the row's, a plain successor when they match."""
    spec = planner.TableSpec("t", "id", True, ("a",), (planner.Slot("a", (0,), planner_policy("earliest")),))
    base = {1: {"a": 0}}
    b = m.base_rid(1)
    site = Site(spec, base)
    site.reconcile([planner.Change(m.ver(11, "s2"), "s2", "U", b, 1, 1, (5,), (0,))])
    p = site.reconcile([planner.Change(m.ver(12, "s3"), "s3", "U", b, 1, 1, (7,), (5,))])
    assert site.state()[1] == {1: (7,)} and not p.conflicts
    p = site.reconcile([planner.Change(m.ver(13, "s4"), "s4", "U", b, 1, 1, (9,), (0,))])
    assert site.state()[1] == {1: (7,)} and [c.decision for c in p.conflicts] == ["local"]


def test_heads_are_kept_and_dropped() -> None:
    """The shadow keeps the heads a site does not show, and forgets a head once a change that
    superseded it arrives; a change superseding every head wins without a conflict."""
    spec = planner.TableSpec("t", "id", True, ("a",), (planner.Slot("a", (0,), planner_policy("maximum")),))
    b = m.base_rid(1)
    site = Site(spec, {1: {"a": 0}})
    v1, v2, v3 = m.ver(11, "s1"), m.ver(12, "s2"), m.ver(13, "s3")
    site.reconcile([planner.Change(v1, "s1", "U", b, 1, 1, (5,), (0,), frozenset({"="}))])
    p = site.reconcile([planner.Change(v2, "s2", "U", b, 1, 1, (3,), (0,), frozenset({"="}))])
    assert site.state()[1] == {1: (5,)} and site.shadow[b].heads == {"a": {v2: (3,)}}
    assert [(c.local_ver, c.remote_ver, c.decision) for c in p.conflicts] == [(v1, v2, "local")]
    # s3 had both: it supersedes both, and wins although its value is the smallest
    p = site.reconcile([planner.Change(v3, "s3", "U", b, 1, 1, (1,), (5,), frozenset({v1, v2}))])
    assert site.state()[1] == {1: (1,)} and site.shadow[b].heads == {} and not p.conflicts


# ---------------------------------------------------------------------------------------------
# keys, incarnations


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(1, 60), max_size=12), st.sets(st.integers(1, 60), min_size=1, max_size=8), st.integers(0, 5))
def test_assign_keys_gives_every_identity_its_rank(existing: set[int], new: set[int], base_max: int) -> None:
    """Existing identities hold base_max + rank; after the shifts and the new keys every identity
    holds base_max + its rank among all of them."""
    new -= existing
    if not new:
        return
    old = sorted(m.ver(h, "s1") for h in existing)
    added = sorted(m.ver(h, "s1") for h in new)
    keys = {r: base_max + i for i, r in enumerate(old, start=1)}
    below = [sum(1 for r in old if r < n) for n in added]
    ka = planner.assign_keys(added, below, base_max)
    for r, k in keys.items():
        for low, high, delta in ka.shifts:
            if k > low and (high is None or k <= high):
                keys[r] = k + delta
                break
    keys.update(ka.keys)
    assert keys == {r: base_max + i for i, r in enumerate(sorted(old + added), start=1)}
    assert planner.reference_keys(old + added, base_max) == keys


def test_incarnation_of() -> None:
    e = m.ver(5 << 16, "s_2")
    assert planner.incarnation_of(m.first_life("x")) is None
    assert planner.incarnation_of(m.later_life("x", e)) == e
    assert planner.incarnation_of(m.later_life("a@b", e)) == e
    assert planner.incarnation_of("k:x@notaversion") is None


# ---------------------------------------------------------------------------------------------
# what the planner records, on small examples


def _plan(table: m.Table, base: dict[Any, dict[str, Any]], events: list[m.Event]) -> planner.Plan:
    site = Site(planner_spec(table), base)
    *first, last = events
    for e in first:
        site.reconcile([to_change(e)])
    return site.reconcile([to_change(last)])


TWO = m.Table(True, COLS, (m.Slot("a", ("a",), "latest"), m.Slot("b", ("b",), "additive"), m.Slot("c", ("c",), "latest")))
ROW = {1: {"a": 0, "b": 10, "c": 0}}
R1 = m.base_rid(1)


def test_concurrent_updates_are_recorded_per_slot() -> None:
    u1 = m.Event(m.ver(11, "s1"), "s1", "U", R1, 1, {"a": 1, "b": 9}, {"a": 0, "b": 10}, frozenset())
    u2 = m.Event(m.ver(12, "s2"), "s2", "U", R1, 1, {"a": 2, "b": 8}, {"a": 0, "b": 10}, frozenset())
    p = _plan(TWO, ROW, [u1, u2])
    recs = {c.slot: c for c in p.conflicts}
    assert set(recs) == {"a", "b"}
    assert (recs["a"].kind, recs["a"].decision, recs["a"].local_ver, recs["a"].remote_ver) == (
        "update_update",
        "remote",
        u1.ver,
        u2.ver,
    )
    assert (recs["b"].policy, recs["b"].decision) == ("additive", "merged")
    assert p.rows[R1].values == [2, 7, 0]  # a: the latest; b: 10 - 1 - 2


def test_an_older_concurrent_update_loses_and_is_recorded() -> None:
    u1 = m.Event(m.ver(11, "s1"), "s1", "U", R1, 1, {"a": 1}, {"a": 0}, frozenset())
    u2 = m.Event(m.ver(12, "s2"), "s2", "U", R1, 1, {"a": 2}, {"a": 0}, frozenset())
    p = _plan(TWO, ROW, [u2, u1])
    assert [(c.kind, c.decision) for c in p.conflicts] == [("update_update", "local")]
    assert p.rows[R1].values == [2, 10, 0] and not p.rows[R1].changed


def test_delete_wins_both_ways_and_is_recorded() -> None:
    u = m.Event(m.ver(11, "s1"), "s1", "U", R1, 1, {"c": 5}, {"c": 0}, frozenset())
    d = m.Event(m.ver(12, "s2"), "s2", "D", R1, 1, {}, {"a": 0, "b": 10, "c": 0}, frozenset())
    p = _plan(TWO, ROW, [u, d])  # the delete arrives after the update: delete_update
    assert [(c.kind, c.decision, c.columns) for c in p.conflicts] == [("delete_update", "delete", ("c",))]
    assert p.rows[R1].values is None and p.rows[R1].deleted == d.ver
    p = _plan(TWO, ROW, [d, u])  # the update arrives after the delete: update_delete
    assert [(c.kind, c.decision) for c in p.conflicts] == [("update_delete", "delete")]
    assert p.rows[R1].values is None and not p.rows[R1].changed


def test_an_update_before_its_insert_waits_and_holds_its_origin_back() -> None:
    i = m.Event(m.ver(11, "s1"), "s1", "I", m.ver(11, "s1"), 2, {"a": 1, "b": 1, "c": 1}, {}, frozenset())
    u = m.Event(m.ver(12, "s2"), "s2", "U", i.rid, 2, {"a": 2}, {"a": 1}, frozenset({i.ver}))
    later = m.Event(m.ver(13, "s2"), "s2", "U", R1, 1, {"a": 3}, {"a": 0}, frozenset({i.ver, u.ver}))
    spec = planner_spec(TWO)
    site = Site(spec, ROW)
    p = site.reconcile([to_change(u), to_change(later)])
    assert [c.ver for c in p.parked] == [u.ver, later.ver] and not p.processed
    p = site.reconcile([to_change(i)])
    assert [c.ver for c in p.processed] == [i.ver, u.ver, later.ver] and not p.parked
    assert site.state()[1] == {1: (3, 10, 0), 2: (2, 1, 1)}


NAT = m.Table(False, COLS, (m.Slot("a", ("a",), "latest"), m.Slot("b", ("b",), "additive"), m.Slot("c", ("c",), "latest")))


def test_natural_key_insert_insert_and_a_later_life() -> None:
    i1 = m.Event(m.ver(11, "s1"), "s1", "I", "k:x", "x", {"a": 1, "b": 2, "c": 1}, {}, frozenset())
    i2 = m.Event(m.ver(12, "s2"), "s2", "I", "k:x", "x", {"a": 2, "b": 3, "c": 2}, {}, frozenset())
    p = _plan(NAT, {}, [i1, i2])
    assert {(c.kind, c.slot, c.decision) for c in p.conflicts} == {
        ("insert_insert", "a", "remote"),
        ("insert_insert", "b", "merged"),
        ("insert_insert", "c", "remote"),
    }
    assert p.rows["k:x"].values == [2, 5, 2]
    # s1 deletes x and inserts it again; s2's update of the first life arrives after: lost
    d = m.Event(m.ver(13, "s1"), "s1", "D", "k:x", "x", {}, {"a": 1, "b": 2, "c": 1}, frozenset({i1.ver}))
    again = m.Event(
        m.ver(14, "s1"), "s1", "I", m.later_life("x", d.ver), "x", {"a": 7, "b": 7, "c": 7}, {}, frozenset({i1.ver, d.ver})
    )
    u = m.Event(m.ver(15, "s2"), "s2", "U", "k:x", "x", {"a": 9}, {"a": 2}, frozenset({i1.ver, i2.ver}))
    site = Site(planner_spec(NAT), {})
    for e in (i1, i2, again):  # the new life arrives before the delete of the old one
        p = site.reconcile([to_change(e)])
    assert [(c.kind, c.rid, c.decision) for c in p.conflicts] == [("insert_replaces", "k:x", "remote")]
    site.reconcile([to_change(u)])
    site.reconcile([to_change(d)])
    shadow, rows, _ = site.state()
    assert rows == {"x": (7, 7, 7)}
    assert shadow == {"k:x": ("x", d.ver), again.rid: ("x", None)}  # E of the later life, then its delete: the lower


def test_an_origin_parked_in_an_earlier_piece_holds_its_changes_of_the_next() -> None:
    """The reconciler plans a long batch in pieces (engine/reconcile.py PLAN_PIECE): an origin
    with a change parked by an earlier piece's plan has its changes of the later pieces parked
    too, as one plan of all of them would (an origin's changes are applied in version order)."""
    i = m.Event(m.ver(11, "s1"), "s1", "I", m.ver(11, "s1"), 2, {"a": 1, "b": 1, "c": 1}, {}, frozenset())
    u = m.Event(m.ver(12, "s2"), "s2", "U", i.rid, 2, {"a": 2}, {"a": 1}, frozenset({i.ver}))
    later = m.Event(m.ver(13, "s2"), "s2", "U", R1, 1, {"a": 3}, {"a": 0}, frozenset({u.ver}))
    spec = planner_spec(TWO)
    whole = planner.plan(spec, [to_change(u), to_change(later)], Site(spec, ROW).load_states([to_change(u), to_change(later)]))
    assert [c.ver for c in whole.parked] == [u.ver, later.ver]
    first = planner.plan(spec, [to_change(u)], Site(spec, ROW).load_states([to_change(u), to_change(later)]))
    second = planner.plan(
        spec, [to_change(later)], Site(spec, ROW).load_states([to_change(u), to_change(later)]), {c.origin for c in first.parked}
    )
    assert [c.ver for c in first.parked + second.parked] == [u.ver, later.ver] and not second.processed
    assert [
        c.ver
        for c in planner.plan(spec, [to_change(later)], Site(spec, ROW).load_states([to_change(u), to_change(later)])).processed
    ] == [later.ver]
