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

import orjson
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


async def _lose_one(c: HostClient, tmp_path: Path) -> tuple[str, str, str]:
    """A session whose message, queued turn and streaming reply refer to two blobs; one blob's file is then
    deleted by hand while the host runs (no GC). Returns (session, lost sha, kept sha)."""
    sid = (await c.call("session.create", {"title": "lost"}))["id"]
    lost, kept = await _put(c, b"l" * 3000), await _put(c, b"k" * 3000)
    blocks = [{"type": "text", "text": "look"}, _att(lost), _att(kept)]
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "look", blocks=blocks)})
    await c.call("session.queuePush", {"sessionId": sid, "principal": "user", "content": "later",
                                       "attachments": [_att(lost), _att(kept)], "permissionMode": "ask"})
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    await c.call("session.saveInflightMessage", {
        "sessionId": sid, "turnId": "t1",
        "message": {"id": "a1", "role": "assistant", "meta": {"status": "streaming"}, "blocks": blocks}})
    (tmp_path / "attachments" / lost).unlink()
    return sid, lost, kept


def _marks(blocks: list[dict[str, Any]]) -> dict[str, bool]:
    return {b["ref"].removeprefix("attachments/"): b.get("evicted", False) for b in blocks}


async def test_a_blob_deleted_by_hand_reads_evicted_in_every_read_before_any_gc(tmp_path: Path) -> None:
    """Seed 000 §2.3: a reference never points at missing bytes unmarked. A blob file deleted by hand (or
    lost) while the host runs reads back at once, before any ``attachments.gc``, as ``attachments.get``
    already answered it: ``"evicted": true`` on every block that refers to it in ``session.get`` (the
    transcript window and the streaming reply), ``session.context`` and ``session.queueList``, and
    ``attachments.estimate`` no longer counts it. They trusted the row (``live``) and served the block
    unmarked, the estimate counting its 3000 bytes, until a GC ran. The GC then makes it a tombstone and
    every read answers the same as before it; the blob whose bytes are there stays unmarked throughout."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            before = await c.call("attachments.estimate", {})
            sid, lost, kept = await _lose_one(c, tmp_path)
            want = {lost: True, kept: False}

            async def reads() -> dict[str, Any]:
                got = await c.call("session.get", {"sessionId": sid})
                context = await c.call("session.context", {"sessionId": sid})
                queue = await c.call("session.queueList", {"sessionId": sid})
                exported = await c.call("session.export", {"sessionId": sid, "format": "jsonl"})
                lines = [orjson.loads(line) for line in exported["content"].splitlines() if line.strip()]
                return {"window": _marks(_blocks(got["messages"])),
                        "export": _marks([b for rec in lines for b in rec.get("blocks", []) or []
                                          if isinstance(b, dict) and b.get("type") == "attachment"]),
                        "inflight": _marks(_blocks([got["inflight"]["message"]])),
                        "context": _marks(_blocks(context["messages"])),
                        "queue": _marks(queue["entries"][0]["attachments"]),
                        "estimate": await c.call("attachments.estimate", {})}

            first = await reads()
            assert {k: v for k, v in first.items() if k != "estimate"} == {
                "window": want, "inflight": want, "context": want, "queue": want, "export": want}
            assert first["estimate"]["blobs"] == before["blobs"] + 1
            assert first["estimate"]["usedBytes"] == before["usedBytes"] + 3000
            await c.call("attachments.gc", {"activeSessionId": sid})
            assert (await c.call("attachments.get", {"sha256": lost}))["deletionState"] == "evicted"
            assert await reads() == first


async def test_a_message_sent_with_a_blob_whose_bytes_are_gone_reads_evicted(tmp_path: Path) -> None:
    """An append whose block refers to a blob deleted by hand is taken, as one referring to an evicted blob is
    (README: the host does not require the blob to be stored; an edit or a regenerate copies an old message's
    blocks), and its block reads back ``"evicted": true`` at once, not live until the next GC; the GC then
    makes the row a tombstone and marks the new reference."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            lost = await _put(c, b"z" * 500)
            (tmp_path / "attachments" / lost).unlink()
            sent = msg("u2", "again", blocks=[{"type": "text", "text": "again"}, _att(lost)])
            await c.call("session.appendMessage", {"sessionId": sid, "message": sent})
            assert _marks(_blocks((await c.call("session.get", {"sessionId": sid}))["messages"])) == {lost: True}
            await c.call("attachments.gc", {"activeSessionId": sid})
            got = await c.call("attachments.get", {"sha256": lost})
            assert got["deletionState"] == "evicted" and "evictedAt" in got
            assert [r["evicted"] for r in got["references"]] == [True]
            assert _marks(_blocks((await c.call("session.get", {"sessionId": sid}))["messages"])) == {lost: True}


async def test_reads_check_each_blob_once_and_not_again_while_the_folder_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost of the check above: a ``session.get`` page checks each distinct blob its lines name once
    (50 messages, 5 blobs: 5 ``lstat``), and a later read on the same reader connection none while the
    ``attachments/`` folder is unchanged and settled (``SETTLE_NS``, 2 s in production, 10 ms here); a file
    deleted from it changes the folder, so the next read checks again and marks the block."""
    import os

    from store import attachments

    monkeypatch.setattr(attachments, "SETTLE_NS", 10_000_000)
    checked: list[str] = []
    real = os.path.lexists

    def counting(path: str) -> bool:
        if os.path.dirname(path).endswith("attachments"):
            checked.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(attachments.os.path, "lexists", counting)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            shas = [await _put(c, bytes([65 + i]) * 100) for i in range(5)]
            for i in range(50):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    f"u{i}", "look", blocks=[{"type": "text", "text": "look"}, _att(shas[i % 5])])})
            await trio.sleep(0.05)  # the folder's last change (the puts) is older than SETTLE_NS
            seen: list[list[str]] = []
            for _ in range(3):
                checked.clear()
                got = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
                assert len(got["messages"]) == 50 and not any(b.get("evicted") for b in _blocks(got["messages"]))
                seen.append(sorted(checked))
            # each distinct blob at most once a read; all five by the first read of each reader connection
            assert all(len(s) == len(set(s)) for s in seen) and seen[0] == sorted(shas)
            assert [] in seen[1:]  # a reader connection that read before checks nothing while the folder holds
            await trio.sleep(0.05)
            (tmp_path / "attachments" / shas[0]).unlink()
            for _ in range(3):  # whichever reader connection serves it
                got = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
                assert {b["ref"]: b.get("evicted", False) for b in _blocks(got["messages"])} == {
                    f"attachments/{sha}": sha == shas[0] for sha in shas}


async def test_a_window_over_the_scan_threshold_still_marks_a_blob_deleted_by_hand(tmp_path: Path) -> None:
    """A large window (a whole-history page, over ``LOST_SCAN_ASK``) asks first whether any blob is live
    before it scans its bytes for references (``LostBlobs.possible``): with a live blob whose file is gone, the
    block naming it still reads ``"evicted": true``; once the GC made every blob a tombstone (none live),
    the skipped scan changes nothing: the mark comes from the evicted row (``evicted_marks``, which for a
    window of many rows first asks whether the session has an evicted reference at all)."""
    from store.transcripts.window_reply import LOST_SCAN_ASK

    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            text = "p" * 6_000
            for i in range(LOST_SCAN_ASK // len(text) + 2):  # the window's bytes pass the threshold
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"f{i}", text)})
            for i in range(70):  # and its rows the count over which evicted marks ask first whether there are any
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"s{i}", "short")})
            lost, kept = await _put(c, b"q" * 700), await _put(c, b"r" * 700)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "u-lost", "look", blocks=[{"type": "text", "text": "look"}, _att(lost), _att(kept)])})
            (tmp_path / "attachments" / lost).unlink()
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1000})
            assert sum(len(m["blocks"][0].get("text", "")) for m in got["messages"]) > LOST_SCAN_ASK
            assert _marks(_blocks(got["messages"])) == {lost: True, kept: False}
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 1})
            await c.call("attachments.gc", {})
            assert (await c.call("attachments.get", {"sha256": kept}))["deletionState"] == "evicted"
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1000})
            assert _marks(_blocks(got["messages"])) == {lost: True, kept: True}


def test_lost_blobs_are_possible_only_while_a_blob_is_live(tmp_path: Path) -> None:
    import sqlite3

    from store import attachments

    conn = sqlite3.connect(tmp_path / "x.sqlite")
    conn.execute("CREATE TABLE attachment_blobs (sha256 TEXT PRIMARY KEY, deletion_state TEXT NOT NULL)")
    assert attachments.LostBlobs(conn).possible() is False
    conn.execute("INSERT INTO attachment_blobs VALUES ('a', 'evicted'), ('b', 'evicting')")
    assert attachments.LostBlobs(conn).possible() is False
    conn.execute("INSERT INTO attachment_blobs VALUES ('c', 'live')")
    assert attachments.LostBlobs(conn).possible() is True
