"""Receipts ride in the line of their effect for tombstones and ``session_info`` lines too.

deleteMessage / restoreMessage write a tombstone line, rename / update / updateMetadata a
``session_info`` line; their receipts used to commit after the line's fsync. A host killed in
between left the effect without its receipt, and a retry with the same ``submissionId`` after the
user had changed things again ran the command a second time (the message deleted again, the title
reverted). Now the line carries its receipt (``receipt``) and the reconcile at boot restores the row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, open_client
from tests.hostkit import client_for, inprocess_host, msg, start_host_process


async def _killed_during(root: Path, method: str, params: dict[str, Any]) -> None:
    """``method`` with ``params`` on a host that SIGKILLs itself once its line is fsynced."""
    crashing = start_host_process(root, env={"RT_CRASHPOINT": "append.after_fsync:1"})
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id="ui-1", client_kind="ui") as c:
                await c.call(method, params)
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
    assert crashing.proc.returncode == -9, "the host did not die after the line's fsync"


async def _setup(root: Path) -> None:
    async with inprocess_host(root) as host, client_for(host, "ui-1", kind="ui") as c:
        await c.call("session.create", {"sessionId": "s1", "title": "First"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})


async def test_a_delete_retried_after_the_crash_is_answered_once_and_never_runs_again(tmp_path: Path) -> None:
    await _setup(tmp_path)
    params = {"sessionId": "s1", "messageId": "m1", "submissionId": "del-1"}
    await _killed_during(tmp_path, "session.deleteMessage", params)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui-1", kind="ui") as c:
            got = await c.call("session.get", {"sessionId": "s1"})
            assert [bool(m.get("deleted")) for m in got["messages"]] == [True]  # the effect is there
            await c.call("session.restoreMessage", {"sessionId": "s1", "messageId": "m1"})  # the user, later
            assert await c.call("session.deleteMessage", params) == {"messageId": "m1", "deleted": True}
            got = await c.call("session.get", {"sessionId": "s1"})
            assert [bool(m.get("deleted")) for m in got["messages"]] == [False]  # not deleted a second time


@pytest.mark.parametrize(("method", "params", "later"), [
    ("session.rename", {"title": "Second"}, {"title": "Third"}),
    ("session.update", {"modelId": "model-a"}, {"modelId": "model-b"}),
])
async def test_a_settings_write_retried_after_the_crash_never_runs_again(
        tmp_path: Path, method: str, params: dict[str, Any], later: dict[str, Any]) -> None:
    await _setup(tmp_path)
    call = {"sessionId": "s1", **params, "submissionId": "set-1"}
    await _killed_during(tmp_path, method, call)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui-1", kind="ui") as c:
            field, value = next(iter(params.items()))
            assert (await c.call("session.get", {"sessionId": "s1"}))["session"][field] == value
            await c.call(method, {"sessionId": "s1", **later})  # the user, later
            answer = await c.call(method, call)
            assert answer[field] == value  # the stored answer of the first call
            assert (await c.call("session.get", {"sessionId": "s1"}))["session"][field] == next(iter(later.values()))


async def test_a_trash_retried_after_the_crash_never_runs_again(tmp_path: Path) -> None:
    """sessions.trash writes a ``session_info`` line with ``trashedAt`` (its receipt in it): killed after the
    line's fsync, the restarted host has the session in the trash, and a retry after the user restored it
    answers the first call and leaves it restored."""
    await _setup(tmp_path)
    call = {"sessionId": "s1", "submissionId": "trash-1"}
    await _killed_during(tmp_path, "sessions.trash", call)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui-1", kind="ui") as c:
            trashed = (await c.call("sessions.listTrashed", {}))["sessions"]
            assert [s["id"] for s in trashed] == ["s1"]
            assert (await c.call("session.list", {}))["sessions"] == []
            await c.call("sessions.restore", {"sessionId": "s1"})  # the user, later
            answer = await c.call("sessions.trash", call)
            assert answer["session"]["id"] == "s1" and answer["session"]["deletedAt"] is not None
            assert (await c.call("sessions.listTrashed", {}))["sessions"] == []
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == ["s1"]
