"""The words for a change a site refused because a key or UNIQUE column's collation (or type)
takes two different texts as one value (SQLite NOCASE / RTRIM, PostgreSQL citext and
nondeterministic collations; docs/types.md "Keys that compare loosely"). MariaDB's own is in
dialects/mysql/dialect.py."""

from __future__ import annotations

from typing import Callable, Sequence

from multimaster.dialects.schema import Column, TableInfo

__all__ = ["explain"]


def explain(
    info: TableInfo,
    cols: Sequence[str],
    value: str | None,
    held: Sequence[str],
    fix: Callable[[Column], str],
    doc: str,
) -> str | None:
    """The value refused (when the database's message names it), the values rows here hold that it
    equals, each loose column's collation and what it merges, and the fix; None when no column of
    `cols` compares loosely (a real duplicate: the database's message is kept)."""
    by = {c.name: c for c in (info.key, *info.columns)}
    loose = [by[c] for c in cols if c in by and by[c].collation is not None and by[c].collation.merges]  # type: ignore[union-attr]
    if not loose:
        return None
    what = f"{info.name}.{cols[0]}" if len(cols) == 1 else f"{info.name} ({', '.join(cols)})"
    said = f"{what} = {value!r}" if value is not None else f"{what}: the value refused"
    same = f" the same value as {', '.join(repr(h) for h in held)}, which a row here holds," if held else " a duplicate"
    sides = "; ".join(f"{c.name}'s collation {c.collation.shown} takes {c.collation.merges} as one value" for c in loose)  # type: ignore[union-attr]
    return (
        f"{said} is{same} under the column's collation, not as text: {sides}, where the other databases and "
        f"multimaster compare texts exactly ({doc}). Fix: make the column compare exactly here "
        f"({'; '.join(fix(c) for c in loose)}), then retry the change; or change one of the two values at its "
        "origin and skip this one"
    )
