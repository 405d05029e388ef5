"""A mesh ships each change to a site once (issue #14; docs/topologies.md "A mesh ships each change
once"): a table that needs causal delivery is relayed by every site, so a change reaches a site
over every route; where every site pulls every writable site, a refresh sends what the target has
applied (per origin, `_mm_origins`) and the source sends those entries as positions only. In a
chain the route through the peer may be the only one (remove-site's salvage reads the snapshots),
so bodies keep travelling there."""

from __future__ import annotations

from typing import Any

from clusters import TestCluster, make_cluster

from multimaster import api

# a natural key: the table needs causal delivery, so every site relays every applied change
TAGS = {"tags": {"key": "code", "auto": False, "columns": {"label": "text", "n": "int"}}}


def _stored(cl: TestCluster, site: str, peer: str, origin: str) -> int:
    """Rows of `origin` in `site`'s snapshot of `peer` (what the pulls from `peer` carried)."""
    with api.Cluster(cl.topo) as c, c.site(site).read() as conn:
        d = c.site(site).dialect
        snap = d.obj("tags", peer).snap
        return int(
            conn.exec_driver_sql(f"SELECT count(*) FROM {snap} WHERE origin = {d.caps.placeholder}", (origin,)).scalar() or 0
        )


def _write(cl: TestCluster, site: str, n: int, prefix: str) -> None:
    for i in range(n):
        cl.execute(site, "INSERT INTO tags (code, label, n) VALUES (?, ?, ?)", (f"{prefix}{i}", f"L{i}", i))
    cl.execute(site, "UPDATE tags SET label = 'changed' WHERE code = ?", (f"{prefix}0",))


def test_a_mesh_carries_a_change_a_site_has_as_a_position_only(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s1 writes; s2 pulls it (and relays it); s3 pulls s1, then s2: s2's relayed copies reach s3 as
    positions only. Then s2 writes; s3 pulls s1 first (s1 relayed s2's changes) and s2 after: this
    time the relayed copies from s1 carry bodies, and s2's own changes, which s3 has applied,
    arrive as positions only."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], TAGS)
    _write(cl, "s1", 5, "a")
    cl.refresh("s2", "s1")
    cl.refresh("s3", "s1")
    cl.refresh("s3", "s2")
    assert _stored(cl, "s3", "s1", "s1") == 6
    assert _stored(cl, "s3", "s2", "s1") == 0, "s2's relayed copies of what s3 had applied travelled whole"
    _write(cl, "s2", 4, "b")
    cl.refresh("s1", "s2")
    cl.refresh("s3", "s1")
    cl.refresh("s3", "s2")
    assert _stored(cl, "s3", "s1", "s2") == 5
    assert _stored(cl, "s3", "s2", "s2") == 0, "s2's own changes that s3 had from s1 travelled whole"
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert sorted(r[0] for r in cl.rows("s3", "tags")) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(4)])


def test_a_chain_keeps_carrying_bodies(backend, tmp_path):  # type: ignore[no-untyped-def]
    """s1 - s2 - s3 - s4 in a chain: s3 relays s1's changes back to s2, which had them from s1, and
    s2's snapshot of s3 holds them whole: were s3 to die, s4 would get them from that snapshot
    (remove-site's salvage), its only route to s1's changes."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3", "s4"], TAGS, links={"chain": ["s1", "s2", "s3", "s4"]})
    _write(cl, "s1", 3, "a")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _stored(cl, "s2", "s3", "s1") == 4


def test_a_remote_pull_validates_have(tmp_path: Any) -> None:
    """An agent refuses a pull whose `have` is not table -> origin -> version strings."""
    import pytest

    from multimaster.errors import ConfigError
    from multimaster.ops.agent import _Handlers

    agent = _Handlers.__new__(_Handlers)
    infos = ["tags"]
    assert agent._have(None, infos) is None
    assert agent._have({"tags": {"s1": "0000000000000000001:s1"}}, infos) == {"tags": {"s1": "0000000000000000001:s1"}}
    for bad in ({"other": {}}, {"tags": {"s1": 5}}, {"tags": ["s1"]}, ["tags"], {"tags": {"s1": "x" * 300}}):
        with pytest.raises(ConfigError):
            agent._have(bad, infos)
