"""Seed §11.21 as one story on real host processes (SIGKILL between the steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, RpcError, open_client
from tests.hostkit import HostProcess, start_host_process
from tests.pipeline.scenarios import rows


def _stop(proc: HostProcess, *, kill: bool) -> None:
    if kill:
        proc.kill9()
    else:
        proc.terminate()
    for pipe in (proc.proc.stdout, proc.proc.stderr):
        if pipe is not None:
            pipe.close()


async def _code(call: Any) -> str:
    try:
        await call
    except RpcError as exc:
        return exc.data_code
    raise AssertionError("the call was accepted")


def _deliver(src: str, tgt: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"pluginId": "team", "sourceSessionId": src, "targetSessionId": tgt, "kind": "task",
            "content": f"work item {key}", "idempotencyKey": key, **extra}


async def test_acceptance_11_21_collaboration_rows_survive_retries_restarts_and_never_replay(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(150):
        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with open_client(proc.url, proc.token, client_id="plugin", client_kind="agent") as c:
                c_: HostClient = c
                lead = (await c_.call("session.create", {"title": "Lead", "permissionMode": "accept-edits"}))["id"]
                rev = (await c_.call("session.create", {"title": "Reviewer", "permissionMode": "ask"}))["id"]
                wild = (await c_.call("session.create", {"title": "Wild", "permissionMode": "auto"}))["id"]
                third = (await c_.call("session.create", {"title": "Third", "permissionMode": "ask"}))["id"]
                # ceilings: a target above the sender's effective mode is refused
                assert await _code(c_.call("collab.deliver", _deliver(lead, wild, "w"))) == "PERMISSION_DENIED"
                sent = await c_.call("collab.deliver", _deliver(lead, rev, "review", notifyOnCompletion=True,
                                                                remainingHops=1))
                did = sent["delivery"]["id"]
                held = await c_.call("collab.deliver", _deliver(lead, rev, "later"))
                held_id = held["delivery"]["id"]
                await c_.call("session.queueAttach", {"sessionId": rev, "controllerId": "ctl"})
                taken = await c_.call("session.queueTake", {"sessionId": rev, "controllerId": "ctl"})
                assert taken["entry"]["sessionMessageId"] == did
                await c_.call("session.startTurn", {"sessionId": rev, "turnId": "tr"})
                began = await c_.call("collab.begin", {"sessionId": rev, "deliveryId": did, "turnId": "tr"})
                assert began["delivery"]["turnId"] == "tr"
                # hops: the reviewer forwards once (1 → 0), the next hop is refused
                forward = await c_.call("collab.deliver", _deliver(rev, third, "fwd", remainingHops=9))
                assert forward["delivery"]["remainingHops"] == 0
                assert forward["delivery"]["permissionCeiling"] == "ask"  # the chain keeps the lowest ceiling
                await c_.call("session.startTurn", {"sessionId": third, "turnId": "t3"})
                await c_.call("collab.begin", {"sessionId": third, "deliveryId": forward["delivery"]["id"],
                                               "turnId": "t3"})
                assert await _code(c_.call("collab.deliver", _deliver(third, rev, "fwd2"))) == "LIMIT_EXCEEDED"
                await c_.call("collab.cancel", {"deliveryId": forward["delivery"]["id"]})
                done = await c_.call("collab.settle", {"sessionId": rev, "deliveryId": did, "turnId": "tr",
                                                       "status": "completed", "result": "3 risky call sites",
                                                       "submissionId": "settle-1"})
                callback = done["callback"]["id"]
        finally:
            await trio.to_thread.run_sync(lambda: _stop(proc, kill=True))
        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with open_client(proc.url, proc.token, client_id="plugin", client_kind="agent") as c:
                c_ = c
                # idempotency across a restart: the same key returns the original row, nothing new is queued
                again = await c_.call("collab.deliver", _deliver(lead, rev, "review", notifyOnCompletion=True,
                                                                 remainingHops=1))
                assert again["replayed"] and again["delivery"]["id"] == did
                assert again["delivery"]["source"]["sessionId"] == lead
                assert again["delivery"]["target"]["sessionId"] == rev
                assert (await c_.call("collab.settle", {"sessionId": rev, "deliveryId": did, "turnId": "tr",
                                                        "status": "completed", "result": "3 risky call sites",
                                                        "submissionId": "settle-1"})) == done
                assert rows(data, "SELECT COUNT(*) FROM session_collaboration_messages WHERE kind = 'completion'") \
                    == [(1,)]  # no duplicate callback
                # the input row and its provenance are in the transcript
                page = await c_.call("session.get", {"sessionId": rev})
                [row] = [m for m in page["messages"] if m.get("sessionMessage")]
                assert row["sessionMessage"]["deliveryId"] == did and row["turnId"] == "tr"
                # queued work with an admission is held for a controller, not replayed
                assert (await c_.call("collab.get", {"deliveryId": held_id}))["status"] == "queued"
                queue = await c_.call("session.queueList", {"sessionId": rev})
                assert queue["held"] and [e["sessionMessageId"] for e in queue["entries"]] == [held_id]
                assert (await c_.call("collab.get", {"deliveryId": callback}))["status"] == "queued"
                # cancel without deleting the target
                await c_.call("collab.cancel", {"deliveryId": held_id})
                assert (await c_.call("session.get", {"sessionId": rev}))["session"]["id"] == rev
                assert (await c_.call("session.queueList", {"sessionId": rev}))["entries"] == []
                statuses = dict(rows(data, "SELECT id, status FROM session_collaboration_messages"))
                assert statuses[forward["delivery"]["id"]] == "cancelled" and statuses[did] == "completed"
        finally:
            await trio.to_thread.run_sync(lambda: _stop(proc, kill=False))
