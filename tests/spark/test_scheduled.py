"""Scheduled checks with Spark: the daemon's job run once (not waiting for its cron) against a real
three-site SQLite cluster built and replicated by the core engine, and `multimaster verify --record`
(in this process; in a process of its own in test_standalone.py). The topology/storage side without Spark is in tests/test_verifications.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import yaml
from typer.testing import CliRunner

from multimaster import api
from multimaster.cli import app
from multimaster.config.topology import load_topology
from multimaster.ops import verifications
from multimaster.ops.daemon import Daemon


def core_cluster(tmp_path: Path, verify: dict | None) -> Path:
    urls = {}
    for i, s in enumerate(("s1", "s2", "s3")):
        p = tmp_path / f"{s}.db"
        c = sqlite3.connect(p)
        c.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)")
        if i == 0:
            c.executemany("INSERT INTO items VALUES (?,?,?,?)", [(k, f"n{k}", k, k / 4) for k in range(1, 31)])
        c.commit()
        c.close()
        urls[s] = f"sqlite:///{p}"
    doc: dict = {"sites": {s: {"url": u} for s, u in urls.items()}, "tables": {"items": {"key": "id"}}, "links": "mesh"}
    if verify is not None:
        doc["verify"] = verify
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    api.init(load_topology(path))
    return path


def test_the_scheduled_job_stores_converged_then_converging(spark, tmp_path):  # type: ignore[no-untyped-def]
    path = core_cluster(tmp_path, {"cron": "0 3 * * *", "site": "s2", "tables": ["items"], "master": "local[2]"})
    topo = load_topology(path)
    d = Daemon(topo, ["s2"])
    try:
        out = d.run_verify()  # what the cron job calls
        assert out is not None and out["error"] is None, out
        v = verifications.last(topo)
        assert v is not None and v["site"] == "s2" and v["source"] == "scheduled"
        assert v["converged"] is True and v["status"] == "converged" and v["tables"] == {"items": "converged"}
        assert v["summary"]["tables"]["items"]["rows"] == {"s1": 30, "s2": 30, "s3": 30}
        first_session = d._spark
        c = sqlite3.connect(tmp_path / "s3.db")  # a change not yet replicated: the next run sees it on its way
        c.execute("INSERT INTO items(name, qty, price) VALUES ('new at s3', 1, 2.5)")
        c.commit()
        c.close()
        d.run_verify()
        assert d._spark is first_session  # one session, reused
        v2 = api.status(topo)["verification"]
        assert v2["id"] > v["id"] and v2["converged"] is False and v2["tables"] == {"items": "converging"}
        assert v2["summary"]["tables"]["items"]["counts"]["missing"] == {"s1": 1, "s2": 1, "s3": 0}
    finally:
        d.stop()  # the session belongs to the test run: the daemon leaves it running
    assert not spark.sparkContext._jsc.sc().isStopped()


def test_verify_record_through_the_cli(spark, tmp_path):  # type: ignore[no-untyped-def]
    """`multimaster verify --record` run in this process (CliRunner: the command finds the tests'
    SparkSession active and uses it). The same command in a process of its own, starting its own
    Spark, records its run in test_standalone.py."""
    path = core_cluster(tmp_path, None)  # no verify section: recorded at the first site
    r = CliRunner().invoke(app, ["verify", "-t", str(path), "--master", "local[1]", "--partitions", "1", "--json", "--record"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["converged"] is True
    v = verifications.last(load_topology(path))
    assert v is not None and v["site"] == "s1" and v["source"] == "manual" and v["converged"] is True
    assert v["summary"]["sites"] == ["s1", "s2", "s3"]
