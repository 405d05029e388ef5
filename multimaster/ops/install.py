"""Install: logs, snapshots, shadows and triggers at every site (`multimaster init`; uninstall: ops/uninstall.py)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.core.progress import ProgressEvent
from multimaster.dialects.schema import TableInfo
from multimaster.engine import evolve, references, uniques
from multimaster.engine.cluster import Cluster, Progress, as_cluster
from multimaster.engine.lockwatch import Watch
from multimaster.engine.refresh import follow_site, write_retrying
from multimaster.engine.schema import collation_findings, compare_schemas, park_references
from multimaster.engine.site import Site
from multimaster.errors import BaseRowsChanged, BaseRowsDiffer, SchemaError, first_line
from multimaster.ops.instantiate import join
from multimaster.ops.uninstall import drop_table

__all__ = ["InitReport", "init"]


@dataclass
class InitReport:
    sites: dict[str, list[str]] = field(default_factory=dict)  # site -> tables newly installed
    copied: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {target site: rows}
    base_rows: dict[str, int] = field(default_factory=dict)
    evolved: dict[str, list[str]] = field(default_factory=dict)  # site -> tables whose capture followed a schema change
    #: site -> tables installed there but no longer under tables: (untracked_message says what to do)
    untracked: dict[str, list[str]] = field(default_factory=dict)
    #: site -> what applications inserting into a renumbered table there are told of the new key that
    #: may not be its key (Dialect.insert_key_caveat), and the application's triggers on replicated
    #: tables that fire for the peers' changes too (Dialect.unguarded_caveats)
    caveats: dict[str, list[str]] = field(default_factory=dict)
    #: what init's checks found questionable without refusing it: a key or UNIQUE column whose
    #: collation takes different texts as one value at every site alike (docs/mysql.md "Collations")
    warnings: list[str] = field(default_factory=list)


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


def _digest() -> Any:
    """A running digest of one site's rows as `_rows_sorted` reads them (key order); compared only
    with a digest of the same site's rows read the same way, never across databases."""
    return hashlib.blake2b(digest_size=16)


def rows_digest(conn: Connection, site: Site, info: TableInfo) -> str:
    """The digest of `info`'s rows at `site`, read on `conn`."""
    h = _digest()
    for r in _rows_sorted(conn, site, info):
        h.update(repr(tuple(map(_norm, r))).encode())
    return str(h.hexdigest())


def _compare_base(
    table: str, a: Site, ca: Connection, b: Site, cb: Connection, info_a: TableInfo, info_b: TableInfo
) -> tuple[str, str]:
    """Raise BaseRowsDiffer at the first row where `a` and `b` differ; else the digests of their
    rows (rows_digest), which each site's install checks again once its writers wait."""
    ita, itb = _rows_sorted(ca, a, info_a), _rows_sorted(cb, b, info_b)
    ha, hb = _digest(), _digest()
    while True:
        ra, rb = next(ita, None), next(itb, None)
        if ra is None and rb is None:
            return str(ha.hexdigest()), str(hb.hexdigest())
        if ra is not None:
            ha.update(repr(tuple(map(_norm, ra))).encode())
        if rb is not None:
            hb.update(repr(tuple(map(_norm, rb))).encode())
        if ra is None or rb is None or tuple(map(_norm, ra)) != tuple(map(_norm, rb)):

            def show(r: Any) -> str:
                return "no row" if r is None else f"key {r[0]}: {dict(zip(info_a.column_names, r[1:]))}"

            raise BaseRowsDiffer(table, a.name, b.name, f"first difference: '{a.name}' has {show(ra)}, '{b.name}' has {show(rb)}")


def init(topo: Topology | Cluster, progress: Progress | None = None) -> InitReport:
    """Install logs, snapshots, shadows and triggers at every site. Idempotent.

    Checks first, touches nothing until every check passed: every site reachable, every table
    present with the same columns everywhere, base rows equal (or all but one site empty, whose
    rows are then copied). Each site is then installed in one transaction. `progress` is told each
    step, the base rows copied so far, and a lock its transaction waits for past
    refresh.lock_wait_warn (engine/lockwatch.py)."""
    cl, own = as_cluster(topo)
    t = cl.topo
    say = progress or (lambda _m: None)
    after = t.refresh.lock_wait_warn_seconds()
    rep = InitReport()
    try:
        sites = {n: cl.site(n) for n in t.sites}
        for s in sites.values():
            s.engine  # noqa: B018 - connect now: unreachable sites fail before anything is written
        # capture follows each site's own schema first (a table changed since it was installed)
        _follow_all(cl, rep)
        chk = _check_schemas(t, sites)
        rep.warnings = chk.warnings
        rep.untracked = {n: sorted(chk.installed[n] - set(t.tables)) for n in sites if chk.installed[n] - set(t.tables)}
        _check_base_rows(t, chk, rep)
        _check_read_only(t, chk)
        # every check passed: install, one transaction per site; the empty sites last, each a
        # copy of an installed site it pulls from, read in one snapshot at a recorded position
        # of its change log (add-site's copy: a write committed meanwhile arrives once)
        _install_all(t, chk, rep, say, progress, after)
        _join_empty(cl, chk, rep, say, progress, after)
        _note_triggers(t, sites, rep)
        return rep
    finally:
        if own:
            cl.close()


def _note_triggers(t: Topology, sites: dict[str, Site], rep: InitReport) -> None:
    """Add to `rep.caveats` each application trigger on a replicated table that fires for the
    peers' changes too (docs/operations.md "Your own triggers"): a read, nothing changed."""
    for n, s in sites.items():
        with s.engine.connect() as conn:
            for tb in t.tables:
                if unguarded := s.dialect.unguarded_caveats(conn, tb):
                    rep.caveats.setdefault(n, []).extend(unguarded)


@dataclass
class _Checked:
    """What init's checks found: per table and site its description, per site the tables installed
    there already, and per table the base rows to copy: (from site, to the empty sites)."""

    sites: dict[str, Site]
    infos: dict[str, dict[str, TableInfo]]
    installed: dict[str, set[str]]
    copy_from: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    #: the empty sites brought in as copies of an installed site (add-site's copy), in order:
    #: site -> the site it is copied from
    joining: dict[str, str] = field(default_factory=dict)
    #: (table, site) -> the digest of the site's rows when init compared them with another site's
    #: (where more than one site held rows): its install checks them again (BaseRowsChanged)
    digests: dict[tuple[str, str], str] = field(default_factory=dict)
    #: what the checks found questionable without refusing it (InitReport.warnings)
    warnings: list[str] = field(default_factory=list)


def _check_schemas(t: Topology, sites: dict[str, Site]) -> _Checked:
    """Read every table at every site; raise SchemaError listing every problem (a site that cannot
    hold the install, a table missing or unusable, columns that differ between sites)."""
    infos: dict[str, dict[str, TableInfo]] = {tb: {} for tb in t.tables}
    installed: dict[str, set[str]] = {}
    problems: list[str] = []
    for n, s in sites.items():
        with s.read() as conn:
            installed[n] = set(s.installed_tables(conn))
            problems.extend(f"site '{n}': {m}" for m in s.dialect.install_problems(conn, list(t.tables)))
            for tb in t.tables:
                try:
                    with conn.begin_nested():
                        infos[tb][n] = s.info(conn, tb, t)
                except SchemaError as e:
                    problems.extend(e.problems)
                except DBAPIError as e:  # (a privilege missing: install_problems names the GRANT)
                    problems.append(f"site '{n}': table '{tb}' cannot be read: {first_line(e)}")
            problems.extend(park_references(conn, n, {tb: infos[tb][n] for tb in t.tables if n in infos[tb]}))
            for tb in t.tables:  # names the database would cut: found before any site is written
                if n in infos[tb]:
                    problems.extend(f"site '{n}': {m}" for m in s.dialect.name_problems(infos[tb][n], t.peers_of(n)))
    if problems:
        raise SchemaError(problems)
    dialects = {n: s.dialect.name for n, s in sites.items()}
    warned: list[str] = []
    for tb in t.tables:
        # a table replicated already may differ between sites while a schema change goes round
        # the cluster (docs/schema-changes.md): only the columns they share must agree
        migrating = any(tb in installed[n] for n in sites)
        problems.extend(compare_schemas(tb, infos[tb], dialects, common_only=migrating))
        refused, questionable = collation_findings(tb, infos[tb], dialects, installed=migrating)
        problems.extend(refused)
        warned.extend(questionable)
    if problems:
        raise SchemaError(problems)
    return _Checked(sites, infos, installed, warnings=warned)


def _check_read_only(t: Topology, chk: _Checked) -> None:
    """A site made read-only must not keep changes (its own, or relayed) that a site pulling from it
    before has not pulled yet: no link pulls from it any more, so they would never leave it. Raises
    SchemaError naming each and the fix."""
    problems: list[str] = []
    for r in t.read_only:
        if not chk.installed[r]:
            continue
        rs = chk.sites[r]
        ph = rs.dialect.caps.placeholder
        for x, xs in chk.sites.items():
            if x == r:
                continue
            for tb in sorted(chk.installed[r] & chk.installed[x] & set(t.tables)):
                with xs.read() as xc:
                    wm = store.watermarks.find(xc, xs.dialect, r, tb)
                if wm is None:
                    continue  # x never pulled from r
                with rs.read() as rc:
                    left = rc.exec_driver_sql(
                        f"SELECT count(*) FROM {rs.dialect.obj(tb).log} WHERE origin <> {ph} AND seq > {ph}", (x, int(wm))
                    ).scalar()
                if left:
                    problems.append(
                        f"site '{r}' is read_only now, but site '{x}' has not pulled {left} change(s) of table '{tb}' "
                        f"from its change log (written or relayed while it was writable), and no link pulls from '{r}' any more: with the links "
                        f"from '{r}' still in the file, run 'multimaster refresh --until-quiet' first, then make it read-only"
                    )
    if problems:
        raise SchemaError(problems)


def _count(s: Site, tb: str) -> int:
    with s.read() as conn:
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM {s.dialect.quote(tb)}").scalar() or 0)


def _plan_joining(t: Topology, chk: _Checked) -> None:
    """The sites init brings in as copies (`chk.joining`): those where nothing is installed and
    every table is empty, while another site has rows or is installed. Each is copied from a site
    it pulls from that is installed before it (a site with rows first); one that pulls from none
    of them keeps the plain install (its base rows copied in its install transaction)."""
    sites = chk.sites
    empty = [n for n in sites if not chk.installed[n] and all(_count(sites[n], tb) == 0 for tb in t.tables)]
    if len(empty) == len(sites):
        return  # a cluster without rows: nothing to copy
    placed = [n for n in sites if n not in empty]
    moved = True
    while moved:
        moved = False
        for n in empty:
            if n in chk.joining:
                continue
            src = next((q for q in placed if q in t.peers_of(n)), None)
            if src is not None:
                chk.joining[n] = src
                placed.append(n)
                moved = True


def _check_base_rows(t: Topology, chk: _Checked, rep: InitReport) -> None:
    """For every table not installed anywhere yet: the sites that hold rows must hold the same rows
    (BaseRowsDiffer names the first difference); the empty sites get them copied: as copies of an
    installed site (`chk.joining`), or, where that cannot be, in their install transaction
    (`chk.copy_from`). A table installed at some sites only is refused at a site that has rows or
    other tables installed: that is add-site's job."""
    sites = chk.sites
    _plan_joining(t, chk)
    for tb in t.tables:
        have = [n for n in sites if tb in chk.installed[n]]
        fresh = [n for n in sites if tb not in chk.installed[n] and n not in chk.joining]
        if not fresh:
            continue
        if have:
            raise SchemaError(
                [
                    f"table '{tb}' is already replicated at {have} but not at {fresh}; "
                    "bring a new site in with 'multimaster add-site' (online instantiation), not init"
                ]
            )
        counts = {n: _count(sites[n], tb) for n in fresh}
        nonempty = [n for n in fresh if counts[n] > 0]
        if len(nonempty) > 1:
            ref = nonempty[0]
            for other in nonempty[1:]:
                with sites[ref].read() as ca, sites[other].read() as cb:
                    got = _compare_base(tb, sites[ref], ca, sites[other], cb, chk.infos[tb][ref], chk.infos[tb][other])
                chk.digests[(tb, ref)], chk.digests[(tb, other)] = got
        if nonempty:
            empties = [n for n in fresh if counts[n] == 0]
            if empties:
                chk.copy_from[tb] = (nonempty[0], empties)
        rep.base_rows[tb] = counts[nonempty[0]] if nonempty else 0


class _Changed(Exception):
    """A site's rows changed between init's check and its install (raised inside the install)."""

    def __init__(self, table: str, site: str):
        super().__init__(table, site)
        self.table, self.site = table, site


def _install_all(
    t: Topology, chk: _Checked, rep: InitReport, say: Progress, progress: Progress | None, after: float | None
) -> None:
    """Install every site but the joining ones, one transaction each. Where several sites held
    the same rows, a site whose rows changed since the check (an application's write that no
    capture saw) stops init: what this run installed is dropped again at every site (its tables'
    rows stay) and BaseRowsChanged says so; rows copied in stay as the base they were."""
    done: list[str] = []
    for n in chk.sites:
        if n in chk.joining:
            continue
        watch = Watch(f"init at {n}", progress, after) if progress and after is not None else None
        try:
            rep.sites[n] = _install_at(t, n, chk, rep, say, watch)
        except _Changed as e:
            say(f"rows of {e.table} at {n} changed since init compared them: undoing this run's install")
            for m in [*done, n]:  # the site that failed too: where DDL commits as it goes, part of it is there
                _undo(t, m, chk)
            raise BaseRowsChanged(e.table, e.site, [m for m in done if rep.sites.get(m)]) from None
        done.append(n)


def _undo(t: Topology, n: str, chk: _Checked) -> None:
    """Drop at `n` what this init run installed: every table not installed there before it, and
    where nothing was, every object of the site (a first init)."""
    s = chk.sites[n]
    peers = t.peers_of(n)
    with s.write() as conn:
        if not chk.installed[n]:
            s.dialect.uninstall(conn, list(t.tables), peers)
        else:
            for tb in t.tables:
                if tb not in chk.installed[n]:
                    drop_table(conn, s, tb, peers)
    for tb in t.tables:
        if tb not in chk.installed[n]:
            s.forget(tb)


def _install_at(t: Topology, n: str, chk: _Checked, rep: InitReport, say: Progress, watch: Watch | None = None) -> list[str]:
    """Install site `n` in one transaction: site objects, then per table its log, shadow, snapshots
    of its peers, links, base rows copied (when it was empty) and capture triggers. Returns the
    tables newly installed there."""
    s = chk.sites[n]
    say(f"installing at {n}")
    s.dialect.prepare_site(s.engine)

    def run(conn: Connection) -> list[str]:
        # writers wait for init, never deadlock with it; a lock not had in time: run again (write_retrying)
        s.dialect.lock_for_install(conn, list(t.tables))
        return _install_tables(conn, t, n, s, chk, rep, say)

    return write_retrying(s, run, watch)


def _install_tables(conn: Connection, t: Topology, n: str, s: Site, chk: _Checked, rep: InitReport, say: Progress) -> list[str]:
    """_install_at's transaction, once its locks are taken (run again whole after a lock timeout)."""
    newly = []
    rep.caveats.pop(n, None)
    s.dialect.install_site(conn, n)
    store.install(conn, s.dialect)
    for tb in t.tables:
        info = chk.infos[tb][n]
        s.dialect.install_table(conn, info)
        s.dialect.install_heads(conn, info)
        uniques.install(conn, s.dialect, info)
        for peer in t.peers_of(n):
            s.dialect.install_snapshot(conn, info, peer)
            store.links.ensure(conn, s.dialect, peer, tb)
            # a new snapshot holds everything it will pull; one made before horizons were kept, nothing known
            wm = store.watermarks.read(conn, s.dialect, peer, tb)
            store.purges.ensure_snapshot_horizon(conn, s.dialect, peer, tb, wm)
        references.install(conn, s, info, t.peers_of(n))  # foreign keys: identities beside keys
        if tb not in chk.installed[n]:
            newly.append(tb)
        with s.dialect.starting_capture(conn, info):  # its writers wait (MariaDB; elsewhere: lock_for_install)
            _start_capture(conn, s, chk, info, rep, say)
        if caveat := s.dialect.insert_key_caveat(conn, info):
            rep.caveats.setdefault(n, []).append(caveat)
        s.dialect.guard_writes(conn, info, n, n in t.read_only)  # docs/topologies.md "Read-only sites"
        evolve.ensure_registered(conn, s, info)  # schema version 1 (docs/schema-changes.md)
    return newly


def _start_capture(conn: Connection, s: Site, chk: _Checked, info: TableInfo, rep: InitReport, say: Progress) -> None:
    """Capture `info` at `s` from now on: where it is not registered yet, its base rows copied in
    (when it was empty) and given their identities, then the capture triggers. Whether it is
    registered is read here, not taken from the checks: where DDL commits as it goes, an attempt
    that failed after the registration committed (write_retrying runs the install again) must not
    copy or register again."""
    tb = info.name
    if store.tables.registration(conn, s.dialect, tb) is None:
        checked = chk.digests.get((tb, s.name))
        if checked is not None and rows_digest(conn, s, info) != checked:
            raise _Changed(tb, s.name)  # a write since the check: captured by no one, sent nowhere
        if tb in chk.copy_from and s.name in chk.copy_from[tb][1]:
            src = chk.sites[chk.copy_from[tb][0]]
            s.dialect.set_applying(conn, True)  # the application's guarded triggers skip the copy
            rep.copied.setdefault(tb, {})[s.name] = _copy_rows(
                src, s, conn, chk.infos[tb][src.name], info, say, rep.base_rows.get(tb)
            )
            s.dialect.set_applying(conn, False)
        store.tables.register(conn, s.dialect, info)
    s.dialect.install_capture(conn, info)


def _join_empty(
    cl: Cluster, chk: _Checked, rep: InitReport, say: Progress, progress: Progress | None, after: float | None
) -> None:
    """Bring each of `chk.joining` in as a copy of its installed source (ops/instantiate.py join)."""
    left = set(chk.joining)
    for n, src in chk.joining.items():
        left.discard(n)
        say(f"installing at {n}: copying {src} in one consistent read")
        watch = Watch(f"init at {n}", progress, after) if progress and after is not None else None
        ninfo = {tb: chk.infos[tb][n] for tb in cl.topo.tables}
        got = join(cl, n, src, ninfo, frozenset(left), say, watch)
        rep.sites[n] = list(cl.topo.tables)
        for tb, rows in got.rows.items():
            if rows:
                rep.copied.setdefault(tb, {})[n] = rows
            rep.base_rows[tb] = max(rep.base_rows.get(tb, 0), rows)


def _follow_all(cl: Cluster, rep: InitReport) -> None:
    """Every installed site's capture follows its tables' columns (engine/evolve.py); a change that
    cannot be made online is refused, naming the column and the fix."""
    problems: list[str] = []
    for n in cl.topo.sites:
        try:
            evs = follow_site(cl, n)
        except DBAPIError as e:  # a user who may not read the bookkeeping: say which GRANT
            s = cl.site(n)
            with s.read() as conn:
                problems.extend(f"site '{n}': {m}" for m in s.dialect.install_problems(conn, list(cl.topo.tables)))
            problems.append(f"site '{n}': its tables' capture cannot be checked: {first_line(e)}")
            continue
        for ev in evs:
            if ev.problems:
                problems.extend(ev.problems)
            elif ev.change is not None:
                rep.evolved.setdefault(n, []).append(ev.table)
    if problems:
        raise SchemaError(problems)


def _exact_row(src: Site, dst: Site, info: TableInfo, adapters: list[Any], row: Any) -> tuple[Any, ...]:
    """A base row of `src` (key first) with its values as `dst`'s driver stores them exactly; a
    value of no kind its column holds (SQLite keeps '12abc' in an INTEGER) is refused naming it,
    and nothing of the copy is kept (docs/types.md "Values a site cannot store")."""
    out = [row[0]]
    for c, f, v in zip(info.column_names, adapters, row[1:]):
        try:
            out.append(v if f is None or v is None else f(v))
        except (TypeError, ValueError, ArithmeticError) as e:
            raise SchemaError(
                [
                    f"table '{info.name}', row {info.key.name}={row[0]!r} at '{src.name}', column '{c}': {e}; "
                    f"'{dst.name}' ({dst.dialect.title}) cannot store it exactly: correct it at '{src.name}' and run again "
                    '(docs/types.md "Values a site cannot store")'
                ]
            ) from None
    return tuple(out)


def _copy_rows(
    src: Site, dst: Site, dconn: Connection, info_src: TableInfo, info_dst: TableInfo, say: Progress, total: int | None = None
) -> int:
    """Copy the base rows of one site into an empty one, inside the target's install transaction
    (before its capture triggers exist, so nothing is captured); `say` is told the rows copied
    so far, of `total` (counted by the checks)."""
    q = dst.dialect.quote
    cols = [info_dst.key.name, *info_dst.column_names]
    sql = f"INSERT INTO {q(info_dst.name)} ({', '.join(q(c) for c in cols)}) VALUES ({dst.dialect.ph(len(cols))})"
    n = 0
    t0 = time.perf_counter()

    def copied() -> None:
        say(
            ProgressEvent(
                "copy",
                f"{src.name} -> {dst.name}",
                table=info_dst.name,
                done=n,
                total=total,
                unit="rows",
                seconds=time.perf_counter() - t0,
            )
        )

    with src.read() as sconn:
        batch: list[tuple[Any, ...]] = []
        adapters = dst.dialect.value_adapters(info_dst)  # values as the target's driver stores them exactly
        for row in _rows_sorted(sconn, src, info_src):
            batch.append(_exact_row(src, dst, info_dst, adapters, row))
            if len(batch) >= 10_000:
                dconn.exec_driver_sql(sql, batch)
                n += len(batch)
                batch = []
                copied()
        if batch:
            dconn.exec_driver_sql(sql, batch)
            n += len(batch)
            copied()
    return n
