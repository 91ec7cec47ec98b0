"""A blob's metadata after a lost ``pi.sqlite`` (seed 000 §2.3): what ``attachments.put`` acknowledged (MIME
type, kind, trust, provenance, source, run, page/image metadata, when it was first stored) comes back from the
metadata file written beside the blob before the answer (``attachments/<sha256>.meta``), not only its bytes,
size and times; the file goes with its blob, and doctor names one left without it.

Black-box on real host processes, as tests/integrity/test_db_loss_turns.py: built through the wire, the host
SIGKILLed, the database removed with its ``-wal``/``-shm``, the host started again.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, open_client
from runtime.datadir import DataDir
from store.attachments import AttachmentFiles, BlobMeta, read_meta_file, record_blob
from store.doctor.doctor import run_doctor
from store.upgrade.attachment_adopt import backfill_meta_files
from tests.dbkit import fresh_db
from tests.hostkit import call_killed_at, msg, start_host_process

SID = "s1"
DATA = b"a screenshot's bytes, kept as a blob\n" * 4
SHA = hashlib.sha256(DATA).hexdigest()
PUT = {"name": "shot.png", "mimeType": "image/png", "dataBase64": base64.b64encode(DATA).decode(),
       "kind": "screenshot", "trust": "untrusted", "provenance": "capture", "source": "https://example.test/page",
       "runId": "t1", "meta": {"url": "https://example.test/page", "width": 640, "height": 480}}
FIELDS = ("sha256", "size", "mimeType", "kind", "trust", "provenance", "source", "runId", "meta", "createdAt")


def _lose_db(root: Path) -> None:
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (root / name).unlink(missing_ok=True)


async def _on_host(root: Path, work: Any, *, kill: bool = False) -> Any:
    proc = await trio.to_thread.run_sync(start_host_process, root)
    try:
        async with open_client(proc.url, proc.token, client_id="sidecar", client_kind="agent") as c:
            return await work(c)
    finally:
        if kill:
            await trio.to_thread.run_sync(proc.kill9)
        else:
            assert await trio.to_thread.run_sync(proc.terminate) == 0


def _fields(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info.get(k) for k in FIELDS}


async def test_a_put_s_metadata_survives_the_loss_of_the_database(tmp_path: Path) -> None:
    """Only bytes, size and times came back: the rest lived in the lost row alone, and the message blocks that
    refer to the blob hold none of trust, provenance, source, run or page metadata."""

    async def build(c: HostClient) -> Any:
        await c.call("session.create", {"sessionId": SID, "title": "t"})
        put = await c.call("attachments.put", PUT)
        assert put["sha256"] == SHA
        await c.call("session.appendMessage", {"sessionId": SID, "message": msg("m1", "see", blocks=[
            {"type": "text", "text": "see"},
            {"type": "attachment", "kind": "image", "name": "shot.png", "ref": f"attachments/{SHA}"}])})
        return await c.call("attachments.get", {"sha256": SHA})

    with trio.fail_after(90):
        before = await _on_host(tmp_path, build, kill=True)
        _lose_db(tmp_path)
        after = await _on_host(tmp_path, _get)
    assert _fields(before) == {**{k: PUT.get(k) for k in FIELDS[2:9]}, "sha256": SHA, "size": len(DATA),
                               "createdAt": before["createdAt"]}
    assert _fields(after) == _fields(before)
    assert after["deletionState"] == "live"


async def test_a_re_put_writes_no_metadata_unless_it_brings_some_and_gc_takes_the_file_with_the_blob(
        tmp_path: Path) -> None:
    """A re-put of the same bytes with nothing new leaves the file as it was (no write); one that fills a field
    the first put left out adds it (the first put's values stay); the sweep of an unreferenced blob removes the
    metadata file with the bytes."""
    meta_file = tmp_path / "attachments" / f"{SHA}.meta"
    first = {k: v for k, v in PUT.items() if k != "runId"}

    async def work(c: HostClient) -> Any:
        await c.call("attachments.put", first)
        ino = os.stat(meta_file).st_ino
        await c.call("attachments.put", first)
        same = os.stat(meta_file).st_ino == ino
        await c.call("attachments.put", {**PUT, "trust": "user"})
        filled = os.stat(meta_file).st_ino != ino
        return same, filled, await c.call("attachments.get", {"sha256": SHA})

    async def read_and_sweep(c: HostClient) -> Any:
        got = await c.call("attachments.get", {"sha256": SHA})
        await c.call("settings.set", {"ns": "app", "key": "attachmentUnreferencedGraceMs", "value": 0})
        await trio.sleep(0.01)  # the blob's last use strictly before the sweep's now
        return got, await c.call("attachments.gc", {})

    with trio.fail_after(90):
        same, filled, got = await _on_host(tmp_path, work, kill=True)
        _lose_db(tmp_path)
        after, gc = await _on_host(tmp_path, read_and_sweep)
    assert same and filled
    assert got["trust"] == "untrusted" and got["runId"] == "t1"
    assert _fields(after) == _fields(got)
    assert gc["unreferencedEvicted"] == [SHA]
    assert sorted(os.listdir(tmp_path / "attachments")) == []


def test_doctor_names_a_metadata_file_whose_blob_is_gone(tmp_path: Path) -> None:
    async def work(c: HostClient) -> Any:
        return await c.call("attachments.put", PUT)

    trio.run(_on_host, tmp_path, work)
    (tmp_path / "attachments" / SHA).unlink()
    data = DataDir(tmp_path)
    report = run_doctor(data, repair=False, now_ms=int(time.time() * 1000))
    found = [(f.check, f.subject) for f in report.findings if f.check == "attachments.orphan_meta"]
    assert found == [("attachments.orphan_meta", f"attachments/{SHA}.meta")]
    run_doctor(data, repair=True, now_ms=int(time.time() * 1000))
    assert not (tmp_path / "attachments" / f"{SHA}.meta").exists()


async def test_a_put_killed_before_its_metadata_file_was_published_writes_it_on_the_retry(tmp_path: Path) -> None:
    """The bytes were in place, the metadata file not yet (never answered): the retry finds the blob present
    and writes no bytes, but the metadata file still, before it answers; a later loss keeps the fields."""

    async def retry(c: HostClient) -> Any:
        return await c.call("attachments.put", PUT), await c.call("attachments.get", {"sha256": SHA})

    with trio.fail_after(120):
        await call_killed_at(tmp_path, "attachments.meta.after_tmp_fsync", "attachments.put", PUT)
        assert not (tmp_path / "attachments" / f"{SHA}.meta").exists()
        assert (tmp_path / "attachments" / SHA).exists()
        put, got = await _on_host(tmp_path, retry, kill=True)
        _lose_db(tmp_path)
        after = await _on_host(tmp_path, _get)
    assert put["sha256"] == SHA and got["kind"] == "screenshot"
    assert _fields(after) == _fields(got)


async def test_a_retry_after_an_unanswered_put_keeps_the_retry_s_metadata_through_a_loss(tmp_path: Path) -> None:
    """The first put died after its metadata file was in place, before its row (never answered); the retry,
    with other values, is what was acknowledged and what the row holds: the file takes its values too, so a
    later loss answers them, not the unanswered attempt's."""
    retried = {**PUT, "trust": "user", "provenance": "upload", "meta": {"width": 1}}

    async def retry(c: HostClient) -> Any:
        await c.call("attachments.put", retried)
        return await c.call("attachments.get", {"sha256": SHA})

    with trio.fail_after(120):
        await call_killed_at(tmp_path, "attachments.meta.after_rename", "attachments.put", PUT)
        assert (tmp_path / "attachments" / f"{SHA}.meta").exists()
        got = await _on_host(tmp_path, retry, kill=True)
        _lose_db(tmp_path)
        after = await _on_host(tmp_path, _get)
    assert (got["trust"], got["provenance"], got["meta"]) == ("user", "upload", {"width": 1})
    assert _fields(after) == _fields(got)


async def _get(c: HostClient) -> Any:
    return await c.call("attachments.get", {"sha256": SHA})


async def _put_then_get(c: HostClient) -> Any:
    await c.call("attachments.put", PUT)
    return await _get(c)


async def test_doctor_writes_the_metadata_file_of_a_blob_stored_before_it_existed(tmp_path: Path) -> None:
    """A blob with a row but no metadata file (stored before the file was kept; its next re-put only would
    write it): doctor names it, repair writes the file from the row, and a later loss of the database keeps
    the fields the put acknowledged."""
    meta_file = tmp_path / "attachments" / f"{SHA}.meta"

    with trio.fail_after(120):
        before = await _on_host(tmp_path, _put_then_get)
        meta_file.unlink()
        data = DataDir(tmp_path)
        now = int(time.time() * 1000)
        report = await trio.to_thread.run_sync(lambda: run_doctor(data, repair=False, now_ms=now))
        found = [(f.check, f.subject) for f in report.findings if f.check == "attachments.meta_missing"]
        assert not meta_file.exists()
        repaired = await trio.to_thread.run_sync(lambda: run_doctor(data, repair=True, now_ms=now))
        again = await trio.to_thread.run_sync(lambda: run_doctor(data, repair=False, now_ms=now))
        _lose_db(tmp_path)
        after = await _on_host(tmp_path, _get)
    assert found == [("attachments.meta_missing", f"attachments/{SHA}.meta")]
    assert [f.repaired for f in repaired.findings if f.check == "attachments.meta_missing"] == [True]
    assert [f for f in again.findings if f.check == "attachments.meta_missing"] == []
    assert _fields(after) == _fields(before)


async def test_boot_writes_the_metadata_file_of_a_blob_stored_before_it_existed(tmp_path: Path) -> None:
    """As an earlier build's data directory: a blob row with metadata and no metadata file. The next boot writes
    the file from the row (a bounded batch per boot), so a later loss of the database keeps the fields."""
    meta_file = tmp_path / "attachments" / f"{SHA}.meta"

    with trio.fail_after(120):
        before = await _on_host(tmp_path, _put_then_get)
        meta_file.unlink()
        await _on_host(tmp_path, _get, kill=True)
        written = meta_file.exists()
        _lose_db(tmp_path)
        after = await _on_host(tmp_path, _get)
    assert written
    assert _fields(after) == _fields(before)


def test_the_boot_backfill_goes_on_from_where_the_last_batch_stopped(tmp_path: Path) -> None:
    files = AttachmentFiles(tmp_path / "attachments")
    conn = fresh_db(tmp_path / "pi.sqlite")
    shas = []
    for i in range(3):  # (a row without metadata, or without its bytes, is not counted)
        sha, size = files.put_bytes(b"blob %d" % i)
        record_blob(conn, sha, size, "text/plain", 1000 + i, BlobMeta(kind="file", trust="user"))
        shas.append(sha)
    assert files.meta_names() == []
    record_blob(conn, "0" * 64, 1, "text/plain", 1000)
    plain, _ = files.put_bytes(b"no metadata")
    record_blob(conn, plain, 11, None, 1000)
    assert [backfill_meta_files(conn, files, limit=2) for _ in range(3)] == [2, 1, 0]
    assert files.meta_names() == sorted(shas)
    assert read_meta_file(files.meta_path(shas[0])) == {"mimeType": "text/plain", "kind": "file", "trust": "user",
                                                        "createdAt": 1000}
    conn.close()
