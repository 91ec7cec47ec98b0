"""A JSONL export carries the session's artifact rows, so an imported copy lists every file the session lists
(seed 003 §4.10: one row per file a session produced, removed only with the session), also the files whose
Write/Edit line a cut (``session.replaceMessages``) took out of every file, and also after the copy's database is
lost and rebuilt from its files. Black-box against real ``pi-host serve`` processes.

Before, the export held only the transcript's and the archived branches' lines: a copy of a session whose Write
line was cut listed fewer files than its source (the source's rebuilt index kept them from its rewritten
header, which the export does not copy), and the copy's rows named no turn. An export made before the
``artifact`` lines imports as it did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import drop_database, real_host, say, write_tool


def _folder(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    return root


async def _listed(c: HostClient, sid: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = (await c.call("artifacts.list", {"sessionId": sid, "limit": 500}))["artifacts"]
    return got


def _as_copy(listed: list[dict[str, Any]], copy: str) -> list[dict[str, Any]]:
    """The source's answer as the copy gives it: its own session id, each turn id namespaced as the copy's turn
    rows are (``<copy>:<turn>``, as its message ids)."""
    return [{**a, "sessionId": copy, **({"turnId": f"{copy}:{a['turnId']}"} if a.get("turnId") else {})}
            for a in listed]


async def _append(c: HostClient, sid: str, message: dict[str, Any], turn: str | None = None) -> None:
    params: dict[str, Any] = {"sessionId": sid, "message": message}
    if turn is not None:
        params["turnId"] = turn
    await c.call("session.appendMessage", params)
    await trio.sleep(0.005)  # each line its own millisecond


async def _cut_session(c: HostClient, ws: Path) -> str:
    """Turn t1 writes then edits x.md and writes y.md; a ``replaceMessages`` leaves x.md's two lines out."""
    sid = str((await c.call("session.create", {"projectPath": str(ws), "title": "cut"}))["id"])
    await say(c, sid, "u1", "write files")
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    await _append(c, sid, write_tool("w1", "x.md"), "t1")
    await _append(c, sid, write_tool("e1", "x.md", "Edit"), "t1")
    await _append(c, sid, write_tool("w2", "y.md"), "t1")
    await _append(c, sid, {"id": "a1", "role": "assistant", "blocks": [{"type": "text", "text": "done"}]}, "t1")
    await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
    kept = [m for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
            if m["id"] not in ("w1", "e1")]
    await c.call("session.replaceMessages", {"sessionId": sid, "messages": kept})
    return sid


async def _import(c: HostClient, path: Path, status: str = "new") -> str:
    report = await c.call("import.sessions", {"source": "pi-host", "root": str(path)})
    [session] = report["sessions"]
    assert session["status"] == status, session
    return str(session["sessionId"])


async def test_a_copy_lists_the_files_whose_lines_a_cut_dropped(tmp_path: Path) -> None:
    ws, d1, d2 = _folder(tmp_path, "ws"), _folder(tmp_path, "d1"), _folder(tmp_path, "d2")
    out = tmp_path / "cut.jsonl"
    with trio.fail_after(120):
        async with real_host(d1) as (_p1, c1):
            sid = await _cut_session(c1, ws)
            source = await _listed(c1, sid)
            assert [(a["path"], a["op"], a["turnId"]) for a in source] == [
                (f"{ws}/y.md", "write", "t1"), (f"{ws}/x.md", "edit", "t1")]
            await c1.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
        async with real_host(d2) as (p2, c2):
            copy = await _import(c2, out)
            assert await _listed(c2, copy) == _as_copy(source, copy)  # before: y.md only, with no turn
            await _import(c2, out, "unchanged")  # the same export again writes nothing
            p2.kill9()
        drop_database(d2)
        async with real_host(d2) as (_p2, c2):  # the copy's index rebuilt from its files
            assert await _listed(c2, copy) == _as_copy(source, copy)
            second = tmp_path / "second.jsonl"  # the copy's own export carries them on
            await c2.call("session.export", {"sessionId": copy, "format": "jsonl", "outPath": str(second)})
        async with real_host(d1) as (_p1, c1):
            again = await _import(c1, second)
            assert [(a["path"], a["op"], a["updatedAt"]) for a in await _listed(c1, again)] == [
                (a["path"], a["op"], a["updatedAt"]) for a in source]


async def test_an_older_export_without_artifact_lines_imports_as_before(tmp_path: Path) -> None:
    """An export written before the ``artifact`` lines: the copy lists what its lines produce (y.md, no turn)."""
    ws, d1, d2 = _folder(tmp_path, "ws"), _folder(tmp_path, "d1"), _folder(tmp_path, "d2")
    out, older = tmp_path / "cut.jsonl", tmp_path / "older.jsonl"
    with trio.fail_after(120):
        async with real_host(d1) as (_p1, c1):
            sid = await _cut_session(c1, ws)
            source = await _listed(c1, sid)
            await c1.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
        lines = out.read_text().splitlines(keepends=True)
        kept = [line for line in lines if json.loads(line)["type"] != "artifact"]
        assert len(kept) == len(lines) - 2  # one line per listed row
        older.write_text("".join(kept))
        async with real_host(d2) as (_p2, c2):
            copy = await _import(c2, older)
            y = next(a for a in source if a["path"].endswith("y.md"))
            assert await _listed(c2, copy) == [
                {"sessionId": copy, "path": y["path"], "op": "write", "updatedAt": y["updatedAt"]}]
