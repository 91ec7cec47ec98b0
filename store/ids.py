"""Validation of ids that become file names or must match them.

Applied before any path is built (RELIABILITY.md row 14): no path traversal, ever.
The patterns themselves are in :mod:`store.rules` (the wire models check the same ones).
"""

from __future__ import annotations

import hashlib
import secrets

from store.errors import InvalidId
from store.rules import SESSION_ID_RE, WIRE_ID_RE


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


MAX_WIRE_ID_CHARS = 200


def remapped_message_id(session_id: str, message_id: str) -> str:
    """The D444 spelling of a client's message id that another session already holds:
    ``{sessionId}:{id}``, or, when that would pass the 200-character wire id limit (a read's id must
    be usable as a method's message id as it is), ``{sessionId}:sha256={sha256(id)[:40]}``. Deterministic:
    every lookup of the client's id finds the same spelling."""
    spelled = f"{session_id}:{message_id}"
    if len(spelled) <= MAX_WIRE_ID_CHARS:
        return spelled
    return f"{session_id}:sha256={hashlib.sha256(message_id.encode('utf-8')).hexdigest()[:40]}"


def new_id(prefix: str = "") -> str:
    """A fresh random id (128 bits, url-safe), valid as a session id."""
    return prefix + secrets.token_hex(16)


def derived_id(*parts: str, prefix: str = "") -> str:
    """A deterministic id from ``parts`` (128 bits of SHA-256), valid as a session id.

    Used where a retry must land on the same new object: a session created or
    forked by a request with a receipt key gets its id from that key.
    """
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return prefix + digest
