"""What the error queue decides without a database (docs/errors.md): whether a change-log entry
is well-formed enough to be applied or stored at all, and the order held changes are retried in.

A change is *malformed* when applying it cannot even be tried: its version is not
``'%019d:%s' % (hlc, origin)`` with the origin a site name, its operation is not I, U or D, or its
identity or column mask is missing, or its version names another site than its origin. Such an
entry (a hand-made row in a change log, say) is held in the error queue like a change the database
rejected, instead of blocking its link. A well-formed entry whose origin is no site this site knows
(:func:`refusal`: not in the topology, not a site removed from it) is held too, until the topology
names it.
"""

from __future__ import annotations

import bisect
import heapq
import re
from typing import Any, Callable, Collection, Hashable, Iterable, Mapping, Sequence

from multimaster.core.batches import source_txn
from multimaster.core.planner import parse_sup

__all__ = [
    "is_version",
    "malformed",
    "refusal",
    "MALFORMED",
    "UNKNOWN_ORIGIN",
    "retry_order",
    "group_key",
    "units",
    "in_halves",
    "shortest_failing",
    "Holds",
    "plan_holds",
    "retry_set",
    "closure",
    "group_of",
    "released_by",
]

_VERSION = re.compile(r"[0-9]{19}:[A-Za-z_][A-Za-z0-9_]*\Z")


def is_version(v: Any) -> bool:
    """Whether `v` is a version string (a fixed-width clock, ':', a site name)."""
    return isinstance(v, str) and _VERSION.match(v) is not None


def malformed(ver: Any, origin: Any, op: Any, rid: Any, mask: Any) -> str | None:
    """Why the change (ver, origin, op, rid, mask) cannot be applied as it is, None when it can."""
    problems = []
    if not is_version(ver):
        problems.append(f"ver={ver!r}")
    if not isinstance(origin, str) or not origin:
        problems.append(f"origin={origin!r}")
    if op not in ("I", "U", "D"):
        problems.append(f"op={op!r}")
    if rid is None or (isinstance(rid, str) and not rid):
        problems.append(f"rid={rid!r}")
    if mask is None or isinstance(mask, bool) or not isinstance(mask, int) or mask < 0:
        problems.append(f"mask={mask!r}")
    return f"malformed change ({', '.join(problems)})" if problems else None


#: :func:`refusal`'s kinds: an entry that can never be applied (only skipped) ...
MALFORMED = "malformed"
#: ... and one whose origin is no site known here: applied by `errors retry` once the topology names it
UNKNOWN_ORIGIN = "origin"


def refusal(
    ver: Any, origin: Any, op: Any, rid: Any, mask: Any, known: Collection[str], sup: Any = None
) -> tuple[str, str] | None:
    """Whether a change-log entry pulled from a peer may be applied here, and why not: None when
    it may; (:data:`MALFORMED`, why) when it never can (:func:`malformed`, a `sup` that is not a
    list of versions, or a version naming another site than its origin: every version is made by
    its origin, docs/clock.md); (:data:`UNKNOWN_ORIGIN`, why) when its origin is not in `known`
    (the sites of the topology, the sites removed from it, the origins this site applied changes
    from)."""
    why = malformed(ver, origin, op, rid, mask)
    if why is not None:
        return MALFORMED, why
    try:
        parse_sup(sup)
    except ValueError as e:
        return MALFORMED, f"malformed change ({e})"
    named = ver[20:]
    if named != origin:
        return MALFORMED, f"malformed change (its version {ver!r} names site '{named}', its origin is '{origin}')"
    if origin not in known:
        return UNKNOWN_ORIGIN, f"origin '{origin}' is not a site of the topology, nor a site removed from it"
    return None


def retry_order(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Held changes in the order a retry applies them: per table, by version (a row's changes in
    the order they were made; every origin's in the order it made them)."""
    return sorted(rows, key=lambda r: (r["tbl"], r["ver"], r["id"]))


# ---- the unit of holding: the source transaction (docs/errors.md "What is held")
#
# A change is described by a mapping with (at least) ``tbl``, ``rid``, ``ver``, ``origin`` and
# ``txn`` (the source transaction, None where the source records none: a SQLite site's changes).
# Changes of one ``(origin, txn)`` are one *group*: held together, applied together. A change
# without a transaction is a group of its own; so is one whose ``txn`` is a batch's name
# (core/batches.py batch_txn: the changes a batch stored from a source that records none, which
# keeps them together for the cuts downstream, and is no source transaction).


def _txn_of(change: Mapping[str, Any]) -> tuple[str, str] | None:
    """The source transaction ``(origin, txn)`` of `change`, None when its source recorded none."""
    txn = source_txn(change.get("txn"))
    return None if txn is None else (str(change["origin"]), txn)


def group_key(change: Mapping[str, Any], ident: Hashable) -> Hashable:
    """The group of `change`: its source transaction ``(origin, txn)``, or `ident` (its own) when
    it has none (no ``txn``, or a batch's name)."""
    t = _txn_of(change)
    return ("txn", *t) if t is not None else ("one", ident)


def _table_rank(table_order: Sequence[str]) -> Callable[[str], tuple[int, str]]:
    rank = {t: i for i, t in enumerate(table_order)}
    return lambda t: (rank.get(t, len(rank)), t)


def units(changes: Sequence[Mapping[str, Any]], table_order: Sequence[str] = ()) -> list[list[int]]:
    """The changes (indices into `changes`) cut into units, in the order they are applied.

    A unit is a group (one source transaction), merged with the groups it is entangled with: group
    A must precede group B when A changes a row before B does (a row's changes apply in version
    order); groups that must each precede the other (possible only across origins) are one unit.
    Units come in an order that respects every row's version order, earliest first version first
    otherwise; a unit's changes come table by table in `table_order` (parents before children),
    then by version."""
    if not changes:
        return []
    gid: dict[Hashable, int] = {}
    of: list[int] = []
    for i, c in enumerate(changes):
        of.append(gid.setdefault(group_key(c, i), len(gid)))
    n = len(gid)
    succ: list[set[int]] = [set() for _ in range(n)]
    rows: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(changes):
        rows.setdefault((c["tbl"], c["rid"]), []).append(i)
    for members in rows.values():
        members.sort(key=lambda i: (changes[i]["ver"], i))
        for a, b in zip(members, members[1:]):
            if of[a] != of[b]:
                succ[of[a]].add(of[b])
    comp = _components(n, succ)
    ncomp = max(comp) + 1
    csucc: list[set[int]] = [set() for _ in range(ncomp)]
    indeg = [0] * ncomp
    for g in range(n):
        for h in succ[g]:
            a, b = comp[g], comp[h]
            if a != b and b not in csucc[a]:
                csucc[a].add(b)
                indeg[b] += 1
    members_of: list[list[int]] = [[] for _ in range(ncomp)]
    for i in range(len(changes)):
        members_of[comp[of[i]]].append(i)
    first = [min((changes[i]["ver"], i) for i in m) for m in members_of]
    ready = [(first[u], u) for u in range(ncomp) if indeg[u] == 0]
    heapq.heapify(ready)
    rank = _table_rank(table_order)
    out: list[list[int]] = []
    while ready:
        _, u = heapq.heappop(ready)
        out.append(sorted(members_of[u], key=lambda i: (rank(changes[i]["tbl"]), changes[i]["ver"], i)))
        for v in csucc[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, (first[v], v))
    return out


def _components(n: int, succ: Sequence[set[int]]) -> list[int]:
    """Strongly connected components of the graph (nodes 0..n-1, edges `succ`): a component number
    per node (Kosaraju, iterative)."""
    order: list[int] = []
    seen = [False] * n
    for s in range(n):
        if seen[s]:
            continue
        seen[s] = True
        stack = [(s, iter(succ[s]))]
        while stack:
            v, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                order.append(v)
            elif not seen[nxt]:
                seen[nxt] = True
                stack.append((nxt, iter(succ[nxt])))
    pred: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for w in succ[v]:
            pred[w].append(v)
    comp = [-1] * n
    c = 0
    for s in reversed(order):
        if comp[s] != -1:
            continue
        comp[s] = c
        todo = [s]
        while todo:
            v = todo.pop()
            for w in pred[v]:
                if comp[w] == -1:
                    comp[w] = c
                    todo.append(w)
        c += 1
    return comp


#: what a held change waits for: a queue id (``int``), or a change held in the same pass (``("new", index)``)
Ref = Any


def in_halves(
    n: int,
    together: Callable[[int, int], bool],
    one: Callable[[int], None],
    whole: bool = True,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Apply the units 0..n-1 in order, as few at a time as the database allows: a span [lo, hi)
    of two or more all at once (`together(lo, hi)`: True when it applied every one, False when it
    applied none), and when that fails, its first half, then its second, in the same way, down to
    single units (`one(i)`, which applies the unit or holds it). `whole`: try 0..n-1 at once first
    (False: the caller saw that fail already). One unit the database rejects among n costs about
    2·log2(n) attempts of shrinking spans instead of n attempts of one unit each.

    `stop` is asked before every attempt; once it says True nothing more is tried. Returns how
    many units were handled: always a prefix 0..k-1 (n when `stop` never said so), so the rest
    can go later, from unit k on, with the same outcome as one run."""
    done = 0

    class _Stopped(Exception):
        pass

    def span(lo: int, hi: int, first: bool) -> None:
        nonlocal done
        if stop is not None and stop():
            raise _Stopped
        if hi - lo == 1:
            one(lo)
            done = hi
            return
        if first and together(lo, hi):
            done = hi
            return
        mid = (lo + hi) // 2
        span(lo, mid, True)
        span(mid, hi, True)

    if n > 0:
        try:
            span(0, n, whole)
        except _Stopped:
            pass
    return done


def shortest_failing(n: int, fails: Callable[[int], bool]) -> int:
    """The length of the shortest prefix of n changes that fails, when all n fail together:
    `fails(k)` tries the first k (1 <= k < n). A prefix fails once it holds the change at fault,
    so the search halves: about log2(n) tries. The change at fault is the last of that prefix."""
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


class Holds:
    """What is held at a site, as the units are gone through in order: per row ``(tbl, rid)`` the
    change it waits behind (its earliest held change), per source transaction ``(origin, txn)``
    the change its held changes are held with. Starts from the queue's open rows (each with
    ``id``, ``tbl``, ``rid``, ``ver``, ``origin``, ``txn``, ``state``)."""

    def __init__(self, queued: Iterable[Mapping[str, Any]] = ()) -> None:
        self.rows: dict[tuple[str, str], tuple[str, Ref]] = {}
        self.txns: dict[tuple[str, str], Ref] = {}
        ordered = sorted(queued, key=lambda q: (q["state"] != "failed", q["ver"], q["id"]))
        for q in ordered:  # a transaction's held changes are held with its failed one, if any
            t = _txn_of(q)
            if t is not None:
                self.txns.setdefault(t, q["id"])
        for q in sorted(ordered, key=lambda q: (q["ver"], q["id"])):
            self.rows.setdefault((q["tbl"], q["rid"]), (q["ver"], q["id"]))

    def blocked(self, members: Sequence[Mapping[str, Any]]) -> tuple[int, str, Ref] | None:
        """Whether the unit `members` (in order) must stay held: (the position of its first member
        that waits, 'waiting' behind the row's held change or 'txn' with its transaction's held
        changes, what it waits for), None when it may be applied."""
        for pos, m in enumerate(members):
            row = self.rows.get((m["tbl"], m["rid"]))
            if row is not None:
                return pos, "waiting", row[1]
            t = _txn_of(m)
            if t is not None and t in self.txns:
                return pos, "txn", self.txns[t]
        return None

    def hold(self, members: Sequence[Mapping[str, Any]], refs: Sequence[Ref], head: int) -> None:
        """The unit `members` is held (`refs`: how each is named; `head`: the position of the one the
        others are held with): later changes of its rows wait behind it, and the rest of its
        transactions is held with it."""
        for m, r in zip(members, refs):
            self.rows.setdefault((m["tbl"], m["rid"]), (m["ver"], r))
            t = _txn_of(m)
            if t is not None:
                self.txns.setdefault(t, refs[head])


def plan_holds(
    changes: Sequence[Mapping[str, Any]], queued: Iterable[Mapping[str, Any]], table_order: Sequence[str] = ()
) -> list[tuple[int, str, Ref]]:
    """Which of the new `changes` must be held before anything is applied, because a change of the
    queue (`queued`, its open rows) holds them back: a unit (see :func:`units`) with a change of a
    row that has a held change, or of a transaction that has one, is held whole — that change
    ``waiting`` behind the row's held change (or ``txn``, held with its transaction), every other
    change of the unit ``txn``, held with it. Later units touching its rows are held behind it in
    turn. Returns (index, state, what it waits for) in the order to queue them: the head of a unit
    first; ``("new", i)`` names change i held in this plan."""
    holds = Holds(queued)
    out: list[tuple[int, str, Ref]] = []
    for unit in units(changes, table_order):
        members = [changes[i] for i in unit]
        b = holds.blocked(members)
        if b is None:
            continue
        pos, state, ref = b
        head = unit[pos]
        out.append((head, state, ref))
        out += [(i, "txn", ("new", head)) for i in unit if i != head]
        holds.hold(members, [("new", i) for i in unit], pos)
    return out


def retry_set(queued: Sequence[Mapping[str, Any]], start: int) -> list[int]:
    """The open queue rows (`queued`, each with ``id``) one retry of `start` takes: its source
    transaction's held changes, every later held change of their rows, and so on (their
    transactions, their rows) until nothing is added. Ids, ascending."""
    return closure(queued, [start])


def closure(queued: Sequence[Mapping[str, Any]], starts: Iterable[int], behind: bool = False) -> list[int]:
    """The open queue rows (`queued`, each with ``id``) that go with the changes `starts`: their
    source transactions' held changes, every held change of their rows at or after them (and,
    with `behind`, those of their rows that wait behind them, ``blocked_by``, whatever their
    versions), and so on until nothing is added. Ids, ascending.

    Each row's changes are taken as a suffix in version order, each transaction once: linear in
    the queue (a loop that read a row's later changes again for each one it took cost the square
    of a hot row's changes, docs/performance.md "Releasing held changes")."""
    by_id = {int(q["id"]): q for q in queued}
    groups: dict[Hashable, list[int]] = {}
    rows: dict[tuple[Any, Any], list[tuple[str, int]]] = {}
    waits: dict[int, list[int]] = {}
    for i, q in by_id.items():
        groups.setdefault(group_key(q, i), []).append(i)
        rows.setdefault((q["tbl"], q["rid"]), []).append((str(q["ver"]), i))
        if behind and q.get("blocked_by") is not None:
            waits.setdefault(int(q["blocked_by"]), []).append(i)
    for lst in rows.values():
        lst.sort()
    taken_from = {k: len(lst) for k, lst in rows.items()}  # each row's suffix taken so far
    seen_groups: set[Hashable] = set()
    got: set[int] = set()
    todo: list[int] = []

    def take(j: int) -> None:
        if j not in got:
            got.add(j)
            todo.append(j)

    for s in starts:
        if int(s) in by_id:
            take(int(s))
    while todo:
        i = todo.pop()
        q = by_id[i]
        g = group_key(q, i)
        if g not in seen_groups:
            seen_groups.add(g)
            for j in groups[g]:
                take(j)
        k = (q["tbl"], q["rid"])
        lst = rows[k]
        at = bisect.bisect_left(lst, (str(q["ver"]), -1))
        for _v, j in lst[at : taken_from[k]]:
            take(j)
        taken_from[k] = min(at, taken_from[k])
        for j in waits.get(i, ()):
            if (by_id[j]["tbl"], by_id[j]["rid"]) == k:
                take(j)
    return sorted(got)


def group_of(queued: Sequence[Mapping[str, Any]], id_: int) -> list[int]:
    """The open queue rows of the group of `id_` (its source transaction; itself alone when it has
    none): what `errors skip --id` drops. Ids, ascending."""
    by_id = {int(q["id"]): q for q in queued}
    if id_ not in by_id:
        return []
    key = group_key(by_id[id_], id_)
    return sorted(i for i, q in by_id.items() if group_key(q, i) == key)


def released_by(queued: Sequence[Mapping[str, Any]], skipped: Iterable[Mapping[str, Any]]) -> list[int]:
    """The open queue rows (`queued`) that were held behind the `skipped` changes: the later held
    changes of their rows, with what a retry of those takes (:func:`retry_set`). Ids, ascending."""
    out: set[int] = set()
    for s in skipped:
        for q in queued:
            if (q["tbl"], q["rid"]) == (s["tbl"], s["rid"]) and q["ver"] >= s["ver"] and int(q["id"]) not in out:
                out |= set(retry_set(queued, int(q["id"])))
    return sorted(out)
