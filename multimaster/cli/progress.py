"""Progress of the long commands (refresh, init, add-site) on stderr, and the lock waits they meet
(docs/cli.md "Progress and lock waits"). On a terminal: Rich progress bars, one per link or copied
table, with the lines above them. Elsewhere (a pipe, a CI log, a file): plain lines, a link's or
table's progress at most once every MM_PROGRESS_EVERY seconds (default 5), as `status --watch`
prints anew instead of redrawing. stdout keeps only the command's result (`--json` stays JSON)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bars

from multimaster.cli.common import err
from multimaster.core.progress import ProgressEvent, progress_detail, progress_line

__all__ = ["Reporter", "plain_every"]

#: the environment variable setting the seconds between two plain progress lines of one task
EVERY_ENV = "MM_PROGRESS_EVERY"
DEFAULT_EVERY = 5.0


def plain_every() -> float:
    """Seconds between two plain progress lines of one link or table (MM_PROGRESS_EVERY; 0: a
    line per batch)."""
    v = os.environ.get(EVERY_ENV, "").strip()
    try:
        return max(0.0, float(v)) if v else DEFAULT_EVERY
    except ValueError:
        return DEFAULT_EVERY


class Reporter:
    """A command's `progress=` callback (a context manager around the command): pull and copy
    events drawn as bars on a terminal, else printed as plain lines at most every `every`
    seconds per task; lock waits and steps (plain messages) always one line each. Called from the
    engine's lock watch threads too."""

    def __init__(self, out: Console | None = None, *, bars: bool | None = None, every: float | None = None):
        self.out = out or err
        self.bars = self.out.is_terminal if bars is None else bars
        self.every = plain_every() if every is None else every
        self._lock = threading.Lock()
        self._bars: Bars | None = None
        self._tasks: dict[tuple[str, str | None, str], TaskID] = {}
        self._last: dict[tuple[str, str | None, str], float] = {}

    def __enter__(self) -> Reporter:
        if self.bars:
            self._bars = Bars(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self.out,
                transient=True,
            )
            self._bars.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bars is not None:
            self._bars.stop()
            self._bars = None

    def __call__(self, e: ProgressEvent | str) -> None:
        with self._lock:
            if isinstance(e, str):
                self._line(e, "dim")
            elif e.kind in ("pull", "copy"):
                self._progress(e)
            else:
                self._line(e.text, "yellow" if e.kind == "wait" else "green")

    def _progress(self, e: ProgressEvent) -> None:
        if self._bars is not None:
            task = self._tasks.get(e.key)
            desc = f"{e.subject}{' ' + e.table if e.table else ''}"
            if task is None:
                self._tasks[e.key] = self._bars.add_task(desc, total=e.total, completed=e.done, detail=progress_detail(e))
            else:
                self._bars.update(task, total=e.total, completed=e.done, detail=progress_detail(e))
            return
        now = time.monotonic()
        last = self._last.setdefault(e.key, now - e.seconds)  # the task's start
        if now - last >= self.every:
            self._last[e.key] = now
            self._line(progress_line(e), None)

    def _line(self, text: str, style: str | None) -> None:
        out = self._bars.console if self._bars is not None else self.out
        out.print(text, style=style, markup=False, highlight=False, soft_wrap=True)
        if self._bars is None:
            out.file.flush()
