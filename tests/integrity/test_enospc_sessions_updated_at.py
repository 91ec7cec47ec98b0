"""An append whose line became durable but whose answer was a storage error (ENOSPC / EIO after the
fsync, or its index commit failing) moves the session's ``updatedAt`` as the crash-free append does.

A `pi-host serve` process raises ``OSError`` at a named point (``RT_CRASHPOINT=<point>:1:<action>``)
inside ``session.appendMessage``; the line is in the transcript, and the index takes it from there
(the actor's catch-up, a tail reconcile). That path indexed the lines without moving the row's
``updated_at``: the session kept its old time and ``session.list`` (newest first) put a session
written to earlier above it, unlike a run without the fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import call_killed_at, client_for, create_two_exchanges, faulted_client, inprocess_host, msg

CLIENT = "cli-1"


async def _setup(root: Path) -> None:
    """s1 with one message, then s9 (created after s1's last write)."""
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await c.call("session.create", {"sessionId": "s1", "title": "First"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})
        await c.call("session.create", {"sessionId": "s9", "title": "Other"})


async def _append(c: HostClient) -> Any:
    return await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m2", "two"),
                                                  "submissionId": "sub-1"})


@pytest.mark.parametrize(("point", "action", "code"), [
    ("append.after_fsync", "enospc", "STORAGE_FULL"),
    ("append.after_fsync", "eio", "IO_ERROR"),  # the line durable: the retry finds it in the same process
    ("append.fsync", "eio", "IO_ERROR"),  # a failed fsync: the file is failed until the next boot
    ("index.before_commit", "enospc", None),  # answered: the line is durable, the index catches up
])
async def test_append_retried_after_a_storage_error_moves_updated_at(tmp_path: Path, point: str, action: str,
                                                                     code: str | None) -> None:
    await _setup(tmp_path)
    async with faulted_client(tmp_path, f"{point}:1:{action}", client_id=CLIENT) as c:
        if code is None:
            answer = await _append(c)
        else:
            with pytest.raises(RpcError) as failed:
                await _append(c)
            assert failed.value.data_code == code
            if point != "append.fsync":
                answer = await _append(c)  # the same call again: the line the fault left is its effect
        if point != "append.fsync":
            listed = (await c.call("session.list", {}))["sessions"]
    if point == "append.fsync":  # the file is failed until the next boot: the call is retried there
        async with faulted_client(tmp_path, None, client_id=CLIENT) as c:
            answer = await _append(c)
            listed = (await c.call("session.list", {}))["sessions"]
    assert answer["message"]["id"] == "m2" and answer["message"]["seq"] == 2
    assert [s["id"] for s in listed] == ["s1", "s9"]
    s1 = next(s for s in listed if s["id"] == "s1")
    assert s1["updatedAt"] >= answer["message"]["createdAt"]
    assert s1["messageCount"] == 2


async def _setup_four(root: Path) -> None:
    """s1 with two exchanges, then s9 (created after s1's last write)."""
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await create_two_exchanges(c)
        await c.call("session.create", {"sessionId": "s9", "title": "Other"})


@pytest.mark.parametrize(("point", "action"), [
    ("rewrite.after_rename", "enospc"),  # the new file in place, the rewrite's write failed after it
    ("rewrite.before_reindex", "eio"),
    ("session.truncateFrom.before_commit", "enospc"),  # the new file in place, its commit rolled back
])
async def test_rewrite_retried_after_a_storage_error_moves_updated_at(tmp_path: Path, point: str,
                                                                      action: str) -> None:
    """A rewrite (truncateFrom) whose new transcript is in place but whose commit failed: the actor's
    catch-up reindexed the new file whole and the retry found its effect there, but nothing moved the
    row's ``updated_at`` as the rewrite's commit does."""
    await _setup_four(tmp_path)
    call = {"sessionId": "s1", "messageId": "a1", "mode": "regenerate", "submissionId": "sub-1"}
    async with faulted_client(tmp_path, f"{point}:1:{action}", client_id=CLIENT) as c:
        with pytest.raises(RpcError) as failed:
            await c.call("session.truncateFrom", call)
        assert failed.value.data_code == {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}[action]
        await c.call("session.truncateFrom", call)
        listed = (await c.call("session.list", {}))["sessions"]
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
    assert [m["id"] for m in got["messages"]] == ["u0", "a0", "u1"]
    assert [s["id"] for s in listed] == ["s1", "s9"]


@pytest.mark.parametrize("point", ["rewrite.after_rename", "rewrite.before_reindex",
                                   "session.truncateFrom.before_commit"])
async def test_rewrite_killed_before_its_commit_moves_updated_at_as_without_the_kill(tmp_path: Path,
                                                                                    point: str) -> None:
    """Killed with the new transcript in place and its commit not made: boot reindexed the new file whole,
    and the row kept the time of the last message left (older than the session created after it). Now the
    rewritten header carries when it was written (``writtenAt``), the time its commit would have set."""
    await _setup_four(tmp_path)
    call = {"sessionId": "s1", "messageId": "a1", "mode": "regenerate", "submissionId": "sub-1"}
    async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
        before = {s["id"]: s["updatedAt"] for s in (await c.call("session.list", {}))["sessions"]}
    await call_killed_at(tmp_path, point, "session.truncateFrom", call, client_id=CLIENT, client_kind="agent")
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
            listed = (await c.call("session.list", {}))["sessions"]
            retried = await c.call("session.truncateFrom", call)
            again = (await c.call("session.list", {}))["sessions"]
    assert [s["id"] for s in listed] == ["s1", "s9"] == [s["id"] for s in again]
    s1 = next(s for s in listed if s["id"] == "s1")
    assert s1["updatedAt"] > before["s9"] >= before["s1"]
    assert retried["session"]["updatedAt"] == s1["updatedAt"] == next(s for s in again if s["id"] == "s1")["updatedAt"]
