"""Values across dialects: what kind of value each column holds, and converting a value pulled
from any peer into what this site's driver stores exactly (docs/types.md).

Every replicated column has a *kind* (int, decimal, float, bool, text, bytes, date, timestamp,
timestamptz, json). Sites of different databases may declare a column with different types as long
as its kind is the same everywhere; `init` refuses a column whose kind differs between sites or that
has no kind (arrays, intervals, geometry, enums, ...), naming it. A value is converted by the kind
of the column at the *receiving* site, from whatever Python value the peer's driver returned.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal
from typing import Any, Callable, Iterable

from sqlalchemy import types as sqltypes

__all__ = ["kind_of", "adapter", "carry_problems", "KINDS", "json_text", "json_checked", "json_problem"]

KINDS = ("int", "decimal", "float", "bool", "text", "bytes", "date", "timestamp", "timestamptz", "json")
UTC = dt.timezone.utc

Conv = Callable[[Any], Any]


def kind_of(dialect: str, col: Any) -> str | None:
    """The kind of a reflected column (schema.Column) at a site of `dialect`; None: not carried."""
    t = col.type
    ts = (col.type_sql or "").upper().replace(" ", "")
    if dialect == "mysql" and (ts.startswith("TINYINT(1)") or ts.startswith("BOOL")):
        return "bool"  # MySQL's BOOLEAN is TINYINT(1)
    if isinstance(t, sqltypes.Boolean):
        return "bool"
    if isinstance(t, sqltypes.Integer):
        return "int"
    if isinstance(t, sqltypes.Float) or ts.startswith(("REAL", "DOUBLE", "FLOAT")):
        return "float"
    if isinstance(t, sqltypes.Numeric):
        return "decimal"
    if isinstance(t, sqltypes.DateTime):
        if getattr(t, "timezone", False) or (dialect == "mysql" and ts.startswith("TIMESTAMP")):
            return "timestamptz"
        return "timestamp"
    if isinstance(t, sqltypes.Date):
        return "date"
    if isinstance(t, sqltypes.JSON):
        return "json"
    if isinstance(t, (sqltypes.LargeBinary, sqltypes._Binary)):
        return "bytes"
    if isinstance(t, (sqltypes.String, sqltypes.Text)) and not isinstance(t, sqltypes.Enum):
        return "text"
    if dialect == "sqlite" and ts == "":
        return "any"  # an untyped SQLite column takes whatever comes
    return None


#: a CHECK clause validating a column's JSON: json_valid(col), the column's name quoted or not
_JSON_VALID = re.compile(r"""json_valid\s*\(\s*[`"\[]?([^`"\]\s()]+)[`"\]]?\s*\)""", re.I)


def json_checked(check_clauses: Iterable[str]) -> set[str]:
    """The columns that CHECK clauses `check_clauses` make hold valid JSON (``json_valid(col)``,
    alone or among other conditions): MariaDB's JSON type, a SQLite TEXT declared to hold JSON."""
    return {m.group(1) for clause in check_clauses for m in _JSON_VALID.finditer(clause)}


def shown(v: Any) -> str:
    """A value as messages name it: its repr, cut to 40 characters."""
    r = repr(bytes(v) if isinstance(v, (bytearray, memoryview)) else v)
    return r if len(r) <= 40 else r[:37] + "..."


def _parse_dt(v: Any) -> dt.datetime:
    if isinstance(v, dt.datetime):
        return v
    if isinstance(v, dt.date):
        return dt.datetime(v.year, v.month, v.day)
    if not isinstance(v, str):  # an epoch number, a blob: which instant it means is a guess
        raise ValueError(f"{shown(v)} is not a date and time (a {type(v).__name__}, not ISO-8601 text)")
    try:
        return dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{shown(v)} is not an ISO-8601 date and time") from None


def _aware(v: Any) -> dt.datetime:
    d = _parse_dt(v)
    return d.replace(tzinfo=UTC) if d.tzinfo is None else d.astimezone(UTC)


def _naive(v: Any) -> dt.datetime:
    d = _parse_dt(v)
    return d if d.tzinfo is None else d.astimezone(UTC).replace(tzinfo=None)


def _date(v: Any) -> dt.date:
    """A date; a date and time only at midnight without an offset (exact: the time of day it
    drops is zero), never cutting off a time of day (docs/types.md)."""
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return v
    if isinstance(v, str) and len(v) == 10:
        try:
            return dt.date.fromisoformat(v)
        except ValueError:
            raise ValueError(f"{shown(v)} is not an ISO-8601 date") from None
    d = _parse_dt(v)
    if d.tzinfo is not None or d.time() != dt.time():
        raise ValueError(f"{shown(v)} has a time of day, which a date column would drop")
    return d.date()


def _decimal(v: Any) -> Decimal:
    if isinstance(v, Decimal):
        return v
    if isinstance(v, float):
        return Decimal(repr(v))  # the shortest repr is the value the peer stored
    if isinstance(v, (bytes, bytearray, memoryview)):
        raise ValueError(f"{shown(v)} is not a number (bytes)")
    try:
        return Decimal(str(v).strip() if isinstance(v, str) else str(v))
    except ArithmeticError:
        raise ValueError(f"{shown(v)} is not a number") from None


def _int(v: Any) -> int:
    if isinstance(v, int):
        return int(v)
    d = _decimal(v)
    if not d.is_finite() or d != d.to_integral_value():
        raise ValueError(f"{shown(v)} is not an integer")
    return int(d)


def _float(v: Any) -> float:
    if isinstance(v, (str, bytes, bytearray, memoryview)):
        try:
            return float(v)  # ' 1.5', 'inf', 'nan' as SQLite keeps them in a REAL it could not convert
        except ValueError:
            raise ValueError(f"{shown(v)} is not a number") from None
    return float(v)


#: the spellings of a boolean PostgreSQL accepts (case and surrounding blanks aside)
_TRUE = ("1", "t", "true", "y", "yes", "on")
_FALSE = ("0", "f", "false", "n", "no", "off")


def _bool(v: Any) -> bool:
    """True or False, from a bool, 0 or 1, or a spelling PostgreSQL accepts; anything else (2,
    'maybe') is no boolean, which no conversion keeps (docs/types.md)."""
    if isinstance(v, str):
        w = v.strip().lower()
        if w in _TRUE or w in _FALSE:
            return w in _TRUE
    elif isinstance(v, (bool, int, float, Decimal)) and v in (0, 1):
        return bool(v)
    raise ValueError(f"{shown(v)} is not a boolean (true, false, 1 or 0)")


def _text(v: Any) -> str:
    """A text; a number as its digits (what SQLite's TEXT affinity stores of one); never a blob,
    whose Python repr is no text the application wrote."""
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        raise ValueError(f"{shown(v)} is bytes, not text")
    return str(v)


def _bytes(v: Any) -> bytes:
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def json_text(v: Any) -> str:
    """A JSON value as its text, the one form multimaster carries JSON in: every site reads a
    JSON column as its text (PostgreSQL's json / jsonb through the text loaders of
    dialects/postgresql, MariaDB's JSON and SQLite's TEXT as they are) except SQLite's JSON-declared
    column, whose NUMERIC affinity keeps a number as an INTEGER or a REAL, and an older agent's
    decoded document. Never raises: a text that is not JSON goes to the database, which refuses it
    for that change alone (held in the error queue) where the column checks it."""
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, Decimal):
        return str(v)
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _no_constant(c: str) -> Any:
    raise ValueError(f"{c} is not JSON")


def json_problem(v: Any, nul: bool = True) -> str | None:
    """Why a value of a JSON column (as json_text takes it) is not a JSON value, or None.
    `nul`: whether U+0000 may be in it (PostgreSQL's jsonb and text refuse it)."""
    if v is None:
        return None
    text = json_text(v)
    try:
        json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        shown = text if len(text) <= 40 else text[:37] + "..."
        return f"{shown!r} is not a JSON value ({e})"
    if not nul and ("\\u0000" in text or "\x00" in text):
        return f"{text[:40]!r} holds U+0000, which PostgreSQL cannot store"
    return None


#: kind -> converter to the Python value a *server* driver (psycopg, PyMySQL) stores exactly
NATIVE: dict[str, Conv] = {
    "int": _int,
    "decimal": _decimal,
    "float": _float,
    "bool": _bool,
    "text": _text,
    "bytes": _bytes,
    "date": _date,
    "timestamp": _naive,
    "timestamptz": _aware,
    "json": json_text,
}


def _sqlite_dt(v: Any) -> str:
    """What a SQLite `TIMESTAMP` / `DATETIME` column gets: a SQLite peer's text as it is (checked
    to be ISO-8601: exact is the same text, '...00.362' stays '...00.362', not '...00.362000');
    a server's datetime as ISO-8601 text of its value, an instant in UTC with '+00:00'."""
    d = _parse_dt(v)
    if isinstance(v, str):
        return v
    if d.tzinfo is not None:
        d = d.astimezone(UTC)
    return d.isoformat(" ")


#: kind -> converter to what SQLite stores exactly (sqlite3 binds no Decimal, date or datetime:
#: ISO-8601 text; a decimal is bound as text, which NUMERIC affinity keeps exact)
SQLITE: dict[str, Conv] = {
    "int": _int,
    "decimal": lambda v: str(_decimal(v)),
    "float": _float,
    "bool": lambda v: int(_bool(v)),
    "text": _text,
    "bytes": _bytes,
    "date": lambda v: _date(v).isoformat(),
    "timestamp": _sqlite_dt,
    "timestamptz": _sqlite_dt,
    "json": json_text,
}

_PY = {
    "int": (int,),
    "decimal": (Decimal,),
    "float": (float,),
    "bool": (bool,),
    "text": (str,),
    "bytes": (bytes,),
    "date": (dt.date,),
    "json": (str,),
}


def adapter(table: dict[str, Conv], kind: str | None) -> Conv | None:
    """A converter for values arriving in a column of `kind` (None: pass values through)."""
    if kind is None or kind == "any":
        return None
    conv = table[kind]
    fast = _PY.get(kind) if conv is NATIVE[kind] else None

    def run(v: Any) -> Any:
        if v is None:
            return None
        if fast is not None and type(v) in fast:
            return v
        return conv(v)

    return run


#: PostgreSQL's text of a date or timestamp Python's cannot hold (its loaders give it as text,
#: dialects/postgresql): infinity, a BC date, a year past 9999
_PG_SPECIAL = re.compile(r"^(-?infinity|\d{4,}-\d\d-\d\d.* BC|\d{5,}-\d\d-\d\d.*)$")


def pg_special(conv: Conv | None) -> Conv | None:
    """`conv` (a converter for a PostgreSQL site) passing PostgreSQL's text of a date or timestamp
    Python cannot hold through as it is, which a PostgreSQL column of the kind stores exactly."""
    if conv is None:
        return None

    def run(v: Any) -> Any:
        if isinstance(v, str) and _PG_SPECIAL.match(v):
            return v
        return conv(v)

    return run


def shared_kinds(per_site: dict[str, tuple[str, str | None]]) -> set[str]:
    """The kinds a column's sites (site -> (dialect, kind)) hold, leaving out what SQLite takes of
    another: its TIMESTAMP holds ISO-8601 text, with or without an offset (either kind). More than
    one: the sites hold different kinds."""
    found = {k for d, k in per_site.values() if k is not None and k != "any" and not (d == "sqlite" and k == "timestamp")}
    if not found and any(k == "timestamp" for _d, k in per_site.values()):
        found = {"timestamp"}
    return found


def _json_hint(per_site: dict[str, tuple[str, str | None]]) -> str:
    """What to do when JSON at some sites meets a SQLite TEXT column: it would carry the JSON text
    exactly, but compare it by its spelling (another database spells a value its own way, and an
    update of such a row would be taken for a conflict)."""
    kinds = {k for _d, k in per_site.values()}
    plain = sorted(s for s, (d, k) in per_site.items() if d == "sqlite" and k == "text")
    if "json" not in kinds or not plain:
        return ""
    return f"; at {', '.join(repr(s) for s in plain)} declare it JSON, or TEXT with CHECK (json_valid(<column>))"


def carry_problems(table: str, infos: dict[str, Any], dialects: dict[str, str]) -> list[str]:
    """init's check for clusters mixing databases: every column has a kind, the same at every site."""
    if len(set(dialects[s] for s in infos)) < 2:
        return []
    problems: list[str] = []
    kinds: dict[str, dict[str, str | None]] = {}
    for site, info in infos.items():
        for c in (info.key, *info.columns):
            kinds.setdefault(c.name, {})[site] = kind_of(dialects[site], c)
    for col, per_site in sorted(kinds.items()):
        bad = [s for s, k in per_site.items() if k is None]
        if bad:
            s = bad[0]
            ts = next(c.type_sql for c in (infos[s].key, *infos[s].columns) if c.name == col)
            problems.append(
                f"table '{table}', column '{col}': type {ts or 'untyped'} at '{s}' cannot be carried exactly between "
                f"{', '.join(sorted(set(dialects.values())))} (see docs/types.md); exclude the column or change its type"
            )
            continue
        typed = {s: (dialects[s], k) for s, k in per_site.items()}
        if len(shared_kinds(typed)) > 1:
            desc = ", ".join(f"{k} at '{s}'" for s, k in sorted(per_site.items()))
            problems.append(
                f"table '{table}', column '{col}': the sites hold different kinds of values ({desc}){_json_hint(typed)}; "
                "see docs/types.md"
            )
    return problems
