"""Rendering a VerifyResult: a rich summary for the terminal, JSON, and a self-contained HTML
report (inline CSS and SVG chart, no external assets)."""

from __future__ import annotations

import html
import json
from typing import Any

from multimaster.spark.result import KIND_LABELS, KINDS, Sample, TableResult, VerifyResult

__all__ = ["render_rich", "to_json", "to_html", "render_plan", "render_repair", "verdict"]

STATUS_STYLE = {"converged": "bold green", "converging": "bold yellow", "diverged": "bold red"}
_ON_ITS_WAY = {True: "yes", False: "<span class='bad'>no: diverged</span>"}
KIND_COLOR = {"missing": "#d62728", "extra": "#ff7f0e", "key": "#9467bd", "values": "#1f77b4"}


def _fmt(v: Any) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= 40 else s[:37] + "..."


def _sample_cell(x: Sample, e: dict[str, Any]) -> str:
    """One site's cell of a sampled identity: its key and values (the differing columns, else the
    first three) where present, else its state."""
    if e.get("state") == "present":
        vals = e.get("values", {})
        shown = {c: vals.get(c) for c in (x.columns or list(vals)[:3])}
        return f"key {e.get('key')} " + ", ".join(f"{c}={_fmt(v)}" for c, v in shown.items())
    return e.get("state", "unknown") + (f" (key {e['key']})" if "key" in e else "")


def _samples_table(name: str, t: TableResult, sites: list[str]) -> Any:
    """The Rich table of a table's sampled differing identities, one column per site."""
    from rich.table import Table

    st = Table(title=f"{name}: sample of differing rows ({len(t.samples)})")
    for c in ("kind", "rid", "counted at", "columns", *sites, "change on its way"):
        st.add_column(c, overflow="fold")
    for x in t.samples:
        cells = [_sample_cell(x, x.sites.get(s, {})) for s in sites]
        st.add_row(
            x.kind, x.rid, ", ".join(x.odd_sites), ", ".join(x.columns), *cells, "yes" if x.waiting else "[red]no: diverged[/]"
        )
    return st


def render_rich(res: VerifyResult, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = console or Console()
    style = STATUS_STYLE.get(res.status, "bold")
    con.print(
        f"[{style}]{res.status.upper()}[/] — {len(res.tables)} table(s), sites {', '.join(res.sites)}, "
        f"{res.mode} compare on {res.master} in {res.seconds:.1f}s"
    )
    summary = Table(title="Per table and site", show_lines=False)
    summary.add_column("table")
    summary.add_column("status")
    summary.add_column("site")
    summary.add_column("rows", justify="right")
    summary.add_column("fingerprint")
    for k in KINDS:
        summary.add_column(k, justify="right")
    for name, t in res.tables.items():
        for i, s in enumerate(res.sites):
            summary.add_row(
                name if i == 0 else "",
                f"[{STATUS_STYLE.get(t.status, '')}]{t.status}[/]" if i == 0 else "",
                s,
                f"{t.rows.get(s, 0):,}",
                t.fingerprints.get(s, ""),
                *[(f"[red]{t.counts[k][s]:,}[/]" if t.counts[k][s] else "0") for k in KINDS],
            )
    con.print(summary)
    for name, t in res.tables.items():
        if t.mode == "checksum":
            con.print(f"{name}: {t.buckets} key ranges hashed, {t.buckets_differing} differed and were compared row by row")
        waiting = [w for w in t.waiting if w.total or w.error]
        if waiting:
            wt = Table(title=f"{name}: changes still waiting")
            for c in ("link", "unpulled", "unapplied", "error"):
                wt.add_column(c)
            for w in waiting:
                wt.add_row(f"{w.source} → {w.target}", str(w.unpulled), str(w.unapplied), w.error or "")
            con.print(wt)
        if t.columns:
            con.print(
                f"{name}: differing columns: "
                + ", ".join(f"{c} ({n})" for c, n in sorted(t.columns.items(), key=lambda x: -x[1]))
            )
        if t.samples:
            con.print(_samples_table(name, t, res.sites))
        style = {"converged": "green", "converging": "yellow"}.get(t.status, "red")
        con.print(f"[{style}]{escape(verdict(name, t))}[/]", highlight=False)


def verdict(name: str, t: TableResult) -> str:
    """One sentence saying why table `name` has its status, naming the first differing row that no
    change on its way explains."""
    if t.status == "converged":
        return f"{name}: every site holds the same rows."
    if t.status == "converging":
        return (
            f"{name}: each of the {t.differing:,} differing row(s) has a change on its way "
            f"({t.waiting_total:,} change(s) waiting in all): not yet converged. Run refresh and verify again "
            "(a change held in a site's error queue is not applied by a refresh: 'multimaster errors' lists them, "
            "'errors retry' applies them once their cause is fixed)."
        )
    first = next((x for x in t.samples if not x.waiting), None)
    named = ""
    if first is not None:
        key = next((e["key"] for e in first.sites.values() if "key" in e), None)
        named = f" (first: identity {first.rid}" + (f", key {key}" if key is not None else "") + f", {KIND_LABELS[first.kind]})"
    return (
        f"{name}: {t.unexplained:,} of the {t.differing:,} differing row(s) have no change on its way{named}: "
        "diverged. Nothing in flight will fix them (see verify --repair-from)."
    )


def to_json(res: VerifyResult) -> str:
    return json.dumps(res.to_dict(), indent=2, default=str)


def _svg_chart(res: VerifyResult) -> str:
    """Grouped horizontal bars: differences per site (rows) and kind (colors), all tables summed."""
    totals = {s: {k: sum(t.counts[k][s] for t in res.tables.values()) for k in KINDS} for s in res.sites}
    mx = max([1] + [v for d in totals.values() for v in d.values()])
    bar_h, gap, left, width = 12, 10, 80, 420
    h = len(res.sites) * (len(KINDS) * bar_h + gap) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 80}" height="{h}" role="img" '
        f'aria-label="differences per site and kind">'
    ]
    y = 10
    for s in res.sites:
        out.append(f'<text x="0" y="{y + 2 * bar_h}" font-size="12" font-family="sans-serif">{html.escape(s)}</text>')
        for k in KINDS:
            v = totals[s][k]
            w = int(width * v / mx) if v else 0
            out.append(
                f'<rect x="{left}" y="{y}" width="{max(w, 1 if v else 0)}" height="{bar_h - 2}" fill="{KIND_COLOR[k]}">'
                f"<title>{html.escape(s)}: {v} {html.escape(KIND_LABELS[k])}</title></rect>"
            )
            out.append(f'<text x="{left + w + 4}" y="{y + bar_h - 3}" font-size="10" font-family="sans-serif">{v}</text>')
            y += bar_h
        y += gap
    x = 0
    for k in KINDS:
        out.append(
            f'<rect x="{x}" y="{y + 5}" width="10" height="10" fill="{KIND_COLOR[k]}"/>'
            f'<text x="{x + 14}" y="{y + 14}" font-size="11" font-family="sans-serif">{k}</text>'
        )
        x += 90
    out.append("</svg>")
    return "".join(out)


def to_html(res: VerifyResult) -> str:
    e = html.escape
    color = {"converged": "#2ca02c", "converging": "#e6a100", "diverged": "#d62728"}.get(res.status, "#333")
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>multimaster verify</title><style>",
        "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#f3f3f3}"
        ".num{text-align:right}.bad{color:#d62728;font-weight:bold}code{font-size:12px}",
        "</style></head><body>",
        f"<h1>multimaster verify: <span style='color:{color}'>{e(res.status)}</span></h1>",
        f"<p>{e(res.mode)} compare of sites {e(', '.join(res.sites))} on <code>{e(res.master)}</code>, "
        f"started {e(res.started_at)}, {res.seconds:.1f}s.</p>",
        "<h2>Differences per site and kind</h2>",
        _svg_chart(res),
        "<h2>Per table and site</h2><table><tr><th>table</th><th>status</th><th>site</th><th>rows</th><th>fingerprint</th>"
        + "".join(f"<th>{k}</th>" for k in KINDS)
        + "</tr>",
    ]
    for name, t in res.tables.items():
        for s in res.sites:
            parts.append(
                f"<tr><td>{e(name)}</td><td>{e(t.status)}</td><td>{e(s)}</td><td class='num'>{t.rows.get(s, 0):,}</td>"
                f"<td><code>{e(t.fingerprints.get(s, ''))}</code></td>"
                + "".join(f"<td class='num{' bad' if t.counts[k][s] else ''}'>{t.counts[k][s]:,}</td>" for k in KINDS)
                + "</tr>"
            )
    parts.append("</table>")
    for name, t in res.tables.items():
        parts.append(f"<p>{e(verdict(name, t))}</p>")
        waiting = [w for w in t.waiting if w.total or w.error]
        if waiting:
            parts.append(
                f"<h3>{e(name)}: changes still waiting</h3><table><tr><th>link</th><th>unpulled</th><th>unapplied</th><th>error</th></tr>"
            )
            for w in waiting:
                parts.append(
                    f"<tr><td>{e(w.source)} → {e(w.target)}</td><td class='num'>{w.unpulled}</td><td class='num'>{w.unapplied}</td><td>{e(w.error or '')}</td></tr>"
                )
            parts.append("</table>")
        if t.columns:
            parts.append(f"<p>{e(name)}: differing columns: " + ", ".join(f"{e(c)} ({n})" for c, n in t.columns.items()) + "</p>")
        if t.samples:
            parts.append(
                f"<h3>{e(name)}: sample of differing rows</h3><table><tr><th>kind</th><th>rid</th><th>counted at</th><th>columns</th>"
                + "".join(f"<th>{e(s)}</th>" for s in res.sites)
                + "<th>change on its way</th></tr>"
            )
            for x in t.samples:
                cells = []
                for s in res.sites:
                    ent = x.sites.get(s, {})
                    txt = ent.get("state", "unknown")
                    if "key" in ent:
                        txt += f", key {ent['key']}"
                    if ent.get("values"):
                        txt += ": " + json.dumps(ent["values"], default=str)
                    cells.append(f"<td><code>{e(txt)}</code></td>")
                parts.append(
                    f"<tr><td>{e(KIND_LABELS[x.kind])}</td><td><code>{e(x.rid)}</code></td><td>{e(', '.join(x.odd_sites))}</td>"
                    f"<td>{e(', '.join(x.columns))}</td>{''.join(cells)}<td>{_ON_ITS_WAY[x.waiting]}</td></tr>"
                )
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render_plan(plan, console=None, apply: bool = False) -> None:
    """The repair plan, per site and table: what `--apply` is about to apply (`apply`), or what a
    dry run would. Nothing is applied yet either way: render_repair tells what was."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
    verb = "plan, applying it now" if apply else "Dry run — would apply (use --apply)"
    t = Table(title=f"Repair from '{plan.reference}': {verb}")
    for c in ("site", "table", "delete", "insert", "rekey", "update"):
        t.add_column(c, justify="right" if c not in ("site", "table") else "left")
    counts = plan.counts()
    for site, tabs in counts.items():
        for table, c in tabs.items():
            t.add_row(site, table, *(str(c[o]) for o in ("delete", "insert", "rekey", "update")))
    if not counts:
        con.print(f"Nothing to repair: every site already equals '{plan.reference}'.")
        return
    con.print(t)


def render_repair(result, console=None) -> None:
    """What applying the plan did, per site: applied (with the ops per table) or failed (why)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = console or Console()
    t = Table(title=f"Repair from '{result.reference}': {'applied' if result.ok else 'FAILED at ' + ', '.join(result.failed)}")
    for c in ("site", "result", "table", "delete", "insert", "rekey", "update"):
        t.add_column(c, justify="right" if c in OPS_SHOWN else "left")
    for site, r in result.sites.items():
        status = "[green]applied[/]" if r.status == "applied" else "[red]failed: nothing changed[/]"
        for i, (table, c) in enumerate(r.counts.items() or [("", {})]):
            t.add_row(site if i == 0 else "", status if i == 0 else "", table, *(str(c.get(o, "")) for o in OPS_SHOWN))
    con.print(t)
    for site, r in result.failed.items():
        con.print(f"[red]site '{escape(site)}': the repair failed and was rolled back: {escape(r.error or '')}[/]")
    for u in result.unfit:
        con.print(escape(u["message"]), soft_wrap=True)


OPS_SHOWN = ("delete", "insert", "rekey", "update")
