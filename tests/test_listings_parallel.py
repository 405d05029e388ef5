"""`errors` and `conflicts` read the sites at once (engine/cluster.py read_each): a page
(`--limit`, `--offset`) and its counts are exactly what the sites read one after another give —
the window at each site comes from the counts of the sites before it, read first — with changes
held and conflicts logged at several sites, on every database."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from clusters import Backend, make_cluster
from test_error_queue import reject_negative_qty

from multimaster import store
from multimaster.engine.cluster import Cluster
from multimaster.ops.errors import errors_at, errors_page
from multimaster.ops.status import conflicts_at, conflicts_page

TABLES = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
SITES = ["s1", "s2", "s3"]


def _met_by_every_site(monkeypatch: Any, module: Any, name: str) -> None:
    """`module.name` waits until every site's read reached it: the sites are read at once (one
    after another, the barrier breaks: a failure), and a read that took its window from a total
    other sites were still adding to would see it before any of them added."""
    barrier = threading.Barrier(len(SITES), timeout=60)
    real = getattr(module, name)

    def met(*a: Any, **kw: Any) -> Any:
        barrier.wait()
        return real(*a, **kw)

    monkeypatch.setattr(module, name, met)


def test_pages_of_several_sites_are_those_read_one_after_another(backend: Backend, tmp_path: Path, monkeypatch: Any) -> None:
    cl = make_cluster(backend, tmp_path, SITES, TABLES)
    for i in range(3):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, 0)", (f"r{i}",))
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET qty = 1")  # each row updated at two sites at once: conflicts
    cl.execute("s2", "UPDATE items SET qty = 2")
    cl.refresh_until_quiet()
    for n in ("s2", "s3"):
        reject_negative_qty(cl, n)
    for i in range(4):
        cl.execute("s1", "INSERT INTO items (name, qty) VALUES (?, -1)", (f"n{i}",))
    cl.refresh_until_quiet()
    topo = cl.topo
    with Cluster(topo) as c:  # what each site holds, read one after another in the topology's order
        held = [(r["site"], r["id"]) for n in SITES for r in errors_at(c.site(n), topo)]
        held_n = sum(1 for n in SITES for r in errors_at(c.site(n), topo) if r["state"] in store.errorqueue.HELD)
        logged = sorted(
            ((r["detected_at"], r["site"], r["id"]) for n in SITES for r in conflicts_at(c.site(n), limit=0)),
        )
    assert len({s for s, _ in held}) == 2 and len(held) >= 8, held  # held at s2 and s3
    assert len({s for _, s, _ in logged}) >= 2, logged  # logged at several sites
    _met_by_every_site(monkeypatch, store.errorqueue, "counts_of")
    _met_by_every_site(monkeypatch, store.conflicts, "count_matching")
    for limit in (0, 1, 2, 3, 5):
        for offset in range(len(held) + 2):
            page = errors_page(topo, limit=limit, offset=offset)
            assert [(r["site"], r["id"]) for r in page.rows] == held[offset : offset + limit if limit else None], (limit, offset)
            assert (page.total, page.held) == (len(held), held_n), (limit, offset)
        for offset in range(len(logged) + 2):
            cp = conflicts_page(topo, limit=limit, offset=offset)
            want = logged[::-1][offset : offset + limit if limit else None][::-1]
            assert [(r["detected_at"], r["site"], r["id"]) for r in cp.rows] == want, (limit, offset)
            assert (cp.total, cp.exact) == (len(logged), True), (limit, offset)
