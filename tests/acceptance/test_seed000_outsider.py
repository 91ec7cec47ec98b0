"""Seed 000 read by an outsider: black-box checks of the tree, tombstones, thread delete, integrity, snapshots
and attachment budget, over a real host's WebSocket gateway, with nasty-but-legal inputs. Each test quotes
the statement it checks; the mapping of the seed's vocabulary onto sessions/messages/revisions is the one
protocol/README.md documents (a regenerate or an edit archives the cut tail as a revision, shown as a
sibling in ``session.tree``)."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.acceptance.outsiderkit import ctx_ids, say
from tests.hostkit import client_for, inprocess_host, msg
from tests.importers.test_pi_branches import HEADER, STAGE_3, entry


def by_id(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in tree["nodes"]}


async def tree(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.tree", {"sessionId": sid})
    return result


async def new_session(c: HostClient) -> str:
    return str((await c.call("session.create", {}))["id"])


# ---------------------------------------------------------------------------------------------- tree (§3.2)

async def test_many_regenerations_are_siblings_in_sequence_order_and_each_can_be_switched_to(tmp_path: Path) -> None:
    """Seed 000 §3.2: "Regeneration appends a new assistant branch under the user message. The branch selector
    orders siblings by sequence and follows the newest default descendants when switching." Eight
    regenerations of one reply (no saveActiveRevision in between): nine siblings under the user message in
    the order they were made; switching to each shows exactly it, and the leaf moves with it."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await say(c, sid, "q", "question")
            await say(c, sid, "r0", "reply 0", "assistant")
            for i in range(1, 9):
                await c.call("session.truncateFrom", {"sessionId": sid, "messageId": f"r{i - 1}",
                                                      "mode": "regenerate", "submissionId": f"regen-{i}"})
                await say(c, sid, f"r{i}", f"reply {i}", "assistant")
            t = await tree(c, sid)
            replies = [n for n in t["nodes"] if n["role"] == "assistant"]
            assert [n["revisionIndex"] for n in replies] == list(range(1, 10))
            assert [n["messageId"] for n in replies] == [f"r{i}" for i in range(9)]
            assert all(n["parentId"] == "q" for n in replies)
            assert [n["active"] for n in replies] == [False] * 8 + [True]
            assert t["activeLeafId"] == "r8"
            for index in (3, 1, 9, 5):
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q",
                                                          "revisionIndex": index})
                assert await ctx_ids(c, sid) == ["q", f"r{index - 1}"]
                t = await tree(c, sid)
                assert t["activeLeafId"] == f"r{index - 1}"
                replies = [n for n in t["nodes"] if n["role"] == "assistant"]
                assert [n["revisionIndex"] for n in replies] == list(range(1, 10))  # still by sequence
                assert [n["messageId"] for n in replies if n["active"]] == [f"r{index - 1}"]


# ----------------------------------------------------------------------------------------- tombstones (§3.3)

async def test_a_tombstoned_root_reconnects_its_children_to_the_top(tmp_path: Path) -> None:
    """Seed 000 §3.3: "Context derivation skips it and reconnects its children to the visible ancestor." —
    the root has no visible ancestor: its child becomes a root of the derived history."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await say(c, sid, "root", "first")
            await say(c, sid, "reply", "answer", "assistant")
            await say(c, sid, "next", "second")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "root"})
            assert await ctx_ids(c, sid) == ["reply", "next"]
            nodes = by_id(await tree(c, sid))
            assert nodes["root"]["deleted"] and not nodes["root"]["active"]
            assert "parentId" not in nodes["reply"] or nodes["reply"]["parentId"] is None
            assert nodes["next"]["parentId"] == "reply"


async def test_a_tombstoned_leaf_moves_the_derived_leaf_to_its_visible_ancestor(tmp_path: Path) -> None:
    """Seed 000 §3.3 and §4: a tombstoned leaf is skipped; the history ends at its visible ancestor, and a
    new message appended after it continues from there."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await say(c, sid, "u1", "q1")
            await say(c, sid, "a1", "r1", "assistant")
            await say(c, sid, "u2", "q2")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"})
            t = await tree(c, sid)
            assert t["activeLeafId"] == "a1"
            await say(c, sid, "u3", "q3")
            nodes = by_id(await tree(c, sid))
            assert nodes["u3"]["parentId"] == "a1" and nodes["u3"]["active"]
            assert await ctx_ids(c, sid) == ["u1", "a1", "u3"]


async def test_a_regenerate_under_a_tombstoned_user_message_hangs_under_the_visible_ancestor(
        tmp_path: Path) -> None:
    """Seed 000 §3.2 + §3.3: regenerating the reply to a tombstoned prompt appends a sibling; the derived
    history skips the prompt and the new reply hangs under the visible ancestor."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for mid, text, role in (("u1", "q1", "user"), ("a1", "r1", "assistant"), ("u2", "q2", "user"),
                                    ("a2", "r2", "assistant")):
                await say(c, sid, mid, text, role)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            await say(c, sid, "a2b", "r2b", "assistant")
            assert await ctx_ids(c, sid) == ["u1", "a1", "a2b"]
            t = await tree(c, sid)
            nodes = by_id(t)
            assert nodes["a2b"]["parentId"] == "a1" and t["activeLeafId"] == "a2b"
            assert nodes["rev:u2:1:a2"]["parentId"] == "u2" and not nodes["rev:u2:1:a2"]["active"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["u1", "a1", "a2"]  # the prompt stays tombstoned on the way back


async def test_an_edit_whose_parent_is_tombstoned_is_a_sibling_under_the_visible_ancestor(tmp_path: Path) -> None:
    """Seed 000 §3.2: "Editing a user message appends a sibling under the original parent." + §3.3: the
    original parent is tombstoned, so both variants hang under its visible ancestor, and switching back
    restores the first variant with the parent still hidden."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for mid, text, role in (("x1", "q1", "user"), ("y1", "r1", "assistant"), ("x2", "q2", "user"),
                                    ("y2", "r2", "assistant")):
                await say(c, sid, mid, text, role)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "y1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "x2", "mode": "edit"})
            await say(c, sid, "x2e", "q2 edited", meta={"revisionRootId": "x2"})
            await say(c, sid, "y2e", "r2 edited", "assistant")
            assert await ctx_ids(c, sid) == ["x1", "x2e", "y2e"]
            nodes = by_id(await tree(c, sid))
            assert nodes["x2e"]["parentId"] == "x1" and nodes["rev:x2:1:x2"]["parentId"] == "x1"
            assert nodes["y1"]["deleted"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "x2", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["x1", "x2", "y2"]
            t = await tree(c, sid)
            assert t["activeLeafId"] == "y2" and by_id(t)["y1"]["deleted"]


async def test_switching_to_a_branch_whose_newest_message_is_tombstoned_ends_at_its_visible_ancestor(
        tmp_path: Path) -> None:
    """Seed 000 §3.2/§3.3: the branch switched to keeps its tombstone; its derived leaf is the visible
    ancestor of the tombstoned reply, and the other branch stays a sibling."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await say(c, sid, "p1", "q")
            await say(c, sid, "b1", "branch one", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "b1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "b1", "mode": "regenerate"})
            await say(c, sid, "b2", "branch two", "assistant")
            assert await ctx_ids(c, sid) == ["p1", "b2"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "p1", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["p1"]
            t = await tree(c, sid)
            nodes = by_id(t)
            assert t["activeLeafId"] == "p1"
            assert nodes["b1"]["deleted"] and nodes["rev:p1:2:b2"]["parentId"] == "p1"


async def test_context_of_a_deep_history_skips_every_tombstone_and_system_notice(tmp_path: Path) -> None:
    """Seed 000 §4: "buildSessionContext reverses the leaf-to-root path, omits tombstones and system
    notices" — over 600 messages with every fifth one tombstoned and a system notice every 50."""
    with trio.fail_after(120):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            expected: list[str] = []
            for i in range(600):
                mid = f"m{i}"
                if i % 50 == 49:
                    await say(c, sid, mid, f"notice {i}", "system")
                    continue
                await say(c, sid, mid, f"text {i}", "user" if i % 2 == 0 else "assistant")
                if i % 5 == 0:
                    await c.call("session.deleteMessage", {"sessionId": sid, "messageId": mid})
                else:
                    expected.append(mid)
            assert await ctx_ids(c, sid) == expected
            t = await tree(c, sid)
            assert len(t["nodes"]) == 600
            assert t["activeLeafId"] == "m599"  # a system notice is a node (§2.2): the leaf, yet not history


# ------------------------------------------------------------------------------------- thread delete (§3.3)

async def test_a_thread_delete_removes_its_runs_approvals_interactions_and_refs_and_keeps_its_receipt(
        tmp_path: Path) -> None:
    """Seed 000 §3.3: "thread.delete first stops admission and active or recovered execution, then deletes
    Thread nodes, attachments, Runs, approvals, interactions, and metadata ... The receipt remains so a lost
    acknowledgement can be replayed after worker restart." """
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-del", "environment": {
                "version": 1, "credentialRefs": ["secret:provider/x"]}})
            await c.call("approvals.request", {"sessionId": sid, "turnId": "t-del", "tool": "Bash", "risk": "low"})
            await c.call("interactions.request", {"sessionId": sid, "turnId": "t-del", "question": "which?",
                                                  "allowFreeText": True})
            blob = await c.call("attachments.put", {"name": "a.bin", "mimeType": "application/octet-stream",
                                                    "dataBase64": base64.b64encode(b"q" * 500).decode()})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "see", blocks=[{
                "type": "attachment", "kind": "file", "name": "a.bin", "ref": blob["ref"],
                "mimeType": "application/octet-stream", "size": 500}])})
            await c.call("attachments.ref", {"sha256": blob["sha256"], "sessionId": sid, "messageId": "m1"})
            first = await c.call("session.delete", {"sessionId": sid, "submissionId": "delete-thread-1"})
            assert first == {"sessionId": sid, "deleted": True}
            assert (await c.call("approvals.pending", {}))["pending"] == []
            assert (await c.call("interactions.pending", {}))["pending"] == []
            with pytest.raises(RpcError) as err:
                await c.call("session.turnEnvironment", {"turnId": "t-del"})
            assert err.value.data_code == "NOT_FOUND"
            assert (await c.call("attachments.get", {"sha256": blob["sha256"]}))["references"] == []
            with pytest.raises(RpcError) as err:
                await c.call("session.startTurn", {"sessionId": sid})  # admission is stopped for good
            assert err.value.data_code == "SESSION_NOT_FOUND"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert await c.call("session.delete", {"sessionId": sid, "submissionId": "delete-thread-1"}) == first
            with pytest.raises(RpcError) as err:
                await c.call("session.get", {"sessionId": sid})
            assert err.value.data_code == "SESSION_NOT_FOUND"


# -------------------------------------------------------------------------------------- integrity (§3.4)

def _pi_file(root: Path, name: str, entries: list[dict[str, Any]], n: int) -> Path:
    sid = f"019e19b4-0000-7000-8000-{n:012d}"
    path = root / name / f"2026-05-12T01-02-27-657Z_{sid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in [{**HEADER, "id": sid}, *entries]))
    return path


async def _import_one(c: HostClient, path: Path) -> str:
    before = {s["id"] for s in (await c.call("session.list", {"limit": 200}))["sessions"]}
    result = await c.call("import.sessions", {"source": "pi", "root": str(path)})
    assert result["counts"]["new"] == 1, result
    (sid,) = {s["id"] for s in (await c.call("session.list", {"limit": 200}))["sessions"]} - before
    return str(sid)


def _notices(page: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in page["messages"] if m["role"] == "system"]


@pytest.mark.parametrize("shape", ["loop", "tail on a loop"])
async def test_a_history_whose_leaf_chain_loops_and_reaches_no_root_gets_a_system_notice(tmp_path: Path,
                                                                                        shape: str) -> None:
    """Seed 000 §3.4: "On load, leafId must reach a root. Corrupt data falls back to the highest-sequence
    reachable leaf and produces a system notice. Walk length is bounded by node count." A pi file whose
    entries form a parent cycle has no leaf that reaches a root: the import still finishes (bounded walk),
    keeps what it could read, and a system notice says the data is corrupt (it used to import the loop as
    a plain conversation, silently). The notice is not model history (§4)."""
    entries = {
        "loop": [entry("e1", "e3", "user", "loop q", 1), entry("e2", "e1", "assistant", "loop a", 2),
                 entry("e3", "e2", "user", "loop q2", 3)],
        "tail on a loop": [entry("e1", "e2", "user", "loop q", 1), entry("e2", "e1", "assistant", "loop a", 2),
                           entry("e3", "e2", "user", "tail q", 3)],
    }[shape]
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = await _import_one(c, _pi_file(tmp_path / "src", "loop", entries, 1))
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            (notice,) = _notices(page)
            assert notice["meta"]["corruptLeaf"]["leaf"] == "e3"
            assert notice["meta"]["corruptLeaf"]["reason"].startswith("parent cycle at ")
            assert "fallback" not in notice["meta"]["corruptLeaf"]
            texts = [m["blocks"][0]["text"] for m in page["messages"] if m["role"] != "system"]
            assert texts == [e["message"]["content"][0]["text"] for e in entries]  # nothing read is dropped
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["role"] for m in ctx["messages"]] == [e["message"]["role"] for e in entries]


async def test_a_dangling_leaf_falls_back_over_the_wire_and_the_notice_stays_out_of_the_context(
        tmp_path: Path) -> None:
    """Seed 000 §3.4 + §4, black-box: the import shows the highest-sequence reachable leaf's branch with one
    system notice, and session.context leaves the notice out."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = await _import_one(c, _pi_file(tmp_path / "src", "dangling",
                                                [*STAGE_3, entry("e9", "gone", "user", "orphan", 9)], 2))
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            assert len(_notices(page)) == 1 and _notices(page)[0]["meta"]["corruptLeaf"]["fallback"] == "e8"
            ctx = await c.call("session.context", {"sessionId": sid})
            assert "system" not in {m["role"] for m in ctx["messages"]}
            assert [m["blocks"][0]["text"] for m in ctx["messages"]][-1] == "a3 on A"


async def test_a_deep_and_a_wide_tree_import_in_bounded_time(tmp_path: Path) -> None:
    """Seed 000 §3.4 "Walk length is bounded by node count" and §6 (branch counts are small, but need not
    be): a 5,000-deep chain and a root with 300 sibling replies both load; the wide one shows its newest
    sibling and keeps the others as branches."""
    deep = [entry(f"d{i}", f"d{i - 1}" if i else None, "user" if i % 2 == 0 else "assistant", f"t{i}", i % 60)
            for i in range(5000)]
    wide = [entry("r", None, "user", "root", 1),
            *(entry(f"w{i}", "r", "assistant", f"v{i}", i % 60) for i in range(300))]
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            d = await _import_one(c, _pi_file(tmp_path / "src", "deep", deep, 3))
            assert len((await c.call("session.context", {"sessionId": d}))["messages"]) == 5000
            w = await _import_one(c, _pi_file(tmp_path / "src", "wide", wide, 4))
            ctx = await c.call("session.context", {"sessionId": w})
            assert [m["blocks"][0]["text"] for m in ctx["messages"]] == ["root", "v299"]
            t = await tree(c, w)
            assert len(t["nodes"]) == 301
            assert sum(1 for n in t["nodes"] if n["role"] == "assistant" and not n["active"]) == 299


# ------------------------------------------------------------------------------------------ snapshots (§4)

async def test_secret_values_anywhere_in_the_snapshot_are_refused_and_references_are_kept(tmp_path: Path) -> None:
    """Seed 000 §4: "Secrets are not copied into the snapshot. It stores credential references." A secret
    value nested in a list of objects is refused; a reference object under a secret-named key is stored."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            with pytest.raises(RpcError) as err:
                await c.call("session.startTurn", {"sessionId": sid, "environment": {
                    "version": 1, "parameters": {"extra": [{"headers": [{"apiKey": "sk-live-123"}]}]}}})
            assert err.value.data_code == "INVALID_PARAMS"
            env = {"version": 1, "connection": {"apiKey": {"ref": "secret:provider/x"}},
                   "credentialRefs": ["secret:provider/x"]}
            started = await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-ref", "environment": env})
            back = await c.call("session.turnEnvironment", {"turnId": "t-ref"})
            assert back["digest"] == started["environmentDigest"]
            assert back["snapshot"]["connection"] == {"apiKey": {"ref": "secret:provider/x"}}


async def test_a_snapshot_whose_version_was_changed_on_disk_is_refused_by_every_reader(tmp_path: Path) -> None:
    """Seed 000 §4: "Recovery rejects invalid versions, digest mismatch ..." — the stored row's version
    changed behind the host's back (its digest still matching the JSON): turnEnvironment, verifyEnvironment
    and the context's latest Turn context all refuse it after a restart."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await say(c, sid, "u1", "go")
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-v", "environment": {"version": 1}})
            await say(c, sid, "a1", "done", "assistant", turnId="t-v")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t-v", "status": "completed"})
    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    with conn:
        assert conn.execute("UPDATE run_snapshots SET version = 2 WHERE turn_id = 't-v'").rowcount == 1
    conn.close()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for method, params in (("session.turnEnvironment", {"turnId": "t-v"}),
                                   ("session.verifyEnvironment", {"sessionId": sid, "turnId": "t-v"}),
                                   ("session.context", {"sessionId": sid})):
                with pytest.raises(RpcError) as err:
                    await c.call(method, params)
                assert err.value.data_code == "CORRUPT_DATA", method


# ----------------------------------------------------------------------------------- attachments (§2.3, §5)

def _att(blob: dict[str, Any]) -> dict[str, Any]:
    return {"type": "attachment", "kind": "file", "name": "f.bin", "ref": blob["ref"],
            "mimeType": "application/octet-stream", "size": blob["size"]}


async def _put(c: HostClient, fill: bytes) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("attachments.put", {
        "name": "f.bin", "mimeType": "application/octet-stream", "kind": "file", "trust": "user",
        "provenance": "upload", "dataBase64": base64.b64encode(fill * 1000).decode()})
    return result


async def test_eviction_spares_the_whole_active_thread_and_takes_the_oldest_outside_it_first(
        tmp_path: Path) -> None:
    """Seed 000 §5: "Attachment cleanup removes the oldest attachments outside the active Thread after the
    200 MB budget." The active thread's blobs are spared wherever they are referenced in it: its live
    transcript, a tombstoned message, an archived branch. Outside it, the oldest go first and eviction stops
    once usage is back under the budget."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            active = await new_session(c)
            other = await new_session(c)
            old1, old2, newest = await _put(c, b"1"), await _put(c, b"2"), await _put(c, b"3")
            live, tomb, archived = await _put(c, b"L"), await _put(c, b"T"), await _put(c, b"A")
            for mid, blob in (("o1", old1), ("o2", old2), ("o3", newest)):
                await c.call("session.appendMessage", {"sessionId": other, "message": msg(
                    mid, "x", blocks=[_att(blob)])})
            await c.call("session.appendMessage", {"sessionId": active, "message": msg(
                "k1", "x", blocks=[_att(live)])})
            await c.call("session.appendMessage", {"sessionId": active, "message": msg(
                "k2", "x", role="assistant", blocks=[_att(archived)])})
            await c.call("session.truncateFrom", {"sessionId": active, "messageId": "k2", "mode": "regenerate"})
            await say(c, active, "k3", "regenerated", "assistant")
            await c.call("session.appendMessage", {"sessionId": active, "message": msg(
                "k4", "x", blocks=[_att(tomb)])})
            await c.call("session.deleteMessage", {"sessionId": active, "messageId": "k4"})
            # 6 blobs of 1,000 bytes; a budget of 4,500 needs two evictions
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 4500})
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            assert gc["evicted"] == [old1["sha256"], old2["sha256"]]
            assert gc["estimate"]["usedBytes"] == 4000
            for blob in (live, tomb, archived, newest):
                assert (await c.call("attachments.get", {"sha256": blob["sha256"]}))["deletionState"] == "live"


async def test_the_quota_warning_starts_just_above_80_percent(tmp_path: Path) -> None:
    """Seed 000 §5: "warns above 80% usage" — exactly 80 % is no warning, a byte more is."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await _put(c, b"w")  # 1,000 bytes
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 1250})
            at = await c.call("attachments.estimate", {})
            assert at["percent"] == 80.0 and at["warning"] is False
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 1249})
            assert (await c.call("attachments.estimate", {}))["warning"] is True


async def test_eviction_spares_the_active_threads_queue_checkpoint_and_recorded_refs(tmp_path: Path) -> None:
    """Seed 000 §2.3 / §5: the active Thread's attachments include those of its queued prompt, of its
    streaming reply's checkpoint, of a recorded reference without a message, and of a blob another thread
    shares with it; with a budget smaller than any one blob, only the blob nothing in the active thread
    refers to goes."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            active = await new_session(c)
            other = await new_session(c)
            orphan, queued, streaming, shared, recorded = [await _put(c, bytes([fill])) for fill in b"OQISR"]
            await c.call("session.queuePush", {"sessionId": active, "principal": "me", "content": "look",
                                               "permissionMode": "inherit", "attachments": [_att(queued)]})
            await c.call("session.startTurn", {"sessionId": active, "turnId": "t-gc"})
            await c.call("session.saveInflightMessage", {"sessionId": active, "turnId": "t-gc", "message": msg(
                "x1", "p", role="assistant", blocks=[{"type": "text", "text": "p"}, _att(streaming)])})
            for sid, mid in ((other, "o1"), (active, "k1")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    mid, "x", blocks=[_att(shared)])})
            await c.call("attachments.ref", {"sha256": recorded["sha256"], "sessionId": active})
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 999})
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            assert gc["evicted"] == [orphan["sha256"]]


async def test_a_streaming_checkpoint_is_not_a_node(tmp_path: Path) -> None:
    """Seed 000 §1/§2.2: "Streaming deltas are not nodes. The final assistant result is written after the
    provider stream completes." A checkpoint of a reply still streaming is neither in the tree nor in the
    model history; the final reply is."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await say(c, sid, "u1", "q")
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-s"})
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t-s",
                                                         "message": msg("x1", "partial", role="assistant")})
            t = await tree(c, sid)
            assert [n["id"] for n in t["nodes"]] == ["u1"] and t["activeLeafId"] == "u1"
            assert await ctx_ids(c, sid) == ["u1"]
            await say(c, sid, "x1", "final", "assistant", turnId="t-s")
            t = await tree(c, sid)
            assert [n["id"] for n in t["nodes"]] == ["u1", "x1"] and t["activeLeafId"] == "x1"


async def test_edits_of_the_root_message_are_sibling_roots_and_each_can_be_switched_to(tmp_path: Path) -> None:
    """Seed 000 §3.2 at the root: the first user message has no parent, so its edits (under the same id,
    then under a new id naming it) are sibling roots; switching restores each whole branch."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await say(c, sid, "u1", "q")
            await say(c, sid, "a1", "r", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
            await say(c, sid, "u1", "q edited, same id")
            await say(c, sid, "a1x", "r2", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
            await say(c, sid, "u1n", "q edited, new id", meta={"revisionRootId": "u1"})
            t = await tree(c, sid)
            roots = [n for n in t["nodes"] if n.get("parentId") is None]
            assert [n["id"] for n in roots] == ["rev:u1:1:u1", "rev:u1:2:u1", "u1n"]
            assert t["activeLeafId"] == "u1n"
            for index, expected in ((1, ["u1", "a1"]), (2, ["u1", "a1x"])):
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1",
                                                          "revisionIndex": index})
                assert await ctx_ids(c, sid) == expected
                assert (await tree(c, sid))["activeLeafId"] == expected[-1]
