"""A blob file without an index row that a session file refers to is not an orphan (seed 003 §8).

Seed 003 §8: "Attachment GC: sweep attachments/ for hashes unreferenced by any transcript file". A file under
``attachments/`` that no ``attachment_blobs`` row names (an interrupted put's leftover, a file a user or a
seed-era build left there) used to be deleted by every ``attachments.gc`` as an orphan — even when a block of a
transcript names it, so the message lost the bytes it still refers to. Only the unreferenced ones go.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import trio

from tests.hostkit import client_for, index_caught_up, inprocess_host, msg


def _att(sha: str) -> dict[str, object]:
    return {"type": "attachment", "kind": "image", "name": "pic.png", "ref": f"attachments/{sha}",
            "mimeType": "image/png", "size": 9}


async def test_a_rowless_blob_a_transcript_refers_to_survives_the_gc_and_an_unreferenced_one_goes(
        tmp_path: Path) -> None:
    blobs = tmp_path / "attachments"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            blobs.mkdir(exist_ok=True)
            kept_bytes, stray_bytes = b"kept blob", b"stray one"
            kept, stray = (hashlib.sha256(b).hexdigest() for b in (kept_bytes, stray_bytes))
            (blobs / kept).write_bytes(kept_bytes)
            (blobs / stray).write_bytes(stray_bytes)
            other = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": other, "message": msg(
                "m1", "see", blocks=[{"type": "text", "text": "see"}, _att(kept)])})
            await index_caught_up(host)

            gc = await c.call("attachments.gc", {"activeSessionId": sid})
            assert gc["orphansRemoved"] == 1
            assert not (blobs / stray).exists()
            assert (blobs / kept).read_bytes() == kept_bytes
            got = await c.call("session.get", {"sessionId": other})
            blocks = [b for m in got["messages"] for b in m["blocks"] if b.get("type") == "attachment"]
            assert [b.get("evicted", False) for b in blocks] == [False]
            info = await c.call("attachments.get", {"sha256": kept})
            assert (info["deletionState"], info["size"]) == ("live", len(kept_bytes))
            assert [r["sessionId"] for r in info["references"]] == [other]
            assert (await c.call("attachments.estimate", {}))["usedBytes"] == len(kept_bytes)
            again = await c.call("attachments.gc", {"activeSessionId": sid})
            assert again["orphansRemoved"] == 0 and (blobs / kept).exists()

            # a referenced file whose bytes are not its name's is left alone: neither deleted nor adopted
            wrong = hashlib.sha256(b"what the name says").hexdigest()
            (blobs / wrong).write_bytes(b"something else")
            await c.call("session.appendMessage", {"sessionId": other, "message": msg(
                "m2", "see", blocks=[{"type": "text", "text": "see"}, _att(wrong)])})
            gc = await c.call("attachments.gc", {"activeSessionId": sid})
            assert gc["orphansRemoved"] == 0 and (blobs / wrong).read_bytes() == b"something else"
            assert (await c.call("attachments.estimate", {}))["usedBytes"] == len(kept_bytes)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert (await c.call("attachments.get", {"sha256": kept}))["deletionState"] == "live"
            assert (await c.call("attachments.gc", {"activeSessionId": sid}))["orphansRemoved"] == 0
            assert (blobs / kept).exists() and (blobs / wrong).exists()


async def test_the_bytes_of_an_evicted_blob_put_back_by_hand_revive_it_rather_than_being_deleted(
        tmp_path: Path) -> None:
    """The bytes of an evicted blob that a transcript still names, restored under ``attachments/`` (from a
    backup), were deleted by the next GC as an orphan; now they revive the blob as storing them again does."""
    data = b"restored bytes"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            active = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            sha = (await c.call("attachments.put", {"name": "pic.png", "mimeType": "image/png", "kind": "image",
                                                    "dataBase64": base64.b64encode(data).decode()}))["sha256"]
            await c.call("session.appendMessage", {"sessionId": other, "message": msg(
                "m1", "see", blocks=[{"type": "text", "text": "see"}, _att(sha)])})
            await c.call("settings.set", {"key": "attachmentBudgetBytes", "value": 1})
            assert (await c.call("attachments.gc", {"activeSessionId": active}))["evicted"] == [sha]
            await c.call("settings.set", {"key": "attachmentBudgetBytes", "value": 1_000_000})

            (tmp_path / "attachments" / sha).write_bytes(data)  # put back by hand
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            assert (gc["orphansRemoved"], gc["evicted"], gc["estimate"]["usedBytes"]) == (0, [], len(data))
            assert (tmp_path / "attachments" / sha).read_bytes() == data
            info = await c.call("attachments.get", {"sha256": sha})
            assert (info["deletionState"], info["kind"], info["mimeType"]) == ("live", "image", "image/png")
            assert [r["evicted"] for r in info["references"]] == [False]
            got = await c.call("session.get", {"sessionId": other})
            assert [b.get("evicted", False) for m in got["messages"] for b in m["blocks"]
                    if b.get("type") == "attachment"] == [False]
