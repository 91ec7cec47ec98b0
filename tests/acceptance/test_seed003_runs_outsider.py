"""Seed 003 §4.6 turns, §4.6a plan_approvals, §4.6c collaboration ledger, §4.11 scheduled tasks + task runs,
§12 native Pi sessions and acceptance items 3, 6, 17-21 read by an outsider: black-box checks over a real
host's WebSocket gateway (the methods protocol/README.md documents), with a SIGKILL + restart where the seed
makes a crash or restart claim and an exact retry (same clientId + submissionId) where a write is keyed.
Each test quotes the statement it checks."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, RpcError, open_client
from tests.acceptance.outsiderkit import all_at_once, code_of, say
from tests.hostkit import HostProcess, client_for, inprocess_host, msg, start_host_process


@asynccontextmanager
async def real_host(data_dir: Path) -> AsyncIterator[tuple[HostProcess, HostClient, HostClient]]:
    """A ``pi-host serve`` process on ``data_dir``, its agent sidecar client and a UI client; killed on exit
    (a SIGKILL: the caller's restart then boots from whatever reached the disk)."""
    proc = start_host_process(data_dir)
    try:
        async with open_client(proc.url, proc.token, client_id="outsider-agent", client_kind="agent") as agent, \
                open_client(proc.url, proc.token, client_id="outsider-ui", client_kind="ui") as ui:
            yield proc, agent, ui
    finally:
        proc.kill9()


async def turns_of(c: HostClient, sid: str) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in (await c.call("session.listTurns", {"sessionId": sid}))["turns"]}


PLAN_MD = "# Plan ✓\r\n\r\n1. Split the tokenizer  \n2. Keep `x = 'é'`\t\n\n- [ ] trailing spaces stay   \n"


def submit(sid: str, ws: Path, call_id: str, turn_id: str, kind: str = "plan", **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": turn_id, "toolCallId": call_id, "kind": kind, "markdown": PLAN_MD,
            "title": "Split *the* tokenizer", "question": "Proceed — with `x`?", "workspaceRoot": str(ws), **extra}


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A data directory and a workspace folder, both made."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    data.mkdir()
    ws.mkdir()
    return data, ws


# ------------------------------------------------------------------------------------------- turns (§4.6, §11.3)

async def test_kill9_mid_turn_aborts_it_skips_a_torn_line_and_the_next_append_is_whole(tmp_path: Path) -> None:
    """§11.3: "Kill -9 during a running turn: boot marks the turn aborted, transcript intact up to the last
    fsync'd message line; a torn trailing line is skipped on read". The torn fragment must not swallow the
    first line written after the restart either: that message reads back after one more restart. The
    aborted turn is settled: a late `completed` is refused and the usage rollup counts it aborted (§4.6)."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            sid = (await agent.call("session.create", {"title": "crashy"}))["id"]
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "providerId": "p",
                                                   "modelId": "m"})
            await say(agent, sid, "u1", "question one", turnId="t1")
            await say(agent, sid, "a1", "partial answer", role="assistant", turnId="t1")
            proc.kill9()
        transcript = data / "sessions" / f"{sid}.jsonl"
        with transcript.open("ab") as f:
            f.write(b'{"type":"message","message":{"id":"torn","role":"assistant","blocks":[{"type":"te')
        async with real_host(data) as (proc, agent, _ui):
            view = await agent.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in view["messages"]] == ["u1", "a1"]
            t1 = (await turns_of(agent, sid))["t1"]
            assert t1["status"] == "aborted" and t1.get("endedAt") is not None
            assert (t1["providerId"], t1["modelId"]) == ("p", "m")
            assert await code_of(agent, "session.endTurn",
                                 {"sessionId": sid, "turnId": "t1", "status": "completed"}) == "CONFLICT"
            usage = await agent.call("usage.session", {"sessionId": sid})
            assert (usage["total"]["turns"], usage["total"]["abortedTurns"]) == (1, 1)
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            await say(agent, sid, "u2", "question two", turnId="t2")
            await agent.call("session.endTurn", {"sessionId": sid, "turnId": "t2", "status": "completed"})
            proc.kill9()
        async with real_host(data) as (proc, agent, _ui):
            view = await agent.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in view["messages"]] == ["u1", "a1", "u2"]
            assert view["messages"][2]["blocks"][0]["text"] == "question two"
            turns = await turns_of(agent, sid)
            assert (turns["t1"]["status"], turns["t2"]["status"]) == ("aborted", "completed")


async def test_turn_rows_and_snapshots_cascade_with_their_session(tmp_path: Path) -> None:
    """§4.6: "session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE". Deleting the session
    takes its turns (and with them their environment snapshots, seed 000 §4) out of every read; another
    session's turn and snapshot stay."""
    env = {"version": 1, "model": {"id": "m1"}, "credentialRefs": ["provider/p1"]}
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            doomed = (await c.call("session.create", {}))["id"]
            kept = (await c.call("session.create", {}))["id"]
            for sid, tid in ((doomed, "td"), (kept, "tk")):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": tid, "environment": env})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": tid, "status": "completed",
                                                 "usage": {"inputTokens": 10, "outputTokens": 5}})
            before = await c.call("usage.history", {"days": 1})
            assert sum(d["turns"] for d in before["days"]) == 2
            await c.call("session.delete", {"sessionId": doomed})
            assert await code_of(c, "session.turnEnvironment", {"turnId": "td"}) == "NOT_FOUND"
            assert (await c.call("session.turnEnvironment", {"turnId": "tk"}))["snapshot"]["model"] == {"id": "m1"}
            after = await c.call("usage.history", {"days": 1})
            assert sum(d["turns"] for d in after["days"]) == 1
            assert await code_of(c, "session.listTurns", {"sessionId": doomed}) == "SESSION_NOT_FOUND"


async def test_environment_snapshot_survives_kill9_and_binds_by_reference(tmp_path: Path) -> None:
    """Seed 000 §4: a versioned RunEnvironmentSnapshot with a SHA-256 digest; "Secrets are not copied into
    the snapshot. It stores credential references. Recovery rejects ... binding drift ... while allowing
    encrypted values behind the same reference to rotate". The snapshot and its digest read back the same
    after a SIGKILL; a secret rotated behind its reference still verifies; a session binding changed is
    drift."""
    data = tmp_path / "data"
    data.mkdir()
    env = {"version": 1, "connection": {"baseUrl": "https://api.example.test", "apiStyle": "messages"},
           "model": {"id": "m1", "contextWindow": 1000}, "systemPrompt": "be careful",
           "executionBindings": {"mode": "agent"}, "credentialRefs": ["provider/p1"]}
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            await agent.call("secrets.set", {"ref": "provider/p1", "value": "old-key"})
            sid = (await agent.call("session.create", {}))["id"]
            started = await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "environment": env})
            digest = started["environmentDigest"]
            proc.kill9()
        async with real_host(data) as (proc, agent, _ui):
            stored = await agent.call("session.turnEnvironment", {"turnId": "t1"})
            assert (stored["digest"], stored["version"]) == (digest, 1)
            assert stored["snapshot"]["credentialRefs"] == ["provider/p1"]
            assert "old-key" not in json.dumps(stored)
            await agent.call("secrets.set", {"ref": "provider/p1", "value": "rotated-key"})
            verified = await agent.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            assert verified["digest"] == digest
            await agent.call("session.update", {"sessionId": sid, "mode": "plan"})
            try:
                await agent.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            except RpcError as drift:
                assert drift.data_code == "ENVIRONMENT_DRIFT"
                assert drift.data["drift"] == [{"field": "executionBindings.mode", "snapshot": "agent",
                                                "current": "plan"}]
            else:
                raise AssertionError("a changed session binding verified")


async def test_list_turns_pages_every_turn_once_newest_first(tmp_path: Path) -> None:
    """§4.6: idx_turns_session (session_id, started_at DESC) serves session.listTurns, "newest first" with a
    cursor. Turns started back to back (same millisecond or not) page out exactly once each, in start order
    reversed, whatever the page size."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            started = []
            for i in range(9):
                tid = f"t{i}"
                await c.call("session.startTurn", {"sessionId": sid, "turnId": tid,
                                                   **({"retryOf": f"t{i - 1}"} if i else {})})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": tid,
                                                 "status": "error" if i % 2 else "completed"})
                started.append(tid)
            for limit in (1, 2, 4, 50):
                seen: list[str] = []
                cursor = None
                while True:
                    page = await c.call("session.listTurns", {"sessionId": sid, "limit": limit,
                                                              **({"cursor": cursor} if cursor else {})})
                    seen += [t["id"] for t in page["turns"]]
                    assert all((t.get("retryOf") == f"t{int(t['id'][1:]) - 1}") if t["id"] != "t0"
                               else t.get("retryOf") is None for t in page["turns"])
                    cursor = page.get("nextCursor")
                    if not cursor:
                        break
                assert seen == started[::-1], limit


# ---------------------------------------------------------------------------------- plan approvals (§4.6a)

async def test_plan_and_goal_snapshots_are_new_immutable_files_and_reload_keeps_only_pending(
        tmp_path: Path) -> None:
    """§4.6a/§11.17: "write exact Markdown bytes to a unique .pi/plan/*.md or .pi/goal/*.md file with
    SHA-256 and size; title/question stay structured and renderer reload retains only the pending row and
    original absolute deadline"; "a later Plan/Goal turn creates a new complete snapshot/approval row and
    never replaces an earlier file". The same Markdown twice gives two files; a fresh UI connection sees
    only the pending one with its deadline as sent."""
    ws = tmp_path / "ws"
    ws.mkdir()
    deadline = int(time.time() * 1000) + 3_600_000 + 7
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "agent-1", "agent") as agent, \
                client_for(host, "ui-1", "ui") as ui:
            sid = (await agent.call("session.create", {"projectPath": str(ws), "mode": "goal"}))["id"]
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            first = await agent.call("plans.submit", submit(sid, ws, "c1", "t1", kind="goal"))
            await ui.call("plans.respond", {"requestId": first["requestId"], "action": "reject"})
            await agent.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            second = await agent.call("plans.submit", submit(sid, ws, "c2", "t2", kind="goal", expiresAt=deadline))
            assert first["artifactPath"] != second["artifactPath"]
            for req in (first, second):
                path = req["artifactPath"]
                assert path.startswith(".pi/goal/") and path.endswith(".md") and "/" not in path[len(".pi/goal/"):]
                body = (ws / path).read_bytes()
                assert body == PLAN_MD.encode()
                assert (req["artifactSha256"], req["artifactSize"]) == (hashlib.sha256(body).hexdigest(), len(body))
                assert (req["title"], req["question"]) == ("Split *the* tokenizer", "Proceed — with `x`?")
            assert sorted(os.listdir(ws / ".pi" / "goal")) == sorted(
                [Path(first["artifactPath"]).name, Path(second["artifactPath"]).name])
            assert not (ws / ".pi" / "plan").exists() or os.listdir(ws / ".pi" / "plan") == []
            async with client_for(host, "ui-reloaded", "ui") as reloaded:
                pending = (await reloaded.call("plans.pending", {}))["pending"]
                assert [(p["requestId"], p["expiresAt"], p["status"], p["kind"]) for p in pending] == [
                    (second["requestId"], deadline, "pending", "goal")]
                assert (pending[0]["title"], pending[0]["question"]) == (second["title"], second["question"])


async def test_a_running_execution_is_interrupted_by_kill9_never_replayed_and_the_session_stays_agent(
        tmp_path: Path) -> None:
    """§4.6a/§11.18: "At startup ... every queued or running execution state to interrupted. The associated
    running turn is aborted. ... no replay ... an already-approved queued/running interruption leaves it
    Agent" and stale responses are rejected. The running case (not only queued): the execution can be
    neither finished nor started again after the restart."""
    data, ws = _dirs(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, ui):
            sid = (await agent.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            req = await agent.call("plans.submit", submit(sid, ws, "c1", "t1"))
            approved = await ui.call("plans.respond", {"requestId": req["requestId"], "action": "approve",
                                                       "targetPermissionMode": "accept-edits"})
            exec_id = approved["approval"]["executionId"]
            await agent.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            await agent.call("plans.startExecution", {"sessionId": sid, "executionId": exec_id, "turnId": "t2"})
            proc.kill9()
        async with real_host(data) as (proc, agent, ui):
            session = (await agent.call("session.get", {"sessionId": sid}))["session"]
            assert (session["mode"], session["permissionMode"]) == ("agent", "accept-edits")
            assert session.get("state") is None  # no longer "running": nothing runs after the restart
            assert (session["latestTurn"]["id"], session["latestTurn"]["status"]) == ("t2", "aborted")
            assert (await turns_of(agent, sid))["t2"]["status"] == "aborted"
            assert (await ui.call("plans.pending", {}))["pending"] == []
            assert await code_of(agent, "plans.finishExecution", {"sessionId": sid, "executionId": exec_id,
                                                                  "turnId": "t2", "outcome": "completed"}) \
                == "CONFLICT"
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t3"})
            assert await code_of(agent, "plans.startExecution",
                                 {"sessionId": sid, "executionId": exec_id, "turnId": "t3"}) == "CONFLICT"
            assert await code_of(ui, "plans.respond", {"requestId": req["requestId"], "action": "reject"}) \
                == "CONFLICT"
            # nothing is queued or running any more: the user may switch the session back to a contract mode
            await agent.call("session.endTurn", {"sessionId": sid, "turnId": "t3", "status": "completed"})
            switched = await ui.call("session.update", {"sessionId": sid, "mode": "plan"})
            assert switched["mode"] == "plan"


async def test_keyed_plan_submit_and_respond_retries_survive_kill9(tmp_path: Path) -> None:
    """§4 receipts over §4.6a: an exact retry (same clientId + submissionId) of plans.submit after a SIGKILL
    answers the stored response and writes no second file; the restart interrupted that pending row, so a
    new proposal opens a new pending row and a new file. An exact retry of a plans.respond answers the stored
    response after a restart too, while a fresh answer is stale (CONFLICT)."""
    data, ws = _dirs(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, ui):
            sid = (await agent.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
            other = (await agent.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            first = await agent.call("plans.submit", submit(sid, ws, "c1", "t1", submissionId="sub-1"))
            await agent.call("session.startTurn", {"sessionId": other, "turnId": "o1"})
            answered_req = await agent.call("plans.submit", submit(other, ws, "o-c1", "o1"))
            answered = await ui.call("plans.respond", {"requestId": answered_req["requestId"], "action": "reject",
                                                       "submissionId": "ans-1"})
            proc.kill9()
        async with real_host(data) as (proc, agent, ui):
            again = await agent.call("plans.submit", submit(sid, ws, "c1", "t1", submissionId="sub-1"))
            assert again == first
            assert sorted(os.listdir(ws / ".pi" / "plan")) == sorted(
                [Path(first["artifactPath"]).name, Path(answered_req["artifactPath"]).name])
            assert await ui.call("plans.respond", {"requestId": answered_req["requestId"], "action": "reject",
                                                   "submissionId": "ans-1"}) == answered
            assert await code_of(ui, "plans.respond", {"requestId": first["requestId"], "action": "approve"}) \
                == "CONFLICT"
            assert (await agent.call("session.get", {"sessionId": sid}))["session"]["mode"] == "plan"
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            fresh = await agent.call("plans.submit", submit(sid, ws, "c2", "t2"))
            assert fresh["status"] == "pending" and fresh["requestId"] != first["requestId"]
            assert fresh["artifactPath"] != first["artifactPath"]
            assert (ws / first["artifactPath"]).read_bytes() == PLAN_MD.encode()
            assert len(os.listdir(ws / ".pi" / "plan")) == 3


async def test_a_deleted_sessions_pending_approval_goes_with_it(tmp_path: Path) -> None:
    """§4.6a: "session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE". A pending proposal of a
    deleted session is no longer pending anywhere and cannot be approved; the next session's proposal is
    unaffected (the one-pending invariant is per session)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "agent-1", "agent") as agent, \
                client_for(host, "ui-1", "ui") as ui:
            doomed = (await agent.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
            kept = (await agent.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
            await agent.call("session.startTurn", {"sessionId": doomed, "turnId": "d1"})
            gone = await agent.call("plans.submit", submit(doomed, ws, "d-c1", "d1"))
            await agent.call("session.startTurn", {"sessionId": kept, "turnId": "k1"})
            stay = await agent.call("plans.submit", submit(kept, ws, "k-c1", "k1"))
            await ui.call("session.delete", {"sessionId": doomed})
            assert [p["requestId"] for p in (await ui.call("plans.pending", {}))["pending"]] == [stay["requestId"]]
            assert await code_of(ui, "plans.respond", {"requestId": gone["requestId"], "action": "approve"}) in (
                "NOT_FOUND", "SESSION_NOT_FOUND")
            out = await ui.call("plans.respond", {"requestId": stay["requestId"], "action": "approve"})
            assert out["session"]["mode"] == "agent"


async def test_a_deadline_passed_unanswered_closes_the_gate_for_the_next_proposal(tmp_path: Path) -> None:
    """§4.6a: "Reject/expiry leave the session in its contract mode ... and close the active gate; a later
    prompt can create a new pending row" (the single-pending index). Nobody answers or reads the expired
    proposal: the next submit opens a new pending row all the same, and the expired one cannot be answered."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "agent-1", "agent") as agent, \
                client_for(host, "ui-1", "ui") as ui:
            sid = (await agent.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            soon = int(time.time() * 1000) + 300
            old = await agent.call("plans.submit", submit(sid, ws, "c1", "t1", expiresAt=soon))
            await trio.sleep(0.6)
            new = await agent.call("plans.submit", submit(sid, ws, "c2", "t1"))
            assert new["status"] == "pending"
            assert [p["requestId"] for p in (await ui.call("plans.pending", {}))["pending"]] == [new["requestId"]]
            assert await code_of(ui, "plans.respond", {"requestId": old["requestId"], "action": "approve"}) \
                == "CONFLICT"
            assert (await agent.call("session.get", {"sessionId": sid}))["session"]["mode"] == "plan"


async def test_a_deadline_that_passes_while_the_host_is_down_leaves_nothing_to_answer(tmp_path: Path) -> None:
    """§4.6a/§11.18 with the deadline passing during the outage: after the restart nothing is pending, an
    answer is stale, the session is still in its contract mode and a new proposal opens a new row."""
    data, ws = _dirs(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            sid = (await agent.call("session.create", {"projectPath": str(ws), "mode": "goal"}))["id"]
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            deadline = int(time.time() * 1000) + 400
            old = await agent.call("plans.submit", submit(sid, ws, "c1", "t1", kind="goal", expiresAt=deadline))
            proc.kill9()
        await trio.sleep(max(0.0, (deadline - time.time() * 1000) / 1000) + 0.2)
        async with real_host(data) as (proc, agent, ui):
            assert (await ui.call("plans.pending", {}))["pending"] == []
            assert await code_of(ui, "plans.respond", {"requestId": old["requestId"], "action": "approve"}) \
                == "CONFLICT"
            assert (await agent.call("session.get", {"sessionId": sid}))["session"]["mode"] == "goal"
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            assert (await agent.call("plans.submit", submit(sid, ws, "c2", "t2", kind="goal")))["status"] == "pending"


async def test_racing_proposals_and_answers_leave_one_pending_row_one_file_and_one_answer(tmp_path: Path) -> None:
    """§4.6a: "One table serves both kinds (D198), so the single-pending-approval invariant ... [is] shared"
    (idx_plan_approvals_one_pending_session) and plans.respond "stale responses are CONFLICT". Four sidecar
    submits racing on one session open exactly one pending row and leave exactly one file; two UIs answering
    at once give one answer, and the session's mode follows the one that won."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "agent-a", "agent") as a, \
                client_for(host, "agent-b", "agent") as b, client_for(host, "ui-1", "ui") as u1, \
                client_for(host, "ui-2", "ui") as u2:
            for rep in range(3):
                sid = (await a.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
                await a.call("session.startTurn", {"sessionId": sid, "turnId": f"t{rep}"})
                outcomes = await all_at_once([
                    (c, "plans.submit", {**submit(sid, ws, f"c{rep}-{i}", f"t{rep}"), "markdown": f"# take {i}\n"})
                    for i, c in enumerate((a, b, a, b))])
                won = [o for o in outcomes if isinstance(o, dict)]
                assert len(won) == 1 and sorted(o for o in outcomes if isinstance(o, str)) == ["CONFLICT"] * 3
                assert len(os.listdir(ws / ".pi" / "plan")) == rep + 1
                assert (ws / won[0]["artifactPath"]).exists()
                answers = await all_at_once([
                    (u1, "plans.respond", {"requestId": won[0]["requestId"], "action": "approve"}),
                    (u2, "plans.respond", {"requestId": won[0]["requestId"], "action": "reject"})])
                settled = [x for x in answers if isinstance(x, dict)]
                assert len(settled) == 1 and [x for x in answers if isinstance(x, str)] == ["CONFLICT"]
                mode = (await a.call("session.get", {"sessionId": sid}))["session"]["mode"]
                assert mode == ("agent" if settled[0]["approval"]["status"] == "approved" else "plan")

# ------------------------------------------------------------------------- scheduled tasks (§4.11, §11.6, §11.19)

async def test_task_runs_outlive_their_session_and_tasks_outlive_their_project(tmp_path: Path) -> None:
    """§4.11: task_runs.session_id "REFERENCES sessions(id) ON DELETE SET NULL" and scheduled_tasks.project_id
    "REFERENCES projects(id) ON DELETE SET NULL". Deleting the run's session keeps the run (without its
    session); removing the task's project keeps the task (without its project); §11.6 through RPC only."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"projectPath": str(ws)}))["id"]
            project_id = (await c.call("session.get", {"sessionId": sid}))["session"]["projectId"]
            other = (await c.call("session.create", {}))["id"]
            task = await c.call("tasks.create", {"title": "digest", "prompt": "sum it up", "projectId": project_id})
            assert task["projectId"] == project_id
            await c.call("tasks.startRun", {"taskId": task["id"], "runId": "r1", "sessionId": other})
            await c.call("tasks.finishRun", {"runId": "r1", "status": "completed"})
            await c.call("session.delete", {"sessionId": other})
            runs = (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"]
            assert [(r["id"], r["status"], r.get("sessionId")) for r in runs] == [("r1", "completed", None)]
            await c.call("projects.remove", {"projectId": project_id})
            kept = await c.call("tasks.get", {"taskId": task["id"]})
            assert kept.get("projectId") is None and kept["title"] == "digest"
            assert [t["id"] for t in (await c.call("tasks.list", {}))["tasks"]] == [task["id"]]


async def test_weekday_selections_are_validated_before_any_mutation(tmp_path: Path) -> None:
    """§4.11: "Optional weekdays stores 1–7 unique integers in 0–6, overriding legacy weekday for weekly
    schedules. Missing weekdays preserves the single-day behavior. Invalid or empty selections are rejected
    before mutation." Duplicates, out-of-range days and an empty list are refused on create and on update,
    and a refused update leaves the task exactly as it was; all seven days are accepted."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            base = {"title": "weekly", "prompt": "p", "cadence": "weekly", "schedule": {"hour": 9, "minute": 0}}
            for bad in ([1, 1], [7], [-1], []):
                assert await code_of(c, "tasks.create", {**base, "weekdays": bad}) == "INVALID_PARAMS", bad
                assert await code_of(c, "tasks.create", {**base, "config": {"weekdays": bad}}) == "INVALID_PARAMS", bad
            assert (await c.call("tasks.list", {}))["tasks"] == []
            task = await c.call("tasks.create", {**base, "weekdays": [0, 1, 2, 3, 4, 5, 6]})
            assert task["weekdays"] == [0, 1, 2, 3, 4, 5, 6]
            single = await c.call("tasks.create", {**base, "schedule": {"hour": 9, "minute": 0, "weekday": 3}})
            assert "weekdays" not in single or single["weekdays"] is None
            assert single.get("nextRunAt")
            for bad in ([2, 2], [0, 1, 2, 3, 4, 5, 6, 0], [8], []):
                assert await code_of(c, "tasks.update", {"taskId": task["id"], "weekdays": bad,
                                                         "title": "changed"}) == "INVALID_PARAMS", bad
            assert await c.call("tasks.get", {"taskId": task["id"]}) == task


async def test_hourly_ignores_calendar_fields_and_a_task_without_schedule_is_unarmed(tmp_path: Path) -> None:
    """§4.11: "hourly schedules compute nextRunAt = now + 3_600_000, ignoring calendar fields. Absence of
    schedule leaves legacy tasks unarmed." and "new scheduled tasks default to agent". A task without a
    schedule object is unarmed whatever its cadence: the object is "required by Hourly intervals" too."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            before = int(time.time() * 1000)
            hourly = await c.call("tasks.create", {"title": "h", "prompt": "p", "cadence": "hourly",
                                                   "schedule": {"hour": 3, "minute": 17}})
            after = int(time.time() * 1000)
            nxt = hourly["nextRunAt"]
            at = int(datetime.fromisoformat(nxt.replace("Z", "+00:00")).timestamp() * 1000)
            assert before + 3_600_000 <= at <= after + 3_600_000, (nxt, before, after)
            for cadence in ("hourly", "daily", "weekly"):
                unarmed = await c.call("tasks.create", {"title": cadence, "prompt": "p", "cadence": cadence})
                assert unarmed.get("nextRunAt") is None, unarmed
                assert unarmed["mode"] == "agent"


async def test_task_writes_retry_exactly_and_a_running_run_is_aborted_by_kill9(tmp_path: Path) -> None:
    """§11.6 "Scheduled tasks CRUD + run history round-trip through host RPC only" with a SIGKILL: an exact
    retry of tasks.create / tasks.startRun after the restart answers the stored response and creates no
    second task or run; the run left running is aborted at boot and cannot be finished afterwards; the
    history survives the crash."""
    data = tmp_path / "data"
    data.mkdir()
    create = {"title": "nightly", "prompt": "check the build", "cadence": "daily",
              "schedule": {"hour": 2, "minute": 5}, "thinkingLevel": "low", "submissionId": "task-create-1"}
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            task = await agent.call("tasks.create", create)
            await agent.call("tasks.startRun", {"taskId": task["id"], "runId": "r0"})
            await agent.call("tasks.finishRun", {"runId": "r0", "status": "error", "errorCode": "E_BUILD"})
            run = await agent.call("tasks.startRun", {"taskId": task["id"], "runId": "r1",
                                                      "submissionId": "run-1"})
            assert run["settings"]["thinkingLevel"] == "low"
            proc.kill9()
        async with real_host(data) as (proc, agent, _ui):
            assert await agent.call("tasks.create", create) == task
            assert [t["id"] for t in (await agent.call("tasks.list", {}))["tasks"]] == [task["id"]]
            assert await agent.call("tasks.startRun", {"taskId": task["id"], "runId": "r1",
                                                       "submissionId": "run-1"}) == run
            runs = (await agent.call("tasks.runs", {"taskId": task["id"]}))["runs"]
            assert [(r["id"], r["status"], r.get("errorCode")) for r in runs][1:] == [("r0", "error", "E_BUILD")]
            assert (runs[0]["id"], runs[0]["status"]) == ("r1", "aborted") and runs[0].get("endedAt") is not None
            assert await code_of(agent, "tasks.finishRun", {"runId": "r1", "status": "completed"}) == "CONFLICT"
            assert (await agent.call("tasks.startRun", {"taskId": task["id"], "runId": "r2"}))["status"] == "running"


async def test_contract_mode_runs_fail_first_with_one_shared_code(tmp_path: Path) -> None:
    """§4.11/§11.19: "A scheduled or unattended run whose mode is a contract mode (Plan or Goal) is explicitly
    rejected before provider work, .pi/<kind>/*.md creation, approval, or queue insertion with
    PLAN_REQUIRES_INTERACTIVE_SESSION — one shared code for both kinds"; legacy chat maps to plan. A task
    switched to Agent runs."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            for mode in ("plan", "goal", "chat"):
                task = await c.call("tasks.create", {"title": mode, "prompt": "p", "mode": mode,
                                                     "workspacePath": str(ws)})
                assert task["mode"] == ("plan" if mode == "chat" else mode)
                assert await code_of(c, "tasks.startRun", {"taskId": task["id"]}) \
                    == "PLAN_REQUIRES_INTERACTIVE_SESSION"
                assert (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"] == []
                switched = await c.call("tasks.update", {"taskId": task["id"], "mode": "agent"})
                assert switched["mode"] == "agent"
                assert (await c.call("tasks.startRun", {"taskId": task["id"]}))["status"] == "running"
            agent_task = await c.call("tasks.create", {"title": "agent", "prompt": "p"})
            goal_session = (await c.call("session.create", {"projectPath": str(ws), "mode": "goal"}))["id"]
            assert await code_of(c, "tasks.startRun", {"taskId": agent_task["id"], "sessionId": goal_session}) \
                == "PLAN_REQUIRES_INTERACTIVE_SESSION"
            assert (await c.call("tasks.runs", {"taskId": agent_task["id"]}))["runs"] == []
            assert not (ws / ".pi").exists()
            assert (await c.call("plans.pending", {}))["pending"] == []
            assert (await c.call("session.queueList", {"sessionId": goal_session})).get("entries", []) == []


async def test_weekdays_override_the_legacy_weekday_in_the_next_slot(tmp_path: Path) -> None:
    """§4.11: "Optional weekdays ... overriding legacy weekday for weekly schedules. Missing weekdays preserves
    the single-day behavior." and "Daily/weekly schedules use the host local timezone" (the host runs in this
    process's zone). 0 = Sunday."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            def local(task: dict[str, Any]) -> datetime:
                return datetime.fromisoformat(task["nextRunAt"].replace("Z", "+00:00")).astimezone()

            base = {"title": "w", "prompt": "p", "cadence": "weekly"}
            legacy = await c.call("tasks.create", {**base, "schedule": {"hour": 7, "minute": 45, "weekday": 3}})
            at = local(legacy)
            assert (at.isoweekday() % 7, at.hour, at.minute) == (3, 7, 45)
            override = await c.call("tasks.create", {**base, "schedule": {"hour": 7, "minute": 45, "weekday": 3},
                                                     "weekdays": [5]})
            at = local(override)
            assert (at.isoweekday() % 7, at.hour, at.minute) == (5, 7, 45)
            now = datetime.now().astimezone()
            assert 0 < (at - now).total_seconds() <= 7 * 86_400
            dropped = await c.call("tasks.update", {"taskId": override["id"], "weekdays": None})
            assert local(dropped).isoweekday() % 7 == 3


async def test_tasks_list_oldest_first_keeps_creation_order_within_one_millisecond(tmp_path: Path) -> None:
    """§11.6 through RPC; protocol/README tasks.list: "Every scheduled task, oldest first", and writes of one
    batch "apply in the order they were sent". Tasks created by one batch (the same millisecond) with ids in
    reverse alphabetical order list in the order they were created, not by id; so does a restart."""
    data = tmp_path / "data"
    data.mkdir()
    order = ["zeta", "yak", "t10", "t9", "task_b", "task_a", "alpha"]
    with trio.fail_after(60):
        async with real_host(data) as (proc, _agent, ui):
            made = await ui.batch([("tasks.create", {"taskId": tid, "title": tid, "prompt": "p"}) for tid in order])
            assert [m["id"] for m in made] == order
            assert [t["id"] for t in (await ui.call("tasks.list", {}))["tasks"]] == order
            stamps = [m["createdAt"] for m in made]
            assert stamps == sorted(stamps)
            proc.kill9()
        async with real_host(data) as (proc, _agent, ui):
            assert [t["id"] for t in (await ui.call("tasks.list", {}))["tasks"]] == order


# --------------------------------------------------------------------------- collaboration ledger (§4.6c, §11.21)

async def _pair(c: HostClient) -> tuple[str, str]:
    src = (await c.call("session.create", {"title": "Lead", "permissionMode": "auto"}))["id"]
    dst = (await c.call("session.create", {"title": "Reviewer", "permissionMode": "ask"}))["id"]
    return src, dst


async def _begun(c: HostClient, content: str) -> tuple[str, str, str]:
    """A lead and a reviewer session, a delivery (completion callback asked for) and the reviewer's turn
    ``t1`` begun on it: ``(source, target, delivery id)``."""
    src, dst = await _pair(c)
    did = (await c.call("collab.deliver", {
        "pluginId": "team", "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
        "content": content, "notifyOnCompletion": True, "idempotencyKey": "k1"}))["delivery"]["id"]
    await c.call("session.startTurn", {"sessionId": dst, "turnId": "t1"})
    await c.call("collab.begin", {"sessionId": dst, "deliveryId": did, "turnId": "t1"})
    return src, dst, did


async def test_a_delivery_outlives_its_deleted_sender_and_settles_without_failing(tmp_path: Path) -> None:
    """§4.6c: "source_session_id deliberately has no foreign key ... so a delivery record and its completion
    receipt outlive a deleted sender. Read projections therefore report such references with available:
    false instead of dropping the row." The sender is deleted between deliver and settle: the target still
    begins and settles it, and the record stays readable with the source unavailable."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            src, dst = await _pair(c)
            out = await c.call("collab.deliver", {"pluginId": "team", "sourceSessionId": src, "targetSessionId": dst,
                                                  "kind": "task", "content": "review it", "notifyOnCompletion": True,
                                                  "idempotencyKey": "k1"})
            did = out["delivery"]["id"]
            await c.call("session.delete", {"sessionId": src})
            await c.call("session.startTurn", {"sessionId": dst, "turnId": "t1"})
            await c.call("collab.begin", {"sessionId": dst, "deliveryId": did, "turnId": "t1"})
            settled = await c.call("collab.settle", {"sessionId": dst, "deliveryId": did, "turnId": "t1",
                                                     "status": "completed", "result": "x" * 5000})
            assert settled["delivery"]["status"] == "completed"
            got = await c.call("collab.get", {"deliveryId": did})
            assert (got["status"], got["source"]["sessionId"], got["source"]["available"]) == ("completed", src, False)
            assert (got["target"]["sessionId"], got["target"]["available"], got["turnId"]) == (dst, True, "t1")
            assert [d["id"] for d in (await c.call("collab.list", {"sessionId": dst}))["deliveries"]] == [did]


async def test_completion_callback_is_bounded_at_most_once_and_never_calls_back(tmp_path: Path) -> None:
    """§4.6c: "A callback is a kind = 'completion' row with reply_to_message_id pointing at the original
    delivery ... callback creation at-most-once. Callback bodies contain a bounded result/error projection";
    "completion rows cannot create another automatic callback". Settling twice (and a restart) yields one
    callback; its body is bounded; the settle retry answers as the first."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            src, dst, did = await _begun(agent, "do it")
            settle = {"sessionId": dst, "deliveryId": did, "turnId": "t1", "status": "failed",
                      "error": "boom " * 2000, "submissionId": "settle-1"}
            first = await agent.call("collab.settle", settle)
            callback = first["callback"]
            assert (callback["kind"], callback["replyToMessageId"], callback["remainingHops"]) == (
                "completion", did, 0)
            assert callback["target"]["sessionId"] == src and len(callback["content"]) <= 2_100
            proc.kill9()
        async with real_host(data) as (proc, agent, _ui):
            assert await agent.call("collab.settle", settle) == first
            incoming = (await agent.call("collab.list", {"sessionId": src, "direction": "incoming"}))["deliveries"]
            assert [(d["id"], d["kind"]) for d in incoming] == [(callback["id"], "completion")]
            # the source handles the completion: settling it creates no further callback
            await agent.call("session.startTurn", {"sessionId": src, "turnId": "s1"})
            await agent.call("collab.begin", {"sessionId": src, "deliveryId": callback["id"], "turnId": "s1"})
            done = await agent.call("collab.settle", {"sessionId": src, "deliveryId": callback["id"],
                                                      "turnId": "s1", "status": "completed", "result": "ack"})
            assert done.get("callback") is None
            assert [d["kind"] for d in (await agent.call("collab.list", {}))["deliveries"]].count("completion") == 1


async def test_retry_after_kill9_returns_the_original_and_cancel_keeps_the_target(tmp_path: Path) -> None:
    """§4.6c/§11.21: "A retry with the same (plugin_id, source_session_id, idempotency_key) returns the original
    delivery; changing its target, body, kind, or callback flag fails with IDEMPOTENCY_CONFLICT"; "retain
    queued work across a restart without replay, and cancel without deleting the target session"."""
    data = tmp_path / "data"
    data.mkdir()
    params = {"pluginId": "team", "kind": "message", "content": "ping", "idempotencyKey": "k-9"}
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            src, dst = await _pair(agent)
            third = (await agent.call("session.create", {"title": "Third", "permissionMode": "ask"}))["id"]
            first = await agent.call("collab.deliver", {**params, "sourceSessionId": src, "targetSessionId": dst})
            proc.kill9()
        async with real_host(data) as (proc, agent, _ui):
            again = await agent.call("collab.deliver", {**params, "sourceSessionId": src, "targetSessionId": dst})
            assert again["replayed"] is True and again["delivery"]["id"] == first["delivery"]["id"]
            assert again["delivery"]["status"] == "queued"
            for change in ({"targetSessionId": third}, {"content": "pong"}, {"kind": "task"},
                           {"notifyOnCompletion": True}):
                assert await code_of(agent, "collab.deliver", {**params, "sourceSessionId": src,
                                                               "targetSessionId": dst, **change}) \
                    == "IDEMPOTENCY_CONFLICT", change
            entries = (await agent.call("session.queueList", {"sessionId": dst}))["entries"]
            assert [e.get("sessionMessageId") for e in entries] == [first["delivery"]["id"]]
            assert (await agent.call("session.get", {"sessionId": dst}))["messages"] == []
            cancelled = await agent.call("collab.cancel", {"deliveryId": first["delivery"]["id"]})
            assert cancelled["delivery"]["status"] == "cancelled"
            assert (await agent.call("session.get", {"sessionId": dst}))["session"]["id"] == dst
            assert (await agent.call("session.queueList", {"sessionId": dst}))["entries"] == []
            replay = await agent.call("collab.deliver", {**params, "sourceSessionId": src, "targetSessionId": dst})
            assert replay["replayed"] is True and replay["delivery"]["status"] == "cancelled"
            assert (await agent.call("session.queueList", {"sessionId": dst}))["entries"] == []


async def test_a_delivery_binds_its_own_sessions_running_turn_and_one_turn_one_delivery(tmp_path: Path) -> None:
    """§4.6c: "turn_id is assigned when the target actually begins the delivery" with
    idx_session_collaboration_turn UNIQUE on turn_id; §11.21 "bind deliveries to their actual target turns".
    A delivery cannot begin under another session's turn or an ended turn, and one turn cannot begin two
    deliveries; the refused attempts leave the delivery queued and write no input row."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            src, dst = await _pair(c)
            d1, d2 = [(await c.call("collab.deliver", {
                "pluginId": "team", "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
                "content": f"job {k}", "idempotencyKey": k}))["delivery"]["id"] for k in ("k1", "k2")]
            await c.call("session.startTurn", {"sessionId": src, "turnId": "src-turn"})
            assert await code_of(c, "collab.begin", {"sessionId": dst, "deliveryId": d1, "turnId": "src-turn"}) \
                is not None
            await c.call("session.startTurn", {"sessionId": dst, "turnId": "ended"})
            await c.call("session.endTurn", {"sessionId": dst, "turnId": "ended", "status": "completed"})
            assert await code_of(c, "collab.begin", {"sessionId": dst, "deliveryId": d1, "turnId": "ended"}) \
                is not None
            assert (await c.call("collab.get", {"deliveryId": d1}))["status"] == "queued"
            assert (await c.call("session.get", {"sessionId": dst}))["messages"] == []
            await c.call("session.startTurn", {"sessionId": dst, "turnId": "t1"})
            began = await c.call("collab.begin", {"sessionId": dst, "deliveryId": d1, "turnId": "t1"})
            assert began["delivery"]["turnId"] == "t1" and began["message"]["id"] == f"collab-{d1}"
            assert await code_of(c, "collab.begin", {"sessionId": dst, "deliveryId": d2, "turnId": "t1"}) \
                == "CONFLICT"
            second = await c.call("collab.get", {"deliveryId": d2})
            assert second["status"] == "queued" and second.get("turnId") is None
            view = await c.call("session.get", {"sessionId": dst})
            assert [m["id"] for m in view["messages"]] == [f"collab-{d1}"]
            assert view["messages"][0]["sessionMessage"]["sourceSessionId"] == src


async def test_a_running_delivery_is_interrupted_by_kill9_never_settled_late_nor_called_back_twice(
        tmp_path: Path) -> None:
    """§4.6c: "Running work and queued deliveries without a queue admission are marked interrupted; the
    startup fence never replays a turn without a new controller admission"; §11.21 "create no duplicate
    completion callback". After the restart the running delivery is interrupted, its turn aborted, a late
    settle is refused, the source got at most one callback (none more after another restart) and the input
    row stays with its provenance."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            src, dst, did = await _begun(agent, "long job")
            proc.kill9()
        async with real_host(data) as (proc, agent, _ui):
            got = await agent.call("collab.get", {"deliveryId": did})
            assert (got["status"], got.get("turnId")) == ("interrupted", "t1")
            assert (await turns_of(agent, dst))["t1"]["status"] == "aborted"
            assert await code_of(agent, "collab.settle", {"sessionId": dst, "deliveryId": did, "turnId": "t1",
                                                          "status": "completed", "result": "late"}) is not None
            callbacks = (await agent.call("collab.list", {"sessionId": src, "direction": "incoming"}))["deliveries"]
            assert len(callbacks) <= 1 and all(d["replyToMessageId"] == did for d in callbacks)
            assert (await agent.call("session.queueList", {"sessionId": dst}))["entries"] == []
            rows = (await agent.call("session.get", {"sessionId": dst}))["messages"]
            assert [(m["id"], m["sessionMessage"]["deliveryId"]) for m in rows] == [(f"collab-{did}", did)]
            proc.kill9()
        async with real_host(data) as (proc, agent, _ui):
            assert (await agent.call("collab.get", {"deliveryId": did}))["status"] == "interrupted"
            again = (await agent.call("collab.list", {"sessionId": src, "direction": "incoming"}))["deliveries"]
            assert [d["id"] for d in again] == [d["id"] for d in callbacks]


async def test_delivery_provenance_lives_in_the_transcript_and_survives_a_lost_index(tmp_path: Path) -> None:
    """§4.6c: "Collaboration provenance is stored in the transcript line's meta as sessionMessage and is
    projected to the UI as UiMessage.sessionMessage ... This metadata is additive and does not require a
    column in messages"; steering into a claimed delivery turn "does not inherit the delivery origin, and has
    any client-supplied session_message stripped". With the database deleted under a SIGKILLed host, the
    rebuilt index still shows the delivery row as a delivery and the steering row as plain steering."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, agent, _ui):
            src = (await agent.call("session.create", {"title": "Lead"}))["id"]
            dst = (await agent.call("session.create", {"title": "Reviewer"}))["id"]
            did = (await agent.call("collab.deliver", {
                "pluginId": "team", "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
                "content": "audit the tokenizer", "idempotencyKey": "k1"}))["delivery"]["id"]
            await agent.call("session.startTurn", {"sessionId": dst, "turnId": "t1"})
            await agent.call("collab.begin", {"sessionId": dst, "deliveryId": did, "turnId": "t1"})
            forged = {"sourceSessionId": src, "deliveryId": did, "pluginId": "team"}
            await say(agent, dst, "steer-1", "also check the tests", turnId="t1",
                      meta={"steering": True, "sessionMessage": forged})
            before = (await agent.call("session.get", {"sessionId": dst}))["messages"]
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (data / name).unlink(missing_ok=True)
        async with real_host(data) as (proc, agent, _ui):
            after = (await agent.call("session.get", {"sessionId": dst}))["messages"]
            assert [m["id"] for m in after] == [f"collab-{did}", "steer-1"]
            delivered, steering = after
            assert delivered["sessionMessage"] == before[0]["sessionMessage"]
            assert (delivered["sessionMessage"]["deliveryId"], delivered["sessionMessage"]["sourceSessionId"]) == (
                did, src)
            assert delivered["blocks"][0]["text"] == "audit the tokenizer"
            assert steering.get("steering") is True and steering.get("sessionMessage") is None
            assert "sessionMessage" not in (steering.get("meta") or {})


async def test_a_completion_receipt_outlives_the_session_that_sent_it(tmp_path: Path) -> None:
    """§4.6c: "source_session_id deliberately has no foreign key, unlike target_session_id, which cascades,
    so a delivery record and its completion receipt outlive a deleted sender". The completion's sender is
    the session that handled the delivery: deleting it leaves the completion queued for the original source
    (its sender reported available: false), and the source can still begin and settle it, without a further
    callback."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            src, dst, did = await _begun(c, "check it")
            receipt = (await c.call("collab.settle", {"sessionId": dst, "deliveryId": did, "turnId": "t1",
                                                      "status": "completed", "result": "fine"}))["callback"]
            await c.call("session.delete", {"sessionId": dst})
            kept = await c.call("collab.get", {"deliveryId": receipt["id"]})
            assert (kept["status"], kept["kind"], kept["replyToMessageId"]) == ("queued", "completion", did)
            assert (kept["source"]["sessionId"], kept["source"]["available"]) == (dst, False)
            assert (kept["target"]["sessionId"], kept["target"]["available"]) == (src, True)
            entries = (await c.call("session.queueList", {"sessionId": src}))["entries"]
            assert [e.get("sessionMessageId") for e in entries] == [receipt["id"]]
            await c.call("session.startTurn", {"sessionId": src, "turnId": "s1"})
            await c.call("collab.begin", {"sessionId": src, "deliveryId": receipt["id"], "turnId": "s1"})
            done = await c.call("collab.settle", {"sessionId": src, "deliveryId": receipt["id"], "turnId": "s1",
                                                  "status": "completed"})
            assert done["delivery"]["status"] == "completed" and done.get("callback") is None


# ------------------------------------------------------------------------------- plugin imports (§11.20)

IMPORTED = {"sourceId": "chatlog", "externalId": "conv-81", "title": "Parser ideas",
            "history": {"projectPath": "/elsewhere/parser", "modelId": "gpt-x", "providerId": "openai"},
            "messages": [msg("u1", "how do I split the lexer"), msg("a1", "move it to lexer.py", role="assistant")]}


async def test_plugin_import_idempotency_holds_across_kill9_trash_purge_and_a_lost_index(tmp_path: Path) -> None:
    """§11.20: "host-generated session ids, one origin row per session, (pluginId, source, externalId)
    idempotency ... and recoverable trash before purge". An exact retry after a SIGKILL answers the stored
    response; a re-import while the session is in the trash writes nothing and leaves it there; after a purge
    the same key imports a new session; with the database deleted, the rebuilt index still knows the origin
    (a re-import is created: false) and the owner still reads its session."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(90):
        proc = start_host_process(data)
        try:
            async with open_client(proc.url, proc.token, client_id="plug-1", client_kind="plugin",
                                   plugin_id="alpha") as alpha:
                first = await alpha.call("plugins.importSession", {**IMPORTED, "submissionId": "imp-1"})
                assert first["created"] is True and first["sessionId"] not in ("conv-81", "chatlog")
        finally:
            proc.kill9()
        proc = start_host_process(data)
        try:
            async with open_client(proc.url, proc.token, client_id="plug-1", client_kind="plugin",
                                   plugin_id="alpha") as alpha, \
                    open_client(proc.url, proc.token, client_id="plug-2", client_kind="plugin",
                                plugin_id="beta") as beta:
                assert await alpha.call("plugins.importSession", {**IMPORTED, "submissionId": "imp-1"}) == first
                sid = first["sessionId"]
                assert await code_of(beta, "session.get", {"sessionId": sid}) == "PERMISSION_DENIED"
                await alpha.call("sessions.trash", {"sessionId": sid})
                again = await alpha.call("plugins.importSession", IMPORTED)
                assert (again["sessionId"], again["created"]) == (sid, False)
                assert [s["id"] for s in (await alpha.call("sessions.listTrashed", {}))["sessions"]] == [sid]
                assert (await alpha.call("plugins.listSessions", {}))["sessions"] == []
                await alpha.call("sessions.purge", {"sessionId": sid})
                reborn = await alpha.call("plugins.importSession", {**IMPORTED, "messages": [msg("u9", "anew")]})
                assert reborn["created"] is True and reborn["sessionId"] != sid
        finally:
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (data / name).unlink(missing_ok=True)
        proc = start_host_process(data)
        try:
            async with open_client(proc.url, proc.token, client_id="plug-1", client_kind="plugin",
                                   plugin_id="alpha") as alpha:
                again = await alpha.call("plugins.importSession", {**IMPORTED, "messages": [msg("u9", "anew")]})
                assert (again["sessionId"], again["created"]) == (reborn["sessionId"], False)
                assert [s["id"] for s in (await alpha.call("plugins.listSessions", {}))["sessions"]] == [
                    reborn["sessionId"]]
                page = await alpha.call("session.get", {"sessionId": reborn["sessionId"]})
                assert [m["blocks"][0]["text"] for m in page["messages"]] == ["anew"]
                assert await code_of(alpha, "session.get", {"sessionId": sid}) in ("SESSION_NOT_FOUND",
                                                                                   "PERMISSION_DENIED")
        finally:
            proc.kill9()


# ---------------------------------------------------------------------------- native Pi sessions (§12, ADR 0254)

def _native_file(root: Path) -> tuple[Path, str]:
    sid = "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee"
    cwd_dir = root / "--tmp-proj--"
    cwd_dir.mkdir(parents=True)
    path = cwd_dir / f"2026-01-01T00-00-00-000Z_{sid}.jsonl"
    lines = [
        {"type": "session", "version": 3, "id": sid, "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/tmp/proj"},
        {"type": "message", "id": "e1", "parentId": None, "timestamp": "2026-01-01T00:00:01.000Z",
         "message": {"role": "user", "content": "hello native", "timestamp": 1767225601000}},
        {"type": "custom", "id": "e2", "parentId": "e1", "timestamp": "2026-01-01T00:00:02.000Z",
         "customType": "x-unknown", "data": {"keep": True}, "unknownField": 1},
    ]
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    return path, sid


NATIVE_SESSION_FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("session.listTurns", {"sessionId": "{n}"}),
    ("session.endTurn", {"sessionId": "{n}", "turnId": "t1", "status": "completed"}),
    ("session.verifyEnvironment", {"sessionId": "{n}", "turnId": "t1"}),
    ("session.recoverInflight", {"sessionId": "{n}", "turnId": "t1"}),
    ("session.saveInflightMessage", {"sessionId": "{n}", "turnId": "t1", "message": msg("a1", "x", "assistant")}),
    ("usage.session", {"sessionId": "{n}"}),
    ("plans.pending", {"sessionId": "{n}"}),
    ("plans.startExecution", {"sessionId": "{n}", "executionId": "e1", "turnId": "t1"}),
    ("collab.list", {"sessionId": "{n}"}),
    ("collab.begin", {"sessionId": "{n}", "deliveryId": "d1", "turnId": "t1"}),
    ("tasks.startRun", {"taskId": "{task}", "sessionId": "{n}"}),
    ("tasks.finishRun", {"runId": "r0", "status": "completed", "sessionId": "{n}"}),
]


async def test_plan_collaboration_queue_and_run_operations_refuse_a_native_session(tmp_path: Path) -> None:
    """§12: native sessions "are never inserted into SQLite"; "Rename, delete, project move, revision,
    Plan/Goal, collaboration, and queue operations remain unsupported for native sessions in this slice" and
    the README: "Every other method refuses a native id with UNSUPPORTED_FOR_NATIVE_SESSION". Turn, plan,
    collaboration and task-run methods naming a native session refuse it that way and leave the pi file's
    bytes alone."""
    native_root = tmp_path / "pi-sessions"
    path, pi_id = _native_file(native_root)
    before = path.read_bytes()
    nid = f"native-pi:{pi_id}"
    wrong: dict[str, str | None] = {}
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=native_root) as host, client_for(host) as c:
            assert (await c.call("session.get", {"sessionId": nid}))["session"]["source"] == "native-pi"
            task = await c.call("tasks.create", {"title": "t", "prompt": "p"})
            await c.call("tasks.startRun", {"taskId": task["id"], "runId": "r0"})
            for method, template in NATIVE_SESSION_FIELDS:
                params = json.loads(json.dumps(template).replace("{n}", nid).replace("{task}", task["id"]))
                code = await code_of(c, method, params)
                if code != "UNSUPPORTED_FOR_NATIVE_SESSION":
                    wrong[method] = code
            assert (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"][0].get("sessionId") is None
    assert path.read_bytes() == before
    assert wrong == {}
