"""The main job: three SQLite sites, writes everywhere, refresh until they converge.

Applications write with the plain sqlite3 module (as any program would); multimaster replicates.
The workload (faker, seeded) has inserts at every site at the same time (their auto-counter keys
collide and are renumbered), updates, deletes, concurrent edits of the same rows, and the airline
case of the locking-schemes survey: two sites sell the last seat of a flight.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

from faker import Faker
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from multimaster.config.topology import load_topology
from multimaster.engine.cluster import Cluster
from multimaster.engine.refresh import refresh
from multimaster.ops.install import init
from multimaster.ops.status import conflicts, status

SITES = ("s1", "s2", "s3")
CITIES = {"s1": "New York", "s2": "Los Angeles", "s3": "Chicago"}

TOPOLOGY = """\
# The demo cluster: three SQLite sites, every site pulls from every other (mesh).
sites:
  s1: {url: "sqlite:///s1.db"}   # New York
  s2: {url: "sqlite:///s2.db"}   # Los Angeles
  s3: {url: "sqlite:///s3.db"}   # Chicago
tables:
  customers:
    key: id                      # auto-counter: renumbered to global insertion order
    policy: latest               # concurrent edits: the latest timestamp wins, per column
    groups:
      address: {columns: [street, city], policy: latest}   # street and city win together
  flights:
    key: id
    columns:
      seats_left: additive      # two sites each selling a seat both count
      last_passenger: latest
links: mesh
"""

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, email TEXT, street TEXT, city TEXT,
                        tier TEXT, balance REAL NOT NULL DEFAULT 0);
CREATE TABLE flights (id INTEGER PRIMARY KEY AUTOINCREMENT, code TEXT NOT NULL, seats_left INTEGER NOT NULL, last_passenger TEXT);
"""


def _connect(path: Path) -> sqlite3.Connection:
    c = sqlite3.connect(path, timeout=30)
    c.execute("PRAGMA busy_timeout = 30000")
    return c


def _rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as c:
        return c.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


def run_demo(directory: Path, *, seed: int = 7, size: int = 200, console: Console | None = None) -> dict[str, Any]:
    say = console.print if console else (lambda *_a, **_k: None)
    rnd = random.Random(seed)
    fake = Faker()
    Faker.seed(seed)
    directory = Path(directory)
    paths = _create_sites(directory)
    topo = load_topology(directory / "topology.yaml")
    t0 = time.perf_counter()
    init_rep = init(topo)
    say(f"[bold]3 SQLite sites in {directory}[/]: installed; base rows copied from s1: {init_rep.copied}")

    # ---- the workload: applications at each site, plain sqlite3 -------------------------------
    changes: Counter[str] = Counter()
    conns = {s: _connect(p) for s, p in paths.items()}
    _workload(conns, changes, rnd, fake, size, console)
    # refresh once so every site shares the customers, then make deliberate conflicts
    totals: Counter[str] = Counter()
    with Cluster(topo) as cl:
        _count_refresh(refresh(cl), totals)
        _make_conflicts(conns, changes)
        for c in conns.values():
            c.close()
        # ---- replicate until quiet -----------------------------------------------------------
        rounds = 1  # the refresh before the deliberate conflicts
        while rounds < 20:
            rounds += 1
            res = refresh(cl)
            _count_refresh(res, totals)
            if all(r.pulled == 0 for r in res):
                break
        st = status(cl)
        conf = conflicts(cl, limit=0)
    elapsed = time.perf_counter() - t0
    # ---- compare the sites row by row ------------------------------------------------------------
    comparison = _compare(paths)
    mm100 = _rows(paths["s1"], "flights")[0]
    converged = all(v["identical"] for v in comparison.values()) and st.get("converging", False)
    by_kind = Counter((c["tbl"], c["kind"], c["policy"], c["decision"]) for c in conf)
    report = {
        "directory": str(directory),
        "changes_per_site": dict(changes),
        "rounds": rounds,
        "seconds": round(elapsed, 2),
        "pulled": totals["pulled"],
        "applied": totals["applied"],
        "conflicts": [
            {"table": k[0], "kind": k[1], "policy": k[2], "decision": k[3], "count": n} for k, n in sorted(by_kind.items())
        ],
        "comparison": comparison,
        "last_seat": {"flight": mm100[1], "seats_left": mm100[2], "last_passenger": mm100[3], "overbooked": mm100[2] < 0},
        "converged": converged,
    }
    if console:
        _print_report(console, report, conf, paths)
    return report


def _create_sites(directory: Path) -> dict[str, Path]:
    """A fresh `directory` with the topology file and the three site databases, the common base
    rows at s1 only (init copies them to the empty sites). Returns each site's database file."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / "topology.yaml").write_text(TOPOLOGY)
    paths = {s: directory / f"{s}.db" for s in SITES}
    # the common base, at s1 only: init copies it to the empty sites
    for s, p in paths.items():
        with _connect(p) as c:
            c.executescript(SCHEMA)
            if s == "s1":
                c.executemany(
                    "INSERT INTO flights (code, seats_left) VALUES (?, ?)", [("MM100", 1), ("MM200", 10), ("MM300", 42)]
                )
    return paths


def _workload(
    conns: dict[str, sqlite3.Connection],
    changes: Counter[str],
    rnd: random.Random,
    fake: Faker,
    size: int,
    console: Console | None,
) -> None:
    """Applications at every site at once: `size` rounds of inserts at each site (their keys
    collide), every fifth round an update, every 25th a delete. Counts the changes per site."""
    progress = Progress(disable=console is None, console=console)
    with progress:
        task = progress.add_task("workload", total=size * len(SITES))
        for i in range(size):
            for s in SITES:
                c = conns[s]
                c.execute(
                    "INSERT INTO customers (name, email, street, city, tier, balance) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        fake.name(),
                        fake.email(),
                        fake.street_address(),
                        CITIES[s],
                        rnd.choice(["basic", "gold"]),
                        round(rnd.uniform(0, 500), 2),
                    ),
                )
                changes[s] += 1
                if i % 5 == 4:
                    ids = [r[0] for r in c.execute("SELECT id FROM customers ORDER BY random() LIMIT 2")]
                    if ids:
                        c.execute(
                            "UPDATE customers SET tier = ?, balance = balance + 10 WHERE id = ?",
                            (rnd.choice(["gold", "platinum"]), ids[0]),
                        )
                        changes[s] += 1
                    if len(ids) > 1 and i % 25 == 24:
                        c.execute("DELETE FROM customers WHERE id = ?", (ids[1],))
                        changes[s] += 1
                c.commit()
                progress.advance(task)


def _make_conflicts(conns: dict[str, sqlite3.Connection], changes: Counter[str]) -> None:
    """Deliberate conflicts on rows every site shares: edits of the same customer, of different
    columns of another, a delete against an update, and the last seat of a flight sold twice."""
    shared = [r[0] for r in conns["s1"].execute("SELECT id FROM customers ORDER BY id LIMIT 5")]
    for s in SITES:
        c = conns[s]
        # everyone edits the same customer: latest timestamp wins, per column
        c.execute("UPDATE customers SET tier = ? WHERE id = ?", (f"edited-at-{s}", shared[0]))
        # s1 moves customer 2, s2 renames them: different columns, both survive
        if s == "s1":
            c.execute("UPDATE customers SET street = ?, city = ? WHERE id = ?", ("1 Main St", "Boston", shared[1]))
        if s == "s2":
            c.execute("UPDATE customers SET name = ? WHERE id = ?", ("Renamed At LA", shared[1]))
        # s3 deletes customer 3 while s1 updates it: the delete wins
        if s == "s3":
            c.execute("DELETE FROM customers WHERE id = ?", (shared[2],))
        if s == "s1":
            c.execute("UPDATE customers SET balance = balance + 100 WHERE id = ?", (shared[2],))
        c.commit()
        changes[s] += 2
    # the airline case: one seat left on MM100; New York and Los Angeles both sell it
    for s, who in (("s1", "Ada (NY)"), ("s2", "Grace (LA)")):
        conns[s].execute("UPDATE flights SET seats_left = seats_left - 1, last_passenger = ? WHERE code = 'MM100'", (who,))
        conns[s].commit()
        changes[s] += 1
    # everyone sells a seat on MM200 (10 seats): additive leaves 7
    for s in SITES:
        conns[s].execute("UPDATE flights SET seats_left = seats_left - 1 WHERE code = 'MM200'")
        conns[s].commit()
        changes[s] += 1


def _count_refresh(results: list[Any], totals: Counter[str]) -> None:
    """Add the changes pulled and applied by one refresh of every link to `totals`."""
    for r in results:
        totals["pulled"] += r.pulled
        totals["applied"] += r.applied


def _compare(paths: dict[str, Path]) -> dict[str, Any]:
    """Per table, the rows at each site and whether every site holds exactly the rows of s1."""
    comparison = {}
    for tb in ("customers", "flights"):
        data = {s: _rows(paths[s], tb) for s in SITES}
        same = all(data[s] == data["s1"] for s in SITES)
        comparison[tb] = {"rows": {s: len(v) for s, v in data.items()}, "identical": same}
    return comparison


def _print_report(console: Console, rep: dict[str, Any], conf: list[dict[str, Any]], paths: dict[str, Path]) -> None:
    t = Table(title="changes made by applications")
    t.add_column("site")
    t.add_column("changes", justify="right")
    for s, n in rep["changes_per_site"].items():
        t.add_row(s, str(n))
    console.print(t)
    ct = Table(title=f"conflicts recorded ({sum(c['count'] for c in rep['conflicts'])} across the three sites)")
    for title in ("table", "kind", "policy", "decision", "count"):
        ct.add_column(title)
    for c in rep["conflicts"]:
        ct.add_row(c["table"], c["kind"], c["policy"], c["decision"], str(c["count"]))
    console.print(ct)
    ex = [c for c in conf if c["site"] == "s1"][:6]
    if ex:
        et = Table(title="examples (as seen at s1)")
        for title in ("table", "key", "columns", "local", "remote", "decision"):
            et.add_column(title)
        for c in ex:
            et.add_row(
                c["tbl"],
                str(c["key"]),
                ",".join(c["columns"]),
                f"{c['local_values']} from {(c['local_ver'] or '')[20:] or '-'}",
                f"{c['remote_values']} from {c['remote_ver'][20:]}",
                c["decision"],
            )
        console.print(et)
    ls = rep["last_seat"]
    console.print(
        f"[bold]last seat of {ls['flight']}[/]: sold at New York and at Los Angeles while they were apart; "
        f"after replication seats_left = {ls['seats_left']}"
        + (
            " → [red]overbooked[/]: both sales are kept and the conflict is in the log for the application to rebook."
            if ls["overbooked"]
            else ""
        )
    )
    rt = Table(title="sites compared row by row")
    rt.add_column("table")
    for s in SITES:
        rt.add_column(f"{s} rows", justify="right")
    rt.add_column("identical (keys and values)")
    for tb, v in rep["comparison"].items():
        rt.add_row(tb, *(str(v["rows"][s]) for s in SITES), "[green]yes[/]" if v["identical"] else "[red]NO[/]")
    console.print(rt)
    sample = {s: _rows(paths[s], "customers")[:4] for s in SITES}
    st = Table(title="first customers at each site (name / tier)")
    st.add_column("id")
    for s in SITES:
        st.add_column(s)
    for i in range(len(sample["s1"])):
        st.add_row(
            str(sample["s1"][i][0]), *(f"{sample[s][i][1]} / {sample[s][i][5]}" if i < len(sample[s]) else "-" for s in SITES)
        )
    console.print(st)
    console.print(
        f"{rep['rounds']} refresh rounds, {rep['pulled']} changes pulled, {rep['applied']} applied, {rep['seconds']} s — "
        + ("[bold green]all three sites converged[/]" if rep["converged"] else "[bold red]sites did not converge[/]")
    )
