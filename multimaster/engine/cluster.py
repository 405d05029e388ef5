"""A cluster: the open sites of a topology, reused across calls (engines are pooled)."""

from __future__ import annotations

from typing import Any, Callable

from multimaster.config.topology import Topology
from multimaster.engine.site import Site, open_sites
from multimaster.errors import ConfigError

__all__ = ["Cluster", "as_cluster", "Progress"]

Progress = Callable[[str], None]


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


def as_cluster(topo_or_cluster: Topology | Cluster) -> tuple[Cluster, bool]:
    """The cluster itself, or a new one on a topology; the flag says whether the caller owns it
    (and closes it)."""
    if isinstance(topo_or_cluster, Cluster):
        return topo_or_cluster, False
    return Cluster(topo_or_cluster), True


# ---------------------------------------------------------------------------------------------
# init / uninstall
