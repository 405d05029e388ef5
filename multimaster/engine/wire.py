"""What a site agent (docs/agent.md) and its clients exchange: values typed so that every column
value a driver returns crosses HTTP exactly, and the layout of a target's table that the agent's
read of its change log is computed in.

Values are JSON. JSON's own null, booleans, integers (any size) and strings stand for themselves;
every other value is a one-key object naming its type: ``{"$b": base64}`` bytes, ``{"$n":
"12.30"}`` a Decimal (its exponent kept), ``{"$f": "0.1"}`` a float (repr: exact, and nan / inf),
``{"$dt": iso}`` a datetime (its offset kept), ``{"$d": iso}`` a date, ``{"$t": iso}`` a time,
``{"$td": [days, seconds, microseconds]}`` a timedelta, ``{"$u": "…"}`` a UUID, ``{"$j": value}``
a JSON document a driver decoded, read back as its text (multimaster carries JSON as its text,
dialects/types.py json_text; an older agent sent PostgreSQL's json / jsonb decoded). Nothing else is a
JSON object on the wire, so decoding is unambiguous.

Plain data built of such values (the rows of a listing: str-keyed dicts and lists, nested) goes
through :func:`data_out` / :func:`data_in`: a dict as ``{"$m": {key: item}}``, a list as a list,
every other value as :func:`encode` makes it.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from dataclasses import fields, replace
from decimal import Decimal
from typing import Any

from sqlalchemy import types as sqltypes

from multimaster.core.planner import TableSpec
from multimaster.core.references import Ref
from multimaster.core.unique import UniqueSet
from multimaster.dialects.schema import Collation, Column, TableInfo
from multimaster.dialects.types import kind_of

__all__ = [
    "encode",
    "decode",
    "data_out",
    "data_in",
    "dumps",
    "loads",
    "layout_of",
    "info_of",
    "description_of",
    "described",
    "piece_out",
    "piece_in",
    "PROTOCOL",
]

#: the version of the agent's protocol: a client and an agent of different versions refuse each other
#: (2: add-site's endpoints, the copy and the reads it makes at its sources; 3: change-log entries
#: carry ``sup``, the heads a change superseded, last in a pulled row and in the copy's log and
#: snapshot rows)
PROTOCOL = 3


def encode(v: Any) -> Any:
    """One value as JSON-ready data (see the module docstring)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"$f": repr(v)}
    if isinstance(v, Decimal):
        return {"$n": str(v)}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, dt.datetime):  # before date: a datetime is a date
        return {"$dt": v.isoformat()}
    if isinstance(v, dt.date):
        return {"$d": v.isoformat()}
    if isinstance(v, dt.time):
        return {"$t": v.isoformat()}
    if isinstance(v, dt.timedelta):
        return {"$td": [v.days, v.seconds, v.microseconds]}
    if isinstance(v, uuid.UUID):
        return {"$u": str(v)}
    if isinstance(v, (dict, list)):
        return {"$j": v}
    if isinstance(v, tuple):
        return [encode(x) for x in v]
    raise TypeError(f"a value of type {type(v).__name__} cannot be sent by the agent: {v!r}")


def decode(v: Any) -> Any:
    """The value `encode` made JSON-ready data of."""
    if not isinstance(v, dict):
        if isinstance(v, list):
            return tuple(decode(x) for x in v)
        return v
    ((tag, x),) = v.items()
    if tag == "$f":
        return float(x)
    if tag == "$n":
        return Decimal(x)
    if tag == "$b":
        return base64.b64decode(x)
    if tag == "$dt":
        return dt.datetime.fromisoformat(x)
    if tag == "$d":
        return dt.date.fromisoformat(x)
    if tag == "$t":
        return dt.time.fromisoformat(x)
    if tag == "$td":
        return dt.timedelta(days=x[0], seconds=x[1], microseconds=x[2])
    if tag == "$u":
        return uuid.UUID(x)
    if tag == "$j":
        return json.dumps(x, ensure_ascii=False, separators=(",", ":"))  # a JSON value is its text (dialects/types.py json_text)
    raise ValueError(f"unknown value type {tag!r} on the wire")


def data_out(v: Any) -> Any:
    """Plain data (str-keyed dicts and lists, nested, of values `encode` takes) as JSON-ready data."""
    if isinstance(v, dict):
        return {"$m": {str(k): data_out(x) for k, x in v.items()}}
    if isinstance(v, list):
        return [data_out(x) for x in v]
    return encode(v)


def data_in(v: Any) -> Any:
    """The plain data `data_out` made JSON-ready data of."""
    if isinstance(v, list):
        return [data_in(x) for x in v]
    if isinstance(v, dict) and len(v) == 1 and "$m" in v:
        return {k: data_in(x) for k, x in v["$m"].items()}
    return decode(v)


def dumps(obj: Any) -> str:
    """JSON of plain data (dicts of str keys, lists, JSON scalars): no value encoding."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def loads(text: str | bytes) -> Any:
    return json.loads(text)


def row_out(r: tuple[Any, ...], trim: bool = False) -> list[Any] | int:
    """`r` encoded; `trim`: without its trailing Nones, and a position-only entry of a pull (seq2,
    op2 'A', seq, then nothing: the target has the change) whose seq2 is its seq — the
    second-order log is a view over the change log — as the bare integer; row_in pads."""
    n = len(r)
    if trim:
        while n and r[n - 1] is None:
            n -= 1
        if n == 3 and r[1] == "A" and r[0] == r[2] and type(r[0]) is int:
            return r[0]
    return [encode(x) for x in r[:n]]


def row_in(r: list[Any] | int, width: int | None = None) -> tuple[Any, ...]:
    """A row row_out encoded; `width`: padded with Nones to it (rows sent trimmed)."""
    out = (r, "A", r) if isinstance(r, int) else tuple(decode(x) for x in r)
    return out if width is None or len(out) >= width else out + (None,) * (width - len(out))


def pulled_width(info: TableInfo) -> int:
    """The number of values in each row engine/pull.py read_entries returns for `info`: seq2, op2,
    seq, ver, origin, op, rid, key, mask, the new and old values, the references' identities, txn,
    pending and sup."""
    return 9 + 2 * len(info.columns) + 2 * len(info.refs) + 3


def layout_of(info: TableInfo) -> dict[str, Any]:
    """What of a target's table the source's read of its change log depends on (engine/pull.py
    read_entries, entry_groups): its name, its replicated columns (with their constant defaults),
    the references' columns and the columns it dropped."""
    return {
        "name": info.name,
        "key": info.key.name,
        "columns": [[c.name, encode(c.default)] for c in info.columns],
        "refs": [[r.column, r.parent] for r in info.refs],
        "dropped": sorted(info.dropped),
    }


def info_of(layout: dict[str, Any]) -> TableInfo:
    """A TableInfo holding what `layout_of` sent (the rest: placeholders nothing on the read path
    reads)."""
    cols = tuple(Column(str(n), None, "", True, default is not None, decode(default)) for n, default in layout["columns"])
    names = tuple(c.name for c in cols)
    key = Column(str(layout["key"]), None, "", False)
    return TableInfo(
        name=str(layout["name"]),
        key=key,
        columns=cols,
        excluded=(),
        spec=TableSpec(str(layout["name"]), key.name, True, names, ()),
        refs=tuple(Ref(str(c), str(p)) for c, p in layout["refs"]),
        dropped=frozenset(str(c) for c in layout["dropped"]),
    )


#: a SQLAlchemy type standing for each kind of column (dialects/types.py kind_of gives the kind
#: back for it): what a described column carries instead of the type the site reflected
_KIND_TYPES: dict[str | None, Any] = {
    "bool": sqltypes.Boolean,
    "int": sqltypes.Integer,
    "float": sqltypes.Float,
    "decimal": sqltypes.Numeric,
    "timestamp": sqltypes.DateTime,
    "timestamptz": lambda: sqltypes.DateTime(timezone=True),
    "date": sqltypes.Date,
    "json": sqltypes.JSON,
    "bytes": sqltypes.LargeBinary,
    "text": sqltypes.Text,
}


def description_of(info: TableInfo, dialect: str) -> dict[str, Any]:
    """What add-site compares of a peer's table with the new site's (engine/schema.py
    compare_schemas): its key and columns (name, declared type, kind of value, nullable, default),
    UNIQUE sets, references, schema version and dropped columns; and the collation of each text
    column that has one (engine/schema.py collation_findings; since session 36: a description
    without ``collations`` comes from an older agent, which `described` marks)."""

    def col(c: Column) -> list[Any]:
        return [c.name, c.type_sql, kind_of(dialect, c), c.nullable, c.has_default, encode(c.default)]

    return {
        "name": info.name,
        "key": col(info.key),
        "columns": [col(c) for c in info.columns],
        "excluded": list(info.excluded),
        "uniques": [[u.name, list(u.columns), u.policy, u.mark, u.max_len] for u in info.uniques],
        "refs": [[r.column, r.parent, r.on_delete, r.on_update, r.name] for r in info.refs],
        "version": info.version,
        "dropped": sorted(info.dropped),
        "collations": {
            c.name: [getattr(c.collation, f.name) for f in fields(Collation)]
            for c in (info.key, *info.columns)
            if c.collation is not None
        },
    }


def collations_reported(d: dict[str, Any]) -> bool:
    """Whether a description (`description_of`) says its columns' collations: an agent older than
    session 36 does not, and its columns then read as comparing exactly."""
    return "collations" in d


def described(d: dict[str, Any]) -> TableInfo:
    """The TableInfo `description_of` sent: each column's type stands for its kind (kind_of gives
    the same kind for it); the spec is a placeholder (the copy is read at the peer, in its own)."""

    def col(x: list[Any]) -> Column:
        name, type_sql, kind, nullable, has_default, default = x
        return Column(
            str(name),
            _KIND_TYPES.get(kind, sqltypes.NullType)(),
            str(type_sql),
            bool(nullable),
            bool(has_default),
            decode(default),
        )

    width = len(fields(Collation))
    colls = {str(n): Collation(*v[:width]) for n, v in (d.get("collations") or {}).items()}
    key, cols = col(d["key"]), tuple(col(x) for x in d["columns"])
    key, cols = (
        replace(key, collation=colls.get(key.name)),
        tuple(replace(c, collation=colls.get(c.name)) for c in cols),
    )
    return TableInfo(
        name=str(d["name"]),
        key=key,
        columns=cols,
        excluded=tuple(str(x) for x in d["excluded"]),
        spec=TableSpec(str(d["name"]), key.name, True, tuple(c.name for c in cols), ()),
        uniques=tuple(UniqueSet(str(n), tuple(int(i) for i in c), str(p), int(m), ml) for n, c, p, m, ml in d["uniques"]),
        refs=tuple(Ref(str(c), str(p), str(od), str(ou), n) for c, p, od, ou, n in d["refs"]),
        version=int(d["version"]),
        dropped=frozenset(str(c) for c in d["dropped"]),
    )


def piece_out(p: dict[str, Any]) -> dict[str, Any]:
    """One piece of add-site's copy (ops/instantiate.py read_copy) as JSON-ready data: the values
    of its rows and of the table's registration typed, the rest (names, positions, versions,
    counts) plain."""
    out = dict(p)
    if "rows" in out:
        out["rows"] = [row_out(r) for r in p["rows"]]
    if "registration" in out:
        out["registration"] = row_out(tuple(p["registration"]))
    if "origins" in out:
        out["origins"] = [list(x) for x in p["origins"]]
    return out


def piece_in(d: dict[str, Any]) -> dict[str, Any]:
    """The piece `piece_out` made JSON-ready data of."""
    out = dict(d)
    if "rows" in out:
        out["rows"] = [row_in(r) for r in d["rows"]]
    if "registration" in out:
        out["registration"] = row_in(d["registration"])
    if "origins" in out:
        out["origins"] = [(str(o), str(v)) for o, v in d["origins"]]
    return out
