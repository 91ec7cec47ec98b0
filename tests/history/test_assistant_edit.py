"""session.assistantEdit through the real gateway (seed 003 §4.5, §4.9)."""

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

EDIT = [{"type": "text", "text": "the edited answer"}]


def session_files(root: Path) -> set[str]:
    return {p.name for p in (root / "sessions").iterdir()}


def texts(got: dict[str, Any]) -> list[str]:
    return [m["blocks"][0]["text"] for m in got["messages"]]


async def source(c: Any) -> str:
    sid = (await c.call("session.create", {"title": "Source"}))["id"]
    await turn(c, sid, "u1", "a1")
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u2", "q two")})
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg("t2", "thinking aloud", role="assistant")})
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
        "a2", "the original answer", role="assistant", meta={"modelId": "m-x", "usage": {"input": 3}})})
    await turn(c, sid, "u3", "a3")  # after the selected reply: not part of the child
    await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u3"})
    return sid


async def test_assistant_edit_records_original_and_edited_tails_in_the_child(tmp_path):
    """Seed 003 §4.5: "A message-scoped fork copies only the canonical prefix through the selected message.
    Assistant Edit uses that child and records the original/edited response tails in the child's existing
    message_revisions store; the source transcript and source revisions are never rewritten." """
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await source(c)
            src_bytes = transcript_path(tmp_path, sid).read_bytes()
            src_revs = revisions_path(tmp_path, sid).read_bytes()
            got = await c.call("session.assistantEdit", {"sessionId": sid, "messageId": "a2", "blocks": EDIT,
                                                         "title": "Edited"})
            cid = got["session"]["id"]
            assert cid != sid and got["session"]["title"] == "Edited" and got["session"]["messageCount"] == 5
            root = derived_id(cid, "message", "u2")
            assert got["rootUserId"] == root
            assert got["originalMessageId"] == derived_id(cid, "message", "a2")
            assert got["messageId"] not in (got["originalMessageId"], "a2")
            assert (got["revisionIndex"], got["originalRevisionIndex"]) == (2, 1)
            child = await full(c, cid)
            assert texts(child) == ["q u1 ", "a a1 ", "q two", "thinking aloud", "the edited answer"]
            edited = child["messages"][-1]
            assert edited["id"] == got["messageId"] and edited["role"] == "assistant"
            assert edited["meta"] == {"modelId": "m-x", "assistantEdit": {"originalMessageId":
                                                                         got["originalMessageId"]}}
            stamp = child["messages"][2]["meta"]
            assert (stamp["revisionCount"], stamp["activeRevision"], stamp["revisionRootId"]) == (2, 2, root)
            revs = (await c.call("session.listRevisions", {"sessionId": cid}))["revisions"]
            assert [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [
                (root, 1, False, 3), (root, 2, True, 3)]
            # the original tail is a real revision: activating it brings the original reply back
            back = await c.call("session.activateRevision", {"sessionId": cid, "rootUserId": root,
                                                             "revisionIndex": 1})
            assert [r["isActive"] for r in back["revisions"]] == [True, False]
            assert texts(await full(c, cid))[-1] == "the original answer"
            again = await c.call("session.activateRevision", {"sessionId": cid, "rootUserId": root,
                                                              "revisionIndex": 2})
            assert [r["isActive"] for r in again["revisions"]] == [False, True]
            assert texts(await full(c, cid))[-1] == "the edited answer"
            # the source is never rewritten
            assert transcript_path(tmp_path, sid).read_bytes() == src_bytes
            assert revisions_path(tmp_path, sid).read_bytes() == src_revs
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, cid)
            assert query(tmp_path, "SELECT COUNT(*) FROM message_revisions WHERE session_id = ?", sid) == [(1,)]


async def test_assistant_edit_leaves_the_source_byte_for_byte(tmp_path):
    """Seed 003 §4.5: "the source transcript and source revisions are never rewritten" — also its index rows."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await source(c)
            await index_caught_up(host)
            before = (transcript_path(tmp_path, sid).read_bytes(), revisions_path(tmp_path, sid).read_bytes(),
                      query(tmp_path, "SELECT * FROM messages WHERE session_id = ? ORDER BY seq", sid),
                      query(tmp_path, "SELECT * FROM message_revisions WHERE session_id = ?", sid),
                      await full(c, sid))
            await c.call("session.assistantEdit", {"sessionId": sid, "messageId": "a1", "blocks": EDIT})
            await index_caught_up(host)
            after = (transcript_path(tmp_path, sid).read_bytes(), revisions_path(tmp_path, sid).read_bytes(),
                     query(tmp_path, "SELECT * FROM messages WHERE session_id = ? ORDER BY seq", sid),
                     query(tmp_path, "SELECT * FROM message_revisions WHERE session_id = ?", sid),
                     await full(c, sid))
            assert after == before


async def test_assistant_edit_retry_is_a_replay(tmp_path):
    """ARCHITECTURE "Command receipts": "A retry with the same key returns the stored response and does nothing
    else; the same key with a different fingerprint fails with IDEMPOTENCY_CONFLICT." """
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await source(c)
            p = {"sessionId": sid, "messageId": "a2", "blocks": EDIT, "submissionId": "edit-1"}
            first = await c.call("session.assistantEdit", p)
            files = session_files(tmp_path)
            second = await c.call("session.assistantEdit", p)
            assert second == first
            assert session_files(tmp_path) == files
            await index_caught_up(host)
            assert len(query(tmp_path, "SELECT id FROM sessions")) == 2
            assert query(tmp_path, "SELECT COUNT(*) FROM message_revisions WHERE session_id = ?",
                         first["session"]["id"]) == [(2,)]
            with pytest.raises(RpcError) as err:
                await c.call("session.assistantEdit", {**p, "blocks": [{"type": "text", "text": "else"}]})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"


@pytest.mark.parametrize(("params", "code"), [
    ({"messageId": "u2"}, "INVALID_PARAMS"),  # a user message is not an assistant reply
    ({"messageId": "nope"}, "MESSAGE_NOT_FOUND"),
    ({"messageId": "a2", "blocks": []}, "INVALID_PARAMS"),
    ({"messageId": "lead"}, "INVALID_PARAMS"),  # no user message before it: no response tail to record
])
async def test_assistant_edit_bad_input_is_a_clear_error_changing_nothing(tmp_path, params, code):
    """Seed 003 §4.5: "Assistant Edit uses that child" — of an assistant reply; anything else (a user message,
    an unknown id, empty content, a reply no user turn roots) is refused with a clear error and changes
    nothing (STYLE: bad input gets a clear error and changes nothing)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("lead", "hi", role="assistant")})
            await turn(c, sid, "u2", "a2")
            await index_caught_up(host)
            files = {p.name: p.read_bytes() for p in (tmp_path / "sessions").iterdir()}
            sessions = query(tmp_path, "SELECT id, updated_at FROM sessions")
            with pytest.raises(RpcError) as err:
                await c.call("session.assistantEdit", {"sessionId": sid, "blocks": EDIT, **params})
            assert err.value.data_code == code
            assert err.value.message
            assert {p.name: p.read_bytes() for p in (tmp_path / "sessions").iterdir()} == files
            await index_caught_up(host)
            assert query(tmp_path, "SELECT id, updated_at FROM sessions") == sessions
            assert query(tmp_path, "SELECT COUNT(*) FROM message_revisions") == [(0,)]


FAULTS = ["fork.after_copy", "assistantEdit.revisions.after_tmp_fsync", "assistantEdit.revisions.after_rename",
          "fork.after_tmp_write", "fork.after_rename", "assistantEdit.before_index",
          "assistantEdit.index_before_commit", "session.assistantEdit.before_commit"]


@pytest.mark.parametrize("point", FAULTS)
async def test_failed_assistant_edit_leaves_no_child_files_or_rows(tmp_path, point):
    """RELIABILITY: a handled failure at any step leaves nothing behind (no child transcript, no child
    revisions file, no rows); the source is untouched and the next edit works."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            pasted = tmp_path / "scratch" / sid / "pasted"
            pasted.mkdir(parents=True)
            (pasted / "a.txt").write_text("A")
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", f"see {pasted}/a.txt")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", "x", role="assistant")})
            await index_caught_up(host)
            files, sessions = session_files(tmp_path), query(tmp_path, "SELECT id FROM sessions")
            scratch = sorted(p.name for p in (tmp_path / "scratch").iterdir())
            host.faults.add(point, nth=1, action="raise")
            with pytest.raises(RpcError):
                await c.call("session.assistantEdit", {"sessionId": sid, "messageId": "a1", "blocks": EDIT})
            host.faults.clear()
            assert session_files(tmp_path) == files
            await index_caught_up(host)
            assert query(tmp_path, "SELECT id FROM sessions") == sessions
            assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == scratch
            assert query(tmp_path, "SELECT COUNT(*) FROM message_revisions") == [(0,)]
            got = await c.call("session.assistantEdit", {"sessionId": sid, "messageId": "a1", "blocks": EDIT})
            assert (tmp_path / "scratch" / got["session"]["id"] / "pasted" / "a.txt").exists()


@pytest.mark.parametrize("point", ["assistantEdit.revisions.after_rename", "fork.after_rename",
                                   "session.assistantEdit.before_commit"])
async def test_sigkill_during_assistant_edit_then_retry_has_exactly_one_effect(tmp_path, point):
    """ARCHITECTURE "Receipts ride with their effect": "A retry after a SIGKILL at any point then gets the
    original response and the effect happens once." — one child, its two revisions, the source unchanged."""
    proc = start_host_process(tmp_path, env={"RT_CRASHPOINT": f"{point}:1:kill"})
    p = {"sessionId": "src", "messageId": "a1", "blocks": EDIT, "submissionId": "edit-kill"}
    try:
        with trio.fail_after(30):
            async with open_client(proc.url, proc.token, client_id="crash") as c:
                await c.call("session.create", {"sessionId": "src", "title": "S"})
                await turn(c, "src", "u1", "a1")
                with pytest.raises(ClientClosed):  # the host dies under the call
                    await c.call("session.assistantEdit", p)
        assert proc.reap(30) == -signal.SIGKILL
    finally:
        proc.kill9()
        proc.proc.communicate()
    src_bytes = transcript_path(tmp_path, "src").read_bytes()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, client_id="crash") as c:
            first = await c.call("session.assistantEdit", p)
            assert await c.call("session.assistantEdit", p) == first
            await index_caught_up(host)
            cid = first["session"]["id"]
            assert sorted(r[0] for r in query(tmp_path, "SELECT id FROM sessions")) == sorted(["src", cid])
            assert session_files(tmp_path) == {"src.jsonl", f"{cid}.jsonl", f"{cid}.revisions.jsonl"}
            revs = (await c.call("session.listRevisions", {"sessionId": cid}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"]) for r in revs] == [(1, False), (2, True)]
            assert texts(await full(c, cid)) == ["q u1 ", "the edited answer"]
            assert transcript_path(tmp_path, "src").read_bytes() == src_bytes
            assert_index_matches_file(tmp_path, cid)
