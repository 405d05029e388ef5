"""A change from a site that records no source transaction (SQLite) is a unit of its own
(docs/errors.md "Limit: a SQLite source records no transaction"): held alone, with the later
changes of its row. Until session 36 the receiving site named every such change of a batch after
the batch (engine/refresh.py's token, kept so what a hub relays stays together downstream), and
while anything was held the error queue took that name for a source transaction: one rejected row
from a SQLite peer, then an update of it and 100 unrelated inserts, and the next refresh held all
101 (the 100 ``txn``, held with the update), at PostgreSQL and MariaDB sites alike; the same for
the changes of other origins a SQLite site relays, and downstream of a hub that relays a SQLite
site's changes. Now only the row's changes are held and the rest is applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, made
from test_error_queue import MixedCluster, reject_negative_qty

from multimaster import api

TABLES = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def _cluster(tmp: Path, kinds: dict[str, str], links: Any = "mesh") -> tuple[MixedCluster, list[Backend]]:
    backends: dict[str, Backend] = {}
    got: list[Backend] = []
    for site, kind in kinds.items():
        b = made(kind)
        got.append(b)
        backends[site] = b
    return MixedCluster(backends, tmp, TABLES, links), got


def _write(cl: MixedCluster, site: str, sqls: list[tuple[str, tuple[Any, ...]]]) -> None:
    """One application transaction at `site` (a SQLite site: one transaction per statement would
    do as well; nothing records either)."""
    p = cl.backend_of(site).param()
    c = cl.db(site)
    try:
        cur = c.cursor()
        for sql, params in sqls:
            cur.execute(sql.replace("?", p), params)
        c.commit()
    finally:
        c.close()


def _hundred(origin: str, n: int = 100) -> list[tuple[str, tuple[Any, ...]]]:
    return [("INSERT INTO items (name, qty) VALUES (?, ?)", (f"{origin}-{i}", i)) for i in range(n)]


def _held(cl: MixedCluster, site: str) -> list[tuple[str, str, str, Any]]:
    """The open queue of `site`: (state, op, origin, txn) in version order."""
    return [(h["state"], h["op"], h["origin"], h.get("txn")) for h in api.list_errors(cl.topo, site)]


def _names(cl: MixedCluster, site: str) -> set[str]:
    return {str(r[1]) for r in cl.rows(site, "items")}


@pytest.fixture(params=["postgresql", "mysql", "sqlite"])
def target(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_held_change_from_a_sqlite_peer_holds_only_its_row(tmp_path: Path, target: str) -> None:
    cl, backends = _cluster(tmp_path, {"s1": "sqlite", "s2": target})
    try:
        reject_negative_qty(cl, "s2")
        _write(cl, "s1", [("INSERT INTO items (name, qty) VALUES ('bad', -1)", ())])
        cl.refresh("s2")
        assert _held(cl, "s2") == [("failed", "I", "s1", None)]
        _write(cl, "s1", [("UPDATE items SET qty = -2 WHERE name = 'bad'", ())])  # a later change of the held row
        _write(cl, "s1", _hundred("s1"))  # 100 rows that have nothing to do with it
        cl.refresh("s2")
        assert _names(cl, "s2") == {f"s1-{i}" for i in range(100)}
        assert _held(cl, "s2") == [("failed", "I", "s1", None), ("waiting", "U", "s1", None)]
        cl.refresh_until_quiet()  # s1 pulls back from s2 too: nothing else is held, nothing lost
        assert len(_held(cl, "s2")) == 2 and len(cl.rows("s1", "items")) == 101
    finally:
        for b in backends:
            b.cleanup()


@pytest.fixture(params=["postgresql", "mysql"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_changes_a_sqlite_site_relays_are_held_by_row_not_by_batch(tmp_path: Path, server: str) -> None:
    """s3 -> s1 (SQLite, relaying s3's changes) -> s2: a change of origin s3 held at s2 holds
    neither the other changes of s3 nor those of s1 that s1's batch carries with it."""
    cl, backends = _cluster(tmp_path, {"s3": "sqlite", "s1": "sqlite", "s2": server}, {"chain": ["s3", "s1", "s2"]})
    try:
        reject_negative_qty(cl, "s2")
        _write(cl, "s3", [("INSERT INTO items (name, qty) VALUES ('bad', -1)", ())])
        cl.refresh("s1")
        cl.refresh("s2")
        assert _held(cl, "s2") == [("failed", "I", "s3", None)]
        _write(cl, "s3", [("UPDATE items SET qty = -2 WHERE name = 'bad'", ())])
        _write(cl, "s3", _hundred("s3", 50))
        cl.refresh("s1")  # s1 now relays s3's update and 50 inserts ...
        _write(cl, "s1", _hundred("s1", 50))  # ... and carries 50 of its own
        cl.refresh("s2")
        assert _names(cl, "s2") == {f"s3-{i}" for i in range(50)} | {f"s1-{i}" for i in range(50)}
        assert _held(cl, "s2") == [("failed", "I", "s3", None), ("waiting", "U", "s3", None)]
    finally:
        for b in backends:
            b.cleanup()


def test_downstream_of_a_hub_a_sqlite_site_s_changes_are_held_by_row(tmp_path: Path) -> None:
    """s1 (SQLite) -> s2 (PostgreSQL hub) -> s3 (MariaDB): the hub relays s1's changes under the
    name of the batch that stored them, which keeps them together for the cuts downstream (a
    batch never holds part of one), never for holding: s3 holds only the row's changes."""
    cl, backends = _cluster(tmp_path, {"s1": "sqlite", "s2": "postgresql", "s3": "mysql"}, {"chain": ["s1", "s2", "s3"]})
    try:
        reject_negative_qty(cl, "s3")
        _write(cl, "s1", [("INSERT INTO items (name, qty) VALUES ('bad', -1)", ())])
        cl.refresh("s2")
        cl.refresh("s3")
        assert _held(cl, "s3") == [("failed", "I", "s1", None)]
        _write(cl, "s1", [("UPDATE items SET qty = -2 WHERE name = 'bad'", ())])
        _write(cl, "s1", _hundred("s1"))
        cl.refresh("s2")  # one hub batch: the update and the 100 inserts, under one name at s2
        cl.refresh("s3")
        assert _names(cl, "s3") == {f"s1-{i}" for i in range(100)}
        assert _held(cl, "s3") == [("failed", "I", "s1", None), ("waiting", "U", "s1", None)]
    finally:
        for b in backends:
            b.cleanup()
