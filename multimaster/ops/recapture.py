"""`multimaster recapture`: send the writes a site made while its capture of a table was missing
(docs/schema-changes.md "A table made again"; engine/recapture.py does the work per table)."""

from __future__ import annotations

from typing import Sequence

from multimaster.config.topology import Topology
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.recapture import Recaptured, gap_tables
from multimaster.engine.recapture import recapture as recapture_table

__all__ = ["Recaptured", "recapture"]


def recapture(
    topo: Topology | Cluster,
    site: str,
    tables: Sequence[str] | None = None,
    peer: str | None = None,
    dry_run: bool = False,
) -> list[Recaptured]:
    """At `site`, for each table of `tables` (default: those with an open capture gap there),
    capture the rows it holds differently from `peer` (default: the first other site), leaving
    those a change on its way touches. One report per table."""
    cl, own = as_cluster(topo)
    try:
        names = list(tables) if tables else gap_tables(cl, site)
        return [recapture_table(cl, site, tb, peer, dry_run) for tb in names]
    finally:
        if own:
            cl.close()
