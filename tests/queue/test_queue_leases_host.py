"""A handed-out queue entry is not lost when the host or its controller dies before the prompt lands.

Before leases, ``session.queueTake`` deleted the entry: a SIGKILL (or a sidecar that died) between the take
and the prompt's append lost the person's acknowledged prompt for good.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient
from tests.approvals.test_approvals_host import next_event
from tests.hostkit import client_for, inprocess_host, start_host_process
from tests.queue.test_queue_restart import connect, stop
from tests.turns.turnkit import rpc_error

ENV = {"version": 1, "model": {"id": "m"}}


async def take(c: HostClient, sid: str, ctl: str = "ctl") -> dict[str, Any] | None:
    out: dict[str, Any] | None = (await c.call("session.queueTake", {"sessionId": sid, "controllerId": ctl}))["entry"]
    return out


async def contents(c: HostClient, sid: str) -> list[str]:
    return [e["content"] for e in (await c.call("session.queueList", {"sessionId": sid}))["entries"]]


async def user_texts(c: HostClient, sid: str) -> list[str]:
    page = await c.call("session.get", {"sessionId": sid, "full": True})
    return [m["blocks"][0]["text"] for m in page["messages"] if m["role"] == "user"]


@asynccontextmanager
async def host_run(data: Path, *, kill: bool = True) -> AsyncIterator[HostClient]:
    """A real host process on ``data`` and an agent connection to it; SIGKILL (or SIGTERM) after."""
    proc = await trio.to_thread.run_sync(start_host_process, data)
    try:
        async with connect(proc) as c:
            yield c
    finally:
        await trio.to_thread.run_sync(lambda: stop(proc, kill=kill))


async def test_a_prompt_handed_out_survives_sigkill_until_its_turn_ran(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(120):
        # 1. taken, then the host dies before any turn began: offered again, first and listed
        async with host_run(data) as c:
            sid = (await c.call("session.create", {"title": "q"}))["id"]
            base = {"sessionId": sid, "principal": "user", "permissionMode": "ask"}
            for text in ("one", "two"):
                await c.call("session.queuePush", {**base, "content": text})
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            first = await take(c, sid)
            assert first is not None and first["content"] == "one"
            assert await contents(c, sid) == ["two"]

        # 2. offered again; this time a turn starts and the host dies before the prompt's line
        async with host_run(data) as c:
            assert await contents(c, sid) == ["one", "two"]
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            again = await take(c, sid)
            assert again == first
            await c.call("session.startTurn", {"sessionId": sid, "turnId": f"t_{first['id']}",
                                               "environment": ENV})

        # 3. the turn was fenced before its prompt landed: boot lists the prompt again under a new id (a
        #    sidecar that scans the queues sees it); the old flow's late prompt for the cut turn is refused
        async with host_run(data) as c:
            assert await contents(c, sid) == ["one", "two"]
            old = f"t_{first['id']}"
            prompt = {"id": f"u_{first['id']}", "role": "user", "turnId": old,
                      "blocks": [{"type": "text", "text": "one"}]}
            late = await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "turnId": old,
                                                                    "message": prompt}))
            assert late.data_code == "CONFLICT" and late.data["turnId"] == old
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            back = await take(c, sid)
            assert back is not None and back["content"] == "one" and back["id"] != first["id"]
            turn = f"t_{back['id']}"
            await c.call("session.startTurn", {"sessionId": sid, "turnId": turn, "environment": ENV})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": turn, "message": {
                "id": f"u_{back['id']}", "role": "user", "turnId": turn,
                "blocks": [{"type": "text", "text": "one"}]}})

        # 4. its prompt landed before the host died: consumed; the next take is the next prompt
        async with host_run(data, kill=False) as c:
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            nxt = await take(c, sid)
            assert nxt is not None and nxt["content"] == "two"
            assert await user_texts(c, sid) == ["one"]  # exactly once
            assert await contents(c, sid) == []


async def test_a_controller_attaching_is_offered_what_was_taken_and_not_started(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "agent", kind="agent") as c:
            sid = (await c.call("session.create", {"title": "q"}))["id"]
            await c.call("session.queuePush", {"sessionId": sid, "principal": "user", "permissionMode": "ask",
                                               "content": "one"})
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-1"})
            first = await take(c, sid, "ctl-1")
            assert first is not None and await contents(c, sid) == []
            # ctl-1 died; a new sidecar attaches and gets the same prompt (so does ctl-1 restarted)
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-2"})
            assert await contents(c, sid) == ["one"]
            assert await take(c, sid, "ctl-2") == first
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-2"})
            assert await take(c, sid, "ctl-2") == first
            # a turn that ran consumes it; nothing is handed out twice
            turn = f"t_{first['id']}"
            await c.call("session.startTurn", {"sessionId": sid, "turnId": turn, "environment": ENV})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": turn, "message": {
                "id": f"u_{first['id']}", "role": "user", "turnId": turn, "blocks": [{"type": "text", "text": "one"}]}})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": turn, "status": "completed"})
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-3"})
            assert await take(c, sid, "ctl-3") is None and await contents(c, sid) == []


async def test_a_recovered_turn_tells_the_next_controller_that_prompts_wait(tmp_path: Path) -> None:
    """A sidecar lost mid-turn: a UI's recoverInflight ends the turn; a new sidecar waiting for
    ``session.queue`` heard nothing and the queue stalled until someone pushed again."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "agent", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = (await c.call("session.create", {"title": "q"}))["id"]
            for text in ("one", "two"):
                await ui.call("session.queuePush", {"sessionId": sid, "principal": "user", "permissionMode": "ask",
                                                    "content": text})
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            first = await take(c, sid)
            assert first is not None
            turn = f"t_{first['id']}"
            await c.call("session.startTurn", {"sessionId": sid, "turnId": turn, "environment": ENV})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": turn, "message": {
                "id": f"u_{first['id']}", "role": "user", "turnId": turn, "blocks": [{"type": "text", "text": "one"}]}})
            async with client_for(host, "agent-2", kind="agent") as fresh:  # the next sidecar, waiting
                await fresh.subscribe(["session.queue"], session_id=sid)
                await ui.call("session.recoverInflight", {"sessionId": sid, "turnId": turn})
                event = await next_event(fresh, "session.queue")
                assert [e["content"] for e in event.data["entries"]] == ["two"]
                await fresh.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-2"})
                assert (await take(fresh, sid, "ctl-2"))["content"] == "two"  # type: ignore[index]
            assert await user_texts(c, sid) == ["one"]


async def test_a_sidecar_that_goes_away_while_the_host_runs_leaves_no_prompt_hidden(tmp_path: Path) -> None:
    """A controller took a prompt and its connection closed before any turn began: the prompt was kept
    but listed nowhere until a restart (a new sidecar's startup scan attaches only sessions whose queue
    lists something). And a turn another client started in between carried it, so that turn's end
    would have consumed a prompt that never ran."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path, client_gone_after=0.3) as host, client_for(host, "ui", kind="ui") as ui:
            sid = (await ui.call("session.create", {"title": "q"}))["id"]
            for text in ("one", "two"):
                await ui.call("session.queuePush", {"sessionId": sid, "principal": "user", "permissionMode": "ask",
                                                    "content": text})
            await ui.subscribe(["session.queue"], session_id=sid)
            async with client_for(host, "sidecar-1", kind="agent") as gone:
                await gone.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-1"})
                assert (await take(gone, sid, "ctl-1"))["content"] == "one"  # type: ignore[index]
                # the UI runs a turn of its own meanwhile: it does not carry the sidecar's prompt
                await ui.call("session.startTurn", {"sessionId": sid, "turnId": "t-ui", "environment": ENV})
                await ui.call("session.endTurn", {"sessionId": sid, "turnId": "t-ui", "status": "completed"})
            shown: list[list[str]] = []
            while shown[-2:] != [["two"], ["one", "two"]]:  # it is gone: listed again, first, and said so
                event = await next_event(ui, "session.queue")
                shown.append([e["content"] for e in event.data["entries"]])
            assert await contents(ui, sid) == ["one", "two"]
            async with client_for(host, "sidecar-2", kind="agent") as c:
                await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-2"})
                first = await take(c, sid, "ctl-2")
                assert first is not None and first["content"] == "one"
                turn = f"t_{first['id']}"
                await c.call("session.startTurn", {"sessionId": sid, "turnId": turn, "environment": ENV})
                await c.call("session.appendMessage", {"sessionId": sid, "turnId": turn, "message": {
                    "id": f"u_{first['id']}", "role": "user", "turnId": turn,
                    "blocks": [{"type": "text", "text": "one"}]}})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": turn, "status": "completed"})
                assert (await take(c, sid, "ctl-2"))["content"] == "two"  # type: ignore[index]
            assert await user_texts(ui, sid) == ["one"]


async def test_a_sidecar_that_comes_back_keeps_what_it_took(tmp_path: Path) -> None:
    """A connection that closes is not a controller that is gone: the same client connecting again within
    the grace (a reconnect, or a helper that opens one connection per call) keeps its take; the next take
    hands out the next prompt, and the reconnected flow starts its turn with the one it took."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path, client_gone_after=3.0) as host, \
                client_for(host, "ui", kind="ui") as ui:
            sid = (await ui.call("session.create", {"title": "q"}))["id"]
            for text in ("one", "two", "three"):
                await ui.call("session.queuePush", {"sessionId": sid, "principal": "user", "permissionMode": "ask",
                                                    "content": text})
            async with client_for(host, "sidecar", kind="agent") as c:
                await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            async with client_for(host, "sidecar", kind="agent") as c:
                first = await take(c, sid)
            async with client_for(host, "sidecar", kind="agent") as c:
                second = await take(c, sid)  # the taker came back: the first prompt is not handed out again
                assert first is not None and second is not None and first["content"] == "one"
                assert second["content"] == "two" and await contents(c, sid) == ["three"]
                turn = f"t_{second['id']}"
                await c.call("session.startTurn", {"sessionId": sid, "turnId": turn, "environment": ENV})
            assert await contents(ui, sid) == ["three"]  # it may come back: its turn keeps its prompt
            await trio.sleep(3.5)  # gone now: the host recovers its turn, whose prompt never landed
            turn_row = (await ui.call("session.listTurns", {"sessionId": sid, "limit": 1}))["turns"][0]
            assert (turn_row["id"], turn_row["status"], turn_row["errorCode"]) == (turn, "aborted", "SIDECAR_LOST")
            assert await contents(ui, sid) == ["two", "three"]
