"""The visible workspace, a session's tool root, pins and project groups (seed 003 §1, §4.1 D093, §4.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import client_for, inprocess_host, msg
from tests.pipeline import probe


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def _session(c: HostClient, path: Path, title: str) -> str:
    sid = str((await c.call("session.create", {"title": title, "projectPath": str(path)}))["id"])
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", f"hello from {title}")})
    return sid


async def test_seed_11_10_a_tool_call_resolves_its_sessions_root_after_the_workspace_switches(
        tmp_path: Path) -> None:
    a, b = tmp_path / "project-a", tmp_path / "project-b"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as ui, \
                client_for(host, "sidecar", kind="agent") as agent:
            sa, sb = await _session(ui, a, "A"), await _session(ui, b, "B")
            await ui.call("workspace.open", {"path": str(a)})
            before = await agent.call("session.resolvePath", {"sessionId": sa, "path": "src/main.py"})
            assert before["root"] == str(a) and before["path"] == f"{a}/src/main.py" and before["insideRoot"]
            switched = await ui.call("workspace.open", {"path": str(b)})
            assert (await ui.call("workspace.get", {}))["project"]["path"] == str(b) == switched["project"]["path"]
            after = await agent.call("session.resolvePath", {"sessionId": sa, "path": "src/main.py"})
            assert after == before, "switching the visible workspace redirected session A's tool root"
            other = await agent.call("session.resolvePath", {"sessionId": sb, "path": "./x/../README.md"})
            assert other["root"] == str(b) and other["path"] == f"{b}/README.md" and other["insideRoot"]
            escape = await agent.call("session.resolvePath", {"sessionId": sa, "path": "../project-b/secret"})
            assert escape["path"] == f"{b}/secret" and escape["insideRoot"] is False
            outside = await agent.call("session.resolvePath", {"sessionId": sa, "path": "/etc/passwd"})
            assert outside["path"] == "/etc/passwd" and outside["insideRoot"] is False
            assert (await agent.call("session.resolvePath", {"sessionId": sa}))["root"] == str(a)
            bare = str((await ui.call("session.create", {"title": "no project"}))["id"])
            assert (await _err(agent.call("session.resolvePath", {"sessionId": bare, "path": "x"}))).data_code \
                == "CONFLICT"
            assert (await _err(agent.call("session.resolvePath", {"sessionId": "nope", "path": "x"}))).data_code \
                == "SESSION_NOT_FOUND"
            # the session's own project moves with session.update, not with the workspace
            await ui.call("session.update", {"sessionId": sa, "projectPath": str(b)})
            assert (await agent.call("session.resolvePath", {"sessionId": sa}))["root"] == str(b)


async def test_seed_11_9_workspace_get_restores_the_current_project_and_changes_nothing(tmp_path: Path) -> None:
    """The host half of §11.9: a renderer that lost its sidebar preferences asks workspace.get."""
    data, a, b = tmp_path / "data", tmp_path / "a", tmp_path / "b"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            assert await c.call("workspace.get", {}) == {}
            await _session(c, a, "A")
            await _session(c, b, "B")
            opened = await c.call("workspace.open", {"path": f"{b}/", "submissionId": "open-b"})
            assert opened["project"]["path"] == str(b)  # the trailing slash is not a second project
            assert len((await c.call("projects.list", {}))["projects"]) == 2
        state = probe.state(data)
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:  # a renderer restart
            restored = await c.call("workspace.get", {})
            assert restored == {"currentProjectId": opened["currentProjectId"], "project": restored["project"]}
            assert restored["project"]["path"] == str(b)
            for _ in range(3):
                assert await c.call("workspace.get", {}) == restored
            assert probe.state(data) == state, "workspace.get changed projects, sessions or transcripts"
            pid = restored["currentProjectId"]
            await c.call("projects.remove", {"projectId": pid})
            assert await c.call("workspace.get", {}) == {}  # a removed project is no current workspace


async def test_workspace_open_refuses_a_relative_path_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            state = probe.state(data)
            assert (await _err(c.call("workspace.open", {"path": "relative/dir"}))).data_code == "INVALID_PARAMS"
            assert probe.state(data) == state


async def test_projects_pin(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            project = (await c.call("workspace.open", {"path": str(tmp_path / "w"), "name": "Work"}))["project"]
            assert project["name"] == "Work" and project["pinned"] is False
            pinned = await c.call("projects.pin", {"projectId": project["id"], "pinned": True})
            assert pinned["project"]["pinned"] is True
            assert (await c.call("projects.list", {}))["projects"][0]["pinned"] is True
            assert (await _err(c.call("projects.pin", {"projectId": 999, "pinned": True}))).data_code == "NOT_FOUND"


async def test_project_groups_roots_detached_paths_memory_and_legacy_projection(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p1, p2, p3 = (str(tmp_path / n) for n in ("parser", "lexer", "old"))
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            for path in (p1, p2, p3):
                await c.call("workspace.open", {"path": path})
            legacy = (await c.call("projectGroups.list", {}))["groups"]
            assert sorted(g["roots"][0] for g in legacy) == sorted([p1, p2, p3])
            assert all(g["legacy"] and g["id"].startswith("project:") for g in legacy)
            saved = (await c.call("projectGroups.save", {"name": "Parser", "roots": [p1, p3 + "/", p2],
                                                         "primaryRoot": p2}))["group"]
            assert saved["roots"] == [p1, p3, p2] and saved["primaryRoot"] == p2
            listed = (await c.call("projectGroups.list", {}))["groups"]
            assert [g["id"] for g in listed] == [saved["id"]]  # every path project is claimed now
            gid = saved["id"]
            again = (await c.call("projectGroups.save", {"groupId": gid, "name": "Parser", "roots": [p1, p2]}))
            assert again["group"]["detachedPaths"] == [p3] and again["group"]["primaryRoot"] == p1
            assert again["group"]["createdAt"] == saved["createdAt"]
            assert [g["id"] for g in (await c.call("projectGroups.list", {}))["groups"]] == [gid]  # p3 stays claimed
            other = await _err(c.call("projectGroups.save", {"name": "Other", "roots": [p2]}))
            assert other.data_code == "CONFLICT"
            bad_primary = await _err(c.call("projectGroups.save", {"name": "X", "roots": ["/x"], "primaryRoot": "/y"}))
            assert bad_primary.data_code == "INVALID_PARAMS"
            mem = await c.call("projectGroups.setMemory", {"groupId": gid, "memory": {
                "format": "entries-v1", "entries": [{"title": "Build", "content": "make"}]}})
            assert mem["memory"]["content"] == "## Build\n\nmake"
            await c.call("projectGroups.setInstructions", {"groupId": gid, "instructions": "  test both roots  "})
            got = await c.call("projectGroups.get", {"groupId": gid})
            assert got["memory"]["entries"] == [{"id": "e1", "title": "Build", "content": "make"}]
            assert got["instructions"] == "test both roots"
            big = await _err(c.call("projectGroups.setInstructions", {"groupId": gid, "instructions": "x" * 40000}))
            assert big.data_code == "PAYLOAD_TOO_LARGE"
            assert (await c.call("projectGroups.get", {"groupId": gid}))["instructions"] == "test both roots"
            await c.call("projectGroups.setInstructions", {"groupId": gid, "instructions": " "})
            assert "instructions" not in await c.call("projectGroups.get", {"groupId": gid})
            missing = await _err(c.call("projectGroups.setMemory", {"groupId": "g-none", "memory": "x"}))
            assert missing.data_code == "NOT_FOUND"
            read_only = await _err(c.call("projectGroups.save", {"groupId": legacy[0]["id"], "name": "n",
                                                                 "roots": ["/q"]}))
            assert read_only.data_code == "INVALID_PARAMS"
            sessions_before = (await c.call("session.list", {}))["sessions"]
            assert (await c.call("projectGroups.delete", {"groupId": gid}))["deleted"] is True
            assert (await c.call("session.list", {}))["sessions"] == sessions_before
            assert len((await c.call("projects.list", {}))["projects"]) == 3  # projects stay
            assert (await _err(c.call("projectGroups.get", {"groupId": gid}))).data_code == "NOT_FOUND"
            assert "value" not in (await c.call("settings.get", {"ns": "projectGroupMemory", "key": gid}))
            # a legacy projection reads its path project's memory
            await c.call("settings.set", {"ns": "projectMemory", "key": p1, "value": "legacy memory"})
            lp1 = next(g for g in (await c.call("projectGroups.list", {}))["groups"] if g["roots"] == [p1])
            assert (await c.call("projectGroups.get", {"groupId": lp1["id"]}))["memory"]["content"] == "legacy memory"


_WIRE_PATHS = ("session.create", "session.update", "projectGroups.save roots", "projectGroups.save primaryRoot")


@pytest.mark.parametrize("where", _WIRE_PATHS)
@pytest.mark.parametrize("bad", ["", "   ", "relative/dir", "./here", "..", "C:relative"])
async def test_a_blank_or_relative_project_path_is_refused_on_the_wire_and_changes_nothing(
        tmp_path: Path, bad: str, where: str) -> None:
    """Audit: session.create / session.update took a blank or relative projectPath: a project row with path ""
    (or "relative/dir") appeared and session.resolvePath answered relative paths. projectGroups.save took
    relative roots. Each is INVALID_PARAMS naming the field now, and nothing is written."""
    data, root = tmp_path / "data", str(tmp_path / "p")
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            sid = str((await c.call("session.create", {"title": "t", "projectPath": root}))["id"])
            state = probe.state(data)
            method, params, loc = {
                "session.create": ("session.create", {"title": "x", "projectPath": bad}, "projectPath"),
                "session.update": ("session.update", {"sessionId": sid, "projectPath": bad}, "projectPath"),
                "projectGroups.save roots": ("projectGroups.save", {"name": "G", "roots": [root, bad]}, "roots.1"),
                "projectGroups.save primaryRoot": ("projectGroups.save", {"name": "G", "roots": [root],
                                                                          "primaryRoot": bad}, "primaryRoot"),
            }[where]
            err = await _err(c.call(method, params))
            assert err.data_code == "INVALID_PARAMS"
            assert [e["loc"] for e in err.data["errors"]] == [loc], err.data
            assert bad == "" or "absolute" in err.data["errors"][0]["msg"], err.data
            assert probe.state(data) == state
            assert [p["path"] for p in (await c.call("projects.list", {}))["projects"]] == [root]
            assert (await c.call("session.resolvePath", {"sessionId": sid}))["root"] == root


async def test_an_absolute_project_path_is_stored_canonical_on_every_platform_form(tmp_path: Path) -> None:
    """The absolute forms stay accepted: POSIX, a Windows drive (either separator), with a trailing separator
    or surrounding blanks (stored trimmed, '/' separators, no trailing '/')."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            for given, stored in ((f" {tmp_path}/a/ ", f"{tmp_path}/a"), ("C:\\Users\\ada\\src", "C:/Users/ada/src"),
                                  ("D:/work/", "D:/work"), ("/", "/")):
                s = await c.call("session.create", {"title": "t", "projectPath": given})
                assert s["projectPath"] == stored, given
            group = await c.call("projectGroups.save", {"name": "G", "roots": ["E:\\code", f"{tmp_path}/b/"]})
            assert group["group"]["roots"] == ["E:/code", f"{tmp_path}/b"]


async def test_a_drive_root_is_an_absolute_project_path_stored_with_its_separator(tmp_path: Path) -> None:
    """Seed 003 §4.2 / README §8.2: a Windows drive path (``C:\\…``, ``C:/…``) is absolute, and trailing
    separators are removed before the upsert. The drive root itself keeps its one separator, as ``/`` does:
    ``C:\\`` and ``C:/`` were canonicalized to ``C:`` (drive-relative) and then refused as not absolute."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            opened = await c.call("workspace.open", {"path": "C:\\"})
            assert opened["project"]["path"] == "C:/"
            for spelling in ("C:/", " C:\\\\ ", "C://"):
                s = await c.call("session.create", {"title": "t", "projectPath": spelling})
                assert (s["projectId"], s["projectPath"]) == (opened["project"]["id"], "C:/"), spelling
            group = await c.call("projectGroups.save", {"name": "G", "roots": ["D:\\"]})
            assert group["group"]["roots"] == ["D:/"]
            await c.call("settings.set", {"ns": "projectMemory", "key": "C:\\", "value": "drive notes"})
            got = await c.call("settings.get", {"ns": "projectMemory", "key": "C:/"})
            assert got["value"]["content"] == "drive notes"
            assert [p["path"] for p in (await c.call("projects.list", {}))["projects"]] == ["C:/"]
            err = await _err(c.call("workspace.open", {"path": "C:"}))  # drive-relative: still refused
            assert err.data_code == "INVALID_PARAMS"
