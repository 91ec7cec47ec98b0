"""A JSONL export carries the project root each line was written under (``records.Root``), and an import of it
gives the copy the same roots: seed 003 §4.10 ("path -- absolute, workspace-resolved"), protocol/README.md §9
(the export's lines) and the artifacts section ("The root is the one the session had when the line was
written"). Black-box against real ``pi-host serve`` processes.

A session in folder A writes ``x.md``, moves to folder B (``session.update``), writes ``y.md``: it lists
``A/x.md`` and ``B/y.md``. Its export imported into another host's data directory, and into its own, lists the
same two files, also after the copy's database is lost and rebuilt from its transcript; before, the copy
resolved every line against its one root and listed ``B/x.md``, a file no tool wrote. An older export (no
positional root lines) imports as it did: every line under the export's root.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import artifact_paths, drop_database, real_host, say, write_tool


def _folder(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    return root




async def _moved_session(c: HostClient, a: Path, b: Path) -> str:
    """x.md written under A, the session moved to B, y.md written under B."""
    sid = str((await c.call("session.create", {"projectPath": str(a), "title": "moved"}))["id"])
    await say(c, sid, "u1", "write x")
    await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w1", "x.md")})
    await say(c, sid, "a1", "done", "assistant")
    await c.call("session.update", {"sessionId": sid, "projectPath": str(b)})
    await say(c, sid, "u2", "write y")
    await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w2", "y.md")})
    await say(c, sid, "a2", "done", "assistant")
    return sid


async def _import(c: HostClient, path: Path) -> str:
    report = await c.call("import.sessions", {"source": "pi-host", "root": str(path)})
    [session] = report["sessions"]
    assert session["status"] == "new", session
    return str(session["sessionId"])


async def test_an_imported_copy_lists_each_artifact_under_the_folder_it_was_written_in(tmp_path: Path) -> None:
    a, b = _folder(tmp_path, "project-a"), _folder(tmp_path, "project-b")
    d1, d2 = _folder(tmp_path, "d1"), _folder(tmp_path, "d2")
    out = tmp_path / "moved.jsonl"
    with trio.fail_after(120):
        async with real_host(d1) as (_p1, c1):
            sid = await _moved_session(c1, a, b)
            want = [f"{a}/x.md", f"{b}/y.md"]
            assert await artifact_paths(c1, sid) == want
            await c1.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
            same = await _import(c1, out)  # into the host it came from: a new copy beside the session
            assert await artifact_paths(c1, same) == want
            got = await c1.call("session.get", {"sessionId": same, "full": True})
            assert got["session"]["projectPath"] == str(b)
            assert [m["id"].rsplit(":", 1)[-1] for m in got["messages"]] == ["u1", "w1", "a1", "u2", "w2", "a2"]
        async with real_host(d2) as (p2, c2):
            copy = await _import(c2, out)  # a fresh data directory
            assert await artifact_paths(c2, copy) == want
            got = await c2.call("session.get", {"sessionId": copy, "full": True})
            assert got["session"]["projectPath"] == str(b)
            assert got["totalMessages"] == 6
            p2.kill9()
        drop_database(d2)
        async with real_host(d2) as (_p2, c2):  # the copy's index rebuilt from its transcript
            assert await artifact_paths(c2, copy) == want
            assert (await c2.call("session.get", {"sessionId": copy}))["session"]["projectPath"] == str(b)


async def test_a_copy_of_a_copy_keeps_the_roots(tmp_path: Path) -> None:
    """The copy's export carries the roots its transcript holds: moved on once more, the files stay put."""
    a, b = _folder(tmp_path, "project-a"), _folder(tmp_path, "project-b")
    d1, d2 = _folder(tmp_path, "d1"), _folder(tmp_path, "d2")
    with trio.fail_after(120):
        async with real_host(d1) as (_p1, c1), real_host(d2) as (_p2, c2):
            sid = await _moved_session(c1, a, b)
            first = tmp_path / "first.jsonl"
            await c1.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(first)})
            copy = await _import(c2, first)
            second = tmp_path / "second.jsonl"
            await c2.call("session.export", {"sessionId": copy, "format": "jsonl", "outPath": str(second)})
            again = await _import(c1, second)
            assert await artifact_paths(c1, again) == [f"{a}/x.md", f"{b}/y.md"]


async def test_an_older_export_without_root_lines_imports_as_before(tmp_path: Path) -> None:
    """An export written before the root lines (one ``session_info`` line, after the header) reads as it did:
    every line resolves against the export's ``projectPath``."""
    a, b = _folder(tmp_path, "project-a"), _folder(tmp_path, "project-b")
    d1, d2 = _folder(tmp_path, "d1"), _folder(tmp_path, "d2")
    out = tmp_path / "moved.jsonl"
    older = tmp_path / "older.jsonl"
    with trio.fail_after(120):
        async with real_host(d1) as (_p1, c1):
            sid = await _moved_session(c1, a, b)
            await c1.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
        lines = out.read_text().splitlines(keepends=True)
        infos = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "session_info"]
        assert len(infos) > 1  # the full line after the header, then the positional root lines
        # (nor the artifact lines, which came later still)
        older.write_text("".join(line for i, line in enumerate(lines)
                                 if i not in infos[1:] and json.loads(line)["type"] != "artifact"))
        async with real_host(d2) as (_p2, c2):
            copy = await _import(c2, older)
            assert await artifact_paths(c2, copy) == [f"{b}/x.md", f"{b}/y.md"]
            assert (await c2.call("session.get", {"sessionId": copy}))["session"]["projectPath"] == str(b)


async def test_a_reimport_of_the_grown_export_adds_its_new_lines_under_their_own_folder(tmp_path: Path) -> None:
    """The session goes on on host 1 in a third folder C (``z.md``); its new export re-imported into the copy
    (``updated``) lists ``C/z.md`` beside the two it had, the copy's own root unchanged, also once the copy's
    database is rebuilt."""
    a, b, c = _folder(tmp_path, "project-a"), _folder(tmp_path, "project-b"), _folder(tmp_path, "project-c")
    d1, d2 = _folder(tmp_path, "d1"), _folder(tmp_path, "d2")
    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir()
    later.mkdir()
    want = [f"{a}/x.md", f"{b}/y.md", f"{c}/z.md"]
    with trio.fail_after(120):
        async with real_host(d1) as (_p1, c1), real_host(d2) as (p2, c2):
            sid = await _moved_session(c1, a, b)
            await c1.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(first / "s.jsonl")})
            copy = await _import(c2, first / "s.jsonl")
            await c1.call("session.update", {"sessionId": sid, "projectPath": str(c)})
            await say(c1, sid, "u3", "write z")
            await c1.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w3", "z.md")})
            assert await artifact_paths(c1, sid) == want
            await c1.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(later / "s.jsonl")})
            report = await c2.call("import.sessions", {"source": "pi-host", "root": str(later / "s.jsonl")})
            [session] = report["sessions"]
            assert (session["status"], session["sessionId"], session["newMessages"]) == ("updated", copy, 2)
            assert await artifact_paths(c2, copy) == want
            assert (await c2.call("session.get", {"sessionId": copy}))["session"]["projectPath"] == str(b)
            p2.kill9()
        drop_database(d2)
        async with real_host(d2) as (_p2, c2):
            assert await artifact_paths(c2, copy) == want
            assert (await c2.call("session.get", {"sessionId": copy}))["session"]["projectPath"] == str(b)


async def _switched_session(c: HostClient, a: Path, b: Path, out: Path) -> str:
    """x.md written under A, the session moved to B, the reply regenerated from the Write on (the branch with
    x.md archived), y.md written under B, the session exported to ``out``, then a switch back to the first
    branch: its lines come back from the revisions file."""
    sid = str((await c.call("session.create", {"projectPath": str(a), "title": "switched"}))["id"])
    await say(c, sid, "u1", "write a file")
    await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w1", "x.md")})
    await say(c, sid, "a1", "done", "assistant")
    await c.call("session.update", {"sessionId": sid, "projectPath": str(b)})
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "w1", "mode": "regenerate"})
    await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w2", "y.md")})
    await say(c, sid, "a2", "done again", "assistant")
    assert await artifact_paths(c, sid) == [f"{a}/x.md", f"{b}/y.md"]
    await c.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
    listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
    first = min(r["revisionIndex"] for r in listed if r["rootUserId"] == "u1")
    await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": first})
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    assert [m["id"] for m in got["messages"]] == ["u1", "w1", "a1"]
    return sid


async def test_a_branch_switched_back_keeps_the_folder_its_lines_were_written_in(tmp_path: Path) -> None:
    """``session.activateRevision`` brings back a branch written under A after the session moved to B: its Write
    stays ``A/x.md`` (no ``B/x.md``, a file no tool wrote), live, after a restart with the database lost, and on
    a copy imported from the session's export, where a switch to the other branch brings ``y.md`` back under B
    (the revisions file's lines keep the root each message stood under: ``store.revisions.ROOTS``). An archived
    branch's file stays listed throughout, as on the first host (seed 003 §4.10: nothing but the session's
    deletion takes a row away)."""
    a, b = _folder(tmp_path, "project-a"), _folder(tmp_path, "project-b")
    d1, d2 = _folder(tmp_path, "d1"), _folder(tmp_path, "d2")
    out = tmp_path / "switched.jsonl"
    want = [f"{a}/x.md", f"{b}/y.md"]
    with trio.fail_after(120):
        async with real_host(d1) as (p1, c1):
            sid = await _switched_session(c1, a, b, out)
            assert await artifact_paths(c1, sid) == want
            p1.kill9()
        drop_database(d1)
        async with real_host(d1) as (_p1, c1):
            # y.md's line is archived now: a rebuild lists it from the revisions file, as the live host did
            assert await artifact_paths(c1, sid) == want
        async with real_host(d2) as (p2, c2):
            copy = await _import(c2, out)  # exported before the switch back: the branch with x.md archived
            assert await artifact_paths(c2, copy) == want  # as the first host listed them (x.md under A)
            listed = (await c2.call("session.listRevisions", {"sessionId": copy}))["revisions"]
            first = min(r["revisionIndex"] for r in listed)
            await c2.call("session.activateRevision", {"sessionId": copy, "rootUserId": f"{copy}:u1",
                                                       "revisionIndex": first})
            got = await c2.call("session.get", {"sessionId": copy, "full": True})
            assert [m["id"].rsplit(":", 1)[-1] for m in got["messages"]] == ["u1", "w1", "a1"]
            assert await artifact_paths(c2, copy) == want
            p2.kill9()
        drop_database(d2)
        async with real_host(d2) as (_p2, c2):  # the copy's index rebuilt: y.md from its revisions file
            assert await artifact_paths(c2, copy) == want
