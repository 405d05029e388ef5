"""The fault-injection suite, short mode (issue #13; the long mode is benchmarks/faults.py).

Applications write through plain clients at every site while `multimaster run` daemons and
`multimaster refresh --until-quiet` processes are SIGKILLed at random moments; a site goes down
and comes back; a dead site is removed for good; a hand-corrupted change-log row is held; a clock
runs ahead past refresh.max_clock_offset. Each scenario ends with every site equal to the
reference model of the committed transactions (tests/faults.py): nothing lost, nothing applied
twice. A failure prints its seed: ``MM_FAULT_SEED=<n> pytest tests/test_faults.py -k ...`` replays
its random choices."""

from __future__ import annotations

from pathlib import Path

import faults
import pytest
from clusters import BACKENDS, Backend, server_unavailable


def _server(name: str) -> Backend:
    try:
        return BACKENDS[name]()  # type: ignore[no-any-return]
    except ConnectionError as e:
        server_unavailable(name, str(e))
        raise


def _check(res: faults.Result) -> None:
    print(res.summary())
    assert res.ok(), res.failure()


def test_sqlite_refreshers_and_daemons_killed_at_random(sqlite_backend: Backend, tmp_path: Path) -> None:
    """Three sites, ten kills; halfway, one update at s1 has its change-log entry corrupted
    by hand in the transaction that made it: s2 and s3 each hold it in their error queue
    (malformed), and everything else converges to the model."""
    res = faults.kills(sqlite_backend, tmp_path, faults.seed_from_env(), n_sites=3, n_kills=10, corrupt=True)
    _check(res)
    assert res.kills >= 10 and res.changes > 0
    assert res.notes["held"] == {"s1": 0, "s2": 1, "s3": 1}


@pytest.mark.parametrize("name", ["postgresql", "mysql"])
def test_server_refreshers_and_daemons_killed_at_random(name: str, tmp_path: Path) -> None:
    """Two sites, five kills; on MariaDB also a hand-corrupted change-log row (held at the other
    site with its source transaction)."""
    b = _server(name)
    try:
        res = faults.kills(b, tmp_path, faults.seed_from_env(), n_sites=2, n_kills=5, corrupt=name == "mysql")
    finally:
        b.cleanup()
    _check(res)
    assert res.kills >= 5 and res.changes > 0
    if name == "mysql":
        assert res.notes["held"] == {"s1": 0, "s2": 1}


def test_a_site_down_and_back(sqlite_backend: Backend, tmp_path: Path) -> None:
    _check(faults.down_and_back(sqlite_backend, tmp_path, faults.seed_from_env(), n_kills=5))


def test_a_mariadb_site_down_and_back(tmp_path: Path) -> None:
    """MariaDB: the site's own login is locked and its sessions killed while the others write and
    their refreshers are killed; then it is let in again (PostgreSQL and the dead site removed
    for good on both servers run in benchmarks/faults.py)."""
    b = _server("mysql")
    try:
        res = faults.down_and_back(b, tmp_path, faults.seed_from_env(), n_kills=4)
    finally:
        b.cleanup()
    _check(res)


def test_a_dead_site_removed_for_good(sqlite_backend: Backend, tmp_path: Path) -> None:
    res = faults.remove_dead_site(sqlite_backend, tmp_path, faults.seed_from_env(), n_kills=4)
    _check(res)
    assert res.notes["remove_site"] == {"unreachable": ["s3"], "cleaned": ["s1", "s2"]}
    assert res.notes["lost_with_s3"] > 0


def test_a_clock_ahead_past_the_offset_is_held_then_flows(sqlite_backend: Backend, tmp_path: Path) -> None:
    res = faults.clock_ahead(sqlite_backend, tmp_path, faults.seed_from_env(), ahead_s=12.0)
    _check(res)
    assert res.notes["held_links"]


def test_a_dead_site_whose_peers_hold_different_prefixes_of_its_log(sqlite_backend: Backend, tmp_path: Path) -> None:
    """s1 applied a change of s3 that s2 had not pulled when s3 died: remove-site gives it to s2 from
    s1's snapshot of s3 before dropping it (a mesh of latest/additive tables relays none of it), so
    the survivors end equal (tests/test_remove_dead_site.py covers the cases in depth)."""
    import yaml
    from clusters import make_cluster

    from multimaster.config.topology import load_topology
    from multimaster.ops.instantiate import remove_site

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], {"items": {"key": "id", "columns": {"name": "text"}}})
    cl.execute("s3", "INSERT INTO items (name) VALUES ('made at s3')")
    cl.refresh("s1", "s3")  # s1 pulled it; s2 had not yet when s3 died
    faults.site_down(cl, "s3", tmp_path / "away")
    rep = remove_site(cl.topo, "s3", force=True)
    assert rep.unreachable == ["s3"]
    assert rep.ok and [(g["site"], g["from"]) for g in rep.relayed] == [("s2", "s1")]
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    del doc["sites"]["s3"]
    Path(cl.topo.path).write_text(yaml.safe_dump(doc))
    cl.topo = load_topology(cl.topo.path)
    del cl.urls["s3"]
    cl.refresh_until_quiet()
    assert cl.rows("s1", "items") == cl.rows("s2", "items")
