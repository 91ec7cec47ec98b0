"""opencode: both storage layouts, generated (no genuine opencode sample exists; see the samples README)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from store.interchange.import_write import ImportTarget
from store.interchange.importers import opencode
from store.interchange.imports import import_root, origin_row
from store.transcripts.transcript import read_transcript
from tests.importers import gen
from tests.samplekit import NOW, rows

CONV: list[gen.Event] = [
    gen.User("open the file"),
    gen.Response((("thinking", "which file?"), ("text", "reading it")),
                 (gen.Tool("read", {"path": "/w/a.txt"}, "contents", False),
                  gen.Tool("bash", {"command": "false"}, "exit 1", True))),
    gen.Compact("we read a file"),
    gen.User("thanks"),
]


def test_both_layouts_import_the_same_messages_and_the_database_wins(tmp_path: Path, db: sqlite3.Connection,
                                                                     target: ImportTarget) -> None:
    info, messages = gen.opencode_docs(CONV)
    root = tmp_path / "opencode"
    gen.write_opencode_json(root, info, messages)
    gen.write_opencode_db(root / "opencode.db", info, messages)
    digest = hashlib.sha256((root / "opencode.db").read_bytes()).hexdigest()
    units = list(opencode.discover(root))
    assert [(u.external_id, u.loc("layout")) for u in units] == [("ses_gen0001", "sqlite")]
    (rep,) = import_root(db, "opencode", root, target, now_ms=lambda: NOW).sessions
    assert rep.status == "new"
    want_msgs, want_comps = gen.expected(CONV)
    t = read_transcript(target.transcript(rep.session_id))
    assert [gen.project_message(m.record) for m in t.messages] == want_msgs
    assert [(c.record["summary"], [m.id for m in t.messages].index(c.record["throughMessageId"]))
            for c in t.compactions] == want_comps
    assert hashlib.sha256((root / "opencode.db").read_bytes()).hexdigest() == digest  # opened read-only

    json_only = tmp_path / "json-only"
    gen.write_opencode_json(json_only, info, messages)
    (unit,) = opencode.discover(json_only)
    assert unit.loc("layout") == "json" and unit.session_id == rep.session_id


def test_tool_states_and_durations(tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    info, messages = gen.opencode_docs(CONV)
    assistant_parts = messages[1][1]
    pending = {"id": "prt_999999999999", "type": "tool", "callID": "call_pending", "tool": "bash",
               "state": {"status": "running", "input": {"command": "sleep 9"}, "time": {"start": 5}}}
    assistant_parts.insert(-1, pending)
    root = gen.write_opencode_json(tmp_path / "oc", info, messages)
    (rep,) = import_root(db, "opencode", root, target, now_ms=lambda: NOW).sessions
    assert (rep.tool_calls, rep.tool_results, rep.unpaired_tool_calls) == (3, 2, 1)
    transcript = read_transcript(target.transcript(rep.session_id))
    tools = [m.record for m in transcript.messages if m.record["role"] == "tool"]
    assert [t["blocks"][0].get("status") for t in tools] == ["ok", "error", None]
    assert tools[0]["blocks"][0]["durationMs"] == 5
    assert "result" not in tools[2]["blocks"][0]


def test_child_sessions_attachments_and_a_broken_part(tmp_path: Path, db: sqlite3.Connection,
                                                      target: ImportTarget) -> None:
    info, messages = gen.opencode_docs(CONV)
    user_parts = messages[0][1]
    user_parts.append({"id": "prt_zz1", "type": "file", "mime": "image/png", "filename": "shot.png",
                       "url": "data:image/png;base64,iVBORw0KGgo="})
    user_parts.append({"id": "prt_zz2", "type": "file", "mime": "text/plain", "filename": "notes.txt",
                       "url": "file:///w/notes%20one.txt"})
    root = gen.write_opencode_json(tmp_path / "oc", info, messages)
    child = {**info, "id": "ses_child01", "parentID": info["id"], "title": "subtask"}
    gen.write_opencode_json(root, child, [({"id": "msg_c1", "sessionID": "ses_child01", "role": "user",
                                            "time": {"created": gen.BASE_MS + 99}},
                                           [{"id": "prt_c1", "type": "text", "text": "child prompt"}])])
    broken = root / "storage" / "part" / messages[4][0]["id"] / f"{messages[4][1][0]['id']}.json"
    broken.write_text(broken.read_text()[:10])
    summary = import_root(db, "opencode", root, target, now_ms=lambda: NOW)
    by_ext = {r.external_id: r for r in summary.sessions}
    assert summary.counts() == {"new": 2}
    parent = by_ext["ses_gen0001"]
    assert parent.files[0].bad_lines == 1  # the broken part is reported; its message has no text left
    assert dict(parent.messages) == {"user": 1, "assistant": 1, "tool": 2}
    first = read_transcript(target.transcript(parent.session_id)).messages[0].record
    image, ref = first["blocks"][1], first["blocks"][2]
    assert image["kind"] == "image" and image["ref"].startswith("attachments/") and image["size"] == 8
    assert ref == {"type": "attachment", "kind": "file", "name": "notes.txt", "ref": "/w/notes one.txt",
                   "mimeType": "text/plain"}
    origin = origin_row(db, by_ext["ses_child01"].session_id)
    assert origin is not None and origin["origin"]["parentSessionId"] == "ses_gen0001"
    assert rows(db, "SELECT title FROM sessions WHERE id = ?", by_ext["ses_child01"].session_id) == [("subtask",)]


def test_a_lone_surrogate_escape_in_a_recorded_part_keeps_the_part(tmp_path: Path, db: sqlite3.Connection,
                                                                   target: ImportTarget) -> None:
    """opencode is JavaScript: JSON.stringify writes half of a split surrogate pair as an escape, into the
    ``data`` column of a part. That part (a reply's text, a tool's output) was counted bad and dropped; it
    is read with U+FFFD in the half's place, as a source line is."""
    recorded = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "opencode"
    (source,) = recorded.rglob("opencode.db")
    copy = tmp_path / "opencode.db"
    copy.write_bytes(source.read_bytes())
    said = '"text":"Reply to: hello there, this is a plain turn"'
    with sqlite3.connect(copy) as conn:
        (sid, n), = conn.execute("SELECT session_id, COUNT(*) FROM part WHERE data LIKE ? GROUP BY session_id "
                                 "ORDER BY session_id LIMIT 1", (f"%{said}%",))
        conn.execute("UPDATE part SET data = replace(data, ?, ?) WHERE session_id = ?",
                     (said, said[:-1] + ' \\ud83d"', sid))
    reps = {r.external_id: r for r in import_root(db, "opencode", copy, target, now_ms=lambda: NOW).sessions}
    rep = reps[sid]
    assert rep.status == "new" and rep.files[0].bad_lines == 0, rep.to_dict()
    texts = [b["text"] for m in read_transcript(target.transcript(rep.session_id)).messages
             for b in m.record["blocks"] if b["type"] == "text"]
    assert "Reply to: hello there, this is a plain turn \ufffd" in texts, texts
