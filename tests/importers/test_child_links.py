"""Issue 23: Codex and opencode child threads/sessions linked to the parent's spawning tool call.

Reproduces: a Codex ``spawn_agent`` thread (Codex 0.171.0, ``session_meta.parent_thread_id``) and an
opencode ``task`` child session (1.18.33, ``session.parent_id``) imported as sessions of their own with
nothing a client could follow from the parent's tool call to the child or back. Now the parent's tool
call record carries ``meta.childSessionId`` and the child session is served with ``spawnedBy``
(parent session id, tool call id, agent name), whichever of the two is imported first, and a re-import
reports ``unchanged``. A Codex child's prompt is the parent agent's, not the user's: it was imported as a
plain ``user`` row; it now carries ``meta.fromAgent`` (the parent session and, when known, its spawning call),
and the user's own prompt in the parent does not.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from store.indexing import index
from store.interchange.import_write import ImportTarget
from store.interchange.importers import discover
from store.interchange.importers.common import session_id_for
from store.interchange.imports import import_root, import_unit
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
CODEX = RECORDED / "codex" / "0.171.0" / "sessions"
CODEX_PARENT, CODEX_CHILD = "01a234be-a24a-7582-8d88-3e562b84c764", "01a234be-a396-7b20-8c86-4d33d2b806f2"
OPENCODE = RECORDED / "opencode" / "1.18.33" / "opencode.db"
OC_PARENT, OC_CHILD = "ses_dcb4fbd60ffe3Yb62e7EYkDUii", "ses_dcb4fa87bffeoZ7lVphRzPQGXj"


def records(target: ImportTarget, sid: str) -> list[dict[str, Any]]:
    return [dict(m.record) for m in read_transcript(target.transcript(sid)).messages]


def spawn_record(target: ImportTarget, sid: str, child_sid: str) -> dict[str, Any]:
    (found,) = [r for r in records(target, sid) if (r.get("meta") or {}).get("childSessionId") == child_sid]
    return found


def check_links(db: sqlite3.Connection, target: ImportTarget, source: str, parent: str, child: str,
                call_id: str, agent: str) -> None:
    parent_sid, child_sid = session_id_for(source, parent), session_id_for(source, child)
    call = spawn_record(target, parent_sid, child_sid)
    assert call["role"] == "tool" and call["blocks"][0]["callId"] == call_id
    listed = {s["id"]: s for s in index.list_sessions(db, limit=100, cursor=None)[0]}
    assert listed[child_sid]["spawnedBy"] == {"sessionId": parent_sid, "toolCallId": call_id, "agentName": agent}
    assert index.require_session(db, child_sid)["spawnedBy"] == listed[child_sid]["spawnedBy"]
    assert "spawnedBy" not in listed[parent_sid]
    # the child's own rows are its conversation, not attributed subagent rows of it
    assert not any((r.get("meta") or {}).get("parentToolCallId") for r in records(target, child_sid))


def prompts(target: ImportTarget, sid: str) -> list[tuple[str, dict[str, Any] | None]]:
    """The session's user rows: (text, ``meta.fromAgent``)."""
    return [(r["blocks"][0]["text"], (r.get("meta") or {}).get("fromAgent"))
            for r in records(target, sid) if r["role"] == "user"]


def test_codex_spawned_thread_links_both_ways(db: sqlite3.Connection, target: ImportTarget, tmp_path: Path) -> None:
    root = tmp_path / "src" / "sessions"
    shutil.copytree(CODEX, root)
    summary = import_root(db, "codex", root, target, now_ms=lambda: NOW)
    assert not summary.counts().get("refused")
    check_links(db, target, "codex", CODEX_PARENT, CODEX_CHILD, "call_fake0016", "Lorentz")
    parent_sid = session_id_for("codex", CODEX_PARENT)
    # the child's prompt came from the parent agent's spawn_agent call (the rollout: a turn whose attribution
    # names the parent's turn); the parent's prompt is the user's
    assert prompts(target, session_id_for("codex", CODEX_CHILD)) == [
        ("[[scenario:subagent-child]] Run echo child-ok and report what it printed.",
         {"sessionId": parent_sid, "toolCallId": "call_fake0016"})]
    assert prompts(target, parent_sid) == [("[[scenario:subagent]] Ask a subagent to run echo.", None)]
    again = import_root(db, "codex", root, target, now_ms=lambda: NOW + 1)
    assert again.counts() == {"unchanged": len(again.sessions)}


def test_codex_link_does_not_depend_on_import_order(db: sqlite3.Connection, target: ImportTarget,
                                                    tmp_path: Path) -> None:
    """The child alone first (its parent's rollout not under that root: no call id yet), then the whole
    tree: the child is read again and ends as a fresh import of the tree makes it."""
    root = tmp_path / "src" / "sessions"
    shutil.copytree(CODEX, root)
    (child_file,) = root.rglob(f"*{CODEX_CHILD}.jsonl")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy2(child_file, alone / child_file.name)
    first = import_root(db, "codex", alone / child_file.name, target, now_ms=lambda: NOW)
    assert first.counts() == {"new": 1}
    child_sid = session_id_for("codex", CODEX_CHILD)
    assert index.require_session(db, child_sid)["spawnedBy"] == {
        "sessionId": session_id_for("codex", CODEX_PARENT), "agentName": "Lorentz"}
    # the child's rollout names its parent's turn, never the spawning call: the prompt is the parent's all the same
    ((_, sender),) = prompts(target, child_sid)
    assert sender == {"sessionId": session_id_for("codex", CODEX_PARENT)}
    units = [u for u in discover("codex", root) if u.external_id in (CODEX_PARENT, CODEX_CHILD)]
    for unit in reversed(units):  # the child's unit before the parent's
        import_unit(db, unit, target, now_ms=NOW + 1)
    check_links(db, target, "codex", CODEX_PARENT, CODEX_CHILD, "call_fake0016", "Lorentz")
    ((_, sender),) = prompts(target, child_sid)
    assert sender == {"sessionId": session_id_for("codex", CODEX_PARENT), "toolCallId": "call_fake0016"}


def test_opencode_task_child_session_links_both_ways(db: sqlite3.Connection, target: ImportTarget,
                                                     tmp_path: Path) -> None:
    db_file = tmp_path / "opencode.db"
    shutil.copy2(OPENCODE, db_file)
    units = list(discover("opencode", db_file))
    units.sort(key=lambda u: u.external_id != OC_CHILD)  # the child first: the link needs no parent imported
    for unit in units:
        assert import_unit(db, unit, target, now_ms=NOW).status == "new"
    check_links(db, target, "opencode", OC_PARENT, OC_CHILD, "call_fixture_12", "general")
    again = import_root(db, "opencode", db_file, target, now_ms=lambda: NOW + 1)
    assert again.counts() == {"unchanged": len(units)}


def test_opencode_json_layout_links_the_same_way(db: sqlite3.Connection, target: ImportTarget,
                                                 tmp_path: Path) -> None:
    """opencode's JSON files (before its database) hold the same documents with their ids: the recorded
    parent and child written out that way link as the database does."""
    storage = tmp_path / "oc" / "storage"
    src = sqlite3.connect(f"{OPENCODE.resolve().as_uri()}?mode=ro", uri=True)
    try:
        for sid in (OC_PARENT, OC_CHILD):
            project, parent, title, directory, created, updated = src.execute(
                "SELECT project_id, parent_id, title, directory, time_created, time_updated FROM session "
                "WHERE id = ?", (sid,)).fetchone()
            info = {"id": sid, "projectID": project, "title": title, "directory": directory,
                    "time": {"created": created, "updated": updated}, **({"parentID": parent} if parent else {})}
            write(storage / "session" / project / f"{sid}.json", info)
            for mid, data in src.execute("SELECT id, data FROM message WHERE session_id = ?", (sid,)):
                write(storage / "message" / sid / f"{mid}.json", {**json.loads(data), "id": mid, "sessionID": sid})
                for pid, pdata in src.execute("SELECT id, data FROM part WHERE message_id = ?", (mid,)):
                    write(storage / "part" / mid / f"{pid}.json",
                          {**json.loads(pdata), "id": pid, "sessionID": sid, "messageID": mid})
    finally:
        src.close()
    summary = import_root(db, "opencode", tmp_path / "oc", target, now_ms=lambda: NOW)
    assert summary.counts() == {"new": 2}
    check_links(db, target, "opencode", OC_PARENT, OC_CHILD, "call_fixture_12", "general")
    assert import_root(db, "opencode", tmp_path / "oc", target, now_ms=lambda: NOW + 1).counts() == {"unchanged": 2}


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_codex_child_without_turn_attribution_marks_its_first_prompt(db: sqlite3.Connection, target: ImportTarget,
                                                                     tmp_path: Path) -> None:
    """A rollout whose ``task_started`` carries no turn attribution (older Codex): the spawned thread's first
    prompt is the parent agent's (what ``spawn_agent`` sent); a later prompt is not taken for one."""
    (child_file,) = CODEX.rglob(f"*{CODEX_CHILD}.jsonl")
    lines = [json.loads(line) for line in child_file.read_text().splitlines()]
    for rec in lines:
        if rec.get("type") == "event_msg" and rec["payload"].get("type") == "task_started":
            rec["payload"].pop("turn_attribution", None)
    later = {"timestamp": "2026-12-02T03:14:00.000Z", "type": "response_item",
             "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and then?"}]}}
    path = tmp_path / "alone" / child_file.name
    path.parent.mkdir()
    path.write_text("".join(json.dumps(rec) + "\n" for rec in [*lines, later]))
    assert import_root(db, "codex", path, target, now_ms=lambda: NOW).counts() == {"new": 1}
    parent = {"sessionId": session_id_for("codex", CODEX_PARENT)}
    assert prompts(target, session_id_for("codex", CODEX_CHILD)) == [
        ("[[scenario:subagent-child]] Run echo child-ok and report what it printed.", parent), ("and then?", None)]
