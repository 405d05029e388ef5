"""The topology file: sites, replicated tables and links, validated by pydantic.

Shape checks come from the pydantic models; cross-references (a link naming an unknown site, a
priority list naming an unknown site, a column in two groups ...) are checked afterwards by
:func:`check_topology`, which collects *every* problem so the user fixes the file in one pass.
Loading touches no database. See docs/configuration.md for the reference.
"""

from __future__ import annotations

import os
import re
import secrets as _random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.engine import URL, make_url

from multimaster.config import secrets
from multimaster.core.unique import POLICIES
from multimaster.dialects.liveness import Timeouts
from multimaster.errors import ConfigError

__all__ = [
    "Topology",
    "SiteConfig",
    "TableConfig",
    "GroupConfig",
    "LinkConfig",
    "Link",
    "VerifyScheduleConfig",
    "PurgeConfig",
    "PolicySpec",
    "parse_retention",
    "load_topology",
    "parse_topology",
    "expand_links",
    "hidden_url",
    "is_agent_url",
    "is_loopback",
]

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SITE = 24
MAX_TABLE = 30
BUILTIN_POLICIES = ("latest", "earliest", "maximum", "minimum", "additive")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: str | int | float) -> float:
    """'500ms', '10s', '5m', '1h', '2d' or a number of seconds -> seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"'{value}' is not a duration (use e.g. 500ms, 10s, 5m, 1h)")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2) or "s"]
    return float(m.group(1)) * scale


#: the shortest refresh interval taken (refresh.interval, a link's interval): 0 would refresh in a
#: busy loop (docs/configuration.md)
MIN_INTERVAL_S = 0.1


def _interval_problems(seconds: float, label: str) -> list[str]:
    """A refresh interval below MIN_INTERVAL_S (0 included, which would refresh in a busy loop)."""
    if seconds >= MIN_INTERVAL_S:
        return []
    return [f"{label}: {seconds:g} s is below the shortest interval, 100ms (0 would refresh a link in a busy loop)"]


def parse_retention(value: str | int | float | None) -> float:
    """A retention: a duration (see :func:`parse_duration`) or 'off' (never: infinity)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
        return float("inf")
    return parse_duration(value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PriorityPolicy(_Strict):
    priority: list[str] = Field(min_length=1)


class CustomPolicy(_Strict):
    custom: str


PolicySpec = Union[Literal["latest", "earliest", "maximum", "minimum", "additive"], PriorityPolicy, CustomPolicy]


class SiteConfig(_Strict):
    url: str
    password: str | None = None  # in the file only: once loaded, the password is inside `url`
    verify: bool = True
    #: a pull-only site (docs/topologies.md "Read-only sites"): it receives every change, no link
    #: pulls from it, and its triggers refuse local writes to replicated tables
    read_only: bool = False
    #: the bearer token of the site's agent (docs/agent.md): with an agent url (http(s)://), what
    #: this host sends; with a database url, what `multimaster serve` for this site checks
    token: str | None = None
    #: a CA certificate file (PEM) to trust for an https agent url (a self-signed certificate)
    ca: str | None = None
    #: plain HTTP to (or served by) an agent on an address other than loopback: the token and the
    #: changes cross the network in clear; off unless written
    insecure_http: bool = False
    #: this site's own bounds on a new connection to its database and on a wait that hears nothing
    #: from it (None: refresh.connect_timeout / refresh.read_timeout; docs/configuration.md)
    connect_timeout: float | str | None = None
    read_timeout: float | str | None = None

    @property
    def agent(self) -> bool:
        """Whether this host reaches the site through its agent (`url` is http(s)://)."""
        return is_agent_url(self.url)

    def __repr_args__(self) -> Any:  # a repr (in a traceback, a log line) shows the URL masked
        for k, v in super().__repr_args__():
            if k == "url" and isinstance(v, str):
                yield k, hidden_url(v)
            elif k in ("password", "token") and v is not None:
                yield k, secrets.MASK
            else:
                yield k, v


class GroupConfig(_Strict):
    columns: list[str] = Field(min_length=1)
    policy: PolicySpec = "latest"


class TableConfig(_Strict):
    key: str
    renumber: bool | None = None  # None: decided at init from the key column type (integer -> True)
    policy: PolicySpec = "latest"
    columns: dict[str, PolicySpec] = Field(default_factory=dict)
    groups: dict[str, GroupConfig] = Field(default_factory=dict)
    exclude: list[str] = Field(default_factory=list)
    #: per UNIQUE set (a column, or its columns joined by ','): what a row losing its value gets
    #: ('suffix', 'null' or 'park'; docs/unique.md)
    unique: dict[str, str] = Field(default_factory=dict)

    @field_validator("unique", mode="before")
    @classmethod
    def _bare_null(cls, v: Any) -> Any:
        """`email: null` written bare is YAML's null: the policy 'null' (docs/unique.md writes it so)."""
        if isinstance(v, dict):
            return {k: "null" if p is None else p for k, p in v.items()}
        return v


class LinkConfig(_Strict):
    from_: str = Field(alias="from")
    to: str
    interval: str | float | None = None
    cron: str | None = None
    jitter: str | float | None = None


class RefreshConfig(_Strict):
    interval: str | float = "10s"
    batch_size: int = Field(default=10_000, ge=1, le=1_000_000)
    jitter: str | float = "1s"
    #: the furthest a pulled change's version may be ahead of this site's wall clock ('off': no
    #: limit); a change further ahead is held, with its link's error naming the site and the offset
    #: (docs/clock.md "Clock discipline")
    max_clock_offset: bool | float | str = "5s"  # (YAML reads a bare off as false)
    #: a link whose oldest waiting change (for its row, a referenced row, an earlier change of its
    #: origin) is older than this is stalled: `refresh` and `status` exit 1 and say what it waits
    #: for ('off': never; docs/operations.md "Stalled links")
    stall_after: bool | float | str = "10m"
    #: a pulled change whose version is further ahead of this site's wall clock than this (but not
    #: past max_clock_offset) is applied with a warning naming its origin and the offset (`refresh`
    #: on stderr, `status`, the metrics); default half of max_clock_offset, 'off': no warning
    clock_warn: bool | float | str | None = None
    #: a write transaction of refresh, init or add-site that has waited this long for a lock
    #: (over the retries of one batch) is named, with who holds the lock: `refresh` and the others
    #: on stderr, the daemon's log ('off': never; docs/cli.md "Progress and lock waits")
    lock_wait_warn: bool | float | str = "2s"
    #: what a site of a mesh writes into its change log of the changes it applies (docs/topologies.md
    #: "Relaying in a mesh"): 'all' (every one, so that a site can get any origin's changes from
    #: any peer that has them, e.g. while the origin is away) or 'needed' (only what some site
    #: pulling from it cannot get directly: cheaper applies and shorter delays, but while a site is
    #: away its changes wait for it). Other shapes always relay what is needed.
    relay: Literal["all", "needed"] = "all"
    #: how often `multimaster run` checks its sites' replicated tables for a schema change made
    #: by hand (a column added or dropped, the table made again) and makes capture follow it,
    #: besides every refresh doing so: a hand-run DROP COLUMN on MariaDB breaks inserts until
    #: then, a table made again is not captured until then ('off': at refreshes only;
    #: docs/schema-changes.md)
    follow_every: bool | float | str = "1s"
    #: the longest a new connection to a site's database may take (TCP, TLS, login) before it fails
    connect_timeout: float | str = "10s"
    #: how long a wait on a site's database may hear nothing from it before the server is checked
    #: on a new connection (within connect_timeout): a server that answers is busy and the wait
    #: goes on; one that does not (down, frozen, cut off) fails the wait (dialects/liveness.py)
    read_timeout: float | str = "15s"

    def max_offset_seconds(self) -> float | None:
        """max_clock_offset in seconds, None when 'off'."""
        return _duration_or_off(self.max_clock_offset, "5s")

    def clock_warn_seconds(self) -> float | None:
        """clock_warn in seconds, None when 'off'; by default half of max_clock_offset (off when it is)."""
        if self.clock_warn is None:
            limit = self.max_offset_seconds()
            return None if limit is None else limit / 2
        return _duration_or_off(self.clock_warn, "2s")

    def stall_after_seconds(self) -> float | None:
        """stall_after in seconds, None when 'off'."""
        return _duration_or_off(self.stall_after, "10m")

    def lock_wait_warn_seconds(self) -> float | None:
        """lock_wait_warn in seconds, None when 'off'."""
        return _duration_or_off(self.lock_wait_warn, "2s")

    def follow_every_seconds(self) -> float | None:
        """follow_every in seconds, None when 'off'."""
        return _duration_or_off(self.follow_every, "1s")


#: the bounds a timeout setting may take (seconds): below a second a busy network trips it; a day
#: is as good as none
TIMEOUT_RANGE = (1.0, 86400.0)


def _timeout(v: float | str, where: str, problems: list[str] | None = None) -> float:
    """A connect_timeout or read_timeout in seconds, within TIMEOUT_RANGE; a problem (raised as
    ValueError when `problems` is None) otherwise."""
    lo, hi = TIMEOUT_RANGE
    try:
        if isinstance(v, bool):
            raise ValueError("expected a duration such as '10s' ('off' is not allowed: a site that hangs would hang its callers)")
        sec = parse_duration(v)
        if not lo <= sec <= hi:
            raise ValueError(f"{sec:g} s is out of range: between {lo:g} s and {hi:g} s ({hi / 86400:g} d)")
        return sec
    except ValueError as e:
        if problems is None:
            raise
        problems.append(f"{where}: {e}")
        return 0.0


def _duration_or_off(v: bool | float | str, example: str) -> float | None:
    """A duration setting that may be 'off' (YAML reads a bare off as false): seconds, or None."""
    if v is False or (isinstance(v, str) and v.strip().lower() == "off"):
        return None
    if v is True:
        raise ValueError(f"expected a duration such as '{example}'")
    return parse_duration(v)


class VerifyScheduleConfig(_Strict):
    """A scheduled convergence check (`multimaster run` runs it, docs/verify.md "Scheduled checks")."""

    cron: str  # crontab: 5 fields (6: seconds first), parsed like a link's cron
    tables: list[str] | None = None  # None: every table
    master: str = "local[*]"  # Spark master
    site: str | None = None  # the site whose daemon runs it and keeps the result (None: the first site)
    checksum_only: bool = False


class PurgeConfig(_Strict):
    """Bounded state (docs/operations.md, "Tombstones and the conflict log"): how long deleted
    rows' tombstones and conflict-log rows are kept at least, once every site has them ('off':
    forever). `multimaster purge` and the daemon's purge job drop them."""

    tombstones_after: str | float = "7d"
    conflicts_after: str | float = "30d"


class _TopologyModel(_Strict):
    sites: dict[str, SiteConfig] = Field(min_length=1)
    tables: dict[str, TableConfig] = Field(min_length=1)
    links: Union[
        Literal["mesh", "ring"],
        dict[Literal["star"], str],
        dict[Literal["chain"], list[str]],
        list[LinkConfig],
    ] = "mesh"
    refresh: RefreshConfig = Field(default_factory=RefreshConfig)
    verify: VerifyScheduleConfig | None = None
    purge: PurgeConfig = Field(default_factory=PurgeConfig)

    @field_validator("links", mode="before")
    @classmethod
    def _one_key(cls, v: Any) -> Any:
        if isinstance(v, dict) and len(v) != 1:
            raise ValueError("a links mapping takes exactly one of 'star' or 'chain'")
        return v


@dataclass(frozen=True)
class Link:
    """`target` pulls the change log of `source` (changes flow source -> target)."""

    source: str
    target: str
    interval: float
    cron: str | None = None
    jitter: float = 1.0


@dataclass(frozen=True)
class Topology:
    sites: dict[str, SiteConfig]
    tables: dict[str, TableConfig]
    links: tuple[Link, ...]
    refresh: RefreshConfig
    path: Path | None = None
    verify: VerifyScheduleConfig | None = None  # the scheduled convergence check, if any
    purge: PurgeConfig = PurgeConfig()  # retention of tombstones and conflict-log rows

    @property
    def verify_site(self) -> str:
        """The site that runs scheduled checks and keeps every recorded verify result."""
        if self.verify is not None and self.verify.site:
            return self.verify.site
        return next(iter(self.sites))

    @property
    def read_only(self) -> frozenset[str]:
        """The read-only (pull-only) sites: no link pulls from them, applications cannot write there."""
        return frozenset(n for n, s in self.sites.items() if s.read_only)

    def peers_of(self, site: str) -> list[str]:
        """Sites that `site` pulls from."""
        return [ln.source for ln in self.links if ln.target == site]

    def pulls_every_writable(self) -> bool:
        """Every site pulls directly from every writable site but itself (a mesh, read-only sites
        included): any change a site lacks, it can get from any other site."""
        writable = set(self.sites) - self.read_only
        return all(writable - {s} <= set(self.peers_of(s)) for s in self.sites)

    def link(self, source: str, target: str) -> Link | None:
        for ln in self.links:
            if ln.source == source and ln.target == target:
                return ln
        return None

    def site_url(self, name: str) -> str:
        return self.sites[name].url

    def timeouts(self, name: str) -> Timeouts:
        """Site `name`'s bounds: its own connect_timeout / read_timeout, else the refresh section's."""
        s, r = self.sites[name], self.refresh
        return Timeouts(
            connect=_timeout(r.connect_timeout if s.connect_timeout is None else s.connect_timeout, "connect_timeout"),
            read=_timeout(r.read_timeout if s.read_timeout is None else s.read_timeout, "read_timeout"),
        )


def is_agent_url(url: str) -> bool:
    """Whether a site's url names its agent (http:// or https://) rather than its database."""
    return url.strip().lower().startswith(("http://", "https://"))


def is_loopback(host: str | None) -> bool:
    """Whether `host` is a loopback address or name (plain HTTP is allowed there without asking)."""
    import ipaddress

    h = (host or "").strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def hidden_url(url: str) -> str:
    """Render a database URL with the password masked, for every message and log line. A URL that
    does not parse is shown masked from the first ':' after the user to its last '@'."""
    if is_agent_url(url):
        return secrets.redact(re.sub(r"://[^/@]*@", "://***@", url))
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - SQLAlchemy raises ArgumentError or ValueError
        shown = re.sub(r"://([^:/@]*):.*@", r"://\1:***@", url)
    return secrets.redact(shown)


def _expand_env(text: str, where: str, problems: list[str]) -> str:
    """`text` with each ${VAR} replaced by the variable's value, as it is."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in os.environ:
            problems.append(f"{where}: environment variable '{name}' is not set")
            return ""
        return os.environ[name]

    return _VAR.sub(sub, text)


def _token(taken: str) -> str:
    """A placeholder for one ${VAR} while a URL is parsed: digits only, so it parses as any part of
    a URL (a port included), and found nowhere in `taken`."""
    while True:
        t = "7" + "".join(_random.choice("0123456789") for _ in range(17))
        if t not in taken:
            return t


def _expand_url(template: str, where: str, problems: list[str]) -> str | None:
    """A site URL with each ${VAR} replaced by the variable's value, encoded for the part of the
    URL it lands in: a password holding '@', '/', '#', ':', '%' or a space stays the password.

    The URL is parsed with a placeholder in place of each variable, each part (user, password,
    host, port, database, query) gets the values back, and SQLAlchemy renders the URL, encoding
    what the part needs. A URL that is one variable alone is a whole URL, taken as it is. None (and
    a problem) when a variable is missing or the URL does not parse or keep its parts."""
    names = list(dict.fromkeys(_VAR.findall(template)))
    missing = [n for n in names if n not in os.environ]
    for n in missing:
        problems.append(f"{where}: environment variable '{n}' is not set")
    if missing:
        return None
    whole = _VAR.fullmatch(template.strip())
    if not names or whole:
        return os.environ[whole.group(1)] if whole else template
    values: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        t = _token(template + "".join(values))
        values[t] = os.environ[m.group(1)]
        return t

    skeleton = _VAR.sub(sub, template)
    try:
        u = make_url(skeleton)
    except Exception:  # noqa: BLE001 - SQLAlchemy raises ArgumentError or ValueError
        problems.append(
            f"{where}: '{hidden_url(template)}' is not a database URL (e.g. postgresql+psycopg://user:${{PW}}@host/db)"
        )
        return None

    def fill(part: str) -> str:
        for t, v in values.items():
            part = part.replace(t, v)
        return part

    port = None if u.port is None else fill(str(u.port))
    if port is not None and not port.isdecimal():
        problems.append(f"{where}: the port of '{hidden_url(template)}' is not a number once its variables are filled in")
        return None
    query = {fill(k): tuple(fill(x) for x in v) if isinstance(v, tuple) else fill(v) for k, v in u.query.items()}
    out = URL.create(
        fill(u.drivername),
        username=None if u.username is None else fill(u.username),
        password=None if u.password is None else fill(u.password),
        host=None if u.host is None else fill(u.host),
        port=None if port is None else int(port),
        database=None if u.database is None else fill(u.database),
        query=query,
    )
    rendered = out.render_as_string(hide_password=False)
    try:
        same = make_url(rendered) == out
    except Exception:  # noqa: BLE001 - as above
        same = False
    if not same:
        problems.append(
            f"{where}: '{hidden_url(template)}' does not keep its parts once its variables are filled in: "
            "a value in the driver name or the host holds a character such as '/', ':', '?' or '@' "
            "(the user name, password, database and query take any character)"
        )
        return None
    return rendered


def _resolve_file(url: str, base: Path | None) -> str:
    """A database file named by a relative path (SQLite) resolves against the topology file's folder."""
    u = make_url(url)
    if base is None:
        return url
    try:
        from multimaster.dialects import get_dialect

        db = get_dialect(u.get_backend_name()).database_file(url)
    except Exception:  # noqa: BLE001 - a database multimaster does not support: init names it
        return url
    if db is None or os.path.isabs(db):
        return url
    return u.set(database=str((base / db).resolve())).render_as_string(hide_password=False)


def expand_links(
    model_links: Any, sites: list[str], default_interval: float, jitter: float, read_only: frozenset[str] = frozenset()
) -> list[Link]:
    """The links a `links` entry names. A shape (mesh, ring, star, chain) leaves out the links it
    would draw from a site of `read_only` (no site pulls from a read-only site); an explicit list
    is taken as written (check_topology refuses a link from a read-only site)."""

    def link(a: str, b: str, cfg: LinkConfig | None = None) -> Link:
        interval = parse_duration(cfg.interval) if cfg and cfg.interval is not None else default_interval
        jit = parse_duration(cfg.jitter) if cfg and cfg.jitter is not None else jitter
        return Link(a, b, interval, cfg.cron if cfg else None, jit)

    pairs: list[Link] = []
    if model_links == "mesh":
        pairs = [link(a, b) for a in sites for b in sites if a != b]
    elif model_links == "ring":
        n = len(sites)
        if n == 2:
            pairs = [link(sites[0], sites[1]), link(sites[1], sites[0])]
        elif n > 2:
            for i in range(n):
                a, b = sites[i], sites[(i + 1) % n]
                pairs += [link(a, b), link(b, a)]
    elif isinstance(model_links, dict) and "star" in model_links:
        hub = model_links["star"]
        for s in sites:
            if s != hub:
                pairs += [link(s, hub), link(hub, s)]
    elif isinstance(model_links, dict) and "chain" in model_links:
        chain = model_links["chain"]
        for a, b in zip(chain, chain[1:]):
            pairs += [link(a, b), link(b, a)]
    else:
        return [link(c.from_, c.to, c) for c in model_links]
    return [ln for ln in pairs if ln.source not in read_only]


def _check_ident(kind: str, name: str, limit: int, where: str, problems: list[str]) -> None:
    if not IDENT.match(name):
        problems.append(f"{where}: {kind} name '{name}' is not a plain SQL name (letters, digits, _; not starting with a digit)")
    elif len(name) > limit:
        problems.append(f"{where}: {kind} name '{name}' is longer than {limit} characters")
    elif name.lower().startswith("_mm_"):
        problems.append(f"{where}: {kind} name '{name}' uses the reserved prefix _mm_")


def _policy_problems(p: Any, where: str, sites: set[str], problems: list[str]) -> None:
    if isinstance(p, PriorityPolicy):
        for s in p.priority:
            if s not in sites:
                problems.append(f"{where}.priority: site '{s}' is not defined under sites")
    elif isinstance(p, CustomPolicy):
        if not re.match(r"^[A-Za-z_][\w.]*[.:][A-Za-z_]\w*$", p.custom):
            problems.append(f"{where}.custom: '{p.custom}' is not a dotted path to a callable (package.module.function)")


def check_topology(model: _TopologyModel, problems: list[str]) -> None:
    sites = set(model.sites)
    lowered: dict[str, str] = {}
    for name in model.sites:
        _check_ident("site", name, MAX_SITE, f"sites.{name}", problems)
        if name.lower() in lowered:
            problems.append(f"sites.{name}: duplicate site name (same as '{lowered[name.lower()]}' ignoring case)")
        lowered[name.lower()] = name
    tl: dict[str, str] = {}
    for tname, t in model.tables.items():
        where = f"tables.{tname}"
        _check_ident("table", tname, MAX_TABLE, where, problems)
        if tname.lower() in tl:
            problems.append(f"{where}: duplicate table name (same as '{tl[tname.lower()]}' ignoring case)")
        tl[tname.lower()] = tname
        _table_problems(t, where, sites, problems)
    for n in _link_problems(model.links, sites, problems):
        if n not in sites:
            problems.append(f"links: site '{n}' is not defined under sites")
    _read_only_problems(model, problems)
    _refresh_problems(model.refresh, problems)
    _timeout_problems(model, problems)
    if model.verify is not None:
        _verify_problems(model, problems)
    for name in ("tombstones_after", "conflicts_after"):
        try:
            parse_retention(getattr(model.purge, name))
        except ValueError as e:
            problems.append(f"purge.{name}: {e} or 'off'")


def _refresh_problems(r: RefreshConfig, problems: list[str]) -> None:
    """The problems of the refresh section: its durations, and a clock warning below the offset."""
    for d, label in ((r.interval, "refresh.interval"), (r.jitter, "refresh.jitter")):
        try:
            seconds = parse_duration(d)
        except ValueError as e:
            problems.append(f"{label}: {e}")
            continue
        if label == "refresh.interval":
            problems.extend(_interval_problems(seconds, label))
    for name, get in (
        ("max_clock_offset", r.max_offset_seconds),
        ("stall_after", r.stall_after_seconds),
        ("clock_warn", r.clock_warn_seconds),
        ("lock_wait_warn", r.lock_wait_warn_seconds),
        ("follow_every", r.follow_every_seconds),
    ):
        try:
            v = get()
            if v is not None and v <= 0:
                problems.append(f"refresh.{name}: must be more than 0 (or 'off')")
        except ValueError as e:
            problems.append(f"refresh.{name}: {e} (or 'off')")
    try:
        warn, limit = r.clock_warn_seconds(), r.max_offset_seconds()
        if warn is not None and limit is not None and warn >= limit:
            problems.append(
                f"refresh.clock_warn: {warn:g} s is not below refresh.max_clock_offset ({limit:g} s): "
                "a change past the warning would be held, never warned about"
            )
    except ValueError:
        pass  # reported above


def _timeout_problems(model: _TopologyModel, problems: list[str]) -> None:
    """The problems of refresh.connect_timeout / read_timeout and of each site's own."""
    r = model.refresh
    _timeout(r.connect_timeout, "refresh.connect_timeout", problems)
    _timeout(r.read_timeout, "refresh.read_timeout", problems)
    for name, s in model.sites.items():
        for field, v in (("connect_timeout", s.connect_timeout), ("read_timeout", s.read_timeout)):
            if v is None:
                continue
            _timeout(v, f"sites.{name}.{field}", problems)
            if is_agent_url(s.url):
                problems.append(f"sites.{name}.{field}: a bound on a database connection, not on an agent url")


def _table_problems(t: TableConfig, where: str, sites: set[str], problems: list[str]) -> None:
    """The problems of one table's entry (`where`: 'tables.<name>'): its column names, its key,
    its policies and its groups."""
    for col in [t.key, *t.columns, *t.exclude]:
        _check_ident("column", col, 48, where, problems)
    if t.key in t.exclude:
        problems.append(f"{where}.exclude: the key column '{t.key}' cannot be excluded")
    if t.key in t.columns:
        problems.append(f"{where}.columns.{t.key}: the key column takes no policy")
    _policy_problems(t.policy, f"{where}.policy", sites, problems)
    seen: dict[str, str] = {}
    for col, p in t.columns.items():
        _policy_problems(p, f"{where}.columns.{col}", sites, problems)
    for gname, g in t.groups.items():
        _check_ident("group", gname, 48, f"{where}.groups", problems)
        _policy_problems(g.policy, f"{where}.groups.{gname}.policy", sites, problems)
        if g.policy == "additive":
            problems.append(f"{where}.groups.{gname}.policy: 'additive' applies to single numeric columns, not groups")
        for col in g.columns:
            _group_column_problems(t, f"{where}.groups.{gname}", col, seen, problems)
            seen[col] = gname
    _unique_problems(t, where, problems)


def _unique_problems(t: TableConfig, where: str, problems: list[str]) -> None:
    """The problems of a table's `unique` entry: each key names columns, each value a policy."""
    for name, pol in t.unique.items():
        cols = unique_columns(name)
        for col in cols:
            _check_ident("column", col, 48, f"{where}.unique", problems)
        if t.key in cols:
            problems.append(f"{where}.unique.{name}: the key column '{t.key}' is not a secondary UNIQUE set")
        if pol not in POLICIES:
            problems.append(f"{where}.unique.{name}: unknown policy {pol!r}; use one of {', '.join(POLICIES)}")


def unique_columns(name: str) -> list[str]:
    """The columns a key of a table's `unique` entry names ('email', 'tenant_id,email')."""
    return [c.strip() for c in name.split(",")]


def _group_column_problems(t: TableConfig, where: str, col: str, seen: dict[str, str], problems: list[str]) -> None:
    """The problems of column `col` of a group (`where`: 'tables.<name>.groups.<group>'); `seen`:
    column -> the group it was met in before."""
    _check_ident("column", col, 48, where, problems)
    if col in seen:
        problems.append(f"{where}: column '{col}' is already in group '{seen[col]}'")
    if col in t.columns:
        problems.append(f"{where}: column '{col}' also has its own policy under columns")
    if col == t.key:
        problems.append(f"{where}: the key column '{col}' cannot be in a group")


def _link_problems(links: Any, sites: set[str], problems: list[str]) -> list[str]:
    """The problems of the `links` entry (a star, a chain or a list of links). Returns the site
    names it mentions, for the caller to check against `sites`."""
    names: list[str] = []
    if isinstance(links, dict) and "star" in links:
        names = [links["star"]]
    elif isinstance(links, dict) and "chain" in links:
        names = list(links["chain"])
        if len(set(names)) != len(names):
            problems.append("links.chain: a site appears twice in the chain")
        missing = sites - set(names)
        if missing:
            problems.append(f"links.chain: sites {sorted(missing)} are not in the chain, so they would never replicate")
    elif isinstance(links, list):
        pairs = set()
        for i, ln in enumerate(links):
            names += [ln.from_, ln.to]
            if ln.from_ == ln.to:
                problems.append(f"links[{i}]: a site cannot pull from itself ('{ln.to}')")
            if (ln.from_, ln.to) in pairs:
                problems.append(f"links[{i}]: duplicate link {ln.from_} -> {ln.to}")
            pairs.add((ln.from_, ln.to))
            for d, field in ((ln.interval, "interval"), (ln.jitter, "jitter")):
                if d is not None:
                    try:
                        v = parse_duration(d)
                    except ValueError as e:
                        problems.append(f"links[{i}]: {e}")
                        continue
                    if field == "interval":
                        problems.extend(_interval_problems(v, f"links[{i}].interval"))
    return names


def _read_only_problems(model: _TopologyModel, problems: list[str]) -> None:
    """The problems read-only sites make (docs/topologies.md "Read-only sites"): a link from one, a
    star whose hub is one, a topology with no writable site left."""
    ro = [n for n, s in model.sites.items() if s.read_only]
    if not ro:
        return
    if len(ro) == len(model.sites):
        problems.append("sites: every site is read_only; at least one site must be writable (changes start there)")
    links: Any = model.links
    if isinstance(links, list):
        for i, ln in enumerate(links):
            if ln.from_ in ro:
                problems.append(
                    f"links[{i}]: link {ln.from_} -> {ln.to} pulls from site '{ln.from_}', which is read_only "
                    f"(sites.{ln.from_}.read_only): no site pulls from a read-only site; remove the link"
                )
    elif isinstance(links, dict) and "star" in links and links["star"] in ro:
        hub = links["star"]
        problems.append(
            f"links.star: the hub '{hub}' is read_only (sites.{hub}.read_only), but every other site pulls from the hub; "
            "make another site the hub"
        )


def _verify_problems(model: _TopologyModel, problems: list[str]) -> None:
    v = model.verify
    assert v is not None
    if v.site is not None and v.site not in model.sites:
        problems.append(f"verify.site: site '{v.site}' is not defined under sites")
    for t in v.tables or []:
        if t not in model.tables:
            problems.append(f"verify.tables: table '{t}' is not defined under tables")
    from multimaster.config.cron import cron_trigger

    try:
        cron_trigger(v.cron)
    except Exception as e:  # noqa: BLE001 - APScheduler raises ValueError, odd input may raise others
        problems.append(f"verify.cron: '{v.cron}' is not a crontab expression ({e})")
    if sum(1 for s in model.sites.values() if s.verify) < 2:
        problems.append("verify: a check needs at least two sites to compare (sites with 'verify: false' are left out)")


def _format_pydantic(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith(("function-after", "literal[", "dict[", "list[")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/configuration.md)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        out.append(f"{loc or '(top level)'}: {msg}")
    # union branches repeat the same location; keep the first message per location
    seen: set[str] = set()
    uniq = []
    for line in out:
        k = line.split(":", 1)[0]
        if k in seen:
            continue
        seen.add(k)
        uniq.append(line)
    return uniq


def parse_topology(data: Any, base: Path | None = None, source: str | None = None) -> Topology:
    """Validate an already-parsed YAML document. Raises ConfigError listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(["the file must be a mapping with 'sites', 'tables' and 'links'"], source)
    try:
        model = _TopologyModel.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_pydantic(e) + _problems_besides(data, e, base), source) from None
    problems: list[str] = []
    check_topology(model, problems)
    sites = _site_configs(model, base, problems)
    if not problems:
        _same_database_problems(sites, problems)
    if problems:
        raise ConfigError(problems, source)
    names = list(model.sites)
    read_only = frozenset(n for n, s in model.sites.items() if s.read_only)
    links = expand_links(
        model.links, names, parse_duration(model.refresh.interval), parse_duration(model.refresh.jitter), read_only
    )
    if len(names) > 1:
        problems += _unreachable(names, links, read_only)
        if problems:
            raise ConfigError(problems, source)
    return Topology(
        sites=sites,
        tables=dict(model.tables),
        links=tuple(links),
        refresh=model.refresh,
        path=None,
        verify=model.verify,
        purge=model.purge,
    )


def _problems_besides(data: dict[str, Any], err: ValidationError, base: Path | None) -> list[str]:
    """The cross-reference problems of a file whose shape pydantic refused (`err`), so that one
    problem does not hide the others (one message per problem): the file is checked again with
    each field refused taken out (its default, where it has one). [] when it still does not
    validate (a required field refused), or has no other problem."""
    import copy

    lenient = copy.deepcopy(data)
    for e in err.errors():
        _take_out(lenient, e["loc"])
    try:
        model = _TopologyModel.model_validate(lenient)
    except ValidationError:
        return []
    problems: list[str] = []
    check_topology(model, problems)
    _site_configs(model, base, problems)
    refused = {line.split(":", 1)[0] for line in _format_pydantic(err)}
    return [p for p in dict.fromkeys(problems) if p.split(":", 1)[0] not in refused]


def _take_out(doc: Any, loc: tuple[Any, ...]) -> None:
    """Delete from `doc` the deepest element of path `loc` that it holds (a pydantic error's
    location: keys and indexes, and union-branch tags that match nothing)."""
    parent: Any = None
    key: Any = None
    node = doc
    for part in loc:
        if isinstance(node, dict) and part in node:
            parent, key, node = node, part, node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parent, key, node = node, part, node[part]
        elif not isinstance(part, int) and not (isinstance(node, dict) and part in node):
            continue  # a union branch's tag ('literal[...]', 'function-after[...]')
        else:
            break
    if isinstance(parent, dict):
        parent.pop(key, None)
    elif isinstance(parent, list) and isinstance(key, int):
        parent[key] = None  # (indexes of the others stay; validated again, the list is refused again)


def _site_configs(model: _TopologyModel, base: Path | None, problems: list[str]) -> dict[str, SiteConfig]:
    """Each site's configuration with ${VAR} expanded in its URL (each value encoded for the part
    it lands in), its `password` field put into the URL and a relative SQLite path resolved against
    `base` (the topology file's folder). Every password is remembered, so that no output shows it
    (config/secrets.py)."""
    sites: dict[str, SiteConfig] = {}
    for name, s in model.sites.items():
        where = f"sites.{name}"
        token = None if s.token is None else _expand_env(s.token, f"{where}.token", problems)
        secrets.remember(token)
        ca = None if s.ca is None else _expand_env(s.ca, f"{where}.ca", problems)
        if ca and base is not None and not os.path.isabs(ca):
            ca = str((base / ca).resolve())
        extra: dict[str, Any] = {
            "token": token,
            "ca": ca,
            "insecure_http": s.insecure_http,
            "connect_timeout": s.connect_timeout,
            "read_timeout": s.read_timeout,
        }
        seen: list[str] = []
        agent = _expand_env(s.url, f"{where}.url", seen).strip()
        if is_agent_url(agent) or (is_agent_url(s.url) and seen):
            problems.extend(seen)
            sites[name] = SiteConfig(url=agent, verify=s.verify, read_only=s.read_only, **extra)
            _agent_problems(sites[name], where, problems, password=s.password is not None)
            continue
        if s.ca is not None:
            problems.append(f"{where}.ca: a CA file is for an agent url (https://...), not a database url")
        url = _expand_url(s.url, f"{where}.url", problems)
        if url is None:
            sites[name] = SiteConfig(url=s.url, verify=s.verify, read_only=s.read_only)
            continue
        try:
            make_url(url)
            url = _resolve_file(url, base)
        except Exception:  # noqa: BLE001 - SQLAlchemy raises ArgumentError or ValueError
            problems.append(f"{where}.url: '{hidden_url(s.url)}' is not a database URL (e.g. sqlite:///s1.db)")
            sites[name] = SiteConfig(url=s.url, verify=s.verify, read_only=s.read_only)
            continue
        literal = url if _VAR.fullmatch(s.url.strip()) else s.url  # the URL as written, variables not filled in
        if literal.count("@") > 1:  # user:p@ss@host: the password's '@' written as it is
            problems.append(
                f"{where}.url: the URL has two '@': a password holding '@' (or '/', '#', ':', '%') must be "
                "percent-encoded in a URL; give it through ${VAR} or the site's password field instead"
            )
            sites[name] = SiteConfig(url=s.url, verify=s.verify, read_only=s.read_only)
            continue
        if s.password is not None:
            url = _with_password(url, _expand_env(s.password, f"{where}.password", problems), where, problems)
        final = make_url(url)
        secrets.remember(final.password)
        for k, v in final.query.items():
            if "password" in k.lower():
                for x in v if isinstance(v, tuple) else (v,):
                    secrets.remember(x)
        sites[name] = SiteConfig(url=url, verify=s.verify, read_only=s.read_only, **extra)
    return sites


def _agent_problems(s: SiteConfig, where: str, problems: list[str], *, password: bool) -> None:
    """The problems of a site reached through its agent (docs/agent.md): a token is needed, plain
    HTTP only to a loopback address unless insecure_http says so, no database password."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(s.url)
        host, _port = u.hostname, u.port
    except ValueError as e:
        problems.append(f"{where}.url: '{hidden_url(s.url)}' is not an agent url (e.g. https://host:8470): {e}")
        return
    if not host:
        problems.append(f"{where}.url: '{hidden_url(s.url)}' names no host (e.g. https://host:8470)")
    if u.path not in ("", "/") or u.query or u.username or u.password:
        problems.append(f"{where}.url: an agent url is scheme, host and port only (e.g. https://host:8470)")
    if not s.token:
        problems.append(f"{where}.token: an agent url needs the agent's token (token: ${{VAR}})")
    if password:
        problems.append(f"{where}.password: a site reached through its agent takes a token, not a database password")
    if u.scheme.lower() == "http" and not is_loopback(host) and not s.insecure_http:
        problems.append(
            f"{where}.url: plain http to '{host}', which is not a loopback address, would send the token and the "
            "changes in clear: use https (the agent's --tls-cert), or write 'insecure_http: true' for the site"
        )
    if s.ca is not None and u.scheme.lower() != "https":
        problems.append(f"{where}.ca: a CA file is for an https agent url")
    elif s.ca is not None and not os.path.isfile(s.ca):
        problems.append(f"{where}.ca: the file {s.ca} does not exist")


def _with_password(url: str, password: str, where: str, problems: list[str]) -> str:
    """`url` with `password` (a site's `password` field) as its password."""
    u = make_url(url)
    secrets.remember(password)
    if u.password is not None:
        problems.append(f"{where}: the password is given twice, in url and in password: keep one")
    elif _is_file(url):
        problems.append(f"{where}.password: '{hidden_url(url)}' names a database file, which takes no password")
    elif u.username is None:
        problems.append(f"{where}.password: the url names no user to log in with it (write user@host in the url)")
    else:
        return u.set(password=password).render_as_string(hide_password=False)
    return url


_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def database_identity(url: str) -> tuple[str, ...] | None:
    """What names one database whatever the driver and the spelling: ("file", its resolved path)
    for a database file, (server kind, host, port, database) for a server database (a loopback
    name for the loopback address, the default port filled in, MariaDB and MySQL one kind); None
    when it cannot tell (an agent url, an in-memory database, a URL it cannot read)."""
    try:
        u = make_url(url)
        backend = u.get_backend_name()
    except Exception:  # noqa: BLE001 - not a database url: checked elsewhere
        return None
    if _is_file(url):
        from multimaster.dialects import get_dialect

        db = get_dialect(backend).database_file(url)
        return ("file", os.path.realpath(db)) if db else None
    if backend not in _DEFAULT_PORTS or not u.database:
        return None
    kind = "mysql" if backend == "mariadb" else backend
    host = (u.host or "localhost").lower()
    host = "localhost" if host in _LOOPBACK else host
    return (kind, host, str(u.port or _DEFAULT_PORTS[backend]), u.database)


def _same_database_problems(sites: dict[str, SiteConfig], problems: list[str]) -> None:
    """Two sites that are one database (database_identity): init would install the first and
    crash at the second on its own bookkeeping."""
    first: dict[tuple[str, ...], str] = {}
    for name, s in sites.items():
        ident = None if s.agent else database_identity(s.url)
        if ident is None:
            continue
        if ident in first:
            problems.append(
                f"sites.{name}: the same database as site '{first[ident]}' ({hidden_url(s.url)}); a site is one "
                "database of its own: give each site its own database, or remove one of the two"
            )
        else:
            first[ident] = name


def _is_file(url: str) -> bool:
    """Whether `url` names a database file (by its dialect)."""
    try:
        from multimaster.dialects import get_dialect

        return get_dialect(make_url(url).get_backend_name()).database_file(url) is not None
    except Exception:  # noqa: BLE001 - a database multimaster does not support: init names it
        return False


def _unreachable(names: list[str], links: list[Link], read_only: frozenset[str] = frozenset()) -> list[str]:
    """A problem for every site that some writable site's changes never reach over `links`
    (a read-only site writes no changes: nothing needs to reach anyone from it)."""
    problems = []
    reach = {s: {s} for s in names}
    changed = True
    while changed:
        changed = False
        for ln in links:
            if not reach[ln.source] <= reach[ln.target]:
                reach[ln.target] |= reach[ln.source]
                changed = True
    for s in names:
        missing = set(names) - read_only - reach[s]
        if missing:
            ro = " (links from read-only sites are left out)" if read_only else ""
            problems.append(f"links: site '{s}' never receives changes from {sorted(missing)} (no path of links){ro}")
    return problems


def _duplicate_keys(node: yaml.Node | None, path: str = "") -> list[str]:
    """A problem for each key written twice in one mapping of the composed YAML document `node`
    (PyYAML would keep the last one silently: a site pasted twice would be the second one alone),
    named by its path and lines."""
    out: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            where = f"{path}.{key}" if path and key is not None else (key or path)
            line = key_node.start_mark.line + 1
            if key is not None and key != "<<" and key in seen:
                out.append(
                    f"{where}: written twice (lines {seen[key]} and {line}); YAML would keep the last one alone: "
                    "remove or rename one"
                )
            elif key is not None:
                seen[key] = line
            out += _duplicate_keys(value, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += _duplicate_keys(item, f"{path}[{i}]")
    return out


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read, validate and resolve a topology file. Touches no database."""
    p = Path(path)
    if not p.exists():
        raise ConfigError([f"file not found: {p}"], str(p))
    try:
        text = p.read_text()
        twice = _duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        if twice:
            raise ConfigError(twice, str(p))
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"not valid YAML: {e}"], str(p)) from None
    topo = parse_topology(data, base=p.resolve().parent, source=str(p))
    return Topology(topo.sites, topo.tables, topo.links, topo.refresh, p.resolve(), topo.verify, topo.purge)
