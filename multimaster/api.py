"""The public Python API. The CLI only wraps these functions.

    from multimaster import api, load_topology
    topo = load_topology("topologies/three-sites.yaml")
    api.init(topo)
    api.refresh(topo)            # every link, until each peer's backlog is pulled and applied
    print(api.status(topo))

Each name is defined in the layer that owns it (engine/, ops/) and gathered here.
"""

from __future__ import annotations

from multimaster.core.versions import BASE_VER
from multimaster.dialects.schema import names
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.reconcile import ReconcileResult, RefreshResult
from multimaster.engine.refresh import catch_up, reconcile, refresh, refresh_link, relay_origins, write_retrying
from multimaster.ops.agent import make_server as agent_server
from multimaster.ops.agent import serve
from multimaster.ops.ddl import DdlReport, ddl
from multimaster.ops.errors import held_counts, list_errors, retry_errors, skip_error
from multimaster.ops.freshness import SiteFreshness, WaitResult, token, wait_visible
from multimaster.ops.install import InitReport, init
from multimaster.ops.keys import current_key, key_history
from multimaster.ops.recapture import Recaptured, recapture
from multimaster.ops.reresolve import re_resolve_conflicts
from multimaster.ops.status import conflicts, status
from multimaster.ops.uninstall import uninstall, uninstall_table

__all__ = [
    "catch_up",
    "init",
    "uninstall",
    "uninstall_table",
    "refresh",
    "refresh_link",
    "reconcile",
    "relay_origins",
    "write_retrying",
    "status",
    "conflicts",
    "re_resolve_conflicts",
    "held_counts",
    "list_errors",
    "retry_errors",
    "skip_error",
    "ddl",
    "DdlReport",
    "recapture",
    "Recaptured",
    "current_key",
    "key_history",
    "token",
    "wait_visible",
    "WaitResult",
    "SiteFreshness",
    "InitReport",
    "Cluster",
    "as_cluster",
    "ReconcileResult",
    "RefreshResult",
    "BASE_VER",
    "names",
    "agent_server",
    "serve",
]
