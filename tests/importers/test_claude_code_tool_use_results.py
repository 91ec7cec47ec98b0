"""What a Claude Code tool did, beyond the text the model saw, comes in with the tool's record.

Claude Code writes the tool's own record of a call beside the ``tool_result`` block, as the line's
``toolUseResult``: an edit's ``structuredPatch`` (the diff it shows) and ``originalFileContents``, a
command's ``stdout``/``stderr``. The ccviewer sample's line 50 is a ``MultiEdit`` whose result text lists the
edits, its ``toolUseResult`` the patch and the file as it was. Reproduces: only the text was kept, the diff and
the original file were dropped without a count.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from store.interchange.export import ExportOptions, export_session
from store.interchange.import_write import ImportTarget
from store.interchange.importers.common import MAX_CUT_STRING_CHARS
from tests.samplekit import import_new

CCVIEWER = "claude-code/ccviewer_v1.0.108_inline_sidechains.jsonl"


def _tool(messages: list[dict[str, object]], call_id: str) -> dict[str, object]:
    return next(m for m in messages if m["role"] == "tool" and m["blocks"][0]["callId"] == call_id)  # type: ignore[index]


def test_an_edits_patch_and_original_file_are_kept(untouched_samples: Path, db: sqlite3.Connection,
                                                   target: ImportTarget, tmp_path: Path) -> None:
    path = untouched_samples / CCVIEWER
    line = orjson.loads(path.read_bytes().splitlines()[49])
    (block,) = line["message"]["content"]
    rep, messages = import_new(db, target, "claude-code", path)
    assert not any(k.startswith("toolUseResult") for k in rep.skipped_blocks)
    tool = _tool(messages, block["tool_use_id"])
    meta = tool["meta"]
    assert isinstance(meta, dict)
    assert meta["toolUseResult"] == line["toolUseResult"]
    assert meta["toolUseResult"]["structuredPatch"] and meta["toolUseResult"]["originalFileContents"]
    assert tool["blocks"][0]["result"] == block["content"]  # type: ignore[index]  # the text the model saw, as before
    kept = sum(1 for m in messages if isinstance(m.get("meta"), dict) and "toolUseResult" in m["meta"])
    raw = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    # every line's: 18 structures and 3 texts that differ from the result (the tool's own error wording)
    assert kept == sum(1 for r in raw if "toolUseResult" in r) == 21

    out = tmp_path / "export.jsonl"
    with out.open("wb") as fh:
        export_session(db, target.transcript(rep.session_id), rep.session_id, fh, ExportOptions(format="jsonl"))
    exported = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    again = next(r for r in exported if r.get("id") == tool["id"])
    assert again["meta"]["toolUseResult"] == line["toolUseResult"]


def _edit_session(tmp_path: Path, tool_use_result: dict[str, object]) -> Path:
    """A Claude Code session file: a prompt, an Edit call, and its result line carrying ``tool_use_result``."""
    path = tmp_path / "proj" / "5c0375b4-57a5-4f26-b12d-d022ee4e5199.jsonl"
    path.parent.mkdir()
    common = {"sessionId": "5c0375b4-57a5-4f26-b12d-d022ee4e5199", "cwd": "/w", "version": "2.1.38",
              "isSidechain": False, "userType": "external"}
    lines = [
        {**common, "type": "user", "uuid": "u1", "parentUuid": None, "timestamp": "2026-01-01T00:00:00Z",
         "message": {"role": "user", "content": "edit it"}},
        {**common, "type": "assistant", "uuid": "a1", "parentUuid": "u1", "timestamp": "2026-01-01T00:00:01Z",
         "message": {"id": "msg_1", "role": "assistant", "model": "claude-x", "content": [
             {"type": "tool_use", "id": "toolu_1", "name": "Edit", "input": {"file_path": "/w/f"}}]}},
        {**common, "type": "user", "uuid": "u2", "parentUuid": "a1", "timestamp": "2026-01-01T00:00:02Z",
         "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                  "content": "edited"}]},
         "toolUseResult": tool_use_result},
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def test_a_huge_original_file_is_cut_and_counted(tmp_path: Path, db: sqlite3.Connection,
                                                  target: ImportTarget) -> None:
    big = "x" * (400 * 1024)
    path = _edit_session(tmp_path, {"filePath": "/w/f", "originalFile": big,
                                    "structuredPatch": [{"lines": ["-a", "+b"]}]})
    rep, messages = import_new(db, target, "claude-code", path)
    assert rep.skipped_blocks["toolUseResult(cut)"] == 1
    meta = _tool(messages, "toolu_1")["meta"]
    assert isinstance(meta, dict)
    assert meta["toolUseResult"]["originalFile"] == big[:MAX_CUT_STRING_CHARS]
    assert meta["toolUseResult"]["structuredPatch"] == [{"lines": ["-a", "+b"]}]
    assert meta["toolUseResultCutChars"] == len(big) - MAX_CUT_STRING_CHARS


def test_a_cut_tool_use_result_is_kept_whole_as_a_blob(tmp_path: Path, db: sqlite3.Connection,
                                                       target: ImportTarget) -> None:
    """The cut copy is the preview; the whole value is a JSON blob the tool record's meta references.
    Reproduces: past 256 KiB the strings were cut to 16 KiB and the rest was gone."""
    whole = {"filePath": "/w/f", "originalFile": "".join(f"line {i}\n" for i in range(60_000)),
             "structuredPatch": [{"lines": ["-a", "+b"]}]}
    path = _edit_session(tmp_path, whole)
    rep, messages = import_new(db, target, "claude-code", path)
    assert rep.skipped_blocks["toolUseResult(cut)"] == 1
    tool = _tool(messages, "toolu_1")
    meta = tool["meta"]
    assert isinstance(meta, dict)
    assert meta["toolUseResult"]["originalFile"] == whole["originalFile"][:MAX_CUT_STRING_CHARS]  # the preview
    ref = meta["toolUseResultBlob"]
    assert ref["mimeType"] == "application/json" and ref["ref"].startswith("attachments/")
    sha = ref["ref"].removeprefix("attachments/")
    assert target.attachments is not None
    kept = target.attachments.path(sha).read_bytes()
    assert orjson.loads(kept) == whole and ref["size"] == len(kept)
    # recorded like an image's blob: known, referenced by the tool record (the GC keeps it, a reader finds it)
    assert db.execute("SELECT mime_type FROM attachment_blobs WHERE sha256 = ?", (sha,)).fetchone()[0] \
        == "application/json"
    assert db.execute("SELECT message_id FROM attachment_refs WHERE sha256 = ?", (sha,)).fetchall() == [(tool["id"],)]
