"""Where to read the rows that changes still on their way touch (docs/verify.md "Waiting changes"):
verify explains a difference between sites by them, and recapture leaves their rows alone
(engine/recapture.py).

For a link source -> target and a table, a change is on its way while it is
- at the source, in the change log past the target's watermark (pulled since or not; captured
  since included), unless it originated at the target (the refresher skips those);
- at the target, in the snapshot and not applied: every snapshot row from the oldest one not
  applied (applied since or not), and every row held for a column the target lacks.

The bounds (the watermark, the oldest row not applied) are read now; the rows later, by whoever
runs the queries: they then name every change in flight at any moment in between.
"""

from __future__ import annotations

from typing import Mapping

import sqlalchemy as sa

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.dialects.base import Dialect

__all__ = ["reads"]


def reads(
    topo: Topology,
    table: str,
    dialects: Mapping[str, Dialect],
    engines: Mapping[str, sa.Engine],
    held: bool = True,
) -> list[tuple[str, str]]:
    """(site, query selecting ``mm_rid`` and ``mm_key``) pairs, per link of `topo` between the sites
    of `engines`: the identities and keys that changes on their way touch. `held`: with the changes
    held for a column the target lacks (verify counts those as differences)."""
    out: list[tuple[str, str]] = []
    for ln in topo.links:
        if ln.source not in engines or ln.target not in engines:
            continue
        sd, td = dialects[ln.source], dialects[ln.target]
        snap = td.mm_name(f"_mm_snap_{table}__{ln.source}")
        with engines[ln.target].connect() as tc:
            wm = int(store.watermarks.find(tc, td, ln.source, table) or 0)
            try:
                oldest = tc.execute(sa.text(f"SELECT min(pseq) FROM {snap} WHERE applied NOT IN (1, 3)")).scalar()
                there = True
            except sa.exc.DBAPIError:  # no snapshot yet: nothing pulled, nothing waiting there
                tc.rollback()
                oldest, there = None, False
        where = [f"pseq >= {int(oldest)}"] if oldest is not None else []
        where += ["applied = 3"] if held and there else []
        if where:
            cond = " OR ".join(where)
            out.append((ln.target, f"SELECT DISTINCT rid AS mm_rid, {td.quote('key')} AS mm_key FROM {snap} WHERE {cond}"))
        log2, log = sd.mm_name(f"_mm_log2_{table}"), sd.mm_name(f"_mm_log_{table}")
        out.append(
            (
                ln.source,
                f"SELECT DISTINCT l.rid AS mm_rid, l.{sd.quote('key')} AS mm_key FROM {log2} l2 JOIN {log} l ON l.seq = l2.seq "
                f"WHERE l2.seq2 > {wm} AND l2.op = 'A' AND l.origin <> '{ln.target}'",
            )
        )
    return out
