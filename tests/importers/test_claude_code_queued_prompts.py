"""A prompt typed while Claude Code worked is the person's words, and the import keeps it.

Claude Code writes no ``user`` line for a prompt typed while the agent is busy: it folds the prompt into the
running turn as an ``attachment`` line (``attachment.type: queued_command``, ``commandMode: prompt``,
``origin.kind: human``; the sample ``claude-code/agent-sessions_CURATED_schema_coverage.jsonl`` line 39 has
one). Reproduces: every ``attachment`` line was counted as skipped, so such a prompt was missing from the
imported session (``session.get``, search, export) with only an ``attachment`` count in the report to say so.
A queued message from elsewhere (another session: ``origin.kind: peer``, ``isMeta``; a task notification) is
not the person's words and stays a skipped attachment.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.interchange import import_write, imports
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS, claude_code
from store.interchange.imports import import_unit
from store.search.search import search_messages
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW

SID = "9a1e0000-0000-4000-8000-00000000q001"
QUEUED = "also check the README for the pelican flag"


def line(kind: str, uuid: str, parent: str | None, ts: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "uuid": uuid, "parentUuid": parent, "isSidechain": False, "sessionId": SID,
            "timestamp": f"2026-03-01T10:00:{ts}.000Z", "cwd": "/w/q", "version": "2.1.90", **fields}


def queued(uuid: str, parent: str, ts: str, prompt: Any, **attachment: Any) -> dict[str, Any]:
    return line("attachment", uuid, parent, ts, attachment={
        "type": "queued_command", "prompt": prompt, "commandMode": "prompt", "origin": {"kind": "human"},
        **attachment})


def session_lines() -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": "toolu_q1", "name": "Bash", "input": {"command": "ls"}}
    return [
        line("user", "u1", None, "01", message={"role": "user", "content": "list the files"}),
        line("assistant", "a1", "u1", "02", message={"id": "msg_1", "role": "assistant", "model": "claude-opus-4-6",
                                                     "content": [call], "usage": {"input_tokens": 5,
                                                                                  "output_tokens": 3}}),
        line("user", "r1", "a1", "03", message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_q1", "content": "README.md"}]}),
        queued("q1", "r1", "04", QUEUED),
        # not the person's words: another session's message, and a harness notification
        queued("q2", "q1", "05", "a peer says hello", origin={"kind": "peer"}, isMeta=True),
        queued("q3", "q2", "06", "<task-notification>done</task-notification>", commandMode="task-notification"),
        line("assistant", "a2", "q3", "07", message={"id": "msg_2", "role": "assistant", "model": "claude-opus-4-6",
                                                     "content": [{"type": "text", "text": "README checked."}],
                                                     "usage": {"input_tokens": 9, "output_tokens": 4}}),
    ]


def write_source(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    project = tmp_path / "projects" / "-w-q"
    project.mkdir(parents=True, exist_ok=True)
    path = project / f"{SID}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def import_file(db: sqlite3.Connection, target: ImportTarget, path: Path) -> Any:
    (unit,) = IMPORTERS["claude-code"].discover(path)
    return import_unit(db, unit, target, now_ms=NOW)


def test_a_prompt_typed_while_the_agent_worked_is_a_user_message(tmp_path: Path, db: sqlite3.Connection,
                                                                 target: ImportTarget) -> None:
    path = write_source(tmp_path, session_lines())
    rep = import_file(db, target, path)
    assert rep.status == "new"
    sid = rep.session_id
    messages = [m.record for m in read_transcript(target.transcript(sid)).messages]
    assert [(m["role"], m["id"].removeprefix(f"{sid}:")) for m in messages] == [
        ("user", "u1"), ("tool", "tool:toolu_q1"), ("user", "q1"), ("assistant", "a2")]
    prompt = messages[2]
    assert prompt["blocks"] == [{"type": "text", "text": QUEUED}]
    assert prompt["createdAt"] == "2026-03-01T10:00:04.000Z" and not prompt.get("meta")
    assert dict(rep.messages) == {"user": 2, "tool": 1, "assistant": 1}
    assert rep.files[0].skipped["attachment"] == 2  # the peer's message and the notification
    hits = search_messages(db, "pelican flag", session_id=sid)["results"]
    assert [h["messageId"] for h in hits] == [prompt["id"]]
    assert import_file(db, target, path).status == "unchanged"


def test_a_queued_prompt_with_an_image_keeps_both(tmp_path: Path, db: sqlite3.Connection,
                                                  target: ImportTarget) -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    lines = session_lines()[:4]
    lines[3] = queued("q1", "r1", "04", [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "text", "text": QUEUED}])
    rep = import_file(db, target, write_source(tmp_path, lines))
    last = read_transcript(target.transcript(rep.session_id)).messages[-1].record
    assert last["role"] == "user" and [b["type"] for b in last["blocks"]] == ["attachment", "text"]
    assert rep.attachments == 1


def test_a_session_imported_before_gets_its_queued_prompts(tmp_path: Path, db: sqlite3.Connection,
                                                           target: ImportTarget,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Import rules 16: the unchanged file of a session the rules-15 importer imported is parsed again, and
    the prompt it skipped is added (nothing else changes)."""
    path = write_source(tmp_path, session_lines())
    with monkeypatch.context() as m:
        m.setattr(claude_code, "_queued_prompt", lambda rec: None)
        m.setattr(import_write, "IMPORT_RULES", 15)
        m.setattr(imports, "IMPORT_RULES", 15)
        first = import_file(db, target, path)
    sid = first.session_id
    assert [m.record["id"] for m in read_transcript(target.transcript(sid)).messages] == [
        f"{sid}:u1", f"{sid}:tool:toolu_q1", f"{sid}:a2"]
    again = import_file(db, target, path)
    assert again.status == "updated" and again.new_messages == 1
    messages = [m.record for m in read_transcript(target.transcript(sid)).messages]
    assert [m["id"] for m in messages if m["role"] == "user"] == [f"{sid}:u1", f"{sid}:q1"]
    assert import_file(db, target, path).status == "unchanged"
