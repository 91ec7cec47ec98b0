"""A review snapshot moves with its session to another machine whose project lives elsewhere: the export carries
its path relative to the session's workspace (``workspacePath``, protocol/README.md §9) and the import re-roots
it on the copy's workspace, so ``review.restore`` on the copy writes into the copy's folder. Before, the
snapshot kept host 1's absolute path and the copy's restore was refused (outside its workspace) unless both
machines kept the project at the same path."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, RpcError
from store.interchange.importers.common import session_id_for
from tests.hostkit import client_for, inprocess_host, msg

SID = "moving"
BEFORE = b"# notes, before\n"
AFTER = b"# notes, after\n"


async def export(c: HostClient, out: Path) -> None:
    await c.call("session.export", {"sessionId": SID, "format": "jsonl", "outPath": str(out)})


async def import_file(c: HostClient, path: Path) -> dict[str, Any]:
    result = await c.call("import.sessions", {"source": "pi-host", "root": str(path)})
    [rep] = result["sessions"]
    return rep  # type: ignore[no-any-return]


async def test_a_snapshot_restores_into_the_copys_workspace_on_another_machine(tmp_path: Path) -> None:
    a, b = tmp_path / "machine-1" / "proj", tmp_path / "machine-2" / "code" / "proj"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    for d in ("d1", "d2"):
        (tmp_path / d).mkdir()
    copy = session_id_for("pi-host", SID)
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "d1") as one, client_for(one) as c1:
            await c1.call("session.create", {"sessionId": SID, "title": "moving", "projectPath": str(a)})
            await c1.call("session.appendMessage", {"sessionId": SID, "message": msg("u1", "write the notes")})
            await export(c1, tmp_path / "early.jsonl")  # before the snapshot
            (a / "notes.md").write_bytes(AFTER)
            rec = await c1.call("review.record", {"sessionId": SID, "path": "notes.md", "toolName": "Write",
                                                  "beforeBase64": base64.b64encode(BEFORE).decode(),
                                                  "toolCallId": "c1", "messageId": "t1"})
            await c1.call("session.appendMessage", {"sessionId": SID, "message": msg(
                "t1", "", role="tool", toolName="Write", blocks=[
                    {"type": "tool_call", "callId": "c1", "name": "Write", "args": {"path": "notes.md"},
                     "result": "wrote notes.md", "status": "success", "details": {"review": rec["review"]}}])})
            await export(c1, tmp_path / "later.jsonl")
        snapshot_id = rec["snapshot"]["snapshotId"]
        async with inprocess_host(tmp_path / "d2") as two, client_for(two) as c2:
            assert (await import_file(c2, tmp_path / "early.jsonl"))["status"] == "new"
            # on this machine the project lives elsewhere: the person points the copy at it
            await c2.call("session.update", {"sessionId": copy, "projectPath": str(b)})
            rep = await import_file(c2, tmp_path / "later.jsonl")
            assert rep["status"] == "updated" and not rep["skippedBlocks"], rep
            [snap] = (await c2.call("review.list", {"sessionId": copy}))["snapshots"]
            assert snap["snapshotId"] == snapshot_id and snap["path"] == str(b / "notes.md"), snap
            (b / "notes.md").write_bytes(AFTER)  # the file as the tool left it, on this machine
            done = await c2.call("review.restore", {"sessionId": copy, "snapshotId": snapshot_id})
            assert done["snapshot"]["state"] == "restored"
            assert (b / "notes.md").read_bytes() == BEFORE and (a / "notes.md").read_bytes() == AFTER


async def test_an_export_without_a_workspace_path_keeps_the_absolute_one(tmp_path: Path) -> None:
    """An older export (no ``workspacePath``): the snapshot keeps host 1's path, and a copy whose workspace is
    elsewhere refuses to restore it (outside its workspace), as before."""
    a, b = tmp_path / "one" / "proj", tmp_path / "two" / "proj"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    copy = session_id_for("pi-host", SID)
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "d1") as one, client_for(one) as c1:
            await c1.call("session.create", {"sessionId": SID, "title": "older", "projectPath": str(a)})
            await c1.call("session.appendMessage", {"sessionId": SID, "message": msg("u1", "write the notes")})
            await export(c1, tmp_path / "early.jsonl")
            (a / "notes.md").write_bytes(AFTER)
            rec = await c1.call("review.record", {"sessionId": SID, "path": "notes.md", "toolName": "Write",
                                                  "beforeBase64": base64.b64encode(BEFORE).decode()})
            await c1.call("session.appendMessage", {"sessionId": SID, "message": msg("u2", "thanks")})
            await export(c1, tmp_path / "later.jsonl")
        later = tmp_path / "later.jsonl"
        lines = later.read_bytes().splitlines(keepends=True)
        assert sum(b'"workspacePath":"notes.md"' in ln for ln in lines) == 1
        later.write_bytes(b"".join(ln.replace(b',"workspacePath":"notes.md"', b"") for ln in lines))
        async with inprocess_host(tmp_path / "d2") as two, client_for(two) as c2:
            assert (await import_file(c2, tmp_path / "early.jsonl"))["status"] == "new"
            await c2.call("session.update", {"sessionId": copy, "projectPath": str(b)})
            assert (await import_file(c2, later))["status"] == "updated"
            [snap] = (await c2.call("review.list", {"sessionId": copy}))["snapshots"]
            assert snap["path"] == str(a / "notes.md"), snap
            try:
                await c2.call("review.restore", {"sessionId": copy, "snapshotId": rec["snapshot"]["snapshotId"]})
            except RpcError as exc:
                assert (exc.data or {}).get("reason") == "outside_workspace", exc
            else:
                raise AssertionError("a snapshot outside the copy's workspace was restored")
            assert (a / "notes.md").read_bytes() == AFTER
