"""Issue 24 part 1: attachment bytes stay out of transcripts; GC derives references from the session files
and the queue; eviction marks every referring block before deleting bytes; blobs carry seed 000 §2.3 metadata.

Each test's docstring quotes the spec line it holds the host to.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient, RpcError
from store import attachments as a
from store.faults import Faults, InjectedFault
from store.upgrade.schema import message_mid
from tests.dbkit import NOW, add_session, tx
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg


def _att(sha: str, name: str = "pic.png") -> dict[str, Any]:
    return {"type": "attachment", "kind": "image", "name": name, "ref": f"attachments/{sha}",
            "mimeType": "image/png", "size": 3}


def _attachment_blocks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in reply["messages"] for b in m["blocks"] if b.get("type") == "attachment"]


async def _put(c: HostClient, data: bytes, **meta: Any) -> dict[str, Any]:
    got: dict[str, Any] = await c.call("attachments.put", {"name": "pic.png", "mimeType": "image/png",
                                                           "dataBase64": base64.b64encode(data).decode(), **meta})
    return got


async def test_attachment_with_1mb_inline_data_is_refused_and_the_transcript_stays_small(tmp_path: Path) -> None:
    """Seed 003 §4.7: "A user attachment block stores only kind, display name, MIME/size metadata, and a ref.
    [...] transient base64 used to build a pi-ai image block never enters the transcript, database, or
    renderer message." Refused at validation (INVALID_PARAMS naming the block and the upload method); the
    reference form leaves a line under 1 KB."""
    inline = base64.b64encode(os.urandom(1024 * 1024)).decode()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t"}))["id"]
            transcript = tmp_path / "sessions" / f"{sid}.jsonl"
            before = transcript.read_bytes() if transcript.exists() else b""
            for block in ({**_att("0" * 64), "data": inline}, {"type": "image", "data": inline,
                                                                "mimeType": "image/png"}):
                with pytest.raises(RpcError) as exc:
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                        "m1", "look", blocks=[{"type": "text", "text": "look"}, block])})
                assert exc.value.data_code == "INVALID_PARAMS"
                [err] = exc.value.data["errors"]
                assert err["loc"] == "message.blocks.1"  # names the offending block
                assert "inline" in err["msg"] and "attachments.put" in err["msg"]
            assert (transcript.read_bytes() if transcript.exists() else b"") == before  # nothing written
            put = await _put(c, os.urandom(1024 * 1024))
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "m1", "look", blocks=[{"type": "text", "text": "look"}, _att(put["sha256"])])})
            lines = [ln for ln in transcript.read_bytes().splitlines() if b'"m1"' in ln]
            assert len(lines) == 1 and len(lines[0]) < 1024


async def test_eviction_marks_every_referring_block_before_the_bytes_go(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes." Seed 003 §8: "Attachment GC: sweep
    attachments/ for hashes unreferenced by any transcript file." The blocks were appended without any
    attachments.ref call: the GC finds them in the transcripts, marks them, and every one reads back
    ``"evicted": true`` (the transcript files themselves are not rewritten)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            s1 = (await c.call("session.create", {"title": "one"}))["id"]
            s2 = (await c.call("session.create", {"title": "two"}))["id"]
            keep = (await c.call("session.create", {"title": "active"}))["id"]
            old = await _put(c, b"x" * 3000)
            kept = await _put(c, b"y" * 3000)
            for sid, mid in ((s1, "a1"), (s1, "a2"), (s2, "b1")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    mid, "see", blocks=[{"type": "text", "text": "see"}, _att(old["sha256"])])})
            await c.call("session.appendMessage", {"sessionId": keep, "message": msg(
                "k1", "mine", blocks=[_att(kept["sha256"])])})
            files_before = {sid: (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes() for sid in (s1, s2)}
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 4000})
            gc = await c.call("attachments.gc", {"activeSessionId": keep})
            assert gc["evicted"] == [old["sha256"]]  # the active session's block protects its blob
            assert not (tmp_path / "attachments" / old["sha256"]).exists()
            for sid, count in ((s1, 2), (s2, 1)):
                blocks = _attachment_blocks(await c.call("session.get", {"sessionId": sid}))
                assert len(blocks) == count and all(b["evicted"] is True for b in blocks)
                assert (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes() == files_before[sid]
            blocks = _attachment_blocks(await c.call("session.get", {"sessionId": keep}))
            assert blocks and "evicted" not in blocks[0]
            info = await c.call("attachments.get", {"sha256": old["sha256"]})
            assert info["deletionState"] == "evicted"
            assert {(r["sessionId"], r["messageId"], r["origin"], r["evicted"]) for r in info["references"]} == {
                (s1, "a1", "transcript", True), (s1, "a2", "transcript", True), (s2, "b1", "transcript", True)}


def test_a_crash_after_marking_already_reads_back_marked(tmp_path: Path, conn: sqlite3.Connection) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes." A crash right after the marking
    transaction leaves the bytes on disk and every referring message already marked (``evicted_marks``,
    what ``session.get`` projects)."""
    faults = Faults()
    d = tmp_path / "attachments"
    d.mkdir()
    f = a.AttachmentFiles(d, faults=faults)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    add_session(conn, "s")
    sha, size = f.put_bytes(b"z" * 100)
    tx(conn)(lambda c: a.record_blob(c, sha, size, "image/png", NOW))
    line = orjson.dumps({"type": "message", "id": "m1", "role": "user", "blocks": [_att(sha)]})
    (sessions / "s.jsonl").write_bytes(line + b"\n")
    ordinal = conn.execute("SELECT ordinal FROM sessions WHERE id = 's'").fetchone()[0]
    conn.execute("INSERT INTO messages(mid, id, session_id, seq, role, created_at) VALUES (?, 'm1', 's', 1, "
                 "'user', 0)", (message_mid(ordinal, 1),))
    faults.add("attachments.gc.after_mark", nth=1, action="raise")
    with pytest.raises(InjectedFault):
        a.collect(f, tx(conn), budget=10, active_session_id=None, sessions_dir=sessions, now_ms=NOW)
    assert f.exists(sha)  # bytes still there ...
    assert a.evicted_marks(conn, "s", 1, 1) == {1: frozenset({f"attachments/{sha}"})}  # ... already marked
    rec = orjson.loads(line)
    assert a.mark_evicted(rec, a.evicted_marks(conn, "s", 1, 1)[1])["blocks"][0]["evicted"] is True


def test_gc_derives_references_from_transcripts_revisions_checkpoints_and_queue(
    tmp_path: Path, conn: sqlite3.Connection
) -> None:
    """Seed 003 §4.7 / §4.6b: blocks live in the transcript file, archived branches in the revisions file,
    the streaming reply in the in-flight checkpoint, queued prompts in ``turn_queue.attachments_json``;
    seed 003 §8: the GC sweeps for hashes "unreferenced by any transcript file". Every one of them is a
    reference, recorded with its origin."""
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    add_session(conn, "s")
    shas = [hashlib.sha256(bytes([i])).hexdigest() for i in range(5)]
    for sha in shas:
        tx(conn)(lambda c, sha=sha: a.record_blob(c, sha, 1, None, NOW))

    def line(obj: Any) -> bytes:
        return orjson.dumps(obj) + b"\n"

    (sessions / "s.jsonl").write_bytes(
        line({"type": "message", "id": "t1", "role": "user", "blocks": [_att(shas[0])]})
        + line({"type": "message", "id": "t2", "role": "tool", "blocks": [{"type": "text", "text": "no ref"}]}))
    (sessions / "s.revisions.jsonl").write_bytes(line({"type": "revision", "rootUserId": "t1", "revisionIndex": 1,
                                                       "messages": [{"id": "r1", "role": "user",
                                                                     "blocks": [_att(shas[1])]}]}))
    (sessions / "s.inflight.json").write_bytes(orjson.dumps({"schema": 1, "sessionId": "s", "message": {
        "id": "live", "role": "assistant", "blocks": [{"type": "tool_call", "callId": "c", "name": "Shot",
                                                       "result": {"ref": f"attachments/{shas[2]}"}}]}}))
    conn.execute("INSERT INTO turn_queue(id, session_id, principal, idempotency_key, input_hash, content, "
                 "attachments_json, permission_mode, position, created_at) "
                 "VALUES ('q1', 's', 'user', 'k', 'h', 'later', ?, 'ask', 1, 0)",
                 (orjson.dumps([{"ref": f"attachments/{shas[3]}", "name": "q.png"}]).decode(),))
    scan = a.scan_references(sessions)
    tx(conn)(lambda c: a.sync_derived_refs(c, scan.refs | a.queue_references(c), NOW, full=True))
    got = set(conn.execute("SELECT sha256, session_id, message_id, origin FROM attachment_refs"))
    assert got == {(shas[0], "s", "t1", "transcript"), (shas[1], "s", "r1", "revision"),
                   (shas[2], "s", "live", "checkpoint"), (shas[3], "s", "q1", "queue")}
    # the active session's derived references protect its blobs from eviction
    assert a.plan_eviction(conn, 1, "s") == [shas[4]]
    # a rescan reads only what the transcript grew by, from its last complete line
    with open(sessions / "s.jsonl", "ab") as out:
        out.write(line({"type": "message", "id": "t3", "role": "user", "blocks": [_att(shas[4])]}))
    late = a.scan_references(sessions, since=scan)
    assert late.refs == {(shas[4], "s", "t3", "transcript"), (shas[2], "s", "live", "checkpoint")}


async def test_blob_metadata_is_recorded_and_read_back(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Attachments record kind, MIME type, Blob bytes, trust, provenance, source, node or Run
    references, deletion state, and optional page or image metadata.\""""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t"}))["id"]
            put = await _put(c, b"page text", kind="pageText", trust="untrusted", provenance="capture",
                             source="https://example.org/a", runId="turn-1",
                             meta={"url": "https://example.org/a", "title": "A page"})
            await c.call("attachments.ref", {"sha256": put["sha256"], "sessionId": sid, "messageId": "m1"})
            info = await c.call("attachments.get", {"sha256": put["sha256"]})
            assert {k: info[k] for k in ("kind", "trust", "provenance", "source", "runId", "meta", "mimeType",
                                         "deletionState")} == {
                "kind": "pageText", "trust": "untrusted", "provenance": "capture",
                "source": "https://example.org/a", "runId": "turn-1",
                "meta": {"url": "https://example.org/a", "title": "A page"}, "mimeType": "image/png",
                "deletionState": "live"}
            assert info["references"] == [{"sessionId": sid, "messageId": "m1", "origin": "client",
                                            "evicted": False}]
            with pytest.raises(RpcError) as exc:
                await _put(c, b"x", kind="video")
            assert exc.value.data_code == "INVALID_PARAMS"
            with pytest.raises(RpcError) as exc:
                await c.call("attachments.get", {"sha256": "1" * 64})
            assert exc.value.data_code == "NOT_FOUND"


async def test_a_clients_evicted_mark_is_dropped_a_live_blob_never_reads_back_evicted(tmp_path: Path) -> None:
    """``evicted`` is the host's mark, set on read from its own state (eviction marks references before
    deleting bytes, seed 000 §2.3). A client's ``"evicted": true`` on a block whose blob is live was stored
    and read back, so the UI and the model context showed a live image as gone; it is dropped on the way in,
    and a retry carrying it is the same message."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            put = await _put(c, b"live bytes")
            block = {"type": "attachment", "kind": "image", "name": "a.png", "ref": f"attachments/{put['sha256']}",
                     "evicted": True}
            message = {"id": "m1", "role": "user", "blocks": [block]}
            await c.call("session.appendMessage", {"sessionId": sid, "message": message})
            again = await c.call("session.appendMessage", {"sessionId": sid, "message": message})
            assert again["replayed"] is True
            for got in ((await c.call("session.get", {"sessionId": sid}))["messages"][0],
                        (await c.call("session.context", {"sessionId": sid}))["messages"][0]):
                assert "evicted" not in got["blocks"][0], got
    line = next(ln for ln in (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes().splitlines() if b'"m1"' in ln)
    assert b"evicted" not in line


def test_reput_revives_an_evicted_blob_and_clears_its_marks(tmp_path: Path, conn: sqlite3.Connection) -> None:
    """Seed 000 §2.3 (deletion state): an evicted blob is a tombstone; storing the same bytes again makes it
    live, so the references that were marked resolve again."""
    d = tmp_path / "attachments"
    d.mkdir()
    f = a.AttachmentFiles(d)
    add_session(conn, "s")
    sha, size = f.put_bytes(b"q" * 50)
    tx(conn)(lambda c: a.record_blob(c, sha, size, None, NOW))
    tx(conn)(lambda c: a.record_ref(c, sha, "s", "m1", NOW))
    a.collect(f, tx(conn), budget=10, active_session_id=None, now_ms=NOW)
    assert a.refs_of(conn, sha, evicted=True) == [("s", "m1")] and not f.exists(sha)
    assert a.estimate(conn, 10).used_bytes == 0  # a tombstone counts nothing
    f.put_bytes(b"q" * 50)
    tx(conn)(lambda c: a.record_blob(c, sha, size, None, NOW + 1))
    row = a.blob_row(conn, sha)
    assert row is not None and row["deletionState"] == "live"
    assert a.refs_of(conn, sha) == [("s", "m1")] and a.refs_of(conn, sha, evicted=True) == []


async def test_a_second_put_of_the_same_bytes_answers_what_is_stored(tmp_path: Path) -> None:
    """README §6: the first writer's values stay. The second put's answer said its own mimeType
    (text/plain) while attachments.get said the stored one (image/png)."""
    data = base64.b64encode(b"\x89PNG same bytes").decode()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            first = await c.call("attachments.put", {"name": "a.png", "mimeType": "image/png", "dataBase64": data})
            second = await c.call("attachments.put", {"name": "b.txt", "mimeType": "text/plain", "dataBase64": data})
            assert second["sha256"] == first["sha256"] and second["mimeType"] == "image/png"
            assert (await c.call("attachments.get", {"sha256": first["sha256"]}))["mimeType"] == "image/png"


async def test_a_queued_prompt_with_inline_bytes_is_refused_and_queues_nothing(tmp_path: Path) -> None:
    """Seed 003 §4.6b: "attachments_json keeps the prompt's attachment references; bytes stay in the session
    scratch or project root". queuePush kept an attachment block's inline dataBase64, a prompt whose user
    message session.appendMessage would then refuse; the reference form is queued."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t"}))["id"]
            push = {"sessionId": sid, "principal": "ui", "content": "look", "permissionMode": "ask"}
            for block in ({**_att("0" * 64), "dataBase64": "iVBORw0KGgo="}, {"type": "image", "data": "iVBO",
                                                                             "mimeType": "image/png"}):
                with pytest.raises(RpcError) as exc:
                    await c.call("session.queuePush", {**push, "attachments": [block]})
                assert exc.value.data_code == "INVALID_PARAMS"
                [err] = exc.value.data["errors"]
                assert err["loc"] == "attachments.0" and "attachments.put" in err["msg"]
            assert (await c.call("session.queueList", {"sessionId": sid}))["entries"] == []
            pushed = await c.call("session.queuePush", {**push, "attachments": [_att("0" * 64)]})
            assert pushed["entry"]["attachments"] == [_att("0" * 64)]


async def test_a_block_appended_to_a_live_blob_is_a_reference_at_once_and_goes_when_rewritten_away(
        tmp_path: Path) -> None:
    """Seed 000 §2.3: "Attachments record kind, MIME type, Blob bytes, trust, provenance, source, node or Run
    references, deletion state." A message appended with a block referring to a live blob was listed by
    ``attachments.get`` only after the next GC's scan; it is recorded when the message is indexed (once, not
    marked). A blob the host does not know gets no reference. Rewritten away (``replaceMessages``), the row is
    derived like the scan's: the next GC drops it."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t"}))["id"]
            put = await _put(c, b"live bytes for the index")
            unknown = "e" * 64
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "m1", "see", blocks=[{"type": "text", "text": "see"}, _att(put["sha256"]), _att(put["sha256"])])})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m2", "plain")})
            await index_caught_up(host)  # the message is indexed (appends answer before the index follows)
            info = await c.call("attachments.get", {"sha256": put["sha256"]})
            assert info["references"] == [{"sessionId": sid, "messageId": "m1", "origin": "transcript",
                                            "evicted": False}]
            with pytest.raises(RpcError) as exc:
                await c.call("attachments.get", {"sha256": unknown})
            assert exc.value.data_code == "NOT_FOUND"
            await c.call("attachments.gc", {"activeSessionId": sid})  # the scan finds the same row: no second
            info = await c.call("attachments.get", {"sha256": put["sha256"]})
            assert info["references"] == [{"sessionId": sid, "messageId": "m1", "origin": "transcript",
                                            "evicted": False}]
            kept = (await c.call("session.get", {"sessionId": sid}))["messages"][1]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [kept]})
            await c.call("attachments.gc", {"activeSessionId": sid})
            assert (await c.call("attachments.get", {"sha256": put["sha256"]}))["references"] == []
            assert (await c.call("attachments.get", {"sha256": put["sha256"]}))["deletionState"] == "live"


async def test_every_blob_kind_of_seed_000_is_stored_with_its_page_or_image_metadata_across_a_restart(
        tmp_path: Path) -> None:
    """Seed 000 §2: attachments are "File, image, screenshot, page snapshot, and page text Blobs"; §2.3 they
    record kind, trust, provenance, source, Run reference "and optional page or image metadata" — by
    ``attachments.put`` and ``attachments.importFile`` alike, read back the same after a restart."""
    kinds = {
        "file": {}, "image": {"width": 640, "height": 480}, "screenshot": {"width": 1280, "height": 800},
        "pageSnapshot": {"url": "https://example.org/p", "title": "P"},
        "pageText": {"url": "https://example.org/t", "title": "T"},
    }
    (tmp_path / "scratch").mkdir(parents=True, exist_ok=True)
    seen: dict[str, dict[str, Any]] = {}
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for i, (kind, meta) in enumerate(kinds.items()):
                fields = {"kind": kind, "trust": "untrusted", "provenance": "capture", "source": f"tool-{i}",
                          "runId": f"turn-{i}", **({"meta": meta} if meta else {})}
                if i % 2:  # every other one imported from a file under scratch/
                    path = tmp_path / "scratch" / f"{kind}.bin"
                    path.write_bytes(f"{kind} bytes".encode())
                    got = await c.call("attachments.importFile", {"path": str(path), "mimeType": "image/png",
                                                                  **fields})
                else:
                    got = await _put(c, f"{kind} bytes".encode(), **fields)
                info = await c.call("attachments.get", {"sha256": got["sha256"]})
                assert {k: info.get(k) for k in (*fields, "deletionState")} == {**fields, "deletionState": "live"}
                seen[got["sha256"]] = info
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for sha, before in seen.items():
                assert await c.call("attachments.get", {"sha256": sha}) == before
