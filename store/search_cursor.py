"""Opaque, stable paging cursors for search results.

A cursor encodes the sort key of the last item a page returned (keyset
paging), never an offset: items that arrive later sort before the cursor and
cannot shift a page boundary. It also carries a fingerprint of the query it was
issued for, so a cursor replayed with another query is refused instead of
silently returning a wrong page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from .errors import InvalidInput

_VERSION = 2  # 2: schema v22 renumbered messages.mid, which search.query cursors hold


def query_fingerprint(kind: str, *parts: str | None) -> str:
    h = hashlib.sha256(kind.encode())
    for part in parts:
        h.update(b"\x00" + (part or "").encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def encode_cursor(kind: str, fingerprint: str, key: list[Any]) -> str:
    raw = json.dumps([_VERSION, kind, fingerprint, key], separators=(",", ":"), ensure_ascii=True)
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, kind: str, fingerprint: str, types: tuple[type, ...]) -> list[Any]:
    """The key stored in ``cursor``; InvalidInput if malformed or for another query."""
    bad = InvalidInput("invalid cursor", data={"field": "cursor"})
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
        raise InvalidInput(
            "cursor belongs to a different search; start again without a cursor",
            data={"field": "cursor"},
        )
    if not (
        isinstance(key, list)
        and len(key) == len(types)
        and all(isinstance(v, t) and not isinstance(v, bool) for v, t in zip(key, types, strict=True))
    ):
        raise bad
    return key
