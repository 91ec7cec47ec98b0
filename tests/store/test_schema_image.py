"""The copied schema databases of tests/schema_image.py are the databases ``apply_schema`` builds."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from store.indexing.database import apply_pragmas
from store.upgrade.schema import apply_schema
from tests.schema_image import fresh_file_db, fresh_memory_db


def _state(conn: sqlite3.Connection) -> dict[str, Any]:
    pragmas = ("user_version", "auto_vacuum", "journal_mode", "page_size", "page_count", "freelist_count",
               "encoding", "application_id", "foreign_keys", "synchronous")
    return {
        "schema": conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall(),
        "rows": {t: conn.execute(f'SELECT * FROM "{t}"').fetchall()
                 for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()},
        **{p: conn.execute(f"PRAGMA {p}").fetchone()[0] for p in pragmas},
        "integrity": conn.execute("PRAGMA integrity_check").fetchall(),
    }


def _usable(conn: sqlite3.Connection) -> list[Any]:
    """Rows through the FTS triggers and the ordinal trigger, read back by a trigram query."""
    conn.execute("PRAGMA trusted_schema = ON")
    conn.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s1', 't', 1, 1)")
    (ordinal,) = conn.execute("SELECT ordinal FROM sessions WHERE id = 's1'").fetchone()
    conn.execute("INSERT INTO messages(mid, id, session_id, seq, role, text, created_at) "
                 "VALUES (?, 'm1', 's1', 1, 'user', 'the quick brown fox', 1)", ((ordinal << 24) + 1,))
    return conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH '\"brown\"'").fetchall()


def test_the_memory_copy_is_the_database_apply_schema_builds() -> None:
    built = sqlite3.connect(":memory:", isolation_level=None)
    copied = fresh_memory_db()
    again = fresh_memory_db()
    try:
        apply_schema(built)
        assert _state(copied) == _state(built)
        assert _usable(copied) == _usable(built) != []
        # each copy is its own database: the rows written to one are in no other
        assert again.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    finally:
        for conn in (built, copied, again):
            conn.close()


def test_the_file_copy_is_the_database_apply_pragmas_and_apply_schema_build(tmp_path: Path) -> None:
    built = sqlite3.connect(tmp_path / "built.sqlite", isolation_level=None)
    apply_pragmas(built)
    apply_schema(built)
    copied = fresh_file_db(tmp_path / "copied.sqlite")
    again = fresh_file_db(tmp_path / "again.sqlite")
    try:
        assert _state(copied) == _state(built)
        assert _usable(copied) == _usable(built) != []
        assert again.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    finally:
        for conn in (built, copied, again):
            conn.close()
