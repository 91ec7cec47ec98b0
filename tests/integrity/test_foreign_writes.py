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
