"""Where a link's batches end: cuts at source-transaction boundaries, as pure functions of plain data.

A puller reads, at the source, every replicated table's change-log entries past its watermarks.
On a dialect whose positions are one site-wide order (a change-log entry's position is a tick of
the site's clock, docs/concepts.md "Many writers"), each entry is ``(position, group)``: its
position, and the source transaction it belongs to (``group``; None: an entry whose transaction is
not known, a group of its own). Every position below the source's horizon is final; an entry at or
past it may belong to a transaction that is still running, or to one that committed after entries
below the horizon were written.

:func:`plan_cuts` returns the cuts: batch ``i`` holds the entries with ``cuts[i-1] <= position <
cuts[i]`` (``cuts[-1]`` is the lowest position before the first); entries at or past the last cut
are held back for a later refresh. The rules (docs/transactions.md):

- **No transaction is split.** A cut ``c`` is *clean* when no group has an entry below ``c`` and
  one at or past it. Every cut returned is clean.
- **Held back whole.** A group with an entry at or past the horizon is held back, all of it; so is
  every entry at or past its first position (a watermark is one position per table: nothing above
  an entry left behind may be taken).
- **Nothing skipped, nothing twice.** The batches are consecutive, disjoint, and hold exactly the
  entries below the last cut.
- **Progress.** The last cut is the highest clean cut at most the horizon: whenever a transaction
  committed entirely below the horizon precedes every transaction that is held back, it is taken.
- **Size.** A batch holds at most `limit` entries, and as many whole stretches (entries between
  two consecutive clean cuts) as fit; a stretch larger than `limit` (one large transaction, or
  transactions interleaved with it) is a batch of its own: a batch may exceed `limit`, it never
  splits a transaction.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["plan_cuts", "clean", "stream_step", "Step", "batch_txn", "is_batch_txn", "source_txn"]

# ---- a batch's own name for the changes that came without a source transaction
#
# A site that records source transactions (PostgreSQL, MariaDB) stores every change a peer that
# records none (SQLite) sends it under the name of the batch that stored it, a read of whole
# transactions: what it relays of them keeps that name in its change log, so the cuts downstream
# (plan_cuts) never split one of them. The name covers the whole batch, though — a SQLite link's
# backlog, the changes of other origins it relays included —, so it is no source transaction: the
# error queue's unit stays the change alone (core/errorqueue.py group_key, docs/errors.md).
#
# The name is 32 lowercase hex digits, the form it has always had, which no
# source transaction's id has: PostgreSQL's is a decimal number of at most 20 digits, MariaDB's
# '<connection>:<epoch>.<trx>' holds a ':' (a new dialect's must not be 32 hex digits either).

_BATCH_TXN = re.compile(r"[0-9a-f]{32}\Z")


def batch_txn() -> str:
    """A new batch's name for the changes it stores without a source transaction."""
    return uuid.uuid4().hex


def is_batch_txn(txn: Any) -> bool:
    """Whether `txn` is a batch's name (:func:`batch_txn`), not a source transaction's id."""
    return isinstance(txn, str) and _BATCH_TXN.match(txn) is not None


def source_txn(txn: Any) -> str | None:
    """The source transaction `txn` names, as text: None when it names none (None, or a batch's
    name: the source recorded no transaction)."""
    return None if txn is None or is_batch_txn(txn) else str(txn)


def _spans(entries: Sequence[tuple[int, Hashable | None]]) -> dict[Hashable, tuple[int, int]]:
    """Per known group, its lowest and highest position."""
    spans: dict[Hashable, tuple[int, int]] = {}
    for pos, g in entries:
        if g is None:
            continue
        lo, hi = spans.get(g, (pos, pos))
        spans[g] = (min(lo, pos), max(hi, pos))
    return spans


def clean(entries: Sequence[tuple[int, Hashable | None]], cut: int) -> bool:
    """Whether no group has an entry below `cut` and another at or past it."""
    return all(not (lo < cut <= hi) for lo, hi in _spans(entries).values())


def plan_cuts(entries: Sequence[tuple[int, Hashable | None]], horizon: int | None, limit: int) -> list[int]:
    """The ends (exclusive) of the batches to apply, in order; [] when nothing can be taken yet.

    `entries`: (position, group) of every entry read past the watermarks, in any order, including
    those at or past `horizon` (they tell which transactions continue there). `horizon` None: every
    entry read is final. `limit`: the entries a batch should hold at least before it may end."""
    if not entries:
        return []
    spans = _spans(entries)
    end = horizon if horizon is not None else max(p for p, _ in entries) + 1
    for lo, hi in spans.values():
        if hi >= end:  # continues at or past the horizon: held back, and everything after its start
            end = min(end, lo)
    # by position; entries at one position keep their order (stream_step puts its marks last)
    below = sorted(((p, g) for p, g in entries if p < end), key=lambda e: e[0])
    cuts: list[int] = []
    reach = -1  # the highest position of a group begun since the last clean cut
    count = 0  # entries of the current batch, in whole stretches
    stretch = 0  # entries since the last clean cut
    last_clean: int | None = None  # the last clean cut (exclusive end), None before the first
    for i, (pos, g) in enumerate(below):
        reach = max(reach, pos if g is None else spans[g][1])
        stretch += 1
        if reach <= pos:  # every group begun so far ends here: a cut after this entry is clean
            if count and count + stretch > max(limit, 1) and last_clean is not None:
                cuts.append(last_clean)  # the stretch would overfill the batch: it starts the next
                count = 0
            count += stretch
            stretch = 0
            last_clean = below[i + 1][0] if i + 1 < len(below) else pos + 1
    if last_clean is not None and (not cuts or last_clean > cuts[-1]):
        cuts.append(last_clean)
    return cuts


#: the group of the entries a stretch took in earlier pieces (stream_step): one group spanning from
#: before the read to the stretch's reach
_STRETCH = ("", "stretch taken before this read")


@dataclass(frozen=True)
class Step:
    """What stream_step decided for one read (positions exclusive ends):

    - ``batches``: take the batches ending at `cuts` (plan_cuts), each in a target transaction;
    - ``piece``: a transaction continues past the read's window: take every entry below
      ``cuts[0]`` (the window's end) as a piece of a stretch, in the target transaction that will
      hold the whole stretch, and read on from there; `reach` is then the highest position of a
      transaction the stretch has taken part of (it cannot end at or below it);
    - ``finish``: the stretch ends: take the entries below ``cuts[0]`` (none when `cuts` is empty)
      and commit the target transaction;
    - ``grow``: nothing can be taken and the reader cannot tell where the transaction that fills
      the window ends (no `reach`): read again with a larger window;
    - ``hold``: nothing can be taken now (the source's horizon holds it back); in a stretch, the
      stretch is abandoned (its target transaction rolled back) and read again later."""

    kind: str
    cuts: list[int] = field(default_factory=list)
    reach: int | None = None


def stream_step(
    entries: Sequence[tuple[int, Hashable | None]],
    horizon: int | None,
    end: int | None,
    continuing: Collection[Hashable],
    beyond: int | None,
    limit: int,
    reach: int | None = None,
) -> Step:
    """Decide what to take of one read of a link (docs/transactions.md "Large transactions").

    `entries`: (position, group) of every entry read past the watermarks, those at or past the
    window's end and the horizon included. `end`: the end of the read's window (None: the read was
    not cut: every entry past the watermarks was read). `continuing`: the groups read below `end`
    that have entries past what was read, and `beyond` the highest position of any of those (None
    when the reader does not know it: `continuing` empty, or an agent that does not send it).
    `reach`: None outside a stretch; in a stretch, the highest position of a group it took part
    of (so no cut at or below it is clean). `limit`: plan_cuts' batch size."""
    bound = horizon if end is None else end if horizon is None else min(horizon, end)
    extra: list[tuple[int, Hashable | None]] = [(end, g) for g in continuing] if end is not None else []
    if reach is not None:
        if not entries:
            return Step("finish")  # every entry past the watermarks was taken
        start = min(p for p, _ in entries) - 1
        extra += [(start, _STRETCH), (max(reach, start), _STRETCH)]
    if bound is None:  # every entry read is final and the read was whole
        top = max((p for p, _ in entries), default=None)
        if top is None:
            return Step("hold")
        return Step("finish" if reach is not None else "batches", [top + 1])
    cuts = plan_cuts([*entries, *extra], bound, limit)
    if cuts:
        return Step("finish", [cuts[-1]]) if reach is not None else Step("batches", cuts)
    if end is None or (horizon is not None and horizon <= end):
        return Step("hold")  # the horizon holds back what the read holds, not the window
    taken = {g for p, g in entries if p < end and g is not None}
    if continuing and beyond is None:
        return Step("hold") if reach is not None else Step("grow")
    top = max((p for p, g in entries if (p < end and g is None) or g in taken), default=-1)
    new_reach = max(top, -1 if beyond is None else beyond, -1 if reach is None else reach)
    if horizon is not None and new_reach >= horizon:
        return Step("hold")  # the stretch would have to take entries at or past the horizon
    if not any(p < end for p, _ in entries):
        return Step("hold")
    return Step("piece", [end], new_reach)
