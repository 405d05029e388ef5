"""Whether a value pulled from a peer fits a column of this site exactly (docs/types.md "Values a
site cannot store").

A column's kind (dialects/types.py) is the same at every site, but its declared type is each
site's own: a PostgreSQL ``text`` may carry 100,000 characters to a MariaDB ``TEXT`` (65,535 bytes),
a ``numeric(20,2)`` 12345678.99 to a ``DECIMAL(6,2)``, a ``double precision`` NaN to a MariaDB
``DOUBLE`` (which has none) or to SQLite (which stores NULL for it). A database given such a value
cuts it, rounds it, clamps it, turns it into NULL or fails the whole statement; none of that may
happen to a replicated change. :func:`checks` gives, per column, a pure test of a value (as this
site's driver is given it, after the value adapters): None when the column stores it exactly,
otherwise why not (the value's kind and size, the column's type), and whether no column of this
database could ever hold it (NaN where the database has none), for the fix the error names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Sequence

__all__ = ["Misfit", "checks", "charset_misfit"]


@dataclass(frozen=True)
class Misfit:
    """Why a value does not fit a column: `why` (its kind and size, and the column's type), and
    whether the database has no column type of the kind that could hold it (`never`)."""

    why: str
    never: bool = False


Check = Callable[[Any], "Misfit | None"]

#: MariaDB / MySQL: the bytes a TEXT / BLOB type holds
_MY_LOB = {"TINY": 255, "": 65_535, "MEDIUM": 16_777_215, "LONG": 4_294_967_295}
#: integer ranges by declared type (signed)
_INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "INT2": 16, "MEDIUMINT": 24, "INT": 32, "INTEGER": 32, "INT4": 32, "SERIAL": 32}
_INT_BITS.update({"BIGINT": 64, "INT8": 64, "BIGSERIAL": 64, "SMALLSERIAL": 16})
_LEN = re.compile(
    r"^(?:NATIONAL\s+)?(CHARACTER VARYING|VARCHAR|NVARCHAR|CHARACTER|CHAR|NCHAR|VARBINARY|BINARY|BIT VARYING)\s*\(\s*(\d+)\s*\)"
)
_DEC = re.compile(r"^(?:NUMERIC|DECIMAL|DEC|FIXED)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?")


def checks(dialect: str, title: str, columns: Sequence[Any], kinds: Sequence[str | None]) -> list[Check | None]:
    """Per column of `columns` (schema.Column, of kind `kinds[i]`) at a site of `dialect`
    (`title` its name in messages), a test of a value as this site's driver is given it; None
    where every value of the kind fits."""
    return [
        _both(
            _check(dialect, title, (c.type_sql or "").strip().upper(), k),
            _charset(title, c) if k == "text" else None,
        )
        for c, k in zip(columns, kinds)
    ]


def _both(a: Check | None, b: Check | None) -> Check | None:
    """One test of both `a` and `b` (the first that refuses says why)."""
    if a is None or b is None:
        return a or b

    def fits(v: Any) -> Misfit | None:
        return a(v) or b(v)

    return fits


def _charset(title: str, col: Any) -> Check | None:
    """A text column whose character set does not hold every character (MariaDB's utf8mb3 holds
    none past U+FFFF, an emoji; latin1 none past its 256): a value with one is refused by the
    database (error 1366, "Incorrect string value", in strict mode) or stored with '?' in its place
    (not strict). docs/types.md "Values a site cannot store"."""
    coll = getattr(col, "collation", None)
    if coll is None:
        return None
    if coll.charset not in _BMP and coll.charset not in _CODEC:
        return None  # every character fits (utf8mb4, utf16, ...)

    # a binary collation stays binary (a key or UNIQUE column compared exactly, docs/mysql.md "Collations")
    to = "CHARACTER SET utf8mb4" + (" COLLATE utf8mb4_bin" if coll.name.endswith("_bin") else "")

    def fits(v: Any) -> Misfit | None:
        why = charset_misfit(coll.charset, v)
        if why is None:
            return None
        return Misfit(
            f"text {v[:40]!r}{'...' if len(v) > 40 else ''} with {why}, which {title}'s character set {coll.charset} "
            f"({col.type_sql or 'the column'}, collation {coll.name}) does not hold: make it utf8mb4 "
            f"(ALTER TABLE ... MODIFY {col.name} ... {to})"
        )

    return fits


def _check(dialect: str, title: str, ts: str, kind: str | None) -> Check | None:
    if kind == "text":
        return _text(dialect, title, ts)
    if kind == "bytes":
        return _bytes(dialect, title, ts)
    if kind == "decimal":
        return _decimal(dialect, title, ts)
    if kind == "float":
        return _float(dialect, title)
    if kind == "int":
        return _int(dialect, title, ts)
    if kind == "json" and dialect in ("postgresql", "mysql"):
        return _json(dialect, title)
    return None


def _json(dialect: str, title: str) -> Check:
    """A JSON column that checks its values (PostgreSQL's json / jsonb, whose snapshot column is
    typed alike: a value it refuses failed the whole batch; MySQL's JSON; MariaDB's json_valid
    CHECK): a text that is not JSON, and for PostgreSQL one holding U+0000, never fits."""
    from multimaster.dialects.types import json_problem

    def fits(v: Any) -> Misfit | None:
        why = json_problem(v, nul=dialect != "postgresql")
        return None if why is None else Misfit(f"{why} (no {title} JSON column holds it)", never=True)

    return fits


def _text(dialect: str, title: str, ts: str) -> Check | None:
    m = _LEN.match(ts)
    if m and dialect != "sqlite":  # SQLite keeps any length whatever the declared type
        n = int(m.group(2))

        def chars(v: Any) -> Misfit | None:
            if isinstance(v, str) and len(v) > n:
                return Misfit(f"text of {len(v):,} characters, longer than {title}'s {ts} holds ({n:,} characters)")
            return None

        return chars
    if dialect == "mysql":
        lob = re.match(r"^(TINY|MEDIUM|LONG|)TEXT\b", ts)
        if lob:
            limit = _MY_LOB[lob.group(1)]

            def size(v: Any) -> Misfit | None:
                if isinstance(v, str) and len(v) * 4 > limit and len(b := v.encode("utf-8")) > limit:
                    return Misfit(
                        f"text of {len(v):,} characters ({len(b):,} bytes), longer than {title}'s {ts} holds ({limit:,} bytes)"
                    )
                return None

            return size
    return None


def _bytes(dialect: str, title: str, ts: str) -> Check | None:
    if dialect != "mysql":
        return None
    m = _LEN.match(ts)
    lob = re.match(r"^(TINY|MEDIUM|LONG|)BLOB\b", ts)
    limit = int(m.group(2)) if m else _MY_LOB[lob.group(1)] if lob else None
    if limit is None:
        return None

    def size(v: Any) -> Misfit | None:
        if isinstance(v, (bytes, bytearray, memoryview)) and len(v) > limit:
            return Misfit(f"bytes of length {len(v):,}, longer than {title}'s {ts} holds ({limit:,} bytes)")
        return None

    return size


def _decimal(dialect: str, title: str, ts: str) -> Check | None:
    m = _DEC.match(ts)
    p: int | None
    s: int | None
    if dialect == "mysql":
        p, s = (int(m.group(1)) if m and m.group(1) else 10), (int(m.group(2)) if m and m.group(2) else 0)
    elif m and m.group(1) and dialect != "sqlite":  # SQLite does not enforce them
        p, s = int(m.group(1)), int(m.group(2) or 0)
    else:
        p = s = None  # unconstrained (PostgreSQL numeric), or SQLite (which enforces neither)

    def fits(v: Any) -> Misfit | None:
        try:
            d = v if isinstance(v, Decimal) else Decimal(str(v))
        except (InvalidOperation, ValueError):
            return None  # not a number at all: the database says so
        if not d.is_finite():
            if dialect == "postgresql":
                return None  # numeric holds NaN and ±Infinity
            return Misfit(f"decimal {d} (no {title} decimal column holds it)", never=True)
        if dialect == "sqlite":
            return _sqlite_numeric(d)
        digits, exp = _digits(d)
        if p is None or s is None:
            return None
        scale = max(0, -exp)
        whole = max(0, digits + exp)
        if scale > s:
            return Misfit(f"decimal {d} with {scale} decimal places, more than {title}'s {ts} keeps ({s}): it would be rounded")
        if whole > p - s:
            return Misfit(
                f"decimal {d} with {whole} digits before the point, out of the range of {title}'s {ts} ({p - s} at most)"
            )
        return None

    return fits


def _sqlite_numeric(d: Decimal) -> Misfit | None:
    """SQLite's NUMERIC affinity keeps an integer of 64 bits as an INTEGER and anything else as the
    nearest REAL: exact when that REAL reads back as the same decimal (15 significant digits
    always do). SQLite does not enforce a declared precision or scale."""
    if d == d.to_integral_value() and -(2**63) <= d < 2**63:
        return None
    if Decimal(repr(float(d))) == d:
        return None
    return Misfit(f"decimal {d}, which SQLite's NUMERIC would store as the nearest REAL, {float(d)!r}", never=True)


def _digits(d: Decimal) -> tuple[int, int]:
    """(significant digits, exponent) of `d` without trailing zeros (1.50 is 15e-1; 0 is 0e0)."""
    if d.is_zero():
        return 1, 0
    t = d.normalize().as_tuple()
    return len(t.digits), int(t.exponent)


def _float(dialect: str, title: str) -> Check | None:
    if dialect == "postgresql":
        return None  # NaN and ±Infinity; an overflow of real the database refuses itself

    def special(v: Any) -> Misfit | None:
        if isinstance(v, float) and not math.isfinite(v):
            if math.isnan(v):
                what = "stores NULL for it" if dialect == "sqlite" else "has none"
                return Misfit(f"float NaN ({title} {what})", never=True)
            if dialect != "sqlite":  # SQLite's REAL holds ±Infinity
                return Misfit(f"float {v} ({title} has no infinity)", never=True)
        return None

    return special


def _int(dialect: str, title: str, ts: str) -> Check | None:
    if dialect == "sqlite":
        return None
    m = re.match(r"^([A-Z0-9]+)(?:\s*\(\s*\d+\s*\))?(\s+UNSIGNED)?", ts)
    bits = _INT_BITS.get(m.group(1)) if m else None
    if bits is None:
        return None
    lo, hi = (0, 2**bits - 1) if m and m.group(2) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)

    def fits(v: Any) -> Misfit | None:
        if isinstance(v, int) and not lo <= v <= hi:
            return Misfit(f"integer {v}, out of the range of {title}'s {ts} ({lo} to {hi})")
        return None

    return fits


#: the characters a character set holds, where it is not all of Unicode: the highest code point
#: (utf8mb3, ucs2: the Basic Multilingual Plane), or a Python codec (MySQL's latin1 is cp1252 with
#: its five undefined bytes mapped to the C1 controls of the same number)
_BMP = {"utf8mb3": 0xFFFF, "utf8": 0xFFFF, "ucs2": 0xFFFF}
_CODEC = {"latin1": "cp1252", "ascii": "ascii", "cp1250": "cp1250", "cp1251": "cp1251", "greek": "iso8859_7"}
_LATIN1_C1 = {"\x81", "\x8d", "\x8f", "\x90", "\x9d"}


def charset_misfit(charset: str, v: Any) -> str | None:
    """Why text `v` cannot be stored in a column of `charset` (its first character the character
    set lacks, with its position and code point), or None."""
    if not isinstance(v, str):
        return None
    top = _BMP.get(charset)
    codec = _CODEC.get(charset)
    if (top is None and codec is None) or v.isascii():
        return None
    if top is not None and ord(max(v)) <= top:
        return None
    for i, ch in enumerate(v):
        if top is not None:
            bad = ord(ch) > top
        else:
            bad = not (charset == "latin1" and ch in _LATIN1_C1) and not _encodes(ch, str(codec))
        if bad:
            return f"character {ch!r} (U+{ord(ch):04X}) at position {i + 1}"
    return None


def _encodes(ch: str, codec: str) -> bool:
    try:
        ch.encode(codec)
    except UnicodeEncodeError:
        return False
    return True
