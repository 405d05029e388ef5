"""The passwords this process has read from topology files, and `redact`, which hides them.

Every URL multimaster shows is rendered with its password masked (`hidden_url`); that covers what
multimaster writes itself. `redact` is the second line, for text it does not write: a driver's or
SQLAlchemy's exception message, a traceback, a log line carrying either. Loading a topology
remembers each site's password (`remember`); the CLI's error output and tracebacks, the daemon's
log and every stored error text go through `redact`, which replaces the password, in each form it
can take in such text (as typed, percent-encoded as in a URL, escaped as in a Python repr or a
JSON string), by ``***``.

Passwords shorter than `MIN_LENGTH` characters are not searched for: masking every ``ab`` of every
message would make the output unreadable while hiding nothing a guess would not find.
"""

from __future__ import annotations

import json
import threading
from urllib.parse import quote, quote_plus

__all__ = ["remember", "redact", "forms", "MIN_LENGTH", "MASK"]

MIN_LENGTH = 4
MASK = "***"

_lock = threading.Lock()
_forms: list[str] = []  # every form of every remembered password, longest first


def forms(password: str) -> set[str]:
    """The forms `password` can take in a message: as typed, percent-encoded (SQLAlchemy's URL
    rendering, a strict one, a form's), as in a Python repr and as in a JSON string."""
    out = {
        password,
        quote(password, safe=" +"),
        quote(password, safe=""),
        quote_plus(password),
        repr(password)[1:-1],
        json.dumps(password)[1:-1],
        json.dumps(password, ensure_ascii=False)[1:-1],
    }
    return {f for f in out if len(f) >= MIN_LENGTH}


def remember(password: str | None) -> None:
    """Hide `password` from everything `redact` sees in this process from now on."""
    if not password or len(password) < MIN_LENGTH:
        return
    with _lock:
        new = forms(password) - set(_forms)
        if new:
            _forms.extend(new)
            _forms.sort(key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with every remembered password (in every form of `forms`) replaced by ``***``."""
    if not _forms or not text:
        return text
    for f in list(_forms):
        if f in text:
            text = text.replace(f, MASK)
    return text
