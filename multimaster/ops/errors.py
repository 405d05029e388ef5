"""The error queue, operated (`multimaster errors`, docs/errors.md): list the changes held at every
site, apply them again once the cause is fixed (`retry`), drop one on purpose (`skip`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.core.versions import now_iso
from multimaster.engine import held, isolate, uniques
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.refresh import relay_origins, write_retrying
from multimaster.engine.site import Site
from multimaster.errors import ConfigError

__all__ = ["list_errors", "retry_errors", "skip_error", "STATES"]

#: every state a queued change can be in
STATES = ("failed", "waiting", "skipped")


def _sites(cl: Cluster, site: str | None) -> list[str]:
    if site is not None and site not in cl.topo.sites:
        raise ConfigError([f"--site: site '{site}' is not defined under sites"])
    return [site] if site else list(cl.topo.sites)


def list_errors(
    topo: Topology | Cluster, site: str | None = None, table: str | None = None, include_skipped: bool = False
) -> list[dict[str, Any]]:
    """The changes held at every site (or `site`), per site and table in version order: id, site,
    table, state, op, rid, ver, origin, peer, error, blocked_by, first_at, last_at, attempts,
    reason, and `change` (its key and the values it sets, as its snapshot holds it; None for a
    malformed entry). `include_skipped`: skipped ones too (with their reason)."""
    cl, own = as_cluster(topo)
    try:
        if table is not None and table not in cl.topo.tables:
            raise ConfigError([f"--table: table '{table}' is not defined under tables"])
        states = (*(STATES if include_skipped else store.errorqueue.OPEN), store.errorqueue.PARKED)
        out: list[dict[str, Any]] = []
        for n in _sites(cl, site):
            s = cl.site(n)
            with s.read() as conn:
                if not s.installed_tables(conn):
                    continue
                for r in store.errorqueue.rows(conn, s.dialect, table, states):
                    r = dict(r, site=n, table=r.pop("tbl"))
                    info = s.info(conn, r["table"], cl.topo) if r["table"] in cl.topo.tables else None
                    if r["state"] == store.errorqueue.PARKED:
                        r["change"] = None if info is None else uniques.parked_change(conn, s.dialect, info, r["rid"])
                    else:
                        r["change"] = (
                            None
                            if info is None or r["op"] in ("?", "P")  # P: a parked row, skipped
                            else store.errorqueue.change(conn, s.dialect, r["table"], r["peer"], r["ver"], info.column_names)
                        )
                    out.append(r)
        return out
    finally:
        if own:
            cl.close()


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


def _retry_at(cl: Cluster, n: str, queued_of: Any) -> isolate.RetryResult:
    """In one write transaction at site `n`: retry the open changes `queued_of(conn, site)` returns."""
    t = cl.topo
    s: Site = cl.site(n)

    def go(conn: Any) -> isolate.RetryResult:
        res = isolate.RetryResult(n)
        s.require_installed(conn, t)
        queued = queued_of(conn, s)
        tables = sorted({str(q["tbl"]) for q in queued if str(q["tbl"]) in t.tables})
        infos = {tb: s.info(conn, tb, t) for tb in tables}
        base = {tb: store.tables.base_max(conn, s.dialect, tb) for tb in tables}
        relay = {tb: relay_origins(t, n, infos[tb]) for tb in tables}
        isolate.retry(conn, s, infos, t.peers_of(n), base, relay, [q for q in queued if str(q["tbl"]) in t.tables], res)
        return res

    return write_retrying(s, go)


def retry_errors(
    topo: Topology | Cluster, site: str | None = None, id_: int | None = None, all_: bool = False
) -> list[dict[str, Any]]:
    """Apply held changes again: `id_` (and the changes of its row waiting behind it), or with
    `all_` every held change of every site (or `site`), in version order, one transaction per
    site. A change that applies leaves the queue; one rejected again stays, with the new error.
    Returns per site: applied (ids), held (id -> why), and what was applied per table."""
    if (id_ is None) == (not all_):
        raise ConfigError(["errors retry: give --id N (one change, and those waiting behind it) or --all"])
    cl, own = as_cluster(topo)
    try:
        if id_ is not None:
            n = _find(cl, site, id_)

            def one(conn: Any, s: Site) -> list[dict[str, Any]]:
                first = store.errorqueue.get(conn, s.dialect, id_)
                if first is None or first["state"] not in store.errorqueue.OPEN:
                    state = "gone" if first is None else first["state"]
                    raise ConfigError([f"--id {id_}: the change is {state}, not held (see: multimaster errors -t FILE --all)"])
                return store.errorqueue.chain(conn, s.dialect, first)

            return [_report(_retry_at(cl, n, one))]
        return [
            _report(_retry_at(cl, n, lambda conn, s: store.errorqueue.rows(conn, s.dialect)))
            for n in _sites(cl, site)
            if _has_queue(cl, n)
        ]
    finally:
        if own:
            cl.close()


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
    """Drop the held change `id_` on purpose: it is never applied here (state `skipped`, with
    `reason` and the time, kept in the queue as history); the changes of its row that waited
    behind it are then applied (as `retry` would), in the same transaction."""
    if not reason or not reason.strip():
        raise ConfigError(["errors skip: --reason TEXT is required (why the change is dropped; it is kept in the queue)"])
    cl, own = as_cluster(topo)
    try:
        n = _find(cl, site, id_)
        t = cl.topo

        def behind(conn: Any, s: Site) -> list[dict[str, Any]]:
            first = store.errorqueue.get(conn, s.dialect, id_)
            if first is not None and first["state"] == store.errorqueue.PARKED and first["tbl"] in t.tables:
                # a parked row (docs/unique.md): deleted for good, a replicated delete, so every site agrees
                uniques.skip_parked(conn, s, s.info(conn, first["tbl"], t), first["rid"])
                store.errorqueue.skip(conn, s.dialect, id_, reason.strip(), now_iso())
                return []
            if first is None or first["state"] not in store.errorqueue.OPEN:
                state = "gone" if first is None else first["state"]
                raise ConfigError([f"--id {id_}: the change is {state}, not held (nothing to skip)"])
            store.errorqueue.skip(conn, s.dialect, id_, reason.strip(), now_iso())
            if first["tbl"] in t.tables and first["op"] != "?":  # its snapshot rows: done with, on purpose
                snaps = [s.dialect.obj(first["tbl"], p).snapshot() for p in t.peers_of(n)]
                held.mark(conn, s.dialect, snaps, first["ver"], applied=1)
                info = s.info(conn, first["tbl"], t)
                if first["op"] == "I" and info.spec.renumber and held.rank_kept(conn, s.dialect, info, first["rid"]) is not None:
                    held.tombstone(conn, s.dialect, info, first["rid"], first["ver"])  # its rank stays, as a deleted row's
            return store.errorqueue.chain(conn, s.dialect, first)

        rep = _report(_retry_at(cl, n, behind))
        rep["skipped"] = id_
        return rep
    finally:
        if own:
            cl.close()
