"""Seed 000 probed from a user's side: black-box checks over the WebSocket gateway of real ``pi-host serve``
processes, aimed at what the other seed 000 outsider modules leave open — tombstones against every read (search,
exports and the bytes they carry, a fork, a final reply landing on a deleted reservation, an index rebuilt from
the files), compaction checkpoints whose boundary messages are tombstoned, the latest Turn context after an edit
that reuses the prompt's id, the approval and question lifecycle (who may decide, answers outside a question's
shape, a deadline already past, a restart in between), and what a reader sees of an evicted attachment. Each
test quotes the sentence it checks. Tests that need no restart share one host (their sessions, search words and
request ids are their own); the others start their own and SIGKILL it."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import (
    client,
    code_of,
    ctx_ids,
    data_dir,
    error_of,
    file_block,
    put_file,
    real_host,
    say,
    shared_host,
)
from tests.hostkit import HostProcess, msg


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the tests that never restart it."""
    yield from shared_host(tmp_path_factory, "seed000-user")


async def new_session(c: HostClient) -> str:
    return str((await c.call("session.create", {}))["id"])


async def window(c: HostClient, sid: str) -> list[tuple[str, bool]]:
    page = await c.call("session.get", {"sessionId": sid})
    return [(m["id"], bool(m.get("deleted"))) for m in page["messages"]]


async def hits(c: HostClient, word: str) -> list[tuple[str, str]]:
    found = (await c.call("search.query", {"query": word}))["results"]
    return [(h["sessionId"], h["messageId"]) for h in found]


async def session_hits(c: HostClient, word: str) -> list[str]:
    found = (await c.call("search.sessions", {"query": word}))["results"]
    return [s["messageId"] for r in found for s in r["snippets"]]


def lose_index(data: Path) -> None:
    """The index database is gone (with its WAL): the next boot rebuilds it from the files."""
    for f in data.glob("pi.sqlite*"):
        f.unlink()


# ----------------------------------------------------------------------------------- tombstones (§3.3, §4)

async def test_a_tombstoned_message_and_the_blob_only_it_holds_leave_search_context_exports_and_a_fork(
        shared: HostProcess) -> None:
    """Seed 000 §3.3: "A message tombstone sets payload.deleted = true. Context derivation skips it" and §4
    "buildSessionContext ... omits tombstones". A deleted prompt with a private photo: search (messages and
    sessions) finds its words no more, the context and a fork's context skip it, the window and the tree keep
    it flagged ``deleted``, and no export — Markdown, HTML, JSONL — carries its words or the bytes of the photo
    only it referred to (README: JSONL exports leave tombstoned messages out); the blob a live message holds
    is carried. Restoring it brings it back to search; deleting it again hides it again."""
    with trio.fail_after(60):
        async with client(shared, "ui-tomb") as c:
            sid = await new_session(c)
            photo = await put_file(c, b"P")
            kept = await put_file(c, b"Q")
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("t-u1", "x", blocks=[
                {"type": "text", "text": "harmless kiwifruit"}, file_block(kept)])})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("t-u2", "x", blocks=[
                {"type": "text", "text": "private quokkaphoto"}, file_block(photo)])})
            await say(c, sid, "t-a2", "a reply about kiwifruit", "assistant")
            assert await hits(c, "quokkaphoto") == [(sid, "t-u2")]
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "t-u2"})

            assert await hits(c, "quokkaphoto") == []
            assert await session_hits(c, "quokkaphoto") == []
            assert sorted(await hits(c, "kiwifruit")) == [(sid, "t-a2"), (sid, "t-u1")]
            assert await ctx_ids(c, sid) == ["t-u1", "t-a2"]
            assert await window(c, sid) == [("t-u1", False), ("t-u2", True), ("t-a2", False)]
            nodes = {n["id"]: n for n in (await c.call("session.tree", {"sessionId": sid}))["nodes"]}
            assert nodes["t-u2"]["deleted"] and not nodes["t-u2"]["active"]
            assert nodes["t-a2"]["parentId"] == "t-u1"  # reconnected to the visible ancestor
            for fmt in ("md", "html", "jsonl"):
                content = (await c.call("session.export", {"sessionId": sid, "format": fmt}))["content"]
                assert "quokkaphoto" not in content and photo["sha256"] not in content, fmt
                assert "kiwifruit" in content, fmt
            lines = [json.loads(line) for line in content.splitlines() if line.strip()]
            assert [x["sha256"] for x in lines if x["type"] == "blob"] == [kept["sha256"]]

            fork = (await c.call("session.fork", {"sessionId": sid}))["id"]
            forked = (await c.call("session.context", {"sessionId": fork}))["messages"]
            assert ["quokkaphoto" in json.dumps(m) for m in forked] == [False, False]
            assert [d for _mid, d in await window(c, fork)] == [False, True, False]  # carried deleted

            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "t-u2"})
            assert await hits(c, "quokkaphoto") == [(sid, "t-u2")]
            assert await ctx_ids(c, sid) == ["t-u1", "t-u2", "t-a2"]
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "t-u2"})
            assert await hits(c, "quokkaphoto") == []


async def test_tombstones_and_restores_read_the_same_after_kill9_and_a_lost_index(tmp_path: Path) -> None:
    """Seed 000 §1: "Message deletion uses a tombstone, and recovery replays nodes rather than deserializing a
    separate snapshot." A message deleted, one deleted then restored, one deleted twice and restored once: after
    a SIGKILL and the loss of the index, the rebuilt one says exactly what the tombstone lines say (the last
    one per message wins) to the window, the context and search."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = await new_session(c)
            for i, word in enumerate(("axolotl", "bandicoot", "capybara", "dugong")):
                await say(c, sid, f"m{i}", f"about the {word}", "user" if i % 2 == 0 else "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "m0"})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "m1"})
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "m1"})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "m2"})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "m2"})
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "m2"})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "m3"})
            want_window = [("m0", True), ("m1", False), ("m2", False), ("m3", True)]
            assert await window(c, sid) == want_window
        lose_index(data)
        async with real_host(data) as (_proc, c):
            assert await window(c, sid) == want_window
            assert await ctx_ids(c, sid) == ["m1", "m2"]
            for word, found in (("axolotl", []), ("bandicoot", [(sid, "m1")]), ("capybara", [(sid, "m2")]),
                                ("dugong", [])):
                assert await hits(c, word) == found, word


async def test_a_reply_deleted_while_it_streams_stays_deleted_when_its_final_row_lands(tmp_path: Path) -> None:
    """Seed 000 §1: "Streaming deltas are not nodes. The final assistant result is written after the provider
    stream completes." + §3.3 (a tombstone hides the message). The user deletes a reply while it is still a
    streaming reservation; the sidecar's final row then replaces the reservation in place (README §4). The
    reply stays deleted — out of the context and search, flagged in the window — also after a SIGKILL."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, sc), \
                client(proc, "ui-1") as ui:
            sid = await new_session(ui)
            await say(ui, sid, "s-u1", "tell me about pangolins")
            await sc.call("session.startTurn", {"sessionId": sid, "turnId": "s-t1"})
            await sc.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "s-a1", "partial", role="assistant", turnId="s-t1", meta={"status": "streaming"})})
            await ui.call("session.deleteMessage", {"sessionId": sid, "messageId": "s-a1"})
            final = await sc.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "s-a1", "the whole answer on scalyanteaters", role="assistant", turnId="s-t1")})
            assert final["replayed"] is False
            await sc.call("session.endTurn", {"sessionId": sid, "turnId": "s-t1", "status": "completed"})
            assert await window(ui, sid) == [("s-u1", False), ("s-a1", True)]
            assert await ctx_ids(ui, sid) == ["s-u1"]
            assert await hits(ui, "scalyanteaters") == []
        async with real_host(data) as (_proc, c):
            page = await c.call("session.get", {"sessionId": sid})
            assert [(m["id"], bool(m.get("deleted"))) for m in page["messages"]] == [("s-u1", False), ("s-a1", True)]
            assert "scalyanteaters" in json.dumps(page["messages"][1])  # the final row, not the reservation
            assert await ctx_ids(c, sid) == ["s-u1"]
            assert await hits(c, "scalyanteaters") == []


async def test_a_keyed_tombstone_retried_after_a_restore_answers_and_deletes_nothing_again(tmp_path: Path) -> None:
    """Seed 000 §2.4: "The receipt key is clientId + submissionId. It stores command type, status, terminal
    response" and "A completed receipt cannot be overwritten." A keyed delete, then a restore: the retry of the
    delete (a lost acknowledgement) answers what it answered and leaves the message restored, before and after
    a SIGKILL; the same key sent for the restore is another command type (IDEMPOTENCY_CONFLICT)."""
    data = data_dir(tmp_path)
    delete = {"messageId": "k-u1", "submissionId": "del-k-u1"}
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = await new_session(c)
            await say(c, sid, "k-u1", "a wombat question")
            first = await c.call("session.deleteMessage", {"sessionId": sid, **delete})
            assert first == {"messageId": "k-u1", "deleted": True}
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "k-u1"})
            assert await c.call("session.deleteMessage", {"sessionId": sid, **delete}) == first
            assert await window(c, sid) == [("k-u1", False)]
            code, data_ = await error_of(c, "session.restoreMessage", {"sessionId": sid, **delete})
            assert code == "IDEMPOTENCY_CONFLICT" and data_["method"] == "session.deleteMessage"
        async with real_host(data) as (_proc, c):
            assert await c.call("session.deleteMessage", {"sessionId": sid, **delete}) == first
            assert await window(c, sid) == [("k-u1", False)]
            assert await hits(c, "wombat") == [(sid, "k-u1")]


async def test_deleting_an_edited_prompt_does_not_hide_the_original_it_replaced(tmp_path: Path) -> None:
    """Seed 000 §3.2: "Editing a user message appends a sibling under the original parent" and §3.3 "A message
    tombstone sets payload.deleted = true": the tombstone is the node's, not every node's of that id. The user
    edits a prompt under the same id (README: "the edited message either reuses the id ..."), then deletes the
    edited prompt. Switching back to the original branch shows the original prompt as it was — visible, in the
    context, found by search; switching to the edited branch again shows the edited prompt still deleted; and
    both read the same after a SIGKILL."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = await new_session(c)
            await say(c, sid, "d-x1", "first prompt")
            await say(c, sid, "d-y1", "first reply", "assistant")
            await say(c, sid, "d-x2", "original narwhalprompt")
            await say(c, sid, "d-y2", "original reply", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "d-x2", "mode": "edit"})
            await say(c, sid, "d-x2", "edited belugaprompt")
            await say(c, sid, "d-y2e", "edited reply", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "d-x2"})
            assert await ctx_ids(c, sid) == ["d-x1", "d-y1", "d-y2e"]

            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "d-x2", "revisionIndex": 1})
            original = [("d-x1", False), ("d-y1", False), ("d-x2", False), ("d-y2", False)]
            assert await window(c, sid) == original
            assert await ctx_ids(c, sid) == ["d-x1", "d-y1", "d-x2", "d-y2"]
            assert await hits(c, "narwhalprompt") == [(sid, "d-x2")]
            nodes = {n["id"]: n for n in (await c.call("session.tree", {"sessionId": sid}))["nodes"]}
            assert nodes["d-x2"]["active"] and not nodes["d-x2"]["deleted"]
            assert nodes["rev:d-x2:2:d-x2"]["deleted"]  # the edited prompt, archived, keeps its tombstone

            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "d-x2", "revisionIndex": 2})
            assert await window(c, sid) == [("d-x1", False), ("d-y1", False), ("d-x2", True), ("d-y2e", False)]
            assert await hits(c, "belugaprompt") == []
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "d-x2", "revisionIndex": 1})

            # the mirror: the original deleted before the edit stays deleted on its branch, the edit does not
            mirror = await new_session(c)
            await say(c, mirror, "d-p", "original prompt")
            await c.call("session.deleteMessage", {"sessionId": mirror, "messageId": "d-p"})
            await c.call("session.truncateFrom", {"sessionId": mirror, "messageId": "d-p", "mode": "edit"})
            await say(c, mirror, "d-p", "edited prompt")
            await c.call("session.activateRevision", {"sessionId": mirror, "rootUserId": "d-p", "revisionIndex": 1})
            assert await window(c, mirror) == [("d-p", True)]
            await c.call("session.activateRevision", {"sessionId": mirror, "rootUserId": "d-p", "revisionIndex": 2})
            assert await window(c, mirror) == [("d-p", False)]
        async with real_host(data) as (_proc, c):
            assert await window(c, sid) == original
            assert await hits(c, "narwhalprompt") == [(sid, "d-x2")]
            assert await window(c, mirror) == [("d-p", False)]


async def test_a_deleted_prompt_stays_deleted_across_its_replies_branches(shared: HostProcess) -> None:
    """Seed 000 §3.2: "Regeneration appends a new assistant branch under the user message" — one prompt, two
    replies. §3.3: the prompt's tombstone hides that one node; deleted after the regenerate, it stays deleted
    whichever reply branch is shown (the two branches share it), and restoring it shows it on both."""
    with trio.fail_after(60):
        async with client(shared, "ui-rg") as c:
            sid = await new_session(c)
            await say(c, sid, "g-u1", "a prompt")
            await say(c, sid, "g-a1", "reply one", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "g-a1", "mode": "regenerate"})
            await say(c, sid, "g-a2", "reply two", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "g-u1"})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "g-u1", "revisionIndex": 1})
            assert await window(c, sid) == [("g-u1", True), ("g-a1", False)]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "g-u1", "revisionIndex": 2})
            assert await window(c, sid) == [("g-u1", True), ("g-a2", False)]
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "g-u1"})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "g-u1", "revisionIndex": 1})
            assert await window(c, sid) == [("g-u1", False), ("g-a1", False)]


async def test_a_reply_branch_switched_on_an_imported_copy_keeps_its_prompt(
        shared: HostProcess, tmp_path: Path) -> None:
    """Seed 000 §3.2: "Regeneration appends a new assistant branch under the user message" (both replies hang
    under the one prompt) and §3.3 "Physical deletion is reserved for an entire Thread or quota cleanup". The
    prompt is deleted while reply two is live, the user looks at reply one and back, then restores the prompt.
    The session's JSONL export imported on a host (README §9: "the copy's pager restores each archived branch
    as on the first host") shows reply one under the prompt when switched to, as the first host does."""
    with trio.fail_after(60):
        async with client(shared, "ui-ex") as c:
            sid = await new_session(c)
            await say(c, sid, "x-u0", "intro")
            await say(c, sid, "x-a0", "hello", "assistant")
            await say(c, sid, "x-u1", "the prompt")
            await say(c, sid, "x-a1", "reply one", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "x-a1", "mode": "regenerate"})
            await say(c, sid, "x-a2", "reply two", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "x-u1"})
            for index in (1, 2):
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "x-u1",
                                                          "revisionIndex": index})
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "x-u1"})
            out = tmp_path / "export.jsonl"
            await c.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
            imported = await c.call("import.sessions", {"source": "pi-host", "root": str(out)})
            copy = imported["sessions"][0]["sessionId"]
            root = (await c.call("session.get", {"sessionId": copy}))["messages"][2]["id"]
            await c.call("session.activateRevision", {"sessionId": copy, "rootUserId": root, "revisionIndex": 1})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "x-u1", "revisionIndex": 1})
            original = (await c.call("session.get", {"sessionId": sid}))["messages"]
            copied = (await c.call("session.get", {"sessionId": copy}))["messages"]
            assert [m["blocks"] for m in copied] == [m["blocks"] for m in original]  # intro, hello, prompt, reply one


async def test_the_reply_branches_of_a_deleted_prompt_can_be_switched_on_an_imported_copy(
        shared: HostProcess, tmp_path: Path) -> None:
    """Seed 000 §3.2: "The branch selector orders siblings by sequence and follows the newest default
    descendants when switching"; README §9: the copy's pager "restores each archived branch as on the first
    host". The prompt of a regenerated reply is deleted (a tombstone: §3.3); on the imported copy of the
    session's JSONL export, switching to the other reply works and shows what the first host shows, the prompt
    deleted (the export carries it content-free: its text never leaves the first host)."""
    with trio.fail_after(60):
        async with client(shared, "ui-ex2") as c:
            sid = await new_session(c)
            await say(c, sid, "z-u0", "intro")
            await say(c, sid, "z-a0", "hello", "assistant")
            await say(c, sid, "z-u1", "the prompt")
            await say(c, sid, "z-a1", "reply one", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "z-a1", "mode": "regenerate"})
            await say(c, sid, "z-a2", "reply two", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "z-u1"})
            out = tmp_path / "export.jsonl"
            await c.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
            imported = await c.call("import.sessions", {"source": "pi-host", "root": str(out)})
            copy = imported["sessions"][0]["sessionId"]
            families = (await c.call("session.listRevisions", {"sessionId": copy}))["revisions"]
            assert [r["revisionIndex"] for r in families] == [1]  # reply one, archived
            await c.call("session.activateRevision", {"sessionId": copy, "rootUserId": families[0]["rootUserId"],
                                                      "revisionIndex": 1})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "z-u1", "revisionIndex": 1})
            assert await ctx_ids(c, copy) == [f"{copy}:{mid}" for mid in await ctx_ids(c, sid)]
            assert await window(c, copy) == [(f"{copy}:{mid}", gone) for mid, gone in await window(c, sid)]
            assert b"the prompt" not in out.read_bytes()


# ---------------------------------------------------------- compaction x tombstones x tree, restart (§3, §4)

async def test_compaction_tombstones_and_branches_derive_the_same_context_and_tree_after_a_lost_index(
        tmp_path: Path) -> None:
    """Seed 000 §4: buildSessionContext "omits tombstones ... and produces provider-neutral messages" (here also
    applying the newest compaction checkpoint: ARCHITECTURE "From seed 000"), and §1 "recovery replays nodes".
    Tombstoning the checkpoint's boundary messages (its ``throughMessageId``, its ``firstKeptMessageId``) keeps
    the checkpoint applied: the context is the summary and the visible messages after it, never the whole
    history again. A regenerate and an edit on top; then the tree and the context read after a SIGKILL and
    the loss of the index are exactly what they were."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = await new_session(c)
            for i in range(1, 4):
                await say(c, sid, f"c-u{i}", f"question {i}")
                await say(c, sid, f"c-a{i}", f"answer {i}", "assistant")
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c-cp1", "summary": "Two exchanges so far.", "firstKeptMessageId": "c-u3",
                "throughMessageId": "c-a2", "tokensBefore": 100}})
            assert await ctx_ids(c, sid) == ["c-cp1", "c-u3", "c-a3"]
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "c-a2"})
            assert await ctx_ids(c, sid) == ["c-cp1", "c-u3", "c-a3"]
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "c-u3"})
            assert await ctx_ids(c, sid) == ["c-cp1", "c-a3"]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "c-a3", "mode": "regenerate"})
            await say(c, sid, "c-a3b", "answer 3, again", "assistant")
            await say(c, sid, "c-u4", "question 4")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "c-u4", "mode": "edit"})
            await say(c, sid, "c-u4", "question 4, edited")
            context = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in context["messages"]] == ["c-cp1", "c-a3b", "c-u4"]
            assert context["compaction"]["id"] == "c-cp1"
            tree = await c.call("session.tree", {"sessionId": sid})
            nodes = {n["id"]: n for n in tree["nodes"]}
            # the archived reply stays under its (tombstoned) prompt; the live one under the visible ancestor
            assert nodes["rev:c-u3:1:c-a3"]["parentId"] == "c-u3" and nodes["c-a3b"]["parentId"] == "c-u2"
            assert nodes["c-u3"]["deleted"] and nodes["c-a2"]["deleted"]
            assert nodes["rev:c-u4:1:c-u4"]["parentId"] == nodes["c-u4"]["parentId"] == "c-a3b"
            assert tree["activeLeafId"] == "c-u4"
        lose_index(data)
        async with real_host(data) as (_proc, c):
            assert await c.call("session.context", {"sessionId": sid}) == context
            assert await c.call("session.tree", {"sessionId": sid}) == tree


# ------------------------------------------------------------------------------ latest Turn context (§4)

async def test_an_edit_that_reuses_the_prompt_id_leaves_the_turn_that_ran_on_the_old_prompt_behind(
        shared: HostProcess) -> None:
    """Seed 000 §4: "buildSessionContext ... produces provider-neutral messages plus the latest Turn context",
    and README: the latest is the newest turn "on the active branch"; a turn is on it "while a live transcript
    message carries its turnId or is its bound input"; "A turn left only on an archived branch (regenerate,
    edit, session.activateRevision) is not it." The user edits the prompt of turn T2 under the same id (README:
    "the edited message either reuses the id ..."): T2's prompt and reply are archived, the live message of
    that id holds other words (``session.verifyEnvironment`` calls T2's input drifted), so the latest Turn
    context is T1's, until a turn runs on the edited prompt. A regenerate keeps T2's prompt live: still T2."""
    with trio.fail_after(60):
        async with client(shared, "ui-tc") as ui, client(shared, "sidecar-tc", "agent") as sc:
            sid = await new_session(ui)

            async def turn(turn_id: str, prompt_id: str, text: str, reply_id: str) -> None:
                await say(ui, sid, prompt_id, text)
                await sc.call("session.startTurn", {
                    "sessionId": sid, "turnId": turn_id,
                    "environment": {"version": 1, "systemPrompt": f"prompt of {turn_id}"},
                    "input": {"messageId": prompt_id, "blocks": [{"type": "text", "text": text}]}})
                await sc.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    reply_id, f"reply of {turn_id}", role="assistant", turnId=turn_id)})
                await sc.call("session.endTurn", {"sessionId": sid, "turnId": turn_id, "status": "completed"})

            async def latest() -> str | None:
                found = (await ui.call("session.context", {"sessionId": sid}))["turnContext"]
                return None if found is None else str(found["turnId"])

            await turn("tc-T1", "tc-u1", "first prompt", "tc-a1")
            await turn("tc-T2", "tc-u2", "second prompt", "tc-a2")
            assert await latest() == "tc-T2"
            await ui.call("session.truncateFrom", {"sessionId": sid, "messageId": "tc-a2", "mode": "regenerate"})
            assert await latest() == "tc-T2"  # its prompt is still live
            await ui.call("session.truncateFrom", {"sessionId": sid, "messageId": "tc-u2", "mode": "edit"})
            assert await latest() == "tc-T1"
            await say(ui, sid, "tc-u2", "second prompt, edited")
            assert await code_of(ui, "session.verifyEnvironment",
                                 {"sessionId": sid, "turnId": "tc-T2"}) == "ENVIRONMENT_DRIFT"
            assert await latest() == "tc-T1"
            await ui.call("session.deleteMessage", {"sessionId": sid, "messageId": "tc-a1"})
            assert await latest() == "tc-T1"  # "(tombstoned or not)"
            await sc.call("session.startTurn", {
                "sessionId": sid, "turnId": "tc-T3", "environment": {"version": 1, "systemPrompt": "third"},
                "input": {"messageId": "tc-u2", "blocks": [{"type": "text", "text": "second prompt, edited"}]}})
            await sc.call("session.endTurn", {"sessionId": sid, "turnId": "tc-T3", "status": "completed"})
            assert await latest() == "tc-T3"  # bound to the live prompt, no reply yet
            await ui.call("session.activateRevision", {"sessionId": sid, "rootUserId": "tc-u2", "revisionIndex": 1})
            assert await latest() == "tc-T2"  # T2's branch is live again


# ------------------------------------------------------------------- approvals and interactions (§2)

async def _running_turn(ui: HostClient, sc: HostClient, turn_id: str) -> str:
    sid = await new_session(ui)
    await sc.call("session.startTurn", {"sessionId": sid, "turnId": turn_id})
    return sid


async def test_only_a_user_decides_and_a_refused_decision_changes_nothing(shared: HostProcess) -> None:
    """Seed 000 §2: "approvals, interactions | Pending and resolved user RPC state" — resolved by the user.
    README: "A client of kind agent may not answer (PERMISSION_DENIED)"; a plugin neither. An option the
    request does not offer is INVALID_PARAMS, an answer for another session's request CONFLICT; after each
    refusal the request is still pending. The UI's answer wins once; a second answer, the same or another, is
    CONFLICT with the decided status; the sidecar asking again for the same tool call gets the decided request,
    and the end of the turn does not change it."""
    with trio.fail_after(60):
        async with client(shared, "ui-ap") as ui, client(shared, "sidecar-ap", "agent") as sc, \
                client(shared, "plug-ap", "plugin", plugin_id="ap-plugin") as plug:
            sid = await _running_turn(ui, sc, "ap-t1")
            other = await new_session(ui)
            ask = {"sessionId": sid, "turnId": "ap-t1", "toolCallId": "ap-c1", "tool": "Bash", "risk": "high"}
            rid = (await sc.call("approvals.request", ask))["request"]["requestId"]
            for who in (sc, plug):
                answer = {"sessionId": sid, "requestId": rid, "optionId": "allow_once"}
                assert await code_of(who, "approvals.respond", answer) == "PERMISSION_DENIED"
            assert await code_of(ui, "approvals.respond", {"sessionId": sid, "requestId": rid,
                                                           "optionId": "allow_forever"}) == "INVALID_PARAMS"
            assert await code_of(ui, "approvals.respond", {"sessionId": other, "requestId": rid,
                                                           "optionId": "deny"}) == "CONFLICT"
            pending = (await ui.call("approvals.pending", {"sessionId": sid}))["pending"]
            assert [(p["requestId"], p["status"]) for p in pending] == [(rid, "pending")]

            won = await ui.call("approvals.respond", {"sessionId": sid, "requestId": rid, "optionId": "allow_once"})
            assert won["request"]["status"] == "allowed" and won["request"]["respondedBy"] == "ui-ap"
            for option in ("allow_once", "deny"):
                code, data = await error_of(ui, "approvals.respond",
                                            {"sessionId": sid, "requestId": rid, "optionId": option})
                assert (code, data.get("status")) == ("CONFLICT", "allowed"), option
            again = await sc.call("approvals.request", ask)
            assert again["request"]["requestId"] == rid and again["request"]["status"] == "allowed"
            await sc.call("session.endTurn", {"sessionId": sid, "turnId": "ap-t1", "status": "completed"})
            page = await ui.call("session.get", {"sessionId": sid})
            assert [(d["requestId"], d["status"]) for d in page["decisions"]] == [(rid, "allowed")]
            assert (await ui.call("approvals.pending", {"sessionId": sid}))["pending"] == []


async def test_a_question_refuses_answers_outside_its_shape_and_stays_pending(shared: HostProcess) -> None:
    """Seed 000 §2 (interactions: pending and resolved user RPC state). A single-choice question without free
    text refuses a choice it did not offer, two choices, the same choice twice, free text, and an empty
    answer — each INVALID_PARAMS, the question still pending — then takes one offered choice, once."""
    with trio.fail_after(60):
        async with client(shared, "ui-q") as ui, client(shared, "sidecar-q", "agent") as sc:
            sid = await _running_turn(ui, sc, "q-t1")
            asked = await sc.call("interactions.request", {
                "sessionId": sid, "turnId": "q-t1", "toolCallId": "q-c1", "question": "Which branch?",
                "choices": [{"id": "main", "label": "main"}, {"id": "dev", "label": "dev"}]})
            qid = asked["request"]["requestId"]
            wrong: list[dict[str, Any]] = [{"choiceIds": ["release"]}, {"choiceIds": ["main", "dev"]},
                                           {"choiceIds": ["dev", "dev"]}, {"text": "whatever you think"}, {},
                                           {"choiceIds": []}]
            for answer in wrong:
                code = await code_of(ui, "interactions.respond", {"sessionId": sid, "requestId": qid, "answer": answer})
                assert code == "INVALID_PARAMS", answer
            pending = (await ui.call("interactions.pending", {"sessionId": sid}))["pending"]
            assert [(p["requestId"], p["status"]) for p in pending] == [(qid, "pending")]
            done = await ui.call("interactions.respond", {"sessionId": sid, "requestId": qid,
                                                          "answer": {"choiceIds": ["dev"]}})
            assert done["request"]["status"] == "answered" and done["request"]["answer"]["choiceIds"] == ["dev"]
            code, data = await error_of(ui, "interactions.respond", {"sessionId": sid, "requestId": qid,
                                                                     "answer": {"choiceIds": ["main"]}})
            assert (code, data.get("status")) == ("CONFLICT", "answered")
            assert (await ui.call("interactions.pending", {"sessionId": sid}))["pending"] == []


async def test_a_request_whose_deadline_has_already_passed_expires_and_its_waiter_is_told(
        shared: HostProcess) -> None:
    """Seed 000 §2 (pending and resolved user RPC state); README: "`expiresAt` Absolute deadline; later answers
    are refused" and `approvals.pending` lists "Pending, unexpired permission requests". A request (approval
    or question) asked with a deadline already behind it is never listed pending, its answer is CONFLICT
    ``expired``, the sidecar hears ``*.resolved`` ``expired`` (it does not wait forever), and asking again for
    the same tool call returns the expired request rather than a second prompt."""
    with trio.fail_after(60):
        async with client(shared, "ui-exp") as ui, client(shared, "sidecar-exp", "agent") as sc:
            sid = await _running_turn(ui, sc, "exp-t1")
            await sc.subscribe(["approval.resolved", "interaction.resolved"], session_id=sid)
            past = int(time.time() * 1000) - 1000
            ask = {"sessionId": sid, "turnId": "exp-t1", "toolCallId": "exp-c1", "tool": "Bash", "risk": "low",
                   "expiresAt": past}
            rid = (await sc.call("approvals.request", ask))["request"]["requestId"]
            qid = (await sc.call("interactions.request", {
                "sessionId": sid, "turnId": "exp-t1", "toolCallId": "exp-c2", "question": "?",
                "allowFreeText": True, "expiresAt": past}))["request"]["requestId"]
            heard: dict[str, str] = {}
            with trio.fail_after(10):
                while len(heard) < 2:
                    event = await sc.next_event()
                    heard[event.data["request"]["requestId"]] = event.data["request"]["status"]
            assert heard == {rid: "expired", qid: "expired"}
            assert (await ui.call("approvals.pending", {"sessionId": sid}))["pending"] == []
            assert (await ui.call("interactions.pending", {"sessionId": sid}))["pending"] == []
            code, data = await error_of(ui, "approvals.respond", {"sessionId": sid, "requestId": rid,
                                                                  "optionId": "allow_once"})
            assert (code, data.get("status")) == ("CONFLICT", "expired")
            code, data = await error_of(ui, "interactions.respond", {"sessionId": sid, "requestId": qid,
                                                                     "answer": {"text": "late"}})
            assert (code, data.get("status")) == ("CONFLICT", "expired")
            again = (await sc.call("approvals.request", {**ask, "expiresAt": past + 3_600_000}))["request"]
            assert (again["requestId"], again["status"]) == (rid, "expired")


async def test_a_restart_between_ask_and_answer_interrupts_both_kinds_and_the_window_shows_them(
        tmp_path: Path) -> None:
    """Seed 000 §2 + ARCHITECTURE "From seed 000": "Pending user RPCs (approvals, interactions): persisted,
    pushed to UI clients as events, resolved once; the boot fence marks those pending at restart
    `interrupted`." One answered approval and a pending approval and question at a SIGKILL: after the restart
    nothing is pending, each late answer is CONFLICT ``interrupted``, the answered one keeps its answer, the
    window's ``decisions`` lists all three, and the fenced turn can ask nothing more."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, sc), client(proc, "ui-r") as ui:
            sid = await _running_turn(ui, sc, "r-t1")
            base = {"sessionId": sid, "turnId": "r-t1", "tool": "Edit", "risk": "medium"}
            answered = (await sc.call("approvals.request", {**base, "toolCallId": "r-c1"}))["request"]["requestId"]
            await ui.call("approvals.respond", {"sessionId": sid, "requestId": answered, "optionId": "deny"})
            waiting = (await sc.call("approvals.request", {**base, "toolCallId": "r-c2"}))["request"]["requestId"]
            question = (await sc.call("interactions.request", {
                "sessionId": sid, "turnId": "r-t1", "toolCallId": "r-c3", "question": "ok?",
                "allowFreeText": True}))["request"]["requestId"]
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, sc), client(proc, "ui-r") as ui:
            assert (await ui.call("approvals.pending", {}))["pending"] == []
            assert (await ui.call("interactions.pending", {}))["pending"] == []
            code, found = await error_of(ui, "approvals.respond", {"sessionId": sid, "requestId": waiting,
                                                                   "optionId": "allow_once"})
            assert (code, found.get("status")) == ("CONFLICT", "interrupted")
            code, found = await error_of(ui, "interactions.respond", {"sessionId": sid, "requestId": question,
                                                                      "answer": {"text": "yes"}})
            assert (code, found.get("status")) == ("CONFLICT", "interrupted")
            code, found = await error_of(ui, "approvals.respond", {"sessionId": sid, "requestId": answered,
                                                                   "optionId": "allow_once"})
            assert (code, found.get("status")) == ("CONFLICT", "denied")
            page = await ui.call("session.get", {"sessionId": sid})
            assert sorted((d["requestId"], d["status"]) for d in page["decisions"]) == sorted(
                [(answered, "denied"), (waiting, "interrupted"), (question, "interrupted")])
            assert await code_of(sc, "approvals.request", {**base, "toolCallId": "r-c4"}) == "CONFLICT"


# ------------------------------------------------------------------------------- attachments (§2.3, §5)

async def test_eviction_takes_the_least_recently_used_first_and_every_reader_sees_the_marks_until_a_reput(
        tmp_path: Path) -> None:
    """Seed 000 §5: "Attachment cleanup removes the oldest attachments outside the active Thread after the
    200 MB budget" (README: least recently used: a put or ``attachments.ref`` is a use) and §2.3 "Eviction
    marks references before deleting bytes". Four blobs of another thread and an image: the oldest one,
    used again, goes last; one the active thread holds by a client reference stays. A reader of the other
    thread — the window, the context, a fork of it made after the eviction, ``attachments.get`` (each
    reference) — sees ``evicted`` on exactly the evicted blocks; storing the same bytes again clears the marks
    for every reader of them."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            active, other = await new_session(c), await new_session(c)
            blobs = {}
            for i, fill in enumerate(b"abcd"):
                blobs[chr(fill)] = blob = await put_file(c, bytes([fill]))
                await c.call("session.appendMessage", {"sessionId": other, "message": msg(
                    f"e-o{i}", "x", blocks=[{"type": "text", "text": "see"}, file_block(blob)])})
            image = await c.call("attachments.put", {
                "name": "p.png", "mimeType": "image/png", "kind": "image",
                "dataBase64": base64.b64encode(b"\x89PNG-ish" * 100).decode()})
            await c.call("session.appendMessage", {"sessionId": other, "message": msg("e-img", "x", blocks=[
                {"type": "attachment", "kind": "image", "name": "p.png", "ref": image["ref"],
                 "mimeType": "image/png", "size": image["size"]}])})
            await c.call("attachments.ref", {"sha256": blobs["a"]["sha256"], "sessionId": other,
                                             "messageId": "e-o0"})  # the oldest is used again
            await c.call("attachments.ref", {"sha256": blobs["b"]["sha256"], "sessionId": active})
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 1000})
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            name = {b["sha256"]: k for k, b in blobs.items()} | {image["sha256"]: "img"}
            assert [name[h] for h in gc["evicted"]] == ["c", "d", "img", "a"]
            assert gc["estimate"]["usedBytes"] == 1000 and gc["estimate"]["blobs"] == 1

            def marks(messages: list[dict[str, Any]]) -> list[bool]:
                return [any(b.get("evicted") for b in m["blocks"]) for m in messages]

            evicted_marks = [True, False, True, True, True]
            assert marks((await c.call("session.get", {"sessionId": other}))["messages"]) == evicted_marks
            assert marks((await c.call("session.context", {"sessionId": other}))["messages"]) == evicted_marks
            fork = (await c.call("session.fork", {"sessionId": other}))["id"]
            assert marks((await c.call("session.get", {"sessionId": fork}))["messages"]) == evicted_marks
            got = await c.call("attachments.get", {"sha256": blobs["a"]["sha256"]})
            assert got["deletionState"] == "evicted"
            assert sorted(r["sessionId"] for r in got["references"]) == sorted([other, fork])
            assert all(r["evicted"] for r in got["references"])

            assert (await put_file(c, b"c"))["sha256"] == blobs["c"]["sha256"]  # the same bytes again
            revived = [True, False, False, True, True]
            assert marks((await c.call("session.get", {"sessionId": other}))["messages"]) == revived
            assert marks((await c.call("session.get", {"sessionId": fork}))["messages"]) == revived
            assert marks((await c.call("session.context", {"sessionId": fork}))["messages"]) == revived
            assert (await c.call("attachments.get", {"sha256": blobs["c"]["sha256"]}))["deletionState"] == "live"
