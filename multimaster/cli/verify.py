"""`multimaster verify`: the Typer command function (registered by multimaster/cli.py).

    app.command("verify")(verify_command)

Exit codes: 0 converged, 1 not converged (differences found), 2 error (bad topology, unreachable
site, missing Java / PySpark / JDBC jar: the message says exactly what to install; a site whose
repair failed with --apply: named after the output, the other sites repaired).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, List, Optional

import typer

from multimaster.spark.api import DEFAULT_BUCKETS, DEFAULT_PARTITIONS, DEFAULT_SAMPLE

__all__ = ["verify_command", "app", "main"]


def _fail(msg: str, traceback: bool = False) -> None:
    """The error, one line on stderr, exit 2; with `traceback`, the Python traceback of the
    exception being handled first (passwords masked, as every command does: cli/common.py)."""
    from multimaster.config.secrets import redact

    if traceback and sys.exc_info()[1] is not None:
        import traceback as tb

        sys.stderr.write(redact("".join(tb.format_exception(sys.exc_info()[1]))))
    typer.echo(f"error: {redact(msg)}", err=True)
    raise typer.Exit(2)


def verify_command(
    topology: Path = typer.Option(..., "-t", "--topology", help="Topology file (YAML).", exists=False),
    table: Optional[List[str]] = typer.Option(None, "--table", help="Table to check (repeatable; default: all)."),
    master: str = typer.Option("local[*]", "--master", help="Spark master: local[*], local[N] or spark://host:7077."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a self-contained HTML report here."),
    checksum_only: bool = typer.Option(
        False, "--checksum-only", help="Hash key ranges first; compare rows only where hashes differ."
    ),
    partitions: int = typer.Option(DEFAULT_PARTITIONS, "--partitions", min=1, help="JDBC reads per site (split by key range)."),
    sample: int = typer.Option(DEFAULT_SAMPLE, "--sample", min=0, help="Differing rows shown per kind."),
    buckets: int = typer.Option(DEFAULT_BUCKETS, "--buckets", min=1, help="Key ranges hashed per site with --checksum-only."),
    repair_from: Optional[str] = typer.Option(None, "--repair-from", help="Plan making every other site equal to SITE."),
    apply: bool = typer.Option(False, "--apply/--dry-run", help="With --repair-from: apply the plan (default: only show it)."),
    record: bool = typer.Option(
        False,
        "--record",
        help="Store the result (or the error) in _mm_verifications at the verify site, where 'multimaster status' shows it.",
    ),
    traceback: bool = typer.Option(False, "--traceback", help="Show the Python traceback on errors."),
) -> None:
    """Check that all sites hold the same rows (Spark over JDBC); optionally repair from one site."""
    import time

    from multimaster.core.versions import started_at_now
    from multimaster.errors import ConfigError, MultimasterError
    from multimaster.spark.jdbc import MissingDependency

    started = started_at_now()
    t0 = time.perf_counter()

    def store(res=None, error: Optional[str] = None) -> None:
        """--record: keep the final result (after a repair, the verify run after it) or the error."""
        _store(topology, res, error, started, t0, as_json)

    def failed(msg: str, recordable: bool = True) -> None:
        if record and recordable:
            store(error=msg)
        _fail(msg, traceback)

    try:
        res = _verify(
            topology, table or None, master, partitions, sample, checksum_only, buckets, repair_from, apply, report, as_json
        )
    except MissingDependency as e:
        failed(str(e))
    except ConfigError as e:  # a bad topology or option: not a run worth recording
        _fail(str(e), traceback)
    except MultimasterError as e:
        failed(str(e))
    except Exception as e:  # noqa: BLE001 - Spark/JDBC failures: one line, exit 2
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        failed(f"verify failed: {type(e).__name__}: {msg[:500]}")
    if record:
        store(res)
    raise typer.Exit(res.exit_code)


def _store(topology: Path, res: Any, error: str | None, started: str, t0: float, as_json: bool) -> None:
    """Store the result (or the error) in _mm_verifications at the verify site, with the time since
    `t0` (time.perf_counter()); exit 2 when that fails."""
    import time

    from multimaster.config.topology import load_topology
    from multimaster.ops import verifications

    try:
        vid = verifications.store(
            load_topology(topology), res, error=error, started_at=started, seconds=time.perf_counter() - t0, source="manual"
        )
    except Exception as e:  # noqa: BLE001 - the verify site may be what is down
        msg = str(getattr(e, "orig", e)).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        _fail(f"the result could not be recorded: {type(e).__name__}: {msg[:500]}")
    if not as_json:
        typer.echo(f"recorded as verification {vid}", err=True)


def _verify(
    topology: Path,
    tables: list[str] | None,
    master: str,
    partitions: int,
    sample: int,
    checksum_only: bool,
    buckets: int,
    repair_from: str | None,
    apply: bool,
    report: Path | None,
    as_json: bool,
) -> Any:
    """Check the sites (and repair from `repair_from` when asked), print the result (or, with
    `as_json`, the JSON document), write the HTML `report`. Returns the final result."""
    from multimaster.spark import api
    from multimaster.spark import report as rep

    def run() -> Any:
        return api.verify(
            str(topology),
            tables=tables,
            master=master,
            partitions=partitions,
            sample_limit=sample,
            checksum_only=checksum_only,
            buckets=buckets,
        )

    res = run()
    failure: Exception | None = None
    out: dict = {"verify": res.to_dict()}
    if not as_json:
        rep.render_rich(res)
    if repair_from is not None:
        after, failure = _repair(topology, tables, master, partitions, repair_from, apply, as_json, out, run)
        if after is not None:
            res = after
    if report is not None:
        report.write_text(rep.to_html(res))
        if not as_json:
            typer.echo(f"HTML report written to {report}")
    if as_json:
        sys.stdout.write(json.dumps(out if repair_from else res.to_dict(), indent=2, default=str) + "\n")
    if failure is not None:  # after the output: which sites were repaired, which not
        raise failure
    return res


def _repair(
    topology: Path,
    tables: list[str] | None,
    master: str,
    partitions: int,
    repair_from: str,
    apply: bool,
    as_json: bool,
    out: dict[str, Any],
    run: Callable[[], Any],
) -> tuple[Any, Exception | None]:
    """Plan making every site equal to `repair_from` and show it (into `out["repair"]`); with
    `apply`, apply it (each site in one transaction), show per site what was applied and what
    failed, and verify again (`run`): returns that result (else None) and, when some site's repair
    failed, the error to end with (after the output)."""
    from multimaster.spark import report as rep
    from multimaster.spark.repair import RepairFailed, apply_plan, plan_repair

    plan = plan_repair(str(topology), repair_from, tables, master=master, partitions=partitions)
    if not as_json:
        rep.render_plan(plan, apply=apply)
    out["repair"] = {"plan": plan.to_dict(), "applied": False}
    if apply and plan.total:
        done = apply_plan(str(topology), plan, check=False)
        out["repair"]["applied"] = done.ok
        out["repair"]["sites"] = done.to_dict()["sites"]
        if not as_json:
            rep.render_repair(done)
        res = run()
        out["after"] = res.to_dict()
        if not as_json:
            typer.echo("After the repair:")
            rep.render_rich(res)
        # rows left for a value a site cannot store (named above) fail no site: the verify after
        # the repair, diverged on them, exits 1
        return res, (RepairFailed(done) if done.failed else None)
    return None, None


app = typer.Typer(add_completion=False, help="multimaster Spark convergence checker")
app.command("verify")(verify_command)


@app.callback()
def _root() -> None:
    """(Entry point used until `multimaster verify` is registered in multimaster/cli.py.)"""


def main() -> None:
    app()
