"""A cluster: the open sites of a topology, reused across calls (engines are pooled)."""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Iterable, Sequence, TypeVar

from sqlalchemy.exc import DBAPIError

from multimaster.config.topology import Topology
from multimaster.core.progress import Progress
from multimaster.engine.remote import AgentSite
from multimaster.engine.site import Site
from multimaster.errors import AgentError, ConfigError, SiteUnreachable, first_line

__all__ = ["Cluster", "as_cluster", "each", "open_site", "Progress", "read_each"]

T = TypeVar("T")
A = TypeVar("A")


class Cluster:
    """Open sites of a topology, reused across calls (engines are pooled)."""

    def __init__(self, topo: Topology, names_: list[str] | None = None, *, create: bool = False):
        self.topo = topo
        self.sites: dict[str, Site] = {n: open_site(topo, n, create=create) for n in names_ or list(topo.sites)}
        self._opening = threading.Lock()  # site(): threads (status, the daemon) open a site once

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for s in self.sites.values():
            s.dispose()

    def narrowed(self, tables: Iterable[str]) -> "Cluster":
        """A view of this cluster whose topology replicates only `tables` (in the file's order),
        sharing its open sites: a refresh of a link that leaves out a table one of its sites no
        longer (or not yet) replicates (engine/refresh.py refresh_link)."""
        keep = set(tables)
        view = Cluster.__new__(Cluster)
        view.topo = replace(self.topo, tables={tb: c for tb, c in self.topo.tables.items() if tb in keep})
        view.sites = self.sites
        view._opening = self._opening
        return view

    def site(self, name: str) -> Site:
        if name not in self.sites:
            if name not in self.topo.sites:
                raise ConfigError([f"site '{name}' is not defined under sites"])
            with self._opening:
                if name not in self.sites:
                    self.sites[name] = open_site(self.topo, name)
        return self.sites[name]


def open_site(topo: Topology, name: str, *, create: bool = False) -> Site:
    """Site `name` of `topo` as this host reaches it: its database, or its agent (an http(s) url,
    docs/agent.md)."""
    cfg = topo.sites[name]
    if cfg.agent:
        return AgentSite(name, cfg)
    return Site(name, cfg.url, create=create, timeouts=topo.timeouts(name))


def as_cluster(topo_or_cluster: Topology | Cluster) -> tuple[Cluster, bool]:
    """The cluster itself, or a new one on a topology; the flag says whether the caller owns it
    (and closes it)."""
    if isinstance(topo_or_cluster, Cluster):
        return topo_or_cluster, False
    return Cluster(topo_or_cluster), True


# ---------------------------------------------------------------------------------------------
# init / uninstall


#: at most this many sites or links read at once (status)
PARALLEL = 16


def each(fn: Callable[[A], T], items: Sequence[A]) -> list[T]:
    """`fn(item)` for every item, at once in threads (each waits on its own site's round trips),
    the results in the items' order; an exception of one is raised once all are done."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(len(items), PARALLEL)) as ex:
        # each in a copy of the caller's context: a scope it opened (dialects/base.py catalog_once) goes on there
        futures = [ex.submit(contextvars.copy_context().run, fn, i) for i in items]
        return [f.result() for f in futures]


def read_each(
    cl: Cluster,
    names: Iterable[str],
    read: Callable[[Site | AgentSite], list[T]],
    unreachable: dict[str, str] | None = None,
) -> list[T]:
    """`read(site)` for each site of `names`, the sites at once (:func:`each`), the results joined in
    the order of `names`. A site that cannot be reached (its database down, or its agent not
    answering) raises (the first in that order); with `unreachable` (a dict) it goes there instead
    (site -> why, in that order) and the other sites are read: a listing (`errors`, `conflicts`)
    shows what it can while a site is down, which is when an operator reads it. `read` runs in
    threads: what it does must not depend on another site's read (a page's window at each site is
    computed from counts read first: ops/errors.py errors_page)."""
    names = list(names)

    def one(n: str) -> tuple[list[T], str | None, BaseException | None]:
        try:
            return read(cl.site(n)), None, None
        except (SiteUnreachable, AgentError) as e:
            return [], str(e), e
        except DBAPIError as e:  # reached, not readable (a login that may only pull): named, the others read
            return [], f"site '{n}' cannot be read with this login: {first_line(e)}", e

    out: list[T] = []
    for n, (rows, why, e) in zip(names, each(one, names)):
        if e is not None:
            if unreachable is None:
                raise e
            unreachable[n] = str(why)
        out += rows
    return out
