"""When two values of a replicated column are the same value: equality as the cluster's column
kinds define it (docs/types.md), whatever database and driver each value was read from.

The same decimal is ``Decimal('1.50')`` read from PostgreSQL or MariaDB, ``1.5`` (a REAL) read from
SQLite, and ``'1.50'`` as a value adapter binds it for SQLite; the same instant is an aware
datetime from PostgreSQL and ISO-8601 text from SQLite; the same JSON document may spell its keys
in another order. Comparing Python values (or their reprs) calls all of these different. Every
comparison of values read at different sites goes through :func:`same` / :func:`differing`:
recapture's (core/recapture.py), verify's differing columns of a sampled row
(spark/compare.py), ``conflicts --re-resolve``'s check that a row still holds the logged winner
(core/reresolve.py).

A column is described by a :class:`ColumnType`: its kind (the names of dialects/types.py; None or
``"any"``: no kind known, values compared as numbers, bytes or themselves) and, for a decimal, the
scale the sites declare (values are compared rounded to it, as a server stores them: SQLite's
NUMERIC keeps the digits it was given). Plain data in, plain data out; standard library only.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any, Hashable, Mapping, Sequence

__all__ = ["ColumnType", "canonical", "same", "differing"]

_CTX = Context(prec=200)  # wide enough for any declared precision: quantize never rounds beyond the scale
_NAN = ("nan",)  # NaN is one value here (NaN != NaN in Python; a stored NaN is the same NaN)


@dataclass(frozen=True)
class ColumnType:
    """What a column's values are compared as: `kind` (dialects/types.py's names; None or "any":
    unknown) and, for a decimal, the declared `scale` (None: not declared)."""

    kind: str | None = None
    scale: int | None = None


def _raw(v: Any) -> Hashable:
    """A value that is not of its column's kind: equal only to the same spelling."""
    return ("raw", type(v).__name__ if not isinstance(v, (str, bytes)) else "text", str(v))


def _number(v: Any) -> Decimal:
    if isinstance(v, bool):
        return Decimal(int(v))
    if isinstance(v, Decimal):
        return v
    if isinstance(v, int):
        return Decimal(v)
    if isinstance(v, float):
        return Decimal(repr(v))  # the shortest repr is the value the site stored
    if isinstance(v, (bytes, bytearray, memoryview)):
        v = bytes(v).decode()
    return Decimal(str(v).strip())


def _num(v: Any, scale: int | None = None) -> Hashable:
    d = _number(v)
    if d.is_nan():
        return _NAN
    if d.is_infinite():
        return d
    if scale is not None:
        d = d.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=_CTX)
    return d.normalize(_CTX)  # (equal Decimals hash alike anyway; normalized reads better)


def _float(v: Any) -> Hashable:
    f = float(_number(v)) if not isinstance(v, float) else v
    return _NAN if math.isnan(f) else f


def _bool(v: Any) -> Hashable:
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("1", "t", "true", "y", "yes", "on"):
            return True
        if s in ("0", "f", "false", "n", "no", "off"):
            return False
        return _raw(v)
    if isinstance(v, (int, float, Decimal)):  # 2 is no boolean (SQLite keeps it): not the same as true
        return bool(v) if v in (0, 1) else _raw(v)
    return _raw(v)


def _bytes(v: Any) -> Hashable:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, Mapping) and set(v) == {"$hex"}:  # the conflict log's spelling of bytes
        return bytes.fromhex(str(v["$hex"]))
    if isinstance(v, str):
        return v.encode()
    return _raw(v)


def _text(v: Any) -> Hashable:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode()
    return v if isinstance(v, str) else str(v)


def _datetime(v: Any) -> dt.datetime:
    if isinstance(v, dt.datetime):
        d = v
    elif isinstance(v, dt.date):
        d = dt.datetime(v.year, v.month, v.day)
    else:
        s = bytes(v).decode() if isinstance(v, (bytes, bytearray, memoryview)) else str(v)
        d = dt.datetime.fromisoformat(s.strip().replace("Z", "+00:00"))
    # an instant is compared in UTC; a naive value (SQLite's text without an offset, a timestamp
    # column) is read as UTC, as replication carries it
    return d if d.tzinfo is None else d.astimezone(dt.timezone.utc).replace(tzinfo=None)


def _date(v: Any) -> Hashable:
    if isinstance(v, dt.datetime):
        return v.date()
    if isinstance(v, dt.date):
        return v
    return dt.date.fromisoformat(str(v).strip()[:10])


def _json(v: Any) -> Hashable:
    if isinstance(v, (str, bytes, bytearray, memoryview)):
        v = json.loads(bytes(v) if not isinstance(v, str) else v)
    return _frozen(v)


def _frozen(v: Any) -> Hashable:
    """A JSON value as a hashable one: objects by their members (key order aside), numbers by value."""
    if isinstance(v, Mapping):
        return ("object", frozenset((str(k), _frozen(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return ("array", tuple(_frozen(x) for x in v))
    if isinstance(v, bool) or v is None:
        return ("literal", v)
    if isinstance(v, (int, float, Decimal)):
        return ("number", _num(v))
    return ("string", str(v))


def _any(v: Any) -> Hashable:
    if isinstance(v, bool):
        return Decimal(int(v))  # (SQLite's booleans are 0 and 1)
    if isinstance(v, (int, float, Decimal)):
        return _num(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, (Mapping, list)):
        return _frozen(v)
    return v if isinstance(v, Hashable) else _raw(v)


_BY_KIND = {
    "int": _num,
    "decimal": _num,
    "float": _float,
    "bool": _bool,
    "text": _text,
    "bytes": _bytes,
    "date": _date,
    "timestamp": _datetime,
    "timestamptz": _datetime,
    "json": _json,
}


def canonical(v: Any, t: ColumnType | None = None) -> Hashable:
    """The value `v` of a column of type `t` in one form per value: two values are the same
    value exactly when their canonical forms are equal (and hash alike)."""
    if v is None:
        return None
    kind = t.kind if t is not None else None
    try:
        if kind == "decimal":
            return _num(v, t.scale if t is not None else None)
        conv = _BY_KIND.get(kind or "")
        return _any(v) if conv is None else conv(v)
    except (ValueError, ArithmeticError, TypeError, InvalidOperation):
        return _raw(v)


def _inferred(v: Any) -> str | None:
    """The kind a value shows by its Python type (None: text, or nothing to tell)."""
    for types, kind in _SHOWN:
        if isinstance(v, types):
            return kind
    return None


_SHOWN: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "bool"),
    ((Decimal, int), "decimal"),
    (float, "float"),
    (dt.datetime, "timestamp"),
    (dt.date, "date"),
    ((bytes, bytearray, memoryview), "bytes"),
    ((Mapping, list), "json"),
)


def same(a: Any, b: Any, t: ColumnType | None = None) -> bool:
    """Whether `a` and `b`, values of a column of type `t` read at any sites, are the same value.
    Of a column whose kind is not known, a value given as text and one of another Python type
    are compared as the kind that one shows (a Decimal: decimal, a datetime: timestamp, ...)."""
    if a is None or b is None:
        return a is None and b is None
    if (t is None or t.kind in (None, "any")) and isinstance(a, str) != isinstance(b, str):
        shown = _inferred(b if isinstance(a, str) else a)
        if shown is not None:
            t = ColumnType(shown)
    return canonical(a, t) == canonical(b, t)


def differing(
    a: Mapping[str, Any], b: Mapping[str, Any], columns: Sequence[str], types: Mapping[str, ColumnType] | None = None
) -> tuple[str, ...]:
    """The `columns` (in their order) whose values differ between the rows `a` and `b` (a column a
    row lacks holds NULL there), each compared as its type in `types` says (none: `ColumnType()`)."""
    ts = types or {}
    return tuple(c for c in columns if not same(a.get(c), b.get(c), ts.get(c)))
