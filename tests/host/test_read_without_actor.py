"""``session.get`` of a session whose actor is not running: served without starting one.

The pipeline serves it from the request's own task in one read-pool hop
(``runtime/handlers/sessions.get_direct``: row, file check, window and in-flight
checkpoint in one snapshot), and hands it to the session actor as before when
that read cannot answer alone (a file past the index's mark or replaced, a reply
streaming, any error). These tests race that read against writes: an append on
the same connection, one acknowledged on another connection while the index
trails, and a rewrite landing in the middle of the read's worker-thread hop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from store.indexing import appends
from store.transcripts import transcript, windows
from tests.hostkit import client_for, inprocess_host, msg, passivate
from tests.turns.turnkit import new_session


def _ids(page: dict[str, Any]) -> list[str]:
    return [m["id"] for m in page["messages"]]



async def test_a_read_of_a_session_without_an_actor_starts_none_and_answers_as_the_actor_does(
        tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(5):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "cp1", "summary": "so far", "firstKeptMessageId": "m3", "throughMessageId": "m2",
                "tokensBefore": 10}})
            await host.services.index_log.barrier()
            await passivate(host, sid)
            direct = await c.call("session.get", {"sessionId": sid, "messageLimit": 3})
            assert host.registry.running(sid) is False
            assert _ids(direct) == ["m2", "m3", "m4"] and [cp["id"] for cp in direct["compactions"]] == ["cp1"]
            # a forward page goes to the actor (it reads the next page ahead): the same page from there
            await c.call("session.get", {"sessionId": sid, "messageEnd": 0, "messageLimit": 1})
            assert host.registry.running(sid) is True
            assert await c.call("session.get", {"sessionId": sid, "messageLimit": 3}) == direct


async def test_a_read_pipelined_behind_an_append_on_its_connection_sees_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Append then get in consecutive frames, the session's actor not running: the append starts the actor
    and waits in its mailbox (its write made slow), the get is ordered behind it there. Served without the
    actor, the read would not have waited for it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "first")})
            await host.services.index_log.barrier()
            await passivate(host, sid)
            real = transcript.TranscriptWriter.append

            def slow_append(self: Any, lines: Any) -> Any:
                time.sleep(0.2)  # the actor's worker thread: the read is dispatched meanwhile
                return real(self, lines)

            monkeypatch.setattr(transcript.TranscriptWriter, "append", slow_append)
            _, page = await c.pipelined([
                ("session.appendMessage", {"sessionId": sid, "message": msg("m1", "second")}),
                ("session.get", {"sessionId": sid, "messageLimit": 50}),
            ])
            assert _ids(page) == ["m0", "m1"] and page["totalMessages"] == 2


async def test_a_read_after_an_append_acknowledged_elsewhere_sees_it_while_the_index_trails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append is acknowledged once durable, before its index rows commit (made slow here). Its actor
    passivates at once; another connection's read, served without an actor, finds the transcript past
    the index's mark and hands the read to a new actor, which catches the index up first."""
    real = appends.index_written

    def slow_index(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)  # the DB writer's thread: the index trails the acknowledgement
        return real(*args, **kwargs)

    served_alone: list[bool] = []
    real_cold = windows.read_cold

    def noting_cold(conn: Any, sid: str, *args: Any, **kwargs: Any) -> Any:
        served_alone.append(not host.registry.running(sid))
        return real_cold(conn, sid, *args, **kwargs)

    monkeypatch.setattr(windows, "read_cold", noting_cold)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "writer") as w, \
                client_for(host, "reader") as r:
            sid = await new_session(w)
            await w.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "first")})
            await host.services.index_log.barrier()
            monkeypatch.setattr(appends, "index_written", slow_index)
            await w.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "acknowledged")})
            assert host.services.index_log.covered_seq < host.services.index_log.acknowledged
            await passivate(host, sid)
            served_alone.clear()
            page = await r.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert _ids(page) == ["m0", "m1"] and page["totalMessages"] == 2
            assert served_alone[:1] == [True]  # the read without an actor ran (and found the file ahead)


@pytest.mark.parametrize("point", ["before_the_file_check", "after_the_file_check"])
async def test_a_rewrite_landing_inside_a_read_without_an_actor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                point: str) -> None:
    """A ``session.truncateFrom`` (the transcript replaced by a rename, its index rows moved in one
    commit) runs to its answer while the read's worker thread is paused inside its snapshot: before
    the transcript is opened and checked, or after (its lines and the compaction's are still to be
    read). The read answers one whole state, never an error or a mix: checked before the rewrite, the
    old one (its descriptor is the file its snapshot describes, compaction lines included); opened
    after it, the check finds the file replaced and the actor reads the new one."""
    token = trio.lowlevel.current_trio_token()
    paused: list[bool] = []
    rewrite: Any = None

    def pause_once() -> None:
        if not paused:
            paused.append(True)
            trio.from_thread.run(rewrite, trio_token=token)

    real_open, real_warm = windows.open_transcript, windows.read_warm

    def opening(path: Any) -> int:
        if point == "before_the_file_check":
            pause_once()
        return real_open(path)

    def reading(*args: Any, **kwargs: Any) -> Any:
        if point == "after_the_file_check":
            pause_once()
        return real_warm(*args, **kwargs)

    old_ids, new_ids = ["u0", "a0", "u1", "a1", "u2", "a2"], ["u0", "a0", "u1", "a1"]
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "reader") as r, \
                client_for(host, "writer") as w:
            sid = await new_session(w)
            for i in range(3):
                await w.call("session.appendMessage", {"sessionId": sid, "message": msg(f"u{i}", f"question {i}")})
                await w.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    f"a{i}", f"answer {i} " + "x" * 200, role="assistant")})
            await w.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "cp1", "summary": "the first exchange", "firstKeptMessageId": "u1",
                "throughMessageId": "a0", "tokensBefore": 10}})
            await host.services.index_log.barrier()
            await passivate(host, sid)

            async def truncate() -> None:
                await w.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2", "mode": "edit"})

            rewrite = truncate
            monkeypatch.setattr(windows, "open_transcript", opening)
            monkeypatch.setattr(windows, "read_warm", reading)
            page = await r.call("session.get", {"sessionId": sid, "messageLimit": 50})
            monkeypatch.undo()
            assert paused == [True]
            after = await r.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert _ids(after) == new_ids and after["totalMessages"] == 4
            # checked before the rewrite: the state its snapshot and its descriptor hold (nothing read again);
            # the file replaced before its check: the actor's read, after the rewrite
            expected = old_ids if point == "after_the_file_check" else new_ids
            assert _ids(page) == expected and page["totalMessages"] == len(expected)
            assert [cp["id"] for cp in page["compactions"]] == ["cp1"]
            assert page["compactions"][0]["summary"] == "the first exchange"
            assert page["messages"][-1]["blocks"][0]["text"].startswith(f"answer {len(expected) // 2 - 1}")
