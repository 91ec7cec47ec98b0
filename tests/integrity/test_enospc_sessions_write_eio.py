"""session.appendMessage whose write fails with EIO (cut back to its previous length, RELIABILITY rule 2)
is retried in the same process; only a failed fsync (rule 7) fails the session's storage until a boot.

A `pi-host serve` process raises ``OSError(EIO)`` at ``append.before_write`` / ``append.after_write``
(``RT_CRASHPOINT=<point>:1:eio``): the writer rolled the file back and stayed usable, but the session's
actor marked the session's storage failed for any I/O error, so every retry was refused until a restart,
and the restart aborted the running turn the prompt belonged to: the retry then answered CONFLICT.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.client import RpcError
from tests.hostkit import client_for, failed_then_retried, faulted_client, inprocess_host, msg

CLIENT = "cli-1"
PROMPT = {"sessionId": "s1", "message": msg("u2", "go", turnId="t1"), "submissionId": "sub-1"}


async def _setup(root: Path) -> None:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await c.call("session.create", {"sessionId": "s1", "title": "First"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})


@pytest.mark.parametrize("point", ["append.before_write", "append.after_write"])
async def test_prompt_retried_after_a_write_eio_in_the_same_process(tmp_path: Path, point: str) -> None:
    await _setup(tmp_path)
    async with faulted_client(tmp_path, f"{point}:1:eio", client_id=CLIENT) as c:
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        retried = await failed_then_retried(c, "session.appendMessage", PROMPT, "IO_ERROR")
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        turns = (await c.call("session.listTurns", {"sessionId": "s1"}))["turns"]
    assert retried["message"]["id"] == "u2" and retried["message"]["seq"] == 2
    assert [m["id"] for m in got["messages"]] == ["m1", "u2"]
    assert [(t["id"], t["status"]) for t in turns] == [("t1", "running")]


async def test_a_failed_fsync_still_fails_the_session_until_a_boot(tmp_path: Path) -> None:
    """``append.fsync``: an error raised there is the fsync's own (``append.after_fsync`` is after it)."""
    await _setup(tmp_path)
    async with faulted_client(tmp_path, "append.fsync:1:eio", client_id=CLIENT) as c:
        with pytest.raises(RpcError) as failed:
            await c.call("session.appendMessage", {**PROMPT, "message": msg("m2", "two")})
        assert failed.value.data_code == "IO_ERROR"
        with pytest.raises(RpcError) as refused:
            await c.call("session.appendMessage", {**PROMPT, "message": msg("m2", "two")})
        assert refused.value.data_code == "IO_ERROR" and "failed earlier" in refused.value.message


async def test_an_error_after_a_durable_fsync_recovers_in_the_same_process(tmp_path: Path) -> None:
    """``OSError(EIO)`` at ``append.after_fsync``: the line and its receipt are durable, only the answer
    failed. The actor marked the session's storage failed as for a failed fsync, so the retry and every
    later write were refused until a restart (which aborted the running turn). Now the writer is retired,
    the next call re-opens the file (tail re-validated, index caught up from it) and the retry is answered
    from the line's receipt: one line, one effect."""
    await _setup(tmp_path)
    async with faulted_client(tmp_path, "append.after_fsync:1:eio", client_id=CLIENT) as c:
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        retried = await failed_then_retried(c, "session.appendMessage", PROMPT, "IO_ERROR")
        later = await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m3", "three")})
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        listed = (await c.call("session.list", {}))["sessions"]
        turns = (await c.call("session.listTurns", {"sessionId": "s1"}))["turns"]
    assert retried["message"]["id"] == "u2" and retried["message"]["seq"] == 2
    assert later["message"]["seq"] == 3
    assert [m["id"] for m in got["messages"]] == ["m1", "u2", "m3"]
    assert [s["messageCount"] for s in listed if s["id"] == "s1"] == [3]
    assert [(t["id"], t["status"]) for t in turns] == [("t1", "running")]
    lines = (tmp_path / "sessions" / "s1.jsonl").read_text().splitlines()
    assert sum('"id":"u2"' in line for line in lines) == 1
