"""The public Python API. The CLI only wraps these functions.

    from multimaster import api, load_topology
    topo = load_topology("topologies/three-sites.yaml")
    api.init(topo)
    api.refresh(topo)            # every link, until each peer's backlog is pulled and applied
    print(api.status(topo))
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .engine import RefreshResult, ReconcileResult, now_iso, pull_batch, reconcile_table, store_batch
from .errors import BaseRowsDiffer, ConfigError, MultimasterError, SchemaError
from .schema import TableInfo, compare_schemas, names
from .site import Site, open_sites
from .topology import Topology
from .versions import BASE_VER, ver_ms

__all__ = [
    "catch_up",
    "init",
    "uninstall",
    "refresh",
    "refresh_link",
    "reconcile",
    "status",
    "conflicts",
    "InitReport",
    "Cluster",
]

Progress = Callable[[str], None]
T = TypeVar("T")


class Cluster:
    """Open sites of a topology, reused across calls (engines are pooled)."""

    def __init__(self, topo: Topology, names_: list[str] | None = None, *, create: bool = False):
        self.topo = topo
        self.sites: dict[str, Site] = open_sites(topo, names_, create=create)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for s in self.sites.values():
            s.dispose()

    def site(self, name: str) -> Site:
        if name not in self.sites:
            if name not in self.topo.sites:
                raise ConfigError([f"site '{name}' is not defined under sites"])
            self.sites[name] = Site(name, self.topo.sites[name].url)
        return self.sites[name]


def _cluster(topo_or_cluster: Topology | Cluster) -> tuple[Cluster, bool]:
    if isinstance(topo_or_cluster, Cluster):
        return topo_or_cluster, False
    return Cluster(topo_or_cluster), True


# ---------------------------------------------------------------------------------------------
# init / uninstall


@dataclass
class InitReport:
    sites: dict[str, list[str]] = field(default_factory=dict)  # site -> tables newly installed
    copied: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {target site: rows}
    base_rows: dict[str, int] = field(default_factory=dict)


def _rows_sorted(conn: Connection, site: Site, info: TableInfo, chunk: int = 5000):  # type: ignore[no-untyped-def]
    q = site.dialect.quote
    cols = ", ".join([q(info.key.name)] + [q(c) for c in info.column_names])
    res = conn.exec_driver_sql(f"SELECT {cols} FROM {q(info.name)} ORDER BY {q(info.key.name)}")
    while True:
        part = res.fetchmany(chunk)
        if not part:
            break
        yield from (tuple(r) for r in part)


def _norm(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _compare_base(table: str, a: Site, ca: Connection, b: Site, cb: Connection, info_a: TableInfo, info_b: TableInfo) -> None:
    ita, itb = _rows_sorted(ca, a, info_a), _rows_sorted(cb, b, info_b)
    while True:
        ra, rb = next(ita, None), next(itb, None)
        if ra is None and rb is None:
            return
        if ra is None or rb is None or tuple(map(_norm, ra)) != tuple(map(_norm, rb)):
            def show(r: Any) -> str:
                return "no row" if r is None else f"key {r[0]}: {dict(zip(info_a.column_names, r[1:]))}"
            raise BaseRowsDiffer(table, a.name, b.name, f"first difference: '{a.name}' has {show(ra)}, '{b.name}' has {show(rb)}")


def init(topo: Topology | Cluster, progress: Progress | None = None) -> InitReport:
    """Install logs, snapshots, shadows and triggers at every site. Idempotent.

    Checks first, touches nothing until every check passed: every site reachable, every table
    present with the same columns everywhere, base rows equal (or all but one site empty, whose
    rows are then copied). Each site is then installed in one transaction."""
    cl, own = _cluster(topo)
    t = cl.topo
    say = progress or (lambda _m: None)
    rep = InitReport()
    try:
        sites = {n: cl.site(n) for n in t.sites}
        for s in sites.values():
            s.engine  # noqa: B018 - connect now: unreachable sites fail before anything is written
        infos: dict[str, dict[str, TableInfo]] = {tb: {} for tb in t.tables}
        installed: dict[str, set[str]] = {}
        problems: list[str] = []
        for n, s in sites.items():
            with s.read() as conn:
                installed[n] = set(s.installed_tables(conn))
                problems.extend(f"site '{n}': {m}" for m in s.dialect.install_problems(conn, list(t.tables)))
                for tb in t.tables:
                    try:
                        infos[tb][n] = s.info(conn, tb, t)
                    except SchemaError as e:
                        problems.extend(e.problems)
        if problems:
            raise SchemaError(problems)
        dialects = {n: s.dialect.name for n, s in sites.items()}
        for tb in t.tables:
            problems.extend(compare_schemas(tb, infos[tb], dialects))
        if problems:
            raise SchemaError(problems)
        copy_from: dict[str, tuple[str, list[str]]] = {}
        for tb in t.tables:
            have = [n for n in sites if tb in installed[n]]
            fresh = [n for n in sites if tb not in installed[n]]
            if not fresh:
                continue
            if have:
                raise SchemaError([
                    f"table '{tb}' is already replicated at {have} but not at {fresh}; "
                    "bring a new site in with 'multimaster add-site' (online instantiation), not init"
                ])
            counts = {}
            for n in fresh:
                with sites[n].read() as conn:
                    counts[n] = conn.exec_driver_sql(f"SELECT count(*) FROM {sites[n].dialect.quote(tb)}").scalar() or 0
            nonempty = [n for n in fresh if counts[n] > 0]
            if len(nonempty) > 1:
                ref = nonempty[0]
                for other in nonempty[1:]:
                    with sites[ref].read() as ca, sites[other].read() as cb:
                        _compare_base(tb, sites[ref], ca, sites[other], cb, infos[tb][ref], infos[tb][other])
            if nonempty:
                empties = [n for n in fresh if counts[n] == 0]
                if empties:
                    copy_from[tb] = (nonempty[0], empties)
            rep.base_rows[tb] = counts[nonempty[0]] if nonempty else 0
        # every check passed: install, one transaction per site
        for n, s in sites.items():
            say(f"installing at {n}")
            s.dialect.prepare_site(s.engine)
            newly = []
            with s.write() as conn:
                s.dialect.install_site(conn, n)
                s.dialect.install_ops(conn)
                for tb in t.tables:
                    info = infos[tb][n]
                    s.dialect.install_table(conn, info)
                    for peer in t.peers_of(n):
                        s.dialect.install_snapshot(conn, info, peer)
                        s.dialect.ensure_link(conn, peer, tb)
                    if tb not in installed[n]:
                        newly.append(tb)
                        if tb in copy_from and n in copy_from[tb][1]:
                            src = sites[copy_from[tb][0]]
                            rep.copied.setdefault(tb, {})[n] = _copy_rows(src, s, conn, infos[tb][src.name], info, say)
                        s.dialect.register_table(conn, info)
                    s.dialect.install_capture(conn, info)
            rep.sites[n] = newly
        return rep
    finally:
        if own:
            cl.close()


def _copy_rows(src: Site, dst: Site, dconn: Connection, info_src: TableInfo, info_dst: TableInfo, say: Progress) -> int:
    """Copy the base rows of one site into an empty one, inside the target's install transaction
    (before its capture triggers exist, so nothing is captured)."""
    q = dst.dialect.quote
    cols = [info_dst.key.name, *info_dst.column_names]
    sql = f"INSERT INTO {q(info_dst.name)} ({', '.join(q(c) for c in cols)}) VALUES ({dst.dialect.ph(len(cols))})"
    n = 0
    with src.read() as sconn:
        batch: list[tuple[Any, ...]] = []
        adapters = dst.dialect.value_adapters(info_dst)  # values as the target's driver stores them exactly
        for row in _rows_sorted(sconn, src, info_src):
            batch.append((row[0], *(v if f is None else f(v) for f, v in zip(adapters, row[1:]))))
            if len(batch) >= 10_000:
                dconn.exec_driver_sql(sql, batch)
                n += len(batch)
                batch = []
                say(f"copied {n} rows of {info_dst.name} from {src.name} to {dst.name}")
        if batch:
            dconn.exec_driver_sql(sql, batch)
            n += len(batch)
    return n


def uninstall(topo: Topology | Cluster, site: str | None = None) -> dict[str, list[str]]:
    """Remove every object multimaster created; user tables and rows stay as they are."""
    cl, own = _cluster(topo)
    try:
        out = {}
        for n in [site] if site else list(cl.topo.sites):
            s = cl.site(n)
            with s.write() as conn:
                out[n] = s.dialect.uninstall(conn, list(cl.topo.tables), cl.topo.peers_of(n))
        return out
    finally:
        if own:
            cl.close()


# ---------------------------------------------------------------------------------------------
# refresh / reconcile


def relay_origins(topo: Topology, site: str, info: TableInfo) -> list[str] | None:
    """Origins whose changes `site` must pass on (second-order records), None for all.

    A change applied at X is pulled from X by every site that pulls from X. It is needed there only
    if that site does not pull from the change's origin directly — unless the table depends on
    causal delivery (policies other than latest/additive, natural keys): then every applied change
    is relayed so that no site sees a change before one it depends on."""
    causal = not info.spec.renumber or any(s.policy.kind not in ("latest", "additive") for s in info.spec.slots)
    if causal:
        return None
    pullers = [ln.target for ln in topo.links if ln.source == site]
    need = set()
    for origin in topo.sites:
        if origin == site:
            continue
        if any(p != origin and origin not in topo.peers_of(p) for p in pullers):
            need.add(origin)
    return sorted(need)


def _base_max(conn: Connection, site: Site, table: str) -> int:
    return site.dialect.base_max(conn, table)


def refresh_link(cl: Cluster, target: str, source: str, *, batch_size: int | None = None, reconcile_: bool = True,
                 progress: Progress | None = None, stop: Callable[[], bool] | None = None) -> RefreshResult:
    """Pull `source`'s change log into `target`'s snapshot and reconcile, batch by batch.

    Each batch is one transaction at `target`: snapshot rows, watermark and the applied changes
    commit together, so an interrupted refresh leaves nothing half-done and resumes where it was.
    `stop` is asked between batches (the daemon's shutdown): True ends the refresh there."""
    from .purge import check_not_purged
    t = cl.topo
    tgt, src = cl.site(target), cl.site(source)
    batch = batch_size or t.refresh.batch_size
    res = RefreshResult(target, source)
    t0 = time.perf_counter()
    peers = t.peers_of(target)
    try:
        for tb in t.tables:
            with tgt.read() as conn:
                tgt.require_installed(conn, t)
                info = tgt.info(conn, tb, t)
                base_max = _base_max(conn, tgt, tb)
            rr = ReconcileResult(tb)
            while True:
                with tgt.read() as conn:
                    wm = tgt.dialect.watermark(conn, source, tb)
                rows = pull_batch(src, tgt, None, info, wm, batch)
                check_not_purged(src, target, tb, wm)
                if not rows:
                    break
                def apply_batch(conn: Connection) -> tuple[int, ReconcileResult | None] | None:
                    if tgt.dialect.watermark(conn, source, tb) != wm:
                        return None  # another refresher moved it: read again
                    stored, last = store_batch(conn, tgt, info, source, rows, applied=reconcile_)
                    tgt.dialect.upsert_watermark(conn, source, tb, last)
                    if reconcile_:
                        fresh = {source: min((r[2] for r in rows if r[1] == "A"), default=1 << 62)}
                        r = reconcile_table(conn, tgt, info, peers, base_max, relay_origins(t, target, info), fresh)
                        tgt.dialect.link_stats(conn, source, stored, r.applied, len(r.conflicts), now_iso())
                        return stored, r
                    tgt.dialect.link_stats(conn, source, stored, 0, 0, now_iso())
                    return stored, None

                done = write_retrying(tgt, apply_batch)
                if done is None:
                    continue
                res.pulled += done[0]
                if done[1] is not None:
                    rr.add(done[1])
                res.batches += 1
                if progress:
                    progress(f"{source} -> {target} {tb}: {res.pulled} changes pulled")
                if len(rows) < batch or (stop is not None and stop()):
                    break
            res.reconciled[tb] = rr
            if stop is not None and stop():
                break
        if res.pulled == 0:
            with tgt.write() as conn:  # nothing new: still a success, for status and purge retention
                tgt.dialect.link_stats(conn, source, 0, 0, 0, now_iso())
    except MultimasterError as e:
        res.error = str(e)
        _record_error(tgt, source, res.error)
    except Exception as e:  # noqa: BLE001 - recorded for status, re-raised by the caller when asked
        res.error = f"{type(e).__name__}: {str(getattr(e, 'orig', e)).splitlines()[0] if str(e) else ''}"
        _record_error(tgt, source, res.error)
    res.seconds = time.perf_counter() - t0
    return res


#: attempts of one write transaction that failed transiently (deadlock, serialization failure, lock timeout)
RETRIES = 10


def write_retrying(site: Site, fn: Callable[[Connection], T]) -> T:
    """Run `fn` in one write transaction at `site`. A transient failure rolls the whole transaction
    back (nothing of the batch stays) and runs it again after a jittered exponential backoff
    (10 ms doubling to 1 s); after RETRIES attempts, or on any other error, it raises."""
    delay = 0.01
    for attempt in range(RETRIES):
        try:
            with site.write() as conn:
                return fn(conn)
        except DBAPIError as e:
            if attempt == RETRIES - 1 or not site.dialect.is_retryable(e):
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def _record_error(tgt: Site, source: str, msg: str) -> None:
    try:
        with tgt.write() as conn:
            tgt.dialect.link_error(conn, source, msg, now_iso())
    except Exception:  # noqa: BLE001 - the target itself may be what failed
        pass


def refresh(topo: Topology | Cluster, site: str | None = None, peer: str | None = None, *, batch_size: int | None = None,
            reconcile_: bool = True, progress: Progress | None = None) -> list[RefreshResult]:
    """Refresh every link into `site` (all sites if None), only from `peer` if given."""
    cl, own = _cluster(topo)
    try:
        t = cl.topo
        for n in (site, peer):
            if n is not None and n not in t.sites:
                raise ConfigError([f"site '{n}' is not defined under sites"])
        links = [ln for ln in t.links if (site is None or ln.target == site) and (peer is None or ln.source == peer)]
        if not links:
            raise ConfigError([f"no link matches --site {site} --peer {peer} (see 'links' in the topology)"])
        return [refresh_link(cl, ln.target, ln.source, batch_size=batch_size, reconcile_=reconcile_, progress=progress) for ln in links]
    finally:
        if own:
            cl.close()


def reconcile(topo: Topology | Cluster, site: str | None = None) -> dict[str, dict[str, ReconcileResult]]:
    """Apply snapshot rows already pulled (e.g. by `refresh --no-reconcile`)."""
    cl, own = _cluster(topo)
    try:
        t = cl.topo
        out: dict[str, dict[str, ReconcileResult]] = {}
        for n in [site] if site else list(t.sites):
            s = cl.site(n)
            out[n] = {}
            for tb in t.tables:
                def apply(conn: Connection, tb: str = tb) -> ReconcileResult:
                    s.require_installed(conn, t)
                    info = s.info(conn, tb, t)
                    return reconcile_table(conn, s, info, t.peers_of(n), _base_max(conn, s, tb), relay_origins(t, n, info))

                out[n][tb] = write_retrying(s, apply)
        return out
    finally:
        if own:
            cl.close()


def catch_up(topo: Topology | Cluster, site: str | None = None) -> None:
    """Bring every shadow up to date with its site's own inserts (SQLite writes them lazily; the
    reconciler does this itself). For tools that copy shadow rows (repair, add-site)."""
    cl, own = _cluster(topo)
    try:
        for n in [site] if site else list(cl.topo.sites):
            s = cl.site(n)
            with s.write() as conn:
                for tb in cl.topo.tables:
                    s.dialect.catch_up(conn, s.info(conn, tb, cl.topo))
    finally:
        if own:
            cl.close()


# ---------------------------------------------------------------------------------------------
# status / conflicts


def status(topo: Topology | Cluster, since: str | None = None) -> dict[str, Any]:
    """Per link: changes waiting at the peer, watermark, last success/error, the age of the oldest
    change not yet applied. Per site: conflicts (and `conflicts_since` the UTC time `since`,
    'YYYY-MM-DDTHH:MM:SS'), log sizes, clock. Unreachable sites are reported, not raised."""
    cl, own = _cluster(topo)
    t = cl.topo
    out: dict[str, Any] = {"sites": {}, "links": []}
    try:
        site_data: dict[str, dict[str, Any]] = {}
        for n in t.sites:
            s = cl.site(n)
            d: dict[str, Any] = {"url": s.display_url, "reachable": True}
            try:
                with s.read() as conn:
                    tables = s.installed_tables(conn)
                    d["installed"] = sorted(tables) == sorted(t.tables)
                    if tables:
                        d.update(s.dialect.site_status(conn, list(t.tables)))
                        if since is not None:
                            d["conflicts_since"] = s.dialect.conflicts_since(conn, since)
            except MultimasterError as e:
                d["reachable"] = False
                d["error"] = str(e)
            site_data[n] = d
        out["sites"] = site_data
        now_ms = int(time.time() * 1000)
        for ln in t.links:
            entry: dict[str, Any] = {"from": ln.source, "to": ln.target, "tables": {}}
            src, tgt = cl.site(ln.source), cl.site(ln.target)
            if not (site_data[ln.source].get("installed") and site_data[ln.target].get("installed")):
                entry["error"] = "not installed or unreachable"
                out["links"].append(entry)
                continue
            with tgt.read() as tconn:
                entry.update(tgt.dialect.link_row(conn=tconn, peer=ln.source))
                wms = {tb: tgt.dialect.watermark(tconn, ln.source, tb) for tb in t.tables}
                pending_local = {tb: tgt.dialect.unapplied(tconn, tb, ln.source) for tb in t.tables}
            waiting_total = 0
            oldest: str | None = None
            with src.read() as sconn:
                for tb in t.tables:
                    w, o = src.dialect.waiting(sconn, tb, wms[tb], ln.target)
                    entry["tables"][tb] = {"watermark": wms[tb], "waiting": w, "unapplied": pending_local[tb][0]}
                    waiting_total += w + pending_local[tb][0]
                    for cand in (o, pending_local[tb][1]):
                        if cand is not None and (oldest is None or cand < oldest):
                            oldest = cand
            entry["waiting"] = waiting_total
            entry["oldest_waiting_age_s"] = None if oldest is None else max(0.0, (now_ms - ver_ms(oldest)) / 1000)
            out["links"].append(entry)
        out["converging"] = all(ln.get("waiting", 1) == 0 for ln in out["links"])
        from .verifications import last

        out["verification"] = last(cl) if site_data[t.verify_site].get("reachable") else None  # last recorded verify run
        return out
    finally:
        if own:
            cl.close()


def conflicts(topo: Topology | Cluster, site: str | None = None, table: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    cl, own = _cluster(topo)
    try:
        rows: list[dict[str, Any]] = []
        for n in [site] if site else list(cl.topo.sites):
            s = cl.site(n)
            with s.read() as conn:
                if not s.installed_tables(conn):
                    continue
                for r in s.dialect.conflict_rows(conn, table, limit):
                    d = dict(r)
                    d["site"] = n
                    for k in ("columns", "local_values", "remote_values"):
                        if d.get(k):
                            d[k] = json.loads(d[k])
                    rows.append(d)
        rows.sort(key=lambda r: (r["detected_at"], r["site"], r["id"]))
        return rows[-limit:] if limit else rows
    finally:
        if own:
            cl.close()


__all__ += ["BASE_VER", "names"]
