"""The durable notification inbox (seed 003 §4.14, D117). SQL only.

One row per terminal (completed/error) turn, inserted by ``session.endTurn``
in the same transaction as the turn update, then the global newest-200 cap
is enforced in that transaction too. List / mark-read / mark-all-read / clear
touch the ``notifications`` table only: never sessions, turns or transcripts. The
notifications of a session in the trash are out of the inbox until it is restored
(``_SHOWN``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from store.fence import NOTIFICATION_CAP, prune_notifications
from store.ids import new_id
from store.indexing.sql_lists import in_chunks
from store.jsonio import Readable, readable, stored_value
from store.stamps import after_newest

_COLUMNS = "id, kind, session_id, session_title, turn_id, error_code, created_at, read_at"

_SHOWN = "session_id NOT IN (SELECT id FROM sessions WHERE deleted_at IS NOT NULL)"
"""The inbox: the notifications of sessions not in the trash. A trashed session's stay as they are (unlisted,
uncounted, out of reach of mark-read, mark-all-read and clear) until its restore brings them back or its
purge deletes them (the cascade); the newest-200 cap is global and counts them (seed 003 §4.14)."""


KINDS: Final = ("task.completed", "task.failed")


def _note(row: Sequence[Any]) -> dict[str, Any]:
    nid, kind, sid, title, turn_id, error_code, created, read_at = row
    return {"id": nid, "kind": kind, "sessionId": sid, "sessionTitle": title, "turnId": turn_id,
            "errorCode": error_code, "createdAt": created, "readAt": read_at}


def _checked(row: Sequence[Any]) -> dict[str, Any]:
    """:func:`_note` with its kind checked (``DamagedRecord``: SQLite checks a CHECK on writes only)."""
    stored_value(row[1], KINDS, f"notification {row[0]}'s kind")
    return _note(row)


def insert_for_turn(
    conn: sqlite3.Connection,
    *,
    session_id: str,
    turn_id: str,
    kind: str,
    error_code: str | None,
    now_ms: int,
    cap: int = NOTIFICATION_CAP,
) -> dict[str, Any] | None:
    """Insert the turn's notification unless one exists; prune to ``cap``. The new row, or None."""
    title_row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    title = title_row[0] if title_row else ""
    nid = new_id("n_")
    cur = conn.execute(
        f"INSERT INTO notifications({_COLUMNS}) VALUES (?,?,?,?,?,?,?,NULL) ON CONFLICT(turn_id) DO NOTHING",
        (nid, kind, session_id, title, turn_id, error_code, created_at(conn, now_ms)),
    )
    if cur.rowcount == 0:
        return None
    prune_notifications(conn, cap)
    row = conn.execute(f"SELECT {_COLUMNS} FROM notifications WHERE id = ?", (nid,)).fetchone()
    return _note(row) if row else None


def created_at(conn: sqlite3.Connection, now_ms: int) -> int:
    """A new notification's ``created_at``: ``now_ms``, but always after every row's.

    The inbox (and its newest-200 cap) orders by ``(created_at DESC, id DESC)`` and ids are random: a
    clock stepped back (NTP, a restored snapshot, a date fixed by hand) would list the new row under
    older ones, or prune it in the very transaction that reports it, and two rows of one millisecond
    would come in random order. Never decreasing, the order is the order the turns ended in."""
    return after_newest(conn, "SELECT MAX(created_at) FROM notifications", (), now_ms)


def list_notifications(
    conn: sqlite3.Connection, *, unread_only: bool, limit: int, cursor: tuple[int, str] | None
) -> tuple[Readable[dict[str, Any]], tuple[int, str] | None, int]:
    """Newest first by (created_at DESC, id DESC). Returns (page, next cursor, unread count). A notification
    whose record is damaged (its kind outside its set) is named in the page's ``unreadable``; the cursor
    comes from the rows' keys, so it moves past it."""
    where: list[str] = [_SHOWN]
    args: list[Any] = []
    if unread_only:
        where.append("read_at IS NULL")
    if cursor is not None:
        where.append("(created_at < ? OR (created_at = ? AND id < ?))")
        args += [cursor[0], cursor[0], cursor[1]]
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM notifications WHERE {' AND '.join(where)} ORDER BY created_at DESC, id DESC LIMIT ?",
        (*args, limit + 1),
    ).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = (int(rows[-1][6]), str(rows[-1][0])) if more and rows else None  # created_at, id
    return readable(rows, _checked, lambda r: str(r[0])), nxt, unread_count(conn)


def unread_count(conn: sqlite3.Connection) -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM notifications WHERE read_at IS NULL AND {_SHOWN}").fetchone()[0])


def mark_read(conn: sqlite3.Connection, ids: Sequence[str], now_ms: int) -> int:
    """Idempotent: ``read_at`` changes only from NULL. Returns rows changed."""
    changed = 0
    unique = list(dict.fromkeys(ids))
    for marks, chunk in in_chunks(unique):
        changed += conn.execute(
            f"UPDATE notifications SET read_at = ? WHERE read_at IS NULL AND id IN ({marks}) AND {_SHOWN}",
            (now_ms, *chunk),
        ).rowcount
    return changed


def mark_all_read(conn: sqlite3.Connection, now_ms: int) -> int:
    return conn.execute(f"UPDATE notifications SET read_at = ? WHERE read_at IS NULL AND {_SHOWN}", (now_ms,)).rowcount


def clear(conn: sqlite3.Connection, ids: Sequence[str] | None) -> int:
    """Delete the given notifications (all in the inbox when ``ids`` is None). Returns rows deleted."""
    if ids is None:
        return conn.execute(f"DELETE FROM notifications WHERE {_SHOWN}").rowcount
    deleted = 0
    unique = list(dict.fromkeys(ids))
    for marks, chunk in in_chunks(unique):
        deleted += conn.execute(f"DELETE FROM notifications WHERE id IN ({marks}) AND {_SHOWN}", chunk).rowcount
    return deleted
