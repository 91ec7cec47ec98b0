"""projects.list / projects.remove: sessions go like session.delete, the folder stays."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.client import RpcError
from store import projects
from store.errors import Conflict
from tests.dbkit import NOW, add_session
from tests.hostkit import client_for, inprocess_host, msg


async def test_remove_deletes_owned_sessions_and_memory_never_the_folder(tmp_path: Path) -> None:
    data, ws, other = tmp_path / "data", tmp_path / "ws", tmp_path / "other"
    ws.mkdir()
    other.mkdir()
    (ws / "keep.txt").write_text("user file")
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            owned = [(await c.call("session.create", {"title": f"s{i}", "projectPath": str(ws)}))["id"]
                     for i in range(2)]
            for sid in owned:
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "hello")})
            kept = (await c.call("session.create", {"title": "k", "projectPath": str(other)}))["id"]
            listed = (await c.call("projects.list", {}))["projects"]
            by_path = {p["path"]: p for p in listed}
            pid = by_path[str(ws)]["id"]
            assert by_path[str(ws)]["sessionCount"] == 2 and by_path[str(ws)]["name"] == "ws"
            await c.call("settings.set", {"ns": "projectMemory", "key": str(ws), "value": "remember me"})
            await c.call("settings.set", {"ns": "projectMemory", "key": str(other), "value": "other memory"})
            assert (await c.call("workspace.open", {"path": str(ws)}))["currentProjectId"] == pid
            task = await c.call("tasks.create", {"title": "t", "prompt": "p", "projectId": pid})
            blob = await c.call("attachments.put", {"name": "a", "mimeType": "text/plain",
                                                    "dataBase64": base64.b64encode(b"att").decode()})
            await c.call("attachments.ref", {"sha256": blob["sha256"], "sessionId": owned[0]})
            out = await c.call("projects.remove", {"projectId": pid, "submissionId": "rm-1"})
            assert out == {"projectId": pid, "path": str(ws), "deletedSessions": sorted(owned)}
            assert await c.call("projects.remove", {"projectId": pid, "submissionId": "rm-1"}) == out
            for sid in owned:
                err = await _err(c.call("session.get", {"sessionId": sid}))
                assert err.data_code == "SESSION_NOT_FOUND"
                assert not (data / "sessions" / f"{sid}.jsonl").exists()
            assert [p["path"] for p in (await c.call("projects.list", {}))["projects"]] == [str(other)]
            assert "value" not in (await c.call("settings.get", {"ns": "projectMemory", "key": str(ws)}))
            assert (await c.call("settings.get", {"ns": "projectMemory", "key": str(other)}))["value"]["content"] \
                == "other memory"
            assert "value" not in (await c.call("settings.get", {"ns": "app", "key": "currentProjectId"}))
            assert "projectId" not in await c.call("tasks.get", {"taskId": task["id"]})
            assert (await c.call("session.get", {"sessionId": kept}))["session"]["projectPath"] == str(other)
            assert (await _err(c.call("projects.remove", {"projectId": pid}))).data_code == "NOT_FOUND"
    assert (ws / "keep.txt").read_text() == "user file"  # the project folder is never touched


async def _err(call: object) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call  # type: ignore[misc]
    return exc.value


def test_row_removal_refuses_while_sessions_remain(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO projects(id, path, name, created_at, last_opened_at) VALUES (1, '/p', 'p', ?, ?)",
                 (NOW, NOW))
    add_session(conn, "s", project_id=1)
    with pytest.raises(Conflict):
        projects.remove_project_row(conn, 1)
    conn.execute("DELETE FROM sessions")
    removed, cleared = projects.remove_project_row(conn, 1)
    assert removed["path"] == "/p" and cleared == {}  # no memory, not the current project: no kv key went
    assert projects.list_projects(conn) == []
