"""Least privileges for pulling: what the refresher of each peer needs at a site.

A peer's refresher only reads this site's change logs (``_mm_log_<t>``, ``_mm_log2_<t>``), the
purge horizon (``_mm_purges``) and the schema versions (``_mm_schemas``); it writes nothing here. :func:`grant_statements` lists, per peer
that pulls from `site`, the statements creating a login (``mm_pull_<peer>``, no password: set it
yourself, it is never printed) with exactly that read access. Give the peer's machine a topology
whose URL for this site uses that login, e.g. ``postgresql+psycopg://mm_pull_eu2:${MM_PULL_PW}@.../db``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from multimaster.config.topology import Topology
from multimaster.dialects.schema import names
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly, ConfigError, MultimasterError, first_line

__all__ = ["PeerGrants", "grant_statements", "apply_grants"]


@dataclass
class PeerGrants:
    peer: str
    login: str
    statements: list[str] = field(default_factory=list)


def _login(peer: str) -> str:
    return "mm_pull_" + "".join(ch if ch.isalnum() else "_" for ch in peer.lower())


def grant_statements(topo: Topology, site: str) -> list[PeerGrants]:
    """The statements to run at `site` (as its owner) for every peer that pulls from it."""
    if site not in topo.sites:
        raise ConfigError([f"site '{site}' is not defined under sites"])
    if topo.sites[site].agent:
        raise AgentOnly(site, topo.sites[site].url, "grants (statements run as the site's database owner)")
    s = Site(site, topo.sites[site].url, timeouts=topo.timeouts(site))
    d = s.dialect
    pullers = sorted({ln.target for ln in topo.links if ln.source == site})
    out = []
    db = make_url(s.url).database or ""
    # what a refresher reads: the change logs, the second-order logs, the purge horizon
    objects = [n for t in topo.tables for n in (names(t).log, names(t).log2)] + ["_mm_purges", "_mm_schemas"]
    for peer in pullers:
        login = _login(peer)
        out.append(PeerGrants(peer, login, d.pull_grants(site, peer, login, db, objects)))
    s.dispose()
    return out


def apply_grants(topo: Topology, site: str) -> list[PeerGrants]:
    """Run :func:`grant_statements` at `site` (after `init`: the logs must exist)."""
    plan = grant_statements(topo, site)
    s = Site(site, topo.sites[site].url, timeouts=topo.timeouts(site))
    try:
        if not s.dialect.has_logins:  # nothing to run: the statements are comments
            return plan
        with s.engine.connect() as conn:
            with conn.begin():
                if not s.installed_tables(conn):
                    raise MultimasterError(f"site '{site}' has no multimaster objects yet; run 'multimaster init' first")
            for g in plan:
                try:
                    with conn.begin():
                        for sql in g.statements:
                            conn.exec_driver_sql(sql.replace("%", "%%"))
                except DBAPIError as e:  # (each peer's login in one transaction: none half made)
                    raise MultimasterError(
                        f"site '{site}': the statements for {g.login} were refused ({first_line(e)}): the login in the "
                        "site's URL may create logins and grant only with CREATEROLE (PostgreSQL) or CREATE USER and "
                        "GRANT OPTION (MariaDB). Run 'multimaster grants' without --apply and have an administrator "
                        "run the statements it prints"
                    ) from None
        return plan
    finally:
        s.dispose()
