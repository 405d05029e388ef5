"""What a long operation tells its caller while it runs (docs/cli.md "Progress and lock waits"):
how far it is (a refresh's changes pulled, an init or add-site copy's rows), and how long a write
transaction of it has waited for a lock, and for whom. Plain data and the one wording of each line,
shared by the CLI (bars on a terminal, plain lines elsewhere) and the daemon's log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = [
    "Blocker",
    "ProgressEvent",
    "Progress",
    "progress_line",
    "progress_detail",
    "wait_text",
    "blocker_text",
    "lock_roots",
]


@dataclass(frozen=True)
class Blocker:
    """A session holding a lock a write transaction waits for, as its database describes it (each
    field None when the database does not tell)."""

    #: the session: "pid 4242" (PostgreSQL), "connection 17" (MariaDB / MySQL); None: not known
    session: str | None = None
    #: who runs it: an application_name, user@host
    who: str | None = None
    #: the client's address
    client: str | None = None
    #: what it is doing ("idle in transaction", "active", a thread's state)
    state: str | None = None
    #: how long its transaction has been open, in seconds
    txn_seconds: float | None = None
    #: (the beginning of) its current or last statement
    query: str | None = None


@dataclass(frozen=True)
class ProgressEvent:
    """One report of a long operation.

    `kind`: "pull" (a refresh link's changes pulled so far: `done`, `applied`, `batches`), "copy"
    (rows copied of one table: `done` of `total` when known), "wait" (a write transaction has waited
    `seconds` for a lock at `site`, held by `blockers`), "waited" (that wait ended after `seconds`).
    `subject` names what runs ("s1 -> s2": a link, or the copy from s1 to s2; "init at s1").
    `seconds` of a pull or copy: since the operation began (its rate is done / seconds).
    `text`: the line saying it (str(event)); a pull's or copy's is progress_line's when not given."""

    kind: str
    subject: str
    text: str = ""
    table: str | None = None
    done: int = 0
    total: int | None = None
    unit: str = "changes"
    applied: int | None = None
    batches: int | None = None
    seconds: float = 0.0
    site: str | None = None
    blockers: tuple[Blocker, ...] = ()

    def __post_init__(self) -> None:
        if not self.text and self.kind in ("pull", "copy"):
            object.__setattr__(self, "text", progress_line(self))

    def __str__(self) -> str:
        return self.text

    @property
    def key(self) -> tuple[str, str | None, str]:
        """What one progress display follows: the operation, its table, what it counts."""
        return (self.subject, self.table, self.unit)

    @property
    def rate(self) -> float | None:
        """Items per second since the operation began (None: too early to tell)."""
        return self.done / self.seconds if self.seconds > 0.05 and self.done else None


#: what a long operation calls with each report: an event, or (steps without numbers) a message
Progress = Callable[[ProgressEvent | str], None]


def _n(v: int) -> str:
    return f"{v:,}"


def _rate(r: float) -> str:
    return f"{round(r):,}/s" if r >= 10 else f"{r:.1f}/s"


#: units named in the singular when there is one
_ONE = {"changes": "change", "rows": "row", "change-log entries": "change-log entry"}


def _unit(e: ProgressEvent) -> str:
    return _ONE.get(e.unit, e.unit) if e.done == 1 and not e.total else e.unit


def progress_detail(e: ProgressEvent) -> str:
    """The numbers of a pull or copy event, without its subject: "1,200 changes pulled, 1,180
    applied, 3 batches (41,000/s)", "50,000 of 200,000 rows copied (25%, 41,000/s)"."""
    rate = e.rate
    if e.kind == "pull":
        parts = [f"{_n(e.done)} {_unit(e)} pulled"]
        if e.applied is not None:
            parts.append(f"{_n(e.applied)} applied")
        if e.batches is not None:
            parts.append(f"{_n(e.batches)} batch{'es' if e.batches != 1 else ''}")
        out = ", ".join(parts)
        return f"{out} ({_rate(rate)})" if rate is not None else out
    of = f" of {_n(e.total)}" if e.total is not None else ""
    extra = [f"{100 * e.done // e.total}%"] if e.total else []
    if rate is not None:
        extra.append(_rate(rate))
    return f"{_n(e.done)}{of} {_unit(e)} copied" + (f" ({', '.join(extra)})" if extra else "")


def progress_line(e: ProgressEvent) -> str:
    """One plain line of a pull or copy event: "s1 -> s2: 120,000 changes pulled, ... (41,000/s)",
    "s1 -> s3 items: 50,000 of 200,000 rows copied (25%, 41,000/s)"."""
    return f"{e.subject}{' ' + e.table if e.table else ''}: {progress_detail(e)}"


def blocker_text(b: Blocker) -> str:
    """One blocking session: "pid 4242 (application 'billing', client 10.0.0.7, idle in
    transaction, transaction open 12.0 s, query: UPDATE items SET ...)"."""
    facts = []
    if b.who:
        facts.append(b.who)
    if b.client:
        facts.append(f"client {b.client}")
    if b.state:
        facts.append(b.state)
    if b.txn_seconds is not None:
        facts.append(f"transaction open {b.txn_seconds:.1f} s")
    if b.query:
        q = " ".join(b.query.split())
        facts.append(f"query: {q[:80]}{'...' if len(q) > 80 else ''}")
    head = b.session or "a session the database does not name"
    return f"{head} ({', '.join(facts)})" if facts else head


def wait_text(
    subject: str,
    site: str,
    seconds: float,
    blockers: Sequence[Blocker] = (),
    *,
    file: str | None = None,
    ended: bool = False,
) -> str:
    """The line naming a lock wait of `subject`'s write transaction at `site`, `seconds` long so
    far (cumulative over the retries of one batch). `blockers`: who holds what it waits for (at
    most three named); `file`: a SQLite database, whose writers cannot be named; `ended`: the
    wait is over."""
    if ended:
        return f"{subject}: no longer waiting for a lock at {site} (waited {seconds:.1f} s)"
    head = f"{subject}: waiting {seconds:.1f} s for a lock at {site}"
    if file is not None:
        return f"{head}: the database file {file} is locked by another connection (SQLite cannot tell which)"
    if blockers:
        named = "; ".join(blocker_text(b) for b in blockers[:3])
        more = f"; and {len(blockers) - 3} more" if len(blockers) > 3 else ""
        return f"{head}, held by {named}{more}"
    return f"{head} (the database does not name its holder)"


def lock_roots(edges: dict[int, set[int]], start: int) -> tuple[set[int], dict[int, list[int]]]:
    """Of the lock waits `edges` (a waiting session -> the sessions it waits for), those `start`
    waits for, followed through the sessions that wait themselves: (the roots, which wait for
    nothing; each waiting one on the way -> the roots it waits behind). A lock's queue names the
    sessions waiting ahead for it besides its holders (InnoDB's lock waits, PostgreSQL's
    pg_blocking_pids): ending a queued one lets nothing go; the roots are what to end."""
    seen: set[int] = set()
    todo = list(edges.get(start, ()))
    while todo:
        s = todo.pop()
        if s in seen or s == start:
            continue
        seen.add(s)
        todo.extend(edges.get(s, ()))
    roots = {s for s in seen if s not in edges}
    queued: dict[int, list[int]] = {}
    for s in seen - roots:
        below: set[int] = set()
        todo, done = list(edges[s]), {s}
        while todo:
            x = todo.pop()
            if x in done:
                continue
            done.add(x)
            if x in roots:
                below.add(x)
            todo.extend(edges.get(x, ()))
        queued[s] = sorted(below)
    return roots, queued
