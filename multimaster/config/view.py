"""What a topology means for changes: who pulls from whom, how many relay hops a change takes
between every pair of sites, and the worst delay the refresh schedules allow. Pure: reads the
topology only, touches no database (``multimaster topology show``)."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from multimaster.config.topology import Link, Topology

__all__ = ["TopologyView", "view", "render_text", "worst_wait"]


@dataclass
class TopologyView:
    sites: list[str]
    links: list[Link]
    hops: dict[str, dict[str, int | None]] = field(default_factory=dict)  # hops[a][b]: links a change from a crosses to reach b
    delay: dict[str, dict[str, float | None]] = field(default_factory=dict)  # worst-case seconds along the fastest route
    route: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # the fastest route a -> ... -> b
    read_only: list[str] = field(default_factory=list)  # pull-only sites: no link from them, no changes written there

    @property
    def diameter(self) -> int:
        return max((h for row in self.hops.values() for h in row.values() if h is not None), default=0)

    @property
    def max_delay(self) -> float:
        return max((d for row in self.delay.values() for d in row.values() if d is not None), default=0.0)

    def pulls_from(self, site: str) -> list[str]:
        return [ln.source for ln in self.links if ln.target == site]

    def pulled_by(self, site: str) -> list[str]:
        return [ln.target for ln in self.links if ln.source == site]

    def as_dict(self) -> dict[str, Any]:
        return {
            "sites": self.sites,
            "read_only": self.read_only,
            "links": [
                {"from": ln.source, "to": ln.target, "interval_s": ln.interval, "cron": ln.cron, "jitter_s": ln.jitter}
                for ln in self.links
            ],
            "hops": self.hops,
            "worst_delay_s": self.delay,
            "routes": self.route,
            "diameter": self.diameter,
            "max_worst_delay_s": self.max_delay,
        }


def _cron_gap(expr: str) -> float:
    """The longest gap between two runs of a cron schedule (over its next 64 runs)."""
    from datetime import datetime, timezone

    from multimaster.config.cron import cron_trigger

    try:
        trig = cron_trigger(expr)
    except ValueError:
        return 0.0
    prev = None
    now = datetime.now(timezone.utc)
    gap = 0.0
    for _ in range(64):
        nxt = trig.get_next_fire_time(prev, now)
        if nxt is None:
            break
        if prev is not None:
            gap = max(gap, (nxt - prev).total_seconds())
        prev, now = nxt, nxt
    return gap


def worst_wait(ln: Link) -> float:
    """Longest a change can wait at `ln.source` before `ln.target` pulls it (its schedule's gap
    and jitter; `status` gives a link that long beyond refresh.stall_after before calling it behind)."""
    return _worst(ln)


def _worst(ln: Link) -> float:
    """Longest a change can wait at `ln.source` before `ln.target` pulls it."""
    return (_cron_gap(ln.cron) if ln.cron else ln.interval) + ln.jitter


def view(topo: Topology) -> TopologyView:
    sites = list(topo.sites)
    out = TopologyView(sites, list(topo.links), read_only=[s for s in sites if s in topo.read_only])
    nxt: dict[str, list[Link]] = {s: [] for s in sites}
    for ln in topo.links:
        nxt[ln.source].append(ln)
    for a in sites:
        dist = _hops(a, nxt)
        out.hops[a] = {b: dist.get(b) for b in sites if b != a}
        best, prev = _fastest(a, nxt)
        out.delay[a] = {b: best.get(b) for b in sites if b != a}
        out.route[a] = {}
        for b in sites:
            if b == a or b not in best:
                continue
            path = [b]
            while path[-1] != a:
                path.append(prev[path[-1]])
            out.route[a][b] = path[::-1]
    return out


def _hops(a: str, nxt: dict[str, list[Link]]) -> dict[str, int]:
    """Site -> the fewest links a change of `a` crosses to reach it (`nxt`: the links out of each
    site): breadth-first over links in the direction changes flow (source -> target)."""
    dist: dict[str, int] = {a: 0}
    dq = deque([a])
    while dq:
        u = dq.popleft()
        for ln in nxt[u]:
            if ln.target not in dist:
                dist[ln.target] = dist[u] + 1
                dq.append(ln.target)
    return dist


def _fastest(a: str, nxt: dict[str, list[Link]]) -> tuple[dict[str, float], dict[str, str]]:
    """The cheapest route from `a` to every site it reaches, by worst-case wait per link: (site ->
    its delay, site -> the site before it on the route)."""
    best: dict[str, float] = {a: 0.0}
    prev: dict[str, str] = {}
    heap = [(0.0, a)]
    while heap:
        c, u = heapq.heappop(heap)
        if c > best.get(u, float("inf")):
            continue
        for ln in nxt[u]:
            nc = c + _worst(ln)
            if nc < best.get(ln.target, float("inf")):
                best[ln.target] = nc
                prev[ln.target] = u
                heapq.heappush(heap, (nc, ln.target))
    return best, prev


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 3600:
        return f"{v / 3600:.1f}h"
    if v >= 60:
        return f"{v / 60:.1f}m"
    return f"{v:g}s"


def render_text(v: TopologyView) -> str:
    """A plain-text drawing: each site with the sites it pulls from, then the hop matrix."""
    lines = [f"{len(v.sites)} sites, {len(v.links)} links (a link 'a -> b': b pulls a's change log)", ""]
    w = max(len(s) for s in v.sites)
    for s in v.sites:
        ins = ", ".join(
            f"{ln.source} ({'cron ' + ln.cron if ln.cron else 'every ' + _fmt_s(ln.interval)})"
            for ln in v.links
            if ln.target == s
        )
        ro = "  (read-only: receives only, no site pulls from it)" if s in v.read_only else ""
        lines.append(f"  {s:<{w}} <- {ins or '(nothing)'}{ro}")
    lines += ["", "relay hops from (row) to (column):"]
    cw = max(w, 3)
    lines.append(" " * (w + 2) + " ".join(f"{s:>{cw}}" for s in v.sites))
    for a in v.sites:
        cells = []
        for b in v.sites:
            h = 0 if a == b else v.hops[a][b]
            cells.append(f"{'.' if a == b else ('-' if a in v.read_only else 'x' if h is None else h):>{cw}}")
        lines.append(f"  {a:<{w}}" + " ".join(cells))
    lines += [
        *(["(-: a read-only site writes no changes)"] if v.read_only else []),
        "",
        f"longest path: {v.diameter} hop(s); worst delay by schedule: {_fmt_s(v.max_delay)}"
        " (interval or longest cron gap, + jitter, summed along the fastest route)",
    ]
    return "\n".join(lines)
