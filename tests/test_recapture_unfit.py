"""`multimaster recapture` with values the other site cannot store exactly (docs/schema-changes.md
"A table made again", docs/types.md "Values a site cannot store"): a SQLite site whose table was
made again holds '12abc' in an INTEGER, a text too long for the peer's VARCHAR(10), 2 in a
BOOLEAN. Before, the command failed whole on the first such row ("error: ValueError: '12abc' is
not a number"), nothing sent; 2 compared equal to true and was never named. Now each such row is
named (table, key, column, value, why, fix) and not sent, every other row is, the command exits 1
and the capture gap stays open until the values are fixed and recapture runs again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from clusters import Backend, mm, query

DDL = {
    "sqlite": "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT, n INTEGER, v VARCHAR(10), ok BOOLEAN)",
    "postgresql": "CREATE TABLE t (id SERIAL PRIMARY KEY, note TEXT, n INTEGER, v VARCHAR(10), ok BOOLEAN)",
    "mysql": "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, note TEXT, n INTEGER, v VARCHAR(10), ok BOOLEAN)",
}


def _remake(url: str, lite: Backend) -> None:
    """`t` made again at the SQLite site as a migration tool does (its capture triggers gone)."""
    c = lite.connect(url)
    c.isolation_level = None
    cur = c.cursor()
    cur.execute("BEGIN")
    cur.execute(DDL["sqlite"].replace("TABLE t", "TABLE new__t"))
    cur.execute("INSERT INTO new__t SELECT id, note, n, v, ok FROM t")
    cur.execute("DROP TABLE t")
    cur.execute("ALTER TABLE new__t RENAME TO t")
    cur.execute("COMMIT")
    c.close()


@pytest.mark.parametrize("peer", ["postgresql", "mysql"])
def test_recapture_names_values_the_peer_cannot_store_and_sends_the_rest(mixed, tmp_path: Path, peer: str) -> None:
    lite, other = mixed["sqlite"], mixed[peer]
    urls = {"lite": lite.new_site(tmp_path, "lite"), "p": other.new_site(tmp_path, "p")}
    query(lite, urls["lite"], DDL["sqlite"])
    query(other, urls["p"], DDL[peer])
    topo = tmp_path / "topology.yaml"
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"}
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    for i in range(5):
        query(lite, urls["lite"], f"INSERT INTO t (note, n, v, ok) VALUES ('r{i}', {i}, 'x', 1)")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    before = query(other, urls["p"], "SELECT id, note, n, v, ok FROM t ORDER BY id")

    _remake(urls["lite"], lite)
    query(lite, urls["lite"], "UPDATE t SET n = '12abc' WHERE note = 'r0'")  # no integer
    query(lite, urls["lite"], "UPDATE t SET v = 'far too long text' WHERE note = 'r1'")  # 17 > VARCHAR(10)
    query(lite, urls["lite"], "UPDATE t SET ok = 2, n = 20 WHERE note = 'r2'")  # no boolean; n alone fits
    query(lite, urls["lite"], "UPDATE t SET n = 99 WHERE note = 'r3'")  # fits
    query(lite, urls["lite"], "DELETE FROM t WHERE note = 'r4'")
    assert mm("refresh", "-t", str(topo)).returncode == 1  # the gap, reported

    r = mm("recapture", "-t", str(topo), "--site", "lite", "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "error:" not in r.stderr, r.stdout + r.stderr
    (rep,) = json.loads(r.stdout)
    assert (rep["updated"], rep["deleted"], rep["failed"], rep["closed"]) == ([4], [5], [], False), rep
    got = {(u["key"], u["column"]): u for u in rep["unfit"]}
    assert sorted(got) == [(1, "n"), (2, "v"), (3, "ok")], rep["unfit"]
    assert got[(1, "n")]["value"] == "'12abc'" and got[(1, "n")]["site"] == "p" and "not a number" in got[(1, "n")]["why"]
    assert "17 characters" in got[(2, "v")]["why"] and "widen t.v at 'p'" in got[(2, "v")]["fix"]
    assert "errors skip -t FILE --site p" in got[(1, "n")]["fix"] and "widen" not in got[(1, "n")]["fix"]
    assert got[(3, "ok")]["value"] == "2" and "not a boolean" in got[(3, "ok")]["why"]
    assert all("recapture -t FILE --site lite --table t" in u["fix"] for u in rep["unfit"])

    # nothing of a row not sent reached the peer (not even r2's n = 20); the rest did
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1  # the gap stays open
    after = query(other, urls["p"], "SELECT id, note, n, v, ok FROM t ORDER BY id")
    assert after[:3] == before[:3] and [r[:3] for r in after[3:]] == [(4, "r3", 99)], after

    # the text table names every row on stderr
    txt = mm("recapture", "-t", str(topo), "--site", "lite", "--dry-run")
    assert txt.returncode == 1, txt.stdout + txt.stderr
    assert "table 't', key 1, column 'n': not sent: 'p' cannot store exactly the value '12abc'" in txt.stderr, txt.stderr
    assert "key 3, column 'ok'" in txt.stderr and "key 2, column 'v'" in txt.stderr

    # fixed at the site (captured: capture is back), recaptured again: the gap closes, the sites agree
    query(lite, urls["lite"], "UPDATE t SET n = 12 WHERE id = 1")
    query(lite, urls["lite"], "UPDATE t SET v = 'short' WHERE id = 2")
    query(lite, urls["lite"], "UPDATE t SET ok = 0 WHERE id = 3")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1
    # those updates carry the values 'p' cannot store as their old values: held there, by name,
    # and dropped as the fix says (recapture sends the rows again, with p's values as the old ones)
    held = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
    assert sorted((e["site"], e["change"]["key"]) for e in held) == [("p", 1), ("p", 2), ("p", 3)], held
    for e in held:
        assert mm("errors", "skip", "-t", str(topo), "--site", "p", "--id", str(e["id"]), "--reason", "old value").returncode == 0
    again = mm("recapture", "-t", str(topo), "--site", "lite", "--json")
    (rep,) = json.loads(again.stdout)
    assert again.returncode == 0 and rep["closed"] and rep["unfit"] == [] and rep["updated"] == [1, 2, 3], (
        again.stdout + again.stderr
    )
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    final = query(other, urls["p"], "SELECT id, n, v, ok FROM t ORDER BY id")
    assert [(k, n, v, bool(ok)) for k, n, v, ok in final] == [
        (1, 12, "x", True),
        (2, 1, "short", True),
        (3, 20, "x", False),
        (4, 99, "x", True),
    ]


def test_recapture_names_a_peer_value_the_site_cannot_store(mixed, tmp_path: Path) -> None:
    """The update recapture sends writes the peer's values at the site first: a PostgreSQL
    'infinity' (whose change the SQLite site held, and was skipped there) cannot be; before, the
    command failed whole ("'infinity' is not an ISO-8601 date and time"); now that row is named, the rest sent."""
    lite, pg = mixed["sqlite"], mixed["postgresql"]
    urls = {"lite": lite.new_site(tmp_path, "lite"), "p": pg.new_site(tmp_path, "p")}
    query(lite, urls["lite"], "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT, n INTEGER, until TIMESTAMP)")
    query(pg, urls["p"], "CREATE TABLE t (id SERIAL PRIMARY KEY, note TEXT, n INTEGER, until TIMESTAMP)")
    topo = tmp_path / "topology.yaml"
    doc = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"t": {"key": "id"}}, "links": "mesh"}
    topo.write_text(yaml.safe_dump(doc))
    assert mm("init", "-t", str(topo)).returncode == 0
    for i in range(2):
        query(lite, urls["lite"], f"INSERT INTO t (note, n, until) VALUES ('r{i}', {i}, '2024-06-01 12:00:00')")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 0
    query(pg, urls["p"], "UPDATE t SET until = 'infinity' WHERE id = 1")
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1  # held at lite
    (e,) = json.loads(mm("errors", "-t", str(topo), "--json").stdout)
    assert mm("errors", "skip", "-t", str(topo), "--site", "lite", "--id", str(e["id"]), "--reason", "x").returncode == 0

    c = lite.connect(urls["lite"])
    c.isolation_level = None
    cur = c.cursor()
    cur.execute("BEGIN")
    cur.execute("CREATE TABLE new__t (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT, n INTEGER, until TIMESTAMP)")
    cur.execute("INSERT INTO new__t SELECT id, note, n, until FROM t")
    cur.execute("DROP TABLE t")
    cur.execute("ALTER TABLE new__t RENAME TO t")
    cur.execute("COMMIT")
    c.close()
    query(lite, urls["lite"], "UPDATE t SET until = '2025-01-01 00:00:00' WHERE id = 1")
    query(lite, urls["lite"], "UPDATE t SET n = 50 WHERE id = 2")
    assert mm("refresh", "-t", str(topo)).returncode == 1

    r = mm("recapture", "-t", str(topo), "--site", "lite", "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "error:" not in r.stderr, r.stdout + r.stderr
    (rep,) = json.loads(r.stdout)
    assert (rep["updated"], rep["closed"]) == ([2], False), rep
    (u,) = rep["unfit"]
    assert (u["key"], u["column"], u["value"], u["site"]) == (1, "until", "'infinity'", "lite"), u
    assert "UPDATE there" in u["fix"] and "at 'p'" in u["fix"]
    assert query(lite, urls["lite"], "SELECT id, n, until FROM t ORDER BY id") == [
        (1, 0, "2025-01-01 00:00:00"),
        (2, 50, "2024-06-01 12:00:00"),
    ]
    assert mm("refresh", "-t", str(topo), "--until-quiet").returncode == 1
    assert query(pg, urls["p"], "SELECT id, n, until::text FROM t ORDER BY id") == [
        (1, 0, "infinity"),
        (2, 50, "2024-06-01 12:00:00"),
    ]
