"""Issue 22, item 1: nothing acknowledged disappears from a read — one owner for the index mark.

Each test reproduces a way an acknowledged message vanished from every read (or the read
barrier opened over it) on the code before the fix; its docstring names the reproduction.
"""

from __future__ import annotations

import sqlite3

import pytest
import trio

from store.transcripts.transcript import TranscriptWriter
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg

from .kit import visible, when_durable


async def test_db_writer_killed_after_rename_line_keeps_the_held_append(tmp_path, monkeypatch) -> None:
    """Reproduces issue 22: index ops held (``index_hold``), append m1, ``session.rename``, the DB writer
    killed right after the rename's ``session_info`` line is durable → the rename moved the index mark
    over m1's lost index op: session.get ``[]``, search 0 hits, messageCount 0, and after a restart boot
    called the session clean. Now m1 stays in every read, before and after a restart."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root, index_hold=3600.0) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"sessionId": "s1", "title": "t"}))["id"]
            await index_caught_up(host)

            async def kill_writer() -> None:
                assert host.kill_actor("db-writer")

            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "tokheldone")})
            with when_durable(monkeypatch, b'"session_info"', kill_writer) as fired:
                renamed = await c.call("session.rename", {"sessionId": sid, "title": "renamed"})
            assert fired and renamed["title"] == "renamed"
            seen = await visible(c, sid, "m1", "tokheldone")
            assert seen == {"get": ["m1"], "total": 1, "listed": 1, "search": ["m1"]}
        async with inprocess_host(root) as host, client_for(host) as c:
            seen = await visible(c, sid, "m1", "tokheldone")
            assert seen == {"get": ["m1"], "total": 1, "listed": 1, "search": ["m1"]}
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["title"] == "renamed"


@pytest.mark.parametrize("method", ["session.update", "session.deleteMessage"])
async def test_batch_failing_whole_then_a_line_writer_of_the_same_session(tmp_path, monkeypatch,
                                                                          method: str) -> None:
    """Reproduces issue 22: the batch holding an append's index op fails whole
    (``RT_CRASHPOINT=index.before_commit:N:enospc``), then ``session.update`` / ``session.deleteMessage``
    of the same session, already past its poison check, moved the mark over the append: it was hidden
    for good. Now the append stays visible (and the tombstone / settings apply too)."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root, index_hold=3600.0) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"sessionId": "s2", "title": "t"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "tokzero")})
            await index_caught_up(host)
            faults = host.faults
            faults.add("index.before_commit", faults.hits("index.before_commit") + 1, "enospc")
            writer = host.services.writer
            actor = writer.current()
            assert actor is not None
            before = actor.stats.failed_commits

            async def fail_held_batch() -> None:
                # end the hold: the batch holding m1's index op runs and fails whole (a deleteMessage
                # already made it run: its read of the message waited for the index)
                writer.wake()
                with trio.move_on_after(5):  # bounded: the session actor's thread waits for this
                    while actor.stats.failed_commits == before:  # noqa: ASYNC110 - a counter, no event to wait on
                        await trio.sleep(0.001)
                    await trio.sleep(0.01)  # its replies (the failure) are delivered

            marker = b'"session_info"' if method == "session.update" else b'"tombstone"'
            second = ({"sessionId": sid, "modelId": "model-2"} if method == "session.update"
                      else {"sessionId": sid, "messageId": "m0"})
            with when_durable(monkeypatch, marker, fail_held_batch) as fired:
                results = await c.pipelined([
                    ("session.appendMessage", {"sessionId": sid, "message": msg("m1", "tokfailedbatch")}),
                    (method, second)])
            assert fired and results[0]["message"]["seq"] == 2
            assert actor.stats.failed_commits == before + 1
            seen = await visible(c, sid, "m1", "tokfailedbatch")
            assert seen == {"get": ["m0", "m1"], "total": 2, "listed": 2, "search": ["m1"]}
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            if method == "session.update":
                assert got["session"]["modelId"] == "model-2"
            else:
                assert [m.get("deleted", False) for m in got["messages"]] == [True, False]
            assert host.services.index_log.statistics().failed_ops >= 1
        async with inprocess_host(root) as host, client_for(host) as c:
            seen = await visible(c, sid, "m1", "tokfailedbatch")
            assert seen == {"get": ["m0", "m1"], "total": 2, "listed": 2, "search": ["m1"]}


async def test_failed_index_op_does_not_open_the_read_barrier(tmp_path) -> None:
    """Reproduces issue 22: ``IndexLog.settle`` took a failed index op as covered, so the read barrier
    opened and ``search.*`` / ``session.list`` missed an acknowledged append (messageCount 1 for 2
    acknowledged) until something touched that session. Now the failed op queues a repair and reads
    wait for it: both appends are counted and found."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"sessionId": "s3", "title": "t"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "tokfirst")})
            await index_caught_up(host)
            faults = host.faults
            faults.add("index.before_commit", faults.hits("index.before_commit") + 1, "enospc")
            acked = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m2", "toksecond")})
            assert acked["message"]["seq"] == 2
            async with client_for(host, "reader") as r:  # another connection: only the barrier orders it
                listed = {s["id"]: s for s in (await r.call("session.list", {"limit": 50}))["sessions"]}
                assert listed[sid]["messageCount"] == 2
                found = await r.call("search.query", {"query": "toksecond"})
                assert [h["messageId"] for h in found["results"]] == ["m2"]
            stats = host.services.index_log.statistics()
            assert stats.failed_ops == 1 and stats.repairs >= 1 and stats.covered == stats.acknowledged


async def test_boot_reindexes_lines_a_mark_was_moved_over(tmp_path) -> None:
    """Reproduces issue 22: after a mark was moved over unindexed lines, boot saw mark == file length,
    called the session clean, and the lines stayed invisible for good. Now boot checks the clean verdict
    against the file (its last message line must have its row) and reindexes the session."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"sessionId": "s4", "title": "t"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "tokone")})
            path = host.config.data_dir.transcript(sid)
            db_path = host.config.data_dir.db_path
        # what the old handlers left behind: a message line in the file, the mark moved over it
        # by a later line's plain UPDATE, no row for it
        writer = TranscriptWriter.open(path)
        try:
            line = b'{"type":"message","id":"m2","role":"user","blocks":[{"type":"text","text":"toklost"}]}\n'
            writer.append([line, b'{"type":"session_info","title":"t"}\n'])
            end = writer.length
        finally:
            writer.close()
        conn = sqlite3.connect(db_path)
        with conn:
            conn.execute("UPDATE sessions SET indexed_len = ? WHERE id = ?", (end, sid))
        conn.close()
        async with inprocess_host(root) as host, client_for(host) as c:
            seen = await visible(c, sid, "m2", "toklost")
            assert seen == {"get": ["m1", "m2"], "total": 2, "listed": 2, "search": ["m2"]}
            assert host.boot.report["reconcile"]["markBehindFile"] == 1
        async with inprocess_host(root) as host:
            assert host.boot.report["reconcile"]["markBehindFile"] == 0  # repaired for good: clean now
