"""The error queue, operated (`multimaster errors`, docs/errors.md): list the changes held at every
site, apply them again once the cause is fixed (`retry`), drop one on purpose (`skip`). The list
reads a site reached through its agent there (docs/agent.md); `retry` and `skip` write the site's
database, so they run on its host (AgentOnly otherwise)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.core.errorqueue import group_of, released_by, retry_set
from multimaster.core.versions import now_iso
from multimaster.dialects.schema import names
from multimaster.engine import held, isolate, uniques
from multimaster.engine.cluster import Cluster, as_cluster, each, read_each
from multimaster.engine.refresh import apply_order, relay_origins, write_retrying
from multimaster.engine.remote import AgentSite
from multimaster.engine.site import Site
from multimaster.errors import ConfigError

__all__ = ["list_errors", "errors_page", "ErrorsPage", "errors_at", "retry_errors", "skip_error", "STATES"]

#: every state a queued change can be in (but parked, docs/unique.md)
STATES = ("failed", "waiting", "txn", "schema", "skipped")


def _sites(cl: Cluster, site: str | None) -> list[str]:
    if site is not None and site not in cl.topo.sites:
        raise ConfigError([f"--site: site '{site}' is not defined under sites"])
    return [site] if site else list(cl.topo.sites)


def list_errors(
    topo: Topology | Cluster,
    site: str | None = None,
    table: str | None = None,
    include_skipped: bool = False,
    unreachable: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The changes held at every site (or `site`), per site and table in version order: id, site,
    table, state, op, rid, ver, origin, peer, error, blocked_by, first_at, last_at, attempts,
    reason, and `change` (its key and the values it sets, as its snapshot holds it; None for a
    malformed entry). `include_skipped`: skipped ones too (with their reason). A site reached
    through its agent is read by its agent (the same rows, read there). A site that cannot be
    reached raises SiteUnreachable; with `unreachable` (a dict) it goes there instead (site ->
    why) and the other sites are read."""
    cl, own = as_cluster(topo)
    try:
        if table is not None and table not in cl.topo.tables:
            raise ConfigError([f"--table: table '{table}' is not defined under tables"])

        def read(s: Site | AgentSite) -> list[dict[str, Any]]:
            if isinstance(s, AgentSite):
                return s.errors(table, include_skipped)
            return errors_at(s, cl.topo, table, include_skipped)

        return read_each(cl, _sites(cl, site), read, unreachable)
    finally:
        if own:
            cl.close()


def _states(include_skipped: bool) -> tuple[str, ...]:
    """The states `multimaster errors` lists (skipped ones only when asked)."""
    return (*(STATES if include_skipped else store.errorqueue.OPEN), store.errorqueue.PARKED)


@dataclass
class ErrorsPage:
    """A page of `multimaster errors`: `rows` (the changes listed), `total` (how many the listing
    has without a limit) and `held` (how many of them are held: the states `status` counts, of
    every page)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    held: int = 0


def errors_page(
    topo: Topology | Cluster,
    site: str | None = None,
    table: str | None = None,
    include_skipped: bool = False,
    *,
    limit: int = 0,
    offset: int = 0,
    unreachable: dict[str, str] | None = None,
) -> ErrorsPage:
    """What :func:`list_errors` lists, from the `offset`-th change on, at most `limit` of them (0:
    all), in the same order (site by site as the topology lists them, then per table in version
    order), with how many the whole listing has and how many of them are held. A site reached
    directly is counted first and only the changes of the page are read there; a site reached
    through its agent is read whole by its agent."""
    if limit < 0 or offset < 0:
        raise ConfigError([f"--limit {limit} / --offset {offset}: a count, 0 or more"])
    cl, own = as_cluster(topo)
    try:
        if table is not None and table not in cl.topo.tables:
            raise ConfigError([f"--table: table '{table}' is not defined under tables"])
        page = ErrorsPage()
        states = _states(include_skipped)
        agents: dict[str, list[dict[str, Any]]] = {}  # a site behind an agent: read whole, paged here

        def count(s: Site | AgentSite) -> list[tuple[str, int, int]]:
            """The site's changes the listing has, and how many are held ([]: not installed)."""
            if isinstance(s, AgentSite):
                rows = agents[s.name] = s.errors(table, include_skipped)
                return [(s.name, len(rows), sum(1 for r in rows if r["state"] in store.errorqueue.HELD))]
            with s.read() as conn:
                if not s.installed_tables(conn):
                    return []
                c = store.errorqueue.counts_of(conn, s.dialect, table)
            return [(s.name, sum(c.get(k, 0) for k in states), store.errorqueue.held_total(c))]

        # every site counted at once, then the page's window at each from the counts of the sites
        # before it (in the topology's order), then each site's window read at once
        windows: dict[str, tuple[int, int]] = {}  # site -> (first, how many; 0: to its end)
        for n, total, held in read_each(cl, _sites(cl, site), count, unreachable):
            start = page.total  # this site's changes are listed from here on
            page.total += total
            page.held += held
            first = max(0, offset - start)
            want = total - first if not limit else min(total - first, offset + limit - start - first)
            if want > 0:
                windows[n] = (first, want)

        def read(s: Site | AgentSite) -> list[dict[str, Any]]:
            first, want = windows[s.name]
            if isinstance(s, AgentSite):
                return agents[s.name][first : first + want]
            return errors_at(s, cl.topo, table, include_skipped, limit=want, offset=first)

        page.rows = read_each(cl, list(windows), read, unreachable)
        return page
    finally:
        if own:
            cl.close()


def errors_at(
    s: Site, topo: Topology, table: str | None = None, include_skipped: bool = False, *, limit: int = 0, offset: int = 0
) -> list[dict[str, Any]]:
    """The changes held in the error queue of site `s` (see list_errors), read at the site (its
    agent runs this); none before init. With `limit`: at most that many, past the first `offset`."""
    out: list[dict[str, Any]] = []
    with s.read() as conn:
        if not s.installed_tables(conn):
            return out
        queued = [
            dict(r, site=s.name, table=r.pop("tbl"))
            for r in store.errorqueue.rows(conn, s.dialect, table, _states(include_skipped), limit=limit, offset=offset)
        ]
        infos = {tb: s.info(conn, tb, topo) for tb in {str(r["table"]) for r in queued} if tb in topo.tables}
        held: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # (table, peer) -> ver -> change
        for tb, peer in {(str(r["table"]), str(r["peer"])) for r in queued}:
            info = infos.get(tb)
            # a snapshot dropped by remove-site before it kept them for held changes: values unknown
            if info is not None and s.dialect.table_kind(conn, names(tb, peer).snapshot()) is not None:
                vers = [str(r["ver"]) for r in queued if (r["table"], r["peer"]) == (tb, peer) and r["op"] not in ("?", "P")]
                held[(tb, peer)] = store.errorqueue.changes(conn, s.dialect, tb, peer, vers, info.column_names, info.key.name)
        for r in queued:
            info = infos.get(str(r["table"]))
            if r["state"] == store.errorqueue.PARKED:
                r["change"] = None if info is None else uniques.parked_change(conn, s.dialect, info, r["rid"])
            elif info is None or r["op"] in ("?", "P"):  # P: a parked row, skipped
                r["change"] = None
            else:
                r["change"] = held.get((str(r["table"]), str(r["peer"])), {}).get(str(r["ver"]))
            out.append(r)
    return out


def _find(cl: Cluster, site: str | None, id_: int) -> str:
    """The site whose queue holds `id_` (ids are per site: with several, --site must say which)."""
    found = []
    for n in _sites(cl, site):
        s = cl.site(n)
        with s.read() as conn:
            if s.installed_tables(conn) and store.errorqueue.get(conn, s.dialect, id_) is not None:
                found.append(n)
    if not found:
        where = f"site '{site}'" if site else "any site"
        raise ConfigError(
            [f"--id {id_}: no change with this id is in the error queue of {where} (see: multimaster errors -t FILE)"]
        )
    if len(found) > 1:
        raise ConfigError([f"--id {id_}: sites {', '.join(found)} each hold a change with this id; say which with --site"])
    return found[0]


Queued = list[dict[str, Any]]


def _retry_at(
    cl: Cluster, n: str, queued_of: Callable[[Any, Site], tuple[Queued, Queued]], skip: Any = None
) -> isolate.RetryResult:
    """In one write transaction at site `n`: retry the open changes `queued_of(conn, site)` returns
    (with the other open ones, which those may wait behind); `skip(conn, site)` first, when given."""
    t = cl.topo
    s: Site = cl.site(n)

    def go(conn: Any) -> isolate.RetryResult:
        res = isolate.RetryResult(n)
        s.require_installed(conn, t)
        infos = {tb: s.info(conn, tb, t) for tb in t.tables}
        order = apply_order(t, infos)
        for tb in order:  # the reconcilers wait: the queue read below is the one the retry acts on
            s.dialect.lock_for_apply(conn, infos[tb])
        if skip is not None:
            skip(conn, s)
        queued, others = queued_of(conn, s)
        base = {tb: store.tables.base_max(conn, s.dialect, tb) for tb in t.tables}
        relay = {tb: relay_origins(t, n, infos[tb]) for tb in t.tables}
        mine = [q for q in queued if str(q["tbl"]) in t.tables]
        known = isolate.known_origins(conn, s, list(t.sites))
        peers = store.watermarks.added(conn, s.dialect, t.peers_of(n))  # not a site listed and not added yet
        isolate.retry(conn, s, infos, order, peers, base, relay, mine, others, res, known)
        return res

    return write_retrying(s, go)


def _open(conn: Any, s: Site, id_: int, verb: str) -> Queued:
    """The open rows of the queue at `s`, after checking that `id_` is one of them."""
    first = store.errorqueue.get(conn, s.dialect, id_)
    if first is None or first["state"] not in store.errorqueue.OPEN:
        state = "gone" if first is None else first["state"]
        raise ConfigError([f"--id {id_}: the change is {state}, not held ({verb}; see: multimaster errors -t FILE --all)"])
    return store.errorqueue.rows(conn, s.dialect)


def _split(rows: Queued, ids: Sequence[int]) -> tuple[Queued, Queued]:
    take = set(ids)
    return [r for r in rows if int(r["id"]) in take], [r for r in rows if int(r["id"]) not in take]


def retry_errors(
    topo: Topology | Cluster, site: str | None = None, id_: int | None = None, all_: bool = False
) -> list[dict[str, Any]]:
    """Apply held changes again, source transaction by source transaction (each under one savepoint:
    all of it applies, or none): `id_` with the rest of its transaction and the changes held behind
    them (core.errorqueue.retry_set), or with `all_` every held change of every site (or `site`),
    one transaction per site. A change that applies leaves the queue; a transaction rejected again
    stays held whole, with the new error. Returns per site: applied (ids), held (id -> why), and
    what was applied per table."""
    if (id_ is None) == (not all_):
        raise ConfigError(["--id / --all: give --id N (its source transaction, and the changes waiting behind it) or --all"])
    cl, own = as_cluster(topo)
    try:
        if id_ is not None:
            n = _find(cl, site, id_)

            def one(conn: Any, s: Site) -> tuple[Queued, Queued]:
                rows = _open(conn, s, id_, "nothing to retry")
                return _split(rows, retry_set(rows, id_))

            return [_report(_retry_at(cl, n, one))]
        return [
            _report(_retry_at(cl, n, lambda conn, s: (store.errorqueue.rows(conn, s.dialect), [])))
            for n in _sites(cl, site)
            if _has_queue(cl, n)
        ]
    finally:
        if own:
            cl.close()


def held_counts(cl: Cluster, sites: Sequence[str]) -> dict[str, int]:
    """Per site of `sites` reached directly, the changes its error queue holds (the states status
    counts as held: failed, waiting, held with their transaction, parked); sites holding none are
    left out, and so are sites behind an agent or not readable (status names those)."""
    return {n: held for n, held in zip(sites, each(lambda n: _held(cl, n), list(sites))) if held}  # sites at once


def _held(cl: Cluster, n: str) -> int:
    """held_counts of site `n` (0: none, or not read)."""
    try:
        s = cl.site(n)
        if isinstance(s, AgentSite):
            return 0
        with s.read() as conn:
            if not s.installed_tables(conn):
                return 0
            c = store.errorqueue.counts(conn, s.dialect)
    except Exception:  # noqa: BLE001 - refresh reported what it could not reach already
        return 0
    return store.errorqueue.held_total(c)


def _has_queue(cl: Cluster, n: str) -> bool:
    s = cl.site(n)
    with s.read() as conn:
        return bool(s.installed_tables(conn))


def _report(r: isolate.RetryResult) -> dict[str, Any]:
    return {
        "site": r.site,
        "applied": r.applied,
        "held": r.held,
        "tables": {tb: {k: v for k, v in asdict(x).items() if k != "conflicts"} for tb, x in r.result.items()},
    }


def skip_error(topo: Topology | Cluster, id_: int, reason: str, site: str | None = None) -> dict[str, Any]:
    """Drop the held change `id_` on purpose, and with it every held change of its source
    transaction (a transaction is applied whole or not at all; a change without one is dropped
    alone): they are never applied here (state `skipped`, with `reason` and the time, kept in the
    queue as history); the changes held behind them are then applied (as `retry` would), in the
    same transaction. A parked row (docs/unique.md) is deleted for good at every site instead."""
    if not reason or not reason.strip():
        raise ConfigError(["errors skip: --reason TEXT is required (why the change is dropped; it is kept in the queue)"])
    cl, own = as_cluster(topo)
    try:
        n = _find(cl, site, id_)
        t = cl.topo
        skipped: list[int] = []

        def drop(conn: Any, s: Site) -> None:
            skipped.clear()
            first = store.errorqueue.get(conn, s.dialect, id_)
            if first is not None and first["state"] == store.errorqueue.PARKED and first["tbl"] in t.tables:
                # a parked row (docs/unique.md): deleted for good, a replicated delete, so every site agrees
                if n in t.read_only:  # nobody pulls a delete written here (docs/topologies.md "Read-only sites")
                    raise ConfigError(
                        [
                            f"errors skip: site '{n}' is read-only, so a delete of parked row {first['rid']} written there "
                            "would reach no other site; skip the row at a writable site where it is parked too "
                            "(the rule parks the same row everywhere), and its delete reaches this one"
                        ]
                    )
                uniques.skip_parked(conn, s, s.info(conn, first["tbl"], t), first["rid"])
                store.errorqueue.skip(conn, s.dialect, id_, reason.strip(), now_iso())
                skipped.append(id_)
                return
            rows = _open(conn, s, id_, "nothing to skip")
            at = now_iso()
            for q in _split(rows, group_of(rows, id_))[0]:
                store.errorqueue.skip(conn, s.dialect, q["id"], reason.strip(), at)
                skipped.append(int(q["id"]))
                if q["tbl"] in t.tables and q["op"] != "?":  # its snapshot rows: done with, on purpose
                    snaps = [
                        s.dialect.obj(q["tbl"], p).snapshot() for p in store.watermarks.added(conn, s.dialect, t.peers_of(n))
                    ]
                    held.mark(conn, s.dialect, snaps, q["ver"], applied=1)
                    info = s.info(conn, q["tbl"], t)
                    if q["op"] == "I" and info.spec.renumber and held.rank_kept(conn, s.dialect, info, q["rid"]) is not None:
                        held.tombstone(conn, s.dialect, info, q["rid"], q["ver"])  # its rank stays, as a deleted row's

        def behind(conn: Any, s: Site) -> tuple[Queued, Queued]:
            rows = store.errorqueue.rows(conn, s.dialect)
            return _split(rows, released_by(rows, store.errorqueue.rows(conn, s.dialect, states=("skipped",), ids=skipped)))

        rep = _report(_retry_at(cl, n, behind, skip=drop))
        rep["skipped"] = id_
        rep["skipped_ids"] = list(skipped)
        return rep
    finally:
        if own:
            cl.close()
