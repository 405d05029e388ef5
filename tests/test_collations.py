"""MariaDB collations that take two texts as one value (docs/mysql.md "Collations"), and character
sets that do not hold every character (docs/types.md "Values a site cannot store").

MariaDB's default collation, utf8mb4_general_ci, takes 'a' and 'A' as one value, and every PAD
SPACE collation 'x' and 'x '; PostgreSQL, SQLite and multimaster keep them apart. Before session 35
init installed such a key or UNIQUE column beside PostgreSQL without a word, and the second of two
such rows was held at the MariaDB site with the driver's bare "Duplicate entry 'A' for key
'PRIMARY'", naming neither the collation nor a fix; a utf8mb3 column given an emoji held the
change with the bare "Incorrect string value"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import Backend, made, mm, query

from multimaster.dialects.fit import charset_misfit
from multimaster.dialects.mysql.collations import CASE, PAD, merges

# ---- pure ---------------------------------------------------------------------------------------


def test_what_a_collation_takes_as_one_value() -> None:
    assert merges("utf8mb4_general_ci") == (CASE, PAD)
    assert merges("utf8mb4_bin") == (PAD,)  # binary, but PAD SPACE
    assert merges("utf8mb4_nopad_bin") == ()
    assert merges("utf8mb4_0900_bin") == ()  # MySQL 8: NO PAD
    assert merges("utf8mb4_0900_ai_ci") == (CASE,)
    assert merges("utf8mb4_uca1400_as_ci")[0] == "letters differing only in case ('a' and 'A')"
    assert merges("latin1_swedish_ci") == (CASE, PAD)


def test_which_characters_a_character_set_holds() -> None:
    assert charset_misfit("utf8mb3", "plain é ü €") is None
    assert charset_misfit("utf8mb3", "ok 😀") == "character '😀' (U+1F600) at position 4"
    assert charset_misfit("utf8mb4", "ok 😀") is None
    assert charset_misfit("latin1", "café €") is None  # MySQL's latin1 is cp1252: it has €
    assert charset_misfit("latin1", "Łódź") == "character 'Ł' (U+0141) at position 1"
    assert charset_misfit("ascii", "é") == "character 'é' (U+00E9) at position 1"


# ---- real servers -------------------------------------------------------------------------------


PG_DDL = [
    "CREATE TABLE k (k VARCHAR(100) PRIMARY KEY, v TEXT)",
    "CREATE TABLE u (id SERIAL PRIMARY KEY, email VARCHAR(100) NOT NULL UNIQUE, v TEXT)",
]


def _my_ddl(collate: str = "") -> list[str]:
    c = f" COLLATE {collate}" if collate else ""
    return [
        f"CREATE TABLE k (k VARCHAR(100){c} PRIMARY KEY, v TEXT)",
        f"CREATE TABLE u (id INT AUTO_INCREMENT PRIMARY KEY, email VARCHAR(100){c} NOT NULL UNIQUE, v TEXT)",
    ]


def _topology(tmp: Path, urls: dict[str, str]) -> Path:
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"k": {"key": "k"}, "u": {"key": "id"}}, "links": "mesh"}
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _mm_tables(b: Backend, url: str) -> list[Any]:
    if b.name == "postgresql":
        return query(b, url, "SELECT table_name FROM information_schema.tables WHERE table_schema = '_mm'")
    return query(
        b, url, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '\\_mm%%'"
    )


def test_init_refuses_a_case_insensitive_key_or_unique_column_beside_postgresql(servers, tmp_path):  # type: ignore[no-untyped-def]
    """PostgreSQL + MariaDB with the server's default collation: init names each column, its
    collation, what it merges and the ALTER that fixes it, exits 2 and installs nothing (before:
    installed, and the second of 'a' / 'A' written at PostgreSQL held at MariaDB unexplained)."""
    pg, my = servers["postgresql"], servers["mysql"]
    urls = {"pg": pg.new_site(tmp_path, "pg"), "maria": my.new_site(tmp_path, "maria")}
    for stmt in PG_DDL:
        query(pg, urls["pg"], stmt)
    for stmt in _my_ddl():
        query(my, urls["maria"], stmt)
    topo = _topology(tmp_path, urls)
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    for table, col, role in (("k", "k", "the key"), ("u", "email", "in UNIQUE (email)")):
        assert (
            f"site 'maria': table '{table}', column '{col}' ({role}) has collation utf8mb4_general_ci, which takes "
            "letters differing only in case or accents ('a' and 'A'" in err
        ), err
        assert f"ALTER TABLE `{table}` MODIFY `{col}` VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL" in err
    assert "'pg' (PostgreSQL) keeps them apart" in err, err
    assert _mm_tables(pg, urls["pg"]) == [] and _mm_tables(my, urls["maria"]) == []

    # the fix init names: then init installs, warning of trailing spaces only, and 'a' / 'A',
    # 'e' / 'é' replicate exactly; 'x' / 'x ' (one value under a PAD SPACE collation, and in
    # multimaster's own utf8mb4_bin tables) are held at MariaDB, named, while the rest flows
    for table, col in (("k", "k"), ("u", "email")):
        query(
            my,
            urls["maria"],
            f"ALTER TABLE `{table}` MODIFY `{col}` VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
        )
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert (
        "warning: site 'maria': table 'k', column 'k' (the key) has collation utf8mb4_bin, which takes texts differing only "
        "in trailing spaces ('x' and 'x ') as one value, while 'pg' (PostgreSQL) keeps them apart" in err
    ), err
    query(pg, urls["pg"], "INSERT INTO k VALUES ('a', 'lower'), ('A', 'upper'), ('é', 'accent'), ('e', 'plain')")
    query(pg, urls["pg"], "INSERT INTO u (email, v) VALUES ('ann@x', 'lower'), ('ANN@x', 'upper')")
    query(pg, urls["pg"], "INSERT INTO k VALUES ('x', 'bare')")
    query(pg, urls["pg"], "INSERT INTO k VALUES ('x ', 'spaced')")
    query(pg, urls["pg"], "INSERT INTO u (email, v) VALUES ('bo@x', 'bare')")
    query(pg, urls["pg"], "INSERT INTO u (email, v) VALUES ('bo@x ', 'spaced')")
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == [], r.stdout
    query(my, urls["maria"], "UPDATE k SET v = 'upper, at maria' WHERE k = 'A'")
    query(my, urls["maria"], "DELETE FROM k WHERE k = 'e'")
    query(pg, urls["pg"], "UPDATE u SET v = 'lower, at pg' WHERE email = 'ann@x'")
    r = mm("refresh", "-t", str(topo), "--until-quiet")
    want_k = [("A", "upper, at maria"), ("a", "lower"), ("x", "bare"), ("é", "accent")]
    want_u = [("ANN@x", "upper"), ("ann@x", "lower, at pg"), ("bo@x", "bare")]
    assert sorted(query(my, urls["maria"], "SELECT k, v FROM k")) == want_k
    assert sorted(query(pg, urls["pg"], "SELECT k, v FROM k WHERE k <> 'x '")) == want_k
    assert sorted(query(my, urls["maria"], "SELECT email, v FROM u")) == want_u
    assert sorted(query(pg, urls["pg"], "SELECT email, v FROM u WHERE email <> 'bo@x '")) == want_u
    held = {e["table"]: e for e in json.loads(mm("errors", "-t", str(topo), "--json").stdout) if e["state"] == "failed"}
    assert sorted(held) == ["k", "u"], held
    assert held["k"]["error"].startswith("value refused: site 'maria' (MySQL): k.k = 'x ' is the same value as 'x'"), held["k"]
    assert (
        "u.email = 'bo@x ' is the same value as 'bo@x', which a row here holds, under the column's collation, not as text: "
        "email's collation utf8mb4_bin takes texts differing only in trailing spaces"
    ) in held["u"]["error"], held["u"]
    assert "Fix: change one of the two values at its origin (trailing spaces trimmed)" in held["u"]["error"]


def test_mariadb_only_warns_and_a_collision_is_held_naming_value_and_collation(servers, tmp_path):  # type: ignore[no-untyped-def]
    """Two MariaDB sites with utf8mb4_general_ci: they compare alike, so init installs and warns.
    'a' at one site and 'A' at the other, concurrently (and 'ann@x' / 'ANN@x' in a UNIQUE column),
    are held at each site with an error naming the value, the row's value it equals, the collation
    and the fix (before: the bare "Duplicate entry 'A' for key 'PRIMARY'"). The fix named, then
    `errors retry`: both rows at both sites."""
    my = servers["mysql"]
    urls = {s: my.new_site(tmp_path, s) for s in ("a", "b")}
    for url in urls.values():
        for stmt in _my_ddl():
            query(my, url, stmt)
    topo = _topology(tmp_path, urls)
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert err.count("warning: table 'k', column 'k' (the key) has collation utf8mb4_general_ci at 'a', 'b'") == 1, err
    assert "warning: table 'u', column 'email' (in UNIQUE (email)) has collation utf8mb4_general_ci" in err, err

    query(my, urls["a"], "INSERT INTO k VALUES ('a', 'at a')")
    query(my, urls["b"], "INSERT INTO k VALUES ('A', 'at b')")
    query(my, urls["a"], "INSERT INTO u (email, v) VALUES ('ann@x', 'at a')")
    query(my, urls["b"], "INSERT INTO u (email, v) VALUES ('ANN@x', 'at b')")
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == [], r.stdout
    held = {(e["site"], e["table"]): e["error"] for e in json.loads(mm("errors", "-t", str(topo), "--json").stdout)}
    assert sorted(held) == [("a", "k"), ("a", "u"), ("b", "k"), ("b", "u")], held
    assert held[("a", "k")].startswith(
        "value refused: site 'a' (MySQL): k.k = 'A' is the same value as 'a', which a row here holds, under the column's "
        "collation, not as text: k's collation utf8mb4_general_ci takes letters differing only in case"
    ), held[("a", "k")]
    assert "u.email = 'ann@x' is the same value as 'ANN@x'" in held[("b", "u")], held[("b", "u")]
    for e in held.values():
        assert "COLLATE utf8mb4_bin NOT NULL" in e and "errors retry" in e and "errors skip" in e, e

    for url in urls.values():
        for table, col in (("k", "k"), ("u", "email")):
            query(
                my, url, f"ALTER TABLE `{table}` MODIFY `{col}` VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
            )
    r = mm("errors", "retry", "-t", str(topo), "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    for url in urls.values():
        assert sorted(query(my, url, "SELECT k, v FROM k")) == [("A", "at b"), ("a", "at a")]
        assert sorted(query(my, url, "SELECT email, v FROM u")) == [("ANN@x", "at b"), ("ann@x", "at a")]


def test_a_utf8mb3_column_holds_an_emoji_by_name_and_the_rest_flows(servers, tmp_path):  # type: ignore[no-untyped-def]
    """An emoji written at PostgreSQL into a column MariaDB declares utf8mb3: held at MariaDB as a
    value that does not fit, naming table, column, value, character and the fix (before: the
    driver's "Incorrect string value: '\\xF0\\x9F\\x98\\x80'" for the whole source transaction);
    the column made utf8mb4, `errors retry` applies it exactly."""
    pg, my = servers["postgresql"], servers["mysql"]
    urls = {"pg": pg.new_site(tmp_path, "pg"), "maria": my.new_site(tmp_path, "maria")}
    query(pg, urls["pg"], "CREATE TABLE t (id SERIAL PRIMARY KEY, note TEXT, label VARCHAR(20))")
    query(
        my,
        urls["maria"],
        "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, note TEXT, label VARCHAR(20) CHARACTER SET utf8mb3)",
    )
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    query(pg, urls["pg"], "INSERT INTO t (note, label) VALUES ('emoji', 'ok 😀')")
    query(pg, urls["pg"], "INSERT INTO t (note, label) VALUES ('plain', 'ok é €')")
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == [], r.stdout
    held = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
    assert [(e["site"], e["change"]["values"]["note"]) for e in held] == [("maria", "emoji")], held
    assert (
        "t.label (text): text 'ok 😀' with character '😀' (U+1F600) at position 4, which MySQL's character set utf8mb3"
        in held[0]["error"]
    ), held[0]["error"]
    assert "CHARACTER SET utf8mb4" in held[0]["error"] and "Incorrect string value" not in held[0]["error"]
    assert query(my, urls["maria"], "SELECT note, label FROM t") == [("plain", "ok é €")]

    query(my, urls["maria"], "ALTER TABLE t MODIFY label VARCHAR(20) CHARACTER SET utf8mb4")
    r = mm("errors", "retry", "-t", str(topo), "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(query(my, urls["maria"], "SELECT note, label FROM t")) == [("emoji", "ok 😀"), ("plain", "ok é €")]


def test_add_site_refuses_a_case_insensitive_key_beside_postgresql(servers, tmp_path):  # type: ignore[no-untyped-def]
    """add-site of a MariaDB site whose key column is utf8mb4_general_ci, copied from PostgreSQL:
    refused as init refuses it, before anything is copied (before: the copy failed with the driver's
    "Duplicate entry 'a' for key 'PRIMARY'", naming neither the collation nor a fix)."""
    pg, my = servers["postgresql"], servers["mysql"]
    urls = {"pg": pg.new_site(tmp_path, "pg"), "maria": my.new_site(tmp_path, "maria")}
    query(pg, urls["pg"], PG_DDL[0])
    query(my, urls["maria"], _my_ddl()[0])
    doc = {"sites": {"pg": {"url": urls["pg"]}}, "tables": {"k": {"key": "k"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    query(pg, urls["pg"], "INSERT INTO k VALUES ('a', 'lower'), ('A', 'upper')")
    doc["sites"]["maria"] = {"url": urls["maria"]}
    topo.write_text(yaml.safe_dump(doc))
    r = mm("add-site", "-t", str(topo), "maria", "--from", "pg")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "site 'maria': table 'k', column 'k' (the key) has collation utf8mb4_general_ci" in err, err
    assert "COLLATE utf8mb4_bin NOT NULL" in err, err
    assert query(my, urls["maria"], "SELECT count(*) FROM k") == [(0,)] and _mm_tables(my, urls["maria"]) == []


def test_keys_differing_only_in_trailing_spaces_are_held_by_name_under_an_exact_key_collation(servers, tmp_path):  # type: ignore[no-untyped-def]
    """A MariaDB key declared utf8mb4_nopad_bin keeps 'x' and 'x ' apart, but multimaster's own
    tables there (utf8mb4_bin) hold its identities 'k:x' and 'k:x ' as one: the second key is held,
    its error naming both keys and why (before: "Duplicate entry 'k:x ' for key 'PRIMARY'", a
    value the user never wrote)."""
    pg, my = servers["postgresql"], servers["mysql"]
    urls = {"pg": pg.new_site(tmp_path, "pg"), "maria": my.new_site(tmp_path, "maria")}
    query(pg, urls["pg"], PG_DDL[0])
    query(my, urls["maria"], _my_ddl("utf8mb4_nopad_bin")[0])
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"k": {"key": "k"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    r = mm("init", "-t", str(topo))
    assert r.returncode == 0 and "collation" not in r.stderr, r.stdout + r.stderr
    query(pg, urls["pg"], "INSERT INTO k VALUES ('x', 'bare')")
    query(pg, urls["pg"], "INSERT INTO k VALUES ('x ', 'spaced')")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1
    held = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
    assert [(e["site"], e["change"]["key"]) for e in held] == [("maria", "x ")], held
    assert (
        "k: the key 'x ' differs from the key 'x', which a row here has, only in trailing spaces, which multimaster's own "
        "tables at this site (collation utf8mb4_bin) ignore" in held[0]["error"]
    ), held[0]["error"]
    assert query(my, urls["maria"], "SELECT k, v FROM k") == [("x", "bare")]


def test_init_refuses_a_unique_column_whose_binary_collation_multimaster_cannot_compare(servers, tmp_path):  # type: ignore[no-untyped-def]
    """A UNIQUE column declared utf8mb4_nopad_bin: the UNIQUE check at apply compares it with the
    snapshot's utf8mb4_bin column, which the server refuses ("Illegal mix of collations"), so every
    change of the table was held (before: init installed it without a word)."""
    my = servers["mysql"]
    urls = {s: my.new_site(tmp_path, s) for s in ("a", "b")}
    for url in urls.values():
        query(my, url, _my_ddl("utf8mb4_nopad_bin")[1])
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"u": {"key": "id"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    r = mm("init", "-t", str(topo))
    assert r.returncode == 2, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert (
        "site 'a': table 'u', column 'email' (in UNIQUE (email)) has collation utf8mb4_nopad_bin: the server refuses to "
        "compare utf8mb4_nopad_bin with multimaster's utf8mb4_bin" in err
    ), err
    assert "COLLATE utf8mb4_bin NOT NULL" in err and _mm_tables(my, urls["a"]) == []


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE k (k VARCHAR(100) CHARACTER SET utf8mb3 COLLATE utf8mb3_bin PRIMARY KEY, v TEXT)",
        "CREATE TABLE k (k VARCHAR(100) PRIMARY KEY, v TEXT) DEFAULT CHARSET=utf8mb3 COLLATE=utf8mb3_bin",
    ],
    ids=["column", "table"],
)
def test_an_emoji_in_a_utf8mb3_key_is_held_by_name_and_the_link_goes_on(servers, tmp_path, ddl):  # type: ignore[no-untyped-def]
    """A natural text key written at PostgreSQL with an emoji, for a MariaDB key column that is
    utf8mb3 (declared on the column, or the table's default): held at MariaDB as a key that does
    not fit, naming site, table, the key column, the value, the character and the fix; the link's
    other changes applied (before: for the column's own character set, the link failed as a whole
    on the snapshot, 'Incorrect string value ... `_mm_snap_k__pg`.`key`', nothing applied; for the
    table's, the change held with the bare "Incorrect string value"). The key column made
    utf8mb4, `errors retry` applies it exactly."""
    pg, my = servers["postgresql"], servers["mysql"]
    urls = {"pg": pg.new_site(tmp_path, "pg"), "maria": my.new_site(tmp_path, "maria")}
    query(pg, urls["pg"], PG_DDL[0])
    query(my, urls["maria"], ddl)
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"k": {"key": "k"}}, "links": "mesh"}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    query(pg, urls["pg"], "INSERT INTO k VALUES ('ok 😀', 'emoji')")
    query(pg, urls["pg"], "INSERT INTO k VALUES ('plain é', 'plain')")
    r = mm("refresh", "-t", str(topo), "--until-quiet", "--json")
    assert r.returncode == 1 and [lk for run in json.loads(r.stdout) for lk in run["links"] if lk["error"]] == [], r.stdout
    held = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
    assert [(e["site"], e["table"], e["change"]["key"], e["change"]["values"]) for e in held] == [
        ("maria", "k", "ok 😀", {"v": "emoji"})
    ], held
    err = held[0]["error"]
    assert err.startswith(
        "value refused: site 'maria' (MySQL) cannot store exactly a value of this change (written at 'pg', pulled from "
        "'pg'): k.k (text, the key): text 'ok 😀' with character '😀' (U+1F600) at position 4, which MySQL's character "
        "set utf8mb3"
    ), err
    assert "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin" in err and "Incorrect string value" not in err, err
    assert query(my, urls["maria"], "SELECT k, v FROM k") == [("plain é", "plain")]

    query(my, urls["maria"], "ALTER TABLE k MODIFY k VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL")
    r = mm("errors", "retry", "-t", str(topo), "--all")
    if "CHARACTER SET utf8mb3" in ddl:
        # multimaster's own tables keep the key as the column declared it at init (a character
        # set is not part of a column's type MariaDB reports, so no schema follow sees it): still
        # held, named, nothing lost (docs/types.md "Values a site cannot store")
        assert r.returncode == 1 and "#1 still held" in r.stdout, r.stdout + r.stderr
        (e,) = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
        assert "k.k (text, the key): the snapshot here refuses it" in e["error"] and "_mm_snap_k__pg" in e["error"], e
        return
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(query(my, urls["maria"], "SELECT k, v FROM k")) == [("ok 😀", "emoji"), ("plain é", "plain")]
    query(pg, urls["pg"], "UPDATE k SET v = 'emoji, again' WHERE k = 'ok 😀'")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    assert sorted(query(my, urls["maria"], "SELECT k, v FROM k")) == [("ok 😀", "emoji, again"), ("plain é", "plain")]


TRAILING = {  # table: (SQLite / PostgreSQL DDL, MariaDB DDL, key, column)
    "k": ("CREATE TABLE k (k VARCHAR(100) PRIMARY KEY, v TEXT)", _my_ddl("utf8mb4_bin")[0], "k", "k"),
    "u": (
        "CREATE TABLE u (id INTEGER PRIMARY KEY, email VARCHAR(100) NOT NULL UNIQUE, v TEXT)",
        _my_ddl("utf8mb4_bin")[1],
        "id",
        "email",
    ),
    "k-nopad": ("CREATE TABLE k (k VARCHAR(100) PRIMARY KEY, v TEXT)", _my_ddl("utf8mb4_nopad_bin")[0], "k", "k"),
}


@pytest.mark.parametrize(
    "source,table,how",
    [
        ("sqlite", "k", "init"),
        ("sqlite", "u", "add-site"),
        ("postgresql", "k", "add-site"),
        ("postgresql", "k-nopad", "add-site"),
    ],
)
def test_a_copy_of_two_values_differing_in_trailing_spaces_is_refused_naming_both(tmp_path, source, table, how):  # type: ignore[no-untyped-def]
    """'a' and 'a ' held side by side at SQLite / PostgreSQL, copied into an empty MariaDB site
    (init's copy of an empty site, or add-site) whose key or UNIQUE column is utf8mb4_bin (PAD
    SPACE: one value there), or whose key is utf8mb4_nopad_bin (multimaster's own tables there hold
    the identities 'k:a' and 'k:a ' as one): refused, exit 2, naming the table, column, both values
    and the fix, nothing kept (before: exit 1, the database's bare "Duplicate entry 'a ' for key
    'PRIMARY'"). The UNIQUE value changed at the source, the copy is made, both sites alike (a key
    cannot be: deleted, its identity stays there as a tombstone, which the copy carries)."""
    src, my = made(source), made("mysql")
    try:
        src_ddl, my_ddl, key, col = TRAILING[table]
        tb = table.split("-")[0]
        urls = {"src": src.new_site(tmp_path, "src"), "maria": my.new_site(tmp_path, "maria")}
        query(src, urls["src"], src_ddl)
        query(my, urls["maria"], my_ddl)
        doc: dict[str, Any] = {"sites": {"src": {"url": urls["src"]}}, "tables": {tb: {"key": key}}, "links": "mesh"}
        topo = tmp_path / "topology.yaml"
        if how == "add-site":
            topo.write_text(yaml.safe_dump(doc))
            assert mm("init", "-t", str(topo)).returncode == 0
        query(src, urls["src"], f"INSERT INTO {tb} ({col}, v) VALUES ('a', 'bare'), ('a ', 'spaced'), ('b', 'other')")
        doc["sites"]["maria"] = {"url": urls["maria"]}
        topo.write_text(yaml.safe_dump(doc))
        cmd = ["init", "-t", str(topo)] if how == "init" else ["add-site", "-t", str(topo), "maria", "--from", "src"]
        r = mm(*cmd)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
        err = " ".join(r.stderr.split())
        assert "site 'maria' cannot hold two rows of 'src' that it takes as one value: " in err, err
        if table == "k-nopad":
            assert "k: the key 'a ' differs from the key 'a', which a row here has, only in trailing spaces" in err, err
        else:
            assert f"{tb}.{col} = 'a ' is the same value as 'a'" in err and "collation utf8mb4_bin" in err, err
        assert "Nothing of the copy was kept. Fix: change one of the two values at 'src' (trailing spaces trimmed)" in err
        assert "Duplicate entry" not in err, err
        assert query(my, urls["maria"], f"SELECT count(*) FROM {tb}") == [(0,)]

        if tb == "k":  # a key deleted there stays an identity, its tombstone, which the copy carries
            assert "the copy carries the deleted key's identity, its tombstone, until 'multimaster purge'" in err, err
            return
        query(src, urls["src"], f"UPDATE {tb} SET {col} = 'a2' WHERE {col} = 'a '")
        r = mm(*cmd)
        assert r.returncode == 0, r.stdout + r.stderr
        assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
        want = [("a", "bare"), ("a2", "spaced"), ("b", "other")]
        assert sorted(query(my, urls["maria"], f"SELECT {col}, v FROM {tb}")) == want
        assert sorted(query(src, urls["src"], f"SELECT {col}, v FROM {tb}")) == want
    finally:
        src.cleanup()
        my.cleanup()


@pytest.mark.parametrize("agent", ["current", "old"])
def test_add_site_sees_the_collations_of_a_peer_reached_through_its_agent(servers, tmp_path, monkeypatch, agent):  # type: ignore[no-untyped-def]
    """add-site of a PostgreSQL site copying a MariaDB peer, reached through its agent, whose key
    is utf8mb4_general_ci: refused as from its database, naming the peer's collation (before: the
    agent's description carried no collation, the peer read as exact, and add-site installed it
    without a word). An agent that predates collations in its description (`old`, its answer
    without them): its columns read as exact, as before, and add-site says so."""
    from test_agent import TOKEN, running_agent

    from multimaster.config.topology import load_topology
    from multimaster.engine import wire
    from multimaster.errors import SchemaError
    from multimaster.ops.instantiate import add_site

    monkeypatch.setenv("MM_AGENT_TOKEN", TOKEN)
    pg, my = servers["postgresql"], servers["mysql"]
    urls = {"maria": my.new_site(tmp_path, "maria"), "pg": pg.new_site(tmp_path, "pg")}
    query(my, urls["maria"], _my_ddl()[0])
    query(pg, urls["pg"], PG_DDL[0])
    doc: dict[str, Any] = {
        "sites": {"maria": {"url": urls["maria"], "token": "${MM_AGENT_TOKEN}"}},
        "tables": {"k": {"key": "k"}},
        "links": "mesh",
    }
    (tmp_path / "maria.yaml").write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(tmp_path / "maria.yaml")).returncode == 0
    query(my, urls["maria"], "INSERT INTO k VALUES ('a', 'lower')")
    if agent == "old":
        new = wire.description_of
        monkeypatch.setattr(wire, "description_of", lambda i, d: {k: v for k, v in new(i, d).items() if k != "collations"})
    said: list[str] = []
    with running_agent(load_topology(tmp_path / "maria.yaml"), "maria") as url:
        doc["sites"] = {"maria": {"url": url, "token": "${MM_AGENT_TOKEN}"}, "pg": {"url": urls["pg"]}}
        (tmp_path / "pg.yaml").write_text(yaml.safe_dump(doc))
        host = load_topology(tmp_path / "pg.yaml")
        if agent == "current":
            with pytest.raises(SchemaError) as e:
                add_site(host, "pg", "maria", progress=lambda m: said.append(str(m)))
            err = " ".join(str(e.value).split())
            assert (
                "site 'maria': table 'k', column 'k' (the key) has collation utf8mb4_general_ci, which takes letters "
                "differing only in case or accents ('a' and 'A'" in err
            ), err
            assert "while 'pg' (PostgreSQL) keeps them apart" in err and "agent older" not in err, err
            assert query(pg, urls["pg"], "SELECT count(*) FROM k") == [(0,)]
        else:
            rep = add_site(host, "pg", "maria", progress=lambda m: said.append(str(m)))
            assert rep.rows == {"k": 1}
            assert any(
                "site 'maria' is reached through an agent older than multimaster's session 36, which does not report "
                "collations: its columns were taken as comparing exactly" in m
                for m in said
            ), said
