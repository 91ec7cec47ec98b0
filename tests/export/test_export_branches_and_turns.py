"""A pi-host JSONL export carries the archived branches and the turns' usage (protocol/README.md §9).

Store level, one database per host: the revisions file is read a bounded amount at a time, a branch's
deleted messages stay behind, an export of an imported session brings its usage over once (the turn rows
its responses made and the ``turn`` lines that carry them are one row each), and an export made before
these lines existed still imports.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.attachments import AttachmentFiles
from store.interchange import export as export_mod
from store.interchange.export import ExportOptions, archived_lines, export_session
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import session_id_for
from store.interchange.imports import import_root, import_unit
from store.revisions import revision_line, revision_live_line, revision_rows
from store.usage import session_usage
from tests.importers.test_child_links import CODEX, CODEX_PARENT
from tests.samplekit import NOW, open_db


def _export(db: sqlite3.Connection, target: ImportTarget, sid: str, out: Path) -> Path:
    with out.open("wb") as fh:
        export_session(db, target.transcript(sid), sid, fh, ExportOptions(format="jsonl"))
    return out


def _host(tmp_path: Path, name: str) -> tuple[sqlite3.Connection, ImportTarget]:
    (tmp_path / name / "sessions").mkdir(parents=True)
    (tmp_path / name / "blobs").mkdir()
    return open_db(tmp_path / name / "pi.sqlite"), ImportTarget(tmp_path / name / "sessions",
                                                                AttachmentFiles(tmp_path / name / "blobs"))


def _import(db: sqlite3.Connection, target: ImportTarget, path: Path) -> Any:
    (unit,) = IMPORTERS["pi-host"].discover(path)
    return import_unit(db, unit, target, now_ms=NOW)


def test_the_revisions_file_is_read_at_most_read_bytes_at_a_time(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.revisions.jsonl"
    big = "x" * (1536 * 1024)
    lines = [revision_line("u1", i, [{"type": "message", "id": f"u1-{i}", "role": "user",
                                      "blocks": [{"type": "text", "text": big}]}], {}, created_at_ms=NOW)
             for i in range(1, 7)]
    lines.append(revision_line("u2", 1, [{"type": "message", "id": "u2", "role": "user", "blocks": []},
                                         {"type": "message", "id": "gone", "role": "assistant", "blocks": []}],
                               {}, created_at_ms=NOW, extra={"deleted": ["gone"], "receipts": [{"x": 1}]}))
    lines.append(revision_live_line("u3", 1, created_at_ms=NOW, message_count=4))
    lines.append(revision_live_line("u3", 1, created_at_ms=NOW, message_count=5))  # the newest line wins
    path.write_bytes(b"".join(lines))
    batches: list[int] = []
    real = export_mod.read_spans

    def spy(p: Any, spans: Any, **kw: Any) -> list[bytes]:
        batches.append(sum(length for _, length in spans))
        return real(p, spans, **kw)

    monkeypatch.setattr(export_mod, "read_spans", spy)
    got = list(archived_lines(path))
    assert [(r["rootUserId"], r["revisionIndex"]) for r in got] == [("u1", i) for i in range(1, 7)] + \
        [("u2", 1), ("u3", 1)]
    assert len(batches) >= 3 and max(batches) <= export_mod.READ_BYTES
    assert [m["id"] for m in got[6]["messages"]] == ["u2"] and set(got[6]) == {
        "type", "rootUserId", "revisionIndex", "createdAt", "messages"}
    assert got[7] == {"type": "revision_live", "rootUserId": "u3", "revisionIndex": 1,
                      "createdAt": got[7]["createdAt"], "messageCount": 5}
    assert list(archived_lines(tmp_path / "none.revisions.jsonl")) == []


def test_an_imported_sessions_usage_comes_over_once_and_an_older_export_still_imports(tmp_path: Path) -> None:
    db, target = _host(tmp_path, "one")
    root = tmp_path / "src" / "sessions"
    shutil.copytree(CODEX, root)
    assert not import_root(db, "codex", root, target, now_ms=lambda: NOW).counts().get("refused")
    sid = session_id_for("codex", CODEX_PARENT)
    before = session_usage(db, sid)["total"]
    assert before["turns"] > 0 and before["inputTokens"] > 0
    out = _export(db, target, sid, tmp_path / "parent.jsonl")
    kinds = [orjson.loads(line)["type"] for line in out.read_bytes().splitlines()]
    assert kinds.count("turn") == before["turns"]
    two, target2 = _host(tmp_path, "two")
    rep = _import(two, target2, out)
    assert rep.status == "new"
    assert session_usage(two, rep.session_id)["total"] == before  # one row per turn, not one more per response
    again = tmp_path / "again" / "parent.jsonl"
    again.parent.mkdir()
    again.write_bytes(out.read_bytes().replace(b'"exportedAt":"', b'"exportedAt":"1', 1))
    assert _import(two, target2, again).status == "unchanged"
    assert session_usage(two, rep.session_id)["total"] == before
    # an export made before turn and revision lines existed: the same messages, no carried turns
    older = tmp_path / "older" / "parent.jsonl"
    older.parent.mkdir()
    older.write_bytes(b"".join(line + b"\n" for line in out.read_bytes().splitlines()
                               if orjson.loads(line)["type"] not in ("turn", "revision", "revision_live")))
    three, target3 = _host(tmp_path, "three")
    rep3 = _import(three, target3, older)
    assert rep3.status == "new" and revision_rows(three, rep3.session_id) == []
    msgs = three.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (rep3.session_id,)).fetchone()[0]
    assert msgs == two.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (rep.session_id,)).fetchone()[0]


def test_an_exported_branch_leaves_thinking_and_secrets_out_as_the_transcript_does() -> None:
    at = "2026-01-01T00:00:00.000Z"
    branch = {"type": "revision", "rootUserId": "u1", "revisionIndex": 2, "createdAt": at,
              "messages": [{"type": "message", "id": "a1b", "role": "assistant", "createdAt": at,
                            "blocks": [{"type": "thinking", "text": "hidden musing"},
                                       {"type": "text", "text": "the key is sk-test-value-123"}],
                            "meta": {"apiKey": "plain", "receipt": {"clientId": "c"}}}]}
    options = ExportOptions(format="jsonl", secret_values=("sk-test-value-123",))
    redactor = export_mod.Redactor(options.secret_values)
    report = export_mod.ExportReport("jsonl")
    out = export_mod.prepare_revision(branch, options, redactor, report)
    [m] = out["messages"]
    assert m["blocks"] == [{"type": "text", "text": "the key is [redacted]"}]
    assert m["meta"] == {"apiKey": "[redacted]"} and report.thinking_omitted == 1


def _export_file(path: Path, answer: str) -> Path:
    """A hand-made pi-host export: u1 → a1 live (variant 1 of u1's family), a1b archived as variant 2."""
    stamp = {"revisionCount": 2, "activeRevision": 1, "revisionRootId": "u1"}
    at = "2026-01-01T00:00:00.000Z"
    lines: list[dict[str, Any]] = [
        {"type": "session", "schema": 1, "sessionId": "hand", "createdAt": at, "exportedBy": "pi-host",
         "exportedAt": f"2026-01-0{len(path.parent.name)}T00:00:00.000Z", "note": path.parent.name},
        {"type": "session_info", "title": "hand-made", "updatedAt": at},
        {"type": "message", "id": "u1", "role": "user", "createdAt": at, "meta": stamp,
         "blocks": [{"type": "text", "text": "q"}]},
        {"type": "message", "id": "a1", "role": "assistant", "createdAt": at,
         "blocks": [{"type": "text", "text": "a"}]},
        {"type": "revision", "rootUserId": "u1", "revisionIndex": 1, "createdAt": at, "messages": [
            {"type": "message", "id": "u1", "role": "user", "createdAt": at, "blocks": [{"type": "text", "text": "q"}]},
            {"type": "message", "id": "a1", "role": "assistant", "createdAt": at,
             "blocks": [{"type": "text", "text": "a"}]}]},
        {"type": "revision", "rootUserId": "u1", "revisionIndex": 2, "createdAt": at, "messages": [
            {"type": "message", "id": "u1", "role": "user", "createdAt": at, "meta": stamp,
             "blocks": [{"type": "text", "text": "q"}]},
            {"type": "message", "id": "a1b", "role": "assistant", "createdAt": at,
             "blocks": [{"type": "text", "text": answer}]}]},
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def test_a_reimport_updates_an_imported_branch_and_leaves_one_the_copy_changed(tmp_path: Path) -> None:
    db, target = _host(tmp_path, "two")
    rep = _import(db, target, _export_file(tmp_path / "a" / "hand.jsonl", "second answer"))
    sid = rep.session_id
    rows = revision_rows(db, sid)
    assert [(r["rootUserId"], r["revisionIndex"], r["isActive"]) for r in rows] == \
        [(f"{sid}:u1", 1, True), (f"{sid}:u1", 2, False)]
    revisions = target.revisions(sid)
    size = revisions.stat().st_size
    rep = _import(db, target, _export_file(tmp_path / "b" / "hand.jsonl", "second answer"))
    assert rep.status == "unchanged" and revisions.stat().st_size == size
    rep = _import(db, target, _export_file(tmp_path / "c" / "hand.jsonl", "second answer, refreshed"))
    assert rep.status == "updated" and rep.archived_branches == 1
    assert b"refreshed" in revisions.read_bytes().splitlines()[-1]
    # the copy stores variant 2 itself (a switch made in the copy): a later export's variant 2 leaves it
    mine = revision_line(f"{sid}:u1", 2, [{"type": "message", "id": f"{sid}:u1", "role": "user", "blocks": []}],
                         {}, created_at_ms=NOW)
    with revisions.open("ab") as fh:
        fh.write(mine)
    rep = _import(db, target, _export_file(tmp_path / "d" / "hand.jsonl", "another answer"))
    assert rep.archived_branches == 0 and revisions.read_bytes().endswith(mine)
