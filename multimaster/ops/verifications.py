"""Recorded verify runs: the table `_mm_verifications` at the topology's verify site.

Scheduled checks (the topology's `verify:` section, run by `multimaster run`) and
`multimaster verify --record` store one row per run here; `multimaster status` shows the last one.
A row keeps when the run started, how long it took, whether the cluster converged, the status per
table, the result's counts (``VerifyResult.to_dict()`` without its samples) as JSON, and the error
of a run that could not complete (Java missing, a site down ...).

This module never imports PySpark: it stores and reads plain data.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from multimaster.config.secrets import redact
from multimaster.config.topology import Topology
from multimaster.core.versions import started_at_now
from multimaster.engine.cluster import Cluster
from multimaster.errors import MultimasterError
from multimaster.store import verifications as records

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from multimaster.spark.result import VerifyResult

__all__ = ["KEEP", "ERROR", "started_at_now", "summarize", "store", "last", "rich_table"]

#: rows kept per site: older runs are deleted when a new one is stored
KEEP = 1000
#: the status of a run that could not complete
ERROR = "error"
_TABLE_KEYS = (
    "status",
    "rows",
    "identities",
    "differing",
    "unexplained",
    "counts",
    "columns",
    "waiting_total",
    "mode",
    "buckets",
    "buckets_differing",
    "seconds",
)


def summarize(result: "VerifyResult | dict[str, Any]") -> dict[str, Any]:
    """``VerifyResult.to_dict()`` trimmed to statuses and counts (no samples, fingerprints or
    per-link waiting detail: those are for the report, not for a log kept for months)."""
    d = result if isinstance(result, dict) else result.to_dict()
    out = {k: d.get(k) for k in ("status", "converged", "sites", "master", "mode", "started_at", "seconds")}
    out["tables"] = {name: {k: t.get(k) for k in _TABLE_KEYS if k in t} for name, t in d.get("tables", {}).items()}
    return out


def _cluster(topo: "Topology | Cluster") -> tuple["Cluster", bool]:
    if isinstance(topo, Cluster):
        return topo, False
    return Cluster(topo, []), True


def store(
    topo: "Topology | Cluster",
    result: "VerifyResult | dict[str, Any] | None" = None,
    *,
    error: str | None = None,
    started_at: str | None = None,
    seconds: float | None = None,
    source: str = "manual",
) -> int:
    """Record one verify run at the topology's verify site; returns its id.

    Either `result` (a VerifyResult or its to_dict()) or `error` (the run failed). Creates the
    table when missing (a site initialised before this existed, or never initialised)."""
    if result is None and error is None:
        raise ValueError("store() needs a result or an error")
    error = None if error is None else redact(error)
    cl, own = _cluster(topo)
    try:
        site = cl.site(cl.topo.verify_site)
        row: tuple[Any, ...]
        if result is not None:
            s = summarize(result)
            row = (
                s["started_at"] or started_at or started_at_now(),
                float(s["seconds"] if seconds is None else seconds),
                1 if s["converged"] else 0,
                s["status"],
                json.dumps({t: v["status"] for t, v in s["tables"].items()}),
                json.dumps(s, default=str),
                error,
                source,
            )
        else:
            row = (started_at or started_at_now(), seconds, None, ERROR, None, None, (error or "")[:4000], source)
        with site.write() as conn:
            if not records.exists(conn, site.dialect):
                records.install(conn, site.dialect)
            return records.insert(conn, site.dialect, row, KEEP)
    finally:
        if own:
            cl.close()


def last(topo: "Topology | Cluster") -> dict[str, Any] | None:
    """The last recorded run at the topology's verify site, or None (none recorded, no table yet,
    or the site cannot be read — `status` reports an unreachable site on its own)."""
    cl, own = _cluster(topo)
    try:
        site = cl.site(cl.topo.verify_site)
        with site.read() as conn:
            if not records.exists(conn, site.dialect):
                return None
            r = records.last(conn, site.dialect)
        if r is None:
            return None
        return {
            "site": site.name,
            "id": int(r[0]),
            "started_at": r[1],
            "seconds": None if r[2] is None else float(r[2]),
            "converged": None if r[3] is None else bool(r[3]),
            "status": r[4],
            "tables": json.loads(r[5]) if r[5] else {},
            "summary": json.loads(r[6]) if r[6] else None,
            "error": None if r[7] is None else redact(str(r[7])),
            "source": r[8],
        }
    except MultimasterError:
        return None
    finally:
        if own:
            cl.close()


def rich_table(v: dict[str, Any]) -> "Table":
    """The last verification (`last()`'s dict) as a Rich table, for `multimaster status`."""
    from rich.table import Table

    colour = {"converged": "green", "converging": "yellow", "diverged": "red", ERROR: "red"}.get(v["status"], "white")
    t = Table(title=f"last verification (kept at {v['site']}, {v.get('source') or '-'} run)")
    for c in ("started", "seconds", "result", "tables", "error"):
        t.add_column(c)
    secs = "-" if v.get("seconds") is None else f"{v['seconds']:.1f}"
    tables = ", ".join(f"{tb}: {st}" for tb, st in (v.get("tables") or {}).items()) or "-"
    t.add_row(str(v["started_at"]), secs, f"[{colour}]{v['status']}[/]", tables, str(v.get("error") or "-"))
    return t
