"""session.recoverInflight failing with ENOSPC / EIO, retried in the same process with the same
clientId + submissionId: the first try's answer (``promoted``, with the promoted message), and no
checkpoint left behind.

A `pi-host serve` process raises ``OSError`` at a named point (``RT_CRASHPOINT=<point>:<n>:<action>``).
After the promoted line was durable but before its commit (the audit record, the turn's end), the
retry found the checkpoint's id settled and answered ``removed`` without the message. After the commit
(before the checkpoint's removal), the retry was answered from the receipt and the stale checkpoint
stayed on disk until the next boot.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.datadir import DataDir
from tests.hostkit import client_for, failed_then_retried, faulted_client, inprocess_host, msg

CLIENT = "cli-1"
CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}
RECOVER = {"sessionId": "s1", "turnId": "t1", "submissionId": "sub-1"}


async def _setup(root: Path) -> None:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await c.call("session.create", {"sessionId": "s1", "title": "First"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})


@pytest.mark.parametrize("action", ["enospc", "eio"])
@pytest.mark.parametrize(("point", "nth"), [
    ("append.after_fsync", 2),  # the promoted line durable, nothing committed
    ("session.recoverInflight.before_commit", 1),
    ("session.recoverInflight.after_commit", 1),  # committed, the checkpoint not yet removed
])
async def test_recover_inflight_retried_after_a_storage_error(tmp_path: Path, point: str, nth: int,
                                                              action: str) -> None:
    await _setup(tmp_path)
    async with faulted_client(tmp_path, f"{point}:{nth}:{action}", client_id=CLIENT) as c:
        # the turn (the first append of this process), its prompt, a streaming checkpoint
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u2", "go", turnId="t1")})
        await c.call("session.saveInflightMessage", {
            "sessionId": "s1", "turnId": "t1",
            "message": msg("a2", "partial", role="assistant", meta={"status": "streaming"})})
        retried = await failed_then_retried(c, "session.recoverInflight", RECOVER, CODES[action])
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        turns = (await c.call("session.listTurns", {"sessionId": "s1"}))["turns"]
    assert retried["action"] == "promoted"
    assert retried["message"]["id"] == "a2" and retried["message"]["seq"] == 3
    assert retried["turn"]["status"] == "aborted" and retried["turn"]["errorCode"] == "SIDECAR_LOST"
    assert [m["id"] for m in got["messages"]] == ["m1", "u2", "a2"]
    assert got["messages"][-1]["meta"]["status"] == "aborted"
    assert [(t["id"], t["status"]) for t in turns] == [("t1", "aborted")]
    assert not DataDir(tmp_path).session_paths("s1").inflight.exists()
