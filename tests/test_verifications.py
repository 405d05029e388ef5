"""Scheduled checks without Spark: the topology's `verify:` section, the `_mm_verifications` log
(store / read on every backend), `status` showing the last run, and the daemon's job recording a
failure instead of dying. The Spark side (a real run, `verify --record`) is in tests/spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from clusters import ITEMS, SQLiteBackend, make_cluster, mm

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.errors import ConfigError
from multimaster.ops import verifications
from multimaster.spark.result import TableResult, VerifyResult, Waiting

CLI = str(Path(sys.executable).parent / "multimaster")

TOPO = """
sites:
  s1: {url: "sqlite:///s1.db"}
  s2: {url: "sqlite:///s2.db"}
  s3: {url: "sqlite:///s3.db"}
tables:
  items: {key: id}
  other: {key: id}
links: mesh
"""


def write(tmp_path: Path, extra: str) -> Path:
    p = tmp_path / "t.yaml"
    p.write_text(textwrap.dedent(TOPO) + textwrap.dedent(extra))
    return p


# ---- topology --------------------------------------------------------------------------------


def test_files_without_a_verify_section_load_unchanged(tmp_path):  # type: ignore[no-untyped-def]
    t = load_topology(write(tmp_path, ""))
    assert t.verify is None
    assert t.verify_site == "s1"  # where manual --record runs are kept


def test_the_documented_verify_section(tmp_path):  # type: ignore[no-untyped-def]
    t = load_topology(
        write(
            tmp_path,
            """
        verify:
          cron: "0 * * * *"
          tables: [items]
          master: "local[2]"
          site: s2
          checksum_only: true
        """,
        )
    )
    assert t.verify is not None
    assert (t.verify.cron, t.verify.tables, t.verify.master, t.verify.checksum_only) == ("0 * * * *", ["items"], "local[2]", True)
    assert t.verify_site == "s2"
    d = load_topology(write(tmp_path, 'verify: {cron: "*/30 * * * * *"}\n'))  # 6 fields: seconds first, as for links
    assert d.verify is not None and d.verify.tables is None and d.verify.master == "local[*]" and d.verify_site == "s1"


BAD = [
    ('verify: {cron: "0 * * * *", site: s9}\n', "verify.site: site 's9' is not defined under sites"),
    ('verify: {cron: "61 * * * *"}\n', "verify.cron: '61 * * * *' is not a crontab expression"),
    ('verify: {cron: "* * *"}\n', "needs 5 fields"),
    ('verify: {cron: "0 * * * *", tables: [items, nope]}\n', "verify.tables: table 'nope' is not defined under tables"),
    ("verify: {site: s1}\n", "verify.cron: required field is missing"),
    ('verify: {cron: "0 * * * *", every: 5m}\n', "verify.every: unknown field"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[m for _, m in BAD])
def test_a_broken_verify_section_gets_one_readable_problem(tmp_path, extra, message):  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as e:
        load_topology(write(tmp_path, extra))
    assert message in str(e.value)
    assert len(e.value.problems) == 1, e.value.problems
    assert e.value.exit_code == 2


def test_a_check_needs_two_sites_to_compare(tmp_path):  # type: ignore[no-untyped-def]
    text = TOPO.replace('s2: {url: "sqlite:///s2.db"}', 's2: {url: "sqlite:///s2.db", verify: false}').replace(
        's3: {url: "sqlite:///s3.db"}', 's3: {url: "sqlite:///s3.db", verify: false}'
    )
    p = tmp_path / "t.yaml"
    p.write_text(textwrap.dedent(text) + 'verify: {cron: "0 * * * *"}\n')
    with pytest.raises(ConfigError) as e:
        load_topology(p)
    assert "at least two sites" in str(e.value)


# ---- the _mm_verifications log -----------------------------------------------------------------


def a_result(status: str = "converged") -> VerifyResult:
    differing = 0 if status == "converged" else 3
    t = TableResult(
        table="items",
        status=status,
        rows={"s1": 10, "s2": 10, "s3": 10 - differing},
        fingerprints={"s1": "ab"},
        identities=10,
        differing=differing,
        counts={"missing": {"s1": 0, "s2": 0, "s3": differing}},
        columns={},
        samples=[],
        waiting=[Waiting("s1", "s3", differing, 0)],
        seconds=1.25,
    )
    return VerifyResult(
        sites=["s1", "s2", "s3"],
        tables={"items": t},
        master="local[2]",
        mode="full",
        started_at="2026-01-02T03:04:05+00:00",
        seconds=2.5,
    )


def with_verify(cl, **section):  # type: ignore[no-untyped-def]
    """The cluster's topology file with a verify section added, reloaded."""
    path = Path(cl.topo.path)
    doc = yaml.safe_load(path.read_text())
    doc["verify"] = {"cron": "0 3 * * *", **section}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cl.topo = load_topology(path)
    return cl.topo


def test_store_and_read_back_on_every_backend(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS)
    topo = with_verify(cl, site="s2")
    assert verifications.last(topo) is None  # init created the table, nothing recorded yet
    st = api.status(topo)
    assert st["verification"] is None
    vid = verifications.store(topo, a_result("converging"), source="scheduled")
    v = verifications.last(topo)
    assert v is not None and v["id"] == vid and v["site"] == "s2"
    assert (v["converged"], v["status"], v["tables"], v["error"], v["source"]) == (
        False,
        "converging",
        {"items": "converging"},
        None,
        "scheduled",
    )
    assert v["started_at"] == "2026-01-02T03:04:05+00:00" and v["seconds"] == 2.5
    s = v["summary"]  # to_dict() trimmed to statuses and counts
    assert (
        s["tables"]["items"]["counts"] == {"missing": {"s1": 0, "s2": 0, "s3": 3}} and s["tables"]["items"]["waiting_total"] == 3
    )
    assert "samples" not in s["tables"]["items"] and "fingerprints" not in s["tables"]["items"]
    vid2 = verifications.store(
        topo, error="SiteUnreachable: site 's3' is unreachable", started_at="2026-01-02T04:00:00Z", seconds=0.5
    )
    v2 = api.status(topo)["verification"]
    assert v2["id"] == vid2 > vid
    assert (v2["converged"], v2["status"], v2["tables"], v2["summary"], v2["source"]) == (None, "error", {}, None, "manual")
    assert "unreachable" in v2["error"]
    verifications.store(topo, a_result().to_dict())  # the plain dict (e.g. read from a --json run) works as well
    assert verifications.last(topo)["converged"] is True
    api.uninstall(topo)
    assert verifications.last(topo) is None  # uninstall drops it with every other _mm_ object


def test_the_table_is_created_on_first_store_and_old_runs_pruned(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    cl = make_cluster(SQLiteBackend(), tmp_path, ["s1", "s2"], ITEMS, init=False)  # never initialised
    topo = with_verify(cl)
    assert verifications.last(topo) is None
    monkeypatch.setattr(verifications, "KEEP", 3)
    ids = [verifications.store(topo, a_result()) for _ in range(5)]
    import sqlite3

    with sqlite3.connect(cl.urls["s1"].removeprefix("sqlite:///")) as c:
        assert [r[0] for r in c.execute("SELECT id FROM _mm_verifications ORDER BY id")] == ids[-3:]
    api.init(topo)  # init after the fact: the table is already there, kept as it is
    assert verifications.last(topo)["id"] == ids[-1]


# ---- the daemon's job, and status through the CLI ----------------------------------------------


def test_a_failing_scheduled_check_is_recorded_not_raised(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from multimaster.ops.daemon import Daemon

    cl = make_cluster(SQLiteBackend(), tmp_path, ["s1", "s2", "s3"], ITEMS)
    topo = with_verify(cl, site="s3")

    def no_java(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("Java 17 is needed to run Spark")

    monkeypatch.setattr(Daemon, "_spark_session", no_java)
    d = Daemon(topo, ["s3"])
    assert d.verify_site == "s3"
    out = d.run_verify()
    assert out is not None and out["status"] == "error" and "Java 17" in out["error"]
    assert d.stats.verifications == 1 and d.stats.verify_errors == 1
    v = verifications.last(topo)
    assert v is not None and v["site"] == "s3" and v["source"] == "scheduled" and "Java 17" in v["error"]
    assert Daemon(topo, ["s1"]).verify_site is None  # s3's daemon runs it, not s1's
    assert Daemon(topo).verify_site == "s3"  # one daemon for every site runs it too
    d.cluster.close()
    r = mm("status", "-t", str(topo.path))
    assert r.returncode == 0, r.stderr
    assert "last verification" in r.stdout and "error" in r.stdout and "Java 17" in r.stdout
    r = mm("status", "-t", str(topo.path), "--json")
    assert json.loads(r.stdout)["verification"]["status"] == "error"


def test_the_daemon_schedules_the_check_without_importing_pyspark(tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(SQLiteBackend(), tmp_path, ["s1", "s2"], ITEMS)
    topo = with_verify(cl)
    code = textwrap.dedent(f"""
        import sys
        from multimaster.ops.daemon import Daemon
        from multimaster.config.topology import load_topology
        d = Daemon(load_topology({str(topo.path)!r}), ["s1"])
        d.start()
        try:
            job = d._scheduler.get_job("verify")
            print(job.max_instances, type(job.trigger).__name__, "pyspark" in sys.modules)
        finally:
            d.stop()
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "CronTrigger", "False"]


def test_verify_record_stores_an_error_when_a_site_is_down(tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(SQLiteBackend(), tmp_path, ["s1", "s2", "s3"], ITEMS)
    topo = with_verify(cl, site="s1")
    os.unlink(cl.urls["s3"].removeprefix("sqlite:///"))  # fails before any JVM starts
    r = subprocess.run([CLI, "verify", "-t", str(topo.path), "--record"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    v = verifications.last(topo)
    assert v is not None and v["status"] == "error" and v["source"] == "manual" and v["error"]
