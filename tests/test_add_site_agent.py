"""add-site on the new site's host, its peer and other sources reached through their agents
(docs/agent.md, docs/operations.md "Adding a site"): the copy is one consistent read streamed by
the peer's agent and one transaction at the new site, so a stream broken off midway writes
nothing and a re-run finishes; the result is the result of the same add-site from the database;
the sites pulling from the new one that are reached through their agents are left to be
connected on their own hosts (`add-site --connect-only`), named with the command, exit code 3
and in `status` until then."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from clusters import Backend, TestCluster, made, make_cluster
from test_add_site import STOCK, Writers
from test_agent import TOKEN, TYPED, running_agent

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.errors import AgentError, AgentOnly
from multimaster.ops import agent as agent_mod
from multimaster.ops.instantiate import add_site, connect_site

ROOT = Path(__file__).resolve().parent.parent

TOKENS = {"s1": {"token": "${MM_AGENT_TOKEN}"}, "s2": {"token": "${MM_AGENT_TOKEN}"}}


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_AGENT_TOKEN", TOKEN)


class Mixed(TestCluster):
    """A cluster whose sites may be on different databases (`of`: site -> its backend)."""

    __test__ = False

    def __init__(self, base: TestCluster, topo: Any, urls: dict[str, str], of: dict[str, Backend]):
        super().__init__(base.backend, topo, urls, base.tables)
        self.of = of

    def db(self, site: str) -> Any:
        return self.of[site].connect(self.urls[site])

    def execute(self, site: str, sql: str, params: tuple[Any, ...] = ()) -> None:
        c = self.db(site)
        try:
            c.cursor().execute(sql.replace("?", self.of[site].param()), params)
            c.commit()
        finally:
            c.close()


def grow(cl: TestCluster, tmp: Path, new: list[str], backend: Backend, links: Any = "mesh") -> Mixed:
    """Sites `new` (on `backend`, their tables created empty) listed in `grown.yaml`, the file of a
    host reaching every site by its database."""
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    urls = dict(cl.urls)
    for n in new:
        urls[n] = backend.new_site(tmp, n)
        for tb, spec in cl.tables.items():
            backend.create_table(urls[n], tb, spec["key"], spec["columns"], spec.get("auto", True))
        doc["sites"][n] = {"url": urls[n]}
    doc["links"] = links
    (tmp / "grown.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    of = {s: cl.backend for s in cl.urls} | {n: backend for n in new}
    return Mixed(cl, load_topology(tmp / "grown.yaml"), urls, of)


def host_file(tmp: Path, name: str, agents: dict[str, str]) -> Path:
    """The grown file as a host reaching the sites of `agents` only through their agents has it."""
    doc = yaml.safe_load((tmp / "grown.yaml").read_text())
    for s, url in agents.items():
        doc["sites"][s] = {"url": url, "token": "${MM_AGENT_TOKEN}"}
    (tmp / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp / name


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "multimaster.cli", *args], capture_output=True, text=True, env=env, timeout=300)


def _installed(cl: Mixed, site: str) -> list[str]:
    with api.Cluster(cl.topo) as c, c.site(site).read() as conn:
        return list(c.site(site).installed_tables(conn))


@pytest.mark.parametrize("pair", ["sqlite-sqlite", "postgresql-sqlite", "postgresql-postgresql"])
def test_add_site_through_agents_while_the_others_keep_writing(pair: str, tmp_path: Path) -> None:
    """s3 is added on its own host, which reaches s1 (the peer) and s2 only through their agents,
    while s1 and s2 keep writing and replicating. s1 and s2 pull from s3: add-site leaves them
    pending, named with the command; refresh and status there name it too. Once connected on
    their host they pull s3 from 0, and every site converges, keys included, with no change lost
    or applied twice."""
    old_name, new_name = pair.split("-")
    old, new = made(old_name), made(new_name)
    try:
        cl = make_cluster(old, tmp_path, ["s1", "s2"], STOCK, base={"s1": [("stock", 1, "counter", 0), ("stock", 2, "w", 10)]},
                          site_settings=TOKENS)  # fmt: skip
        cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('early', 1)")
        cl.refresh_until_quiet()
        big = grow(cl, tmp_path, ["s3"], new)
        with running_agent(big.topo, "s1") as u1, running_agent(big.topo, "s2") as u2:
            here = load_topology(host_file(tmp_path, "s3.yaml", {"s1": u1, "s2": u2}))
            stop = threading.Event()

            def refresher() -> None:  # the old links keep replicating during the copy
                with api.Cluster(cl.topo) as c:
                    while not stop.is_set():
                        api.refresh(c)

            with Writers(cl, ["s1", "s2"]) as w:
                t = threading.Thread(target=refresher)
                t.start()
                try:
                    time.sleep(0.05)
                    rep = add_site(here, "s3", "s1", batch_size=7)
                    big.execute("s3", "INSERT INTO stock (name, qty) VALUES ('from-s3', 3)")
                    big.execute("s3", "UPDATE stock SET qty = qty + 100 WHERE id = 1")
                    time.sleep(0.05)
                finally:
                    stop.set()
                    t.join()
            assert rep.rows["stock"] >= 3 and rep.log_entries["stock"] >= 3 and set(rep.watermarks) == {"s1", "s2"}
            assert not rep.ok and rep.pullers == [] and [p["site"] for p in rep.pending] == ["s1", "s2"]
            for p in rep.pending:
                assert p["fix"] == f"on {p['site']}'s host: multimaster add-site -t FILE s3 --connect-only --site {p['site']}"
                assert "agent" in p["reason"]
            # s3 pulls s1 and s2 through their agents meanwhile
            assert all(r.error is None for r in api.refresh(here, "s3"))
            # the links into s1 and s2 wait for their connection, and say how
            st = api.status(here)
            for s in ("s1", "s2"):
                link = next(x for x in st["links"] if (x["from"], x["to"]) == ("s3", s))
                assert f"--connect-only --site {s}" in link["error"] and not st["converging"]
            (r,) = api.refresh(big.topo, "s1", "s3")
            assert r.error and "add-site -t FILE s3 --connect-only --site s1" in r.error
            # on s1's and s2's host
            crep = connect_site(big.topo, "s3")
            assert crep.connected == ["s1", "s2"] and crep.ok
            assert connect_site(big.topo, "s3", ["s1"]).already == ["s1"]
            again = add_site(here, "s3", "s1")  # checks, through the agents: nothing pending now
            assert again.already_installed and again.ok and again.pullers == ["s1", "s2"]
        big.refresh_until_quiet()
        big.assert_converged()
        rows = big.rows("s3", "stock")
        names = [r[1] for r in rows]
        assert len(names) == len(set(names)), "a row was inserted twice"
        assert len(rows) == 2 + 1 + sum(w.inserts.values()) + 1, "a row was lost"
        assert rows[0] == (1, "counter", sum(w.increments.values()) + 100), "an increment was lost or applied twice"
    finally:
        new.cleanup()
        old.cleanup()


def _write(cl: TestCluster, site: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        cl.execute(
            site,
            "INSERT INTO items (name, big, price, amount, flag, data, day, at) "
            "VALUES (?, ?, ?, ?, ?, ?, '2024-02-29', '2024-02-29 23:59:58.123456')",
            (f"n{i}", 2**62 + i, 0.1 * i, str(Decimal("1234.50") + i), i % 2 == 0, bytes([i % 256, 0, 255])),
        )


def _state(cl: Mixed, site: str) -> dict[str, Any]:
    """What add-site wrote at `site`, typed: rows, identities, change log, dedupe record, watermarks,
    snapshots, registration and the sites recorded as removed."""
    with api.Cluster(cl.topo) as c, c.site(site).read() as conn:
        d = c.site(site).dialect
        o = d.obj("items")

        def rows(sql: str) -> list[Any]:
            return [[(type(v).__name__, v) for v in r] for r in conn.exec_driver_sql(sql)]

        key = d.key_col
        log_cols = f"ver, origin, op, rid, {key}, mask, " + ", ".join(
            d.quote(p + c) for p in ("n_", "o_") for c in sorted(TYPED["items"]["columns"])
        )
        return {
            "rows": cl.rows(site, "items"),
            "typed": rows(f"SELECT * FROM {d.quote('items')} ORDER BY id"),
            "shadow": rows(f"SELECT * FROM {o.shadow} ORDER BY rid"),
            "log": rows(f"SELECT {log_cols} FROM {o.log} ORDER BY seq"),
            "log2": rows(f"SELECT seq2, op FROM {o.log2} ORDER BY seq2"),
            "origins": rows(f"SELECT tbl, origin, max_ver FROM {d.mm_table('_mm_origins')} ORDER BY tbl, origin"),
            "watermarks": rows(f"SELECT peer, tbl, seq2 FROM {d.mm_table('_mm_watermarks')} ORDER BY peer, tbl"),
            "snap_s1": rows(f"SELECT * FROM {d.obj('items', 's1').snapshot()} ORDER BY pseq"),
            "snap_s2": rows(f"SELECT * FROM {d.obj('items', 's2').snapshot()} ORDER BY pseq"),
            "tables": rows(f"SELECT * FROM {d.mm_table('_mm_tables')} ORDER BY tbl"),
            "retired": rows(f"SELECT site FROM {d.mm_table('_mm_retired')} ORDER BY site"),
            "clock": (d.read_clock(conn) or 0) > 0,
        }


@pytest.mark.parametrize("pair", ["sqlite-sqlite", "postgresql-sqlite", "mysql-sqlite"])
def test_the_copy_through_the_agent_is_the_copy_from_the_database(pair: str, tmp_path: Path) -> None:
    """Two new sites copied from s1 at the same moment, s3 through s1's agent (s2 through its
    agent too), s4 from s1's database: the same rows (typed values: big ints, Decimal, float,
    bool, bytes, date, timestamp), identities, change log, dedupe record, watermarks (s4 pulls s2
    from its current position: s1 does not pull s2 here), snapshots and registration. s1 purged
    part of its log and records a removed site first."""
    old_name, new_name = pair.split("-")
    old, new = made(old_name), made(new_name)
    try:
        links = [{"from": "s2", "to": "s1"}, {"from": "s1", "to": "s2"}]
        cl = make_cluster(old, tmp_path, ["s1", "s2"], TYPED, links=links, site_settings=TOKENS)
        _write(cl, "s1", 9)
        _write(cl, "s2", 4, start=100)
        cl.refresh_until_quiet()
        cl.execute("s1", "UPDATE items SET name = NULL, data = NULL WHERE name = 'n1'")
        cl.execute("s2", "DELETE FROM items WHERE name = 'n3'")
        cl.refresh("s1")
        from multimaster.ops.purge import PurgePolicy, purge_site

        with api.Cluster(cl.topo) as c:
            assert purge_site(c, "s1", PurgePolicy(min_age=0)).purged >= 1
            with c.site("s1").write() as conn:
                from multimaster import store
                from multimaster.core.versions import now_iso

                store.retired.record(conn, c.site("s1").dialect, "gone", now_iso())
        # s1 does not pull s2 any more: the new sites start s2 at its current position
        grown_links = [{"from": "s1", "to": "s2"}] + [
            {"from": a, "to": b} for n in ("s3", "s4") for a, b in (("s1", n), (n, "s1"), ("s2", n))
        ]
        big = grow(cl, tmp_path, ["s3", "s4"], new, links=grown_links)
        with running_agent(big.topo, "s1") as u1, running_agent(big.topo, "s2") as u2:
            here = load_topology(host_file(tmp_path, "s3.yaml", {"s1": u1, "s2": u2}))
            via = add_site(here, "s3", "s1", batch_size=3)
            with api.Cluster(here) as c, api.Cluster(big.topo) as d:
                _same_description(c.site("s1"), d.site("s1"), big.topo)
        direct = add_site(big.topo, "s4", "s1", batch_size=3)
        assert (via.rows, via.identities, via.log_entries) == (direct.rows, direct.identities, direct.log_entries)
        if old_name == "mysql":  # reading a horizon there draws a tick of the site's clock: the later copy starts later
            assert via.watermarks["s1"]["items"] < direct.watermarks["s1"]["items"]
            via.watermarks["s1"] = direct.watermarks["s1"]
        assert via.watermarks == direct.watermarks and via.watermarks["s2"]["items"] > 0
        assert [p["site"] for p in via.pending] == ["s1"] and direct.pending == [] and direct.pullers == ["s1"]
        a, b = _state(big, "s3"), _state(big, "s4")
        if old_name == "mysql":
            a["watermarks"], b["watermarks"] = ([w for w in x["watermarks"] if w[0] != ("str", "s1")] for x in (a, b))
        for k in a:
            assert a[k] == b[k], k
        assert [r[:3] for r in a["rows"]] == [r[:3] for r in cl.rows("s1", "items")]  # keys, names, big ints
        assert len(a["log"]) >= 1 and a["retired"] == [[("str", "gone")]]
        connect_site(big.topo, "s3")
        big.execute("s3", "UPDATE items SET name = 'from-s3' WHERE name = 'n2'")
        big.execute("s4", "UPDATE items SET name = 'from-s4' WHERE name = 'n4'")
        big.refresh_until_quiet()
        # each driver returns its own types (docs/types.md): equal per database, keys and names everywhere
        assert big.rows("s3", "items") == big.rows("s4", "items") and big.rows("s1", "items") == big.rows("s2", "items")
        assert [r[:3] for r in big.rows("s3", "items")] == [r[:3] for r in big.rows("s1", "items")]
        assert "from-s3" in [r[1] for r in big.rows("s1", "items")]
    finally:
        new.cleanup()
        old.cleanup()


def _same_description(via: Any, direct: Any, topo: Any) -> None:
    """The tables as the agent describes them are the tables as read at the database, for every
    check add-site makes: names, declared types, kinds of value, UNIQUE sets, references."""
    from multimaster.dialects.types import kind_of
    from multimaster.engine.schema import compare_schemas

    got = via.describe()
    with direct.read() as conn:
        for tb in topo.tables:
            want = direct.info(conn, tb, topo)
            d = direct.dialect.name
            assert compare_schemas(tb, {"a": got[tb], "b": want}, {"a": d, "b": d}) == []
            assert [(c.name, c.type_sql, kind_of(d, c), c.nullable, c.default) for c in (got[tb].key, *got[tb].columns)] == [
                (c.name, c.type_sql, kind_of(d, c), c.nullable, c.default) for c in (want.key, *want.columns)
            ]
            assert (got[tb].uniques, got[tb].refs, got[tb].version, got[tb].dropped) == (
                want.uniques,
                want.refs,
                want.version,
                want.dropped,
            )


def test_every_value_type_crosses_the_wire_in_a_copy_piece() -> None:
    """The copy's pieces (engine/wire.py piece_out / piece_in): rows of every value type a driver
    returns, a registration and a dedupe record, through JSON and back, same types and values."""
    import json
    import uuid

    from multimaster.engine import wire

    row = (
        None,
        True,
        0,
        -(2**63),
        10**40,
        "é\u2603\x00",
        0.1,
        float("inf"),
        Decimal("12.340"),
        b"\x00\xff",
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
        dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
        dt.time(1, 2, 3, 4),
        dt.timedelta(days=-1, seconds=5),
        uuid.uuid4(),
        '{"a":[1,null]}',
    )  # fmt: skip  (a JSON document is carried as its text: dialects/types.py json_text)
    pieces = [
        {"kind": "rows", "table": "t", "into": "log", "rows": [row, row[::-1]]},
        {"kind": "table_end", "table": "t", "registration": ("id", 1, '["a"]', Decimal("7")), "watermarks": {"s2": 5}},
        {"kind": "applied", "table": "t", "origins": [("s1", "v1"), ("s2", "v2")], "own_top": None},
    ]
    for p in pieces:
        back = wire.piece_in(json.loads(wire.dumps(wire.piece_out(p))))
        assert back == p
        for k in ("rows", "registration"):
            if k in p:
                flat = [v for r in p[k] for v in r] if k == "rows" else list(p[k])
                got = [v for r in back[k] for v in r] if k == "rows" else list(back[k])
                assert [type(v) for v in got] == [type(v) for v in flat]


def test_a_copy_broken_off_midway_writes_nothing_and_a_rerun_finishes(
    sqlite_backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent dies while streaming the copy (after rows were written at s3 in its transaction):
    s3 is left as it was (nothing installed, no row); add-site run again finishes. A new site
    reached through its agent is refused (it is written), naming the agent."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TYPED, site_settings=TOKENS)
    _write(cl, "s1", 30)
    cl.refresh_until_quiet()
    big = grow(cl, tmp_path, ["s3"], sqlite_backend)
    real = agent_mod._copy_lines
    sent = {"lines": 0}

    def dying(first: Any, pieces: Any) -> Iterator[bytes]:
        for i, line in enumerate(real(first, pieces)):
            if i == 12:
                raise RuntimeError("agent killed")
            sent["lines"] += 1
            yield line

    monkeypatch.setattr(agent_mod, "_copy_lines", dying)
    with running_agent(big.topo, "s1") as url:
        here = load_topology(host_file(tmp_path, "s3.yaml", {"s1": url}))
        with pytest.raises(AgentError, match="broke off") as e:
            add_site(here, "s3", "s1", batch_size=2)
        assert "site 's1'" in str(e.value) and "add-site wrote nothing" in str(e.value)
        assert sent["lines"] == 12  # rows of the table had come and been written
        assert _installed(big, "s3") == [] and big.rows("s3", "items") == []
        monkeypatch.setattr(agent_mod, "_copy_lines", real)
        rep = add_site(here, "s3", "s1", batch_size=2)
        assert rep.rows["items"] == 30 and [p["site"] for p in rep.pending] == ["s1"]
        with pytest.raises(AgentOnly, match="site 's3' is reached through its agent"):
            add_site(load_topology(host_file(tmp_path, "other.yaml", {"s3": url})), "s3", "s1")
    assert big.rows("s3", "items") == cl.rows("s1", "items")
    connect_site(big.topo, "s3")
    big.refresh_until_quiet()
    big.assert_converged()


def test_the_cli_names_the_pullers_to_connect_and_exits_3_until_they_are(sqlite_backend: Backend, tmp_path: Path) -> None:
    """`multimaster add-site` on the new site's host (s1 through its agent): exit 3, the puller s1
    named with the command; `status` names it; `add-site --connect-only --site s1` on s1's host;
    add-site run again exits 0."""
    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], STOCK, site_settings=TOKENS)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('a', 1)")
    cl.refresh_until_quiet()
    big = grow(cl, tmp_path, ["s3"], sqlite_backend)
    with running_agent(big.topo, "s1") as url:
        here = host_file(tmp_path, "s3.yaml", {"s1": url})
        r = _cli("add-site", "-t", str(here), "s3", "--from", "s1")
        assert r.returncode == 3, r.stdout + r.stderr
        assert "pending s1" in r.stdout and "multimaster add-site -t FILE s3 --connect-only --site s1" in r.stdout
        assert "pulling from s3: s2" in r.stdout
        st = _cli("status", "-t", str(here), "--json")
        assert "--connect-only --site s1" in st.stdout
        (r1,) = api.refresh(big.topo, "s1", "s3")  # s1's host, before it is connected
        assert r1.error and "'s1' is not connected to 's3' yet" in r1.error
        c1 = _cli("add-site", "-t", str(tmp_path / "grown.yaml"), "s3", "--connect-only", "--site", "s1")
        assert c1.returncode == 0 and "s1 now holds its snapshot of s3" in c1.stdout, c1.stdout + c1.stderr
        r2 = _cli("add-site", "-t", str(here), "s3", "--from", "s1", "--json")
        assert r2.returncode == 0, r2.stdout + r2.stderr
        assert '"ok": true' in r2.stdout and '"already_installed": true' in r2.stdout
    big.refresh_until_quiet()
    big.assert_converged()
    assert len(big.rows("s3", "stock")) == 1
