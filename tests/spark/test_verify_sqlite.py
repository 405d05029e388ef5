"""verify() on three SQLite sites: converged, every difference kind, waiting vs diverged,
checksum-only, the JSON/HTML outputs and the CLI exit codes."""

from __future__ import annotations

import json

import pytest
from mm_spark_helpers import base_rid as rid
from mm_spark_helpers import captured, make_every_kind, uncaptured
from typer.testing import CliRunner

from multimaster.cli import app
from multimaster.config.topology import load_topology
from multimaster.spark import VerifyResult, verify


def test_converged(spark, cluster):
    res = verify(cluster, spark=spark, partitions=3)
    t = res.tables["items"]
    assert res.converged and res.exit_code == 0 and t.status == "converged"
    assert t.rows == {"s1": 200, "s2": 200, "s3": 200}
    assert len(set(t.fingerprints.values())) == 1
    assert t.differing == 0 and t.samples == [] and t.identities == 200
    assert all(w.total == 0 for w in t.waiting) and len(t.waiting) == 6


def test_every_kind_detected(spark, cluster):
    make_every_kind(cluster)
    res = verify(cluster, spark=spark, partitions=2)
    t = res.tables["items"]
    assert res.status == "diverged" and res.exit_code == 1
    assert t.counts["missing"] == {"s1": 0, "s2": 1, "s3": 0}
    assert t.counts["extra"] == {"s1": 1, "s2": 1, "s3": 0}
    assert t.counts["key"] == {"s1": 1, "s2": 0, "s3": 0}
    assert t.counts["values"] == {"s1": 0, "s2": 0, "s3": 1}
    assert t.columns == {"name": 1, "qty": 1}
    assert t.differing == 4
    by_kind = {x.kind: x for x in t.samples}
    assert by_kind["missing"].rid == rid(5) and by_kind["missing"].sites["s2"]["state"] == "unknown"
    assert by_kind["extra"].rid == rid(7) and by_kind["extra"].sites["s3"]["state"] == "deleted"
    assert by_kind["key"].sites["s1"]["key"] == 100009 and by_kind["key"].sites["s2"]["key"] == 9
    v = by_kind["values"]
    assert v.odd_sites == ["s3"] and sorted(v.columns) == ["name", "qty"]
    assert v.sites["s3"]["values"] == {"name": None, "qty": 999, "price": 2.75}
    assert v.sites["s1"]["values"]["qty"] == 11
    assert not v.waiting
    # plain data, JSON-ready, round-trips
    d = json.loads(json.dumps(res.to_dict()))
    assert VerifyResult.from_dict(d).to_dict() == d


def test_two_of_three_value_disagreement_counts_the_odd_site(spark, cluster):
    with uncaptured(cluster, "s1") as c:
        c.execute("UPDATE items SET price = 1.5 WHERE id = 20")
    with uncaptured(cluster, "s2") as c:
        c.execute("UPDATE items SET price = 2.5 WHERE id = 20")
    t = verify(cluster, spark=spark).tables["items"]
    assert t.counts["values"] == {"s1": 1, "s2": 1, "s3": 1}  # three different values: all counted
    assert t.columns == {"price": 1}


def test_waiting_changes_tell_converging_from_diverged(spark, cluster):
    captured(cluster, "s1", "INSERT INTO items VALUES (201, 'new', 1, 1.0)", "UPDATE items SET qty = 0 WHERE id = 3")
    res = verify(cluster, spark=spark)
    t = res.tables["items"]
    assert t.status == "converging" and res.exit_code == 1
    assert t.counts["missing"] == {"s1": 0, "s2": 1, "s3": 1}
    w = {(x.source, x.target): x for x in t.waiting}
    assert w[("s1", "s2")].unpulled == 2 and w[("s1", "s3")].unpulled == 2
    assert w[("s2", "s1")].total == 0
    assert all(x.waiting for x in t.samples)
    # once s2 and s3 have pulled past those entries (watermark), the same difference is divergence
    for s in ("s2", "s3"):
        with uncaptured(cluster, s) as c:
            c.execute("UPDATE _mm_watermarks SET seq2 = 2 WHERE peer = 's1'")
    t = verify(cluster, spark=spark).tables["items"]
    assert t.status == "diverged" and t.unexplained == 2
    # an unapplied snapshot row counts as waiting for its own row only
    with uncaptured(cluster, "s2") as c:
        c.execute(
            "INSERT INTO _mm_snap_items__s1(pseq, ver, origin, op, rid, key, mask, applied) "
            "VALUES (1, 'v', 's1', 'I', 'some other row', 201, 7, 0)"
        )
    t = verify(cluster, spark=spark).tables["items"]
    assert t.status == "diverged" and t.unexplained == 2
    assert {(x.source, x.target): x.unapplied for x in t.waiting}[("s1", "s2")] == 1
    with uncaptured(cluster, "s1") as c:
        new_rid, upd_rid = (c.execute(f"SELECT rid FROM _mm_log_items WHERE key = {k}").fetchone()[0] for k in (201, 3))
    for s in ("s2", "s3"):
        with uncaptured(cluster, s) as c:
            c.execute(
                "INSERT INTO _mm_snap_items__s1(pseq, ver, origin, op, rid, key, mask, applied) VALUES (?, 'v', 's1', 'U', ?, 3, 7, 0)",
                (2, upd_rid),
            )
    t = verify(cluster, spark=spark).tables["items"]
    assert t.status == "diverged" and t.unexplained == 1  # the new row 201 is still on its way nowhere
    for s in ("s2", "s3"):
        with uncaptured(cluster, s) as c:
            c.execute(
                "INSERT INTO _mm_snap_items__s1(pseq, ver, origin, op, rid, key, mask, applied) VALUES (3, 'v', 's1', 'I', ?, 201, 7, 0)",
                (new_rid,),
            )
    t = verify(cluster, spark=spark).tables["items"]
    assert t.status == "converging" and t.unexplained == 0


def test_a_waiting_change_explains_only_its_own_row(spark, cluster):
    """Issue 13 item 4: a change waiting for row A does not make an uncaptured difference on row B
    "converging". Each differing identity is converging only when a waiting change touches it."""
    captured(cluster, "s1", "UPDATE items SET qty = 0 WHERE id = 3")  # row A: captured at s1, not yet pulled
    res = verify(cluster, spark=spark)
    t = res.tables["items"]
    assert (res.status, t.status, t.differing, t.unexplained) == ("converging", "converging", 1, 0)
    with uncaptured(cluster, "s2") as c:  # row B: changed at s2 with capture off: nothing will fix it
        c.execute("UPDATE items SET qty = 999 WHERE id = 20")
    for mode in ({}, {"checksum_only": True, "buckets": 8}):
        res = verify(cluster, spark=spark, **mode)
        t = res.tables["items"]
        assert (res.status, t.status, res.exit_code) == ("diverged", "diverged", 1)
        assert t.differing == 2 and t.unexplained == 1
        assert {x.rid: x.waiting for x in t.samples} == {rid(20): False, rid(3): True}
        assert t.samples[0].rid == rid(20)  # the differences nothing explains come first
    # the change pulled into s2's snapshot but not applied yet still explains row A at s2
    from multimaster import api

    api.refresh(load_topology(cluster), "s2", "s1", reconcile_=False)
    t = verify(cluster, spark=spark).tables["items"]
    assert t.status == "diverged" and t.unexplained == 1
    assert {(w.source, w.target): (w.unpulled, w.unapplied) for w in t.waiting if w.total} == {
        ("s1", "s2"): (0, 1),
        ("s1", "s3"): (1, 0),
    }
    with uncaptured(cluster, "s2") as c:  # row B repaired by hand: only row A differs, and it is on its way
        c.execute("UPDATE items SET qty = 20 WHERE id = 20")
    res = verify(cluster, spark=spark)
    assert (res.status, res.tables["items"].unexplained) == ("converging", 0)


@pytest.mark.parametrize("diverge", [False, True])
def test_checksum_only(spark, cluster, diverge):
    if diverge:
        make_every_kind(cluster)
    full = verify(cluster, spark=spark)
    cs = verify(cluster, spark=spark, checksum_only=True, buckets=16)
    a, b = full.tables["items"], cs.tables["items"]
    assert b.mode == "checksum" and b.buckets >= 16
    assert a.fingerprints == b.fingerprints and a.rows == b.rows
    assert a.counts == b.counts and a.status == b.status and a.columns == b.columns
    if diverge:
        assert 1 <= b.buckets_differing < b.buckets
        assert sorted(x.rid for x in a.samples) == sorted(x.rid for x in b.samples)
    else:
        assert b.buckets_differing == 0 and b.converged


def test_partitions_do_not_change_the_answer(spark, cluster):
    make_every_kind(cluster)
    r1 = verify(cluster, spark=spark, partitions=1).tables["items"]
    r7 = verify(cluster, spark=spark, partitions=7).tables["items"]
    assert r1.counts == r7.counts and r1.fingerprints == r7.fingerprints


def test_sample_limit_bounds_what_comes_back(spark, cluster):
    with uncaptured(cluster, "s2") as c:
        c.execute("UPDATE items SET qty = qty + 1 WHERE id <= 50")
    t = verify(cluster, spark=spark, sample_limit=3).tables["items"]
    assert t.counts["values"]["s2"] == 50 and t.columns == {"qty": 50}
    assert len(t.samples) == 3


def test_sites_with_verify_false_are_skipped(spark, cluster):
    topo = load_topology(cluster)
    with uncaptured(cluster, "s3") as c:
        c.execute("DELETE FROM items WHERE id = 1")
    res = verify(topo, spark=spark, sites=["s1", "s2"])
    assert res.converged and res.sites == ["s1", "s2"]


def test_cli_exit_codes_json_and_html(spark, cluster, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["verify", "-t", str(cluster), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["status"] == "converged"
    make_every_kind(cluster)
    html = tmp_path / "report.html"
    r = runner.invoke(app, ["verify", "-t", str(cluster), "--report", str(html), "--sample", "5"])
    assert r.exit_code == 1, r.output
    assert "DIVERGED" in r.output
    page = html.read_text()
    assert "<svg" in page and "diverged" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    r = runner.invoke(app, ["verify", "-t", str(cluster), "--checksum-only", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["mode"] == "checksum"


def test_cli_errors_exit_2(spark, cluster, tmp_path, monkeypatch):
    runner = CliRunner()
    bad = tmp_path / "bad.yml"
    bad.write_text("sites: {a: {url: 'sqlite:///x.db'}}\ntables: {}\n")
    r = runner.invoke(app, ["verify", "-t", str(bad)])
    assert r.exit_code == 2 and "problem" in r.output
    r = runner.invoke(app, ["verify", "-t", str(cluster), "--table", "nope"])
    assert r.exit_code == 2 and "nope" in r.output
    monkeypatch.setenv("MM_JDBC_JARS", str(tmp_path / "sqlite-jdbc.jar"))
    r = runner.invoke(app, ["verify", "-t", str(cluster)])
    assert r.exit_code == 2 and "libxerial-sqlite-jdbc-java" in r.output


def test_missing_sqlite_file_is_an_error_not_a_new_file(spark, cluster, tmp_path):
    topo = load_topology(cluster)
    gone = topo.sites["s3"].url.replace("sqlite:///", "")
    import os

    os.remove(gone)
    r = CliRunner().invoke(app, ["verify", "-t", str(cluster)])
    assert r.exit_code == 2 and "does not exist" in r.output
    assert not os.path.exists(gone)
