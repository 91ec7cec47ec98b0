"""Shared helpers for the SQLite schema/database/migration tests."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from store.indexing.database import apply_pragmas, open_writer
from store.upgrade.schema import apply_schema

NOW_MS = 1_700_000_000_000


def connect_plain(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def build_db(path: Path, statements: Sequence[str], version: int) -> None:
    """A real database file at ``version`` holding exactly ``statements``."""
    conn = connect_plain(path)
    try:
        apply_pragmas(conn)
        apply_schema(conn, statements=statements, version=version)
    finally:
        conn.close()


def add_session(
    conn: sqlite3.Connection, sid: str, texts: Sequence[str | None], *, now: int = NOW_MS
) -> list[int]:
    """Insert a session with one message per text; returns the message mids."""
    conn.execute(
        "INSERT INTO sessions(id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
        (sid, f"title {sid}", now, now),
    )
    has_ordinal = any(row[1] == "ordinal" for row in conn.execute("PRAGMA table_info(sessions)"))
    mids = []
    for seq, text in enumerate(texts, start=1):
        # v22+: mid = (ordinal << 24) + seq (enforced by a trigger); older layouts: rowid.
        mid_sql = "(SELECT ordinal FROM sessions WHERE id = ?2) * 16777216 + ?3" if has_ordinal else "NULL"
        cur = conn.execute(
            f"INSERT INTO messages(mid, id, session_id, seq, role, text, created_at)"
            f" VALUES ({mid_sql}, ?1, ?2, ?3, ?4, ?5, ?6)",
            (f"{sid}-m{seq}", sid, seq, "user" if text is not None else "tool", text, now),
        )
        assert cur.lastrowid is not None
        mids.append(cur.lastrowid)
    conn.execute("UPDATE sessions SET last_seq = ? WHERE id = ?", (len(texts), sid))
    return mids


def fts_hits(conn: sqlite3.Connection, needle: str) -> list[str]:
    """Message ids whose text the trigram index matches (quoted literal)."""
    literal = '"' + needle.replace('"', '""') + '"'
    rows = conn.execute(
        "SELECT m.id FROM messages_fts JOIN messages m ON m.mid = messages_fts.rowid"
        " WHERE messages_fts MATCH ? ORDER BY m.mid",
        (literal,),
    ).fetchall()
    return [row[0] for row in rows]


def fts_rowids(conn: sqlite3.Connection, needle: str) -> list[int]:
    """Raw FTS rowids for a match (no join: stale index entries would show)."""
    literal = '"' + needle.replace('"', '""') + '"'
    return [
        row[0]
        for row in conn.execute(
            "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid",
            (literal,),
        )
    ]


def schema_objects(conn: sqlite3.Connection) -> set[tuple[str, str, str]]:
    return {
        (row[0], row[1], row[2] or "")
        for row in conn.execute("SELECT type, name, sql FROM sqlite_master")
    }


def fresh_layout(tmp_path: Path, now_ms: int) -> set[tuple[str, str, str]]:
    """The schema objects of a fresh install (what every migration must end in)."""
    fresh_root = tmp_path / "fresh"
    fresh_root.mkdir()
    fresh, _ = open_writer(fresh_root / "pi.sqlite", quarantine_dir=fresh_root / "quarantine", now_ms=now_ms)
    try:
        return schema_objects(fresh)
    finally:
        fresh.close()


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())
