"""The core commands: init, uninstall, refresh, reconcile, status, conflicts, demo. Each calls one
public function of multimaster.api."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from multimaster import api
from multimaster.cli.common import TOPOLOGY, TRACEBACK, app, console, dump, err, execute, not_reached, redraw
from multimaster.cli.progress import Reporter
from multimaster.config.topology import load_topology
from multimaster.ops.uninstall import untracked_message
from multimaster.store.errorqueue import held_total


@app.command()
def init(topology: Path = TOPOLOGY, traceback: bool = TRACEBACK) -> None:
    """Install change logs, snapshots, shadows and capture triggers at every site.

    Checks every site first (reachable, tables present and equal, same base rows or all but one
    empty) and changes nothing unless all checks pass. Safe to run again. Progress (base rows
    copied) and lock waits past refresh.lock_wait_warn go to stderr.

    Examples:
      multimaster init -t topologies/three-sites.yaml
    """

    def go() -> None:
        topo = load_topology(topology)
        with Reporter() as progress:
            progress("checking sites")
            rep = api.init(topo, progress=progress)
        for site, tables in rep.sites.items():
            console.print(
                f"[green]✓[/] {site}: " + (f"installed {', '.join(tables)}" if tables else "already installed, objects checked")
            )
        for tb, copies in rep.copied.items():
            for site, n in copies.items():
                console.print(f"  copied {n} base rows of {tb} to {site}")
        for site, tables in rep.untracked.items():
            for tb in tables:
                err.print(f"warning: {untracked_message(tb, site)}", markup=False, highlight=False, soft_wrap=True)
        for w in rep.warnings:
            err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
        for site, caveats in rep.caveats.items():
            for c in caveats:
                err.print(f"note: {site}: {c}", markup=False, highlight=False, soft_wrap=True)

    execute(go, traceback)


@app.command()
def uninstall(
    topology: Path = TOPOLOGY,
    site: Optional[str] = typer.Option(None, "--site", help="Only this site."),
    table: Optional[str] = typer.Option(
        None, "--table", help="Only this table's objects and bookkeeping (remove it from tables: first); online."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was dropped per site as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Remove every object multimaster created. User tables and rows are left as they are.

    With --table T: stop replicating T only, while applications and refreshers keep running. T must
    no longer be under tables: in the file (exit 2 otherwise). Drops T's triggers, change log,
    snapshots, shadow and bookkeeping rows at every site (or --site); its rows stay, changes of T
    not yet applied elsewhere are dropped. Running it again reports nothing left.

    Examples:
      multimaster uninstall -t topologies/three-sites.yaml
      multimaster uninstall -t topologies/three-sites.yaml --table audit
    """

    def go() -> None:
        topo = load_topology(topology)
        if table is None:
            out = api.uninstall(topo, site)
            if as_json:
                return dump(out)
            for s, dropped in out.items():
                console.print(f"[green]✓[/] {s}: dropped {len(dropped)} objects")
            return None
        res = api.uninstall_table(topo, table, site)
        if as_json:
            return dump(res)
        for s, r in res.items():
            if not r["objects"] and not r["rows"]:
                console.print(f"[green]✓[/] {s}: nothing of table {escape(table)} left")
            else:
                console.print(
                    f"[green]✓[/] {s}: table {escape(table)}: dropped {len(r['objects'])} objects, "
                    f"deleted {sum(r['rows'].values())} bookkeeping rows"
                )
        return None

    execute(go, traceback)


def _refresh_table(results: list[Any]) -> Table:
    t = Table(title="refresh")
    for c in ("link", "pulled", "applied", "conflicts", "batches", "waiting", "seconds", "result"):
        t.add_column(c, justify="right" if c not in ("link", "result") else "left")
    for r in results:
        result = (
            f"[red]{escape(r.error)}[/]"
            if r.error
            else "[red]stalled[/]"
            if r.stalled
            else f"[yellow]waiting: {escape(r.waits_for or '')}[/]"
            if r.waiting
            else f"[yellow]held at source: {r.held_at_source['waiting']} change(s) behind {escape(r.held_at_source['who'])}[/]"
            if r.held_at_source
            else "[green]ok[/]"
        )
        t.add_row(
            f"{r.peer} → {r.site}",
            str(r.pulled),
            str(r.applied),
            str(r.conflicts),
            str(r.batches),
            str(r.waiting),
            f"{r.seconds:.2f}",
            result,
        )
    return t


def _removed(topo: Any, results: list[Any]) -> None:
    """A link failing because a site of it was removed (`remove-site`) and the file still lists it
    says so, instead of the fixes of a site never installed or connected (init, add-site)."""
    if not any(r.error for r in results):
        return
    from multimaster.ops.status import removed_message, removed_sites

    with api.Cluster(topo) as cl:
        gone = removed_sites(cl)
    for r in results:
        site = next((n for n in (r.peer, r.site) if n in gone), None)
        if r.error and site is not None:
            r.error = removed_message(site)


def _stalled_exit(messages: list[str]) -> int:
    """1 when a link is stalled (docs/operations.md "Stalled links") or failing (a site not
    reached, refreshes that fail), each named on stderr with its fix; else 0."""
    for m in messages:
        err.print(m, markup=False, highlight=False, soft_wrap=True)
    return 1 if messages else 0


@app.command()
def refresh(
    topology: Path = TOPOLOGY,
    site: Optional[str] = typer.Option(None, "--site", help="Only links into this site."),
    peer: Optional[str] = typer.Option(None, "--peer", help="Only the link from this peer."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Changes per transaction."),
    no_reconcile: bool = typer.Option(False, "--no-reconcile", help="Only pull into snapshots; apply later with 'reconcile'."),
    until_quiet: bool = typer.Option(False, "--until-quiet", help="Repeat rounds until a whole round pulls nothing."),
    max_rounds: int = typer.Option(20, "--max-rounds", help="Upper bound for --until-quiet."),
    as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """Pull each peer's change log past its watermark and reconcile, in bounded batches.

    Exit 1 if any link failed (the others still refresh), or is stalled: a change of it has waited
    longer than refresh.stall_after for something this site has not received (stderr says what,
    and the fix), or a site's capture of a table was found missing (the table was made again)
    and its writes of then are not recaptured yet (see `multimaster recapture`), or a site it
    refreshed holds changes in its error queue (the links went on without them; stderr names the
    site and `multimaster errors`). A site whose versions came ahead of this site's clock past refresh.clock_warn
    (not past max_clock_offset: those are held) is named on stderr; that alone exits 0.

    Progress goes to stderr (bars on a terminal, else a line per link every MM_PROGRESS_EVERY
    seconds, default 5), and so does a write transaction's wait for a lock past
    refresh.lock_wait_warn (default 2s), naming who holds it.

    Examples:
      multimaster refresh -t topo.yaml
      multimaster refresh -t topo.yaml --site s2 --peer s1
      multimaster refresh -t topo.yaml --until-quiet
    """

    def go() -> int:
        topo = load_topology(topology)
        allres = []
        with api.Cluster(topo) as cl, Reporter() as progress:
            for _ in range(max_rounds if until_quiet else 1):
                res = api.refresh(
                    cl, site, peer, batch_size=batch_size, reconcile_=not no_reconcile, progress=progress, parallel=True
                )
                allres.append(res)
                if not until_quiet or all(r.pulled == 0 for r in res) or any(r.error for r in res):
                    break
            held = api.held_counts(cl, sorted({r.site for r in allres[-1]}))  # on the sites' open connections
        last = allres[-1]
        _removed(topo, [r for res in allres for r in res])
        if as_json:
            dump(
                [
                    {
                        "round": i + 1,
                        "links": [
                            {
                                "from": r.peer,
                                "to": r.site,
                                "pulled": r.pulled,
                                "applied": r.applied,
                                "conflicts": r.conflicts,
                                "batches": r.batches,
                                "seconds": round(r.seconds, 4),
                                "error": r.error,
                                "waiting": r.waiting,
                                "waits_for": r.waits_for,
                                "stalled": r.stalled,
                                "held_at_source": r.held_at_source,
                                "clock_ahead": r.clock_ahead,
                                "clock_warnings": r.clock_warnings,
                                "capture_gaps": r.gaps,
                            }
                            for r in res
                        ],
                    }
                    for i, res in enumerate(allres)
                ]
            )
        else:
            for i, res in enumerate(allres):
                if len(allres) > 1:
                    console.print(f"round {i + 1}")
                console.print(_refresh_table(res))
        for r in last:  # applied, not held: a warning, exit 0 (docs/clock.md "Clock discipline")
            for w in r.clock_warnings:
                err.print(w, markup=False, highlight=False, soft_wrap=True)
        stalled = _stalled_exit([r.stalled for r in last if r.stalled])
        gaps = _gaps_exit(sorted({g for r in last for g in r.gaps}))
        return 1 if any(r.error for r in last) else max(stalled, gaps, _held_at(held))

    code = execute(go, traceback)
    raise typer.Exit(code)


@app.command()
def reconcile(
    topology: Path = TOPOLOGY,
    site: Optional[str] = typer.Option(None, "--site"),
    as_json: bool = typer.Option(False, "--json"),
    traceback: bool = TRACEBACK,
) -> None:
    """Apply changes already pulled into snapshots (see refresh --no-reconcile).

    Examples:
      multimaster reconcile -t topo.yaml --site s1
    """

    def go() -> None:
        out = api.reconcile(load_topology(topology), site)
        rows = [
            {
                "site": s,
                "table": tb,
                "applied": r.applied,
                "duplicates": r.duplicates,
                "parked": r.parked,
                "inserted": r.inserted,
                "updated": r.updated,
                "deleted": r.deleted,
                "renumbered": r.renumbered,
                "conflicts": len(r.conflicts),
            }
            for s, per in out.items()
            for tb, r in per.items()
        ]
        if as_json:
            dump(rows)
            return
        t = Table(title="reconcile")
        for c in rows[0].keys() if rows else ["site"]:
            t.add_column(c)
        for r in rows:
            t.add_row(*(str(v) for v in r.values()))
        console.print(t)

    execute(go, traceback)


def _last_error_cell(ln: dict[str, Any]) -> str:
    """status's "last error" of a link: why it could not be read, else its last error with its time,
    dimmed as past when a refresh succeeded after it (before, an error of 25 minutes ago stood
    beside a success of a moment ago with no time to tell them apart)."""
    if ln.get("error"):
        return f"[red]{escape(str(ln['error']))}[/]"
    last, at, ok = ln.get("last_error"), ln.get("last_error_at"), ln.get("last_success_at")
    if not last:
        return "-"
    text = escape(f"{at}: {last}" if at else str(last))
    return f"[dim]{text} (succeeded since)[/]" if at and ok and str(ok) > str(at) else text


def _status_tables(st: dict[str, Any]) -> list[Table]:
    t = Table(title="sites")
    since = any("conflicts_since" in d for d in st["sites"].values())
    cols = (
        ["site", "reachable", "rows", "change log", "tombstones", "conflicts"]
        + (["conflicts since"] if since else [])
        + ["held errors", "url"]
    )
    for c in cols:
        t.add_column(c)
    for name, d in st["sites"].items():
        tabs = d.get("tables", {})
        row = [
            f"{name} (read-only)" if d.get("read_only") else name,
            "yes" if d["reachable"] else "[red]no[/]",
            str(sum(v["rows"] for v in tabs.values())) if tabs else "-",
            str(sum(v["log"] for v in tabs.values())) if tabs else "-",
            str(sum(v["tombstones"] for v in tabs.values())) if tabs else "-",
            str(d.get("conflicts", "-")),
        ]
        if since:
            row.append(str(d.get("conflicts_since", "-")))
        errs = d.get("errors") or {}
        held = held_total(errs)  # as status.held_errors counts
        row.append("-" if not errs else f"[red]{held}[/]" if held else "0")
        t.add_row(*row, d["url"])
    lt = Table(title="links")
    for c in ("link", "waiting", "oldest waiting", "parked", "watermarks", "last success", "last error"):
        lt.add_column(c)
    for ln in st["links"]:
        age = ln.get("oldest_waiting_age_s")
        parked = ln.get("parked")
        held = ln.get("held_at_source")  # behind a transaction open at the source
        lt.add_row(
            f"{ln['from']} → {ln['to']}",
            ("-" if ln.get("waiting") is None else str(ln["waiting"]))
            + ("" if held is None else f" [{'red' if ln.get('stalled') else 'yellow'}](held at source)[/]"),
            "-" if age is None else f"{age:.1f}s",
            "-"
            if parked is None
            else f"[red]{parked} stalled[/]"
            if ln.get("stalled") and parked
            else f"[yellow]{parked}[/]"
            if parked
            else "0",
            ", ".join(f"{tb}:{v['watermark']}" for tb, v in ln.get("tables", {}).items()),
            str(ln.get("last_success_at") or "-"),
            _last_error_cell(ln),
        )
    from multimaster.ops.verifications import rich_table  # the last recorded verify run (docs/verify.md, Scheduled checks)

    out = [t, lt]
    behind = list(st.get("schema_behind") or [])
    behind += [
        f"site '{n}': the columns of {tb} changed and replication has not followed yet (the next refresh does)"
        for n, d in st["sites"].items()
        for tb in d.get("schema_unfollowed") or []
    ]
    for title, column, lines in (
        # docs/clock.md "Clock discipline"
        ("clock warnings", "a site whose clock is ahead (applied; held past refresh.max_clock_offset)", st.get("clock_warnings")),
        # docs/mysql.md "The transaction registry"
        ("transaction registry", "a record the server keeps of capturing transactions, and the fix", st.get("registry_warnings")),
        ("schema behind", "what waits, and the fix", behind),  # docs/schema-changes.md
        # docs/schema-changes.md "A table made again"
        ("capture gaps", "writes a site made while its capture was missing, and the fix", st.get("capture_gaps")),
    ):
        if lines:
            mt = Table(title=title)
            mt.add_column(column)
            for line in lines:
                mt.add_row(escape(line))
            out.append(mt)
    return out + ([rich_table(st["verification"])] if st.get("verification") else [])


@app.command()
def status(
    topology: Path = TOPOLOGY,
    as_json: bool = typer.Option(False, "--json", help="Print as JSON (once)."),
    since: Optional[str] = typer.Option(None, "--since", help="Also count conflicts since: a duration ago (1h) or an ISO time."),
    watch: bool = typer.Option(False, "--watch", help="Refresh the tables in place until Ctrl-C."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch."),
    traceback: bool = TRACEBACK,
) -> None:
    """Per link: changes waiting, watermark, last refresh, age of the oldest waiting change; per
    site: rows, log sizes, conflicts (and conflicts since --since), changes held in the error
    queue (exit 1 while some are held: see `multimaster errors`), sites whose clock was found
    ahead past refresh.clock_warn (a warning: exit 0). Exit 1 also while a site cannot be reached
    or a link's refreshes have failed for refresh.stall_after, each named on stderr.

    Examples:
      multimaster status -t topo.yaml
      multimaster status -t topo.yaml --json --since 1h
      multimaster status -t topo.yaml --watch
    """
    from multimaster.ops.metrics import parse_since

    def go() -> int:
        topo = load_topology(topology)
        since_at = parse_since(since)
        with api.Cluster(topo) as cl:
            st = api.status(cl, since=since_at)
            if as_json:
                dump(st)
                return max(
                    _held_exit(st, as_json),
                    _stalled_exit(st.get("stalled") or []),
                    _stalled_exit(st.get("failing") or []),
                    _stalled_exit(st.get("behind") or []),
                    _untracked_exit(st),
                    _gaps_exit(st.get("capture_gaps") or []),
                )
            if not watch:
                for t in _status_tables(st):
                    console.print(t)
                return max(
                    _held_exit(st, as_json),
                    _stalled_exit(st.get("stalled") or []),
                    _stalled_exit(st.get("failing") or []),
                    _stalled_exit(st.get("behind") or []),
                    _untracked_exit(st),
                    _gaps_exit(st.get("capture_gaps") or []),
                )
            redraw(lambda: _status_tables(api.status(cl, since=since_at)), interval)

    raise typer.Exit(execute(go, traceback) or 0)


def _gaps_exit(gaps: list[str]) -> int:
    """1 when a site's capture was found missing and its writes of then are not recaptured yet
    (docs/schema-changes.md "A table made again"), each named on stderr with the fix; else 0."""
    for m in gaps:
        err.print(m, markup=False, highlight=False, soft_wrap=True)
    return 1 if gaps else 0


def _untracked_exit(st: dict[str, Any]) -> int:
    """1 when a site still has a table installed that is no longer under tables: (its changes are
    captured and nothing pulls them), each named on stderr with the command that stops it; else 0."""
    for m in st.get("untracked") or []:
        err.print(m, markup=False, highlight=False, soft_wrap=True)
    return 1 if st.get("untracked") else 0


def _held_at(held: dict[str, int]) -> int:
    """refresh: 1 when a site it refreshed holds changes in its error queue (docs/errors.md: the
    link went on without them), each site named on stderr with the commands; else 0."""
    for n, k in sorted(held.items()):
        err.print(
            f"site '{n}' holds {k} change(s) in its error queue: see them with 'multimaster errors -t FILE --site {n}', "
            "fix the cause, then 'multimaster errors retry -t FILE --all'",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    return 1 if held else 0


def _held_exit(st: dict[str, Any], as_json: bool) -> int:
    """1 when a site holds changes in its error queue (docs/errors.md), naming the command that
    shows them on stderr; else 0."""
    if not st.get("held_errors"):
        return 0
    err.print(
        f"{st['held_errors']} change(s) held in the error queue: see them with 'multimaster errors -t FILE', "
        "fix the cause, then 'multimaster errors retry -t FILE --all'",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return 1


def _side(r: dict[str, Any], side: str) -> str:
    vals = r.get(f"{side}_values")
    origin = r.get(f"{side}_origin")
    src = r.get(f"{side}_source")
    return f"{vals} @{origin} ({src})" if origin else str(vals)


@app.command()
def conflicts(
    topology: Path = TOPOLOGY,
    site: Optional[str] = typer.Option(None, "--site", help="Only the conflicts this site recorded."),
    table: Optional[str] = typer.Option(None, "--table", help="Only conflicts of this table."),
    kind: Optional[str] = typer.Option(
        None,
        "--kind",
        help="Only this kind: update_update, insert_insert, update_delete, delete_update, insert_replaces, unique, orphan.",
    ),
    since: Optional[str] = typer.Option(None, "--since", help="Only conflicts since: a duration ago (1h) or an ISO time."),
    limit: int = typer.Option(50, "--limit", min=0, help="At most the newest N conflicts (0: all); stderr says how many more."),
    offset: int = typer.Option(0, "--offset", min=0, help="Skip the newest N conflicts (the next page: --offset 50)."),
    re_resolve: bool = typer.Option(
        False, "--re-resolve", help="Show what --policy would have decided for each logged conflict of a column or group."
    ),
    policy: Optional[str] = typer.Option(
        None, "--policy", help="With --re-resolve: latest, earliest, maximum, minimum, priority:s1,s2, custom:pkg.mod.fn."
    ),
    apply: bool = typer.Option(
        False, "--apply", help="With --re-resolve: make the new outcome the row's (a local update at one site, replicated)."
    ),
    at: Optional[str] = typer.Option(
        None, "--at", help="With --apply: write at this site (default: the first site that logged the conflict)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
    traceback: bool = TRACEBACK,
) -> None:
    """List recorded conflicts: both versions with the site that wrote each (this site: local;
    another: replicated), the values of the contested columns, both row images, the rule applied
    and which side won.

    With --re-resolve --policy P: per row and column (or group) in conflict, what P would have
    decided among the versions logged, beside what the logged rule decided (a dry run). With
    --apply, where P picks another winner and the row still holds the logged winner's values, the
    new values are written at one site as an ordinary update (a fresh version, replicated to every
    site); a row changed since is skipped and reported (exit 1).

    Examples:
      multimaster conflicts -t topo.yaml --since 1h
      multimaster conflicts -t topo.yaml --site s1 --table items --kind update_update --json
      multimaster conflicts -t topo.yaml --re-resolve --policy earliest --table items
      multimaster conflicts -t topo.yaml --re-resolve --policy priority:hq,branch --since 1d --apply
    """
    from multimaster.ops.metrics import parse_since

    if (apply or policy or at) and not re_resolve:
        err.print("error: --policy, --apply and --at go with --re-resolve", markup=False)
        raise typer.Exit(2)
    if re_resolve and not policy:
        err.print(
            "error: --re-resolve needs --policy (latest, earliest, maximum, minimum, priority:..., custom:...)", markup=False
        )
        raise typer.Exit(2)
    if re_resolve:
        assert policy is not None
        raise typer.Exit(
            execute(lambda: _re_resolve(topology, policy, site, table, kind, since, apply, at, as_json), traceback) or 0
        )

    def go() -> int:
        from multimaster.ops.status import conflicts_page

        unreachable: dict[str, str] = {}
        page = conflicts_page(
            load_topology(topology), site, table, limit, offset, since=parse_since(since), kind=kind, unreachable=unreachable
        )
        rows = page.rows
        code = not_reached(unreachable)  # the others' logs are listed all the same
        _more_conflicts(page.total, page.exact, len(rows), offset, limit, topology)
        if as_json:
            dump(rows)
            return code
        t = Table(title=f"conflicts ({len(rows)} of {page.total:,}{'' if page.exact else '+'})")
        for c in ("site", "id", "detected", "table", "key", "kind", "columns", "local", "remote", "rule", "winner"):
            t.add_column(c)
        for r in rows:
            t.add_row(
                r["site"],
                str(r["id"]),
                str(r["detected_at"]),
                r["table"],
                str(r["key"]),
                r["kind"],
                ",".join(r["columns"] or []),
                _side(r, "local"),
                _side(r, "remote"),
                r["rule"],
                r["winner"],
            )
        console.print(t)
        return code

    code = execute(go, traceback)
    if code:
        raise typer.Exit(code)


def _more_conflicts(total: int, exact: bool, shown: int, offset: int, limit: int, topology: Path) -> None:
    """On stderr, when the log has conflicts this page does not show: how many older ones (at
    least, when a site's agent was not counted), and the options that show them."""
    left = total - offset - shown
    if shown and (left > 0 or offset):
        line = f"conflicts {offset + 1}-{offset + shown} of {total:,}{'' if exact else '+'} shown, newest first"
        if left > 0:
            line += (
                f"; {left:,}{'' if exact else ' or more'} older: 'multimaster conflicts -t {topology} --offset "
                f"{offset + shown}' shows the next {limit}"
            )
        err.print(
            line + ", --limit 0 shows all; --since, --table, --kind narrow it", markup=False, highlight=False, soft_wrap=True
        )


def _re_resolve(
    topology: Path,
    policy: str,
    site: str | None,
    table: str | None,
    kind: str | None,
    since: str | None,
    apply: bool,
    at: str | None,
    as_json: bool,
) -> int:
    """`conflicts --re-resolve`: the outcomes (and with --apply what was written); exit 1 when a
    change to apply was skipped."""
    from multimaster.ops.metrics import parse_since

    rep = api.re_resolve_conflicts(
        load_topology(topology), policy, site=site, table=table, since=parse_since(since), kind=kind, apply=apply, at=at
    )
    if as_json:
        dump(rep)
    else:
        t = Table(title=f"conflicts re-resolved with {rep['policy']}" + (" (applied)" if apply else " (dry run: --apply writes)"))
        for c in ("table", "key", "columns", "versions", "logged rule", "logged winner", "new winner", "outcome"):
            t.add_column(c)
        for o in rep["outcomes"]:
            outcome = (
                o["why"]
                if o["status"] == "skip"
                else "same winner"
                if o["status"] == "same"
                else f"{o['action']} at {o['at']}: {o['why']}"
                if o.get("action")
                else "would change"
            )
            t.add_row(
                o["table"],
                str(o["key"]),
                ",".join(o["columns"]),
                "; ".join(
                    [f"{c['values']} @{c['origin']}" for c in o["candidates"]]
                    + [f"({c['values']} @{c['origin']}, written over)" for c in o.get("superseded") or ()]
                ),
                o["logged_rule"],
                "-" if not o["logged"] else f"{o['logged']['values']} @{o['logged']['origin']}",
                "-" if not o["new"] else f"{o['new']['values']} @{o['new']['origin']}",
                escape(outcome),
            )
        console.print(t)
        console.print(", ".join(f"{k}: {v}" for k, v in sorted(rep["counts"].items())) or "no conflicts logged")
    skipped = [o for o in rep["outcomes"] if o.get("action") == "skipped"]
    for o in skipped:
        err.print(f"{o['table']} {o['rid']}: not applied: {o['why']}", markup=False, highlight=False, soft_wrap=True)
    return 1 if skipped else 0


@app.command()
def demo(
    directory: Path = typer.Option(Path("demo-sites"), "--dir", help="Where to create the three SQLite sites."),
    seed: int = typer.Option(7, "--seed", help="Workload seed."),
    size: int = typer.Option(200, "--size", help="Rows inserted per site."),
    as_json: bool = typer.Option(False, "--json"),
    traceback: bool = TRACEBACK,
) -> None:
    """Create three SQLite sites, write to all of them (with conflicts and the airline last-seat
    case), refresh until they converge, and show what happened.

    Examples:
      multimaster demo --dir /tmp/mm-demo
    """
    from multimaster.ops.demo import run_demo

    def go() -> int:
        report = run_demo(directory, seed=seed, size=size, console=None if as_json else console)
        if as_json:
            dump(report)
        return 0 if report["converged"] else 1

    raise typer.Exit(execute(go, traceback))
