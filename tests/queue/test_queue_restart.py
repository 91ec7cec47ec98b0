"""Queue entries survive SIGKILL of a real host process; the queue comes back held."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from runtime.client import HostClient, open_client
from tests.hostkit import HostProcess, start_host_process


def stop(proc: HostProcess, *, kill: bool) -> None:
    """SIGKILL (or SIGTERM) the host and close the pipes hostkit opened for it."""
    try:
        if kill:
            proc.kill9()
        else:
            proc.terminate()
    finally:
        for pipe in (proc.proc.stdout, proc.proc.stderr):
            if pipe is not None:
                pipe.close()


@asynccontextmanager
async def connect(proc: HostProcess, kind: str = "agent") -> AsyncIterator[HostClient]:
    async with open_client(proc.url, proc.token, client_id=f"{kind}-client", client_kind=kind) as c:
        yield c


async def test_entries_survive_sigkill_and_queue_is_held_until_a_controller_attaches(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(90):
        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with connect(proc) as c:
                sid = (await c.call("session.create", {"title": "q"}))["id"]
                base = {"sessionId": sid, "principal": "ui", "permissionMode": "ask"}
                first = await c.call("session.queuePush", {**base, "content": "one", "idempotencyKey": "k1"})
                second = await c.call("session.queuePush", {**base, "content": "two", "idempotencyKey": "k2"})
                await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": second["entry"]["id"]})
                attached = await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
                assert attached["held"] is False
        finally:
            await trio.to_thread.run_sync(lambda: stop(proc, kill=True))

        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with connect(proc) as c:
                state = await c.call("session.queueList", {"sessionId": sid})
                assert state["held"] is True and "controllerId" not in state
                assert [e["content"] for e in state["entries"]] == ["two", "one"]
                assert state["entries"][1] == first["entry"]
                assert state["entries"][0]["priority"] == 1
                # A retried push after the restart is still a replay, not a second entry.
                again = await c.call("session.queuePush", {**base, "content": "one", "idempotencyKey": "k1"})
                assert again == {"entry": first["entry"], "replayed": True}
                held = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
                assert held == {"entry": None, "reason": "held"}
                await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
                taken = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
                assert taken["entry"]["content"] == "two"
                third = await c.call("session.queuePush", {**base, "content": "three"})
                assert third["entry"]["position"] == 3
                state = await c.call("session.queueList", {"sessionId": sid})
                assert [e["content"] for e in state["entries"]] == ["one", "three"]
        finally:
            await trio.to_thread.run_sync(lambda: stop(proc, kill=False))
