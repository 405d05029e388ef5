"""`multimaster ddl`: one ALTER TABLE at every site, capture following it (docs/schema-changes.md).

At each site, in one write transaction where the database allows (SQLite, PostgreSQL): the capture
triggers of the table are dropped (SQLite refuses to drop a column a trigger names), the statement
runs, and the site's replication objects follow the new columns (engine/evolve.py) — so no write
of an application is ever captured in the wrong schema, and none fails. On MariaDB, where every
DDL statement commits, the statement runs first and the capture is made again right after it.
A change that cannot be made online is refused: the site is left as it was (on MariaDB, the
statement has run and the capture stays in the previous version; the report says so). Changes
that waited for a column the site now has are applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.dialects import Dialect
from multimaster.engine import evolve
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.refresh import back_off, follow_site, relay_origins, schemas_elsewhere
from multimaster.engine.site import Site
from multimaster.errors import ConfigError, SchemaError, first_line

__all__ = ["DdlReport", "ddl", "table_of"]

_ALTER = re.compile(r"^\s*ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?([`\"]?)([A-Za-z_][A-Za-z0-9_$]*)\1", re.IGNORECASE)


#: `DROP [COLUMN] [IF EXISTS] name` of an ALTER TABLE; the other DROP clauses name no column
_DROP = re.compile(r"\bDROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?([`\"]?)([A-Za-z_][A-Za-z0-9_$]*)\1", re.IGNORECASE)
_NOT_COLUMNS = {"index", "key", "primary", "foreign", "constraint", "check", "partition", "period", "system", "unique"}


def dropped_columns(statement: str, columns: list[str]) -> list[str]:
    """The replicated `columns` an ALTER TABLE `statement` drops (`DROP [COLUMN] name` clauses)."""
    named = {m.group(2).lower() for m in _DROP.finditer(statement) if m.group(2).lower() not in _NOT_COLUMNS}
    return [c for c in columns if c.lower() in named]


def table_of(statement: str) -> str:
    """The table an ALTER TABLE statement changes. Raises ConfigError for anything else."""
    m = _ALTER.match(statement)
    if m is None or ";" in statement.strip().rstrip(";"):
        raise ConfigError(
            [
                f"ddl: expected one ALTER TABLE statement, got {statement.strip()[:80]!r}; run other statements with a database client"
            ]
        )
    return m.group(2)


@dataclass
class DdlReport:
    """What `ddl` did (or, with dry_run, would do) at one site."""

    site: str
    status: str  #: applied, refused, failed, would apply, not run (another site could not take it)
    version: int | None = None
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    retyped: list[str] = field(default_factory=list)
    released: int = 0
    message: str | None = None
    ran: bool = False  #: the statement changed the site's table (committed)


def ddl(topo: Topology | Cluster, statement: str, site: str | None = None, dry_run: bool = False) -> list[DdlReport]:
    """Run `statement` (one ALTER TABLE of a replicated table) at every site (or `site`), one site
    after the other, each site's capture following it. `dry_run`: where DDL is transactional, run
    it and roll back, reporting what it would do; elsewhere only check that the table is there."""
    table = table_of(statement)
    cl, own = as_cluster(topo)
    try:
        t = cl.topo
        if table not in t.tables:
            raise ConfigError(
                [f"ddl: table '{table}' is not replicated (not under tables); run the statement with a database client"]
            )
        if site is not None and site not in t.sites:
            raise ConfigError([f"ddl: site '{site}' is not defined under sites"])
        names = [site] if site else list(t.sites)
        if site is None:
            unready = _unready(cl, table)
            if unready:
                return [_not_run(n, unready) for n in names]
        return [_at_safely(cl, n, table, statement, dry_run) for n in names]
    finally:
        if own:
            cl.close()


def _unready(cl: Cluster, table: str) -> dict[str, str]:
    """Before a change of every site: the sites that cannot take it now (site -> why): not reached,
    not readable with this login, reached only through an agent, or without multimaster's objects
    for `table`. ddl changes no site while one of them is unready: a column added at some sites
    and not at others is a change an operator has to finish by hand."""
    t = cl.topo
    out: dict[str, str] = {}
    for n in t.sites:
        try:
            s = cl.site(n)
            with s.read() as conn:
                s.require_installed(conn, t)
                s.info(conn, table, t)
        except Exception as e:  # noqa: BLE001 - each site's reason is reported, none is changed
            out[n] = first_line(e)
    return out


def _not_run(n: str, unready: dict[str, str]) -> "DdlReport":
    """The report of site `n` when ddl changed no site because of `unready`."""
    if n in unready:
        return DdlReport(n, "failed", message=f"{unready[n]} (no site was changed)")
    others = ", ".join(f"'{u}'" for u in unready)
    return DdlReport(
        n,
        "not run",
        message=f"not run: {others} cannot take it now; no site was changed. Run it again once every site "
        "answers, or site by site with --site (each site's capture follows its own schema; docs/schema-changes.md)",
    )


def _at_safely(cl: Cluster, n: str, table: str, statement: str, dry_run: bool) -> "DdlReport":
    """`_at`, a failure of any step reported as the site's (the other sites are still tried): a site
    that stops answering half-way through is named, never the end of the run."""
    try:
        return _at(cl, n, table, statement, dry_run)
    except Exception as e:  # noqa: BLE001 - reported per site; the next site is tried
        if n in cl.sites:  # (not there when opening the site was what failed)
            cl.sites[n].forget(table)
        return DdlReport(n, "failed", message=first_line(e))


class _DryRun(Exception):
    """Rolls a dry run's transaction back."""


def _at(cl: Cluster, n: str, table: str, statement: str, dry_run: bool) -> DdlReport:
    t = cl.topo
    s = cl.site(n)
    d = s.dialect
    rep = DdlReport(n, "applied")
    # the site follows any change made by hand before
    follow_site(cl, n, [table])
    if dry_run and not d.caps.transactional_ddl:
        with s.read() as conn:
            s.require_installed(conn, t)
            cur = store.schemas.current(conn, d, table)
        rep.status, rep.version = "would apply", cur[0] if cur else None
        rep.message = f"{d.title} commits DDL at once: not run (a dry run runs it and rolls back only where DDL is transactional)"
        return rep
    if not d.caps.transactional_ddl:
        return _at_committing(cl, n, table, statement)
    others = schemas_elsewhere(cl, n)(table)  # read before the site's write transaction
    try:
        _transactionally(s, t, n, table, statement, others, rep, dry_run)
    except _DryRun:
        s.forget(table)
        rep.status = "would apply"
        return rep
    except SchemaError as e:
        s.forget(table)
        rep.status, rep.message = "refused", "; ".join(e.problems)
        return rep
    except Exception as e:  # noqa: BLE001 - reported per site; the next site is tried
        s.forget(table)
        rep.status, rep.message = "failed", first_line(e)
        return rep
    rep.ran = True
    try:
        with s.write() as conn:  # what waited for a column the site has now
            info = s.info(conn, table, t)
            peers = store.watermarks.added(conn, d, t.peers_of(n))
            rep.released = len(evolve.release(conn, s, info, peers, lambda i: relay_origins(t, n, i)).applied)
    except Exception as e:  # noqa: BLE001 - the change is made; what waits for it is the next refresh's
        rep.message = f"the changes waiting for its columns were not applied yet: {first_line(e)} (the next refresh applies them)"
    return rep


#: how long `ddl` keeps trying a DDL statement that waits for a table's metadata lock, where each
#: try waits at most Dialect.short_ddl_waits (MariaDB: 1 s) or the table's lock at most
#: APPLY_LOCK_TIMEOUT (PostgreSQL: 500 ms, Dialect.lock_for_install)
DDL_TRIES = 60


def _transactionally(
    s: Site, t: Topology, n: str, table: str, statement: str, others: Any, rep: DdlReport, dry_run: bool
) -> None:
    """`ddl` at a site whose DDL is transactional (PostgreSQL, SQLite): the statement and the
    capture's follow in one write transaction, run again after a backoff while a lock wait or a
    deadlock is what fails it (_again). Before (session 37), the first lock timeout behind an
    application's transaction on the table failed the site for good, and the cluster was left
    with the column at some sites only."""
    d = s.dialect

    def attempt() -> None:
        with s.write() as conn:
            s.require_installed(conn, t)
            info = s.info(conn, table, t)
            # as a follow takes them (engine/evolve.py _follow_table): the table's reconcilers
            # first, then its writers; dropping the triggers first deadlocked with a refresher
            d.lock_for_apply(conn, info)
            d.lock_for_install(conn, [table])
            d.drop_capture(conn, info)  # made again below, in this transaction
            conn.exec_driver_sql(statement)
            ev = evolve.evolve_table(conn, s, t, table, t.peers_of(n), others, capture_dropped=True)
            rep.version = ev.version
            if ev.change is not None:
                rep.added, rep.dropped, rep.retyped = list(ev.change.added), list(ev.change.dropped), list(ev.change.retyped)
            if dry_run:
                raise _DryRun()

    _again(d, attempt, failed=lambda: s.forget(table))


def _again(d: Dialect, fn: Callable[[], Any], failed: Callable[[], None] | None = None) -> Any:
    """fn(), again after a backoff while a transient error of the site's database (a lock wait,
    a deadlock) fails it, at most DDL_TRIES times; `failed` runs after each failure."""
    delay = 0.02
    for attempt in range(DDL_TRIES):
        try:
            return fn()
        except DBAPIError as e:
            if failed is not None:
                failed()
            if attempt == DDL_TRIES - 1 or not d.is_retryable(e):
                raise
            delay = back_off(delay)
    raise AssertionError("unreachable")


def _briefly(conn: Connection, d: Dialect, fn: Callable[[], Any]) -> Any:
    """Run the DDL of `fn` waiting only briefly for the table's metadata lock, again (after a
    backoff) while that wait is what fails it (_again): a DDL statement waiting for the lock makes every
    application statement on the table queue behind it, and an application transaction that holds
    the lock while it waits for a row one of those queued holds is a cycle neither InnoDB nor the
    metadata locks see (applications waited out innodb_lock_wait_timeout, 50 s; session 30)."""

    def once() -> Any:
        with d.short_ddl_waits(conn):
            return fn()

    return _again(d, once)


def _at_committing(cl: Cluster, n: str, table: str, statement: str) -> DdlReport:
    """`ddl` at a site whose DDL commits at once (MariaDB). Holding the table's follow lock (no other
    process follows it meanwhile): the capture triggers stop naming the columns the statement
    drops (Dialect.capture_without: between the ALTER and the follow, a trigger naming one failed
    every application write of the table, "Unknown column 'c' in 'NEW'"), then the statement;
    each waiting for the table's metadata lock only briefly (_briefly). Then the site's capture
    follows, as a refresher's follow does (engine/evolve.py follow: its own locks, retried), which a
    refresher running meanwhile may have done already."""
    t = cl.topo
    s = cl.site(n)
    d = s.dialect
    rep = DdlReport(n, "applied")
    try:
        with s.write() as conn:
            s.require_installed(conn, t)
            info = s.info(conn, table, t)
            gone = dropped_columns(statement, list(info.column_names))
            d.lock_follow(conn, table)
            try:
                if gone:
                    _briefly(conn, d, lambda: d.capture_without(conn, info, gone))
                try:
                    _briefly(conn, d, lambda: conn.exec_driver_sql(statement))
                except Exception:
                    if gone:  # the statement did not run: the capture as it was
                        _briefly(conn, d, lambda: d.install_capture(conn, info))
                    raise
            finally:
                d.unlock_follow(conn, table)
    except Exception as e:  # noqa: BLE001 - reported per site; the next site is tried
        s.forget(table)
        rep.status, rep.message = "failed", first_line(e)
        return rep
    s.forget(table)
    rep.ran = True
    before = list(info.column_names)
    try:
        evs = [ev for ev in follow_site(cl, n, [table]) if ev.table == table]
    except Exception as e:  # noqa: BLE001 - the statement ran; the next refresh's follow tries again
        rep.status = "failed"
        rep.message = f"{first_line(e)} ({d.title} commits DDL at once: the statement has run; the next refresh makes the capture follow it)"
        return rep
    if any(ev.problems for ev in evs):
        rep.status = "refused"
        rep.message = "; ".join(p for ev in evs for p in ev.problems)
        rep.message += f" ({d.title} commits DDL at once: the statement has run; capture stays in the previous schema)"
        return rep
    with s.read() as conn:
        cur = store.schemas.current(conn, d, table)
        after = list(s.info(conn, table, t).column_names)
    rep.version = cur[0] if cur else None
    rep.added = [c for c in after if c not in before]
    rep.dropped = [c for c in before if c not in after]
    for ev in evs:
        if ev.change is not None:
            rep.retyped = list(ev.change.retyped)
        rep.released += ev.released
    return rep
