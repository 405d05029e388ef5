"""Uninstall: every object multimaster created at a site, or one table's (`multimaster uninstall`),
and the tables installed at a site that are no longer under `tables:` (status, init)."""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.engine import uniques
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.remote import AgentSite
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly, ConfigError, SchemaError

__all__ = ["drop_table", "uninstall", "uninstall_table", "untracked", "untracked_message"]


def uninstall(topo: Topology | Cluster, site: str | None = None) -> dict[str, list[str]]:
    """Remove every object multimaster created; user tables and rows stay as they are."""
    cl, own = as_cluster(topo)
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


def untracked(installed: Iterable[str], topo: Topology) -> list[str]:
    """The tables of `installed` (a site's) that are not under the topology's tables: any more."""
    return sorted(set(installed) - set(topo.tables))


def untracked_message(table: str, site: str) -> str:
    """What `init` and `status` say of a table installed at `site` but no longer under tables:."""
    return (
        f"table '{table}' is installed at {site} but not under tables: its changes are still captured and nothing pulls them; "
        f"run 'multimaster uninstall -t FILE --table {table}'"
    )


def uninstall_table(topo: Topology | Cluster, table: str, site: str | None = None) -> dict[str, dict[str, Any]]:
    """Stop replicating `table`: drop its replication objects and bookkeeping rows at every site
    (or `site`), online (docs/schema-changes.md "Stop replicating a table"). The table must no
    longer be under tables: (else ConfigError: a refresher or init would install it again). Its
    rows stay; changes of it not yet applied elsewhere are dropped with its change logs and
    snapshots; every other table keeps replicating, its writers never wait for this.

    One transaction per site (PostgreSQL and SQLite: all or nothing; MariaDB commits each DROP:
    capture triggers go first, the bookkeeping rows and the table's registration last, so a run
    stopped half-way still shows the table as installed, and a re-run finishes it). Refused
    (SchemaError), before anything is dropped, while a replicated table's capture reads its
    identities (a foreign key to it, renumbered). Returns per site {"objects": ["kind name", ...],
    "rows": {bookkeeping table: rows deleted}}; both empty where nothing of it was left."""
    cl, own = as_cluster(topo)
    t = cl.topo
    try:
        problems = []
        if table in t.tables:
            problems.append(
                f"--table: table '{table}' is still under tables: remove it from the topology file first (else the next "
                "refresh or init installs it again), then run 'multimaster uninstall --table' again"
            )
        if site is not None and site not in t.sites:
            problems.append(f"--site: site '{site}' is not defined under sites")
        if problems:
            raise ConfigError(problems)
        sites = {}
        for n in [site] if site else list(t.sites):
            s = cl.site(n)
            if isinstance(s, AgentSite):
                raise AgentOnly(n, s.display_url, "uninstall --table (it drops objects at the site)")
            s.engine  # noqa: B018 - connect now: an unreachable site fails before anything is dropped
            sites[n] = s
        _check_unreferenced(t, sites, table)
        out: dict[str, dict[str, Any]] = {}
        for n, s in sites.items():
            with s.write() as conn:
                out[n] = drop_table(conn, s, table, sorted(set(t.sites) - {n}))
            s.forget(table)
        return out
    finally:
        if own:
            cl.close()


def drop_table(conn: Connection, s: Site, table: str, peers: Iterable[str]) -> dict[str, Any]:
    """In the caller's transaction: `table`'s replication objects and bookkeeping rows at `s`
    (those of each of `peers`, and of every peer a watermark names); its rows stay. Returns
    {"objects": ["kind name", ...], "rows": {bookkeeping table: rows deleted}}."""
    every = sorted(set(peers) | (store.watermarks.peers_of(conn, s.dialect, table) - {s.name}))
    objects = s.dialect.uninstall_table(conn, table, every)
    objects += uniques.uninstall(conn, s.dialect, table)
    rows = s.dialect.forget_table(conn, table)
    rows.update(store.forget_table(conn, s.dialect, table))  # its registration last
    return {"objects": objects, "rows": rows}


def _check_unreferenced(t: Topology, sites: dict[str, Site], table: str) -> None:
    """Refuse to drop `table`'s objects at a site where it is renumbered and a table still
    replicated references it: that table's capture looks up `table`'s identities in its shadow
    (docs/foreign-keys.md), and its writes would fail without it."""
    problems = []
    for n, s in sites.items():
        with s.read() as conn:
            if table not in s.installed_tables(conn):
                continue
            reg = store.tables.registration(conn, s.dialect, table)
            if not reg or not int(reg[1]):  # (key_col, renumber, ...): natural keys are not looked up
                continue
            for other in t.tables:
                for fk in s.dialect.foreign_keys(conn, other):
                    if fk.get("referred_table") == table:
                        problems.append(
                            f"site '{n}': replicated table '{other}' references '{table}' (column "
                            f"'{(fk.get('constrained_columns') or ['?'])[0]}'): its capture reads the identities of "
                            f"'{table}', whose keys differ per site. Drop the foreign key, or stop replicating '{other}' too"
                        )
    if problems:
        raise SchemaError(problems)
