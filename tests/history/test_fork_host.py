"""session.fork through the real gateway (seed 003 §4.5, §5 fork row)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, RpcError, open_client
from store.fork import derived_id
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg, start_host_process
from tests.revisions.helpers import assert_index_matches_file, full, query, revisions_path, transcript_path, turn

SETTINGS = {"providerId": "anthropic", "modelId": "claude-x", "mode": "plan", "thinkingLevel": "high",
            "permissionMode": "accept-edits"}


def strip(rec: dict[str, Any]) -> dict[str, Any]:
    """A record without what a fork remaps or drops (ids, call ids, turn, meta)."""
    out = {k: v for k, v in rec.items() if k not in ("id", "seq", "turnId", "meta")}
    out["blocks"] = [{k: v for k, v in b.items() if k != "callId"} for b in rec["blocks"]]
    return out


def session_files(root: Path) -> set[str]:
    return {p.name for p in (root / "sessions").iterdir()}


async def source(c: Any, root: Path) -> str:
    sid = (await c.call("session.create", {"title": "Source", "projectPath": "/proj/a", **SETTINGS}))["id"]
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "T1"})
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": "T1", "message": msg("u1", "hello")})
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": "T1", "message": {
        "id": "a1", "role": "assistant", "blocks": [
            {"type": "text", "text": "delegating"},
            {"type": "tool_call", "callId": "call-1", "name": "Task", "args": {"p": 1}, "result": "report"}]}})
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
        "s1", "subagent work", role="assistant", meta={"parentToolCallId": "call-1", "agentName": "reviewer"})})
    await turn(c, sid, "u2", "a2")
    return sid


async def test_fork_copies_the_live_transcript_and_settings(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await source(c, tmp_path)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            # a pending approval row of the source is never copied
            await host.services.db.write(lambda conn: conn.execute(
                "INSERT INTO plan_approvals(request_id, session_id, turn_id, tool_call_id, plan_json, status, "
                "created_at, updated_at) VALUES ('r1', ?, 'T1', 'call-1', '{}', 'pending', 0, 0)", (sid,)))
            src_bytes = transcript_path(tmp_path, sid).read_bytes()
            src = await full(c, sid)
            child = await c.call("session.fork", {"sessionId": sid})
            cid = child["id"]
            assert cid != sid and child["title"] == "Source" and child["messageCount"] == 5
            for key, value in SETTINGS.items():
                assert child[key] == value
            assert child["projectId"] == src["session"]["projectId"] and child["projectPath"] == "/proj/a"
            got = await full(c, cid)
            old_ids = [m["id"] for m in src["messages"]]
            assert [m["id"] for m in got["messages"]] == [derived_id(cid, "message", i) for i in old_ids]
            assert [strip(m) for m in got["messages"]] == [strip(m) for m in src["messages"]]
            assert [m.get("deleted", False) for m in got["messages"]] == [False, False, False, True, False]
            call = got["messages"][1]["blocks"][1]["callId"]
            assert call == derived_id(cid, "call", "call-1")
            assert got["messages"][2]["meta"] == {"parentToolCallId": call, "agentName": "reviewer"}
            assert "meta" not in got["messages"][3]  # the source's revision pager stamp is not copied
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, cid)
            assert query(tmp_path, "SELECT COUNT(*) FROM plan_approvals WHERE session_id = ?", cid) == [(0,)]
            assert query(tmp_path, "SELECT COUNT(*) FROM turns WHERE session_id = ?", cid) == [(0,)]
            assert query(tmp_path, "SELECT COUNT(*) FROM message_revisions WHERE session_id = ?", cid) == [(0,)]
            assert query(tmp_path, "SELECT turn_id FROM messages WHERE session_id = ? AND turn_id IS NOT NULL",
                         cid) == []
            assert not revisions_path(tmp_path, cid).exists()
            assert transcript_path(tmp_path, sid).read_bytes() == src_bytes  # the source is never rewritten
            # same model context, message for message (subagent rows and tombstones skipped in both)
            src_ctx = await c.call("session.context", {"sessionId": sid})
            ctx = await c.call("session.context", {"sessionId": cid})
            assert [m["id"] for m in ctx["messages"]] == [derived_id(cid, "message", m["id"])
                                                          for m in src_ctx["messages"]]
            # the child is independent: it appends, continuing its own sequence
            r = await c.call("session.appendMessage", {"sessionId": cid, "message": msg("n1", "next")})
            assert r["message"]["seq"] == 6
            await c.call("session.delete", {"sessionId": sid})
            assert [m["id"] for m in (await full(c, cid))["messages"]][-1] == "n1"
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            again = await full(c, cid)
            assert len(again["messages"]) == 6 and again["session"]["mode"] == "plan"
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, cid)


async def test_message_scoped_fork_and_checkpoints(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await source(c, tmp_path)
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c1", "summary": "early", "throughMessageId": "a1", "tokensBefore": 10}})
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c2", "summary": "late", "throughMessageId": "a2", "tokensBefore": 20,
                "firstKeptMessageId": "u2"}})
            child = await c.call("session.fork", {"sessionId": sid, "throughMessageId": "u2", "title": "  Part  "})
            cid = child["id"]
            assert child["title"] == "Part" and child["messageCount"] == 4
            got = await full(c, cid)
            assert [m["blocks"][0]["text"] for m in got["messages"]] == ["hello", "delegating", "subagent work",
                                                                          "q u2 "]
            assert [(x["summary"], x["throughMessageId"]) for x in got["compactions"]] == [
                ("early", derived_id(cid, "message", "a1"))]
            ctx = await c.call("session.context", {"sessionId": cid})
            assert ctx["compaction"]["summary"] == "early"
            assert [m["id"] for m in ctx["messages"]] == [got["compactions"][0]["id"],
                                                          derived_id(cid, "message", "u2")]
            whole = await c.call("session.fork", {"sessionId": sid})
            assert [x["summary"] for x in (await full(c, whole["id"]))["compactions"]] == ["early", "late"]
            with pytest.raises(RpcError) as err:
                await c.call("session.fork", {"sessionId": sid, "throughMessageId": "nope"})
            assert err.value.data_code == "MESSAGE_NOT_FOUND"
            with pytest.raises(RpcError) as err:
                await c.call("session.fork", {"sessionId": "missing"})
            assert err.value.data_code == "SESSION_NOT_FOUND"
            await index_caught_up(host)
            assert len(query(tmp_path, "SELECT id FROM sessions")) == 3


async def test_fork_copies_referenced_pasted_inputs_only(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            pasted = tmp_path / "scratch" / sid / "pasted"
            pasted.mkdir(parents=True)
            (pasted / "a.txt").write_text("A")
            (pasted / "later.txt").write_text("L")
            (pasted / "unreferenced.txt").write_text("U")
            (tmp_path / "scratch" / sid / "output.log").write_text("other scratch output")
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "u1", "role": "user", "blocks": [
                    {"type": "attachment", "kind": "file", "name": "a.txt", "ref": str(pasted / "a.txt")},
                    {"type": "text", "text": f"and {pasted / 'expired.txt'} is gone"}]}})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", "ok", role="assistant")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "u2", "role": "user", "blocks": [
                    {"type": "attachment", "kind": "file", "name": "l", "ref": str(pasted / "later.txt")}]}})
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c1", "summary": f"user pasted {pasted / 'a.txt'}", "throughMessageId": "a1",
                "tokensBefore": 1}})
            child = await c.call("session.fork", {"sessionId": sid, "throughMessageId": "a1"})
            cid = child["id"]
            child_pasted = tmp_path / "scratch" / cid / "pasted"
            assert sorted(p.name for p in (tmp_path / "scratch" / cid).rglob("*")) == ["a.txt", "pasted"]
            assert (child_pasted / "a.txt").read_text() == "A"
            got = await full(c, cid)
            blocks = got["messages"][0]["blocks"]
            assert blocks[0]["ref"] == str(child_pasted / "a.txt")
            assert blocks[1]["text"] == f"and {child_pasted / 'expired.txt'} is gone"
            assert got["compactions"][0]["summary"] == f"user pasted {child_pasted / 'a.txt'}"
            await c.call("session.delete", {"sessionId": sid})
            assert not (tmp_path / "scratch" / sid).exists()
            assert (child_pasted / "a.txt").read_text() == "A"  # source deletion cannot remove the copy


FAULTS = ["fork.after_copy", "fork.after_tmp_write", "fork.after_tmp_fsync", "fork.after_rename",
          "fork.before_index", "fork.index_before_commit", "index.before_commit"]


@pytest.mark.parametrize("point", FAULTS)
async def test_failed_fork_leaves_no_child_files_or_rows(tmp_path, point):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            pasted = tmp_path / "scratch" / sid / "pasted"
            pasted.mkdir(parents=True)
            (pasted / "a.txt").write_text("A")
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", f"see {pasted}/a.txt")})
            await index_caught_up(host)
            files, sessions = session_files(tmp_path), query(tmp_path, "SELECT id FROM sessions")
            scratch = sorted(p.name for p in (tmp_path / "scratch").iterdir())
            host.faults.add(point, nth=1, action="raise")
            with pytest.raises(RpcError):
                await c.call("session.fork", {"sessionId": sid})
            host.faults.clear()
            assert session_files(tmp_path) == files
            await index_caught_up(host)
            assert query(tmp_path, "SELECT id FROM sessions") == sessions
            assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == scratch
            assert query(tmp_path, "SELECT COUNT(*) FROM messages") == [(1,)]
            # the source is untouched and the next fork works
            child = await c.call("session.fork", {"sessionId": sid})
            assert (tmp_path / "scratch" / child["id"] / "pasted" / "a.txt").exists()


async def test_fork_retry_with_the_same_submission_returns_the_same_child(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            p = {"sessionId": sid, "submissionId": "fork-1"}
            first = await c.call("session.fork", p)
            second = await c.call("session.fork", p)
            assert first["id"] == second["id"]
            await index_caught_up(host)
            assert len(query(tmp_path, "SELECT id FROM sessions")) == 2
            with pytest.raises(RpcError) as err:
                await c.call("session.fork", {**p, "throughMessageId": "u1"})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"


@pytest.mark.parametrize("point,child_survives", [("fork.after_copy", False), ("fork.before_index", True)])
async def test_sigkill_during_fork_gives_no_child_or_a_whole_one(tmp_path, point, child_survives):
    proc = start_host_process(tmp_path, env={"RT_CRASHPOINT": f"{point}:1:kill"})
    try:
        with trio.fail_after(30):
            async with open_client(proc.url, proc.token, client_id="crash") as c:
                await c.call("session.create", {"sessionId": "src", "title": "S", **SETTINGS})
                pasted = tmp_path / "scratch" / "src" / "pasted"
                pasted.mkdir(parents=True)
                (pasted / "a.txt").write_text("A")
                await c.call("session.appendMessage", {"sessionId": "src", "message": msg("u1", f"{pasted}/a.txt")})
                await c.call("session.appendMessage", {"sessionId": "src", "message": msg("a1", "x", role="assistant")})
                with pytest.raises(ClientClosed):  # the host dies under the call
                    await c.call("session.fork", {"sessionId": "src"})
        assert proc.reap(30) == -signal.SIGKILL
    finally:
        proc.kill9()
        proc.proc.communicate()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await index_caught_up(host)
            rows = [r[0] for r in query(tmp_path, "SELECT id FROM sessions ORDER BY id")]
            others = [r for r in rows if r != "src"]
            scratch = sorted(p.name for p in (tmp_path / "scratch").iterdir())
            if not child_survives:
                assert others == [] and scratch == ["src"]
                assert session_files(tmp_path) == {"src.jsonl"}
                return
            assert len(others) == 1
            cid = others[0]
            got = await full(c, cid)  # boot restored the whole child from its file
            assert [m["blocks"][0]["text"] for m in got["messages"]] == [f"{tmp_path}/scratch/{cid}/pasted/a.txt",
                                                                          "x"]
            for key, value in SETTINGS.items():
                assert got["session"][key] == value
            assert (tmp_path / "scratch" / cid / "pasted" / "a.txt").read_text() == "A"
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, cid)


def _write(mid: str, path: str) -> dict[str, Any]:
    return {"id": mid, "role": "tool", "toolName": "Write", "blocks": [
        {"type": "tool_call", "callId": f"c-{mid}", "name": "Write", "args": {"path": path}, "status": "ok"}]}


async def test_a_fork_and_an_assistant_edit_list_a_copied_write_where_the_source_wrote_it(tmp_path: Path) -> None:
    """Seed 003 §4.10 ("absolute, workspace-resolved") with the rule of ``records.Root``: a Write of ``x.md``
    while the session's root was A, then ``session.update`` to B. The child of a fork (and of an Assistant
    Edit) holds a copy of that line: it lists ``A/x.md``, the file the tool wrote, as the source does, and
    keeps it once the database is lost; it listed ``B/x.md``."""
    a, b = tmp_path / "project-a", tmp_path / "project-b"
    a.mkdir()
    b.mkdir()
    data = tmp_path / "data"

    async def listed(c: Any, sid: str) -> list[str]:
        return sorted(x["path"] for x in (await c.call("artifacts.list", {"sessionId": sid}))["artifacts"])

    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"projectPath": str(a)}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "write x")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": _write("w1", "x.md")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", "done", "assistant")})
            await c.call("session.update", {"sessionId": sid, "projectPath": str(b)})
            child = (await c.call("session.fork", {"sessionId": sid}))["id"]
            edited = (await c.call("session.assistantEdit", {"sessionId": sid, "messageId": "a1", "blocks": [
                {"type": "text", "text": "edited"}]}))["session"]["id"]
            for s in (sid, child, edited):
                assert await listed(c, s) == [f"{a}/x.md"], s
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (data / name).unlink(missing_ok=True)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c:
            for s in (sid, child, edited):
                assert await listed(c, s) == [f"{a}/x.md"], s
