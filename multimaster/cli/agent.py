"""The `serve` command: the site agent (ops/agent.py, docs/agent.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from multimaster import api
from multimaster.cli.common import TOPOLOGY, TRACEBACK, err, execute
from multimaster.config.topology import load_topology

__all__ = ["register"]


def serve(
    topology: Path = TOPOLOGY,
    site: str = typer.Option(..., "--site", help="The site to serve: this host's topology file gives its database url."),
    listen: str = typer.Option("127.0.0.1:8470", "--listen", help="HOST:PORT to listen on (0.0.0.0:8470: every address)."),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="Certificate file (PEM): serve HTTPS."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="Its private key file (PEM)."),
    log_level: str = typer.Option("warning", "--log-level", help="debug, info (one line per request), warning, error."),
    traceback: bool = TRACEBACK,
) -> None:
    """Serve one site's change log, schema versions, status, clock, freshness (token, wait), error
    queue and conflict log to peers on other hosts, read-only, over HTTP(S), to callers holding the
    site's token.

    Peers name the agent in their topology file (url: https://host:8470, token: ${VAR}); a refresh
    through it pulls exactly what a refresh from the database pulls. Plain HTTP only on a loopback
    address, unless the site's entry says insecure_http: true. Stops on Ctrl-C / SIGTERM.

    Examples:
      multimaster serve -t host1.yaml --site s1 --listen 0.0.0.0:8470 --tls-cert s1.pem --tls-key s1.key
      multimaster serve -t host1.yaml --site s1 --listen 127.0.0.1:8470
    """

    def go() -> None:
        topo = load_topology(topology)
        server = api.agent_server(
            topo, site, listen, None if tls_cert is None else str(tls_cert), None if tls_key is None else str(tls_key), log_level
        )
        scheme = "https" if tls_cert else "http"
        err.print(f"serving site '{site}' on {scheme}://{listen}", highlight=False)
        server.run()

    execute(go, traceback)


def register(app: typer.Typer) -> None:
    app.command(name="serve")(serve)
