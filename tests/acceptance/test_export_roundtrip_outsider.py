"""Outsider: a person's session moves between machines without loss — ``session.export`` (JSONL) on one
``pi-host serve`` and ``import.sessions`` source ``pi-host`` on another, with its own data directory.

Written from protocol/README.md (section 9: "`session.export` ... this host's JSONL (which `import.sessions`
with source `pi-host` reads back to the same messages"; the README's `pi-host export` / `pi-host import`), seed 003
(§2 file layout, §2.0 review snapshots, §2.1 transcripts, §4.9 revisions, §10.4 "Exported sessions exclude
secrets by default") and seed 000 (tree, tombstones, attachments), black-box against real host processes: one
rich session on host 1 (every block kind, usage, a regenerate with its archived revision and the other branch
switched to, an edit, a tombstone, a checkpoint, a review snapshot, a subagent's rows, a child session, a queued
prompt, a plan), exported, imported into host 2, and compared as a user sees it.

Known and documented, not checked as losses: the copy is ``source: "pi-host"`` with a new id and namespaced
message ids (``<new id>:<old id>``); a re-imported child's ``spawnedBy`` names its parent's id on host 1.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from runtime.client import HostClient, RpcError, open_client
from tests.acceptance.outsiderkit import error_of, real_host, say
from tests.hostkit import HostProcess, msg, run_cli

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
PDF = b"%PDF-1.4\n% a pelican's notes\n" + bytes(range(256)) * 40
SECRET = "sk-ant-roundtrip-5f4e3d2c1b0a9988"
SECRET_2 = "ghp_roundtripTokenValue0099887766"
PROVIDER_KEY = "sk-prov-roundtrip-778899aabbccddee"
ODD_TEXT = ("line\u2028separator, next\u0085line, paragraph\u2029end, CR\r and CRLF\r\n, tab\t, NUL-free "
            "emoji 🦩🏳️‍🌈, RTL שלום, combining e\u0301, \"quotes\" and \\backslash\\ stork")
SID = "rich"
CHILD = "rich-child"


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Built:
    """What host 1 holds after :func:`build_rich`."""

    sid: str
    workspace: Path
    png_sha: str
    pdf_sha: str
    turns: list[str] = field(default_factory=list)


async def build_rich(c: HostClient, workspace: Path) -> Built:
    """One session with everything a person makes in it (see the module doc). Its live branch, top to bottom:
    u1 (text + image) → a1 (thinking, text; first variant, switched back to) · t1 (tool call + result, a
    review card) · sub1/sub2 (a subagent's rows) · u2 → a2 · u3 (edited: the first wording replaced) → a3 ·
    gone (tombstoned) · back (tombstoned, then restored) · u4 → a4 (a file attachment) · odd (text with every
    line-breaking character JSON and Python know, an error reply) · sys1 (a system notice) · checkpoint cp1
    after a3."""
    await trio.Path(workspace).mkdir()
    await c.call("secrets.set", {"ref": "secret:provider/anthropic", "value": SECRET})
    await c.call("secrets.set", {"ref": "secret:github/token", "value": SECRET_2})
    await c.call("providers.create", {"name": "Anth", "baseUrl": "https://api.example.org", "apiKey": PROVIDER_KEY})
    await c.call("session.create", {"sessionId": SID, "title": "Pelican ✓ 鹈鹕 roundtrip", "thinkingLevel": "high",
                                    "projectPath": str(workspace), "providerId": "anth", "modelId": "m1",
                                    "mode": "agent", "permissionMode": "ask"})
    png = await c.call("attachments.put", {"name": "shot.png", "mimeType": "image/png", "kind": "image",
                                           "dataBase64": base64.b64encode(PNG).decode()})
    pdf = await c.call("attachments.put", {"name": "notes.pdf", "mimeType": "application/pdf", "kind": "file",
                                           "dataBase64": base64.b64encode(PDF).decode()})
    built = Built(SID, workspace, png["sha256"], pdf["sha256"])

    async def turn(tid: str, messages: list[dict[str, Any]], tokens: tuple[int, int]) -> None:
        await c.call("session.startTurn", {"sessionId": SID, "turnId": tid, "providerId": "anth", "modelId": "m1"})
        for m in messages:
            await c.call("session.appendMessage", {"sessionId": SID, "message": {**m, "turnId": tid}})
        await c.call("session.endTurn", {"sessionId": SID, "turnId": tid, "status": "completed",
                                         "usage": {"inputTokens": tokens[0], "outputTokens": tokens[1]}})
        built.turns.append(tid)

    def usage(i: int, o: int) -> dict[str, Any]:
        return {"input": i, "output": o, "cacheRead": 0, "cacheWrite": 0, "totalTokens": i + o,
                "cost": {"total": 0.001}}

    (workspace / "notes.md").write_text("# notes, after\n")
    await turn("t1", [
        msg("u1", "", blocks=[{"type": "text", "text": "draw a pelican, key " + SECRET},
                              {"type": "attachment", "kind": "image", "name": "shot.png", "ref": png["ref"],
                               "mimeType": "image/png", "size": png["size"]}]),
        msg("a1", "", role="assistant", blocks=[
            {"type": "thinking", "text": "musing quokka", "signature": "sig-1"},
            {"type": "text", "text": "first answer heron"}],
            meta={"modelId": "m1", "providerId": "anth", "usage": usage(100, 20), "apiKey": "plain-api-key-value"}),
    ], (100, 20))
    await c.call("session.truncateFrom", {"sessionId": SID, "messageId": "a1", "mode": "regenerate"})
    await turn("t2", [msg("a1b", "second answer egret", role="assistant",
                          meta={"modelId": "m1", "providerId": "anth", "usage": usage(50, 5)})], (50, 5))
    await c.call("session.saveActiveRevision", {"sessionId": SID, "rootUserId": "u1"})
    await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": "u1", "revisionIndex": 1})
    review = await c.call("review.record", {"sessionId": SID, "path": "notes.md",
                                            "beforeBase64": base64.b64encode(b"# notes, before\n").decode(),
                                            "toolName": "Write", "toolCallId": "c1", "messageId": "t1"})
    await turn("t3", [
        msg("t1", "", role="tool", toolName="Write", blocks=[
            {"type": "tool_call", "callId": "c1", "name": "Write",
             "args": {"path": "notes.md", "content": "# notes, after\n", "token": SECRET_2},
             "result": f"wrote notes.md pelican-tool-output (ANTHROPIC_API_KEY={PROVIDER_KEY})", "status": "success",
             "details": {"review": review["review"]}}]),
        msg("sub1", "subagent looks around ibis", role="assistant",
            meta={"parentToolCallId": "c_task", "agentName": "explorer"}),
        msg("sub2", "subagent found spoonbill", role="assistant",
            meta={"parentToolCallId": "c_task", "agentName": "explorer"}),
        msg("u2", "second question flamingo"),
        msg("a2", "", role="assistant", blocks=[{"type": "thinking", "text": "second musing"},
                                                {"type": "text", "text": "second reply cormorant"}],
            meta={"modelId": "m1", "providerId": "anth", "usage": usage(200, 40)}),
        msg("u3", "third question, first wording"),
    ], (200, 40))
    await c.call("session.truncateFrom", {"sessionId": SID, "messageId": "u3", "mode": "edit"})
    await turn("t4", [
        msg("u3e", "third question, edited wording albatross"),
        msg("a3", "third reply gannet", role="assistant",
            meta={"modelId": "m1", "providerId": "anth", "usage": usage(300, 60)}),
        msg("gone", "a regret walrus"),
        msg("back", "deleted, then restored: grebe"),
    ], (300, 60))
    await c.call("session.deleteMessage", {"sessionId": SID, "messageId": "gone"})
    await c.call("session.deleteMessage", {"sessionId": SID, "messageId": "back"})
    await c.call("session.restoreMessage", {"sessionId": SID, "messageId": "back"})
    await c.call("session.appendCompaction", {"sessionId": SID, "compaction": {
        "id": "cp1", "summary": f"summary of the pelican talk ({SECRET_2})", "throughMessageId": "a3",
        "firstKeptMessageId": "u3e", "tokensBefore": 900, "retainedTail": []}})
    await turn("t5", [
        msg("u4", "", blocks=[{"type": "text", "text": "read my notes"},
                              {"type": "attachment", "kind": "file", "name": "notes.pdf", "ref": pdf["ref"],
                               "mimeType": "application/pdf", "size": pdf["size"]}]),
        msg("a4", "the notes say puffin", role="assistant",
            meta={"modelId": "m1", "providerId": "anth", "usage": usage(400, 80)}),
        msg("odd", ODD_TEXT, role="assistant", meta={"status": "error", "error": "overloaded"}),
        msg("sys1", "a system notice: the model changed", role="system", meta={"importedKind": "note"}),
    ], (400, 80))
    child = await c.call("session.fork", {"sessionId": SID, "throughMessageId": "a2", "title": "Pelican child"})
    await c.call("session.updateMetadata", {"sessionId": child["id"], "parentThreadId": SID, "tags": ["fork"]})
    await c.call("session.updateMetadata", {"sessionId": SID, "tags": ["birds", "drawing"], "folder": "Zoo/Birds",
                                            "preset": "artist"})
    await c.call("session.queuePush", {"sessionId": SID, "principal": "ui", "idempotencyKey": "q-1",
                                       "content": "later: draw a heron", "permissionMode": "ask"})
    await c.call("session.update", {"sessionId": SID, "mode": "plan"})
    await c.call("session.startTurn", {"sessionId": SID, "turnId": "t6"})
    await c.call("plans.submit", {"sessionId": SID, "turnId": "t6", "toolCallId": "c_plan", "kind": "plan",
                                  "markdown": "# Plan\n1. draw the heron\n", "title": "Heron plan",
                                  "question": "Draw it?", "workspaceRoot": str(workspace)})
    return built


async def child_of(c: HostClient, sid: str) -> str:
    """The session ``session.fork`` made of ``sid`` (the only other one)."""
    listed = await c.call("session.list", {})
    [child] = [s["id"] for s in listed["sessions"] if s["id"] != sid]
    return str(child)


async def pages(c: HostClient, sid: str, size: int = 3) -> list[dict[str, Any]]:
    """Every message of the session read newest page first, ``size`` at a time, in transcript order."""
    out: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        params: dict[str, Any] = {"sessionId": sid, "messageLimit": size, "contentLimit": 1_000_000}
        if before is not None:
            params["messageBefore"] = before
        page = await c.call("session.get", params)
        out[:0] = page["messages"]
        if not page["hasMoreBefore"]:
            return out
        before = page["messageStart"]


def local(mid: str, sid: str) -> str:
    """A message or checkpoint id on host 2 as it was on host 1 (the import namespaces them ``<new sid>:<id>``
    and ``<new sid>:compaction:<id>``)."""
    return mid.removeprefix(f"{sid}:").removeprefix("compaction:")


def shown(m: dict[str, Any], sid: str) -> dict[str, Any]:
    """A message as a person sees it, ids made comparable across the hosts; ``seq`` is compared apart."""
    out = {k: v for k, v in m.items() if k not in ("seq", "turnId")}
    out["id"] = local(m["id"], sid)
    return out


async def export_to(c: HostClient, sid: str, out: Path, **options: Any) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.export", {"sessionId": sid, "format": "jsonl",
                                                             "outPath": str(out), **options})
    return result


async def import_file(c: HostClient, path: Path) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("import.sessions", {"source": "pi-host", "root": str(path)})
    return result


@asynccontextmanager
async def two_hosts(tmp_path: Path) -> AsyncIterator[tuple[HostProcess, HostClient, HostProcess, HostClient]]:
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    async with real_host(tmp_path / "d1") as (p1, c1), real_host(tmp_path / "d2") as (p2, c2):
        yield p1, c1, p2, c2


@dataclass
class Roundtrip:
    built: Built
    new_sid: str
    report: dict[str, Any]
    one: dict[str, Any]
    two: dict[str, Any]


async def view(c: HostClient, sid: str) -> dict[str, Any]:
    """Everything of one session a person sees through the host."""
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    searches = {}
    for word in ("heron", "egret", "cormorant", "albatross", "walrus", "quokka", "puffin", "ibis", "grebe", "stork",
                 "pelican-tool-output"):
        scope = "tools" if word == "pelican-tool-output" else "messages"
        hits = await c.call("search.query", {"query": word, "sessionId": sid, "scope": scope})
        searches[word] = sorted(local(r["messageId"], sid) for r in hits["results"])
    return {"session": got["session"], "messages": [shown(m, sid) for m in got["messages"]],
            "seqs": [m["seq"] for m in got["messages"]], "pages": [shown(m, sid) for m in await pages(c, sid)],
            "compactions": got["compactions"], "total": got["totalMessages"],
            "revisions": (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"],
            "usage": (await c.call("usage.session", {"sessionId": sid}))["total"],
            "context": [local(m["id"], sid) for m in (await c.call("session.context", {"sessionId": sid}))["messages"]],
            "search": searches,
            "review": (await c.call("review.list", {"sessionId": sid}))["snapshots"],
            "plans": (await c.call("plans.pending", {"sessionId": sid}))["pending"],
            "queue": (await c.call("session.queueList", {"sessionId": sid}))["entries"]}


async def roundtrip(tmp_path: Path, **options: Any) -> Roundtrip:
    """Build the rich session on host 1, export it (JSONL, thinking kept unless told), import it on host 2."""
    out = tmp_path / "rich.jsonl"
    async with two_hosts(tmp_path) as (_p1, c1, p2, c2):
        built = await build_rich(c1, tmp_path / "ws")
        one = await view(c1, SID)
        await export_to(c1, SID, out, **{"includeThinking": True, **options})
        report = await import_file(c2, out)
        [session] = report["sessions"]
        assert session["status"] == "new", session
        two = await view(c2, session["sessionId"])
        two["blobs"] = {sha: h(blob.read_bytes()) if (blob := p2.data_dir / "attachments" / sha).exists() else None
                        for sha in (built.png_sha, built.pdf_sha)}
        two["attachments"] = {sha: (await error_of(c2, "attachments.get", {"sha256": sha}))[0]
                              for sha in (built.png_sha, built.pdf_sha)}
        return Roundtrip(built, session["sessionId"], report, one, two)


# --------------------------------------------------------------------------- what a person reads


async def test_every_message_and_block_reads_the_same_on_the_second_host(tmp_path: Path) -> None:
    """README §9: JSONL "which `import.sessions` with source `pi-host` reads back to the same messages"; seed
    003 §2.1: "blocks is the canonical block vocabulary" (text, thinking, tool calls with their results, images
    and files, a subagent's attributed rows). Exported with `includeSecrets` and `includeThinking`: nothing is
    redacted or left out."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path, includeSecrets=True)
    one, two = rt.one, rt.two
    visible = [m for m in one["messages"] if not m.get("deleted")]
    assert [m["id"] for m in two["messages"]] == [m["id"] for m in visible]
    for a, b in zip(visible, two["messages"], strict=True):
        assert a["role"] == b["role"] and a["blocks"] == b["blocks"], a["id"]
        assert a.get("createdAt") == b.get("createdAt") and a.get("toolName") == b.get("toolName"), a["id"]
        assert {k: v for k, v in (a.get("meta") or {}).items() if k not in ("revisionRootId",)} == \
            {k: v for k, v in (b.get("meta") or {}).items() if k not in ("revisionRootId",)}, a["id"]
    kinds = {blk["type"] for m in two["messages"] for blk in m["blocks"]}
    assert {"text", "thinking", "tool_call", "attachment"} <= kinds
    assert two["seqs"] == list(range(1, len(two["messages"]) + 1))
    [odd] = [m for m in two["messages"] if m["id"] == "odd"]
    assert odd["blocks"] == [{"type": "text", "text": ODD_TEXT}]
    assert two["search"]["stork"] == ["odd"]
    assert two["pages"] == two["messages"]  # paging backward three at a time reads the same rows
    assert two["total"] == len(visible)
    assert [m["id"] for m in two["messages"] if (m.get("meta") or {}).get("agentName") == "explorer"] == \
        ["sub1", "sub2"]
    assert two["session"]["title"] == one["session"]["title"] == "Pelican ✓ 鹈鹕 roundtrip"
    assert two["session"]["projectPath"] == one["session"]["projectPath"]
    assert rt.report["counts"]["new"] == 1 and rt.report["unreadLines"] == 0


async def test_the_edit_and_the_switched_branch_come_over_as_shown(tmp_path: Path) -> None:
    """Seed 000 §3.2 "Editing a user message appends a sibling under the original parent. Regeneration appends
    a new assistant branch under the user message": the transcript the person sees after an edit and a
    switch back to the first variant (a1, u3e) is the one host 2 shows, and the discarded wording is not in it."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    ids = [m["id"] for m in rt.two["messages"]]
    assert "a1" in ids and "a1b" not in ids and "u3e" in ids and "u3" not in ids
    assert rt.two["context"] == [i for i in rt.one["context"] if i != "gone"]
    assert rt.two["search"]["albatross"] == ["u3e"] and rt.two["search"]["heron"] == ["a1"]


async def test_archived_revisions_and_the_pager_come_over(tmp_path: Path) -> None:
    """Seed 003 §4.9 / acceptance 13: "Regenerated assistant variants survive restart in
    sessions/<id>.revisions.jsonl; the live root user turn reloads with revisionCount / activeRevision, the
    pager can restore any archived branch"."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    strip = [{k: v for k, v in r.items() if k not in ("createdAt", "rootUserId")} for r in rt.one["revisions"]]
    # u1's two answers (the first active again) and u3's first wording (the edit archived it)
    assert [(r["rootUserId"], r["revisionIndex"], r["isActive"]) for r in rt.one["revisions"]] == \
        [("u1", 1, True), ("u1", 2, False), ("u3", 1, False)]
    assert [local(r["rootUserId"], rt.new_sid) for r in rt.two["revisions"]] == ["u1", "u1", "u3"]
    assert [{k: v for k, v in r.items() if k not in ("createdAt", "rootUserId")} for r in rt.two["revisions"]] \
        == strip


async def test_the_copys_pager_restores_each_archived_branch_as_host_1_does(tmp_path: Path) -> None:
    """Seed 003 acceptance 13 "the pager can restore any archived branch": switching to each variant of the
    regenerated turn, then back, shows on host 2 what it shows on host 1 (u3's archived first wording has no
    live root on either host: u3e was appended without ``meta.revisionRootId``); a second export
    of the same session imports as `unchanged` and one after another regenerate on host 1 as `updated`."""
    out = tmp_path / "rich.jsonl"
    with trio.fail_after(120):
        async with two_hosts(tmp_path) as (_p1, c1, _p2, c2):
            await build_rich(c1, tmp_path / "ws")
            await export_to(c1, SID, out, includeSecrets=True, includeThinking=True)
            [s] = (await import_file(c2, out))["sessions"]
            new = s["sessionId"]

            async def shows(c: HostClient, sid: str) -> list[tuple[str, str, Any]]:
                got = await c.call("session.get", {"sessionId": sid, "full": True})
                return [(local(m["id"], sid), m["role"], m["blocks"]) for m in got["messages"] if not m.get("deleted")]

            for root, idx in (("u1", 2), ("u1", 1)):
                for c, sid in ((c1, SID), (c2, new)):
                    await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": (
                        root if sid == SID else f"{new}:{root}"), "revisionIndex": idx})
                assert await shows(c2, new) == await shows(c1, SID), (root, idx)
            again = tmp_path / "again" / "rich.jsonl"
            again.parent.mkdir()
            await c1.call("session.truncateFrom", {"sessionId": SID, "messageId": "a4", "mode": "regenerate"})
            await export_to(c1, SID, again, includeSecrets=True, includeThinking=True)
            await c1.call("session.activateRevision", {"sessionId": SID, "rootUserId": "u4", "revisionIndex": 1})
            [s2] = (await import_file(c2, again))["sessions"]
            assert s2["sessionId"] == new and s2["status"] == "updated" and s2["archivedBranches"] >= 1
            twice = tmp_path / "twice" / "rich.jsonl"
            twice.parent.mkdir()
            twice.write_bytes(again.read_bytes().replace(b'"exportedAt":"', b'"exportedAt":"1'))
            [s3] = (await import_file(c2, twice))["sessions"]
            assert s3["status"] == "unchanged" and s3["archivedBranches"] == 0, s3
            await c2.call("session.activateRevision", {"sessionId": new, "rootUserId": f"{new}:u4",
                                                        "revisionIndex": 1})
            assert await shows(c2, new) == await shows(c1, SID)


async def test_tombstoned_message_stays_deleted_and_the_checkpoint_comes_over(tmp_path: Path) -> None:
    """Seed 000 §3.3 "A message tombstone sets payload.deleted = true. Context derivation skips it"; seed 003
    §2.1 "Readers return every message unchanged and separately return every still-valid checkpoint"."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    assert "gone" not in [m["id"] for m in rt.two["messages"]] and "gone" not in rt.two["context"]
    assert "back" in [m["id"] for m in rt.two["messages"]] and "back" in rt.two["context"]
    assert rt.two["search"]["grebe"] == rt.one["search"]["grebe"] == ["back"]
    assert rt.one["search"]["walrus"] == [] and rt.two["search"]["walrus"] == []
    [cp1] = rt.one["compactions"]
    [cp2] = rt.two["compactions"]
    assert cp2["summary"] == cp1["summary"].replace(SECRET_2, "[redacted]")
    assert cp2["summary"] == "summary of the pelican talk ([redacted])"
    assert cp2["tokensBefore"] == cp1["tokensBefore"]
    assert local(cp2["throughMessageId"], rt.new_sid) == cp1["throughMessageId"] == "a3"
    assert local(cp2["firstKeptMessageId"], rt.new_sid) == cp1["firstKeptMessageId"]


async def test_search_finds_the_same_messages_and_never_thinking(tmp_path: Path) -> None:
    """README §9 "Imported sessions are searchable as soon as the call returns (thinking blocks are kept in
    the transcript but never searched)"; seed 003 acceptance 12 "the derived search text excludes thinking"."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    for word, hits in rt.one["search"].items():
        if word in ("egret",):  # the variant switched away from is not in the live transcript on either host
            continue
        assert rt.two["search"][word] == hits, word
    assert rt.two["search"]["quokka"] == [] and rt.two["search"]["ibis"] == ["sub1"]
    assert rt.two["search"]["pelican-tool-output"] == ["t1"]


async def test_attachment_bytes_come_over(tmp_path: Path) -> None:
    """Seed 003 §2 "attachments/ # content-addressed blobs (sha256 name), refs from messages"; seed 000 §2.3
    "Attachments record kind, MIME type, Blob bytes". A person's picture must be on the second machine."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    blocks = [b for m in rt.two["messages"] for b in m["blocks"] if b["type"] == "attachment"]
    assert len(blocks) == 2 and not any(b.get("evicted") for b in blocks)
    assert rt.two["attachments"] == {rt.built.png_sha: None, rt.built.pdf_sha: None}
    assert rt.two["blobs"] == {rt.built.png_sha: h(PNG), rt.built.pdf_sha: h(PDF)}


async def test_usage_totals_come_over(tmp_path: Path) -> None:
    """README §9 "Everything an import derives from the lines it writes is rebuilt ...: its `usage.*` counts
    (the responses on the transcript and on the branches archived in the revisions file)"."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    assert rt.one["usage"]["inputTokens"] == 1050 and rt.one["usage"]["outputTokens"] == 205
    assert rt.two["usage"]["inputTokens"] == rt.one["usage"]["inputTokens"]
    assert rt.two["usage"]["outputTokens"] == rt.one["usage"]["outputTokens"]
    # the five ended turns (t2, whose answer a1b is archived, among them); t6, still running on host 1, stays there
    assert rt.one["usage"]["turns"] == 6 and rt.two["usage"]["turns"] == 5


async def test_the_thinking_level_comes_over(tmp_path: Path) -> None:
    """Seed 003 acceptance 11 "A session's thinking level survives restart"; the export's `session_info`
    names it, so a move to another machine keeps it too."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    assert rt.one["session"]["thinkingLevel"] == "high"
    assert rt.two["session"]["thinkingLevel"] == "high"


async def test_thinking_is_left_out_unless_asked_and_then_the_copy_has_none(tmp_path: Path) -> None:
    """README §9 "Thinking blocks are left out unless `includeThinking`": a default export moves the rest."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path, includeThinking=False)
    kinds = {blk["type"] for m in rt.two["messages"] for blk in m["blocks"]}
    assert "thinking" not in kinds and "tool_call" in kinds and "attachment" in kinds
    assert [m["id"] for m in rt.two["messages"]] == [m["id"] for m in rt.one["messages"] if not m.get("deleted")]


async def test_review_snapshots_come_over(tmp_path: Path) -> None:
    """Seed 003 §2.0 "The transcript JSONL is the durable index for the visible card; the previous bytes and
    hashes live outside the workspace in review-changes/<sessionId>/<snapshotId>/"."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    [card] = [b["details"]["review"] for m in rt.two["messages"] for b in m["blocks"] if b.get("details")]
    assert len(rt.one["review"]) == 1 and card["snapshotId"] == rt.one["review"][0]["snapshotId"]
    assert [s["snapshotId"] for s in rt.two["review"]] == [card["snapshotId"]]


async def test_the_turn_queue_and_a_pending_plan_stay_on_the_host(tmp_path: Path) -> None:
    """README §9 "**What stays on the host:** ... the turn queue, pending plans, approvals and interactions":
    a prompt queued while a turn ran (seed 003 §4.6b) and a plan awaiting approval (§4.6a, acceptance 17) are
    the first host's state, not part of the session's history; the copy has neither (nor the queued text as a
    message), and the first host keeps both."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    assert [e["content"] for e in rt.one["queue"]] == ["later: draw a heron"]
    assert rt.one["session"]["state"] == "awaiting_approval"
    assert [p["title"] for p in rt.one["plans"]] == ["Heron plan"]
    assert not rt.two["queue"] and not rt.two["plans"]
    assert not any("draw a heron" in str(m["blocks"]) for m in rt.two["messages"])


async def test_thread_metadata_comes_over(tmp_path: Path) -> None:
    """Seed 000 §2.1 "ThreadMeta stores title, timestamps, leafId, optional folder and preset, tags, pin and
    archive flags, optional parentThreadId": a person's tags, folder and preset are theirs on the new machine."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
    thread = rt.one["session"]["thread"]
    assert thread["tags"] == ["birds", "drawing"] and thread["folder"] == "Zoo/Birds"
    got = rt.two["session"].get("thread") or {}
    assert {k: got.get(k) for k in ("tags", "folder", "preset", "archived")} == \
        {k: thread.get(k) for k in ("tags", "folder", "preset", "archived")}


def unevicted(m: dict[str, Any]) -> dict[str, Any]:
    return {**m, "blocks": [{k: v for k, v in blk.items() if k != "evicted"} for blk in m["blocks"]]}


async def test_the_copy_reads_the_same_after_its_index_is_rebuilt(tmp_path: Path) -> None:
    """README §9 "Everything an import derives from the lines it writes is rebuilt from them when the database
    is lost or corrupt ... so an imported session reads the same after a rebuild"; RELIABILITY row 8 "Index
    deleted, transcripts present": the copy's messages, thinking level and thread metadata."""
    with trio.fail_after(120):
        rt = await roundtrip(tmp_path)
        for name in os.listdir(tmp_path / "d2"):
            if name.startswith("pi.sqlite"):
                os.unlink(tmp_path / "d2" / name)
        async with real_host(tmp_path / "d2") as (_p, c2):
            again = await view(c2, rt.new_sid)
    for key in ("compactions", "context", "search", "total", "revisions"):
        assert again[key] == rt.two[key], key
    # the attachments' bytes never came over (test_attachment_bytes_come_over): the rebuilt index marks their
    # blocks evicted, which the import did not; everything else reads the same
    assert [unevicted(m) for m in again["messages"]] == rt.two["messages"]
    for key in ("title", "thinkingLevel", "thread", "projectPath", "source", "historyModel"):
        assert again["session"].get(key) == rt.two["session"].get(key), key
    assert again["session"]["thinkingLevel"] == "high" and again["session"]["thread"]["folder"] == "Zoo/Birds"


async def test_a_child_session_and_its_parent_both_come_over(tmp_path: Path) -> None:
    """Seed 000 §2.1 "ThreadMeta stores ... optional parentThreadId"; a fork is a session of its own: exported
    and imported with its parent (one directory, two files), both read back whole."""
    folder = tmp_path / "exports"
    folder.mkdir()
    with trio.fail_after(120):
        async with two_hosts(tmp_path) as (_p1, c1, _p2, c2):
            await build_rich(c1, tmp_path / "ws")
            child = await child_of(c1, SID)
            child_one = await c1.call("session.get", {"sessionId": child, "full": True})
            for sid in (SID, child):
                await export_to(c1, sid, folder / f"{sid}.jsonl", includeThinking=True)
            report = await import_file(c2, folder)
            assert report["counts"]["new"] == 2
            by_ext = {s["externalId"]: s["sessionId"] for s in report["sessions"]}
            child_two = await c2.call("session.get", {"sessionId": by_ext[child], "full": True})
            assert [local(m["id"], by_ext[child]) for m in child_two["messages"]] == \
                [m["id"] for m in child_one["messages"]]
            assert child_two["session"]["title"] == child_one["session"]["title"] == "Pelican child"
            assert child_one["session"]["thread"]["parentThreadId"] == SID
            assert (child_two["session"].get("thread") or {}).get("parentThreadId") == by_ext[SID]
            assert (child_two["session"].get("thread") or {}).get("tags") == ["fork"]
            parent = await c2.call("session.get", {"sessionId": by_ext[SID]})  # the link leads somewhere
            assert parent["session"]["title"] == "Pelican ✓ 鹈鹕 roundtrip"


async def test_a_session_moved_back_and_forth_six_times_reads_the_same(tmp_path: Path) -> None:
    """README §9: a copy's export "reads back to the same messages" — also the export of a copy (its ids
    namespaced again on every move, past the 200-character id bound after a few moves)."""
    with trio.fail_after(180):
        async with two_hosts(tmp_path) as (_p1, c1, _p2, c2):
            await c1.call("session.create", {"sessionId": SID, "title": "travelling", "thinkingLevel": "medium"})
            await c1.call("session.updateMetadata", {"sessionId": SID, "tags": ["travel"]})
            for m in (msg("u1", "where to, kittiwake?"), msg("a1", "", role="assistant", blocks=[
                    {"type": "thinking", "text": "hm"}, {"type": "text", "text": "north, skua"}]),
                    msg("t1", "", role="tool", toolName="Bash", blocks=[
                        {"type": "tool_call", "callId": "c1", "name": "Bash", "args": {"command": "ls"},
                         "result": "maps", "status": "success"}]),
                    msg("u2", "and then?")):
                await c1.call("session.appendMessage", {"sessionId": SID, "message": m})
            await c1.call("session.appendCompaction", {"sessionId": SID, "compaction": {
                "id": "cp1", "summary": "they went north", "throughMessageId": "a1", "firstKeptMessageId": "t1",
                "tokensBefore": 10, "retainedTail": []}})
            first = await c1.call("session.get", {"sessionId": SID, "full": True})
            hosts = [c1, c2]
            sid = SID
            for hop in range(6):
                src, dst = hosts[hop % 2], hosts[(hop + 1) % 2]
                out = tmp_path / f"hop{hop}.jsonl"
                await export_to(src, sid, out, includeThinking=True)
                report = await import_file(dst, out)
                [s] = report["sessions"]
                assert s["status"] == "new", (hop, s)
                sid = s["sessionId"]
                got = await dst.call("session.get", {"sessionId": sid, "full": True})
                assert [(m["role"], m["blocks"]) for m in got["messages"]] == \
                    [(m["role"], m["blocks"]) for m in first["messages"]], hop
                assert all(len(m["id"]) <= 200 for m in got["messages"]), hop
                [cp] = got["compactions"]
                assert cp["summary"] == "they went north", hop
                ids = [m["id"] for m in got["messages"]]
                assert ids.index(cp["throughMessageId"]) == 1 and ids.index(cp["firstKeptMessageId"]) == 2, hop
                assert got["session"]["thinkingLevel"] == "medium", hop
                assert got["session"]["thread"]["tags"] == ["travel"], hop
                ctx = await dst.call("session.context", {"sessionId": sid})
                assert [m["role"] for m in ctx["messages"]][-2:] == ["tool", "user"], hop


# --------------------------------------------------------------------------- secrets


async def test_no_export_holds_a_secret_value(tmp_path: Path) -> None:
    """Seed 003 §10.4 "Exported sessions exclude secrets by default"; README §9 "every value the secret store
    holds, the host's own bearer token (its exact value), credential references and values of secret-named
    keys (`apiKey`, `token`, …) are redacted"."""
    out = tmp_path / "exports"
    out.mkdir()
    with trio.fail_after(120):
        async with two_hosts(tmp_path) as (p1, c1, _p2, c2):
            await build_rich(c1, tmp_path / "ws")
            await say(c1, SID, "leak", f"the bearer token is {p1.token}")
            child = await child_of(c1, SID)
            written: list[Path] = []
            for fmt in ("jsonl", "md", "html"):
                for sid in (SID, child):
                    path = out / f"{sid}.{fmt}"
                    done = await c1.call("session.export", {"sessionId": sid, "format": fmt, "outPath": str(path),
                                                            "includeThinking": True})
                    assert done["redactions"] >= (3 if sid == SID else 1), (sid, fmt)
                    written.append(path)
            inline = await c1.call("session.export", {"sessionId": SID, "format": "jsonl"})
            cli = await trio.to_thread.run_sync(lambda: run_cli("--data-dir", str(p1.data_dir), "export", SID,
                                                                "--format", "jsonl"))
            assert cli.returncode == 0, cli.stderr
            blobs = [p.read_bytes() for p in written] + [inline["content"].encode(), cli.stdout.encode()]
            for blob in blobs:
                for value in (SECRET, SECRET_2, PROVIDER_KEY, p1.token, "plain-api-key-value",
                              "secret:provider/anthropic"):
                    assert value.encode() not in blob
            report = await import_file(c2, out / f"{SID}.jsonl")
            new = report["sessions"][0]["sessionId"]
            got = json.dumps(await c2.call("session.get", {"sessionId": new, "full": True}))
            assert SECRET not in got and p1.token not in got and "[redacted]" in got
            assert "draw a pelican, key" in got  # the rest of the sentence comes over


# --------------------------------------------------------------------------- import twice, CLI


async def test_an_export_imported_twice_is_one_session_and_the_second_is_unchanged(tmp_path: Path) -> None:
    """README §9 "A re-import of unchanged files is `unchanged` (nothing is parsed or written)"; the CLI's
    `pi-host import` / `pi-host export` do the same as the methods."""
    out = tmp_path / "rich.jsonl"
    with trio.fail_after(120):
        async with two_hosts(tmp_path) as (p1, c1, p2, c2):
            await build_rich(c1, tmp_path / "ws")
            cli = await trio.to_thread.run_sync(lambda: run_cli(
                "--data-dir", str(p1.data_dir), "export", SID, "--format", "jsonl", "--out", str(out)))
            assert cli.returncode == 0, cli.stderr
            first = await import_file(c2, out)
            new = first["sessions"][0]["sessionId"]
            before = await c2.call("session.get", {"sessionId": new, "full": True})
            second = await import_file(c2, out)
            assert second["counts"]["unchanged"] == 1 and second["counts"]["new"] == 0
            assert second["sessions"][0]["status"] == "unchanged" and second["newMessages"] == 0
            third = await trio.to_thread.run_sync(lambda: run_cli(
                "--data-dir", str(p2.data_dir), "import", "pi-host", str(out), "--json"))
            assert third.returncode == 0, third.stderr
            assert json.loads(third.stdout)["counts"]["unchanged"] == 1
            listed = await c2.call("session.list", {})
            assert [s["id"] for s in listed["sessions"]] == [new]
            assert await c2.call("session.get", {"sessionId": new, "full": True}) == before
            again = await c1.call("session.export", {"sessionId": SID, "format": "jsonl"})
            copy = tmp_path / "copy" / "rich.jsonl"  # a second export of the same session, at another path
            copy.parent.mkdir()
            copy.write_text(again["content"])
            fourth = await import_file(c2, copy)
            assert fourth["sessions"][0]["sessionId"] == new
            assert fourth["sessions"][0]["newMessages"] == 0
            assert [s["id"] for s in (await c2.call("session.list", {}))["sessions"]] == [new]
            assert [m["id"] for m in (await c2.call("session.get", {"sessionId": new, "full": True}))["messages"]] \
                == [m["id"] for m in before["messages"]]
            await say(c1, SID, "u5", "one more question, shoebill")  # the session goes on on host 1
            await say(c1, SID, "a5", "one more answer, hoopoe", "assistant")
            later = tmp_path / "later" / "rich.jsonl"
            later.parent.mkdir()
            await export_to(c1, SID, later)
            fifth = await import_file(c2, later)
            assert fifth["sessions"][0]["status"] == "updated" and fifth["sessions"][0]["newMessages"] == 2
            grown = await c2.call("session.get", {"sessionId": new, "full": True})
            assert [local(m["id"], new) for m in grown["messages"]] == \
                [local(m["id"], new) for m in before["messages"]] + ["u5", "a5"]
            assert [s["id"] for s in (await c2.call("session.list", {}))["sessions"]] == [new]


# --------------------------------------------------------------------------- damaged files


async def test_a_torn_or_damaged_export_file_imports_every_whole_line(tmp_path: Path) -> None:
    """README §9 "a line that is not JSON is skipped and counted (`files[].badLines`), and an incomplete last
    line is left for a later import (`files[].tornTailBytes`)"."""
    out = tmp_path / "rich.jsonl"
    with trio.fail_after(120):
        async with two_hosts(tmp_path) as (_p1, c1, _p2, c2):
            await build_rich(c1, tmp_path / "ws")
            await export_to(c1, SID, out)
            whole = out.read_bytes()
            lines = whole.splitlines(keepends=True)
            ids = [json.loads(ln)["id"] for ln in lines if json.loads(ln)["type"] == "message"]
            torn = tmp_path / "torn" / "rich.jsonl"
            torn.parent.mkdir()
            # torn inside the last message line: what follows it (archived branches, turns, the attachment and
            # review bytes the export carries) has not arrived either
            last = max(i for i, ln in enumerate(lines) if json.loads(ln)["type"] == "message")
            torn.write_bytes(b"".join(lines[:last]) + lines[last][: len(lines[last]) // 2])
            report = await import_file(c2, torn)
            [s] = report["sessions"]
            assert s["files"][0]["tornTailBytes"] == len(lines[last]) // 2
            got = await c2.call("session.get", {"sessionId": s["sessionId"], "full": True})
            assert [local(m["id"], s["sessionId"]) for m in got["messages"]] == ids[:-1]
            shown_blocks = [b for m in got["messages"] for b in m["blocks"] if b["type"] == "attachment"]
            assert len(shown_blocks) == 2 and all(b.get("evicted") for b in shown_blocks)  # no bytes yet: says so
            torn.write_bytes(whole)  # the rest arrives (a copy finished)
            report = await import_file(c2, torn)
            assert report["sessions"][0]["status"] == "updated"
            got = await c2.call("session.get", {"sessionId": s["sessionId"], "full": True})
            assert [local(m["id"], s["sessionId"]) for m in got["messages"]] == ids
            shown_blocks = [b for m in got["messages"] for b in m["blocks"] if b["type"] == "attachment"]
            assert len(shown_blocks) == 2 and not any(b.get("evicted") for b in shown_blocks)  # the bytes came
            damaged = tmp_path / "damaged" / "rich.jsonl"
            damaged.parent.mkdir()
            victim = next(i for i, ln in enumerate(lines) if b'"id":"u2"' in ln)
            header = json.dumps({**json.loads(lines[0]), "sessionId": "rich-damaged"}).encode() + b"\n"
            damaged.write_bytes(header + b"".join(lines[1:victim]) + b"{not json at all\n"
                                + b"".join(lines[victim + 1:]))
            report = await import_file(c2, damaged)
            [d] = report["sessions"]
            assert d["files"][0]["badLines"] == 1 and report["unreadLines"] >= 1
            got = await c2.call("session.get", {"sessionId": d["sessionId"], "full": True})
            assert [local(m["id"], d["sessionId"]) for m in got["messages"]] == [i for i in ids if i != "u2"]


async def test_an_export_of_a_transcript_with_a_torn_tail_or_a_damaged_line(tmp_path: Path) -> None:
    """RELIABILITY rule 3 "truncate to the last `\\n` ending a parseable line"; seed 003 §2.1 "Readers skip ...
    a torn trailing line"; SessionExportResult.unreadableLines: "Indexed transcript lines that no longer parse
    (damaged on disk), left out of the export"."""
    d1 = tmp_path / "d1"
    d1.mkdir()
    (tmp_path / "d2").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    with trio.fail_after(120):
        async with real_host(d1) as (_p, c):
            await c.call("session.create", {"sessionId": SID, "title": "damaged"})
            for i in range(6):
                await say(c, SID, f"m{i}", f"line {i} kestrel")
        transcript = d1 / "sessions" / f"{SID}.jsonl"
        with transcript.open("ab") as f:
            f.write(b'{"type":"message","id":"m6","role":"user","blocks":[{"type":"te')  # a crash mid-append
        async with real_host(d1) as (_p, c):
            torn = await export_to(c, SID, out / "torn.jsonl")
            assert torn["messages"] == 6 and "unreadableLines" not in torn
            data = transcript.read_bytes()
            start = data.index(b'"id":"m3"')
            line_end = data.index(b"\n", start)
            rotted = data[:start] + b"#" * (line_end - start) + data[line_end:]  # same length: offsets hold
            transcript.write_bytes(rotted)
            damaged = await export_to(c, SID, out / "damaged.jsonl")
            assert damaged["messages"] == 5 and damaged["unreadableLines"] == 1
        for name, want in (("torn.jsonl", [f"m{i}" for i in range(6)]),
                           ("damaged.jsonl", ["m0", "m1", "m2", "m4", "m5"])):
            for line in (out / name).read_bytes().splitlines():
                json.loads(line)
            fresh = tmp_path / "d2" / name  # a new machine for each copy
            fresh.mkdir()
            async with real_host(fresh) as (_q, c2):
                report = await import_file(c2, out / name)
                [s] = report["sessions"]
                got = await c2.call("session.get", {"sessionId": s["sessionId"], "full": True})
                assert [local(m["id"], s["sessionId"]) for m in got["messages"]] == want, name


# --------------------------------------------------------------------------- while a turn streams


async def test_an_export_while_a_turn_streams_holds_a_consistent_prefix(tmp_path: Path) -> None:
    """Seed 003 §2.1 "Ordering: the file is written before the DB index transaction"; an export taken while
    a turn appends and checkpoints its streaming reply (D299) holds whole lines, the messages a prefix of
    the final transcript, and never the inflight reply's partial text."""
    d = tmp_path / "d1"
    d.mkdir()
    final = [f"m{i}" for i in range(120)]
    snapshots: list[list[str]] = []
    with trio.fail_after(120):
        async with real_host(d) as (proc, c):
            await c.call("session.create", {"sessionId": SID, "title": "streaming"})
            await c.call("session.startTurn", {"sessionId": SID, "turnId": "t1"})

            async def writer() -> None:
                for i, mid in enumerate(final):
                    role = "user" if i % 2 == 0 else "assistant"
                    await c.call("session.appendMessage", {"sessionId": SID, "message": msg(
                        mid, f"part {i} osprey", role=role, turnId="t1")})
                    await c.call("session.saveInflightMessage", {"sessionId": SID, "turnId": "t1", "message": msg(
                        "streaming", f"partial reply {i} PARTIAL", role="assistant", turnId="t1")})

            async with open_client(proc.url, proc.token, client_id="reader", client_kind="ui") as r:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer)
                    for _ in range(40):
                        got = await r.call("session.export", {"sessionId": SID, "format": "jsonl"})
                        lines = [json.loads(ln) for ln in got["content"].splitlines()]
                        ids = [ln["id"] for ln in lines if ln["type"] == "message"]
                        assert got["messages"] == len(ids)
                        assert "PARTIAL" not in got["content"]
                        snapshots.append(ids)
                        await trio.lowlevel.checkpoint()
            await c.call("session.endTurn", {"sessionId": SID, "turnId": "t1", "status": "completed"})
            last = await c.call("session.export", {"sessionId": SID, "format": "jsonl"})
            assert [json.loads(ln)["id"] for ln in last["content"].splitlines()
                    if json.loads(ln)["type"] == "message"] == final
    for ids in snapshots:
        assert ids == final[: len(ids)]
    assert any(0 < len(ids) < len(final) for ids in snapshots) or snapshots[-1] == final


# --------------------------------------------------------------------------- big, deleted


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.slow
async def test_a_20_mb_session_exports_to_a_file_and_imports_whole(tmp_path: Path) -> None:
    """README §9 "The export comes back inline (`content`, up to 16 MiB) or, with `outPath`, is written to
    that new file"; export.py "The export streams ... so memory does not grow with the session"."""
    out = tmp_path / "big.jsonl"
    piece = 200_000
    n = 100
    with trio.fail_after(300):
        async with two_hosts(tmp_path) as (p1, c1, p2, c2):
            await c1.call("session.create", {"sessionId": SID, "title": "big"})
            digests = []
            for i in range(n):
                text = (f"{i:04d} " + "pelican " * (piece // 8))[:piece]
                digests.append(h(text.encode()))
                await say(c1, SID, f"m{i}", text, role="user" if i % 2 == 0 else "assistant")
            code, data = await error_of(c1, "session.export", {"sessionId": SID, "format": "jsonl"})
            assert code == "PAYLOAD_TOO_LARGE" and data["limit"] == 16 * 1024 * 1024
            before = peak_rss_kib(p1.proc.pid)
            done = await export_to(c1, SID, out)
            grew = peak_rss_kib(p1.proc.pid) - before
            assert done["messages"] == n and out.stat().st_size == done["bytes"] > n * piece
            assert grew < 16 * 1024, f"the host's peak RSS grew {grew} KiB exporting a 20 MB session"
            report = await import_file(c2, out)
            [s] = report["sessions"]
            assert s["status"] == "new" and report["unreadLines"] == 0
            seen = []
            before_msg: int | None = None
            while True:  # read back in windows no larger than the byte budget allows
                params: dict[str, Any] = {"sessionId": s["sessionId"], "messageLimit": 20, "contentLimit": 1_000_000}
                if before_msg is not None:
                    params["messageBefore"] = before_msg
                page = await c2.call("session.get", params)
                seen[:0] = [h(m["blocks"][0]["text"].encode()) for m in page["messages"]]
                if not page["hasMoreBefore"]:
                    break
                before_msg = page["messageStart"]
            assert seen == digests
            assert p2.proc.poll() is None


async def test_exporting_a_deleted_session_is_a_clear_error(tmp_path: Path) -> None:
    """README §10 "`session.delete` ... ends that turn"; SessionExportParams: errors `SESSION_NOT_FOUND`. An
    export of a deleted session names it, writes no file, and the CLI says so in one line."""
    d = tmp_path / "d1"
    d.mkdir()
    target = tmp_path / "never.jsonl"
    with trio.fail_after(120):
        async with real_host(d) as (_p, c):
            await c.call("session.create", {"sessionId": SID, "title": "to delete"})
            await say(c, SID, "m1", "soon gone")
            await c.call("session.delete", {"sessionId": SID})
            for fmt in ("jsonl", "md", "html"):
                code, data = await error_of(c, "session.export", {"sessionId": SID, "format": fmt,
                                                                  "outPath": str(target)})
                assert code == "SESSION_NOT_FOUND", (fmt, code, data)
                assert not target.exists()
            cli = await trio.to_thread.run_sync(lambda: run_cli("--data-dir", str(d), "export", SID))
            assert cli.returncode != 0 and cli.stdout == ""
            assert f"session {SID} was deleted" in cli.stderr.splitlines()[0], cli.stderr
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


async def test_exporting_a_trashed_session_still_works_and_imports(tmp_path: Path) -> None:
    """README §9 "`sessions.trash` hides a session ...; its transcript, rows and origin stay": it is still the
    person's data, and an export of it moves it."""
    out = tmp_path / "trashed.jsonl"
    with trio.fail_after(120):
        async with two_hosts(tmp_path) as (_p1, c1, _p2, c2):
            await c1.call("session.create", {"sessionId": SID, "title": "trashed"})
            await say(c1, SID, "m1", "in the bin, heron")
            await c1.call("sessions.trash", {"sessionId": SID})
            try:
                await export_to(c1, SID, out)
            except RpcError as refused:
                pytest.fail(f"the export of a trashed session failed: {refused.data_code}")
            report = await import_file(c2, out)
            [s] = report["sessions"]
            got = await c2.call("session.get", {"sessionId": s["sessionId"], "full": True})
            assert [m["blocks"][0]["text"] for m in got["messages"]] == ["in the bin, heron"]
