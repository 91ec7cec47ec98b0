"""``plan.requested`` / ``plan.resolved`` events through the gateway (seed 003 §4.6a, §11.17-18)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import dump_event
from runtime.client import HostClient, RpcError
from tests.hostkit import client_for
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import BASE, MINUTE

TOPICS = ["plan.requested", "plan.resolved"]


def _submit(sid: str, ws: Path, call_id: str, kind: str = "plan", **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": "t1", "toolCallId": call_id, "kind": kind, "markdown": f"# {call_id}\n",
            "title": "Split the tokenizer", "question": "Proceed?", "workspaceRoot": str(ws), **extra}


async def _events(c: HostClient, n: int) -> list[tuple[str, str | None, Any]]:
    """The next ``n`` events, each checked against its payload model."""
    out = []
    with trio.fail_after(10):
        for _ in range(n):
            ev = await c.next_event()
            dump_event(ev.topic, ev.data, cursor=ev.cursor, subscription_id=ev.subscription_id)
            out.append((ev.topic, ev.session_id, ev.data))
    return out


async def _no_more_events(c: HostClient, *, may_come: tuple[tuple[str, Any], ...] = ()) -> None:
    """Nothing else was sent: a marker event published after everything else arrives first. ``may_come``:
    events the host may publish meanwhile, or not (each once at most): a request whose deadline the clock
    passed is expired by the expiry timer whenever it wakes (any tell wakes it), and that is announced."""
    sid = (await c.call("session.create", {"title": "marker"}))["id"]
    await c.call("session.delete", {"sessionId": sid})
    allowed = list(may_come)
    with trio.fail_after(10):
        ev = await c.next_event()
        while (ev.topic, ev.data) in allowed:
            allowed.remove((ev.topic, ev.data))
            ev = await c.next_event()
    assert ev.topic == "session.deleted", ev


@asynccontextmanager
async def _subscribed(tmp_path: Path, clock: SetClock, mode: str) -> AsyncIterator[tuple[HostClient, str, Path]]:
    """A host on ``clock``, a UI client subscribed to the plan events, and a ``mode`` session with a project."""
    ws = tmp_path / "ws"
    ws.mkdir()
    async with host_at(tmp_path / "data", clock) as host, client_for(host, "ui", kind="ui") as c:
        sid = (await c.call("session.create", {"title": mode, "projectPath": str(ws), "mode": mode}))["id"]
        await c.subscribe([*TOPICS, "session.deleted"])
        yield c, sid, ws


async def test_submit_and_responses_publish_plan_events(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with _subscribed(tmp_path, clock, "plan") as (c, sid, ws):
            first = await c.call("plans.submit", _submit(sid, ws, "call-1", submissionId="sub-1"))
            assert await c.call("plans.submit", _submit(sid, ws, "call-1", submissionId="sub-1")) == first  # retry
            rejected = await c.call("plans.respond", {"requestId": first["requestId"], "action": "reject"})
            second = await c.call("plans.submit", _submit(sid, ws, "call-2"))
            approved = await c.call("plans.respond", {"requestId": second["requestId"], "action": "approve",
                                                      "targetPermissionMode": "ask"})
            assert approved["session"]["mode"] == "agent"
            assert await _events(c, 4) == [
                ("plan.requested", sid, {"approval": first}),
                ("plan.resolved", sid, {"requestId": first["requestId"], "sessionId": sid, "status": "rejected"}),
                ("plan.requested", sid, {"approval": second}),
                ("plan.resolved", sid, {"requestId": second["requestId"], "sessionId": sid, "status": "approved"}),
            ]
            assert rejected["approval"]["status"] == "rejected"
            with pytest.raises(RpcError) as stale:  # a stale response publishes nothing
                await c.call("plans.respond", {"requestId": first["requestId"], "action": "approve"})
            assert stale.value.data_code == "CONFLICT"
            await _no_more_events(c)


async def test_expired_approvals_publish_plan_resolved(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with _subscribed(tmp_path, clock, "goal") as (c, sid, ws):
            old = await c.call("plans.submit", _submit(sid, ws, "g-1", "goal", expiresAt=BASE + MINUTE))
            clock.ms = BASE + 2 * MINUTE
            new = await c.call("plans.submit", _submit(sid, ws, "g-2", "goal", expiresAt=BASE + 3 * MINUTE))
            clock.ms = BASE + 4 * MINUTE
            with pytest.raises(RpcError) as late:
                await c.call("plans.respond", {"requestId": new["requestId"], "action": "approve"})
            assert late.value.data_code == "CONFLICT"
            assert await _events(c, 4) == [
                ("plan.requested", sid, {"approval": old}),
                ("plan.resolved", sid, {"requestId": old["requestId"], "sessionId": sid, "status": "expired"}),
                ("plan.requested", sid, {"approval": new}),
                ("plan.resolved", sid, {"requestId": new["requestId"], "sessionId": sid, "status": "expired"}),
            ]
            await _no_more_events(c)


async def test_restart_interruptions_are_rehydrated_with_plans_pending(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path / "data", clock) as host, client_for(host, "ui", kind="ui") as c:
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(ws), "mode": "plan"}))["id"]
            pending = await c.call("plans.submit", _submit(sid, ws, "call-1"))
            assert (await c.call("plans.pending", {}))["pending"] == [pending]
        async with host_at(tmp_path / "data", clock) as host, client_for(host, "ui", kind="ui") as c:
            assert host.boot.report["fence"]["interruptedApprovals"] == 1
            await c.subscribe([*TOPICS, "session.deleted"], cursor=0)  # everything this boot published
            assert (await c.call("plans.pending", {}))["pending"] == []  # the rehydration path
            await _no_more_events(c)  # the interruption itself is not announced
            with pytest.raises(RpcError) as stale:
                await c.call("plans.respond", {"requestId": pending["requestId"], "action": "approve"})
            assert stale.value.data_code == "CONFLICT"


async def test_a_proposal_past_its_deadline_is_no_longer_pending_anywhere(tmp_path: Path) -> None:
    """Seed 003 §4.5/§4.6a: expiry returns planning to editable. Before anything marks the row ``expired``,
    ``plans.pending``, the session's projected state (get and list) and the mode guard treat it as expired;
    the next proposal marks it and announces it once."""
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with _subscribed(tmp_path, clock, "plan") as (c, sid, ws):
            old = await c.call("plans.submit", _submit(sid, ws, "p-1", expiresAt=BASE + MINUTE))

            async def seen() -> tuple[list[str], Any, Any]:
                pending = [p["requestId"] for p in (await c.call("plans.pending", {}))["pending"]]
                got = (await c.call("session.get", {"sessionId": sid}))["session"]
                listed = next(s for s in (await c.call("session.list", {}))["sessions"] if s["id"] == sid)
                return pending, got.get("state"), listed.get("state")

            assert await seen() == ([old["requestId"]], "awaiting_approval", "awaiting_approval")
            with pytest.raises(RpcError) as held:  # a live proposal keeps the contract mode
                await c.call("session.update", {"sessionId": sid, "mode": "goal"})
            assert held.value.data_code == "CONFLICT"
            clock.ms = BASE + MINUTE  # the deadline itself: expired
            assert await seen() == ([], "planning", "planning")
            assert (await c.call("plans.pending", {"sessionId": sid}))["pending"] == []
            new = await c.call("plans.submit", _submit(sid, ws, "p-2", expiresAt=BASE + 3 * MINUTE))
            assert await seen() == ([new["requestId"]], "awaiting_approval", "awaiting_approval")
            assert await _events(c, 3) == [
                ("plan.requested", sid, {"approval": old}),
                ("plan.resolved", sid, {"requestId": old["requestId"], "sessionId": sid, "status": "expired"}),
                ("plan.requested", sid, {"approval": new}),
            ]
            clock.ms = BASE + 4 * MINUTE
            await c.call("session.update", {"sessionId": sid, "mode": "goal"})  # nothing live holds the mode
            assert await seen() == ([], "planning", "planning")
            # the second proposal's deadline passed too: the expiry timer announces it once if it woke meanwhile
            await _no_more_events(c, may_come=(
                ("plan.resolved", {"requestId": new["requestId"], "sessionId": sid, "status": "expired"}),))
