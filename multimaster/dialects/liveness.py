"""Bounded waits on a database server: a connection that hears nothing from its server for
`read_timeout` seconds has the server checked, and is cut when the server does not answer.

A driver's connection (psycopg, PyMySQL) blocks for as long as its server sends nothing: a frozen
server (SIGSTOP, a hung host) or a silent partition keeps a statement, a COMMIT or a ping waiting
for minutes (TCP keepalives and retransmissions do not help against a frozen process: its kernel
still acknowledges every packet). A plain socket read timeout would also cut a statement that the
server is legitimately busy with (a big purge, add-site's copy), which sends nothing until it
ends. So the wait is watched instead (docs/decisions.md, session "Bounded waits on a server"):

- each wait of a connection for its server (the driver's own wait: psycopg's ``Connection.wait``,
  PyMySQL's reads and writes) registers with its engine's :class:`Guard`;
- once a wait has heard nothing for `read_timeout` seconds, the guard checks the server on a new
  socket, within `connect_timeout` seconds: PostgreSQL must answer an SSLRequest (one byte, 'S'
  or 'N'), MariaDB/MySQL must send its greeting. That is the server process answering, not its
  kernel; no login, no session;
- a server that answers is busy, not gone: the wait goes on, checked again after another
  `read_timeout` of silence, so a long statement is never cut; a server that does not is gone:
  the connection's socket is shut down, which ends the driver's wait at once, and the driver's
  error is raised as :class:`ServerSilent`'s message (the driver's OperationalError, so that
  SQLAlchemy treats it as a disconnect and discards the connection).

A wait therefore ends within ``read_timeout + connect_timeout`` (plus the guard's tick) of the
server's last answer once the server stops answering.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_READ_TIMEOUT", "Guard", "Timeouts", "probe"]

#: seconds a new connection may take (TCP, TLS, login) before it fails
DEFAULT_CONNECT_TIMEOUT = 10.0
#: seconds a wait may hear nothing from its server before the server is checked
DEFAULT_READ_TIMEOUT = 15.0
#: PostgreSQL's SSLRequest: length 8, code 80877103; the server answers one byte
_PG_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
#: seconds the guard's thread lingers without a wait to watch before it ends
_IDLE_EXIT = 5.0


@dataclass(frozen=True)
class Timeouts:
    """A site's bounds (topology: refresh.connect_timeout / read_timeout, or the site's own)."""

    connect: float = DEFAULT_CONNECT_TIMEOUT
    read: float = DEFAULT_READ_TIMEOUT

    @property
    def bound(self) -> float:
        """The longest a wait lasts once its server stops answering (the guard's tick aside)."""
        return self.read + self.connect


#: an address to check: ("tcp", host, port) or ("unix", path, 0)
Address = tuple[str, str, int]


def probe(protocol: str, addr: Address, timeout: float) -> str | None:
    """None when the server at `addr` answers within `timeout` seconds (`protocol`: 'postgresql'
    answers an SSLRequest, 'mysql' sends its greeting; a connection it closes is an answer too),
    else why not."""
    kind, host, port = addr
    deadline = time.monotonic() + timeout
    try:
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(host)
        else:
            s = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        return f"a new connection was not accepted within {timeout:g} s"
    except OSError as e:
        return f"a new connection failed: {e.strerror or e}"
    try:
        if protocol == "postgresql":
            s.sendall(_PG_SSL_REQUEST)
        s.settimeout(max(0.05, deadline - time.monotonic()))
        s.recv(1)
        return None
    except socket.timeout:
        return f"a new connection got no answer within {timeout:g} s"
    except OSError:
        return None  # reset by the server: it answered
    finally:
        s.close()


class _Wait:
    __slots__ = ("addr", "cut", "fd", "since")

    def __init__(self, fd: int, addr: Address):
        self.fd, self.addr = fd, addr
        self.since = time.monotonic()
        self.cut: str | None = None


class Guard:
    """The waits of one engine's connections on their server, and the thread that checks the
    server when one has heard nothing for `timeouts.read` seconds (module docstring). The thread
    runs while there are waits, and ends a few seconds after the last one."""

    def __init__(self, protocol: str, timeouts: Timeouts):
        self.protocol = protocol
        self.timeouts = timeouts
        self._waits: set[_Wait] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._tick = min(0.5, max(0.05, timeouts.read / 4))

    @contextmanager
    def waiting(self, fd: int, addr: Address) -> Iterator[_Wait]:
        """Watch one wait on socket `fd` (to `addr`) while the block runs. The block's error, when
        the guard cut the wait, is for the caller to replace with `w.cut`'s message."""
        w = _Wait(fd, addr)
        with self._lock:
            self._waits.add(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="multimaster-liveness", daemon=True)
                self._thread.start()
        try:
            yield w
        finally:
            with self._lock:
                self._waits.discard(w)

    def message(self, w: _Wait) -> str:
        return (
            f"the server did not answer for {self.timeouts.read:g} s (read_timeout) and {w.cut} "
            "(connect_timeout): it is down, frozen or cut off by the network"
        )

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(self._tick)
            now = time.monotonic()
            with self._lock:
                if not self._waits:
                    if now - idle_since >= _IDLE_EXIT:
                        self._thread = None
                        return
                    continue
                idle_since = now
                silent = [w for w in self._waits if w.cut is None and now - w.since >= self.timeouts.read]
            for addr in {w.addr for w in silent}:
                why = probe(self.protocol, addr, self.timeouts.connect)
                with self._lock:
                    for w in silent:
                        if w.addr != addr or w not in self._waits:
                            continue
                        if why is None:
                            w.since = time.monotonic()  # busy, not gone: watched again
                        else:
                            w.cut = why
                            _shut(w.fd)


def _shut(fd: int) -> None:
    """End every wait on socket `fd`: shut down in both directions (the driver's socket stays
    open, its owner closes it)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.close()
