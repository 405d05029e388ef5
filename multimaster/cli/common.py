"""What every command module of the CLI shares: the app, the consoles, the common options, and how a
command's function is run (errors to exit codes, tracebacks only when asked)."""

from __future__ import annotations

import json
import os
import sys
import traceback as tb
from typing import Any, Callable, NoReturn, Sequence

import typer
from rich.console import Console
from rich.markup import escape

from multimaster.config.secrets import redact
from multimaster.errors import MultimasterError

__all__ = ["app", "console", "err", "TOPOLOGY", "TRACEBACK", "execute", "dump", "redraw"]

app = typer.Typer(
    name="multimaster",
    help="Update-anywhere asynchronous replication of SQL tables with triggers and snapshot logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
#: the width of output that goes to a pipe or a file when COLUMNS does not say (Rich's 80 wrapped
#: the error queue's and status's tables into unreadable columns in a log or `| less`)
PIPED_WIDTH = 200


def _console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or PIPED_WIDTH when the output is not one (COLUMNS wins)."""
    c = Console(stderr=stderr)
    if c.is_terminal or os.environ.get("COLUMNS"):
        return c
    return Console(stderr=stderr, width=PIPED_WIDTH)


console = _console()
err = _console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from multimaster import __version__

        console.print(f"multimaster {__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version of multimaster and exit."
    ),
) -> None:
    """Update-anywhere asynchronous replication of SQL tables with triggers and snapshot logs."""


TOPOLOGY = typer.Option(..., "-t", "--topology", help="Topology file (YAML).", exists=False)
TRACEBACK = typer.Option(False, "--traceback", help="Show the Python traceback on errors.")


def not_reached(unreachable: dict[str, str]) -> int:
    """Name on stderr each site a listing could not read (site -> why; the others are listed all
    the same): 1 when there is one, else 0."""
    for why in unreachable.values():
        err.print(f"[bold red]not reached:[/] {escape(redact(why))}", markup=True, highlight=False, soft_wrap=True)
    return 1 if unreachable else 0


def execute(fn: Callable[[], Any], traceback: bool) -> Any:
    """Run a command's function: an error becomes one line on stderr (with `traceback`, the Python
    traceback) and its exit code. No password the process has read appears in either
    (config/secrets.py): a driver's message may carry one."""
    try:
        return fn()
    except MultimasterError as e:
        if traceback:
            _traceback(e)
        else:
            err.print(f"[bold red]error:[/] {escape(redact(str(e)))}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None
    except Exception as e:  # noqa: BLE001 - an unexpected failure: one line unless asked
        if traceback:
            _traceback(e)
        else:
            err.print(
                f"[bold red]error:[/] {escape(redact(f'{type(e).__name__}: {e}'))}", markup=True, highlight=False, soft_wrap=True
            )
            err.print("(run again with --traceback for details)")
        raise typer.Exit(1) from None


def _traceback(e: BaseException) -> None:
    """Python's traceback of `e` (its causes included) on stderr, passwords masked."""
    sys.stderr.write(redact("".join(tb.format_exception(e))))
    sys.stderr.flush()


def dump(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def redraw(tables: Callable[[], Sequence[Any]], interval: float) -> NoReturn:
    """Show `tables()` every `interval` seconds until interrupted: redrawn in place on a terminal;
    elsewhere (a pipe, a log file) printed anew each time under a line with the time, so a reader
    of the output sees every drawing as it is made, not all of them at the end."""
    import time

    from rich.console import Group
    from rich.live import Live

    if not console.is_terminal:
        while True:
            console.print(f"-- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", markup=False, highlight=False)
            for t in tables():
                console.print(t)
            console.file.flush()
            time.sleep(interval)
    with Live(Group(*tables()), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval)
            live.update(Group(*tables()))
