"""Seed 000 read by a fresh outsider, third pass (the tree, tombstones, snapshots, approvals, attachments and
thread delete; receipts §2.4 had their own pass): the probes the first two passes (test_seed000_outsider.py,
test_seed000_adversarial.py) do not make — a tombstone inside an archived branch across a SIGKILL and a lost
database, a thread delete killed after its log line and retried with its key, a snapshot of a turn killed
mid-stream, approvals whose deadline passes while the host is down, eviction killed between marking and
unlinking, and bad input that must change nothing. Every test runs against real ``pi-host serve``
processes (SIGKILL between steps) and speaks only the wire protocol of protocol/README.md."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, open_client
from tests.acceptance.outsiderkit import code_of, ctx_ids, data_dir, error_of, file_block, put_file, real_host, say
from tests.hostkit import HostProcess, call_killed_at, msg


def lose_database(data: Path) -> None:
    """The index database is gone: every ``pi.sqlite*`` file is removed."""
    for path in data.glob("pi.sqlite*"):
        path.unlink()


async def tree(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.tree", {"sessionId": sid})
    return result


def now_ms() -> int:
    return int(time.time() * 1000)


# ------------------------------------------------------------------------ tombstones x archived branches (§3.3)

async def test_a_tombstone_inside_an_archived_branch_survives_kill9_and_a_lost_database(tmp_path: Path) -> None:
    """Seed 000 §3.3: "A message tombstone sets payload.deleted = true. Context derivation skips it and
    reconnects its children to the visible ancestor", and §1 "recovery replays nodes". The prompt ``u2`` is
    only in an archived branch (the reply before it was regenerated) when it is tombstoned; after a SIGKILL
    and the loss of the database, switching to that branch shows it deleted (its reply hangs under the
    visible ancestor), the live branch is untouched, and restoring it brings it back in place."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            for mid, text, role in (("q", "q1", "user"), ("r0", "reply A", "assistant"), ("u2", "q2", "user"),
                                    ("a2", "reply A2", "assistant")):
                await say(c, sid, mid, text, role)
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "r0", "mode": "regenerate"})
            await say(c, sid, "r1", "reply B", "assistant")
            assert await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"}) == {
                "messageId": "u2", "deleted": True}
            assert await ctx_ids(c, sid) == ["q", "r1"]
        lose_database(data)
        async with real_host(data) as (_proc, c):
            assert await ctx_ids(c, sid) == ["q", "r1"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["q", "r0", "a2"]
            t = await tree(c, sid)
            nodes = {n["id"]: n for n in t["nodes"]}
            assert nodes["u2"]["deleted"] and t["activeLeafId"] == "a2"
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "u2"})
            assert await ctx_ids(c, sid) == ["q", "r0", "u2", "a2"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q", "revisionIndex": 2})
            assert await ctx_ids(c, sid) == ["q", "r1"]


# ------------------------------------------------------------------------------------- bad input (all §)

async def test_bad_input_gets_a_clear_code_and_changes_nothing(tmp_path: Path) -> None:
    """Seed 000 §3.1-§3.4, §2.3, approvals: every malformed or impossible request is refused with a code that
    says why, and the tree, the context, the pending approvals and the attachment estimate are as before."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "q")
            await say(c, sid, "a1", "r", "assistant")
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await put_file(c, b"x")
            before_tree = await tree(c, sid)
            before_ctx = await ctx_ids(c, sid)
            before_est = await c.call("attachments.estimate", {})
            before_pending = await c.call("approvals.pending", {})
            refusals: list[tuple[str, dict[str, Any], set[str]]] = [
                ("session.deleteMessage", {"sessionId": sid, "messageId": "nope"}, {"MESSAGE_NOT_FOUND"}),
                ("session.restoreMessage", {"sessionId": sid, "messageId": "nope"}, {"MESSAGE_NOT_FOUND"}),
                ("session.deleteMessage", {"sessionId": sid, "messageId": "bad id!"}, {"INVALID_PARAMS"}),
                ("session.deleteMessage", {"sessionId": "no-such", "messageId": "u1"}, {"SESSION_NOT_FOUND"}),
                ("session.truncateFrom", {"sessionId": sid, "messageId": "nope", "mode": "regenerate"},
                 {"MESSAGE_NOT_FOUND"}),
                ("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "sideways"},
                 {"INVALID_PARAMS"}),
                ("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 7},
                 {"NOT_FOUND", "INVALID_PARAMS", "MESSAGE_NOT_FOUND"}),
                ("session.delete", {"sessionId": "no-such"}, {"SESSION_NOT_FOUND"}),
                ("attachments.put", {"name": "f", "mimeType": "a/b", "dataBase64": "***not base64***"},
                 {"INVALID_PARAMS"}),
                ("attachments.ref", {"sha256": "0" * 64, "sessionId": sid}, {"NOT_FOUND"}),
                ("approvals.request", {"sessionId": sid, "turnId": "not-running", "tool": "Bash", "risk": "low"},
                 {"CONFLICT", "NOT_FOUND"}),
                ("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash", "risk": "extreme"},
                 {"INVALID_PARAMS"}),
                ("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash", "risk": "low",
                                       "options": [{"id": "ok", "label": "OK", "decision": "allow",
                                                    "remember": "once"}]}, {"INVALID_PARAMS"}),
                ("session.turnEnvironment", {"turnId": "nope"}, {"NOT_FOUND"}),
                ("session.startTurn", {"sessionId": sid, "turnId": "t2", "environment": {"version": "one"}},
                 {"INVALID_PARAMS"}),
            ]
            for method, params, codes in refusals:
                assert await code_of(c, method, params) in codes, (method, params)
            async with real_host_client(proc, "ui-1", "ui") as ui:
                assert await code_of(ui, "approvals.respond", {"sessionId": sid, "requestId": "apr_nope",
                                                               "optionId": "deny"}) == "NOT_FOUND"
            assert await tree(c, sid) == before_tree
            assert await ctx_ids(c, sid) == before_ctx
            assert await c.call("attachments.estimate", {}) == before_est
            assert await c.call("approvals.pending", {}) == before_pending


def real_host_client(proc: HostProcess, client_id: str, kind: str) -> Any:
    """Another connection to the same host process."""
    return open_client(proc.url, proc.token, client_id=client_id, client_kind=kind)


# ---------------------------------------------------------------------------------------- append (§3.1)

async def test_an_append_moves_the_leaf_and_the_thread_timestamp_and_both_survive_kill9(tmp_path: Path) -> None:
    """Seed 000 §3.1: "appendNode assigns the next sequence, writes the node, moves thread.leafId, and updates
    the Thread timestamp." — the list row's updatedAt moves with each acknowledged append, and after a
    SIGKILL and a lost database the leaf is what was acknowledged and the timestamp still the append's."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            created = (await c.call("session.get", {"sessionId": sid}))["session"]["updatedAt"]
            await trio.sleep(0.01)
            await say(c, sid, "u1", "q")
            await trio.sleep(0.01)
            await say(c, sid, "a1", "r", "assistant")
            row = next(s for s in (await c.call("session.list", {}))["sessions"] if s["id"] == sid)
            assert row["updatedAt"] > created
            assert (await tree(c, sid))["activeLeafId"] == "a1"
        lose_database(data)
        async with real_host(data) as (_proc, c):
            again = next(s for s in (await c.call("session.list", {}))["sessions"] if s["id"] == sid)
            # rebuilt from the files: the newest message's stamp, which the acknowledged time (taken once the
            # line was durable) may pass by the fsync's milliseconds; never later, never before the append
            assert created < again["updatedAt"] <= row["updatedAt"]
            assert (await tree(c, sid))["activeLeafId"] == "a1"
            assert again["messageCount"] == 2


# ------------------------------------------------------------------------------------- thread delete (§3.3)

async def test_a_thread_delete_killed_after_its_log_line_finishes_on_a_keyed_retry(tmp_path: Path) -> None:
    """Seed 000 §3.3: "thread.delete ... deletes Thread nodes, attachments, Runs, approvals, interactions, and
    metadata in one transaction with the command receipt acknowledgement. The receipt remains so a lost
    acknowledgement can be replayed after worker restart." The host dies after the delete is logged and before
    it answers; the retry with the same key answers ``deleted: true`` (twice alike), and nothing of the thread
    is left behind — not its pending approval or question, not its snapshot, not its attachment references;
    the other thread keeps all of its own."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            keep = (await c.call("session.create", {}))["id"]
            blob = await put_file(c, b"d")
            for s, turn in ((sid, "t-del"), (keep, "t-keep")):
                await c.call("session.appendMessage", {"sessionId": s, "message": msg(
                    f"m-{turn}", "see", blocks=[file_block(blob)])})
                await c.call("attachments.ref", {"sha256": blob["sha256"], "sessionId": s,
                                                 "messageId": f"m-{turn}"})
                await c.call("session.startTurn", {"sessionId": s, "turnId": turn, "environment": {"version": 1}})
                await c.call("approvals.request", {"sessionId": s, "turnId": turn, "tool": "Bash", "risk": "low"})
                await c.call("interactions.request", {"sessionId": s, "turnId": turn, "question": "?",
                                                      "allowFreeText": True})
        params = {"sessionId": sid, "submissionId": "del-thread"}
        await call_killed_at(data, "session_delete.after_log", "session.delete", params, client_id="ui-1")
        async with real_host(data, client_id="ui-1") as (_proc, c):
            first = await c.call("session.delete", params)
            assert first == {"sessionId": sid, "deleted": True}
            assert await c.call("session.delete", params) == first
            assert await code_of(c, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [keep]
            assert await code_of(c, "session.turnEnvironment", {"turnId": "t-del"}) == "NOT_FOUND"
            assert (await c.call("session.turnEnvironment", {"turnId": "t-keep"}))["snapshot"]["version"] == 1
            refs = (await c.call("attachments.get", {"sha256": blob["sha256"]}))["references"]
            assert {r["sessionId"] for r in refs} == {keep}
            # pending requests never survive a restart (README), and none of the deleted thread's come back
            for method in ("approvals.pending", "interactions.pending"):
                assert all(p["sessionId"] != sid for p in (await c.call(method, {}))["pending"])
            assert await code_of(c, "session.startTurn", {"sessionId": sid}) == "SESSION_NOT_FOUND"


# ------------------------------------------------------------------------------------------ snapshots (§4)

async def test_a_snapshot_of_a_turn_killed_mid_stream_still_verifies_and_is_the_histories_turn_context(
        tmp_path: Path) -> None:
    """Seed 000 §4: "Before execution, runTurn stores normalized input and a versioned RunEnvironmentSnapshot
    with a SHA-256 integrity digest" and recovery checks it. A turn is
    SIGKILLed mid-stream (a checkpoint saved); after the restart its snapshot reads back under the digest
    startTurn answered, verifyEnvironment passes, the history's Turn context is that snapshot, and a second
    startTurn of the same turn id with another model does not replace it."""
    data = data_dir(tmp_path)
    env = {"version": 1, "connection": {"baseUrl": "https://api.example.test", "apiKey": {"ref": "provider/p"}},
           "model": {"id": "m-1"}, "systemPrompt": "be brief", "credentialRefs": ["provider/p"]}
    with trio.fail_after(90):
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, c):
            await c.call("secrets.set", {"ref": "provider/p", "value": "the-value"})
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "go")
            started = await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-mid", "environment": env})
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t-mid",
                                                         "message": msg("x1", "half a repl", role="assistant")})
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, c):
            back = await c.call("session.turnEnvironment", {"turnId": "t-mid"})
            assert back["digest"] == started["environmentDigest"]
            assert back["snapshot"]["systemPrompt"] == "be brief"
            ctx = await c.call("session.context", {"sessionId": sid})
            assert ctx["turnContext"]["turnId"] == "t-mid"
            assert ctx["turnContext"]["digest"] == started["environmentDigest"]
            assert ctx["turnContext"]["snapshot"]["model"] == {"id": "m-1"}
            verified = await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t-mid"})
            assert verified["digest"] == started["environmentDigest"]
            code, _ = await error_of(c, "session.startTurn", {"sessionId": sid, "turnId": "t-mid",
                                                              "environment": {**env, "model": {"id": "m-2"}}})
            assert code is not None  # the turn id is taken: its snapshot is not replaced
            assert (await c.call("session.turnEnvironment", {"turnId": "t-mid"}))["digest"] == back["digest"]


# ------------------------------------------------------------------------------------ approvals x restart

async def test_an_approval_whose_deadline_passes_while_the_host_is_down_is_not_pending_and_refuses_answers(
        tmp_path: Path) -> None:
    """Seed 000 §2 (approvals: pending and resolved user RPC state) and README "Tool permissions": pending
    requests never survive a restart, and an answer after ``expiresAt`` is CONFLICT. One approval's deadline
    passes while the host is down, another's is still ahead: after the restart neither is pending, both
    refuse an answer with CONFLICT naming a terminal status, and neither lets a deny through."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            soon = now_ms() + 1500
            short = (await c.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash",
                                                        "risk": "high", "expiresAt": soon}))["request"]
            long = (await c.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Edit",
                                                       "risk": "high", "expiresAt": now_ms() + 3_600_000}))[
                "request"]
            assert short["status"] == long["status"] == "pending"
        await trio.sleep(max(0.0, (soon - now_ms()) / 1000 + 0.2))
        async with real_host(data, client_id="ui-1") as (_proc, ui):
            assert (await ui.call("approvals.pending", {"sessionId": sid}))["pending"] == []
            statuses = {}
            for req in (short, long):
                code, err = await error_of(ui, "approvals.respond", {"sessionId": sid,
                                                                     "requestId": req["requestId"],
                                                                     "optionId": "deny"})
                assert code == "CONFLICT", (req, code, err)
                statuses[req["tool"]] = err.get("status")
            assert statuses["Edit"] == "interrupted"
            assert statuses["Bash"] == "expired"  # its deadline came before the restart


# ----------------------------------------------------------------------------------- attachments (§2.3, §5)

async def test_eviction_killed_between_marking_and_unlinking_finishes_on_retry_and_the_refs_stay_marked(
        tmp_path: Path) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes." + §5 "removes the oldest attachments
    outside the active Thread". The host dies after marking and before unlinking; after the restart a keyed
    retry of the gc answers the same eviction, the evicted blob (the oldest outside the active thread) is
    marked deleted with its reference marked, and the active thread's older blob and the newer one live."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data) as (_proc, c):
            active = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            in_active = await put_file(c, b"A")  # the oldest of all, but in the active thread
            oldest_out, newer_out = await put_file(c, b"O"), await put_file(c, b"N")
            await c.call("session.appendMessage", {"sessionId": active, "message": msg("k1", "x",
                                                                                       blocks=[file_block(in_active)])})
            for mid, blob in (("o1", oldest_out), ("o2", newer_out)):
                await c.call("session.appendMessage", {"sessionId": other, "message": msg(mid, "x",
                                                                                          blocks=[file_block(blob)])})
                await c.call("attachments.ref", {"sha256": blob["sha256"], "sessionId": other, "messageId": mid})
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 2500})
        params = {"activeSessionId": active, "submissionId": "gc-1"}
        await call_killed_at(data, "attachments.gc.after_mark", "attachments.gc", params, client_id="outsider")
        async with real_host(data) as (_proc, c):
            gc = await c.call("attachments.gc", params)
            assert gc["evicted"] == [oldest_out["sha256"]]
            assert await c.call("attachments.gc", params) == gc
            gone = await c.call("attachments.get", {"sha256": oldest_out["sha256"]})
            assert gone["deletionState"] == "evicted"
            assert [(r["sessionId"], r["messageId"], r["evicted"]) for r in gone["references"]] == [
                (other, "o1", True)]
            for blob in (in_active, newer_out):
                assert (await c.call("attachments.get", {"sha256": blob["sha256"]}))["deletionState"] == "live"
            assert (await c.call("attachments.estimate", {}))["usedBytes"] == 2000


async def test_a_blob_only_a_tombstone_in_an_archived_branch_holds_is_spared_in_the_active_thread_and_evicted_outside(
        tmp_path: Path) -> None:
    """Seed 000 §5 "removes the oldest attachments outside the active Thread" x §3.3 tombstones x §3.2
    branches: in both threads a blob is referenced only by a tombstoned message inside an archived branch.
    The active thread's is spared although it is the least recently used; the other thread's is evicted,
    and when that branch is switched to (after a SIGKILL and a lost database) its message is still deleted
    and its block reads back ``evicted: true``."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data) as (_proc, c):
            active = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            in_active, in_other = await put_file(c, b"A"), await put_file(c, b"B")
            for sid, blob, p in ((active, in_active, "k"), (other, in_other, "o")):
                await say(c, sid, f"{p}q", "question")
                await say(c, sid, f"{p}r0", "reply A", "assistant")
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    f"{p}u2", "look", blocks=[{"type": "text", "text": "look"}, file_block(blob)])})
                await say(c, sid, f"{p}a2", "seen", "assistant")
                await c.call("session.deleteMessage", {"sessionId": sid, "messageId": f"{p}u2"})
                await c.call("session.truncateFrom", {"sessionId": sid, "messageId": f"{p}r0",
                                                      "mode": "regenerate"})
                await say(c, sid, f"{p}r1", "reply B", "assistant")
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 1000})
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            assert gc["evicted"] == [in_other["sha256"]]
            assert (await c.call("attachments.get", {"sha256": in_active["sha256"]}))["deletionState"] == "live"
        lose_database(data)
        async with real_host(data) as (_proc, c):
            await c.call("session.activateRevision", {"sessionId": other, "rootUserId": "oq", "revisionIndex": 1})
            assert await ctx_ids(c, other) == ["oq", "or0", "oa2"]
            t = await tree(c, other)
            assert {n["id"]: n["deleted"] for n in t["nodes"]}["ou2"] is True
            page = await c.call("session.get", {"sessionId": other, "full": True})
            (u2,) = [m for m in page["messages"] if m["id"] == "ou2"]
            assert u2["deleted"] is True
            assert [b.get("evicted") for b in u2["blocks"] if b["type"] == "attachment"] == [True]


async def test_a_thread_deleted_while_its_sidecar_waits_on_an_approval_releases_the_waiter_and_admits_nothing(
        tmp_path: Path) -> None:
    """Seed 000 §3.3: "thread.delete first stops admission and active or recovered execution" (and "Physical
    deletion is reserved for an entire Thread": a purge from the trash is one too). The sidecar of a running
    turn waits on an approval and a question when a UI deletes the thread (``session.delete``, or
    ``sessions.trash`` then ``sessions.purge``): it is told both are over (``*.resolved`` ``cancelled``, its
    turn ``turn.ended`` ``aborted``) before ``session.deleted``, and each later write of that turn — a
    checkpoint, a reply, another request, a new turn — is SESSION_NOT_FOUND."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, sc), \
                real_host_client(proc, "ui-1", "ui") as ui:
            for how in ("delete", "purge"):
                sid = (await sc.call("session.create", {}))["id"]
                await say(sc, sid, f"u-{how}", "go")
                await sc.call("session.startTurn", {"sessionId": sid, "turnId": f"t-{how}"})
                sub = await sc.subscribe(["approval.resolved", "interaction.resolved", "session.deleted",
                                          "turn.ended"], session_id=sid)
                await sc.call("approvals.request", {"sessionId": sid, "turnId": f"t-{how}", "tool": "Bash",
                                                    "risk": "high"})
                await sc.call("interactions.request", {"sessionId": sid, "turnId": f"t-{how}", "question": "?",
                                                       "allowFreeText": True})
                if how == "delete":
                    assert (await ui.call("session.delete", {"sessionId": sid}))["deleted"] is True
                else:
                    await ui.call("sessions.trash", {"sessionId": sid})
                    await ui.call("sessions.purge", {"sessionId": sid})
                seen: list[tuple[str, str | None]] = []
                with trio.fail_after(10):
                    while not seen or seen[-1][0] != "session.deleted":
                        event = await sc.next_event()
                        row = event.data.get("request") or event.data.get("turn") or {}
                        seen.append((event.topic, row.get("status")))
                assert sorted(seen) == [("approval.resolved", "cancelled"), ("interaction.resolved", "cancelled"),
                                        ("session.deleted", None), ("turn.ended", "aborted")], (how, seen)
                await sc.call("events.unsubscribe", {"subscriptionId": sub["subscriptionId"]})
                for method, params in (
                        ("session.saveInflightMessage", {"sessionId": sid, "turnId": f"t-{how}",
                                                         "message": msg("x1", "partial", role="assistant")}),
                        ("session.appendMessage", {"sessionId": sid, "turnId": f"t-{how}",
                                                   "message": msg("x1", "final", role="assistant")}),
                        ("approvals.request", {"sessionId": sid, "turnId": f"t-{how}", "tool": "Edit",
                                               "risk": "low"}),
                        ("session.startTurn", {"sessionId": sid, "turnId": f"t2-{how}"})):
                    assert await code_of(sc, method, params) == "SESSION_NOT_FOUND", (how, method)
                assert (await sc.call("approvals.pending", {}))["pending"] == []
                assert all(s["id"] != sid for s in (await sc.call("session.list", {}))["sessions"])


# ----------------------------------------------------------------- tool calls x approvals x restart (§2.2)

async def test_a_tool_call_and_its_result_stay_separate_nodes_across_an_answered_approval_and_a_kill(
        tmp_path: Path) -> None:
    """Seed 000 §2.2: "Node types include user and assistant messages, tool calls and results, approval
    decisions ... Tool calls and results are separate because approval can pause for an arbitrary time." The
    reply naming a tool call is a node before the approval is answered; the answer is recorded; the host
    is SIGKILLed and its database lost between the answer and the result. After the restart the decision
    still reads back next to its turn, and the result appended then follows the call in the history."""
    data = data_dir(tmp_path)
    call = {"type": "tool_call", "callId": "call-1", "name": "Bash", "args": {"cmd": "ls"}}
    with trio.fail_after(90):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, sc):
            sid = (await sc.call("session.create", {}))["id"]
            await say(sc, sid, "u1", "list the files")
            await sc.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(sc, sid, "a1", "", "assistant", turnId="t1", blocks=[call])
            rid = (await sc.call("approvals.request", {"sessionId": sid, "turnId": "t1", "toolCallId": "call-1",
                                                       "tool": "Bash", "risk": "low"}))["request"]["requestId"]
            assert await ctx_ids(sc, sid) == ["u1", "a1"]  # the call is history while the approval waits
            async with real_host_client(proc, "ui-1", "ui") as ui:
                answered = await ui.call("approvals.respond", {"sessionId": sid, "requestId": rid,
                                                               "optionId": "allow_once"})
                assert answered["request"]["status"] == "allowed"
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, sc):
            page = await sc.call("session.get", {"sessionId": sid, "full": True})
            decided = [(d["requestId"], d["status"]) for d in page.get("decisions", [])]
            assert decided == [(rid, "allowed")], page.get("decisions")
            await say(sc, sid, "r1", "a.txt", "tool", turnId="t1", toolName="Bash")  # the result: a tool row
            assert await ctx_ids(sc, sid) == ["u1", "a1", "r1"]
            nodes = {n["id"]: n for n in (await tree(sc, sid))["nodes"]}
            assert nodes["r1"]["parentId"] == "a1" and nodes["a1"]["parentId"] == "u1"
