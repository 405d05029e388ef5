"""Keys of renumbered tables, as pure functions of plain data (docs/concepts.md, "Keys").

A renumbered row's key is ``base + rank`` of its identity among every identity the sites know,
deleted ones included. A site does not count that rank again from what its shadow holds: a purge
drops tombstones (docs/operations.md "Tombstones and the conflict log") and leaves every other
identity at its key, so the keys the shadow holds are the truth and the shadow's own ranks are not.
What a site may decide is only:

- :func:`rank_moves`: the keys of identities above ``floor`` (drawn by local inserts from a key
  counter where writers capture concurrently, not yet ranked) become ``floor + 1``, ``floor + 2``,
  ... in identity order. Every identity above the floor is one the site inserted since it last
  ranked, so no other site ranks any identity between them; a purge never drops one of them
  (ops/retention.py), so none is missing from the count;
- :func:`remade`: a table made again (docs/schema-changes.md "A table made again"): every row an
  identity holds keeps its key; the rows no capture saw (no live identity holds their key, or the
  one that does had its insert held) are taken out and inserted again as local inserts, taking
  the next keys past every identity's;
- :func:`key_differences`: the identities two sites hold at different keys that nothing on its way
  explains: the sites diverged, and no site can tell which key is right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Collection, Iterable, Mapping, Sequence

__all__ = ["Remade", "rank_moves", "ranked", "remade", "key_differences"]


def rank_moves(known: Iterable[tuple[str, int]], floor: int) -> list[tuple[str, int, int]]:
    """(identity, key, new key) for every identity of `known` (identity, key) whose key is above
    `floor` and is not yet ``floor + its place among them`` in identity order."""
    above = sorted((rid, key) for rid, key in known if key > floor)
    return [(rid, key, floor + i) for i, (rid, key) in enumerate(above, 1) if key != floor + i]


def ranked(known: Mapping[str, int], floor: int | None) -> dict[str, int]:
    """`known` (identity -> key) with the moves of :func:`rank_moves` made (`floor` None: every
    key is a rank already, as where the database ranks each local insert itself)."""
    out = dict(known)
    if floor is not None:
        for rid, _old, new in rank_moves(known.items(), floor):
            out[rid] = new
    return out


@dataclass(frozen=True)
class Remade:
    """What becomes of a renumbered table made again at a site."""

    #: (identity, key, new key): identities whose key was drawn and not yet ranked
    moves: list[tuple[str, int, int]]
    #: keys of the rows no capture saw, in key order: taken out and inserted again under capture
    unseen: list[int]
    #: the keys those rows take, in the same order (the next keys, as local inserts)
    placed: list[int]


def remade(
    known: Mapping[str, tuple[int, bool]], rows: Iterable[int], held: Collection[str], floor: int | None, base: int
) -> Remade:
    """The keys of a renumbered table made again. `known`: identity -> (key, deleted) of every
    identity the shadow holds; `rows`: the table's keys; `held`: identities whose insert is held in
    the error queue (they keep their key, and no row is theirs); `floor`: the key up to which every
    key is a rank (None: all are); `base`: the table's base. Every identity keeps its key (but for
    the ranking of drawn keys above `floor`); the other rows are inserted again past them all."""
    live = {key: rid for rid, (key, dead) in known.items() if not dead}
    unseen = sorted(k for k in set(rows) if k not in live or live[k] in held)
    moves = rank_moves(((rid, key) for rid, (key, _dead) in known.items()), floor) if floor is not None else []
    keys = {rid: key for rid, (key, _dead) in known.items()}
    for rid, _old, new in moves:
        keys[rid] = new
    top = max([base, *keys.values()])
    return Remade(moves, unseen, list(range(top + 1, top + 1 + len(unseen))))


def key_differences(here: Mapping[str, int], there: Mapping[str, int], on_way: AbstractSet[str]) -> list[tuple[str, int, int]]:
    """(identity, key here, key there) of the identities both sites hold (`here`, `there`:
    identity -> key, ranked, deleted ones included) at different keys, where no identity one of
    them lacks and a change on its way (`on_way`) brings ranks at or below it (such an identity
    moves the keys above it at the site that lacks it, until it lands). An identity one site lacks
    with nothing on its way was purged there (it moves no key) or never reached it (a divergence of
    its own, which moves keys: those keys differ for good)."""
    coming = [rid for rid in on_way if (rid in here) != (rid in there)]
    lowest = min(coming, default=None)
    both: Sequence[str] = sorted(here.keys() & there.keys())
    return [(r, here[r], there[r]) for r in both if here[r] != there[r] and (lowest is None or r < lowest)]
