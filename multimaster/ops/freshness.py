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

Each read is one function of a local :class:`Site` — :func:`token_at`, :func:`need_at` (the token's
site), :func:`applied_at` (a site waited at), :func:`missing_at` (the token's site, for a site still
behind) — called directly for a site this host reaches through its database, and by the site's
agent (ops/agent.py) for a site reached through its agent (docs/agent.md): the same reads, run
where the database is.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import hidden_url
from multimaster.core.versions import make_ver, ver_hlc, ver_ms
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.remote import TIMEOUT, AgentSite
from multimaster.engine.site import Site
from multimaster.errors import AgentError, ConfigError, MultimasterError

if TYPE_CHECKING:
    from multimaster.config.topology import Topology

__all__ = [
    "token",
    "wait_visible",
    "WaitResult",
    "SiteFreshness",
    "parse_token",
    "check_token",
    "token_at",
    "need_at",
    "applied_at",
    "missing_at",
]

_TOKEN = re.compile(r"^(\d{19}):([A-Za-z_][A-Za-z0-9_]*)$")

#: the first pause between two polls, the factor it grows by, and its largest value (seconds)
_FIRST_POLL, _GROWTH, _MAX_POLL = 0.05, 1.5, 1.0
#: seconds a look at a site through its agent may take at least, however close the deadline is
_MIN_AGENT_WAIT = 1.0


def check_token(tok: str) -> tuple[str, str]:
    """(the token, its site) of a well-formed token; ConfigError (exit 2) for a malformed one."""
    m = _TOKEN.match(tok.strip())
    if not m:
        raise ConfigError(
            [
                f"--token: '{tok}' is not a token: expected 19 digits, ':' and a site's name, as "
                "'multimaster token -t FILE --site SITE' prints it"
            ]
        )
    return tok.strip(), m.group(2)


def parse_token(cl: Cluster, tok: str) -> tuple[str, str]:
    """(the version the token is, its site); ConfigError (exit 2) for a malformed token or one of a
    site the topology does not name."""
    tok, site = check_token(tok)
    if site not in cl.topo.sites:
        raise ConfigError([f"--token: the token's site '{site}' is not defined under sites"])
    return tok, site


def _check_site(cl: Cluster, site: str, option: str) -> None:
    if site not in cl.topo.sites:
        raise ConfigError([f"{option}: site '{site}' is not defined under sites"])


def token(topo: Topology | Cluster, site: str) -> str:
    """The freshness token of `site` now: its version, at least that of every change it captured
    (docs/cli.md "Freshness: token and wait"), read at the site (through its agent for a site
    reached through one). Raises ConfigError for an unknown site, NotInstalled before init,
    AgentError when the site's agent cannot be read."""
    cl, own = as_cluster(topo)
    try:
        _check_site(cl, site, "--site")
        s = cl.site(site)
        if isinstance(s, AgentSite):
            tok, of = check_token(s.token())
            if of != site:
                raise AgentError(site, hidden_url(s.url), f"the agent answered a token of site '{of}'")
            return tok
        return token_at(s, cl.topo)
    finally:
        if own:
            cl.close()


def token_at(s: Site, topo: Topology) -> str:
    """The token of site `s` now, read at the site (:func:`token`; its agent runs this)."""
    d = s.dialect
    with s.read() as conn:
        s.require_installed(conn, topo)
        hlc = d.read_clock(conn) or 0
        for tb in topo.tables:  # SQLite's clock floor leaves out its own captures: they are in the log
            top = store.origins.newest_own(conn, d, tb, s.name)
            if top:
                hlc = max(hlc, ver_hlc(str(top)))
    return make_ver(hlc, s.name)


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


def need_at(s: Site, topo: Topology, tok: str) -> dict[str, str | None]:
    """Per table, the newest change of the token's site `s` (its own) at or below `tok` (see the
    module's description); None: none. Read at `s` (its agent runs this)."""
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


def applied_at(s: Site, origin: str) -> tuple[dict[str, str], dict[str, tuple[str, int]]]:
    """What site `s` has of `origin`'s changes, read at `s` (its agent runs this): per table the
    newest applied (``_mm_origins``), and the lowest version and number of those held in its error
    queue."""
    with s.read() as conn:
        return store.origins.of_origin(conn, s.dialect, origin), store.errorqueue.open_of_origin(conn, s.dialect, origin)


def missing_at(s: Site, applied: dict[str, str], need: dict[str, str | None]) -> tuple[dict[str, int], str | None]:
    """Per table, how many changes of the token's site `s` its change log holds above what a site
    applied (`applied`: per table its ``_mm_origins`` for `s`) and at or below `need`; and the
    oldest of their versions (None: none in the log). Read at `s` (its agent runs this)."""
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


def _need(s: Site, topo: Topology, tok: str) -> dict[str, str | None]:
    return s.need(tok) if isinstance(s, AgentSite) else need_at(s, topo, tok)


def _applied(s: Site, origin: str, timeout: float | None = None) -> tuple[dict[str, str], dict[str, tuple[str, int]]]:
    return s.applied_of(origin, timeout=timeout) if isinstance(s, AgentSite) else applied_at(s, origin)


def _look(s: Site, origin: str, need: dict[str, str | None], timeout: float | None = None) -> SiteFreshness:
    """Whether site `s` has applied every change of `origin` up to `need`, per table (an agent-site:
    its agent answering within `timeout` seconds)."""
    out = SiteFreshness(s.name)
    try:
        applied, held = _applied(s, origin, timeout)
    except MultimasterError as e:  # an agent that does not answer, or refuses: behind, named
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
    return s.missing(applied, need) if isinstance(s, AgentSite) else missing_at(s, applied, need)


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
    an unknown site, a `k` out of range or a negative timeout, and the token's site's error when it
    cannot be read (its database, or its agent: AgentError naming both). A site waited at that
    cannot be read (its agent down or refusing) is behind, with the error, until it answers."""
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
                    # an agent is given the time left, at least _MIN_AGENT_WAIT (a dead host: not 30 s)
                    allowed = min(TIMEOUT, max(deadline - time.monotonic(), _MIN_AGENT_WAIT))
                    res.per_site[s] = _look(cl.site(s), origin, need, allowed)
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
        try:
            applied = _applied(cl.site(b.site), origin)[0]
            b.missing, oldest = _missing(cl.site(origin), applied, res.need)
        except Exception:  # noqa: BLE001 - the report does without the counts
            continue
        if oldest is not None:
            b.lag_s = round(max(0.0, (now_ms - ver_ms(oldest)) / 1000.0), 3)
