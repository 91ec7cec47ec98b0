"""A blob only an archived branch refers to comes over with the export.

The export carries the bytes of every blob its lines refer to (``blob`` lines) and the session's archived
regenerate branches (``revision`` lines); the two were written apart, and the blobs were collected from the
live transcript's messages only: an image in a reply the person regenerated away was left behind, and the
restored branch on the other machine showed it evicted. Now the archived branches' blocks count too.
"""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import trio

from tests.hostkit import client_for, inprocess_host, msg

PNG = b"\x89PNG\r\n\x1a\n" + b"archived-only-pixels" * 64


async def test_a_blob_only_an_archived_branch_refers_to_is_carried_and_restores_on_the_copy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "one") as host, client_for(host) as c:
            png = await c.call("attachments.put", {"name": "heron.png", "mimeType": "image/png", "kind": "image",
                                                   "dataBase64": base64.b64encode(PNG).decode()})
            await c.call("session.create", {"sessionId": "s1", "title": "archived blob"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u1", "draw a heron")})
            picture = msg("a1", "", role="assistant", blocks=[
                {"type": "text", "text": "here it is"},
                {"type": "attachment", "kind": "image", "name": "heron.png", "ref": png["ref"],
                 "mimeType": "image/png", "size": png["size"]}])
            await c.call("session.appendMessage", {"sessionId": "s1", "message": picture})
            await c.call("session.truncateFrom", {"sessionId": "s1", "messageId": "a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("a2", "no picture this time",
                                                                                      role="assistant")})
            await c.call("session.export", {"sessionId": "s1", "format": "jsonl", "outPath": str(out / "s1.jsonl")})
        lines = [orjson.loads(line) for line in (out / "s1.jsonl").read_bytes().splitlines()]
        assert [ln["sha256"] for ln in lines if ln["type"] == "blob"] == [png["sha256"]]
        async with inprocess_host(tmp_path / "two") as host, client_for(host) as c:
            done = await c.call("import.sessions", {"source": "pi-host", "root": str(out)})
            sid = done["sessions"][0]["sessionId"]
            got = await c.call("attachments.get", {"sha256": png["sha256"]})
            assert got["size"] == len(PNG) and got.get("deletionState") != "evicted", got
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": f"{sid}:u1",
                                                      "revisionIndex": 1})
            page = await c.call("session.get", {"sessionId": sid, "full": True})
    blocks = [b for m in page["messages"] for b in m["blocks"] if b["type"] == "attachment"]
    assert [b["ref"] for b in blocks] == [png["ref"]] and not blocks[0].get("evicted"), page["messages"]
