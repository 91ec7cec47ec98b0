"""Seed 003 §4.6a (plan_approvals), the plan/goal rows of §5's write-path table, §4.5's projection and the
Plan/Goal items of §11 (17-19) read by an outsider: black-box checks over a real host's WebSocket gateway,
with SIGKILL + restart where the seed makes a restart claim. Each test quotes the statement it checks.
(The happy path, one pending per session, tampering, restart interruption and the cut approval are covered
by tests/plans and tests/chaos; these are the claims they leave open.)"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, open_client
from tests.acceptance.outsiderkit import code_of, error_of, real_host, say

FAR = 9_999_999_999_999


def _ws(tmp_path: Path, name: str = "ws") -> Path:
    ws = tmp_path / name
    ws.mkdir()
    return ws


async def _session(c: HostClient, ws: Path, mode: str = "plan") -> str:
    sid: str = (await c.call("session.create", {"title": mode, "projectPath": str(ws), "mode": mode}))["id"]
    return sid


def _submit(sid: str, ws: Path, call_id: str, markdown: str = "# Plan\n\n1. Do it\n", kind: str = "plan",
            **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": "t1", "toolCallId": call_id, "kind": kind, "markdown": markdown,
            "workspaceRoot": str(ws), **extra}


def _files(ws: Path, kind: str = "plan") -> list[str]:
    folder = ws / ".pi" / kind
    return sorted(os.listdir(folder)) if folder.exists() else []


def _exact(ws: Path, row: dict[str, Any], markdown: str) -> None:
    body = (ws / row["artifactPath"]).read_bytes()
    assert body == markdown.encode("utf-8")
    assert (row["artifactSha256"], row["artifactSize"]) == (hashlib.sha256(body).hexdigest(), len(body))


async def test_racing_submissions_leave_one_pending_row_and_one_file(tmp_path: Path) -> None:
    """§4.6a: "the single-pending-approval invariant"; §5: "insert one plan_approvals(pending) row". Four
    proposals sent at once to one session: one is pending, the others are CONFLICT and leave no file (nor a
    temporary one) behind."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (_proc, c):
            sid = await _session(c, ws)
            outcomes: dict[str, Any] = {}

            async def one(i: int) -> None:
                outcomes[f"c{i}"] = await error_of(c, "plans.submit", _submit(sid, ws, f"c{i}", f"# Plan {i}\n"))

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(one, i)
            codes = sorted(str(code) for code, _data in outcomes.values())
            assert codes == ["CONFLICT", "CONFLICT", "CONFLICT", "None"]
            pending = (await c.call("plans.pending", {"sessionId": sid}))["pending"]
            assert len(pending) == 1
            assert _files(ws) == [pending[0]["artifactPath"].rsplit("/", 1)[1]]
            winner = next(k for k, (code, _d) in outcomes.items() if code is None)
            _exact(ws, pending[0], f"# Plan {winner[1:]}\n")


async def test_identical_proposals_each_get_a_new_file_and_none_is_ever_replaced(tmp_path: Path) -> None:
    """§4.6a: "a new unique file", "Each artifact file is immutable and unique, so a later Plan/Goal turn
    creates a new complete snapshot/approval row and never replaces an earlier file"; the single pending
    approval is per session. Two sessions of one workspace propose the same bytes in the same second; a
    rejected one is followed by the same proposal again; approval leaves the files as they were."""
    ws = _ws(tmp_path)
    same = "# Same plan\n"
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (_proc, c):
            s1, s2 = await _session(c, ws), await _session(c, ws)
            r1 = await c.call("plans.submit", _submit(s1, ws, "a", same))
            r2 = await c.call("plans.submit", _submit(s2, ws, "b", same))
            assert r1["artifactPath"] != r2["artifactPath"]
            assert r1["artifactSha256"] == r2["artifactSha256"]
            listed = (await c.call("plans.pending", {}))["pending"]
            assert {p["requestId"] for p in listed} >= {r1["requestId"], r2["requestId"]}
            await c.call("plans.respond", {"requestId": r1["requestId"], "action": "reject"})
            r3 = await c.call("plans.submit", _submit(s1, ws, "c", same))
            assert r3["requestId"] != r1["requestId"] and r3["artifactPath"] not in (
                r1["artifactPath"], r2["artifactPath"])
            await c.call("plans.respond", {"requestId": r2["requestId"], "action": "approve"})
            assert len(_files(ws)) == 3
            for row in (r1, r2, r3):
                _exact(ws, row, same)


async def test_awkward_markdown_is_written_byte_for_byte_and_title_stays_structured(tmp_path: Path) -> None:
    """§11.17: "write exact Markdown bytes to a unique .pi/plan/*.md or .pi/goal/*.md file with SHA-256 and
    size; title/question stay structured". A BOM, CR-only and CRLF breaks, U+2028, 4-byte characters,
    trailing blanks and no final newline survive; the size is in bytes; title/question are not in the file."""
    ws = _ws(tmp_path)
    markdown = "\ufeff# Ziel 🎯\r\rline\u2028sep  \t\r\n- [ ] ä\\u00e9 `x`\n\n    code\n\u00a0end"
    title, question = "**Bold** <title>\nsecond", "Proceed? 🙂"
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (_proc, c):
            gid = await _session(c, ws, "goal")
            row = await c.call("plans.submit", _submit(gid, ws, "g", markdown, kind="goal", title=title,
                                                       question=question))
            assert row["artifactPath"].startswith(".pi/goal/") and row["artifactPath"].endswith(".md")
            assert row["artifactSize"] == len(markdown.encode("utf-8")) > len(markdown)
            _exact(ws, row, markdown)
            assert (row["title"], row["question"]) == (title, question)
            assert b"<title>" not in (ws / row["artifactPath"]).read_bytes()
            assert _files(ws, "plan") == []
            [again] = (await c.call("plans.pending", {"sessionId": gid}))["pending"]
            assert (again["title"], again["question"], again["artifactSha256"]) == (
                title, question, row["artifactSha256"])


async def test_a_lapsed_request_frees_the_session_and_cannot_be_answered(tmp_path: Path) -> None:
    """§4.5: "reject, expiry, or pending interruption returns live planning to editable state";
    "plans.pending rehydrates only pending rows"; §4.6a: "Reject/expiry leave the session in its contract
    mode"; §11.17: "renderer reload retains only the pending row and original absolute deadline". Nothing
    answers the request before its deadline passes: it is gone from plans.pending, the session is planning
    again (its mode may change), and a late approval is a stale response; the file stays."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (_proc, c):
            sid = await _session(c, ws)
            deadline = int(time.time() * 1000) + 1500
            row = await c.call("plans.submit", _submit(sid, ws, "late", expiresAt=deadline))
            [listed] = (await c.call("plans.pending", {"sessionId": sid}))["pending"]
            assert listed["expiresAt"] == deadline
            live = (await c.call("session.get", {"sessionId": sid}))["session"]
            assert (live["mode"], live.get("state"), live.get("contractKind")) == ("plan", "awaiting_approval", "plan")
            assert await code_of(c, "session.update", {"sessionId": sid, "mode": "agent"}) == "CONFLICT"
            await trio.sleep(max(0.0, (deadline - time.time() * 1000) / 1000) + 0.3)
            assert (await c.call("plans.pending", {"sessionId": sid}))["pending"] == []
            lapsed = (await c.call("session.get", {"sessionId": sid}))["session"]
            assert (lapsed["mode"], lapsed.get("state")) == ("plan", "planning")
            code, data = await error_of(c, "plans.respond", {"requestId": row["requestId"], "action": "approve"})
            assert (code, data.get("status")) == ("CONFLICT", "expired")
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["mode"] == "plan"
            assert (await c.call("session.update", {"sessionId": sid, "mode": "agent"}))["mode"] == "agent"
            _exact(ws, row, "# Plan\n\n1. Do it\n")


async def test_answers_survive_sigkill_and_only_their_exact_retry_is_answered_again(tmp_path: Path) -> None:
    """§11.18: "rejects stale responses"; §4.6a approval/reject are one transaction. An approval and a
    rejection answered before a SIGKILL: after the restart the exact retry (same clientId + submissionId)
    returns the stored answer, any other response is stale (CONFLICT), and the modes are as answered."""
    ws = _ws(tmp_path)
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            pid, gid = await _session(c, ws), await _session(c, ws, "goal")
            p = await c.call("plans.submit", _submit(pid, ws, "p"))
            g = await c.call("plans.submit", _submit(gid, ws, "g", kind="goal"))
            approve = {"requestId": p["requestId"], "action": "approve", "targetPermissionMode": "auto",
                       "submissionId": "yes-1"}
            reject = {"requestId": g["requestId"], "action": "reject", "submissionId": "no-1"}
            approved, rejected = await c.call("plans.respond", approve), await c.call("plans.respond", reject)
            proc.kill9()
        async with real_host(data) as (_proc, c):
            assert await c.call("plans.respond", approve) == approved
            assert await c.call("plans.respond", reject) == rejected
            assert await code_of(c, "plans.respond", {**approve, "submissionId": "yes-2"}) == "CONFLICT"
            assert await code_of(c, "plans.respond", {"requestId": g["requestId"], "action": "approve"}) == "CONFLICT"
            ps = (await c.call("session.get", {"sessionId": pid}))["session"]
            gs = (await c.call("session.get", {"sessionId": gid}))["session"]
            assert (ps["mode"], ps["permissionMode"], gs["mode"]) == ("agent", "auto", "goal")
            assert (await c.call("plans.pending", {}))["pending"] == []


async def test_no_background_client_answers_a_plan_or_goal(tmp_path: Path) -> None:
    """§11.19: "no background path auto-approves either kind". The agent sidecar and a plugin are refused
    (PERMISSION_DENIED) and the request stays pending for the person, who can still approve it."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (proc, c):
            gid = await _session(c, ws, "goal")
            g = await c.call("plans.submit", _submit(gid, ws, "g", kind="goal"))
            answer = {"requestId": g["requestId"], "action": "approve", "targetPermissionMode": "auto"}
            async with open_client(proc.url, proc.token, client_id="side", client_kind="agent") as agent:
                assert await code_of(agent, "plans.respond", answer) == "PERMISSION_DENIED"
            async with open_client(proc.url, proc.token, client_id="plug", client_kind="plugin",
                                   plugin_id="acme") as plugin:
                assert await code_of(plugin, "plans.respond", answer) == "PERMISSION_DENIED"
            [still] = (await c.call("plans.pending", {"sessionId": gid}))["pending"]
            assert still["status"] == "pending"
            assert (await c.call("session.get", {"sessionId": gid}))["session"]["mode"] == "goal"
            assert (await c.call("plans.respond", answer))["approval"]["status"] == "approved"


async def test_a_fork_copies_the_mode_but_never_an_approval_or_execution(tmp_path: Path) -> None:
    """§4.5: "forked sessions copy the durable mode but never copy pending, queued, or running approval
    rows". A fork of a session awaiting approval is a planning Plan session with nothing pending (it may
    propose its own); a fork of one whose approved execution is queued is an idle agent session."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (_proc, c):
            sid = await _session(c, ws)
            await say(c, sid, "u1", "make a plan")
            row = await c.call("plans.submit", _submit(sid, ws, "p"))
            cid = (await c.call("session.fork", {"sessionId": sid}))["id"]
            cs = (await c.call("session.get", {"sessionId": cid}))["session"]
            assert (cs["mode"], cs.get("state")) == ("plan", "planning")
            assert (await c.call("plans.pending", {"sessionId": cid}))["pending"] == []
            assert [p["requestId"] for p in (await c.call("plans.pending", {}))["pending"]] == [row["requestId"]]
            own = await c.call("plans.submit", _submit(cid, ws, "p-child"))
            assert own["sessionId"] == cid and own["artifactPath"] != row["artifactPath"]
            approved = await c.call("plans.respond", {"requestId": row["requestId"], "action": "approve"})
            assert approved["session"].get("state") == "queued"
            gid = (await c.call("session.fork", {"sessionId": sid}))["id"]
            gs = (await c.call("session.get", {"sessionId": gid}))["session"]
            assert gs["mode"] == "agent" and gs.get("state") not in ("queued", "running", "awaiting_approval")
            assert await code_of(c, "session.update", {"sessionId": gid, "mode": "goal"}) is None


async def test_a_keyed_submission_runs_once_across_a_sigkill(tmp_path: Path) -> None:
    """§5: "host writes the exact Markdown bytes to a new unique ... file" — once per submission. The exact
    retry of a committed submission (same clientId + submissionId) after SIGKILL + restart answers the stored
    row and writes no second file; the same key with another body is IDEMPOTENCY_CONFLICT; the restart
    interrupted the request (§11.18), so a new proposal (new key) opens a new pending row and file."""
    ws = _ws(tmp_path)
    data = tmp_path / "data"
    keyed = {"submissionId": "sub-1", "title": "t"}
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = await _session(c, ws)
            first = await c.call("plans.submit", _submit(sid, ws, "p1", **keyed))
            proc.kill9()
        async with real_host(data) as (_proc, c):
            assert await c.call("plans.submit", _submit(sid, ws, "p1", **keyed)) == first
            assert await code_of(c, "plans.submit",
                                 _submit(sid, ws, "p1", "# Other\n", **keyed)) == "IDEMPOTENCY_CONFLICT"
            assert _files(ws) == [first["artifactPath"].rsplit("/", 1)[1]]
            assert (await c.call("plans.pending", {"sessionId": sid}))["pending"] == []
            fresh = await c.call("plans.submit", _submit(sid, ws, "p2", submissionId="sub-2"))
            assert fresh["status"] == "pending" and len(_files(ws)) == 2
            _exact(ws, first, "# Plan\n\n1. Do it\n")


async def test_a_reused_tool_call_id_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    """§4.6a DDL: "tool_call_id TEXT NOT NULL UNIQUE". After a reject, a new proposal under the same tool
    call id (in this session or another) is refused and writes nothing; the earlier file is untouched. A
    workspaceRoot spelled with a trailing '/' names the same project."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (_proc, c):
            s1, s2 = await _session(c, ws), await _session(c, ws)
            r1 = await c.call("plans.submit", _submit(s1, ws, "call-x"))
            await c.call("plans.respond", {"requestId": r1["requestId"], "action": "reject"})
            assert await code_of(c, "plans.submit", _submit(s1, ws, "call-x", "# Again\n")) == "CONFLICT"
            assert await code_of(c, "plans.submit", _submit(s2, ws, "call-x", "# Again\n")) == "CONFLICT"
            assert _files(ws) == [r1["artifactPath"].rsplit("/", 1)[1]]
            _exact(ws, r1, "# Plan\n\n1. Do it\n")
            slash = {**_submit(s2, ws, "call-y"), "workspaceRoot": f"{ws}/"}
            assert (await c.call("plans.submit", slash))["status"] == "pending"


async def _answer(outcomes: dict[str, str | None], client: HostClient, request_id: str, action: str) -> None:
    outcomes[action] = await code_of(client, "plans.respond", {"requestId": request_id, "action": action})


async def test_racing_answers_from_two_people_settle_once(tmp_path: Path) -> None:
    """§4.6a: approval is one transaction; §11.18 "rejects stale responses". Two UI clients answer one
    request at the same moment (approve vs reject): exactly one answer lands, the other is CONFLICT, and the
    session's mode is the winner's (agent after an approval, the contract mode after a rejection)."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with real_host(tmp_path / "data") as (proc, c):
            for round_ in range(3):
                sid = await _session(c, ws, "goal")
                row = await c.call("plans.submit", _submit(sid, ws, f"g{round_}", kind="goal"))
                outcomes: dict[str, str | None] = {}
                async with open_client(proc.url, proc.token, client_id=f"ui-2-{round_}", client_kind="ui") as other:

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_answer, outcomes, c, row["requestId"], "approve")
                        nursery.start_soon(_answer, outcomes, other, row["requestId"], "reject")
                assert sorted(str(v) for v in outcomes.values()) == ["CONFLICT", "None"]
                winner = next(k for k, v in outcomes.items() if v is None)
                session = (await c.call("session.get", {"sessionId": sid}))["session"]
                assert session["mode"] == ("agent" if winner == "approve" else "goal")
                assert (await c.call("plans.pending", {"sessionId": sid}))["pending"] == []
