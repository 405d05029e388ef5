"""A transaction left open at a source holds back, at every puller, what committed there after it
began (docs/concepts.md "Many writers"). `status` names it — who, open how long, doing what, and
the statement that ends it — and, once the oldest change held has waited refresh.stall_after,
calls the link stalled and exits 1 (issue "Nothing silent"). Applications write with plain
clients; the CLI runs as a user runs it."""

from __future__ import annotations

import json
import time

import pytest
from clusters import make_cluster, mm

from multimaster.dialects import get_dialect

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def test_status_names_the_open_transaction_that_holds_a_link_back(backend, tmp_path):  # type: ignore[no-untyped-def]
    if not get_dialect(backend.name).caps.concurrent_capture:
        pytest.skip(f"{backend.name}: one writer at a time, no transaction stays open across another's commit")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, settings={"refresh": {"stall_after": "1s"}})
    topo = str(tmp_path / "topology.yaml")
    forgotten, app = cl.db("s1"), cl.db("s1")
    try:
        p = cl.backend.param()
        forgotten.cursor().execute(f"INSERT INTO stock (name, qty) VALUES ({p}, 1)", ("left open",))
        app.cursor().execute(f"INSERT INTO stock (name, qty) VALUES ({p}, 2)", ("committed",))
        app.commit()
        assert cl.refresh("s2", "s1")[0].pulled == 0  # held: it committed after the open one began

        fresh = mm("status", "-t", topo, "--json")
        link = next(ln for ln in json.loads(fresh.stdout)["links"] if ln["from"] == "s1" and ln["to"] == "s2")
        held = link["held_at_source"]
        who = "backend pid" if backend.name == "postgresql" else "connection"
        assert held is not None and held["who"].startswith(who), link
        assert "pg_terminate_backend(" in held["fix"] or held["fix"].startswith("KILL "), held
        time.sleep(1.5)  # past refresh.stall_after

        late = mm("status", "-t", topo)
        assert late.returncode == 1, late.stdout + late.stderr
        out = late.stdout + late.stderr
        assert "stalled" in out and "behind a transaction open there" in out and held["fix"] in out, out
        # the refresh says it too, and exits 1: what it could not take waits for that transaction
        ref = mm("refresh", "-t", topo, "--site", "s2", "--json")
        assert ref.returncode == 1, ref.stdout + ref.stderr
        (ln,) = [x for x in json.loads(ref.stdout)[-1]["links"] if x["from"] == "s1"]
        assert ln["pulled"] == 0 and ln["held_at_source"]["who"] == held["who"], ln
        assert "behind a transaction open there" in ref.stderr and held["fix"] in ref.stderr, ref.stderr
        from multimaster.config.topology import load_topology
        from multimaster.ops.metrics import health, render

        text = render(health(load_topology(topo)))  # what the daemon's metrics endpoint serves
        assert 'multimaster_link_held_at_source{source="s1",target="s2"} 1' in text, text
        assert 'multimaster_link_stalled{source="s1",target="s2"} 1' in text
    finally:
        forgotten.rollback()
        forgotten.close()
        app.close()
    cl.refresh_until_quiet()
    assert mm("status", "-t", topo).returncode == 0
    assert [r[1] for r in cl.rows("s2", "stock")] == ["committed"]
