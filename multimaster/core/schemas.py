"""Schema changes at a running site (docs/schema-changes.md, docs/design/schema-changes.md): pure
rules on plain data.

A site's capture writes each change-log entry in the *layout* of the schema version its triggers
were made for: bit *i* of the mask and the *i*-th ``n_`` / ``o_`` value belong to the *i*-th name
of that version's column list (sorted by name). Sites change their schemas at different times, so
an entry is carried to another site by column NAME (:func:`translate`): a column the receiving
site has and the entry's version lacks is left out (an insert takes the receiving site's default);
a column the entry carries and the receiving site dropped is dropped there; a column the entry
needs and the receiving site does not have yet makes the change wait (its values kept apart,
`pending`) until the site has it. :func:`evolution` tells what a site's new schema changes and
refuses what cannot be done online.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = [
    "Col",
    "Translated",
    "translate",
    "Evolution",
    "evolution",
    "narrowing",
    "remap_mask",
    "literal_default",
    "encode_value",
    "decode_value",
    "encode_pending",
    "decode_pending",
]


@dataclass(frozen=True)
class Col:
    """A replicated column as a site declares it: its type as SQL of the site's database, whether
    it takes NULL, and whether it has a default."""

    name: str
    type_sql: str
    nullable: bool = True
    has_default: bool = False


@dataclass(frozen=True)
class Translated:
    """An entry in the receiving site's layout: the mask, the new and old values, and per column the
    receiving site does not have yet (and never had) the values the entry needs it for: the change
    waits for that column (`pending`, name -> (new, old))."""

    mask: int
    new: tuple[Any, ...]
    old: tuple[Any, ...]
    pending: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def translate(
    op: str,
    mask: int,
    new: Sequence[Any],
    old: Sequence[Any],
    src: Sequence[str],
    dst: Sequence[str],
    dropped: frozenset[str] | set[str] = frozenset(),
    defaults: Mapping[str, Any] | None = None,
) -> Translated:
    """Carry an entry from layout `src` (the column names of its version) to layout `dst` (the
    receiving site's current columns), by name.

    - a column both have: its bit and values move to its place in `dst`;
    - a column of `dst` that `src` lacks: left out of updates and deletes; an insert sets it to
      `defaults[name]` (the receiving site's default, None when it has none), so that rows a site
      without the column inserted hold what the site that adds it later gives its own rows;
    - a column of `src` that `dst` lacks: in `dropped` (the receiving site had it and dropped it)
      its value is dropped; otherwise the change *needs* it when it is an update of the column or
      an insert with a value other than NULL, and the values wait in `pending`. A delete needs no
      column."""
    at = {c: i for i, c in enumerate(dst)}
    n_out: list[Any] = [None] * len(dst)
    o_out: list[Any] = [None] * len(dst)
    m = 0
    pending: dict[str, tuple[Any, Any]] = {}
    for i, c in enumerate(src):
        if not (mask >> i) & 1:
            continue
        j = at.get(c)
        if j is not None:
            m |= 1 << j
            n_out[j], o_out[j] = new[i], old[i]
        elif c in dropped or op == "D":
            continue
        elif op == "U" or new[i] is not None:
            pending[c] = (new[i], old[i])
    if op == "I":
        have = set(src)
        for c, j in at.items():
            if c not in have:
                m |= 1 << j
                n_out[j] = (defaults or {}).get(c)
    return Translated(m, tuple(n_out), tuple(o_out), pending)


def remap_mask(mask: int, src: Sequence[str], dst: Sequence[str]) -> int:
    """`mask` of layout `src` in layout `dst` (columns `dst` lacks leave it)."""
    at = {c: i for i, c in enumerate(dst)}
    out = 0
    for i, c in enumerate(src):
        if (mask >> i) & 1 and c in at:
            out |= 1 << at[c]
    return out


@dataclass(frozen=True)
class Evolution:
    """What a site's schema change does to a replicated table's capture: the columns added, dropped
    and whose type changed, and the problems that make it unsafe online (each naming the column
    and what to do instead)."""

    added: tuple[str, ...]
    dropped: tuple[str, ...]
    retyped: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.added or self.dropped or self.retyped)


_INT_RANK = {"TINYINT": 1, "SMALLINT": 2, "INT2": 2, "MEDIUMINT": 3, "INT": 4, "INTEGER": 4, "INT4": 4, "BIGINT": 8, "INT8": 8}
_FLOAT_RANK = {"REAL": 4, "FLOAT4": 4, "FLOAT": 8, "DOUBLE": 8, "DOUBLEPRECISION": 8, "FLOAT8": 8}


def _base(t: str) -> str:
    return re.sub(r"\(.*\)", "", t.upper().replace(" ", "")).replace("UNSIGNED", "")


def _args(t: str) -> list[int]:
    m = re.search(r"\(([\d,\s]+)\)", t)
    return [int(x) for x in m.group(1).split(",")] if m else []


#: text types only MySQL and MariaDB name, beside whose TEXT (65,535 bytes) is not the widest
_MYSQL_TEXTS = frozenset({"TINYTEXT", "MEDIUMTEXT", "LONGTEXT"})


def _text_rank(t: str) -> int | None:
    b = _base(t)
    if b in ("TEXT", "CLOB", "STRING", "LONGTEXT"):
        return 1 << 32
    if b == "MEDIUMTEXT":
        return 1 << 24
    if b == "TINYTEXT":
        return 255
    if b in ("VARCHAR", "CHARACTERVARYING", "CHAR", "CHARACTER", "NVARCHAR", "NCHAR"):
        a = _args(t)
        return a[0] if a else (1 << 32 if "VAR" in b else 1)
    return None


def narrowing(old: str, new: str) -> bool:
    """Whether a column's type going from `old` to `new` (SQL of one site's database) may no longer
    hold every value the old type held: a shorter text, a smaller integer or float, fewer digits of
    a decimal, or a change of kind. The same type, or a wider one, is not."""
    if _base(old) == _base(new) and _args(old) == _args(new):
        return False
    to, tn = _text_rank(old), _text_rank(new)
    if to is not None and tn is not None:
        if {_base(old), _base(new)} & _MYSQL_TEXTS:  # MySQL's own names: its TEXT holds 65,535 bytes
            to, tn = (65_535 if _base(t) == "TEXT" else r for t, r in ((old, to), (new, tn)))
        return tn < to
    bo, bn = _base(old), _base(new)
    if bo in _INT_RANK and bn in _INT_RANK:
        return _INT_RANK[bn] < _INT_RANK[bo]
    if bo in _INT_RANK and bn in ("NUMERIC", "DECIMAL"):
        a = _args(new)
        return bool(a) and a[0] - (a[1] if len(a) > 1 else 0) < 19
    if bo in _FLOAT_RANK and bn in _FLOAT_RANK:
        return _FLOAT_RANK[bn] < _FLOAT_RANK[bo]
    if bo in ("NUMERIC", "DECIMAL") and bn in ("NUMERIC", "DECIMAL"):
        ao, an = _args(old), _args(new)
        if not an:
            return False
        if not ao:
            return True
        po, so = ao[0], ao[1] if len(ao) > 1 else 0
        pn, sn = an[0], an[1] if len(an) > 1 else 0
        return sn < so or pn - sn < po - so
    return True


def evolution(
    site: str,
    table: str,
    old: Sequence[Col],
    new: Sequence[Col],
    others_lacking: Mapping[str, Sequence[str]] | None = None,
) -> Evolution:
    """The change from the registered columns `old` to the columns `new` a site's table has now.

    Refused (problems): a column whose type was narrowed (values the other sites write may not fit);
    a new column NOT NULL without a default while some other site lacks it (`others_lacking`:
    column -> the sites whose registered schema lacks it): the rows those sites insert carry no
    value for it."""
    ob = {c.name: c for c in old}
    nb = {c.name: c for c in new}
    added = tuple(sorted(set(nb) - set(ob)))
    dropped = tuple(sorted(set(ob) - set(nb)))
    retyped = tuple(sorted(c for c in set(ob) & set(nb) if _norm(ob[c].type_sql) != _norm(nb[c].type_sql)))
    problems: list[str] = []
    for c in retyped:
        if narrowing(ob[c].type_sql, nb[c].type_sql):
            problems.append(
                f"site '{site}': column {table}.{c} was narrowed from {ob[c].type_sql} to {nb[c].type_sql}: values the other "
                f"sites write may not fit. Narrowing is not an online change: change it back (ALTER TABLE {table} ... {c} "
                f"{ob[c].type_sql}), or add a new column of the narrower type, copy the values, and drop the old one "
                "(docs/schema-changes.md)"
            )
    for c in added:
        col = nb[c]
        lacking = list((others_lacking or {}).get(c, ()))
        if not col.nullable and not col.has_default and lacking:
            problems.append(
                f"site '{site}': column {table}.{c} is NOT NULL without a default while site(s) {', '.join(sorted(lacking))} "
                f"still write rows without it: their inserts could not be applied here. Give it a default "
                f"(ALTER TABLE {table} ALTER COLUMN {c} SET DEFAULT ...) or make it nullable, add it at every site, and "
                "make it NOT NULL only once every site has it (docs/schema-changes.md)"
            )
    return Evolution(added, dropped, retyped, tuple(problems))


def _norm(t: str) -> str:
    return t.upper().replace(" ", "")


_NUM = re.compile(r"^[+-]?\d+$")
_DEC = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def literal_default(sql: str | None) -> tuple[bool, Any]:
    """A column default as a database reports it ('red', 'red'::text, 0, '0'::numeric, NULL,
    true): (True, its value) when it is a constant, (False, None) when it is an expression (a
    function call: now(), nextval(...))."""
    if sql is None:
        return False, None
    s = sql.strip()
    while s.startswith("(") and s.endswith(")"):
        s = s[1:-1].strip()
    s = re.sub(r"(::[\w\s\"\[\]]+(\(\d+(,\s*\d+)?\))?)+$", "", s).strip()
    if s.upper() == "NULL":
        return True, None
    if s.lower() in ("true", "false"):
        return True, s.lower() == "true"
    if len(s) >= 2 and s[0] == "'" and s[-1] == "'" and "'" not in s[1:-1].replace("''", ""):
        return True, s[1:-1].replace("''", "'")
    if _NUM.match(s):
        return True, int(s)
    if _DEC.match(s):
        from decimal import Decimal

        return True, Decimal(s)
    return False, None


def encode_value(v: Any) -> Any:
    """A value as JSON that :func:`decode_value` gives back with its Python type (the values a
    change waiting for a column keeps, `pending`)."""
    import base64
    import datetime as dt
    from decimal import Decimal
    from uuid import UUID

    if v is None or isinstance(v, bool):
        return {"b": v} if isinstance(v, bool) else None
    if isinstance(v, int):
        return {"i": str(v)}
    if isinstance(v, float):
        return {"f": repr(v)}
    if isinstance(v, Decimal):
        return {"d": str(v)}
    if isinstance(v, str):
        return {"s": v}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"x": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, dt.datetime):
        return {"ts": v.isoformat()}
    if isinstance(v, dt.date):
        return {"da": v.isoformat()}
    if isinstance(v, dt.time):
        return {"tm": v.isoformat()}
    if isinstance(v, dt.timedelta):
        return {"td": [v.days, v.seconds, v.microseconds]}
    if isinstance(v, UUID):
        return {"s": str(v)}
    return {"j": v}  # JSON documents (dict, list) as the driver returned them


def decode_value(e: Any) -> Any:
    """The value :func:`encode_value` encoded."""
    import base64
    import datetime as dt
    from decimal import Decimal

    if e is None:
        return None
    ((k, v),) = e.items()
    if k == "b":
        return bool(v)
    if k == "i":
        return int(v)
    if k == "f":
        return float(v)
    if k == "d":
        return Decimal(v)
    if k == "s":
        return v
    if k == "x":
        return base64.b64decode(v)
    if k == "ts":
        return dt.datetime.fromisoformat(v)
    if k == "da":
        return dt.date.fromisoformat(v)
    if k == "tm":
        return dt.time.fromisoformat(v)
    if k == "td":
        return dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
    return v


def encode_pending(pending: Mapping[str, tuple[Any, Any]]) -> str:
    """`pending` (column -> (new, old)) as the snapshot's `pending` text."""
    import json

    return json.dumps({c: [encode_value(n), encode_value(o)] for c, (n, o) in sorted(pending.items())})


def decode_pending(text: str) -> dict[str, tuple[Any, Any]]:
    import json

    return {c: (decode_value(n), decode_value(o)) for c, (n, o) in json.loads(text).items()}
