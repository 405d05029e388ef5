"""The pure decisions of foreign keys between replicated tables (multimaster.core.references),
property-tested against small reference models."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multimaster.core.references import RefChange, fk_order, orphan_action, waiting
from multimaster.core.versions import make_ver

TABLES = ["t0", "t1", "t2", "t3", "t4", "t5"]


@st.composite
def acyclic(draw):  # type: ignore[no-untyped-def]
    """Tables in some given order and parents drawn from a hidden topological order (self-references allowed)."""
    hidden = draw(st.permutations(TABLES))
    given_order = draw(st.permutations(TABLES))
    parents = {}
    for i, t in enumerate(hidden):
        earlier = hidden[: i + 1]  # itself: a self-reference
        parents[t] = draw(st.lists(st.sampled_from(earlier), max_size=3))
    return list(given_order), parents


@given(acyclic())
def test_fk_order_puts_every_parent_first_and_keeps_every_table(case):  # type: ignore[no-untyped-def]
    tables, parents = case
    out = fk_order(tables, parents)
    assert sorted(out) == sorted(tables)
    pos = {t: i for i, t in enumerate(out)}
    for t, ps in parents.items():
        for p in ps:
            assert p == t or pos[p] < pos[t]


@given(st.permutations(TABLES), st.dictionaries(st.sampled_from(TABLES), st.lists(st.sampled_from(TABLES), max_size=3)))
def test_fk_order_of_any_graph_is_a_permutation(tables, parents):  # type: ignore[no-untyped-def]
    """Cycles included: every table exactly once; without any reference, the given order."""
    out = fk_order(list(tables), parents)
    assert sorted(out) == sorted(tables)
    assert fk_order(list(tables), {}) == list(tables)


SITES = ["a", "b", "c"]


@st.composite
def batch(draw):  # type: ignore[no-untyped-def]
    """A batch of changes of table t (version order) whose references point to identities of p
    (known here or not) or of t (inserted by the batch, or not)."""
    n = draw(st.integers(0, 12))
    hlcs = sorted(draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n, unique=True)))
    changes = []
    parent_ids = [f"p{i}" for i in range(4)]
    own: list[str] = []
    for h in hlcs:
        origin = draw(st.sampled_from(SITES))
        ver = make_ver(h, origin)
        op = draw(st.sampled_from("IUD"))
        rid = ver if op == "I" else draw(st.sampled_from(own + ["old1", "old2"]))
        pool = [("p", x) for x in parent_ids] + [("t", x) for x in own + ["t-missing"]]
        refs = tuple(draw(st.lists(st.sampled_from(pool), max_size=2))) if op != "D" else ()
        changes.append(RefChange(ver, origin, rid, op, refs))
        if op == "I":
            own.append(rid)
    known = {"p": set(draw(st.lists(st.sampled_from(parent_ids), max_size=4)))}
    return changes, known


def model_waiting(changes, known):  # type: ignore[no-untyped-def]
    """Apply changes one by one; a change waits when a reference names an identity neither known
    nor inserted (and applied) earlier; after a wait, its origin stops."""
    applied_ins: set[str] = set()
    stopped: set[str] = set()
    out = set()
    for ch in changes:
        if ch.origin in stopped:
            out.add(ch.ver)
            continue
        ok = all(rid in known.get(p, set()) or (p == "t" and rid in applied_ins) for p, rid in ch.refs)
        if not ok:
            out.add(ch.ver)
            stopped.add(ch.origin)
        elif ch.op == "I":
            applied_ins.add(ch.rid)
    return out


@given(batch())
def test_waiting_matches_the_model(case):  # type: ignore[no-untyped-def]
    changes, known = case
    assert waiting("t", changes, known) == model_waiting(changes, known)


@given(batch())
def test_waiting_holds_back_the_rest_of_an_origin_and_applied_references_resolve(case):  # type: ignore[no-untyped-def]
    changes, known = case
    w = waiting("t", changes, known)
    first = {}
    for ch in changes:
        if ch.ver in w:
            first.setdefault(ch.origin, ch.ver)
    inserted = {ch.rid for ch in changes if ch.op == "I" and ch.ver not in w}
    for ch in changes:
        # every later change of an origin that waits, waits
        if ch.origin in first and ch.ver >= first[ch.origin]:
            assert ch.ver in w
        # every applied change references only identities held once the batch is applied
        if ch.ver not in w:
            assert all(rid in known.get(p, set()) or (p == "t" and rid in inserted) for p, rid in ch.refs)


def test_orphan_actions() -> None:
    assert orphan_action("SET NULL") == "null"
    assert orphan_action("set  default") == "default"
    for a in ("CASCADE", "RESTRICT", "NO ACTION", ""):
        assert orphan_action(a) == "delete"
