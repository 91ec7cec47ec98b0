"""Tool output search, opt-in (issue 24 item 9; seed 003 §4.7: ``text ... NULL for tool rows``).

Rows go through the real indexer (``store.indexing.index``), so ``tool_output`` and
``tool_fts`` are filled the way a host fills them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store.errors import InvalidCursor, InvalidInput, SessionNotFound
from store.indexing import index
from store.indexing.database import apply_pragmas
from store.indexing.index import TOOL_OUTPUT_MAX_CHARS, IndexRecord, tool_output_text
from store.search.search import search_messages, search_sessions
from store.upgrade.migrations import ddl_for_version, migrate
from tests.dbkit import NOW
from tests.store._sqlite_helpers import NOW_MS, build_db, connect_plain, fresh_layout, schema_objects
from tests.store.search_corpus import Corpus

ERROR = "connect ECONNREFUSED 127.0.0.1:5432 at TCPConnectWrap.afterConnect"


def tool_row(mid: str, result: Any, *, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": "tool", "toolName": "Bash", "blocks": [
        {"type": "tool_call", "callId": f"c-{mid}", "name": "Bash", "args": {"command": "psql -c 'select 1'"},
         "status": status, "result": result, **extra}]}


def text_row(mid: str, role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": role, "blocks": [{"type": "text", "text": text}]}


def add(conn: sqlite3.Connection, sid: str, *records: dict[str, Any]) -> None:
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None:
        index.insert_session(conn, sid, now_ms=NOW, title=f"session {sid}")
    items = [IndexRecord({**r, "createdAt": None}, offset=i * 100, length=100) for i, r in enumerate(records)]
    conn.execute("BEGIN")
    index.index_messages(conn, sid, items, indexed_len=None, file_epoch=None, now_ms=NOW)
    conn.execute("COMMIT")


def ids(result: dict[str, Any]) -> list[str]:
    return [r["messageId"] for r in result["results"]]


def test_a_tool_results_error_string_is_found_with_scope_tools_not_without(conn: sqlite3.Connection) -> None:
    """Issue 24: 'an error string from a tool result ... finds nothing; the spec keeps tool rows'
    text NULL for the default index, and nothing says so'. The default scope stays as the spec
    says; scope "tools" finds the row."""
    add(conn, "s1", text_row("u1", "user", "why does the database not start?"),
        tool_row("t1", ERROR, status="error"), text_row("a1", "assistant", "Postgres is not running."))
    for query in ("ECONNREFUSED", "econnrefused", "127.0.0.1:5432", "afterConnect"):
        assert ids(search_messages(conn, query)) == [], query
        assert search_sessions(conn, query)["totalMessageMatches"] == 0, query
        found = search_messages(conn, query, scope="tools")
        assert ids(found) == ["t1"], query
        hit = found["results"][0]
        assert hit["role"] == "tool" and hit["sessionId"] == "s1" and hit["seq"] == 2
        assert query.lower() in hit["snippet"].lower()
        sessions = search_sessions(conn, query, scope="tools")
        assert sessions["totalSessions"] == 1 and sessions["totalMessageMatches"] == 1
        assert [s["messageId"] for s in sessions["results"][0]["snippets"]] == ["t1"]
    # the default scope still finds the user/assistant text, and the tool scope does not
    assert ids(search_messages(conn, "Postgres")) == ["a1"]
    assert ids(search_messages(conn, "Postgres", scope="tools")) == []
    # the arguments are not output
    assert ids(search_messages(conn, "psql", scope="tools")) == []


def test_short_non_ascii_and_cjk_queries_take_the_exact_rule(conn: sqlite3.Connection) -> None:
    """The tool scope uses the search's one matching rule for every query shape (scan and trigram)."""
    add(conn, "s1", tool_row("t1", "Fehler: ÄPFEL nicht gefunden"), tool_row("t2", "数据库连接失败"),
        tool_row("t3", "ok"), tool_row("t4", [{"type": "text", "text": "x=1 50% done"}]))
    assert ids(search_messages(conn, "äpfel", scope="tools")) == ["t1"]
    assert ids(search_messages(conn, "连接", scope="tools")) == ["t2"]  # 2 characters: a scan
    assert ids(search_messages(conn, "数据库连接", scope="tools")) == ["t2"]
    assert ids(search_messages(conn, "ok", scope="tools")) == ["t3"]
    assert ids(search_messages(conn, "50%", scope="tools")) == ["t4"]
    assert ids(search_messages(conn, "5_%", scope="tools")) == []  # % and _ are literal


def test_results_are_bounded_and_paged(conn: sqlite3.Connection) -> None:
    """Bounded per result: a snippet of about 120 characters, never the whole output; only the first
    TOOL_OUTPUT_MAX_CHARS characters of an output are searchable."""
    huge = "x" * 5000 + " NEEDLE-42 " + "y" * 5000
    past_cap = "z" * TOOL_OUTPUT_MAX_CHARS + " LATE-NEEDLE"
    add(conn, "s1", *[tool_row(f"t{i}", f"run {i}: {huge}") for i in range(5)], tool_row("late", past_cap))
    first = search_messages(conn, "needle-42", scope="tools", limit=2)
    assert len(first["results"]) == 2 and first["nextCursor"]
    assert all(len(r["snippet"]) <= 122 for r in first["results"])
    rest = search_messages(conn, "needle-42", scope="tools", limit=10, cursor=first["nextCursor"])
    assert ids(first) + ids(rest) == ["t4", "t3", "t2", "t1", "t0"] and rest["nextCursor"] is None
    with pytest.raises(InvalidCursor):  # a cursor belongs to its scope
        search_messages(conn, "needle-42", limit=2, cursor=first["nextCursor"])
    assert ids(search_messages(conn, "late-needle", scope="tools")) == []
    assert len(tool_output_text(tool_row("big", past_cap)) or "") == TOOL_OUTPUT_MAX_CHARS


def test_tombstones_trash_session_filter_and_reindex(conn: sqlite3.Connection) -> None:
    """Tombstoned rows and trashed sessions never match; a session filter reads only that session;
    a replaced row's output replaces the old one; a cleared session takes its outputs along."""
    add(conn, "s1", tool_row("t1", "Traceback: KeyError 'zebra'"), tool_row("t2", "KeyError 'okapi'"))
    add(conn, "s2", tool_row("t3", "KeyError 'zebra'"))
    assert ids(search_messages(conn, "KeyError", scope="tools")) == ["t3", "t2", "t1"]
    assert ids(search_messages(conn, "KeyError", session_id="s1", scope="tools")) == ["t2", "t1"]
    with pytest.raises(SessionNotFound):
        search_messages(conn, "KeyError", session_id="nope", scope="tools")
    index.set_deleted(conn, "s1", "t1", True)
    assert ids(search_messages(conn, "zebra", scope="tools")) == ["t3"]
    conn.execute("UPDATE sessions SET deleted_at = 1 WHERE id = 's2'")
    assert ids(search_messages(conn, "zebra", scope="tools")) == []
    assert search_sessions(conn, "zebra", scope="tools")["totalSessions"] == 0
    conn.execute("UPDATE sessions SET deleted_at = NULL WHERE id = 's2'")
    add(conn, "s1", tool_row("t2", "ValueError 'okapi'"))  # the same id again: replaced in place
    assert ids(search_messages(conn, "okapi", scope="tools")) == ["t2"]
    assert ids(search_messages(conn, "KeyError 'okapi'", scope="tools")) == []
    conn.execute("BEGIN")
    index.clear_session_index(conn, "s1")
    conn.execute("COMMIT")
    assert conn.execute("SELECT count(*) FROM tool_output").fetchone()[0] == 1  # s2's row
    assert ids(search_messages(conn, "okapi", scope="tools")) == []
    conn.execute("INSERT INTO tool_fts(tool_fts, rank) VALUES ('integrity-check', 0)")


def test_output_text_of_the_result_shapes() -> None:
    """Results as strings, content parts, objects and tool_result blocks; errors; no arguments."""
    assert tool_output_text(tool_row("a", "plain")) == "plain"
    parts = [{"type": "text", "text": "one"}, {"type": "image", "data": "QUJD"}]
    assert tool_output_text(tool_row("a", parts)) == "one"
    assert tool_output_text(tool_row("a", {"stdout": "out", "stderr": "err", "exitCode": 1})) == "out\nerr"
    assert tool_output_text(tool_row("a", None, error="denied by policy")) == "denied by policy"
    assert tool_output_text({"role": "tool", "blocks": [{"type": "tool_result", "content": "legacy"}],
                             "meta": {"error": "timeout"}}) == "legacy\ntimeout"
    assert tool_output_text(text_row("u", "user", "not a tool")) is None
    assert tool_output_text(tool_row("a", None)) is None


def test_scope_is_checked(conn: sqlite3.Connection) -> None:
    for bad in ("tool", "", "MESSAGES"):
        with pytest.raises(InvalidInput):
            search_messages(conn, "abc", scope=bad)
        with pytest.raises(InvalidInput):
            search_sessions(conn, "abc", scope=bad)


def test_v26_database_gains_tool_search_and_asks_to_reindex_sessions_with_tool_rows(tmp_path: Path) -> None:
    """The v28 step is additive (no backup); it marks for a full reindex exactly the sessions holding
    tool rows (their output rows come from the transcript), and ends in a fresh install's layout."""
    db = tmp_path / "pi.sqlite"
    build_db(db, ddl_for_version(26), 26)
    conn = connect_plain(db)
    try:
        apply_pragmas(conn)
        corpus = Corpus(conn)
        tools, plain = corpus.session("s1"), corpus.session("s2")
        corpus.message(tools, "what failed?")
        corpus.message(tools, ERROR, role="tool")
        corpus.message(plain, "hello")
        conn.execute("UPDATE sessions SET indexed_len = 500")
        result = migrate(conn, db, now_ms=NOW_MS)
        assert result.applied == [27, 28, 29, 30, 31, 32] and result.backups == []
        assert dict(conn.execute("SELECT id, indexed_len FROM sessions")) == {tools: 0, plain: 500}
        assert conn.execute("SELECT count(*) FROM tool_output").fetchone()[0] == 0
        assert search_sessions(conn, "what failed")["totalMessageMatches"] == 1  # the default index as it was
        assert schema_objects(conn) == fresh_layout(tmp_path, NOW_MS)
    finally:
        conn.close()


def test_text_after_a_nul_is_found_in_messages_and_tool_output(conn: sqlite3.Connection) -> None:
    """SQLite's trigram tokenizer and LIKE stop reading a value at a NUL: the index stores a NUL as
    U+FFFD, so what follows it is found like any other text (long and short queries, both scopes),
    and the transcript record keeps the NUL."""
    nul = text_row("m1", "user", "before\x00after NULKW zz")
    add(conn, "s1", nul, text_row("m2", "user", "control NULKW zz"), tool_row("t1", "pre\x00post TOOLNULKW"))
    assert nul["blocks"][0]["text"] == "before\x00after NULKW zz"
    for query, want in (("before", ["m1"]), ("after", ["m1"]), ("fter", ["m1"]), ("zz", ["m1", "m2"]),
                        ("NULKW", ["m1", "m2"]), ("r N", ["m1"])):
        assert sorted(ids(search_messages(conn, query))) == want, query
        assert search_sessions(conn, query)["totalMessageMatches"] == len(want), query
    assert ids(search_messages(conn, "TOOLNULKW", scope="tools")) == ["t1"]
    assert ids(search_messages(conn, "post", scope="tools")) == ["t1"]
    assert ids(search_messages(conn, "before after")) == []  # the NUL is not a space
