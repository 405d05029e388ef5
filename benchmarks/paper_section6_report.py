"""docs/paper-section6.md and its figures from benchmarks/paper_section6.py's results.

    .venv/bin/python benchmarks/paper_section6_report.py [benchmarks/paper_section6.json]

The text after the line `<!-- reading -->` of an existing document (our reading of the results,
written by hand) is kept; everything before it is written anew.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- reading -->"
STRESS = ["X/9", "X/3", "X", "3X"]


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def _s(v: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _kb(v: int) -> str:
    return f"{v / 1e3:,.0f}"


def _answered(r: dict[str, Any]) -> str:
    sent = r.get("sent", r["requests"])
    return str(r["requests"]) if sent == r["requests"] else f"{r['requests']} of {sent} answered"


def _runs(runs: list[dict[str, Any]], net: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["net"] == net]


def _rep_avail(r: dict[str, Any]) -> float:
    """The master of the uni-directional model; the mean of the sites in the multi-directional one
    (the paper shows 'a representative server')."""
    if r["model"] == "uni":
        return float(r["sites"]["s1"]["available"])
    v = [s["available"] for s in r["sites"].values()]
    return float(sum(v) / len(v))


def _table(runs: list[dict[str, Any]]) -> str:
    head = (
        "| model | stress | updates | requests | run time (s) | after last request (s) | CPU available s1 / s2 / s3 | "
        "CPU use s1 / s2 / s3 (of its CPU) | replication kB | writes kB | wire kB | wait, all sites (s) | p95 (s) | "
        "wait, own site (s) | request answered (s) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = []
    for r in runs:
        av = " / ".join(_pct(s["available"]) for s in r["sites"].values())
        busy = " / ".join(_pct(s["busy"]) for s in r["sites"].values())
        lines.append(
            f"| {r['model']} | {r['stress']} | {r['updates']} % | {_answered(r)} | {r['run_time']:.1f}"
            f"{'' if r['reconciled'] else ' (not reconciled)'} | {r['tail']:.1f} | {av} | {busy} | "
            f"{_kb(r['bytes_replication'])} | {_kb(r['bytes_writes'])} | {_kb(r['bytes_wire'])} | {_s(r['wait_mean'], '{:.2f}')} | "
            f"{_s(r['wait_p95'], '{:.2f}')} | {_s(r['wait_own'], '{:.2f}')} | {_s(r['ack_mean'], '{:.2f}')} |"
        )
    return head + "\n".join(lines) + "\n"


def _setup_label(r: dict[str, Any]) -> str:
    return f"{r['stress']}\n{r['updates']}%"


def figures(runs: list[dict[str, Any]], img: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    made = []
    lan = _runs(runs, "lan")
    if lan:
        setups = sorted({(r["stress"], r["updates"]) for r in lan}, key=lambda k: (STRESS.index(k[0]), k[1]))
        by = {(r["model"], r["stress"], r["updates"]): r for r in lan}
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
        x = range(len(setups))
        w = 0.4
        for i, (model, color) in enumerate((("uni", "#4c72b0"), ("multi", "#dd8452"))):
            rt = [by[(model, *k)]["run_time"] if (model, *k) in by else 0 for k in setups]
            av = [100 * _rep_avail(by[(model, *k)]) if (model, *k) in by else 0 for k in setups]
            pos = [p + (i - 0.5) * w for p in x]
            left.bar(pos, rt, w, label=f"{model}-directional", color=color)
            right.bar(
                pos, av, w, label=f"{model}-directional" + (" (master)" if model == "uni" else " (mean of sites)"), color=color
            )
        for ax, title, ylabel in (
            (left, "Run time until reconciliation ended (LAN)", "seconds"),
            (right, "Server availability: CPU below 100 % (LAN)", "% of run time"),
        ):
            ax.set_xticks(list(x))
            ax.set_xticklabels([f"{s}\n{u}%" for s, u in setups], fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.set_ylabel(ylabel)
            ax.set_xlabel("stress / share of updates")
            ax.legend(fontsize=8)
        right.set_ylim(0, 105)
        fig.tight_layout()
        fig.savefig(img / "paper-fig8.png", dpi=110)
        plt.close(fig)
        made.append("paper-fig8.png")
    # Fig. 9: wait-time for the setups with 33 % and 67 % updates, LAN and WAN side by side
    nets = [n for n in ("lan", "wan") if any(r["net"] == n and r["updates"] in (33, 67) for r in runs)]
    if nets:
        fig, axes = plt.subplots(1, len(nets), figsize=(6.5 * len(nets), 4.2), squeeze=False)
        for ax, net in zip(axes[0], nets):
            rs = [r for r in _runs(runs, net) if r["updates"] in (33, 67)]
            setups = sorted({(r["stress"], r["updates"]) for r in rs}, key=lambda k: (STRESS.index(k[0]), k[1]))
            by = {(r["model"], r["stress"], r["updates"]): r for r in rs}
            w = 0.4
            for i, (model, color) in enumerate((("uni", "#4c72b0"), ("multi", "#dd8452"))):
                v = [by[(model, *k)]["wait_mean"] or 0 if (model, *k) in by else 0 for k in setups]
                ax.bar([p + (i - 0.5) * w for p in range(len(setups))], v, w, label=f"{model}-directional", color=color)
            ax.set_xticks(list(range(len(setups))))
            ax.set_xticklabels([f"{s}\n{u}%" for s, u in setups], fontsize=8)
            delay = next((r.get("delay") for r in rs if r.get("delay") is not None), None)
            ax.set_title(
                f"Wait-time for up-to-date data, {net.upper()}" + (f" ({delay:g} s one way)" if delay else ""), fontsize=10
            )
            ax.set_ylabel("seconds (mean over writes × sites)")
            ax.set_xlabel("stress / share of updates")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(img / "paper-fig9.png", dpi=110)
        plt.close(fig)
        made.append("paper-fig9.png")
    return made


def write_report(meta: dict[str, Any], runs: list[dict[str, Any]], doc: Path, img: Path) -> None:
    made = figures(runs, img)
    kept = ""
    if doc.exists() and MARK in doc.read_text():
        kept = doc.read_text().split(MARK, 1)[1]
    cmd = "benchmarks/paper_section6.py" + (" --quick" if meta.get("quick") else "")
    parts = [
        "# The paper's section 6, on three separate hosts\n",
        "Generated by `.venv/bin/python " + cmd + "` (tables and figures; the reading at the end is written by hand). "
        f"This run: X = **{meta['x']:.0f} requests/s**, {meta['duration']:g} s of requests per run, each site's CPU "
        f"capped at {meta['quota']:g} of a core, refresh interval {meta['interval']}, WAN delay {meta['wan_delay']:g} s "
        f"one way, {meta['seconds'] / 60:.1f} minutes in all.\n",
        "## Setup\n",
        "The paper (Ben-Chaim & Gal, section 6) ran three Oracle 8 servers on three single-CPU machines on a LAN, one "
        "replicated relation, and compared its multi-directional model with Oracle's uni-directional one (one master, "
        "read-only snapshots) at four stress levels (X/9, X/3, X, 3X, X being the request rate that brings a server to "
        "100 % CPU, about 32/s there) and four shares of updates (0, 33, 67, 100 %). It reports CPU availability, network "
        "usage, run time until reconciliation ended (Fig. 8) and the wait-time for up-to-date data at the nearest server, "
        "on the LAN and computed for a WAN with 5 s delay (Fig. 9).\n",
        "Here (`benchmarks/paper_section6.py`):\n",
        "- **Hosts**: three network namespaces, each with a veth pair to a bridge in a fourth (hub) namespace. Each "
        "holds one SQLite site, its agent (`multimaster serve`, bound to the host's address), its refresher daemon "
        "(`multimaster run --site`) and an application server that runs each user request as one single-row "
        "transaction. A site's three processes run in a CPU cgroup capped at "
        f"{meta['quota']:g} of a core: the paper's single-CPU server (the machine has 2 cores shared with other jobs).\n",
        "- **Network**: every connection from one host to another goes through a delaying TCP proxy in the connecting "
        "host (`benchmarks/delay_proxy.py`), which counts the bytes and delays every chunk by a fixed time in both "
        "directions: 0 on the LAN, 5 s one way on the WAN (a request and its answer: 10 s).\n",
        "- **Models**: *uni-directional*: s1 is the master, s2 and s3 are `read_only: true` and pull s1 (two links); the "
        "users at s2 and s3 send their requests to s1's application server across the network. *Multi-directional*: a "
        "mesh (six links); every user writes at its own site.\n",
        "- **Load**: one user per site, requests at a fixed rate (open loop: a user does not wait for an answer before "
        "the next request), the total of the three being the stress level times X. X is measured first: one site alone, "
        "16 requests outstanding, as many as it commits. A request inserts a row or updates one of the user's own "
        "earlier rows (the share of updates), so no two sites write the same row (the paper's experiment had no "
        "conflicts either). Each setup runs on the cluster left by the previous one (the paper started each run empty).\n",
        "- **Measures**: *CPU available*: the share of the run's 100 ms scheduler periods in which the site did not use "
        "up its CPU (the cgroup's `nr_throttled`: the paper's 'time in which the CPU is utilized at less than 100 %'); "
        "*CPU use*: its CPU time over the run, in shares of its cap. *Run time*: from the first request to the moment "
        "the last request is visible at every site. *Bytes*: counted in the proxies (application payload: the agents' "
        "HTTP for replication, the users' requests to the master), and on the wire (the hosts' veth counters, TCP/IP "
        "headers included). *Wait-time for up-to-date data*: for every request and every site, from the moment the "
        "user issued it to the moment a query at that site sees it (each site polled every 50 ms), averaged over "
        "requests × sites: what a user querying their nearest server waits for everybody's writes. *Own site*: the "
        "same at the requesting user's own site only (read-your-writes).\n",
    ]
    lan, wan = _runs(runs, "lan"), _runs(runs, "wan")
    if lan:
        parts += ["## LAN\n", _table(lan)]
    if "paper-fig8.png" in made:
        parts += [
            "![Fig. 8 reproduced: run time and server availability per setup](img/paper-fig8.png)\n",
            "*Fig. 8 reproduced (LAN): left, run time until reconciliation ended; right, CPU availability of the "
            "uni-directional master and the mean of the three multi-directional sites.*\n",
        ]
    if wan:
        parts += [f"## WAN ({meta['wan_delay']:g} s one way)\n", _table(wan)]
    if "paper-fig9.png" in made:
        parts += [
            "![Fig. 9 reproduced: wait-time for up-to-date data](img/paper-fig9.png)\n",
            "*Fig. 9 reproduced: mean wait-time for up-to-date data at the nearest site, setups with 33 % and 67 % updates.*\n",
        ]
    net = [
        (r["stress"], r["updates"], r["model"], r["bytes_replication"] + r["bytes_writes"], r["requests"])
        for r in lan
        if r["requests"]
    ]
    if net:
        uni = {(s, u): b / n for s, u, m, b, n in net if m == "uni"}
        multi = {(s, u): b / n for s, u, m, b, n in net if m == "multi"}
        ratios = [multi[k] / uni[k] for k in uni if k in multi and uni[k]]
        if ratios:
            parts.append(
                "**Network, LAN**: bytes per request (replication + requests sent to the master) multi ÷ uni: "
                + ", ".join(f"{r:.2f}" for r in ratios)
                + f" (median {sorted(ratios)[len(ratios) // 2]:.2f}; the paper: roughly n = 3).\n"
            )
    text = "\n".join(parts) + "\n" + MARK + (kept or "\n\n## Reading\n\n(to be written)\n")
    doc.write_text(text)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "paper_section6.json"
    data = json.loads(path.read_text())
    write_report(data["meta"], data["runs"], ROOT / "docs" / "paper-section6.md", ROOT / "docs" / "img")
