"""The refresher daemon: one process per site, each incoming link on its own schedule.

    multimaster run -t topology.yaml --site s2

For every link into the site, an APScheduler (3.x) job on the link's `interval` or `cron`
expression from the topology file, with its `jitter`. At most one refresh per link at a time
(``max_instances=1``, missed runs coalesced). A link whose peer fails backs off exponentially
(interval, 2x, 4x ... up to ``max_backoff``) while the other links keep running. A lock makes it
one daemon per site: a lock file next to a SQLite database, a session-level advisory lock on a
server (``Dialect.daemon_lock_sql``). SIGINT / SIGTERM: the refresh in flight finishes its
transaction (the batch being applied commits, the next one does not start), then the process exits.

Every refresh logs one line (JSON with ``--log-format json``): link, changes pulled, applied,
conflicts, duration, error. A write transaction of a refresh that waits for a lock past
``refresh.lock_wait_warn`` logs a ``lock_wait`` record naming who holds it (engine/lockwatch.py),
again while it lasts, and ``lock_wait_ended`` when it ends. Optionally a purge job (``purge_every``) and a metrics endpoint in
the Prometheus text format (:mod:`multimaster.ops.metrics`).

The topology file is read again while the daemon runs (docs/operations.md "Editing the topology
file"): every RELOAD_EVERY seconds the daemon compares the file with what it last read, and on
SIGHUP it reads it at once. An edit is validated first: a broken one is logged with every problem
(``topology_refused``) and the daemon keeps the topology it had; one that changes this daemon's
own sites (a site it runs removed or given another url, sites added or removed while it runs every
site) is logged as needing a restart, and kept out too. Otherwise it takes effect at once
(``topology_reloaded``): links added, removed or rescheduled, tables added or removed, policies,
batch size, stall and clock settings, the follow and verify schedules; refreshes already running
finish on the topology they started with.

Scheduled checks: when the topology has a ``verify:`` section and this daemon runs its site (or
every site), a job on its cron runs ``multimaster.spark.verify`` in this process (one at a time;
the SparkSession starts on the first run and is reused; nothing imports PySpark before) and stores
the result, or the error, in the site's ``_mm_verifications`` (:mod:`multimaster.ops.verifications`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from multimaster.config.cron import cron_trigger
from multimaster.config.secrets import redact
from multimaster.config.topology import Link, Topology, load_topology
from multimaster.core.progress import ProgressEvent
from multimaster.core.versions import started_at_now
from multimaster.engine import evolve
from multimaster.engine.cluster import Cluster, open_site
from multimaster.engine.reconcile import RefreshResult
from multimaster.engine.refresh import follow_site, refresh_link
from multimaster.engine.site import Site
from multimaster.errors import AgentOnly, ConfigError, MultimasterError, SiteUnreachable, first_line
from multimaster.ops import verifications
from multimaster.ops.purge import PurgePolicy, purge_site
from multimaster.ops.status import removed_message, removed_sites

__all__ = ["Daemon", "DaemonAlreadyRunning", "LinkState", "SiteLock", "cron_trigger"]

log = logging.getLogger("multimaster.ops.daemon")

#: seconds before the daemon logs again the same error of a site's schema follow (which runs every
#: refresh.follow_every, 1 s: a site that is down would log it every second)
FOLLOW_ERROR_REPEAT = 60.0
#: seconds between two looks at the topology file for an edit (SIGHUP: at once)
RELOAD_EVERY = 1.0


class DaemonAlreadyRunning(MultimasterError):
    def __init__(self, site: str, where: str, holder: str = ""):
        self.site = site
        super().__init__(
            f"a refresher daemon for site '{site}' is already running ({where}{'; ' + holder if holder else ''}). "
            "Run one daemon per site: stop the other one first, or pick another --site."
        )


class SiteLock:
    """At most one daemon per site. SQLite: ``flock`` on ``<database>.mm-daemon.lock``, released
    by the kernel if the process dies. Servers: the dialect's session advisory lock, held on a
    connection of its own for the daemon's lifetime."""

    def __init__(self, site: Site):
        self.site = site
        self._fd: int | None = None
        self._conn: Any = None
        self.where = ""

    def acquire(self) -> None:
        d = self.site.dialect
        lock_sql = d.caps.daemon_lock_sql
        if lock_sql is None:
            db = (make_url(self.site.url).database or "").removeprefix("file:").split("?")[0]
            if not db or db == ":memory:":
                return
            if not os.path.isfile(db):
                raise MultimasterError(
                    f"site '{self.site.name}': cannot take the one-daemon-per-site lock: the {d.name} dialect has no "
                    f"daemon_lock_sql and {db} is not a database file"
                )
            path = Path(db + ".mm-daemon.lock")
            self.where = f"lock file {path}"
            import fcntl

            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 200).decode(errors="replace").strip()
                os.close(fd)
                raise DaemonAlreadyRunning(self.site.name, self.where, holder) from None
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
            self._fd = fd
            return
        self.where = "advisory lock in the site's database"
        conn = self.site.engine.connect()
        ok = conn.exec_driver_sql(lock_sql, (f"multimaster-daemon-{self.site.name}",)).scalar()
        conn.commit()
        if not ok:
            conn.close()
            raise DaemonAlreadyRunning(self.site.name, self.where)
        self._conn = conn

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._conn is not None:
            try:
                self._conn.close()  # ends the session: the advisory lock goes with it
            finally:
                self._conn = None


@dataclass
class LinkState:
    """What the daemon knows of one link, in memory (the database keeps the durable part)."""

    link: Link
    runs: int = 0
    failures: int = 0  # consecutive
    errors: int = 0
    pulled: int = 0
    applied: int = 0
    conflicts: int = 0
    last_seconds: float = 0.0
    last_error: str | None = None
    retry_at: float = 0.0
    running: bool = False
    transient: bool = False  # the last failure was transient (RefreshResult.transient)

    @property
    def name(self) -> str:
        return f"{self.link.source}->{self.link.target}"


@dataclass
class DaemonStats:
    links: dict[str, LinkState] = field(default_factory=dict)
    purged: dict[str, int] = field(default_factory=dict)
    purge_errors: int = 0
    verifications: int = 0  # scheduled checks run
    verify_errors: int = 0  # of which could not complete
    reloads: int = 0  # edits of the topology file taken
    reloads_refused: int = 0  # edits refused (broken, or needing a restart)
    last_verification: dict[str, Any] | None = None  # what the last one stored (verifications.last's shape)
    started_at: float = field(default_factory=time.time)


def _json_line(event: str, at: float, fields: dict[str, Any]) -> str:
    """One event of the JSON log: its time (UTC, to the second), its name, its fields."""
    return json.dumps({"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)), "event": event, **fields}, default=str)


#: events logged at ERROR: replication lost until someone acts (a puller given up by purge)
_ERROR_EVENTS = ("given_up",)


def _emit(event: str, fmt: str, **fields: Any) -> None:
    if event in _ERROR_EVENTS and fields.get("error"):
        level = logging.ERROR
    elif fields.get("error") or event in ("clock_warning", "lock_wait", "given_up"):
        level = logging.WARNING
    else:
        level = logging.INFO
    if fmt == "json":
        line = _json_line(event, time.time(), fields)
    else:
        line = f"{event} " + " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    log.log(level, redact(line))


class Daemon:
    """The refreshers of `sites` (every site when None) of a topology, in one process."""

    def __init__(
        self,
        topo: Topology,
        sites: list[str] | None = None,
        *,
        purge_every: float | None = None,
        purge_policy: PurgePolicy | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        max_backoff: float = 300.0,
        log_format: str = "text",
        batch_size: int | None = None,
    ):
        problems = [f"site '{s}' is not defined under sites" for s in sites or [] if s not in topo.sites]
        if problems:
            raise ConfigError(problems)
        self.topo = topo
        #: run without --site: every site of the file this host reaches by its database
        self.every_site = not sites
        # a site reached through its agent is refreshed by the daemon on its own host (docs/agent.md)
        self.sites = list(sites) if sites else [n for n in topo.sites if not topo.sites[n].agent]
        remote = [n for n in self.sites if topo.sites[n].agent]
        if remote:
            raise AgentOnly(remote[0], topo.sites[remote[0]].url, "running its daemon (it writes the site's database)")
        self.links = [ln for ln in topo.links if ln.target in self.sites]
        if not self.links:
            raise ConfigError([f"no link pulls into {self.sites} (see 'links' in the topology)"])
        #: the topology file and what was last read of it (an edit is what differs), when it came from one
        self.path = topo.path
        self._seen = _digest(self.path)
        self.loaded_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._reload_asked = threading.Event()  # SIGHUP
        self._reload_lock = threading.Lock()
        #: clusters of topologies replaced by an edit, closed once no job uses them; jobs in use per cluster
        self._retired: list[Cluster] = []
        self._uses: dict[int, int] = {}
        self._uses_lock = threading.Lock()
        self.purge_every = purge_every
        #: per site, the follow's last error logged and when (time.monotonic): the same error is
        #: logged again only after FOLLOW_ERROR_REPEAT seconds, not at every follow_every
        self._follow_errors: dict[str, tuple[str, float]] = {}
        # capture gaps logged (site, message): each once, whether the follow or a refresh found it
        self._told_gaps: set[tuple[str, str]] = set()
        self._told_mu = threading.Lock()
        #: per site purged, the pullers its last purge gave up: each is logged when it is given up
        #: and when it is no longer, not at every purge (docs/operations.md "Log purge and retention")
        self._given_up: dict[str, set[str]] = {}
        self.purge_policy = purge_policy or PurgePolicy()
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.max_backoff = max_backoff
        self.log_format = log_format
        self.batch_size = batch_size
        self.stats = DaemonStats({f"{ln.source}->{ln.target}": LinkState(ln) for ln in self.links})
        self.cluster = Cluster(topo)
        self._stopping = threading.Event()
        self._locks: list[SiteLock] = []
        self._scheduler: Any = None
        self._metrics: Any = None
        #: the scheduled check's site when this daemon runs it (the daemon of that site runs it)
        self.verify_site = topo.verify_site if topo.verify is not None and topo.verify_site in self.sites else None
        self._spark: Any = None  # the SparkSession of the scheduled checks, started on the first
        self._own_spark = False

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Take the site locks, schedule every link, start the scheduler (and metrics)."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.triggers.interval import IntervalTrigger

        try:
            for s in self.sites:
                lock = SiteLock(open_site(self.topo, s))  # its own engine: the cluster is replaced by an edit
                if not self._acquire_when_up(lock):
                    return  # stopped while it waited: nothing was scheduled
                self._locks.append(lock)
        except BaseException:
            self._release()
            raise
        for name in {n for ln in self.links for n in (ln.source, ln.target)}:
            try:
                self.cluster.site(name).engine  # noqa: B018 - connect once from this thread (engines are shared)
            except MultimasterError:
                pass  # an unreachable peer: its link fails and backs off
        sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=len(self.links) + 4)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        for st in self.stats.links.values():
            _schedule_link(sched, self._refresh, st)
        if self.purge_every:
            sched.add_job(self._purge, IntervalTrigger(seconds=self.purge_every), id="purge", name="purge")
        self._schedule_follow(sched)
        self._schedule_verify(sched)
        if self.path is not None:
            sched.add_job(self._look, IntervalTrigger(seconds=RELOAD_EVERY), id="topology", name="topology file")
        self._scheduler = sched
        if self.metrics_port is not None:
            from multimaster.ops.metrics import MetricsServer

            self._metrics = MetricsServer(self, self.metrics_host, self.metrics_port)
            self._metrics.start()
        sched.start()
        _emit(
            "started",
            self.log_format,
            sites=",".join(self.sites),
            links=len(self.links),
            pid=os.getpid(),
            verify=f"'{self.topo.verify.cron}' at {self.verify_site}" if self.verify_site and self.topo.verify else None,
            metrics=f"http://{self.metrics_host}:{self._metrics.port}/metrics" if self._metrics else None,
        )

    def stop(self) -> None:
        """Ask every refresh to end after its current batch, wait for them, release the locks."""
        self._stopping.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if self._metrics is not None:
            self._metrics.stop()
            self._metrics = None
        if self._spark is not None and self._own_spark:
            try:
                self._spark.stop()
            except Exception:  # noqa: BLE001 - the JVM may be gone already
                pass
        self._spark = None
        self.cluster.close()
        for cl in self._retired:
            cl.close()
        self._retired = []
        self._release()
        _emit("stopped", self.log_format, sites=",".join(self.sites))

    def _acquire_when_up(self, lock: SiteLock) -> bool:
        """Take `lock`, waiting while its site's database does not answer (a server that starts
        after the daemon, a restart): logged once as `site_down`, tried again after a backoff
        (1 s doubling to 30 s), then `site_up`. False when the daemon was asked to stop
        meanwhile. Another daemon holding the lock is an error at once."""
        delay, said = 1.0, None
        while True:
            try:
                lock.acquire()
                if said is not None:
                    _emit("site_up", self.log_format, site=lock.site.name)
                return True
            except DaemonAlreadyRunning:
                raise
            except (SiteUnreachable, OperationalError) as e:
                msg = redact(first_line(e))
                if msg != said:
                    _emit("site_down", self.log_format, site=lock.site.name, error=msg, waiting="until it answers")
                    said = msg
            if self._stopping.wait(delay):
                return False
            delay = min(delay * 2, 30.0)

    def _release(self) -> None:
        for lock in self._locks:
            lock.release()
            lock.site.dispose()
        self._locks = []

    def run_forever(self, install_signals: bool = True) -> None:
        """Start, wait for SIGINT/SIGTERM (or :meth:`request_stop`), stop cleanly."""
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda signum, _frame: self.request_stop(signal.Signals(signum).name))
            if hasattr(signal, "SIGHUP"):
                signal.signal(signal.SIGHUP, lambda _signum, _frame: self._reload_asked.set())
        self.start()
        try:
            while not self._stopping.wait(0.5):
                if self._reload_asked.is_set():
                    self._look()
        finally:
            self.stop()

    def request_stop(self, why: str = "") -> None:
        if not self._stopping.is_set():
            _emit("stopping", self.log_format, reason=why or None)
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # ---- the topology file -----------------------------------------------------------------
    @contextmanager
    def using(self) -> Iterator[Cluster]:
        """The current cluster, for one job: one an edit replaced is closed only once no job uses it."""
        with self._uses_lock:
            cl = self.cluster
            self._uses[id(cl)] = self._uses.get(id(cl), 0) + 1
        try:
            yield cl
        finally:
            with self._uses_lock:
                self._uses[id(cl)] -= 1
                if not self._uses[id(cl)]:
                    del self._uses[id(cl)]

    def _close_retired(self) -> None:
        with self._uses_lock:
            done = [cl for cl in self._retired if id(cl) not in self._uses]
            self._retired = [cl for cl in self._retired if id(cl) in self._uses]
        for cl in done:
            cl.close()

    def _look(self) -> None:
        """The topology job (every RELOAD_EVERY seconds, and on SIGHUP): take an edit of the file."""
        forced = self._reload_asked.is_set()
        self._reload_asked.clear()
        if self.stopping:
            return
        self.reload(force=forced)
        self._close_retired()

    def reload(self, force: bool = False) -> bool | None:
        """Read the topology file again when it changed since it was last read (`force`: in any
        case, SIGHUP) and take it: True when taken, False when refused (logged, with every problem:
        the daemon keeps the topology it had), None when there was nothing to read."""
        if self.path is None:
            return None
        with self._reload_lock:
            seen = _digest(self.path)
            if seen == self._seen and not force:
                return None
            self._seen = seen  # a broken edit is logged once, not at every look
            keeping = f"the topology read at {self.loaded_at}"
            try:
                new = load_topology(self.path)
            except ConfigError as e:
                self.stats.reloads_refused += 1
                _emit(
                    "topology_refused",
                    self.log_format,
                    file=str(self.path),
                    error=f"{len(e.problems)} problem(s) in the edited file; fix it (this daemon reads it again once it changes)",
                    problems=e.problems,
                    keeping=keeping,
                )
                return False
            restart = self._needs_restart(new)
            if restart:
                self.stats.reloads_refused += 1
                _emit(
                    "topology_refused",
                    self.log_format,
                    file=str(self.path),
                    error="the edit changes this daemon's own sites: restart the daemon to take it",
                    problems=restart,
                    keeping=keeping,
                )
                return False
            self._take(new)
            return True

    def _needs_restart(self, new: Topology) -> list[str]:
        """What in `new` changes this daemon's own sites (each named), which it takes only when it
        starts again: it holds their one-daemon lock, and runs the sites it was started for."""
        out = []
        for n in self.sites:
            if n not in new.sites:
                out.append(f"site '{n}', which this daemon runs, is no longer under sites")
            elif new.sites[n].url != self.topo.sites[n].url:
                out.append(f"the url of site '{n}', which this daemon runs (and holds the lock of), changed")
        if self.every_site and not out:
            now = {n for n in new.sites if not new.sites[n].agent}
            if now != set(self.sites):
                out.append(f"this daemon runs every site ({', '.join(self.sites)}) and the file now has {', '.join(sorted(now))}")
        if not out and not any(ln.target in self.sites for ln in new.links):
            out.append(f"no link pulls into {self.sites} any more (see 'links' in the topology)")
        return out

    def _take(self, new: Topology) -> None:
        """Run on `new` from now on: a cluster of its own (tables described anew: policies, keys),
        each link's job added, removed or rescheduled, the follow and verify jobs too."""
        old = self.topo
        links = [ln for ln in new.links if ln.target in self.sites]
        states: dict[str, LinkState] = {}
        for ln in links:
            name = f"{ln.source}->{ln.target}"
            st = self.stats.links.get(name) or LinkState(ln)
            changed = st.link != ln
            st.link = ln
            states[name] = st
            if self._scheduler is not None and (changed or name not in self.stats.links):
                if name in self.stats.links:
                    self._scheduler.remove_job(name)
                _schedule_link(self._scheduler, self._refresh, st)
        gone = [name for name in self.stats.links if name not in states]
        for name in gone:
            if self._scheduler is not None:
                self._scheduler.remove_job(name)
        with self._uses_lock:
            self._retired.append(self.cluster)
            self.cluster = Cluster(new)
        self.topo, self.links = new, links
        self.stats.links = states
        self.verify_site = new.verify_site if new.verify is not None and new.verify_site in self.sites else None
        if self._scheduler is not None:
            if new.refresh.follow_every != old.refresh.follow_every:
                self._schedule_follow(self._scheduler, replace=True)
            if new.verify != old.verify:
                self._schedule_verify(self._scheduler, replace=True)
        self.loaded_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.stats.reloads += 1
        _emit("topology_reloaded", self.log_format, file=str(self.path), **_changes(old, new, self.sites))

    def _schedule_follow(self, sched: Any, replace: bool = False) -> None:
        from apscheduler.triggers.interval import IntervalTrigger

        if replace and sched.get_job("follow") is not None:
            sched.remove_job("follow")
        follow = self.topo.refresh.follow_every_seconds()
        if follow:
            sched.add_job(
                self._follow, IntervalTrigger(seconds=follow), id="follow", name="follow schemas", next_run_time=_now_dt()
            )

    def _schedule_verify(self, sched: Any, replace: bool = False) -> None:
        if replace and sched.get_job("verify") is not None:
            sched.remove_job("verify")
        if self.verify_site is not None:
            assert self.topo.verify is not None
            sched.add_job(
                self.run_verify, cron_trigger(self.topo.verify.cron), id="verify", name="verify", max_instances=1, coalesce=True
            )

    # ---- jobs ------------------------------------------------------------------------------
    def backoff(self, st: LinkState) -> float:
        """Seconds before a failing link is tried again: its interval doubled per consecutive
        failure (up to max_backoff), except after a transient failure (a lock wait that timed out,
        a deadlock: the sites answer, docs/decisions.md session 36), tried again after the interval."""
        base = max(st.link.interval if not st.link.cron else 1.0, 1.0)
        if st.transient:
            return float(min(self.max_backoff, base))
        return float(min(self.max_backoff, base * 2 ** max(0, st.failures - 1)))

    def _refresh(self, st: LinkState) -> None:
        if self.stopping or time.time() < st.retry_at:
            return
        st.running = True
        try:
            with self.using() as cl:
                res = refresh_link(
                    cl,
                    st.link.target,
                    st.link.source,
                    batch_size=self.batch_size,
                    stop=self._stopping.is_set,
                    progress=functools.partial(self._lock_wait, st),
                )
        except Exception as e:  # noqa: BLE001 - a job must not die: record and back off
            res = RefreshResult(st.link.target, st.link.source, error=redact(f"{type(e).__name__}: {e}"))
        finally:
            st.running = False
        if res.error:
            res.error = self._removed(st, res.error)
        st.runs += 1
        st.pulled += res.pulled
        st.applied += res.applied
        st.conflicts += res.conflicts
        st.last_seconds = res.seconds
        retry = None
        if res.error:
            st.failures += 1
            st.errors += 1
            st.last_error = res.error
            st.transient = res.transient
            retry = self.backoff(st)
            st.retry_at = time.time() + retry
        else:
            st.failures = 0
            st.transient = False
            st.retry_at = 0.0
        if res.pulled or res.error or log.isEnabledFor(logging.DEBUG):
            _emit(
                "refresh",
                self.log_format,
                link=st.name,
                pulled=res.pulled,
                applied=res.applied,
                conflicts=res.conflicts,
                batches=res.batches,
                seconds=round(res.seconds, 4),
                error=res.error,
                retry_in_s=retry,
            )
        for w in res.clock_warnings:  # applied, a warning (docs/clock.md "Clock discipline")
            _emit("clock_warning", self.log_format, link=st.name, message=w)
        # a capture found missing and made again by the refresh's own follow (a link refreshed
        # more often than refresh.follow_every finds it first): logged as the follow logs it,
        # once per gap (before, only the follow's finding was logged: a dropped trigger a
        # refresh made again was never in the log, explorer session 37)
        for tb, m in zip(res.gap_tables, res.gaps):
            if self._first_telling(st.link.target, m):
                _emit("capture_gap", self.log_format, site=st.link.target, table=tb, message=m)

    def _first_telling(self, site: str, gap: str) -> bool:
        """Whether capture gap `gap` of `site` is logged now (each open gap once per process)."""
        with self._told_mu:
            if (site, gap) in self._told_gaps:
                return False
            self._told_gaps.add((site, gap))
            return True

    def _removed(self, st: LinkState, error: str) -> str:
        """A link of a site remove-site removed (its file still lists it) fails saying so, not with
        the fixes of a site never installed or connected (init, add-site), as `status` and
        `refresh` say it; read at the link's own sites, only when it failed."""
        try:
            with self.using() as cl:
                gone = removed_sites(cl, [st.link.target, st.link.source])
        except Exception:  # noqa: BLE001 - the link's error stands as it was
            return error
        site = next((n for n in (st.link.source, st.link.target) if n in gone), None)
        return error if site is None else removed_message(site)

    def _lock_wait(self, st: LinkState, e: ProgressEvent | str) -> None:
        """A refresh's progress: its lock waits are logged (a record when one passes
        refresh.lock_wait_warn, again while it lasts, one when it ends); the rest is not."""
        if isinstance(e, ProgressEvent) and e.kind in ("wait", "waited"):
            _emit(
                "lock_wait" if e.kind == "wait" else "lock_wait_ended",
                self.log_format,
                link=st.name,
                site=e.site,
                waited_s=round(e.seconds, 1),
                blockers=[b.session for b in e.blockers if b.session] or None,
                message=e.text,
            )

    def _follow(self) -> None:
        """Each site's capture follows its tables' schema (refresh.follow_every): a hand-run change
        is followed within that time, not at the link's next refresh. Logs what it did: a table
        followed (`schema`), a capture found missing and made again (`capture_gap`), a change
        refused (`schema` with the problem)."""
        with self.using() as cl:
            for n in self.sites:
                if self.stopping:
                    return
                self._follow_site(cl, n)

    def _follow_site(self, cl: Cluster, n: str) -> None:
        """_follow at site `n`."""
        try:
            site = cl.site(n)
            for ev in follow_site(cl, n):
                if ev.gap:
                    with site.read() as conn:
                        for tb, m in evolve.open_gaps(conn, site):
                            if self._first_telling(n, m):
                                _emit("capture_gap", self.log_format, site=n, table=tb, message=m)
                elif ev.problems:
                    _emit("schema", self.log_format, site=n, table=ev.table, error="; ".join(ev.problems))
                else:
                    _emit("schema", self.log_format, site=n, table=ev.table, version=ev.version, released=ev.released or None)
        except Exception as e:  # noqa: BLE001 - logged, tried again at the next run and by every refresh
            # one line (a driver's message carries the statement), once while it repeats
            msg = redact(f"{type(e).__name__}: {first_line(e)}")
            last = self._follow_errors.get(n)
            now = time.monotonic()
            if last is None or last[0] != msg or now - last[1] >= FOLLOW_ERROR_REPEAT:
                self._follow_errors[n] = (msg, now)
                _emit("schema", self.log_format, site=n, error=msg)
            return
        self._follow_errors.pop(n, None)

    def _purge(self) -> None:
        for s in self.sites:
            if self.stopping:
                return
            try:
                with self.using() as cl:
                    rep = purge_site(cl, s, self.purge_policy)
                self.stats.purged[s] = self.stats.purged.get(s, 0) + rep.purged
                _emit(
                    "purge",
                    self.log_format,
                    site=s,
                    purged=rep.purged,
                    log=sum(t.log_left for t in rep.tables.values()),
                    tombstones=rep.tombstones,
                    conflicts=rep.conflicts,
                    held_by=",".join(sorted({h for t in rep.tables.values() for h in t.state_held_by})) or None,
                    expired=",".join(rep.expired) or None,
                )
                self._tell_given_up(s, rep.expired, rep.given_up)
            except Exception as e:  # noqa: BLE001 - logged, retried on the next run
                self.stats.purge_errors += 1
                _emit("purge", self.log_format, site=s, error=f"{type(e).__name__}: {e}")

    def _tell_given_up(self, site: str, expired: list[str], told: list[str]) -> None:
        """A puller of `site` its purge gave up is logged at ERROR, once, with the commands that
        bring it back (purge's message, `told`: one per puller of `expired`, in that order); one
        no longer given up (it answers again, or it left the topology) once at WARNING: if
        `site` purged past its watermark, its link fails and status names the fix."""
        before, now = self._given_up.get(site, set()), set(expired)
        for peer, msg in zip(expired, told):
            if peer not in before:
                _emit("given_up", self.log_format, site=site, peer=peer, error=msg)
        for peer in sorted(before - now):
            _emit(
                "given_up",
                self.log_format,
                site=site,
                peer=peer,
                state=f"no longer given up: '{peer}' answers again or left the topology; if its link from "
                f"'{site}' fails with purged changes, 'multimaster status' names the fix",
            )
        self._given_up[site] = now

    def _spark_session(self) -> Any:
        """The scheduled checks' SparkSession: started on the first run (PySpark is imported here
        and nowhere before), reused by the next ones."""
        if self._spark is not None:
            try:
                if self._spark.sparkContext._jsc is not None:  # still alive
                    return self._spark
            except Exception:  # noqa: BLE001 - a dead session: start another
                pass
            self._spark = None
        assert self.topo.verify is not None
        from multimaster.spark.jdbc import dialect_of, find_jars
        from multimaster.spark.session import get_spark

        jars = find_jars({dialect_of(s.url) for s in self.topo.sites.values() if s.verify})
        try:
            from pyspark import SparkContext

            fresh = SparkContext._active_spark_context is None
        except ImportError:
            fresh = True  # get_spark raises the readable MissingDependency
        self._spark = get_spark(self.topo.verify.master, jars)
        self._own_spark = fresh
        return self._spark

    def run_verify(self) -> dict[str, Any] | None:
        """The scheduled check, once: verify the cluster, store the result (or the error) at the
        verify site, log one line. Never raises: a failure is recorded and logged."""
        cfg = self.topo.verify
        if cfg is None or self.stopping:
            return None
        started = started_at_now()
        t0 = time.perf_counter()
        res: Any = None
        error = None
        try:
            from multimaster.spark import verify as spark_verify

            res = spark_verify(
                self.topo,
                tables=list(cfg.tables) if cfg.tables else None,
                master=cfg.master,
                checksum_only=cfg.checksum_only,
                spark=self._spark_session(),
            )
        except Exception as e:  # noqa: BLE001 - Java missing, a site down ...: recorded, retried on the next run
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            error = f"{type(e).__name__}: {msg[:1000]}"
        seconds = time.perf_counter() - t0
        self.stats.verifications += 1
        if error:
            self.stats.verify_errors += 1
        stored = None
        store_error = None
        try:
            with self.using() as cl:
                vid = verifications.store(cl, res, error=error, started_at=started, seconds=seconds, source="scheduled")
                stored = verifications.last(cl)
            if stored is not None and stored["id"] != vid:
                stored = None
        except Exception as e:  # noqa: BLE001 - the verify site itself may be down
            store_error = f"{type(e).__name__}: {str(getattr(e, 'orig', e)).strip().splitlines()[0] if str(e).strip() else ''}"
        self.stats.last_verification = stored or {
            "site": self.verify_site,
            "started_at": started,
            "seconds": seconds,
            "converged": res.converged if res else None,
            "status": res.status if res else verifications.ERROR,
            "tables": {t: r.status for t, r in res.tables.items()} if res else {},
            "error": error,
            "source": "scheduled",
        }
        _emit(
            "verify",
            self.log_format,
            site=self.verify_site,
            status=res.status if res else verifications.ERROR,
            tables=",".join(f"{t}:{r.status}" for t, r in res.tables.items()) if res else None,
            seconds=round(seconds, 3),
            id=stored["id"] if stored else None,
            error=error or (f"not stored: {store_error}" if store_error else None),
        )
        return self.stats.last_verification


def _digest(path: Path | None) -> str | None:
    """What the topology file holds, as a digest (None: no file, or it cannot be read now)."""
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _schedule_link(sched: Any, job: Any, st: LinkState) -> None:
    """The refresh job of a link, on its interval (a first refresh at once) or cron, with its jitter."""
    from apscheduler.triggers.interval import IntervalTrigger

    ln = st.link
    if ln.cron:
        trig = cron_trigger(ln.cron, ln.jitter)
        first = None
    else:
        trig = IntervalTrigger(seconds=max(ln.interval, 0.05), jitter=ln.jitter or None)
        first = _now_dt()
    sched.add_job(job, trig, args=[st], id=st.name, name=f"refresh {st.name}", **({"next_run_time": first} if first else {}))


def _changes(old: Topology, new: Topology, sites: list[str]) -> dict[str, Any]:
    """What an edit of the topology file changed, for the daemon's log (None: nothing of that)."""

    def names(xs: Any) -> str | None:
        return ",".join(sorted(xs)) or None

    mine = {f"{ln.source}->{ln.target}": ln for ln in old.links if ln.target in sites}
    now = {f"{ln.source}->{ln.target}": ln for ln in new.links if ln.target in sites}
    settings = [k for k in type(new.refresh).model_fields if getattr(new.refresh, k) != getattr(old.refresh, k)]
    out = {
        "tables_added": names(set(new.tables) - set(old.tables)),
        "tables_removed": names(set(old.tables) - set(new.tables)),
        "tables_changed": names(t for t in set(new.tables) & set(old.tables) if new.tables[t] != old.tables[t]),
        "links_added": names(set(now) - set(mine)),
        "links_removed": names(set(mine) - set(now)),
        "links_rescheduled": names(n for n in set(now) & set(mine) if now[n] != mine[n]),
        "refresh": ",".join(settings) or None,
        "sites_changed": names(n for n in set(new.sites) & set(old.sites) if new.sites[n] != old.sites[n]),
        "verify": "changed" if new.verify != old.verify else None,
        "purge": "changed" if new.purge != old.purge else None,
    }
    return {k: v for k, v in out.items() if v is not None}


def _now_dt() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


class RedactingFormatter(logging.Formatter):
    """A formatter whose every line (the message, an exception's traceback) shows no password the
    process has read (config/secrets.py): a driver's message may carry one."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class SchedulerJson(RedactingFormatter):
    """The scheduler's own lines (APScheduler: a run skipped because the link's previous one still
    runs, a job that raised) as the daemon's JSON events: ``{"ts", "event": "scheduler", "level",
    "message"}``. Before, they reached stderr as plain text, and a log shipper parsing one JSON
    object a line broke on them."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {"level": record.levelname.lower(), "message": record.getMessage()}
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info)
        return redact(_json_line("scheduler", record.created, fields))


def setup_logging(fmt: str = "text", level: int = logging.INFO, stream: Any = None) -> None:
    """One line per event on stderr (the message already carries the JSON when fmt is json); the
    scheduler's lines (logger ``apscheduler``) in the same format, warnings and errors only."""
    h = logging.StreamHandler(stream)
    h.setFormatter(RedactingFormatter("%(message)s" if fmt == "json" else "%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("multimaster")
    root.handlers[:] = [h]
    root.setLevel(level)
    root.propagate = False
    sh = logging.StreamHandler(stream)
    sh.setFormatter(SchedulerJson() if fmt == "json" else RedactingFormatter("%(asctime)s %(levelname)s %(message)s"))
    sched = logging.getLogger("apscheduler")
    sched.handlers[:] = [sh]
    sched.setLevel(logging.WARNING)
    sched.propagate = False
