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

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.engine import evolve
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.refresh import follow_site, relay_origins, schemas_elsewhere
from multimaster.errors import ConfigError, SchemaError

__all__ = ["DdlReport", "ddl", "table_of"]

_ALTER = re.compile(r"^\s*ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?([`\"]?)([A-Za-z_][A-Za-z0-9_$]*)\1", re.IGNORECASE)


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
    status: str  #: applied, refused, failed, would apply
    version: int | None = None
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    retyped: list[str] = field(default_factory=list)
    released: int = 0
    message: str | None = None


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
        out = []
        for n in [site] if site else list(t.sites):
            out.append(_at(cl, n, table, statement, dry_run))
        return out
    finally:
        if own:
            cl.close()


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
    others = schemas_elsewhere(cl, n)(table)  # read before the site's write transaction
    try:
        with s.write() as conn:
            s.require_installed(conn, t)
            info = s.info(conn, table, t)
            if d.caps.transactional_ddl:
                d.drop_capture(conn, info)  # made again below, in this transaction
            conn.exec_driver_sql(statement)
            try:
                ev = evolve.evolve_table(conn, s, t, table, t.peers_of(n), others, capture_dropped=d.caps.transactional_ddl)
            except SchemaError:
                if not d.caps.transactional_ddl:
                    s.forget(table)
                    d.install_capture(conn, s.info(conn, table, t))  # the previous version's capture
                raise
            rep.version = ev.version
            if ev.change is not None:
                rep.added, rep.dropped, rep.retyped = list(ev.change.added), list(ev.change.dropped), list(ev.change.retyped)
            if dry_run:
                raise _DryRun()
    except _DryRun:
        s.forget(table)
        rep.status = "would apply"
        return rep
    except SchemaError as e:
        s.forget(table)
        rep.status, rep.message = "refused", "; ".join(e.problems)
        if not d.caps.transactional_ddl:
            rep.message += f" ({d.title} commits DDL at once: the statement has run; capture stays in the previous schema)"
        return rep
    except Exception as e:  # noqa: BLE001 - reported per site; the next site is tried
        s.forget(table)
        rep.status, rep.message = (
            "failed",
            str(getattr(e, "orig", e)).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
        )
        return rep
    with s.write() as conn:  # what waited for a column the site has now
        info = s.info(conn, table, t)
        rep.released = len(evolve.release(conn, s, info, t.peers_of(n), lambda i: relay_origins(t, n, i)).applied)
    return rep
