"""Conflict policies: pure functions deciding between two versions of a column or column group.

A conflict happens when an incoming update's *old* values of a slot (a column, or a group of columns
that must win together) differ from the values this site holds: the two sites changed the same data
concurrently. The slot's policy then picks the result. Every built-in policy gives the same result
whatever order a site receives the changes in:

- ``latest`` / ``earliest``: the higher / lower version (timestamp, then site name) wins;
- ``priority``: the version from the site listed first wins (ties: latest);
- ``maximum`` / ``minimum``: the larger / smaller value wins (ties and NULLs: latest);
- ``additive``: both deltas are kept: ``local + (new - old)``;
- custom: a dotted path to a callable ``f(conflict: Conflict) -> Candidate`` returning one of
  ``conflict.local`` / ``conflict.remote``. It must be a function of the two candidates only, not of
  which one arrived first: :func:`check_resolver` tests that.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass
from typing import Any, Callable

from multimaster.errors import ResolverError

__all__ = ["Candidate", "Conflict", "Policy", "make_policy", "check_resolver", "load_resolver"]


@dataclass(frozen=True)
class Candidate:
    """One competing version of a slot: its values (column -> value), version and origin site."""

    values: dict[str, Any]
    ver: str
    origin: str

    @property
    def timestamp(self) -> int:
        return int(self.ver[:19])


@dataclass(frozen=True)
class Conflict:
    """What a custom resolver receives."""

    table: str
    key: Any
    rid: str
    columns: tuple[str, ...]
    local: Candidate
    remote: Candidate


def _latest(a: Candidate, b: Candidate) -> Candidate:
    return a if a.ver >= b.ver else b


def _earliest(a: Candidate, b: Candidate) -> Candidate:
    return a if a.ver <= b.ver else b


def _by_value(pick_max: bool) -> Callable[[Candidate, Candidate], Candidate]:
    def resolve(a: Candidate, b: Candidate) -> Candidate:
        va, vb = tuple(a.values.values()), tuple(b.values.values())
        if None in va or None in vb or va == vb:
            if None in va and None not in vb:
                return b
            if None in vb and None not in va:
                return a
            return _latest(a, b)
        try:
            bigger = a if va > vb else b
        except TypeError:
            return _latest(a, b)
        smaller = b if bigger is a else a
        return bigger if pick_max else smaller

    return resolve


def _priority(order: list[str]) -> Callable[[Candidate, Candidate], Candidate]:
    rank = {s: i for i, s in enumerate(order)}

    def resolve(a: Candidate, b: Candidate) -> Candidate:
        ra, rb = rank.get(a.origin, len(order)), rank.get(b.origin, len(order))
        if ra != rb:
            return a if ra < rb else b
        return _latest(a, b)

    return resolve


def load_resolver(path: str) -> Callable[[Conflict], Candidate]:
    mod_name, _, attr = path.replace(":", ".").rpartition(".")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - the message names the cause
        raise ResolverError(path, f"cannot import module '{mod_name}': {e}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ResolverError(path, f"module '{mod_name}' has no callable '{attr}'")
    return fn


@dataclass(frozen=True)
class Policy:
    """A slot's policy. `kind` is latest|earliest|maximum|minimum|additive|priority|custom."""

    kind: str
    name: str
    pick: Callable[[Candidate, Candidate], Candidate] | None = None
    custom: Callable[[Conflict], Candidate] | None = None

    @property
    def is_additive(self) -> bool:
        return self.kind == "additive"

    @property
    def chooses(self) -> bool:
        """Whether the policy picks among a slot's concurrent heads by its own order (earliest,
        maximum, minimum, priority, custom): the heads must then be kept (docs/conflicts.md
        "Concurrent heads"). `latest` (the greatest version) and `additive` (deltas) need no heads."""
        return self.kind not in ("latest", "additive")

    def resolve(self, conflict: Conflict) -> Candidate:
        if self.custom is not None:
            won = self.custom(conflict)
            if won is not conflict.local and won is not conflict.remote:
                if won == conflict.local:
                    return conflict.local
                if won == conflict.remote:
                    return conflict.remote
                raise ResolverError(self.name, "must return conflict.local or conflict.remote")
            return won
        assert self.pick is not None
        return self.pick(conflict.local, conflict.remote)


def make_policy(spec: Any) -> Policy:
    """A policy from its configuration: a name ('latest', 'additive', ...), or an object with a
    `priority` list of sites, or one with a `custom` resolver path (the topology's models, or any
    object with that attribute: the core does not import the configuration layer)."""
    priority = getattr(spec, "priority", None)
    if priority is not None:
        return Policy("priority", "priority:" + ",".join(priority), _priority(list(priority)))
    custom = getattr(spec, "custom", None)
    if custom is not None:
        return Policy("custom", custom, custom=load_resolver(custom))
    if spec == "latest":
        return Policy("latest", "latest", _latest)
    if spec == "earliest":
        return Policy("earliest", "earliest", _earliest)
    if spec == "maximum":
        return Policy("maximum", "maximum", _by_value(True))
    if spec == "minimum":
        return Policy("minimum", "minimum", _by_value(False))
    if spec == "additive":
        return Policy("additive", "additive")
    raise ValueError(f"unknown policy {spec!r}")


def check_resolver(
    resolver: Callable[[Conflict], Candidate] | str, samples: list[tuple[Any, Any]] | None = None, column: str = "value"
) -> list[str]:
    """Check that a custom resolver does not depend on arrival order.

    For every pair of sample values (and every pair of versions/origins) it asks the resolver with
    the candidates as (local, remote) and swapped (the value under the name `column`); the winner's version must be the same both ways,
    and a deterministic result must come back on a repeated call. Returns the list of violations
    (empty when the resolver is order-independent on the samples).
    """
    fn = load_resolver(resolver) if isinstance(resolver, str) else resolver
    samples = samples or [(1, 2), (2, 1), (None, 5), ("a", "b"), (3, 3)]
    vers = [("0000001700000000000:s1", "s1"), ("0000001700000000001:s2", "s2"), ("0000001700000000001:s3", "s3")]
    problems = []
    for (va, vb), ((ver_a, oa), (ver_b, ob)) in itertools.product(samples, itertools.permutations(vers, 2)):
        a = Candidate({column: va}, ver_a, oa)
        b = Candidate({column: vb}, ver_b, ob)
        w1 = fn(Conflict("t", 1, "r", (column,), a, b))
        w2 = fn(Conflict("t", 1, "r", (column,), b, a))
        if w1 not in (a, b) or w2 not in (a, b):
            problems.append(f"values {va!r}/{vb!r}: the resolver did not return one of the two candidates")
        elif w1.ver != w2.ver:
            problems.append(
                f"values {va!r} ({oa}) vs {vb!r} ({ob}): winner depends on which one arrived first "
                f"({w1.origin} when {oa} was local, {w2.origin} when {ob} was local)"
            )
    return problems
