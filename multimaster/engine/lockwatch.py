"""Lock waits named while they last (docs/cli.md "Progress and lock waits").

A write operation at a site (one batch of a refresh with all its retries, init's install at a
site, add-site's copy) runs under a :class:`LockWatch`: a timer thread beside it that, every
`poll` seconds, asks whether the operation waits for a lock. On a server the dialect reads it on a
connection of its own (``Dialect.lock_blockers`` of the session the transaction runs in); where
the database's write lock is taken at BEGIN (SQLite's BEGIN IMMEDIATE) the watch sees that wait
itself; between two attempts of a batch (after a lock timeout, a deadlock) the operation still
waits. Once one wait has lasted `after` seconds (summed over the batch's retries: PostgreSQL's
apply gives up a lock after 500 ms and tries again), the watch reports it once, naming its holders,
then every `every` seconds while it goes on, and once when it ends. A wait that ends in a failure
says nothing more: the operation's error is the message.

A refresh's watch (`Watch.peer` set) also records each report at a server site, in a short
transaction of its own, in ``_mm_running`` (store/running.py): `status` of another process then
says which refresh waits, since when, for whom. The row is renewed at every report and deleted when
the wait ends (a process killed meanwhile leaves one that expires). Not on SQLite: the watch would
wait for the very write lock it reports.

Quick operations cost nothing but a thread: the first look is one `poll` after the start, and a
server is asked only from then on. Never imported by the layers below the engine; the reports go
through the caller's progress callback (core/progress.py)."""

from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator, Protocol

from sqlalchemy.engine import Engine

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.core.progress import Blocker, Progress, ProgressEvent, wait_text
from multimaster.core.versions import iso_in, now_iso
from multimaster.dialects import Dialect

__all__ = ["Watch", "LockWatch", "watching", "REPEAT_S"]

#: a wait still going on is reported again this often (seconds)
REPEAT_S = 10.0
#: the longest time between two looks (a short `after` looks more often: a quarter of it)
POLL_MAX_S = 0.5
#: a wait has ended when this many looks in a row found none
QUIET_LOOKS = 2

#: a recorded wait counts for at least this long after the report that renewed it (seconds)
RECORD_MIN_S = 30.0


def runner() -> str:
    """This process, as a recorded wait names it (host:pid; read when asked: a forked daemon has its own)."""
    return f"{socket.gethostname()}:{os.getpid()}"


#: the sites whose lock waits could not be read (each said once per process)
_unreadable: set[str] = set()


class _Site(Protocol):
    name: str
    url: str
    dialect: Dialect

    @property
    def engine(self) -> Engine: ...


@dataclass(frozen=True)
class Watch:
    """Who is told of the lock waits of `subject`'s write transactions, and after how long."""

    subject: str
    report: Progress
    after: float
    every: float = REPEAT_S
    #: a refresh's watch: the link's source (its waits are recorded at the target, store/running.py)
    peer: str | None = None
    #: when the refresh began (the bookkeeping's UTC text)
    started_at: str | None = None

    def over(self, site: _Site) -> LockWatch:
        return LockWatch(site, self)


def watching(site: _Site, watch: Watch | None) -> ContextManager[LockWatch | None]:
    """`watch` over one operation at `site` (a context), or nothing when None."""
    return watch.over(site) if watch is not None else nullcontext()


class LockWatch:
    """The watch over one write operation at `site`: a context manager around it; the site's
    write transactions call :meth:`attach`, :meth:`beginning` and (between attempts)
    :meth:`retrying`."""

    def __init__(self, site: _Site, watch: Watch):
        self.site = site
        self.watch = watch
        self.poll = min(POLL_MAX_S, max(0.02, watch.after / 4))
        self._stop = threading.Event()
        self._mu = threading.Lock()  # the watch's state, shared by its thread and the operation's
        self._thread: threading.Thread | None = None
        # set by the operation's thread, read by the watch's
        self._backend: int | None = None
        self._begin_since: float | None = None
        self._retrying = False
        # the watch's own
        self.episode = 0.0  #: seconds the current wait has lasted (over retries)
        self._quiet = 0
        self._reported_at: float | None = None
        self._blockers: tuple[Blocker, ...] = ()
        self._at_begin = False
        self._recorded = False  # a row of _mm_running is ours (store/running.py)

    # ---- the operation's side ------------------------------------------------------------------
    def __enter__(self) -> LockWatch:
        self._thread = threading.Thread(target=self._run, name=f"lock watch: {self.watch.subject}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._mu:
            if exc_type is None and self._reported_at is not None:
                self._say(ended=True)
                self._reported_at = None
            if self._recorded:  # the operation failed while it waited: its error says the rest
                self._record(ended=True)

    def attach(self, dbapi_conn: Any) -> None:
        """An attempt's write transaction begins on `dbapi_conn`."""
        self._backend = None if dbapi_conn is None else self.site.dialect.backend_id(dbapi_conn)
        self._retrying = False

    @contextmanager
    def beginning(self) -> Iterator[None]:
        """Around the transaction's BEGIN (SQLite: it waits there for the database's write lock)."""
        self._begin_since = time.monotonic()
        try:
            yield
        finally:
            self._begin_since = None
            with self._mu:
                if self._reported_at is not None and self._at_begin:  # the write lock is ours now
                    self._say(ended=True)
                    self._reported_at, self.episode = None, 0.0

    def retrying(self) -> None:
        """An attempt failed transiently (a lock timeout, a deadlock): the next one will follow."""
        self._retrying = True

    # ---- the watch's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.poll):
            waiting = self._look()
            now = time.monotonic()
            with self._mu:
                if self._stop.is_set():
                    return  # the operation ended meanwhile: its result says the rest
                self._account(waiting, now - last, now)
            last = now

    def _account(self, waiting: bool, elapsed: float, now: float) -> None:
        """One look's finding: the wait went on for `elapsed` more seconds, or there is none."""
        if waiting:
            self.episode += elapsed
            self._quiet = 0
            if self.episode >= self.watch.after and (self._reported_at is None or now - self._reported_at >= self.watch.every):
                self._reported_at = now
                self._say()
            return
        self._quiet += 1
        if self._quiet >= QUIET_LOOKS:
            if self._reported_at is not None:
                self._say(ended=True)
            self._reported_at = None
            self.episode = 0.0

    def _look(self) -> bool:
        """Whether the operation waits for a lock now (noting its holders)."""
        if self._begin_since is not None and self.site.dialect.caps.single_writer:
            self._at_begin, self._blockers = True, ()
            return True
        if self._retrying:
            return True  # between attempts: the same holders, as far as known
        backend = self._backend
        if backend is None:
            return False
        try:
            with self.site.engine.connect() as c:
                found = self.site.dialect.lock_blockers(c, backend)
                c.rollback()
        except NotImplementedError:
            return False
        except Exception as e:  # noqa: BLE001 - a wait it cannot read is said once, never fatal
            if self.site.name not in _unreadable:
                _unreadable.add(self.site.name)
                msg = str(getattr(e, "orig", e)).strip().splitlines()
                self._tell(
                    f"{self.watch.subject}: lock waits at {self.site.name} cannot be read "
                    f"({redact(msg[0] if msg else type(e).__name__)}); they are not reported"
                )
            return False
        if found:
            self._at_begin, self._blockers = False, tuple(found)
        return bool(found)

    def _say(self, ended: bool = False) -> None:
        s = self.site
        file = (s.dialect.database_file(s.url) or s.name) if self._at_begin else None
        text = wait_text(self.watch.subject, s.name, self.episode, self._blockers, file=file, ended=ended)
        self._tell(
            ProgressEvent(
                "waited" if ended else "wait",
                self.watch.subject,
                text,
                seconds=self.episode,
                site=s.name,
                blockers=self._blockers,
            )
        )
        self._record(ended, text)

    def _record(self, ended: bool, text: str = "") -> None:
        """A refresh's wait at a server site, recorded for `status` (store/running.py): the row
        renewed at every report, deleted when the wait ends. Never fatal: a site installed before
        the table, or one that does not answer, has no record."""
        w, s = self.watch, self.site
        if w.peer is None or s.dialect.caps.single_writer or (ended and not self._recorded):
            return
        try:
            with s.engine.begin() as c:
                if ended:
                    store.running.clear(c, s.dialect, w.peer, runner())
                else:
                    store.running.record(
                        c,
                        s.dialect,
                        store.running.Running(
                            w.peer,
                            w.started_at or now_iso(),
                            runner(),
                            iso_in(-self.episode),
                            text,
                            iso_in(max(3 * w.every, RECORD_MIN_S)),
                        ),
                    )
            self._recorded = not ended
        except Exception:  # noqa: BLE001 - what status would say is lost, not the refresh
            pass

    def _tell(self, what: ProgressEvent | str) -> None:
        try:
            self.watch.report(what)
        except Exception:  # noqa: BLE001 - a display that fails must not stop the watch or the operation
            pass
