"""Command receipts (seed 000 §2.4): keys, fingerprints, rows, and receipts carried in files.

A receipt is keyed by ``(clientId, submissionId)`` and stores the terminal
response of one mutating request plus a SHA-256 fingerprint of the request
(method + params, without the submission id or any transport identity). A
completed receipt is never overwritten.

A receipt is as durable as its effect and never later (ARCHITECTURE.md
"Receipts ride with their effect"):

* an effect that is a database transaction stores the row in that
  transaction (:func:`store`);
* an effect that is a file carries the receipt in that file, as a
  :func:`file_record` — in an appended line's ``meta.receipt``, in the
  ``receipt`` of a (re)written transcript header, in the delete marker — and
  ``store.indexing.reconcile.restore_receipt`` rebuilds the row from it when the
  database lost it (boot, or an actor's catch-up), computing the response
  from the state the file left behind.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from store.errors import IdempotencyConflict

__all__ = [
    "ReceiptKey",
    "check",
    "file_record",
    "fingerprint",
    "get",
    "key_of_record",
    "keys_of_session",
    "store",
]


@dataclass(frozen=True, slots=True)
class ReceiptKey:
    """Command receipt identity + request fingerprint.

    ``legacy_fingerprint``: the fingerprint an earlier build stored for the same request, where it
    differs from today's (``secrets.set``: before its keyed MAC without the value, builds fingerprinted
    the request with a MAC of the value in its place); a retry of a request that build answered must
    still find its receipt after an in-place upgrade. Only matched, never stored."""

    client_id: str
    submission_id: str
    method: str
    fingerprint: str
    legacy_fingerprint: str | None = field(default=None, compare=False)


def fingerprint(method: str, params: Mapping[str, Any]) -> str:
    """SHA-256 of method + params without transport identity or the submission id."""
    clean = {k: v for k, v in params.items() if k not in ("submissionId", "submission_id")}
    try:
        body = orjson.dumps([method, clean], option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        # integers beyond 64 bits: the strict decoder refuses them, but stay total here
        body = json.dumps([method, clean], sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return hashlib.sha256(body).hexdigest()


def get(conn: sqlite3.Connection, client_id: str, submission_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT method, status, response_json, fingerprint FROM command_receipts "
        "WHERE client_id = ? AND submission_id = ?",
        (client_id, submission_id),
    ).fetchone()
    if row is None:
        return None
    return {
        "method": row[0],
        "status": row[1],
        "response": orjson.loads(row[2]) if row[2] else None,
        "fingerprint": row[3],
    }


def session_of(conn: sqlite3.Connection, client_id: str, submission_id: str) -> str | None:
    """The session a stored receipt was recorded for (``None``: no such receipt, or none named)."""
    row = conn.execute("SELECT session_id FROM command_receipts WHERE client_id = ? AND submission_id = ?",
                       (client_id, submission_id)).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


def keys_of_session(conn: sqlite3.Connection, session_id: str) -> set[tuple[str, str]]:
    """``(clientId, submissionId)`` of every receipt recorded for the session (a full scan: no index on
    ``session_id``; only a session whose storage failed asks, around a catch-up)."""
    return {(str(c), str(s)) for c, s in conn.execute(
        "SELECT client_id, submission_id FROM command_receipts WHERE session_id = ?", (session_id,))}


def conflict(key: ReceiptKey, stored_method: str) -> IdempotencyConflict:
    return IdempotencyConflict(
        f"submissionId {key.submission_id} was already used for a different request",
        data={"submissionId": key.submission_id, "method": stored_method},
    )


def check(conn: sqlite3.Connection, key: ReceiptKey) -> dict[str, Any] | None:
    """The stored row for a matching retry; raise IDEMPOTENCY_CONFLICT for a different request; else None."""
    found = get(conn, key.client_id, key.submission_id)
    if found is None:
        return None
    if found["fingerprint"] not in (key.fingerprint, key.legacy_fingerprint) or found["method"] != key.method:
        raise conflict(key, str(found["method"]))
    return found


def landed(conn: sqlite3.Connection, key: ReceiptKey | None, effect: Callable[[sqlite3.Connection], bool]) -> bool:
    """After a commit raised (an error once it may have taken place): whether its transaction took place
    all the same. With a receipt, its row says (it rides in the effect's transaction); else ``effect(conn)``,
    a read of the effect's own rows."""
    if key is not None:
        return check(conn, key) is not None
    return effect(conn)


def store(
    conn: sqlite3.Connection,
    key: ReceiptKey,
    response: Any,
    *,
    session_id: str | None,
    now_ms: int,
    status: str = "completed",
) -> None:
    """Insert a completed receipt in the caller's transaction; an existing one is never overwritten."""
    conn.execute(
        "INSERT OR IGNORE INTO command_receipts(client_id, submission_id, method, status, response_json, "
        "fingerprint, session_id, created_at) VALUES (?,?,?,?,?,?,?,?)",
        (key.client_id, key.submission_id, key.method, status, orjson.dumps(response).decode(), key.fingerprint,
         session_id, now_ms),
    )


# ---------------------------------------------------------------------------
# receipts carried in files


def file_record(key: ReceiptKey, **extra: Any) -> dict[str, Any]:
    """The receipt as written into a file (a header, a marker, a line's meta).

    ``extra`` holds what :func:`rebuild_response` needs beyond the state the
    file leaves behind (for a truncate: how many messages it removed).
    """
    rec: dict[str, Any] = {"clientId": key.client_id, "submissionId": key.submission_id,
                           "fingerprint": key.fingerprint, "method": key.method}
    if extra:
        rec["extra"] = extra
    return rec


def key_of_record(rec: Any, *, default_method: str | None = None) -> ReceiptKey | None:
    """Parse a receipt record found in a file (``None`` if it is not a well-formed one)."""
    if not isinstance(rec, Mapping):
        return None
    client_id, submission_id, fp = rec.get("clientId"), rec.get("submissionId"), rec.get("fingerprint")
    method = rec.get("method", default_method)
    if not all(isinstance(v, str) and v for v in (client_id, submission_id, fp, method)):
        return None
    return ReceiptKey(str(client_id), str(submission_id), str(method), str(fp))
