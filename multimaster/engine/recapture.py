"""``multimaster recapture``: send the rows a site holds differently from a peer as changes captured
at the site (docs/schema-changes.md "A table made again").

A table made again at a site (a migration tool's copy into a new table, DROP and CREATE) loses its
capture triggers; the site's next follow makes them again and opens a gap (store/gaps.py), but the
writes made in between were never captured (a renumbered table's inserts excepted: the follow
captured them, evolve.capture_unseen_rows). This reads the site's rows and a peer's, leaves out the
rows a change on its way touches (engine/inflight.py: the same rule as verify's), and for every
other difference (core/recapture.py plan) makes the site's capture write the change that turns the
peer's row into the site's, in one write transaction at the site that holds its writers back:

- an update: the row is set to the peer's values of the differing columns with the capture guard
  set (not captured), then back to its own values under capture: an update from the peer's values
  to the site's;
- a delete: the peer's row is inserted with the guard set, then deleted under capture;
- an insert: the rows no capture saw are captured first, as the follow does
  (evolve.capture_unseen_rows); a renumbered table's rows are matched by identity (its shadow).

Each change runs under a savepoint: one the database refuses (a UNIQUE value, a NOT NULL column
the peer's row lacks) is reported and left. A change with a value one of the two sites cannot
store exactly (dialects/fit.py, as refresh holds one: '12abc' in a SQLite INTEGER, a PostgreSQL
'infinity' for SQLite, a text too long for the peer's VARCHAR(10)) is not sent: it is reported by
table, key, column, value and why, with the fix (`unfit`), and the rest goes on. A row the site has with an identity the peer lacks (or
the reverse, not deleted at the site), with no change on its way, is not a write capture missed:
it is left, for verify to tell.
When nothing is left, the table's open gap at the site is closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Hashable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.core import keys as key_rule
from multimaster.core import recapture as rule
from multimaster.core.values import ColumnType
from multimaster.core.versions import now_iso
from multimaster.dialects.fit import Misfit
from multimaster.dialects.schema import TableInfo
from multimaster.engine import evolve, inflight
from multimaster.engine.cluster import Cluster
from multimaster.engine.pull import converted
from multimaster.engine.refresh import follow_site, relay_origins, write_retrying
from multimaster.engine.remote import AgentSite
from multimaster.engine.schema import value_types
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly, ConfigError, RecaptureRefused

__all__ = ["Recaptured", "recapture", "gap_tables"]

_CHUNK = 500


@dataclass
class Recaptured:
    """What recapture did (or, with dry_run, would do) for one table at one site."""

    site: str
    table: str
    peer: str
    dry_run: bool = False
    inserted: list[Any] = field(default_factory=list)  #: keys the site sent as inserts
    updated: list[Any] = field(default_factory=list)  #: keys the site sent as updates
    deleted: list[Any] = field(default_factory=list)  #: keys the site sent as deletes
    #: keys whose rows differ but a change on its way touches them: run again once it has landed
    left: list[Any] = field(default_factory=list)
    failed: list[tuple[Any, str]] = field(default_factory=list)  #: (key, the database's refusal)
    #: (key here, key at the peer) of the rows whose identity the peer holds at another key, with
    #: nothing on its way to explain it: the sites diverged (core/keys.py key_differences)
    keys_differ: list[tuple[Any, Any]] = field(default_factory=list)
    #: the rows not sent because a value of the change is one a site cannot store exactly
    unfit: list[Unfit] = field(default_factory=list)
    closed: bool = False  #: the table's open capture gap at the site was closed

    @property
    def ok(self) -> bool:
        return not self.left and not self.failed and not self.keys_differ and not self.unfit

    def unfit_problems(self) -> list[str]:
        """One line per row of `unfit`: the table, key, column, value, the site that cannot store
        it and why, and the fix."""
        return [u.message(self) for u in self.unfit]

    def keys_problem(self) -> str | None:
        """What to say of `keys_differ`, naming the rows and the fix; None when there are none."""
        if not self.keys_differ:
            return None
        pairs = ", ".join(f"{k} -> {pk}" for k, pk in self.keys_differ[:10]) + (" ..." if len(self.keys_differ) > 10 else "")
        return (
            f"site '{self.site}': {len(self.keys_differ)} row(s) of table '{self.table}' have other keys at "
            f"'{self.peer}' (here -> there: {pairs}) and no change on its way explains it: the sites' keys "
            "diverged and recapture cannot tell which are right, so the capture gap stays open. Once every "
            f"change of '{self.site}' has reached '{self.peer}' (refresh until quiet), make '{self.site}' a copy of "
            f"'{self.peer}' again: 'multimaster add-site -t FILE {self.site} --from {self.peer} --replace'"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "table": self.table,
            "peer": self.peer,
            "dry_run": self.dry_run,
            "inserted": self.inserted,
            "updated": self.updated,
            "deleted": self.deleted,
            "left": self.left,
            "failed": [{"key": k, "error": e} for k, e in self.failed],
            "keys_differ": [{"key": k, "peer_key": pk} for k, pk in self.keys_differ],
            "keys_problem": self.keys_problem(),
            "unfit": [u.to_dict(self) for u in self.unfit],
            "closed": self.closed,
        }


@dataclass(frozen=True)
class Unfit:
    """A row recapture did not send: the value of `column` that `at` (the site or the peer) cannot
    store exactly, and why (dialects/fit.py, engine/pull.py converted)."""

    key: Any
    column: str
    value: Any
    at: str
    misfit: Misfit

    def fix(self, rep: Recaptured) -> str:
        """What to do: write a value both sites hold where the row is (the site's value, or the
        peer's), or widen the column of `at` (not when no column of the kind holds the value);
        then run recapture again."""
        again = f"then run 'multimaster recapture -t FILE --site {rep.site} --table {rep.table}' again"
        if self.at == rep.site:  # the peer's value, which the update or delete writes at the site
            write, where, held = rep.peer, rep.site, rep.site
        else:  # the site's value, which the change would send to the peer
            write, where, held = rep.site, rep.peer, rep.peer
        rewrite = (
            f"write a value '{where}' can hold in {rep.table}.{self.column} at '{write}' (UPDATE there; '{held}' holds that "
            f"update for the old value it carries: drop it there, 'multimaster errors skip -t FILE --site {held} --id ID "
            "--reason TEXT')"
        )
        if self.misfit.never:
            return f"{rewrite}; {again}"
        return f"widen {rep.table}.{self.column} at '{self.at}' to hold it ('multimaster ddl', or ALTER TABLE there), or {rewrite}; {again}"

    def message(self, rep: Recaptured) -> str:
        from multimaster.dialects.types import shown

        return (
            f"site '{rep.site}': table '{rep.table}', key {self.key!r}, column '{self.column}': not sent: '{self.at}' "
            f"cannot store exactly the value {shown(self.value)} ({self.misfit.why}). Nothing of the row was sent "
            f'and the capture gap stays open. Fix: {self.fix(rep)} (docs/types.md "Values a site cannot store")'
        )

    def to_dict(self, rep: Recaptured) -> dict[str, Any]:
        from multimaster.dialects.types import shown

        return {
            "key": self.key,
            "column": self.column,
            "value": shown(self.value),
            "site": self.at,
            "why": self.misfit.why,
            "fix": self.fix(rep),
            "message": self.message(rep),
        }


def gap_tables(cl: Cluster, site: str) -> list[str]:
    """The tables of the topology with an open capture gap at `site`."""
    s = cl.site(site)
    with s.read() as conn:
        return [g["tbl"] for g in store.gaps.read_open(conn, s.dialect) if g["tbl"] in cl.topo.tables]


def _direct(cl: Cluster, name: str, what: str) -> Site:
    s = cl.site(name)
    if isinstance(s, AgentSite):
        raise AgentOnly(name, s.display_url, what)
    return s


#: per column: (a converter to what a site's driver stores, a test that it stores it exactly)
Fits = Mapping[str, tuple[Any, Any]]
#: key -> column -> (the site that cannot store the value, the value as read, why)
Unfits = dict[Hashable, dict[str, tuple[str, Any, Misfit]]]


def _fits(form: TableInfo, at: Site) -> dict[str, tuple[Any, Any]]:
    """The converters and tests of `at`'s columns of `form` (Dialect.value_adapters,
    value_checks), by column."""
    d = at.dialect
    return {
        c.name: (a, f)
        for c, a, f in zip(form.columns, d.value_adapters(form), d.value_checks(form))
        if a is not None or f is not None
    }


def _fit(fit: tuple[Any, Any] | None, v: Any) -> tuple[Any, Misfit | None]:
    """`v` converted by `fit`'s converter, and why its site cannot store it exactly (None: it can);
    a value that cannot be converted comes back as it was read."""
    if fit is None or v is None:
        return v, None
    adapt, check = fit
    m = None
    if adapt is not None:
        v, m = converted(adapt, v)
    if m is None and check is not None:
        m = check(v)
    return v, m


def _rows(
    conn: Connection, s: Site, info: TableInfo, cols: list[str], form: TableInfo, at: Site, stored: tuple[str, Fits]
) -> tuple[dict[Hashable, dict[str, Any]], Unfits]:
    """Every row of `info` at `s`: key -> {column: value}, the values in the form site `at`'s
    driver stores for `form` (its table: what recapture writes there; a value that cannot be
    converted as it was read); compared by their columns' types (core/values.py), not as Python
    values. And the values the site `stored` names cannot store exactly (its column tests)."""
    q = s.dialect.quote
    adapt = {c: (a, None) for c, (a, _f) in _fits(form, at).items()}
    name, tests = stored
    sel = ", ".join(q(c) for c in [info.key.name, *cols])
    out: dict[Hashable, dict[str, Any]] = {}
    unfit: Unfits = {}
    for r in conn.exec_driver_sql(f"SELECT {sel} FROM {q(info.name)}"):
        out[r[0]] = {c: _fit(adapt.get(c), v)[0] for c, v in zip(cols, r[1:])}
        for c, v in zip(cols, r[1:]):
            m = _fit(tests.get(c), v)[1]
            if m is not None:
                unfit.setdefault(r[0], {})[c] = (name, v, m)
    return out, unfit


def _in_flight(queries: list[tuple[str, str]], sites: dict[str, Site], table: str) -> tuple[set[str], set[Hashable]]:
    """The identities the changes on their way touch, and their keys at every site: the keys the
    entries carry, and those the shadows give the identities (a renumbered row's key may have moved)."""
    rids: set[str] = set()
    keys: set[Hashable] = set()
    for n, sql in queries:
        with sites[n].engine.connect() as c:
            for rid, key in c.exec_driver_sql(sql):
                if rid is not None:
                    rids.add(str(rid))
                if key is not None:
                    keys.add(key)
    ordered = sorted(rids)
    for s in sites.values():
        shadow, kc = s.dialect.obj(table).shadow, s.dialect.key_col
        with s.engine.connect() as c:
            for i in range(0, len(ordered), _CHUNK):
                part = ordered[i : i + _CHUNK]
                marks = ", ".join([s.dialect.caps.placeholder] * len(part))
                keys |= {r[0] for r in c.exec_driver_sql(f"SELECT {kc} FROM {shadow} WHERE rid IN ({marks})", tuple(part))}
    return rids, keys


def _live(conn: Connection, s: Site, table: str) -> dict[Hashable, str]:
    """key -> identity of the live identities in `s`'s shadow of `table`."""
    d = s.dialect
    return {
        r[0]: str(r[1]) for r in conn.exec_driver_sql(f"SELECT {d.key_col}, rid FROM {d.obj(table).shadow} WHERE deleted IS NULL")
    }


def recapture(cl: Cluster, site: str, table: str, peer: str | None = None, dry_run: bool = False) -> Recaptured:
    """Compare `table` at `site` with `peer` (default: the first other site of the topology) and
    capture at `site` every difference no change on its way explains (the module's description).
    Every site must be reached directly: changes on their way are read on every link."""
    t = cl.topo
    peer = _peer(t, site, table, peer)
    sites = {n: _direct(cl, n, "recapture (it reads the changes on their way at every site)") for n in t.sites}
    s, p = sites[site], sites[peer]
    # capture exists and writes the table's current columns
    follow_site(cl, site, [table])
    queries = inflight.reads(t, table, {n: x.dialect for n, x in sites.items()}, {n: x.engine for n, x in sites.items()})
    with p.read() as pc:
        p_info = p.info(pc, table, t)
    with s.read() as sc:
        info = s.info(sc, table, t)
    cols = sorted(set(info.column_names) & set(p_info.column_names))
    renumber = info.spec.renumber
    with p.read() as pc:
        # the peer's values, written at the site: what the site cannot store is not sent
        there, there_unfit = _rows(pc, p, p_info, cols, info, s, (site, _fits(info, s)))
        p_live = _live(pc, p, table)
    d = s.dialect

    def run(conn: Connection) -> Recaptured:
        # a fresh report each attempt: a deadlock victim (MariaDB, applications writing) is rolled
        # back whole and run again (write_retrying), where it failed the command at once
        out = Recaptured(site, table, peer, dry_run)
        d.lock_table_writes(conn, table)
        if renumber and d.caps.concurrent_capture:  # no local insert in flight: keys are ranks
            d.lock_for_apply(conn, info)
            d.lock_writers(conn, info)
        d.catch_up(conn, info)
        sent: list[Any] = []
        if not dry_run:  # rows no capture saw, first (a renumbered table's hold keys that are ranks)
            out.inserted, sent, refused = evolve.capture_unseen_rows(conn, s, info)
            if refused is not None:
                raise RecaptureRefused(site, table, refused)
            if out.inserted:  # the changes of peers that collided with them apply now
                peers = store.watermarks.added(conn, d, t.peers_of(site))  # not a site listed and not added yet
                evolve.release(conn, s, info, peers, lambda i: relay_origins(t, site, i), held=True)
        # the site's values, sent to the peer: what the peer cannot store is not sent
        here, here_unfit = _rows(conn, s, info, cols, info, s, (peer, _fits(p_info, p)))
        rids, keys = _in_flight(queries, sites, table)
        live = _live(conn, s, table)
        ident: Mapping[Hashable, Hashable]
        p_ident: Mapping[Hashable, Hashable]
        flight: AbstractSet[Hashable]
        if renumber:  # by identity: keys are ranks, and moved where a row no capture saw took one
            ident, p_ident, flight = live, p_live, rids
        else:  # by key, the identity of a row (its incarnations share it)
            ident, p_ident, flight = {k: k for k in live}, {k: k for k in p_live}, keys
        skip = {ident[k] for k in sent if k in ident}  # just captured: on its way, not compared
        types = value_types([(d.name, info), (p.dialect.name, p_info)])
        unfit = _Unfit(here_unfit, there_unfit)
        _compare(conn, s, info, cols, here, there, ident, p_ident, flight, skip, types, unfit, out)
        if renumber:  # read after the changes on their way: what reached the peer since was on its way
            out.keys_differ = _keys_differ(conn, s, p, table, rids | {str(i) for i in skip})
        if not dry_run and out.ok:
            out.closed = bool(store.gaps.close(conn, d, table, now_iso(), _summary(out)))
        return out

    out = write_retrying(s, run)
    return out


def _shadow_keys(conn: Connection, s: Site, table: str) -> dict[str, int]:
    """identity -> key of every identity in `s`'s shadow of renumbered `table` (deleted ones
    included), the keys local inserts drew and no reconcile ranked yet ranked as it will."""
    d = s.dialect
    known = {str(r): int(k) for r, k in conn.exec_driver_sql(f"SELECT rid, {d.key_col} FROM {d.obj(table).shadow}")}
    fresh = d.fresh_identities_select(table)  # its own inserts the shadow has not caught up with (SQLite)
    if fresh is not None:
        known.update({str(r): int(k) for r, k in conn.exec_driver_sql(fresh) if str(r) not in known})
    floor = None
    if d.caps.concurrent_capture:
        floor = max(store.tables.keys_ranked(conn, d, table), store.tables.base_max(conn, d, table))
    return key_rule.ranked(known, floor)


def _keys_differ(conn: Connection, s: Site, p: Site, table: str, on_way: AbstractSet[str]) -> list[tuple[Any, Any]]:
    """(key here, key at `p`) of the rows of renumbered `table` whose identity `p` holds at another
    key, nothing on its way explaining it."""
    here = _shadow_keys(conn, s, table)
    with p.read() as pc:
        there = _shadow_keys(pc, p, table)
    return [(k, pk) for _rid, k, pk in key_rule.key_differences(here, there, on_way)]


def _peer(t: Any, site: str, table: str, peer: str | None) -> str:
    """The site to compare with: `peer`, or the first other site of the topology."""
    if table not in t.tables:
        raise ConfigError([f"table '{table}' is not under tables in the topology file"])
    if site not in t.sites:
        raise ConfigError([f"site '{site}' is not defined under sites"])
    others = [n for n in t.sites if n != site]
    if peer is None:
        if not others:
            raise ConfigError([f"site '{site}' has no other site to compare with"])
        return others[0]
    if peer not in others:
        raise ConfigError([f"--from '{peer}': not another site of the topology (sites: {', '.join(others)})"])
    return peer


def _compare(
    conn: Connection,
    s: Site,
    info: TableInfo,
    cols: list[str],
    here: dict[Hashable, dict[str, Any]],
    there: dict[Hashable, dict[str, Any]],
    ident: Mapping[Hashable, Hashable],
    p_ident: Mapping[Hashable, Hashable],
    flight: AbstractSet[Hashable],
    skip: AbstractSet[Hashable],
    types: Mapping[str, ColumnType],
    unfit: _Unfit,
    out: Recaptured,
) -> None:
    """Match the rows by identity (`ident`, `p_ident`: key -> identity at the site and the peer,
    from the shadows: a row without one is a row no capture saw, captured first, or, at the peer,
    not the site's business) and capture the updates and deletes `rule.plan` gives. An identity
    the peer lacks, or the site lacks without having deleted it, with no change on its way, is not
    a write capture missed: it is left (verify tells what it is). `types`: what each column's
    values are compared as (core/values.py: a decimal by value at its scale, an instant in UTC).
    A change with a value one of the sites cannot store exactly (`unfit`) is reported, not sent."""
    key_of = {i: k for k, i in ident.items()}
    p_key = {i: k for k, i in p_ident.items()}
    plan = rule.plan(
        {ident[k]: r for k, r in here.items() if k in ident and ident[k] not in skip},
        {p_ident[k]: r for k, r in there.items() if k in p_ident and p_ident[k] not in skip},
        cols,
        flight,
        types,
    )
    out.left = [key_of.get(i, i) for i in plan.left]
    for op in plan.ops:
        if op.kind == rule.INSERT or op.key not in key_of:
            out.left.append(key_of.get(op.key, op.key))
            continue
        k = key_of[op.key]
        bad = unfit.of(op, k, p_key[op.key])
        if bad:
            out.unfit.extend(bad)
            continue
        _sent(out, op, k, None if out.dry_run else _send(conn, s, info, op, k, here.get(k), there.get(p_key[op.key])))
    if out.dry_run:  # a run captures them first
        out.inserted = evolve.unseen_rows(conn, s, info)


@dataclass(frozen=True)
class _Unfit:
    """The values of the site's rows the peer cannot store exactly (`here`, by the site's key) and
    of the peer's rows the site cannot (`there`, by the peer's key)."""

    here: Unfits
    there: Unfits

    def of(self, op: rule.Op, key: Hashable, peer_key: Hashable) -> list[Unfit]:
        """The values of `op` one of the sites cannot store: an update sends the site's values of
        its columns and writes the peer's at the site; a delete writes the peer's row there."""
        h, t = self.here.get(key, {}), self.there.get(peer_key, {})
        got = [(c, h[c]) for c in op.columns if op.kind == rule.UPDATE and c in h]
        got += [(c, t[c]) for c in op.columns if c in t]
        return [Unfit(key, c, v, at, m) for c, (at, v, m) in got]


def _note(out: Recaptured, kind: str, key: Hashable) -> None:
    {rule.INSERT: out.inserted, rule.UPDATE: out.updated, rule.DELETE: out.deleted}[kind].append(key)


def _sent(out: Recaptured, op: rule.Op, key: Hashable, err: str | None) -> None:
    """Report `op` of the row of `key` sent, or refused with `err`."""
    if err is None:
        _note(out, op.kind, key)
    else:
        out.failed.append((key, err))


def _summary(out: Recaptured) -> str:
    return f"recaptured from '{out.peer}': {len(out.inserted)} inserted, {len(out.updated)} updated, {len(out.deleted)} deleted"


def _send(
    conn: Connection,
    s: Site,
    info: TableInfo,
    op: rule.Op,
    key_value: Hashable,
    here: dict[str, Any] | None,
    there: dict[str, Any] | None,
) -> str | None:
    """Capture the update or delete `op` at `s`, for the row of key `key_value` there, under a
    savepoint; None, or the database's reason it was left."""
    d = s.dialect
    q, ph = d.quote, d.caps.placeholder
    tbl, key = q(info.name), q(info.key.name)
    try:
        with conn.begin_nested():
            if op.kind == rule.UPDATE:
                assert here is not None and there is not None
                sets = ", ".join(f"{q(c)} = {ph}" for c in op.columns)
                d.set_applying(conn, True)  # the peer's values, not captured
                conn.exec_driver_sql(f"UPDATE {tbl} SET {sets} WHERE {key} = {ph}", (*[there[c] for c in op.columns], key_value))
                d.set_applying(conn, False)  # back to the site's, captured
                conn.exec_driver_sql(f"UPDATE {tbl} SET {sets} WHERE {key} = {ph}", (*[here[c] for c in op.columns], key_value))
            else:
                assert op.kind == rule.DELETE and there is not None
                names = [info.key.name, *op.columns]
                d.set_applying(conn, True)  # the peer's row, not captured
                conn.exec_driver_sql(
                    f"INSERT INTO {tbl} ({', '.join(q(c) for c in names)}) VALUES ({d.ph(len(names))})",
                    (key_value, *[there[c] for c in op.columns]),
                )
                d.set_applying(conn, False)  # deleted, captured
                conn.exec_driver_sql(f"DELETE FROM {tbl} WHERE {key} = {ph}", (key_value,))
    except sa.exc.DBAPIError as e:
        d.set_applying(conn, False)  # (a session setting on some databases: not rolled back)
        return redact(str(e.orig).splitlines()[0][:300])
    return None
