"""init copying one site's base rows into an empty site while applications write at the full one:
every transaction committed meanwhile arrives once (no row twice, no increment added twice), and
an init stopped during the copy finishes when it is run again."""

from __future__ import annotations

import time
from typing import Any

import pytest
from clusters import TestCluster, make_cluster, mm
from test_add_site import STOCK, Writers

from multimaster import api
from multimaster.core.progress import ProgressEvent

ROWS = 2000


def _full_and_empty(backend: Any, tmp_path: Any) -> TestCluster:
    """s1 holds a counter row and ROWS more, s2 the same table empty; nothing installed."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, init=False)
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES ('counter', 0)")  # key 1
    cl.execute("s1", "INSERT INTO stock (name, qty) VALUES " + ", ".join(f"('base-{i}', {i})" for i in range(ROWS)))
    return cl


def _assert_each_write_once(cl: TestCluster, w: Writers, extra: int = 0) -> None:
    cl.refresh_until_quiet()
    cl.assert_converged()
    rows = cl.rows("s2", "stock")
    names = [r[1] for r in rows]
    assert len(names) == len(set(names)), "a row was copied and replayed"
    assert len(rows) == ROWS + 1 + w.inserts["s1"] + extra, "a row was lost or copied twice"
    assert rows[0] == (1, "counter", w.increments["s1"]), "an increment was lost or applied twice"


def test_init_copies_an_empty_site_exactly_while_the_full_one_writes(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = _full_and_empty(backend, tmp_path)
    w = Writers(cl, ["s1"])

    def progress(m: Any) -> None:
        # s1 is installed (capturing): the application writes there before and while s2 is copied
        if not w.threads[0].is_alive() and not isinstance(m, ProgressEvent) and "installing at s2" in str(m):
            w.__enter__()
            time.sleep(0.3)

    try:
        rep = api.init(cl.topo, progress=progress)
        time.sleep(0.05)
    finally:
        w.__exit__(None, None, None)
    assert w.inserts["s1"] and rep.copied["stock"]["s2"] >= ROWS + 1
    _assert_each_write_once(cl, w)


@pytest.mark.parametrize("where", ["copy"])
def test_init_stopped_during_the_copy_finishes_when_run_again(backend, tmp_path, where):  # type: ignore[no-untyped-def]
    cl = _full_and_empty(backend, tmp_path)

    class Stopped(Exception):
        pass

    def progress(m: Any) -> None:
        if isinstance(m, ProgressEvent) and m.kind == where and "s2" in m.subject:
            raise Stopped  # as a kill in the middle of the copy: s2's transaction does not commit

    with pytest.raises(Stopped):
        api.init(cl.topo, progress=progress)
    with Writers(cl, ["s1"]) as w:  # s1 is installed: its writes are captured while init runs again
        r = mm("init", "-t", str(cl.topo.path))
        assert r.returncode == 0, r.stdout + r.stderr
        cl.execute("s2", "INSERT INTO stock (name, qty) VALUES ('from-s2', 1)")
    _assert_each_write_once(cl, w, extra=1)
    r = mm("status", "-t", str(cl.topo.path))
    assert r.returncode == 0, r.stdout + r.stderr
