"""The permission mode and todo list Claude Code wrote on its user lines come in with the messages.

Every Claude Code user line carries the permission mode it was written under (``permissionMode``: default,
plan, acceptEdits, bypassPermissions, ...) and the agent's todo list as it stood (``todos``, Claude Code 1.x;
later versions write ``[]`` and keep the list in the TodoWrite tool's result). Each line repeats them, so the
import keeps a change: on the message the line becomes, ``meta.permissionMode`` / ``meta.todos``. The CURATED
sample switches from ``ask`` (lines 7-10: a prompt and two tool results) to ``default`` (line 30, the result of
``toolu_stage0_1``: the tool record).
Reproduces: both were dropped without a count.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from store.interchange.import_write import ImportTarget
from tests.samplekit import import_new


def _messages(db: sqlite3.Connection, target: ImportTarget, path: Path) -> list[dict[str, Any]]:
    return import_new(db, target, "claude-code", path)[1]


def test_permission_mode_changes_are_kept(untouched_samples: Path, db: sqlite3.Connection,
                                          target: ImportTarget) -> None:
    messages = _messages(db, target, untouched_samples / "claude-code/agent-sessions_CURATED_schema_coverage.jsonl")
    modes = [(m["id"].rsplit(":", 1)[1], m["meta"]["permissionMode"]) for m in messages
             if "permissionMode" in (m.get("meta") or {})]
    assert modes[:2] == [("u1", "ask"), ("toolu_stage0_1", "default")], modes
    # the two tool results written under "ask" after the prompt repeat it: not kept again
    assert all(mode != "ask" for _, mode in modes[1:])

    short = _messages(db, target, untouched_samples / "claude-code/spotter_v2.1.38_short_hooks_local_command.jsonl")
    first = next(m for m in short if m["role"] == "user")
    assert first["meta"]["permissionMode"] == "bypassPermissions"
    assert "todos" not in first["meta"]  # an empty list, as every line of it writes: nothing to keep


def test_a_todo_list_is_kept_when_it_changes(tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    path = tmp_path / "proj" / "5c0375b4-57a5-4f26-b12d-d022ee4e5198.jsonl"
    path.parent.mkdir()
    todos = [{"content": "Write the parser", "status": "in_progress", "id": "1"}]
    base = {"sessionId": "5c0375b4-57a5-4f26-b12d-d022ee4e5198", "cwd": "/w", "version": "1.0.108",
            "isSidechain": False, "userType": "external"}

    def user(uuid: str, parent: str | None, n: int, text: str, todo: list[Any]) -> dict[str, Any]:
        return {**base, "type": "user", "uuid": uuid, "parentUuid": parent, "timestamp": f"2026-01-01T00:00:0{n}Z",
                "todos": todo, "message": {"role": "user", "content": text}}

    def reply(uuid: str, parent: str, n: int) -> dict[str, Any]:
        return {**base, "type": "assistant", "uuid": uuid, "parentUuid": parent,
                "timestamp": f"2026-01-01T00:00:0{n}Z",
                "message": {"id": f"msg_{uuid}", "role": "assistant", "model": "claude-x",
                            "content": [{"type": "text", "text": "ok"}]}}

    lines = [user("u1", None, 0, "start", []), reply("a1", "u1", 1), user("u2", "a1", 2, "go on", todos),
             reply("a2", "u2", 3), user("u3", "a2", 4, "more", todos), reply("a3", "u3", 5),
             user("u4", "a3", 6, "new topic", [])]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    users = [m for m in _messages(db, target, path) if m["role"] == "user"]
    assert [(m.get("meta") or {}).get("todos") for m in users] == [None, todos, None, []]


def test_a_permission_mode_line_is_kept_on_the_next_prompt(tmp_path: Path, db: sqlite3.Connection,
                                                            target: ImportTarget) -> None:
    """Claude Code writes a ``permission-mode`` line where the mode is set; a user line that names no mode of
    its own takes it, as a change the user lines say is kept (``meta.permissionMode``). Reproduces: the line
    was counted as skipped and the mode was nowhere."""
    sid = "5c0375b4-57a5-4f26-b12d-d022ee4e5197"
    path = tmp_path / "proj" / f"{sid}.jsonl"
    path.parent.mkdir()
    base = {"sessionId": sid, "cwd": "/w", "version": "2.1.80", "isSidechain": False, "userType": "external"}

    def user(uuid: str, parent: str | None, n: int, **extra: Any) -> dict[str, Any]:
        return {**base, "type": "user", "uuid": uuid, "parentUuid": parent, "timestamp": f"2026-01-01T00:00:0{n}Z",
                "message": {"role": "user", "content": f"prompt {uuid}"}, **extra}

    def reply(uuid: str, parent: str, n: int) -> dict[str, Any]:
        return {**base, "type": "assistant", "uuid": uuid, "parentUuid": parent,
                "timestamp": f"2026-01-01T00:00:0{n}Z",
                "message": {"id": f"msg_{uuid}", "role": "assistant", "model": "claude-x",
                            "content": [{"type": "text", "text": "ok"}]}}

    def mode(name: str) -> dict[str, Any]:
        return {"type": "permission-mode", "permissionMode": name, "sessionId": sid}

    lines = [mode("plan"), user("u1", None, 0), reply("a1", "u1", 1),
             mode("acceptEdits"), user("u2", "a1", 2), reply("a2", "u2", 3),
             mode("bypassPermissions"), user("u3", "a2", 4, permissionMode="default"), reply("a3", "u3", 5),
             user("u4", "a3", 6), reply("a4", "u4", 7), mode("plan")]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    rep, messages = import_new(db, target, "claude-code", path)
    users = [m for m in messages if m["role"] == "user"]
    assert [(m.get("meta") or {}).get("permissionMode") for m in users] == ["plan", "acceptEdits", "default", None]
    # the line's own mode wins (it was written under it); the last one has no later prompt: both counted
    assert rep.files[0].skipped == Counter({"permission-mode(superseded)": 1, "permission-mode(no later message)": 1})
