"""--repair-from: plan (dry run), apply with the capture guard on, verify converged after."""

from __future__ import annotations

import json

from mm_spark_helpers import make_every_kind, sql_site, uncaptured
from typer.testing import CliRunner

from multimaster.cli import app
from multimaster.config.topology import load_topology
from multimaster.spark import verify
from multimaster.spark.repair import apply_plan, plan_repair


def log_counts(cluster):
    topo = load_topology(cluster)
    out = {}
    for s, cfg in topo.sites.items():
        c = sql_site(cfg.url)
        out[s] = (
            c.execute("SELECT count(*) FROM _mm_log_items").fetchone()[0],
            c.execute("SELECT count(*) FROM _mm_log2_items").fetchone()[0],
            c.execute("SELECT applying FROM _mm_state").fetchone()[0],
        )
        c.close()
    return out


def test_plan_then_apply_converges_without_capture(spark, cluster):
    make_every_kind(cluster)
    with uncaptured(cluster, "s2") as c:  # a row only s2 has, with its shadow row
        c.execute("INSERT INTO items VALUES (500, 'stray', 1, 1.0)")
        c.execute("INSERT INTO _mm_shadow_items(rid, key) VALUES ('0000000005000000000:s2', 500)")
    before = log_counts(cluster)
    plan = plan_repair(cluster, "s1", spark=spark)
    c = plan.counts()
    assert c["s2"]["items"] == {"delete": 1, "insert": 1, "rekey": 1, "update": 0}
    assert c["s3"]["items"] == {"delete": 0, "insert": 1, "rekey": 1, "update": 1}
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["reference"] == "s1" and d["total"] == plan.total == 6
    # the dry run changed nothing
    assert not verify(cluster, spark=spark).converged
    apply_plan(cluster, plan)
    res = verify(cluster, spark=spark)
    assert res.converged, res.to_dict()["tables"]["items"]["counts"]
    assert log_counts(cluster) == before  # nothing captured, guard reset
    # the shadow rows were copied from the reference (rid, key, deleted, versions)
    shadows = {}
    for s, cfg in load_topology(cluster).sites.items():
        con = sql_site(cfg.url)
        shadows[s] = con.execute("SELECT * FROM _mm_shadow_items WHERE key IN (7, 9, 100009, 500) ORDER BY rid").fetchall()
        con.close()
    assert shadows["s2"] == shadows["s1"] and shadows["s3"] == shadows["s1"]


def test_cli_repair_dry_run_then_apply(spark, cluster):
    with uncaptured(cluster, "s3") as c:
        c.execute("UPDATE items SET name = 'x' WHERE id BETWEEN 10 AND 14")
    runner = CliRunner()
    r = runner.invoke(app, ["verify", "-t", str(cluster), "--repair-from", "s1", "--json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    assert out["repair"]["applied"] is False and out["repair"]["plan"]["counts"]["s3"]["items"]["update"] == 5
    r = runner.invoke(app, ["verify", "-t", str(cluster), "--repair-from", "s1", "--apply"])
    assert r.exit_code == 0, r.output
    assert "After the repair" in r.output and "CONVERGED" in r.output
