"""The `keys` command: the key history of a renumbered table (ops/keys.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from multimaster import api
from multimaster.cli.common import TOPOLOGY, TRACEBACK, console, dump, execute
from multimaster.config.topology import load_topology

__all__ = ["register"]


def keys(
    topology: Path = TOPOLOGY,
    site: str = typer.Option(..., "--site", help="The site whose key history to show (keys differ per site until converged)."),
    table: str = typer.Option(..., "--table", help="A renumbered replicated table."),
    key: Optional[int] = typer.Option(None, "--key", help="Only the row this key named when it was given, and its key now."),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Show every key a row has had and why it moved (rank: a local insert's key became its rank;
    shift: rows inserted earlier elsewhere arrived). With --key, the row an application was given
    that key for, and its key now.

    Examples:
      multimaster keys -t topo.yaml --site s1 --table orders
      multimaster keys -t topo.yaml --site s1 --table orders --key 42 --json
    """

    def go() -> None:
        topo = load_topology(topology)
        rows = api.key_history(topo, site, table, key)
        now = api.current_key(topo, site, table, key) if key is not None else None
        if as_json:
            dump({"site": site, "table": table, "key": key, "current_key": now, "moves": rows} if key is not None else rows)
            return
        t = Table(title=f"key moves of {table} at {site} ({len(rows)})")
        for c in ("rid", "old key", "new key", "moved at", "reason"):
            t.add_column(c)
        for r in rows:
            t.add_row(r["rid"], str(r["old_key"]), str(r["new_key"]), r["moved_at"], r["reason"])
        console.print(t)
        if key is not None:
            console.print(
                f"key {key} of {table} at {site} is now {now}"
                if now is not None
                else f"key {key} of {table} at {site}: no such row now"
            )

    execute(go, traceback)


def register(app: typer.Typer) -> None:
    app.command(name="keys")(keys)
