"""verify against sites built and replicated by the core engine (multimaster.api init/refresh)."""

from __future__ import annotations

import sqlite3

import pytest

from multimaster.spark import verify
from multimaster.spark.fixtures import write_topology
from multimaster.topology import load_topology

api = pytest.importorskip("multimaster.api", reason="the core engine (multimaster.api) is not there yet")


def test_core_cluster_converging_then_converged(spark, tmp_path):
    urls = {}
    for i, s in enumerate(("a", "b", "c")):
        p = tmp_path / f"{s}.db"
        c = sqlite3.connect(p)
        c.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)")
        if i == 0:
            c.executemany("INSERT INTO items VALUES (?,?,?,?)", [(k, f"n{k}", k, k / 4) for k in range(1, 31)])
        c.commit()
        c.close()
        urls[s] = f"sqlite:///{p}"
    topo = load_topology(write_topology(tmp_path / "t.yml", urls))
    api.init(topo)
    assert verify(topo, spark=spark).converged
    c = sqlite3.connect(tmp_path / "b.db")
    c.execute("INSERT INTO items(name, qty, price) VALUES ('new at b', 1, 2.5)")
    c.execute("UPDATE items SET qty = 77 WHERE id = 3")
    c.commit()
    c.close()
    res = verify(topo, spark=spark)
    t = res.tables["items"]
    assert t.status == "converging", t.counts
    assert t.counts["missing"]["a"] == 1 and t.counts["values"]["b"] == 1
    assert {(w.source, w.target): w.unpulled for w in t.waiting}[("b", "a")] == 2
    api.refresh(topo)
    res = verify(topo, spark=spark)
    assert res.converged, res.to_dict()["tables"]["items"]["counts"]
    assert res.tables["items"].rows == {"a": 31, "b": 31, "c": 31}
