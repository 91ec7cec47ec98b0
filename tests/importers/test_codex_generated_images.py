"""An image a Codex model made with its image generation tool comes in as an image attachment.

Codex writes the image into the rollout: a ``response_item`` of type ``image_generation_call`` whose
``result`` is the image, base64 (the sample ``codex/agent-sessions_CURATED_schema_coverage_compacted.jsonl``
line 49 has the shape, its value trimmed). Reproduces: the item was counted as skipped, so the image, what the
user asked for, was missing from the imported session with only a skip count to say so.
"""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from store.attachments import read_meta_file
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_unit
from store.transcripts.transcript import read_transcript
from store.upgrade.attachment_adopt import adopt_blob
from tests.samplekit import NOW, rows

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"generated pixels of a pelican"


def rollout(tmp_path: Path, result: str) -> Path:
    def line(n: int, kind: str, payload: dict[str, Any]) -> bytes:
        return orjson.dumps({"timestamp": f"2026-04-01T08:00:0{n}.000Z", "type": kind, "payload": payload}) + b"\n"

    lines = [
        line(0, "session_meta", {"id": "01900000-0000-7000-8000-0000000001a9", "timestamp": "2026-04-01T08:00:00Z",
                                 "cwd": "/w/img", "cli_version": "0.140.0", "model_provider": "openai"}),
        line(1, "turn_context", {"cwd": "/w/img", "model": "gpt-5.5"}),
        line(2, "response_item", {"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": "draw a pelican"}]}),
        line(3, "response_item", {"type": "image_generation_call", "id": "ig_1", "status": "completed",
                                  "revised_prompt": "a pelican", "result": result}),
        line(4, "response_item", {"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": "Here is your pelican."}]}),
    ]
    path = tmp_path / "2026" / "04" / "01" / "rollout-2026-04-01T08-00-00-01900000-0000-7000-8000-0000000001a9.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(lines))
    return path


def test_a_generated_image_is_an_attachment_of_the_reply(tmp_path: Path, db: sqlite3.Connection,
                                                         target: ImportTarget) -> None:
    (unit,) = IMPORTERS["codex"].discover(rollout(tmp_path, base64.b64encode(PNG).decode()))
    rep = import_unit(db, unit, target, now_ms=NOW)
    assert rep.status == "new" and rep.attachments == 1
    assert "response_item/image_generation_call" not in rep.files[0].skipped
    messages = [m.record for m in read_transcript(target.transcript(rep.session_id)).messages]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    reply = messages[1]
    image, text = reply["blocks"]
    assert image["type"] == "attachment" and image["kind"] == "image" and image["mimeType"] == "image/png"
    assert text == {"type": "text", "text": "Here is your pelican."}
    sha = image["ref"].removeprefix("attachments/")
    assert target.attachments is not None and target.attachments.path(sha).read_bytes() == PNG
    assert rows(db, "SELECT message_id FROM attachment_refs WHERE sha256 = ?", sha) == [(reply["id"],)]


def test_an_image_generation_call_without_an_image_is_counted(tmp_path: Path, db: sqlite3.Connection,
                                                              target: ImportTarget) -> None:
    (unit,) = IMPORTERS["codex"].discover(rollout(tmp_path, "[trimmed for fixture]"))
    rep = import_unit(db, unit, target, now_ms=NOW)
    assert rep.files[0].skipped["response_item/image_generation_call(no image)"] == 1 and rep.attachments == 0
    messages = [m.record for m in read_transcript(target.transcript(rep.session_id)).messages]
    assert [[b["type"] for b in m["blocks"]] for m in messages] == [["text"], ["text"]]


def test_an_imported_image_keeps_its_mime_type_beside_its_bytes(tmp_path: Path, db: sqlite3.Connection,
                                                                target: ImportTarget) -> None:
    """The blob's row was the only place its MIME type was stored: a database lost and rebuilt from the files
    adopted the blob without it. It is in the metadata file beside the bytes, and adoption reads it."""
    (unit,) = IMPORTERS["codex"].discover(rollout(tmp_path, base64.b64encode(PNG).decode()))
    rep = import_unit(db, unit, target, now_ms=NOW)
    assert target.attachments is not None
    (sha,) = [r[0] for r in db.execute("SELECT sha256 FROM attachment_blobs")]
    assert read_meta_file(target.attachments.meta_path(sha)) == {"mimeType": "image/png"}
    db.execute("DELETE FROM attachment_refs")
    db.execute("DELETE FROM attachment_blobs")  # as a rebuilt index has it before the adoption
    assert adopt_blob(db, target.attachments.directory, sha, NOW)
    assert rows(db, "SELECT mime_type, size_bytes FROM attachment_blobs") == [("image/png", len(PNG))]
    assert rep.attachments == 1
