"""Network namespaces as separate hosts, for tests and benchmarks (tests/test_netns.py,
benchmarks/paper_section6.py, benchmarks/bench_network.py).

A :class:`Lab` creates namespaces with unique names, links them (a veth pair between two, or a
bridge in a hub namespace for more), runs commands inside them and removes everything it created
in :meth:`Lab.close`, processes first. Needs root and `ip netns`; :func:`unavailable` says why
not when they are missing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Lab", "Host", "unavailable"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {(p.stderr or p.stdout).strip()}")
    return p


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (None: they can)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    name = "mmprobe" + secrets.token_hex(3)
    p = _ip("netns", "add", name, check=False)
    if p.returncode != 0:
        return f"'ip netns add' is not permitted here: {(p.stderr or p.stdout).strip()}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class Host:
    """A namespace standing for one host: its name and its address on the lab's network."""

    ns: str
    addr: str
    dev: str  # the host's end of its link
    peer_dev: str  # the other end (in the hub namespace, or in the other host)
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    def argv(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *cmd]

    def run(self, *cmd: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*cmd), capture_output=True, text=True, env=env, timeout=timeout)

    def start(self, *cmd: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[Any]:
        """A process in this host, stopped by Lab.close() (SIGTERM, then SIGKILL)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        p: subprocess.Popen[Any] = subprocess.Popen(self.argv(*cmd), env=env, text=True, start_new_session=True, **kw)
        self.procs.append(p)
        return p


class Lab:
    """Namespaces named `<prefix><run id><n>`, unique per run; close() removes them all."""

    def __init__(self, prefix: str = "mm") -> None:
        self.run_id = secrets.token_hex(3)
        self.prefix = prefix
        self.hosts: list[Host] = []
        self.namespaces: list[str] = []
        self.hub: str | None = None
        # 10.<a>.<b>.0/24, drawn per run: two labs running at once do not share a subnet (each is in
        # its own namespaces anyway; the draw keeps logs unambiguous)
        r = secrets.randbelow(200 * 250)
        self.subnet = f"10.{20 + r // 250}.{r % 250}"

    def _ns(self, tag: str) -> str:
        name = f"{self.prefix}{self.run_id}{tag}"
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def pair(self) -> tuple[Host, Host]:
        """Two hosts joined by one veth pair: <subnet>.1 and <subnet>.2."""
        a, b = self._ns("a"), self._ns("b")
        da, db = f"v{self.run_id}a", f"v{self.run_id}b"
        _ip("link", "add", da, "netns", a, "type", "veth", "peer", "name", db, "netns", b)
        for ns, dev, n in ((a, da, 1), (b, db, 2)):
            _ip("-n", ns, "addr", "add", f"{self.subnet}.{n}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        ha, hb = Host(a, f"{self.subnet}.1", da, db), Host(b, f"{self.subnet}.2", db, da)
        self.hosts += [ha, hb]
        return ha, hb

    def star(self, n: int) -> list[Host]:
        """n hosts, each with a veth pair to a bridge in a hub namespace: <subnet>.1 .. .n."""
        self.hub = self._ns("h")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        out = []
        for i in range(1, n + 1):
            ns = self._ns(str(i))
            dev, peer = f"v{self.run_id}{i}", f"b{self.run_id}{i}"
            _ip("link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", self.hub)
            _ip("-n", self.hub, "link", "set", peer, "master", "br0")
            _ip("-n", self.hub, "link", "set", peer, "up")
            _ip("-n", ns, "addr", "add", f"{self.subnet}.{i}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            out.append(Host(ns, f"{self.subnet}.{i}", dev, peer))
        self.hosts += out
        return out

    def link_bytes(self, host: Host) -> dict[str, int]:
        """Bytes the host sent and received on its link (its end's counters, TCP/IP headers included)."""
        p = _ip("-n", host.ns, "-j", "-s", "link", "show", host.dev)
        st = json.loads(p.stdout)[0]["stats64"]
        return {"tx": int(st["tx"]["bytes"]), "rx": int(st["rx"]["bytes"])}

    def close(self) -> None:
        """Stop every process started in a host (SIGTERM, 10 s, SIGKILL), then delete the namespaces
        (their veth ends go with them)."""
        procs = [p for h in self.hosts for p in h.procs if p.poll() is None]
        for p in procs:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait(5)
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        self.namespaces = []

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
