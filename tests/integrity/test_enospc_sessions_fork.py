"""session.fork / session.assistantEdit failing with ENOSPC / EIO after their commit: the child session
they answer with (on the retry, from the receipt) exists.

A `pi-host serve` process raises ``OSError`` at a named point (``RT_CRASHPOINT=<point>:1:<action>``)
once the child's rows and the receipt are committed. The handler took any failure before it saw the
commit's value for a failed commit and removed the child (files and rows); the receipt stayed, so the
retry answered the child's summary for a session that no longer existed (acknowledged, then lost).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.datadir import DataDir
from tests.hostkit import client_for, create_two_exchanges, failed_then_retried, faulted_client, inprocess_host

CLIENT = "cli-1"
CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "fork": ("session.fork", {"sessionId": "s1", "throughMessageId": "a0", "title": "F"}),
    "assistantEdit": ("session.assistantEdit", {"sessionId": "s1", "messageId": "a1",
                                                "blocks": [{"type": "text", "text": "edited"}]}),
}


async def _setup(root: Path) -> None:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await create_two_exchanges(c)


def _child_of(answer: dict[str, Any]) -> dict[str, Any]:
    return answer["session"] if "session" in answer else answer


@pytest.mark.parametrize("action", ["enospc", "eio"])
@pytest.mark.parametrize("point", ["index.after_commit", "after_commit"])
@pytest.mark.parametrize("kind", ["fork", "assistantEdit"])
async def test_child_committed_before_a_storage_error_is_kept(tmp_path: Path, kind: str, point: str,
                                                               action: str) -> None:
    await _setup(tmp_path)
    method, params = CALLS[kind]
    params = {**params, "submissionId": "sub-1"}
    armed = f"{method}.after_commit" if point == "after_commit" else point
    async with faulted_client(tmp_path, f"{armed}:1:{action}", client_id=CLIENT) as c:
        retried = await failed_then_retried(c, method, params, CODES[action])
        child = _child_of(retried)["id"]
        listed = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
        got = await c.call("session.get", {"sessionId": child, "full": True})
    assert child in listed
    assert len(got["messages"]) == _child_of(retried)["messageCount"] > 0
    assert DataDir(tmp_path).transcript(child).exists()
