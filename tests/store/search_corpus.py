"""Test helpers for search: a real-schema database and row builders.

Rows are inserted the way the indexer leaves them: ``text`` is the final answer
text (``store.transcripts.records.extract_text``: no thinking, NULL for tool rows), ``seq``
comes from ``sessions.last_seq``, ``mid`` is ``(sessions.ordinal << 24) + seq``, and
the FTS triggers of the real schema keep ``messages_fts`` in sync.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.transcripts.records import extract_text
from store.upgrade.schema import apply_schema, message_mid
from tests.schema_image import fresh_memory_db


@contextlib.contextmanager
def patched(module: Any, name: str, value: Any) -> Iterator[None]:
    """``module.name`` set to ``value`` inside the block (a hypothesis test cannot take ``monkeypatch``)."""
    assert hasattr(module, name), name
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def open_db(path: Path | str = ":memory:") -> sqlite3.Connection:
    """A new database with the whole schema (in memory: a copy of one built once, tests/schema_image.py)."""
    if str(path) == ":memory:":
        conn = fresh_memory_db()
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA trusted_schema = ON")
        return conn
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA trusted_schema = ON")
    apply_schema(conn)
    return conn


@dataclass
class Corpus:
    """Builds sessions/messages with deterministic ids and timestamps."""

    conn: sqlite3.Connection
    clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1_000_000))
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def project(self, path: str, name: str | None = None) -> int:
        now = next(self.clock)
        cur = self.conn.execute(
            "INSERT INTO projects(path, name, created_at, last_opened_at) VALUES (?,?,?,?)",
            (path, name if name is not None else path.rsplit("/", 1)[-1], now, now),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def session(
        self,
        sid: str | None = None,
        *,
        title: str = "",
        project_id: int | None = None,
        updated_at: int | None = None,
        deleted_at: int | None = None,
    ) -> str:
        sid = sid or f"s{next(self.ids)}"
        now = next(self.clock)
        self.conn.execute(
            "INSERT INTO sessions(id, title, project_id, deleted_at, created_at, updated_at) "
            "VALUES (?,?,?,?,?,?)",
            (sid, title, project_id, deleted_at, now, updated_at if updated_at is not None else now),
        )
        return sid

    def message(
        self,
        session_id: str,
        text: str | None,
        *,
        role: str = "user",
        deleted: bool = False,
        created_at: int | None = None,
        thinking: str | None = None,
        msg_id: str | None = None,
    ) -> tuple[str, int]:
        """Index one message built from blocks; returns ``(message id, mid)``."""
        blocks: list[dict[str, Any]] = []
        if thinking is not None:
            blocks.append({"type": "thinking", "text": thinking})
        if role == "tool":
            blocks.append({"type": "tool_call", "callId": "c", "name": "Read", "args": {}, "status": "ok",
                           "result": text})
        elif text is not None:
            blocks.append({"type": "text", "text": text})
        record = {"type": "message", "id": msg_id or f"m{next(self.ids)}", "role": role, "blocks": blocks}
        now = created_at if created_at is not None else next(self.clock)
        (seq,) = self.conn.execute(
            "UPDATE sessions SET last_seq = last_seq + 1, updated_at = MAX(updated_at, ?) "
            "WHERE id = ? RETURNING last_seq",
            (now, session_id),
        ).fetchone()
        (ordinal,) = self.conn.execute("SELECT ordinal FROM sessions WHERE id = ?", (session_id,)).fetchone()
        cur = self.conn.execute(
            "INSERT INTO messages(mid, id, session_id, seq, role, tool_name, text, created_at, deleted) "
            "VALUES (?,?,?,?,?,?,?,?,?)",
            (message_mid(ordinal, seq), record["id"], session_id, seq, role, "Read" if role == "tool" else None,
             extract_text(record), now, int(deleted)),
        )
        assert cur.lastrowid is not None
        return record["id"], cur.lastrowid
