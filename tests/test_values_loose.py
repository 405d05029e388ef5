"""Values a column's kind does not hold, which SQLite keeps as they came ('12abc' in an INTEGER, a
blob in a TEXT, a time of day in a DATE, 2 in a BOOLEAN, an epoch number in a TIMESTAMP): each is
held at the site it cannot go to, for its change, naming the table, column, kind and value, with
the fix (docs/types.md "Values a site cannot store"). Never a link failure (before: the whole link
failed, every table, nothing named) and never a value changed on the way (before: the blob arrived
as its Python repr, the DATE lost its time, 2 became true)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, mm, query

from multimaster.dialects import types

# ---- the conversions, pure ----------------------------------------------------------------------


def _conv(kind: str, table: dict[str, Any] = types.NATIVE) -> Any:
    return types.adapter(table, kind)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("int", "12abc"),
        ("int", ""),
        ("int", 1.5),
        ("int", "NaN"),
        ("decimal", "12,50"),
        ("float", "abc"),
        ("text", b"\x00\xff"),
        ("date", "2024-06-01 13:45:00"),
        ("date", "2024/06/01"),
        ("bool", 2),
        ("bool", "maybe"),
        ("timestamp", 1717243200),
        ("timestamptz", "June 1st"),
    ],
)
def test_a_value_of_no_kind_the_column_holds_is_refused_naming_it(kind: str, value: Any) -> None:
    for table in (types.NATIVE, types.SQLITE):
        with pytest.raises(ValueError) as e:
            _conv(kind, table)(value)
        assert types.shown(value) in str(e.value)


def test_exact_conversions_still_convert() -> None:
    assert _conv("date")("2024-06-01 00:00:00") == dt.date(2024, 6, 1)  # midnight: nothing dropped
    assert _conv("date")(dt.datetime(2024, 6, 1)) == dt.date(2024, 6, 1)
    assert _conv("date", types.SQLITE)("2024-06-01") == "2024-06-01"
    assert [_conv("bool")(v) for v in ("true", " F ", "on", 0, 1, Decimal(1))] == [True, False, True, False, True, True]
    assert _conv("int")("12") == 12 and _conv("int", types.SQLITE)(Decimal("3.0")) == 3
    assert _conv("text")(12) == "12" and _conv("float")("1.5") == 1.5


# ---- a cluster of real databases ------------------------------------------------------------------


SITES = {"pg": "postgresql", "maria": "mysql", "lite": "sqlite"}
DDL = {
    "postgresql": [
        "CREATE TABLE t (id SERIAL PRIMARY KEY, note TEXT, n INTEGER, what TEXT, d DATE, ok BOOLEAN, at TIMESTAMP)",
        "CREATE TABLE other (id SERIAL PRIMARY KEY, s TEXT)",
    ],
    "mysql": [
        "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, note TEXT, n INTEGER, what TEXT, d DATE, ok BOOLEAN, at DATETIME(6))",
        "CREATE TABLE other (id INT AUTO_INCREMENT PRIMARY KEY, s TEXT)",
    ],
    "sqlite": [
        "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT, n INTEGER, what TEXT, d DATE, ok BOOLEAN, at TIMESTAMP)",
        "CREATE TABLE other (id INTEGER PRIMARY KEY AUTOINCREMENT, s TEXT)",
    ],
}


def _build(backends: dict[str, Backend], tmp: Path) -> tuple[Path, dict[str, str]]:
    urls = {}
    for site, name in SITES.items():
        urls[site] = url = backends[name].new_site(tmp, site)
        for stmt in DDL[name]:
            query(backends[name], url, stmt)
    doc = {
        "sites": {s: {"url": u} for s, u in urls.items()},
        "tables": {"t": {"key": "id"}, "other": {"key": "id"}},
        "links": "mesh",
    }
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(path)).returncode == 0
    return path, urls


LOOSE = {  # note -> the column and the SQLite literal it holds
    "text in int": ("n", "'12abc'"),
    "blob in text": ("what", "x'00ff'"),
    "time in date": ("d", "'2024-06-01 13:45:00'"),
    "2 in bool": ("ok", "2"),
    "epoch in timestamp": ("at", "1717243200"),
}


def test_loose_sqlite_values_are_held_by_name_and_the_rest_flows(mixed, tmp_path):  # type: ignore[no-untyped-def]
    topo, urls = _build(mixed, tmp_path)
    lite = mixed["sqlite"]
    for note, (col, lit) in LOOSE.items():
        query(lite, urls["lite"], f"INSERT INTO t (note, {col}) VALUES ('{note}', {lit})")
    query(lite, urls["lite"], "INSERT INTO t (note, n, d, ok) VALUES ('fine', 7, '2024-06-01 00:00:00', 'true')")
    query(lite, urls["lite"], "INSERT INTO other (s) VALUES ('unrelated')")

    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == []  # no link failed
    held = mm("errors", "-t", str(topo), "--json")
    by = {(e["site"], e["change"]["values"]["note"]): e["error"] for e in json.loads(held.stdout)}
    assert sorted(by) == sorted((s, note) for s in ("pg", "maria") for note in LOOSE), by
    for (site, note), err in by.items():
        col = LOOSE[note][0]
        assert f"site '{site}'" in err and f"t.{col} (" in err and "written at 'lite'" in err and "errors skip" in err, err
    assert "'12abc'" in by[("pg", "text in int")] and "b'\\x00\\xff'" in by[("maria", "blob in text")]
    assert "time of day" in by[("pg", "time in date")] and "1717243200" in by[("pg", "epoch in timestamp")]

    # the rest flowed, unchanged: the midnight DATE is exactly a date, 'true' a boolean
    for site in ("pg", "maria"):
        b = mixed[SITES[site]]
        assert query(b, urls[site], "SELECT note, n, d, ok FROM t") == [
            ("fine", 7, dt.date(2024, 6, 1), True if site == "pg" else 1)
        ]
        assert query(b, urls[site], "SELECT s FROM other") == [("unrelated",)]

    # retried as they are, they are still held (and named) at both sites
    assert mm("errors", "retry", "-t", str(topo), "--all").returncode == 1
    assert len(json.loads(mm("errors", "-t", str(topo), "--json").stdout)) == 2 * len(LOOSE)
    assert query(mixed["postgresql"], urls["pg"], "SELECT count(*) FROM t") == [(1,)]


def test_init_copy_refuses_a_loose_value_naming_its_row(mixed, tmp_path):  # type: ignore[no-untyped-def]
    """init copying SQLite's rows into an empty PostgreSQL: a value the copy cannot store exactly
    is refused naming its table, row and column (before: a bare ValueError for '12abc', the blob's
    repr for a blob in a TEXT); nothing of the copy is kept."""
    urls = {}
    for site, name in (("pg", "postgresql"), ("lite", "sqlite")):
        urls[site] = mixed[name].new_site(tmp_path, site)
        query(mixed[name], urls[site], DDL[name][0])
    query(mixed["sqlite"], urls["lite"], "INSERT INTO t (note, n) VALUES ('fine', 1)")
    query(mixed["sqlite"], urls["lite"], "INSERT INTO t (note, what) VALUES ('blob', x'00ff')")
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "table 't', row id=2, column 'what': b'\\x00\\xff' is bytes, not text" in r.stderr, r.stderr
    assert query(mixed["postgresql"], urls["pg"], "SELECT count(*) FROM t") == [(0,)]


def test_postgresql_infinity_and_bc_replicate_to_postgresql_and_are_held_elsewhere(mixed, tmp_path):  # type: ignore[no-untyped-def]
    """'infinity' and BC dates, which Python's datetime cannot hold: before, the read at the source
    failed ("timestamp too large"), the whole link, even PostgreSQL -> PostgreSQL. Now they are read
    as PostgreSQL's text, stored as they are at another PostgreSQL site and held at SQLite."""
    pg, lite = mixed["postgresql"], mixed["sqlite"]
    ddl = "CREATE TABLE t (id {}, note TEXT, until TIMESTAMP, at TIMESTAMPTZ, d DATE)"
    urls = {s: b.new_site(tmp_path, s) for s, b in (("a", pg), ("b", pg), ("lite", lite))}
    for s in ("a", "b"):
        query(pg, urls[s], ddl.format("SERIAL PRIMARY KEY"))
    query(lite, urls["lite"], ddl.format("INTEGER PRIMARY KEY AUTOINCREMENT").replace("TIMESTAMPTZ", "TIMESTAMP"))
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    query(pg, urls["a"], "INSERT INTO t (note, until, at, d) VALUES ('forever', 'infinity', '-infinity', '0044-03-15 BC')")
    query(pg, urls["a"], "INSERT INTO t (note, until) VALUES ('fine', '2024-06-01 12:00')")
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == [], r.stdout
    got = "SELECT note, until::text, at::text, d::text FROM t ORDER BY id"
    assert query(pg, urls["b"], got) == query(pg, urls["a"], got)
    assert query(pg, urls["b"], got)[0] == ("forever", "infinity", "-infinity", "0044-03-15 BC")
    held = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
    assert [(e["site"], e["change"]["values"]["note"]) for e in held] == [("lite", "forever")], held
    assert "'infinity'" in held[0]["error"] and "t.until (" in held[0]["error"]
    assert query(lite, urls["lite"], "SELECT note FROM t") == [("fine",)]


def test_mariadb_zero_dates_are_held_by_name_not_a_link_failure(mixed, tmp_path):  # type: ignore[no-untyped-def]
    """A zero date (written with sql_mode='') reaches the engine as its text: before, converting
    it failed the whole link ("year 0 is out of range"), even MariaDB -> MariaDB; now the change
    is held at each site, naming the columns and values, and the link's other changes flow."""
    my = mixed["mysql"]
    urls = {s: my.new_site(tmp_path, s) for s in ("a", "b")}
    for s in urls:
        query(my, urls[s], "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, note TEXT, at DATETIME(6), d DATE)")
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    c = my.connect(urls["a"])
    cur = c.cursor()
    cur.execute("SET sql_mode = ''")
    cur.execute("INSERT INTO t (note, at, d) VALUES ('zero', '0000-00-00 00:00:00', '0000-00-00')")
    c.commit()
    cur.execute("INSERT INTO t (note, at, d) VALUES ('fine', '2024-06-01 12:00:00', '2024-06-01')")
    c.commit()
    c.close()
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == [], r.stdout
    held = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
    assert [(e["site"], e["change"]["values"]["note"]) for e in held] == [("b", "zero")], held
    assert "t.at (" in held[0]["error"] and "'0000-00-00'" in held[0]["error"] and "t.d (" in held[0]["error"]
    assert query(my, urls["b"], "SELECT note FROM t") == [("fine",)]


def test_entry_size_counts_what_a_statement_carries() -> None:
    from multimaster.engine.pull import entry_size

    assert entry_size(["x" * 100, b"y" * 100, 5], 10_000) == 0
    assert entry_size([b"\x00" * 1000], 1500) == 2010  # each NUL escaped
    assert entry_size(["é" * 1000, None], 1000) == 2010 + 32


def test_an_entry_larger_than_max_allowed_packet_is_named_not_a_stall(mixed, tmp_path):  # type: ignore[no-untyped-def]
    """A blob larger than the receiving MariaDB's max_allowed_packet: before, the store lost the
    connection ("server has gone away"), retried forever, nothing named. Now the link's error names
    the table, key, size, the limit and the SET GLOBAL that lets it through."""
    pg, my = mixed["postgresql"], mixed["mysql"]
    urls = {"pg": pg.new_site(tmp_path, "pg"), "maria": my.new_site(tmp_path, "maria")}
    query(pg, urls["pg"], "CREATE TABLE f (id SERIAL PRIMARY KEY, body BYTEA)")
    query(my, urls["maria"], "CREATE TABLE f (id INT AUTO_INCREMENT PRIMARY KEY, body LONGBLOB)")
    limit = int(query(my, urls["maria"], "SELECT @@max_allowed_packet")[0][0])
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"f": {"key": "id"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    c = pg.connect(urls["pg"])
    c.cursor().execute("INSERT INTO f (body) VALUES (%s)", (b"z" * (limit + 1024),))
    c.commit()
    c.close()
    r = mm("refresh", "-t", str(topo), "--json")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    err = next(lk["error"] for run in json.loads(r.stdout) for lk in run["links"] if lk["error"])
    assert "table 'f' (key 1, pulled from 'pg')" in err and f"max_allowed_packet ({limit:,} bytes)" in err, err
    assert "SET GLOBAL max_allowed_packet" in err and "gone away" not in err
    assert query(my, urls["maria"], "SELECT count(*) FROM f") == [(0,)]
