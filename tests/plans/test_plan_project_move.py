"""A plan/goal whose session moved to another project while its approval was pending (seed 003 §4.6a).

The artifact is written under the session's workspace at submission ("<workspaceRoot>/.pi/<kind>/", "an
immutable checkpoint"); ``session.update {projectPath}`` may move the session meanwhile. Approval verifies the
artifact where it was written, not under the new project (it used to be CORRUPT_DATA "file is missing" while a
reject still worked). Black-box against real host processes, with SIGKILL + restart variants."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.hostkit import start_host_process

MARKDOWN = "# Plan\r\n\r\n1. Split the tokenizer ✓\n"


def _workspaces(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "proj-a", tmp_path / "proj-b"
    a.mkdir()
    b.mkdir()
    return a, b


def _submit(sid: str, ws: Path, call_id: str, kind: str = "plan", **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": "t1", "toolCallId": call_id, "kind": kind, "markdown": MARKDOWN,
            "title": "Split", "question": "Proceed?", "workspaceRoot": str(ws), **extra}


async def _code(c: HostClient, method: str, params: dict[str, Any]) -> str | None:
    try:
        await c.call(method, params)
    except RpcError as failed:
        return failed.data_code
    return None


async def _submitted_then_moved(c: HostClient, a: Path, b: Path, kind: str,
                                **extra: Any) -> tuple[str, dict[str, Any]]:
    sid = (await c.call("session.create", {"title": kind, "projectPath": str(a), "mode": kind}))["id"]
    req = await c.call("plans.submit", _submit(sid, a, f"{kind}-1", kind=kind, **extra))
    moved = await c.call("session.update", {"sessionId": sid, "projectPath": str(b)})
    assert moved["projectPath"] == str(b) and moved["mode"] == kind
    return sid, req


def _artifact_intact(ws: Path, req: dict[str, Any]) -> None:
    body = (ws / req["artifactPath"]).read_bytes()
    assert body == MARKDOWN.encode()
    assert (req["artifactSha256"], req["artifactSize"]) == (hashlib.sha256(body).hexdigest(), len(body))


@pytest.mark.parametrize("kind", ["plan", "goal"])
async def test_approval_after_the_session_moved_verifies_the_artifact_where_it_was_written(
        tmp_path: Path, kind: str) -> None:
    a, b = _workspaces(tmp_path)
    proc = start_host_process(tmp_path / "data")
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui-move", client_kind="ui") as c:
                sid, req = await _submitted_then_moved(c, a, b, kind, expiresAt=9_999_999_999_999)
                assert not (b / ".pi").exists()
                out = await c.call("plans.respond", {"requestId": req["requestId"], "action": "approve",
                                                     "targetPermissionMode": "ask", "submissionId": "ok-1"})
                approval, session = out["approval"], out["session"]
                assert (approval["status"], approval["executionState"], approval["kind"]) == (
                    "approved", "queued", kind)
                assert approval["artifactPath"] == req["artifactPath"]
                assert (session["mode"], session["permissionMode"], session["projectPath"]) == (
                    "agent", "ask", str(b))
                _artifact_intact(a, req)
                assert not (b / ".pi").exists()  # nothing copied or re-written into the new project
                assert await c.call("plans.respond", {"requestId": req["requestId"], "action": "approve",
                                                      "targetPermissionMode": "ask",
                                                      "submissionId": "ok-1"}) == out
                assert (await c.call("plans.pending", {"sessionId": sid}))["pending"] == []
    finally:
        proc.kill9()


async def test_a_tampered_artifact_is_still_refused_after_the_move(tmp_path: Path) -> None:
    """The recorded workspace is where the immutable checkpoint is verified, not a way around it."""
    a, b = _workspaces(tmp_path)
    proc = start_host_process(tmp_path / "data")
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui-move", client_kind="ui") as c:
                sid, req = await _submitted_then_moved(c, a, b, "plan")
                art = a / req["artifactPath"]
                art.write_bytes(MARKDOWN.encode() + b"tampered")
                # a same-named copy with the right bytes in the new project does not stand in for it
                (b / ".pi" / "plan").mkdir(parents=True)
                (b / req["artifactPath"]).write_bytes(MARKDOWN.encode())
                assert await _code(c, "plans.respond", {"requestId": req["requestId"],
                                                        "action": "approve"}) == "CORRUPT_DATA"
                assert [p["requestId"] for p in (await c.call("plans.pending", {"sessionId": sid}))["pending"]] == [
                    req["requestId"]]
                art.write_bytes(MARKDOWN.encode())
                out = await c.call("plans.respond", {"requestId": req["requestId"], "action": "approve"})
                assert out["approval"]["status"] == "approved"
    finally:
        proc.kill9()


async def test_a_moved_session_can_propose_again_in_its_new_project_after_a_reject_or_expiry(
        tmp_path: Path) -> None:
    a, b = _workspaces(tmp_path)
    proc = start_host_process(tmp_path / "data")
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui-move", client_kind="ui") as c:
                sid, req = await _submitted_then_moved(c, a, b, "goal", expiresAt=1)
                # lapsed: a stale response, whatever project the session is in now
                assert await _code(c, "plans.respond", {"requestId": req["requestId"],
                                                        "action": "approve"}) == "CONFLICT"
                assert await _code(c, "plans.submit", _submit(sid, a, "goal-2", kind="goal")) == "CONFLICT"
                g2 = await c.call("plans.submit", _submit(sid, b, "goal-2", kind="goal"))
                _artifact_intact(b, g2)
                out = await c.call("plans.respond", {"requestId": g2["requestId"], "action": "approve"})
                assert out["approval"]["status"] == "approved" and out["session"]["mode"] == "agent"
                _artifact_intact(a, req)  # the lapsed one's file stays: artifacts are never removed or replaced
    finally:
        proc.kill9()


async def test_sigkill_between_the_move_and_the_approval_refuses_the_stale_response(tmp_path: Path) -> None:
    """§11.18: the restart interrupts the pending row; the approval is a stale response (CONFLICT), never a
    verification against the new project (CORRUPT_DATA); the session stays in its contract mode in its new
    project, where a new proposal is approved."""
    a, b = _workspaces(tmp_path)
    data = tmp_path / "data"
    proc = start_host_process(data)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui-move", client_kind="ui") as c:
                sid, req = await _submitted_then_moved(c, a, b, "plan")
    finally:
        proc.kill9()
    proc = start_host_process(data)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui-move", client_kind="ui") as c:
                assert await _code(c, "plans.respond", {"requestId": req["requestId"],
                                                        "action": "approve"}) == "CONFLICT"
                session = (await c.call("session.get", {"sessionId": sid}))["session"]
                assert (session["mode"], session["projectPath"]) == ("plan", str(b))
                assert (await c.call("plans.pending", {"sessionId": sid}))["pending"] == []
                _artifact_intact(a, req)
                again = await c.call("plans.submit", _submit(sid, b, "plan-2"))
                out = await c.call("plans.respond", {"requestId": again["requestId"], "action": "approve"})
                assert out["approval"]["status"] == "approved"
                _artifact_intact(b, again)
    finally:
        proc.kill9()


async def test_an_approval_after_the_move_cut_before_its_row_changed_is_applied_at_the_restart(
        tmp_path: Path) -> None:
    """Killed after the approval's mode line was fsynced and before the row changed: boot applies the
    approval the line names (the artifact was verified, under the old project, before the line); the retry
    answers it once."""
    a, b = _workspaces(tmp_path)
    data = tmp_path / "data"
    proc = start_host_process(data, env={"RT_CRASHPOINT": "plans.respond.before_commit:1"})
    params: dict[str, Any] = {}
    with trio.fail_after(60):
        try:
            async with open_client(proc.url, proc.token, client_id="ui-move", client_kind="ui") as c:
                sid, req = await _submitted_then_moved(c, a, b, "plan")
                params = {"requestId": req["requestId"], "action": "approve", "targetPermissionMode": "auto",
                          "submissionId": "cut-1"}
                with pytest.raises((ClientClosed, OSError)):  # the host kills itself in the approval
                    await c.call("plans.respond", params)
        except (ClientClosed, OSError):
            pass
        except BaseException:
            proc.kill9()
            raise
        await trio.to_thread.run_sync(lambda: proc.reap())
        assert proc.proc.returncode == -9
        proc = start_host_process(data)
        try:
            async with open_client(proc.url, proc.token, client_id="ui-move", client_kind="ui") as c:
                first = await c.call("plans.respond", params)
                assert (first["approval"]["status"], first["approval"]["executionState"]) == ("approved", "queued")
                assert (first["session"]["mode"], first["session"]["permissionMode"],
                        first["session"]["projectPath"]) == ("agent", "auto", str(b))
                assert await c.call("plans.respond", params) == first
                _artifact_intact(a, req)
        finally:
            proc.kill9()
