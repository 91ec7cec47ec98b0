"""Baseline stores for ``scripts/bench``: what another agent store does per append.

:class:`SQLiteSessionBaseline` does what the OpenAI Agents SDK's ``SQLiteSession``
(``agents/memory/sqlite_session.py``) does in ``add_items`` for a file database:

* WAL journal; ``synchronous`` left at SQLite's default, which is FULL (set here
  explicitly, and read back into the figures), so every commit fsyncs the WAL;
* one transaction per ``add_items`` call: ``INSERT OR IGNORE`` of the session row,
  ``executemany`` INSERT of ``json.dumps(item)`` for each item into ``agent_messages``
  (``session_id, message_data TEXT, created_at DEFAULT CURRENT_TIMESTAMP``, indexed
  on ``(session_id, id)``), an UPDATE of the session row's ``updated_at``, COMMIT,
  and a rollback on any error;
* the call runs in a worker thread (the SDK: ``asyncio.to_thread``; here
  ``trio.to_thread.run_sync``) under one lock per database file, shared by every
  session on that file, so calls from concurrent sessions are serialised.

One difference, in the baseline's favour: the SDK opens a connection per session and
per worker thread (``threading.local``) and serialises them all with that one lock;
here every session shares one connection, so no connection is ever opened inside a
measured segment. The SQL per append, its fsyncs and the thread hop are the same.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

__all__ = ["SQLiteSessionBaseline"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS agent_sessions (
        session_id TEXT PRIMARY KEY,
        created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
        updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS agent_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        message_data TEXT NOT NULL,
        created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
        FOREIGN KEY (session_id) REFERENCES agent_sessions (session_id) ON DELETE CASCADE)""",
    "CREATE INDEX IF NOT EXISTS idx_agent_messages_session_id ON agent_messages (session_id, id)",
)

_SYNC_NAMES = ("OFF", "NORMAL", "FULL", "EXTRA")  # PRAGMA synchronous values 0-3


class SQLiteSessionBaseline:
    """``SQLiteSession.add_items`` on one database file, for any number of session ids."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        # Python's default isolation: the first INSERT opens a deferred transaction, commit() ends it
        self._conn = sqlite3.connect(str(path), check_same_thread=False)
        self.default_synchronous = int(self._conn.execute("PRAGMA synchronous").fetchone()[0])
        self.journal_mode = str(self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        self._conn.execute("PRAGMA synchronous=FULL")
        self.synchronous = int(self._conn.execute("PRAGMA synchronous").fetchone()[0])
        for ddl in _SCHEMA:
            self._conn.execute(ddl)
        self._conn.commit()

    def _add_items_sync(self, session_id: str, items: Sequence[Any]) -> None:
        with self._lock:
            conn = self._conn
            try:
                conn.execute("INSERT OR IGNORE INTO agent_sessions (session_id) VALUES (?)", (session_id,))
                conn.executemany("INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
                                 [(session_id, json.dumps(item)) for item in items])
                conn.execute("UPDATE agent_sessions SET updated_at = CURRENT_TIMESTAMP WHERE session_id = ?",
                             (session_id,))
                conn.commit()
            except BaseException:
                conn.rollback()
                raise

    async def add_items(self, session_id: str, items: Sequence[Any]) -> None:
        """One durable ``add_items`` call: one worker-thread hop, one transaction."""
        if items:
            await trio.to_thread.run_sync(self._add_items_sync, session_id, items)

    async def append_each(self, session_id: str, messages: Sequence[Any]) -> None:
        """One ``add_items([message])`` per message, each awaited before the next."""
        for m in messages:
            await self.add_items(session_id, [m])

    async def append_concurrently(self, work: Mapping[str, Sequence[Any]]) -> None:
        """One task per session, each appending its messages one at a time, all at once."""
        async with trio.open_nursery() as nursery:
            for sid, msgs in work.items():
                nursery.start_soon(self.append_each, sid, msgs)

    def counts(self) -> dict[str, int]:
        """Messages stored per session (to check that every append landed)."""
        with self._lock:
            rows = self._conn.execute("SELECT session_id, count(*) FROM agent_messages GROUP BY session_id")
            return {str(sid): int(n) for sid, n in rows}

    def describe(self) -> dict[str, Any]:
        return {"journalMode": self.journal_mode, "synchronous": _SYNC_NAMES[self.synchronous],
                "sqliteDefaultSynchronous": _SYNC_NAMES[self.default_synchronous]}

    def close(self) -> None:
        """Close the connection and delete the database (it is scratch)."""
        with self._lock:
            self._conn.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
