"""Re-resolving logged conflicts with another rule (`multimaster conflicts --re-resolve`,
docs/conflicts.md "Re-resolving logged conflicts"): what a different policy would have decided for
each conflict of the log, and whether the row still holds what the logged rule decided.

A conflict of a slot (a column or a column group, kinds ``update_update`` and ``insert_insert``) is
recorded by every site that saw the two versions meet, each from its side (local, remote); three
sites changing a slot concurrently leave several records of it. So records are grouped per slot
of a row, ``(table, rid, slot)``. Each version the records name carried values for the slot; one
that a later version of the same origin follows is *superseded* (a site's writes of a slot are in
order, and each saw the one before it or what overwrote it: docs/conflicts.md "Concurrent
heads"), so it is no candidate any more. The *candidates* are the others. The logged outcome is
what each site's latest record of the slot says won, once superseded versions are set aside: a
version that lost an early meeting can win a later one, after its rival was written over. The
new outcome is the candidate the new policy picks (built-in policies pick by a total order, so
the order they are asked in does not matter). Records of other kinds
(a delete wins, UNIQUE, orphans: no column policy decides them) and merges (``additive``: the
merged value is not a candidate, and the value both changes started from is not logged) are not
re-resolved, and say why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

from multimaster.core.policies import Candidate, Conflict, Policy, make_policy
from multimaster.core.values import ColumnType, same

__all__ = ["SLOT_KINDS", "parse_policy", "Outcome", "re_resolve", "as_logged", "same_values", "superseded"]

#: the kinds of conflict a column policy decides (docs/conflicts.md "The conflict log")
SLOT_KINDS = ("update_update", "insert_insert")


def parse_policy(text: str) -> Policy:
    """The policy `--policy` names: ``latest``, ``earliest``, ``maximum``, ``minimum``,
    ``priority:s1,s2,...``, ``custom:pkg.mod.fn``. ``additive`` is refused (ValueError): adding
    both deltas needs the value both changes started from, which the conflict log does not hold."""
    t = text.strip()
    if t == "additive":
        raise ValueError(
            "--policy additive: adding both changes' deltas needs the value both started from, which the conflict "
            "log does not record; re-resolve to latest, earliest, maximum, minimum, priority:... or custom:..."
        )
    if t.startswith("priority:"):
        sites = [s.strip() for s in t[len("priority:") :].split(",") if s.strip()]
        if not sites:
            raise ValueError("--policy priority: name the sites, first wins: priority:s1,s2")
        return make_policy(SimpleNamespace(priority=sites, custom=None))
    if t.startswith("custom:"):
        return make_policy(SimpleNamespace(priority=None, custom=t[len("custom:") :]))
    try:
        return make_policy(t)
    except ValueError:
        raise ValueError(
            f"--policy: unknown policy {text!r} (latest, earliest, maximum, minimum, priority:s1,s2, custom:pkg.mod.fn)"
        ) from None


@dataclass
class Outcome:
    """One slot of a row, re-resolved. `status`: ``same`` (the new rule picks the logged winner),
    ``change`` (it picks another: `new`), ``skip`` (`why`: it cannot be re-resolved)."""

    table: str
    rid: str
    key: Any
    slot: str | None
    columns: tuple[str, ...]
    records: list[tuple[str, int]]  # (site, id) of the conflict-log rows
    candidates: list[Candidate] = field(default_factory=list)
    #: versions the records name that a later version of the same origin followed (no candidates)
    superseded: list[Candidate] = field(default_factory=list)
    logged_policy: str = ""
    logged: Candidate | None = None
    new: Candidate | None = None
    status: str = "skip"
    why: str = ""
    detected_at: str = ""


def as_logged(row: Mapping[str, Any], site: str) -> dict[str, Any]:
    """A conflict-log row (as ops.status.describe gives it, values decoded) in the shape
    :func:`re_resolve` reads: site, id, detected_at, tbl, rid, key, kind, slot, columns, local_ver,
    local_values, remote_ver, remote_values, policy, decision, heads (None: not recorded)."""
    out = {k: row.get(k) for k in ("id", "detected_at", "tbl", "rid", "key", "kind", "slot", "local_ver", "remote_ver")}
    out.update(site=site, policy=row.get("policy") or "", decision=row.get("decision") or "")
    for k in ("columns", "local_values", "remote_values", "heads"):
        v = row.get(k)
        out[k] = json.loads(v) if isinstance(v, str) else v
    return out


def re_resolve(records: Iterable[Mapping[str, Any]], policy: Policy) -> list[Outcome]:
    """Every slot conflict of `records` (see :func:`as_logged`), grouped per (table, rid, slot),
    re-resolved with `policy`; other kinds come back as ``skip``, one outcome per record. In the
    order of each group's earliest detection."""
    groups: dict[tuple[str, str, str | None], list[Mapping[str, Any]]] = {}
    out: list[Outcome] = []
    for r in records:
        if r["kind"] not in SLOT_KINDS:
            o = Outcome(str(r["tbl"]), str(r["rid"]), r.get("key"), r.get("slot"), tuple(r.get("columns") or ()), [])
            o.records = [(str(r["site"]), int(r["id"]))]
            o.logged_policy, o.detected_at = str(r["policy"]), str(r.get("detected_at") or "")
            o.why = f"a {r['kind']} conflict is not decided by a column policy"
            out.append(o)
            continue
        groups.setdefault((str(r["tbl"]), str(r["rid"]), r.get("slot")), []).append(r)
    for (tb, rid, slot), rs in groups.items():
        out.append(_group(tb, rid, slot, rs, policy))
    out.sort(key=lambda o: (o.detected_at, o.table, o.rid, o.slot or ""))
    return out


def _group(table: str, rid: str, slot: str | None, rs: Sequence[Mapping[str, Any]], policy: Policy) -> Outcome:
    """One slot of a row and every record of it."""
    rs = sorted(rs, key=lambda r: (str(r.get("detected_at") or ""), str(r["site"]), int(r["id"])))
    last = rs[-1]
    o = Outcome(table, rid, last.get("key"), slot, tuple(last.get("columns") or ()), [(str(r["site"]), int(r["id"])) for r in rs])
    o.detected_at = str(rs[0].get("detected_at") or "")
    o.logged_policy = ",".join(sorted({str(r["policy"]) for r in rs}))
    cands: dict[str, Candidate] = {}
    latest: dict[str, Mapping[str, Any]] = {}  # site -> its latest record of the slot
    for r in rs:
        for side in ("local", "remote"):
            ver = r.get(f"{side}_ver")
            if ver:
                cands.setdefault(str(ver), Candidate(dict(r.get(f"{side}_values") or {}), str(ver), str(ver)[20:]))
        for ver, vals in (r.get("heads") or {}).items():
            cands.setdefault(str(ver), Candidate(dict(vals or {}), str(ver), str(ver)[20:]))
        if r["decision"] == "merged":
            o.candidates = sorted(cands.values(), key=lambda c: c.ver)
            o.why = "the logged rule merged both changes (additive): the merged value is not a candidate"
            return o
        site = str(r["site"])
        if site not in latest or int(r["id"]) > int(latest[site]["id"]):
            latest[site] = r
    every = sorted(cands.values(), key=lambda c: c.ver)
    gone = superseded(every) | _left_behind(rs, latest)
    if latest and all(r.get("heads") for r in latest.values()):  # the heads each site chose among last
        last_heads = {str(v) for r in latest.values() for v in r["heads"]}
        gone |= {c.ver for c in every if c.ver not in last_heads}
    o.candidates = [c for c in every if c.ver not in gone]
    o.superseded = [c for c in every if c.ver in gone]
    wins = (r.get(f"{r['decision']}_ver") for r in latest.values() if r["decision"] in ("local", "remote"))
    ends = sorted({str(w) for w in wins if w and str(w) not in gone})
    if len(ends) != 1:
        o.why = (
            f"the sites' latest records of this slot name {len(ends)} winners, not one (the sites decided it "
            "differently, or a later write at another site went over some of these versions)"
            if ends
            else "every winner the records name was written over later at its own site"
        )
        return o
    o.logged = cands[ends[0]]
    won = o.candidates[0]
    for c in o.candidates[1:]:  # built-in policies pick by a total order: any order gives the same
        won = policy.resolve(Conflict(table, o.key, rid, o.columns, won, c))
    o.new = won
    o.status = "same" if won.ver == o.logged.ver else "change"
    return o


def _left_behind(rs: Sequence[Mapping[str, Any]], latest: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Versions a site held as heads of the slot at one of its records and no longer at its latest:
    a later write went over them (heads leave only so)."""
    out: set[str] = set()
    for r in rs:
        last = latest[str(r["site"])]
        if r.get("heads") and last.get("heads") and r is not last:
            out |= {str(v) for v in r["heads"]} - {str(v) for v in last["heads"]}
    return out


def superseded(cands: Sequence[Candidate]) -> set[str]:
    """The versions of `cands` that a later candidate of the same origin follows: a site writes a
    slot in order, and each write saw the one before it (or what overwrote it), so the earlier one
    is no head of the slot any more, whatever the policy."""
    last: dict[str, str] = {}
    for c in cands:
        last[c.origin] = max(last.get(c.origin, ""), c.ver)
    return {c.ver for c in cands if c.ver < last[c.origin]}


def same_values(current: Mapping[str, Any], logged: Mapping[str, Any], types: Mapping[str, ColumnType] | None = None) -> bool:
    """Whether the row's `current` values (as the database gives them) are the `logged` values of a
    slot (as the conflict log holds them: bytes as {"$hex": ...}, other values JSON does not carry
    as text), column by column, each compared as its type in `types` says (core/values.py: the
    same decimal read as 1.5 from SQLite and logged as "1.50" at PostgreSQL is the same value)."""
    ts = types or {}
    for col, want in logged.items():
        got = current.get(col)
        t = ts.get(col)
        if isinstance(want, Mapping) and set(want) == {"$hex"} and (t is None or t.kind in (None, "any")):
            t = ColumnType("bytes")
        if not same(got, want, t):
            return False
    return True
