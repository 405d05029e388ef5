"""An idle refresh (nothing to pull) sends a bounded number of SQL statements to each site.

Over a WAN every statement is a round trip: at 50 ms RTT the 70-80 statements an idle refresh of
two tables sent to its two sites before session 37 were 3.5-4 s of waiting for nothing, every
refresh interval, and a fresh process (a one-shot `multimaster refresh`) paid 100-120. Session 37
took out what was read twice (catalogue checks of the bookkeeping tables once per refresh,
dialects/base.py catalog_once; the schema versions, watermarks, purge horizons, waiting changes
and MariaDB's table signatures in one statement for every table; three tables that are almost
always empty asked together; a fresh process's description of a table reading its versions once)
and the transactions that did nothing (docs/performance.md "Statements per refresh",
benchmarks/bench_statements.py).

The bounds are the counts measured after that work plus MARGIN, per database, for the link
b -> a of two tables, in a process that described the tables already (as `multimaster run` keeps
them) and in a new one (as a one-shot `refresh`). A change that adds a statement per refresh or
per table to this path fails here: fold it into a read that is made anyway, or raise the bound
here saying why it is worth a round trip over a WAN. Counted with SQLAlchemy's
`before_cursor_execute` event (an executemany counts once; SQLite's BEGIN is a statement)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from clusters import Backend, make_cluster
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url

from multimaster import api

TABLES = {f"t{i}": {"key": "id", "columns": {"name": "text", "qty": "int"}} for i in range(2)}

#: statements measured at (target a, source b) after session 37: an idle refresh in a process
#: that described the tables already, and in a new one (before: warm 43+28, 34+22, 36+28; new
#: 67+52, 59+47, 55+47 for SQLite, PostgreSQL, MariaDB)
MEASURED = {
    "sqlite": {"warm": (24, 16), "new": (45, 37)},
    "postgresql": {"warm": (17, 12), "new": (38, 33)},
    "mysql": {"warm": (17, 16), "new": (32, 31)},
}
#: room for a statement or two that a change needs (a new check, a new bookkeeping read), not for
#: one per table per kind again
MARGIN = 3


def _key(url: Any) -> tuple[Any, ...]:
    u = make_url(str(url))
    return (u.get_backend_name(), u.host, u.port, u.database)


def _counted(cl: Any, run: Any) -> dict[str, list[str]]:
    """The statements each site of `cl` was sent while `run()` ran."""
    sites = {_key(u): s for s, u in cl.urls.items()}
    got: dict[str, list[str]] = defaultdict(list)

    def record(conn: Any, _cur: Any, statement: str, *_: Any) -> None:
        site = sites.get(_key(conn.engine.url))
        if site is not None:
            got[site].append(" ".join(statement.split())[:160])

    event.listen(Engine, "before_cursor_execute", record)
    try:
        run()
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    return got


def _refreshed(res: list[Any]) -> None:
    assert [r.error for r in res if r.error] == []
    assert sum(r.pulled for r in res) == 0


def _check(backend: Backend, how: str, got: dict[str, list[str]]) -> None:
    for site, measured in zip(("a", "b"), MEASURED[backend.name][how]):
        n = len(got[site])
        shown = "\n".join(f"  {i:3d} {s}" for i, s in enumerate(got[site], 1))
        assert n <= measured + MARGIN, (
            f"an idle refresh ({how}) sent {n} statements to site {site}, measured {measured} (+{MARGIN}):\n{shown}"
        )


def test_an_idle_refresh_sends_few_statements(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["a", "b"], TABLES)
    cl.execute("b", "INSERT INTO t0 (name, qty) VALUES ('x', 1)")
    with api.Cluster(cl.topo) as c:
        assert sum(r.pulled for r in api.refresh(c, "a", "b")) == 1  # described, the change applied
        warm = _counted(cl, lambda: _refreshed(api.refresh(c, "a", "b")))
    new = _counted(cl, lambda: _refreshed(api.refresh(cl.topo, "a", "b")))  # a new Cluster: described anew
    _check(backend, "warm", warm)
    _check(backend, "new", new)
    assert cl.rows("a", "t0") == cl.rows("b", "t0")
