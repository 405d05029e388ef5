"""Sites that join and leave while every other site keeps writing.

**add-site** (online instantiation, Oracle Streams 2.8; a bulk load combined with incremental
replication from a capture point, IDAA 3.3). The new site NAME is listed in the topology file with
its links, its tables exist and are empty. Then ``add_site(topo, NAME, PEER)``:

1. checks everything first (nothing is written unless all checks pass): NAME pulls from PEER,
   PEER is installed, NAME's tables match PEER's and are empty, every site linked to NAME answers;
2. opens one consistent read of PEER (a snapshot: SQLite's WAL read transaction, REPEATABLE READ
   on servers) and, in one transaction at NAME, copies PEER's rows *with their identities*
   (shadow rows: rid, key, deleted, v_* versions), PEER's change log and dedupe record (so a change
   PEER already applied is a duplicate at NAME whichever route brings it), the table's base, and
   the clock — in batches, with progress; installs logs, snapshots and triggers at NAME;
3. sets NAME's watermarks: for PEER, PEER's second-order position read in the same snapshot (the
   capture point: everything up to it is in the copy); for another peer Q, PEER's own watermark
   for Q (PEER's unapplied snapshot rows of Q are copied too), or Q's current position when PEER
   does not pull Q (what NAME misses from Q reaches PEER and, relayed, NAME);
4. at every site pulling from NAME: creates the snapshot of NAME and its watermark (PEER starts
   at NAME's position after the copy, others at 0 and drop what they have as duplicates).

Nothing is lost (everything not in the copy is past a watermark) and nothing is applied twice
(everything in the copy is in NAME's change log or dedupe record). Running it again finishes an
interrupted add-site.

It runs on NAME's host: NAME is written, so the file gives its database url; PEER and the other
sites may be reached through their agents (docs/agent.md). The copy's reading half
(:func:`read_copy`, one consistent read yielding pieces) then runs in PEER's agent, which streams
the pieces; the writing half consumes them in NAME's one transaction either way, so an answer
broken off midway writes nothing. The checks and positions of step 1 and 3 are read through the
agents too. A puller reached through its agent cannot be written through it (the agent is
read-only): step 4 is left to its own host, ``add-site NAME --connect-only --site PULLER``
(:func:`connect_site`: from position 0, as for every puller but PEER), and the report names each
such puller with that command until it is connected.

**remove-site** retires a site: checks that every puller has pulled its changes (or --force),
brings every puller up to the furthest any of them pulled of its change log (for a site that
died: the entries one puller still holds in its snapshot are given to those behind and applied as
if pulled from it, core/salvage.py, engine/salvage.py; what cannot be given is reported, with the
fix), drops the other sites' snapshots, watermarks and puller records of it (releasing the log
entries kept for it), records it as removed at every other site (its changes still on their way
are applied there, not refused as of an unknown origin) and uninstalls its replication objects;
its rows stay. Then remove it and its links from the topology file.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import hidden_url
from multimaster.core.errorqueue import malformed
from multimaster.core.progress import Progress, ProgressEvent
from multimaster.core.salvage import Behind, CatchUp, Copy, Holding, verdict
from multimaster.core.salvage import plan as plan_copies
from multimaster.core.schemas import translate
from multimaster.core.versions import now_iso
from multimaster.dialects.schema import TableInfo
from multimaster.engine import apply, evolve, references, salvage, uniques
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.lockwatch import Watch, watching
from multimaster.engine.pull import read_entries, store_batch
from multimaster.engine.refresh import refresh_link, relay_origins
from multimaster.engine.remote import AgentSite
from multimaster.engine.schema import collation_findings, compare_schemas, keyed_columns
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly, ChangesHeld, ConfigError, MultimasterError, NotInstalled, SchemaError
from multimaster.ops.status import link_at_target, status
from multimaster.ops.uninstall import uninstall

if TYPE_CHECKING:
    from multimaster.config.topology import Topology

__all__ = [
    "add_site",
    "join",
    "connect_site",
    "connect_command",
    "read_copy",
    "max_seq2",
    "CopyRequest",
    "remove_site",
    "AddSiteReport",
    "ConnectReport",
    "RemoveSiteReport",
    "SiteNotDrained",
]


class SiteNotDrained(MultimasterError):
    def __init__(self, site: str, details: list[str]):
        super().__init__(
            f"site '{site}' still has changes its pullers have not applied ({'; '.join(details)}). "
            f"Refresh them first (multimaster refresh -t FILE); changes held in an error queue are listed by "
            f"'multimaster errors -t FILE', to retry or skip. Or pass --force to drop the changes still waiting "
            f"(held ones keep the snapshots until they are retried or skipped)."
        )


@dataclass
class AddSiteReport:
    site: str
    peer: str
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows copied
    identities: dict[str, int] = field(default_factory=dict)  # table -> shadow rows copied
    log_entries: dict[str, int] = field(default_factory=dict)  # table -> change-log entries copied
    watermarks: dict[str, dict[str, int]] = field(default_factory=dict)  # peer -> table -> seq2 at NAME
    pullers: list[str] = field(default_factory=list)  # sites now holding a snapshot of NAME
    already_installed: bool = False
    #: the sites pulling from NAME that this host reaches through their agents and that hold no
    #: snapshot of NAME yet (the agent writes nothing): {site, reason, fix (the command to run on
    #: the site's host)}
    pending: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every site pulling from NAME holds its snapshot of NAME: nothing is left to do elsewhere."""
        return not self.pending

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "ok": self.ok}


@dataclass
class ConnectReport:
    """`add-site NAME --connect-only`: the sites given their snapshot of NAME here."""

    site: str
    connected: list[str] = field(default_factory=list)  # newly given a snapshot of NAME
    already: list[str] = field(default_factory=list)  # held one before
    #: (without --site) the pullers reached through their agents that still hold none, as in AddSiteReport
    pending: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.pending

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "ok": self.ok}


@dataclass
class RemoveSiteReport:
    site: str
    cleaned: dict[str, list[str]] = field(default_factory=dict)  # other site -> what was dropped there
    unreachable: list[str] = field(default_factory=list)
    uninstalled: list[str] = field(default_factory=list)
    #: entries of the site's change log given from one puller's snapshot to another that lacked
    #: them: {site, table, from, after, upto (positions), applied (changes)}
    relayed: list[dict[str, Any]] = field(default_factory=list)
    #: the pullers that still lack changes of the site another has, or were not reached:
    #: {site, table (None: not reached), has, top, furthest (versions), changes_at_least, reason, fix}
    behind: list[dict[str, Any]] = field(default_factory=list)
    #: per puller and table, changes of the site pulled but not applied there (waiting, or held in
    #: the error queue), dropped with its snapshot
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per table, the site's own changes no puller pulled (lost); None: the site did not answer
    not_pulled: dict[str, int] | None = None
    #: why the snapshots of the site stay at its pullers (run remove-site again); empty: dropped
    kept: list[str] = field(default_factory=list)
    #: an earlier remove-site did all of it: every other site records the site as removed and
    #: keeps nothing of it (nothing was done this time)
    already_removed: bool = False

    @property
    def ok(self) -> bool:
        """Nothing left behind: every puller holds all of the site's changes any of them has, its
        snapshots of the site could go, and every site but the removed one was reached."""
        return not self.behind and not self.kept and all(u == self.site for u in self.unreachable)

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "ok": self.ok}


def _consistent_read(conn: Connection) -> None:
    """Make `conn`'s next transaction read one snapshot across statements where the database needs
    to be asked (REPEATABLE READ); SQLite's WAL read transaction already does."""
    try:
        dbapi = conn.connection.dbapi_connection
        levels = [] if dbapi is None else conn.dialect.get_isolation_level_values(dbapi)
    except Exception:  # noqa: BLE001 - a dialect that cannot tell: keep its default
        levels = []
    if "REPEATABLE READ" in levels:
        conn.execution_options(isolation_level="REPEATABLE READ")


def _stream(conn: Connection, sql: str, params: Any = (), size: int = 5000) -> Iterator[list[tuple[Any, ...]]]:
    res = conn.execution_options(stream_results=True).exec_driver_sql(sql, params)
    while True:
        part = res.fetchmany(size)
        if not part:
            return
        yield [tuple(r) for r in part]


def _parts(rows: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


#: change-log columns written unquoted (as engine/pull.py log_select_columns names them)
_PLAIN = ("ver", "origin", "op", "rid", "mask")


def _current_layout(
    r: tuple[Any, ...], union: list[str], layouts: dict[int, list[str]] | None, cur: list[str]
) -> tuple[Any, ...]:
    """A change-log row read with every column any schema version had (`union`, then the
    references and txn columns, then `sv` when versions are kept) in the layout of `cur` (the
    peer's current columns), carried by name (core/schemas.py translate)."""
    nu = len(union)
    head, new, old = r[:6], r[6 : 6 + nu], r[6 + nu : 6 + 2 * nu]
    rest = r[6 + 2 * nu : len(r) - (1 if layouts else 0)]
    src = union if not layouts else layouts[min(layouts) if r[-1] is None else int(r[-1])]
    at = {c: i for i, c in enumerate(union)}
    n_src, o_src = [new[at[c]] for c in src], [old[at[c]] for c in src]
    if src == cur or head[5] is None or head[2] not in ("I", "U", "D"):
        nv = tuple(n_src[src.index(c)] if c in src else None for c in cur)
        ov = tuple(o_src[src.index(c)] if c in src else None for c in cur)
        return (*head, *nv, *ov, *rest)
    t = translate(head[2], int(head[5]), n_src, o_src, src, cur, frozenset(union))
    return (*head[:5], t.mask, *t.new, *t.old, *rest)


def max_seq2(conn: Connection, site: Site, table: str) -> int:
    """A second-order position up to which every entry is final: the highest seq2 visible to
    `conn`, or below the horizon where writers capture concurrently (read first, in a statement of
    its own: entries may commit out of position order there)."""
    d = site.dialect
    h = d.read_horizons(conn, [table])[table]
    below = "" if h is None else f" WHERE seq2 < {int(h)}"
    return int(conn.exec_driver_sql(f"SELECT coalesce(max(seq2), 0) FROM {d.obj(table).log2}{below}").scalar() or 0)


# ---- what add-site reads at a site: of its database here, or through its agent (docs/agent.md) ----


def _installed(cl: Cluster, name: str) -> list[str]:
    s = cl.site(name)
    if isinstance(s, AgentSite):
        return s.installed()
    with s.read() as conn:
        return s.installed_tables(conn)


def _require_installed(cl: Cluster, name: str) -> None:
    """Raise NotInstalled unless every table of the topology is installed at site `name`."""
    have = set(_installed(cl, name))
    missing = [tb for tb in cl.topo.tables if tb not in have]
    if missing:
        raise NotInstalled(name, f"replication objects for table(s) {missing}", missing)


def _held_counts(cl: Cluster, name: str) -> dict[str, int]:
    """The error queue's counts per state at site `name` (store/errorqueue.py counts)."""
    s = cl.site(name)
    if isinstance(s, AgentSite):
        return s.error_counts()
    with s.read() as conn:
        return store.errorqueue.counts(conn, s.dialect)


def _positions(cl: Cluster, name: str) -> dict[str, int]:
    """Per table, a position of site `name`'s change log up to which every entry is final (max_seq2)."""
    s = cl.site(name)
    if isinstance(s, AgentSite):
        got = s.positions()
    else:
        with s.read() as conn:
            got = {tb: max_seq2(conn, s, tb) for tb in cl.topo.tables}
    missing = [tb for tb in cl.topo.tables if tb not in got]
    if missing:
        raise NotInstalled(name, f"replication objects for table(s) {missing} (its agent does not replicate them)")
    return got


def _describe(cl: Cluster, name: str) -> dict[str, TableInfo]:
    """Every table of the topology as site `name` has it (through an agent: what add-site compares)."""
    s = cl.site(name)
    if isinstance(s, AgentSite):
        got = s.describe()
        missing = [tb for tb in cl.topo.tables if tb not in got]
        if missing:
            raise SchemaError([f"site '{name}': its agent does not replicate table(s) {missing} (its topology file's tables)"])
        return got
    with s.read() as conn:
        return {tb: s.info(conn, tb, cl.topo) for tb in cl.topo.tables}


def _collations_unknown(cl: Cluster, peer: str, say: Progress) -> str:
    """'' when `peer`'s columns came with their collations (its database, or an agent of session 36
    or later); else the words added to each collation finding, also said once: an older agent
    does not send them (its /describe predates them), so its columns read as comparing exactly."""
    s = cl.site(peer)
    if not isinstance(s, AgentSite) or s.collations_reported:
        return ""
    note = (
        f" (site '{peer}' is reached through an agent older than multimaster's session 36, which does not report "
        "collations: its columns were taken as comparing exactly; run this multimaster version's agent there to "
        "compare them)"
    )
    say(f"note: {note[2:-1]}")
    return note


def add_site(
    topo: "Topology | Cluster",
    name: str,
    peer: str,
    *,
    replace: bool = False,
    batch_size: int = 5000,
    progress: Progress | None = None,
) -> AddSiteReport:
    """Bring site `name` into a running cluster by copying `peer` at a recorded log position.
    `progress` is told each step, the rows copied so far, and a lock the copy's transaction at
    `name` waits for past refresh.lock_wait_warn (engine/lockwatch.py). `name` is written: its
    database url must be in the file; `peer` and the other sites may be reached through their
    agents (the sites pulling from `name` among them are then left `pending` in the report)."""
    cl, own = as_cluster(topo)
    say = progress or (lambda _m: None)
    after = cl.topo.refresh.lock_wait_warn_seconds()
    watch = Watch(f"add-site {name}", progress, after) if progress and after is not None else None
    try:
        return _add_site(cl, name, peer, replace, batch_size, say, watch)
    finally:
        if own:
            cl.close()


def _add_site(
    cl: Cluster, name: str, peer: str, replace: bool, batch_size: int, say: Progress, watch: Watch | None = None
) -> AddSiteReport:
    t = cl.topo
    _check_add_site(t, name, peer)
    if t.sites[name].agent:  # the copy is written there
        raise AgentOnly(
            name,
            hidden_url(t.sites[name].url),
            "add-site (it writes the new site: run it on the new site's host, with its database url in the topology file)",
        )
    rep = AddSiteReport(name, peer)
    nsite = cl.site(name)
    sources = t.peers_of(name)
    pullers = [ln.target for ln in t.links if ln.source == name]
    # ---- checks: every site we will read or write answers and is installed ----------------
    for s in dict.fromkeys([peer, *sources, *pullers]):
        _require_installed(cl, s)
    held = _held_counts(cl, peer)  # its copy would lack the changes it holds (docs/errors.md)
    n_held = held["failed"] + held["waiting"] + held["txn"]
    if n_held:
        raise ChangesHeld(peer, n_held, f"add-site {name} --from {peer}")
    with nsite.read() as conn:
        installed = nsite.installed_tables(conn)
    if installed and replace:
        say(f"{name}: dropping its replication objects (--replace)")
        uninstall(cl, name)
        installed = []
    rep.already_installed = bool(installed)
    copied: dict[str, int] | None = None
    if not installed:
        pinfo = _describe(cl, peer)
        pdialect = cl.site(peer).dialect.name
        unknown = _collations_unknown(cl, peer, say)
        ninfo: dict[str, TableInfo] = {}
        schema_problems: list[str] = []
        with nsite.read() as nc:
            # what would stop the install half-way (MySQL: triggers refused under binary logging)
            schema_problems += [f"site '{name}': {m}" for m in nsite.dialect.install_problems(nc, list(t.tables))]
            for tb in t.tables:
                try:
                    ninfo[tb] = nsite.info(nc, tb, t)
                except SchemaError as e:
                    schema_problems += e.problems
                    continue
                pair, pair_dialects = {peer: pinfo[tb], name: ninfo[tb]}, {peer: pdialect, name: nsite.dialect.name}
                schema_problems += compare_schemas(tb, pair, pair_dialects)
                # a key or UNIQUE column the new site compares otherwise (docs/mysql.md "Collations")
                schema_problems += [m + unknown for m in collation_findings(tb, pair, pair_dialects, installed=False)[0]]
                n = nc.exec_driver_sql(f"SELECT count(*) FROM {nsite.dialect.quote(tb)}").scalar() or 0
                if n and not replace:
                    schema_problems.append(
                        f"table '{tb}' at site '{name}' has {n} rows; add-site copies '{peer}''s rows into empty tables "
                        "(--replace deletes them first)"
                    )
        if schema_problems:
            raise SchemaError(schema_problems)
        _forget_observations(cl, name)
        copied = _copy(cl, name, peer, ninfo, replace, batch_size, say, rep, watch)
    else:
        say(f"{name}: already installed; checking the sites that pull from it")
    _connect_pullers(cl, name, peer, pullers, rep, say, copied)
    return rep


def join(
    cl: Cluster,
    name: str,
    peer: str,
    ninfo: dict[str, TableInfo],
    absent: frozenset[str],
    say: Progress,
    watch: Watch | None = None,
    batch_size: int = 5000,
) -> AddSiteReport:
    """`init` bringing in a site whose tables are all empty (docs/decisions.md "init copies an
    empty site the way add-site does"): `name` becomes a copy of `peer` (installed, `name` pulls
    from it) read in one consistent snapshot at a recorded position of its change log, as
    add-site copies, so a transaction committed at `peer` while init runs reaches `name` once.
    `absent`: the sites init has not installed yet (the empty ones still to come): `name` pulls
    their change logs from the start, and they connect to `name` when they are copied in turn.
    `ninfo`: `name`'s tables, as init's checks read them. Running init again after it stopped
    here copies again (the copy is one transaction at `name`; MariaDB's DDL committed only empty
    objects, which the copy takes as they are)."""
    rep = AddSiteReport(name, peer)
    _forget_observations(cl, name)
    copied = _copy(cl, name, peer, ninfo, False, batch_size, say, rep, watch, absent)
    pullers = [ln.target for ln in cl.topo.links if ln.source == name and ln.target not in absent]
    _connect_pullers(cl, name, peer, pullers, rep, say, copied)
    return rep


def _forget_observations(cl: Cluster, name: str) -> list[str]:
    """Every other site that answers drops what it observed of `name` (a site instantiated again
    is not the site observed before: its tombstones and conflict rows are judged afresh). Returns
    the sites that did not answer, or that this host reaches through their agents (which write
    nothing: a puller among them drops it when it is connected on its host, `connect_site`)."""
    missed = []
    for s in cl.topo.sites:
        if s == name:
            continue
        site = cl.site(s)
        if isinstance(site, AgentSite):
            missed.append(s)
            continue
        try:
            with site.write() as conn:
                if site.installed_tables(conn):
                    store.fences.forget(conn, site.dialect, name)
        except MultimasterError:
            missed.append(s)
    return missed


def _check_add_site(t: Topology, name: str, peer: str) -> None:
    """Raise ConfigError unless both sites are defined, differ, and `name` pulls from `peer`."""
    problems = [
        f"site '{s}' is not defined under sites (add it to the topology file first)" for s in (name, peer) if s not in t.sites
    ]
    if not problems and name == peer:
        problems.append("a site cannot be instantiated from itself: --from names an existing site")
    if not problems and peer not in t.peers_of(name):
        problems.append(f"links: '{name}' must pull from '{peer}' (add a link from {peer} to {name}) to be instantiated from it")
    if problems:
        raise ConfigError(problems, str(t.path) if t.path else None)


def connect_command(name: str, puller: str) -> str:
    """The command that connects `puller` to `name` on the puller's host."""
    return f"multimaster add-site -t FILE {name} --connect-only --site {puller}"


def _connect(cl: Cluster, s: str, name: str, start: dict[str, int] | None) -> bool:
    """Give site `s` (a database here) its snapshot of `name` and the link's watermark rows, in one
    transaction: from `start` per table where the watermark is still 0 (the peer after the copy),
    else from 0 (what it has already is dropped as duplicates). A site newly connected drops what
    it observed of an earlier `name`. Returns whether it was newly connected."""
    t = cl.topo
    site = cl.site(s)
    d = site.dialect
    with site.write() as conn:
        site.require_installed(conn, t)
        have = store.watermarks.tables_of(conn, d, name)
        for tb in t.tables:
            info = site.info(conn, tb, t)
            d.install_snapshot(conn, info, name)
            references.install(conn, site, info, [name])
            store.links.ensure(conn, d, name, tb)
            if start is not None and store.watermarks.read(conn, d, name, tb) == 0:
                store.watermarks.write(conn, d, name, tb, start[tb])  # the peer already holds all NAME has
            # its snapshot holds what it pulls from here on
            wm = store.watermarks.read(conn, d, name, tb)
            store.purges.ensure_snapshot_horizon(conn, d, name, tb, wm)
        new = not set(t.tables) <= have
        if new:
            store.fences.forget(conn, d, name)
    return new


def _pending(cl: Cluster, name: str, s: str) -> dict[str, str] | None:
    """Puller `s`, reached through its agent: None when it holds its snapshot of `name` already
    (connected on its host), else why not and the command that connects it there."""
    site = cl.site(s)
    assert isinstance(site, AgentSite)
    try:
        held = site.watermarks_held(name)
        if held.get("installed") and all(held["watermarks"].get(tb) is not None for tb in cl.topo.tables):
            return None
        reason = f"'{s}' is reached through its agent, which writes nothing: its snapshot of '{name}' is made on its host"
    except MultimasterError as e:
        reason = f"'{s}' is reached through its agent, which did not answer ({redact(str(e))})"
    return {"site": s, "reason": reason, "fix": f"on {s}'s host: {connect_command(name, s)}"}


def _connect_pullers(
    cl: Cluster, name: str, peer: str, pullers: list[str], rep: AddSiteReport, say: Progress, copied: dict[str, int] | None
) -> None:
    """Give every site that pulls from `name` a snapshot of it and a link; `peer`, if it has not
    pulled from `name` yet, starts after the entries `name`'s change log got from it (`copied`:
    per table the last position the copy wrote; None: `name` was installed already, so it may
    have written since: from 0, as every other puller). A puller this host reaches through its
    agent is left in `rep.pending`, with the command that connects it on its own host, unless it
    holds its snapshot of `name` already."""
    for s in pullers:
        if isinstance(cl.site(s), AgentSite):
            p = _pending(cl, name, s)
            if p is None:
                rep.pullers.append(s)
            else:
                rep.pending.append(p)
                say(f"{s}: pending: {p['fix']}")
            continue
        _connect(cl, s, name, copied if s == peer else None)
        rep.pullers.append(s)
        say(f"{s}: snapshot of {name} ready")


def connect_site(
    topo: "Topology | Cluster", name: str, sites: list[str] | None = None, *, progress: Progress | None = None
) -> ConnectReport:
    """`add-site NAME --connect-only`, run on the host of sites that pull from `name`: each of
    `sites` (default: every puller of `name` whose database url is in this file) gets its
    snapshot of `name` and its watermarks, from position 0 (what `name` copied from its peer is
    dropped there as duplicates), in one transaction per site; running it again changes nothing.
    `name` must be installed (add-site ran on its host); it may be reached through its agent.
    Without `sites`, the pullers reached through their agents that hold no snapshot of `name` yet
    are reported `pending`."""
    cl, own = as_cluster(topo)
    say = progress or (lambda _m: None)
    try:
        t = cl.topo
        if name not in t.sites:
            raise ConfigError([f"site '{name}' is not defined under sites"], str(t.path) if t.path else None)
        pullers = [ln.target for ln in t.links if ln.source == name]
        chosen = list(dict.fromkeys(sites)) if sites else [p for p in pullers if not t.sites[p].agent]
        problems = [f"--site: site '{s}' is not defined under sites" for s in chosen if s not in t.sites]
        problems += [
            f"--site: site '{s}' does not pull from '{name}' (no link from {name} to {s})"
            for s in chosen
            if s in t.sites and s not in pullers
        ]
        if problems:
            raise ConfigError(problems, str(t.path) if t.path else None)
        for s in chosen:
            if t.sites[s].agent:
                raise AgentOnly(s, hidden_url(t.sites[s].url), f"connecting it to '{name}' (it writes its snapshot of '{name}')")
        _require_installed(cl, name)  # add-site ran on its host
        rep = ConnectReport(name)
        for s in chosen:
            if _connect(cl, s, name, None):
                rep.connected.append(s)
                say(f"{s}: snapshot of {name} ready")
            else:
                rep.already.append(s)
                say(f"{s}: already holds its snapshot of {name}")
        if not sites:
            for s in pullers:
                if t.sites[s].agent and (p := _pending(cl, name, s)) is not None:
                    rep.pending.append(p)
        return rep
    finally:
        if own:
            cl.close()


# ---- the copy: read in one snapshot of the peer (here, or by its agent), written in one transaction at the new site ----


@dataclass(frozen=True)
class CopyRequest:
    """What the new site asks of the peer's consistent read (`read_copy`)."""

    target: str  #: the new site
    tables: tuple[str, ...]
    #: the new site's other sources the peer pulls: their watermarks at the peer and the peer's
    #: snapshot rows of them not applied yet come along
    relayed: tuple[str, ...]
    #: the new site's change log has ``txn`` (docs/transactions.md): every site of this release
    #: (an add-site of a release before session 36 asks without it for a SQLite site)
    txn: bool
    batch_size: int  #: rows per piece


def read_copy(psite: Site, infos: Mapping[str, TableInfo], ask: CopyRequest) -> Generator[dict[str, Any], None, None]:
    """The reading half of add-site's copy, at the peer `psite` (its database: run here for a peer
    reached by its database url, by the peer's agent otherwise): every table of `ask` (as `infos`
    describes it there) read in ONE consistent read (a snapshot: SQLite's WAL read transaction,
    REPEATABLE READ on servers), as pieces of plain data, each a dict with a ``kind``:

    - ``site``: the peer's clock and the sites recorded as removed there (first: the snapshot is
      taken when it is read);
    - per table, ``table`` (the capture point ``position``, the row count, the columns of the
      rows, shadow and change log), then ``rows`` pieces of ``batch_size`` rows ``into`` the
      table (``rows``), its shadow (``shadow``; ``fresh``: the peer's own rows inserted since its
      shadow last caught up), its UNIQUE bookkeeping (``parked``, ``marks``, with ``columns``),
      the change log (``log``, carried to the current columns), then ``applied`` (the dedupe
      record and the peer's own changes up to the capture point), then ``rows`` into ``past``
      (entries past the capture point the snapshot holds: applied already) and ``waiting`` (per
      relayed ``peer``, its snapshot rows not applied at the peer), then ``table_end`` (the
      table's registration, the peer's watermarks of the relayed sources).

    The horizon of each table is read before the snapshot is taken (every entry below it is in
    the snapshot if committed; entries at or above it may commit later, at lower positions than
    some the snapshot holds). Close the iterator to end the read early."""
    pd = psite.dialect
    with psite.read() as hconn:
        horizons = pd.read_horizons(hconn, list(ask.tables))
    with psite.engine.connect() as pconn:
        _consistent_read(pconn)
        with pconn.begin():
            hlc = pd.read_clock(pconn) or 0
            yield {"kind": "site", "clock": hlc, "retired": sorted(store.retired.read(pconn, pd))}
            for tb in ask.tables:
                yield from _read_table(pconn, psite, infos[tb], ask, horizons[tb])


def _read_table(pconn: Connection, psite: Site, pi: TableInfo, ask: CopyRequest, horizon: int | None) -> Iterator[dict[str, Any]]:
    """read_copy's pieces of one table."""
    pd = psite.dialect
    tb, po, size = pi.name, pd.obj(pi.name), ask.batch_size
    # the capture point: the new site pulls the peer's entries after it
    pos = (
        horizon - 1
        if horizon is not None
        else int(pconn.exec_driver_sql(f"SELECT coalesce(max(seq2), 0) FROM {po.log2}").scalar() or 0)
    )
    cols = [pi.key.name, *pi.column_names]
    scols = ["rid", "key", "deleted"] + ["v_" + s.name for s in pi.spec.slots]
    # a slot's other concurrent heads (docs/conflicts.md "Concurrent heads", Dialect.install_heads)
    scols += [p_ + s.name for s in pi.spec.slots if s.policy.chooses for p_ in ("h_", "x_")]
    lcols = (
        ["ver", "origin", "op", "rid", "key", "mask"]
        + ["n_" + c for c in pi.column_names]
        + ["o_" + c for c in pi.column_names]
        + [p_ + r.column for r in pi.refs for p_ in ("f_", "fo_")]
        + (["txn"] if ask.txn else [])  # docs/transactions.md
        + ["sup"]  # the heads the change superseded (docs/conflicts.md "Concurrent heads")
    )
    total = int(pconn.exec_driver_sql(f"SELECT count(*) FROM {pd.quote(tb)}").scalar() or 0)
    yield {"kind": "table", "table": tb, "position": pos, "rows_total": total, "columns": cols, "shadow": scols, "log": lcols}

    def piece(into: str, rows: list[Any], **more: Any) -> dict[str, Any]:
        return {"kind": "rows", "table": tb, "into": into, **more, "rows": rows}

    # rows, with the keys they have at the peer
    sel = ", ".join(pd.quote(c) for c in cols)
    for part in _stream(pconn, f"SELECT {sel} FROM {pd.quote(tb)} ORDER BY {pd.quote(pi.key.name)}", size=size):
        yield piece("rows", part)
    # identities
    sq = ", ".join(pd.quote(c) for c in scols)
    for part in _stream(pconn, f"SELECT {sq} FROM {po.shadow} ORDER BY rid", size=size):
        yield piece("shadow", part)
    # the peer's own rows inserted since its shadow last caught up (capture may write it lazily)
    for part in _parts(pd.fresh_identities(pconn, pi), size):
        yield piece("fresh", part)
    for which, mcols, mrows in uniques.read_marks(pconn, pd, pi):  # the values marked rows want
        for part in _parts(mrows, size):
            yield piece(which, part, columns=mcols)
    # the change log: what the peer applied is applied at the new site too (dedupe), and relays on
    # (entries written in earlier schema versions of the peer: carried to its current columns by name)
    layouts = store.schemas.layouts(pconn, pd, tb)
    union = sorted({c for cs in (layouts or {}).values() for c in cs} | set(pi.column_names))
    rcols = (
        lcols[:6]
        + ["n_" + c for c in union]
        + ["o_" + c for c in union]
        + lcols[6 + 2 * len(pi.column_names) :]
        + (["sv"] if layouts else [])
    )
    lq = ", ".join(pd.quote(c) for c in rcols)
    for raw in _stream(pconn, f"SELECT {lq} FROM {po.log} ORDER BY seq", size=size):
        # an entry damaged by hand is held by every puller of the peer already (docs/errors.md):
        # copied, the new site would relay it, and its pullers would hold it once more
        ok = [r for r in raw if malformed(r[0], r[1], r[2], r[3], r[5]) is None]
        yield piece("log", [_current_layout(r, union, layouts, list(pi.column_names)) for r in ok])
    # the peer's own changes up to the capture point are in the copy: applied at the new site too
    own_top = store.origins.newest_own(pconn, pd, tb, psite.name, upto_seq=pos)
    yield {"kind": "applied", "table": tb, "origins": store.origins.read(pconn, pd, tb), "own_top": own_top or None}
    # ... and the entries past it that the snapshot holds (committed between the horizon and the
    # snapshot) are in the copy too: stored as applied in the new site's snapshot of the peer, so
    # pulling them again skips them (engine/pull.py store_batch)
    if horizon is not None:
        for part in _parts(read_entries(pconn, psite, ask.target, pi, pos), size):
            yield piece("past", part)
    reg = store.tables.registration(pconn, pd, tb)
    if reg is None:  # checked first: the peer lost it meanwhile
        raise NotInstalled(psite.name, f"replication objects for table(s) {[tb]}", [tb])
    wms: dict[str, int] = {}
    for q in ask.relayed:
        wms[q] = store.watermarks.read(pconn, pd, q, tb)
        # the peer's snapshot rows of q not yet applied there: pulled by the peer (below its
        # watermark), not in the copy, so the new site takes them over
        # (every column of an entry: the references' identities and the source transaction too)
        wcols = ["pseq", *lcols, "applied"]
        wsel = ", ".join(pd.quote(c) for c in wcols)
        for part in _stream(pconn, f"SELECT {wsel} FROM {pd.obj(tb, q).snap} WHERE applied <> 1", size=size):
            yield piece("waiting", part, peer=q, columns=wcols)
    # the key up to which the peer's keys are ranks (where its writers capture concurrently, keys
    # above it were drawn by local inserts; None: every key is a rank)
    ranked = None
    if pd.caps.concurrent_capture:
        ranked = max(store.tables.keys_ranked(pconn, pd, tb), store.tables.base_max(pconn, pd, tb))
    yield {"kind": "table_end", "table": tb, "registration": tuple(reg), "watermarks": wms, "ranked": ranked}


def _copy(
    cl: Cluster,
    name: str,
    peer: str,
    ninfo: dict[str, TableInfo],
    replace: bool,
    batch_size: int,
    say: Progress,
    rep: AddSiteReport,
    watch: Watch | None = None,
    absent: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Install `name` as a copy of `peer`, read in one snapshot (at its database here, or by its
    agent). Returns per table the last position of `name`'s change log the copy wrote."""
    t = cl.topo
    nsite, psite = cl.site(name), cl.site(peer)
    sources = t.peers_of(name)
    peer_sources = set(t.peers_of(peer))
    # a position in every other source's log, read before the copy (any position is complete:
    # what NAME skips there reaches PEER, which NAME pulls from); a source init installs after
    # NAME (`absent`) from its start: what its log gets from its own copy is a duplicate here
    other_pos = {
        q: {tb: 0 for tb in t.tables} if q in absent else _positions(cl, q)
        for q in sources
        if q != peer and q not in peer_sources
    }
    relayed = tuple(q for q in sources if q != peer and q in peer_sources)
    nsite.dialect.prepare_site(nsite.engine)
    ask = CopyRequest(name, tuple(t.tables), relayed, True, batch_size)
    if isinstance(psite, AgentSite):
        pieces = psite.read_copy(ask.target, list(ask.tables), list(ask.relayed), ask.txn, ask.batch_size)
    else:
        pieces = read_copy(psite, _describe(cl, peer), ask)
    with contextlib.closing(pieces):
        npos = _write_copy(cl, name, peer, ninfo, pieces, replace, say, rep, watch, other_pos)
    say(f"{name}: installed from {peer}")
    return npos


@dataclass
class _Into:
    """The table a copy is writing at the new site: its description there and the columns the
    peer's pieces carry."""

    info: TableInfo
    head: dict[str, Any]
    rows: Callable[[int], None]
    entries: Callable[[int], None]
    #: per column of the table, the converter of a value as the peer's driver returned it to one
    #: the new site's driver stores exactly (dialects/types.py; a peer of another database kind)
    adapt: dict[str, Callable[[Any], Any]] = field(default_factory=dict)

    def exact(self, into: str, cols: list[str], rows: list[Any]) -> list[Any]:
        """`rows` (of columns `cols`, going `into`) with the table's values as the new site stores
        them: the row's columns (its key aside), a change's n_ and o_ values, a parked row's c_
        values, a mark's i_ value."""
        if into == "rows":
            names: list[str | None] = [None] + cols[1:]
        else:
            pre = ("n_", "o_") if into in ("log", "waiting") else ("c_",) if into == "parked" else ("i_",)
            names = [c[2:] if c.startswith(pre) else None for c in cols]
        conv = [(i, self.adapt[n]) for i, n in enumerate(names) if n is not None and n in self.adapt]
        if not conv:
            return rows
        out = []
        for r in rows:
            x = list(r)
            for i, f in conv:
                x[i] = self._exact(f, x[i], names[i], into, r[0] if into == "rows" else None)
            out.append(tuple(x))
        return out

    def _exact(self, f: Callable[[Any], Any], v: Any, col: str | None, into: str, key: Any) -> Any:
        """`v` converted by `f`; a value of no kind its column holds (SQLite keeps '12abc' in an
        INTEGER) is refused naming it: nothing of the copy is kept (docs/types.md "Values a site
        cannot store")."""
        try:
            return f(v)
        except (TypeError, ValueError, ArithmeticError) as e:
            row = (
                f", row {self.info.key.name}={key!r}"
                if into == "rows"
                else f", a value kept in its {into} (a change recorded before)"
            )
            raise SchemaError(
                [
                    f"table '{self.info.name}'{row}, column '{col}': {e}; the new site cannot store it exactly: "
                    'write a value it can hold where it was written and run again (docs/types.md "Values a site cannot store")'
                ]
            ) from None


def _write_copy(
    cl: Cluster,
    name: str,
    peer: str,
    ninfo: dict[str, TableInfo],
    pieces: Iterator[dict[str, Any]],
    replace: bool,
    say: Progress,
    rep: AddSiteReport,
    watch: Watch | None,
    other_pos: dict[str, dict[str, int]],
) -> dict[str, int]:
    """The writing half of add-site's copy: `pieces` (read_copy's, from the peer's database or its
    agent) written at `name` in one transaction, which installs its logs, snapshots and triggers
    and sets its watermarks. A read that fails or ends early (an agent's answer broken off) ends
    it with nothing written. Returns per table the last position of `name`'s change log written."""
    t = cl.topo
    nsite = cl.site(name)
    nd = nsite.dialect
    sources = t.peers_of(name)
    head = next(pieces)  # the peer's snapshot is taken before the new site's write lock
    if head.get("kind") != "site":
        raise MultimasterError(f"add-site {name}: the copy of '{peer}' did not start with its clock; nothing was written")
    npos: dict[str, int] = {}
    done: list[str] = []
    ranked: dict[str, int | None] = {}  # per table copied: the peer's ranked keys (table_end)
    cur: _Into | None = None
    with watching(nsite, watch) as lw, nsite.write(lw) as nconn:
        nd.install_site(nconn, name)
        store.install(nconn, nd)
        # rows referencing rows copied later (docs/foreign-keys.md); one block for the whole copy:
        # the ranking's own (nested) block then reuses it, and MariaDB's checks stay off until the
        # end (they came back on after the first ranked table, so the later tables' copied
        # references were checked, before they had moved)
        with references.deferred(nconn, nd):
            for p in pieces:
                kind, tb = p["kind"], p.get("table")
                if kind == "table":
                    if tb not in ninfo or tb in done:
                        raise MultimasterError(
                            f"add-site {name}: the copy of '{peer}' sent table '{tb}' unasked; nothing was written"
                        )
                    ni = ninfo[tb]
                    cur = _Into(
                        ni,
                        p,
                        _copied(say, f"{peer} -> {name}", tb, "rows", int(p["rows_total"])),
                        _copied(say, f"{peer} -> {name}", tb, "change-log entries", None),
                        {c: f for c, f in zip(ni.column_names, nd.value_adapters(ni)) if f is not None},
                    )
                    rep.rows[tb] = rep.identities[tb] = rep.log_entries[tb] = 0
                    _start_table(nconn, nsite, cur.info, sources, replace)
                    continue
                if cur is None or tb != cur.info.name:
                    raise MultimasterError(f"add-site {name}: the copy of '{peer}' sent pieces out of order; nothing was written")
                if kind == "rows":
                    _write_rows(nconn, nsite, peer, cur, p, rep)
                elif kind == "applied":
                    # the last position of NAME's change log the copy wrote (its log is complete now)
                    npos[tb] = int(nconn.exec_driver_sql(f"SELECT coalesce(max(seq2), 0) FROM {nd.obj(tb).log2}").scalar() or 0)
                    store.origins.copy_in(nconn, nd, tb, list(p["origins"]))
                    if p["own_top"]:
                        store.origins.mark_applied(nconn, nd, tb, peer, str(p["own_top"]))
                elif kind == "table_end":
                    _finish_table(nconn, nsite, peer, cur, p, sources, other_pos, rep)
                    ranked[tb] = p.get("ranked")
                    done.append(tb)
                    cur = None
            missing = [tb for tb in t.tables if tb not in done]
            if missing:
                raise MultimasterError(f"add-site {name}: the copy of '{peer}' lacks table(s) {missing}; nothing was written")
            for tb in done:  # every table is copied: the references to a ranked key are all there to move
                _settle_table(nconn, nsite, name, ninfo[tb], ranked[tb], name in t.read_only)
        # the new site's whole clock (no table: MySQL moves every table's clock row and the site's
        # floor) to at least the source's, so its next change sorts after everything copied
        nd.advance_clock(nconn, int(head["clock"]))
        for g in head["retired"]:  # the sites removed before: their changes on the way are applied here too
            store.retired.record(nconn, nd, str(g), now_iso())
    return npos


def _start_table(nconn: Connection, nsite: Site, ni: TableInfo, sources: list[str], replace: bool) -> None:
    """The new site's objects of one table, before its rows come."""
    nd = nsite.dialect
    if replace:
        nconn.exec_driver_sql(f"DELETE FROM {nd.quote(ni.name)}")
    nd.install_table(nconn, ni)
    nd.install_heads(nconn, ni)  # the change log's sup, the shadow's heads (as init installs them)
    uniques.install(nconn, nd, ni)
    for q in sources:
        nd.install_snapshot(nconn, ni, q)
        store.links.ensure(nconn, nd, q, ni.name)
    references.install(nconn, nsite, ni, sources)


def _write_rows(nconn: Connection, nsite: Site, peer: str, cur: _Into, p: dict[str, Any], rep: AddSiteReport) -> None:
    """One ``rows`` piece of the copy, written where it goes at the new site."""
    nd, ni, into, rows = nsite.dialect, cur.info, p["into"], p["rows"]
    tb, no = ni.name, nd.obj(ni.name)
    if not rows:
        return
    if into == "rows":
        cols = cur.head["columns"]
        ins = f"INSERT INTO {nd.quote(tb)} ({', '.join(nd.quote(c) for c in cols)}) VALUES ({nd.ph(len(cols))})"
        _insert_copied(nconn, nsite, peer, ni, ins, cur.exact(into, cols, rows))
        rep.rows[tb] += len(rows)
        cur.rows(rep.rows[tb])
    elif into == "shadow":
        scols = cur.head["shadow"]
        ins = f"INSERT INTO {no.shadow} ({', '.join(nd.quote(c) for c in scols)}) VALUES ({nd.ph(len(scols))})"
        _insert_copied(nconn, nsite, peer, ni, ins, rows, shadow=True)
        rep.identities[tb] += len(rows)
    elif into == "fresh":
        _insert_copied(nconn, nsite, peer, ni, f"INSERT INTO {no.shadow} (rid, {nd.key_col}) VALUES ({nd.ph(2)})", rows, True)
        rep.identities[tb] += len(rows)
    elif into in ("parked", "marks"):
        uniques.write_marks(nconn, nd, ni, into, p["columns"], cur.exact(into, p["columns"], rows))
    elif into == "log":
        lcols = cur.head["log"]
        nd.append_log(
            nconn,
            tb,
            [nd.key_col if c == "key" else c if c in _PLAIN else nd.quote(c) for c in lcols],
            rows=cur.exact(into, lcols, rows),
        )
        rep.log_entries[tb] += len(rows)
        cur.entries(rep.log_entries[tb])
    elif into == "past":
        store_batch(nconn, nsite, ni, peer, rows, applied=True)
    elif into == "waiting":
        q, cols = str(p["peer"]), p["columns"]
        collist = ", ".join(nd.quote(c) for c in cols)
        ins = nd.insert_ignore_into(nd.obj(tb, q).snapshot(), collist, f"VALUES ({nd.ph(len(cols))})")
        nconn.exec_driver_sql(ins, cur.exact(into, cols, rows))
    else:
        raise MultimasterError(f"add-site {nsite.name}: the copy of '{peer}' sent rows for '{into}'; nothing was written")


def _insert_copied(
    nconn: Connection, nsite: Site, peer: str, ni: TableInfo, ins: str, rows: list[Any], shadow: bool = False
) -> None:
    """`rows` of the copy inserted by `ins` (into the table or its shadow). Two keys or UNIQUE
    values that the peer holds apart and that are one value here (a MariaDB PAD SPACE collation:
    'a' and 'a '; multimaster's own tables there hold the identities 'k:a' and 'k:a ' as one) are
    refused naming both, the collation and the fix (Dialect.explain_rejection finds the row the
    refused one equals, so the piece is written again row by row to reach it); nothing of the copy
    is kept. `shadow`: `ins` writes the table's shadow (its identities). Before session 36 the
    copy failed with the database's bare duplicate-key error."""
    sp = nconn.begin_nested()
    try:
        nconn.exec_driver_sql(ins, rows)
        sp.commit()
        return
    except DBAPIError as e:
        sp.rollback()
        first: DBAPIError = e
    nd = nsite.dialect
    for r in rows:
        sp = nconn.begin_nested()
        try:
            nconn.exec_driver_sql(ins, [r])
            sp.commit()
        except DBAPIError as e:
            sp.rollback()
            why = nd.explain_identity_collision(nconn, ni, e) if shadow else nd.explain_rejection(nconn, ni, e)
            if why is None:
                raise
            raise SchemaError([_copy_collision(nsite, peer, ni, why)]) from None
    raise first


def _copy_collision(nsite: Site, peer: str, ni: TableInfo, why: str) -> str:
    """The words for two of `peer`'s rows that `nsite` takes as one (`why`: the dialect's
    explanation, its fix for a held change replaced by the copy's)."""
    said = why.split(" Fix: ")[0].rstrip(".")
    loose = [c for c, _role in keyed_columns(ni) if c.collation is not None and c.collation.merges and not c.collation.pads_only]
    fix = (
        f"make the column compare exactly at '{nsite.name}' ("
        + "; ".join(nsite.dialect.exact_collation_sql(ni.name, c) for c in loose)
        + f"), or change one of the two values at '{peer}'"
        if loose
        else f"change one of the two values at '{peer}' (trailing spaces trimmed)"
    )
    if not ni.spec.renumber:  # a key deleted there stays an identity (its tombstone), which the copy carries
        fix += (
            " (a key is changed by a delete and an insert, and the copy carries the deleted key's identity, its tombstone, "
            "until 'multimaster purge' removes it)"
        )
    return (
        f"site '{nsite.name}' cannot hold two rows of '{peer}' that it takes as one value: {said}. Nothing of the copy "
        f"was kept. Fix: {fix}; then run it again"
    )


def _finish_table(
    nconn: Connection,
    nsite: Site,
    peer: str,
    cur: _Into,
    p: dict[str, Any],
    sources: list[str],
    other_pos: dict[str, dict[str, int]],
    rep: AddSiteReport,
) -> None:
    """The end of one table's copy: its registration, where the new site starts pulling each
    source, and its capture (the rest once every table is copied: _settle_table)."""
    nd, ni, tb = nsite.dialect, cur.info, cur.info.name
    store.tables.copy_in(nconn, nd, tb, tuple(p["registration"]))
    for q in sources:
        if q == peer:
            wm = int(cur.head["position"])
        elif q in p["watermarks"]:
            wm = int(p["watermarks"][q])
        else:
            wm = other_pos[q][tb]
        store.watermarks.write(nconn, nd, q, tb, wm)
        store.purges.ensure_snapshot_horizon(nconn, nd, q, tb, wm)  # nothing pulled below it is held
        rep.watermarks.setdefault(q, {})[tb] = wm
    nd.install_capture(nconn, ni)


def _settle_table(nconn: Connection, nsite: Site, name: str, ni: TableInfo, ranked: int | None, read_only: bool) -> None:
    """After every table is copied: the copied keys of renumbered `ni` ranked (`ranked`: the
    peer's, table_end) with every reference to them, then the read-only guards, the schema
    version, the key counters. Ranked as each table's copy ended, before session 37, a table
    copied later (a child) kept the keys it references as the peer had them: a child named the
    wrong parent, silently, or a key no row held (a foreign-key error at COMMIT)."""
    nd = nsite.dialect
    if ni.spec.renumber:  # (the key counter exists now)
        _rank_copied_keys(nconn, nsite, ni, ranked)
    nd.guard_writes(nconn, ni, name, read_only)  # docs/topologies.md "Read-only sites"
    evolve.ensure_registered(nconn, nsite, ni)  # schema version 1 (docs/schema-changes.md)
    nd.after_apply(nconn, ni)


def _rank_copied_keys(nconn: Connection, nsite: Site, ni: TableInfo, ranked: int | None) -> None:
    """The copy of renumbered `ni` holds the peer's keys: those up to `ranked` are ranks, kept as
    they are (a purge at the peer left holes in its ranks, which every other site has too); those
    above it were drawn by the peer's local inserts, ranked here as the peer's next reconcile
    ranks them (core/keys.py rank_moves). Where writers capture concurrently here, every key is a
    rank from then on (keys_ranked), and the key counter is past them."""
    nd = nsite.dialect
    base = store.tables.base_max(nconn, nd, ni.name)
    nd.set_applying(nconn, True)
    if ranked is not None:
        apply.normalize_keys(nconn, nd, ni, base, floor=ranked)
    if nd.caps.concurrent_capture:
        apply.keys_ranked_now(nconn, nd, ni, base)
    nd.set_applying(nconn, False)


def _copied(say: Progress, subject: str, table: str, unit: str, total: int | None) -> Callable[[int], None]:
    """What the copy tells `say` of `n` `unit` of `table` copied so far (of `total`, when counted)."""
    t0 = time.perf_counter()
    return lambda n: say(
        ProgressEvent("copy", subject, table=table, done=n, total=total, unit=unit, seconds=time.perf_counter() - t0)
    )


# ---------------------------------------------------------------------------------------------
# remove-site


def remove_site(
    topo: "Topology | Cluster", name: str, *, force: bool = False, progress: Progress | None = None
) -> RemoveSiteReport:
    """Retire site `name` (still listed in the topology file, with its links).

    First the sites that pull from it are brought up to the furthest any of them pulled of its
    change log (`_salvage`); then what the other sites keep for it is dropped and its replication
    objects are removed. The report says what could not be recovered (`behind`, `not_pulled`,
    `dropped`) and what to do; `ok` is False when a site lacks changes another has, or a site
    other than `name` was not reached."""
    cl, own = as_cluster(topo)
    say = progress or (lambda _m: None)
    try:
        t = cl.topo
        if name not in t.sites:
            raise ConfigError(
                [f"site '{name}' is not defined under sites (remove-site reads its links: keep it in the file until done)"]
            )
        rep = RemoveSiteReport(name)
        pullers = [ln.target for ln in t.links if ln.source == name]
        sources = t.peers_of(name)
        if _removed_already(cl, name):
            rep.already_removed = True
            return rep
        if not force:
            _check_drained(cl, name)
        keep = _salvage(cl, name, pullers, rep, say)
        rep.kept = keep
        others = [n for n in t.sites if n != name]
        for s in dict.fromkeys([*pullers, *sources, *others]):
            site = cl.site(s)
            dropped: list[str] = []
            try:
                with site.write() as conn:
                    d = site.dialect
                    # its changes still on their way (relayed) are applied, not refused (docs/errors.md)
                    store.retired.record(conn, d, name, now_iso())
                    dropped.append(f"'{name}' recorded as removed")
                    if s in pullers and not keep:
                        for tb in t.tables:
                            snap = d.obj(tb, name).snap
                            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {snap}")
                            dropped.append(f"snapshot {snap}")
                        store.links.forget(conn, d, name)
                        store.purges.forget_snapshot_horizons(conn, d, name)
                        dropped.append("watermarks")
                    if s in sources:
                        store.purges.forget_puller(conn, d, name)
                        dropped.append("puller record (log entries kept for it are released)")
                    store.fences.forget(conn, d, name)
            except MultimasterError:
                rep.unreachable.append(s)
                continue
            rep.cleaned[s] = dropped
            say(f"{s}: dropped what it kept for {name}")
        try:
            out = uninstall(cl, name)
            rep.uninstalled = out.get(name, [])
            say(f"{name}: replication objects removed (its rows stay)")
        except MultimasterError:
            rep.unreachable.append(name)
        return rep
    finally:
        if own:
            cl.close()


#: rounds of surveying the pullers, planning and giving (planned again when a receiver's watermark
#: moved or a giver purged meanwhile)
_ROUNDS = 6


def _survey_all(cl: Cluster, name: str, pullers: list[str], unread: dict[str, str]) -> dict[str, salvage.Survey]:
    """What every puller of `name` that answers holds of it; the others, with why, into `unread`."""
    out: dict[str, salvage.Survey] = {}
    for p in pullers:
        try:
            out[p] = salvage.survey(cl, p, name)
            unread.pop(p, None)
        except Exception as e:  # noqa: BLE001 - unreachable, not installed, an agent: reported, kept for a rerun
            unread[p] = redact(str(e) if isinstance(e, MultimasterError) else f"{type(e).__name__}: {e}")
    return out


def _holdings(surveys: dict[str, salvage.Survey], tb: str, target: str | None = None) -> list[Holding]:
    """The holdings of `tb` of the pullers that keep a snapshot; with `target`, only the target's
    and those of givers whose table has the target's layout (their entries fit it)."""
    want = surveys[target].tables[tb].layout if target is not None else None
    return [
        Holding(s, h.position, h.kept)
        for s, sv in sorted(surveys.items())
        if (h := sv.tables[tb]).position is not None and (want is None or s == target or h.layout == want)
    ]


def _steps(surveys: dict[str, salvage.Survey], tables: list[str], target: str) -> list[dict[str, Copy]]:
    """The copies `target` receives, step by step: step k holds the k-th copy of every table."""
    per: dict[str, tuple[Copy, ...]] = {}
    for tb in tables:
        if surveys[target].tables[tb].position is None:
            continue
        per[tb] = plan_copies(_holdings(surveys, tb, target))[target].copies
    n = max((len(c) for c in per.values()), default=0)
    return [{tb: c[k] for tb, c in per.items() if k < len(c)} for k in range(n)]


def _salvage(cl: Cluster, name: str, pullers: list[str], rep: "RemoveSiteReport", say: Progress) -> list[str]:
    """Bring every puller of `name` up to the furthest position of its change log any of them
    pulled, from the snapshots of those that still hold the entries (core/salvage.py plan,
    engine/salvage.py give), then report in `rep` who still lacks changes of `name` another has
    (`behind`, with the fix), the changes waiting at a puller that go with its snapshot
    (`dropped`) and, when `name` answers, its own changes no puller pulled (`not_pulled`).
    Returns why the snapshots of `name` must be kept for a rerun (a puller not reached, a copy that
    failed for a reason a rerun may not meet again); empty when they may go."""
    t = cl.topo
    tables = list(t.tables)
    unread: dict[str, str] = {}
    stuck: dict[str, str] = {}  # puller -> why a copy to it failed
    for _round in range(_ROUNDS):
        surveys = _survey_all(cl, name, pullers, unread)
        busy = False
        for target in sorted(surveys):
            if target in stuck:
                continue
            wms = {tb: surveys[target].tables[tb].position or 0 for tb in tables}
            for part in _steps(surveys, tables, target):
                busy = True
                try:
                    done = salvage.give(cl, target, name, part, wms)
                except salvage.GiverPurged:
                    break  # planned again from what the givers hold now
                except Exception as e:  # noqa: BLE001 - reported with the puller, kept for a rerun
                    stuck[target] = redact(str(e) if isinstance(e, MultimasterError) else f"{type(e).__name__}: {e}")
                    break
                if done is None:
                    break  # a refresher moved its watermark: planned again
                _stored, applied = done
                for tb, c in part.items():
                    wms[tb] = c.upto
                    rep.relayed.append(
                        {
                            "site": target,
                            "table": tb,
                            "from": c.donor,
                            "after": c.after,
                            "upto": c.upto,
                            "applied": applied.get(tb, 0),
                        }
                    )
                    say(f"{target}: {tb}: {applied.get(tb, 0)} change(s) of {name} given from {c.donor}'s snapshot")
        if not busy:
            break
    surveys = _survey_all(cl, name, pullers, unread)
    surveys = _relay_behind(cl, name, pullers, surveys, unread, stuck)
    return _verdicts(cl, name, tables, surveys, unread, stuck, rep)


def _relay_behind(
    cl: Cluster,
    name: str,
    pullers: list[str],
    surveys: dict[str, salvage.Survey],
    unread: dict[str, str],
    stuck: dict[str, str],
) -> dict[str, salvage.Survey]:
    """A puller behind another in `name`'s changes that it pulls from, where that one relays them
    (tables that need causal delivery, engine/refresh.py relay_origins): refreshed from it, which
    brings what the snapshots no longer held. Returns the surveys read again when one ran."""
    t = cl.topo
    ran = False
    for tb in t.tables:
        for b in verdict({s: sv.tables[tb].applied for s, sv in surveys.items()}):
            if b.site in stuck or b.furthest not in t.peers_of(b.site):
                continue
            g = cl.site(b.furthest)
            try:
                with g.read() as conn:
                    relays = relay_origins(t, b.furthest, g.info(conn, tb, t))
            except Exception:  # noqa: BLE001 - it answered the survey a moment ago; judged below
                continue
            if relays is not None and name not in relays:
                continue
            res = refresh_link(cl, b.site, b.furthest)
            ran = True
            if res.error:
                stuck.setdefault(b.site, f"refresh from '{b.furthest}': {res.error}")
    return _survey_all(cl, name, pullers, unread) if ran else surveys


_FIX_COPY = (
    "remove '{n}' and its links from the topology file, then copy {s} again from {f}: "
    "'multimaster add-site -t FILE {s} --from {f} --replace'"
)


def _verdicts(
    cl: Cluster,
    name: str,
    tables: list[str],
    surveys: dict[str, salvage.Survey],
    unread: dict[str, str],
    stuck: dict[str, str],
    rep: "RemoveSiteReport",
) -> list[str]:
    """Fill `rep` from the pullers' final holdings; returns why the snapshots must be kept."""
    keep: list[str] = []
    for p, why in sorted(unread.items()):
        rep.behind.append(
            {
                "site": p,
                "table": None,
                "reason": f"not reached: whether it lacks changes of '{name}' another site has is unknown ({why})",
                "fix": f"run 'multimaster remove-site -t FILE {name} --force' again once {p} answers (the snapshots of "
                f"'{name}' stay at its pullers until then); if {p} is gone for good too, remove it first "
                f"('multimaster remove-site -t FILE {p} --force')",
            }
        )
        keep.append(f"'{p}' was not reached")
    for p, why in sorted(stuck.items()):
        keep.append(f"giving '{p}' what it lacks failed: {why}")
    goal: dict[str, int] = {}
    for tb in tables:
        held = _holdings(surveys, tb)
        goal[tb] = max((h.position for h in held), default=0)
        short = {s: c for s, c in plan_copies(held).items() if c.short}
        for b in verdict({s: sv.tables[tb].applied for s, sv in surveys.items()}):
            f = cl.site(b.furthest)
            try:
                with f.read() as conn:
                    n = salvage.count_changes(conn, f, tb, name, b.has, b.top)
            except Exception:  # noqa: BLE001 - counted where it can be
                n = 0
            why, fix, kept = _why_behind(name, tb, b, surveys, stuck, short.get(b.site))
            if kept:
                keep.append(f"'{b.site}': {why}")
            rep.behind.append(
                {
                    "site": b.site,
                    "table": tb,
                    "has": b.has,
                    "top": b.top,
                    "furthest": b.furthest,
                    "changes_at_least": n,
                    "reason": f"'{b.site}' applied '{name}''s changes of table '{tb}' up to version {b.has or '(none)'}, "
                    f"'{b.furthest}' up to {b.top}: {f'at least {n} change(s)' if n else 'changes'} missing ({why})",
                    "fix": fix,
                }
            )
    keep += _held_there(name, tables, surveys)
    if not keep:  # the snapshots go, and with them the changes that wait in them
        for s, sv in sorted(surveys.items()):
            for tb in tables:
                if sv.tables[tb].waiting:
                    rep.dropped.setdefault(s, {})[tb] = sv.tables[tb].waiting
    try:
        rep.not_pulled = salvage.unpulled(cl, name, goal)
    except Exception:  # noqa: BLE001 - the site is gone: what it made and nobody pulled is unknown
        rep.not_pulled = None
    return keep


def _held_there(name: str, tables: list[str], surveys: dict[str, salvage.Survey]) -> list[str]:
    """Why a puller's snapshots of `name` must stay for the changes its error queue holds from
    `name`, and for those it applied from them whose relay waits behind a held change: the values
    of both are only in that snapshot (dropped, the held ones could be neither retried nor listed,
    and the waiting relays would never reach the puller's own peers)."""
    out: list[str] = []
    for s, sv in sorted(surveys.items()):
        for tb in tables:
            h = sv.tables[tb]
            if not (h.held or h.relays):
                continue
            what = [f"{h.held} change(s) from '{name}' held in its error queue"] if h.held else []
            if h.relays:
                what.append(f"{h.relays} change(s) applied from '{name}' whose relay waits behind a change held there")
            out.append(
                f"'{s}' has, in table '{tb}', {' and '.join(what)}: fix the cause and "
                f"'multimaster errors retry -t FILE --site {s} --all', or drop them with "
                f"'multimaster errors skip -t FILE --site {s} --id ID --reason TEXT', then run remove-site again"
            )
    return out


def _why_behind(
    name: str, tb: str, b: Behind, surveys: dict[str, salvage.Survey], stuck: dict[str, str], short: CatchUp | None
) -> tuple[str, str, bool]:
    """Why puller `b.site` still lacks changes of `name` in `tb` after the copies, the fix, and
    whether a rerun of remove-site may give them (the snapshots are kept for it). `short`: its
    catch-up from every puller's holdings, when positions remain that it did not reach."""
    if b.site in stuck:
        return (
            f"giving it the entries failed: {stuck[b.site]}",
            f"fix that and run 'multimaster remove-site -t FILE {name} --force' again (the snapshots of '{name}' stay until then)",
            False,
        )
    fix = _FIX_COPY.format(n=name, s=b.site, f=b.furthest)
    if short is not None:
        fitting = plan_copies(_holdings(surveys, tb, b.site))[b.site]
        if fitting.reaches < short.reaches:
            return (
                f"the sites that hold positions {fitting.reaches + 1}..{short.reaches} of '{name}''s change log have other "
                "columns in this table (a schema change not yet at every site)",
                "let every site follow the schema change ('multimaster refresh -t FILE'), then run "
                f"'multimaster remove-site -t FILE {name} --force' again",
                True,
            )
        return (
            f"no site holds positions {short.reaches + 1}..{short.goal} of '{name}''s change log any more "
            f"({short.goal - short.reaches} entries at most: purged from their snapshots, or kept there in the layout "
            "the table had before a schema change)",
            fix,
            False,
        )
    h = surveys[b.site].tables[tb]
    if h.position is None:
        return f"it keeps no snapshot of '{name}' any more (an earlier remove-site dropped it)", fix, False
    if h.waiting:
        return f"they wait at '{b.site}' (status: the link from '{name}') and go with its snapshot of '{name}'", fix, False
    return f"they reached '{b.furthest}' relayed by another site, not through the snapshots of '{name}'", fix, False


def _removed_already(cl: Cluster, name: str) -> bool:
    """Whether an earlier remove-site of `name` finished: every other site answers, records `name`
    as removed and keeps no snapshot of it. (Run again, remove-site used to refuse, saying the
    pullers were "not connected" to the site.) A site reached through its agent is not read here:
    then False, and remove-site runs as usual."""
    for n in cl.topo.sites:
        if n == name:
            continue
        s = cl.site(n)
        if isinstance(s, AgentSite):
            return False
        try:
            with s.read() as conn:
                d = s.dialect
                if name not in store.retired.read(conn, d) or store.watermarks.tables_of(conn, d, name):
                    return False
        except Exception:  # noqa: BLE001 - not reached: remove-site itself says so
            return False
    return True


def _check_drained(cl: Cluster, name: str) -> None:
    """Raise SiteNotDrained unless `name` answers and every site pulling from it has pulled all it
    has, without error."""
    details: list[str] = []
    st = status(cl)
    if not st["sites"][name].get("reachable"):
        raise SiteNotDrained(name, [f"'{name}' cannot be reached, so whether its changes were pulled is unknown"])
    for ln in st["links"]:
        if ln["from"] != name or not (ln.get("waiting") or ln.get("error")):
            continue
        n = (ln["waiting"] if ln.get("waiting") is not None else "?") if ln.get("error") else _own_waiting(cl, name, ln)
        if n or ln.get("error"):
            details.append(f"'{ln['to']}': {n} waiting" + (f" ({ln['error']})" if ln.get("error") else ""))
    if details:
        raise SiteNotDrained(name, details)


def _own_waiting(cl: Cluster, name: str, ln: dict[str, Any]) -> int:
    """Of what `status` counts as waiting on the link from `name` (`ln`), the changes that are
    `name`'s own: not pulled yet, or pulled and not applied at the puller. The entries `name`
    relayed of other origins are left out: in a mesh its log always has a few in flight while the
    others write, and its pullers get them from their origins (the refusal held a site that never
    wrote until its daemon was stopped, session 32). A puller read through its agent: all of it."""
    t = cl.topo
    tgt, src = cl.site(ln["to"]), cl.site(name)
    if isinstance(tgt, AgentSite) or isinstance(src, AgentSite):
        return int(ln.get("waiting") or 0)
    at = link_at_target(tgt, name, t)
    have = at.get("have") or {}
    with src.read() as conn:
        pulled = sum(
            store.links.waiting(conn, src.dialect, tb, at["watermarks"][tb], ln["to"], have.get(tb), origin=name)[0]
            for tb in t.tables
        )
    return pulled + sum(n for n, _ in at["unapplied"].values())
