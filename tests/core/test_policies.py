"""Conflict policies on their own: each built-in policy's resolve function, make_policy on every
spec form, check_resolver, and the additive arithmetic (which lives in the planner's merge)."""

from __future__ import annotations

import itertools
from typing import Any

import model as m
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multimaster.config.topology import CustomPolicy, PriorityPolicy
from multimaster.core import planner, policies
from multimaster.errors import ResolverError

Candidate, Conflict = policies.Candidate, policies.Conflict
SITES = ["s1", "s2", "s3", "s4"]


def conflict(local: Candidate, remote: Candidate, columns: tuple[str, ...] = ("v",)) -> Conflict:
    return Conflict("t", 1, "r", columns, local, remote)


def resolve(p: policies.Policy, a: Candidate, b: Candidate) -> Candidate:
    """The winner with `a` held here and `b` arriving; it must be one of the two objects."""
    won = p.resolve(conflict(a, b, tuple(a.values)))
    assert won is a or won is b
    return won


# candidates of one slot: values of one or two columns (ints or NULL) and distinct versions
values_st = st.one_of(st.none(), st.integers(-3, 3))


@st.composite
def candidates(draw: Any, n: int, width: int = 1) -> list[Candidate]:
    hlcs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    origins = draw(st.lists(st.sampled_from(SITES), min_size=n, max_size=n))
    vers = {m.ver(h, o) for h, o in zip(hlcs, origins)}
    if len(vers) < n:  # two changes never share a version
        hlcs = list(range(1, n + 1))
    out = []
    for h, o in zip(hlcs, origins):
        vals = draw(st.lists(values_st, min_size=width, max_size=width))
        out.append(Candidate(dict(zip(("v", "w"), vals)), m.ver(h, o), o))
    return out


PICKS = {
    "latest": "latest",
    "earliest": "earliest",
    "maximum": "maximum",
    "minimum": "minimum",
    "priority": PriorityPolicy(priority=["s3", "s1"]),
}


def model_policy(name: str) -> Any:
    return ("priority", ("s3", "s1")) if name == "priority" else name


def model_pick(name: str, cands: list[Candidate]) -> Candidate:
    """The reference model's choice among candidates (tests/core/model.py, written apart)."""
    writes = [m.Write(tuple(c.values.values()), c.ver, c.origin, frozenset()) for c in cands]
    won = m.pick(model_policy(name), writes)
    return cands[writes.index(won)]


@pytest.mark.parametrize("name", list(PICKS))
@settings(max_examples=120, deadline=None)
@given(data=st.data(), width=st.sampled_from([1, 2]))
def test_pick_policies_are_commutative_associative_and_match_the_model(name: str, data: Any, width: int) -> None:
    p = policies.make_policy(PICKS[name])
    a, b, c = data.draw(candidates(3, width))
    assert resolve(p, a, b) is resolve(p, b, a), "the winner depends on which one arrived first"
    assert resolve(p, resolve(p, a, b), c) is resolve(p, a, resolve(p, b, c)), "not associative"
    for order in itertools.permutations((a, b, c)):  # any arrival order picks the model's winner
        won = order[0]
        for x in order[1:]:
            won = resolve(p, won, x)
        assert won is model_pick(name, [a, b, c])


def cand(v: Any, hlc: int, origin: str) -> Candidate:
    return Candidate({"v": v}, m.ver(hlc, origin), origin)


def test_latest_and_earliest_by_version_ties_by_site_name() -> None:
    latest, earliest = policies.make_policy("latest"), policies.make_policy("earliest")
    old, new = cand(9, 5, "s2"), cand(1, 6, "s1")
    assert resolve(latest, old, new) is new and resolve(latest, new, old) is new
    assert resolve(earliest, old, new) is old and resolve(earliest, new, old) is old
    s1, s2 = cand(1, 7, "s1"), cand(2, 7, "s2")  # the same timestamp: the site name decides
    assert resolve(latest, s1, s2) is s2 and resolve(earliest, s2, s1) is s1


def test_maximum_and_minimum_null_loses_ties_latest() -> None:
    mx, mn = policies.make_policy("maximum"), policies.make_policy("minimum")
    small, big = cand(1, 9, "s1"), cand(5, 2, "s2")
    assert resolve(mx, small, big) is big and resolve(mn, big, small) is small
    null = cand(None, 99, "s3")
    for p in (mx, mn):
        assert resolve(p, null, small) is small and resolve(p, small, null) is small
    tie_old, tie_new = cand(3, 1, "s1"), cand(3, 2, "s1")
    assert resolve(mx, tie_new, tie_old) is tie_new and resolve(mn, tie_old, tie_new) is tie_new
    both_null = cand(None, 100, "s1")
    assert resolve(mx, null, both_null) is both_null
    # a group: compared as a tuple; a NULL anywhere loses
    g1 = Candidate({"v": 1, "w": 9}, m.ver(1, "s1"), "s1")
    g2 = Candidate({"v": 2, "w": 0}, m.ver(2, "s2"), "s2")
    g3 = Candidate({"v": 9, "w": None}, m.ver(3, "s3"), "s3")
    assert resolve(mx, g1, g2) is g2 and resolve(mn, g2, g1) is g1
    assert resolve(mx, g3, g1) is g1 and resolve(mn, g1, g3) is g1


def test_maximum_of_values_that_do_not_compare_falls_back_to_latest() -> None:
    a, b = cand("x", 1, "s1"), cand(2, 2, "s2")
    assert resolve(policies.make_policy("maximum"), a, b) is b
    assert resolve(policies.make_policy("minimum"), b, a) is b


def test_priority_listed_first_wins_unlisted_last_ties_latest() -> None:
    p = policies.make_policy(PriorityPolicy(priority=["s3", "s1"]))
    s1, s3, s2, s4 = cand(0, 9, "s1"), cand(0, 1, "s3"), cand(0, 50, "s2"), cand(0, 60, "s4")
    assert resolve(p, s1, s3) is s3 and resolve(p, s3, s1) is s3
    assert resolve(p, s2, s1) is s1  # not listed: after every listed site
    assert resolve(p, s2, s4) is s4 and resolve(p, s4, s2) is s4  # both unlisted: latest
    again = cand(1, 10, "s1")
    assert resolve(p, s1, again) is again  # the same site: latest


# ---- make_policy ------------------------------------------------------------------------------


def prefer_higher(c: Conflict) -> Candidate:
    a, b = c.local, c.remote
    (va,), (vb,) = a.values.values(), b.values.values()
    if va is not None and vb is not None and va != vb:
        return a if va > vb else b
    return a if a.ver > b.ver else b


def prefer_local(c: Conflict) -> Candidate:
    return c.local


def copy_of_latest(c: Conflict) -> Candidate:
    won = c.local if c.local.ver > c.remote.ver else c.remote
    return Candidate(dict(won.values), won.ver, won.origin)


def returns_nonsense(c: Conflict) -> Any:
    return "remote"


def here(fn: Any) -> str:
    return f"{fn.__module__}.{fn.__name__}"


@pytest.mark.parametrize(
    "spec, kind, name",
    [
        ("latest", "latest", "latest"),
        ("earliest", "earliest", "earliest"),
        ("maximum", "maximum", "maximum"),
        ("minimum", "minimum", "minimum"),
        ("additive", "additive", "additive"),
        (PriorityPolicy(priority=["s2", "s1"]), "priority", "priority:s2,s1"),
    ],
)
def test_make_policy_builtin_forms(spec: Any, kind: str, name: str) -> None:
    p = policies.make_policy(spec)
    assert (p.kind, p.name, p.is_additive) == (kind, name, kind == "additive")
    assert p.custom is None
    assert (p.pick is None) == (kind == "additive")


def test_make_policy_custom_by_dotted_and_colon_path() -> None:
    for path in (here(prefer_higher), f"{prefer_higher.__module__}:{prefer_higher.__name__}"):
        p = policies.make_policy(CustomPolicy(custom=path))
        assert (p.kind, p.name, p.custom) == ("custom", path, prefer_higher)
        a, b = cand(1, 5, "s1"), cand(2, 1, "s2")
        assert resolve(p, a, b) is b and resolve(p, b, a) is b


def test_custom_resolver_returning_an_equal_copy_or_nonsense() -> None:
    a, b = cand(1, 5, "s1"), cand(2, 1, "s2")
    p = policies.make_policy(CustomPolicy(custom=here(copy_of_latest)))
    assert p.resolve(conflict(a, b)) is a and p.resolve(conflict(b, a)) is a  # an equal copy is mapped back
    bad = policies.make_policy(CustomPolicy(custom=here(returns_nonsense)))
    with pytest.raises(ResolverError, match="must return conflict.local or conflict.remote"):
        bad.resolve(conflict(a, b))


@pytest.mark.parametrize(
    "path, message",
    [
        ("no_such_module_xyz.fn", "cannot import module 'no_such_module_xyz'"),
        ("os.path.no_such_function", "has no callable 'no_such_function'"),
        ("os.sep", "has no callable 'sep'"),
    ],
)
def test_make_policy_custom_that_cannot_load(path: str, message: str) -> None:
    with pytest.raises(ResolverError, match=message):
        policies.make_policy(CustomPolicy(custom=path))


@pytest.mark.parametrize("spec", ["newest", "", None, 3, {"priority": ["s1"]}])
def test_make_policy_unknown(spec: Any) -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        policies.make_policy(spec)


def test_candidate_timestamp() -> None:
    assert cand(0, 123 << 16, "s1").timestamp == 123 << 16


# ---- check_resolver ---------------------------------------------------------------------------


def test_check_resolver_accepts_an_order_independent_resolver() -> None:
    assert policies.check_resolver(prefer_higher) == []
    assert policies.check_resolver(here(prefer_higher), [(1, 2), (None, 3), (4, 4)], column="v") == []
    # the built-in policies pass too
    for spec in ("latest", "earliest", "maximum", "minimum", PriorityPolicy(priority=["s2"])):
        p = policies.make_policy(spec)
        assert policies.check_resolver(p.resolve, column="v") == [], spec


def test_check_resolver_reports_a_resolver_that_prefers_this_site() -> None:
    problems = policies.check_resolver(prefer_local, [(1, 2)])
    assert len(problems) == 6  # one value pair, every ordered pair of the 3 sample versions
    assert all("winner depends on which one arrived first" in p for p in problems)
    assert "values 1 (s1) vs 2 (s2)" in problems[0]


def test_check_resolver_reports_a_resolver_returning_something_else() -> None:
    problems = policies.check_resolver(returns_nonsense, [(1, 2)])
    assert problems and all("did not return one of the two candidates" in p for p in problems)


def test_check_resolver_passes_the_column_name() -> None:
    asked: list[tuple[str, ...]] = []

    def spy(c: Conflict) -> Candidate:
        asked.append(c.columns)
        assert set(c.local.values) == set(c.remote.values) == {"note"}
        return c.local if c.local.ver > c.remote.ver else c.remote

    assert policies.check_resolver(spy, [("a", "b")], column="note") == []
    assert asked and set(asked) == {("note",)}


def test_check_resolver_on_a_path_that_cannot_load() -> None:
    with pytest.raises(ResolverError):
        policies.check_resolver("no_such_module_xyz.fn")


# ---- additive: local + (new - old), in the planner's merge ------------------------------------

ADD = planner.TableSpec("t", "id", True, ("n",), (planner.Slot("n", (0,), policies.make_policy("additive")),))
RID = m.base_rid(1)


def apply(start: Any, updates: list[tuple[Any, Any, str]]) -> tuple[Any, planner.Plan]:
    """Apply updates (old, new, version) to a row holding `start`, one plan each; the value and the
    last plan."""
    st_ = planner.RowState(RID, 1, None, {"n": None}, [start])
    p = None
    for old, new, ver in updates:
        p = planner.plan(ADD, [planner.Change(ver, ver[20:], "U", RID, 1, 1, (new,), (old,))], {RID: st_})
        st_ = p.rows[RID]
        st_ = planner.RowState(RID, 1, st_.deleted, dict(st_.versions), list(st_.values))
    assert p is not None
    return st_.values[0], p


@settings(max_examples=200, deadline=None)
@given(start=st.integers(-50, 50), deltas=st.lists(st.integers(-5, 5).filter(bool), min_size=1, max_size=6), data=st.data())
def test_additive_keeps_every_delta_in_any_order(start: int, deltas: list[int], data: Any) -> None:
    """Concurrent updates each made from `start`: the result is start + every delta, whatever the order."""
    updates = [(start, start + d, m.ver(10 + i, SITES[i % 4])) for i, d in enumerate(deltas)]
    order = data.draw(st.permutations(updates))
    value, _ = apply(start, order)
    assert value == start + sum(deltas)


def test_additive_records_a_merge_only_when_concurrent() -> None:
    value, p = apply(10, [(10, 9, m.ver(5, "s1"))])
    assert value == 9 and p.conflicts == []
    value, p = apply(10, [(10, 9, m.ver(5, "s1")), (10, 8, m.ver(6, "s2"))])
    assert value == 7
    assert [(c.kind, c.policy, c.decision, c.local_values, c.remote_values) for c in p.conflicts] == [
        ("update_update", "additive", "merged", {"n": 9}, {"n": 8})
    ]


def test_additive_without_concurrency_takes_the_new_value_exactly() -> None:
    assert 0.2 + (0.9 - 0.2) != 0.9
    value, _ = apply(0.2, [(0.2, 0.9, m.ver(5, "s1"))])
    assert value == 0.9  # not 0.2 + (0.9 - 0.2)
    value, _ = apply(0.2, [(0.2, 0.9, m.ver(5, "s1")), (0.2, 0.1, m.ver(6, "s2"))])
    assert value == pytest.approx(0.8)


def test_additive_with_null_takes_the_newer_version() -> None:
    assert apply(None, [(5, 7, m.ver(5, "s1"))])[0] == 7  # newer than the row's insert
    assert apply(3, [(5, None, m.ver(5, "s1"))])[0] is None
    # older than what the row holds: the row's value stays
    st_ = planner.RowState(RID, 1, None, {"n": m.ver(9, "s2")}, [None])
    p = planner.plan(ADD, [planner.Change(m.ver(5, "s1"), "s1", "U", RID, 1, 1, (7,), (5,))], {RID: st_})
    assert p.rows[RID].values == [None] and p.rows[RID].versions["n"] == m.ver(9, "s2")


def test_additive_version_is_the_highest_seen() -> None:
    value, p = apply(10, [(10, 12, m.ver(9, "s2")), (10, 11, m.ver(5, "s1"))])
    assert value == 13 and p.rows[RID].versions["n"] == m.ver(9, "s2")
