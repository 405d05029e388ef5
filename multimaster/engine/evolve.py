"""A site's capture follows its own schema (docs/schema-changes.md, docs/design/schema-changes.md).

When a replicated table's columns changed at a site (its catalog signature differs from the one
recorded with its current schema version, store/schemas.py), :func:`evolve_table` makes the site's
replication objects match, where the database allows in one transaction (SQLite, PostgreSQL; on
MariaDB every DDL statement commits, and the steps are ordered so that an interruption is finished
by the next run):

1. the change log, the snapshots (and the shadow's slot versions, a park table's kept values) get
   the columns of added columns; a widened column's are widened; dropped columns' stay (entries
   written before keep their values);
2. a new schema version is recorded: its column list is the layout of every entry written from now
   on; the snapshot rows not applied yet are carried to it by name, and the changes that waited for
   an added column get its values (they are then applied, :func:`release`);
3. the capture triggers are made again for the new version (they write it as the constant ``sv``);
4. the table's signature is recorded: the site has followed its schema.

:func:`follow` runs it for every table of a site that changed; refresh runs it at both ends of a
link before pulling, init at every site, and ``multimaster ddl`` in the transaction of the ALTER.
A change that cannot be made online (type narrowing, a new NOT NULL column without a default
while other sites lack it) is refused: the site keeps capturing its previous version (which names
only columns the table still has), and the problem is reported.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.config.topology import Topology
from multimaster.core.errorqueue import closure
from multimaster.core.schemas import Col, Evolution, decode_pending, encode_pending, evolution, remap_mask
from multimaster.core.versions import now_iso
from multimaster.dialects.schema import TableInfo, names
from multimaster.engine import apply, isolate, references, uniques
from multimaster.engine.schema import introspect
from multimaster.engine.site import Site
from multimaster.errors import SchemaError

__all__ = [
    "Evolved",
    "changed_tables",
    "ensure_registered",
    "evolve_table",
    "follow",
    "gap_message",
    "gap_messages",
    "capture_unseen_rows",
    "unseen_rows",
    "release",
    "waited_columns",
    "registered_columns",
]

#: the relay of a table at a site (engine/refresh.py relay_origins)
RelayOf = Callable[[TableInfo], Sequence[str] | None]
#: per table, (number, recorded signature) of its current schema version (_heads)
Heads = dict[str, tuple[int, str]]


@dataclass
class Evolved:
    """What following its schema did for one table at one site."""

    site: str
    table: str
    version: int
    change: Evolution | None = None
    released: int = 0  #: changes that waited for a column and were applied
    problems: list[str] = field(default_factory=list)
    gap: list[str] = field(default_factory=list)  #: capture triggers found missing and made again
    #: then, the keys of the rows of a renumbered table inserted while it was missing, captured
    unseen: list[Any] = field(default_factory=list)


def _cols(info: TableInfo) -> list[Col]:
    return [Col(c.name, c.type_sql, c.nullable, c.has_default) for c in info.columns]


def ensure_registered(conn: Connection, site: Site, info: TableInfo) -> None:
    """Record schema version 1 of `info` at `site` when it has none (a table installed now, or by
    an earlier multimaster): the columns its capture writes now."""
    d = site.dialect
    if store.schemas.current(conn, d, info.name) is None:
        store.schemas.record(conn, d, info.name, 1, _cols(info), d.table_signature(conn, info.name))


def gap_message(site: str, gap: Mapping[str, Any]) -> str:
    """What an open capture gap (store/gaps.py read_open) means, and the command that closes it."""
    table = gap["tbl"]
    unseen = int(gap.get("unseen") or 0)
    sent = (
        f" The {unseen} row(s) inserted meanwhile were captured then (in a renumbered table, with the next keys)."
        if unseen and not gap.get("refused")
        else ""
    )
    refused = f" Its rows inserted meanwhile are not captured: {gap['refused']}." if gap.get("refused") else ""
    return (
        f"site '{site}': the capture of table '{table}' was found missing at {gap['found']} ({', '.join(gap['missing'])}): "
        "the table was made again (a migration tool's copy, DROP and CREATE) or its triggers were dropped. Capture is "
        f"back.{sent}{refused} The updates and deletes made there before were not captured, and no other site has "
        f"them. Run 'multimaster recapture -t FILE --site {site} --table {table}' to send them (docs/schema-changes.md "
        '"A table made again")'
    )


def gap_messages(conn: Connection, site: Site) -> list[str]:
    """The open capture gaps of `site`, each named with its fix."""
    return [m for _tb, m in open_gaps(conn, site)]


def open_gaps(conn: Connection, site: Site) -> list[tuple[str, str]]:
    """The open capture gaps of `site`: (table, message naming the fix), oldest first."""
    return [(g["tbl"], gap_message(site.name, g)) for g in store.gaps.read_open(conn, site.dialect)]


def registered_columns(conn: Connection, site: Site, table: str) -> list[str] | None:
    """The columns of `table`'s current schema version at `site` (None: none recorded)."""
    d = site.dialect
    if not store.schemas.exists(conn, d):
        return None
    cur = store.schemas.current(conn, d, table)
    return None if cur is None else [c.name for c in cur[1]]


def changed_tables(conn: Connection, site: Site, tables: Sequence[str], heads: Heads | None = None) -> list[str]:
    """The tables of `tables` whose columns changed at `site` since its capture last followed them
    (the recorded signatures in one statement, the catalog's in one per kind where the dialect can);
    `heads`: the recorded ones, read already (_heads)."""
    d = site.dialect
    if heads is None:
        heads = _heads(conn, site)
    if heads is None:
        return []
    sigs = {tb: sig for tb, (_v, sig) in heads.items()}
    now = d.table_signatures(conn, [tb for tb in tables if tb in sigs])
    return [tb for tb in now if now[tb] != sigs[tb]]


def evolve_table(
    conn: Connection,
    site: Site,
    topo: Topology,
    table: str,
    peers: Sequence[str],
    others: Mapping[str, set[str]] | None = None,
    capture_dropped: bool = False,
    locks: Callable[[Connection], None] | None = None,
) -> Evolved:
    """In a write transaction at `site`: make its replication objects of `table` follow the
    table's columns now (the steps in the module's description). Raises SchemaError, changing
    nothing, for a change that cannot be made online. Capture triggers found missing (the table
    was made again, or they were dropped) are made again and a gap is recorded (store/gaps.py),
    unless `capture_dropped`: the caller dropped them (multimaster ddl). `locks`: where each DDL
    statement commits at once (MariaDB), the caller's locks, taken after the columns are added
    (that DDL committed whatever the transaction held before): the records of the new version are
    then one transaction under them, which the capture's DDL ends."""
    d = site.dialect
    cur = store.schemas.current(conn, d, table)
    if cur is None:
        raise SchemaError([f"site '{site.name}': table '{table}' is not installed; run 'multimaster init'"])
    version, old_cols, recorded = cur
    # a follow that made the capture again and stopped before the rest (store/schemas.py
    # mark_capturing): the triggers it found missing, and the signature recorded before it
    pending, _sig = store.schemas.capturing(recorded)
    o = d.obj(table)
    wanted = names(table)
    found = [] if capture_dropped else sorted({wanted.cap_i, wanted.cap_u, wanted.cap_d} - set(d.capture_present(conn, table)))
    missing = sorted(set(found) | set(pending))
    site.forget(table)
    live = introspect(conn, site.name, table, topo.tables[table])
    new_cols = _cols(live)
    lacking = {c.name: [n for n, cols in (others or {}).items() if c.name not in cols] for c in new_cols}
    ev = evolution(site.name, table, old_cols, new_cols, lacking)
    if ev.problems:
        raise SchemaError(list(ev.problems))
    changed = (
        ev.added
        or ev.dropped
        or ev.retyped
        or [(c.nullable, c.has_default) for c in old_cols]
        != [(c.nullable, c.has_default) for c in new_cols if c.name in {o.name for o in old_cols}]
    )
    snaps = [d.obj(table, p).snapshot() for p in peers]
    # 1. the columns of the added columns; widened ones widened (idempotent)
    _add_columns(conn, site, live, ev, old_cols, [o.log, *snaps])
    if locks is not None:
        locks(conn)
    # 2. the new version; snapshot rows carried to it; waiting changes get their columns (no DDL
    #    from here to step 3: where DDL commits at once, this is one transaction under `locks`)
    if changed:
        version += 1
        store.schemas.record(conn, d, table, version, new_cols, "")
        store.tables.set_columns(conn, d, table, [c.name for c in new_cols])
    # the columns of the version just recorded, described on this transaction: not one kept by
    # another thread sharing the site (the daemon's refreshers) that described the table after
    # the forget above and before this version was recorded (it read the version before: the
    # capture was made for that one, its triggers left as they were, and the signature recorded
    # as followed; soak 2026-11-30 D1)
    info = site.info(conn, table, topo, anew=True)
    old_names, new_names = [c.name for c in old_cols], [c.name for c in new_cols]
    ready = 0
    if changed:
        for peer, snap in zip(peers, snaps):
            _remap(conn, site, table, snap, old_names, new_names)
            ready += _fill_pending(conn, site, info, snap)
            # its applied rows keep the old layout's masks: none of them is given on (core/salvage.py)
            store.purges.raise_snapshot_horizon(conn, d, peer, table, store.watermarks.read(conn, d, peer, table))
    if ev.retyped or ev.added:  # changes the database refused (a value too long...) may fit now
        ready += store.errorqueue.ready_failed(conn, d, table, now_iso())
    # 3. capture in the new version (and the identities of references, a new column's too); not
    #    for a change replication does not see (an index), unless an earlier run was interrupted
    if found:  # the table was made again: every trigger of it is gone, not only capture's
        # committed with the triggers where DDL commits at once: a rollback of what follows (a
        # lock wait of capture_unseen_rows, which the refresh runs again) leaves the triggers, and
        # the next follow, finding them, still captures the rows inserted meanwhile and opens
        # the gap (before, it found nothing to do: both were lost, and the site's next update of
        # such a row was captured as a change of whatever identity held its key)
        store.schemas.mark_capturing(conn, d, table, version, missing, _sig)
        if not d.caps.transactional_ddl:
            _clear_kept_ranks(conn, site, info)
        d.install_table(conn, info)
        uniques.install(conn, d, info)
    # a capture that writes fewer columns than this version has (made for an earlier one): made
    # again, and the values those columns were given meanwhile captured (3b). A follow that made
    # it from another thread's description of the version before left it so, recorded as
    # followed (soak 2026-11-30 D1: a column's values stayed at the site that wrote them); the
    # signature names the capture triggers' text (MariaDB, SQLite), so such a site's next follow
    # looks (Dialect.table_signature)
    lacks = [] if (changed or found or not _sig) else d.capture_lacks(conn, info)
    if changed or not _sig or found or lacks:
        _make_capture(conn, site, info, peers, again=bool(found))
    unseen: list[Any] = []
    if missing:
        d.guard_writes(conn, info, site.name, site.name in topo.read_only)
        unseen, _now, refused = capture_unseen_rows(conn, site, info)
        store.gaps.open_gap(conn, d, table, now_iso(), missing, 0 if refused else len(unseen), refused)
    # 3b. values written to an added column before its capture existed: the columns added now, or
    #     those its recorded version added, when a follow recorded it and stopped before the end
    #     (where DDL commits at once, the records commit before the triggers: a lock wait of the
    #     trigger DDL, which the refresh retries, or a crash); those a stale capture lacked
    for c in ev.added or lacks or (_added_by(conn, site, table, version, new_cols) if not _sig and not changed else []):
        _capture_window(conn, site, info, c)
    # 4. followed
    store.schemas.set_sig(conn, d, table, version, d.table_signature(conn, table))
    return Evolved(site.name, table, version, ev, ready, gap=missing, unseen=unseen)


def _added_by(conn: Connection, site: Site, table: str, version: int, cols: Sequence[Col]) -> list[str]:
    """The columns of `cols` (schema version `version` of `table`) that its previous version lacks."""
    prev = store.schemas.versions(conn, site.dialect, table).get(version - 1)
    return [] if prev is None else [c.name for c in cols if c.name not in {p.name for p in prev}]


def _add_columns(
    conn: Connection, site: Site, live: TableInfo, ev: Evolution, old_cols: Sequence[Col], rels: Sequence[str]
) -> None:
    """evolve_table's step 1 (DDL, idempotent): the change log's and snapshots' (`rels`) columns
    of the added columns, those of retyped ones widened, the shadow's and the heads' columns."""
    d = site.dialect
    by = {c.name: c for c in live.columns}
    add = [(p + c, d.wide_type(by[c].type_sql)) for c in ev.added for p in ("n_", "o_")]
    old_types = {c.name: c.type_sql for c in old_cols}
    widen = [c for c in ev.retyped if d.wide_type(by[c].type_sql) != d.wide_type(old_types[c])]
    for rel in rels:
        d.add_columns(conn, rel, add)
        for c in widen:
            for p in ("n_", "o_"):
                d.retype_column(conn, rel, p + c, d.wide_type(by[c].type_sql))
    d.add_columns(conn, d.obj(live.name).shadow, [("v_" + s.name, d.version_type) for s in live.spec.slots])
    d.install_heads(conn, live)
    _park_columns(conn, site, live)


def _make_capture(conn: Connection, site: Site, info: TableInfo, peers: Sequence[str], again: bool) -> None:
    """The capture of `info` made (again): the identities of references, then the triggers;
    `again`: the table was made again (MariaDB first moves its key counter far past the keys its
    rows took meanwhile, Dialect.before_capture_again)."""
    d = site.dialect
    references.install(conn, site, info, peers)
    if d.caps.transactional_ddl or again:
        # where DDL commits at once (MariaDB), the triggers are replaced in one statement each
        # (install_capture, CREATE OR REPLACE): dropped first, every write in between went by
        # uncaptured (no change-log entry, no shadow row: its row then collided with a rank, and
        # its updates failed with "Column 'rid' cannot be null"; session 29)
        d.drop_capture(conn, info)
    if again:
        d.before_capture_again(conn, info)
    d.install_capture(conn, info)


def held_inserts(conn: Connection, site: Site, info: TableInfo) -> dict[Any, str]:
    """key -> identity of `info`'s identities whose insert is held in the error queue (they keep
    their key, engine/held.py, but no row of the table is theirs)."""
    d = site.dialect
    rids = {str(q["rid"]) for q in store.errorqueue.rows(conn, d, info.name) if q["op"] == "I"}
    if not rids:
        return {}
    sh = d.obj(info.name).shadow
    return {
        k: str(r) for k, r in conn.exec_driver_sql(f"SELECT {d.key_col}, rid FROM {sh} WHERE deleted IS NULL") if str(r) in rids
    }


def _clear_kept_ranks(conn: Connection, site: Site, info: TableInfo) -> None:
    """Where DDL commits at once (MariaDB), before the capture triggers of a table made again exist:
    a row no capture saw that holds the key a peer's held insert kept (renumbered tables) moves,
    not captured, to a key above every key. The capture triggers exist a moment before those rows
    are captured (capture_unseen_rows); an application's update of one in that moment is then
    refused (no identity holds its key) instead of captured as an update of the peer's row."""
    if not info.spec.renumber:
        return
    d = site.dialect
    held = held_inserts(conn, site, info)
    if not held:
        return
    q, ph = d.quote, d.caps.placeholder
    key = q(info.key.name)
    clash = [r[0] for r in conn.exec_driver_sql(f"SELECT {key} FROM {q(info.name)} ORDER BY {key}") if r[0] in held]
    if not clash:
        return
    top = apply.key_top(conn, d, info, store.tables.base_max(conn, d, info.name))
    d.set_applying(conn, True)
    for i, k in enumerate(clash, 1):
        conn.exec_driver_sql(f"UPDATE {q(info.name)} SET {key} = {ph} WHERE {key} = {ph}", (top + i, k))
    d.after_apply(conn, info)  # the key counter past them
    d.set_applying(conn, False)


def unseen_rows(conn: Connection, site: Site, info: TableInfo) -> list[Any]:
    """The keys of `info`'s rows no capture saw, inserted while capture was missing:
    no live identity in the shadow holds their key, or the one that does has its insert held (a
    change from a peer that collided with such a row). In a write transaction, key order."""
    d = site.dialect
    d.catch_up(conn, info)
    q = d.quote
    key, sh = q(info.key.name), d.obj(info.name).shadow
    out = {
        r[0]
        for r in conn.exec_driver_sql(
            f"SELECT t.{key} FROM {q(info.name)} t WHERE NOT EXISTS "
            f"(SELECT 1 FROM {sh} s WHERE s.{d.key_col} = t.{key} AND s.deleted IS NULL)"
        )
    }
    held = list(held_inserts(conn, site, info))
    if held:  # the table's rows at those keys
        marks = ", ".join([d.caps.placeholder] * len(held))
        out |= {r[0] for r in conn.exec_driver_sql(f"SELECT {key} FROM {q(info.name)} WHERE {key} IN ({marks})", tuple(held))}
    return sorted(out)


def capture_unseen_rows(conn: Connection, site: Site, info: TableInfo) -> tuple[list[Any], list[Any], str | None]:
    """`info`'s capture just made again: capture the rows inserted while it was missing
    (unseen_rows), each taken out (not captured) and inserted again whole under capture, so that
    they replicate and the site's next update or delete of them is captured (the capture of a row
    with no identity fails on PostgreSQL and MariaDB, and makes a change no peer can place on
    SQLite). A renumbered table's rows took keys outside the ranks, which collide with the next
    local insert's or the next ranking's: every other row keeps the key its identity holds (the
    key it has at every other site; only keys drawn by local inserts and not yet ranked are
    ranked, as every reconcile does), and each of these rows takes the next key past every
    identity's, as any local insert (core/keys.py remade); a natural key stays. Refused, changing
    nothing, when another row references one of them (taking it out would touch that row; a new
    key would leave it behind). Returns (their keys before, their keys now, the refusal)."""
    d = site.dialect
    renumber = info.spec.renumber
    base = store.tables.base_max(conn, d, info.name)
    if renumber and d.caps.concurrent_capture:
        d.lock_for_apply(conn, info)
        d.lock_writers(conn, info)
        apply.keys_locked(conn, d, info, base)
    keys = unseen_rows(conn, site, info)
    if not keys:
        return [], [], None
    q, ph = d.quote, d.caps.placeholder
    for r in references.referencing(conn, d, info.name, info.key.name, fresh=True):
        for k in keys:
            if conn.exec_driver_sql(f"SELECT 1 FROM {q(r.table)} WHERE {q(r.column)} = {ph} LIMIT 1", (k,)).first() is not None:
                if renumber:
                    d.after_apply(conn, info)  # the next local insert draws a key past theirs
                return (
                    keys,
                    [],
                    (
                        f"row {k} (written while capture was missing) is referenced by {r.table}.{r.column}: capturing "
                        "it takes it out and inserts it again"
                        + (", with the next rank (a new key)" if renumber else "")
                        + ". Move those references, or insert the row anew by hand, then run recapture again"
                    ),
                )
    tbl, key = q(info.name), q(info.key.name)
    rows: list[dict[str, Any]] = []
    # where DDL commits at once (MariaDB) the capture triggers exist already and applications
    # update these rows meanwhile (capture.sql: without an entry, the row is sent whole here): a
    # locking read takes each row as its last writer committed it and holds it to the end (a plain
    # read is this transaction's snapshot, older than such an update, which was then lost)
    locking = "" if d.caps.transactional_ddl else " FOR UPDATE"
    for k in keys:
        found = conn.exec_driver_sql(f"SELECT * FROM {tbl} WHERE {key} = {ph}{locking}", (k,)).mappings().first()
        rows.append({str(c): v for c, v in dict(found or {}).items() if not (renumber and c == info.key.name)})
    d.set_applying(conn, True)
    conn.exec_driver_sql(f"DELETE FROM {tbl} WHERE {key} = {ph}", [(k,) for k in keys])
    if renumber:
        _settle_keys(conn, site, info, base)
    d.set_applying(conn, False)
    for row in rows:  # a renumbered row without its key: the capture gives it the next key
        names_ = [str(c) for c in row]
        conn.exec_driver_sql(
            f"INSERT INTO {tbl} ({', '.join(q(c) for c in names_)}) VALUES ({d.ph(len(names_))})", tuple(row.values())
        )
    if not renumber:
        return keys, list(keys), None
    if d.caps.concurrent_capture:  # the keys they drew (the key counter) are ranks at once
        d.set_applying(conn, True)
        _settle_keys(conn, site, info, base)
        d.set_applying(conn, False)
    # the highest keys now (the table's writers wait for this transaction)
    top = [r[0] for r in conn.exec_driver_sql(f"SELECT {key} FROM {tbl} ORDER BY {key} DESC LIMIT {len(rows)}")]
    return keys, sorted(top), None


def _settle_keys(conn: Connection, site: Site, info: TableInfo, base: int) -> None:
    """Renumbered `info`, the rows no capture saw taken out: the keys drawn by local inserts and
    not yet ranked ranked (where writers capture concurrently), and the key counter past every
    identity's key, so that the next local insert takes the next key. No other key moves: the
    shadow's keys are those of every other site, whatever holes a purge left in its ranks."""
    d = site.dialect
    if d.caps.concurrent_capture:
        apply.normalize_keys(conn, d, info, base)
        apply.keys_ranked_now(conn, d, info, base)
    else:
        d.after_apply(conn, info)


def _capture_window(conn: Connection, site: Site, info: TableInfo, column: str) -> int:
    """Capture the values an application wrote to the added `column` between the ALTER and this
    capture (a hand-run ALTER commits before the site follows it): every row whose value differs
    from the column's default is updated to the default and back, under the new capture, so both
    updates are captured and the value reaches the other sites (which lack the column or gave
    their rows the same default). A column whose default is an expression is left alone (its
    rows cannot be told apart). Returns how many rows."""
    d = site.dialect
    q = d.quote
    ph = d.caps.placeholder
    col = next((c for c in info.columns if c.name == column), None)
    if col is None:
        return 0  # not a column of the version described now (dropped again since): nothing to capture
    if col.has_default and col.default is None:
        return 0  # an expression (now(), a sequence): not a constant the rows were given
    key, tbl, qc = q(info.key.name), q(info.name), q(column)
    fill = "NULL" if col.default is None else ph
    params: tuple[Any, ...] = () if col.default is None else (col.default,)
    differs = f"NOT ({d.null_safe_eq(d.comparable(col, qc), d.comparable(col, fill))})"
    tmp = d.temp_name("_mm_tmp_window")
    d.create_temp(conn, tmp, f"SELECT {key} AS mm_k, {qc} AS mm_v FROM {tbl} WHERE 1 = 0", keys="mm_k", index=None)
    conn.exec_driver_sql(f"INSERT INTO {tmp} (mm_k, mm_v) SELECT {key}, {qc} FROM {tbl} WHERE {differs}", params)
    n = int(conn.exec_driver_sql(f"SELECT count(*) FROM {tmp}").scalar() or 0)
    if n:
        conn.exec_driver_sql(f"UPDATE {tbl} SET {qc} = {fill} WHERE {key} IN (SELECT mm_k FROM {tmp})", params)
        d.update_from(conn, tbl, [f"{qc} = w.mm_v"], f"{tmp} w", f"w.mm_k = {tbl}.{key}")
    d.drop_temp(conn, tmp)
    return n


def _park_columns(conn: Connection, site: Site, info: TableInfo) -> None:
    """A table with a ``park`` UNIQUE set keeps parked rows' values per column (engine/uniques.py)."""
    if any(u.policy == "park" for u in info.uniques) and site.dialect.table_kind(conn, f"_mm_parked_{info.name}") is not None:
        site.dialect.add_columns(
            conn, uniques.parked_table(site.dialect, info.name), [("c_" + c.name, c.type_sql) for c in info.columns]
        )


def _remap(conn: Connection, site: Site, table: str, snap: str, old: list[str], new: list[str]) -> None:
    """The masks of `snap`'s rows not applied yet, and of every copy of a change of `table` held
    in the error queue (a copy that came later over another route is stored applied, as a
    duplicate, and a retry may apply it), from layout `old` to layout `new`."""
    if old == new:
        return
    parts = []
    for i, c in enumerate(old):
        m = remap_mask(1 << i, old, new)
        if m:
            parts.append(f"(CASE WHEN (mask & {1 << i}) <> 0 THEN {m} ELSE 0 END)")
    expr = " + ".join(parts) if parts else "0"
    held = ""
    if site.dialect.table_kind(conn, "_mm_errors") is not None:  # (init follows a site's schema before it adds the queue)
        held = f" OR ver IN ({store.errorqueue.open_versions_sql(site.dialect, table)})"
    conn.exec_driver_sql(f"UPDATE {snap} SET mask = {expr} WHERE applied <> 1{held}")


def _fill_pending(conn: Connection, site: Site, info: TableInfo, snap: str) -> int:
    """The changes of `snap` that waited for columns `info` has now get their values (converted as
    this site stores them exactly); those that wait for nothing more are ready to apply (held as
    ``failed`` until :func:`release` applies them). Returns how many are ready.

    The rows are updated with one statement per set of columns (an executemany), and the queue's
    rows made ready 500 at a time: a loop that read the whole queue again for each change made
    ready cost the square of the changes held (docs/performance.md "Releasing held changes")."""
    d = site.dialect
    ph = d.caps.placeholder
    at = {c: i for i, c in enumerate(info.column_names)}
    adapters = d.value_adapters(info)
    ready: list[str] = []
    updates: dict[str, list[tuple[Any, ...]]] = {}
    rows = conn.exec_driver_sql(f"SELECT pseq, ver, mask, pending FROM {snap} WHERE pending IS NOT NULL").all()
    for pseq, ver, mask, text in rows:
        pending = decode_pending(text)
        now = {c: v for c, v in pending.items() if c in at}
        if not now:
            continue
        rest = {c: v for c, v in pending.items() if c not in at}
        sets, params = [], []
        m = int(mask)
        for c, (n, o_) in sorted(now.items()):
            f = adapters[at[c]]
            sets += [f"{d.quote('n_' + c)} = {ph}", f"{d.quote('o_' + c)} = {ph}"]
            params += [n if f is None or n is None else f(n), o_ if f is None or o_ is None else f(o_)]
            m |= 1 << at[c]
        sets += [f"mask = {ph}", f"pending = {ph}"]
        params += [m, encode_pending(rest) if rest else None]
        updates.setdefault(f"UPDATE {snap} SET {', '.join(sets)} WHERE pseq = {ph}", []).append((*params, pseq))
        if not rest:
            ready.append(str(ver))
    for sql, many in updates.items():
        conn.exec_driver_sql(sql, many)
    if ready:
        want = set(ready)
        ids = [
            int(q["id"]) for q in store.errorqueue.rows(conn, d, info.name, states=(store.errorqueue.SCHEMA,)) if q["ver"] in want
        ]
        store.errorqueue.ready(conn, d, ids, now_iso())
    return len(ready)


def release(
    conn: Connection,
    site: Site,
    info: TableInfo,
    peers: Sequence[str],
    relay_of: RelayOf,
    held: bool = False,
) -> isolate.RetryResult:
    """In a write transaction at `site`: apply the changes of `info` that waited for columns the
    site has now, the later changes of their rows that waited behind them, and the changes of
    their source transactions held with them (``txn``; in any table, and their rows' later
    changes): a transaction is applied whole or stays held whole (the error queue's retry,
    engine/isolate.py). `relay_of`: what a table relays at `site`. `held`: also the held inserts
    of `info` (rows no capture saw took their keys; capture_unseen_rows took those rows out)."""
    d = site.dialect
    out = isolate.RetryResult(site.name)
    # the table's reconcilers wait: one holds a change behind a held change of its row only while
    # it holds this lock, so the queue read here is the one the retry acts on
    d.lock_for_apply(conn, info)
    firsts = [
        q
        for q in store.errorqueue.rows(conn, d, info.name, states=("failed",))
        if (q["error"] is None or (held and q["op"] == "I")) and q["op"] in "IUD"
    ]
    if not firsts:
        return out
    opened = store.errorqueue.rows(conn, d)
    by_id = {int(q["id"]): q for q in opened}
    # each change taken, what waits behind it and its transaction's, to the end
    queued = {i: by_id[i] for i in closure(opened, [int(q["id"]) for q in firsts], behind=True)}
    tables = sorted({str(q["tbl"]) for q in queued.values()} | {info.name})
    infos = {info.name: info}
    for tb in tables:
        if tb not in infos:
            other = site.known_info(tb, conn)
            if other is None:  # a table no longer replicated here: its changes stay held
                queued = {i: q for i, q in queued.items() if q["tbl"] != tb}
            else:
                infos[tb] = other
                d.lock_for_apply(conn, other)
    base = {tb: store.tables.base_max(conn, d, tb) for tb in infos}
    others = [q for q in opened if int(q["id"]) not in queued]  # held, not retried here
    isolate.retry(
        conn,
        site,
        infos,
        [tb for tb in tables if tb in infos],
        peers,
        base,
        {tb: relay_of(i) for tb, i in infos.items()},
        list(queued.values()),
        others,
        out,
    )
    return out


def follow(
    site: Site,
    topo: Topology,
    relay_of: RelayOf,
    others: Callable[[str], Mapping[str, set[str]]] | None = None,
    tables: Sequence[str] | None = None,
    write: Writer | None = None,
) -> list[Evolved]:
    """Make `site`'s capture follow every table (of `tables`, default all) whose columns changed
    there, each in a write transaction of its own, and apply what waited for the columns it
    gained. `others(table)`: the columns of the table's schema at the other sites (for the NOT
    NULL refusal; read before the site's write transaction). A refused change is reported in the result's `problems`, nothing else changes.
    `write(site, fn)`: runs a table's follow in a write transaction (the refresh's runs it again
    after a transient failure, a lock wait of its DDL among them); default: once."""
    names = list(tables if tables is not None else topo.tables)
    with site.read() as conn:
        heads = _heads(conn, site)
        todo = changed_tables(conn, site, names, heads)
        behind = _described_behind(conn, site, names, heads)
        waiting = _waiting_tables(conn, site, names)
        # the sources it holds a snapshot of: not a site the file lists before add-site added it
        peers = store.watermarks.added(conn, site.dialect, topo.peers_of(site.name)) if todo or waiting else []
    for tb in behind:
        site.forget(tb)
    out: list[Evolved] = []
    run = write or _write_once
    for tb in todo:
        elsewhere = others(tb) if others else None
        done = run(site, functools.partial(_follow_locked, site=site, topo=topo, tb=tb, peers=peers, elsewhere=elsewhere))
        if done is None:
            continue
        ev, refused = done
        out.append(ev)
        if refused:
            continue
        if ev.released or ev.unseen:
            with site.write() as conn:
                info = site.info(conn, tb, topo)
                r = release(conn, site, info, peers, relay_of, held=bool(ev.unseen))
                ev.released = len(r.applied)
    for tb in waiting - set(todo):
        late = _release_late(site, topo, tb, peers, relay_of)
        if late is not None:
            out.append(late)
    return out


#: runs fn(conn) in a write transaction at the site (refresh.write_retrying: again after a transient failure)
Writer = Callable[[Site, Callable[[Connection], Any]], Any]


def _write_once(site: Site, fn: Callable[[Connection], Any]) -> Any:
    with site.write() as conn:
        return fn(conn)


def _follow_locked(
    conn: Connection, site: Site, topo: Topology, tb: str, peers: Sequence[str], elsewhere: Mapping[str, set[str]] | None
) -> tuple[Evolved, bool] | None:
    """:func:`_follow_table` holding the table's follow lock, its DDL waiting for metadata locks
    only briefly (Dialect.short_ddl_waits)."""
    d = site.dialect
    d.lock_follow(conn, tb)
    try:
        with d.short_ddl_waits(conn):
            return _follow_table(conn, site, topo, tb, peers, elsewhere)
    finally:
        d.unlock_follow(conn, tb)


def _follow_table(
    conn: Connection, site: Site, topo: Topology, tb: str, peers: Sequence[str], elsewhere: Mapping[str, set[str]] | None
) -> tuple[Evolved, bool] | None:
    """follow's transaction for one table: what it did and whether the change was refused (its
    problems), or None when another process followed it meanwhile."""
    d = site.dialect
    info = site.info(conn, tb, topo)

    def locks(c: Connection) -> None:
        # the table's reconcilers wait for this transaction (they hold its snapshots, then the
        # table), then its applications (they take the table, then what their capture
        # writes): the steps of the follow take them the other way round, and would deadlock with either
        d.lock_for_apply(c, info)
        d.lock_for_install(c, [tb])

    if d.caps.transactional_ddl:
        locks(conn)
    # (else the first ALTER would commit and release them: evolve_table takes them after its DDL;
    # the follow lock keeps other follows out meanwhile)
    if tb not in changed_tables(conn, site, [tb]):
        site.forget(tb)
        return None  # another process followed it meanwhile
    try:
        return evolve_table(conn, site, topo, tb, peers, elsewhere, locks=None if d.caps.transactional_ddl else locks), False
    except SchemaError as e:
        cur = store.schemas.current(conn, site.dialect, tb)
        return Evolved(site.name, tb, cur[0] if cur else 0, None, 0, list(e.problems)), True


def _heads(conn: Connection, site: Site) -> Heads | None:
    """(version, recorded signature) of each table's current schema version at `site`, in one
    statement; None when the site keeps no versions (installed by an earlier release)."""
    if not store.schemas.exists(conn, site.dialect):
        return None
    return store.schemas.current_heads(conn, site.dialect)


def _described_behind(conn: Connection, site: Site, tables: Sequence[str], heads: Heads | None) -> list[str]:
    """The tables of `tables` that `site` (this process's description of it) describes in a schema
    version other than the one recorded there now (`heads`, _heads): another process followed
    them since."""
    if heads is None:
        return []
    out = []
    for tb in tables:
        known = site.known_info(tb)
        if known is not None and tb in heads and heads[tb][0] != known.version:
            out.append(tb)
    return out


def _waiting_tables(conn: Connection, site: Site, tables: Sequence[str]) -> set[str]:
    """The tables of `tables` with changes held at `site` for columns it did not have (state
    ``schema``), or ready to be applied since it has them (``failed`` without an error: the
    transaction that was to apply them failed)."""
    d = site.dialect
    if not store.schemas.exists(conn, d) or d.table_kind(conn, "_mm_errors") is None:
        return set()  # (a site installed before them: init follows its schema before it adds them)
    return set(store.errorqueue.waiting_tables(conn, d)) & set(tables)


def waited_columns(conn: Connection, site: Site, table: str, peers: Sequence[str]) -> set[str]:
    """The columns the changes of `table` held at `site` for columns it lacked wait for (their
    values kept in the snapshots of `peers`, `pending`)."""
    d = site.dialect
    out: set[str] = set()
    for p in peers:
        for (text,) in conn.exec_driver_sql(f"SELECT pending FROM {d.obj(table, p).snapshot()} WHERE pending IS NOT NULL"):
            out |= set(decode_pending(text))
    return out


def _release_late(site: Site, topo: Topology, table: str, peers: Sequence[str], relay_of: RelayOf) -> Evolved | None:
    """Changes of `table` held for columns `site` has now, though it followed its schema already:
    a refresher that described the table as it was before another process followed it holds them
    after that follow released what waited (two refreshers of one site: the daemon and a refresh
    run by hand, or the pulling side's follow); and changes made ready whose release failed (a
    lock timeout). They get their values and are applied, as :func:`evolve_table` and
    :func:`release` do for those held before. None: nothing was ready. (It reads the pending
    values of every snapshot of the table: only while changes wait for a column, at each follow.)"""
    d = site.dialect
    with site.read() as conn:
        info = site.info(conn, table, topo)
        have = set(info.column_names)
        wanted = waited_columns(conn, site, table, peers)
        ready = any(q["error"] is None for q in store.errorqueue.rows(conn, d, table, states=("failed",)))
    if wanted & have:
        with site.write() as conn:
            info = site.info(conn, table, topo)
            ready = sum(_fill_pending(conn, site, info, d.obj(table, p).snapshot()) for p in peers) > 0 or ready
    if not ready:
        return None
    with site.write() as conn:
        info = site.info(conn, table, topo)
        r = release(conn, site, info, peers, relay_of)
    return Evolved(site.name, table, info.version, None, len(r.applied))
