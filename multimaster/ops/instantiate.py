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

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.core.progress import Progress, ProgressEvent
from multimaster.core.salvage import Behind, CatchUp, Copy, Holding, verdict
from multimaster.core.salvage import plan as plan_copies
from multimaster.core.schemas import translate
from multimaster.core.versions import now_iso
from multimaster.dialects.schema import TableInfo
from multimaster.engine import evolve, references, salvage, uniques
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.lockwatch import Watch, watching
from multimaster.engine.pull import read_entries, store_batch
from multimaster.engine.refresh import refresh_link, relay_origins
from multimaster.engine.schema import compare_schemas
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly, ChangesHeld, ConfigError, MultimasterError, NotInstalled, SchemaError
from multimaster.ops.install import uninstall
from multimaster.ops.status import status

if TYPE_CHECKING:
    from multimaster.config.topology import Topology

__all__ = ["add_site", "remove_site", "AddSiteReport", "RemoveSiteReport", "SiteNotDrained"]


class SiteNotDrained(MultimasterError):
    def __init__(self, site: str, details: list[str]):
        super().__init__(
            f"site '{site}' still has changes its pullers have not applied ({'; '.join(details)}). "
            f"Refresh them first (multimaster refresh -t FILE), or pass --force to drop those changes."
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

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


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


def _copy_rows(
    src: Connection, select: str, dst: Connection, insert: str, size: int, progress: Callable[[int], None] | None = None
) -> int:
    """Stream `select` from `src` into `insert` at `dst` in batches of `size`; rows copied."""
    n = 0
    for part in _stream(src, select, size=size):
        dst.exec_driver_sql(insert, part)
        n += len(part)
        if progress:
            progress(n)
    return n


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


def _max_seq2(conn: Connection, site: Site, table: str) -> int:
    """A second-order position up to which every entry is final: the highest seq2 visible to
    `conn`, or below the horizon where writers capture concurrently (read first, in a statement of
    its own: entries may commit out of position order there)."""
    d = site.dialect
    h = d.read_horizon(conn, table)
    below = "" if h is None else f" WHERE seq2 < {int(h)}"
    return int(conn.exec_driver_sql(f"SELECT coalesce(max(seq2), 0) FROM {d.obj(table).log2}{below}").scalar() or 0)


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
    `name` waits for past refresh.lock_wait_warn (engine/lockwatch.py)."""
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
    rep = AddSiteReport(name, peer)
    nsite, psite = cl.site(name), cl.site(peer)
    sources = t.peers_of(name)
    pullers = [ln.target for ln in t.links if ln.source == name]
    for s in [name, peer, *sources, *pullers]:  # it copies tables and installs: databases, not agents
        if t.sites[s].agent:
            raise AgentOnly(
                s, t.sites[s].url, "add-site (it copies the peer's tables and writes at the sites around the new one)"
            )
    # ---- checks: every site we will read or write answers and is installed ----------------
    for s in {*sources, *pullers, peer}:
        with cl.site(s).read() as conn:
            cl.site(s).require_installed(conn, t)
    with psite.read() as conn:  # its copy would lack the changes it holds (docs/errors.md)
        held = store.errorqueue.counts(conn, psite.dialect)
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
        pinfo: dict[str, TableInfo] = {}
        ninfo: dict[str, TableInfo] = {}
        schema_problems: list[str] = []
        with psite.read() as pc, nsite.read() as nc:
            # what would stop the install half-way (MySQL: triggers refused under binary logging)
            schema_problems += [f"site '{name}': {m}" for m in nsite.dialect.install_problems(nc, list(t.tables))]
            for tb in t.tables:
                pinfo[tb] = psite.info(pc, tb, t)
                try:
                    ninfo[tb] = nsite.info(nc, tb, t)
                except SchemaError as e:
                    schema_problems += e.problems
                    continue
                schema_problems += compare_schemas(
                    tb, {peer: pinfo[tb], name: ninfo[tb]}, {peer: psite.dialect.name, name: nsite.dialect.name}
                )
                n = nc.exec_driver_sql(f"SELECT count(*) FROM {nsite.dialect.quote(tb)}").scalar() or 0
                if n and not replace:
                    schema_problems.append(
                        f"table '{tb}' at site '{name}' has {n} rows; add-site copies '{peer}''s rows into empty tables "
                        "(--replace deletes them first)"
                    )
        if schema_problems:
            raise SchemaError(schema_problems)
        _forget_observations(cl, name)
        copied = _copy(cl, name, peer, pinfo, ninfo, replace, batch_size, say, rep, watch)
        with psite.read() as pc:  # the sites removed before: their changes on the way are applied here too
            gone = store.retired.read(pc, psite.dialect)
        if gone:
            with nsite.write() as nc:
                for g in sorted(gone):
                    store.retired.record(nc, nsite.dialect, g, now_iso())
    else:
        say(f"{name}: already installed; checking the sites that pull from it")
    _connect_pullers(cl, name, peer, pullers, rep, say, copied)
    return rep


def _forget_observations(cl: Cluster, name: str) -> list[str]:
    """Every other site that answers drops what it observed of `name` (a site instantiated again
    is not the site observed before: its tombstones and conflict rows are judged afresh). Returns
    the sites that did not answer."""
    missed = []
    for s in cl.topo.sites:
        if s == name:
            continue
        site = cl.site(s)
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


def _connect_pullers(
    cl: Cluster, name: str, peer: str, pullers: list[str], rep: AddSiteReport, say: Progress, copied: dict[str, int] | None
) -> None:
    """Give every site that pulls from `name` a snapshot of it and a link; `peer`, if it has not
    pulled from `name` yet, starts after the entries `name`'s change log got from it (`copied`:
    per table the last position the copy wrote; None: `name` was installed already, its end)."""
    t = cl.topo
    nsite = cl.site(name)
    # ---- the sites that pull from NAME --------------------------------------------------
    if copied is not None:
        npos = copied
    else:
        with nsite.read() as conn:
            npos = {tb: _max_seq2(conn, nsite, tb) for tb in t.tables}
    for s in pullers:
        site = cl.site(s)
        with site.write() as conn:
            for tb in t.tables:
                info = site.info(conn, tb, t)
                site.dialect.install_snapshot(conn, info, name)
                references.install(conn, site, info, [name])
                store.links.ensure(conn, site.dialect, name, tb)
                if s == peer and store.watermarks.read(conn, site.dialect, name, tb) == 0:
                    store.watermarks.write(conn, site.dialect, name, tb, npos[tb])  # the peer already holds all NAME has
                # its snapshot holds what it pulls from here on
                wm = store.watermarks.read(conn, site.dialect, name, tb)
                store.purges.ensure_snapshot_horizon(conn, site.dialect, name, tb, wm)
        rep.pullers.append(s)
        say(f"{s}: snapshot of {name} ready")


def _copy(
    cl: Cluster,
    name: str,
    peer: str,
    pinfo: dict[str, TableInfo],
    ninfo: dict[str, TableInfo],
    replace: bool,
    batch_size: int,
    say: Progress,
    rep: AddSiteReport,
    watch: Watch | None = None,
) -> dict[str, int]:
    """Install `name` as a copy of `peer`, read in one snapshot. Returns per table the last
    position of `name`'s change log the copy wrote."""
    t = cl.topo
    nsite, psite = cl.site(name), cl.site(peer)
    nd, pd = nsite.dialect, psite.dialect
    sources = t.peers_of(name)
    peer_sources = set(t.peers_of(peer))
    # a position in every other source's log, read before the copy (any position is complete:
    # what NAME skips there reaches PEER, which NAME pulls from)
    other_pos: dict[str, dict[str, int]] = {}
    for q in sources:
        if q != peer and q not in peer_sources:
            qs = cl.site(q)
            with qs.read() as conn:
                other_pos[q] = {tb: _max_seq2(conn, qs, tb) for tb in t.tables}
    nd.prepare_site(nsite.engine)
    # PEER's horizon per table, read before its snapshot is taken: every entry below it is in the
    # snapshot if committed; entries at or above it may commit later, at lower positions than some
    # the snapshot holds (None: positions are given in commit order; the snapshot's last one is the cut)
    with psite.read() as hconn:
        horizons = {tb: pd.read_horizon(hconn, tb) for tb in t.tables}
    npos: dict[str, int] = {}
    with psite.engine.connect() as pconn:
        _consistent_read(pconn)
        with pconn.begin(), watching(nsite, watch) as lw, nsite.write(lw) as nconn:
            hlc = pd.read_clock(pconn) or 0
            nd.install_site(nconn, name)
            store.install(nconn, nd)
            nd.defer_foreign_keys(nconn, True)  # rows referencing rows copied later (docs/foreign-keys.md)
            for tb in t.tables:
                pi, ni = pinfo[tb], ninfo[tb]
                po, no = pd.obj(tb), nd.obj(tb)
                horizon = horizons[tb]
                # the capture point: NAME pulls PEER's entries after it
                pos = (
                    horizon - 1
                    if horizon is not None
                    else int(pconn.exec_driver_sql(f"SELECT coalesce(max(seq2), 0) FROM {po.log2}").scalar() or 0)
                )
                pwm = {q: store.watermarks.read(pconn, pd, q, tb) for q in peer_sources}
                if replace:
                    nconn.exec_driver_sql(f"DELETE FROM {nd.quote(tb)}")
                nd.install_table(nconn, ni)
                uniques.install(nconn, nd, ni)
                for q in sources:
                    nd.install_snapshot(nconn, ni, q)
                    store.links.ensure(nconn, nd, q, tb)
                references.install(nconn, nsite, ni, sources)
                # rows, with the keys they have at PEER
                cols = [pi.key.name, *pi.column_names]
                sel = ", ".join(pd.quote(c) for c in cols)
                ins = f"INSERT INTO {nd.quote(tb)} ({', '.join(nd.quote(c) for c in cols)}) VALUES ({nd.ph(len(cols))})"
                total = int(pconn.exec_driver_sql(f"SELECT count(*) FROM {pd.quote(tb)}").scalar() or 0)
                rep.rows[tb] = _copy_rows(
                    pconn,
                    f"SELECT {sel} FROM {pd.quote(tb)} ORDER BY {pd.quote(pi.key.name)}",
                    nconn,
                    ins,
                    batch_size,
                    _copied(say, f"{peer} -> {name}", tb, "rows", total),
                )
                # identities
                scols = ["rid", "key", "deleted"] + ["v_" + s.name for s in pi.spec.slots]
                sq = ", ".join(pd.quote(c) for c in scols)
                ins = f"INSERT INTO {no.shadow} ({', '.join(nd.quote(c) for c in scols)}) VALUES ({nd.ph(len(scols))})"
                n = _copy_rows(pconn, f"SELECT {sq} FROM {po.shadow} ORDER BY rid", nconn, ins, batch_size)
                # PEER's own rows inserted since its shadow last caught up (capture may write it lazily)
                fresh = pd.fresh_identities(pconn, pi)
                if fresh:
                    nconn.exec_driver_sql(f"INSERT INTO {no.shadow} (rid, {nd.key_col}) VALUES ({nd.ph(2)})", fresh)
                    n += len(fresh)
                rep.identities[tb] = n
                uniques.copy_marks(pconn, pd, nconn, nd, ni)  # the values marked rows want
                # the change log: what PEER applied is applied at NAME too (dedupe), and relays on
                lcols = (
                    ["ver", "origin", "op", "rid", "key", "mask"]
                    + ["n_" + c for c in pi.column_names]
                    + ["o_" + c for c in pi.column_names]
                    + [p_ + r.column for r in pi.refs for p_ in ("f_", "fo_")]
                    + (["txn"] if pd.caps.txn_column and nd.caps.txn_column else [])  # docs/transactions.md
                )
                # (entries written in earlier schema versions of PEER: carried to its current columns by name)
                layouts = store.schemas.layouts(pconn, pd, tb)
                union = sorted({c for cols in (layouts or {}).values() for c in cols} | set(pi.column_names))
                rcols = (
                    lcols[:6]
                    + ["n_" + c for c in union]
                    + ["o_" + c for c in union]
                    + lcols[6 + 2 * len(pi.column_names) :]
                    + (["sv"] if layouts else [])
                )
                lq = ", ".join(pd.quote(c) for c in rcols)
                rep.log_entries[tb] = 0
                entries = _copied(say, f"{peer} -> {name}", tb, "change-log entries", None)
                for raw in _stream(pconn, f"SELECT {lq} FROM {po.log} ORDER BY seq", size=batch_size):
                    part = [_current_layout(r, union, layouts, list(pi.column_names)) for r in raw]
                    nd.append_log(
                        nconn, tb, [nd.key_col if c == "key" else c if c in _PLAIN else nd.quote(c) for c in lcols], rows=part
                    )
                    rep.log_entries[tb] += len(part)
                    entries(rep.log_entries[tb])
                npos[tb] = int(nconn.exec_driver_sql(f"SELECT coalesce(max(seq2), 0) FROM {no.log2}").scalar() or 0)
                store.origins.copy_in(nconn, nd, tb, store.origins.read(pconn, pd, tb))
                # PEER's own changes up to the capture point are in the copy: applied at NAME too
                ph = pd.caps.placeholder
                own_top = pconn.exec_driver_sql(
                    f"SELECT max(ver) FROM {po.log} WHERE origin = {ph} AND seq <= {ph}", (peer, pos)
                ).scalar()
                if own_top:
                    store.origins.mark_applied(nconn, nd, tb, peer, own_top)
                # ... and the entries past it that the snapshot holds (committed between the horizon
                # and the snapshot) are in the copy too: stored as applied in NAME's snapshot of
                # PEER, so pulling them again skips them (engine/pull.py store_batch)
                if horizon is not None:
                    past = read_entries(pconn, psite, name, pi, pos)
                    if past:
                        store_batch(nconn, nsite, ni, peer, past, applied=True)
                reg = store.tables.registration(pconn, pd, tb)
                if reg is None:  # checked first: PEER lost it meanwhile
                    raise NotInstalled(peer, f"replication objects for table(s) {[tb]}")
                store.tables.copy_in(nconn, nd, tb, reg)
                # watermarks: where NAME starts pulling each source
                for q in sources:
                    if q == peer:
                        wm = pos
                    elif q in peer_sources:
                        wm = pwm[q]
                        _copy_waiting(pconn, psite, nconn, nsite, pi, q)
                    else:
                        wm = other_pos[q][tb]
                    store.watermarks.write(nconn, nd, q, tb, wm)
                    store.purges.ensure_snapshot_horizon(nconn, nd, q, tb, wm)  # nothing pulled below it is held
                    rep.watermarks.setdefault(q, {})[tb] = wm
                nd.install_capture(nconn, ni)
                nd.guard_writes(nconn, ni, name, name in t.read_only)  # docs/topologies.md "Read-only sites"
                evolve.ensure_registered(nconn, nsite, ni)  # schema version 1 (docs/schema-changes.md)
                nd.after_apply(nconn, ni)
            nd.defer_foreign_keys(nconn, False)
            # the new site's whole clock (no table: MySQL moves every table's clock row and the site's
            # floor) to at least the source's, so its next change sorts after everything copied
            nd.advance_clock(nconn, hlc)
    say(f"{name}: installed from {peer}")
    return npos


def _copied(say: Progress, subject: str, table: str, unit: str, total: int | None) -> Callable[[int], None]:
    """What _copy tells `say` of `n` `unit` of `table` copied so far (of `total`, when counted)."""
    t0 = time.perf_counter()
    return lambda n: say(
        ProgressEvent("copy", subject, table=table, done=n, total=total, unit=unit, seconds=time.perf_counter() - t0)
    )


def _copy_waiting(pconn: Connection, psite: Site, nconn: Connection, nsite: Site, info: TableInfo, q: str) -> None:
    """PEER's snapshot rows of `q` not yet applied there: pulled by PEER (below its watermark),
    not in the copy, so NAME takes them over."""
    cols = (
        ["pseq", "ver", "origin", "op", "rid", "key", "mask"]
        + ["n_" + c for c in info.column_names]
        + ["o_" + c for c in info.column_names]
        + ["applied"]
    )
    sel = ", ".join(psite.dialect.quote(c) for c in cols)
    rows = [
        tuple(r) for r in pconn.exec_driver_sql(f"SELECT {sel} FROM {psite.dialect.obj(info.name, q).snap} WHERE applied <> 1")
    ]
    if rows:
        nd = nsite.dialect
        collist = ", ".join(nd.quote(c) for c in cols)
        nconn.exec_driver_sql(
            nd.insert_ignore_into(nd.obj(info.name, q).snapshot(), collist, f"VALUES ({nd.ph(len(cols))})"), rows
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


def _check_drained(cl: Cluster, name: str) -> None:
    """Raise SiteNotDrained unless `name` answers and every site pulling from it has pulled all it
    has, without error."""
    details: list[str] = []
    st = status(cl)
    if not st["sites"][name].get("reachable"):
        raise SiteNotDrained(name, [f"'{name}' cannot be reached, so whether its changes were pulled is unknown"])
    for ln in st["links"]:
        if ln["from"] == name and (ln.get("waiting") or ln.get("error")):
            details.append(f"'{ln['to']}': {ln.get('waiting', '?')} waiting" + (f" ({ln['error']})" if ln.get("error") else ""))
    if details:
        raise SiteNotDrained(name, details)
