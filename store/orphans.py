"""Orphaned sessions (seed 003 §5, D318): a session whose row and transcript are both gone.

The app's outbox may hold appends for a session the host lost both halves of
(a database reset or an older backup put back, a transcript removed by hand).
Refusing them for ever would keep the outbox from draining, so such an append
inserts a stub row under the session's id and goes on (its transcript starts
anew). A row that is gone while the transcript is still there is not an orphan
of this kind: reconciling the index with the file puts the row back
(``store/indexing/reconcile.py``: at boot, when a session actor starts, or in
the DB writer's repair of an append whose index op failed for want of the row).

Two kinds of session id never get a stub; their appends stay ``SESSION_NOT_FOUND``:

* one the user deleted or purged: ``known_sessions`` (schema v29) records every
  id the host created, ``index.insert_session`` and ``index.delete_session_rows``
  keep it in the transactions that insert and delete the row (no foreign key:
  it outlives the row), and a deleted id carries ``deleted_at``;
* one the host never knew: a stub needs the id known and not deleted, or, for a
  session older than that record, another trace that it existed (a command
  receipt, an audit row or index rows still naming it), or its actor having
  seen the row in this run.

``known_sessions`` lives in the database; the deleted-sessions log
(``store/transcripts/deleted_log.py``) keeps a deleted id outside it, with the
receipts :func:`created_receipts` finds, so a database rebuilt after a loss
knows the id as deleted again (``store.indexing.reconcile.forget_logged``).

SQL only; runs in the caller's (the DB writer's) transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

import orjson

from store import receipts
from store.errors import Conflict, CorruptData
from store.indexing import index
from store.transcripts.transcript import header_receipts

__all__ = ["CREATES", "created_receipts", "insert_stub", "left_traces", "was_deleted"]


_DELETES = ("session.delete", "sessions.purge")
CREATES = ("session.create", "session.fork", "session.assistantEdit", "plugins.importSession")
"""Methods whose effect is a new session: their receipts outlive its delete in the deleted-sessions log."""


def created_receipts(conn: sqlite3.Connection, session_id: str, *, header: Mapping[str, Any] | None = None,
                     limit: int = 8) -> list[dict[str, Any]]:
    """The receipt records, with their answers, of the requests that made this session (the newest
    ``limit``): a retry of one after the database was lost is answered as before, not run again.

    Found under the session's id, and through ``header`` (its transcript's header): a fork or an
    assistant edit keeps its receipt row under the session it was asked of, the parent; the child's
    header names it."""
    rows = conn.execute(
        "SELECT client_id, submission_id, fingerprint, method, response_json FROM command_receipts "
        f"WHERE session_id = ? AND method IN ({', '.join('?' * len(CREATES))}) AND status = 'completed' "
        "AND response_json IS NOT NULL ORDER BY created_at DESC LIMIT ?", (session_id, *CREATES, limit)).fetchall()
    seen = {(r[0], r[1]) for r in rows}
    for rec in header_receipts(header):
        key = receipts.key_of_record(rec)
        if key is None or key.method not in CREATES or (key.client_id, key.submission_id) in seen:
            continue
        row = conn.execute(
            "SELECT client_id, submission_id, fingerprint, method, response_json FROM command_receipts "
            "WHERE client_id = ? AND submission_id = ? AND status = 'completed' AND response_json IS NOT NULL",
            (key.client_id, key.submission_id)).fetchone()
        if row is not None:
            seen.add((row[0], row[1]))
            rows.append(row)
    out: list[dict[str, Any]] = []
    for client_id, submission_id, fp, method, response in rows:
        try:
            answer = receipts.stored_answer(conn, response, what=f"{client_id}/{submission_id}")
        except (orjson.JSONDecodeError, CorruptData):
            continue  # its answer does not read (a damaged row, or its answer file): a retry is told so
        out.append({"clientId": client_id, "submissionId": submission_id, "fingerprint": fp, "method": method,
                    "response": answer})
    return out


def was_deleted(conn: sqlite3.Connection, session_id: str) -> bool:
    """Whether the user deleted (or purged) this session id: its ``known_sessions`` row says; a session
    deleted by a build before that record (schema v29) has no row there, and then a keyed delete's
    receipt naming it says (its create's and appends' receipts are traces too, which must not bring
    back what the user deleted when an outbox retries them after an in-place upgrade)."""
    row = conn.execute("SELECT deleted_at FROM known_sessions WHERE id = ?", (session_id,)).fetchone()
    if row is not None:
        return row[0] is not None
    return conn.execute(
        f"SELECT 1 FROM command_receipts WHERE session_id = ? AND method IN ({', '.join('?' * len(_DELETES))}) "
        "LIMIT 1", (session_id, *_DELETES)).fetchone() is not None


_TRACES = (
    "SELECT 1 FROM known_sessions WHERE id = ? LIMIT 1",
    "SELECT 1 FROM command_receipts WHERE session_id = ? LIMIT 1",
    "SELECT 1 FROM audit_log WHERE session_id = ? LIMIT 1",
    "SELECT 1 FROM messages WHERE session_id = ? LIMIT 1",
)


def left_traces(conn: sqlite3.Connection, session_id: str) -> bool:
    """Whether the database remembers this session beyond its row (never true of a deleted one)."""
    if was_deleted(conn, session_id):
        return False
    return any(conn.execute(sql, (session_id,)).fetchone() is not None for sql in _TRACES)


def insert_stub(conn: sqlite3.Connection, session_id: str, *, now_ms: int, seen: bool) -> dict[str, Any]:
    """Insert the stub row of an orphaned session (``seen``: its actor saw the row in this run).

    ``CONFLICT`` if the row exists; a session with no trace and not ``seen``, or one the user
    deleted, raises :class:`LookupError` (the caller answers ``SESSION_NOT_FOUND``). Index rows
    left behind by a row deleted without its cascade are cleared: they point into a transcript
    that is gone (the other rows it left, its queue or thread metadata, belong to the stub)."""
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None:
        raise Conflict(f"session {session_id} already exists", data={"sessionId": session_id})
    if was_deleted(conn, session_id) or not (seen or left_traces(conn, session_id)):
        raise LookupError(session_id)
    index.insert_session(conn, session_id, now_ms=now_ms)
    index.clear_session_index(conn, session_id)
    return index.require_session(conn, session_id)
