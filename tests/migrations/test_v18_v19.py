"""Seed schema v18 (``turn_queue.priority``, §4.6b, ADR 0265) and v19 (thinking level ``omit``, §4.5,
ADR 0295) open through the guarded chain (issue 23: the host answered SCHEMA_UNKNOWN for both).

The files are built from the seed's DDL (``seed_sql/v18.sql``, ``v19.sql``) with rows in every table.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store.indexing.database import OpenReport, open_writer
from store.upgrade.migrations import MigrationFailed
from store.upgrade.schema import SCHEMA_VERSION
from store.upgrade.seed_migrations import sessions_sql_with_omit
from tests.migrations.dbcheck import dump, sha256, sqlite3_cli, user_version
from tests.migrations.seedkit import assert_rows_present, build_seed_dir, expected_rows, seed_sql


def _open(root: Path) -> tuple[sqlite3.Connection, OpenReport]:
    return open_writer(root / "pi.sqlite", quarantine_dir=root / "quarantine", now_ms=1_800_000_000_000,
                       platform="linux")


def test_v19_file_keeps_its_promoted_queue_entry_and_omit_thinking_level(tmp_path: Path) -> None:
    """Issue 23: a v19 database was refused with SCHEMA_UNKNOWN; it opens with priority and omit kept."""
    seed = build_seed_dir(tmp_path, 19)
    before = dump(seed.db)
    conn, report = _open(tmp_path)
    try:
        assert report.migrated_from == 19 and report.steps[0] == 20
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert dict(conn.execute("SELECT id, priority FROM turn_queue")) == {"q-1": None, "q-2": 1, "q-3": None}
        assert conn.execute("SELECT thinking_level FROM sessions WHERE id = 's-import'").fetchone() == ("omit",)
        assert_rows_present(conn, expected_rows(seed))
        # the host's own schema still accepts the level for new rows
        conn.execute("UPDATE sessions SET thinking_level = 'omit' WHERE id = 's-alpha'")
    finally:
        conn.close()
    assert dump(tmp_path / "pi.sqlite.v19.bak") == before


def test_v18_file_gains_omit_with_every_session_row_and_index_kept(tmp_path: Path) -> None:
    """Issue 23: v18 (priority, no omit yet) walks 18 → 19 → 20 …; the v19 step widens the CHECK in place."""
    seed = build_seed_dir(tmp_path, 18)
    before = dump(seed.db)
    conn, report = _open(tmp_path)
    try:
        assert report.steps[:2] == [19, 20]
        assert dict(conn.execute("SELECT id, priority FROM turn_queue")) == {"q-1": None, "q-2": 1, "q-3": None}
        assert_rows_present(conn, expected_rows(seed))
    finally:
        conn.close()
    assert dump(tmp_path / "pi.sqlite.v18.bak") == before
    v19 = tmp_path / "pi.sqlite.v19.bak"
    assert sqlite3_cli(v19, "PRAGMA integrity_check; PRAGMA user_version;") == ["ok", "19"]
    check = sqlite3.connect(v19)
    try:
        check.execute("UPDATE sessions SET thinking_level = 'omit' WHERE id = 's-beta'")  # CHECK now allows it
        indexes = {n for (n,) in check.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                               "AND tbl_name = 'sessions' AND sql IS NOT NULL")}
        assert indexes == {"idx_sessions_updated", "idx_sessions_project", "idx_sessions_deleted"}
    finally:
        check.close()


def test_v17_file_gains_a_null_priority(tmp_path: Path) -> None:
    """v17 → v18 adds ``turn_queue.priority``: every pre-v18 entry is unpromoted (NULL)."""
    seed = build_seed_dir(tmp_path, 17)
    conn, report = _open(tmp_path)
    try:
        assert report.steps[:3] == [18, 19, 20]
        assert {p for (p,) in conn.execute("SELECT priority FROM turn_queue")} == {None}
        assert_rows_present(conn, expected_rows(seed))
    finally:
        conn.close()
    assert [p.name for p in report.backups][:3] == ["pi.sqlite.v17.bak", "pi.sqlite.v18.bak", "pi.sqlite.v19.bak"]


def test_a_v17_file_written_from_the_printed_ddl_keeps_its_priority_column(tmp_path: Path) -> None:
    """§4 prints priority in the v15 statement: a file made from that text is not altered twice."""
    statements = seed_sql(17).replace(", session_message_id TEXT\n",
                                      ", session_message_id TEXT, priority INTEGER\n")
    build_seed_dir(tmp_path, 17, statements=statements,
                   tweak=lambda rows: [r.update(priority=7) for r in rows["turn_queue"] if r["id"] == "q-2"])
    conn, _ = _open(tmp_path)
    try:
        assert conn.execute("SELECT priority FROM turn_queue WHERE id = 'q-2'").fetchone() == (7,)
    finally:
        conn.close()


def test_a_v18_sessions_table_without_a_known_thinking_check_fails_closed_byte_for_byte(tmp_path: Path) -> None:
    """The v19 step refuses a ``sessions`` it cannot widen: rolled back, the file exactly as it was."""
    old = seed_sql(18)
    start = old.index("CHECK (thinking_level IN (")
    end = old.index(")),", start) + len(")),")
    statements = old[:start] + "CHECK (length(thinking_level) > 0)," + old[end:]
    seed = build_seed_dir(tmp_path, 18, statements=statements)
    digest = sha256(seed.db)
    with pytest.raises(MigrationFailed, match="thinking_level CHECK"):
        _open(tmp_path)
    assert sha256(seed.db) == digest
    assert user_version(seed.db) == 18


def test_omit_is_added_once_to_the_check_list() -> None:
    sql = "CREATE TABLE sessions (t TEXT CHECK (thinking_level IN ('off', 'max')), x INT)"
    widened = sessions_sql_with_omit(sql)
    assert widened == "CREATE TABLE sessions (t TEXT CHECK (thinking_level IN ('off', 'max', 'omit')), x INT)"
    assert sessions_sql_with_omit(widened) is None
