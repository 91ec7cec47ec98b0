"""``artifacts.list`` after the database is lost: a rebuild from the files answers as the live host did (seed 003
§4.10: one row per file a session produced, upserted when its Write/Edit succeeded; nothing takes it away but
the session's deletion). Black-box against real ``pi-host serve`` processes.

A Write whose line a regenerate archived (``session.truncateFrom`` mode regenerate: the branch goes to the
revisions file, ``session.activateRevision`` can bring it back) stays listed on the live host, whose row was made
when the line was written. Before, an index rebuilt from the files took artifacts from the live transcript only:
the archived branch's file dropped out of the list until a switch brought its branch back, and a path written
then edited listed ``write`` (the rebuild kept the first line's op) where the live host listed ``edit``, and
every rebuilt row was dated with the boot time (the live host had dated it when the line was indexed). A row is
now dated by its line's ``createdAt`` on both, so the answers compare whole, times included. A line a plain cut
or a replace took out of every file keeps its row too: the rewrite carries the rows no line gives back any more
in the revisions file (``artifact`` lines), any number of them (a header carried 256 at most)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import drop_database, killed_during, real_host, say, write_tool


async def _listed(c: HostClient, sid: str) -> list[dict[str, Any]]:
    """The session's artifacts as listed (newest first)."""
    got: list[dict[str, Any]] = (await c.call("artifacts.list", {"sessionId": sid}))["artifacts"]
    return got


def _shape(listed: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return [(a["path"], a["op"], a.get("turnId")) for a in listed]



async def _append(c: HostClient, sid: str, message: dict[str, Any], turn: str | None = None) -> None:
    params: dict[str, Any] = {"sessionId": sid, "message": message}
    if turn is not None:
        params["turnId"] = turn
    await c.call("session.appendMessage", params)
    await trio.sleep(0.005)  # each line its own millisecond: the list's order is the order they were written


async def _x_cut_then_y_written(c: HostClient, ws: Path, title: str) -> str:
    """A session under ``ws`` that wrote then edited x.md, cut both lines (``truncateFrom`` w1, no archive), then
    wrote y.md."""
    sid = str((await c.call("session.create", {"projectPath": str(ws), "title": title}))["id"])
    await say(c, sid, "u1", "write x")
    await _append(c, sid, write_tool("w1", "x.md"))
    await _append(c, sid, write_tool("e1", "x.md", "Edit"))
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "w1"})
    await say(c, sid, "u2", "write y")
    await _append(c, sid, write_tool("w2", "y.md"))
    return sid


async def _regenerated_session(c: HostClient, ws: Path) -> str:
    """Turn t1 writes then edits x.md and writes z.md; the reply is regenerated from u1's answer on (the
    branch with those lines archived); turn t2 writes y.md and edits z.md."""
    sid = str((await c.call("session.create", {"projectPath": str(ws), "title": "archived"}))["id"])
    await say(c, sid, "u1", "write files")
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    await _append(c, sid, write_tool("w1", "x.md"), "t1")
    await _append(c, sid, write_tool("e1", "x.md", "Edit"), "t1")
    await _append(c, sid, write_tool("w3", "z.md"), "t1")
    await _append(c, sid, {"id": "a1", "role": "assistant", "blocks": [{"type": "text", "text": "done"}]}, "t1")
    await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "w1", "mode": "regenerate"})
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
    await _append(c, sid, write_tool("w2", "y.md"), "t2")
    await _append(c, sid, write_tool("e3", "z.md", "Edit"), "t2")
    await _append(c, sid, {"id": "a2", "role": "assistant", "blocks": [{"type": "text", "text": "again"}]}, "t2")
    await c.call("session.endTurn", {"sessionId": sid, "turnId": "t2", "status": "completed"})
    return sid


async def _switch(c: HostClient, sid: str, to: str) -> None:
    """``activateRevision`` of u1's oldest (``first``) or newest (``last``) branch."""
    listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
    indexes = [r["revisionIndex"] for r in listed if r["rootUserId"] == "u1"]
    target = min(indexes) if to == "first" else max(indexes)
    await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": target})


async def test_an_archived_branchs_files_stay_listed_after_the_database_is_rebuilt(tmp_path: Path) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    data.mkdir()
    want = [(f"{ws}/z.md", "edit", "t2"), (f"{ws}/y.md", "write", "t2"), (f"{ws}/x.md", "edit", "t1")]
    with trio.fail_after(120):
        async with real_host(data) as (proc, c):
            sid = await _regenerated_session(c, ws)
            live = await _listed(c, sid)  # the answer every later list gives, times included
            assert _shape(live) == want
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"]] == ["u1", "w2", "e3", "a2"]
            proc.kill9()
        drop_database(data)
        async with real_host(data) as (proc, c):
            assert await _listed(c, sid) == live  # before: only y.md and z.md (the live branch's lines)
            await _switch(c, sid, "first")  # the archived branch back: nothing listed changes
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"]] == ["u1", "w1", "e1", "w3", "a1"]
            assert await _listed(c, sid) == live
            proc.kill9()
        drop_database(data)
        async with real_host(data) as (proc, c):
            assert await _listed(c, sid) == live  # y.md's branch is the archived one now
            await _switch(c, sid, "last")
            assert await _listed(c, sid) == live
            proc.kill9()
        drop_database(data)
        async with real_host(data) as (_proc, c):
            assert await _listed(c, sid) == live


async def test_a_file_whose_line_a_cut_or_a_replace_dropped_stays_listed_after_the_database_is_rebuilt(
        tmp_path: Path) -> None:
    """A plain ``session.truncateFrom`` (no mode: nothing archived) and a ``session.replaceMessages`` that leaves
    a Write's line out drop the line from every file; the live host keeps listing the file (its row stays), and
    so does an index rebuilt after the database is lost: the revisions file carries the rows the cuts took the
    lines of, with the times the live host gave them."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    data.mkdir()
    with trio.fail_after(120):
        async with real_host(data) as (proc, c):
            sid = await _x_cut_then_y_written(c, ws, "cut")
            await _append(c, sid, write_tool("w3", "z.md"))
            kept = [m for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
                    if m["id"] != "w2"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": kept})
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"]] == ["u1", "u2", "w3"]
            want = await _listed(c, sid)
            assert [(a["path"], a["op"]) for a in want] == [
                (f"{ws}/z.md", "write"), (f"{ws}/y.md", "write"), (f"{ws}/x.md", "edit")]
            proc.kill9()
        drop_database(data)
        async with real_host(data) as (_proc, c):
            assert await _listed(c, sid) == want


async def _all_listed(c: HostClient, sid: str) -> list[dict[str, Any]]:
    """Every page of the session's artifacts, newest first."""
    rows: list[dict[str, Any]] = []
    params: dict[str, Any] = {"sessionId": sid, "limit": 500}
    while True:
        page = await c.call("artifacts.list", params)
        rows += page["artifacts"]
        if not page.get("nextCursor"):
            return rows
        params = {**params, "cursor": page["nextCursor"]}


async def test_more_files_than_a_header_holds_stay_listed_after_a_cut_and_a_rebuild(tmp_path: Path) -> None:
    """300 files written, each line then cut by a ``replaceMessages``: more rows than the 256 (and over the 64
    KiB) a rewritten header carried. The live host lists them all, and so does an index rebuilt after the
    database is lost (before: 188 of the 301, the newest within the header's 64 KiB). A second cut carries no
    row twice: the revisions file holds one ``artifact`` line per row the cuts took the line of, and the header
    stays small."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    data.mkdir()
    deep = "d" * 200  # long paths: 300 rows are over the 64 KiB a header carried, too
    with trio.fail_after(120):
        async with real_host(data) as (proc, c):
            sid = str((await c.call("session.create", {"projectPath": str(ws), "title": "many"}))["id"])
            await say(c, sid, "u1", "write many files")
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            for i in range(300):
                await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                       "message": write_tool(f"w{i}", f"{deep}/f{i:03}.md")})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [
                {"id": "u1", "role": "user", "blocks": [{"type": "text", "text": "write many files"}]}]})
            want = await _all_listed(c, sid)
            assert len(want) == 300
            await say(c, sid, "u2", "one more")
            await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w300", "last.md")})
            kept = [m for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
                    if m["id"] != "w300"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": kept})
            want = await _all_listed(c, sid)
            assert len(want) == 301
            proc.kill9()
        drop_database(data)
        async with real_host(data) as (_proc, c):
            assert await _all_listed(c, sid) == want
        sessions = data / "sessions"
        carried = [json.loads(line) for line in (sessions / f"{sid}.revisions.jsonl").read_text().splitlines()
                   if json.loads(line)["type"] == "artifact"]
        assert sorted(a["path"] for a in carried) == sorted(a["path"] for a in want)
        assert len((sessions / f"{sid}.jsonl").read_bytes().split(b"\n", 1)[0]) < 4096


def _as_an_older_host_wrote_them(sessions: Path, sid: str) -> None:
    """The session's files as a host before the ``artifact`` lines left them: the carried rows in the rewritten
    transcript's header (``artifacts``), none in the revisions file."""
    revisions = sessions / f"{sid}.revisions.jsonl"
    lines = [json.loads(line) for line in revisions.read_text().splitlines()]
    rows = [{k: v for k, v in line.items() if k != "type"} for line in lines if line["type"] == "artifact"]
    assert rows
    rest = [line for line in lines if line["type"] != "artifact"]
    if rest:
        revisions.write_text("".join(json.dumps(line) + "\n" for line in rest))
    else:
        revisions.unlink()
    transcript = sessions / f"{sid}.jsonl"
    header, body = transcript.read_bytes().split(b"\n", 1)
    transcript.write_bytes(json.dumps({**json.loads(header), "artifacts": rows}).encode() + b"\n" + body)


async def test_the_rows_an_older_hosts_header_carries_are_listed_and_carried_on_by_the_next_rewrite(
        tmp_path: Path) -> None:
    """A transcript an older host rewrote carries the cut rows in its header: a rebuild lists them, and the next
    rewrite (whose header carries none) carries them in the revisions file, so a later rebuild lists them too."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    data.mkdir()
    sessions = data / "sessions"
    with trio.fail_after(120):
        async with real_host(data) as (proc, c):
            sid = await _x_cut_then_y_written(c, ws, "older")
            want = await _listed(c, sid)
            assert [(a["path"], a["op"]) for a in want] == [(f"{ws}/y.md", "write"), (f"{ws}/x.md", "edit")]
            proc.kill9()
        _as_an_older_host_wrote_them(sessions, sid)
        drop_database(data)
        async with real_host(data) as (proc, c):
            assert await _listed(c, sid) == want
            kept = [m for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
                    if m["id"] != "u2"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": kept})
            assert await _listed(c, sid) == want
            proc.kill9()
        assert b'"artifacts"' not in (sessions / f"{sid}.jsonl").read_bytes().split(b"\n", 1)[0]
        drop_database(data)
        async with real_host(data) as (_proc, c):
            assert await _listed(c, sid) == want


async def test_a_cut_killed_after_carrying_its_rows_carries_them_once_when_retried(tmp_path: Path) -> None:
    """The rows go to the revisions file before the transcript is replaced: a host killed between the two
    (``revisions.after_write``) leaves the transcript whole and the rows carried; the retried cut finds them
    carried (no second line), and a rebuild lists what the live host did."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    data.mkdir()
    revisions = data / "sessions" / "cut-kill.revisions.jsonl"
    with trio.fail_after(120):
        async with real_host(data) as (proc, c):
            sid = str((await c.call("session.create", {"projectPath": str(ws), "sessionId": "cut-kill"}))["id"])
            await say(c, sid, "u1", "write x")
            await _append(c, sid, write_tool("w1", "x.md"))
            want = await _listed(c, sid)
            kept = [m for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
                    if m["id"] != "w1"]
            proc.kill9()
        cut = ("session.replaceMessages", {"sessionId": sid, "messages": kept})
        await killed_during(data, "revisions.after_write:1:kill", [cut])
        assert [json.loads(line)["path"] for line in revisions.read_text().splitlines()] == [f"{ws}/x.md"]
        async with real_host(data) as (proc, c):
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"]] == ["u1", "w1"]  # the rewrite never happened
            await c.call(*cut)
            assert await _listed(c, sid) == want
            proc.kill9()
        assert len(revisions.read_text().splitlines()) == 1
        drop_database(data)
        async with real_host(data) as (_proc, c):
            assert await _listed(c, sid) == want
