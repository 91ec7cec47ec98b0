"""Seed 000 audited by an outsider writing the hidden tests: the receipt, tree, tombstone and attachment
statements no other test pinned, each checked black-box against a real ``pi-host serve`` process over the
WebSocket JSON-RPC protocol (protocol/README.md). Each test quotes the sentence it checks."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, RpcError, open_client
from tests.acceptance.outsiderkit import code_of, ctx_ids, data_dir, error_of, nested_branches, real_host, say
from tests.hostkit import msg


async def rows(c: HostClient, sid: str) -> list[tuple[str, bool]]:
    page = await c.call("session.get", {"sessionId": sid})
    return [(m["id"], bool(m.get("deleted"))) for m in page["messages"]]


async def new_session(c: HostClient, **params: Any) -> str:
    return str((await c.call("session.create", params))["id"])


# ------------------------------------------------------------------------------------- receipts (§2.4)

async def test_a_keyed_append_retried_after_a_regenerate_cut_it_answers_its_first_answer_and_appends_nothing(
        tmp_path: Path) -> None:
    """Seed 000 §2.4: "The receipt key is clientId + submissionId. It stores command type, status, terminal
    response ... A completed receipt cannot be overwritten." + README §4: "A retry with the same key returns
    the stored response and has no other effect. This holds across reconnects and host restarts." A reply
    appended under a key, then cut by a regenerate (§3.2): its retry answers the first answer and does not
    bring the reply back into the live branch, before and after a SIGKILL; the same key with another
    message is IDEMPOTENCY_CONFLICT and writes nothing."""
    data = data_dir(tmp_path)
    key = {"submissionId": "reply-1"}
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = await new_session(c)
            await say(c, sid, "u1", "question")
            first = await c.call("session.appendMessage", {"sessionId": sid, **key,
                                                           "message": msg("a1", "first reply", role="assistant")})
            assert first["replayed"] is False and first["message"]["seq"] == 2
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            retry = {"sessionId": sid, **key, "message": msg("a1", "first reply", role="assistant")}
            assert await c.call("session.appendMessage", retry) == first
            assert await ctx_ids(c, sid) == ["u1"]
            other = {"sessionId": sid, **key, "message": msg("a1b", "another reply", role="assistant")}
            assert await code_of(c, "session.appendMessage", other) == "IDEMPOTENCY_CONFLICT"
            assert await ctx_ids(c, sid) == ["u1"]
        async with real_host(data) as (_proc, c):
            assert await c.call("session.appendMessage", retry) == first
            assert await ctx_ids(c, sid) == ["u1"]
            nodes = (await c.call("session.tree", {"sessionId": sid}))["nodes"]
            assert [n["messageId"] for n in nodes if n["role"] == "assistant"] == ["a1"]  # archived only


async def test_a_keyed_append_retried_after_its_message_was_tombstoned_leaves_it_tombstoned(tmp_path: Path) -> None:
    """Seed 000 §2.4 + §3.3: the retry of a completed append answers its stored response and changes nothing:
    a message the user deleted since stays deleted (hidden from the context, still read back with
    ``deleted``), before and after a SIGKILL; a keyed delete retried after a restore answers ``deleted:
    true`` and does not delete again."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = await new_session(c)
            append = {"sessionId": sid, "submissionId": "ask", "message": msg("u1", "question")}
            first = await c.call("session.appendMessage", append)
            await say(c, sid, "a1", "reply", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u1"})
            assert await c.call("session.appendMessage", append) == first
            assert await rows(c, sid) == [("u1", True), ("a1", False)]
            assert await ctx_ids(c, sid) == ["a1"]
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "u1"})
            delete = {"sessionId": sid, "messageId": "a1", "submissionId": "hide-reply"}
            assert await c.call("session.deleteMessage", delete) == {"messageId": "a1", "deleted": True}
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1"})
        async with real_host(data) as (_proc, c):
            assert await c.call("session.appendMessage", append) == first
            assert await c.call("session.deleteMessage", delete) == {"messageId": "a1", "deleted": True}
            assert await rows(c, sid) == [("u1", False), ("a1", False)]
            assert await ctx_ids(c, sid) == ["u1", "a1"]


async def test_keyed_retries_after_a_thread_delete_answer_from_their_receipts_and_only_for_their_client(
        tmp_path: Path) -> None:
    """Seed 000 §3.3: "thread.delete ... deletes Thread nodes ... The receipt remains so a lost
    acknowledgement can be replayed after worker restart." + §2.4 "The receipt key is clientId +
    submissionId": after the delete, the keyed create, append, tombstone and delete of that thread replay
    their stored answers (after a SIGKILL too) and bring nothing back; the same keys from another client, or
    the same calls unkeyed, meet a deleted session."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            create = {"submissionId": "k-create", "title": "doomed"}
            made = await c.call("session.create", create)
            sid = made["id"]
            append = {"sessionId": sid, "submissionId": "k-append", "message": msg("u1", "question")}
            appended = await c.call("session.appendMessage", append)
            hide = {"sessionId": sid, "messageId": "u1", "submissionId": "k-hide"}
            hidden = await c.call("session.deleteMessage", hide)
            delete = {"sessionId": sid, "submissionId": "k-delete"}
            deleted = await c.call("session.delete", delete)
            assert deleted == {"sessionId": sid, "deleted": True}
            calls = [("session.create", create, made), ("session.appendMessage", append, appended),
                     ("session.deleteMessage", hide, hidden), ("session.delete", delete, deleted)]
            for method, params, answer in calls:
                assert await c.call(method, params) == answer, method
            assert (await c.call("session.list", {}))["sessions"] == []
            async with open_client(proc.url, proc.token, client_id="someone-else", client_kind="ui") as other:
                for method, params, _ in calls[1:]:
                    assert await code_of(other, method, params) == "SESSION_NOT_FOUND", method
            for method, params, _ in calls[1:]:
                unkeyed = {k: v for k, v in params.items() if k != "submissionId"}
                assert await code_of(c, method, unkeyed) == "SESSION_NOT_FOUND", method
        async with real_host(data) as (_proc, c):
            for method, params, answer in calls:
                assert await c.call(method, params) == answer, method
            assert (await c.call("session.list", {}))["sessions"] == []
            assert await code_of(c, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"


async def test_one_key_in_one_batch_runs_once_conflicts_on_other_content_and_a_failure_keeps_no_receipt(
        tmp_path: Path) -> None:
    """Seed 000 §2.4: the receipt "stores command type, status, terminal response, and an optional SHA-256
    request fingerprint" + README §4: two requests with one key that arrive together run once (the second
    gets the first's response); the key with other params or another method is IDEMPOTENCY_CONFLICT and
    changes nothing; "Only a success is stored": a keyed tombstone of an unknown message is
    MESSAGE_NOT_FOUND, and the same key then works for the message once it exists."""
    with trio.fail_after(60):
        async with real_host(data_dir(tmp_path)) as (_proc, c):
            sid = await new_session(c, title="kept")
            same = {"sessionId": sid, "submissionId": "k", "message": msg("u1", "hello")}
            hide = {"sessionId": sid, "messageId": "u2", "submissionId": "k-hide"}
            got = await c.batch([
                ("session.appendMessage", same),
                ("session.appendMessage", {**same, "message": msg("u9", "other")}),
                ("session.appendMessage", same),
                ("session.rename", {"sessionId": sid, "title": "renamed", "submissionId": "k"}),
                ("session.deleteMessage", hide),
            ])
            codes = [r.data_code if isinstance(r, RpcError) else None for r in got]
            assert codes == [None, "IDEMPOTENCY_CONFLICT", None, "IDEMPOTENCY_CONFLICT", "MESSAGE_NOT_FOUND"]
            assert got[0] == got[2] and got[0]["replayed"] is False
            await say(c, sid, "u2", "second")
            assert await c.call("session.deleteMessage", hide) == {"messageId": "u2", "deleted": True}
            assert await rows(c, sid) == [("u1", False), ("u2", True)]
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["title"] == "kept"


# ------------------------------------------------------------------------------------ tree (§3.1, §2.1)

async def test_an_append_takes_the_next_sequence_moves_the_leaf_and_the_thread_timestamp(tmp_path: Path) -> None:
    """Seed 000 §3.1: "appendNode assigns the next sequence, writes the node, moves thread.leafId, and updates
    the Thread timestamp." + §2.1: the conversation list reads thread metadata: each append gets seq n + 1,
    becomes ``activeLeafId``, raises the session's ``updatedAt``, and moves the session to the top of
    ``session.list`` (newest first); after a SIGKILL the same holds."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            older = await new_session(c, title="older")
            newer = await new_session(c, title="newer")
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [newer, older]
            before = (await c.call("session.get", {"sessionId": older}))["session"]["updatedAt"]
            for n, (mid, role) in enumerate((("u1", "user"), ("a1", "assistant"), ("u2", "user")), start=1):
                await trio.sleep(0.002)  # a later millisecond than the step before
                got = await say(c, older, mid, f"text {n}", role)
                assert got["message"]["seq"] == n
                assert (await c.call("session.tree", {"sessionId": older}))["activeLeafId"] == mid
                now = (await c.call("session.get", {"sessionId": older}))["session"]["updatedAt"]
                assert now > before
                before = now
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [older, newer]
        async with real_host(data) as (_proc, c):
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [older, newer]
            assert (await c.call("session.tree", {"sessionId": older}))["activeLeafId"] == "u2"
            assert (await say(c, older, "a2", "text 4", "assistant"))["message"]["seq"] == 4


# -------------------------------------------------------------------------------- tombstones (§3.3, §2.3)

async def test_a_blob_only_a_tombstoned_message_holds_survives_gc_and_goes_with_the_thread(tmp_path: Path) -> None:
    """Seed 000 §3.3: "A message tombstone sets payload.deleted = true ... Physical deletion is reserved for an
    entire Thread or quota cleanup" (a tombstone is reversible: README ``session.deleteMessage``), and
    "thread.delete ... deletes Thread nodes, attachments ...": a GC (grace 0) right after the only message
    that refers to a blob was tombstoned sweeps nothing (the block reads back not evicted when the message
    is restored); once the thread is deleted the next GC sweeps it."""
    with trio.fail_after(60):
        async with real_host(data_dir(tmp_path)) as (_proc, c):
            await c.call("settings.set", {"ns": "app", "key": "attachmentUnreferencedGraceMs", "value": 0})
            sid = await new_session(c)
            put = await c.call("attachments.put", {"name": "shot.png", "mimeType": "image/png", "kind": "screenshot",
                                                   "dataBase64": base64.b64encode(b"pixels").decode()})
            block = {"type": "attachment", "kind": "image", "name": "shot.png", "ref": put["ref"],
                     "mimeType": "image/png", "size": put["size"]}
            await say(c, sid, "u1", "look", blocks=[{"type": "text", "text": "look"}, block])
            await say(c, sid, "a1", "seen", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u1"})
            gc = await c.call("attachments.gc", {})
            assert gc["unreferencedEvicted"] == [] and gc["evicted"] == []
            assert (await c.call("attachments.get", {"sha256": put["sha256"]}))["deletionState"] == "live"
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "u1"})
            ctx = (await c.call("session.context", {"sessionId": sid}))["messages"]
            (shown,) = [b for b in ctx[0]["blocks"] if b["type"] == "attachment"]
            assert shown["ref"] == put["ref"] and not shown.get("evicted")
            await c.call("session.delete", {"sessionId": sid})
            gc = await c.call("attachments.gc", {})
            assert gc["unreferencedEvicted"] == [put["sha256"]]
            assert (await c.call("attachments.get", {"sha256": put["sha256"]}))["deletionState"] == "evicted"


async def test_a_tombstoned_tool_row_is_not_found_by_the_tool_output_search_until_restored(tmp_path: Path) -> None:
    """Seed 000 §3.3 (a tombstone hides the message) + README "Searching tool output": "tombstoned rows and
    sessions in the trash never match" — ``search.query`` and ``search.sessions`` in the ``tools`` scope stop
    finding a tool row's output when it is deleted, and find it again once it is restored."""
    with trio.fail_after(60):
        async with real_host(data_dir(tmp_path)) as (_proc, c):
            sid = await new_session(c)
            await say(c, sid, "u1", "run it")
            await say(c, sid, "t1", "", "tool",
                      blocks=[{"type": "tool_result", "toolCallId": "call-1", "content": "ECONNREFUSED at db"}])

            async def found() -> tuple[list[str], int]:
                q = await c.call("search.query", {"query": "econnrefused", "scope": "tools"})
                s = await c.call("search.sessions", {"query": "econnrefused", "scope": "tools"})
                return [r["messageId"] for r in q["results"]], s["totalMessageMatches"]

            assert await found() == (["t1"], 1)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "t1"})
            assert await found() == ([], 0)
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "t1"})
            assert await found() == (["t1"], 1)


# ------------------------------------------------------------------------------ branch selector (§3.2)

async def test_switching_back_to_a_branch_lands_on_its_newest_descendant_even_after_an_older_was_chosen(
        tmp_path: Path) -> None:
    """Seed 000 §3.2: "The branch selector orders siblings by sequence and follows the newest default
    descendants when switching." Branch B of the first reply holds a regenerated second reply (b2, then the
    newer b2x); the user picks the older b2, goes on (q3, a3, then deletes q3), switches the first reply to A,
    then back to B: the history follows B's newest second reply b2x, not the b2 it left on. The b2 line
    stays one switch away with what grew on it (q3 still deleted). The same after a SIGKILL."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = await new_session(c)
            await nested_branches(c, sid)
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q2", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["q1", "b1", "q2", "b2"]
            await say(c, sid, "q3", "third question")
            await say(c, sid, "a3", "third reply", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "q3"})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q1", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["q1", "a1"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q1", "revisionIndex": 2})
            assert await ctx_ids(c, sid) == ["q1", "b1", "q2", "b2x"]
            t = await c.call("session.tree", {"sessionId": sid})
            assert t["activeLeafId"] == "b2x"
            seconds = [n for n in t["nodes"] if n.get("parentId") == "q2"]
            assert [(n["messageId"], n["active"]) for n in seconds] == [("b2", False), ("b2x", True)]
            listed = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "q2"}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"]) for r in listed] == [(1, False), (2, True)]
        async with real_host(data) as (_proc, c):
            assert await ctx_ids(c, sid) == ["q1", "b1", "q2", "b2x"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q2", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["q1", "b1", "q2", "b2", "a3"]
            assert await rows(c, sid) == [("q1", False), ("b1", False), ("q2", False), ("b2", False),
                                          ("q3", True), ("a3", False)]


# ------------------------------------------------------------------------------------- snapshots (§4)

def canonical_sha256(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


async def test_a_snapshot_digest_is_the_sha256_of_its_canonical_json_whatever_the_key_order(tmp_path: Path) -> None:
    """Seed 000 §4: "Before execution, runTurn stores normalized input and a versioned RunEnvironmentSnapshot
    with a SHA-256 integrity digest" + README "Turns": the stored snapshot (read back by
    ``session.turnEnvironment`` and ``session.context``'s ``turnContext``) hashes to the digest
    ``session.startTurn`` answered, as canonical JSON (sorted keys, compact, UTF-8); the same snapshot with
    its keys in another order is the same snapshot (starting the running turn again with it is a retry);
    another snapshot for it is CONFLICT; a version other than 1 and a secret value are INVALID_PARAMS;
    after a SIGKILL the digest still verifies."""
    data = data_dir(tmp_path)
    env = {"version": 1, "model": {"id": "m-1", "contextWindow": 200000}, "systemPrompt": "réponds en français ✓",
           "parameters": {"temperature": 0.5, "maxTokens": 512}, "credentialRefs": ["provider/p1"]}
    reordered = {"credentialRefs": ["provider/p1"], "parameters": {"maxTokens": 512, "temperature": 0.5},
                 "systemPrompt": "réponds en français ✓", "model": {"contextWindow": 200000, "id": "m-1"},
                 "version": 1}
    with trio.fail_after(60):
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, c):
            sid = await new_session(c)
            start = {"sessionId": sid, "turnId": "t1"}
            turn = await c.call("session.startTurn", {**start, "environment": env})
            digest = turn["environmentDigest"]
            assert await c.call("session.startTurn", {**start, "environment": reordered}) == turn
            assert await code_of(c, "session.startTurn", {**start, "environment": {**env, "systemPrompt": "x"}}) \
                == "CONFLICT"
            stored = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert stored["digest"] == digest == canonical_sha256(stored["snapshot"])
            assert stored["version"] == 1 and stored["snapshot"]["systemPrompt"] == env["systemPrompt"]
            assert (await c.call("session.context", {"sessionId": sid}))["turnContext"]["digest"] == digest
            for bad in ({**env, "version": 2}, {**env, "connection": {"apiKey": "sk-live-123"}}):
                assert await code_of(c, "session.startTurn", {"sessionId": sid, "turnId": "t2",
                                                              "environment": bad}) == "INVALID_PARAMS"
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, c):
            again = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert again == stored and canonical_sha256(again["snapshot"]) == digest


# ------------------------------------------------------------------------------------- approvals (§2)

async def test_keyed_answers_to_approvals_and_questions_replay_after_the_turn_and_a_late_one_keeps_no_receipt(
        tmp_path: Path) -> None:
    """Seed 000 §2 ("approvals, interactions | Pending and resolved user RPC state") + §2.4 (the receipt key is
    clientId + submissionId; a completed receipt cannot be overwritten) + README §10 ("Exactly one answer
    wins: a second one is CONFLICT with data.status; so is ... one after expiresAt") and §4 ("Only a success
    is stored"): a keyed answer retried after its turn ended replays its answer; the same key with another
    option is IDEMPOTENCY_CONFLICT; another UI sending the same key is a second answer (CONFLICT, the
    winner's status); a keyed answer past the deadline is CONFLICT ``expired`` and so is its retry; the
    sidecar may not answer (PERMISSION_DENIED)."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, agent), \
                open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as ui, \
                open_client(proc.url, proc.token, client_id="ui-2", client_kind="ui") as ui2:
            sid = await new_session(ui)
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await agent.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u", "go")})
            ask = {"sessionId": sid, "turnId": "t1", "tool": "Bash", "argsSummary": "ls", "risk": "low"}
            rid = (await agent.call("approvals.request", {**ask, "toolCallId": "c1"}))["request"]["requestId"]
            allow = {"sessionId": sid, "requestId": rid, "optionId": "allow_once", "submissionId": "answer-1"}
            won = await ui.call("approvals.respond", allow)
            assert won["request"]["status"] == "allowed"
            assert await code_of(ui, "approvals.respond", {**allow, "optionId": "deny"}) == "IDEMPOTENCY_CONFLICT"
            assert await code_of(agent, "approvals.respond", allow) == "PERMISSION_DENIED"
            code, data = await error_of(ui2, "approvals.respond", allow)  # not a retry: another client's answer
            assert code == "CONFLICT" and data["status"] == "allowed"

            question = {"sessionId": sid, "turnId": "t1", "question": "which?",
                        "choices": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]}
            qid = (await agent.call("interactions.request", question))["request"]["requestId"]
            pick = {"sessionId": sid, "requestId": qid, "answer": {"choiceIds": ["a"]}, "submissionId": "answer-2"}
            answered = await ui.call("interactions.respond", pick)
            assert answered["request"]["status"] == "answered"
            assert await code_of(ui, "interactions.respond", {**pick, "answer": {"choiceIds": ["b"]}}) \
                == "IDEMPOTENCY_CONFLICT"

            await agent.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            assert await ui.call("approvals.respond", allow) == won
            assert await ui.call("interactions.respond", pick) == answered

            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            deadline = (await agent.call("approvals.request", {**ask, "turnId": "t2", "toolCallId": "c2",
                                                                "expiresAt": int(time.time() * 1000) + 300}))
            late = {"sessionId": sid, "requestId": deadline["request"]["requestId"], "optionId": "allow_once",
                    "submissionId": "answer-3"}
            await trio.sleep(0.6)
            for _ in range(2):  # the refusal left no receipt: the retry is refused the same way
                code, data = await error_of(ui, "approvals.respond", late)
                assert code == "CONFLICT" and data["status"] == "expired"
            assert (await ui.call("approvals.pending", {"sessionId": sid}))["pending"] == []
