"""verify --repair-from --apply with a reference value a target cannot store exactly ('12abc' in a
SQLite INTEGER at the reference, docs/verify.md): before, the target's whole repair failed
("ValueError: '12abc' is not a number", rolled back, exit 2), every other row of that site left
unrepaired. Now that row is named (site, table, key, column, value, why, fix) and left as it is,
every other row is repaired, and the command exits 1."""

from __future__ import annotations

import json

from mm_spark_helpers import sql_site, uncaptured
from typer.testing import CliRunner

from multimaster.cli import app
from multimaster.config.topology import load_topology


def test_repair_names_a_value_a_target_cannot_store_and_repairs_the_rest(spark, cluster):
    with uncaptured(cluster, "s1") as c:  # the reference holds a value no integer column holds
        c.execute("UPDATE items SET qty = '12abc' WHERE id = 20")
    with uncaptured(cluster, "s3") as c:  # and s3 differs elsewhere: repaired all the same
        c.execute("UPDATE items SET name = 'x' WHERE id BETWEEN 30 AND 31")
    urls = {s: cfg.url for s, cfg in load_topology(cluster).sites.items()}
    before = {s: sql_site(u).execute("SELECT qty FROM items WHERE id = 20").fetchone()[0] for s, u in urls.items()}
    r = CliRunner().invoke(app, ["verify", "-t", str(cluster), "--repair-from", "s1", "--apply", "--json"])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "ValueError" not in r.output, r.output
    out = json.loads(r.stdout)
    sites = out["repair"]["sites"]
    assert {s: v["status"] for s, v in sites.items()} == {"s2": "applied", "s3": "applied"}, sites
    for s in ("s2", "s3"):
        (u,) = sites[s]["unfit"]
        assert (u["table"], u["key"], u["column"], u["value"]) == ("items", 20, "qty", "'12abc'"), u
        assert "not a number" in u["why"] and "s1" in u["fix"], u
    # nothing of row 20 changed at the targets; s3's other rows were repaired
    for s in ("s2", "s3"):
        con = sql_site(urls[s])
        assert con.execute("SELECT qty FROM items WHERE id = 20").fetchone()[0] == before[s]
        names = con.execute("SELECT name FROM items WHERE id BETWEEN 30 AND 31").fetchall()
        con.close()
        assert "x" not in [n for (n,) in names], (s, names)
    txt = CliRunner().invoke(app, ["verify", "-t", str(cluster), "--repair-from", "s1", "--apply"])
    assert txt.exit_code == 1, txt.output
    assert "site 's2': table 'items', key 20, column 'qty'" in txt.output and "'12abc'" in txt.output, txt.output
