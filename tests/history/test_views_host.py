"""session.tree and session.context through the real gateway, over real revisions and checkpoints."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store.context import build_session_context
from tests.hostkit import client_for, inprocess_host, msg
from tests.revisions.helpers import turn


def by_id(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in tree["nodes"]}


async def test_tree_shows_regenerated_variants_as_siblings(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a2b", "b", role="assistant")})
            tree = await c.call("session.tree", {"sessionId": sid})
            nodes = by_id(tree)
            # seed 000 §3.2: "Regeneration appends a new assistant branch under the user message"
            assert [n["id"] for n in tree["nodes"]] == ["u1", "a1", "u2", "rev:u2:1:a2", "a2b"]
            assert nodes["rev:u2:1:a2"]["parentId"] == "u2" and nodes["a2b"]["parentId"] == "u2"
            assert nodes["rev:u2:1:a2"]["revisionIndex"] == 1 and nodes["u2"]["revisionIndex"] == 2
            assert nodes["a2b"]["revisionIndex"] == 2
            assert [n["id"] for n in tree["nodes"] if n["active"]] == ["u1", "a1", "u2", "a2b"]
            assert tree["activeLeafId"] == "a2b"
            # switching back: the stored copy of the now-live variant is not shown twice
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            tree = await c.call("session.tree", {"sessionId": sid})
            assert [n["id"] for n in tree["nodes"]] == ["u1", "a1", "u2", "a2", "rev:u2:2:a2b"]
            assert tree["activeLeafId"] == "a2"
            assert by_id(tree)["u2"]["revisionIndex"] == 1
            # a tombstone turns its node into a leaf; the child reconnects to the visible ancestor
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"})
            nodes = by_id(await c.call("session.tree", {"sessionId": sid}))
            assert nodes["u2"]["deleted"] and not nodes["u2"]["active"]
            assert nodes["a2"]["parentId"] == "a1" and nodes["a2"]["active"]
            assert nodes["rev:u2:2:a2b"]["parentId"] == "u2"  # the archived reply stays with its user message


async def edited(c: Any, sid: str, uid: str, aid: str, revises: str) -> None:
    """An edited prompt under a new id naming the message it revises, and its reply."""
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(uid, f"q {uid}",
                                                                            meta={"revisionRootId": revises})})
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(aid, f"a {aid}", role="assistant")})


async def edited_once(c: Any) -> str:
    """u1 a1 u2 a2, u2 cut in edit mode and edited as u2e (naming u2) with reply a2e; the session id."""
    sid = str((await c.call("session.create", {}))["id"])
    await turn(c, sid, "u1", "a1")
    await turn(c, sid, "u2", "a2")
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2", "mode": "edit"})
    await edited(c, sid, "u2e", "a2e", "u2")
    return sid


async def test_an_edit_under_a_new_id_is_a_sibling_and_restorable_when_it_names_its_root(tmp_path):
    """Seed 000 §3.2: "Editing a user message appends a sibling under the original parent." An edit cut at
    the user message archives its branch; the edited message, under a new id, names the family it
    revises with meta.revisionRootId (the pager's own stamp field): its old branch is its sibling under
    the original parent, and activateRevision restores it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await edited_once(c)
            nodes = by_id(await c.call("session.tree", {"sessionId": sid}))
            assert nodes["rev:u2:1:u2"]["parentId"] == "a1" and nodes["u2e"]["parentId"] == "a1"
            assert nodes["rev:u2:1:a2"]["parentId"] == "rev:u2:1:u2"
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in page["messages"]] == ["u1", "a1", "u2", "a2"]




async def test_an_edit_of_an_edit_naming_the_message_it_revises_joins_the_original_family(tmp_path):
    """u2 edited to u2e (naming u2), then u2e edited to u2f naming u2e, the message it revises: every
    earlier variant was listed but activateRevision answered MESSAGE_NOT_FOUND for all of them and the tree
    hung them at the top. The host files u2f under the original family (u2): one set of variants, each
    restorable, each a sibling under a1."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await edited_once(c)
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2e", "mode": "edit"})
            await edited(c, sid, "u2f", "a2f", "u2e")
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            assert page["messages"][2]["meta"]["revisionRootId"] == "u2"
            revisions = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert {r["rootUserId"] for r in revisions} == {"u2"}
            nodes = by_id(await c.call("session.tree", {"sessionId": sid}))
            assert all(n["parentId"] == "a1" for n in nodes.values() if n["role"] == "user" and n["id"] != "u1")
            for index, expected in ((1, ["u2", "a2"]), (2, ["u2e", "a2e"])):
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2",
                                                          "revisionIndex": index})
                page = await c.call("session.get", {"sessionId": sid, "full": True})
                assert [m["id"] for m in page["messages"]] == ["u1", "a1", *expected]


async def test_an_edit_naming_a_live_message_is_refused_and_changes_nothing(tmp_path):
    """A user message whose meta.revisionRootId names a message still in the transcript (u1, say) was
    accepted; two live messages of one family, and the next branch switch dropped u1 and a1 from the live
    transcript. Refused (INVALID_PARAMS), within one batch too."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            for root in ("u1", "a1"):
                with pytest.raises(RpcError) as bad:
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                        "u2", "q2", meta={"revisionRootId": root})})
                assert bad.value.data_code == "INVALID_PARAMS"
                assert bad.value.data["field"] == "message.meta.revisionRootId"
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in page["messages"]] == ["u1", "a1"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(  # its own id: fine
                "u2", "q2", meta={"revisionRootId": "u2"})})


async def test_context_follows_the_newest_checkpoint_and_skips_hidden_rows(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("n1", "notice", role="system")})
            await turn(c, sid, "u2", "a2")
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "a3", "role": "assistant", "meta": {"replayReasoning": True},
                "blocks": [{"type": "thinking", "text": "think"}, {"type": "text", "text": "answer"}]}})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "s1", "delegate row", role="assistant", meta={"agentName": "reviewer"})})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "u2", "a2", "a3"]
            assert ctx["messages"][-1]["blocks"] == [{"type": "reasoning", "text": "think"},
                                                     {"type": "text", "text": "answer"}]
            assert ctx.get("compaction") is None
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c1", "summary": "first", "throughMessageId": "a1", "tokensBefore": 5}})
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c2", "summary": "second", "throughMessageId": "a2", "tokensBefore": 9,
                "retainedTail": [msg("u2", "q u2 (bounded)")],
                "details": {"retainedTailMode": "active_turn"}}})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert ctx["compaction"]["id"] == "c2"
            assert [m["id"] for m in ctx["messages"]] == ["c2", "u2", "a3"]
            assert ctx["messages"][0]["blocks"][0]["text"] == "second"
            assert ctx["messages"][1]["blocks"][0]["text"] == "q u2 (bounded)"
            # cutting the newest checkpoint's boundary away makes the older one the active checkpoint
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert ctx["compaction"]["id"] == "c1"
            assert [m["id"] for m in ctx["messages"]] == ["c1"]  # only the system notice followed a1
            with pytest.raises(RpcError) as err:
                await c.call("session.context", {"sessionId": "nope"})
            assert err.value.data_code == "SESSION_NOT_FOUND"
            with pytest.raises(RpcError) as err:
                await c.call("session.tree", {"sessionId": "nope"})
            assert err.value.data_code == "SESSION_NOT_FOUND"


async def test_a_checkpoint_that_would_break_the_context_is_refused(tmp_path):
    """A retained message without an id made session.context answer INTERNAL for good (it hands each one
    on as a message, id required); a retained attachment carrying its bytes inline reached the transcript
    (seed 003 §4.7: transient base64 never enters it); a checkpoint under a message's id listed that id twice
    and ended silently when the message was deleted. Each is refused and writes nothing."""
    inline = {"type": "attachment", "kind": "image", "name": "x.png", "ref": "attachments/" + "ab" * 32,
              "dataBase64": "iVBORw0KGgo="}
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u2", "q2")})
            before = (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes()
            active = {"retainedTailMode": "active_turn"}
            for tail, cid, code in (
                    ([{"role": "user", "blocks": [{"type": "text", "text": "q"}]}], "c1", "INVALID_PARAMS"),
                    ([{"id": "u2", "role": "user", "blocks": [inline]}], "c1", "INVALID_PARAMS"),
                    ([{"id": "u2", "role": "user", "blocks": [{"type": "text"}]}], "c1", "INVALID_PARAMS"),
                    ([], "u2", "CONFLICT")):
                with pytest.raises(RpcError) as bad:
                    await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                        "id": cid, "summary": "S", "throughMessageId": "a1", "tokensBefore": 1,
                        "retainedTail": tail, "details": active if tail else {}}})
                assert bad.value.data_code == code, (tail, cid)
            assert (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes() == before
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "u2"]


async def test_a_first_kept_message_after_the_boundary_drops_nothing_from_the_context(tmp_path):
    """Seed 003 §2.1: "throughMessageId is the durable transcript boundary; firstKeptMessageId and
    retainedTail reproduce the summary + applicable context". A firstKept after the boundary (a2 with
    through a1) made the context skip u2, neither summarized nor kept. Such a checkpoint is now refused
    (INVALID_PARAMS, nothing written); one an older host stored reads from the boundary, dropping nothing."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            with pytest.raises(RpcError) as info:
                await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                    "id": "c1", "summary": "S", "throughMessageId": "a1", "firstKeptMessageId": "a2",
                    "tokensBefore": 1}})
            assert info.value.data_code == "INVALID_PARAMS"
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "u2", "a2"]
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {  # the usual order
                "id": "c2", "summary": "S2", "throughMessageId": "a2", "firstKeptMessageId": "u2",
                "tokensBefore": 1}})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["c2", "u2", "a2"]
    records = [msg(mid, mid, role=role) for mid, role in (("u1", "user"), ("a1", "assistant"),
                                                          ("u2", "user"), ("a2", "assistant"))]
    stored = {"type": "compaction", "id": "c1", "summary": "S", "throughMessageId": "a1",
              "firstKeptMessageId": "a2", "tokensBefore": 1}
    assert [m["id"] for m in build_session_context(records, [stored], ())["messages"]] == ["c1", "u2", "a2"]
