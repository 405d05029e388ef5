"""`status` reads each kind of bookkeeping for every table of a site in one statement (over a WAN
each statement is a round trip): the batched readers give exactly what the per-table ones give, on
every database, with waiting, unapplied, parked changes, tombstones and a purge horizon present."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, make_cluster

from multimaster import api, store
from multimaster.engine import evolve
from multimaster.engine.cluster import Cluster

TABLES = {f"t{i}": {"key": "id", "columns": {"name": "text", "qty": "int"}} for i in range(3)}


def _per_table(conn: Any, s: Any, peer: str, tables: list[str], have: Any, theirs: dict[str, int]) -> dict[str, Any]:
    """What the per-table readers give (one statement per table and kind) at site `s` of the link
    from `peer` and (waiting) of the link to `peer`, whose watermarks there are `theirs`."""
    d = s.dialect
    wms = {tb: store.watermarks.read(conn, d, peer, tb) for tb in tables}
    return {
        "watermarks": wms,
        "unapplied": {tb: store.links.unapplied(conn, d, tb, peer) for tb in tables},
        "parked": [store.links.parked(conn, d, tb, peer) for tb in tables],
        "waiting": {tb: store.links.waiting(conn, d, tb, theirs[tb], peer, (have or {}).get(tb)) for tb in tables},
        "horizons": {tb: store.purges.horizon(conn, d, tb) for tb in tables},
        "versions": {tb: store.schemas.current_version(conn, d, tb) for tb in tables},
        "sigs": {tb: (store.schemas.current(conn, d, tb) or (0, [], None))[2] for tb in tables},
        "have": {tb: dict(store.origins.read(conn, d, tb)) for tb in tables},
        "counts": {
            tb: {
                "log": _n(conn, d.obj(tb).log),
                "log2": _n(conn, d.obj(tb).log2),
                "tombstones": _n(conn, d.obj(tb).shadow + " WHERE deleted IS NOT NULL"),
                "rows": _n(conn, d.quote(tb)),
            }
            for tb in tables
        },
        "conflicts": _n(conn, d.mm_table("_mm_conflicts")),
        "changed": [tb for tb in tables if s.dialect.table_signature(conn, tb) != store.schemas.current(conn, d, tb)[2]],
        "signatures": {tb: s.dialect.table_signature(conn, tb) for tb in tables},
    }


def _n(conn: Any, obj: str) -> int:
    return int(conn.exec_driver_sql(f"SELECT count(*) FROM {obj}").scalar() or 0)


def _batched(conn: Any, s: Any, peer: str, tables: list[str], have: Any, theirs: dict[str, int]) -> dict[str, Any]:
    d = s.dialect
    wms = store.watermarks.read_all(conn, d, peer, tables)
    versions = store.schemas.current_versions(conn, d)
    summary = store.tables.site_status(conn, d, tables)
    return {
        "watermarks": wms,
        "unapplied": store.links.unapplied_all(conn, d, tables, peer),
        "parked": store.links.parked_all(conn, d, tables, peer),
        "waiting": store.links.waiting_all(conn, d, theirs, peer, have),
        "horizons": store.purges.horizons(conn, d, tables),
        "versions": {tb: versions.get(tb) for tb in tables},
        "sigs": {tb: store.schemas.current_sigs(conn, d).get(tb) for tb in tables},
        "have": store.origins.have(conn, d, tables),
        "counts": summary["tables"],
        "conflicts": summary["conflicts"],
        "changed": evolve.changed_tables(conn, s, tables),
        "signatures": s.dialect.table_signatures(conn, tables),
    }


@pytest.mark.parametrize("union_max", [100, 2], ids=["one-statement", "in-pieces"])
def test_batched_readers_equal_per_table(backend: Backend, tmp_path: Path, union_max: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(store._rows, "UNION_MAX", union_max)
    cl = make_cluster(backend, tmp_path, ["a", "b"], TABLES)
    for tb in ("t0", "t1"):
        for i in range(3):
            cl.execute("a", f"INSERT INTO {tb} (name, qty) VALUES (?, ?)", (f"{tb}-{i}", i))
    cl.execute("a", "DELETE FROM t1 WHERE qty = 0")  # a tombstone
    cl.execute("b", "INSERT INTO t0 (name, qty) VALUES ('b0', 7)")
    cl.refresh()
    cl.execute("a", "INSERT INTO t0 (name, qty) VALUES ('later', 1)")  # waiting at a for b
    cl.execute("a", "INSERT INTO t2 (name, qty) VALUES ('later', 2)")
    for i in range(2):
        cl.execute("b", "INSERT INTO t1 (name, qty) VALUES (?, ?)", (f"b1-{i}", 10 + i))  # pulled, not applied at a
    cl.execute("b", "INSERT INTO t2 (name, qty) VALUES ('b2', 20)")
    api.refresh(cl.topo, "a", "b", reconcile_=False)
    tables = list(TABLES)
    with Cluster(cl.topo) as c:
        a = c.site("a")
        with a.write() as conn:  # t1's changes from b wait (for what does not matter to the readers)
            conn.exec_driver_sql(f"UPDATE {a.dialect.obj('t1', 'b').snap} SET applied = 2 WHERE applied = 0")
            store.purges.record_horizon(conn, a.dialect, "t0", 1, 1)
        cl.execute("b", "ALTER TABLE t2 ADD COLUMN extra INTEGER")  # changed, not followed yet
        seen = {}
        for n, peer in (("a", "b"), ("b", "a")):
            s = c.site(n)
            with c.site(peer).read() as pconn:  # what the peer applied, and pulled from here
                have = {tb: dict(store.origins.read(pconn, c.site(peer).dialect, tb)) for tb in tables}
                theirs = {tb: store.watermarks.read(pconn, c.site(peer).dialect, n, tb) for tb in tables}
            for h in (None, have):
                with s.read() as conn:
                    want, got = _per_table(conn, s, peer, tables, h, theirs), _batched(conn, s, peer, tables, h, theirs)
                assert got == want, (n, peer, h)
            seen[n] = want
    # the readers were compared on something to count
    assert seen["a"]["unapplied"]["t1"][0] == 2 and seen["a"]["unapplied"]["t2"][0] == 1
    assert seen["a"]["parked"][1] is not None and seen["a"]["parked"][1].count == 2 and seen["a"]["parked"][0] is None
    assert seen["a"]["waiting"]["t0"][0] == 1 and seen["a"]["waiting"]["t2"][0] == 1 and seen["a"]["waiting"]["t1"][0] == 0
    assert seen["a"]["counts"]["t1"]["tombstones"] == 1 and seen["a"]["horizons"]["t0"] == 1
    assert all(v is not None for v in seen["a"]["versions"].values())
    assert seen["b"]["changed"] == ["t2"] and seen["a"]["changed"] == []
