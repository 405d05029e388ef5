"""Two hosts for real: two network namespaces joined by a veth pair, a SQLite site in each behind
its agent (`multimaster serve` bound to the host's address), each host's refresher pulling the
other site through its agent across the link (`ip netns exec B multimaster refresh ...`). Skipped,
with the reason, where network namespaces cannot be created (not root, no `ip netns`)."""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from netns import Host, Lab, unavailable

ROOT = Path(__file__).resolve().parent.parent
TOKEN_A = "netns-token-a-0123456789abcdef"
TOKEN_B = "netns-token-b-0123456789abcdef"
PORT = 8470


@pytest.fixture
def lab() -> Iterator[Lab]:
    why = unavailable()
    if why:
        pytest.skip(why)
    lab = Lab("mmt")
    try:
        yield lab
    finally:
        lab.close()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MM_TOKEN_A": TOKEN_A, "MM_TOKEN_B": TOKEN_B}


def _cli(host: Host, *args: str) -> Any:
    p = host.run(sys.executable, "-m", "multimaster.cli", *args, env=_env(), timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def _wait_listening(host: Host, proc: Any, addr: str, port: int) -> None:
    """Until the agent answers on addr:port from inside `host` (a connect from the other host)."""
    deadline = time.time() + 20
    probe = f"import socket; socket.create_connection(('{addr}', {port}), 1).close()"
    while host.run(sys.executable, "-c", probe).returncode != 0:
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "the agent did not listen in time"
        time.sleep(0.2)


def _rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT id, name, qty FROM items ORDER BY id").fetchall()


def _write(db: Path, sql: str, *params: Any) -> None:
    with sqlite3.connect(db) as c:
        c.execute(sql, params)


def test_two_hosts_replicate_through_their_agents(lab: Lab, tmp_path: Path) -> None:
    a, b = lab.pair()
    dbs = {"sa": tmp_path / "sa.db", "sb": tmp_path / "sb.db"}
    for db in dbs.values():
        with sqlite3.connect(db) as c:
            c.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER)")
    common = {"tables": {"items": {"key": "id"}}, "links": "mesh"}
    sa_db = {"url": f"sqlite:///{dbs['sa']}", "token": "${MM_TOKEN_A}", "insecure_http": True}
    sb_db = {"url": f"sqlite:///{dbs['sb']}", "token": "${MM_TOKEN_B}", "insecure_http": True}
    sa_agent = {"url": f"http://{a.addr}:{PORT}", "token": "${MM_TOKEN_A}", "insecure_http": True}
    sb_agent = {"url": f"http://{b.addr}:{PORT}", "token": "${MM_TOKEN_B}", "insecure_http": True}
    files = {
        "setup": {"sites": {"sa": sa_db, "sb": sb_db}, **common},  # the installer's view: both databases
        "a": {"sites": {"sa": sa_db, "sb": sb_agent}, **common},  # host A: its database, B's agent
        "b": {"sites": {"sa": sa_agent, "sb": sb_db}, **common},  # host B: A's agent, its database
    }
    for name, doc in files.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    _cli(a, "init", "-t", str(tmp_path / "setup.yaml"))

    # each host's agent, bound to its own address on the link (not loopback: the peer is another host)
    agents = [
        (h, h.start(sys.executable, "-m", "multimaster.cli", "serve", "-t", str(tmp_path / f"{f}.yaml"),
                    "--site", s, "--listen", f"{h.addr}:{PORT}", env=_env()))
        for h, f, s in ((a, "a", "sa"), (b, "b", "sb"))
    ]  # fmt: skip
    _wait_listening(b, agents[0][1], a.addr, PORT)  # A's agent, seen from B
    _wait_listening(a, agents[1][1], b.addr, PORT)
    # the hosts are separate: A's agent is not on B's loopback
    nope = b.run(sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {PORT}), 1)")
    assert nope.returncode != 0

    for i in range(5):
        _write(dbs["sa"], "INSERT INTO items (name, qty) VALUES (?, ?)", f"a{i}", i)
    for i in range(3):
        _write(dbs["sb"], "INSERT INTO items (name, qty) VALUES (?, ?)", f"b{i}", 10 + i)

    _cli(b, "refresh", "-t", str(tmp_path / "b.yaml"), "--site", "sb", "--until-quiet")  # B pulls A across the link
    _cli(a, "refresh", "-t", str(tmp_path / "a.yaml"), "--site", "sa", "--until-quiet")  # A pulls B
    assert _rows(dbs["sa"]) == _rows(dbs["sb"])
    assert sorted(r[1] for r in _rows(dbs["sa"])) == ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2"]

    # both directions again, with an update and a delete crossing
    _write(dbs["sb"], "UPDATE items SET qty = 99 WHERE name = 'a2'")
    _write(dbs["sa"], "DELETE FROM items WHERE name = 'b1'")
    _cli(a, "refresh", "-t", str(tmp_path / "a.yaml"), "--site", "sa", "--until-quiet")
    _cli(b, "refresh", "-t", str(tmp_path / "b.yaml"), "--site", "sb", "--until-quiet")
    assert _rows(dbs["sa"]) == _rows(dbs["sb"])
    names = {r[1]: r[2] for r in _rows(dbs["sb"])}
    assert names["a2"] == 99 and "b1" not in names and len(names) == 7

    st = _cli(b, "status", "-t", str(tmp_path / "b.yaml"), "--json")  # A's side read through its agent
    assert '"reachable": false' not in st.stdout
    # the link carried the pulls: bytes crossed both ends of the veth pair
    assert lab.link_bytes(a)["tx"] > 0 and lab.link_bytes(b)["tx"] > 0
