"""A transcript written by another program while the host runs (a line appended by hand, or the
file cut): the session's writer notices before it writes (``TranscriptWriter``: the file is not
the length it left it at), writes nothing, and the session actor lets the file decide again and
plans the appends anew on it, once. Before, the lines were planned on what the actor knew: the
index took the foreign line for the host's, and an acknowledged append was in no read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host, msg


def _append_by_hand(path: Path, line: bytes) -> None:
    with open(path, "ab") as f:
        f.write(line)


async def test_a_line_another_program_appended_is_read_and_every_acknowledged_append_too(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "one")})
            foreign = {"type": "message", "id": "ext1", "role": "user", "createdAt": "2026-12-03T07:00:00.000Z",
                       "blocks": [{"type": "text", "text": "written by hand"}]}
            _append_by_hand(tmp_path / "sessions" / "s1.jsonl", json.dumps(foreign).encode() + b"\n")
            seqs = [(await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(m, m)}))["message"]["seq"]
                    for m in ("m2", "m3")]
            assert seqs == [3, 4]
            got = await c.call("session.get", {"sessionId": "s1"})
            assert [(m["id"], m["seq"]) for m in got["messages"]] == [("m1", 1), ("ext1", 2), ("m2", 3), ("m3", 4)]
            assert got["totalMessages"] == 4
            assert [h["messageId"] for h in (await c.call("search.query", {"query": "by hand"}))["results"]] == ["ext1"]
        async with inprocess_host(tmp_path) as host, client_for(host) as c:  # the same after a restart
            got = await c.call("session.get", {"sessionId": "s1"})
            assert [(m["id"], m["seq"]) for m in got["messages"]] == [("m1", 1), ("ext1", 2), ("m2", 3), ("m3", 4)]


async def test_a_transcript_cut_by_another_program_takes_the_next_append_after_what_is_left(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            for m in ("m1", "m2"):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(m, m)})
            path = tmp_path / "sessions" / "s1.jsonl"
            data = path.read_bytes()
            os.truncate(path, data.rindex(b"\n", 0, len(data) - 1) + 1)  # m2's line gone (an older copy put back)
            assert (await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m3", "m3")}))[
                "message"]["seq"] == 2
            got = await c.call("session.get", {"sessionId": "s1"})
            assert [m["id"] for m in got["messages"]] == ["m1", "m3"] and got["totalMessages"] == 2


async def test_a_transcript_copied_by_hand_is_a_session_of_its_own_and_its_tombstones_hold(tmp_path: Path) -> None:
    """A user duplicates a session by copying its file: the copy's index rows take the D444 spelling
    ``copy:<id>`` (the ids belong to the original), its lines keep theirs. A tombstone named the
    index spelling, which no line of the copy carries: session.context (read from the transcript)
    still showed the deleted message, and so would a rebuilt index."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "a", "title": "original"})
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": "a", "message": msg(f"m{i}", f"text {i}")})
        sessions = tmp_path / "sessions"
        (sessions / "copy.jsonl").write_bytes((sessions / "a.jsonl").read_bytes())

        async def context_ids(c: HostClient, sid: str) -> list[str]:
            return [m["id"] for m in (await c.call("session.context", {"sessionId": sid}))["messages"]]

        async def deleted(c: HostClient, sid: str) -> list[str]:
            return [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"] if m.get("deleted")]

        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"]) == ["a", "copy"]
            hits = await c.call("search.query", {"query": "text 1"})
            found = sorted((h["sessionId"], h["messageId"]) for h in hits["results"])
            assert found == [("a", "m1"), ("copy", "copy:m1")]
            for spelling in ("m1", "copy:m1"):
                around = await c.call("session.get", {"sessionId": "copy", "messageAround": spelling,
                                                      "messageLimit": 1})
                assert [m["id"] for m in around["messages"]] == ["m1"]
            await c.call("session.deleteMessage", {"sessionId": "copy", "messageId": "copy:m1"})
            await c.call("session.deleteMessage", {"sessionId": "copy", "messageId": "m2"})
            assert await context_ids(c, "copy") == ["m0"] and await deleted(c, "copy") == ["m1", "m2"]
            assert await context_ids(c, "a") == ["m0", "m1", "m2"] and await deleted(c, "a") == []
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert await context_ids(c, "copy") == ["m0"] and await deleted(c, "copy") == ["m1", "m2"]
            await c.call("session.restoreMessage", {"sessionId": "copy", "messageId": "m1"})
            assert await context_ids(c, "copy") == ["m0", "m1"] and await deleted(c, "copy") == ["m2"]
            assert await context_ids(c, "a") == ["m0", "m1", "m2"]
        # the transcript alone says the same: a rebuilt index agrees
        (tmp_path / "pi.sqlite").unlink()
        for side in ("pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / side).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert await context_ids(c, "copy") == ["m0", "m1"] and await deleted(c, "copy") == ["m2"]
            assert await deleted(c, "a") == []


async def test_every_method_takes_either_spelling_of_a_copied_transcript_s_messages(tmp_path: Path) -> None:
    """Search answers a copied transcript's messages in their index spelling ``copy:<id>``; the methods
    that find a message in the transcript took only the line's id (truncateFrom "c2:m2" was
    MESSAGE_NOT_FOUND: "regenerate from here" on a search hit failed)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "a"})
            for i in range(4):
                await c.call("session.appendMessage", {"sessionId": "a", "message": msg(
                    f"m{i}", f"text {i}", "user" if i % 2 == 0 else "assistant")})
        for copy in ("c1", "c2"):
            (tmp_path / "sessions" / f"{copy}.jsonl").write_bytes((tmp_path / "sessions" / "a.jsonl").read_bytes())
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            cut = await c.call("session.truncateFrom", {"sessionId": "c1", "messageId": "c1:m2",
                                                        "mode": "regenerate"})
            assert cut["removed"] == 2
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": "c1"}))["messages"]] == ["m0", "m1"]
            child = await c.call("session.fork", {"sessionId": "c2", "throughMessageId": "c2:m1"})
            assert len((await c.call("session.get", {"sessionId": child["id"]}))["messages"]) == 2
            edit = await c.call("session.assistantEdit", {"sessionId": "c2", "messageId": "c2:m3",
                                                          "blocks": [{"type": "text", "text": "edited"}]})
            got = await c.call("session.get", {"sessionId": edit["session"]["id"]})
            assert got["messages"][-1]["blocks"] == [{"type": "text", "text": "edited"}]
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": "a"}))["messages"]] == [
                "m0", "m1", "m2", "m3"]



async def test_a_foreign_line_before_the_writer_opens_takes_its_seq_and_the_append_the_next(tmp_path: Path) -> None:
    """Found by hand: after a restart (the session's writer not open yet) a line appended by hand, then
    an append: opening the writer caught the index up (the foreign line took seq 3), but the append had
    read its seq before (3 as well): it was acknowledged and in no read."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            for m in ("m1", "m2"):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(m, m)})
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert (await c.call("session.get", {"sessionId": "s1"}))["totalMessages"] == 2  # the actor starts
            foreign = {"type": "message", "id": "ext1", "role": "user", "blocks": [{"type": "text", "text": "by hand"}]}
            _append_by_hand(tmp_path / "sessions" / "s1.jsonl", json.dumps(foreign).encode() + b"\n")
            got = await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m3", "m3")})
            assert got["message"]["seq"] == 4
            page = await c.call("session.get", {"sessionId": "s1"})
            assert [(m["id"], m["seq"]) for m in page["messages"]] == [("m1", 1), ("m2", 2), ("ext1", 3), ("m3", 4)]
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            page = await c.call("session.get", {"sessionId": "s1"})
            assert [m["id"] for m in page["messages"]] == ["m1", "m2", "ext1", "m3"]
