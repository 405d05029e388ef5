"""`multimaster token` and `multimaster wait`: freshness for callers (ops/freshness.py, docs/cli.md
"Freshness: token and wait")."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from multimaster import api
from multimaster.cli.common import TOPOLOGY, TRACEBACK, console, dump, err, execute
from multimaster.config.topology import load_topology

__all__ = ["register"]


def token(
    topology: Path = TOPOLOGY,
    site: str = typer.Option(..., "--site", help="The site the caller wrote at."),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Print the site's freshness token: its version now, at least that of every change it
    captured (a write the caller committed there included). Give it to 'multimaster wait'.

    Examples:
      multimaster token -t topo.yaml --site s1
      T=$(multimaster token -t topo.yaml --site s1)
    """

    def go() -> None:
        tok = api.token(load_topology(topology), site)
        if as_json:
            dump({"site": site, "token": tok})
        else:
            console.print(tok, markup=False, highlight=False, soft_wrap=True)

    execute(go, traceback)


def wait(
    topology: Path = TOPOLOGY,
    tok: str = typer.Option(..., "--token", help="A token printed by 'multimaster token'."),
    sites: Optional[str] = typer.Option(None, "--sites", help="Sites to wait at, comma-separated (default: every other site)."),
    k: Optional[int] = typer.Option(None, "--k", help="Return when this many of the sites see the changes (default: all)."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds to wait at most."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Wait until every change the token's site made up to the token is applied at the sites
    (or at --k of them). Exit 0 when it is, 1 on timeout (stderr names each site behind and by
    how much), 2 for a bad token or an unknown site.

    Examples:
      multimaster wait -t topo.yaml --token "$T" --sites s2,s3 --timeout 5
      multimaster wait -t topo.yaml --token "$T" --sites s2,s3 --k 1 --json
    """

    def go() -> int:
        names = [s.strip() for s in sites.split(",") if s.strip()] if sites else None
        res = api.wait_visible(load_topology(topology), tok, names, k=k, timeout=timeout)
        if as_json:
            dump(res.as_dict())
        elif res.met:
            console.print(
                f"visible at {', '.join(res.visible)} ({len(res.visible)} of {len(res.sites)}, {res.k} needed) "
                f"after {res.waited_s:.2f} s",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        if res.met:
            return 0
        err.print(
            f"timed out after {res.waited_s:.1f} s: the changes of {res.origin} up to the token are visible at "
            f"{len(res.visible)} of {len(res.sites)} site(s) ({res.k} needed)"
            + (f": {', '.join(res.visible)}" if res.visible else ""),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        for b in res.behind:
            err.print(f"  behind: {b.describe(res.origin)}", markup=False, highlight=False, soft_wrap=True)
        return 1

    raise typer.Exit(execute(go, traceback))


def register(app: typer.Typer) -> None:
    app.command(name="token")(token)
    app.command(name="wait")(wait)
