"""`multimaster errors`: the error queue (docs/errors.md) — list the changes held, `retry` them once
the cause is fixed, `skip` one on purpose."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from multimaster import api
from multimaster.cli.common import TOPOLOGY, TRACEBACK, console, dump, err, execute, not_reached
from multimaster.config.topology import load_topology
from multimaster.errors import ConfigError

__all__ = ["register", "errors_app"]

errors_app = typer.Typer(
    help="The error queue: changes a site rejected, held there; list (default), retry, skip.", no_args_is_help=False
)


def _what(r: dict[str, Any]) -> str:
    ch = r.get("change")
    if r["op"] == "?":
        return "malformed entry"
    if not ch:
        return r["op"]
    vals = ", ".join(f"{k}={v!r}" for k, v in ch["values"].items())
    return f"{r['op']} key {ch['key']}" + (f": {vals}" if vals else "")


def _state(r: dict[str, Any]) -> str:
    if r["state"] == "waiting":
        return f"waiting behind #{r['blocked_by']}"
    if r["state"] == "txn":  # held with a change of its source transaction
        return f"held with #{r['blocked_by']} (same transaction)"
    if r["state"] == "skipped":
        return f"skipped: {r.get('reason') or ''}"
    return str(r["state"])  # failed, parked


def _table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="error queue")
    for c in ("site", "id", "table", "state", "change", "from", "transaction", "version", "error", "first", "last", "attempts"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(
            r["site"],
            str(r["id"]),
            r["table"],
            _state(r),
            _what(r),
            f"{r['origin']} via {r['peer']}" if r["origin"] != r["peer"] else r["origin"],
            "-" if r.get("txn") is None else f"{r['origin']}:{r['txn']}",
            r["ver"],
            r.get("error") or "-",
            r["first_at"],
            r["last_at"],
            str(r["attempts"]),
        )
    return t


def _list(
    topology: Path,
    site: Optional[str],
    table: Optional[str],
    all_: bool,
    as_json: bool,
    traceback: bool,
    limit: int = 50,
    offset: int = 0,
) -> None:
    def go() -> int:
        from multimaster.ops.errors import errors_page

        unreachable: dict[str, str] = {}
        page = errors_page(
            load_topology(topology), site, table, include_skipped=all_, limit=limit, offset=offset, unreachable=unreachable
        )
        rows = page.rows
        code = max(not_reached(unreachable), 1 if page.held else 0)  # the others' queues are listed all the same
        _more(page.total, len(rows), offset, limit, topology)
        if as_json:
            dump(rows)
            return code
        if not rows:
            where = " of the sites reached" if unreachable else ""
            console.print(
                f"no change is held in the error queue{where}" if not page.total else f"no change past --offset {offset}",
                highlight=False,
            )
            return code
        console.print(_table(rows))
        _hints(rows, topology)
        return code

    code = execute(go, traceback)
    if code:
        raise typer.Exit(code)


def _more(total: int, shown: int, offset: int, limit: int, topology: Path) -> None:
    """On stderr, when the listing has changes this page does not show: how many, and the options
    that show them."""
    left = total - offset - shown
    if shown and (left > 0 or offset):
        first = f"changes {offset + 1}-{offset + shown} of {total:,} shown"
        nxt = (
            f"; {left:,} more: 'multimaster errors -t {topology} --offset {offset + shown}' shows the next {limit}"
            if left > 0
            else ""
        )
        err.print(first + nxt + ", --limit 0 shows all", markup=False, highlight=False, soft_wrap=True)


def _hints(rows: list[dict[str, Any]], topology: Path) -> None:
    """The commands that deal with what the listing shows."""
    if any(r["state"] in ("failed", "waiting", "txn") for r in rows):
        console.print(
            f"fix the cause, then: multimaster errors retry -t {topology} --all   "
            f"(or drop one, with the rest of its source transaction: multimaster errors skip -t {topology} "
            "--site SITE --id N --reason TEXT)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if any(r["state"] == "parked" for r in rows):
        console.print(
            "a parked row comes back by itself once its value is free: change the holder's value "
            f"(a plain UPDATE), or drop the parked row at every site: multimaster errors skip -t {topology} "
            "--site SITE --id N --reason TEXT",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


SITE = typer.Option(None, "--site", help="Only this site's queue.")
JSON = typer.Option(False, "--json", help="Print as JSON.")
LIMIT = typer.Option(50, "--limit", min=0, help="At most N changes (0: all); stderr says how many more there are.")
OFFSET = typer.Option(0, "--offset", min=0, help="Skip the first N changes (the next page: --offset 50).")


@errors_app.callback(invoke_without_command=True)
def errors(
    ctx: typer.Context,
    topology: Optional[Path] = typer.Option(None, "-t", "--topology", help="Topology file (YAML)."),
    site: Optional[str] = SITE,
    table: Optional[str] = typer.Option(None, "--table", help="Only this table's changes."),
    all_: bool = typer.Option(False, "--all", help="Also the skipped changes (with their reason)."),
    limit: int = LIMIT,
    offset: int = OFFSET,
    as_json: bool = JSON,
    traceback: bool = TRACEBACK,
) -> None:
    """The changes held in the error queue of every site: the change, the database's error, when,
    and the changes of the same row waiting behind it; the first --limit (50) of them, stderr
    saying how many more and the --offset that shows them. Exits 1 while a change is held (of
    --site and --table when given: failed, waiting behind one, held with its transaction, parked)
    or a site was not reached (named on stderr; the queues of the others are listed all the same);
    0 when nothing is held.

    Examples:
      multimaster errors -t topo.yaml
      multimaster errors -t topo.yaml --site s2 --json
      multimaster errors -t topo.yaml --offset 50          # the next 50
      multimaster errors retry -t topo.yaml --all
      multimaster errors skip -t topo.yaml --site s2 --id 3 --reason "row was removed by hand"
    """
    if ctx.invoked_subcommand is not None:
        return
    if topology is None:
        execute(_topology_required, traceback)
        return
    _list(topology, site, table, all_, as_json, traceback, limit, offset)


def _topology_required() -> None:
    raise ConfigError(["errors: -t/--topology FILE is required"])


@errors_app.command("list")
def list_(
    topology: Path = TOPOLOGY,
    site: Optional[str] = SITE,
    table: Optional[str] = typer.Option(None, "--table", help="Only this table's changes."),
    all_: bool = typer.Option(False, "--all", help="Also the skipped changes (with their reason)."),
    limit: int = LIMIT,
    offset: int = OFFSET,
    as_json: bool = JSON,
    traceback: bool = TRACEBACK,
) -> None:
    """The same as `multimaster errors`: the changes held in the error queue."""
    _list(topology, site, table, all_, as_json, traceback, limit, offset)


def _print_report(reps: list[dict[str, Any]], as_json: bool) -> int:
    if as_json:
        dump(reps)
    else:
        for r in reps:
            line = f"{r['site']}: applied {len(r['applied'])}"
            if r.get("skipped") is not None:
                ids = r.get("skipped_ids") or [r["skipped"]]
                what = (
                    f"#{r['skipped']}"
                    if len(ids) < 2
                    else f"#{r['skipped']} with its source transaction ({', '.join('#' + str(i) for i in ids)})"
                )
                line = f"{r['site']}: skipped {what}; then applied {len(r['applied'])} waiting behind it"
            console.print(line + (f" ({', '.join('#' + str(i) for i in r['applied'])})" if r["applied"] else ""), markup=False)
            for i, why in r["held"].items():
                console.print(f"{r['site']}: #{i} still held: {why}", markup=False, highlight=False, soft_wrap=True)
    return 1 if any(r["held"] for r in reps) else 0


@errors_app.command("retry")
def retry(
    topology: Path = TOPOLOGY,
    site: Optional[str] = SITE,
    id_: Optional[int] = typer.Option(
        None, "--id", help="This change, the rest of its source transaction, and the changes waiting behind them."
    ),
    all_: bool = typer.Option(False, "--all", help="Every held change (of --site, or of every site)."),
    as_json: bool = JSON,
    traceback: bool = TRACEBACK,
) -> None:
    """Apply held changes again, once their cause is fixed: source transaction by source
    transaction, each all or nothing. What applies leaves the queue; a transaction rejected again
    stays held whole, with the new error (exit 1).

    Examples:
      multimaster errors retry -t topo.yaml --all
      multimaster errors retry -t topo.yaml --site s2 --id 3
    """
    code = execute(lambda: _print_report(api.retry_errors(load_topology(topology), site, id_, all_), as_json), traceback)
    raise typer.Exit(code)


@errors_app.command("skip")
def skip(
    topology: Path = TOPOLOGY,
    site: Optional[str] = SITE,
    id_: int = typer.Option(..., "--id", help="The held change to drop (with the rest of its source transaction)."),
    reason: str = typer.Option(..., "--reason", help="Why (kept in the queue with the time)."),
    as_json: bool = JSON,
    traceback: bool = TRACEBACK,
) -> None:
    """Drop a held change on purpose, with every held change of its source transaction (a
    transaction is applied whole or not at all): they are never applied at this site; the queue
    keeps them as `skipped` with the reason and the time. The changes waiting behind them are
    applied.

    Examples:
      multimaster errors skip -t topo.yaml --site s2 --id 3 --reason "price fixed by hand"
    """
    code = execute(lambda: _print_report([api.skip_error(load_topology(topology), id_, reason, site)], as_json), traceback)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.add_typer(errors_app, name="errors")
