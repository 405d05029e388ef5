"""Foreign keys between replicated tables, as pure decisions (docs/foreign-keys.md).

A reference to a row of a renumbered table is carried by the referenced row's identity (the
change log's ``f_<col>``) and resolved to its key at the applying site. What this module decides:

- :func:`fk_order`: the order tables are refreshed in, parents before children;
- :func:`waiting`: which changes of a batch wait for a referenced identity this site does not hold
  yet (and, in order, the later changes of their origin);
- :func:`orphan_action`: what becomes of a row whose referenced row was deleted (delete wins).

Nothing here touches a database; ``multimaster.engine.references`` reads the inputs and carries
the decisions out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

__all__ = ["Ref", "RefChange", "fk_order", "waiting", "orphan_action", "REFUSED_ON_UPDATE"]

#: ON UPDATE actions a reference to a renumbered table cannot have: the framework moves keys, and
#: these would null, reset or refuse the reference instead of following it
REFUSED_ON_UPDATE = ("SET NULL", "SET DEFAULT", "RESTRICT")


@dataclass(frozen=True)
class Ref:
    """One declared single-column foreign key of a replicated table to the key of a renumbered
    replicated table (`parent`; itself for a self-reference)."""

    column: str
    parent: str
    on_delete: str = "NO ACTION"  # upper case: CASCADE, SET NULL, SET DEFAULT, RESTRICT, NO ACTION
    on_update: str = "NO ACTION"
    name: str | None = None  # the constraint's name, when the database gives one


@dataclass(frozen=True)
class RefChange:
    """What :func:`waiting` needs of one change: its version, origin, identity, operation and the
    (parent table, identity) of each reference it sets (None where it sets none)."""

    ver: str
    origin: str
    rid: str
    op: str
    refs: tuple[tuple[str, str], ...]


def fk_order(tables: Sequence[str], parents: Mapping[str, Iterable[str]]) -> list[str]:
    """`tables` ordered so that every table comes after the tables it references (`parents[t]`),
    keeping the given order otherwise. Self-references are ignored; tables of a cycle keep their
    given order among themselves (a reference that cannot be ordered waits at apply instead)."""
    given = {t: i for i, t in enumerate(tables)}
    deps = {t: {p for p in parents.get(t, ()) if p in given and p != t} for t in tables}
    out: list[str] = []
    done: set[str] = set()
    visiting: set[str] = set()

    def visit(t: str) -> None:
        if t in done or t in visiting:
            return  # done, or a cycle: keep the given order
        visiting.add(t)
        for p in sorted(deps[t], key=given.__getitem__):
            visit(p)
        visiting.discard(t)
        done.add(t)
        out.append(t)

    for t in tables:
        visit(t)
    return out


def waiting(table: str, changes: Sequence[RefChange], known: Mapping[str, set[str]] | None = None) -> set[str]:
    """The versions of `changes` (of `table`, in version order) that must wait.

    A change waits when it sets a reference to an identity this site does not hold (`known[parent]`,
    the identities of the parent's shadow, deleted ones included) and that no earlier change of the
    batch inserts (a self-reference to a row inserted by the same batch, itself not waiting). The
    later changes of a waiting change's origin wait too: an origin's changes are applied in version
    order (the duplicate filter keeps the highest version applied per origin)."""
    known = known or {}
    held: set[str] = set()
    out: set[str] = set()
    inserted: set[str] = set()
    for ch in changes:
        if ch.origin in held:
            out.add(ch.ver)
            continue
        missing = any(rid not in known.get(p, set()) and not (p == table and rid in inserted) for p, rid in ch.refs)
        if missing:
            out.add(ch.ver)
            held.add(ch.origin)
            continue
        if ch.op == "I":
            inserted.add(ch.rid)
    return out


def orphan_action(on_delete: str) -> str:
    """What becomes of a row whose referenced row is deleted (delete wins, at every site alike):
    ``"null"`` (ON DELETE SET NULL), ``"default"`` (SET DEFAULT) or ``"delete"`` (CASCADE,
    RESTRICT, NO ACTION: the row goes too, and the conflict log says so)."""
    a = " ".join(on_delete.upper().split())
    if a == "SET NULL":
        return "null"
    if a == "SET DEFAULT":
        return "default"
    return "delete"
