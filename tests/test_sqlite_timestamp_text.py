"""A SQLite `TIMESTAMP` / `DATETIME` column holds text (docs/types.md): what a SQLite site's
application wrote reaches another SQLite site as the same text, and a server as the same value.

Before session 35 every such text was parsed and written again at a SQLite receiver:
'2026-11-30 10:00:00.362' arrived as '2026-11-30 10:00:00.362000', '2026-11-30T10:00' as
'2026-11-30 10:00:00', an offset as the UTC instant: another string than the application wrote,
at every SQLite peer."""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, made, make_cluster, mm, query

from multimaster import api

#: what a SQLite application writes -> the value a server's `timestamp` / DATETIME(6) holds
TEXTS = {
    "millis": ("2026-11-30 10:00:00.362", dt.datetime(2026, 11, 30, 10, 0, 0, 362000)),
    "T": ("2026-11-30T10:00:00", dt.datetime(2026, 11, 30, 10, 0, 0)),
    "minutes": ("2026-11-30 10:00", dt.datetime(2026, 11, 30, 10, 0)),
    "micros": ("2026-11-30 23:59:59.999999", dt.datetime(2026, 11, 30, 23, 59, 59, 999999)),
    "offset": ("2026-11-30 10:00:00.5+02:00", dt.datetime(2026, 11, 30, 8, 0, 0, 500000)),  # naive: in UTC
}


def _at(cl: Any, site: str) -> dict[str, Any]:
    return {r[1]: r[2] for r in cl.rows(site, "t")}


@pytest.mark.parametrize("decl", ["TIMESTAMP", "DATETIME"])
def test_sqlite_to_sqlite_keeps_the_text(sqlite_backend: Backend, tmp_path: Path, decl: str) -> None:
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], {"t": {"key": "id", "columns": {"note": "text", "at": decl}}})
    for note, (text, _v) in TEXTS.items():
        cl.execute("s1", "INSERT INTO t (note, at) VALUES (?, ?)", (note, text))
    cl.execute("s2", "INSERT INTO t (note, at) VALUES ('from s2', '2026-01-02 03:04:05.6')")
    cl.refresh_until_quiet()
    want = {note: text for note, (text, _v) in TEXTS.items()} | {"from s2": "2026-01-02 03:04:05.6"}
    for s in ("s1", "s2"):
        assert _at(cl, s) == want, s  # before: '2026-11-30 10:00:00.362000', ... at the peer
    # an update carries its text the same way (the fast path and the planner)
    cl.execute("s2", "UPDATE t SET at = '2027-01-01 00:00:00.1' WHERE note = 'millis'")
    cl.refresh_until_quiet()
    assert _at(cl, "s1")["millis"] == "2027-01-01 00:00:00.1"
    cl.assert_converged()
    assert all(r.pulled == 0 for r in api.refresh(cl.topo))


@pytest.fixture
def mixed():  # type: ignore[no-untyped-def]
    backends = {n: made(n) for n in ("sqlite", "postgresql", "mysql")}
    yield backends
    for b in backends.values():
        b.cleanup()


SITES = {"lite": "sqlite", "lite2": "sqlite", "pg": "postgresql", "maria": "mysql"}
DDL = {
    "sqlite": "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT, at TIMESTAMP)",
    "postgresql": "CREATE TABLE t (id SERIAL PRIMARY KEY, note TEXT, at TIMESTAMP)",
    "mysql": "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, note TEXT, at DATETIME(6))",
}


_sql = functools.partial(query, qmark=True)


def test_sqlite_text_reaches_servers_as_its_value_and_sqlite_as_its_text(mixed, tmp_path):  # type: ignore[no-untyped-def]
    urls = {}
    for site, name in SITES.items():
        urls[site] = mixed[name].new_site(tmp_path, site)
        _sql(mixed[name], urls[site], DDL[name])
    topo = tmp_path / "topology.yaml"
    topo.write_text(
        yaml.safe_dump({"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"})
    )
    assert mm("init", "-t", str(topo)).returncode == 0
    for note, (text, _v) in TEXTS.items():
        _sql(mixed["sqlite"], urls["lite"], "INSERT INTO t (note, at) VALUES (?, ?)", (note, text))
    r = mm("refresh", "-t", str(topo), "--until-quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert dict(_sql(mixed["sqlite"], urls["lite2"], "SELECT note, at FROM t")) == {n: t for n, (t, _v) in TEXTS.items()}
    for site in ("pg", "maria"):
        b = mixed[SITES[site]]
        assert dict(_sql(b, urls[site], "SELECT note, at FROM t")) == {n: v for n, (_t, v) in TEXTS.items()}, site
    # what a server writes reaches SQLite as ISO-8601 text of its value, as before
    _sql(mixed["postgresql"], urls["pg"], "INSERT INTO t (note, at) VALUES ('pg', '2026-11-30 10:00:00.362')")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    for site in ("lite", "lite2"):
        assert dict(_sql(mixed["sqlite"], urls[site], "SELECT note, at FROM t"))["pg"] == "2026-11-30 10:00:00.362000"
