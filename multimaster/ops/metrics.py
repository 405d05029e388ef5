"""Lag and health: the figures of `multimaster status`, extended for operations, and the same
figures in the Prometheus text format (``multimaster run --metrics-port N``).

:func:`health` = :func:`multimaster.api.status` plus, per site, the conflicts since a time, the
purge horizon and the pullers (their watermark, last refresh, whether they are expired).
:func:`render` turns it (and a daemon's in-memory counters) into ``/metrics`` text.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import Topology, parse_duration
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.errors import ConfigError, MultimasterError
from multimaster.ops.purge import PurgePolicy, pullers
from multimaster.ops.status import status

__all__ = ["health", "render", "parse_since", "MetricsServer"]


def parse_since(value: str | None, now: float | None = None) -> str | None:
    """'1h' (that long ago) or an ISO timestamp -> 'YYYY-MM-DDTHH:MM:SS' in UTC."""
    if value is None:
        return None
    now = time.time() if now is None else now
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - parse_duration(value)))
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError([f"--since '{value}': use a duration (30m, 1h, 2d) or an ISO time (2024-05-01T12:00:00Z)"]) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.strptime(str(iso)[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def health(
    topo: Topology | Cluster, sites: list[str] | None = None, *, since: str | None = None, policy: PurgePolicy | None = None
) -> dict[str, Any]:
    """`api.status` restricted to `sites` (links into them), plus per site: `conflicts_since`
    (when `since` is given, 'YYYY-MM-DDTHH:MM:SS' UTC), `snapshot_rows`, `purge` (horizon per
    table) and `pullers` (watermark, last refresh, expired)."""
    cl, own = as_cluster(topo)
    policy = policy or PurgePolicy()
    try:
        st = status(cl)
        keep = set(sites or cl.topo.sites)
        st["sites"] = {n: d for n, d in st["sites"].items() if n in keep}
        st["links"] = [ln for ln in st["links"] if ln["to"] in keep]
        st["since"] = since
        st["retention_s"] = policy.retention
        for n, d in st["sites"].items():
            if not d.get("reachable") or not d.get("installed"):
                continue
            s = cl.site(n)
            try:
                with s.read() as conn:
                    if since is not None:
                        d["conflicts_since"] = store.conflicts.count_since(conn, s.dialect, since)
                    d["purge"] = {tb: {"horizon": store.purges.horizon(conn, s.dialect, tb)} for tb in cl.topo.tables}
                    for tb in cl.topo.tables:
                        d["tables"][tb]["snapshot_rows"] = sum(
                            int(conn.exec_driver_sql(f"SELECT count(*) FROM {s.dialect.obj(tb, p).snap}").scalar() or 0)
                            for p in store.watermarks.added(conn, s.dialect, cl.topo.peers_of(n))
                        )
                ps = pullers(cl, n, policy, record=False)
                d["pullers"] = [
                    {
                        "peer": p.peer,
                        "table": p.table,
                        "watermark": p.watermark,
                        "last_success_at": p.last_success_at,
                        "reachable": p.reachable,
                        "away_s": p.away_s,
                        "expired": p.expired,
                    }
                    for p in ps
                ]
                d["expired_pullers"] = sorted({p.peer for p in ps if p.expired})
            except MultimasterError as e:
                d["health_error"] = redact(str(e))
        return st
    finally:
        if own:
            cl.close()


# ---------------------------------------------------------------------------------------------
# Prometheus text format


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.seen: set[str] = set()

    def add(self, name: str, kind: str, help_: str, value: float | int | None, **labels: Any) -> None:
        if value is None:
            return
        if name not in self.seen:
            self.seen.add(name)
            self.lines.append(f"# HELP {name} {help_}")
            self.lines.append(f"# TYPE {name} {kind}")
        lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{lab}}} {float(value):g}" if lab else f"{name} {float(value):g}")


def _waited_s(running: dict[str, Any] | None) -> float:
    """Seconds since a recorded lock wait of a link's refresh began (status's `running`; 0: none)."""
    since = _ts((running or {}).get("waiting_since"))
    return 0.0 if since is None else max(0.0, round(time.time() - since, 1))


def render(h: dict[str, Any], daemon: Any = None) -> str:
    """The figures of :func:`health` (and a daemon's counters) in the Prometheus text format."""
    o = _Out()
    for ln in h.get("links", []):
        lab = {"source": ln["from"], "target": ln["to"]}
        read = ln.get("waiting") is not None  # the link's state was read (else its `error` says why)
        o.add(
            "multimaster_link_waiting_changes",
            "gauge",
            "Changes at the peer (or in the snapshot) not yet applied here.",
            ln.get("waiting"),
            **lab,
        )
        o.add(
            "multimaster_link_visibility_delay_seconds",
            "gauge",
            "Age of the oldest change not yet applied (0 when none waits).",
            ln.get("oldest_waiting_age_s") or (0 if read else None),
            **lab,
        )
        o.add(
            "multimaster_link_parked_changes",
            "gauge",
            "Changes of the link that wait here for their row, a referenced row or an earlier change of their origin.",
            ln.get("parked"),
            **lab,
        )
        o.add(
            "multimaster_link_stalled",
            "gauge",
            "1 when the oldest waiting change is older than refresh.stall_after (status says what it waits for).",
            None if ln.get("parked") is None else 1 if ln.get("stalled") else 0,
            **lab,
        )
        o.add(
            "multimaster_link_behind_seconds",
            "gauge",
            "Seconds the link has made no progress while changes wait at its source (0 when it is not behind; status says why).",
            None if not read else ln.get("behind_s") or 0,
            **lab,
        )
        o.add(
            "multimaster_link_refresh_lock_wait_seconds",
            "gauge",
            "How long a refresh of the link has waited for a lock at the target, as its lock watch last recorded (0: none recorded).",
            None if not read else _waited_s(ln.get("running")),
            **lab,
        )
        o.add(
            "multimaster_link_held_at_source",
            "gauge",
            "1 when every change waiting at the source for this link waits for a transaction still open there (status names it).",
            None if not read else 1 if ln.get("held_at_source") else 0,
            **lab,
        )
        o.add(
            "multimaster_link_last_success_timestamp_seconds",
            "gauge",
            "Unix time of the last successful refresh.",
            _ts(ln.get("last_success_at")),
            **lab,
        )
        o.add(
            "multimaster_link_last_error_timestamp_seconds",
            "gauge",
            "Unix time of the last failed refresh.",
            _ts(ln.get("last_error_at")),
            **lab,
        )
        for k, help_ in (
            ("pulled", "Changes pulled over the link."),
            ("applied", "Changes applied from the link."),
            ("conflicts", "Conflicts resolved while applying the link's changes."),
        ):
            o.add(f"multimaster_link_{k}_total", "counter", help_, ln.get(k), **lab)
        for tb, t in (ln.get("tables") or {}).items():
            o.add(
                "multimaster_link_watermark",
                "gauge",
                "Last second-order sequence number pulled, per table.",
                t.get("watermark"),
                table=tb,
                **lab,
            )
    for n, d in h.get("sites", {}).items():
        o.add("multimaster_site_up", "gauge", "1 if the site's database answered.", 1 if d.get("reachable") else 0, site=n)
        o.add("multimaster_site_conflicts_total", "counter", "Conflicts recorded at the site.", d.get("conflicts"), site=n)
        o.add(
            "multimaster_site_conflicts_since",
            "gauge",
            "Conflicts recorded since the --since time.",
            d.get("conflicts_since"),
            site=n,
        )
        for w in d.get("clock_ahead") or []:
            o.add(
                "multimaster_clock_ahead_seconds",
                "gauge",
                "How far ahead of this site's clock an origin's versions came over a link, past refresh.clock_warn "
                "(applied; held past refresh.max_clock_offset).",
                w["ahead_s"],
                site=n,
                peer=w["peer"],
                origin=w["origin"],
            )
        for state, n_ in (d.get("errors") or {}).items():
            o.add("multimaster_error_queue_changes", "gauge", "Changes in the error queue, per state.", n_, site=n, state=state)
        gaps = {g["tbl"] for g in d.get("capture_gaps") or []}
        for tb, t in (d.get("tables") or {}).items():
            o.add(
                "multimaster_capture_gap",
                "gauge",
                "1 while the table's capture was found missing at the site (made again) and what the site wrote "
                "meanwhile is not recaptured (status names it; multimaster recapture).",
                1 if tb in gaps else 0,
                site=n,
                table=tb,
            )
            o.add("multimaster_change_log_entries", "gauge", "Entries in the change log.", t.get("log"), site=n, table=tb)
            o.add(
                "multimaster_second_order_log_entries",
                "gauge",
                "Entries in the second-order log.",
                t.get("log2"),
                site=n,
                table=tb,
            )
            o.add(
                "multimaster_snapshot_rows",
                "gauge",
                "Rows in the site's snapshots of its peers.",
                t.get("snapshot_rows"),
                site=n,
                table=tb,
            )
            o.add(
                "multimaster_tombstones",
                "gauge",
                "Identities deleted (kept for key ranks).",
                t.get("tombstones"),
                site=n,
                table=tb,
            )
            o.add("multimaster_rows", "gauge", "Rows in the replicated table.", t.get("rows"), site=n, table=tb)
            o.add(
                "multimaster_purge_horizon",
                "gauge",
                "Highest second-order sequence number purged.",
                (d.get("purge") or {}).get(tb, {}).get("horizon"),
                site=n,
                table=tb,
            )
        for p in d.get("pullers") or []:
            o.add(
                "multimaster_puller_expired",
                "gauge",
                "1 if the puller stayed away longer than the retention.",
                1 if p["expired"] else 0,
                site=n,
                puller=p["peer"],
                table=p["table"],
            )
            o.add(
                "multimaster_puller_away_seconds",
                "gauge",
                "Seconds since the puller's last successful refresh from the site.",
                p.get("away_s"),
                site=n,
                puller=p["peer"],
                table=p["table"],
            )
    if daemon is not None:
        for st in daemon.stats.links.values():
            lab = {"source": st.link.source, "target": st.link.target}
            o.add("multimaster_daemon_refreshes_total", "counter", "Refreshes run by this daemon.", st.runs, **lab)
            o.add("multimaster_daemon_refresh_errors_total", "counter", "Refreshes that failed.", st.errors, **lab)
            o.add(
                "multimaster_daemon_consecutive_failures",
                "gauge",
                "Failures in a row (backoff grows with it).",
                st.failures,
                **lab,
            )
            o.add("multimaster_daemon_last_refresh_seconds", "gauge", "Duration of the last refresh.", st.last_seconds, **lab)
        for n, c in daemon.stats.purged.items():
            o.add("multimaster_daemon_purged_entries_total", "counter", "Change-log entries purged by this daemon.", c, site=n)
        o.add("multimaster_daemon_start_timestamp_seconds", "gauge", "Unix time the daemon started.", daemon.stats.started_at)
    return "\n".join(o.lines) + "\n"


class MetricsServer:
    """GET /metrics on `host:port` (loopback by default; port 0 picks a free one), computed on
    each scrape from the daemon's cluster."""

    def __init__(self, daemon: Any, host: str = "127.0.0.1", port: int = 9464):
        self.daemon = daemon
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics here")
                    return
                try:
                    body = outer.text().encode()
                    code = 200
                except Exception as e:  # noqa: BLE001 - a scrape must answer
                    body = redact(f"# error: {type(e).__name__}: {e}\n").encode()
                    code = 500
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="mm-metrics", daemon=True)

    def text(self) -> str:
        d = self.daemon
        with d.using() as cl:  # (an edit of the topology file may replace the daemon's cluster meanwhile)
            return render(health(cl, d.sites, policy=d.purge_policy), d)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
