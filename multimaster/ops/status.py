"""Status and the conflict log, read from every site (`multimaster status`, `multimaster conflicts`)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy.exc import DBAPIError

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import Topology
from multimaster.config.view import worst_wait
from multimaster.core.versions import now_iso, ver_ms, ver_origin
from multimaster.core.waits import NEEDS_ACTION, Wait, behind, behind_message, failing, fix, reason, since_s, stalled
from multimaster.dialects.base import Dialect
from multimaster.engine import evolve
from multimaster.engine.cluster import Cluster, as_cluster, each, read_each
from multimaster.engine.refresh import clock_warning, held_at_source, held_stall
from multimaster.engine.remote import AgentSite
from multimaster.engine.site import Site
from multimaster.errors import ConfigError, MultimasterError, NotConnected, NotInstalled, first_line
from multimaster.ops.purge import purged_past
from multimaster.ops.uninstall import untracked, untracked_message
from multimaster.ops.verifications import last

__all__ = [
    "status",
    "attention",
    "removed_message",
    "removed_sites",
    "conflicts",
    "conflicts_page",
    "ConflictsPage",
    "conflicts_at",
    "describe",
    "CONFLICT_KINDS",
    "site_summary",
    "link_at_target",
    "link_at_source",
]

# status / conflicts


def _site_entry(cl: Cluster, t: Topology, n: str, since: str | None) -> dict[str, Any]:
    """status's entry for site `n`: its summary, or why it could not be read (not reached, or
    reached with a login that may not read multimaster's tables there, e.g. a pull login)."""
    s = cl.site(n)
    d: dict[str, Any] = {"url": s.display_url, "reachable": True, "read_only": n in t.read_only}
    try:
        d.update(s.summary(since) if isinstance(s, AgentSite) else site_summary(s, t, since))
    except MultimasterError as e:
        d["reachable"] = False
        d["error"] = redact(str(e))
    except DBAPIError as e:
        d["reachable"] = False
        d["error"] = redact(f"site '{n}' cannot be read with this login: {first_line(e)}")
    return d


#: the keys of every link's entry besides from / to / tables / clock_ahead (None when not known)
LINK_KEYS = (
    "error",
    "last_success_at",
    "last_error",
    "last_error_at",
    "pulled",
    "applied",
    "conflicts",
    "waiting",
    "oldest_waiting_age_s",
    "parked",
    "parked_age_s",
    "waits_for",
    "stalled",
    "held_at_source",
    "behind",
    "behind_s",
    "running",
)


def _link_entry(cl: Cluster, t: Topology, ln: Any, site_data: dict[str, dict[str, Any]], now_ms: int) -> dict[str, Any]:
    """status's entry for link `ln`: its state at its target, and what waits at its source."""
    # every key present whatever is known (a monitoring script reads them; null: not known, the
    # link's `error` says why): before, a link into an unreachable site had no `waiting`, `stalled`, ...
    entry: dict[str, Any] = {"from": ln.source, "to": ln.target, "tables": {}, **dict.fromkeys(LINK_KEYS)}
    entry["clock_ahead"] = {
        w["origin"]: w["ahead_s"] for w in site_data[ln.target].get("clock_ahead", []) if w["peer"] == ln.source
    }
    src, tgt = cl.site(ln.source), cl.site(ln.target)
    if not site_data[ln.target].get("installed"):
        entry["error"] = _not_installed(site_data, ln.target) or "not installed or unreachable"
        return entry
    try:
        at = tgt.link_at_target(ln.source) if isinstance(tgt, AgentSite) else link_at_target(tgt, ln.source, t)
        entry.update(at["row"])
        if not at["connected"]:
            entry["error"] = str(NotConnected(ln.target, ln.source))
            return entry
        if entry.get("last_error"):  # stored by a refresher, maybe before its password was masked
            entry["last_error"] = redact(str(entry["last_error"]))
        if not site_data[ln.source].get("installed"):  # the link's own last error says why, above
            entry["error"] = _not_installed(site_data, ln.source) or f"site '{ln.source}' not installed or unreachable"
            return entry
        wms, have = at["watermarks"], at.get("have")
        ahead = (
            src.link_at_source(ln.target, wms, have)
            if isinstance(src, AgentSite)
            else link_at_source(src, ln.target, t, wms, have)
        )
        gone = purged_past(src, tgt, ln.source, ln.target, wms)  # the target was given up by a purge
        if gone:
            entry["error"] = gone
    except MultimasterError as e:  # an agent that stopped answering since
        entry["error"] = redact(str(e))
        return entry
    except Exception as e:  # noqa: BLE001 - a link whose bookkeeping is damaged: reported, not raised
        entry["error"] = redact(f"its state cannot be read: {type(e).__name__}: {first_line(e)}")
        return entry
    pending_local = at["unapplied"]
    _waits(entry, [w for w in at["parked"] if w is not None], now_ms, t.refresh.stall_after_seconds(), ln.target)
    waiting_total = 0
    oldest: str | None = None
    for tb in t.tables:
        w, o = ahead[tb]
        entry["tables"][tb] = {"watermark": wms[tb], "waiting": w, "unapplied": pending_local[tb][0]}
        waiting_total += w + pending_local[tb][0]
        for cand in (o, pending_local[tb][1]):
            if cand is not None and (oldest is None or cand < oldest):
                oldest = cand
    entry["waiting"] = waiting_total
    entry["oldest_waiting_age_s"] = None if oldest is None else max(0.0, (now_ms - ver_ms(oldest)) / 1000)
    if any(ahead[tb][0] for tb in t.tables) and not isinstance(src, AgentSite):
        _held_at_source(entry, src, ln.target, t, wms, t.refresh.stall_after_seconds(), have)
    _behind(entry, tgt, ln, ahead, now_ms, t.refresh.stall_after_seconds())
    return entry


def _behind(
    entry: dict[str, Any], tgt: Any, ln: Any, ahead: Mapping[str, tuple[int, str | None]], now_ms: int, after_s: float | None
) -> None:
    """A link that makes no progress while changes wait at its source (core/waits.py behind): how
    long (`behind_s`) and the message with what is known of why (`behind`); None otherwise, and
    for a link already named as stalled or failing."""
    entry["behind"] = entry["behind_s"] = entry["running"] = None
    count = sum(n for n, _ in ahead.values())
    vers = [o for _, o in ahead.values() if o is not None]
    if not count or not vers or entry.get("stalled"):
        return
    now = now_iso()
    success, error_at = entry.get("last_success_at"), entry.get("last_error_at")
    if failing(success, error_at, now, after_s, entry.get("last_error")):
        return  # named as failing, with its error (_failing)
    age = max(0.0, (now_ms - ver_ms(min(vers))) / 1000)
    stuck = behind(count, age, since_s(success, now), after_s, worst_wait(ln))
    if stuck is None:
        return
    error = entry.get("last_error") if error_at is not None and (success is None or error_at >= success) else None
    entry["behind_s"] = round(stuck, 1)
    r = _running(tgt, ln.source, now)
    entry["running"] = (
        None
        if r is None
        else {
            "started_at": r.started_at,
            "process": r.runner,
            "waiting_since": r.wait_since,
            "waiting_for": r.waiting_for,
        }
    )
    running = None if r is None else (r.started_at, r.runner, r.wait_since, r.waiting_for)
    entry["behind"] = behind_message(ln.source, ln.target, count, age, stuck, success, error, running)


def _running(tgt: Any, source: str, now: str) -> store.running.Running | None:
    """The refresh of the link from `source` waiting for a lock at `tgt` now, as its lock watch
    recorded it (store/running.py; read only for a link found behind: one statement more then);
    None at a SQLite or agent site (nothing records there) or where it cannot be read."""
    if isinstance(tgt, AgentSite) or tgt.dialect.caps.single_writer:
        return None
    try:
        with tgt.read() as conn:
            return store.running.read(conn, tgt.dialect, source, now)
    except Exception:  # noqa: BLE001 - the link is named behind all the same, with what else is known
        return None


def status(topo: Topology | Cluster, since: str | None = None) -> dict[str, Any]:
    """Per link: changes waiting at the peer, watermark, last success/error, the age of the oldest
    change not yet applied, the origins whose versions its last refresh received ahead of the
    target's clock past refresh.clock_warn (`clock_ahead`, also as messages in `clock_warnings`).
    Per site: conflicts (and `conflicts_since` the UTC time `since`,
    'YYYY-MM-DDTHH:MM:SS'), log sizes, clock, the tables installed there but no longer under
    tables: (`untracked`; each also as a message in `untracked`, with the command that stops
    them). Unreachable sites are reported, not raised."""
    cl, own = as_cluster(topo)
    t = cl.topo
    out: dict[str, Any] = {"sites": {}, "links": []}
    try:
        # every site and every link read at once: over a WAN each costs its round trips (100 ms
        # apart, 3 sites of 4 tables took 43 s one after the other)
        site_data = dict(zip(t.sites, each(lambda n: _site_entry(cl, t, n, since), list(t.sites))))
        out["sites"] = site_data
        _types_elsewhere(cl, site_data)
        now_ms = int(time.time() * 1000)
        out["links"] = each(lambda ln: _link_entry(cl, t, ln, site_data, now_ms), list(t.links))
        _pending_links(site_data, out["links"], t)
        out["removed"] = _removed_links(site_data, out["links"], t)
        out["converging"] = all(ln.get("waiting", 1) == 0 for ln in out["links"])
        out["stalled"] = [ln["stalled"] for ln in out["links"] if ln.get("stalled")]
        out["behind"] = [ln["behind"] for ln in out["links"] if ln.get("behind")]
        out["failing"] = _failing(site_data, out["links"], t.refresh.stall_after_seconds(), out["removed"])
        warn, limit = t.refresh.clock_warn_seconds(), t.refresh.max_offset_seconds()
        out["clock_warnings"] = [
            clock_warning(n, w["peer"], w["origin"], w["ahead_s"], warn, limit) + f" (seen {w['observed_at']})"
            for n, d in site_data.items()
            for w in d.get("clock_ahead", [])
        ]
        out["held_errors"] = sum(store.errorqueue.held_total(d.get("errors", {})) for d in site_data.values())
        out["schema_behind"] = [
            f"site '{n}' lacks {tb}.{c}: {w['changes']} change(s) wait for it; add it at '{n}' "
            f"(ALTER TABLE {tb} ADD COLUMN {c} {w['types'].get(c, '...')}) and they are applied at the next refresh"
            for n, d in site_data.items()
            for tb, w in d.get("schema_behind", {}).items()
            for c in w["columns"]
        ]
        out["untracked"] = [untracked_message(tb, n) for n, d in site_data.items() for tb in d.get("untracked", [])]
        out["capture_gaps"] = [evolve.gap_message(n, g) for n, d in site_data.items() for g in d.get("capture_gaps", [])]
        out["registry_warnings"] = [
            f"site '{n}': mysql.transaction_registry holds ~{d['registry_rows']:,} rows, one per transaction that "
            "captured a change; run 'multimaster purge' (it truncates it; docs/mysql.md \"The transaction registry\")"
            for n, d in site_data.items()
            if (d.get("registry_rows") or 0) > Dialect.REGISTRY_WARN
        ]
        out["verification"] = (
            last(cl) if site_data[t.verify_site].get("reachable") and not isinstance(cl.site(t.verify_site), AgentSite) else None
        )  # last recorded verify run
        return out
    finally:
        if own:
            cl.close()


def site_summary(s: Site, t: Topology, since: str | None = None) -> dict[str, Any]:
    """What `status` shows of one site, read at the site (its agent serves the same, docs/agent.md):
    installed, its clock, conflicts, log sizes, the error queue, schema versions, clocks seen ahead."""
    d: dict[str, Any] = {}
    with s.read() as conn:
        tables = s.installed_tables(conn)
        d["installed"] = set(t.tables) <= set(tables)
        d["untracked"] = untracked(tables, t)  # installed, no longer under tables: (uninstall --table)
        # under tables: and not installed (init not run since it was added, or uninstall --table ran)
        d["missing"] = [tb for tb in t.tables if tb not in tables] if tables else list(t.tables)
        if tables:
            mine = [tb for tb in t.tables if tb in tables]
            d.update(store.tables.site_status(conn, s.dialect, mine))
            d["errors"] = store.errorqueue.counts(conn, s.dialect)  # the error queue (docs/errors.md)
            d["retired"] = sorted(
                store.retired.removed(conn, s.dialect, s.name)
            )  # the sites remove-site removed (not added since)
            d.update(_schemas(conn, s, t, mine))  # docs/schema-changes.md
            d["clock_ahead"] = store.skew.read(conn, s.dialect)  # docs/clock.md "Clock discipline"
            d["registry_rows"] = s.dialect.registry_rows(conn)  # MariaDB: docs/mysql.md "The transaction registry"
            if since is not None:
                d["conflicts_since"] = store.conflicts.count_since(conn, s.dialect, since)
    return d


def link_at_target(tgt: Site, source: str, t: Topology) -> dict[str, Any]:
    """A link's state at its target `tgt` (pulling from `source`): whether it is connected there
    (it holds its snapshot of `source`: not yet after add-site of `source` left it to be connected
    on its host), the link's row, per table the watermark and the changes stored but not applied
    (count, oldest version), the oldest waiting change per table (None: none), and in a mesh what
    the target applied per table and origin (`have`, as a pull sends it: engine/refresh.py _have;
    else None)."""
    with tgt.read() as tconn:
        if not set(t.tables) <= store.watermarks.tables_of(tconn, tgt.dialect, source):  # no snapshot of it yet
            return {
                "connected": False,
                "row": store.links.row(tconn, tgt.dialect, source),
                "watermarks": {},
                "unapplied": {},
                "parked": [],
                "have": None,
            }
        return {
            "connected": True,
            "row": store.links.row(tconn, tgt.dialect, source),
            # each kind for every table in one statement (over a WAN each is a round trip)
            "watermarks": store.watermarks.read_all(tconn, tgt.dialect, source, list(t.tables)),
            "unapplied": store.links.unapplied_all(tconn, tgt.dialect, list(t.tables), source),
            "parked": store.links.parked_all(tconn, tgt.dialect, list(t.tables), source),
            "have": store.origins.have(tconn, tgt.dialect, t.tables) if t.pulls_every_writable() else None,
        }


def link_at_source(
    src: Site,
    target: str,
    t: Topology,
    watermarks: dict[str, int],
    have: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, tuple[int, str | None]]:
    """Per table, the changes at `src` past `target`'s watermark it has not pulled yet (count,
    oldest version), without those `have` says the target applied (relayed in a mesh: not waiting,
    and their older versions would make the link look late)."""
    with src.read() as sconn:
        return store.links.waiting_all(sconn, src.dialect, {tb: watermarks[tb] for tb in t.tables}, target, have)


def _held_at_source(
    entry: dict[str, Any],
    src: Site,
    target: str,
    t: Topology,
    wms: dict[str, int],
    after_s: float | None,
    have: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """A link whose waiting changes all wait for a transaction still open at its source: named in
    `held_at_source`, and the link is stalled (with the statement that ends it) once the oldest
    has waited refresh.stall_after."""
    held = held_at_source(src, target, t, wms, have)
    entry["held_at_source"] = held
    if held is None or entry.get("stalled"):
        return
    entry["stalled"] = held_stall(entry["from"], target, held, after_s)


def _waits(entry: dict[str, Any], waits: list[Wait], now_ms: int, after_s: float | None, target: str) -> None:
    """A link's waiting changes at its target (docs/operations.md "Stalled links"): how many, the
    age of the oldest, what it waits for, and the stall message with its fix when it is stalled."""
    entry["parked"] = sum(w.count for w in waits)
    entry["stalled"] = None
    if not waits:
        entry["parked_age_s"] = entry["waits_for"] = None
        return
    oldest = min(waits, key=lambda w: w.ver)
    entry["parked_age_s"] = round(oldest.age_s(now_ms), 1)
    entry["waits_for"] = reason(oldest)
    if stalled(oldest, now_ms, after_s):
        entry["stalled"] = (
            f"link {entry['from']} -> {target} stalled: {entry['parked']} change(s) wait, the oldest made "
            f"{entry['parked_age_s']:.0f}s ago: {entry['waits_for']}. Fix: {fix(target)}"
        )


def _schemas(conn: Any, s: Any, t: Topology, tables: list[str]) -> dict[str, Any]:
    """A site's schema versions per table, the tables whose columns changed since its capture
    followed them (the next refresh follows them), and per table the changes that wait for
    columns the site does not have yet: how many, which columns, their types at the sites that
    have them (docs/schema-changes.md)."""
    d = s.dialect
    if not store.schemas.exists(conn, d):
        return {}
    out: dict[str, Any] = {"schema_versions": {}, "schema_behind": {}}
    versions = store.schemas.current_versions(conn, d)
    for tb in tables:
        out["schema_versions"][tb] = versions.get(tb)
    out["schema_unfollowed"] = evolve.changed_tables(conn, s, tables)
    out["capture_gaps"] = store.gaps.read_open(conn, d)
    waits = store.errorqueue.schema_waits(conn, d)
    for tb in sorted({str(w["tbl"]) for w in waits}):
        cols = evolve.waited_columns(conn, s, tb, store.watermarks.added(conn, d, t.peers_of(s.name)))
        n = sum(1 for w in waits if w["tbl"] == tb)
        out["schema_behind"][tb] = {"changes": n, "columns": sorted(cols), "types": {}}
    return out


def _types_elsewhere(cl: Cluster, site_data: dict[str, dict[str, Any]]) -> None:
    """The declared type of each column a site lacks, at the sites that have it (for the fix)."""
    for n, d in site_data.items():
        for tb, w in d.get("schema_behind", {}).items():
            for other in cl.topo.sites:
                if other == n or not site_data[other].get("reachable") or isinstance(cl.site(other), AgentSite):
                    continue
                with cl.site(other).read() as conn:
                    cur = (
                        store.schemas.current(conn, cl.site(other).dialect, tb)
                        if store.schemas.exists(conn, cl.site(other).dialect)
                        else None
                    )
                for c in cur[1] if cur else []:
                    if c.name in w["columns"]:
                        w["types"].setdefault(c.name, c.type_sql)


#: what the planner records (docs/conflicts.md, "The conflict log")
CONFLICT_KINDS = ("update_update", "insert_insert", "update_delete", "delete_update", "insert_replaces", "unique", "orphan")
_WINNER = {"local": "local", "remote": "remote", "merged": "both", "delete": "delete", "null": "null"}


def _not_installed(site_data: dict[str, dict[str, Any]], n: str) -> str | None:
    """Why a reachable site that holds some tables is not installed: the tables under tables: it
    has no replication objects for, with both fixes (errors.NotInstalled); None otherwise."""
    d = site_data[n]
    missing = d.get("missing") or []
    if not d.get("reachable") or not missing:
        return None
    if not d.get("tables"):  # nothing installed at all
        return str(NotInstalled(n))
    return str(NotInstalled(n, f"replication objects for table(s) {missing}", missing))


def _pending_links(site_data: dict[str, dict[str, Any]], links: list[dict[str, Any]], t: Topology) -> None:
    """A site of `t` that answers with nothing installed while others are installed is listed
    before `add-site` added it (docs/operations.md "Adding a site"): each link of its gets the
    command that adds it, not `init` (a new cluster's) nor `add-site --connect-only` (a puller
    left to connect on its host)."""
    placed = [n for n, d in site_data.items() if d.get("tables")]
    if not placed:
        return  # a new cluster: init installs every site
    for n, d in site_data.items():
        if d.get("reachable") and not d.get("tables") and d.get("missing"):
            msg = pending_message(n, next((p for p in t.peers_of(n) if p in placed), None) or "PEER")
            for entry in links:
                if n in (entry["from"], entry["to"]):
                    entry["error"] = msg


def pending_message(site: str, peer: str) -> str:
    """What `status` says of a link of a site the topology file lists that is not added yet."""
    return (
        f"site '{site}' is in the topology file and not added to the cluster yet: run 'multimaster add-site -t FILE "
        f'{site} --from {peer}\' (docs/operations.md "Adding a site"); the other links go on meanwhile'
    )


def _removed_links(site_data: dict[str, dict[str, Any]], links: list[dict[str, Any]], t: Topology) -> list[str]:
    """The sites of `t` a site records as removed (remove-site); each link of theirs gets the
    error that says so: not a link to install or connect, one to drop from the file."""
    removed = sorted({g for d in site_data.values() for g in d.get("retired") or []} & set(t.sites))
    for entry in links:
        gone = [n for n in (entry["from"], entry["to"]) if n in removed]
        if gone:
            entry["error"] = removed_message(gone[0])
    return removed


def removed_message(site: str) -> str:
    """What `status` and `refresh` say of a link of a site `remove-site` removed that the topology
    file still lists (not the fixes of a site never installed: init, add-site)."""
    return (
        f"site '{site}' was removed from the cluster (multimaster remove-site): remove '{site}' and its links from "
        "the topology file and restart the daemons"
    )


def attention(st: dict[str, Any], after_s: float | None) -> list[str]:
    """What `status` exits 1 for, of the sites and links `st` holds (a status document, or `watch`'s
    restricted to some sites): changes held in an error queue, stalled and failing links, sites not
    reached or removed, tables installed and no longer under tables:, open capture gaps; each a
    message with its fix. Empty when nothing needs action."""
    held = sum(store.errorqueue.held_total(d.get("errors") or {}) for d in st["sites"].values())
    out = []
    if held:
        out.append(
            f"{held} change(s) held in the error queue: see them with 'multimaster errors -t FILE', "
            "fix the cause, then 'multimaster errors retry -t FILE --all'"
        )
    out += [ln["stalled"] for ln in st["links"] if ln.get("stalled")]
    out += [ln["behind"] for ln in st["links"] if ln.get("behind")]
    out += _failing(st["sites"], st["links"], after_s, [n for n in st.get("removed") or [] if n in st["sites"]])
    out += [untracked_message(tb, n) for n, d in st["sites"].items() for tb in d.get("untracked") or []]
    out += [evolve.gap_message(n, g) for n, d in st["sites"].items() for g in d.get("capture_gaps") or []]
    return out


def removed_sites(cl: Cluster, at: Sequence[str] | None = None) -> set[str]:
    """The sites of the topology that a site reached directly (of `at`, default every site)
    records as removed (remove-site); sites that cannot be read are left out (the command reading
    this names them)."""
    out: set[str] = set()
    for n in cl.topo.sites if at is None else at:
        s = cl.site(n)
        if isinstance(s, AgentSite):
            continue
        try:
            with s.read() as conn:
                if s.installed_tables(conn):
                    out |= store.retired.removed(conn, s.dialect, s.name)
        except (MultimasterError, DBAPIError):
            continue
    return out & set(cl.topo.sites)


def _failing(
    site_data: dict[str, dict[str, Any]], links: list[dict[str, Any]], after_s: float | None, removed: Sequence[str] = ()
) -> list[str]:
    """What keeps links from making progress other than waiting changes (those are `stalled`): a
    site that cannot be reached (or was removed and is still in the file), and a link whose
    refreshes have failed for `after_s` (the stall grace; core/waits.py failing), each with what
    its error says."""
    out = [
        removed_message(n) if n in removed else f"site '{n}' not reached: {d.get('error')}"
        for n, d in site_data.items()
        if not d.get("reachable") or n in removed
    ]
    now = now_iso()
    down = {n for n, d in site_data.items() if not d.get("reachable")} | set(removed)
    for ln in links:
        if ln["from"] in down or ln["to"] in down:
            continue  # named with its site above
        if ln.get("error"):  # not connected, not installed, its bookkeeping unreadable
            out.append(f"link {ln['from']} -> {ln['to']}: {ln['error']}")
        elif failing(ln.get("last_success_at"), ln.get("last_error_at"), now, after_s, ln.get("last_error")):
            error = str(ln.get("last_error") or "")
            if error.startswith(NEEDS_ACTION):  # not transient: named at once, with its fix
                out.append(
                    f"link {ln['from']} -> {ln['to']} failing: its last refresh, at {ln['last_error_at']}, failed and the "
                    f"next ones will until this is done: {error.removeprefix(NEEDS_ACTION)}"
                )
                continue
            since = ln.get("last_success_at") or "it was set up"
            out.append(
                f"link {ln['from']} -> {ln['to']} failing: no refresh of it succeeded since {since}; the last one, at "
                f"{ln['last_error_at']}, failed: {error}"
            )
    return out


@dataclass
class ConflictsPage:
    """A page of `multimaster conflicts`: `rows` (oldest first), `total` (how many conflicts the
    listing has without a limit; with `exact` False, at least that many: a site reached through its
    agent is not counted past the page)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    exact: bool = True


def conflicts_page(
    topo: Topology | Cluster,
    site: str | None = None,
    table: str | None = None,
    limit: int = 50,
    offset: int = 0,
    *,
    since: str | None = None,
    kind: str | None = None,
    unreachable: dict[str, str] | None = None,
) -> ConflictsPage:
    """The conflicts :func:`conflicts` lists, newest first past the `offset` newest, at most
    `limit` (0: all), shown oldest first; with how many the listing has. Each site reached directly
    is counted, and its `offset + limit` newest are read."""
    if offset < 0:
        raise ConfigError([f"--offset: {offset} is negative (0: from the newest)"])
    page = ConflictsPage()
    want = offset + limit if limit else 0
    adding = threading.Lock()  # (the sites are read at once: engine/cluster.py read_each)

    def count(s: Site | AgentSite, rows: list[dict[str, Any]]) -> None:
        n, exact = len(rows), not (want and len(rows) > want)  # an agent lists them: counted as far as read
        if not isinstance(s, AgentSite):
            with s.read() as conn:
                n, exact = (
                    (store.conflicts.count_matching(conn, s.dialect, table, since, kind), True)
                    if s.installed_tables(conn)
                    else (0, True)
                )
        with adding:
            page.total += n
            page.exact = page.exact and exact

    rows = conflicts(topo, site, table, want + 1 if want else 0, since=since, kind=kind, unreachable=unreachable, counted=count)
    newest = rows[::-1][offset : want or None]
    page.rows = newest[::-1]
    return page


def conflicts(
    topo: Topology | Cluster,
    site: str | None = None,
    table: str | None = None,
    limit: int = 100,
    *,
    since: str | None = None,
    kind: str | None = None,
    unreachable: dict[str, str] | None = None,
    counted: Callable[[Site | AgentSite, list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """The conflict log of every site (or `site`), oldest first, at most the last `limit` (0:
    all): only of `table`, of `kind`, recorded at or after `since` (UTC 'YYYY-MM-DDTHH:MM:SS')
    when given. Each row: what ``_mm_conflicts`` holds (values and row images decoded) plus, per
    side, the site that wrote its version and whether that was this site (``local``) or another
    (``replicated``), and ``winner`` (``local``, ``remote``, ``both`` for a merge, ``delete``).
    A site reached through its agent is read by its agent (conflicts_at, run there). A site that
    cannot be reached raises SiteUnreachable; with `unreachable` (a dict) it goes there instead
    (site -> why) and the other sites are read.
    Raises ConfigError for a site, table or kind that does not exist."""
    cl, own = as_cluster(topo)
    try:
        problems = []
        if site is not None and site not in cl.topo.sites:
            problems.append(f"--site: site '{site}' is not defined under sites")
        if table is not None and table not in cl.topo.tables:
            problems.append(f"--table: table '{table}' is not defined under tables")
        if kind is not None and kind not in CONFLICT_KINDS:
            problems.append(f"--kind: '{kind}' is not a conflict kind (one of {', '.join(CONFLICT_KINDS)})")
        if limit < 0:
            problems.append(f"--limit: {limit} is negative (0 lists every conflict)")
        if problems:
            raise ConfigError(problems)

        def read(s: Site | AgentSite) -> list[dict[str, Any]]:
            if isinstance(s, AgentSite):  # (an agent of a version before `table` was added names it `tbl` only)
                rows = [dict(r, table=r.get("table", r.get("tbl"))) for r in s.conflicts(table, limit, since, kind)]
            else:
                rows = conflicts_at(s, table, limit, since, kind)
            if counted is not None:  # (conflicts_page: how many the listing has)
                counted(s, rows)
            return rows

        rows = read_each(cl, [site] if site else list(cl.topo.sites), read, unreachable)
        rows.sort(key=lambda r: (r["detected_at"], r["site"], r["id"]))
        return rows[-limit:] if limit else rows
    finally:
        if own:
            cl.close()


def conflicts_at(
    s: Site, table: str | None = None, limit: int = 100, since: str | None = None, kind: str | None = None
) -> list[dict[str, Any]]:
    """The conflict log of site `s` as `conflicts` returns it (the last `limit`, 0: all), read at
    the site (its agent runs this); none before init."""
    with s.read() as conn:
        if not s.installed_tables(conn):
            return []
        return [describe(dict(r), s.name) for r in store.conflicts.rows(conn, s.dialect, table, limit, since=since, kind=kind)]


def describe(row: dict[str, Any], site: str) -> dict[str, Any]:
    """A conflict-log row as `conflicts` returns it (see there)."""
    d = dict(row)
    d["site"] = site
    if "key" not in d:  # MySQL names the column `key` too; SQLAlchemy gives it bare
        d["key"] = next((v for k, v in row.items() if k.strip('`"') == "key"), None)
    for k in ("columns", "local_values", "remote_values", "local_row", "remote_row", "heads"):
        if d.get(k):
            d[k] = json.loads(d[k])
    for side in ("local", "remote"):
        ver = d.get(f"{side}_ver")
        origin = ver_origin(ver) if ver else None
        d[f"{side}_origin"] = origin or None
        d[f"{side}_source"] = None if not origin else ("local" if origin == site else "replicated")
    d["table"] = d.get("tbl")  # the name `errors` and the --table option use (`tbl` kept for scripts)
    d["rule"] = d.get("policy")
    d["winner"] = _WINNER.get(d.get("decision") or "", d.get("decision"))
    return d
