"""`multimaster refresh` (one round of every link) refreshes the links into different sites at once
(over a WAN each link waits on its round trips), those into one site one after another; its output
lists the links in the topology's order and its exit code is what it was, a failing link reported
while the others still refresh."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from clusters import Backend, make_cluster, mm, unreachable_topology

from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.engine import refresh as refresh_mod

TABLES = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def _links(out: str) -> list[tuple[str, str, int, str | None]]:
    return [(ln["from"], ln["to"], ln["pulled"], ln["error"]) for ln in json.loads(out)[0]["links"]]


def test_links_into_different_sites_run_at_once(backend: Backend, tmp_path: Path, monkeypatch: Any) -> None:
    cl = make_cluster(backend, tmp_path, ["a", "b", "c"], TABLES)
    for n in ("a", "b", "c"):
        cl.execute(n, "INSERT INTO items (name, qty) VALUES (?, ?)", (n, 1))
    targets = [ln.target for ln in cl.topo.links]
    # the first link into each site waits until the first links into every other site started: a
    # refresh running them one after another breaks the barrier (BrokenBarrierError, a failure)
    barrier = threading.Barrier(len(set(targets)), timeout=60)
    running: dict[str, int] = {}
    overlapped: list[str] = []
    lock = threading.Lock()
    real = refresh_mod.refresh_link

    def watched(c: Any, target: str, source: str, **kw: Any) -> Any:
        with lock:
            running[target] = running.get(target, 0) + 1
            if running[target] > 1:
                overlapped.append(target)
            first = source == next(ln.source for ln in c.topo.links if ln.target == target)
        try:
            if first:
                barrier.wait()
            return real(c, target, source, **kw)
        finally:
            with lock:
                running[target] -= 1

    monkeypatch.setattr(refresh_mod, "refresh_link", watched)
    r = mm("refresh", "-t", str(cl.topo.path), "--json")
    assert r.returncode == 0, r.stderr
    links = _links(r.stdout)
    assert [(f, t) for f, t, _, _ in links] == [(ln.source, ln.target) for ln in cl.topo.links]  # the file's order
    assert all(pulled == 1 and error is None for _, _, pulled, error in links), links
    assert not overlapped, f"links into {overlapped} ran at the same time"
    cl.assert_converged()


def test_a_failing_link_is_reported_and_the_others_refresh(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["a", "b", "c"], TABLES)
    for n in ("a", "b"):
        cl.execute(n, "INSERT INTO items (name, qty) VALUES (?, ?)", (n, 1))
    down = unreachable_topology(cl, tmp_path, "c")
    r = mm("refresh", "-t", str(down), "--json")
    assert r.returncode == 1, r.stderr
    links = _links(r.stdout)
    topo = load_topology(down)
    assert [(f, t) for f, t, _, _ in links] == [(ln.source, ln.target) for ln in topo.links]
    for f, t, pulled, error in links:
        if "c" in (f, t):
            assert error and "'c'" in error, (f, t, error)
        else:
            assert error is None and pulled == 1, (f, t, pulled, error)
    # the same results, in the same order, as the links refreshed one after another
    again = [(x.peer, x.site, x.error is None) for x in api.refresh(topo)]
    assert again == [(f, t, error is None) for f, t, _, error in links]
