"""A branch switch cut after its rewrite, before its rows changed: the retry's answer is the switch's."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from runtime.client import ClientClosed, open_client
from tests.hostkit import client_for, inprocess_host, msg, start_host_process


@pytest.mark.parametrize("point", ["rewrite.after_rename", "session.activateRevision.before_commit"])
async def test_an_activate_revision_retried_after_a_kill_answers_the_rows_it_left(tmp_path: Path, point: str) -> None:
    """Boot rebuilt the switch's answer from its header receipt while the branch rows were still as
    before the switch (the DB writer never ran the handler's step): the retry answered
    [{1, isActive: false}] for good, where listRevisions said [{1, active}, {2}]."""
    root = tmp_path / "data"
    params = {"rootUserId": "u1", "revisionIndex": 1, "submissionId": "K2"}
    with trio.fail_after(90):
        async with inprocess_host(root) as host, client_for(host, "crash") as c:
            sid = (await c.call("session.create", {"title": "t"}))["id"]
            for m in (msg("u0", "q0"), msg("a0", "r0", role="assistant"), msg("u1", "q1"),
                      msg("a1", "r1", role="assistant")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": m})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate",
                                                  "submissionId": "K1"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "r1b", role="assistant")})
        crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
        try:
            async with open_client(crashing.url, crashing.token, client_id="crash", client_kind="test") as c:
                await c.call("session.activateRevision", {"sessionId": sid, **params})
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
        assert crashing.proc.returncode == -9
        async with inprocess_host(root) as host, client_for(host, "crash") as c:
            again = await c.call("session.activateRevision", {"sessionId": sid, **params})
            listed = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "u1"}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"]) for r in again["revisions"]] == [(1, True), (2, False)]
            assert again["revisions"] == listed
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == \
                ["u0", "a0", "u1", "a1"]
