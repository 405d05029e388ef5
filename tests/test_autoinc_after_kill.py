"""The key counter of a renumbered table stays past every key when the refresher dies at any point
(docs/concepts.md "Many writers").

Local inserts take their keys from the table's key counter (PostgreSQL and MariaDB: a sequence,
which a rollback does not move back); the reconciler turns those keys into ranks and may move the
counter back to the highest rank. The fault suite once saw, on MariaDB, an application's plain
INSERT refused with a duplicate PRIMARY key after refreshers were SIGKILLed at random: the
transaction that ranked the keys had moved the counter back to the highest rank and then did not
commit, so the rows came back with their old, higher keys while the counter stayed low.

Each test makes gaps among s1's own keys (inserts rolled back), lets a refresh at s1 rank them
and die at a chosen point, then has an application insert rows at s1 with plain INSERTs: none may
collide, and afterwards the sites converge with keys 1..N and the next insert takes N + 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clusters import TestCluster, make_cluster
from sqlalchemy.exc import OperationalError

from multimaster import api
from multimaster.dialects import get_dialect
from multimaster.engine import apply
from multimaster.engine import refresh as refresh_mod

ROOT = Path(__file__).resolve().parent.parent
ITEMS = {"items": {"key": "id", "columns": {"name": "text"}}}


def _concurrent_only(backend: Any) -> None:
    if not get_dialect(backend.name).caps.concurrent_capture:
        pytest.skip(f"{backend.name}: local inserts take ranks under the write lock, no counter to move back")


def _gapped(backend: Any, tmp_path: Path, path: str) -> TestCluster:
    """s1 holds 'a' and 'b' with keys drawn around two rolled-back inserts (1 and 4 where the key
    counter is a sequence); for the path 'apply', s2 then inserts 'r', which s1 has to rank last."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], ITEMS)
    c = cl.db("s1")
    p = backend.param()
    try:
        cur = c.cursor()
        for name, keep in (("a", True), ("gone-1", False), ("gone-2", False), ("b", True)):
            cur.execute(f"INSERT INTO items (name) VALUES ({p})", (name,))
            c.commit() if keep else c.rollback()
    finally:
        c.close()
    if path == "apply":
        cl.execute("s2", "INSERT INTO items (name) VALUES ('r')")
    return cl


def _insert_and_converge(cl: TestCluster, names: list[str]) -> None:
    """Plain application INSERTs at s1 (a duplicate key fails here), then the sites converge with
    keys 1..N, and the next insert at s1 takes N + 1 (the counter is back at the highest rank)."""
    for n in names:
        cl.execute("s1", "INSERT INTO items (name) VALUES (?)", (n,))
    cl.refresh_until_quiet()
    cl.assert_converged()
    rows = cl.rows("s1", "items")
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), rows
    cl.execute("s1", "INSERT INTO items (name) VALUES ('next')")
    assert cl.rows("s1", "items")[-1] == (len(rows) + 1, "next")


class _Died(Exception):
    """The refresher, gone at the injected point."""


@pytest.mark.parametrize("path", ["rank", "apply"])
def test_the_ranking_transaction_rolled_back_at_its_end(backend, tmp_path, monkeypatch, path):  # type: ignore[no-untyped-def]
    """The transaction that ranked s1's keys (with nothing to apply: 'rank'; applying s2's insert:
    'apply') fails after its last statement, before COMMIT, and rolls back: s1's rows keep the keys
    they had. Then an application inserts three rows at s1."""
    if path == "rank":
        _concurrent_only(backend)
    cl = _gapped(backend, tmp_path, path)

    def dying(real: Any) -> Any:
        def f(*a: Any, **kw: Any) -> Any:
            real(*a, **kw)
            raise _Died("the refresher died before COMMIT")

        return f

    with monkeypatch.context() as m:
        m.setattr(refresh_mod, "reconcile_table", dying(refresh_mod.reconcile_table))
        m.setattr(refresh_mod, "rank_local_keys", dying(refresh_mod.rank_local_keys))
        res = api.refresh(cl.topo, "s1", "s2")
    assert res[0].error and "_Died" in res[0].error, res[0].error
    assert sorted(r[1] for r in cl.rows("s1", "items")) == ["a", "b"]
    _insert_and_converge(cl, ["x", "y", "z"])


def test_a_failed_rewind_of_the_counter_fails_nothing(backend, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The transaction moving the counter back after the ranking one committed fails (a lock
    wait timeout, say): the refresh still succeeds, its work committed, and the counter stays past
    every key; the next ranking moves it back."""
    _concurrent_only(backend)
    cl = _gapped(backend, tmp_path, "rank")
    tried: list[str] = []

    def failing(conn: Any, d: Any, info: Any) -> None:
        tried.append(info.name)
        raise OperationalError("SELECT ...", {}, Exception("lock wait timeout"))

    with monkeypatch.context() as m:
        m.setattr(apply, "rewind_key_counter", failing)
        assert cl.refresh("s1", "s2")[0].error is None
    assert tried == ["items"]
    assert [r[:2] for r in cl.rows("s1", "items")] == [(1, "a"), (2, "b")]  # ranked, committed
    _insert_and_converge(cl, ["x", "y", "z"])


#: run in a subprocess: `multimaster refresh --site s1 --peer s2`, SIGKILLed at the `nth` call of a
#: dialect method, before or after the call
_HOOKED_REFRESH = """
import os, signal, sys
from multimaster import api
from multimaster.config.topology import load_topology
from multimaster.dialects import get_dialect

topo, backend, method, nth, when = sys.argv[1:]
cls = type(get_dialect(backend))
real = getattr(cls, method)
calls = [0]

def hooked(self, *a, **kw):
    calls[0] += 1
    die = calls[0] == int(nth)
    if die and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    out = real(self, *a, **kw)
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    return out

setattr(cls, method, hooked)
print([r.error for r in api.refresh(load_topology(topo), "s1", "s2")], flush=True)
"""


@pytest.mark.parametrize(
    "path, method, nth, when",
    [
        # in the transaction that ranks the keys, right after it moved the key counter
        ("rank", "reset_key_counter", 1, "after"),
        ("apply", "reset_key_counter", 1, "after"),
        # between that transaction's COMMIT and the one moving the counter back to the highest rank
        ("rank", "lock_writers", 2, "before"),
        # in the transaction moving the counter back, right after it moved it
        ("rank", "reset_key_counter", 2, "after"),
    ],
)
def test_the_refresher_sigkilled_around_the_key_counter(backend, tmp_path, path, method, nth, when):  # type: ignore[no-untyped-def]
    """A `refresh` process SIGKILLed at the given point (the server rolls its open transaction
    back when the connection drops); then an application inserts three rows at s1."""
    _concurrent_only(backend)
    cl = _gapped(backend, tmp_path, path)
    script = tmp_path / "hooked_refresh.py"
    script.write_text(_HOOKED_REFRESH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    p = subprocess.run(
        [sys.executable, str(script), str(cl.topo.path), backend.name, method, str(nth), when],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == -signal.SIGKILL, f"the refresh was not killed at {method} #{nth}: {p.stdout}{p.stderr}"
    _insert_and_converge(cl, ["x", "y", "z"])
