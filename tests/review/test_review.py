"""Issue 24 part 2: message-owned review-change snapshots (seed 003 §2.0, ADR 0043).

Seed 003 §2.0: "Successful workspace Write/Edit tool results carry the bounded details.review record
described in 03-tools-and-permissions. The transcript JSONL is the durable index for the visible card;
the previous bytes and hashes live outside the workspace in review-changes/<sessionId>/<snapshotId>/.
The host removes a session's snapshot directory with session.delete and sweeps directories whose
session no longer exists at startup. A snapshot is never inferred from Git, so a later commit does not
remove historical review evidence."

Each test's docstring quotes the part it holds the host to; results are validated against their
wire models. On main before this change none of ``review.*`` existed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from protocol.methods import METHODS
from runtime.client import HostClient, RpcError
from store import review
from store.receipts import ReceiptKey, fingerprint
from store.rules import MAX_REVIEW_FILE_BYTES, MAX_REVIEW_SNAPSHOTS
from tests.hostkit import client_for, inprocess_host, msg
from tests.threadkit import on_trio_thread

BEFORE = b"# Notes\n"
AFTER = b"# Notes\n\nMore.\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _checked(method: str, result: Any) -> Any:
    """The raw result must validate against the method's result model (as tests/protocol does)."""
    METHODS[method].result_model.model_validate(result)
    return result


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    return _checked(method, await c.call(method, params))


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True, exist_ok=True)
    return ws


async def _session(c: HostClient, ws: Path) -> str:
    return str((await c.call("session.create", {"title": "review", "projectPath": str(ws)}))["id"])


def _record_params(sid: str, path: str = "docs/notes.md", before: bytes | None = BEFORE,
                   **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "path": path, "beforeBase64": None if before is None else _b64(before),
            "toolName": "Edit", "toolCallId": "call_3", "messageId": "a1", **extra}


def _snapshot_dirs(data: Path, sid: str) -> list[Path]:
    return sorted(p for p in (data / "review-changes" / sid).glob("rv-*") if (p / "meta.json").exists())


async def test_record_keeps_before_bytes_and_hashes_outside_the_workspace(tmp_path: Path) -> None:
    """§2.0: "the previous bytes and hashes live outside the workspace in
    review-changes/<sessionId>/<snapshotId>/" — ``before`` holds the old bytes, ``meta.json`` the
    resolved path, both hashes, the diff state and the owner; the workspace gains no file. The answer's
    ``review`` record is what the tool result's ``details.review`` carries, and it refers to the snapshot."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    (ws / "docs" / "notes.md").write_bytes(AFTER)
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            out = await _call(c, "review.record", _record_params(sid, turnId="t1"))
            snap = out["snapshot"]
            assert out["review"] == {"snapshotId": snap["snapshotId"], "path": str(ws / "docs" / "notes.md"),
                                     "beforeSha256": _sha(BEFORE), "afterSha256": _sha(AFTER), "created": False}
            assert snap["before"] == {"exists": True, "sha256": _sha(BEFORE), "size": len(BEFORE)}
            assert snap["after"] == {"exists": True, "sha256": _sha(AFTER), "size": len(AFTER)}
            assert (snap["state"], snap["messageId"], snap["toolCallId"], snap["turnId"]) == \
                ("recorded", "a1", "call_3", "t1")
            # the tool result carries the bounded record; the transcript line is the card's index
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", "", "assistant", blocks=[
                {"type": "tool_call", "callId": "call_3", "name": "Edit", "args": {"path": "docs/notes.md"},
                 "status": "ok", "result": {"output": "edited", "details": {"review": out["review"]}}}])})
            got = await c.call("session.get", {"sessionId": sid})
            card = got["messages"][-1]["blocks"][0]["result"]["details"]["review"]
            assert card == out["review"]
    [directory] = _snapshot_dirs(data, sid)
    assert directory.name == snap["snapshotId"]
    assert (directory / "before").read_bytes() == BEFORE
    meta = orjson.loads((directory / "meta.json").read_bytes())
    assert meta["path"] == str(ws / "docs" / "notes.md") and meta["sessionId"] == sid
    assert sorted(p.name for p in (ws / "docs").iterdir()) == ["notes.md"]
    assert oct(directory.stat().st_mode & 0o777) == "0o700"


async def test_get_and_list_read_a_sessions_snapshots(tmp_path: Path) -> None:
    """§2.0: the snapshot is readable by id (with its before bytes on request) and a session's snapshots
    are listed, oldest first, optionally those of one message (the card's owner)."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    (ws / "docs" / "notes.md").write_bytes(AFTER)
    (ws / "new.txt").write_bytes(b"fresh\n")
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            first = (await _call(c, "review.record", _record_params(sid)))["snapshot"]
            second = (await _call(c, "review.record", _record_params(sid, "new.txt", None, messageId="a2")))
            assert second["review"]["created"] is True and second["review"]["beforeSha256"] is None
            got = await _call(c, "review.get", {"sessionId": sid, "snapshotId": first["snapshotId"],
                                                "includeBefore": True})
            assert got["snapshot"] == first and base64.b64decode(got["beforeBase64"]) == BEFORE
            plain = await _call(c, "review.get", {"sessionId": sid, "snapshotId": first["snapshotId"]})
            assert "beforeBase64" not in plain
            listed = await _call(c, "review.list", {"sessionId": sid})
            assert [s["snapshotId"] for s in listed["snapshots"]] == \
                [first["snapshotId"], second["snapshot"]["snapshotId"]] and listed["truncated"] is False
            mine = await _call(c, "review.list", {"sessionId": sid, "messageId": "a2"})
            assert [s["snapshotId"] for s in mine["snapshots"]] == [second["snapshot"]["snapshotId"]]
            one = await _call(c, "review.list", {"sessionId": sid, "limit": 1})
            assert len(one["snapshots"]) == 1 and one["truncated"] is True
            with pytest.raises(RpcError) as missing:
                await c.call("review.get", {"sessionId": sid, "snapshotId": "rv-" + "0" * 32})
            assert missing.value.data_code == "NOT_FOUND"


async def test_restore_puts_the_before_bytes_back_and_removes_a_created_file(tmp_path: Path) -> None:
    """§2.0 / issue 24: "restore the before bytes into the workspace" — an edited file gets its old bytes
    (and keeps its mode), a file the tool created is removed; the snapshot then says ``restored``."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    notes, created = ws / "docs" / "notes.md", ws / "new.txt"
    notes.write_bytes(AFTER)
    notes.chmod(0o640)
    created.write_bytes(b"fresh\n")
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            edit = (await _call(c, "review.record", _record_params(sid)))["snapshot"]["snapshotId"]
            make = (await _call(c, "review.record", _record_params(sid, "new.txt", None)))["snapshot"]["snapshotId"]
            done = await _call(c, "review.restore", {"sessionId": sid, "snapshotId": edit})
            assert done["snapshot"]["state"] == "restored" and done["snapshot"]["restoredAt"] > 0
            assert notes.read_bytes() == BEFORE and oct(notes.stat().st_mode & 0o777) == "0o640"
            await _call(c, "review.restore", {"sessionId": sid, "snapshotId": make})
            assert not created.exists()
            with pytest.raises(RpcError) as again:
                await c.call("review.restore", {"sessionId": sid, "snapshotId": edit})
            assert again.value.data_code == "CONFLICT" and again.value.data["reason"] == "already_restored"
            listed = await _call(c, "review.list", {"sessionId": sid})
            assert {s["state"] for s in listed["snapshots"]} == {"restored"}
    assert not [p for p in (ws / "docs").iterdir() if ".tmp." in p.name]


async def test_restore_refuses_a_file_that_changed_since_by_hash(tmp_path: Path) -> None:
    """Issue 24: restore "refusing when the file changed since, by hash" — a file edited after the tool
    (same size, other bytes) is ``FILE_CHANGED`` with both hashes; the file and the snapshot stay as they
    were. A file deleted since is refused too."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    notes = ws / "docs" / "notes.md"
    notes.write_bytes(AFTER)
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            snap = (await _call(c, "review.record", _record_params(sid)))["snapshot"]["snapshotId"]
            changed = AFTER.replace(b"More", b"Less")
            notes.write_bytes(changed)
            with pytest.raises(RpcError) as err:
                await c.call("review.restore", {"sessionId": sid, "snapshotId": snap, "submissionId": "r1"})
            assert err.value.data_code == "FILE_CHANGED"
            assert (err.value.data["expectedSha256"], err.value.data["actualSha256"]) == (_sha(AFTER), _sha(changed))
            assert notes.read_bytes() == changed
            got = await _call(c, "review.get", {"sessionId": sid, "snapshotId": snap})
            assert got["snapshot"]["state"] == "recorded"
            notes.unlink()
            with pytest.raises(RpcError) as gone:
                await c.call("review.restore", {"sessionId": sid, "snapshotId": snap})
            assert gone.value.data_code == "FILE_CHANGED" and gone.value.data["actualSha256"] is None
            assert not notes.exists()


async def test_paths_resolve_under_the_sessions_workspace_and_never_leave_it(tmp_path: Path) -> None:
    """Issue 24: "paths resolved under the session's workspace root through the same rule as
    session.resolvePath — never outside it, O_NOFOLLOW": ``..``, an absolute path elsewhere, a folder link
    out of the workspace and a final symlink are refused, and nothing is written."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"x")
    (ws / "out").symlink_to(outside)
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            for path in ("../outside/secret.txt", str(outside / "secret.txt"), "out/secret.txt", "link.txt"):
                with pytest.raises(RpcError) as err:
                    await c.call("review.record", _record_params(sid, path))
                assert err.value.data_code == "INVALID_PARAMS", path
            resolved = await c.call("session.resolvePath", {"sessionId": sid, "path": "docs/../docs/notes.md"})
            (ws / "docs" / "notes.md").write_bytes(AFTER)
            out = await _call(c, "review.record", _record_params(sid, "docs/../docs/notes.md"))
            assert out["snapshot"]["path"] == resolved["path"]
    assert len(_snapshot_dirs(data, sid)) == 1


async def test_snapshots_are_bounded(tmp_path: Path) -> None:
    """Issue 24: "bounded sizes (limits beside the wire models in store/rules.py)": a file over
    MAX_REVIEW_FILE_BYTES is ``PAYLOAD_TOO_LARGE``, a session holding MAX_REVIEW_SNAPSHOTS is
    ``LIMIT_EXCEEDED``, a missing file is ``NOT_FOUND``; none of them writes a snapshot."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    (ws / "big.bin").write_bytes(b"\0" * (MAX_REVIEW_FILE_BYTES + 1))
    (ws / "docs" / "notes.md").write_bytes(AFTER)
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            with pytest.raises(RpcError) as big:
                await c.call("review.record", _record_params(sid, "big.bin"))
            assert big.value.data_code == "PAYLOAD_TOO_LARGE"
            with pytest.raises(RpcError) as missing:
                await c.call("review.record", _record_params(sid, "docs/absent.md"))
            assert missing.value.data_code == "NOT_FOUND"
            assert _snapshot_dirs(data, sid) == []
            for n in range(MAX_REVIEW_SNAPSHOTS):  # published snapshots, written as the store writes them
                meta = review.new_meta(snapshot_id=f"rv-{n:032x}", session_id=sid, path=str(ws / "docs/notes.md"),
                                       tool_name="Edit", tool_call_id=None, message_id=None, turn_id=None,
                                       before=None, after=AFTER, now_ms=n, key=None)
                review.write_snapshot(data / "review-changes" / sid, meta, None)
            with pytest.raises(RpcError) as full:
                await c.call("review.record", _record_params(sid))
            assert full.value.data_code == "LIMIT_EXCEEDED"
    assert len(_snapshot_dirs(data, sid)) == MAX_REVIEW_SNAPSHOTS


async def test_session_delete_removes_its_snapshots_and_boot_sweeps_orphans(tmp_path: Path) -> None:
    """§2.0: "The host removes a session's snapshot directory with session.delete and sweeps directories
    whose session no longer exists at startup." Another session's snapshots stay."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    (ws / "docs" / "notes.md").write_bytes(AFTER)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c:
            gone, kept = await _session(c, ws), await _session(c, ws)
            for sid in (gone, kept):
                await _call(c, "review.record", _record_params(sid))
            assert _snapshot_dirs(data, gone) and _snapshot_dirs(data, kept)
            await c.call("session.delete", {"sessionId": gone})
            assert not (data / "review-changes" / gone).exists()
        orphan = data / "review-changes" / "ghost" / ("rv-" + "a" * 32)
        orphan.mkdir(parents=True)
        (orphan / "meta.json").write_bytes(b"{}")
        async with inprocess_host(data) as host, client_for(host) as c:
            status = await c.call("host.status")
            assert status["boot"]["scratchSwept"] >= 1
            listed = await _call(c, "review.list", {"sessionId": kept})
            assert len(listed["snapshots"]) == 1
    assert not (data / "review-changes" / "ghost").exists()
    assert len(_snapshot_dirs(data, kept)) == 1


async def test_a_snapshot_is_never_inferred_from_git(tmp_path: Path) -> None:
    """§2.0: "A snapshot is never inferred from Git, so a later commit does not remove historical review
    evidence." A workspace under Git: committing the change leaves the snapshot listed and restorable."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    notes = ws / "docs" / "notes.md"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True, env=env)

    git("init", "-q")
    notes.write_bytes(BEFORE)
    git("add", "-A")
    git("commit", "-qm", "before")
    notes.write_bytes(AFTER)
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            snap = (await _call(c, "review.record", _record_params(sid)))["snapshot"]["snapshotId"]
            git("commit", "-qam", "the tool's change")
            listed = await _call(c, "review.list", {"sessionId": sid})
            assert [s["snapshotId"] for s in listed["snapshots"]] == [snap]
            await _call(c, "review.restore", {"sessionId": sid, "snapshotId": snap})
            assert notes.read_bytes() == BEFORE


def _drop_receipts(data: Path) -> None:
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        conn.execute("DELETE FROM command_receipts WHERE method LIKE 'review.%'")
        conn.commit()
    finally:
        conn.close()


async def test_a_retry_after_a_crash_is_answered_from_the_snapshot_files(tmp_path: Path) -> None:
    """ARCHITECTURE "Receipts ride with their effect": "If the effect is a file (...) the receipt travels in
    that file (...). A retry after a SIGKILL at any point then gets the original response and the effect
    happens once." Reproduces a crash after ``meta.json`` was published but before the receipt row (the row
    is removed), and one after the restore intent was written but before the workspace file was replaced."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    notes = ws / "docs" / "notes.md"
    notes.write_bytes(AFTER)
    record = {**_record_params("", "docs/notes.md"), "submissionId": "rec-1"}
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, "agent-1") as c:
            sid = await _session(c, ws)
            record["sessionId"] = sid
            first = await _call(c, "review.record", record)
        _drop_receipts(data)
        snap = first["snapshot"]["snapshotId"]
        restore = {"sessionId": sid, "snapshotId": snap, "submissionId": "res-1"}
        shown = {k: v for k, v in restore.items() if k != "submissionId"}
        key = ReceiptKey("agent-1", "res-1", "review.restore", fingerprint("review.restore", shown))
        directory = data / "review-changes" / sid
        review.start_restore(directory, review.load_meta(directory, snap) or {}, key, 1767229260000)
        # the killed attempt's temp file in the workspace, before its rename: the retry removes it
        leftover = notes.with_name(f"notes.md.tmp.{hashlib.sha256(snap.encode()).hexdigest()[:12]}")
        leftover.write_bytes(b"half")
        async with inprocess_host(data) as host, client_for(host, "agent-1") as c:
            with pytest.raises(RpcError) as other:  # another request under that key: refused from meta.json
                await c.call("review.record", {**record, "toolCallId": "call_9"})
            assert other.value.data_code == "IDEMPOTENCY_CONFLICT"
            assert await _call(c, "review.record", record) == first
            assert len(_snapshot_dirs(data, sid)) == 1
            assert notes.read_bytes() == AFTER
            done = await _call(c, "review.restore", restore)
            assert done["snapshot"]["state"] == "restored" and done["snapshot"]["restoredAt"] == 1767229260000
            assert notes.read_bytes() == BEFORE
            assert not list(notes.parent.glob("notes.md.tmp.*"))  # nothing of the restore left in the project
        _drop_receipts(data)
        async with inprocess_host(data) as host, client_for(host, "agent-1") as c:
            assert await _call(c, "review.restore", restore) == done
            with pytest.raises(RpcError) as mine:
                await c.call("review.restore", {**restore, "submissionId": "res-2"})
            assert mine.value.data_code == "CONFLICT"
    assert notes.read_bytes() == BEFORE


async def test_boot_removes_temp_files_an_interrupted_snapshot_write_left(tmp_path: Path) -> None:
    """Found by this session's crash sweep: review.record killed after a snapshot file's temp write
    (``review.before.after_tmp_write`` and the like) left ``review-changes/<sid>/rv-*/*.tmp.<hex>`` for
    good (boot swept temp files only in the data directory's top folders). The snapshot itself stays."""
    data, ws = tmp_path / "data", _workspace(tmp_path)
    (ws / "docs" / "notes.md").write_bytes(AFTER)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            await _call(c, "review.record", _record_params(sid))
        (snapshot,) = _snapshot_dirs(data, sid)
        kept = sorted(p.name for p in snapshot.iterdir())
        stray = snapshot / "before.bin.tmp.0123456789ab"
        stray.write_bytes(b"half")
        async with inprocess_host(data) as host, client_for(host) as c:
            assert not stray.exists()
            assert sorted(p.name for p in snapshot.iterdir()) == kept
            assert (await c.call("host.status"))["boot"]["tempFilesRemoved"] == 1
            assert len((await _call(c, "review.list", {"sessionId": sid}))["snapshots"]) == 1


async def test_before_bytes_are_decoded_hashed_and_encoded_off_the_trio_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record carries megabytes of base64 ``before`` (up to the params limit) and hashes it and the workspace
    file (up to 4 MiB); a get with ``includeBefore`` encodes up to 4 MiB: all in the session's worker thread,
    never on the trio loop (every other request of the host waits while it runs there)."""
    before = os.urandom(1 << 20)
    encoded = _b64(before)
    seen: list[tuple[str, bool]] = []
    decode_before, new_meta, b64encode = review.decode_before, review.new_meta, base64.b64encode

    def decode_seen(value: str | None) -> bytes | None:
        seen.append(("decode", on_trio_thread()))
        return decode_before(value)

    def meta_seen(**kwargs: Any) -> dict[str, Any]:
        seen.append(("hash", on_trio_thread()))
        return new_meta(**kwargs)

    def encode_seen(value: Any, *args: Any) -> bytes:
        if value == before:
            seen.append(("encode", on_trio_thread()))
        return b64encode(value, *args)

    data, ws = tmp_path / "data", _workspace(tmp_path)
    (ws / "docs" / "notes.md").write_bytes(AFTER)
    monkeypatch.setattr(review, "decode_before", decode_seen)
    monkeypatch.setattr(review, "new_meta", meta_seen)
    monkeypatch.setattr(base64, "b64encode", encode_seen)
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = await _session(c, ws)
            params = {**_record_params(sid), "beforeBase64": encoded}
            first = (await _call(c, "review.record", params))["snapshot"]
            got = await _call(c, "review.get", {"sessionId": sid, "snapshotId": first["snapshotId"],
                                                "includeBefore": True})
    assert first["before"]["sha256"] == _sha(before) and got["beforeBase64"] == encoded
    assert seen == [("decode", False), ("hash", False), ("encode", False)]
