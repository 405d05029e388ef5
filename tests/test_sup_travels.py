"""A change-log entry's ``sup`` (the heads the writer's change superseded, docs/conflicts.md
"Concurrent heads") travels with the entry wherever its columns go, unchanged, as ``txn`` does:
pulled into a peer's snapshot, relayed into the middle site's change log and on to the next site,
through an agent (docs/agent.md), in the layout remove-site's salvage reads a snapshot in, and into
a site made by add-site (its copied change log, and the snapshot rows of a relayed source its peer
had not applied yet).

The value is written by hand into the origin's change log right after the application's update,
on a table whose policies are `latest` only (capture writes no ``sup`` there, and the planner
does not read it), so what arrives is exactly what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import ITEMS, TestCluster, make_cluster
from test_add_site_agent import grow, host_file
from test_agent import TOKEN, running_agent
from test_heads import continued_writes, shadow

from multimaster import api, store
from multimaster.config.topology import load_topology
from multimaster.core.salvage import Copy
from multimaster.engine import salvage, wire
from multimaster.engine.pull import read_entries
from multimaster.ops.instantiate import add_site, connect_site

#: what capture writes into sup: versions (and '=', the row's default version), space-separated
SUP1 = "0000000000000000007:s9 ="
SUP3 = "0000000000000000011:s8 0000000000000000012:s8"

CHAIN = {"chain": ["s1", "s2", "s3"]}
S2_SERVES = {"s2": {"token": "${MM_AGENT_TOKEN}"}}


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_AGENT_TOKEN", TOKEN)


def _update_with_sup(cl: TestCluster, site: str, name: str, sup: str) -> str:
    """An application update of row 1 at `site`, then `sup` written into its change-log entry;
    returns the entry's version."""
    cl.execute(site, "UPDATE items SET name = ? WHERE id = 1", (name,))
    with api.Cluster(cl.topo) as c:
        s = c.site(site)
        d, ph = s.dialect, s.dialect.caps.placeholder
        with s.write() as conn:
            log = d.obj("items").log
            ver = conn.exec_driver_sql(f"SELECT max(ver) FROM {log} WHERE origin = {ph} AND op = 'U'", (site,)).scalar()
            assert ver is not None
            conn.exec_driver_sql(f"UPDATE {log} SET sup = {ph} WHERE ver = {ph}", (sup, ver))
    return str(ver)


def _sups(cl: TestCluster, site: str, peer: str | None = None) -> dict[str, str]:
    """version -> sup of every entry with a sup in `site`'s change log (`peer`: in its snapshot of `peer`)."""
    with api.Cluster(cl.topo) as c:
        s = c.site(site)
        d = s.dialect
        rel = d.obj("items").log if peer is None else d.obj("items", peer).snapshot()
        with s.read() as conn:
            return {str(v): str(x) for v, x in conn.exec_driver_sql(f"SELECT ver, sup FROM {rel} WHERE sup IS NOT NULL")}


def _served(tmp: Path, url: str) -> Any:
    """The cluster's topology file as a host reaching s2 only through its agent has it."""
    doc = yaml.safe_load((tmp / "topology.yaml").read_text())
    doc["sites"]["s2"] = {"url": url, "token": "${MM_AGENT_TOKEN}"}
    (tmp / "via-s2.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_topology(tmp / "via-s2.yaml")


def test_sup_travels_to_the_peer_the_relay_and_through_an_agent(backend: Any, tmp_path: Path) -> None:
    """s1 - s2 - s3: s2 stores s1's entry with its sup, relays it with it, and s3 pulls it from s2's
    agent with it; remove-site's salvage reads s2's snapshot in read_entries' layout, sup last."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS, links=CHAIN, site_settings=S2_SERVES)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    ver = _update_with_sup(cl, "s1", "b", SUP1)
    assert _sups(cl, "s1") == {ver: SUP1}
    cl.refresh("s2", "s1")
    assert _sups(cl, "s2", "s1") == {ver: SUP1}  # the peer's snapshot
    assert _sups(cl, "s2") == {ver: SUP1}  # the relayed copy in the middle site's change log
    # the rows a read of the change log gives and those salvage gives from a snapshot: sup last
    with api.Cluster(cl.topo) as c:
        s1, s2 = c.site("s1"), c.site("s2")
        with s2.read() as conn:
            info = s2.info(conn, "items", cl.topo)
            wm = store.watermarks.read(conn, s2.dialect, "s1", "items")
            held = salvage.read_held(conn, s2, info, "s1", "s3", Copy("s2", 0, wm))
        with s1.read() as conn:
            read = read_entries(conn, s1, "s3", info, 0)
        width = wire.pulled_width(info)
        assert {len(r) for r in held} == {len(r) for r in read} == {width}
        assert [r[-1] for r in held if r[3] == ver] == [r[-1] for r in read if r[3] == ver] == [SUP1]
        assert all(r[-1] is None for r in [*held, *read] if r[3] != ver)
    # s3 pulls s2 through s2's agent
    with running_agent(cl.topo, "s2") as url:
        (r,) = api.refresh(_served(tmp_path, url), "s3", "s2")
        assert r.error is None and r.pulled >= 1
    assert _sups(cl, "s3", "s2") == {ver: SUP1}
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows("s3", "items") == [(1, "b", 1, 1.0)]


def test_sup_travels_into_a_site_added_through_an_agent(backend: Any, tmp_path: Path) -> None:
    """s4 is added from s2 (through its agent) and pulls s3 too: its change log copied from s2's
    holds s1's relayed entry with its sup, and its snapshot of s3 the entry of s3 that s2 had
    pulled but not applied yet, with its sup."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], ITEMS, links=CHAIN, site_settings=S2_SERVES)
    cl.execute("s1", "INSERT INTO items (name, qty, price) VALUES ('a', 1, 1.0)")
    cl.refresh_until_quiet()
    v1 = _update_with_sup(cl, "s1", "b", SUP1)
    cl.refresh_until_quiet()
    v3 = _update_with_sup(cl, "s3", "c", SUP3)
    cl.refresh("s2", "s3", reconcile_=False)  # pulled, not applied: waiting in s2's snapshot
    assert _sups(cl, "s2", "s3") == {v3: SUP3} and _sups(cl, "s2") == {v1: SUP1}
    links = [{"from": a, "to": b} for a, b in (("s1", "s2"), ("s2", "s1"), ("s2", "s3"), ("s3", "s2"))]
    links += [{"from": "s2", "to": "s4"}, {"from": "s4", "to": "s2"}, {"from": "s3", "to": "s4"}]
    big = grow(cl, tmp_path, ["s4"], cl.backend, links=links)
    with running_agent(big.topo, "s2") as url:
        here = load_topology(host_file(tmp_path, "s4.yaml", {"s2": url}))
        rep = add_site(here, "s4", "s2", batch_size=2)
    assert rep.log_entries["items"] == 2 and [p["site"] for p in rep.pending] == ["s2"]
    assert _sups(big, "s4") == {v1: SUP1}  # the copied change log
    assert _sups(big, "s4", "s3") == {v3: SUP3}  # the snapshot rows s2 had not applied
    assert _sups(big, "s4", "s2") == {}
    assert connect_site(big.topo, "s4").connected == ["s2"]
    big.refresh_until_quiet()
    big.assert_converged()
    assert big.rows("s4", "items") == [(1, "c", 1, 1.0)]
    assert _sups(big, "s4") == {v1: SUP1}  # (s3's entry: s4's pullers pull s3 themselves)
    assert _sups(big, "s1", "s2") == {v3: SUP3}  # applied at s2 from the snapshot it waited in, relayed to s1


def test_an_added_site_keeps_the_heads_and_its_sup_supersedes_them(backend: Any, tmp_path: Path) -> None:
    """add-site copies the shadow's other heads of a slot whose policy chooses among them
    (docs/conflicts.md "Concurrent heads"): the new site's next write supersedes both heads (capture
    writes them into its sup), and every site ends with it, although `maximum` prefers either head."""
    cl = continued_writes(backend, tmp_path)
    big = grow(cl, tmp_path, ["s3"], cl.backend)
    add_site(big.topo, "s3", "s1")
    held = shadow(big, "s1", "qty")
    assert held[1][1] is not None and shadow(big, "s3", "qty") == held  # the version, the other head, its value
    big.execute("s3", "UPDATE items SET qty = 1 WHERE id = 1")
    assert {v: x for v, x in _sups(big, "s3").items() if not v.endswith(":s3")} == _sups(big, "s1")  # the copied log
    ((ver, sup),) = [(v, x) for v, x in _sups(big, "s3").items() if v.endswith(":s3")]
    assert set(sup.split()) == {held[1][0], held[1][1]}  # capture: both heads superseded
    big.refresh_until_quiet()
    big.assert_converged()
    assert big.rows("s2", "items") == [(1, "a", 1, 1.0)]
    assert _sups(big, "s2", "s3") == {ver: sup}
