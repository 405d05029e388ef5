"""While a site is away, the others get its changes from any peer that has them (issue "Nothing
silent", case 2; docs/topologies.md "Relaying"): in a mesh every site relays every change it
applies, and a puller that has a change already gets it as a position only. Before, a mesh of
latest/additive tables relayed nothing: s1 could not get s3's insert from s2, parked s2's update of
that row, and held back every later change of s2 behind it for the whole outage."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import faults
import pytest
from clusters import TestCluster, make_cluster, mm

from multimaster import api, store

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}}}


def _by_name(cl: TestCluster, site: str) -> dict[str, int]:
    return {r[1]: r[2] for r in cl.rows(site, "stock")}


def _waiting(cl: TestCluster, site: str) -> int:
    """Changes parked at `site`, in its snapshots of every peer (store.links.parked)."""
    with api.Cluster(cl.topo) as c, c.site(site).read() as conn:
        waits = [store.links.parked(conn, c.site(site).dialect, "stock", peer) for peer in cl.topo.peers_of(site)]
        return sum(w.count for w in waits if w is not None)


def test_while_a_site_is_away_its_changes_reach_the_others_through_any_peer(backend: Any, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK)
    if backend.name == "mysql":
        faults._own_logins(cl)  # so that s3 alone can be locked out
    cl.execute("s3", "INSERT INTO stock (name, qty) VALUES ('x', 10)")
    cl.execute("s3", "INSERT INTO stock (name, qty) VALUES ('w', 1)")
    cl.refresh("s2", "s3")
    cl.execute("s3", "UPDATE stock SET qty = qty + 3 WHERE name = 'w'")  # s1 will get this one from s3
    cl.execute("s2", "UPDATE stock SET qty = qty + 5 WHERE name = 'x'")
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('y', 7)")
    faults.site_down(cl, "s3", tmp_path / "away")
    # the user's command, as a cron job would run it: s3 is named unreachable, the rest flows
    r = mm("refresh", "-t", str(cl.topo.path), "--until-quiet", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "s3" in r.stdout + r.stderr
    assert _by_name(cl, "s1") == {"x": 15, "w": 1, "y": 7}, "s3's changes that s2 holds did not reach s1"
    assert _waiting(cl, "s1") == 0
    # s1 writes meanwhile; s2 has it; s3 comes back and gets everything; nothing applied twice
    cl.execute("s1", "UPDATE stock SET qty = qty + 100 WHERE name = 'x'")
    cl.refresh("s2", "s1")
    faults.site_up(cl, "s3", tmp_path / "away")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _by_name(cl, "s1") == {"x": 115, "w": 4, "y": 7}
    r = mm("status", "-t", str(cl.topo.path), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not json.loads(r.stdout).get("stalled")


def test_a_puller_that_has_a_relayed_change_gets_a_position_only(sqlite_backend: Any, tmp_path: Path) -> None:
    """The price of relaying in a mesh is a log row at the relaying site, not a second copy on the
    wire: s2 relays s1's changes, s3 has them from s1 already and stores none of their bodies."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], STOCK)
    for i in range(5):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh("s2", "s1")
    cl.refresh("s3", "s1")
    cl.refresh("s3", "s2")
    with api.Cluster(cl.topo) as c:
        d = c.site("s2").dialect
        with c.site("s2").read() as conn:
            relayed = conn.exec_driver_sql(f"SELECT count(*) FROM {d.obj('stock').log} WHERE origin = 's1'").scalar()
        with c.site("s3").read() as conn:
            bodies = conn.exec_driver_sql(f"SELECT count(*) FROM {d.obj('stock', 's2').snap} WHERE origin = 's1'").scalar()
    assert relayed == 5 and bodies == 0


def test_two_sites_relay_nothing(sqlite_backend: Any, tmp_path: Path) -> None:
    """With two sites the only puller of a site is the origin of everything it applies, whatever
    the table (a natural key needs causal delivery: it was relayed back to its origin before)."""
    tags = {"tags": {"key": "code", "auto": False, "columns": {"label": "text"}}}
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], {**STOCK, **tags})
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('x', 1)")
    cl.execute("s1", "INSERT INTO tags (code, label) VALUES ('a', 'A')")
    cl.refresh("s2", "s1")
    with api.Cluster(cl.topo) as c, c.site("s2").read() as conn:
        d = c.site("s2").dialect
        for tb in ("stock", "tags"):
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {d.obj(tb).log} WHERE origin = 's1'").scalar() == 0, tb
    assert cl.rows("s2", "tags") == [("a", "A")]


def test_a_capture_after_a_relayed_change_takes_a_new_version(backend: Any, tmp_path: Path) -> None:
    """s2's clock is ahead (a peer dragged it within the offset, or a fast clock): its captures
    take versions from its floor. A change it relays in between (another origin's, older version)
    must not make its next capture repeat its last one's version: a peer pulling them in two
    batches dropped the second as a duplicate (SQLite, whose capture read the last log entry)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK, settings={"refresh": {"max_clock_offset": "1h"}})
    with api.Cluster(cl.topo) as c:
        s = c.site("s2")
        with s.write() as conn:
            s.dialect.advance_clock(conn, int((time.time() + 30) * 1000) << 16, "stock")
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('a', 1)")
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('z', 1)")
    cl.refresh("s2", "s1")  # applied and relayed at s2
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('b', 2)")
    with api.Cluster(cl.topo) as c, c.site("s2").read() as conn:
        vers = [
            r[0] for r in conn.exec_driver_sql(f"SELECT ver FROM {c.site('s2').dialect.obj('stock').log} WHERE origin = 's2'")
        ]
    assert len(vers) == len(set(vers)) == 2, vers
    cl.refresh("s3", "s2", batch_size=1)
    assert sorted(_by_name(cl, "s3")) == ["a", "b", "z"]


def test_status_does_not_count_relayed_changes_the_puller_has(
    sqlite_backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s1 relays s2's changes; s3 has them from s2: status says nothing waits on s1 -> s3 (the
    count and the age leave out entries s3 applied), directly and through s1's agent; five
    changes of s1's own do wait."""
    from test_agent import TOKEN, _peer_file, running_agent

    monkeypatch.setenv("MM_AGENT_TOKEN", TOKEN)
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], STOCK, site_settings={"s1": {"token": "${MM_AGENT_TOKEN}"}})
    for i in range(5):
        cl.execute("s2", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"n{i}", i))
    cl.refresh("s1", "s2")
    cl.refresh("s3", "s2")

    def link(st: dict[str, Any]) -> dict[str, Any]:
        (ln,) = [x for x in st["links"] if (x["from"], x["to"]) == ("s1", "s3")]
        return ln

    r = mm("status", "-t", str(cl.topo.path), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    ln = link(json.loads(r.stdout))
    assert ln["waiting"] == 0 and ln["oldest_waiting_age_s"] is None
    for i in range(5):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"m{i}", i))
    assert link(api.status(cl.topo))["waiting"] == 5
    with running_agent(cl.topo, "s1") as url:
        assert link(api.status(_peer_file(tmp_path, url)))["waiting"] == 5


def test_relay_needed_keeps_the_cheaper_rule_and_its_wait(sqlite_backend: Any, tmp_path: Path) -> None:
    """`refresh: {relay: needed}`: a mesh of latest/additive tables relays nothing; while s3 is away
    s1 waits for s3's insert (s2's update of it is parked, and status names what it waits for),
    and gets everything once s3 is back."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], STOCK, settings={"refresh": {"relay": "needed"}})
    cl.execute("s3", "INSERT INTO stock (name, qty) VALUES ('x', 10)")
    cl.refresh("s2", "s3")
    cl.execute("s2", "UPDATE stock SET qty = qty + 5 WHERE name = 'x'")
    faults.site_down(cl, "s3", tmp_path / "away")
    cl.refresh("s1", "s2")
    assert _by_name(cl, "s1") == {} and _waiting(cl, "s1") == 1
    (ln,) = [x for x in api.status(cl.topo)["links"] if (x["from"], x["to"]) == ("s2", "s1")]
    assert ln["parked"] == 1 and "has not received" in ln["waits_for"]
    faults.site_up(cl, "s3", tmp_path / "away")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert _by_name(cl, "s1") == {"x": 15}


def test_relay_setting_is_checked(tmp_path: Path) -> None:
    from multimaster.config.topology import load_topology
    from multimaster.errors import ConfigError

    p = tmp_path / "t.yaml"
    p.write_text(
        "sites: {a: {url: 'sqlite:///a.db'}, b: {url: 'sqlite:///b.db'}}\ntables: {t: {key: id}}\nrefresh: {relay: sometimes}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_topology(p)
    assert "relay" in str(e.value) and "t.yaml" in str(e.value)


def test_remove_site_counts_only_the_removed_sites_own_changes_as_waiting(backend, tmp_path):  # type: ignore[no-untyped-def]
    """In a mesh s3 relays what it applies. s3 never wrote; it applied s1's insert and relayed it,
    and s2 has not pulled it yet (from s1 or from s3). remove-site s3 goes on: what waits on the
    link s3 -> s2 is s1's change, which s2 gets from s1 (before: refused, "'s2': 1 waiting", and
    under steady writes never otherwise). A change of s3's own that s2 has not pulled still makes
    it refuse."""
    import yaml

    from multimaster.config.topology import load_topology

    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK)
    topo = str(tmp_path / "topology.yaml")
    cl.execute("s3", "INSERT INTO stock (name, qty) VALUES ('own', 1)")
    cl.refresh("s1", "s3")
    r = mm("remove-site", "-t", topo, "s3")
    assert r.returncode != 0 and "'s2': 1 waiting" in r.stderr, r.stdout + r.stderr
    cl.refresh("s2", "s3")
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('x', 5)")
    cl.refresh("s3", "s1")  # s3 applies x and relays it; s2 has it from neither yet
    st = api.status(cl.topo)
    assert [ln["waiting"] for ln in st["links"] if (ln["from"], ln["to"]) == ("s3", "s2")] == [1]
    r = mm("remove-site", "-t", topo, "s3")
    assert r.returncode == 0, r.stdout + r.stderr
    # run again (a script, a second operator): it says so, and changes nothing (before: "not connected")
    r = mm("remove-site", "-t", topo, "s3", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["already_removed"] is True, r.stdout + r.stderr
    r = mm("remove-site", "-t", topo, "s3")
    assert r.returncode == 0 and "s3 was removed already" in r.stdout, r.stdout + r.stderr
    doc = yaml.safe_load(Path(topo).read_text())
    del doc["sites"]["s3"]
    Path(topo).write_text(yaml.safe_dump(doc, sort_keys=False))
    cl.topo = load_topology(topo)
    del cl.urls["s3"]
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert sorted(r[1] for r in cl.rows("s2", "stock")) == ["own", "x"]
