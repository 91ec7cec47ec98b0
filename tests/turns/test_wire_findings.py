"""Issue 25 ("Wire and docs"), against a real in-process host: each test names the finding it reproduces."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import trio

from tests.hostile.wire import error_code, exchange, raw_connection, request
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.turns.turnkit import assistant, end, new_session, rpc_error, start


def _count(root: Path, sql: str, *args: Any) -> int:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return int(conn.execute(sql, args).fetchone()[0])
    finally:
        conn.close()


async def test_second_running_turn_is_refused(tmp_path: Path) -> None:
    """Issue 25: a second running turn was accepted (``session.startTurn`` while one runs). Now CONFLICT
    naming the running turn, nothing stored; once the first ended the next one starts; retrying the
    running turn's own start is still a replay."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            first = await start(c, sid, "t1")
            assert await start(c, sid, "t1") == first  # the same start again: a retry
            err = await rpc_error(start(c, sid, "t2"))
            assert err.data_code == "CONFLICT"
            assert err.data["runningTurnId"] == "t1" and err.data["turnId"] == "t2"
            assert _count(tmp_path, "SELECT COUNT(*) FROM turns WHERE session_id = ?", sid) == 1
            other = await new_session(c, "other")
            await start(c, other, "t9")  # another session runs its own turn meanwhile
            await end(c, sid, "t1")
            started = await start(c, sid, "t2")
            assert started["id"] == "t2" and started["status"] == "running"
            del host


async def test_checkpoint_under_an_ended_turn_is_refused(tmp_path: Path) -> None:
    """Issue 25: ``session.saveInflightMessage`` with another turn's ``turnId`` answered ``saved: true``
    (and replaced the running turn's checkpoint). Now CONFLICT; the running turn's checkpoint stays."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await start(c, sid, "t1")
            await end(c, sid, "t1")
            await start(c, sid, "t2")
            params = {"sessionId": sid, "turnId": "t2", "message": assistant("a2", "the running reply")}
            assert await c.call("session.saveInflightMessage", params) == {"saved": True}
            stale = {"sessionId": sid, "turnId": "t1", "message": assistant("a1", "from an ended turn")}
            err = await rpc_error(c.call("session.saveInflightMessage", stale))
            assert err.data_code == "CONFLICT" and (err.data["turnId"], err.data["status"]) == ("t1", "completed")
            body = json.loads((tmp_path / "sessions" / f"{sid}.inflight.json").read_bytes())
            assert body["turnId"] == "t2" and body["message"]["id"] == "a2"
            del host


async def test_same_message_id_with_other_content_is_a_conflict(tmp_path: Path) -> None:
    """Issue 25: the same message id with different content answered ``replayed: true``. Now
    IDEMPOTENCY_CONFLICT and the transcript keeps the first; the same content again is still a replay
    (also while the first is not indexed yet, and within one group of appends)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            first = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "hello")})
            assert first["replayed"] is False
            again = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "hello")})
            assert again == {**first, "replayed": True}
            err = await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "changed")}))
            assert err.data_code == "IDEMPOTENCY_CONFLICT" and err.data["messageId"] == "m1"
            await index_caught_up(host)
            err = await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "changed")}))
            assert err.data_code == "IDEMPOTENCY_CONFLICT"
            assert (await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "hello")}))[
                "replayed"] is True
            other_role = {**msg("m1", "hello"), "role": "assistant"}
            err = await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "message": other_role}))
            assert err.data_code == "IDEMPOTENCY_CONFLICT"
            lines = (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes()
            assert b"changed" not in lines and lines.count(b'"m1"') == 1


async def test_notification_creates_no_session_and_array_params_are_refused(tmp_path: Path) -> None:
    """Issue 25: a notification (no ``id``) could create a session, though notifications are for events
    only: now nothing is done (and nothing answered). And array ``params`` got a pydantic message: now
    INVALID_PARAMS "params must be an object", nothing created."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, raw_connection(host.url, host.token) as ws:
            note = {"jsonrpc": "2.0", "method": "session.create", "params": {"title": "from a notification"}}
            await ws.send_message(orjson.dumps(note).decode())
            await ws.send_message(orjson.dumps([note, {**note, "params": {"title": "batched"}}]).decode())
            answer = await exchange(ws, request("session.create", ["positional"], request_id=7))
            assert answer["id"] == 7 and error_code(answer) == "INVALID_PARAMS"
            assert "params must be an object" in answer["error"]["message"]
            listed = await exchange(ws, request("session.list", {}, request_id=8))
            assert listed["id"] == 8 and listed["result"]["sessions"] == []  # the first answer after the notes
            assert _count(tmp_path, "SELECT COUNT(*) FROM sessions") == 0
