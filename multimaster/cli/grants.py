"""`multimaster grants`: least privileges for the peers pulling from a site (multimaster/grants.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    from multimaster.cli.common import TOPOLOGY, TRACEBACK, console, dump, execute
    from multimaster.config.topology import load_topology

    @app.command()
    def grants(
        topology: Path = TOPOLOGY,
        site: str = typer.Option(..., "--site", help="The site whose logs the peers read."),
        apply: bool = typer.Option(False, "--apply", help="Run the statements at the site (after init)."),
        json_: bool = typer.Option(False, "--json", help="Print {peer: {login, statements}} as JSON."),
        traceback: bool = TRACEBACK,
    ) -> None:
        """Print (or with --apply run) the least privileges each peer's refresher needs at SITE:
        read access to the change logs and second-order logs, nothing else.

        Examples:
          multimaster grants -t cluster.yaml --site eu-1
          multimaster grants -t cluster.yaml --site eu-1 --apply
        """
        from multimaster.ops import grants as g

        def go():  # type: ignore[no-untyped-def]
            topo = load_topology(topology)
            return g.apply_grants(topo, site) if apply else g.grant_statements(topo, site)

        plan = execute(go, traceback)
        if json_:
            dump({p.peer: {"login": p.login, "statements": p.statements} for p in plan})
            return
        if not plan:
            why = " (it is read-only)" if site in load_topology(topology).read_only else ""
            console.print(f"-- no site pulls from '{site}'{why}: nothing to grant", markup=False, highlight=False)
        for p in plan:
            console.print(
                f"-- peer '{p.peer}' pulls from '{site}' as {p.login} (set its password yourself)", markup=False, highlight=False
            )
            for sql in p.statements:
                console.print(sql + ";", markup=False, highlight=False, soft_wrap=True)
        if apply:
            console.print(f"-- applied at '{site}'", markup=False)
