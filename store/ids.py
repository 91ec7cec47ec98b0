"""Validation of ids that become file names or must match them.

Applied before any path is built (RELIABILITY.md row 14): no path traversal, ever.
"""

from __future__ import annotations

import re
import secrets

from .errors import InvalidId

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Message / turn / other wire ids: printable, bounded, no control characters.
WIRE_ID_RE = re.compile(r"^[A-Za-z0-9_\-:.@+=/]{1,200}$")


def validate_session_id(value: object) -> str:
    if not isinstance(value, str) or not SESSION_ID_RE.fullmatch(value):
        shown = repr(value)[:80]
        raise InvalidId(
            f"invalid session id {shown}: must match {SESSION_ID_RE.pattern}",
            data={"field": "sessionId"},
        )
    return value


def validate_wire_id(value: object, field: str = "id") -> str:
    if not isinstance(value, str) or not WIRE_ID_RE.fullmatch(value):
        shown = repr(value)[:80]
        raise InvalidId(
            f"invalid {field} {shown}: 1-200 characters from [A-Za-z0-9_-:.@+=/]",
            data={"field": field},
        )
    return value


def new_id(prefix: str = "") -> str:
    """A fresh random id (128 bits, url-safe), valid as a session id."""
    return prefix + secrets.token_hex(16)
