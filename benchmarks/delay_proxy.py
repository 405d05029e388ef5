"""A TCP proxy adding a fixed one-way delay to every chunk, in both directions, and counting bytes.

The kernel of the benchmark machines has no netem qdisc, so WAN delay comes from here: every chunk
read from one side is written to the other `--delay` seconds after it was read, in order (a
connection's chunks are not reordered; the proxy never holds a chunk longer than the delay, so the
throughput is not capped, only the latency raised). 0 gives a plain counting proxy (LAN).

    python benchmarks/delay_proxy.py --delay 5 --map 127.0.0.1:9001=10.0.0.2:8470 [--map ...] \
        [--stats stats.json]

Each `--map LISTEN=TARGET` may carry a name (`name@LISTEN=TARGET`). `--stats FILE` is rewritten
every 0.25 s and at exit with per map: connections, bytes up (client → target) and down.
Importable: :func:`serve` runs the same in a running asyncio loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Map", "serve", "parse_map"]


@dataclass
class Map:
    name: str
    listen: tuple[str, int]
    target: tuple[str, int]
    connections: int = 0
    up: int = 0  # client -> target
    down: int = 0  # target -> client
    open: set[Any] = field(default_factory=set)

    def stats(self) -> dict[str, int]:
        return {"connections": self.connections, "up": self.up, "down": self.down}


def _hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host, int(port)


def parse_map(spec: str) -> Map:
    name, _, rest = spec.rpartition("@")
    listen, _, target = rest.partition("=")
    return Map(name or rest, _hostport(listen), _hostport(target))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, m: Map, up: bool) -> None:
    """Read chunks, forward each `delay` s after it was read (a queue keeps them in order)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            if up:
                m.up += len(data)
            else:
                m.down += len(data)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                break
    except (ConnectionError, OSError):
        await queue.put((time.monotonic() + delay, b""))
    await sender


async def _handle(m: Map, delay: float, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
    m.connections += 1
    try:
        tr, tw = await asyncio.open_connection(*m.target)
    except OSError:
        cw.close()
        return
    m.open.add(cw)
    try:
        await asyncio.gather(_pipe(cr, tw, delay, m, True), _pipe(tr, cw, delay, m, False))
    finally:
        m.open.discard(cw)
        for w in (cw, tw):
            w.close()


async def serve(maps: list[Map], delay: float, stats: str | None = None, stop: asyncio.Event | None = None) -> None:
    """Listen on every map's address until `stop` is set (or forever)."""
    servers = [
        await asyncio.start_server(lambda r, w, m=m: _handle(m, delay, r, w), m.listen[0], m.listen[1], reuse_address=True)
        for m in maps
    ]
    stop = stop or asyncio.Event()

    def dump() -> None:
        if stats:
            tmp = f"{stats}.tmp"
            with open(tmp, "w") as f:
                json.dump({m.name: m.stats() for m in maps}, f)
            os.replace(tmp, stats)

    try:
        while not stop.is_set():
            dump()
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
    finally:
        for s in servers:
            s.close()
        for m in maps:
            for w in list(m.open):
                w.close()
        dump()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", type=float, default=0.0, help="one-way delay in seconds, each direction")
    ap.add_argument("--map", action="append", required=True, help="[name@]LISTEN_HOST:PORT=TARGET_HOST:PORT")
    ap.add_argument("--stats", help="a JSON file rewritten every 0.25 s with the byte counts")
    a = ap.parse_args()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve([parse_map(s) for s in a.map], a.delay, a.stats, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
