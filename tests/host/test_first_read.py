"""The first ``session.get`` of a session on a host (or a new actor) that has not touched it yet.

A first read takes the session's row, checks the transcript against the index
and reads the newest page in one read-pool snapshot, and looks for the reply
streaming right now (the in-flight checkpoint) in the same worker-thread hop
(``runtime/handlers/sessions.get``, ``store/transcripts/windows.read_cold``).
What is behind the index is caught up first; each read connection has the
page read's statements prepared when it opens (``windows.prepare_reads``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import trio

from actors.db_reader import ReadPool
from runtime.client import ClientClosed, HostClient, open_client
from store.indexing.database import open_reader
from store.jsonio import dumps_line
from store.transcripts import windows
from store.transcripts.records import normalize_message
from tests.hostkit import client_for, inprocess_host, msg, passivate, start_host_process
from tests.turns.turnkit import assistant, new_session, start


def _ids(page: dict[str, Any]) -> list[str]:
    return [m["id"] for m in page["messages"]]



def _append_outside(path: Path, messages: list[dict[str, Any]]) -> None:
    """Lines written to the transcript the way the host writes them, while no host runs."""
    now = int(time.time() * 1000)
    with open(path, "ab") as fh:
        for m in messages:
            fh.write(dumps_line(normalize_message(m, now_ms=now)))


async def turn_and_metadata(c: HostClient, sid: str) -> None:
    """Turn t1 with a question and its answer, and thread metadata: a session with optional rows."""
    await start(c, sid, "t1")
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "question")})
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": assistant("a1", "answer")})
    await c.call("session.updateMetadata", {"sessionId": sid, "tags": ["x"]})


async def test_a_first_read_after_sigkill_sees_every_acknowledged_append(tmp_path: Path) -> None:
    """Appends are acknowledged once durable in the transcript, before their index rows commit; the
    host SIGKILLs itself at an index commit (``RT_CRASHPOINT``), so the index is behind the file. The
    next host's first read of the session (no actor, nothing in memory) answers every acknowledged
    message, in order, and the count covers them."""
    crashing = start_host_process(tmp_path, env={"RT_CRASHPOINT": "index.before_commit:2:kill"})
    acked: list[str] = []
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id="c") as c:
                sid = await new_session(c)
                for i in range(500):  # the host dies at its second index commit, long before
                    mid = f"m{i:03d}"
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, f"text {i}")})
                    acked.append(mid)
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
    assert crashing.proc.returncode == -9 and acked
    again = start_host_process(tmp_path)
    try:
        async with open_client(again.url, again.token, client_id="c") as c:
            page = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            total = page["totalMessages"]
            assert total in (len(acked), len(acked) + 1)  # + the one written but not acknowledged
            whole = await c.call("session.get", {"sessionId": sid, "full": True})
            assert _ids(whole)[: len(acked)] == acked
            assert _ids(page) == _ids(whole)[-50:]
    finally:
        again.terminate()
        again.proc.communicate(timeout=30)


async def test_a_first_read_of_a_transcript_that_grew_outside_the_index(tmp_path: Path) -> None:
    """Lines in the transcript that the index never saw (written while no host ran) are caught up
    before the first read answers: the newest page ends with them, the count includes them."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
        _append_outside(tmp_path / "sessions" / f"{sid}.jsonl", [msg(f"m{i}", f"written outside {i}") for i in (3, 4)])
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            page = await c.call("session.get", {"sessionId": sid, "messageLimit": 2})
            assert page["totalMessages"] == 5 and _ids(page) == ["m3", "m4"]
            assert page["messages"][-1]["blocks"][0]["text"] == "written outside 4"
            again = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert _ids(again) == ["m0", "m1", "m2", "m3", "m4"]


async def test_a_new_actors_first_read_shows_the_reply_streaming_and_not_after_it_landed(tmp_path: Path) -> None:
    """The first read of a new actor looks for the in-flight checkpoint in its one read hop: a reply
    that streams while the session's actor was passivated is in the page; once its final row landed,
    the next new actor's first read has none."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await start(c, sid, "t1")
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "question")})
            await c.call("session.saveInflightMessage",
                         {"sessionId": sid, "turnId": "t1", "message": assistant("a1", "partial answer")})
            await passivate(host, sid)
            page = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert _ids(page) == ["u1"]
            assert page["inflight"]["message"]["id"] == "a1"
            assert page["inflight"]["message"]["blocks"][0]["text"] == "partial answer"
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "final answer")})
            await passivate(host, sid)
            page = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert _ids(page) == ["u1", "a1"] and "inflight" not in page


class _Recording:
    """A read connection that notes the text of every statement run through it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.statements: set[str] = set()
        self.ran: list[str] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.statements.add(sql)
        self.ran.append(sql)
        return self._conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def test_prepare_reads_runs_every_statement_of_a_newest_page_read(tmp_path: Path) -> None:
    """What the read pool prepares on a new connection is what a first newest-page read runs (row,
    derived fields, thread metadata, compactions, spans, evicted marks, turns and their decisions),
    so no statement of it is parsed on a request; and it leaves no transaction open."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await turn_and_metadata(c, sid)
            await host.services.index_log.barrier()
    read = _Recording(open_reader(tmp_path / "pi.sqlite"))
    prepared = _Recording(open_reader(tmp_path / "pi.sqlite"))
    try:
        window = windows.read_cold(read, sid, tmp_path / "sessions" / f"{sid}.jsonl",  # type: ignore[arg-type]
                                   windows.WindowRequest(limit=50))
        assert window.plan_kind == "clean" and window.total == 2 and window.reply
        windows.prepare_reads(prepared)  # type: ignore[arg-type]
        assert read.statements - prepared.statements == set()
        assert not prepared.in_transaction
    finally:
        read._conn.close()
        prepared._conn.close()


async def test_a_first_read_runs_only_the_statements_of_rows_its_session_has(tmp_path: Path) -> None:
    """The session's row says, in the read's own snapshot, which of its optional rows exist (plan approvals,
    turns, thread metadata, compactions, evicted attachments): the newest page of a session with none of
    them is four statements (begin, the row, the window's spans, rollback), not ten; and a session with a
    turn and metadata is answered as a read that runs every statement answers it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            plain = await new_session(c)
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": plain, "message": msg(f"p{i}", f"text {i}")})
            busy = await new_session(c)
            await turn_and_metadata(c, busy)
            await host.services.index_log.barrier()
    conn = _Recording(open_reader(tmp_path / "pi.sqlite"))
    req = windows.WindowRequest(limit=50)
    try:
        window = windows.read_cold(conn, plain, tmp_path / "sessions" / f"{plain}.jsonl",  # type: ignore[arg-type]
                                   req)
        assert window.plan_kind == "clean" and window.total == 3
        assert len(conn.ran) == 4, conn.ran
        for sid in (plain, busy):
            path = tmp_path / "sessions" / f"{sid}.jsonl"
            cold = windows.read_cold(conn, sid, path, req)  # type: ignore[arg-type]
            assert cold.row is not None
            conn.execute("BEGIN")
            try:  # every statement, the derived fields read again (``present`` left at "every kind")
                full = windows.read_warm(conn, sid, path, cold.total, req, cold.row)  # type: ignore[arg-type]
            finally:
                conn.execute("ROLLBACK")
            assert orjson.loads(cold.reply) == orjson.loads(full.reply)
        page = orjson.loads(cold.reply)
        assert _ids(page) == ["u1", "a1"]
        assert page["session"]["thread"]["tags"] == ["x"] and page["session"]["latestTurn"]["id"] == "t1"
    finally:
        conn._conn.close()


async def test_the_read_pool_prepares_every_connection_it_opens(tmp_path: Path) -> None:
    """``ReadPool(prepare=...)`` runs on each connection as it is opened (at warm-up, and one opened
    on demand), before any read borrows it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path):
            pass
    seen: list[sqlite3.Connection] = []
    pool = ReadPool(tmp_path / "pi.sqlite", size=2, prepare=seen.append)
    try:
        with pool.borrow() as conn:  # opened on demand: prepared before it is lent
            assert seen == [conn]
        pool.warm()
        assert len(seen) == 2 and len({id(c) for c in seen}) == 2
        assert await pool.run(lambda conn: conn in seen)
    finally:
        pool.close()


async def test_boot_opens_a_few_read_connections_and_concurrent_reads_open_the_rest(tmp_path: Path) -> None:
    """Boot opens ``read_pool_warm`` connections, not the pool's size (each costs a connection, its PRAGMAs and the
    prepared page statements); reads one after another keep to them, and reads at the same time open more, up to
    the pool's size."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, read_pool_warm=2, read_pool_size=6) as host, client_for(host) as c:
            pool = host.services.reads
            assert pool.opened == 2
            sid = await new_session(c)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "text")})
            for _ in range(5):
                await c.call("session.get", {"sessionId": sid})
            assert pool.opened == 2
            together = threading.Barrier(6, timeout=20)

            def at_once(conn: sqlite3.Connection) -> int:
                together.wait()  # six reads hold a connection at the same moment
                return int(conn.execute("SELECT 1").fetchone()[0])

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(pool.run, at_once)
            assert pool.opened == 6


async def test_a_clean_first_read_opens_the_transcript_once(tmp_path: Path, monkeypatch: Any) -> None:
    """The clean check (size and header epoch against the index's mark) and the window's bytes share one
    descriptor: the transcript is opened once and not ``lstat``-ed (``open_transcript`` refuses a link or
    a non-regular file as the ``lstat`` did). A transcript that grew past the mark, one that is missing
    and a planted link are still told apart by ``plan_reconcile``, as before."""
    import os

    from store.errors import CorruptData

    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
            await host.services.index_log.barrier()
    path = tmp_path / "sessions" / f"{sid}.jsonl"
    conn = open_reader(tmp_path / "pi.sqlite")
    opened: list[str] = []
    looked: list[str] = []
    real_open, real_lstat = os.open, os.lstat

    def counting_open(p: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(p))
        return real_open(p, *args, **kwargs)

    def counting_lstat(p: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        looked.append(os.fspath(p))
        return real_lstat(p, *args, **kwargs)

    try:
        monkeypatch.setattr(os, "open", counting_open)
        monkeypatch.setattr(os, "lstat", counting_lstat)
        window = windows.read_cold(conn, sid, path, windows.WindowRequest(limit=50))
        monkeypatch.undo()
        assert window.plan_kind == "clean" and window.total == 3 and window.file_len == path.stat().st_size
        assert opened.count(str(path)) == 1 and str(path) not in looked
        assert [m["id"] for m in orjson.loads(window.reply)["messages"]] == ["m0", "m1", "m2"]
        _append_outside(path, [msg("m3", "written outside")])
        assert windows.read_cold(conn, sid, path, windows.WindowRequest(limit=50)).plan_kind == "tail"
        moved = path.with_name("elsewhere.jsonl")
        path.rename(moved)
        assert windows.read_cold(conn, sid, path, windows.WindowRequest(limit=50)).plan_kind == "missing"
        path.symlink_to(moved)
        try:
            windows.read_cold(conn, sid, path, windows.WindowRequest(limit=50))
        except CorruptData as exc:
            assert exc.data["reason"] == "not_a_regular_file"
        else:
            raise AssertionError("a planted link was read")
    finally:
        conn.close()
