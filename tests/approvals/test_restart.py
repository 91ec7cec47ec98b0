"""Seed §11.18 extended to every pending user request, on real host processes killed with SIGKILL."""

from __future__ import annotations

from pathlib import Path

import trio

from runtime.client import RpcError, open_client
from tests.hostkit import client_for, start_host_process
from tests.pipeline.scenarios import rows
from tests.scheduler.hostclock import SetClock, host_at

MARKDOWN = "# Plan\n\n1. Do it\n"



async def test_acceptance_11_18_restart_interrupts_every_pending_request_and_refuses_stale_answers(
    tmp_path: Path,
) -> None:
    """Pending tool permissions, questions, plan approvals and queued/running executions become
    ``interrupted``; answered ones, rules and decisions stay; no turn is replayed; every late answer
    is refused and changes nothing."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    data.mkdir()
    ws.mkdir()
    with trio.fail_after(120):
        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with open_client(proc.url, proc.token, client_id="sidecar", client_kind="agent") as sc, \
                    open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
                a = (await sc.call("session.create", {"title": "agent", "projectPath": str(ws)}))["id"]
                await sc.call("session.startTurn", {"sessionId": a, "turnId": "ta"})
                answered = (await sc.call("approvals.request", {"sessionId": a, "turnId": "ta", "tool": "Read",
                                                                "risk": "low"}))["request"]["requestId"]
                await ui.call("approvals.respond", {"sessionId": a, "requestId": answered,
                                                    "optionId": "allow_project"})
                waiting = (await sc.call("approvals.request", {"sessionId": a, "turnId": "ta", "tool": "Bash",
                                                               "risk": "high"}))["request"]["requestId"]
                question = (await sc.call("interactions.request", {
                    "sessionId": a, "turnId": "ta", "question": "Which branch?", "allowFreeText": True,
                }))["request"]["requestId"]
                b = (await sc.call("session.create", {"title": "plan", "projectPath": str(ws), "mode": "plan"}))["id"]
                submitted = await sc.call("plans.submit", {"sessionId": b, "turnId": "tb0", "toolCallId": "cb",
                                                           "kind": "plan", "markdown": MARKDOWN,
                                                           "workspaceRoot": str(ws)})
                approved = await ui.call("plans.respond", {"requestId": submitted["requestId"], "action": "approve"})
                execution = approved["approval"]["executionId"]
                await sc.call("session.startTurn", {"sessionId": b, "turnId": "tb"})
                await sc.call("plans.startExecution", {"sessionId": b, "executionId": execution, "turnId": "tb"})
                c = (await sc.call("session.create", {"title": "goal", "projectPath": str(ws), "mode": "goal"}))["id"]
                pending_goal = await sc.call("plans.submit", {"sessionId": c, "turnId": "tc0", "toolCallId": "cc",
                                                              "kind": "goal", "markdown": MARKDOWN,
                                                              "workspaceRoot": str(ws)})
                assert (await ui.call("approvals.pending", {}))["pending"][0]["requestId"] == waiting
        finally:
            await trio.to_thread.run_sync(proc.kill9)
        before = rows(data, "SELECT status FROM approvals WHERE request_id = ?", answered)
        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
                fence = (await ui.call("host.status", {}))["boot"]["fence"]
                assert sorted(fence["abortedTurns"]) == ["ta", "tb"]
                assert fence["interruptedPermissionRequests"] == 1 and fence["interruptedInteractions"] == 1
                assert (fence["interruptedApprovals"], fence["interruptedExecutions"]) == (1, 1)
                assert (await ui.call("approvals.pending", {})) == {"pending": []}
                assert (await ui.call("interactions.pending", {})) == {"pending": []}
                assert (await ui.call("plans.pending", {})) == {"pending": []}
                for method, params in (
                    ("approvals.respond", {"sessionId": a, "requestId": waiting, "optionId": "allow_once"}),
                    ("interactions.respond", {"sessionId": a, "requestId": question, "answer": {"text": "main"}}),
                    ("plans.respond", {"requestId": pending_goal["requestId"], "action": "approve"}),
                ):
                    try:
                        await ui.call(method, params)
                    except RpcError as exc:
                        assert exc.data_code == "CONFLICT", method
                    else:
                        raise AssertionError(f"{method}: a stale answer was accepted")
                assert rows(data, "SELECT status FROM approvals WHERE request_id = ?", waiting) == [("interrupted",)]
                assert rows(data, "SELECT status FROM interactions") == [("interrupted",)]
                assert rows(data, "SELECT status FROM approvals WHERE request_id = ?", answered) == before
                page = await ui.call("session.get", {"sessionId": a})
                assert {d["requestId"]: d["status"] for d in page["decisions"]} == {
                    answered: "allowed", waiting: "interrupted", question: "interrupted"}
                sb = (await ui.call("session.get", {"sessionId": b}))["session"]
                assert sb["mode"] == "agent" and "state" not in sb  # approved, interrupted: stays agent
                sc_ = (await ui.call("session.get", {"sessionId": c}))["session"]
                assert (sc_["mode"], sc_["state"]) == ("goal", "planning")  # pending, interrupted: contract mode
                assert rows(data, "SELECT execution_state, execution_outcome FROM plan_approvals "
                                  "WHERE execution_id = ?", execution) == [("interrupted", "interrupted")]
                assert sorted(rows(data, "SELECT id, status FROM turns")) == [("ta", "aborted"), ("tb", "aborted")]
            async with open_client(proc.url, proc.token, client_id="sidecar", client_kind="agent") as sc:
                # nothing is replayed: a new turn asks again, and the remembered rule still answers
                await sc.call("session.startTurn", {"sessionId": a, "turnId": "ta2"})
                again = await sc.call("approvals.request", {"sessionId": a, "turnId": "ta2", "tool": "Read",
                                                            "risk": "low"})
                assert again["request"]["status"] == "allowed" and again["request"]["respondedBy"] == "rule"
                fresh = await sc.call("approvals.request", {"sessionId": a, "turnId": "ta2", "tool": "Bash",
                                                            "risk": "high"})
                assert fresh["request"]["status"] == "pending" and fresh["request"]["requestId"] != waiting
        finally:
            await trio.to_thread.run_sync(proc.terminate)


async def test_a_request_past_its_deadline_stays_expired_across_a_restart(tmp_path: Path) -> None:
    """README §10: an answer after ``expiresAt`` finds the request ``expired``. The boot fence marked
    every pending row ``interrupted``, so one that had expired unanswered said ``interrupted`` after
    a restart (in session.get decisions and the late answer's CONFLICT); a live one is interrupted."""
    clock = SetClock(1_796_000_000_000)
    with trio.fail_after(60):
        async with host_at(tmp_path / "data", clock) as host, client_for(host, "sidecar", kind="agent") as sc:
            await sc.call("session.create", {"sessionId": "s1"})
            await sc.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
            ids = []
            for call, deadline in (("c1", clock.ms + 1_000), ("c2", clock.ms + 60_000)):
                got = await sc.call("approvals.request", {"sessionId": "s1", "turnId": "t1", "toolCallId": call,
                                                          "tool": "Bash", "risk": "low", "expiresAt": deadline})
                ids.append(got["request"]["requestId"])
        clock.ms += 5_000  # the first one's deadline passed while nobody answered (the host was down)
        async with host_at(tmp_path / "data", clock) as host, client_for(host, "ui", kind="ui") as ui:
            got = await ui.call("session.get", {"sessionId": "s1"})
            assert {d["requestId"]: d["status"] for d in got["decisions"]} == {ids[0]: "expired",
                                                                               ids[1]: "interrupted"}
            for rid, status in zip(ids, ("expired", "interrupted"), strict=True):
                try:
                    await ui.call("approvals.respond", {"sessionId": "s1", "requestId": rid, "optionId": "allow_once"})
                except RpcError as err:
                    assert err.data_code == "CONFLICT" and err.data["status"] == status
                else:
                    raise AssertionError("a late answer was accepted")
