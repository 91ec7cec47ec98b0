"""Attachments: content addressing, budget eviction order, active-session protection,
references marked before bytes go (a crash between never leaves an unmarked reference to missing bytes)."""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store import attachments as a
from store.errors import InvalidInput, NotFound, PayloadTooLarge, SessionNotFound
from store.faults import Faults, InjectedFault
from tests.dbkit import NOW, add_session, tx
from tests.hostkit import client_for, inprocess_host
from tests.threadkit import on_trio_thread


def files(tmp_path: Path, faults: Faults | None = None) -> a.AttachmentFiles:
    d = tmp_path / "attachments"
    d.mkdir(exist_ok=True)
    return a.AttachmentFiles(d, faults=faults or Faults())


def put(conn: sqlite3.Connection, f: a.AttachmentFiles, data: bytes, at: int) -> str:
    sha, size = f.put_bytes(data)
    tx(conn)(lambda c: a.record_blob(c, sha, size, "application/octet-stream", at))
    return sha


def dangling(conn: sqlite3.Connection, f: a.AttachmentFiles) -> list[str]:
    """Unmarked references whose bytes are missing (must always be empty)."""
    return [sha for (sha,) in conn.execute("SELECT DISTINCT sha256 FROM attachment_refs WHERE evicted_at IS NULL")
            if not f.exists(sha)]


def test_put_is_content_addressed_and_deduplicated(tmp_path: Path, conn: sqlite3.Connection) -> None:
    f = files(tmp_path)
    data = b"hello attachments"
    sha = put(conn, f, data, NOW)
    assert sha == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "attachments" / sha).read_bytes() == data
    mtime = os.stat(f.path(sha)).st_mtime_ns
    assert put(conn, f, data, NOW + 5) == sha  # same bytes: nothing rewritten, one row
    assert os.stat(f.path(sha)).st_mtime_ns == mtime
    assert f.blob_names() == [sha]
    est = a.estimate(conn, 1000)
    assert (est.used_bytes, est.blobs) == (len(data), 1)
    assert a.blob_row(conn, sha)["lastUsedAt"] == NOW + 5  # type: ignore[index]


def test_import_streams_and_hashes_large_files(tmp_path: Path, conn: sqlite3.Connection) -> None:
    f = files(tmp_path)
    src = tmp_path / "big.bin"
    chunk = os.urandom(1 << 16)
    with open(src, "wb") as out:
        for _ in range(48):  # 3 MiB, several read chunks
            out.write(chunk)
    roots = [str(tmp_path)]
    sha, size = f.import_file(src, max_bytes=10 << 20, roots=roots)
    assert size == 48 << 16 and sha == hashlib.sha256(src.read_bytes()).hexdigest()
    assert f.path(sha).read_bytes() == src.read_bytes()
    assert f.import_file(src, max_bytes=10 << 20, roots=roots) == (sha, size)  # dedupe
    with pytest.raises(PayloadTooLarge):
        f.import_file(src, max_bytes=1 << 20, roots=roots)
    os.symlink(src, tmp_path / "link")
    with pytest.raises(InvalidInput):  # O_NOFOLLOW: a symlink is refused, not followed
        f.import_file(tmp_path / "link", max_bytes=10 << 20, roots=roots)
    assert [n for n in os.listdir(f.directory) if ".tmp." in n] == []  # failed imports leave no temp file


def test_ref_requires_a_live_blob_and_session(tmp_path: Path, conn: sqlite3.Connection) -> None:
    f = files(tmp_path)
    sha = put(conn, f, b"x", NOW)
    add_session(conn, "s1")
    assert tx(conn)(lambda c: a.record_ref(c, sha, "s1", "m1", NOW)) is True
    assert tx(conn)(lambda c: a.record_ref(c, sha, "s1", "m1", NOW)) is False
    assert tx(conn)(lambda c: a.record_ref(c, sha, "s1", None, NOW)) is True
    assert tx(conn)(lambda c: a.record_ref(c, sha, "s1", None, NOW)) is False  # NULL message id dedupes too
    with pytest.raises(SessionNotFound):
        tx(conn)(lambda c: a.record_ref(c, sha, "nope", None, NOW))
    with pytest.raises(NotFound):
        tx(conn)(lambda c: a.record_ref(c, "0" * 64, "s1", None, NOW))


def test_budget_eviction_is_lru_and_spares_the_active_session(tmp_path: Path, conn: sqlite3.Connection) -> None:
    f = files(tmp_path)
    for sid in ("active", "other"):
        add_session(conn, sid)
    blobs = [put(conn, f, bytes([i]) * 100, NOW + i) for i in range(6)]  # 600 bytes, oldest first
    tx(conn)(lambda c: a.record_ref(c, blobs[0], "active", "m0", NOW))  # oldest, but protected
    conn.execute("UPDATE attachment_blobs SET last_used_at = ? WHERE sha256 = ?", (NOW, blobs[0]))
    tx(conn)(lambda c: a.record_ref(c, blobs[1], "other", "m1", NOW))
    conn.execute("UPDATE attachment_blobs SET last_used_at = ? WHERE sha256 = ?", (NOW + 1, blobs[1]))
    out = a.collect(f, tx(conn), budget=350, active_session_id="active")
    assert out["evicted"] == blobs[1:4]  # oldest first, skipping the active session's blob
    assert out["freedBytes"] == 300
    assert f.blob_names() == sorted([blobs[0], blobs[4], blobs[5]])
    assert a.estimate(conn, 350).used_bytes == 300
    assert a.refs_of(conn, blobs[1]) == []  # the other session's reference is marked evicted
    assert a.refs_of(conn, blobs[1], evicted=True) == [("other", "m1")]
    assert a.refs_of(conn, blobs[0]) == [("active", "m0")]
    assert dangling(conn, f) == []
    # under budget: nothing more to do
    assert a.collect(f, tx(conn), budget=350, active_session_id="active")["evicted"] == []


def test_estimate_warns_above_80_percent(conn: sqlite3.Connection, tmp_path: Path) -> None:
    f = files(tmp_path)
    put(conn, f, b"a" * 80, NOW)
    est = a.estimate(conn, 100)
    assert (est.percent, est.warning) == (80.0, False)
    put(conn, f, b"b", NOW)
    est = a.estimate(conn, 100)
    assert est.warning is True and est.to_wire()["usedBytes"] == 81
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('app', 'attachmentBudgetBytes', '90', 0)")
    assert a.estimate(conn).budget_bytes == 90


@pytest.mark.parametrize("point", ["attachments.gc.after_mark", "attachments.gc.after_unlink"])
def test_crash_between_marking_and_deleting_leaves_no_dangling_reference(
    tmp_path: Path, conn: sqlite3.Connection, point: str
) -> None:
    faults = Faults()
    f = files(tmp_path, faults)
    add_session(conn, "s")
    blobs = [put(conn, f, bytes([i]) * 10, NOW + i) for i in range(4)]
    for i, sha in enumerate(blobs):
        tx(conn)(lambda c, sha=sha, i=i: a.record_ref(c, sha, "s", f"m{i}", NOW + i))
    faults.add(point, nth=1, action="raise")
    with pytest.raises(InjectedFault):
        a.collect(f, tx(conn), budget=15, active_session_id=None)
    # the crash state: references are gone before any byte went; nothing points at missing bytes
    assert dangling(conn, f) == []
    marked = a.pending_evictions(conn)
    assert len(marked) == 3
    assert all(a.refs_of(conn, sha) == [] for sha in marked)  # every reference marked before any byte went
    assert all(a.refs_of(conn, sha, evicted=True) for sha in marked)
    with pytest.raises(NotFound):  # a marked blob cannot be referenced again
        tx(conn)(lambda c: a.record_ref(c, marked[0], "s", "late", NOW))
    assert a.estimate(conn, 15).used_bytes == 10  # marked blobs no longer count
    # the next GC finishes the job
    faults.clear()
    a.collect(f, tx(conn), budget=15, active_session_id=None)
    assert a.pending_evictions(conn) == [] and f.blob_names() == [blobs[3]]
    assert dangling(conn, f) == []


def test_gc_repairs_orphan_files_and_lost_blobs(tmp_path: Path, conn: sqlite3.Connection) -> None:
    f = files(tmp_path)
    add_session(conn, "s")
    orphan, _ = f.put_bytes(b"no row: crash before the index commit")
    lost = put(conn, f, b"bytes lost", NOW)
    tx(conn)(lambda c: a.record_ref(c, lost, "s", None, NOW))
    os.unlink(f.path(lost))
    out = a.collect(f, tx(conn), budget=1000, active_session_id=None)
    assert out["orphansRemoved"] == 1 and f.blob_names() == []
    lost_row = a.blob_row(conn, lost)
    assert lost_row is not None and lost_row["deletionState"] == "evicted"  # a tombstone: its refs read marked
    assert dangling(conn, f) == [] and a.refs_of(conn, lost, evicted=True) == [("s", None)]


async def test_attachments_over_rpc(tmp_path: Path) -> None:
    data = b"\x89PNG fake image bytes"
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            s1 = (await c.call("session.create", {"title": "one"}))["id"]
            s2 = (await c.call("session.create", {"title": "two"}))["id"]
            put1 = await c.call("attachments.put", {"name": "a.png", "mimeType": "image/png",
                                                    "dataBase64": base64.b64encode(data).decode(),
                                                    "submissionId": "p-1"})
            sha = hashlib.sha256(data).hexdigest()
            assert put1 == {"ref": f"attachments/{sha}", "sha256": sha, "size": len(data), "name": "a.png",
                            "mimeType": "image/png"}
            project = tmp_path.parent / f"{tmp_path.name}-project"
            project.mkdir()
            s3 = (await c.call("session.create", {"title": "three", "projectPath": str(project)}))["id"]
            src = project / "big.bin"
            src.write_bytes(os.urandom(300_000))
            big = await c.call("attachments.importFile", {"path": str(src), "mimeType": "application/zip",
                                                          "sessionId": s3})
            assert big["size"] == 300_000
            assert (tmp_path / "attachments" / big["sha256"]).read_bytes() == src.read_bytes()
            r = await c.call("attachments.ref", {"sha256": sha, "sessionId": s1, "messageId": "m1"})
            assert r["created"] is True
            await c.call("attachments.ref", {"sha256": big["sha256"], "sessionId": s2})
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 250_000})
            est = await c.call("attachments.estimate", {})
            assert est["usedBytes"] == 300_000 + len(data) and est["warning"] is True
            gc = await c.call("attachments.gc", {"activeSessionId": s1, "submissionId": "gc-1"})
            assert gc["evicted"] == [big["sha256"]] and gc["estimate"]["warning"] is False
            assert not (tmp_path / "attachments" / big["sha256"]).exists()
            assert await c.call("attachments.gc", {"activeSessionId": s1, "submissionId": "gc-1"}) == gc
            with pytest.raises(RpcError) as exc:
                await c.call("attachments.ref", {"sha256": big["sha256"], "sessionId": s2})
            assert exc.value.data_code == "NOT_FOUND"
            with pytest.raises(RpcError) as exc:
                await c.call("attachments.put", {"name": "x", "mimeType": "a/b", "dataBase64": "not base64!"})
            assert exc.value.data_code == "INVALID_PARAMS"
            await c.call("session.delete", {"sessionId": s1})  # refs cascade with the session
            assert (await c.call("attachments.gc", {}))["evicted"] == []  # under budget now


async def test_put_decodes_its_base64_off_the_trio_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An inline put carries megabytes of base64 (up to the params limit): decoded in a worker thread, never
    on the trio loop (every other request of the host waits while it runs there); bad base64 is still refused."""
    data = os.urandom(1 << 20)
    payload = base64.b64encode(data).decode()
    seen: list[bool] = []
    decode = base64.b64decode

    def decode_seen(value: Any, *args: Any, **kwargs: Any) -> bytes:
        if value in (payload, "not base64!"):
            seen.append(on_trio_thread())
        return decode(value, *args, **kwargs)

    monkeypatch.setattr(base64, "b64decode", decode_seen)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            put = await c.call("attachments.put", {"name": "big.bin", "mimeType": "application/octet-stream",
                                                   "dataBase64": payload})
            with pytest.raises(RpcError) as exc:
                await c.call("attachments.put", {"name": "x", "mimeType": "a/b", "dataBase64": "not base64!"})
    assert put["sha256"] == hashlib.sha256(data).hexdigest() and put["size"] == len(data)
    assert exc.value.data_code == "INVALID_PARAMS" and exc.value.data.get("field") == "dataBase64"
    assert seen == [False, False]
