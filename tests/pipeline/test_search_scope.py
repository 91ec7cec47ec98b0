"""``search.*`` with ``scope: "tools"`` through the real gateway (issue 24 item 9).

Reproduces: 'an error string from a tool result (what users of imported agent history search
for first) finds nothing'. The default scope keeps the spec's rule (tool rows' text is NULL in
the default index); the opt-in scope finds the row, its reply validated against the wire models.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from protocol.models import SearchQueryResult, SearchSessionsResult
from runtime.client import RpcError
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.revisions.helpers import query

ERROR = "psycopg.OperationalError: connection refused (port 5432); is the server running?"


async def test_tool_error_string_found_only_with_scope_tools(tmp_path):  # type: ignore[no-untyped-def]
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "start the app")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "t1", "role": "tool", "toolName": "Bash", "blocks": [
                    {"type": "tool_call", "callId": "c1", "name": "Bash", "args": {"command": "make run"},
                     "status": "error", "result": ERROR}]}})
            await index_caught_up(host)
            for query in ("OperationalError", "connection refused"):
                plain = await c.call("search.query", {"query": query})
                assert plain["results"] == []
                assert (await c.call("search.sessions", {"query": query}))["totalMessageMatches"] == 0
                hits = SearchQueryResult.model_validate(
                    await c.call("search.query", {"query": query, "scope": "tools"}))
                assert [(h.message_id, h.role, h.seq) for h in hits.results] == [("t1", "tool", 2)]
                assert query in hits.results[0].snippet
                one = SearchQueryResult.model_validate(
                    await c.call("search.query", {"query": query, "scope": "tools", "sessionId": sid}))
                assert [h.message_id for h in one.results] == ["t1"]
                sessions = SearchSessionsResult.model_validate(
                    await c.call("search.sessions", {"query": query, "scope": "tools"}))
                assert sessions.total_message_matches == 1
                assert [s.message_id for s in sessions.results[0].snippets] == ["t1"]
            with pytest.raises(RpcError) as info:
                await c.call("search.query", {"query": "refused", "scope": "everything"})
            assert info.value.data["code"] == "INVALID_PARAMS"


def _back_to_v27(db: Path) -> None:
    """Turn a current database into the v27 layout it upgraded from: no tool output tables."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA trusted_schema = ON")
        for trigger in ("tool_output_ai", "tool_output_ad", "tool_output_au", "messages_tool_output_ad"):
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute("DROP TABLE tool_output")
        conn.execute("DROP TABLE tool_fts")
        conn.execute("DROP TABLE known_sessions")  # v29
        for column in ("lease", "lease_turn_id", "lease_seq", "lease_client"):  # v30, v31
            conn.execute(f"ALTER TABLE turn_queue DROP COLUMN {column}")
        conn.execute("DROP INDEX idx_messages_window")  # v32
        conn.execute("PRAGMA user_version = 27")
    finally:
        conn.close()


async def test_upgrade_to_v28_makes_earlier_tool_output_searchable(tmp_path):  # type: ignore[no-untyped-def]
    """Tool rows indexed before v28 have no output row: the upgrade asks for a full reindex of their
    sessions at the next start (only those), which fills it from the transcript."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            with_tools = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": with_tools, "message": {
                "id": "t1", "role": "tool", "toolName": "Bash", "blocks": [
                    {"type": "tool_call", "callId": "c1", "name": "Bash", "args": {}, "status": "error",
                     "result": ERROR}]}})
            without = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": without, "message": msg("u1", "hello")})
            await index_caught_up(host)
        _back_to_v27(tmp_path / "pi.sqlite")
        assert query(tmp_path, "SELECT count(*) FROM messages WHERE role = 'tool'") == [(1,)]
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await index_caught_up(host)
            hits = await c.call("search.query", {"query": "OperationalError", "scope": "tools"})
            assert [h["messageId"] for h in hits["results"]] == ["t1"]
            assert (await c.call("search.query", {"query": "hello"}))["results"][0]["messageId"] == "u1"
        assert query(tmp_path, "PRAGMA user_version") == [(32,)]
        marks = dict(query(tmp_path, "SELECT id, indexed_len > 0 FROM sessions"))
        assert marks == {with_tools: 1, without: 1}
