"""Clusters mixing SQLite, PostgreSQL and MariaDB/MySQL: the same topology, only the URLs differ.

Values of every kind round-trip exactly (docs/types.md), rows and keys converge, and a column that
cannot be carried is refused at init, named.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, made

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.errors import SchemaError

UTC = dt.timezone.utc
COLS = ["i", "b", "d", "f", "t", "ok", "day", "at", "atz", "data"]
DDL = {
    "sqlite": ["INTEGER", "BIGINT", "NUMERIC(18,6)", "REAL", "TEXT", "BOOLEAN", "DATE", "TIMESTAMP", "TIMESTAMP", "BLOB"],
    "postgresql": [
        "INTEGER",
        "BIGINT",
        "NUMERIC(18,6)",
        "DOUBLE PRECISION",
        "TEXT",
        "BOOLEAN",
        "DATE",
        "TIMESTAMP",
        "TIMESTAMPTZ",
        "BYTEA",
    ],
    "mysql": [
        "INT",
        "BIGINT",
        "DECIMAL(18,6)",
        "DOUBLE",
        "TEXT",
        "BOOLEAN",
        "DATE",
        "DATETIME(6)",
        "TIMESTAMP(6) NULL",
        "LONGBLOB",
    ],
}
KEY = {
    "sqlite": '"id" INTEGER PRIMARY KEY',
    "postgresql": '"id" SERIAL PRIMARY KEY',
    "mysql": "`id` INT AUTO_INCREMENT PRIMARY KEY",
}
TEXT = "héllo ☃ 𝄞 😀 中文 עברית \t\n 'single' \"double\" \\back `tick` % _ Ω"
ROWS = [
    (
        -2147483648,
        9007199254740993,
        Decimal("123456789.123456"),
        0.1,
        TEXT,
        True,
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
        dt.datetime(2024, 2, 29, 23, 59, 59, 654321, UTC),
        bytes(range(256)),
    ),
    (None,) * 10,
    (
        0,
        -9223372036854775808,
        Decimal("-0.000001"),
        -1.5e-300,
        "",
        False,
        dt.date(1970, 1, 1),
        dt.datetime(1, 1, 1, 0, 0, 0),
        dt.datetime(2000, 1, 1, tzinfo=UTC),
        b"",
    ),
    (
        2147483647,
        9223372036854775807,
        Decimal("999999999.999999"),
        1 / 3,
        "x" * 5000,
        True,
        dt.date(9999, 12, 31),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        dt.datetime(2038, 1, 19, 3, 14, 7, 999999, UTC),
        b"\x00\xff" * 1000,
    ),
]


@pytest.fixture
def mixed(tmp_path: Path):  # type: ignore[no-untyped-def]
    backends = {n: made(n) for n in ("sqlite", "postgresql", "mysql")}
    yield backends
    for b in backends.values():
        b.cleanup()


def _q(backend: str, ident: str) -> str:
    return f"`{ident}`" if backend == "mysql" else f'"{ident}"'


def _build(
    backends: dict[str, Backend], tmp: Path, ddl: dict[str, list[str]] = DDL, config: dict[str, Any] | None = None
) -> tuple[Any, dict[str, str]]:
    urls = {}
    for site, name in (("lite", "sqlite"), ("pg", "postgresql"), ("maria", "mysql")):
        url = backends[name].new_site(tmp, site)
        cols = [KEY[name]] + [f"{_q(name, c)} {t}" for c, t in zip(COLS, ddl[name])]
        c = backends[name].connect(url)
        c.cursor().execute(f"CREATE TABLE {_q(name, 'vals')} ({', '.join(cols)})")
        c.commit()
        c.close()
        urls[site] = url
    doc = {
        "sites": {s: {"url": u} for s, u in urls.items()},
        "tables": {"vals": {"key": "id", **(config or {})}},
        "links": "mesh",
    }
    (tmp / "topology.yaml").write_text(yaml.safe_dump(doc))
    return load_topology(tmp / "topology.yaml"), urls


BACKEND_OF = {"lite": "sqlite", "pg": "postgresql", "maria": "mysql"}


def _insert(backends: dict[str, Backend], site: str, url: str, row: tuple[Any, ...]) -> None:
    name = BACKEND_OF[site]
    b = backends[name]
    c = b.connect(url)
    vals = list(row)
    if name == "sqlite":  # an application writing SQLite stores ISO-8601 text and exact decimals as text
        vals = [
            None
            if v is None
            else str(v)
            if isinstance(v, Decimal)
            else v.isoformat(" ")
            if isinstance(v, dt.datetime)
            else v.isoformat()
            if isinstance(v, dt.date)
            else v
            for v in vals
        ]
    if name == "mysql" and vals[8] is not None:
        c.cursor().execute("SET time_zone = '+00:00'")
        vals[8] = vals[8].replace(tzinfo=None)
    ph = ", ".join([b.param()] * len(COLS))
    c.cursor().execute(f"INSERT INTO {_q(name, 'vals')} ({', '.join(_q(name, x) for x in COLS)}) VALUES ({ph})", vals)
    c.commit()
    c.close()


def _canon(name: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row as plain Python values, whatever the driver returned."""
    k, i, b, d, f, t, ok, day, at, atz, data = row

    def ts(v: Any, aware: bool) -> Any:
        if v is None:
            return None
        x = v if isinstance(v, dt.datetime) else dt.datetime.fromisoformat(str(v))
        if aware:
            return x.replace(tzinfo=UTC) if x.tzinfo is None else x.astimezone(UTC)
        return x

    return (
        k,
        i,
        b,
        None if d is None else Decimal(repr(d)) if isinstance(d, float) else Decimal(str(d)),
        f,
        t,
        None if ok is None else bool(ok),
        None if day is None else day if isinstance(day, dt.date) else dt.date.fromisoformat(day),
        ts(at, False),
        ts(atz, True),
        None if data is None else bytes(data),
    )


def _rows(backends: dict[str, Backend], site: str, url: str) -> list[tuple[Any, ...]]:
    name = BACKEND_OF[site]
    c = backends[name].connect(url)
    cur = c.cursor()
    if name == "mysql":
        cur.execute("SET time_zone = '+00:00'")
    cur.execute(f"SELECT {', '.join(_q(name, x) for x in ['id', *COLS])} FROM {_q(name, 'vals')} ORDER BY {_q(name, 'id')}")
    out = [_canon(name, tuple(r)) for r in cur.fetchall()]
    c.close()
    return out


def _quiet(topo: Any) -> None:
    """Refresh every link until a round pulls nothing (at most 6 rounds); no link may fail."""
    with api.Cluster(topo) as cl:
        for _ in range(6):
            res = api.refresh(cl)
            assert not [r.error for r in res if r.error], [r.error for r in res if r.error]
            if all(r.pulled == 0 for r in res):
                return


def _write(backends: dict[str, Backend], site: str, url: str, sql: str, params: tuple[Any, ...]) -> None:
    c = backends[BACKEND_OF[site]].connect(url)
    c.cursor().execute(sql.replace("?", backends[BACKEND_OF[site]].param()), params)
    c.commit()
    c.close()


def test_concurrent_heads_cross_the_three_databases(mixed, tmp_path):  # type: ignore[no-untyped-def]
    """docs/conflicts.md "Concurrent heads" across SQLite, PostgreSQL and MariaDB: a group (i, d,
    day) under `maximum`, continued at two sites while apart, ends with the pick of the two last
    writes at every site, whichever it heard first; the other head's values (a decimal, a date)
    wait in the shadow as JSON and win exactly when a site's last write loses."""
    cfg = {"groups": {"g": {"columns": ["i", "d", "day"], "policy": "maximum"}}}
    topo, urls = _build(mixed, tmp_path, config=cfg)
    api.init(topo)
    _insert(mixed, "lite", urls["lite"], ROWS[2])
    api.refresh(topo)
    api.refresh(topo)
    upd = "UPDATE vals SET i = ?, d = ?, day = ? WHERE id = 1"

    def day(n: int) -> str:  # SQLite: a date as an application stores it, ISO-8601 text
        return f"2020-01-0{n}"

    _write(mixed, "lite", urls["lite"], upd, (5, "5.5", day(5)))  # U1
    _write(mixed, "pg", urls["pg"], upd, (3, Decimal("3.25"), dt.date(2020, 1, 3)))  # U2
    _write(mixed, "pg", urls["pg"], upd, (4, Decimal("4.125"), dt.date(2020, 1, 4)))  # U4, after U2
    _write(mixed, "lite", urls["lite"], upd, (2, "2.5", day(2)))  # U3, after U1
    with api.Cluster(topo) as cl:  # maria hears pg's two writes first: U1 beats U4 there, then U3
        assert not [r.error for r in api.refresh(cl, "maria", "pg") if r.error]
        assert not [r.error for r in api.refresh(cl, "maria", "lite") if r.error]
    _quiet(topo)
    for site, url in urls.items():
        row = _rows(mixed, site, url)[0]
        assert (row[1], row[3], row[7]) == (4, Decimal("4.125"), dt.date(2020, 1, 4)), (site, row)
    # pg held U4 and U3: its next write supersedes both, although maximum prefers 4
    _write(mixed, "pg", urls["pg"], upd, (1, Decimal("1"), dt.date(2020, 1, 1)))
    _quiet(topo)
    for site, url in urls.items():
        row = _rows(mixed, site, url)[0]
        assert (row[1], row[3], row[7]) == (1, Decimal("1"), dt.date(2020, 1, 1)), (site, row)


@pytest.mark.server
def test_three_databases_converge_with_exact_values(mixed, tmp_path):  # type: ignore[no-untyped-def]
    topo, urls = _build(mixed, tmp_path)
    api.init(topo)
    # every site inserts every row: each value crosses every pair of databases
    for site in urls:
        for row in ROWS:
            _insert(mixed, site, urls[site], row)
    _quiet(topo)
    ref = _rows(mixed, "pg", urls["pg"])
    assert len(ref) == 3 * len(ROWS)
    expected = sorted((tuple(map(str, r)) for r in ROWS * 3))
    for site, url in urls.items():
        rows = _rows(mixed, site, url)
        assert rows == ref, f"{site} differs from pg"
        assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
        assert sorted(tuple(map(str, r[1:])) for r in rows) == expected, site
    # updates and deletes cross too, and values stay exact
    _q_up = {
        "lite": "UPDATE vals SET t = ?, d = ? WHERE id = 1",
        "pg": "UPDATE vals SET f = %s, atz = %s WHERE id = 2",
        "maria": "UPDATE vals SET data = %s, day = %s WHERE id = 3",
    }
    params = {
        "lite": ("Ünïcødé ✓", "0.5"),
        "pg": (2.5e-10, dt.datetime(2030, 6, 1, 12, 0, 0, 1, UTC)),
        "maria": (b"\x01\x02", dt.date(2001, 9, 9)),
    }
    for site, sql in _q_up.items():
        c = mixed[BACKEND_OF[site]].connect(urls[site])
        c.cursor().execute(sql, params[site])
        c.commit()
        c.close()
    c = mixed["postgresql"].connect(urls["pg"])
    c.cursor().execute("DELETE FROM vals WHERE id = 4")
    c.commit()
    c.close()
    _quiet(topo)
    ref = _rows(mixed, "pg", urls["pg"])
    by_key = {r[0]: r for r in ref}
    assert 4 not in by_key
    assert by_key[1][5] == "Ünïcødé ✓" and by_key[1][3] == Decimal("0.5")
    assert by_key[2][4] == 2.5e-10 and by_key[2][9] == dt.datetime(2030, 6, 1, 12, 0, 0, 1, UTC)
    assert by_key[3][10] == b"\x01\x02" and by_key[3][7] == dt.date(2001, 9, 9)
    for site, url in urls.items():
        assert _rows(mixed, site, url) == ref, site


@pytest.mark.server
def test_a_column_that_cannot_be_carried_is_refused_by_name(mixed, tmp_path):  # type: ignore[no-untyped-def]
    ddl = {k: list(v) for k, v in DDL.items()}
    ddl["postgresql"][4] = "TEXT[]"  # an array: SQLite and MariaDB have nothing to hold it
    ddl["mysql"][0] = "VARCHAR(20)"  # text where the others hold integers
    topo, _ = _build(mixed, tmp_path, ddl)
    with pytest.raises(SchemaError) as e:
        api.init(topo)
    msg = str(e.value)
    assert "column 't'" in msg and "TEXT[]" in msg and "'pg'" in msg
    assert "column 'i'" in msg and "text at 'maria'" in msg
