"""A document Claude Code sent to the model (a PDF, a text file) comes in as a file attachment.

Claude Code writes an @-mentioned PDF in a user line, and a PDF the Read tool read in its ``tool_result``, as an
Anthropic ``document`` block (``source``: ``base64`` with ``media_type``, or ``text``; optional ``title``). None
of the shared samples holds one, so the first line of a real sample
(``claude-code/spotter_v2.1.38_short_hooks_local_command.jsonl``, its first ``user`` line) is given such blocks.
Reproduces: the blocks were counted as skipped (``user/document``, ``tool_result/document``) and the document
missing from the session.
"""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from store.interchange.import_write import ImportTarget
from tests.samplekit import import_new, rows

PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
SAMPLE = "claude-code/spotter_v2.1.38_short_hooks_local_command.jsonl"


def test_documents_are_file_attachments(untouched_samples: Path, tmp_path: Path, db: sqlite3.Connection,
                                        target: ImportTarget) -> None:
    raw = [orjson.loads(x) for x in (untouched_samples / SAMPLE).read_bytes().splitlines()]
    first = next(r for r in raw if r.get("type") == "user" and isinstance(r["message"].get("content"), str))
    pdf = {"type": "document", "title": "spec.pdf",
           "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(PDF).decode()}}
    note = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"}}
    by_url = {"type": "document", "source": {"type": "url", "url": "https://example.invalid/a.pdf"}}
    user = {**first, "message": {"role": "user", "content": [{"type": "text", "text": "read these"}, pdf, note,
                                                               by_url]}}
    call = {**first, "type": "assistant", "uuid": "a-doc", "parentUuid": first["uuid"],
            "message": {"id": "msg_doc", "role": "assistant", "model": "claude-x", "content": [
                {"type": "tool_use", "id": "toolu_doc", "name": "Read", "input": {"file_path": "/w/spec.pdf"}}]}}
    result: dict[str, Any] = {**first, "uuid": "u-doc", "parentUuid": "a-doc", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_doc", "content": [pdf]}]}}
    path = tmp_path / "proj" / f"{first['sessionId']}.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in (user, call, result)))
    rep, messages = import_new(db, target, "claude-code", path)
    assert rep.attachments == 3
    assert dict(rep.skipped_blocks) == {"document(url)": 1}
    prompt = messages[0]
    text, spec, notes = prompt["blocks"]
    assert text == {"type": "text", "text": "read these"}
    assert (spec["kind"], spec["name"], spec["mimeType"], spec["size"]) == ("file", "spec.pdf", "application/pdf",
                                                                             len(PDF))
    assert (notes["kind"], notes["name"], notes["mimeType"]) == ("file", "document-3", "text/plain")
    store = target.attachments
    assert store is not None
    assert store.path(spec["ref"].removeprefix("attachments/")).read_bytes() == PDF
    assert store.path(notes["ref"].removeprefix("attachments/")).read_bytes() == b"plain notes"
    tool = next(m for m in messages if m["role"] == "tool")
    (read,) = tool["blocks"][0]["result"]
    assert read["kind"] == "file" and read["ref"] == spec["ref"]  # the same bytes, one blob
    referenced = {r[0] for r in rows(db, "SELECT message_id FROM attachment_refs WHERE sha256 = ?",
                                     spec["ref"].removeprefix("attachments/"))}
    assert referenced == {prompt["id"], tool["id"]}
