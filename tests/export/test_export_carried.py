"""A JSONL export carries the attachment bytes its blocks refer to and the session's review snapshots
(protocol/README.md §9), and the pi-host import verifies both before it stores them."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import sqlite3
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest

from store import attachments, review
from store.attachments import AttachmentFiles
from store.errors import IOFailure
from store.interchange import imports
from store.interchange.export import ExportOptions, export_session, export_to_new_file
from store.interchange.import_write import ImportTarget, publish, undo
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_unit, prepare_unit
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter, create_transcript
from tests.export.test_export import PNG, SID, build_session
from tests.samplekit import NOW, db, open_db, rows, tx

__all__ = ["db"]

BEFORE = b"# notes, before\n"
AFTER = b"# notes, after\n"


def add_review(root: Path) -> dict[str, Any]:
    """One published review snapshot of the session (a Write tool changed notes.md)."""
    meta = review.new_meta(snapshot_id="rv-" + "ab" * 16, session_id=SID, path="/w/export/notes.md",
                           tool_name="Write", tool_call_id="c1", message_id="m-asst", turn_id="turn-1",
                           before=BEFORE, after=AFTER, now_ms=NOW, key=None)
    review.write_snapshot(root / "review-changes" / SID, meta, BEFORE)
    return meta


@pytest.fixture
def host1(db: sqlite3.Connection, tmp_path: Path) -> tuple[sqlite3.Connection, Path, AttachmentFiles, Path]:
    one = tmp_path / "one"
    one.mkdir()
    path, blobs, _ = build_session(db, one)
    tx(db, lambda c: attachments.record_blob(c, png_sha(), len(PNG), "image/png", NOW))  # as attachments.put does
    add_review(one)
    return db, path, blobs, one / "review-changes" / SID


def export_lines(host: Any, **opts: Any) -> tuple[list[dict[str, Any]], Any]:
    conn, path, blobs, review_dir = host
    buf = io.BytesIO()
    report = export_session(conn, path, SID, buf, ExportOptions(format="jsonl", exported_at_ms=NOW,
                                                                attachments=blobs, review_dir=review_dir, **opts))
    return [orjson.loads(line) for line in buf.getvalue().splitlines()], report


class Host2:
    def __init__(self, root: Path) -> None:
        root.mkdir()
        (root / "sessions").mkdir()
        self.files = AttachmentFiles(root / "attachments")
        self.target = ImportTarget(root / "sessions", self.files, review_root=root / "review-changes")
        self.conn = open_db(root / "two.sqlite")
        self.root = root

    def load(self, lines: list[dict[str, Any]], name: str = "export.jsonl") -> Any:
        out = self.root / name
        out.write_bytes(b"".join(dumps_line(ln) for ln in lines))
        (unit,) = IMPORTERS["pi-host"].discover(out)
        return import_unit(self.conn, unit, self.target, now_ms=NOW)

    def evicted(self, sid: str) -> set[str]:
        marks = attachments.evicted_marks(self.conn, sid, 0, 1 << 30)
        return {ref for refs in marks.values() for ref in refs}

    def blob_names(self) -> list[str]:
        return self.files.blob_names() if self.files.directory.exists() else []

    def temp_files(self) -> list[str]:
        return [n for n in os.listdir(self.files.directory) if len(n) != 64 and not n.endswith(".meta")] \
            if self.files.directory.exists() else []


def png_sha() -> str:
    return hashlib.sha256(PNG).hexdigest()


def test_attachment_and_review_bytes_come_over_verified_and_a_second_import_writes_nothing(
        host1: Any, tmp_path: Path) -> None:
    lines, report = export_lines(host1)
    kinds = [ln["type"] for ln in lines]
    assert kinds.count("blob") == 1 and kinds.count("review_snapshot") == 1
    assert report.blobs == 1 and report.review_snapshots == 1 and report.to_dict()["blobs"] == 1
    [blob] = [ln for ln in lines if ln["type"] == "blob"]
    assert blob["sha256"] == png_sha() and blob["mimeType"] == "image/png" and blob["size"] == len(PNG)
    [snap] = [ln for ln in lines if ln["type"] == "review_snapshot"]
    assert "receipt" not in snap["snapshot"] and base64.b64decode(snap["beforeBase64"]) == BEFORE
    # inside the session's workspace (/w/export): carried relative to it too, for a copy whose project is elsewhere
    assert snap["snapshot"]["path"] == "/w/export/notes.md" and snap["snapshot"]["workspacePath"] == "notes.md"

    two = Host2(tmp_path / "two")
    try:
        rep = two.load(lines)
        assert rep.status == "new", rep.to_dict()
        sid = rep.session_id
        assert two.files.path(png_sha()).read_bytes() == PNG
        assert rows(two.conn, "SELECT deletion_state, size_bytes, mime_type FROM attachment_blobs") == \
            [("live", len(PNG), "image/png")]
        assert rows(two.conn, "SELECT message_id, origin, evicted_at FROM attachment_refs") == \
            [(f"{sid}:m-user", "transcript", None)]
        assert two.evicted(sid) == set()
        directory = two.root / "review-changes" / sid
        [meta] = review.list_snapshots(directory).items
        assert meta["snapshotId"] == "rv-" + "ab" * 16 and meta["sessionId"] == sid
        assert meta["messageId"] == f"{sid}:m-asst" and meta["before"] == snap["snapshot"]["before"]
        assert review.read_before(directory, meta) == BEFORE
        stat_blob = os.stat(two.files.path(png_sha()))
        stat_meta = os.stat(directory / meta["snapshotId"] / "meta.json")
        again = two.load(lines, "again.jsonl")  # the same export once more: content-addressed, nothing written
        assert again.session_id == sid and again.status in ("unchanged", "updated"), again.to_dict()
        assert os.stat(two.files.path(png_sha())).st_ino == stat_blob.st_ino
        assert os.stat(directory / meta["snapshotId"] / "meta.json").st_mtime_ns == stat_meta.st_mtime_ns
        assert two.temp_files() == []
    finally:
        two.conn.close()


def test_a_blob_whose_bytes_do_not_match_its_name_is_refused_and_never_stored(host1: Any, tmp_path: Path) -> None:
    lines, _ = export_lines(host1)
    for ln in lines:
        if ln["type"] == "blob":
            data = bytearray(base64.b64decode(ln["data"]))
            data[40] ^= 0xFF
            ln["data"] = base64.b64encode(bytes(data)).decode()
    two = Host2(tmp_path / "two")
    try:
        rep = two.load(lines)
        assert rep.status == "new" and rep.skipped_blocks["blob(sha256 mismatch)"] == 1
        assert not two.files.exists(png_sha()) and two.blob_names() == [] and two.temp_files() == []
        # the copy's block says at once that its bytes are not here (as a rebuilt index would)
        assert two.evicted(rep.session_id) == {f"attachments/{png_sha()}"}
        assert rows(two.conn, "SELECT deletion_state FROM attachment_blobs") == [("evicted",)]
    finally:
        two.conn.close()


def test_a_blob_whose_file_was_changed_by_hand_is_exported_as_not_held(host1: Any, tmp_path: Path) -> None:
    """A blob file whose bytes were changed by hand (same size: no read checks more than the file's presence)
    was exported as it is, data that does not hash to the name its line gives (a copy by this host refused
    it; any other reader took it). The export reads the bytes it carries: it checks them first and exports
    a blob whose bytes are not its own as one this host does not hold, as an evicted blob."""
    path = host1[2].path(png_sha())
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))
    lines, report = export_lines(host1)
    [blob] = [ln for ln in lines if ln["type"] == "blob"]
    assert blob == {"type": "blob", "sha256": png_sha(), "evicted": True} and report.blobs_evicted == 1
    assert report.blobs == 0
    two = Host2(tmp_path / "two")
    try:
        rep = two.load(lines)
        assert rep.status == "new" and two.blob_names() == []
        assert two.evicted(rep.session_id) == {f"attachments/{png_sha()}"}
    finally:
        two.conn.close()


def test_a_review_snapshot_whose_bytes_do_not_match_is_refused(host1: Any, tmp_path: Path) -> None:
    lines, _ = export_lines(host1)
    for ln in lines:
        if ln["type"] == "review_snapshot":
            ln["beforeBase64"] = base64.b64encode(b"# notes, forged\n").decode()
    two = Host2(tmp_path / "two")
    try:
        rep = two.load(lines)
        assert rep.status == "new" and rep.skipped_blocks["review_snapshot(hash mismatch)"] == 1
        assert review.list_snapshots(two.root / "review-changes" / rep.session_id).items == []
    finally:
        two.conn.close()


def test_an_older_export_without_blob_lines_imports_and_its_blocks_say_evicted(host1: Any, tmp_path: Path) -> None:
    lines, _ = export_lines(host1)
    older = [ln for ln in lines if ln["type"] not in ("blob", "review_snapshot")]
    two = Host2(tmp_path / "two")
    try:
        rep = two.load(older)
        assert rep.status == "new" and rep.messages.total() > 0
        assert two.evicted(rep.session_id) == {f"attachments/{png_sha()}"}
        # the bytes arriving later revive the blob: the marks go
        assert two.load(lines, "later.jsonl").session_id == rep.session_id
        assert two.evicted(rep.session_id) == set() and two.files.path(png_sha()).read_bytes() == PNG
    finally:
        two.conn.close()


def test_a_blob_host_1_evicted_is_exported_as_evicted_not_invented(host1: Any, tmp_path: Path) -> None:
    conn = host1[0]
    tx(conn, lambda c: attachments.mark_for_eviction(c, [png_sha()], NOW))
    host1[2].delete(png_sha())
    tx(conn, lambda c: attachments.finish_eviction(c, [png_sha()], NOW))
    lines, report = export_lines(host1)
    [blob] = [ln for ln in lines if ln["type"] == "blob"]
    assert blob == {"type": "blob", "sha256": png_sha(), "evicted": True} and report.blobs_evicted == 1
    two = Host2(tmp_path / "two")
    try:
        rep = two.load(lines)
        assert rep.status == "new" and two.blob_names() == []
        assert two.evicted(rep.session_id) == {f"attachments/{png_sha()}"}
    finally:
        two.conn.close()


def test_a_blob_over_the_attachment_budget_is_not_stored(host1: Any, tmp_path: Path) -> None:
    lines, _ = export_lines(host1)
    two = Host2(tmp_path / "two")
    try:
        two.conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('app', 'attachmentBudgetBytes', "
                         "?, 0)", (str(len(PNG) - 1),))
        rep = two.load(lines)
        assert rep.status == "new" and rep.skipped_blocks["blob(too large)"] == 1
        assert two.blob_names() == [] and two.evicted(rep.session_id) == {f"attachments/{png_sha()}"}
    finally:
        two.conn.close()


def test_a_large_attachment_goes_over_in_parts_never_held_whole(db: sqlite3.Connection, tmp_path: Path) -> None:
    """A 24 MiB file: the export reads and writes it a part at a time, the import writes each part as it comes."""
    big = os.urandom(24 * 1024 * 1024)
    one = tmp_path / "one"
    (one / "sessions").mkdir(parents=True)
    files = AttachmentFiles(one / "attachments")
    sha, size = files.put_bytes(big)
    del big
    tx(db, lambda c: attachments.record_blob(c, sha, size, "application/pdf", NOW))
    path = one / "sessions" / f"{SID}.jsonl"
    header = create_transcript(path, SID, NOW)
    line = dumps_line({"type": "message", "id": "u1", "role": "user", "createdAt": "2026-04-01T10:00:00.000Z",
                       "blocks": [{"type": "attachment", "kind": "file", "name": "big.pdf", "ref": f"attachments/{sha}",
                                   "mimeType": "application/pdf", "size": 24 * 1024 * 1024}]})
    with TranscriptWriter.open(path) as writer:
        first, end = writer.append([line])

    def op(c: sqlite3.Connection) -> None:
        from store.indexing import index

        index.insert_session(c, SID, now_ms=NOW, created_at_ms=NOW, title="big", file_epoch=header.epoch)
        index.index_messages(c, SID, [index.IndexRecord(orjson.loads(line), first, len(line))], indexed_len=end,
                             file_epoch=header.epoch, now_ms=NOW)

    tx(db, op)
    out = tmp_path / "big.jsonl"
    tracemalloc.start()
    try:
        report = export_to_new_file(out, lambda fh: export_session(db, path, SID, fh, ExportOptions(
            format="jsonl", attachments=files)))
        _, export_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.blobs == 1 and out.stat().st_size > 32 * 1024 * 1024
    assert export_peak < 8 * 1024 * 1024, f"exporting a 24 MiB attachment held {export_peak} bytes"
    two = Host2(tmp_path / "two")
    try:
        (unit,) = IMPORTERS["pi-host"].discover(out)
        tracemalloc.start()
        try:
            rep = import_unit(two.conn, unit, two.target, now_ms=NOW)
            _, import_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert rep.status == "new", rep.to_dict()
        assert import_peak < 8 * 1024 * 1024, f"importing a 24 MiB attachment held {import_peak} bytes"
        assert attachments_sha(two.files.path(sha)) == sha and two.evicted(rep.session_id) == set()
    finally:
        two.conn.close()


def attachments_sha(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_a_blob_in_parts_that_stops_short_is_not_stored(host1: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("store.interchange.export.BLOB_CHUNK", 300)  # the PNG in several parts
    lines, _ = export_lines(host1)
    parts = [ln for ln in lines if ln["type"] == "blob"]
    assert len(parts) > 2 and [p["offset"] for p in parts] == [300 * i for i in range(len(parts))]
    assert b"".join(base64.b64decode(p["data"]) for p in parts) == PNG
    two = Host2(tmp_path / "two")
    try:
        short = [ln for ln in lines if ln is not parts[-1]]
        rep = two.load(short)
        assert rep.status == "new" and rep.skipped_blocks["blob(truncated)"] == 1
        assert two.blob_names() == [] and two.temp_files() == []
        assert two.evicted(rep.session_id) == {f"attachments/{png_sha()}"}
        swapped = [ln for ln in lines if ln is not parts[1]]
        swapped.insert(lines.index(parts[0]), parts[1])  # part 2 before part 1
        rep = two.load(swapped, "swapped.jsonl")
        assert rep.skipped_blocks["blob(part out of order)"] >= 1 and two.blob_names() == []
        rep = two.load(lines, "whole.jsonl")
        assert two.files.path(png_sha()).read_bytes() == PNG and two.evicted(rep.session_id) == set()
    finally:
        two.conn.close()


def test_an_empty_attachment_comes_over(host1: Any, tmp_path: Path) -> None:
    conn, path, blobs, _ = host1
    empty, _ = blobs.put_bytes(b"")
    tx(conn, lambda c: attachments.record_blob(c, empty, 0, "text/plain", NOW))
    line = dumps_line({"type": "message", "id": "m-empty", "role": "user", "createdAt": "2026-04-01T10:02:00.000Z",
                       "blocks": [{"type": "attachment", "kind": "file", "name": "empty.txt",
                                   "ref": f"attachments/{empty}", "mimeType": "text/plain", "size": 0}]})
    with TranscriptWriter.open(path) as writer:
        first, end = writer.append([line])

    def op(c: sqlite3.Connection) -> None:
        from store.indexing import index

        epoch = index.require_session(c, SID)["_fileEpoch"]
        index.index_messages(c, SID, [index.IndexRecord(orjson.loads(line), first, len(line))], indexed_len=end,
                             file_epoch=epoch, now_ms=NOW)

    tx(conn, op)
    lines, report = export_lines(host1)
    assert report.blobs == 2
    two = Host2(tmp_path / "two")
    try:
        rep = two.load(lines)
        assert rep.status == "new" and not rep.skipped_blocks, rep.skipped_blocks
        assert two.files.path(empty).read_bytes() == b"" and two.evicted(rep.session_id) == set()
    finally:
        two.conn.close()


def review_folders(two: Host2) -> list[str]:
    """Every file and folder under the copy host's review-changes (relative), staged or not."""
    top = two.root / "review-changes"
    return sorted(str(p.relative_to(top)) for p in top.rglob("*")) if top.exists() else []


def test_review_snapshots_are_staged_until_the_import_publishes_and_undo_takes_them_back(
        host1: Any, tmp_path: Path) -> None:
    lines, _ = export_lines(host1)
    two = Host2(tmp_path / "two")
    try:
        out = two.root / "export.jsonl"
        out.write_bytes(b"".join(dumps_line(ln) for ln in lines))
        (unit,) = IMPORTERS["pi-host"].discover(out)
        directory = two.root / "review-changes" / unit.session_id
        prepared = prepare_unit(two.conn, unit, two.target, now_ms=NOW)
        assert prepared.staged is not None and prepared.changed
        assert review.list_snapshots(directory).items == []  # parsed and staged: no reader sees it yet
        # a kill here leaves what boot and doctor remove: a snapshot folder without its meta.json
        assert review.unpublished_snapshots(two.root / "review-changes") == [directory / ("rv-" + "ab" * 16)]
        publish(prepared.staged)
        [meta] = review.list_snapshots(directory).items
        assert review.read_before(directory, meta) == BEFORE
        undo(prepared.staged)  # the index step failed: the import is taken back, its snapshot with it
        assert review_folders(two) == []
    finally:
        two.conn.close()


def test_an_import_refused_after_its_review_lines_were_read_leaves_no_snapshot(host1: Any, tmp_path: Path) -> None:
    lines, _ = export_lines(host1)
    two = Host2(tmp_path / "two")
    try:
        rep = two.load([ln for ln in lines if ln["type"] in ("session", "session_info", "review_snapshot")])
        assert rep.status == "refused" and rep.reason == "EMPTY_SESSION", rep.to_dict()
        assert review_folders(two) == []
    finally:
        two.conn.close()


def test_an_import_whose_index_step_fails_leaves_no_snapshot(host1: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    lines, _ = export_lines(host1)
    two = Host2(tmp_path / "two")

    def failing(*_: Any, **__: Any) -> None:
        raise IOFailure("the index step failed")

    monkeypatch.setattr(imports, "apply_index", failing)
    try:
        rep = two.load(lines)
        assert rep.status == "refused" and rep.reason == "IO_ERROR", rep.to_dict()
        assert review_folders(two) == [] and not two.target.transcript(rep.session_id).exists()
    finally:
        two.conn.close()


def test_a_snapshot_outside_the_sessions_workspace_is_carried_with_its_absolute_path_only(
        host1: Any, tmp_path: Path) -> None:
    conn, _, _, directory = host1
    outside = review.new_meta(snapshot_id="rv-" + "cd" * 16, session_id=SID, path="/w/exported/notes.md",
                              tool_name="Write", tool_call_id="c2", message_id="m-asst", turn_id=None,
                              before=None, after=AFTER, now_ms=NOW + 1, key=None)
    review.write_snapshot(directory, outside, None)  # (a project moved after it was recorded)
    lines, _ = export_lines(host1)
    snaps = {ln["snapshot"]["snapshotId"]: ln["snapshot"] for ln in lines if ln["type"] == "review_snapshot"}
    assert snaps["rv-" + "ab" * 16]["workspacePath"] == "notes.md"
    assert "workspacePath" not in snaps["rv-" + "cd" * 16]
    two = Host2(tmp_path / "two")
    try:
        rep = two.load(lines)
        assert rep.status == "new" and not rep.skipped_blocks, rep.to_dict()
        paths = {m["snapshotId"]: m["path"] for m in review.list_snapshots(
            two.root / "review-changes" / rep.session_id).items}
        assert paths == {"rv-" + "ab" * 16: "/w/export/notes.md", "rv-" + "cd" * 16: "/w/exported/notes.md"}
    finally:
        two.conn.close()
