"""SQLite's NOCASE / RTRIM and PostgreSQL's citext and nondeterministic collations on a key or
UNIQUE column (docs/sqlite.md "Collations", docs/postgresql.md "Collations"): each takes two texts
as one value that the other databases (and multimaster) keep apart. Before session 35 init
installed such a column in a mixed cluster without a word; 'a' and 'A' written at a site that keeps
them apart were two rows there and one row, the second held with the database's bare "UNIQUE
constraint failed" / "duplicate key value", at the site whose collation merges them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, made, mm, query


@pytest.fixture
def servers():  # type: ignore[no-untyped-def]
    backends = {n: made(n) for n in ("sqlite", "postgresql")}
    yield backends
    for b in backends.values():
        b.cleanup()


def _topology(tmp: Path, urls: dict[str, str]) -> Path:
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"k": {"key": "k"}, "u": {"key": "id"}}, "links": "mesh"}
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _mm_tables(b: Backend, url: str) -> list[Any]:
    if b.name == "postgresql":
        return query(b, url, "SELECT table_name FROM information_schema.tables WHERE table_schema = '_mm'")
    return query(b, url, "SELECT name FROM sqlite_master WHERE name LIKE '\\_mm%' ESCAPE '\\'")


SQLITE_PLAIN = [
    "CREATE TABLE k (k TEXT PRIMARY KEY, v TEXT)",
    "CREATE TABLE u (id INTEGER PRIMARY KEY, email TEXT NOT NULL UNIQUE, v TEXT)",
]
SQLITE_NOCASE = [
    "CREATE TABLE k (k TEXT COLLATE NOCASE PRIMARY KEY, v TEXT)",
    "CREATE TABLE u (id INTEGER PRIMARY KEY, email TEXT COLLATE NOCASE NOT NULL UNIQUE, v TEXT)",
]
PG_PLAIN = [
    "CREATE TABLE k (k TEXT PRIMARY KEY, v TEXT)",
    "CREATE TABLE u (id SERIAL PRIMARY KEY, email TEXT NOT NULL UNIQUE, v TEXT)",
]
PG_CITEXT = [
    "CREATE EXTENSION IF NOT EXISTS citext",
    "CREATE TABLE k (k CITEXT PRIMARY KEY, v TEXT)",
    "CREATE TABLE u (id SERIAL PRIMARY KEY, email CITEXT NOT NULL UNIQUE, v TEXT)",
]
PG_ICU = [
    "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    "CREATE TABLE k (k TEXT COLLATE ci PRIMARY KEY, v TEXT)",
    "CREATE TABLE u (id SERIAL PRIMARY KEY, email TEXT COLLATE ci NOT NULL UNIQUE, v TEXT)",
]


def _site(servers: dict[str, Backend], tmp: Path, name: str, kind: str, ddl: list[str]) -> str:
    url = servers[kind].new_site(tmp, name)
    for stmt in ddl:
        query(servers[kind], url, stmt)
    return url


CASES = {
    "sqlite-nocase": (("sqlite", SQLITE_NOCASE), ("postgresql", PG_PLAIN)),
    "pg-citext": (("postgresql", PG_CITEXT), ("sqlite", SQLITE_PLAIN)),
    "pg-icu": (("postgresql", PG_ICU), ("sqlite", SQLITE_PLAIN)),
}
SAID = {
    "sqlite-nocase": (
        "NOCASE",
        "ASCII letters differing only in case ('a' and 'A'",
        "SQLite cannot change a column's collation in place: make table k again without COLLATE NOCASE on k",
    ),
    "pg-citext": (
        "citext",
        "letters differing only in case ('a' and 'A', 'É' and 'é'",
        'ALTER TABLE "k" ALTER COLUMN "k" TYPE text',
    ),
    "pg-icu": ("ci", "letters differing only in case ('a' and 'A')", 'ALTER TABLE "k" ALTER COLUMN "k" TYPE TEXT COLLATE "C"'),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_init_refuses_a_loose_key_or_unique_column_beside_a_site_that_compares_exactly(servers, tmp_path, case):  # type: ignore[no-untyped-def]
    """SQLite NOCASE beside PostgreSQL, PostgreSQL citext or a nondeterministic ICU collation
    beside SQLite: init names each column, its collation, what it merges and the fix, exits 2 and
    installs nothing (before: installed; 'a' and 'A' written at the other site were two rows there
    and one here, the second held with the database's bare "UNIQUE constraint failed: k.k" /
    "duplicate key value violates unique constraint")."""
    loose, plain = CASES[case]
    urls = {"loose": _site(servers, tmp_path, "loose", *loose), "plain": _site(servers, tmp_path, "plain", *plain)}
    topo = _topology(tmp_path, urls)
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    coll, merges, fix = SAID[case]
    for table, col, role in (("k", "k", "the key"), ("u", "email", "in UNIQUE (email)")):
        assert f"site 'loose': table '{table}', column '{col}' ({role}) has collation {coll}, which takes {merges}" in err, err
    assert f"while 'plain' ({'PostgreSQL' if plain[0] == 'postgresql' else 'SQLite'}) keeps them apart" in err, err
    assert fix in err, err
    assert _mm_tables(servers["sqlite"], urls["loose" if loose[0] == "sqlite" else "plain"]) == []
    assert _mm_tables(servers["postgresql"], urls["loose" if loose[0] == "postgresql" else "plain"]) == []

    # the fix named: then init installs and 'a' / 'A' replicate as two rows everywhere
    kind = loose[0]
    if kind == "sqlite":
        for stmt in ["DROP TABLE k", "DROP TABLE u", *SQLITE_PLAIN]:
            query(servers[kind], urls["loose"], stmt)
    else:
        for table, col in (("k", "k"), ("u", "email")):
            query(servers[kind], urls["loose"], fix.replace('"k"', f'"{table}"', 1).replace('"k"', f'"{col}"', 1))
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0 and "collation" not in r.stderr, r.stdout + r.stderr
    bp = servers[plain[0]]
    query(bp, urls["plain"], "INSERT INTO k VALUES ('a', 'lower'), ('A', 'upper')")
    query(bp, urls["plain"], "INSERT INTO u (email, v) VALUES ('ann@x', 'lower'), ('ANN@x', 'upper')")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    assert sorted(query(servers[kind], urls["loose"], "SELECT k, v FROM k")) == [("A", "upper"), ("a", "lower")]
    assert sorted(query(servers[kind], urls["loose"], "SELECT email, v FROM u")) == [("ANN@x", "upper"), ("ann@x", "lower")]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_sites_alike_warn_and_a_collision_is_held_naming_collation_and_fix(servers, tmp_path, kind):  # type: ignore[no-untyped-def]
    """Two SQLite NOCASE sites, two PostgreSQL citext sites: they compare alike, so init installs
    and warns; 'a' at one site and 'A' at the other, concurrently, are held at each site naming the
    collation, what it merges and the fix (PostgreSQL: the value and the row's value it equals too;
    SQLite's message names no value). Before: the bare database message."""
    ddl = SQLITE_NOCASE if kind == "sqlite" else PG_CITEXT
    urls = {s: _site(servers, tmp_path, s, kind, ddl) for s in ("a", "b")}
    topo = _topology(tmp_path, urls)
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    coll = "NOCASE" if kind == "sqlite" else "citext"
    assert err.count(f"warning: table 'k', column 'k' (the key) has collation {coll} at 'a', 'b'") == 1, err
    assert f"warning: table 'u', column 'email' (in UNIQUE (email)) has collation {coll}" in err, err

    b = servers[kind]
    query(b, urls["a"], "INSERT INTO k VALUES ('a', 'at a')")
    query(b, urls["b"], "INSERT INTO k VALUES ('A', 'at b')")
    query(b, urls["a"], "INSERT INTO u (email, v) VALUES ('ann@x', 'at a')")
    query(b, urls["b"], "INSERT INTO u (email, v) VALUES ('ANN@x', 'at b')")
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == [], r.stdout
    held = {(e["site"], e["table"]): e["error"] for e in json.loads(mm("errors", "-t", str(topo), "--json").stdout)}
    assert sorted(held) == [("a", "k"), ("a", "u"), ("b", "k"), ("b", "u")], held
    title = "SQLite" if kind == "sqlite" else "PostgreSQL"
    if kind == "sqlite":
        assert held[("a", "k")].startswith(
            f"value refused: site 'a' ({title}): k.k: the value refused is a duplicate under the column's collation, not as text: "
            "k's collation NOCASE takes ASCII letters differing only in case"
        ), held[("a", "k")]
        assert "make table u again without COLLATE NOCASE on email" in held[("b", "u")], held[("b", "u")]
    else:
        assert held[("a", "k")].startswith(
            f"value refused: site 'a' ({title}): k.k = 'A' is the same value as 'a', which a row here holds, under the "
            "column's collation, not as text: k's collation citext takes letters differing only in case"
        ), held[("a", "k")]
        assert "is the same value as 'ANN@x', which a row here holds," in held[("b", "u")], held[("b", "u")]
        assert 'ALTER TABLE "u" ALTER COLUMN "email" TYPE text' in held[("b", "u")]
    for e in held.values():
        assert "errors retry" in e and "errors skip" in e, e


def test_what_sqlite_and_postgresql_read_as_a_columns_collation(servers, tmp_path):  # type: ignore[no-untyped-def]
    """The collation a UNIQUE index compares with, not only the column's own (SQLite); RTRIM; a
    domain over citext and a BINARY column left alone; ks-level1 (PostgreSQL)."""
    from sqlalchemy import create_engine

    from multimaster.dialects.postgresql.dialect import PostgreSQLDialect
    from multimaster.dialects.sqlite.dialect import SQLiteDialect

    s = _site(
        servers,
        tmp_path,
        "s",
        "sqlite",
        [
            "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b TEXT COLLATE RTRIM UNIQUE, c TEXT COLLATE NOCASE, d TEXT)",
            "CREATE UNIQUE INDEX ta ON t (a COLLATE NOCASE)",
            "CREATE UNIQUE INDEX td ON t (d)",
        ],
    )
    with create_engine(s).connect() as conn:
        got = SQLiteDialect().column_collations(conn, "t")
    assert {n: (c.name, c.merges) for n, c in got.items()} == {
        "a": ("NOCASE", "ASCII letters differing only in case ('a' and 'A'; not 'é' and 'É')"),
        "b": ("RTRIM", "texts differing only in trailing spaces ('x' and 'x ')"),
    }  # c: NOCASE, but no UNIQUE index over it; d: BINARY
    p = _site(
        servers,
        tmp_path,
        "p",
        "postgresql",
        [
            "CREATE EXTENSION IF NOT EXISTS citext",
            "CREATE DOMAIN email AS citext",
            "CREATE COLLATION nocase_noaccent (provider = icu, locale = 'und-u-ks-level1', deterministic = false)",
            "CREATE TABLE t (id INT PRIMARY KEY, a email, b TEXT COLLATE nocase_noaccent, c TEXT)",
        ],
    )
    with create_engine(p.replace("postgresql://", "postgresql+psycopg://", 1)).connect() as conn:
        got = PostgreSQLDialect().column_collations(conn, "t")
    assert {n: c.name for n, c in got.items()} == {"a": "citext", "b": "nocase_noaccent"}
    assert got["b"].merges == "letters differing only in case or accents ('a' and 'A', 'e' and 'é')"


def test_add_site_refuses_a_nocase_key_beside_postgresql(servers, tmp_path):  # type: ignore[no-untyped-def]
    """add-site of a SQLite site whose key is COLLATE NOCASE, copied from PostgreSQL holding 'a'
    and 'A': refused as init refuses it, before anything is copied (before: the copy failed on
    SQLite's bare "UNIQUE constraint failed: k.k")."""
    pg, lite = servers["postgresql"], servers["sqlite"]
    urls = {
        "pg": _site(servers, tmp_path, "pg", "postgresql", PG_PLAIN[:1]),
        "s": _site(servers, tmp_path, "s", "sqlite", SQLITE_NOCASE[:1]),
    }
    doc = {"sites": {"pg": {"url": urls["pg"]}}, "tables": {"k": {"key": "k"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    query(pg, urls["pg"], "INSERT INTO k VALUES ('a', 'lower'), ('A', 'upper')")
    doc["sites"]["s"] = {"url": urls["s"]}
    topo.write_text(yaml.safe_dump(doc))
    r = mm("add-site", "-t", str(topo), "s", "--from", "pg")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "site 's': table 'k', column 'k' (the key) has collation NOCASE" in err, err
    assert "make table k again without COLLATE NOCASE on k" in err, err
    assert query(lite, urls["s"], "SELECT count(*) FROM k") == [(0,)] and _mm_tables(lite, urls["s"]) == []


PG_ICU_INDEX = [
    "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    "CREATE TABLE u (id SERIAL PRIMARY KEY, email TEXT NOT NULL, v TEXT)",
    "CREATE UNIQUE INDEX u_email_ci ON u (email COLLATE ci)",
]


def test_a_unique_index_with_its_own_nondeterministic_collation_counts_as_the_column_s(servers, tmp_path):  # type: ignore[no-untyped-def]
    """A PostgreSQL UNIQUE index naming a nondeterministic collation itself, on a column whose own
    collation is deterministic: init refuses it beside SQLite as it refuses such a column, naming
    the index and the fix (the index made again without the COLLATE), and installs nothing (before:
    installed without a word, only the column's collation was read; 'ann@x' and 'ANN@x' written at
    SQLite were two rows there, the second held at PostgreSQL with the bare duplicate-key error).
    Two PostgreSQL sites with the same index: installed, warned."""
    urls = {
        "loose": _site(servers, tmp_path, "loose", "postgresql", PG_ICU_INDEX),
        "plain": _site(servers, tmp_path, "plain", "sqlite", SQLITE_PLAIN[1:]),
    }
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"u": {"key": "id"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert (
        "site 'loose': table 'u', column 'email' (in UNIQUE (email)) has collation ci (named by its unique index u_email_ci), "
        "which takes letters differing only in case ('a' and 'A')"
    ) in err, err
    assert "while 'plain' (SQLite) keeps them apart" in err, err
    fix = 'DROP INDEX "u_email_ci"; CREATE UNIQUE INDEX u_email_ci ON public.u USING btree (email)'
    assert fix in err, err
    assert _mm_tables(servers["postgresql"], urls["loose"]) == [] and _mm_tables(servers["sqlite"], urls["plain"]) == []

    # the fix named: init installs, and 'ann@x' / 'ANN@x' are two rows at both sites
    for stmt in fix.split("; "):
        query(servers["postgresql"], urls["loose"], stmt)
    assert mm("init", "-t", str(topo)).returncode == 0
    query(servers["sqlite"], urls["plain"], "INSERT INTO u (email, v) VALUES ('ann@x', 'lower'), ('ANN@x', 'upper')")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    assert sorted(query(servers["postgresql"], urls["loose"], "SELECT email, v FROM u")) == [
        ("ANN@x", "upper"),
        ("ann@x", "lower"),
    ]


def test_two_postgresql_sites_with_the_same_collated_unique_index_are_warned(tmp_path):  # type: ignore[no-untyped-def]
    """Every site's UNIQUE index takes 'a' and 'A' as one value: each enforces the same rule, so
    init installs and warns, naming the index's collation (before: not a word)."""
    pg = made("postgresql")
    try:
        urls = {s: pg.new_site(tmp_path, s) for s in ("a", "b")}
        for url in urls.values():
            for stmt in PG_ICU_INDEX:
                query(pg, url, stmt)
        doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"u": {"key": "id"}}, "links": "mesh"}
        topo = tmp_path / "topology.yaml"
        topo.write_text(yaml.safe_dump(doc))
        r = mm("init", "-t", str(topo))
        assert r.returncode == 0, r.stdout + r.stderr
        err = " ".join(r.stderr.split())
        assert (
            "warning: table 'u', column 'email' (in UNIQUE (email)) has collation ci (named by its unique index u_email_ci) at "
            "'a', 'b', which takes letters differing only in case ('a' and 'A') as one value"
        ) in err, err
        # written concurrently, one at each site: each site holds the other's, named
        query(pg, urls["a"], "INSERT INTO u (email, v) VALUES ('ann@x', 'at a')")
        query(pg, urls["b"], "INSERT INTO u (email, v) VALUES ('ANN@x', 'at b')")
        assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1
        held = {e["site"]: e["error"] for e in json.loads(mm("errors", "-t", str(topo), "--json").stdout)}
        assert sorted(held) == ["a", "b"], held
        assert (
            "u.email = 'ANN@x' is the same value as 'ann@x', which a row here holds, under the column's collation, not as "
            "text: email's collation ci (named by its unique index u_email_ci) takes letters differing only in case"
        ) in held["a"], held["a"]
        assert 'DROP INDEX "u_email_ci"; CREATE UNIQUE INDEX u_email_ci ON public.u USING btree (email)' in held["b"], held["b"]
    finally:
        pg.cleanup()
