"""Values a site cannot store exactly (docs/types.md "Values a site cannot store"): a text longer
than a MariaDB TEXT holds, a decimal out of a DECIMAL(6,2)'s range, a float NaN or Infinity where
the database has none. Each is held in that site's error queue for its change, naming the site,
table, column, kind and value, with the fix; the link goes on; `status` and `errors` exit 1 —
never a value cut, rounded, clamped or turned into NULL on the way in. A held value whose column
is widened since is applied exactly by `errors retry`."""

from __future__ import annotations

import functools
import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from clusters import Backend, mm, query

from multimaster.dialects import fit
from multimaster.dialects.schema import Column

# ---- the rules, pure ----------------------------------------------------------------------------


def _check(dialect: str, type_sql: str, kind: str) -> Any:
    return fit.checks(dialect, dialect, [Column("c", None, type_sql, True)], [kind])[0]


def test_mariadb_text_blob_and_varchar_limits() -> None:
    text = _check("mysql", "TEXT", "text")
    assert text("x" * 65_535) is None
    m = text("x" * 65_536)
    assert m is not None and "65,536 characters" in m.why and not m.never
    assert text("é" * 40_000) is not None  # 80,000 bytes in utf-8
    assert _check("mysql", "MEDIUMTEXT", "text")("x" * 100_000) is None
    assert _check("mysql", "VARCHAR(5)", "text")("abcde") is None
    assert _check("mysql", "VARCHAR(5)", "text")("abcde ") is not None  # MariaDB would cut the space, quietly
    assert _check("mysql", "BLOB", "bytes")(b"x" * 70_000) is not None
    assert _check("postgresql", "TEXT", "text") is None


def test_decimal_range_and_scale() -> None:
    dec = _check("mysql", "DECIMAL(6,2)", "decimal")
    assert dec(Decimal("9999.99")) is None and dec(Decimal("1.50")) is None and dec(Decimal("100")) is None
    assert "before the point" in dec(Decimal("12345678.99")).why
    assert "rounded" in dec(Decimal("1.005")).why
    assert dec(Decimal("NaN")).never
    pg = _check("postgresql", "NUMERIC(12,2)", "decimal")
    assert pg(Decimal("1.005")) is not None and pg(Decimal("1.01")) is None
    assert _check("postgresql", "NUMERIC", "decimal")(Decimal("NaN")) is None
    lite = _check("sqlite", "NUMERIC(12,2)", "decimal")
    assert lite("1.005") is None  # SQLite enforces no scale and keeps this one exactly
    assert lite("123456789012345678") is None  # an INTEGER
    assert lite("1234567890123456.78").never  # the nearest REAL is another number


def test_float_specials_and_integers() -> None:
    my, lite, pg = (_check(d, "DOUBLE", "float") for d in ("mysql", "sqlite", "postgresql"))
    assert my(math.nan).never and my(math.inf).never and my(1.5) is None
    assert lite(math.nan).never and lite(math.inf) is None
    assert pg is None
    i = _check("mysql", "INT", "int")
    assert i(2**31 - 1) is None and i(2**31) is not None
    assert _check("mysql", "INT UNSIGNED", "int")(-1) is not None
    assert _check("sqlite", "INTEGER", "int") is None


# ---- clusters of real databases -------------------------------------------------------------------


DDL = {
    "postgresql": "CREATE TABLE t (id SERIAL PRIMARY KEY, body TEXT, amt NUMERIC(20,2), x DOUBLE PRECISION, note TEXT)",
    "mysql": "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, body TEXT, amt DECIMAL(6,2), x DOUBLE, note TEXT)",
    "sqlite": "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT, amt NUMERIC(20,2), x REAL, note TEXT)",
}
SITES = {"pg": "postgresql", "maria": "mysql", "lite": "sqlite"}


def _build(backends: dict[str, Backend], tmp: Path, sites: dict[str, str], ddl: dict[str, str]) -> tuple[Path, dict[str, str]]:
    urls = {}
    for site, name in sites.items():
        url = backends[name].new_site(tmp, site)
        c = backends[name].connect(url)
        c.cursor().execute(ddl.get(site, ddl.get(name, "")))
        c.commit()
        c.close()
        urls[site] = url
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"}
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(path)).returncode == 0
    return path, urls


_sql = functools.partial(query, qmark=True)


def _held(topo: Path) -> list[dict[str, Any]]:
    r = mm("errors", "-t", str(topo), "--json")
    return [e for e in json.loads(r.stdout)]


def test_values_a_site_cannot_store_are_held_never_altered(mixed, tmp_path):  # type: ignore[no-untyped-def]
    topo, urls = _build(mixed, tmp_path, SITES, DDL)
    pg, maria, lite = (mixed[SITES[s]] for s in ("pg", "maria", "lite"))
    ins = "INSERT INTO t (body, amt, x, note) VALUES (?, ?, ?, ?)"
    _sql(pg, urls["pg"], ins, ("x" * 100_000, Decimal("1.00"), 1.0, "long"))
    _sql(pg, urls["pg"], ins, ("ok", Decimal("12345678.99"), 1.0, "big"))
    _sql(pg, urls["pg"], ins, ("ok", Decimal("1.00"), float("nan"), "nan"))
    _sql(pg, urls["pg"], ins, ("ok", Decimal("1.00"), float("inf"), "inf"))
    _sql(pg, urls["pg"], ins, ("ok", Decimal("2.50"), 2.5, "fine"))
    _sql(lite, urls["lite"], "INSERT INTO t (body, amt, x, note) VALUES ('lite', '3.25', 3.5, 'from lite')")

    r = mm("refresh", "-t", str(topo), "--until-quiet")
    # no link fails (the changes are held): refresh exits 1 naming the sites that hold them
    assert r.returncode == 1 and "site 'maria' holds" in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
    st = mm("status", "-t", str(topo))
    assert st.returncode == 1 and "held in the error queue" in st.stderr
    held = _held(topo)
    by = {(e["site"], e["change"]["values"].get("note") if e["change"] else None): e for e in held}
    assert sorted(by) == [("lite", "nan"), ("maria", "big"), ("maria", "inf"), ("maria", "long"), ("maria", "nan")], held
    long_ = by[("maria", "long")]["error"]
    assert "site 'maria'" in long_ and "t.body (text)" in long_ and "100,000 characters" in long_ and "errors retry" in long_
    big = by[("maria", "big")]["error"]
    assert "t.amt (decimal)" in big and "12345678.99" in big
    nan = by[("maria", "nan")]["error"]
    assert "t.x (float)" in nan and "NaN" in nan and "errors skip" in nan
    assert "NaN" in by[("lite", "nan")]["error"] and "site 'lite'" in by[("lite", "nan")]["error"]
    assert by[("maria", "long")]["change"]["values"]["body"] == "x" * 100_000  # the listing shows the value kept aside
    listing = mm("errors", "-t", str(topo))  # exits 1 while a change is held, as status does (docs/cli.md)
    assert listing.returncode == 1 and "value refused" in listing.stdout

    # nothing cut, clamped or made NULL; the other changes of the link went on, in both directions
    notes = {s: sorted(r[0] for r in _sql(mixed[n], urls[s], "SELECT note FROM t")) for s, n in SITES.items()}
    assert notes["maria"] == ["fine", "from lite"]
    assert notes["lite"] == ["big", "fine", "from lite", "inf", "long"]
    assert sorted(notes["pg"]) == ["big", "fine", "from lite", "inf", "long", "nan"]
    assert _sql(lite, urls["lite"], "SELECT count(*) FROM t WHERE x IS NULL") == [(0,)]

    # widened at maria: retry applies the long text and the decimal exactly; NaN and Infinity stay held
    _sql(maria, urls["maria"], "ALTER TABLE t MODIFY body MEDIUMTEXT, MODIFY amt DECIMAL(12,2)")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1  # (still held until retried)
    r = mm("errors", "retry", "-t", str(topo), "--all")
    assert r.returncode == 1  # NaN and Infinity are still held
    got = dict(_sql(maria, urls["maria"], "SELECT note, concat(length(body), ' ', amt) FROM t"))
    assert got["long"] == "100000 1.00" and got["big"] == "2 12345678.99"
    left = sorted((e["site"], e["change"]["values"]["note"]) for e in _held(topo))
    assert left == [("lite", "nan"), ("maria", "inf"), ("maria", "nan")]
    # keys agree at every site (a held insert kept its rank)
    rows = {s: sorted(_sql(mixed[n], urls[s], "SELECT id, note FROM t")) for s, n in SITES.items()}
    assert [r for r in rows["maria"]] == [r for r in rows["pg"] if r[1] not in ("nan", "inf")]


def test_pure_mariadb_cluster_holds_a_text_too_long_instead_of_cutting_it(mixed, tmp_path):  # type: ignore[no-untyped-def]
    ddl = {"mysql": "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, body TEXT, amt DECIMAL(10,2))"}
    topo, urls = _build(mixed, tmp_path, {"a": "mysql", "b": "mysql"}, ddl)
    my = mixed["mysql"]
    # widened at 'a' only (a schema change its capture follows; 'b' has not widened yet)
    _sql(my, urls["a"], "ALTER TABLE t MODIFY body MEDIUMTEXT, MODIFY amt DECIMAL(12,3)")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    _sql(my, urls["a"], "INSERT INTO t (body, amt) VALUES (?, ?)", ("y" * 70_000, Decimal("1.000")))
    _sql(my, urls["a"], "INSERT INTO t (body, amt) VALUES (?, ?)", ("ok", Decimal("1.005")))
    _sql(my, urls["a"], "INSERT INTO t (body, amt) VALUES (?, ?)", ("ok", Decimal("2.500")))
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1  # held at b
    assert mm("status", "-t", str(topo)).returncode == 1
    errs = sorted(e["error"].split(": ", 2)[2][:40] for e in _held(topo))
    assert len(errs) == 2 and all(e["site"] == "b" for e in _held(topo)), errs
    assert _sql(my, urls["b"], "SELECT body, amt FROM t") == [("ok", Decimal("2.50"))]
