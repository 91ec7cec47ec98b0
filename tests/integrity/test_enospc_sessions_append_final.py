"""The final of a streamed reply (session.appendMessage) failing with ENOSPC once its line is
durable, retried in the same process: the in-flight checkpoint it settles goes, as on the first try.

A `pi-host serve` process raises ``OSError(ENOSPC)`` after the fsync of the final's line
(``RT_CRASHPOINT=append.after_fsync:2:enospc``): the checkpoint rule (a final removes its
checkpoint) runs in the write's own hop, so it did not run; the retry found the line and answered it
as a replay, and the stale checkpoint stayed on disk until the turn ended or the host restarted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.client import RpcError
from runtime.datadir import DataDir
from tests.hostkit import client_for, faulted_client, inprocess_host, msg

CLIENT = "cli-1"


async def test_final_retried_after_a_storage_error_removes_its_checkpoint(tmp_path: Path) -> None:
    """ENOSPC: the retry runs in the same process (after EIO the file is failed until the next boot,
    whose in-flight sweep removes a checkpoint whose final landed)."""
    async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
        await c.call("session.create", {"sessionId": "s1", "title": "First"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})
    final = {"sessionId": "s1", "message": msg("a2", "done", role="assistant", turnId="t1"),
             "submissionId": "sub-1"}
    checkpoint = DataDir(tmp_path).session_paths("s1").inflight
    async with faulted_client(tmp_path, "append.after_fsync:2:enospc", client_id=CLIENT) as c:
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u2", "go", turnId="t1")})
        await c.call("session.saveInflightMessage", {
            "sessionId": "s1", "turnId": "t1",
            "message": msg("a2", "partial", role="assistant", meta={"status": "streaming"})})
        assert checkpoint.exists()
        with pytest.raises(RpcError) as failed:
            await c.call("session.appendMessage", final)
        assert failed.value.data_code == "STORAGE_FULL"
        retried = await c.call("session.appendMessage", final)
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
    assert retried["message"]["id"] == "a2" and retried["message"]["seq"] == 3
    assert [m["id"] for m in got["messages"]] == ["m1", "u2", "a2"]
    assert got["messages"][-1]["blocks"][0]["text"] == "done"
    assert not checkpoint.exists()
