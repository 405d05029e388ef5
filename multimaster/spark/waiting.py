"""Changes still on their way, per link and table (plain SQLAlchemy: these sets are small).

For a link source -> target and table t:
- unpulled: entries of source's `_mm_log2_<t>` past target's watermark (`_mm_watermarks.seq2` for
  peer = source, tbl = t) that append a change not originating at target (the refresher skips those);
- unapplied: rows of target's `_mm_snap_<t>__<source>` with applied 0 (new) or 2 (waiting for its row).

`waiting_reads` names the identities those changes touch, for verify's per-row decision.
"""

from __future__ import annotations

import sqlalchemy as sa

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import Topology
from multimaster.engine import inflight
from multimaster.spark.jdbc import dialect_of
from multimaster.spark.result import Waiting

__all__ = ["waiting_changes", "waiting_reads", "mm_name"]


def mm_name(url: str, name: str) -> str:
    """The qualified, quoted name of multimaster object `name` at the site of `url`."""
    return dialect_of(url).mm_name(name)


def _watermark(conn: sa.Connection, url: str, source: str, table: str) -> int:
    """The position `source`'s change log of `table` is pulled up to at the site of `url`."""
    return store.watermarks.find(conn, dialect_of(url), source, table) or 0


def waiting_changes(topo: Topology, table: str, engines: dict[str, sa.Engine]) -> list[Waiting]:
    out: list[Waiting] = []
    for ln in topo.links:
        if ln.source not in engines or ln.target not in engines:
            continue
        s_url, t_url = topo.sites[ln.source].url, topo.sites[ln.target].url
        try:
            with engines[ln.target].connect() as tc:
                wm = _watermark(tc, t_url, ln.source, table)
                snap = mm_name(t_url, f"_mm_snap_{table}__{ln.source}")
                try:
                    unapplied = tc.execute(sa.text(f"SELECT count(*) FROM {snap} WHERE applied NOT IN (1, 3)")).scalar_one()
                except sa.exc.DBAPIError:
                    tc.rollback()
                    unapplied = 0  # no snapshot table yet: nothing pulled, nothing waiting there
            with engines[ln.source].connect() as sc:
                log2 = mm_name(s_url, f"_mm_log2_{table}")
                log = mm_name(s_url, f"_mm_log_{table}")
                try:
                    unpulled = sc.execute(
                        sa.text(
                            f"SELECT count(*) FROM {log2} l2 JOIN {log} l ON l.seq = l2.seq "
                            "WHERE l2.seq2 > :wm AND l2.op = 'A' AND l.origin <> :target"
                        ),
                        {"wm": wm, "target": ln.target},
                    ).scalar_one()
                except sa.exc.DBAPIError:
                    sc.rollback()
                    unpulled = sc.execute(sa.text(f"SELECT count(*) FROM {log2} WHERE seq2 > :wm"), {"wm": wm}).scalar_one()
            out.append(Waiting(ln.source, ln.target, int(unpulled), int(unapplied)))
        except sa.exc.DBAPIError as e:
            out.append(Waiting(ln.source, ln.target, 0, 0, error=redact(str(e.orig).splitlines()[0][:200])))
    return out


def waiting_reads(topo: Topology, table: str, engines: dict[str, sa.Engine]) -> list[tuple[str, str]]:
    """Where verify reads the identities (``mm_rid``) that changes on their way touch: (site,
    query) pairs, per link between `engines`' sites (engine/inflight.py; docs/verify.md, "Waiting
    changes"). A change held for a column its target lacks is not counted: verify reports it."""
    dialects = {n: dialect_of(topo.sites[n].url) for n in engines}
    return inflight.reads(topo, table, dialects, engines, held=False)
