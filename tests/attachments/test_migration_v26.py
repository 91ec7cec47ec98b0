"""The v25→v26 step (attachment metadata, deletion state, reference marks) is additive and ends in
exactly a fresh install's layout."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from store.indexing.database import OpenReport, open_writer
from store.upgrade.migrations import ddl_for_version
from store.upgrade.schema import SCHEMA_VERSION
from tests.store._sqlite_helpers import (
    NOW_MS,
    add_session,
    build_db,
    connect_plain,
    fresh_layout,
    schema_objects,
    user_version,
)


def _open(root: Path) -> tuple[sqlite3.Connection, OpenReport]:
    return open_writer(root / "pi.sqlite", quarantine_dir=root / "quarantine", now_ms=NOW_MS)


def test_v25_database_gains_attachment_metadata_additively(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Attachments record kind, MIME type, Blob bytes, trust, provenance, source, node or Run
    references, deletion state, and optional page or image metadata." Rows kept, no backup taken, an older
    build's half-finished eviction (``marked_for_eviction = 1``) becomes ``evicting`` for the next GC to
    finish, and the layout equals a fresh install's."""
    db = tmp_path / "pi.sqlite"
    build_db(db, ddl_for_version(25), 25)
    conn = connect_plain(db)
    try:
        add_session(conn, "s1", ["hello"])
        conn.execute("INSERT INTO attachment_blobs(sha256, size_bytes, mime_type, created_at, last_used_at, "
                     "marked_for_eviction) VALUES ('a', 1, 'image/png', 1, 1, 0), ('b', 2, NULL, 1, 1, 1)")
        conn.execute("INSERT INTO attachment_refs(sha256, session_id, message_id) VALUES ('a', 's1', 'm1')")
        conn.commit()
    finally:
        conn.close()
    conn, report = _open(tmp_path)
    try:
        assert report.migrated_from == 25 and report.backups == []
        assert user_version(conn) == SCHEMA_VERSION
        assert conn.execute("SELECT sha256, mime_type, deletion_state, kind FROM attachment_blobs ORDER BY 1"
                            ).fetchall() == [("a", "image/png", "live", None), ("b", None, "evicting", None)]
        assert conn.execute("SELECT sha256, origin, evicted_at FROM attachment_refs").fetchall() == [
            ("a", "client", None)]
        migrated = schema_objects(conn)
    finally:
        conn.close()
    assert migrated == fresh_layout(tmp_path, NOW_MS)
