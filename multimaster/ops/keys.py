"""The key history of renumbered tables (``_mm_keymoves``, docs/foreign-keys.md): every key a row
has had and why it moved, and the translation of a key an application stored before renumbering
to the row's key now."""

from __future__ import annotations

from typing import Any

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.engine.cluster import Cluster, as_cluster
from multimaster.engine.site import Site
from multimaster.errors import ConfigError

__all__ = ["key_history", "current_key"]


def _check(cl: Cluster, site: str, table: str) -> None:
    problems = []
    if site not in cl.topo.sites:
        problems.append(f"--site: site '{site}' is not defined under sites")
    if table not in cl.topo.tables:
        problems.append(f"--table: table '{table}' is not defined under tables")
    if problems:
        raise ConfigError(problems)


def _rid_of(conn: Any, s: Site, topo: Topology, table: str, key: int) -> str | None:
    """The identity a key names: the row that had it when the key was first given (the earliest
    move away from it), else the row that has it now (also a local insert the shadow has not
    caught up with yet)."""
    d = s.dialect
    moves = store.keymoves.moves_from(conn, d, table, key)
    if moves:
        return str(moves[0][0])
    v = conn.exec_driver_sql(
        f"SELECT rid FROM {d.obj(table).shadow} WHERE {d.key_col} = {d.caps.placeholder}", (int(key),)
    ).scalar()
    if v is None:
        v = {int(k): r for r, k in d.fresh_identities(conn, s.info(conn, table, topo))}.get(int(key))
    return None if v is None else str(v)


def key_history(topo: Topology | Cluster, site: str, table: str, key: int | None = None) -> list[dict[str, Any]]:
    """The key moves `site` recorded for `table`, oldest first: each a dict with table, rid,
    old_key, new_key, moved_at (UTC), reason (``rank``: a local insert's key became its rank;
    ``shift``: identities that sort before it arrived). With `key`: only the moves of the row that
    key named (see current_key). Raises ConfigError for an unknown site or table."""
    cl, own = as_cluster(topo)
    try:
        _check(cl, site, table)
        s = cl.site(site)
        with s.read() as conn:
            s.require_installed(conn, cl.topo)
            rows = store.keymoves.history(conn, s.dialect, table)
            if key is not None:
                rid = _rid_of(conn, s, cl.topo, table, key)
                rows = [r for r in rows if r[0] == rid]
        return [
            {"table": table, "rid": r[0], "old_key": int(r[1]), "new_key": int(r[2]), "moved_at": r[3], "reason": r[4]}
            for r in rows
        ]
    finally:
        if own:
            cl.close()


def current_key(topo: Topology | Cluster, site: str, table: str, key: int) -> int | None:
    """The key at `site` now of the row of `table` that `key` named when an application was given
    it (before any renumbering since); None when that row was deleted or the key never existed."""
    cl, own = as_cluster(topo)
    try:
        _check(cl, site, table)
        s = cl.site(site)
        d = s.dialect
        with s.read() as conn:
            s.require_installed(conn, cl.topo)
            rid = _rid_of(conn, s, cl.topo, table, key)
            if rid is None:
                return None
            row = conn.exec_driver_sql(
                f"SELECT {d.key_col}, deleted FROM {d.obj(table).shadow} WHERE rid = {d.caps.placeholder}", (rid,)
            ).first()
            if row is None:  # a local insert the shadow has not caught up with: its key never moved
                now = int(key)
            elif row[1] is not None:
                return None
            else:
                now = int(row[0])
            # the row itself: a delete no trigger saw (MariaDB runs none for ON DELETE CASCADE,
            # docs/foreign-keys.md "Limits") leaves its identity live in the shadow
            q = d.quote
            info = s.info(conn, table, cl.topo)
            there = conn.exec_driver_sql(
                f"SELECT 1 FROM {q(table)} WHERE {q(info.key.name)} = {d.caps.placeholder}", (now,)
            ).first()
            return now if there else None
    finally:
        if own:
            cl.close()
