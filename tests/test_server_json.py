"""JSON values and PostgreSQL intervals replicate exactly (docs/types.md): the JSON value (objects,
arrays, numbers, strings, true/false, JSON null apart from SQL NULL, nested, Unicode) between
PostgreSQL json / jsonb, MariaDB JSON and SQLite JSON / TEXT columns, through the planner and the
set-based fast path; a value a site cannot take is held for that change alone. Before: a JSON
object was held at PostgreSQL ("cannot adapt type 'dict'"), a JSON string failed the whole link,
MariaDB's JSON was taken for text (init refused a mixed cluster) and an interval arrived with its
months folded into days.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, apply_path, mm

pytestmark = pytest.mark.server

#: every kind of JSON value, as an application writes it
VALUES = [
    '{"a": 1, "b": [true, false, null], "c": {"d": "\u00e9 \U0001f600 \\u4e2d"}, "e": 1.50}',
    '[1, 2.5, "x", [], {}]',
    "5",
    "-1.25e3",
    '"s"',
    '"5"',
    "true",
    "false",
    "null",
    None,  # SQL NULL
    '{"nested": {"deeper": [[{"k": "\\"quoted\\""}]]}}',
]

DDL = {
    # doc: the database's JSON type; j2: another spelling of it (PostgreSQL json, MariaDB's LONGTEXT
    # with the json_valid CHECK its JSON type is, SQLite TEXT with the same CHECK)
    "sqlite": 'CREATE TABLE docs (k TEXT PRIMARY KEY, doc JSON, j2 TEXT CHECK (j2 IS NULL OR json_valid(j2)), "t" JSON)',
    "postgresql": 'CREATE TABLE docs (k TEXT PRIMARY KEY, doc JSONB, j2 JSON, "t" JSONB)',
    "mysql": "CREATE TABLE docs (k VARCHAR(64) COLLATE utf8mb4_bin PRIMARY KEY, doc JSON, j2 LONGTEXT CHECK (json_valid(j2)), t JSON)",
}
BACKEND_OF = {"lite": "sqlite", "pg": "postgresql", "maria": "mysql"}


def _canon(v: Any) -> Any:
    """A JSON value whatever its spelling: numbers by value."""
    if v is None:
        return ("SQL NULL",)
    if isinstance(v, (int, float)):
        v = json.dumps(v)
    return ("json", _key(json.loads(v, parse_float=Decimal)))


def _key(d: Any) -> Any:
    if isinstance(d, bool) or d is None or isinstance(d, str):
        return (type(d).__name__, d)
    if isinstance(d, (int, Decimal)):
        return ("num", Decimal(d).normalize())
    if isinstance(d, list):
        return ("list", tuple(_key(x) for x in d))
    return ("obj", tuple(sorted((k, _key(x)) for k, x in d.items())))


def _sql(cn: Any, name: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    cur = cn.cursor()
    cur.execute(sql.replace("?", "%s") if name != "sqlite" else sql, params)
    rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
    cn.commit()
    return rows


def _write_topology(tmp: Path, urls: dict[str, str], table: str = "docs") -> Path:
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {table: {"key": "k"}}, "links": "mesh"}
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _read(backends: dict[str, Backend], urls: dict[str, str], site: str) -> dict[str, tuple[Any, ...]]:
    name = BACKEND_OF.get(site, "postgresql")
    cn = backends[name].connect(urls[site])
    try:
        cols = "k, doc::text, j2::text, t::text" if name == "postgresql" else "k, doc, j2, t"
        return {r[0]: tuple(_canon(v) for v in r[1:]) for r in _sql(cn, name, f"SELECT {cols} FROM docs ORDER BY k")}
    finally:
        cn.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fastpath", "planner"])
def test_json_values_cross_the_three_databases(mixed, tmp_path, fast):  # type: ignore[no-untyped-def]
    urls = {}
    for site, name in BACKEND_OF.items():
        urls[site] = mixed[name].new_site(tmp_path, site)
        cn = mixed[name].connect(urls[site])
        _sql(cn, name, DDL[name])
        cn.close()
    topo = _write_topology(tmp_path, urls)
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0, r.stderr  # MariaDB's JSON is json, not text; SQLite's TEXT takes JSON
    expected: dict[str, tuple[Any, ...]] = {}
    for site, name in BACKEND_OF.items():
        cn = mixed[name].connect(urls[site])
        for i, v in enumerate(VALUES):
            _sql(cn, name, "INSERT INTO docs (k, doc, j2, t) VALUES (?, ?, ?, ?)", (f"{site}-{i}", v, v, v))
            expected[f"{site}-{i}"] = (_canon(v),) * 3
        cn.close()
    restore = apply_path(fast)
    try:
        r = mm("refresh", "-t", str(topo), "--until-quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        r = mm("errors", "-t", str(topo), "--json")
        assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout
        for site in urls:
            assert _read(mixed, urls, site) == expected, site
        # JSON null is a value, not SQL NULL, everywhere
        for site in urls:
            got = _read(mixed, urls, site)
            assert got["pg-8"][0] == ("json", ("NoneType", None)) and got["pg-9"][0] == ("SQL NULL",), site
        # updates of rows another database spelled: no conflict (the same JSON value), exact values
        updates = {
            "pg": ("maria-0", '{"z": [1, {"y": null}]}'),
            "maria": ("pg-1", '"now a string"'),
            "lite": ("pg-0", "[false]"),
        }
        for site, (k, v) in updates.items():
            name = BACKEND_OF[site]
            cn = mixed[name].connect(urls[site])
            _sql(cn, name, "UPDATE docs SET doc = ?, j2 = ?, t = ? WHERE k = ?", (v, v, v, k))
            cn.close()
            expected[k] = (_canon(v),) * 3
        r = mm("refresh", "-t", str(topo), "--until-quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        for site in urls:
            assert _read(mixed, urls, site) == expected, site
        r = mm("conflicts", "-t", str(topo), "--json")
        assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout
    finally:
        restore()


def test_text_that_is_not_json_is_held_for_that_change(mixed, tmp_path):  # type: ignore[no-untyped-def]
    """A SQLite JSON column may hold text that is not JSON (SQLite does not check it): PostgreSQL
    (jsonb) and MariaDB (its json_valid CHECK) refuse it for that change alone, held in their error queues; the link goes
    on, other rows arrive, and `status` names the held changes (exit 1)."""
    urls = {}
    for site, name in BACKEND_OF.items():
        urls[site] = mixed[name].new_site(tmp_path, site)
        cn = mixed[name].connect(urls[site])
        _sql(cn, name, DDL[name])
        cn.close()
    topo = _write_topology(tmp_path, urls)
    assert mm("init", "-t", str(topo)).returncode == 0
    cn = mixed["sqlite"].connect(urls["lite"])
    _sql(cn, "sqlite", "INSERT INTO docs (k, doc, t) VALUES ('bad', 'not json', '1')")
    _sql(cn, "sqlite", "INSERT INTO docs (k, doc, t) VALUES ('good', '2', '\"fine\"')")
    cn.close()
    r = mm("refresh", "-t", str(topo), "--until-quiet")
    assert r.returncode == 1 and "holds 1 change(s) in its error queue" in r.stderr, r.stdout + r.stderr
    r = mm("errors", "-t", str(topo), "--json")
    held = json.loads(r.stdout)
    assert sorted(e["site"] for e in held) == ["maria", "pg"], held
    by_site = {e["site"]: e for e in held}
    for site in ("maria", "pg"):  # held as pulled, before the batch is stored (dialects/fit.py)
        assert "docs.doc (json)" in by_site[site]["error"] and "is not a JSON value" in by_site[site]["error"], held
    for site in ("pg", "maria"):
        got = _read(mixed, urls, site)
        assert "bad" not in got and got["good"][2] == ("json", ("str", "fine")), site
    assert mm("status", "-t", str(topo)).returncode == 1


#: hs has a collation: SQLAlchemy's reflection reads it as a JSON object, decoded by SQLAlchemy
#: although multimaster's connections read json as text
PG_DDL = (
    "CREATE TABLE x (k TEXT PRIMARY KEY, doc JSONB, j JSON, ja JSON[], dur INTERVAL, durs INTERVAL[], "
    'cash MONEY, hs TEXT COLLATE "C")'
)
PG_ROWS = [
    ("obj", '{"b": 1, "a": [1.50, null]}', '{"b":1,  "a" : "\u00e9"}', ['{"x": 1}', '"s"'], "1 year 2 mons 3 days 04:05:06.7"),
    ("arr", "[1, 2]", "[1,2]", ["null"], "-1 mons +1 day -00:00:01"),
    ("num", "5", "5.0", [], "30 days"),
    ("str", '"s"', '"s"', None, "1 mon"),
    ("null", "null", "null", ["null", "5"], "00:00:00.000001"),
    ("sqlnull", None, None, None, None),
]


@pytest.mark.parametrize("fast", [True, False], ids=["fastpath", "planner"])
def test_pure_postgresql_json_and_intervals_are_exact(pg_backend, tmp_path, fast):  # type: ignore[no-untyped-def]
    urls = {s: pg_backend.new_site(tmp_path, s) for s in ("p1", "p2")}
    for url in urls.values():
        with pg_backend.connect(url) as c:
            c.execute(PG_DDL)
            c.commit()
    topo = _write_topology(tmp_path, urls, "x")
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0, r.stderr
    with pg_backend.connect(urls["p1"]) as c:
        for k, doc, j, ja, dur in PG_ROWS:
            c.execute(
                "INSERT INTO x VALUES (%s, %s, %s, %s::json[], %s, ARRAY[%s, '1 mon']::interval[], %s, NULL)",
                (k, doc, j, ja, dur, dur, "12.34" if dur else None),
            )
        c.commit()

    def texts(site: str) -> list[tuple[Any, ...]]:
        with pg_backend.connect(urls[site]) as c:
            return [tuple(r) for r in c.execute("SELECT x::text FROM x ORDER BY k").fetchall()]

    restore = apply_path(fast)
    try:
        r = mm("refresh", "-t", str(topo), "--until-quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(mm("errors", "-t", str(topo), "--json").stdout) == []
        assert texts("p2") == texts("p1") and len(texts("p1")) == len(PG_ROWS)
        # updates at the other site: a json column (capture found no equality operator for json:
        # every update failed), an interval to an equal one ('1 mon' = '30 days' to PostgreSQL)
        with pg_backend.connect(urls["p2"]) as c:
            c.execute("UPDATE x SET j = '{\"b\":1, \"a\":\"\u00e9\"}', dur = '30 days' WHERE k = 'str'")
            c.execute(
                "UPDATE x SET doc = '\"other\"', ja = ARRAY['{}']::json[], durs = ARRAY['30 days']::interval[] WHERE k = 'null'"
            )
            c.execute("DELETE FROM x WHERE k = 'arr'")
            c.commit()
        r = mm("refresh", "-t", str(topo), "--until-quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        assert texts("p1") == texts("p2")
        with pg_backend.connect(urls["p1"]) as c:
            assert c.execute("SELECT dur::text, j::text FROM x WHERE k = 'str'").fetchone() == (
                "30 days",
                '{"b":1, "a":"\u00e9"}',
            )
        assert json.loads(mm("conflicts", "-t", str(topo), "--json").stdout) == []
    finally:
        restore()


def test_pure_mariadb_json(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    urls = {s: mysql_backend.new_site(tmp_path, s) for s in ("m1", "m2")}
    for url in urls.values():
        c = mysql_backend.connect(url)
        _sql(c, "mysql", DDL["mysql"])
        c.close()
    topo = _write_topology(tmp_path, urls)
    assert mm("init", "-t", str(topo)).returncode == 0
    c = mysql_backend.connect(urls["m1"])
    for i, v in enumerate(VALUES):
        _sql(c, "mysql", "INSERT INTO docs VALUES (?, ?, ?, ?)", (str(i), v, v, v))
    c.close()
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    c = mysql_backend.connect(urls["m2"])
    _sql(c, "mysql", "UPDATE docs SET doc = '{\"u\": 1}' WHERE k = '0'")
    c.close()
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0

    def rows(site: str) -> list[tuple[Any, ...]]:
        c = mysql_backend.connect(urls[site])
        try:
            return _sql(c, "mysql", "SELECT k, doc, j2, t FROM docs ORDER BY k")
        finally:
            c.close()

    assert rows("m1") == rows("m2") and len(rows("m1")) == len(VALUES)
    assert json.loads(mm("errors", "-t", str(topo), "--json").stdout) == []


def test_plain_sqlite_text_beside_json_is_refused_naming_the_fix(mixed, tmp_path):  # type: ignore[no-untyped-def]
    """A plain SQLite TEXT column would compare JSON by its spelling, which other databases change:
    init refuses it (exit 2), naming the table, column and what to declare instead."""
    urls = {}
    ddl = {**DDL, "sqlite": DDL["sqlite"].replace('"t" JSON', '"t" TEXT')}
    for site, name in BACKEND_OF.items():
        urls[site] = mixed[name].new_site(tmp_path, site)
        cn = mixed[name].connect(urls[site])
        _sql(cn, name, ddl[name])
        cn.close()
    r = mm("init", "-t", str(_write_topology(tmp_path, urls)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "column 't'" in r.stderr and "text at 'lite'" in r.stderr and "CHECK (json_valid" in r.stderr, r.stderr
    assert "column 'doc'" not in r.stderr and "column 'j2'" not in r.stderr


def test_same_json_compares_values_not_spellings() -> None:
    from multimaster.core.planner import same_json

    assert same_json('{"a": 1, "b": [1.50]}', '{"b":[1.5],"a":1}')
    assert same_json(5, "5") and same_json(1.5, "1.50") and same_json("-1250", -1250.0)
    assert not same_json("true", "1") and not same_json('"5"', "5") and not same_json("null", None)
    assert not same_json('{"a": 1}', '{"a": 1, "b": 2}') and not same_json("[1, 2]", "[2, 1]")
    assert same_json("not json", "not json") and not same_json("not json", "not  json")
    assert same_json(None, None)
