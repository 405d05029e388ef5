"""A transaction left open at a source holds back, at every puller, what committed there after it
began (docs/concepts.md "Many writers"). `status` names it — who, open how long, doing what, and
the statement that ends it — and, once the oldest change held has waited refresh.stall_after,
calls the link stalled and exits 1 (issue "Nothing silent"). Applications write with plain
clients; the CLI runs as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

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


def test_a_refresh_holding_the_writers_lock_is_not_named_as_the_open_transaction(mysql_backend, tmp_path):  # type: ignore[no-untyped-def]
    """The soak's D4: a refresh applying at a MariaDB site takes its writers' lock (every slot of
    the table, Dialect.lock_writers) and waits there for an application's row; what committed at
    that site meanwhile is held back for its pullers by the refresh, multimaster's own session.
    `status` named a connection whose slot the refresh had locked (or the refresh's own session)
    and advised `KILL` of it. Now: multimaster's own work is never the transaction to end; once an
    application's capturing transaction that began before it is open, that one is named."""
    cl = make_cluster(mysql_backend, tmp_path, ["s1", "s2"], STOCK, settings={"refresh": {"lock_wait_warn": "300ms"}})

    def hold(c: Any) -> None:  # the row 'a', by its key: a scan FOR UPDATE would wait for an open insert
        cur = c.cursor()
        cur.execute("SELECT id FROM stock WHERE name = 'a'")
        cur.execute("SELECT * FROM stock WHERE id = %s FOR UPDATE", (cur.fetchone()[0],))

    topo = str(tmp_path / "topology.yaml")
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('a', 1)")
    cl.refresh("s2")
    cl.execute("s2", "UPDATE stock SET qty = 2 WHERE name = 'a'")  # what the refresh at s1 applies ...
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('b', 1)")  # ... with an insert: the writers' lock
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('c', 1)")  # waits at s1 for s2
    holder = cl.db("s1")  # an application holding the row the refresh needs (it captures nothing)
    hold(holder)
    args = ("refresh", "-t", topo, "--site", "s1", "--peer", "s2")  # as a user runs it, beside status
    refresh = subprocess.Popen(
        [sys.executable, "-m", "multimaster.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    app = None
    try:
        look = cl.db("s1")
        cur = look.cursor()
        end = time.monotonic() + 90
        waiting: list[int] = []
        while time.monotonic() < end and not waiting:  # the refresh waits for the row, the writers' lock held
            cur.execute("SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'")
            waiting = [int(r[0]) for r in cur.fetchall()]
            look.commit()
            time.sleep(0.1)
        assert waiting, "the refresh never waited"
        link = next(ln for ln in json.loads(mm("status", "-t", topo, "--json").stdout)["links"] if ln["to"] == "s2")
        assert link.get("waiting"), link  # 'c' waits: the refresh holds the horizon
        held = link["held_at_source"]
        assert held is None, held  # multimaster's own refresh, not a transaction to KILL

        # an application's capturing transaction open since before it: that one is named
        app = cl.db("s1")
        acur = app.cursor()
        acur.execute("SELECT CONNECTION_ID()")
        (cid,) = acur.fetchone()
    finally:
        holder.rollback()
        holder.close()
        out = refresh.communicate(timeout=120)[0]
    assert refresh.returncode == 0, out
    assert app is not None
    cl.refresh("s2", "s1")  # 'c': nothing s2 can take waits at s1
    acur.execute("INSERT INTO stock (name, qty) VALUES ('d', 1)")  # open, captured
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('e', 1)")  # committed after it began
    cl.execute("s2", "UPDATE stock SET qty = 3 WHERE name = 'a'")
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('f', 1)")
    holder = cl.db("s1")
    hold(holder)
    refresh = subprocess.Popen(
        [sys.executable, "-m", "multimaster.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        end = time.monotonic() + 90
        waiting = []
        while time.monotonic() < end and not waiting:
            cur.execute("SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'")
            waiting = [int(r[0]) for r in cur.fetchall()]
            look.commit()
            time.sleep(0.1)
        assert waiting, "the refresh never waited"
        link = next(ln for ln in json.loads(mm("status", "-t", topo, "--json").stdout)["links"] if ln["to"] == "s2")
        held = link["held_at_source"]
        assert held is not None and held["who"] == f"connection {cid}" and held["fix"] == f"KILL {cid}", (held, waiting)
    finally:
        holder.rollback()
        holder.close()
        app.commit()
        app.close()
        out = refresh.communicate(timeout=120)[0]
        look.close()
    assert refresh.returncode == 0, out
    cl.refresh_until_quiet()
    assert sorted(r[1] for r in cl.rows("s2", "stock")) == ["a", "b", "c", "d", "e", "f"]
