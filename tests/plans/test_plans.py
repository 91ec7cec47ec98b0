"""Plan/Goal approvals: exact Markdown artifacts (§11.17), the approval transaction, stale
responses, and a full process restart (§11.18)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError, open_client
from store import plans
from store.errors import Conflict, CorruptData
from tests.dbkit import rows as _rows
from tests.hostkit import client_for, index_caught_up, inprocess_host, start_host_process

MARKDOWN = "# Plan ✓\r\n\r\n1. Split the tokenizer  \n2. Add tests\t\n\n```py\nx = '\\u00e9'\n```\n"
REL_RE = re.compile(r"^\.pi/(plan|goal)/[A-Za-z0-9_-]+\.md$")


def test_artifact_is_exact_unique_and_verified(tmp_path: Path) -> None:
    data = MARKDOWN.encode()
    a1 = plans.write_artifact(str(tmp_path), "plan", data)
    a2 = plans.write_artifact(str(tmp_path), "plan", data)
    g = plans.write_artifact(str(tmp_path), "goal", b"goal")
    assert a1.relative_path != a2.relative_path  # same content, still a new immutable file
    for art, body in ((a1, data), (a2, data), (g, b"goal")):
        assert REL_RE.fullmatch(art.relative_path)
        assert (tmp_path / art.relative_path).read_bytes() == body
        assert (art.sha256, art.size) == (hashlib.sha256(body).hexdigest(), len(body))
        plans.verify_artifact(str(tmp_path), art.relative_path, art.sha256, art.size)
    assert g.relative_path.startswith(".pi/goal/")
    path = tmp_path / a1.relative_path
    path.write_bytes(data + b"x")
    with pytest.raises(CorruptData, match="size changed"):
        plans.verify_artifact(str(tmp_path), a1.relative_path, a1.sha256, a1.size)
    path.write_bytes(data[:-1] + b"!")
    with pytest.raises(CorruptData, match="hash changed"):
        plans.verify_artifact(str(tmp_path), a1.relative_path, a1.sha256, a1.size)
    path.unlink()
    os.symlink(tmp_path / a2.relative_path, path)  # same bytes behind a symlink: refused
    with pytest.raises(CorruptData):
        plans.verify_artifact(str(tmp_path), a1.relative_path, a1.sha256, a1.size)
    with pytest.raises(CorruptData, match="no valid artifact"):
        plans.verify_artifact(str(tmp_path), "../../etc/passwd", a1.sha256, a1.size)


def test_symlinked_pi_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(elsewhere, ws / ".pi")
    with pytest.raises(Conflict, match="symlinks are refused"):
        plans.write_artifact(str(ws), "plan", b"x")
    assert list(elsewhere.iterdir()) == []


async def _plan_session(c: Any, ws: Path, mode: str = "plan") -> str:
    return (await c.call("session.create", {"title": mode, "projectPath": str(ws), "mode": mode}))["id"]


def _submit(sid: str, ws: Path, call_id: str, kind: str = "plan", **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": "t1", "toolCallId": call_id, "kind": kind, "markdown": MARKDOWN,
            "title": "Split the tokenizer", "question": "Proceed?", "workspaceRoot": str(ws), **extra}


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def test_submit_approve_reject_and_stale_responses(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = await _plan_session(c, ws)
            req = await c.call("plans.submit", _submit(sid, ws, "c1", expiresAt=9_999_999_999_999,
                                                       submissionId="sub-1"))
            assert req["status"] == "pending" and (req["title"], req["question"]) == ("Split the tokenizer", "Proceed?")
            body = (ws / req["artifactPath"]).read_bytes()
            assert body == MARKDOWN.encode()  # §11.17: exact bytes, hash and size
            assert (req["artifactSha256"], req["artifactSize"]) == (hashlib.sha256(body).hexdigest(), len(body))
            assert await c.call("plans.submit", _submit(sid, ws, "c1", expiresAt=9_999_999_999_999,
                                                        submissionId="sub-1")) == req  # retry: same row, no file
            assert len(os.listdir(ws / ".pi" / "plan")) == 1
            # one pending per session; nothing written for the refused one
            assert (await _err(c.call("plans.submit", _submit(sid, ws, "c2")))).data_code == "CONFLICT"
            assert len(os.listdir(ws / ".pi" / "plan")) == 1
            pending = (await c.call("plans.pending", {}))["pending"]
            assert [p["requestId"] for p in pending] == [req["requestId"]]
            assert pending[0]["expiresAt"] == 9_999_999_999_999
            # a changed artifact blocks approval, the row stays pending
            art = ws / req["artifactPath"]
            art.write_bytes(body + b"tampered")
            err = await _err(c.call("plans.respond", {"requestId": req["requestId"], "action": "approve"}))
            assert err.data_code == "CORRUPT_DATA"
            assert (await c.call("plans.pending", {}))["pending"][0]["status"] == "pending"
            art.write_bytes(body)
            out = await c.call("plans.respond", {"requestId": req["requestId"], "action": "approve",
                                                 "targetPermissionMode": "accept-edits", "submissionId": "ans-1"})
            a = out["approval"]
            assert (a["status"], a["action"], a["executionState"], a["targetPermissionMode"]) == (
                "approved", "approve", "queued", "accept-edits")
            assert a["executionId"]
            assert (out["session"]["mode"], out["session"]["permissionMode"]) == ("agent", "accept-edits")
            assert await c.call("plans.respond", {"requestId": req["requestId"], "action": "approve",
                                                  "targetPermissionMode": "accept-edits",
                                                  "submissionId": "ans-1"}) == out
            stale = await _err(c.call("plans.respond", {"requestId": req["requestId"], "action": "reject"}))
            assert stale.data_code == "CONFLICT"
            assert (await c.call("plans.pending", {}))["pending"] == []
            # reject keeps the contract mode (goal stays goal)
            gid = await _plan_session(c, ws, "goal")
            wrong = await _err(c.call("plans.submit", _submit(gid, ws, "g0", kind="plan")))
            assert wrong.data_code == "CONFLICT"
            g = await c.call("plans.submit", _submit(gid, ws, "g1", kind="goal"))
            assert g["artifactPath"].startswith(".pi/goal/")
            out = await c.call("plans.respond", {"requestId": g["requestId"], "action": "reject"})
            assert out["approval"]["status"] == "rejected" and out["session"]["mode"] == "goal"
            # a later proposal opens a new pending row; an expired one cannot be answered
            g2 = await c.call("plans.submit", _submit(gid, ws, "g2", kind="goal", expiresAt=1))
            expired = await _err(c.call("plans.respond", {"requestId": g2["requestId"], "action": "approve"}))
            assert expired.data_code == "CONFLICT"
            g3 = await c.call("plans.submit", _submit(gid, ws, "g3", kind="goal"))
            assert [p["requestId"] for p in (await c.call("plans.pending", {"sessionId": gid}))["pending"]] == [
                g3["requestId"]]
            assert (await c.call("session.get", {"sessionId": gid}))["session"]["mode"] == "goal"
            wrong_root = await _err(c.call("plans.submit", _submit(gid, tmp_path, "g4", kind="goal")))
            assert wrong_root.data_code == "CONFLICT"
    # the approved mode is in the transcript too: a rebuilt index keeps it
    lines = (tmp_path / "data" / "sessions" / f"{sid}.jsonl").read_text().splitlines()
    assert '"mode":"agent"' in lines[-1] and '"permissionMode":"accept-edits"' in lines[-1]


def _calls(url: str, token: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    async def run() -> list[Any]:
        out: list[Any] = []
        async with open_client(url, token, client_id="plans", client_kind="test") as c:
            for method, params in calls:
                try:
                    out.append(await c.call(method, params))
                except RpcError as exc:
                    out.append(exc)
        return out

    return trio.run(run)


def _close_pipes(proc: Any) -> None:
    for pipe in (proc.proc.stdout, proc.proc.stderr):
        if pipe is not None:
            pipe.close()


def test_full_process_restart_interrupts_approvals(tmp_path: Path) -> None:
    """Seed §11.18 with SIGKILL: pending/queued → interrupted, turns aborted, no replay, modes kept."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    data.mkdir()
    ws.mkdir()
    proc = start_host_process(data)
    try:
        pa, pb, pc = _calls(proc.url, proc.token, [
            ("session.create", {"title": "pending", "projectPath": str(ws), "mode": "plan"}),
            ("session.create", {"title": "approved", "projectPath": str(ws), "mode": "goal"}),
            ("session.create", {"title": "rejected", "projectPath": str(ws), "mode": "plan"}),
        ])
        a, b, c = pa["id"], pb["id"], pc["id"]
        out = _calls(proc.url, proc.token, [
            ("session.startTurn", {"sessionId": a, "turnId": "ta"}),
            ("plans.submit", {**_submit(a, ws, "ca"), "turnId": "ta"}),
            ("session.startTurn", {"sessionId": b, "turnId": "tb"}),
            ("plans.submit", {**_submit(b, ws, "cb", kind="goal"), "turnId": "tb"}),
            ("plans.submit", {**_submit(c, ws, "cc"), "turnId": "tc"}),
        ])
        req_a, req_b, req_c = out[1], out[3], out[4]
        approved, rejected = _calls(proc.url, proc.token, [
            ("plans.respond", {"requestId": req_b["requestId"], "action": "approve",
                               "targetPermissionMode": "auto"}),
            ("plans.respond", {"requestId": req_c["requestId"], "action": "reject"}),
        ])
        assert approved["approval"]["executionState"] == "queued" and rejected["approval"]["status"] == "rejected"
    finally:
        proc.kill9()
        _close_pipes(proc)
    proc = start_host_process(data)
    try:
        status, audited, pending, stale_a, stale_b, sa, sb, sc = _calls(proc.url, proc.token, [
            ("host.status", {}),
            ("audit.list", {"kind": "plan_interrupted"}),
            ("plans.pending", {}),
            ("plans.respond", {"requestId": req_a["requestId"], "action": "approve"}),
            ("plans.respond", {"requestId": req_b["requestId"], "action": "reject"}),
            ("session.get", {"sessionId": a}),
            ("session.get", {"sessionId": b}),
            ("session.get", {"sessionId": c}),
        ])
        fence = status["boot"]["fence"]
        assert sorted(fence["abortedTurns"]) == ["ta", "tb"]
        assert (fence["interruptedApprovals"], fence["interruptedExecutions"]) == (1, 1)
        # seed §3: the fence "appends the recovery audit records": one per approval or execution it interrupted
        records = sorted((e["sessionId"], e["payload"]) for e in audited["entries"])
        assert records == sorted([
            (a, {"requestId": req_a["requestId"], "kind": "plan", "interrupted": "approval", "turnId": "ta",
                 "bootId": status["boot"]["bootId"], "reason": "host restarted"}),
            (b, {"requestId": req_b["requestId"], "kind": "goal", "interrupted": "execution",
                 "executionId": approved["approval"]["executionId"], "turnId": "tb",
                 "bootId": status["boot"]["bootId"], "reason": "host restarted"})]), records
        assert pending == {"pending": []}
        assert isinstance(stale_a, RpcError) and stale_a.data_code == "CONFLICT"
        assert isinstance(stale_b, RpcError) and stale_b.data_code == "CONFLICT"
        assert sa["session"]["mode"] == "plan"  # pending interruption: contract mode kept
        assert (sb["session"]["mode"], sb["session"]["permissionMode"]) == ("agent", "auto")  # approved: agent
        assert sc["session"]["mode"] == "plan"
        rows = dict((r[0], r[1:]) for r in _rows(
            data, "SELECT request_id, status, execution_state FROM plan_approvals"))
        assert rows == {req_a["requestId"]: ("interrupted", None), req_b["requestId"]: ("approved", "interrupted"),
                        req_c["requestId"]: ("rejected", None)}
        assert sorted(_rows(data, "SELECT id, status FROM turns")) == [("ta", "aborted"), ("tb", "aborted")]
        # no replay: nothing was re-queued, a new proposal starts fresh
        again = _calls(proc.url, proc.token, [("plans.submit", {**_submit(a, ws, "ca2"), "turnId": "ta2"})])[0]
        assert again["status"] == "pending"
        assert len(os.listdir(ws / ".pi" / "plan")) == 3 and len(os.listdir(ws / ".pi" / "goal")) == 1
    finally:
        proc.terminate()
        _close_pipes(proc)


async def test_failed_approval_commit_leaves_the_session_in_its_contract_mode(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = await _plan_session(c, ws)
            req = await c.call("plans.submit", _submit(sid, ws, "c1"))
            await index_caught_up(host)
            host.faults.add("index.before_commit", nth=1, action="raise")
            with pytest.raises(RpcError):
                await c.call("plans.respond", {"requestId": req["requestId"], "action": "approve"})
            host.faults.clear()
            got = await c.call("session.get", {"sessionId": sid})  # catch-up applies the newest session_info
            assert got["session"]["mode"] == "plan"
            assert (await c.call("plans.pending", {}))["pending"][0]["requestId"] == req["requestId"]
            out = await c.call("plans.respond", {"requestId": req["requestId"], "action": "approve"})
            assert out["session"]["mode"] == "agent"
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["mode"] == "agent"
