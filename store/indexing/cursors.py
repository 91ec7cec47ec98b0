"""Opaque, stable paging cursors for every paged list (sessions, search, inbox, artifacts).

A cursor encodes the sort key of the last item a page returned (keyset
paging), never an offset: items that arrive later sort before the cursor and
cannot shift a page boundary. It also carries the list's kind and a
fingerprint of the query or filter it was issued for, so a cursor replayed
with another query is refused instead of silently returning a wrong page.
Every key element is type-checked (and integers range-checked to int64)
before it reaches SQL: a forged or foreign cursor is ``INVALID_CURSOR``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import sqlite3
from typing import Any

from store.errors import InvalidCursor

_IDENTITY_KV = ("index", "identity")
_VERSION = 2  # 2: schema v22 renumbered messages.mid, which search.query cursors hold
_INT64 = (-(2**63), 2**63 - 1)


def query_fingerprint(kind: str, *parts: str | None) -> str:
    h = hashlib.sha256(kind.encode())
    for part in parts:
        h.update(b"\x00" + (part or "").encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


SESSION_LIST_KIND = "sessions.list"


def session_list_fingerprint(project_id: int | None) -> str:
    """``session.list``'s cursor fingerprint: the host's handler and the CLI's offline ``sessions`` issue and
    read the same cursors, so a page read offline continues online and back."""
    return query_fingerprint("session.list", str(project_id))


def index_identity(conn: sqlite3.Connection) -> tuple[str, ...]:
    """What a cursor whose key holds index-local numbers (``messages.mid``: session ordinals) adds to its
    fingerprint: the identity of this index, renewed when it is created or rebuilt from the files, which
    number the sessions again. Nothing for an index from before identities (its cursors stay valid)."""
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", _IDENTITY_KV).fetchone()
    return (f"index:{row[0]}",) if row is not None else ()


def renew_index_identity(conn: sqlite3.Connection, now_ms: int) -> None:
    """A new identity for an index created or rebuilt: cursors issued by the one before are refused."""
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT(ns, key) DO UPDATE SET value_json = excluded.value_json, "
                 "updated_at = excluded.updated_at", (*_IDENTITY_KV, f'"{secrets.token_hex(8)}"', now_ms))


def encode_cursor(kind: str, fingerprint: str, key: list[Any]) -> str:
    raw = json.dumps([_VERSION, kind, fingerprint, key], separators=(",", ":"), ensure_ascii=True)
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, kind: str, fingerprint: str, types: tuple[type, ...]) -> list[Any]:
    """The key stored in ``cursor``; ``INVALID_CURSOR`` if malformed, forged or for another query."""
    bad = InvalidCursor("invalid cursor", data={"field": "cursor"})
    if not isinstance(cursor, str) or not cursor or len(cursor) > 512:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = json.loads(raw.decode("ascii"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not (isinstance(decoded, list) and len(decoded) == 4 and decoded[0] == _VERSION):
        raise bad
    _, got_kind, got_fp, key = decoded
    if got_kind != kind or got_fp != fingerprint:
        raise InvalidCursor(
            "cursor belongs to a different list or query; start again without a cursor",
            data={"field": "cursor"},
        )
    if not (
        isinstance(key, list)
        and len(key) == len(types)
        and all(_fits(v, t) for v, t in zip(key, types, strict=True))
    ):
        raise bad
    return key


def _fits(value: Any, kind: type) -> bool:
    if isinstance(value, bool) or not isinstance(value, kind):
        return False
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    if isinstance(value, str):
        return len(value) <= 512
    return True
