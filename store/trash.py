"""Recoverable trash: ``sessions.trash`` / ``sessions.restore`` / ``sessions.purge`` (seed 003 §4.5, §11.20).

Trash is the ``sessions.deleted_at`` host timestamp, durable in the session's
own transcript: ``sessions.trash`` and ``sessions.restore`` write a ``session_info``
line carrying it (``trashedAt``: the time, ``null`` once restored; every later
``session_info`` line of a trashed session carries it too), so a rebuilt index
puts it back (:func:`restore_from_info`). A trashed session is
hidden from session lists (:func:`store.indexing.index.list_sessions`), search
(:mod:`store.search.search` skips ``deleted_at`` sessions) and plugin reads
(:mod:`store.interchange.plugin_imports`), while its transcript, index rows and import
origin stay untouched, so :func:`restore_session` brings it back exactly.
Only a trashed session can be purged; purge removes it for good with the
delete protocol of :mod:`store.transcripts.session_files` (a crash at any step never
resurrects the session):

1. ``write_delete_marker`` — ``<sid>.deleting`` (boot finishes from here on);
2. one transaction: :func:`purge_rows` deletes the session row, and with it
   (cascades) the messages, checkpoints, origin row, turns, queue...;
3. ``finish_delete`` removes the files, the marker last.

With ``plugin_id`` every call is scoped to the sessions that plugin imported
(another plugin's or the host's session is ``PERMISSION_DENIED``). SQL runs in
the caller's transaction; the file steps run in a worker thread.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from store import orphans
from store.errors import Conflict, PermissionDenied
from store.indexing import index
from store.indexing.database import in_transaction
from store.stamps import after_newest
from store.transcripts.session_files import SessionPaths, finish_delete, write_delete_marker

__all__ = [
    "TRASHED_AT",
    "check_purgeable",
    "check_scope",
    "list_trashed",
    "owner_of",
    "purge_rows",
    "purge_session",
    "restore_from_info",
    "restore_session",
    "trash_session",
    "trash_time",
    "trashed_at_of",
]

TRASHED_AT = "trashedAt"
"""The ``session_info`` field that records the trash state: the ``deleted_at`` time, ``null`` once restored
(absent: the line says nothing about it, as every line an older build wrote)."""


def owner_of(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The plugin that imported a session (``""`` for the host's importers), None when not imported."""
    row = conn.execute("SELECT plugin_id FROM session_import_origins WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else str(row[0])


def check_scope(conn: sqlite3.Connection, session_id: str, plugin_id: str | None) -> dict[str, Any]:
    """The session's row, if the caller may trash, restore or purge it (``PERMISSION_DENIED`` for a plugin
    that did not import it; before its line is written, so a refused call leaves no line)."""
    row = index.require_session(conn, session_id)
    if plugin_id is not None and owner_of(conn, session_id) != plugin_id:
        raise PermissionDenied(f"session {session_id} was not imported by plugin {plugin_id}",
                               data={"sessionId": session_id, "pluginId": plugin_id})
    return row


def trash_session(conn: sqlite3.Connection, session_id: str, *, now_ms: int,
                  plugin_id: str | None = None) -> dict[str, Any]:
    """Hide a session (idempotent: trashing it again keeps the first ``deleted_at``)."""
    check_scope(conn, session_id, plugin_id)
    conn.execute("UPDATE sessions SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL", (now_ms, session_id))
    return index.public_session(index.require_session(conn, session_id))


def restore_session(conn: sqlite3.Connection, session_id: str, *, plugin_id: str | None = None) -> dict[str, Any]:
    """Bring a trashed session back (a session not in the trash is left as it is)."""
    check_scope(conn, session_id, plugin_id)
    conn.execute("UPDATE sessions SET deleted_at = NULL WHERE id = ?", (session_id,))
    return index.public_session(index.require_session(conn, session_id))


def check_purgeable(conn: sqlite3.Connection, session_id: str, *, plugin_id: str | None = None) -> None:
    """Before step 1: the caller may purge it and it is in the trash (``CONFLICT`` otherwise)."""
    row = check_scope(conn, session_id, plugin_id)
    if row["deletedAt"] is None:
        raise Conflict(f"session {session_id} is not in the trash: trash it before purging",
                       data={"sessionId": session_id})


def purge_rows(conn: sqlite3.Connection, session_id: str, *, now_ms: int,
               plugin_id: str | None = None) -> dict[str, Any]:
    """Step 2: delete the rows of a trashed session (``CONFLICT`` unless it is in the trash)."""
    check_purgeable(conn, session_id, plugin_id=plugin_id)
    index.delete_session_rows(conn, session_id, now_ms=now_ms)
    return {"sessionId": session_id, "purged": True}


def list_trashed(conn: sqlite3.Connection, *, plugin_id: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Trashed sessions, most recently trashed first (a plugin sees only its own)."""
    sql = ("SELECT s.id FROM sessions s LEFT JOIN session_import_origins o ON o.session_id = s.id "
           "WHERE s.deleted_at IS NOT NULL")
    args: list[Any] = []
    if plugin_id is not None:
        sql += " AND o.plugin_id = ?"
        args.append(plugin_id)
    sql += " ORDER BY s.deleted_at DESC, s.id LIMIT ?"
    args.append(limit)
    out = []
    for (sid,) in conn.execute(sql, args).fetchall():
        row = index.session_row(conn, sid)
        if row is not None:
            out.append(index.public_session(row))
    return out


def trash_time(conn: sqlite3.Connection, now_ms: int) -> int:
    """The ``deleted_at`` of a session trashed now: ``now_ms``, but after every session in the trash.

    ``sessions.listTrashed`` lists most recently trashed first, the newest ``limit``: on a clock stepped
    back a session trashed now would sort under older ones, and behind 200 of them drop out of the list."""
    return after_newest(conn, "SELECT MAX(deleted_at) FROM sessions", (), now_ms)


def trashed_at_of(info: Mapping[str, Any] | None) -> tuple[bool, int | None]:
    """``(says, at)``: whether a ``session_info`` record says anything about the trash state, and what
    (the ``deleted_at`` time, None: not in the trash). A value that is no time says nothing."""
    if not info or TRASHED_AT not in info:
        return False, None
    at = info[TRASHED_AT]
    if at is None:
        return True, None
    if type(at) is int and at >= 0:
        return True, at
    return False, None


def restore_from_info(conn: sqlite3.Connection, session_id: str, info: Mapping[str, Any] | None) -> bool:
    """A rebuilt (or caught-up) index takes the trash state the newest ``session_info`` line that records
    it says. True if the row changed."""
    says, at = trashed_at_of(info)
    if not says:
        return False
    return conn.execute("UPDATE sessions SET deleted_at = ? WHERE id = ? AND deleted_at IS NOT ?",
                        (at, session_id, at)).rowcount > 0


def purge_session(conn: sqlite3.Connection, paths: SessionPaths, *, plugin_id: str | None = None,
                  write: Callable[[Callable[[sqlite3.Connection], Any]], Any] | None = None,
                  now_ms: int | None = None) -> dict[str, Any]:
    """All three steps in order (tests, the CLI without a host). ``write`` runs one transaction;
    ``now_ms`` (default: the wall clock) is the time the id is recorded as deleted."""
    session_id = paths.session_id
    now = int(time.time() * 1000) if now_ms is None else now_ms
    run = write or (lambda fn: in_transaction(conn, fn))
    check_purgeable(conn, session_id, plugin_id=plugin_id)  # refuse before touching any file
    write_delete_marker(paths, None, orphans.created_receipts(conn, session_id))
    result = run(lambda c: purge_rows(c, session_id, now_ms=now, plugin_id=plugin_id))
    finish_delete(paths, now_ms=now)
    return dict(result)


