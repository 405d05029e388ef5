"""`multimaster conflicts --re-resolve --policy P [--apply]` (docs/conflicts.md "Re-resolving
logged conflicts"): what another rule would have decided for each logged conflict of a slot
(core/reresolve.py decides), and with `apply`, that outcome made the row's: the new winning values
written at one site as an ordinary local update, captured there with a fresh version and
replicated to every site like any update — only where the row still holds what the logged rule
decided (a row changed since is left alone and reported). The conflict logs are read as
`conflicts` reads them (a site reached through its agent, by its agent); `apply` writes, so a site
it would write at must be reached through its database (AgentOnly, before anything is written)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import DBAPIError

from multimaster.config.secrets import redact
from multimaster.config.topology import Topology, hidden_url
from multimaster.core.policies import Candidate
from multimaster.core.reresolve import SLOT_KINDS, Outcome, as_logged, parse_policy, re_resolve, same_values
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.remote import AgentSite
from multimaster.engine.schema import value_types
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly, ConfigError, MultimasterError, ResolverError
from multimaster.ops.status import conflicts

__all__ = ["re_resolve_conflicts"]


def re_resolve_conflicts(
    topo: Topology | Cluster,
    policy: str,
    *,
    site: str | None = None,
    table: str | None = None,
    since: str | None = None,
    kind: str | None = None,
    apply: bool = False,
    at: str | None = None,
) -> dict[str, Any]:
    """Re-resolve the logged conflicts (of `site`'s log, `table`, `kind`, recorded since `since`,
    when given) with `policy` (core.reresolve.parse_policy). Returns ``{"policy", "applied":
    bool, "outcomes": [...], "counts": {...}}``; each outcome: table, rid, key, slot, columns,
    records ([site, id] of its log rows), candidates, superseded (versions a later one of the
    same origin followed: no candidates), logged_rule, logged, new (each candidate
    ``{values, ver, origin}``), status (``same`` / ``change`` / ``skip``), why, and with `apply`,
    for a ``change``: ``action`` (``applied`` or ``skipped``), ``at`` (the site written) and
    ``why``. `at`: the site the new values are written at (default: the first site, in the
    topology's order, that logged the conflict)."""
    cl, own = as_cluster(topo)
    try:
        problems = []
        try:
            pol = parse_policy(policy)
        except (ValueError, ResolverError) as e:
            problems.append(str(e))
            pol = None
        if kind is not None and kind not in SLOT_KINDS:
            problems.append(f"--kind: only {' and '.join(SLOT_KINDS)} conflicts are decided by a column policy")
        if at is not None and at not in cl.topo.sites:
            problems.append(f"--at: site '{at}' is not defined under sites")
        if problems:
            raise ConfigError(problems)
        assert pol is not None
        rows = conflicts(cl, site, table, 0, since=since, kind=kind)
        outcomes = re_resolve([as_logged(r, r["site"]) for r in rows], pol)
        out = [_as_dict(o) for o in outcomes]
        if apply:
            order = list(cl.topo.sites)
            plan = [
                (o, d, at or min((s for s, _ in o.records), key=order.index))
                for o, d in zip(outcomes, out)
                if o.status == "change"
            ]
            for where in dict.fromkeys(w for _, _, w in plan):  # every site written at, before any write
                s = cl.site(where)
                if isinstance(s, AgentSite):
                    raise AgentOnly(where, hidden_url(s.url), "conflicts --apply (it writes the new values at the site)")
            for o, d, where in plan:
                d["at"] = where
                d["action"], d["why"] = _apply(cl, where, o)
        counts: dict[str, int] = {}
        for d in out:
            k = d.get("action") or d["status"]
            counts[k] = counts.get(k, 0) + 1
        return {"policy": pol.name, "applied": apply, "outcomes": out, "counts": counts}
    finally:
        if own:
            cl.close()


def _cand(c: Candidate | None) -> dict[str, Any] | None:
    return None if c is None else {"values": c.values, "ver": c.ver, "origin": c.origin}


def _as_dict(o: Outcome) -> dict[str, Any]:
    return {
        "table": o.table,
        "rid": o.rid,
        "key": o.key,
        "slot": o.slot,
        "columns": list(o.columns),
        "records": [list(r) for r in o.records],
        "detected_at": o.detected_at,
        "candidates": [_cand(c) for c in o.candidates],
        "superseded": [_cand(c) for c in o.superseded],
        "logged_rule": o.logged_policy,
        "logged": _cand(o.logged),
        "new": _cand(o.new),
        "status": o.status,
        "why": o.why,
    }


def _value(v: Any) -> Any:
    """A value as the conflict log holds it, back to what a driver takes (bytes were {"$hex": ...})."""
    if isinstance(v, dict) and set(v) == {"$hex"}:
        return bytes.fromhex(v["$hex"])
    return v


def _apply(cl: Cluster, where: str, o: Outcome) -> tuple[str, str]:
    """Write `o`'s new winning values at site `where`, as an application's update (captured, with
    a fresh version), if the row still holds the logged winner's values; in one transaction, the
    row locked while it is compared. Returns (action, why)."""
    assert o.new is not None and o.logged is not None
    s: Site = cl.site(where)
    d = s.dialect
    q, ph = d.quote, d.caps.placeholder
    cols = list(o.new.values)
    try:
        with s.write() as conn:
            info = s.info(conn, o.table, cl.topo)
            r = conn.exec_driver_sql(
                f"SELECT {d.key_col} FROM {d.obj(o.table).shadow} WHERE rid = {ph} AND deleted IS NULL", (o.rid,)
            ).first()
            if r is None:
                return "skipped", f"the row ({o.rid}) is deleted at '{where}' (or not there)"
            key = r[0]
            lock = " FOR UPDATE" if d.caps.concurrent_capture else ""
            cur = conn.exec_driver_sql(
                f"SELECT {', '.join(q(c) for c in cols)} FROM {q(o.table)} WHERE {q(info.key.name)} = {ph}{lock}", (key,)
            ).first()
            if cur is None:
                return "skipped", f"the row ({o.rid}) is not in {o.table} at '{where}'"
            current = dict(zip(cols, cur))
            if not same_values(current, o.logged.values, value_types([(d.name, info)])):
                return "skipped", f"changed since: '{where}' holds {current}, not the logged winner {o.logged.values}"
            sets = ", ".join(f"{q(c)} = {ph}" for c in cols)
            conn.exec_driver_sql(
                f"UPDATE {q(o.table)} SET {sets} WHERE {q(info.key.name)} = {ph}",
                (*(_value(o.new.values[c]) for c in cols), key),
            )
        return "applied", f"written at '{where}' as a local update (key {key}); it replicates like any update"
    except (DBAPIError, MultimasterError) as e:
        return "skipped", redact(f"'{where}' refused the update: {str(getattr(e, 'orig', e)).strip().splitlines()[0]}")
