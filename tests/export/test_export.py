"""session export: every block kind to Markdown, HTML (opened in headless Chromium) and JSONL; no secret leaks."""

from __future__ import annotations

import base64
import io
import re
import shutil
import sqlite3
import subprocess
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from store import attachments
from store.attachments import AttachmentFiles
from store.config.secrets import SecretStore, upsert_meta
from store.indexing import index
from store.interchange.export import ExportOptions, export_session, secret_values
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_unit
from store.jsonio import dumps_line
from store.snapshots import prepare_snapshot, store_snapshot
from store.tombstones import tombstone_line
from store.transcripts.transcript import TranscriptWriter, create_transcript, read_transcript
from tests.samplekit import NOW, db, open_db, rows, tx

__all__ = ["db"]

SID = "export-all-blocks"
SECRET = "sk-live-9f8e7d6c5b4a3210"
SECRET_REF = "secret:provider/openai"


def make_png(width: int, height: int) -> bytes:
    """A real RGB PNG (a colour gradient), written by hand: no imaging library needed."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    rows_ = b"".join(b"\x00" + b"".join(bytes((x * 9 % 256, y * 7 % 256, 128)) for x in range(width))
                     for y in range(height))
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes((8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows_)) + chunk(b"IEND", b"")


PNG = make_png(24, 16)


def png_pixels_vary(data: bytes) -> bool:
    """A screenshot shows something: its decoded scanlines are not all one byte value."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return len(set(raw[:200_000])) > 8


def records(sha: str) -> list[dict[str, Any]]:
    def msg(mid: str, role: str, blocks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"type": "message", "id": mid, "role": role, "createdAt": f"2026-04-01T10:00:{len(mid):02d}.000Z",
                "blocks": blocks, **extra}

    return [
        msg("m-user", "user", [
            {"type": "text", "text": "Please look at <script>alert('x')</script> and `inline code` & this key "
                                     f"{SECRET} I pasted."},
            {"type": "attachment", "kind": "image", "name": "screen.png", "ref": f"attachments/{sha}",
             "mimeType": "image/png", "size": len(PNG)},
            {"type": "attachment", "kind": "file", "name": "notes.txt", "ref": "/home/u/notes.txt",
             "mimeType": "text/plain", "size": 12}],
            meta={"receipt": {"clientId": "c", "submissionId": "s", "fingerprint": "f"}}),
        msg("m-asst", "assistant", [
            {"type": "thinking", "text": "private chain of thought marmalade", "signature": "sig-abc"},
            {"type": "text", "text": "Here is the fix:\n\n```python\nprint('hello export')\n```\n\nDone."},
            {"type": "hostedSearch", "status": "completed", "rounds": [
                {"id": "r1", "status": "completed", "kind": "search", "query": "export formats",
                 "sources": [{"url": "https://example.com/formats", "title": "Formats page"}]}]},
            {"type": "futureBlock", "payload": {"answer": 42}}],
            meta={"modelId": "claude-test", "usage": {"input_tokens": 5}, "apiKey": SECRET}),
        msg("m-tool-ok", "tool", [{"type": "tool_call", "callId": "c1", "name": "Bash",
                                   "args": {"command": f"curl -H 'Authorization: {SECRET}' x"},
                                   "result": "exported ok output", "status": "ok"}], toolName="Bash"),
        msg("m-tool-err", "tool", [{"type": "tool_call", "callId": "c2", "name": "Read", "args": {"path": "/nope"},
                                    "result": "ENOENT failure text", "status": "error"}], toolName="Read"),
        msg("m-tool-pending", "tool", [{"type": "tool_call", "callId": "c3", "name": "Task",
                                        "args": {"prompt": "delegate"}}], toolName="Task"),
        msg("m-sub", "assistant", [{"type": "text", "text": "subagent report line"}],
            meta={"parentToolCallId": "c3", "agentName": "reviewer"}),
        msg("m-deleted", "user", [{"type": "text", "text": "this message was deleted"}]),
        msg("m-system", "system", [{"type": "text", "text": "system notice text"}]),
        msg("m-last", "user", [{"type": "text", "text": "final question after compaction"}]),
    ]


def build_session(conn: sqlite3.Connection, root: Path) -> tuple[Path, AttachmentFiles, SecretStore]:
    sessions = root / "sessions"
    sessions.mkdir()
    blobs = AttachmentFiles(root / "attachments")
    (root / "attachments").mkdir()
    sha, _ = blobs.put_bytes(PNG)
    path = sessions / f"{SID}.jsonl"
    header = create_transcript(path, SID, NOW)
    recs = records(sha)
    lines = [dumps_line(r) for r in recs]
    comp = {"type": "compaction", "id": "cp1", "summary": "we compacted: summary text", "throughMessageId": "m-system",
            "tokensBefore": 1234, "retainedTail": [], "createdAt": "2026-04-01T10:01:00.000Z",
            "details": {"retainedTailMode": "completed_turn"}}
    lines.insert(8, dumps_line(comp))
    lines.append(tombstone_line("t1", "m-deleted", True, created_at_ms=NOW))
    with TranscriptWriter.open(path) as writer:
        first, end = writer.append(lines)
    offsets = []
    pos = first
    for line in lines:
        offsets.append((pos, len(line)))
        pos += len(line)

    def op(c: sqlite3.Connection) -> None:
        index.insert_session(c, SID, now_ms=NOW, created_at_ms=NOW, title="Everything <b>exported</b>",
                             project_path="/w/export", file_epoch=header.epoch)
        items = [index.IndexRecord(orjson.loads(line), off, ln) for line, (off, ln) in zip(lines, offsets, strict=True)
                 if b'"type":"message"' in line[:20]]
        index.index_messages(c, SID, items, indexed_len=end, file_epoch=header.epoch, now_ms=NOW)
        index.index_compactions(c, SID, [index.CompactionRecord(comp, *offsets[8])], NOW)
        index.set_deleted(c, SID, "m-deleted", True)
        c.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES ('turn-1', ?, 'completed', ?)",
                  (SID, NOW))
        store_snapshot(c, "turn-1", prepare_snapshot({
            "version": 1, "model": {"id": "claude-test"}, "systemPrompt": "be brief",
            "credentialRefs": [SECRET_REF], "connection": {"baseUrl": "https://api.example"}}), NOW)

    tx(conn, op)
    store = SecretStore(root / "secrets")
    (root / "secrets").mkdir()
    store.set(SECRET_REF, SECRET, now_ms=NOW)
    tx(conn, lambda c: upsert_meta(c, SECRET_REF, owner_kind="provider", owner_id="openai", kind="api_key",
                                   now_ms=NOW))
    return path, blobs, store


@pytest.fixture
def session(db: sqlite3.Connection, tmp_path: Path) -> tuple[sqlite3.Connection, Path, AttachmentFiles, SecretStore]:
    path, blobs, store = build_session(db, tmp_path)
    return db, path, blobs, store


def export(conn: sqlite3.Connection, path: Path, fmt: str, **opts: Any) -> tuple[bytes, Any]:
    buf = io.BytesIO()
    report = export_session(conn, path, SID, buf, ExportOptions(format=fmt, exported_at_ms=NOW, **opts))
    assert report.bytes == len(buf.getvalue())
    return buf.getvalue(), report


VISIBLE = ["Please look at", "Here is the fix", "print('hello export')", "exported ok output", "ENOENT failure text",
           "subagent report line", "system notice text", "final question after compaction", "we compacted",
           "Formats page", "screen.png", "notes.txt", "futureBlock"]


@pytest.mark.parametrize("fmt", ["md", "html", "jsonl"])
def test_every_block_kind_exports_and_no_secret_leaks(session: Any, fmt: str) -> None:
    conn, path, blobs, store = session
    values = secret_values(conn, store)
    assert values == (SECRET,)
    data, report = export(conn, path, fmt, secret_values=values, attachments=blobs)
    text = data.decode()
    for needle in VISIBLE:
        assert needle.replace("'", "&#x27;" if fmt == "html" else "'") in text or needle in text, needle
    assert "this message was deleted" not in text  # tombstoned
    assert "marmalade" not in text and report.thinking_omitted == 1
    assert report.messages == 8 and report.compactions == 1 and report.environments == 1
    # no secret: not the value (text, tool args, meta), not the credential reference
    assert SECRET not in text and SECRET_REF not in text
    assert base64.b64encode(SECRET.encode()).decode() not in text
    assert report.redactions >= 4
    assert "receipt" not in text and "submissionId" not in text
    # ... unless asked
    leaky, _ = export(conn, path, fmt, secret_values=values, include_secrets=True, include_thinking=True)
    assert SECRET in leaky.decode() and SECRET_REF in leaky.decode() and "marmalade" in leaky.decode()


def test_markdown_fences_and_collapsed_tool_calls(session: Any) -> None:
    conn, path, _, _ = session
    md = export(conn, path, "md", include_thinking=True)[0].decode()
    assert md.startswith("# Everything <b>exported</b>\n")
    assert "```python\nprint('hello export')\n```" in md
    assert "<details><summary>Tool call <code>Bash</code> — ok</summary>" in md
    assert "<details><summary>Tool call <code>Task</code> — no result</summary>" in md
    assert "<details><summary>Thinking</summary>\n\n> private chain of thought marmalade" in md
    assert "### Assistant · subagent reviewer" in md
    assert md.index("system notice text") < md.index("**Context compacted** (tokens before: 1234)") < md.index(
        "final question after compaction")


def test_html_is_self_contained_and_escaped(session: Any) -> None:
    conn, path, blobs, _ = session
    page = export(conn, path, "html", attachments=blobs)[0].decode()
    assert "<script" not in page and "&lt;script&gt;alert(" in page
    assert re.search(r'http-equiv="Content-Security-Policy" content="default-src \'none\'', page)
    # nothing to fetch: the only URLs are a link target and inline data
    assert re.findall(r'\ssrc="([^"]+)"', page) == [f"data:image/png;base64,{base64.b64encode(PNG).decode()}"]
    assert re.findall(r'href="([^"]+)"', page) == ["https://example.com/formats"]
    assert page.count("<details class=\"tool\">") == 3 and "<details class=\"tool\" open" not in page
    assert "<pre><code class=\"language-python\">print(&#x27;hello export&#x27;)</code></pre>" in page


def test_an_image_being_evicted_is_marked_and_not_inlined(session: Any) -> None:
    """Between the GC's two steps the references are marked and the bytes are still on disk (seed 000 §2.3:
    "Eviction marks references before deleting bytes"): the page shows the marker, not the going bytes."""
    conn, path, blobs, _ = session
    sha = blobs.put_bytes(PNG)[0]
    tx(conn, lambda c: attachments.record_blob(c, sha, len(PNG), "image/png", NOW))
    tx(conn, lambda c: attachments.mark_for_eviction(c, [sha], NOW))
    assert blobs.path(sha).is_file()
    page = export(conn, path, "html", attachments=blobs)[0].decode()
    assert "data:image/png" not in page
    assert '<p class="attachment evicted">[attachment evicted: <b>screen.png</b>] — image/png, ' in page
    assert "Attachment: <b>notes.txt</b>" in page  # an absolute path is no blob: never marked
    md = export(conn, path, "md")[0].decode()
    assert "[attachment evicted: **screen.png**] — image/png, " in md and f"attachments/{sha}" not in md


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(args: list[str], page: Path, out_dir: Path) -> subprocess.CompletedProcess[str]:
    binary = chromium()
    if binary is None:
        pytest.skip("headless Chromium (Debian package chromium) is not installed")
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--enable-logging=stderr", "--v=0", f"--user-data-dir={out_dir / 'profile'}",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)


def test_the_html_export_opens_in_headless_chromium_and_shows_the_messages(session: Any, tmp_path: Path) -> None:
    conn, path, blobs, _ = session
    page = tmp_path / "export.html"
    page.write_bytes(export(conn, path, "html", attachments=blobs, include_thinking=True)[0])
    dom = run_chromium(["--dump-dom"], page, tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for needle in ("Please look at", "Here is the fix", "exported ok output", "subagent report line",
                   "final question after compaction", "Context compacted"):
        assert needle in dom.stdout, needle
    assert dom.stdout.count("<article class=\"msg") == 8
    shot = tmp_path / "export.png"
    result = run_chromium([f"--screenshot={shot}", "--window-size=1100,1800", "--hide-scrollbars"], page, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000 and png_pixels_vary(shot.read_bytes())
    # nothing on the page's console: no error, and no fetch the CSP had to block (it would be logged)
    for log in (dom.stderr, result.stderr):
        assert ":CONSOLE" not in log and "Content Security Policy" not in log


def test_chromium_reports_a_page_that_tries_to_fetch(tmp_path: Path) -> None:
    """The check above is real: the same CSP makes Chromium log a refused fetch."""
    from store.interchange.export_render import CSP

    page = tmp_path / "fetching.html"
    page.write_text(f'<!doctype html><html><head><meta http-equiv="Content-Security-Policy" content="{CSP}">'
                    '</head><body><img src="https://example.invalid/x.png"><p>hi</p></body></html>')
    result = run_chromium(["--dump-dom"], page, tmp_path)
    assert ":CONSOLE" in result.stderr and "violates the following Content Security Policy" in result.stderr


def test_jsonl_export_reimports_to_the_same_messages(session: Any, tmp_path: Path) -> None:
    conn, path, blobs, _ = session
    data, _ = export(conn, path, "jsonl", include_thinking=True)
    out = tmp_path / "exported.jsonl"
    out.write_bytes(data)
    lines = [orjson.loads(line) for line in data.splitlines()]
    assert lines[0]["type"] == "session" and lines[1]["type"] == "session_info"
    assert [ln["type"] for ln in lines].count("environment") == 1
    original = [m.record for m in read_transcript(path).messages if m.id != "m-deleted"]
    (unit,) = IMPORTERS["pi-host"].discover(out)
    (tmp_path / "copy").mkdir()
    target = ImportTarget(tmp_path / "copy")
    conn2 = open_db(tmp_path / "copy.sqlite")
    try:
        rep = import_unit(conn2, unit, target, now_ms=NOW)
        assert rep.status == "new" and rep.files[0].skipped["environment"] == 1
        t = read_transcript(target.transcript(rep.session_id))
        copied = [m.record for m in t.messages]

        def same(rec: dict[str, Any]) -> dict[str, Any]:
            meta = {k: v for k, v in rec.get("meta", {}).items() if k not in ("receipt", "apiKey")}
            return {"role": rec["role"], "blocks": rec["blocks"], "toolName": rec.get("toolName"), "meta": meta,
                    "createdAt": rec["createdAt"]}

        assert [same(r) for r in copied] == [same(r) for r in original]
        assert [r["id"] for r in copied] == [f"{rep.session_id}:{r['id']}" for r in original]
        (cp,) = t.compactions
        assert cp.record["throughMessageId"] == f"{rep.session_id}:m-system"
        assert rows(conn2, "SELECT title FROM sessions") == [("Everything <b>exported</b>",)]
    finally:
        conn2.close()


def test_an_imported_sample_exports_in_every_format(tmp_path: Path, db: sqlite3.Connection) -> None:
    from tests.samplekit import samples_dir

    sample = samples_dir() / "claude-code" / "fasthooks_v2.0.76_compaction_thinking_errors.jsonl"
    (tmp_path / "s").mkdir()
    target = ImportTarget(tmp_path / "s")
    (unit,) = IMPORTERS["claude-code"].discover(sample)
    rep = import_unit(db, unit, target, now_ms=NOW)
    for fmt in ("md", "html", "jsonl"):
        buf = io.BytesIO()
        out = export_session(db, target.transcript(rep.session_id), rep.session_id, buf, ExportOptions(format=fmt))
        assert out.messages == sum(rep.messages.values()) and out.compactions == 1
        assert b"Write" in buf.getvalue()
