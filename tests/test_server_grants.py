"""`multimaster grants`: a peer pulling with only the printed privileges can refresh, and nothing more."""

from __future__ import annotations

import json

import pytest
from clusters import ITEMS, make_cluster
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from multimaster.engine.pull import pull_batch
from multimaster.engine.site import Site
from multimaster.ops.grants import apply_grants, grant_statements


def test_pulling_with_least_privileges(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    plan = grant_statements(cl.topo, "s1")
    assert [p.peer for p in plan] == ["s2"]
    if backend.name == "sqlite":
        assert plan[0].statements[0].startswith("--")
        return
    text = "\n".join(plan[0].statements)
    assert "SELECT" in text and "INSERT" not in text and "UPDATE" not in text and "DELETE" not in text
    apply_grants(cl.topo, "s1")
    apply_grants(cl.topo, "s1")  # idempotent
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('x', 1, 1.5)")
    url = make_url(cl.urls["s1"]).set(username=plan[0].login, password=None).render_as_string(hide_password=False)
    src, tgt = Site("s1", url), Site("s2", cl.urls["s2"])
    try:
        with tgt.read() as conn:
            info = tgt.info(conn, "items", cl.topo)
        rows = pull_batch(src, tgt, None, info, 0, 100)
        assert [r[1] for r in rows] == ["A"] and rows[0][5] == "I"
        with pytest.raises(DBAPIError):  # the application's table: not readable
            with src.read() as conn:
                conn.exec_driver_sql("SELECT * FROM items").all()
        with pytest.raises(DBAPIError):  # its own watermark lives at its own site, nothing is written here
            with src.write() as conn:
                conn.exec_driver_sql("DELETE FROM _mm_watermarks")
        # the peer's topology file with the pull login: refresh works; status names s1 as not
        # readable with it (exit 1) and still shows s2 (before: a traceback, nothing shown)
        from clusters import mm

        peer_file = tmp_path / "at-s2.yaml"
        peer_file.write_text(cl.topo.path.read_text().replace(cl.urls["s1"], url))
        r = mm("refresh", "-t", str(peer_file), "--site", "s2")
        assert r.returncode == 0, r.stdout + r.stderr
        r = mm("status", "-t", str(peer_file), "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "site 's1' cannot be read with this login" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert json.loads(r.stdout)["sites"]["s2"]["reachable"] is True
    finally:
        src.dispose()
        tgt.dispose()
        for sql in (
            [f"DROP OWNED BY {plan[0].login}", f"DROP ROLE IF EXISTS {plan[0].login}"]
            if backend.name == "postgresql"
            else [f"DROP USER IF EXISTS '{plan[0].login}'@'%'"]
        ):
            try:
                cl.execute("s1", sql)
            except Exception:  # noqa: BLE001 - shared server: another test may still use the login
                pass
