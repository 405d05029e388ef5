"""Status and the conflict log, read from every site (`multimaster status`, `multimaster conflicts`)."""

from __future__ import annotations

import json
import time
from typing import Any

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import Topology
from multimaster.core.versions import ver_ms
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.errors import MultimasterError
from multimaster.ops.verifications import last

__all__ = ["status", "conflicts"]

# status / conflicts


def status(topo: Topology | Cluster, since: str | None = None) -> dict[str, Any]:
    """Per link: changes waiting at the peer, watermark, last success/error, the age of the oldest
    change not yet applied. Per site: conflicts (and `conflicts_since` the UTC time `since`,
    'YYYY-MM-DDTHH:MM:SS'), log sizes, clock. Unreachable sites are reported, not raised."""
    cl, own = as_cluster(topo)
    t = cl.topo
    out: dict[str, Any] = {"sites": {}, "links": []}
    try:
        site_data: dict[str, dict[str, Any]] = {}
        for n in t.sites:
            s = cl.site(n)
            d: dict[str, Any] = {"url": s.display_url, "reachable": True}
            try:
                with s.read() as conn:
                    tables = s.installed_tables(conn)
                    d["installed"] = sorted(tables) == sorted(t.tables)
                    if tables:
                        d.update(store.tables.site_status(conn, s.dialect, list(t.tables)))
                        if since is not None:
                            d["conflicts_since"] = store.conflicts.count_since(conn, s.dialect, since)
            except MultimasterError as e:
                d["reachable"] = False
                d["error"] = redact(str(e))
            site_data[n] = d
        out["sites"] = site_data
        now_ms = int(time.time() * 1000)
        for ln in t.links:
            entry: dict[str, Any] = {"from": ln.source, "to": ln.target, "tables": {}}
            src, tgt = cl.site(ln.source), cl.site(ln.target)
            if not (site_data[ln.source].get("installed") and site_data[ln.target].get("installed")):
                entry["error"] = "not installed or unreachable"
                out["links"].append(entry)
                continue
            with tgt.read() as tconn:
                entry.update(store.links.row(tconn, tgt.dialect, ln.source))
                if entry.get("last_error"):  # stored by a refresher, maybe before its password was masked
                    entry["last_error"] = redact(str(entry["last_error"]))
                wms = {tb: store.watermarks.read(tconn, tgt.dialect, ln.source, tb) for tb in t.tables}
                pending_local = {tb: store.links.unapplied(tconn, tgt.dialect, tb, ln.source) for tb in t.tables}
            waiting_total = 0
            oldest: str | None = None
            with src.read() as sconn:
                for tb in t.tables:
                    w, o = store.links.waiting(sconn, src.dialect, tb, wms[tb], ln.target)
                    entry["tables"][tb] = {"watermark": wms[tb], "waiting": w, "unapplied": pending_local[tb][0]}
                    waiting_total += w + pending_local[tb][0]
                    for cand in (o, pending_local[tb][1]):
                        if cand is not None and (oldest is None or cand < oldest):
                            oldest = cand
            entry["waiting"] = waiting_total
            entry["oldest_waiting_age_s"] = None if oldest is None else max(0.0, (now_ms - ver_ms(oldest)) / 1000)
            out["links"].append(entry)
        out["converging"] = all(ln.get("waiting", 1) == 0 for ln in out["links"])
        out["verification"] = last(cl) if site_data[t.verify_site].get("reachable") else None  # last recorded verify run
        return out
    finally:
        if own:
            cl.close()


def conflicts(
    topo: Topology | Cluster, site: str | None = None, table: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    cl, own = as_cluster(topo)
    try:
        rows: list[dict[str, Any]] = []
        for n in [site] if site else list(cl.topo.sites):
            s = cl.site(n)
            with s.read() as conn:
                if not s.installed_tables(conn):
                    continue
                for r in store.conflicts.rows(conn, s.dialect, table, limit):
                    d = dict(r)
                    d["site"] = n
                    for k in ("columns", "local_values", "remote_values"):
                        if d.get(k):
                            d[k] = json.loads(d[k])
                    rows.append(d)
        rows.sort(key=lambda r: (r["detected_at"], r["site"], r["id"]))
        return rows[-limit:] if limit else rows
    finally:
        if own:
            cl.close()
