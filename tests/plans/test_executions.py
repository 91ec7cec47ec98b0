"""Plan/goal execution lifecycle (seed §4.6a), the projected session state (§4.5), mode guards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from runtime.client import ClientEvent, HostClient
from tests.hostkit import client_for, inprocess_host
from tests.turns.turnkit import end, rpc_error, start

MARKDOWN = "# Plan\n\n1. Do it\n"


async def contract_session(c: HostClient, root: Path, kind: str = "plan") -> tuple[str, Path]:
    ws = root.parent / f"{root.name}-ws"
    ws.mkdir(exist_ok=True)
    sid = str((await c.call("session.create", {"title": kind, "projectPath": str(ws), "mode": kind}))["id"])
    return sid, ws


async def submit(c: HostClient, sid: str, ws: Path, kind: str = "plan", call: str = "c1") -> dict[str, Any]:
    result: dict[str, Any] = await c.call("plans.submit", {
        "sessionId": sid, "turnId": "t0", "toolCallId": f"{sid}-{call}", "kind": kind, "markdown": MARKDOWN,
        "workspaceRoot": str(ws)})
    return result


async def approved(c: HostClient, ui: HostClient, root: Path, kind: str = "plan") -> tuple[str, str]:
    """Submitted by the sidecar ``c``, approved by a person (``ui``: §11.19, never the sidecar)."""
    sid, ws = await contract_session(c, root, kind)
    request = await submit(c, sid, ws, kind)
    out = await ui.call("plans.respond", {"requestId": request["requestId"], "action": "approve"})
    return sid, out["approval"]["executionId"]


async def state_of(c: HostClient, sid: str) -> dict[str, Any]:
    page = await c.call("session.get", {"sessionId": sid, "messageLimit": 1})
    listed = {s["id"]: s for s in (await c.call("session.list", {}))["sessions"]}[sid]
    assert {k: listed.get(k) for k in ("state", "contractKind", "latestTurn")} == \
        {k: page["session"].get(k) for k in ("state", "contractKind", "latestTurn")}  # list and get agree
    summary: dict[str, Any] = page["session"]
    return summary


async def next_event(c: HostClient, topic: str) -> ClientEvent:
    with trio.fail_after(5):
        async for event in c:
            if event.topic == topic:
                return event
    raise AssertionError(topic)


async def test_an_execution_moves_queued_running_completed_bound_to_its_turn(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, execution = await approved(c, ui, tmp_path)
            await c.subscribe(["plan.execution", "session.updated"], session_id=sid)
            await start(c, sid, "t1")
            started = await c.call("plans.startExecution", {"sessionId": sid, "executionId": execution,
                                                            "turnId": "t1"})
            assert started["approval"]["executionState"] == "running"
            assert started["approval"]["executionTurnId"] == "t1" and started["session"]["state"] == "running"
            assert (await next_event(c, "plan.execution")).data["approval"]["executionState"] == "running"
            assert (await next_event(c, "session.updated")).data["session"]["state"] == "running"
            err = await rpc_error(c.call("plans.finishExecution", {"sessionId": sid, "executionId": execution,
                                                                   "turnId": "t2", "outcome": "completed"}))
            assert err.data_code == "CONFLICT" and err.data["turnId"] == "t1"  # only its own turn ends it
            done = await c.call("plans.finishExecution", {"sessionId": sid, "executionId": execution,
                                                          "turnId": "t1", "outcome": "completed"})
            assert done["approval"]["executionState"] == "completed" and "state" not in done["session"]
            again = await rpc_error(c.call("plans.finishExecution", {"sessionId": sid, "executionId": execution,
                                                                     "turnId": "t1", "outcome": "failed"}))
            assert again.data_code == "CONFLICT" and again.data["executionState"] == "completed"


async def test_an_execution_fails_or_is_cancelled_with_its_reason(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, execution = await approved(c, ui, tmp_path)
            await start(c, sid, "t1")
            await c.call("plans.startExecution", {"sessionId": sid, "executionId": execution, "turnId": "t1"})
            failed = await c.call("plans.finishExecution", {"sessionId": sid, "executionId": execution,
                                                            "turnId": "t1", "outcome": "failed",
                                                            "errorCode": "TESTS_RED"})
            assert failed["approval"]["executionState"] == "failed"
            assert failed["approval"]["executionErrorCode"] == "TESTS_RED"
            sid2, queued = await approved(c, ui, tmp_path / "second")
            err = await rpc_error(c.call("plans.finishExecution", {"sessionId": sid2, "executionId": queued,
                                                                   "outcome": "completed"}))
            assert err.data_code == "CONFLICT"  # it never ran: it can only be cancelled
            cancelled = await c.call("plans.finishExecution", {"sessionId": sid2, "executionId": queued,
                                                               "outcome": "cancelled"})
            assert cancelled["approval"]["executionState"] == "cancelled" and "state" not in cancelled["session"]


async def test_an_execution_needs_its_queued_state_and_a_running_turn(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, execution = await approved(c, ui, tmp_path)
            assert (await rpc_error(c.call("plans.startExecution", {"sessionId": sid, "executionId": execution,
                                                                    "turnId": "nope"}))).data_code == "NOT_FOUND"
            await start(c, sid, "t1")
            await end(c, sid, "t1")
            assert (await rpc_error(c.call("plans.startExecution", {"sessionId": sid, "executionId": execution,
                                                                    "turnId": "t1"}))).data_code == "CONFLICT"
            other, _ = await contract_session(c, tmp_path / "other")
            assert (await rpc_error(c.call("plans.startExecution", {"sessionId": other, "executionId": execution,
                                                                    "turnId": "t1"}))).data_code == "NOT_FOUND"
            await start(c, sid, "t2")
            await c.call("plans.startExecution", {"sessionId": sid, "executionId": execution, "turnId": "t2"})
            assert (await rpc_error(start(c, sid, "t3"))).data["runningTurnId"] == "t2"  # one running turn
            err = await rpc_error(c.call("plans.startExecution", {"sessionId": sid, "executionId": execution,
                                                                  "turnId": "t3"}))
            assert err.data_code == "CONFLICT" and err.data["executionState"] == "running"


async def test_the_executing_turns_end_ends_an_unfinished_execution(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            for status, expected in (("completed", "completed"), ("error", "failed"), ("aborted", "cancelled")):
                sid, execution = await approved(c, ui, tmp_path / status)
                tid = f"t-{status}"
                await start(c, sid, tid)
                await c.call("plans.startExecution", {"sessionId": sid, "executionId": execution, "turnId": tid})
                await end(c, sid, tid, status, **({"errorCode": "BOOM"} if status == "error" else {}))
                assert "state" not in (await state_of(c, sid)), status
                err = await rpc_error(c.call("plans.finishExecution", {"sessionId": sid, "executionId": execution,
                                                                       "turnId": tid, "outcome": "completed"}))
                assert err.data_code == "CONFLICT" and err.data["executionState"] == expected, status


async def test_a_sidecar_loss_ends_the_execution_its_turn_was_running(tmp_path: Path) -> None:
    """``session.recoverInflight`` ends the lost turn like a turn end does: its execution is cancelled."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, execution = await approved(c, ui, tmp_path)
            await start(c, sid, "t1")
            await c.call("plans.startExecution", {"sessionId": sid, "executionId": execution, "turnId": "t1"})
            await c.subscribe(["plan.execution", "session.updated"], session_id=sid)
            lost = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t1"})
            assert lost["turn"]["status"] == "aborted" and lost["turn"]["errorCode"] == "SIDECAR_LOST"
            event = (await next_event(c, "plan.execution")).data["approval"]
            assert (event["executionState"], event["executionErrorCode"]) == ("cancelled", "SIDECAR_LOST")
            assert "state" not in (await next_event(c, "session.updated")).data["session"]
            assert "state" not in (await state_of(c, sid))
            err = await rpc_error(c.call("plans.finishExecution", {"sessionId": sid, "executionId": execution,
                                                                   "turnId": "t1", "outcome": "completed"}))
            assert err.data_code == "CONFLICT" and err.data["executionState"] == "cancelled"


async def test_the_projected_state_follows_the_contract(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            plain = str((await c.call("session.create", {"title": "agent"}))["id"])
            assert "state" not in await state_of(c, plain)
            sid, ws = await contract_session(c, tmp_path, "goal")
            assert {k: (await state_of(c, sid)).get(k) for k in ("state", "contractKind")} == \
                {"state": "planning", "contractKind": "goal"}
            request = await submit(c, sid, ws, "goal")
            summary = await state_of(c, sid)
            assert (summary["state"], summary["contractKind"]) == ("awaiting_approval", "goal")
            out = await ui.call("plans.respond", {"requestId": request["requestId"], "action": "approve"})
            assert out["session"]["state"] == "queued" and (await state_of(c, sid))["state"] == "queued"
            await start(c, sid, "t1")
            await c.call("plans.startExecution", {"sessionId": sid, "executionId": out["approval"]["executionId"],
                                                  "turnId": "t1"})
            assert (await state_of(c, sid))["state"] == "running"
            await end(c, sid, "t1")
            summary = await state_of(c, sid)
            assert "state" not in summary and summary["mode"] == "agent"


async def test_the_latest_turn_gives_the_badge(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {"title": "badges"}))["id"])
            assert "latestTurn" not in await state_of(c, sid)
            await start(c, sid, "t1")
            await end(c, sid, "t1", "error", errorCode="RATE_LIMITED")
            latest = (await state_of(c, sid))["latestTurn"]
            assert (latest["id"], latest["status"], latest["errorCode"]) == ("t1", "error", "RATE_LIMITED")
            await start(c, sid, "t2")
            assert (await state_of(c, sid))["latestTurn"] == {"id": "t2", "status": "running"}
            await end(c, sid, "t2", "aborted")
            assert (await state_of(c, sid))["latestTurn"]["status"] == "aborted"


async def test_a_mode_change_that_breaks_a_pending_contract_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as c:
            sid, ws = await contract_session(c, tmp_path)
            await c.call("session.update", {"sessionId": sid, "mode": "goal"})  # no contract yet: fine
            await c.call("session.update", {"sessionId": sid, "mode": "plan"})
            request = await submit(c, sid, ws)
            err = await rpc_error(c.call("session.update", {"sessionId": sid, "mode": "agent"}))
            assert err.data_code == "CONFLICT" and err.data["state"] == "awaiting_approval"
            assert (await state_of(c, sid))["mode"] == "plan"
            await c.call("session.update", {"sessionId": sid, "thinkingLevel": "high"})  # other fields: fine
            out = await c.call("plans.respond", {"requestId": request["requestId"], "action": "approve"})
            err = await rpc_error(c.call("session.update", {"sessionId": sid, "mode": "plan"}))
            assert err.data_code == "CONFLICT" and err.data["state"] == "queued"
            await c.call("plans.finishExecution", {"sessionId": sid, "executionId": out["approval"]["executionId"],
                                                   "outcome": "cancelled"})
            assert (await c.call("session.update", {"sessionId": sid, "mode": "plan"}))["mode"] == "plan"


async def test_the_sidecar_cannot_approve_its_own_plan(tmp_path: Path) -> None:
    """§11.19: no background path approves a plan or goal. approvals.respond refused the agent sidecar,
    plans.respond let it approve its own plan (execution queued, permission raised to auto)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, ws = await contract_session(c, tmp_path)
            request = await submit(c, sid, ws)
            for action in ("approve", "reject"):
                err = await rpc_error(c.call("plans.respond", {"requestId": request["requestId"], "action": action,
                                                              "targetPermissionMode": "auto"}
                                             if action == "approve" else
                                             {"requestId": request["requestId"], "action": action}))
                assert err.data_code == "PERMISSION_DENIED"
            assert (await state_of(c, sid))["state"] == "awaiting_approval"
            out = await ui.call("plans.respond", {"requestId": request["requestId"], "action": "approve"})
            assert out["approval"]["status"] == "approved"
