"""Seed 003 §4.6a (plan_approvals) and §11 items 17-19, audited by an outsider against real ``pi-host serve``
processes over WebSocket: the clauses older tests leave open.

Already held elsewhere (not repeated here): a BOM/CR/CRLF/U+2028 body, title/question structured, unique and
immutable files, racing submissions on one connection, a lapsed deadline, answers kept across SIGKILL, no
background approver, forks and keyed submissions (tests/acceptance/test_plans_outsider.py); a tampered
artifact refused in-process, the boot fence (pending → interrupted, queued → interrupted, turns aborted, no
replay, contract/agent modes kept, stale responses CONFLICT) (tests/plans/test_plans.py); the multi-byte
size limit (tests/plans/test_audit_fixes.py); an approval cut after its mode line (tests/chaos/
test_file_first_kill.py); §11.19's PLAN_REQUIRES_INTERACTIVE_SESSION (tests/tasks/test_tasks.py).

Here: the byte limit's edges and more awkward bodies through the real gateway; every way a file can change on
disk before approval, with nothing moved; racing submissions from two connections; approve/reject cut by
SIGKILL at several moments and retried; expiry while the host is down; a workspace that is a symlink, missing
or read-only; bad input refused with nothing changed. Probes that never restart share one host."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient
from tests.acceptance.outsiderkit import all_at_once, client, code_of, error_of, real_host, shared_host
from tests.acceptance.test_plans_outsider import _session, _ws
from tests.dbkit import rows
from tests.hostkit import HostProcess, start_host_process

LIMIT = 1_048_576
"""plans.submit's markdown bound in UTF-8 bytes (protocol/README.md)."""


@pytest.fixture(scope="module")
def host(tmp_path_factory: Any) -> Iterator[HostProcess]:
    yield from shared_host(tmp_path_factory, "plans_audit")


def _submit(sid: str, ws: Path | str, call_id: str, markdown: str = "# Plan\n\n1. Do it\n", kind: str = "plan",
            **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": "t1", "toolCallId": call_id, "kind": kind, "markdown": markdown,
            "workspaceRoot": str(ws), **extra}


def _tree(ws: Path) -> list[str]:
    """Every file under the workspace's .pi (temporaries too), relative."""
    pi = ws / ".pi"
    return sorted(str(p.relative_to(ws)) for p in pi.rglob("*")) if pi.exists() else []


def _exact(ws: Path, row: dict[str, Any], body: bytes) -> None:
    on_disk = (ws / row["artifactPath"]).read_bytes()
    assert on_disk == body
    assert (row["artifactSha256"], row["artifactSize"]) == (hashlib.sha256(body).hexdigest(), len(body))


async def _state(c: HostClient, sid: str) -> tuple[Any, ...]:
    """What an answer may change: the session's mode, permission mode and state, and its pending rows."""
    s = (await c.call("session.get", {"sessionId": sid}))["session"]
    pending = (await c.call("plans.pending", {"sessionId": sid}))["pending"]
    return s["mode"], s["permissionMode"], s.get("state"), pending


async def test_exact_bytes_at_the_limits_and_awkward_bodies(host: HostProcess, tmp_path: Path) -> None:
    """§11.17: "write exact Markdown bytes to a unique .pi/plan/*.md or .pi/goal/*.md file with SHA-256 and
    size". Bodies of exactly the byte limit, one byte, trailing blanks, CRLF with a BOM, combining marks,
    RTL and astral characters: each file holds exactly the UTF-8 bytes sent. One byte (here one character)
    over the limit and an empty body are refused, each naming the markdown field: no file, no row. (A body
    within the wire's character bound but over the byte bound is PAYLOAD_TOO_LARGE: tests/plans.)"""
    ws = _ws(tmp_path)
    bodies = {
        "limit": "#" + "x" * (LIMIT - 2) + "\n",
        "one": "x",
        "trailing": "# Plan  \n\t\n  \n   ",
        "crlf": "\ufeff# Plan\r\n\r\n- a\r\n- b  \r\n",
        "unicode": "e\u0301 \u05e9\u05dc\u05d5\u05dd \U0001f9ea \U00010348 \u200d\ufffd \\x00 \u2029",
    }
    with trio.fail_after(120):
        async with client(host) as c:
            for name, markdown in bodies.items():
                kind = "goal" if name == "unicode" else "plan"
                sid = await _session(c, ws, kind)
                row = await c.call("plans.submit", _submit(sid, ws, f"ok-{name}", markdown, kind=kind))
                assert row["artifactPath"].startswith(f".pi/{kind}/") and row["artifactPath"].endswith(".md")
                _exact(ws, row, markdown.encode("utf-8"))
            assert (ws / (await c.call("plans.pending", {}))["pending"][0]["artifactPath"]).exists()
            before = _tree(ws)
            sid = await _session(c, ws)
            over = await error_of(c, "plans.submit", _submit(sid, ws, "over", "x" * (LIMIT + 1)))
            empty = await error_of(c, "plans.submit", _submit(sid, ws, "empty", ""))
            assert (over[0], empty[0]) == ("INVALID_PARAMS", "INVALID_PARAMS"), (over, empty)
            assert _tree(ws) == before
            assert await _state(c, sid) == ("plan", "inherit", "planning", [])


async def test_a_file_changed_on_disk_is_never_approved_and_nothing_moves(host: HostProcess, tmp_path: Path) -> None:
    """§4.6a: "Hash and byte size authenticate the file before approval". The artifact with one byte changed
    (same size), one byte added, truncated to nothing, deleted, or replaced by a folder: approval is
    CORRUPT_DATA each time and the session (mode, permission mode, state) and its pending row (status,
    version, updatedAt) are as before. The person can still reject it, which keeps the contract mode."""
    ws = _ws(tmp_path)
    body = b"# Plan\n\n1. Ship it\n"

    def flip(p: Path) -> None:
        p.write_bytes(body[:-2] + b"X\n")

    def grow(p: Path) -> None:
        p.write_bytes(body + b" ")

    def empty(p: Path) -> None:
        p.write_bytes(b"")

    def gone(p: Path) -> None:
        p.unlink()

    def folder(p: Path) -> None:
        p.unlink()
        p.mkdir()

    with trio.fail_after(60):
        async with client(host) as c:
            for change in (flip, grow, empty, gone, folder):
                sid = await _session(c, ws)
                row = await c.call("plans.submit", _submit(sid, ws, f"t-{change.__name__}", body.decode()))
                before = await _state(c, sid)
                change(ws / row["artifactPath"])
                code = await code_of(c, "plans.respond", {"requestId": row["requestId"], "action": "approve",
                                                          "targetPermissionMode": "auto"})
                assert code == "CORRUPT_DATA", change.__name__
                assert await _state(c, sid) == before, change.__name__
                rejected = await c.call("plans.respond", {"requestId": row["requestId"], "action": "reject"})
                assert (rejected["approval"]["status"], rejected["session"]["mode"]) == ("rejected", "plan")
                assert rejected["approval"].get("executionId") is None


async def test_racing_submissions_from_two_connections_leave_one_pending_row(host: HostProcess,
                                                                            tmp_path: Path) -> None:
    """§4.6a: "CREATE UNIQUE INDEX idx_plan_approvals_one_pending_session ... WHERE status = 'pending'". Two
    connections each send three proposals (keyed and not) at once to one session: exactly one is pending,
    the rest are CONFLICT, and the workspace holds exactly the winner's file."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with client(host, "racer-a") as a, client(host, "racer-b") as b:
            sid = await _session(a, ws, "goal")
            calls = [(conn, "plans.submit", _submit(sid, ws, f"{n}{i}", f"# Goal {n}{i}\n", kind="goal",
                                                    **({"submissionId": f"k{i}"} if i % 2 else {})))
                     for n, conn in (("a", a), ("b", b)) for i in range(3)]
            outcomes = await all_at_once(calls)
            won = [o for o in outcomes if isinstance(o, dict)]
            assert len(won) == 1 and sorted(o for o in outcomes if not isinstance(o, dict)) == ["CONFLICT"] * 5
            [pending] = (await a.call("plans.pending", {"sessionId": sid}))["pending"]
            assert pending["requestId"] == won[0]["requestId"]
            assert _tree(ws) == [".pi/goal", pending["artifactPath"]]
            _exact(ws, pending, f"# Goal {pending['toolCallId']}\n".encode())


async def _ro_mount(path: Path) -> bool:
    """A read-only file system at ``path`` (root ignores file modes); False when it cannot be made."""
    done = await trio.run_process(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                                  capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode == 0


async def test_a_workspace_that_is_a_symlink_missing_or_read_only(host: HostProcess, tmp_path: Path) -> None:
    """§4.6a: the file goes "under the session's workspace root" as ".pi/<kind>/<unique-name>.md". The
    workspace removed after the session was created is NOT_FOUND; a read-only one is IO_ERROR naming the
    errno: neither leaves a row (the session is still planning, nothing pending), a file or an intent. A
    workspace reached through a symlink is the folder it names: the file lands there, exact."""
    real = _ws(tmp_path, "real")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    missing = _ws(tmp_path, "missing")
    ro = _ws(tmp_path, "ro")
    with trio.fail_after(60):
        async with client(host) as c:
            gone = await _session(c, missing)
            missing.rmdir()
            code, data = await error_of(c, "plans.submit", _submit(gone, missing, "m1"))
            assert code == "NOT_FOUND" and data.get("workspaceRoot") == str(missing)
            assert not missing.exists()
            assert await _state(c, gone) == ("plan", "inherit", "planning", [])

            locked = await _session(c, ro)
            mounted = False
            if os.geteuid() == 0:
                mounted = await _ro_mount(ro)
            else:
                ro.chmod(0o555)
            try:
                if os.geteuid() == 0 and not mounted:
                    pytest.skip("no read-only workspace can be made here (root ignores modes, no mount)")
                code, data = await error_of(c, "plans.submit", _submit(locked, ro, "r1"))
                assert (code, data.get("errno")) == ("IO_ERROR", errno.EROFS if mounted else errno.EACCES)
                assert _tree(ro) == [] and list(host.data_dir.rglob(f"{locked}*intent*")) == []
                assert await _state(c, locked) == ("plan", "inherit", "planning", [])
            finally:
                if mounted:
                    with trio.CancelScope(shield=True):
                        await trio.run_process(["umount", str(ro)], check=False)
                ro.chmod(0o755)
            row = await c.call("plans.submit", _submit(locked, ro, "r2"))
            assert row["status"] == "pending"

            via = await _session(c, link)
            row = await c.call("plans.submit", _submit(via, link, "l1"))
            assert not (link / ".pi").is_symlink()
            _exact(real, row, b"# Plan\n\n1. Do it\n")


async def test_bad_input_is_refused_with_a_clear_code_and_changes_nothing(host: HostProcess, tmp_path: Path) -> None:
    """§4.6a: the new protocol has no request-changes action; the row's CHECKs bound kind and
    target_permission_mode. Malformed submissions and responses are refused with a stable code; the pending
    row, the session and the workspace are exactly as before, and the request can still be approved with an
    explicit permission mode (approved + executionId + queued + agent in one answer)."""
    ws = _ws(tmp_path)
    with trio.fail_after(60):
        async with client(host) as c:
            sid = await _session(c, ws)
            row = await c.call("plans.submit", _submit(sid, ws, "good"))
            rid = row["requestId"]
            before, files = await _state(c, sid), _tree(ws)
            other = _ws(tmp_path, "other")
            bad_submits = [
                ("INVALID_PARAMS", _submit(sid, ws, "b1", kind="spec")),
                ("INVALID_PARAMS", _submit(sid, "relative/ws", "b2")),
                ("INVALID_PARAMS", _submit(sid, ws, "bad id with spaces")),
                ("INVALID_PARAMS", _submit(sid, ws, "b3", title="t" * 201)),
                ("INVALID_PARAMS", _submit(sid, ws, "b4", question="q" * 2001)),
                ("INVALID_PARAMS", _submit(sid, ws, "b5", expiresAt=-1)),
                ("INVALID_PARAMS", {**_submit(sid, ws, "b6"), "markdown": 7}),
                ("INVALID_PARAMS", {k: v for k, v in _submit(sid, ws, "b7").items() if k != "workspaceRoot"}),
                ("SESSION_NOT_FOUND", _submit("s_nobody", ws, "b8")),
                ("CONFLICT", _submit(sid, other, "b9")),
                ("CONFLICT", _submit(sid, ws, "b10")),
            ]
            for want, params in bad_submits:
                assert await code_of(c, "plans.submit", params) == want, params
            bad_answers = [
                ("INVALID_PARAMS", {"requestId": rid, "action": "request_changes", "feedback": "more"}),
                ("INVALID_PARAMS", {"requestId": rid, "action": "approve", "targetPermissionMode": "inherit"}),
                ("INVALID_PARAMS", {"requestId": rid, "action": "approve", "targetPermissionMode": "yolo"}),
                ("INVALID_PARAMS", {"requestId": rid}),
                ("NOT_FOUND", {"requestId": "plan_nobody", "action": "approve"}),
            ]
            for want, params in bad_answers:
                assert await code_of(c, "plans.respond", params) == want, params
            assert (await _state(c, sid), _tree(ws), _tree(other)) == (before, files, [])
            [still] = before[3]
            assert (still["version"], still["updatedAt"], still["requestId"]) == (row["version"], row["updatedAt"], rid)
            out = await c.call("plans.respond", {"requestId": rid, "action": "approve",
                                                 "targetPermissionMode": "ask"})
            a, s = out["approval"], out["session"]
            assert (a["status"], a["executionState"], bool(a["executionId"]), a["targetPermissionMode"]) == (
                "approved", "queued", True, "ask")
            assert (s["mode"], s["permissionMode"], s.get("state")) == ("agent", "ask", "queued")


async def _die_in(data: Path, spec: str, prepare: Callable[[HostClient], Awaitable[tuple[str, dict[str, Any]]]]
                  ) -> Any:
    """A host armed with ``RT_CRASHPOINT=spec``: ``prepare`` runs on it and names the last call, at which
    the host dies without answering. ``prepare``'s value."""
    crashing = start_host_process(data, env={"RT_CRASHPOINT": spec})
    answered = False
    try:
        async with client(crashing) as c:
            method, params = await prepare(c)
            try:
                await c.call(method, params)
                answered = True
            except (ClientClosed, OSError):
                pass
    except (ClientClosed, OSError):
        pass
    if answered:
        crashing.kill9()
    await trio.to_thread.run_sync(crashing.reap)
    assert crashing.proc.returncode == -9 and not answered, f"the host did not die at {spec}"
    return params


@pytest.mark.parametrize(("action", "points"), [
    ("approve", ("append.after_write", "append.after_fsync", "plans.respond.before_commit",
                 "plans.respond.after_commit")),
    ("reject", ("plans.respond.before_commit", "plans.respond.after_commit")),
])
async def test_an_answer_cut_by_sigkill_and_retried_has_one_effect(tmp_path: Path, action: str,
                                                                   points: tuple[str, ...]) -> None:
    """§4.6a: "Approval changes status to approved, sets execution_id and execution_state = 'queued',
    updates sessions.mode to agent, and stores the explicit permission mode in one transaction";
    "Reject/expiry leave the session in its contract mode"; §11.18. An answer killed at each moment of its
    write path, then retried with the same key after the restart: all of it or none of it, never a part —
    approved ⇔ agent with the permission mode and one execution id (interrupted by the restart: no replay);
    rejected ⇔ the contract mode and no execution; a pending row left behind is interrupted; any other
    answer to it afterwards is a stale response (CONFLICT)."""
    data, ws = tmp_path / "data", _ws(tmp_path)
    data.mkdir()
    kind = "goal" if action == "reject" else "plan"
    cases: list[tuple[str, str, dict[str, Any]]] = []
    with trio.fail_after(60 + 20 * len(points)):
        for n, point in enumerate(points):
            sid = f"s_{action}_{n}"

            async def prepare(c: HostClient, sid: str = sid, n: int = n) -> tuple[str, dict[str, Any]]:
                await c.call("session.create", {"sessionId": sid, "projectPath": str(ws), "mode": kind})
                row = await c.call("plans.submit", _submit(sid, ws, f"c{n}", f"# {n}\n", kind=kind))
                answer = {"requestId": row["requestId"], "action": action, "submissionId": f"answer-{n}",
                          **({"targetPermissionMode": "accept-edits"} if action == "approve" else {})}
                return "plans.respond", answer

            answer = await _die_in(data, f"{point}:1:kill", prepare)
            cases.append((point, sid, answer))
        async with real_host(data) as (_proc, c):
            for point, sid, answer in cases:
                first = await error_of(c, "plans.respond", answer)
                again = await error_of(c, "plans.respond", answer)
                assert first == again, point
                s = (await c.call("session.get", {"sessionId": sid}))["session"]
                assert (await c.call("plans.pending", {"sessionId": sid}))["pending"] == [], point
                other = "reject" if action == "approve" else "approve"
                assert await code_of(c, "plans.respond", {"requestId": answer["requestId"],
                                                          "action": other}) == "CONFLICT", point
                cases_seen = (point, first[0], s["mode"], s["permissionMode"])
                if first[0] is None:
                    assert cases_seen[2:] == (("agent", "accept-edits") if action == "approve"
                                              else (kind, "inherit")), cases_seen
                else:
                    assert first[0] == "CONFLICT" and cases_seen[2:] == (kind, "inherit"), cases_seen
        for point, sid, _answer in cases:
            [(status, execution_id, state, target)] = rows(
                data, "SELECT status, execution_id, execution_state, target_permission_mode FROM plan_approvals "
                      "WHERE session_id = ?", sid)
            if status == "approved":
                assert (bool(execution_id), state, target) == (True, "interrupted", "accept-edits"), point
            else:
                assert status in ("rejected", "interrupted") and (execution_id, state) == (None, None), point
                assert status == "rejected" or point != "plans.respond.after_commit", point


async def test_a_deadline_that_passes_while_the_host_is_down(tmp_path: Path) -> None:
    """§4.6a: "At startup ... one transaction changes every pending row to interrupted"; "plans.pending
    returns no terminal rows"; §11.18 "rejects stale responses". A request whose deadline passes while the
    host is dead is not listed after the restart, cannot be approved (CONFLICT, status terminal), the session
    keeps its contract mode with nothing executing, and a new proposal opens a new row and a new file."""
    data, ws = tmp_path / "data", _ws(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = await _session(c, ws, "goal")
            row = await c.call("plans.submit", _submit(sid, ws, "g1", kind="goal",
                                                       expiresAt=int(time.time() * 1000) + 800))
            proc.kill9()
        await trio.sleep(1.0)
        async with real_host(data) as (_proc, c):
            assert (await c.call("plans.pending", {}))["pending"] == []
            code, info = await error_of(c, "plans.respond", {"requestId": row["requestId"], "action": "approve"})
            assert code == "CONFLICT" and info.get("status") in ("interrupted", "expired")
            s = (await c.call("session.get", {"sessionId": sid}))["session"]
            assert (s["mode"], s["permissionMode"], s.get("state")) == ("goal", "inherit", "planning")
            fresh = await c.call("plans.submit", _submit(sid, ws, "g2", "# again\n", kind="goal"))
            assert fresh["artifactPath"] != row["artifactPath"] and len(_tree(ws)) == 3
            _exact(ws, row, b"# Plan\n\n1. Do it\n")
