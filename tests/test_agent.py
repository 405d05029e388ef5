"""The site agent (docs/agent.md): a peer pulling through `multimaster serve` gets what a pull from
the database gets, on SQLite, PostgreSQL and MariaDB; wrong tokens, sites and certificates fail
cleanly with nothing applied; an answer broken off midway applies nothing; mixed topologies
converge through the CLI."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from clusters import make_cluster

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.engine.pull import pull_link
from multimaster.engine.remote import AgentSite
from multimaster.errors import ConfigError
from multimaster.ops import agent as agent_mod
from multimaster.ops.purge import PurgePolicy, purge

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "agent-token-0123456789abcdef"
TYPED = {
    "items": {
        "key": "id",
        "columns": {
            "name": "text",
            "big": "bigint",
            "price": "real",
            "amount": "decimal",
            "flag": "bool",
            "data": "blob",
            "day": "date",
            "at": "timestamp",
        },
    }
}


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_AGENT_TOKEN", TOKEN)


def _cluster(backend: Any, tmp: Path, sites: tuple[str, ...] = ("s1", "s2", "s3"), **kw: Any) -> Any:
    return make_cluster(backend, tmp, list(sites), TYPED, site_settings={"s1": {"token": "${MM_AGENT_TOKEN}"}}, **kw)


def _write(cl: Any, site: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        cl.execute(
            site,
            "INSERT INTO items (name, big, price, amount, flag, data, day, at) "
            "VALUES (?, ?, ?, ?, ?, ?, '2024-02-29', '2024-02-29 23:59:58.123456')",
            (f"n{i}", 2**62 + i, 0.1 * i, str(Decimal("1234.50") + i), i % 2 == 0, bytes([i % 256, 0, 255])),
        )
    cl.execute(site, "UPDATE items SET name = NULL, data = NULL WHERE name = 'n1'")


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def running_agent(topo: Any, site: str = "s1", cert: str | None = None, key: str | None = None) -> Iterator[str]:
    """An agent of `site` in a thread on a free loopback port; yields its url."""
    sock = _free_socket()
    port = sock.getsockname()[1]
    server = agent_mod.make_server(topo, site, f"127.0.0.1:{port}", cert, key)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.time() + 10
    while not server.started:
        assert time.time() < deadline and t.is_alive(), "the agent did not start"
        time.sleep(0.01)
    try:
        yield f"{'https' if cert else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()


def _peer_file(tmp: Path, url: str, name: str = "peer.yaml", **s1: Any) -> Any:
    """This cluster's topology file as a host without site s1's database has it: s1 is its agent."""
    doc = yaml.safe_load((tmp / "topology.yaml").read_text())
    doc["sites"]["s1"] = {"url": url, "token": "${MM_AGENT_TOKEN}", **s1}
    (tmp / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_topology(tmp / name)


def _typed(rows: Any) -> Any:
    return [[(type(v).__name__, v) for v in r] for r in rows]


def test_pull_through_the_agent_is_the_pull_from_the_database(backend: Any, tmp_path: Path) -> None:
    """On every database: the agent's read (typed values: big ints, Decimal, float, bool, bytes,
    date, datetime, NULL) equals the direct read, window by window; a refresh through it leaves
    the target as a direct refresh leaves another."""
    tables = TYPED
    if backend.name != "sqlite":  # and a timestamp with time zone (aware datetimes from the driver)
        tables = {"items": {**TYPED["items"], "columns": {**TYPED["items"]["columns"], "tz": "timestamptz"}}}
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], tables, site_settings={"s1": {"token": "${MM_AGENT_TOKEN}"}})
    _write(cl, "s1", 12)
    if backend.name != "sqlite":
        cl.execute("s1", "UPDATE items SET tz = '2024-03-01 10:11:12.654321' WHERE MOD(big, 3) = 0")
    with running_agent(cl.topo) as url:
        peer = _peer_file(tmp_path, url)
        with api.Cluster(cl.topo) as direct, api.Cluster(peer) as remote:
            src, via = direct.site("s1"), remote.site("s1")
            assert isinstance(via, AgentSite) and via.dialect.name == src.dialect.name
            with direct.site("s3").read() as conn:
                infos = [direct.site("s3").info(conn, "items", cl.topo)]
            for window in (1000, 5):
                a = pull_link(src, "s3", infos, {"items": 0}, window)
                b = via.pull_link("s3", infos, {"items": 0}, window)
                assert _typed(a.rows["items"]) == _typed(b.rows["items"]) and len(a.rows["items"]) >= 5
                assert (a.end, a.continuing, a.more) == (b.end, b.continuing, b.more)
                # a horizon read may draw a tick of the site's clock itself (MariaDB): the later read's is not lower
                assert (a.horizon is None) == (b.horizon is None) and (a.horizon or 0) <= (b.horizon or 0)
            # entries the target has travel as positions only, trimmed on the wire and padded again
            have = {"items": {"s1": "9" * 19 + ":s1"}}
            a, b = pull_link(src, "s3", infos, {"items": 0}, 1000, have), via.pull_link("s3", infos, {"items": 0}, 1000, have)
            assert _typed(a.rows["items"]) == _typed(b.rows["items"]) and len(a.rows["items"]) >= 12
            assert all(r[3:] == (None,) * (len(r) - 3) for r in b.rows["items"])
            assert via.purge_horizon("items") == 0 and via.registered_columns("items") is not None
        cl.refresh("s2", "s1")  # directly
        res = api.refresh(peer, "s3", "s1", batch_size=4)  # through the agent, in several batches
        assert res[0].error is None and res[0].pulled >= 12
    assert cl.rows("s3", "items") == cl.rows("s2", "items") == cl.rows("s1", "items")
    assert len(cl.rows("s3", "items")) == 12


def test_wrong_token_or_site_fails_naming_the_agent_and_applies_nothing(sqlite_backend: Any, tmp_path: Path) -> None:
    cl = _cluster(sqlite_backend, tmp_path)
    _write(cl, "s1", 3)
    with running_agent(cl.topo) as url:
        os.environ["MM_WRONG"] = "not-the-token-at-all"
        doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
        doc["sites"]["s1"] = {"url": url, "token": "${MM_WRONG}"}
        (tmp_path / "wrong.yaml").write_text(yaml.safe_dump(doc))
        wrong = load_topology(tmp_path / "wrong.yaml")
        (r,) = api.refresh(wrong, "s3", "s1")
        assert "site 's1'" in r.error and "refused the token" in r.error and url in r.error
        assert "not-the-token" not in r.error
        st = api.status(wrong)
        link = next(x for x in st["links"] if (x["from"], x["to"]) == ("s1", "s3"))
        assert "refused the token" in (link.get("last_error") or link.get("error") or "")
        assert st["sites"]["s1"]["reachable"] is False and "refused the token" in st["sites"]["s1"]["error"]
        # an agent of another site behind the url
        doc["sites"]["s2"] = {"url": url, "token": "${MM_AGENT_TOKEN}"}
        doc["sites"]["s1"] = {"url": url, "token": "${MM_AGENT_TOKEN}"}
        (tmp_path / "other.yaml").write_text(yaml.safe_dump(doc))
        (r2,) = api.refresh(load_topology(tmp_path / "other.yaml"), "s3", "s2")
        assert "serves site 's1', not 's2'" in r2.error
    assert cl.rows("s3", "items") == []
    # the agent gone: unreachable, named
    (r3,) = api.refresh(_peer_file(tmp_path, url), "s3", "s1")
    assert "site 's1'" in r3.error and "cannot be reached" in r3.error
    assert cl.rows("s3", "items") == []


def test_serving_refuses_plain_http_off_loopback_and_a_site_without_token(sqlite_backend: Any, tmp_path: Path) -> None:
    cl = _cluster(sqlite_backend, tmp_path)
    with pytest.raises(ConfigError, match="plain HTTP on an address other than loopback"):
        agent_mod.make_server(cl.topo, "s1", "0.0.0.0:8470")
    with pytest.raises(ConfigError, match="sites.s2.token"):
        agent_mod.make_server(cl.topo, "s2", "127.0.0.1:8470")
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["sites"]["s1"] = {"url": "http://10.1.2.3:8470", "token": "${MM_AGENT_TOKEN}"}
    (tmp_path / "clear.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="insecure_http"):
        load_topology(tmp_path / "clear.yaml")
    doc["sites"]["s1"]["insecure_http"] = True
    (tmp_path / "clear.yaml").write_text(yaml.safe_dump(doc))
    assert load_topology(tmp_path / "clear.yaml").sites["s1"].agent
    peer = _peer_file(tmp_path, "http://127.0.0.1:1")
    with pytest.raises(Exception, match="reached through its agent"):
        api.refresh(peer, "s1")


def _self_signed(tmp: Path) -> tuple[str, str]:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "multimaster test agent")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cp, kp = tmp / "agent.pem", tmp / "agent.key"
    cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    kp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(cp), str(kp)


def test_tls_with_a_self_signed_certificate(sqlite_backend: Any, tmp_path: Path) -> None:
    cl = _cluster(sqlite_backend, tmp_path)
    _write(cl, "s1", 4)
    cert, key = _self_signed(tmp_path)
    with running_agent(cl.topo, cert=cert, key=key) as url:
        assert url.startswith("https://")
        (r,) = api.refresh(_peer_file(tmp_path, url, "untrusted.yaml"), "s3", "s1")
        assert "TLS failed" in r.error and "'ca:'" in r.error and "site 's1'" in r.error
        assert cl.rows("s3", "items") == []
        (r,) = api.refresh(_peer_file(tmp_path, url, "trusted.yaml", ca="agent.pem"), "s3", "s1")
        assert r.error is None and r.pulled == 5  # 4 inserts, 1 update
    assert cl.rows("s3", "items") == cl.rows("s1", "items")


def test_an_answer_broken_off_midway_applies_nothing(
    sqlite_backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent dies while sending the second window of a SQLite source (whose windows apply in
    one target transaction): nothing of the link is applied, the watermark stays; the next
    refresh completes."""
    cl = _cluster(sqlite_backend, tmp_path)
    _write(cl, "s1", 40)
    real = agent_mod._lines
    calls = {"n": 0}

    def dying(read: Any, trim: bool = False) -> Iterator[bytes]:
        calls["n"] += 1
        for i, line in enumerate(real(read, trim)):
            if calls["n"] >= 2 and i == 2:
                raise RuntimeError("agent killed")
            yield line

    monkeypatch.setattr(agent_mod, "ROWS_PER_LINE", 3)
    monkeypatch.setattr(agent_mod, "_lines", dying)
    with running_agent(cl.topo) as url:
        peer = _peer_file(tmp_path, url)
        (r,) = api.refresh(peer, "s3", "s1", batch_size=3)
        assert r.error and "broke off" in r.error and "site 's1'" in r.error
        assert cl.rows("s3", "items") == []
        with api.Cluster(cl.topo) as c, c.site("s3").read() as conn:
            from multimaster import store

            assert store.watermarks.read(conn, c.site("s3").dialect, "s1", "items") == 0
        monkeypatch.setattr(agent_mod, "_lines", real)
        (r,) = api.refresh(peer, "s3", "s1", batch_size=3)
        assert r.error is None
    assert cl.rows("s3", "items") == cl.rows("s1", "items")


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "multimaster.cli", *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def test_mixed_topology_converges_through_the_cli(sqlite_backend: Any, tmp_path: Path) -> None:
    """s1's host runs `multimaster serve` (its file has s1's database); the other host's file
    reaches s1 through the agent and s2, s3 directly. Each host refreshes its own sites; status
    and purge read s1 through the agent."""
    cl = _cluster(sqlite_backend, tmp_path)
    _write(cl, "s1", 5)
    _write(cl, "s2", 3, start=100)
    sock = _free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "multimaster.cli", "serve", "-t", str(tmp_path / "topology.yaml"), "--site", "s1",
         "--listen", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        peer = _peer_file(tmp_path, f"http://127.0.0.1:{port}")
        deadline = time.time() + 20
        while True:
            try:
                with api.Cluster(peer) as c:
                    c.site("s1").hello()  # type: ignore[attr-defined]
                break
            except Exception:
                assert agent.poll() is None and time.time() < deadline, agent.stdout.read() if agent.stdout else ""
                time.sleep(0.1)
        _cli("refresh", "-t", str(tmp_path / "peer.yaml"), "--until-quiet")  # s2, s3: s1 through its agent
        _cli("refresh", "-t", str(tmp_path / "topology.yaml"), "--site", "s1")  # s1's host
        cl.assert_converged()
        assert len(cl.rows("s1", "items")) == 8
        st = _cli("status", "-t", str(tmp_path / "peer.yaml"), "--json")
        assert '"reachable": false' not in st.stdout
        reps = purge(peer, "s2", PurgePolicy(min_age=0))
        assert reps[0].error is None
        s1 = [p for p in reps[0].pullers if p.peer == "s1"]
        assert s1 and all(p.reachable and p.watermark > 0 for p in s1)
        bad = _cli("refresh", "-t", str(tmp_path / "peer.yaml"), "--site", "s1", check=False)
        assert bad.returncode != 0 and "reached through its agent" in bad.stdout + bad.stderr
    finally:
        agent.terminate()
        agent.wait(10)


def test_every_value_type_crosses_the_wire_exactly() -> None:
    """The codec alone (engine/wire.py): what drivers return, through JSON and back, same type and value."""
    import json
    import uuid

    from multimaster.engine import wire

    values = [
        None, True, False, 0, -(2**63), 2**64 + 1, 10**40, "", "é\u2603\x00", 0.1, -0.0, float("inf"), 1e308,
        Decimal("12.340"), Decimal("-1E+5"), Decimal("0.000000000000000000001"), b"", b"\x00\xff" * 3,
        bytearray(b"ab"), memoryview(b"cd"), dt.date(2024, 2, 29), dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
        dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))), dt.time(1, 2, 3, 4),
        dt.timedelta(days=-1, seconds=5, microseconds=7), uuid.uuid4(), {"a": [1, {"b": None}]}, [1, "x"],
    ]  # fmt: skip
    back = [wire.decode(json.loads(wire.dumps(wire.encode(v)))) for v in values]
    for v, b in zip(values, back):
        want = bytes(v) if isinstance(v, (bytearray, memoryview)) else v
        if isinstance(v, (dict, list)):  # a decoded JSON document (an older agent's) is read as its text
            want = json.dumps(v, separators=(",", ":"))
        assert type(b) is type(want) and b == want, (v, b)
        if isinstance(v, Decimal):
            assert str(b) == str(v)  # the exponent kept
        if isinstance(v, dt.datetime):
            assert b.utcoffset() == v.utcoffset()
    nan = wire.decode(json.loads(wire.dumps(wire.encode(float("nan")))))
    assert nan != nan


def test_the_daemon_pulls_and_purges_through_an_agent(sqlite_backend: Any, tmp_path: Path) -> None:
    """`multimaster run` on a host reaching s1 through its agent: its sites' links from s1 go
    through the agent, its purge reads s1's watermarks and observations there, its metrics read
    s1's status there; a daemon asked to run s1 from here is refused, naming the agent."""
    from multimaster.errors import AgentOnly
    from multimaster.ops.daemon import Daemon

    links = [{"from": a, "to": b, "interval": "100ms"} for a in ("s1", "s2") for b in ("s1", "s2") if a != b]
    cl = _cluster(sqlite_backend, tmp_path, ("s1", "s2"), links=links)
    _write(cl, "s1", 3)
    with running_agent(cl.topo) as url:
        peer = _peer_file(tmp_path, url)
        with pytest.raises(AgentOnly, match="site 's1' is reached through its agent"):
            Daemon(peer, ["s1"])
        d = Daemon(peer, metrics_port=0, purge_every=0.2)
        assert d.sites == ["s2"]
        d.start()
        try:
            deadline = time.time() + 20
            while len(cl.rows("s2", "items")) < 3 or not d.stats.purged:
                assert time.time() < deadline, (d.stats, cl.rows("s2", "items"))
                time.sleep(0.05)
            import urllib.request

            text = urllib.request.urlopen(f"http://127.0.0.1:{d._metrics.port}/metrics", timeout=30).read().decode()
            assert 'multimaster_link_waiting_changes{source="s1",target="s2"} 0' in text
        finally:
            d.stop()
        assert d.stats.purge_errors == 0
    assert cl.rows("s2", "items") == cl.rows("s1", "items")
