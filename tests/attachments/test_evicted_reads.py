"""Evicted attachments read back marked everywhere a block is read, not only in ``session.get``.

Seed 000 §2.3: "Eviction marks references before deleting bytes." A reference
that points at bytes the GC removed must say so wherever the client reads it:
the derived model context (``session.context``) and the turn queue
(``session.queueList``, and the queue state an edit answers).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import client_for, inprocess_host, msg


def _att(sha: str) -> dict[str, Any]:
    return {"type": "attachment", "kind": "image", "name": "pic.png", "ref": f"attachments/{sha}",
            "mimeType": "image/png", "size": 3000}


async def _put(c: HostClient, data: bytes) -> str:
    got = await c.call("attachments.put", {"name": "pic.png", "mimeType": "image/png",
                                           "dataBase64": base64.b64encode(data).decode()})
    return str(got["sha256"])


async def _evict_one(c: HostClient) -> tuple[str, str, str, str]:
    """Two sessions referring to two blobs; the GC (budget 4000 bytes) evicts the inactive one's blob.

    Returns (inactive session, active session, evicted sha, kept sha)."""
    gone_sid = (await c.call("session.create", {"title": "old"}))["id"]
    keep_sid = (await c.call("session.create", {"title": "active"}))["id"]
    gone, kept = await _put(c, b"x" * 3000), await _put(c, b"y" * 3000)
    for sid, sha in ((gone_sid, gone), (keep_sid, kept)):
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
            f"u-{sid[-6:]}", "look", blocks=[{"type": "text", "text": "look"}, _att(sha)])})
        await c.call("session.queuePush", {"sessionId": sid, "principal": "user", "content": "later",
                                           "attachments": [_att(sha)], "permissionMode": "ask"})
    await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 4000})
    gc = await c.call("attachments.gc", {"activeSessionId": keep_sid})
    assert gc["evicted"] == [gone]
    return gone_sid, keep_sid, gone, kept


def _blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for m in messages for b in m["blocks"] if b.get("type") == "attachment"]


async def test_session_context_marks_blocks_of_evicted_blobs(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes." ``session.context`` (seed 000 §4's
    buildSessionContext) hands the model's messages out; a block whose blob the GC evicted reads
    ``"evicted": true`` there as in ``session.get``, and a block of a live blob stays unmarked."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            gone_sid, keep_sid, gone, kept = await _evict_one(c)
            [block] = _blocks((await c.call("session.context", {"sessionId": gone_sid}))["messages"])
            assert block["ref"] == f"attachments/{gone}" and block["evicted"] is True
            [block] = _blocks((await c.call("session.context", {"sessionId": keep_sid}))["messages"])
            assert block["ref"] == f"attachments/{kept}" and "evicted" not in block


async def test_session_queue_list_marks_attachments_of_evicted_blobs(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes." A queued prompt's attachment is a
    reference too (the GC derives it from ``turn_queue.attachments_json``): ``session.queueList``, the
    queue state an edit answers and the entry ``session.queueTake`` hands out mark it ``"evicted": true``;
    the active session's entry stays unmarked."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            gone_sid, keep_sid, gone, kept = await _evict_one(c)
            state = await c.call("session.queueList", {"sessionId": gone_sid})
            [entry] = state["entries"]
            assert entry["attachments"] == [{**_att(gone), "evicted": True}]
            kept_state = await c.call("session.queueList", {"sessionId": keep_sid})
            assert kept_state["entries"][0]["attachments"] == [_att(kept)]
            await c.call("session.queuePush", {"sessionId": gone_sid, "principal": "user", "content": "more",
                                               "permissionMode": "ask"})
            edited = await c.call("session.queueReorder", {"sessionId": gone_sid, "entryId": entry["id"],
                                                           "direction": "down"})
            marked = [e for e in edited["entries"] if e["id"] == entry["id"]]
            assert marked[0]["attachments"] == [{**_att(gone), "evicted": True}]
            # the controller that takes it (the sidecar about to run it) learns the blob is gone too
            await c.call("session.queuePrioritize", {"sessionId": gone_sid, "entryId": entry["id"]})
            async with client_for(host, "sidecar", kind="agent") as agent:
                await agent.call("session.queueAttach", {"sessionId": gone_sid, "controllerId": "sidecar"})
                taken = await agent.call("session.queueTake", {"sessionId": gone_sid, "controllerId": "sidecar"})
            assert taken["entry"]["id"] == entry["id"]
            assert taken["entry"]["attachments"] == [{**_att(gone), "evicted": True}]


async def test_session_get_marks_the_streaming_reply_blocks_of_evicted_blobs(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes." The reply streaming into a session
    (its in-flight checkpoint, ``session.get``'s ``inflight``) is a reference too (origin ``checkpoint``): a
    block of it whose blob the GC evicted reads ``"evicted": true`` like the transcript's blocks."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            gone_sid, _keep_sid, gone, _kept = await _evict_one(c)
            await c.call("session.startTurn", {"sessionId": gone_sid, "turnId": "t1"})
            await c.call("session.saveInflightMessage", {
                "sessionId": gone_sid, "turnId": "t1",
                "message": {"id": "a1", "role": "assistant", "meta": {"status": "streaming"},
                            "blocks": [{"type": "text", "text": "here"}, _att(gone)]}})
            got = await c.call("session.get", {"sessionId": gone_sid})
            [block] = _blocks([got["inflight"]["message"]])
            assert block["ref"] == f"attachments/{gone}" and block["evicted"] is True
            [block] = _blocks(got["messages"])
            assert block["evicted"] is True


async def test_session_export_marks_blocks_of_evicted_blobs(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes." An export (JSONL here) is a read of
    the transcript too: the block of an evicted blob is exported with ``"evicted": true``, a live one without."""
    import orjson

    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            gone_sid, keep_sid, gone, kept = await _evict_one(c)
            exported = {}
            for sid in (gone_sid, keep_sid):
                out = await c.call("session.export", {"sessionId": sid, "format": "jsonl"})
                lines = [orjson.loads(line) for line in out["content"].splitlines() if line.strip()]
                exported[sid] = [b for rec in lines for b in rec.get("blocks", []) or []
                                 if isinstance(b, dict) and b.get("type") == "attachment"]
    [block] = exported[gone_sid]
    assert block["ref"] == f"attachments/{gone}" and block["evicted"] is True
    [block] = exported[keep_sid]
    assert block["ref"] == f"attachments/{kept}" and "evicted" not in block


async def test_a_block_written_after_its_blob_was_evicted_reads_evicted(tmp_path: Path) -> None:
    """A window read marks only recorded references, and a new block's reference was recorded at the next GC
    scan: session.get served a block of an evicted blob (appended later, in another session, or copied by a
    fork) as live while session.context marked it. It is recorded marked as it is indexed."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            gone_sid, keep_sid, gone, kept = await _evict_one(c)
            again = msg("again", "again", blocks=[{"type": "text", "text": "again"}, _att(gone)])
            await c.call("session.appendMessage", {"sessionId": gone_sid, "message": again})
            other = (await c.call("session.create", {"title": "other"}))["id"]
            await c.call("session.appendMessage", {"sessionId": other, "message": {**again, "id": "b1"}})
            child = (await c.call("session.fork", {"sessionId": gone_sid}))["id"]
            for sid in (gone_sid, other, child):
                blocks = _blocks((await c.call("session.get", {"sessionId": sid}))["messages"])
                assert blocks and all(b["evicted"] is True for b in blocks), (sid, blocks)
            assert "evicted" not in _blocks((await c.call("session.get", {"sessionId": keep_sid}))["messages"])[0]


async def test_a_blob_deleted_by_hand_while_the_host_was_stopped_does_not_read_live(tmp_path: Path) -> None:
    """Seed 000 §2.3: a blob's deletion state says whether its bytes are there, and a reference never points
    at missing bytes unmarked. A blob file deleted by hand while the host is stopped reads back, at once and
    before any ``attachments.gc``, as the state the README gives a blob whose bytes are gone (``evicted``,
    its references marked; no ``evictedAt``: nothing evicted it); it read ``live``. A GC then makes it a
    tombstone, as before; a blob whose bytes are there still reads ``live``."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            gone, kept = await _put(c, b"g" * 100), await _put(c, b"k" * 100)
            for sha in (gone, kept):
                await c.call("attachments.ref", {"sha256": sha, "sessionId": sid, "messageId": "m1"})
    (tmp_path / "attachments" / gone).unlink()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await c.call("attachments.get", {"sha256": gone})
            assert got["deletionState"] == "evicted" and "evictedAt" not in got
            assert got["references"] == [{"sessionId": sid, "messageId": "m1", "origin": "client", "evicted": True}]
            live = await c.call("attachments.get", {"sha256": kept})
            assert live["deletionState"] == "live"
            assert live["references"] == [{"sessionId": sid, "messageId": "m1", "origin": "client", "evicted": False}]
            await c.call("attachments.gc", {})
            after = await c.call("attachments.get", {"sha256": gone})
            assert after["deletionState"] == "evicted" and "evictedAt" in after
            assert after["references"] == got["references"]


async def test_a_reference_to_a_blob_whose_bytes_are_gone_is_refused(tmp_path: Path) -> None:
    """Seed 000 §2.3 (references are marked before bytes go: none points at missing bytes unmarked).
    ``attachments.ref`` of a blob deleted by hand while the host was stopped is ``NOT_FOUND``, as for an
    evicted one, and records nothing; it made an unmarked reference to bytes that are not there."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            gone = await _put(c, b"g" * 100)
    (tmp_path / "attachments" / gone).unlink()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            with pytest.raises(RpcError) as exc:
                await c.call("attachments.ref", {"sha256": gone, "sessionId": sid, "messageId": "m1"})
            assert exc.value.data_code == "NOT_FOUND"
            assert (await c.call("attachments.get", {"sha256": gone}))["references"] == []
