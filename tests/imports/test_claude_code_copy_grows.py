"""A Claude Code session file two project folders hold stays the session it was first imported as.

A session goes on in another directory by its file being copied into that directory's project folder and
resumed there (:mod:`tests.importers.test_claude_code_two_folders`): the longest file is named by its file name,
the other ``<name>@<path digest>``. Which one is the longest was decided again at every import, so once the copy
grew past the original, a re-import gave the plain name to the copy: the original's session was written over
with the copy's file ("updated": the copy's turns in the original's session, under the original's project) and
the original's file became a third session, a duplicate of what the first import had. Reproduced through
``pi-host import claude-code`` against a running host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import trio

from runtime.client import open_client
from store.interchange.importers.common import session_id_for
from tests.hostkit import HostProcess, run_cli
from tests.importers.test_claude_code_two_folders import ELSEWHERE, HOME, SESSION, THIRD_TURN, _layout

LONG_PROMPT = "Here is the whole build log, tell me the word again:\n" + "step ok; " * 20_000
"""A prompt pasted in the copy's folder: 180 kB, past what the original holds more than the copy."""


def _goes_on(copy: Path) -> None:
    """The copy's session goes on in its own folder with one more turn (new uuids, a long prompt)."""
    lines = copy.read_bytes().splitlines(keepends=True)
    last = next(rec["uuid"] for rec in map(orjson.loads, reversed(lines)) if rec.get("type") == "assistant")
    tail = [orjson.loads(line) for line in lines[THIRD_TURN]]  # the copy's own third turn
    renamed: dict[str, str] = {}
    out = []
    for rec in tail:
        if "uuid" in rec:
            renamed[rec["uuid"]] = f"e15e0001-0000-4000-8000-{len(renamed):012d}"
    for rec in tail:
        if rec.get("type") == "user":
            rec["parentUuid"], rec["message"]["content"] = last, LONG_PROMPT
        elif rec.get("parentUuid") in renamed:
            rec["parentUuid"] = renamed[rec["parentUuid"]]
        if rec.get("uuid") in renamed:
            rec["uuid"] = renamed[rec["uuid"]]
        if rec.get("type") == "assistant":
            rec["message"]["id"] = "msg_e15e0001"
            rec["message"]["content"] = [{"type": "text", "text": "Heron, still."}]
        if "cwd" in rec:
            rec["cwd"] = ELSEWHERE
        out.append(orjson.dumps(rec) + b"\n")
    with open(copy, "ab") as f:
        f.write(b"".join(out))


def _import(host: HostProcess, root: Path) -> dict[str, Any]:
    done = run_cli("--data-dir", str(host.data_dir), "import", "claude-code", str(root), "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def _seen(host: HostProcess) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Each session the host lists: its project and its messages (id, role)."""
    async with open_client(host.url, host.token, client_id="copy-grows") as c:
        listed = (await c.call("session.list", {"limit": 100}))["sessions"]
        out = {}
        for s in listed:
            page = await c.call("session.get", {"sessionId": s["id"], "full": True})
            out[s["id"]] = (s.get("projectPath"), [(m["id"], m["role"]) for m in page["messages"]])
        return out


async def test_a_copy_grown_past_its_original_stays_its_own_session(tmp_path: Path, host: HostProcess) -> None:
    root = tmp_path / "projects"
    original, copy = _layout(root)
    first = await trio.to_thread.run_sync(_import, host, root)
    named = {r["externalId"]: r["sessionId"] for r in first["sessions"]}
    assert sorted(r["status"] for r in first["sessions"]) == ["new", "new"]
    own = session_id_for("claude-code", SESSION)
    (other,) = set(named.values()) - {own}
    before = await _seen(host)
    assert before[own][0] == HOME and before[other][0] == ELSEWHERE

    _goes_on(copy)
    assert copy.stat().st_size > original.stat().st_size
    second = await trio.to_thread.run_sync(_import, host, root)
    by_sid = {r["sessionId"]: r for r in second["sessions"]}
    assert set(by_sid) == {own, other}  # no third session, and each file's under the id it was imported as
    assert by_sid[own]["status"] == "unchanged" and by_sid[other]["status"] == "updated"
    assert second["counts"].get("new", 0) == 0
    after = await _seen(host)
    assert set(after) == {own, other}
    assert after[own] == before[own]  # the original's session: its project, its own messages only
    project, messages = after[other]
    assert project == ELSEWHERE
    assert messages[:len(before[other][1])] == before[other][1]
    grown = messages[len(before[other][1]):]
    assert [role for _, role in grown] == ["user", "assistant"]
    assert not any("e15e0001" in mid for mid, _ in after[own][1])
    third = await trio.to_thread.run_sync(_import, host, root)
    assert sorted(r["status"] for r in third["sessions"]) == ["unchanged", "unchanged"]


async def test_a_copy_that_appears_after_its_original_was_imported_is_a_session_of_its_own(
        tmp_path: Path, host: HostProcess) -> None:
    root = tmp_path / "projects"
    original, copy = _layout(root)
    held = copy.read_bytes()
    copy.unlink()  # the original is imported before the copy is taken and goes on elsewhere
    first = await trio.to_thread.run_sync(_import, host, root)
    own = session_id_for("claude-code", SESSION)
    assert [(r["sessionId"], r["status"]) for r in first["sessions"]] == [(own, "new")]
    before = await _seen(host)
    copy.write_bytes(held)
    _goes_on(copy)
    assert copy.stat().st_size > original.stat().st_size
    second = await trio.to_thread.run_sync(_import, host, root)
    by_sid = {r["sessionId"]: r["status"] for r in second["sessions"]}
    (other,) = set(by_sid) - {own}
    assert by_sid == {own: "unchanged", other: "new"}
    after = await _seen(host)
    assert after[own] == before[own] and after[other][0] == ELSEWHERE
    assert sum("e15e000" in mid for mid, _ in after[other][1]) == 4  # its own two turns, after the copied start
    copied = [(mid.split(":", 1)[1], role) for mid, role in after[other][1][:4]]
    assert copied == [(mid.split(":", 1)[1], role) for mid, role in before[own][1][:4]]  # the copied start
