"""The fresh DDL: every seed §4 object, our additions, and FTS5 trigram sync."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.indexing.database import apply_pragmas
from store.search.search_text import TRIGRAM_TEXT_HAZARDS
from store.upgrade.schema import DDL, FRESH_DDL, MAX_SEQ, SCHEMA_VERSION, apply_schema, message_mid

from ._sqlite_helpers import NOW_MS, add_session, connect_plain, fts_hits, fts_rowids, user_version

SEED_TABLES = {
    "kv", "projects", "providers", "models", "sessions", "session_import_origins",
    "turns", "plan_approvals", "turn_queue", "session_collaboration_links",
    "session_collaboration_messages", "messages", "messages_fts", "message_revisions",
    "artifacts", "scheduled_tasks", "task_runs", "secrets_meta", "audit_log",
    "notifications",
}  # fmt: skip
OUR_TABLES = {
    "compactions", "command_receipts", "run_snapshots", "attachment_blobs",
    "attachment_refs", "boot_reports", "search_hazard", "approvals", "interactions",
    "permission_rules", "thread_meta", "tool_output", "tool_fts", "known_sessions",
}  # fmt: skip
SEED_INDEXES = {
    "idx_providers_owner", "idx_sessions_updated", "idx_sessions_project",
    "idx_sessions_deleted", "idx_session_import_origins_plugin", "idx_turns_session",
    "idx_turns_ended_at", "idx_plan_approvals_session", "idx_plan_approvals_pending",
    "idx_plan_approvals_one_pending_session", "idx_plan_approvals_execution_queue",
    "idx_plan_approvals_execution_id", "idx_turn_queue_session", "idx_turn_queue_idempotency",
    "idx_session_collaboration_turn", "idx_session_collaboration_receipt",
    "idx_message_revisions_root", "idx_artifacts_time", "idx_task_runs", "idx_audit_ts",
    "idx_audit_session", "idx_notifications_created", "idx_notifications_unread",
}  # fmt: skip
SEED_TRIGGERS = {"messages_ai", "messages_ad", "messages_au"}
OUR_TRIGGERS = {"messages_mid_insert", "messages_mid_update", "sessions_ordinal", "tool_output_ai", "tool_output_ad",
                "tool_output_au", "messages_tool_output_ad"}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = connect_plain(tmp_path / "pi.sqlite")
    apply_pragmas(conn)
    apply_schema(conn)
    try:
        yield conn
    finally:
        conn.close()


def _names(conn: sqlite3.Connection, kind: str) -> set[str]:
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = ? AND name NOT LIKE 'sqlite_%'", (kind,)
    )
    return {row[0] for row in rows}


def _columns(conn: sqlite3.Connection, table: str) -> dict[str, tuple[str, int, str | None]]:
    return {
        row[1]: (row[2], row[3], row[4])  # type, notnull, default
        for row in conn.execute(f"PRAGMA table_info({table})")
    }


def test_fresh_schema_has_every_seed_table_index_and_trigger(db: sqlite3.Connection) -> None:
    assert user_version(db) == SCHEMA_VERSION == 32
    tables = _names(db, "table")
    fts_shadow = {t for t in tables if t.startswith(("messages_fts_", "tool_fts_"))}
    assert tables - fts_shadow == SEED_TABLES | OUR_TABLES
    assert SEED_INDEXES | {"idx_messages_turn", "idx_sessions_ordinal", "idx_messages_created"} <= _names(db, "index")
    assert _names(db, "trigger") == SEED_TRIGGERS | OUR_TRIGGERS
    fts_sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'").fetchone()[0]
    assert "tokenize='trigram'" in fts_sql and "content=''" in fts_sql
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_seed_columns_and_our_additions(db: sqlite3.Connection) -> None:
    messages = _columns(db, "messages")
    assert messages["line_offset"][:2] == ("INTEGER", 0)
    assert messages["line_len"][:2] == ("INTEGER", 0)
    assert messages["deleted"] == ("INTEGER", 1, "0")
    sessions = _columns(db, "sessions")
    assert sessions["indexed_len"] == ("INTEGER", 1, "0")
    assert sessions["file_epoch"][:2] == ("TEXT", 0)
    assert _columns(db, "plan_approvals")["kind"] == ("TEXT", 1, "'plan'")
    queue = _columns(db, "turn_queue")
    assert queue["priority"][:2] == ("INTEGER", 0)
    assert queue["session_message_id"][:2] == ("TEXT", 0)
    assert _columns(db, "providers")["owner_plugin_id"][:2] == ("TEXT", 0)
    # The messages (session_id, seq) hot path is covered by the UNIQUE constraint.
    plan = db.execute(
        "EXPLAIN QUERY PLAN SELECT mid FROM messages WHERE session_id = ? AND seq > ?", ("s", 1)
    ).fetchall()
    assert any("sqlite_autoindex_messages" in str(row[-1]) for row in plan)


def test_thinking_level_check_accepts_omit_and_rejects_unknown(db: sqlite3.Connection) -> None:
    insert = (
        "INSERT INTO sessions(id, thinking_level, created_at, updated_at) VALUES (?, ?, 1, 1)"
    )
    for level in ("off", "minimal", "low", "medium", "high", "xhigh", "max", "omit"):
        db.execute(insert, (f"s-{level}", level))
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        db.execute(insert, ("s-bad", "extreme"))


def test_plan_approval_kind_defaults_to_plan_and_rejects_other_kinds(
    db: sqlite3.Connection,
) -> None:
    add_session(db, "s1", [])
    insert = (
        "INSERT INTO plan_approvals(request_id, session_id, turn_id, tool_call_id, plan_json,"
        " status, created_at, updated_at{extra}) VALUES (?, 's1', 't', ?, '# plan', 'approved',"
        " 1, 1{marks})"
    )
    db.execute(insert.format(extra="", marks=""), ("r1", "c1"))
    assert db.execute("SELECT kind FROM plan_approvals").fetchone() == ("plan",)
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(insert.format(extra=", kind", marks=", ?"), ("r2", "c2", "essay"))


def test_fts_follows_insert_update_and_delete_for_ascii_and_cjk(db: sqlite3.Connection) -> None:
    mids = add_session(
        db,
        "s1",
        ["Refactor the websocket gateway today", "今天天气很好，我们去公园散步", None],
    )
    assert fts_hits(db, "socket gate") == ["s1-m1"]
    assert fts_hits(db, "天气很好") == ["s1-m2"]
    assert fts_hits(db, "公园散") == ["s1-m2"]
    # a tool row (text NULL) is not indexed and does not break the triggers
    assert db.execute("SELECT count(*) FROM messages_fts").fetchone()[0] == 2

    db.execute("UPDATE messages SET text = ? WHERE mid = ?", ("数据库迁移已经完成", mids[1]))
    assert fts_hits(db, "天气很好") == []
    assert fts_rowids(db, "天气很好") == []
    assert fts_hits(db, "迁移已经") == ["s1-m2"]

    db.execute("UPDATE messages SET text = NULL WHERE mid = ?", (mids[0],))
    assert fts_rowids(db, "socket") == []
    db.execute("UPDATE messages SET text = ? WHERE mid = ?", ("back with sockets", mids[0]))
    assert fts_hits(db, "socket") == ["s1-m1"]

    db.execute("DELETE FROM messages WHERE mid = ?", (mids[1],))
    assert fts_rowids(db, "迁移已经") == []
    db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


def test_session_delete_cascades_rows_and_fts_entries(db: sqlite3.Connection) -> None:
    add_session(db, "gone", ["shared phrase alpha", "仅在这里出现的句子"])
    add_session(db, "kept", ["shared phrase beta"])
    db.execute("INSERT INTO turns(id, session_id, started_at) VALUES ('t1', 'gone', 1)")
    db.execute(
        "INSERT INTO compactions(session_id, id, line_offset, line_len, created_at)"
        " VALUES ('gone', 'cp1', 10, 20, 1)"
    )
    db.execute(
        "INSERT INTO run_snapshots(turn_id, version, digest, snapshot_json, size_bytes,"
        " created_at) VALUES ('t1', 1, 'd', '{}', 2, 1)"
    )
    db.execute("INSERT INTO attachment_refs(sha256, session_id, message_id) VALUES ('h', 'gone', 'm')")
    db.execute(
        "INSERT INTO command_receipts(client_id, submission_id, method, status, fingerprint,"
        " session_id, created_at) VALUES ('c', 'sub1', 'session.delete', 'ok', 'f', 'gone', 1)"
    )
    assert fts_hits(db, "shared phrase") == ["gone-m1", "kept-m1"]

    db.execute("DELETE FROM sessions WHERE id = 'gone'")

    assert fts_hits(db, "shared phrase") == ["kept-m1"]
    assert fts_rowids(db, "这里出现") == []
    cascaded = {
        "messages": "SELECT count(*) FROM messages WHERE session_id = 'gone'",
        "turns": "SELECT count(*) FROM turns WHERE session_id = 'gone'",
        "compactions": "SELECT count(*) FROM compactions WHERE session_id = 'gone'",
        "run_snapshots": "SELECT count(*) FROM run_snapshots",
        "attachment_refs": "SELECT count(*) FROM attachment_refs",
    }
    for table, query in cascaded.items():
        assert db.execute(query).fetchone()[0] == 0, table
    assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    # the delete's receipt outlives its session (no foreign key on purpose)
    assert db.execute("SELECT session_id FROM command_receipts").fetchall() == [("gone",)]
    db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


def _layout(statements: tuple[str, ...]) -> tuple[list[tuple[str, ...]], dict[str, list[tuple[object, ...]]]]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_schema(conn, statements=statements)
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        tables = [row[1] for row in rows if row[0] == "table"]
        columns = {name: conn.execute(f"PRAGMA table_xinfo({name})").fetchall() for name in tables}
        return rows, columns
    finally:
        conn.close()


def test_the_fresh_ddl_makes_the_schema_the_statements_make_one_by_one() -> None:
    """A new database runs ``FRESH_DDL`` (each ``ALTER TABLE … ADD COLUMN`` written into its table's ``CREATE``):
    the same ``sqlite_master`` text, to the byte, and the same columns in the same order as the DDL's statements
    run one by one, which is also what the migrations' ALTERs make of an older database."""
    alters = [st for st in DDL if st.upper().startswith("ALTER TABLE")]
    assert alters, "the DDL adds columns: the fold has something to do"
    assert not [st for st in FRESH_DDL if st.upper().startswith("ALTER TABLE")]
    assert len(FRESH_DDL) == len(DDL) - len(alters)
    assert _layout(FRESH_DDL) == _layout(DDL)


def test_apply_schema_is_one_transaction(tmp_path: Path) -> None:
    conn = connect_plain(tmp_path / "pi.sqlite")
    try:
        apply_pragmas(conn)
        broken = (*DDL[:5], "CREATE TABLE kv (x)")  # duplicate name fails mid-way
        with pytest.raises(sqlite3.OperationalError, match="already exists"):
            apply_schema(conn, statements=broken)
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        assert user_version(conn) == 0
        assert not conn.in_transaction
        apply_schema(conn)  # the empty file is still a fresh database
        assert user_version(conn) == SCHEMA_VERSION
    finally:
        conn.close()


def test_apply_schema_refuses_a_non_empty_database(db: sqlite3.Connection) -> None:
    db.execute("INSERT INTO kv VALUES ('app', 'k', '1', ?)", (NOW_MS,))
    with pytest.raises(ValueError, match="empty database"):
        apply_schema(db)
    assert db.execute("SELECT count(*) FROM kv").fetchone()[0] == 1


def test_apply_schema_needs_autocommit_connection(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.sqlite")  # default isolation level
    try:
        with pytest.raises(ValueError, match="isolation_level=None"):
            apply_schema(conn)
    finally:
        conn.close()


def _fts_state(db: sqlite3.Connection) -> tuple[set[int], set[int]]:
    """(rowids in messages_fts, mids in search_hazard)."""
    fts = {r[0] for r in db.execute("SELECT rowid FROM messages_fts")}
    hazard = {r[0] for r in db.execute("SELECT mid FROM search_hazard")}
    return fts, hazard


def _expected_fts_state(db: sqlite3.Connection) -> tuple[set[int], set[int]]:
    rows = db.execute("SELECT mid, role, text, deleted FROM messages").fetchall()
    live = {mid: text for mid, role, text, deleted in rows
            if text is not None and role in ("user", "assistant") and not deleted}
    return set(live), {mid for mid, text in live.items() if any(ch in text for ch in TRIGRAM_TEXT_HAZARDS)}


def test_sessions_get_ordinals_and_mids_encode_ordinal_and_seq(db: sqlite3.Connection) -> None:
    a = add_session(db, "a", ["one", "two"])
    b = add_session(db, "b", ["three"])
    ordinals = dict(db.execute("SELECT id, ordinal FROM sessions").fetchall())
    assert ordinals == {"a": 1, "b": 2}
    assert a == [message_mid(1, 1), message_mid(1, 2)] == [(1 << 24) + 1, (1 << 24) + 2]
    assert b == [message_mid(2, 1)]
    explicit = "INSERT INTO sessions(id, ordinal, created_at, updated_at) VALUES ('c', 40, 1, 1)"
    db.execute(explicit)
    db.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('d', 1, 1)")
    assert db.execute("SELECT ordinal FROM sessions WHERE id = 'd'").fetchone() == (41,)
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("UPDATE sessions SET ordinal = 1 WHERE id = 'b'")  # unique


_INSERT_M = (
    "INSERT INTO messages(mid, id, session_id, seq, role, text, created_at) "
    "VALUES (?, 'm', 'a', ?, 'user', 'x', 1)"
)


@pytest.mark.parametrize(
    ("mid", "seq"),
    [(None, 1), ((1 << 24) + 2, 1), ((2 << 24) + 1, 1), (1 << 24, 0), ((1 << 24) + MAX_SEQ + 1, MAX_SEQ + 1)],
)
def test_a_message_row_with_a_wrong_mid_is_refused(db: sqlite3.Connection, mid: int | None, seq: int) -> None:
    add_session(db, "a", [])
    with pytest.raises(sqlite3.IntegrityError, match="messages.mid must be"):
        db.execute(_INSERT_M, (mid, seq))
    db.execute(_INSERT_M, (message_mid(1, MAX_SEQ), MAX_SEQ))
    with pytest.raises(sqlite3.IntegrityError, match="messages.mid must be"):
        db.execute("UPDATE messages SET seq = 5 WHERE id = 'm'")


def test_fts_holds_exactly_the_searchable_rows_through_every_change(db: sqlite3.Connection) -> None:
    mids = add_session(db, "s", ["plain text", "İstanbul trip", "ſtreet", None, "noncharacter \uffff here"])
    tool = db.execute("SELECT mid FROM messages WHERE text IS NULL").fetchone()[0]
    assert _fts_state(db) == _expected_fts_state(db)
    assert _fts_state(db)[1] == {mids[1], mids[2]}
    changes = [
        ("UPDATE messages SET deleted = 1 WHERE mid = ?", (mids[1],)),  # out of the index
        ("UPDATE messages SET deleted = 0 WHERE mid = ?", (mids[1],)),  # back in
        ("UPDATE messages SET role = 'system' WHERE mid = ?", (mids[0],)),
        ("UPDATE messages SET role = 'assistant' WHERE mid = ?", (mids[0],)),
        ("UPDATE messages SET text = 'tool result' WHERE mid = ?", (tool,)),  # tool role: still out
        ("UPDATE messages SET role = 'user' WHERE mid = ?", (tool,)),  # now searchable
        ("UPDATE messages SET text = 'no hazard now' WHERE mid = ?", (mids[2],)),
        ("UPDATE messages SET text = 'KELVIN İ' WHERE mid = ?", (mids[0],)),
        ("UPDATE messages SET deleted = 1, text = 'gone ſ' WHERE mid = ?", (mids[4],)),
        ("UPDATE messages SET line_offset = 7 WHERE mid = ?", (mids[1],)),  # not a searched column
        ("DELETE FROM messages WHERE mid = ?", (mids[1],)),
        ("DELETE FROM messages WHERE mid = ?", (mids[4],)),
    ]
    for sql, args in changes:
        db.execute(sql, args)
        assert _fts_state(db) == _expected_fts_state(db), sql
        db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    assert fts_rowids(db, "street") == [] and fts_rowids(db, "tool res") == [tool]
    assert fts_rowids(db, "kelvin") == [mids[0]]
