"""SQL statements a refresh sends, per site (docs/performance.md "Statements per refresh").

    .venv/bin/python benchmarks/bench_statements.py                       # every database
    .venv/bin/python benchmarks/bench_statements.py --databases sqlite --log idle-warm

Over a WAN every statement is a round trip (50 ms each at 50 ms RTT), so their number, not their
time on this host, is what a refresh costs there. Two sites `a` and `b` of one table (`--tables N`:
N tables, the changes written to the first); the link
b -> a is refreshed and every statement the process sends is counted per site with SQLAlchemy's
`before_cursor_execute` event (an `executemany` counts once), and the transactions it ends
(`commit` and `rollback` events, each a round trip of its own) beside them as `+N`. Scenarios:

- `init`: `api.init` of both sites (installing the replication objects);
- `idle`: a refresh with nothing to pull; `1 change` / `100 changes`: a refresh pulling one change
  (an insert at b) or 100 (100 application transactions of one insert each);
- each one in the same process (`warm`: one `api.Cluster` kept open, as `multimaster run` keeps it,
  after a first refresh) and in a fresh process (`cold`: a new interpreter that opens the topology
  and refreshes once, as a one-shot `multimaster refresh` does; its tables are described anew).

`--log SCENARIO` (e.g. `idle-warm`, `1-cold`) prints the statements of that scenario, numbered,
per site, on the first database of `--databases`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

SPEC = {"key": "id", "columns": {"name": "text", "qty": "int"}}
SCENARIOS = ["idle", "1", "100"]


class Counted:
    """Statements (and transactions ended) per site while it is entered, keyed by the site's url."""

    def __init__(self, urls: dict[str, str], log: bool = False) -> None:
        self.by_url = {_norm(u): s for s, u in urls.items()}
        self.statements: Counter[str] = Counter()
        self.ends: Counter[str] = Counter()
        self.log: list[tuple[str, str]] | None = [] if log else None

    def _site(self, conn: Any) -> str:
        return self.by_url.get(_norm(str(conn.engine.url)), "?")

    def _stmt(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        s = self._site(conn)
        self.statements[s] += 1
        if self.log is not None:
            shown = "" if executemany or not params else f"  <- {params!r}"[:120]
            self.log.append((s, ("[many] " if executemany else "") + " ".join(statement.split()) + shown))

    def _end(self, conn: Any) -> None:
        s = self._site(conn)
        self.ends[s] += 1
        if self.log is not None:
            self.log.append((s, "-- end of transaction"))

    def __enter__(self) -> "Counted":
        event.listen(Engine, "before_cursor_execute", self._stmt)
        event.listen(Engine, "commit", self._end)
        event.listen(Engine, "rollback", self._end)
        return self

    def __exit__(self, *exc: Any) -> None:
        event.remove(Engine, "before_cursor_execute", self._stmt)
        event.remove(Engine, "commit", self._end)
        event.remove(Engine, "rollback", self._end)

    def cells(self) -> dict[str, list[int]]:
        return {s: [self.statements[s], self.ends[s]] for s in ("a", "b")}


def _norm(url: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return f"{u.get_backend_name()}|{u.host}|{u.port}|{u.database}"


def tables_of(n: int) -> dict[str, dict[str, Any]]:
    """The replicated tables: `t`, or `t0` ... `t<n-1>` (the changes go to the first)."""
    return {"t": SPEC} if n == 1 else {f"t{i}": SPEC for i in range(n)}


def write_changes(cl: Any, n: int) -> None:
    """`n` application transactions of one insert each at b (into the first table), on one connection."""
    c = cl.db("b")
    try:
        cur = c.cursor()
        p = cl.backend.param()
        for i in range(n):
            cur.execute(f"INSERT INTO {next(iter(cl.tables))} (name, qty) VALUES ({p}, {p})", (f"x{i}", i))
            c.commit()
    finally:
        c.close()


def refresh_counted(topo_or_cluster: Any, urls: dict[str, str], log: bool = False) -> Counted:
    from multimaster import api

    with Counted(urls, log) as c:
        res = api.refresh(topo_or_cluster, "a", "b")
    errors = [r.error for r in res if r.error]
    assert not errors, errors
    return c


def cold(topo_path: str, urls: dict[str, str], log: bool) -> Counted:
    """A refresh of b -> a in a fresh interpreter (this script with --cold), its counts read back."""
    out = subprocess.run(
        [sys.executable, __file__, "--cold", topo_path, "--urls", json.dumps(urls)] + (["--cold-log"] if log else []),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    c = Counted(urls, log)
    c.statements.update(got["statements"])
    c.ends.update(got["ends"])
    if log:
        c.log = [tuple(x) for x in got["log"]]  # type: ignore[misc]
    return c


def measure(db: str, log_scenario: str | None, n_tables: int = 1) -> dict[str, dict[str, list[int]]]:
    """Per scenario, per site: [statements, transactions ended]."""
    from clusters import BACKENDS, make_cluster

    from multimaster import api

    out: dict[str, dict[str, list[int]]] = {}
    logs: dict[str, Counted] = {}
    backend = BACKENDS[db]()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cl = make_cluster(backend, Path(tmp), ["a", "b"], tables_of(n_tables), init=False)
            with Counted(cl.urls, log_scenario == "init") as c:
                api.init(cl.topo)
            out["init"], logs["init"] = c.cells(), c
            with api.Cluster(cl.topo) as cluster:
                refresh_counted(cluster, cl.urls)  # described, the first pull done
                for sc in SCENARIOS:
                    for how in ("warm", "cold"):
                        name = f"{sc}-{how}"
                        write_changes(cl, 0 if sc == "idle" else int(sc))
                        run: Callable[[], Counted] = (
                            (lambda: refresh_counted(cluster, cl.urls, log_scenario == name))
                            if how == "warm"
                            else (lambda: cold(str(cl.topo.path), cl.urls, log_scenario == name))
                        )
                        logs[name] = run()
                        out[name] = logs[name].cells()
    finally:
        backend.cleanup()
    if log_scenario and logs.get(log_scenario) and logs[log_scenario].log is not None:
        for i, (site, sql) in enumerate(logs[log_scenario].log or [], 1):
            print(f"{i:4d} {site} {sql[:400]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--databases", default="sqlite,postgresql,mysql")
    ap.add_argument("--log", help="print the statements of one scenario: init, idle-warm, 1-cold, 100-warm, ...")
    ap.add_argument("--tables", type=int, default=1, help="replicated tables (the changes go to the first)")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON line as well")
    ap.add_argument("--cold", help=argparse.SUPPRESS)  # a fresh process's refresh of this topology file
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    ap.add_argument("--cold-log", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.cold:
        from multimaster.config.topology import load_topology

        urls = json.loads(a.urls)
        c = refresh_counted(load_topology(Path(a.cold)), urls, a.cold_log)
        print(json.dumps({"statements": dict(c.statements), "ends": dict(c.ends), "log": c.log}))
        return
    dbs = a.databases.split(",")
    cols = ["init"] + [f"{sc}-{how}" for sc in SCENARIOS for how in ("warm", "cold")]
    heads = {"init": "init", "idle-warm": "idle", "idle-cold": "idle cold", "1-warm": "1", "1-cold": "1 cold"}
    heads |= {"100-warm": "100", "100-cold": "100 cold"}
    print(f"statements at a + at b (+ transactions ended); the link b -> a, {a.tables} table(s)")
    print(f"{'database':10}" + "".join(f"{heads[c]:>20}" for c in cols))
    everything = {}
    for i, db in enumerate(dbs):
        got = measure(db, a.log if i == 0 else None, a.tables)
        everything[db] = got
        cells = []
        for c in cols:
            (sa, ea), (sb, eb) = got[c]["a"], got[c]["b"]
            cells.append(f"{sa}+{sb} (+{ea + eb})")
        print(f"{db:10}" + "".join(f"{x:>20}" for x in cells), flush=True)
    if a.json:
        print(json.dumps(everything))


if __name__ == "__main__":
    main()
