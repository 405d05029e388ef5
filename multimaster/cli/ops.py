"""Operations commands: run (the refresher daemon), purge, add-site, remove-site, watch and
topology show. Registered on the main app by ``multimaster.cli`` (the package); each command
calls one public function (daemon.Daemon, purge.purge, instantiate.add_site/remove_site,
metrics.health, topology_view.view)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.table import Table

from multimaster.cli.common import TOPOLOGY, TRACEBACK, console, dump, err, execute, redraw
from multimaster.cli.progress import Reporter
from multimaster.config.topology import load_topology, parse_duration
from multimaster.errors import ConfigError

__all__ = ["register"]

RETENTION = typer.Option(
    "7d",
    "--retention",
    help="A puller that purge cannot reach and that has not refreshed for longer is given up (it stops holding log "
    "entries and must be re-instantiated); at least 1h. A puller that answers is never given up.",
)
MIN_AGE = typer.Option("1h", "--min-age", help="Only log entries older than this are purged (a margin for changes in transit).")
TOMBSTONES_AFTER = typer.Option(
    None,
    "--tombstones-after",
    help="Keep tombstones at least this long once every site has them ('off': forever). Default: purge.tombstones_after.",
)
CONFLICTS_AFTER = typer.Option(
    None,
    "--conflicts-after",
    help="Keep conflict-log rows at least this long once every site has their changes ('off': forever). "
    "Default: purge.conflicts_after.",
)


def _duration(value: Optional[str], opt: str) -> Optional[float]:
    if value is None or value.lower() in ("off", "none", "0"):
        return None
    try:
        return parse_duration(value)
    except ValueError as e:
        raise ConfigError([f"{opt}: {e}"]) from None


def run(
    topology: Path = TOPOLOGY,
    site: Optional[List[str]] = typer.Option(
        None, "--site", help="Run this site's refreshers (repeatable). Default: every site."
    ),
    metrics_port: Optional[int] = typer.Option(
        None, "--metrics-port", help="Serve Prometheus metrics on this port (0: any free port)."
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", "--metrics-host", help="Address of the metrics endpoint (loopback by default)."
    ),
    purge_every: str = typer.Option("10m", "--purge-every", help="Purge this site's change logs this often ('off': never)."),
    retention: str = RETENTION,
    min_age: str = MIN_AGE,
    tombstones_after: Optional[str] = TOMBSTONES_AFTER,
    conflicts_after: Optional[str] = CONFLICTS_AFTER,
    max_backoff: str = typer.Option("5m", "--max-backoff", help="Longest wait between retries of a failing link."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", min=1, help="Changes per transaction (default: refresh.batch_size)."
    ),
    log_format: str = typer.Option("text", "--log-format", help="'text' or 'json' (one JSON object per line)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also log refreshes that pulled nothing."),
    traceback: bool = TRACEBACK,
) -> None:
    """Run the refresher daemon: every link into the site on its own schedule (interval or cron,
    with jitter, from the topology file), failing links backing off, one daemon per site.

    Stops cleanly on SIGINT/SIGTERM: the batch being applied commits, nothing is half-applied.
    One log line per refresh (link, pulled, applied, conflicts, seconds, error).

    Examples:
      multimaster run -t topo.yaml --site s1
      multimaster run -t topo.yaml --site s1 --metrics-port 9464 --log-format json
      multimaster run -t topo.yaml            # every site in one process
    """
    import logging

    from multimaster.ops.daemon import Daemon, setup_logging
    from multimaster.ops.purge import PurgePolicy

    if log_format not in ("text", "json"):
        raise typer.BadParameter("use 'text' or 'json'", param_hint="--log-format")

    def go() -> None:
        setup_logging(log_format, logging.DEBUG if verbose else logging.INFO)
        topo = load_topology(topology)
        policy = PurgePolicy.parse(retention, min_age, tombstones_after=tombstones_after, conflicts_after=conflicts_after)
        d = Daemon(
            topo,
            site or None,
            purge_every=_duration(purge_every, "--purge-every"),
            purge_policy=policy,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            max_backoff=_duration(max_backoff, "--max-backoff") or 300.0,
            log_format=log_format,
            batch_size=batch_size,
        )
        d.run_forever()

    execute(go, traceback)


def purge(
    topology: Path = TOPOLOGY,
    site: Optional[str] = typer.Option(None, "--site", help="Only this site's logs."),
    retention: str = RETENTION,
    min_age: str = MIN_AGE,
    tombstones_after: Optional[str] = TOMBSTONES_AFTER,
    conflicts_after: Optional[str] = CONFLICTS_AFTER,
    keep_snapshots: bool = typer.Option(False, "--keep-snapshots", help="Keep applied snapshot rows."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Delete change-log entries every live puller has pulled (and applied snapshot rows), and
    tombstones and conflict-log rows past their retention that every site has.

    Never an entry a live peer still needs: a puller that answers holds entries back however
    long it has not refreshed. Only a puller that purge cannot reach, and that has not refreshed,
    for longer than --retention (at least 1h) is given up: named on stderr with the commands that
    bring it back (remove-site --force, add-site --replace), exit 1. A site that is down, or has
    not applied a delete or a conflict's changes yet, holds those tombstones and conflict rows
    back (listed under "held by"). Exit 1 if a site could not be purged or a puller is given up.

    Examples:
      multimaster purge -t topo.yaml --dry-run
      multimaster purge -t topo.yaml --site s1 --retention 2d --min-age 10m
      multimaster purge -t topo.yaml --tombstones-after 1d --conflicts-after off
    """
    from multimaster.ops import purge as purge_mod

    def go() -> int:
        policy = purge_mod.PurgePolicy.parse(
            retention, min_age, snapshots=not keep_snapshots, tombstones_after=tombstones_after, conflicts_after=conflicts_after
        )
        reps = purge_mod.purge(load_topology(topology), site, policy, dry_run=dry_run)
        if as_json:
            dump([r.as_dict() for r in reps])
        else:
            _purge_tables(reps, dry_run)
        for r in reps:  # a puller given up needs re-instantiation: named with the commands, exit 1
            for m in r.given_up:
                err.print(m, markup=False, highlight=False, soft_wrap=True)
        return 1 if any(r.error or r.given_up for r in reps) else 0

    raise typer.Exit(execute(go, traceback))


def _purge_tables(reps: list[Any], dry_run: bool) -> None:
    """The purge reports as two tables: change logs, then tombstones and conflict-log rows."""
    t = Table(title="purge (dry run)" if dry_run else "purge")
    for c in ("site", "table", "purged", "second-order", "snapshot rows", "log left", "held by", "expired"):
        t.add_column(c)
    s = Table(title="tombstones and conflict log" + (" (dry run)" if dry_run else ""))
    for c in ("site", "table", "tombstones purged", "held", "left", "conflicts purged", "held", "held by"):
        s.add_column(c)
    for r in reps:
        if r.error:
            t.add_row(r.site, "-", "-", "-", "-", "-", "-", f"[red]{r.error}[/]")
        for tb, tp in r.tables.items():
            t.add_row(
                r.site,
                tb,
                str(tp.purged),
                str(tp.log2_deleted),
                str(tp.snapshot_rows),
                str(tp.log_left),
                ",".join(tp.held_by) or "-",
                ",".join(r.expired) or "-",
            )
            s.add_row(
                r.site,
                tb,
                str(tp.tombstones),
                str(tp.tombstones_held),
                str(tp.tombstones_left),
                str(tp.conflicts),
                str(tp.conflicts_held),
                "; ".join(f"{k}: {v}" for k, v in tp.state_held_by.items()) or "-",
            )
    console.print(t)
    console.print(s)
    for r in reps:  # MariaDB's record of capturing transactions (docs/mysql.md "The transaction registry")
        if r.registry:
            console.print(f"site '{r.site}': {r.registry}", markup=False, highlight=False, soft_wrap=True)


def add_site(
    name: str = typer.Argument(..., help="The new site, already listed in the topology file with its links."),
    topology: Path = TOPOLOGY,
    peer: Optional[str] = typer.Option(
        None, "--from", help="The running site to copy (NAME must pull from it); not needed with --connect-only."
    ),
    replace: bool = typer.Option(False, "--replace", help="Drop NAME's replication objects and rows first (re-instantiation)."),
    batch_size: int = typer.Option(5000, "--batch-size", min=1, help="Rows per copy batch."),
    connect_only: bool = typer.Option(
        False,
        "--connect-only",
        help="Copy nothing: give the sites here that pull from NAME (or those of --site) their snapshot of NAME. "
        "Run on the host of a puller add-site reached through its agent.",
    ),
    site: Optional[List[str]] = typer.Option(None, "--site", help="With --connect-only: connect this puller (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Add a site to a running cluster while every other site keeps writing.

    Copies PEER's rows with their identities at a recorded log position, installs logs, snapshots
    and triggers at NAME, and sets every watermark so no change is lost or applied twice. First add
    NAME and its links to the topology file and create its (empty) tables. Progress (rows copied
    per table) and lock waits past refresh.lock_wait_warn go to stderr.

    Run it on NAME's host: NAME's database url must be in the file; PEER and the other sites may be
    reached through their agents (multimaster serve). A site pulling from NAME that is reached
    through its agent is left to connect on its own host (the agent writes nothing): each is named
    with its command, and the exit code is 3 until each is connected (run add-site again to check).

    Examples:
      multimaster add-site -t topo.yaml s4 --from s1
      multimaster add-site -t topo.yaml s2 --from s1 --replace   # re-instantiate an expired site
      multimaster add-site -t hub.yaml s4 --connect-only --site s1   # on s1's host, after add-site on s4's
    """
    from multimaster.ops.instantiate import add_site as add
    from multimaster.ops.instantiate import connect_site

    def go() -> int:
        topo = load_topology(topology)
        if connect_only:
            if replace:
                raise ConfigError(["--replace copies: it does not go with --connect-only"])
            crep = connect_site(topo, name, site, progress=None if as_json else (lambda m: console.log(m)))
            if as_json:
                dump(crep.as_dict())
            else:
                for s in crep.connected:
                    console.print(f"[green]✓[/] {s} now holds its snapshot of {name} (it pulls {name}'s change log from 0)")
                for s in crep.already:
                    console.print(f"  {s} already held its snapshot of {name}")
                _print_pending(crep.pending)
            return 0 if crep.ok else 3
        if peer is None:
            raise ConfigError(["--from: name the running site to copy (or give --connect-only)"])
        if site:
            raise ConfigError(["--site goes with --connect-only"])
        with Reporter() as progress:
            rep = add(topo, name, peer, replace=replace, batch_size=batch_size, progress=progress)
        if as_json:
            dump(rep.as_dict())
            return 0 if rep.ok else 3
        for tb in rep.rows:
            console.print(
                f"[green]✓[/] {tb}: {rep.rows[tb]} rows, {rep.identities[tb]} identities, "
                f"{rep.log_entries[tb]} change-log entries copied from {peer}"
            )
        for q, wms in rep.watermarks.items():
            console.print(f"  {name} pulls {q} from " + ", ".join(f"{tb}:{w}" for tb, w in wms.items()))
        console.print(f"  pulling from {name}: {', '.join(rep.pullers) or 'nobody'}")
        _print_pending(rep.pending)
        console.print(f"Next: start its daemon (multimaster run -t {topology} --site {name}) and restart the others' daemons.")
        return 0 if rep.ok else 3

    raise typer.Exit(execute(go, traceback))


def _print_pending(pending: list[dict[str, str]]) -> None:
    for p in pending:
        console.print(f"[yellow]pending[/] {p['site']}: {p['reason']}", highlight=False)
        console.print(f"  {p['fix']}", highlight=False)


def remove_site(
    name: str = typer.Argument(..., help="The site to retire (still listed in the topology file)."),
    topology: Path = TOPOLOGY,
    force: bool = typer.Option(False, "--force", help="Retire it even if its changes were not all pulled (they are lost)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Retire a site: first bring every site that pulls from it up to the furthest any of them
    pulled of its change log, then drop what other sites keep for it (snapshots, watermarks, log
    entries held for it) and its replication objects. Its rows stay. Then remove it from the
    topology file. Exits 1, naming each site and the fix, when a site still lacks changes of it
    that another has, or a site was not reached.

    Examples:
      multimaster remove-site -t topo.yaml s4
      multimaster remove-site -t topo.yaml s4 --force    # s4 is gone for good
    """
    from multimaster.ops.instantiate import remove_site as remove

    def go() -> int:
        rep = remove(load_topology(topology), name, force=force, progress=None if as_json else (lambda m: console.log(m)))
        if as_json:
            dump(rep.as_dict())
        else:
            _print_removal(rep, name, topology)
        return 0 if rep.ok else 1

    raise typer.Exit(execute(go, traceback))


def _print_removal(rep: Any, name: str, topology: Path) -> None:
    if rep.already_removed:
        console.print(
            f"[green]✓[/] {name} was removed already: every other site records it as removed and keeps nothing of it",
            highlight=False,
        )
        console.print(f"Next: remove '{name}' and its links from {topology} and restart the daemons.", highlight=False)
        return
    for r in rep.relayed:
        console.print(
            f"[green]✓[/] {r['site']}: {r['table']}: positions {r['after'] + 1}..{r['upto']} of {name}'s change log "
            f"given from {r['from']}'s snapshot ({r['applied']} change(s) applied)"
        )
    for s, what in rep.cleaned.items():
        console.print(f"[green]✓[/] {s}: dropped {', '.join(what)}")
    for s, per in sorted(rep.dropped.items()):
        for tb, n in sorted(per.items()):
            console.print(f"[yellow]dropped:[/] {s}: {tb}: {n} change(s) of {name} that waited there went with its snapshot")
    if rep.not_pulled:
        for tb, n in sorted(rep.not_pulled.items()):
            if n:
                console.print(f"[yellow]lost:[/] {name}: {tb}: {n} change(s) of its own no site pulled")
    for k in rep.kept:
        console.print(f"[yellow]kept:[/] the snapshots of {name} stay at the sites that pull from it: {k}")
    others = [u for u in rep.unreachable if u != name]
    if name in rep.unreachable:
        console.print(f"[yellow]not reached:[/] {name} (its replication objects stay in its database)")
    if others:
        console.print(f"[red]not reached:[/] {', '.join(others)} (run remove-site again when they answer)")
    for b in rep.behind:
        console.print(f"[red]behind:[/] {b['site']}: {b['reason']}", soft_wrap=True)
        console.print(f"  fix: {b['fix']}", soft_wrap=True)
    if rep.kept:
        console.print(f"Next: keep '{name}' in {topology} and run remove-site again once the above is fixed.")
    else:
        console.print(f"Next: remove '{name}' and its links from {topology} and restart the daemons.")


def _health_tables(h: dict[str, Any]) -> list[Table]:
    st = Table(title="sites")
    for c in ("site", "reachable", "rows", "change log", "2nd-order", "snapshots", "conflicts", "since", "expired pullers"):
        st.add_column(c)
    for n, d in h["sites"].items():
        tabs = d.get("tables") or {}
        tot = lambda k: str(sum(v.get(k, 0) for v in tabs.values())) if tabs else "-"  # noqa: E731
        st.add_row(
            n,
            "yes" if d.get("reachable") else "[red]no[/]",
            tot("rows"),
            tot("log"),
            tot("log2"),
            tot("snapshot_rows"),
            str(d.get("conflicts", "-")),
            str(d.get("conflicts_since", "-")),
            "[red]" + ", ".join(d["expired_pullers"]) + "[/]" if d.get("expired_pullers") else "-",
        )
    lt = Table(title="links")
    for c in ("link", "waiting", "visibility delay", "last success", "last error"):
        lt.add_column(c)
    for ln in h["links"]:
        age = ln.get("oldest_waiting_age_s")
        err = ln.get("last_error") or ln.get("error")
        recent_err = err and (
            not ln.get("last_success_at") or str(ln.get("last_error_at") or "") >= str(ln.get("last_success_at"))
        )
        lt.add_row(
            f"{ln['from']} → {ln['to']}",
            str(ln.get("waiting", "-")),
            "-" if age is None else f"{age:.1f}s",
            str(ln.get("last_success_at") or "-"),
            (f"[red]{err}[/]" if recent_err else str(err)) if err else "-",
        )
    return [st, lt]


def watch(
    topology: Path = TOPOLOGY,
    site: Optional[List[str]] = typer.Option(None, "--site", help="Only these sites and the links into them."),
    since: Optional[str] = typer.Option(None, "--since", help="Count conflicts since: a duration ago (1h) or an ISO time."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes of the view."),
    once: bool = typer.Option(False, "--once", help="Print once and exit (no live view)."),
    retention: str = RETENTION,
    as_json: bool = typer.Option(False, "--json", help="Print once as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Lag and health, refreshed in place: per link the changes waiting, the visibility delay
    (age of the oldest change not applied), last success and last error; per site log sizes,
    conflicts (since --since) and expired pullers.

    With --once or --json: exit 1 when, of the sites watched, `status` would exit 1 (changes held
    in an error queue, a link stalled or failing, a site not reached, ...: each named on stderr);
    0 when nothing needs action.

    Examples:
      multimaster watch -t topo.yaml
      multimaster watch -t topo.yaml --since 1h --once --json
    """

    from multimaster.engine.cluster import Cluster
    from multimaster.ops.metrics import health, parse_since
    from multimaster.ops.purge import PurgePolicy
    from multimaster.ops.status import attention

    def go() -> int:
        topo = load_topology(topology)
        policy = PurgePolicy.parse(retention)
        with Cluster(topo) as cl:

            def snap() -> dict[str, Any]:
                return health(cl, site or None, since=parse_since(since), policy=policy)

            if as_json or once:
                h = snap()
                if as_json:
                    dump(h)
                else:
                    for t in _health_tables(h):
                        console.print(t)
                problems = attention(h, topo.refresh.stall_after_seconds())  # as `status` exits
                for m in problems:
                    err.print(m, markup=False, highlight=False, soft_wrap=True)
                return 1 if problems else 0
            redraw(lambda: _health_tables(snap()), interval)

    raise typer.Exit(execute(go, traceback) or 0)


topology_app = typer.Typer(help="Look at a topology file.", no_args_is_help=True)


@topology_app.command("show")
def topology_show(
    topology: Path = TOPOLOGY, as_json: bool = typer.Option(False, "--json", help="Print as JSON."), traceback: bool = TRACEBACK
) -> None:
    """Draw the links and the path length (relay hops) between every pair of sites, and the
    worst delay the refresh schedules allow. Reads the file only.

    Examples:
      multimaster topology show -t topologies/star.yaml
    """
    from multimaster.config.view import render_text, view

    def go() -> None:
        v = view(load_topology(topology))
        if as_json:
            dump(v.as_dict())
        else:
            console.print(render_text(v), highlight=False, markup=False)

    execute(go, traceback)


def ddl(
    statement: str = typer.Argument(..., help="One ALTER TABLE statement of a replicated table."),
    topology: Path = TOPOLOGY,
    site: Optional[str] = typer.Option(None, "--site", help="Only at this site."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Run it and roll back where DDL is transactional (SQLite, PostgreSQL); elsewhere only check."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Apply one ALTER TABLE at every site, each site's capture following it in the same
    transaction where the database allows (docs/schema-changes.md). Reports per site; exit 1 when
    a site refused or failed.

    Examples:
      multimaster ddl -t topo.yaml "ALTER TABLE items ADD COLUMN color TEXT"
      multimaster ddl -t topo.yaml --dry-run "ALTER TABLE items DROP COLUMN note"
    """
    from multimaster import api

    def go() -> int:
        reps = api.ddl(load_topology(topology), statement, site=site, dry_run=dry_run)
        if as_json:
            dump([dict(r.__dict__) for r in reps])
        else:
            t = Table(title="ddl" + (" (dry run)" if dry_run else ""))
            for c in ("site", "status", "version", "added", "dropped", "retyped", "applied waiting", "message"):
                t.add_column(c)
            for r in reps:
                t.add_row(
                    r.site,
                    r.status if r.status in ("applied", "would apply") else f"[red]{r.status}[/]",
                    "-" if r.version is None else str(r.version),
                    ", ".join(r.added) or "-",
                    ", ".join(r.dropped) or "-",
                    ", ".join(r.retyped) or "-",
                    str(r.released),
                    r.message or "-",
                )
            console.print(t)
        _ddl_unfinished(reps, topology, statement)
        return 1 if any(r.status in ("refused", "failed", "not run") for r in reps) else 0

    raise typer.Exit(execute(go, traceback))


def _ddl_unfinished(reps: list[Any], topology: Path, statement: str) -> None:
    """On stderr, when `ddl` changed some sites and not others: the command that finishes it at
    each of the others (each site's capture follows its own schema meanwhile)."""
    done = [r.site for r in reps if r.ran]
    left = [r.site for r in reps if not r.ran and r.status == "failed"]
    if not done or not left:
        return
    err.print(
        f"ddl: applied at {', '.join(done)}, not at {', '.join(left)}; the cluster's schemas differ until it runs there:",
        markup=False,
        highlight=False,
    )
    for n in left:
        err.print(
            f"  multimaster ddl -t {shlex.quote(str(topology))} --site {n} {shlex.quote(statement)}",
            markup=False,
            highlight=False,
        )


def recapture(
    topology: Path = TOPOLOGY,
    site: str = typer.Option(..., "--site", help="The site whose writes were not captured."),
    table: Optional[List[str]] = typer.Option(
        None, "--table", help="A table (repeatable); default: every table with an open capture gap at the site."
    ),
    peer: Optional[str] = typer.Option(None, "--from", help="The site to compare with (default: the first other site)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be sent."),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Send the writes a site made while its capture of a table was missing (the table was made
    again: a migration tool's copy, DROP and CREATE; `status` names it). Compares the site's rows
    with a peer's and captures every difference no change on its way explains, as an insert, an
    update or a delete at the site; rows a change on its way touches are left (run again once it
    has landed). Closes the table's capture gap when nothing is left. Every site must be
    reachable directly. A row with a value the other site cannot store exactly is not sent and is
    named, with the fix. Exit 1 when rows were left, refused or not sent, or when rows of a renumbered table
    have other keys at the peer (docs/schema-changes.md "A table made again").

    Examples:
      multimaster recapture -t topo.yaml --site s2 --dry-run
      multimaster recapture -t topo.yaml --site s2 --table items --from s1
    """
    from multimaster import api

    def go() -> int:
        reps = api.recapture(load_topology(topology), site, table, peer, dry_run)
        if as_json:
            dump([r.to_dict() for r in reps])
        elif not reps:
            console.print(f"site '{site}': no table has an open capture gap; nothing to recapture")
        else:
            t = Table(title="recapture" + (" (dry run)" if dry_run else ""))
            for c in ("site", "table", "from", "inserts", "updates", "deletes", "left", "refused", "gap"):
                t.add_column(c)
            for r in reps:
                t.add_row(
                    r.site,
                    r.table,
                    r.peer,
                    str(len(r.inserted)),
                    str(len(r.updated)),
                    str(len(r.deleted)),
                    f"[yellow]{len(r.left)}[/]" if r.left else "0",
                    f"[red]{len(r.failed) + len(r.unfit)}[/]" if r.failed or r.unfit else "0",  # not sent
                    "closed" if r.closed else ("-" if r.dry_run or r.ok else "open"),
                )
            console.print(t)
            for r in reps:
                if r.left:
                    err.print(
                        f"{r.table}: {len(r.left)} row(s) differ but a change on its way touches them (keys "
                        f"{', '.join(map(str, r.left[:10]))}{' ...' if len(r.left) > 10 else ''}): refresh, then run again",
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )
                for k, e in r.failed:
                    err.print(f"{r.table}: key {k}: not sent: {e}", markup=False, highlight=False, soft_wrap=True)
                for line in r.unfit_problems():
                    err.print(line, markup=False, highlight=False, soft_wrap=True)
                if r.keys_differ:
                    err.print(r.keys_problem(), markup=False, highlight=False, soft_wrap=True)
        return 0 if all(r.ok for r in reps) else 1

    raise typer.Exit(execute(go, traceback))


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("ddl")(ddl)
    app.command("recapture")(recapture)
    app.command("purge")(purge)
    app.command("add-site")(add_site)
    app.command("remove-site")(remove_site)
    app.command("watch")(watch)
    app.add_typer(topology_app, name="topology")
