"""Bad input the turn queue, in-flight recovery, compaction checkpoints and the session lifecycle once
accepted or answered oddly: each now gets a clear error and changes nothing (ARCHITECTURE, "Bad input
gets a clear error and changes nothing"). One test per finding, against a real in-process host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host
from tests.turns.turnkit import new_session, rpc_error


def _push(sid: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "principal": "ui", "content": content, "permissionMode": "ask", **extra}


async def _entries(c: HostClient, sid: str) -> list[dict[str, Any]]:
    return list((await c.call("session.queueList", {"sessionId": sid}))["entries"])


async def test_an_empty_queue_push_without_attachments_is_refused(tmp_path: Path) -> None:
    """A queued prompt with no text and no attachment is nothing to run: INVALID_PARAMS naming ``content``
    (as collab.send refuses an empty body), nothing queued. Text, or an attachment alone, is still a prompt."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for content, extra in (("", {}), ("", {"attachments": []}), ("  \n\t", {})):
                err = await rpc_error(c.call("session.queuePush", _push(sid, content, **extra)))
                assert err.data_code == "INVALID_PARAMS", (content, extra)
                assert "content" in str(err.data), err.data
            assert await _entries(c, sid) == []
            att = {"type": "attachment", "kind": "file", "name": "notes.txt", "ref": "/w/notes.txt"}
            only_file = await c.call("session.queuePush", _push(sid, "", attachments=[att]))
            assert only_file["entry"]["content"] == ""
            await c.call("session.queuePush", _push(sid, "next"))
            assert [e["content"] for e in await _entries(c, sid)] == ["", "next"]
