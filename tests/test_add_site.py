"""Sites joining and leaving a running cluster: add-site under concurrent writes converges with no
change lost and none applied twice; re-instantiation of an expired site; remove-site."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusters import TestCluster, make_cluster

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.core.versions import HLC_SHIFT, hlc_now
from multimaster.errors import ConfigError, SchemaError
from multimaster.ops.instantiate import SiteNotDrained, add_site, remove_site
from multimaster.ops.purge import PurgePolicy, purge_site

STOCK = {"stock": {"key": "id", "columns": {"name": "text", "qty": "int"}, "config": {"columns": {"qty": "additive"}}}}
BASE = [("stock", 1, "counter", 0), ("stock", 2, "widgets", 10)]


def grow(cl: TestCluster, tmp: Path, new: str, links: Any = "mesh", name: str = "grown.yaml") -> TestCluster:
    """List site `new` in a copy of the cluster's topology file and create its empty tables."""
    url = cl.backend.new_site(tmp, new)
    for tb, spec in cl.tables.items():
        cl.backend.create_table(url, tb, spec["key"], spec["columns"], spec.get("auto", True))
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    doc["sites"][new] = {"url": url}
    doc["links"] = links
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return TestCluster(cl.backend, load_topology(path), {**cl.urls, new: url}, cl.tables)


class Writers:
    """Application writes at some sites, each in its own thread, until stopped."""

    def __init__(self, cl: TestCluster, sites: list[str]):
        self.cl = cl
        self.stop = threading.Event()
        self.inserts = {s: 0 for s in sites}
        self.increments = {s: 0 for s in sites}
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(s,)) for s in sites]

    def _run(self, site: str) -> None:
        try:
            i = 0
            while not self.stop.is_set() or i < 5:
                i += 1
                self._once(site, "INSERT INTO stock (name, qty) VALUES (?, ?)", (f"{site}-{i}", i))
                self.inserts[site] += 1
                self._once(site, "UPDATE stock SET qty = qty + 1 WHERE id = 1")
                self.increments[site] += 1
                time.sleep(0.002)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    def _once(self, site: str, sql: str, params: tuple[Any, ...] = ()) -> None:
        """One statement in its own transaction, again when MariaDB chose it as a deadlock victim
        (it rolled back; an application retries it, as it must on MariaDB)."""
        for attempt in range(20):
            try:
                self.cl.execute(site, sql, params)
                return
            except Exception as e:  # noqa: BLE001 - only a deadlock victim is retried
                if attempt == 19 or "deadlock" not in str(e).lower():
                    raise
                time.sleep(0.01)

    def __enter__(self) -> "Writers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        assert not self.errors, self.errors


def test_add_site_while_every_other_site_keeps_writing(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": BASE})
    cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('early', 1)")
    cl.refresh_until_quiet()
    big = grow(cl, tmp_path, "s3")
    refreshing = threading.Event()

    def refresher() -> None:  # the old links keep replicating during the copy
        with api.Cluster(cl.topo) as c:
            while not refreshing.is_set():
                api.refresh(c)

    with Writers(cl, ["s1", "s2"]) as w:
        t = threading.Thread(target=refresher)
        t.start()
        try:
            time.sleep(0.05)
            rep = add_site(big.topo, "s3", "s1", batch_size=7)
            big.execute("s3", "INSERT INTO stock (name, qty) VALUES ('from-s3', 3)")
            big.execute("s3", "UPDATE stock SET qty = qty + 100 WHERE id = 1")
            time.sleep(0.05)
        finally:
            refreshing.set()
            t.join()
    assert rep.rows["stock"] >= 3 and rep.pullers == ["s1", "s2"]
    big.refresh_until_quiet()
    big.assert_converged()
    rows = big.rows("s3", "stock")
    names = [r[1] for r in rows]
    assert len(names) == len(set(names)), "a row was inserted twice"
    assert len(rows) == 2 + 1 + sum(w.inserts.values()) + 1, "a row was lost"
    assert rows[0] == (1, "counter", sum(w.increments.values()) + 100), "an increment was lost or applied twice"


def test_add_site_from_a_peer_with_purged_logs_and_backlogs(backend, tmp_path):  # type: ignore[no-untyped-def]
    """The copy carries the dedupe record: changes purged at the peer are still duplicates at the new site."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": BASE})
    for _ in range(3):
        cl.execute("s1", "UPDATE stock SET qty = qty + 1 WHERE id = 1")
        cl.refresh_until_quiet()
    with api.Cluster(cl.topo) as c:
        assert purge_site(c, "s1", PurgePolicy(min_age=0)).purged >= 2
    cl.execute("s2", "UPDATE stock SET qty = qty + 1 WHERE id = 2")  # not yet at s1
    big = grow(
        cl,
        tmp_path,
        "s3",
        links=[
            {"from": "s1", "to": "s3"},
            {"from": "s3", "to": "s1"},
            {"from": "s2", "to": "s3"},
            {"from": "s3", "to": "s2"},
            {"from": "s1", "to": "s2"},
            {"from": "s2", "to": "s1"},
        ],
    )
    add_site(big.topo, "s3", "s1")
    big.refresh_until_quiet()
    big.assert_converged()
    assert big.rows("s3", "stock")[:2] == [(1, "counter", 3), (2, "widgets", 11)]


def _set_clock_floor(cl: TestCluster, site: str, hlc: int) -> None:
    """Put a site's clock ahead of the wall clock (as if it had received a version from a peer whose
    clock runs ahead): its capture takes versions above `hlc` from now on."""
    with api.Cluster(cl.topo) as c, c.site(site).write() as conn:
        conn.exec_driver_sql(f"UPDATE _mm_state SET hlc = {c.site(site).dialect.caps.placeholder}", (hlc,))


def _log_versions(cl: TestCluster, site: str, table: str) -> list[tuple[str, str]]:
    with api.Cluster(cl.topo) as c, c.site(site).read() as conn:
        d = c.site(site).dialect
        return [(str(o), str(v)) for o, v in conn.exec_driver_sql(f"SELECT origin, ver FROM {d.obj(table).log} ORDER BY seq")]


def test_new_site_clock_starts_past_everything_it_copied(backend, tmp_path):  # type: ignore[no-untyped-def]
    """After add-site the new site's clock is at least its source's: a change made there at once sorts
    after every version it copied (it follows them causally) and wins, under `latest`, over an older
    change another site made concurrently. The peers' clocks run ahead of the wall clock here, so the
    wall clock alone would give the new site's change a lower version than both (the topology
    allows that offset)."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": BASE}, settings={"refresh": {"max_clock_offset": "3h"}})
    hour = (3600 * 1000) << HLC_SHIFT
    now = hlc_now()
    _set_clock_floor(cl, "s2", now + hour)
    cl.execute("s2", "UPDATE stock SET name = 's2-earlier' WHERE id = 2")  # s1 has not pulled it: not copied
    _set_clock_floor(cl, "s1", now + 2 * hour)
    cl.execute("s1", "UPDATE stock SET name = 's1-copied' WHERE id = 1")
    big = grow(cl, tmp_path, "s3")
    add_site(big.topo, "s3", "s1")
    with api.Cluster(big.topo) as c:
        clocks = {}
        for s in ("s1", "s3"):
            with c.site(s).read() as conn:
                clocks[s] = c.site(s).dialect.read_clock(conn) or 0
    assert clocks["s1"] >= now + 2 * hour
    assert clocks["s3"] >= clocks["s1"], f"the new site's clock {clocks['s3']} is behind its source's {clocks['s1']}"
    big.execute("s3", "UPDATE stock SET name = 's3-later' WHERE id IN (1, 2)")
    log = _log_versions(big, "s3", "stock")
    copied = [v for o, v in log if o != "s3"]
    own = [v for o, v in log if o == "s3"]
    assert copied and len(own) == 2
    assert min(own) > max(copied), "a change made at the new site sorts before a change it had copied"
    big.refresh_until_quiet()
    big.assert_converged()
    assert [r[1] for r in big.rows("s1", "stock")[:2]] == ["s3-later", "s3-later"]


def test_add_site_checks_before_writing(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": BASE})
    with pytest.raises(ConfigError, match="not defined under sites"):
        add_site(cl.topo, "s9", "s1")
    chain = grow(cl, tmp_path, "s3", links={"chain": ["s1", "s2", "s3"]})
    with pytest.raises(ConfigError, match="must pull from 's1'"):
        add_site(chain.topo, "s3", "s1")
    big = grow(cl, tmp_path, "s4", name="four.yaml")
    big.execute("s4", "INSERT INTO stock (name, qty) VALUES ('stray', 1)")
    with pytest.raises(SchemaError, match="has 1 rows"):
        add_site(big.topo, "s4", "s1")
    with api.Cluster(big.topo) as c, c.site("s4").read() as conn:
        assert not c.site("s4").installed_tables(conn)  # nothing was written
    add_site(big.topo, "s4", "s1", replace=True)
    assert big.rows("s4", "stock") == big.rows("s1", "stock")
    # running it again finishes / checks, changes nothing
    rep = add_site(big.topo, "s4", "s1")
    assert rep.already_installed


def test_add_site_stops_on_install_problems_before_writing(sqlite_backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The new site's dialect is asked first, as init asks every site (MySQL: triggers refused under
    binary logging without SUPER, since its DDL cannot be rolled back)."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": BASE})
    big = grow(cl, tmp_path, "s3")
    with api.Cluster(big.topo) as c:
        d = type(c.site("s3").dialect)
    monkeypatch.setattr(d, "install_problems", lambda self, conn, tables: ["triggers cannot be created here"])
    with pytest.raises(SchemaError, match="site 's3': triggers cannot be created here"):
        add_site(big.topo, "s3", "s1")
    monkeypatch.undo()
    with api.Cluster(big.topo) as c, c.site("s3").read() as conn:
        assert not c.site("s3").installed_tables(conn)


def test_expired_site_is_reinstantiated(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": BASE})
    cl.execute("s2", "UPDATE stock SET qty = qty + 5 WHERE id = 2")
    cl.refresh_until_quiet()
    for i in range(3):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, 1)", (f"n{i}",))
    path = tmp_path / "s2.db"
    path.rename(tmp_path / "s2.away")  # s2 cannot be reached: given up once past the retention
    try:
        with api.Cluster(cl.topo) as c:
            rep = purge_site(c, "s1", PurgePolicy(retention=3600, min_age=0), now=time.time() + 2 * 3600)
    finally:
        (tmp_path / "s2.away").rename(path)
    assert rep.expired == ["s2"]
    assert api.refresh(cl.topo, "s2", "s1")[0].error
    remove_site(cl.topo, "s2", force=True)
    add_site(cl.topo, "s2", "s1", replace=True)
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert cl.rows("s2", "stock")[1] == (2, "widgets", 15)


def test_remove_site_releases_what_was_kept_for_it(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], STOCK, base={"s1": BASE})
    cl.execute("s3", "INSERT INTO stock (name, qty) VALUES ('from-s3', 1)")
    with pytest.raises(SiteNotDrained, match="'s3'"):
        remove_site(cl.topo, "s3")
    cl.refresh_until_quiet()
    for i in range(4):
        cl.execute("s1", "INSERT INTO stock (name, qty) VALUES (?, 1)", (f"n{i}",))
    cl.refresh("s2")  # s3 is leaving and will never pull these
    rep = remove_site(cl.topo, "s3")
    assert set(rep.cleaned) == {"s1", "s2"} and rep.uninstalled
    small = load_topology(_rewrite_without(cl, tmp_path, "s3"))
    with api.Cluster(small) as c:
        assert purge_site(c, "s1", PurgePolicy(min_age=0)).purged >= 3  # its own four inserts but the newest
        st = api.status(c)
    assert st["converging"]
    assert (
        "_mm" not in str(cl.db("s3").execute("SELECT group_concat(name) FROM sqlite_master").fetchone()[0] or "")
        if backend.name == "sqlite"
        else True
    )
    assert len(cl.rows("s3", "stock")) == 3  # its rows stay


def _rewrite_without(cl: TestCluster, tmp: Path, site: str) -> Path:
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    del doc["sites"][site]
    path = tmp / "smaller.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


ITEMS = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def test_add_site_from_a_peer_whose_tombstones_were_purged_keeps_every_key(backend, tmp_path):  # type: ignore[no-untyped-def]
    """A new site copies its peer's keys with the holes the peer's purge left in its ranks. Before,
    on PostgreSQL and MariaDB, the new site's first reconcile ranked every copied key again from
    the table's base (it had no record of the keys ranked): every row after a hole moved down
    there for good."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    for i in range(1, 8):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, ?)", (f"r{i}", i))
    cl.execute("s1", "DELETE FROM items WHERE id IN (2, 3)")
    cl.refresh_until_quiet()
    policy = PurgePolicy(min_age=0, tombstones_after=0)
    for _ in range(2):
        with api.Cluster(cl.topo) as c:
            for s in ("s1", "s2"):
                purge_site(c, s, policy)
        cl.refresh_until_quiet()
    assert api.status(cl.topo)["sites"]["s1"]["tables"]["items"]["tombstones"] == 0
    big = grow(cl, tmp_path, "s3")
    add_site(big.topo, "s3", "s1")
    big.execute("s3", "INSERT INTO items (name, qty) VALUES ('at s3', 0)")
    big.refresh_until_quiet()
    want = [(1, "r1", 1)] + [(i, f"r{i}", i) for i in range(4, 8)] + [(8, "at s3", 0)]
    for s in ("s1", "s2", "s3"):
        assert big.rows(s, "items") == want, s
