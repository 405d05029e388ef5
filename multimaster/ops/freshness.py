"""Freshness for callers (issue #14; docs/cli.md "Freshness: token and wait"): a writer takes a
*token* at the site it wrote, and a reader elsewhere waits until the token's changes are visible
there — IBM IDAA's delay protocol, SAP HANA's staleness-bounded reads, with the hybrid clock as
the log position.

- :func:`token`: the site's version now, ``'%019d:%s' % (hlc, site)``: its clock (docs/clock.md),
  at least the version of every change it captured so far (a caller's committed write included).
- :func:`wait_visible`: returns when *every change the token's site captured itself with a
  version <= the token* is applied at the named sites (or at `k` of them), or when the timeout
  passes, saying which sites are behind and by how much.

What "visible at X" means, precisely. At the start the token's site S is read once: per
replicated table t, the newest change of S's own (origin S) with version <= the token, in its
change log or, once purged from it, the highest version purge recorded for S (``_mm_origins``;
when purge went past the token, the token itself stands for it). That is ``need[t]``; a table S
never wrote up to the token needs nothing. X has the token's changes of t when its duplicate
filter ``_mm_origins`` for (t, S) is at least ``need[t]`` — every route delivers an origin's
changes in version order and a change waiting for its row holds back the later ones, so X then
applied every change of S up to it, whichever route it came by (directly, or relayed by another
site) — and X's error queue holds no change of S of t at or below it. The token's site itself sees
its changes at once. A token of a site whose log holds none of its own changes (it never wrote,
or a read-only site) is met at once: there is nothing to wait for. Changes of other origins that
S had applied when the token was taken are not waited for: take a token at their origin for those.

Polling reads one row set per site still behind (``_mm_origins`` of origin S and its error queue),
every 50 ms at first and less often as the wait goes on (at most 1 s apart), never past the
deadline.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.core.versions import make_ver, ver_hlc, ver_ms
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.site import Site
from multimaster.errors import ConfigError, MultimasterError

if TYPE_CHECKING:
    from multimaster.config.topology import Topology

__all__ = ["token", "wait_visible", "WaitResult", "SiteFreshness", "parse_token"]

_TOKEN = re.compile(r"^(\d{19}):([A-Za-z_][A-Za-z0-9_]*)$")

#: the first pause between two polls, the factor it grows by, and its largest value (seconds)
_FIRST_POLL, _GROWTH, _MAX_POLL = 0.05, 1.5, 1.0


def parse_token(cl: Cluster, tok: str) -> tuple[str, str]:
    """(the version the token is, its site); ConfigError (exit 2) for a malformed token or one of a
    site the topology does not name."""
    m = _TOKEN.match(tok.strip())
    if not m:
        raise ConfigError(
            [
                f"--token: '{tok}' is not a token: expected 19 digits, ':' and a site's name, as "
                "'multimaster token -t FILE --site SITE' prints it"
            ]
        )
    site = m.group(2)
    if site not in cl.topo.sites:
        raise ConfigError([f"--token: the token's site '{site}' is not defined under sites"])
    return tok.strip(), site


def _check_site(cl: Cluster, site: str, option: str) -> None:
    if site not in cl.topo.sites:
        raise ConfigError([f"{option}: site '{site}' is not defined under sites"])


def token(topo: Topology | Cluster, site: str) -> str:
    """The freshness token of `site` now: its version, at least that of every change it captured
    (docs/cli.md "Freshness: token and wait"). Raises ConfigError for an unknown site,
    NotInstalled before init."""
    cl, own = as_cluster(topo)
    try:
        _check_site(cl, site, "--site")
        s = cl.site(site)
        d = s.dialect
        with s.read() as conn:
            s.require_installed(conn, cl.topo)
            hlc = d.read_clock(conn) or 0
            for tb in cl.topo.tables:  # SQLite's clock floor leaves out its own captures: they are in the log
                top = conn.exec_driver_sql(
                    f"SELECT max(ver) FROM {d.obj(tb).log} WHERE origin = {d.caps.placeholder}", (site,)
                ).scalar()
                if top:
                    hlc = max(hlc, ver_hlc(str(top)))
        return make_ver(hlc, site)
    finally:
        if own:
            cl.close()


@dataclass
class SiteFreshness:
    """Where one site stands against a token."""

    site: str
    visible: bool = False
    #: per table, the token's changes not applied here yet, as far as the token's site still has
    #: them in its change log (read when the wait ends without them)
    missing: dict[str, int] = field(default_factory=dict)
    #: changes of the token's site at or below the token held in this site's error queue
    held: int = 0
    #: the oldest of the token's changes not applied here was written this many seconds ago (its
    #: version's clock against the wall clock; None: not known, e.g. purged from the log already)
    lag_s: float | None = None
    #: why the site could not be read (unreachable, not installed), if so
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "visible": self.visible,
            "missing": sum(self.missing.values()),
            "tables": dict(self.missing),
            "held": self.held,
            "lag_s": self.lag_s,
            "error": self.error,
        }

    def describe(self, origin: str) -> str:
        """One line saying how far behind the token this site is."""
        if self.error:
            return f"{self.site}: {self.error}"
        parts = []
        n = sum(self.missing.values())
        if n:
            per = ", ".join(f"{t} {c}" for t, c in self.missing.items() if c)
            parts.append(f"{n} change(s) of {origin} not applied yet ({per})")
        else:
            parts.append(f"changes of {origin} not applied yet")
        if self.lag_s is not None:
            parts.append(f"the oldest written {self.lag_s:.1f} s ago")
        if self.held:
            parts.append(f"{self.held} held in its error queue (see multimaster errors)")
        return f"{self.site}: " + ", ".join(parts)


@dataclass
class WaitResult:
    token: str
    origin: str
    sites: list[str]
    k: int
    met: bool
    waited_s: float
    per_site: dict[str, SiteFreshness] = field(default_factory=dict)
    #: per table, the newest change of the token's site the wait needed (None: none)
    need: dict[str, str | None] = field(default_factory=dict)

    @property
    def visible(self) -> list[str]:
        return [s for s in self.sites if self.per_site[s].visible]

    @property
    def behind(self) -> list[SiteFreshness]:
        return [self.per_site[s] for s in self.sites if not self.per_site[s].visible]

    def as_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "origin": self.origin,
            "sites": self.sites,
            "k": self.k,
            "met": self.met,
            "waited_s": round(self.waited_s, 3),
            "visible": self.visible,
            "behind": [b.as_dict() for b in self.behind],
            "need": self.need,
        }


def _need(s: Site, topo: Topology, tok: str) -> dict[str, str | None]:
    """Per table, the newest change of the token's site `s` (its own) at or below `tok` (see the
    module's description); None: none."""
    d = s.dialect
    ph = d.caps.placeholder
    out: dict[str, str | None] = {}
    with s.read() as conn:
        s.require_installed(conn, topo)
        purged = store.origins.of_origin(conn, d, s.name)  # what purge recorded of its own changes
        for tb in topo.tables:
            logged = conn.exec_driver_sql(
                f"SELECT max(ver) FROM {d.obj(tb).log} WHERE origin = {ph} AND ver <= {ph}", (s.name, tok)
            ).scalar()
            p = purged.get(tb)
            if p is not None and p > tok:
                out[tb] = tok  # purged past the token: which of them was the last one is gone with them
            else:
                out[tb] = max((str(v) for v in (logged, p) if v), default=None)
    return out


def _look(s: Site, origin: str, need: dict[str, str | None]) -> SiteFreshness:
    """Whether site `s` has applied every change of `origin` up to `need`, per table."""
    out = SiteFreshness(s.name)
    try:
        with s.read() as conn:
            applied = store.origins.of_origin(conn, s.dialect, origin)
            held = store.errorqueue.open_of_origin(conn, s.dialect, origin)
    except MultimasterError as e:
        out.error = redact(str(e))
        return out
    except Exception as e:  # noqa: BLE001 - down or not installed: behind until it answers
        out.error = redact(f"cannot be read ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})")
        return out
    ok = True
    for tb, v in need.items():
        if v is None:
            continue
        a = applied.get(tb)
        h = held.get(tb)
        if h is not None and h[0] <= v:
            out.held += h[1]
            ok = False
        if a is None or a < v:
            ok = False
    out.visible = ok
    return out


def _missing(s: Site, applied: dict[str, str], need: dict[str, str | None]) -> tuple[dict[str, int], str | None]:
    """Per table, how many changes of the token's site `s` its change log holds above what a site
    applied (`applied`: per table its ``_mm_origins`` for `s`) and at or below `need`; and the
    oldest of their versions (None: none in the log)."""
    d = s.dialect
    ph = d.caps.placeholder
    out: dict[str, int] = {}
    oldest: str | None = None
    with s.read() as conn:
        for tb, v in need.items():
            low = applied.get(tb) or ""
            if v is None or low >= v:
                continue
            n, first = conn.exec_driver_sql(
                f"SELECT count(*), min(ver) FROM {d.obj(tb).log} WHERE origin = {ph} AND ver > {ph} AND ver <= {ph}",
                (s.name, low, v),
            ).first() or (0, None)
            out[tb] = int(n or 0)
            if first is not None and (oldest is None or str(first) < oldest):
                oldest = str(first)
    return out, oldest


def wait_visible(
    topo: Topology | Cluster,
    tok: str,
    sites: Sequence[str] | None = None,
    *,
    k: int | None = None,
    timeout: float = 5.0,
) -> WaitResult:
    """Wait until every change the token's site captured with a version <= `tok` is applied at
    every site of `sites` (default: every other site), or at `k` of them, or `timeout` seconds
    passed (see the module's description for what counts). Returns a :class:`WaitResult` (`met`
    False on timeout, with how far each site is behind); raises ConfigError for a malformed token,
    an unknown site, a `k` out of range or a negative timeout."""
    cl, own = as_cluster(topo)
    try:
        tok, origin = parse_token(cl, tok)
        targets = list(dict.fromkeys(sites)) if sites else [s for s in cl.topo.sites if s != origin]
        problems = [f"--sites: site '{s}' is not defined under sites" for s in targets if s not in cl.topo.sites]
        if not targets:
            problems.append("--sites: no site to wait for (the topology has the token's site only)")
        want = len(targets) if k is None else k
        if targets and not 1 <= want <= len(targets):
            problems.append(f"--k: {want} is not between 1 and the number of sites named ({len(targets)})")
        if timeout < 0:
            problems.append(f"--timeout: {timeout:g} is negative")
        if problems:
            raise ConfigError(problems)
        start = time.monotonic()
        deadline = start + timeout
        need = _need(cl.site(origin), cl.topo, tok)
        res = WaitResult(tok, origin, targets, want, False, 0.0, need=need)
        nothing = all(v is None for v in need.values())
        for s in targets:
            res.per_site[s] = SiteFreshness(s, visible=nothing or s == origin)
        pause = _FIRST_POLL
        while True:
            for s in targets:
                if not res.per_site[s].visible:
                    res.per_site[s] = _look(cl.site(s), origin, need)
            if len(res.visible) >= want:
                res.met = True
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(pause, left))
            pause = min(pause * _GROWTH, _MAX_POLL)
        res.waited_s = time.monotonic() - start
        _describe_behind(cl, origin, res)
        return res
    finally:
        if own:
            cl.close()


def _describe_behind(cl: Cluster, origin: str, res: WaitResult) -> None:
    """How many of the token's changes each site still behind lacks, and how old the oldest is
    (read at the token's site)."""
    now_ms = int(time.time() * 1000)
    for b in res.behind:
        if b.error:
            continue
        s = cl.site(b.site)
        try:
            with s.read() as conn:
                applied = store.origins.of_origin(conn, s.dialect, origin)
            b.missing, oldest = _missing(cl.site(origin), applied, res.need)
        except Exception:  # noqa: BLE001 - the report does without the counts
            continue
        if oldest is not None:
            b.lag_s = round(max(0.0, (now_ms - ver_ms(oldest)) / 1000.0), 3)
