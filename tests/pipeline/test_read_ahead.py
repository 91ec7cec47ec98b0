"""Forward ``session.get`` pages read ahead by the session actor (issue 26 item 5: a whole history over
WebSocket read page by page waited for the host to build page N+1 only once the client asked for it).

The page after a forward page with more after it is read while the actor's mailbox is empty and offered to
the next call only; it is taken only for exactly that page and only if nothing changed since it was read:
no line written by the actor, no SQLite commit that could change the session's rows (its commit
generation at the DB writer: other sessions' index ops and the writer's idle search-index merge change
nothing a page reads and do not count). Every page a client gets is the
page a fresh read would give; ``ReadAhead.gave_up`` says why a read-ahead was not taken.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from actors.session import ReadAhead
from runtime.host import RunningHost
from store.rules import READ_AHEAD_SECONDS
from tests.hostkit import client_for, inprocess_host, msg

N = 40
PAGE = 10


def _read_ahead(host: RunningHost) -> ReadAhead:
    stats: ReadAhead = host.services.sessions._deps.read_ahead
    return stats


async def _until(done: Callable[[], bool]) -> None:
    for _ in range(2000):
        if done():
            return
        await trio.sleep(0.005)
    raise AssertionError("not within 10 s")


async def _wait_read(host: RunningHost, reads: int) -> None:
    """Until the actor has read ahead ``reads`` pages in all (it does so as soon as its mailbox is empty)."""
    await _until(lambda: _read_ahead(host).reads >= reads)


async def _session(c: Any, n: int = N) -> str:
    sid = str((await c.call("session.create", {"title": "pages"}))["id"])
    await c.batch([("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
                   for i in range(n)])
    return sid


def _page(sid: str, end: int) -> dict[str, Any]:
    return {"sessionId": sid, "messageEnd": end, "messageLimit": PAGE, "maxBytes": 1 << 20}


async def _second_page_is_the_one_read_ahead(c: Any, stats: ReadAhead, sid: str, first: dict[str, Any],
                                             whole: dict[str, Any]) -> None:
    """The page after ``first`` is taken from the read-ahead (not stale) and is what a fresh read gives."""
    taken = stats.taken
    second = await c.call("session.get", _page(sid, first["messageEnd"]))
    assert stats.taken == taken + 1, stats.gave_up
    assert "stale_commit" not in stats.gave_up
    assert second["messages"] == whole["messages"][PAGE:2 * PAGE]
    assert second["session"] == whole["session"] and second["totalMessages"] == N


async def test_forward_pages_are_read_ahead_and_are_the_pages_a_fresh_read_gives(tmp_path: Path) -> None:
    """Reproduces the wait of issue 26 item 5: with nothing written meanwhile, each forward page after the
    first is the one read ahead (taken) and no read-ahead is given up; the pages together are exactly the
    session's messages, equal to one whole read."""
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        sid = await _session(c)
        whole = await c.call("session.get", {"sessionId": sid, "messageLimit": N})
        stats = _read_ahead(host)
        before = stats.taken
        pages: list[dict[str, Any]] = []
        end = 0
        while True:
            # Counted before the call: the read-ahead of the next page may end before this reply is decoded
            # (counted after it, the test waited for a read that had already happened while the page expired).
            reads = stats.reads
            page = await c.call("session.get", _page(sid, end))
            pages.append(page)
            end = page["messageEnd"]
            if not page["hasMoreAfter"]:
                break
            await _wait_read(host, reads + 1)
        assert len(pages) == N // PAGE
        assert stats.taken - before == len(pages) - 1, stats.gave_up
        assert stats.gave_up == {}
        assert [m for p in pages for m in p["messages"]] == whole["messages"]
        assert all(p["session"] == whole["session"] and p["totalMessages"] == N for p in pages)
        await _until(lambda: _read_ahead(host).held == 0)  # the last page has nothing after it: nothing held


async def test_a_page_read_ahead_is_not_taken_after_any_commit(tmp_path: Path) -> None:
    """A commit by someone else (here a turn row the session's summary projects as ``latestTurn``) between
    the read-ahead and the next call: the page is read again and shows the change."""
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        sid = await _session(c)
        first = await c.call("session.get", _page(sid, 0))
        assert "latestTurn" not in first["session"]
        await _wait_read(host, 1)
        taken = _read_ahead(host).taken

        def add_turn(conn: Any) -> None:
            conn.execute("INSERT INTO turns (id, session_id, status, started_at) VALUES ('t-1', ?, 'running', 1)",
                         (sid,))

        await host.services.db.write(add_turn, durable=True)
        second = await c.call("session.get", _page(sid, first["messageEnd"]))
        assert _read_ahead(host).taken == taken
        assert _read_ahead(host).gave_up.get("stale_commit") == 1
        assert second["session"]["latestTurn"] == {"id": "t-1", "status": "running"}
        assert [m["id"] for m in second["messages"]] == [f"m{i}" for i in range(PAGE, 2 * PAGE)]


async def test_a_page_read_ahead_is_offered_to_the_next_call_only(tmp_path: Path) -> None:
    """Another call first (an append, which moves the end of the session): the page read ahead is dropped,
    not kept for a later read, and the next page is read fresh (its totals count the new message)."""
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        sid = await _session(c)
        first = await c.call("session.get", _page(sid, 0))
        await _wait_read(host, 1)
        taken = _read_ahead(host).taken
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("late", "late")})
        assert _read_ahead(host).held == 0
        assert _read_ahead(host).gave_up.get("other_call") == 1
        second = await c.call("session.get", _page(sid, first["messageEnd"]))
        assert _read_ahead(host).taken == taken
        assert second["totalMessages"] == N + 1


async def test_a_page_read_ahead_is_dropped_when_nobody_asks_for_it(tmp_path: Path) -> None:
    """A client that stops after one page: the page read ahead leaves the host-wide bound after
    ``READ_AHEAD_SECONDS``; a page that does not fit the bound is not read ahead at all."""
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        sid = await _session(c)
        await c.call("session.get", _page(sid, 0))
        await _wait_read(host, 1)
        assert _read_ahead(host).held > 0
        t0 = trio.current_time()
        await _until(lambda: _read_ahead(host).held == 0)
        assert trio.current_time() - t0 >= READ_AHEAD_SECONDS / 2  # held for a while, then dropped
        assert _read_ahead(host).gave_up == {"expired": 1}
        _read_ahead(host).limit = 100  # smaller than any page
        reads = _read_ahead(host).reads
        await c.call("session.get", _page(sid, 0))
        await _until(lambda: "bound" in _read_ahead(host).gave_up)
        assert _read_ahead(host).reads == reads and _read_ahead(host).held == 0
        assert _read_ahead(host).gave_up == {"expired": 1, "bound": 1}


async def test_a_search_index_merge_does_not_make_a_page_read_ahead_stale(tmp_path: Path) -> None:
    """Reproduces a read-ahead given up under load: the DB writer's idle search-index merge (``upkeep``,
    2 s after its last batch) committed between the read-ahead and the next call, and every commit made a
    held page stale, though a merge changes nothing a page reads. Now the page is taken across it, and it
    is the page a fresh read gives."""
    async with inprocess_host(tmp_path, search_upkeep_after=0.3) as host, client_for(host) as c:
        stats = _read_ahead(host)
        stats.seconds = 60.0  # held until asked: the test does not depend on the machine's speed
        host.faults.enabled = True  # count fault-point hits (no rule is armed: nothing fires)
        sid = await _session(c)
        whole = await c.call("session.get", {"sessionId": sid, "messageLimit": N})
        for _ in range(10):
            # A batch, then the writer is idle: its next upkeep commits 0.3 s later, after the read-ahead.
            await host.services.db.write(lambda conn: None, durable=False)
            upkeeps = host.faults.hits("upkeep.after_commit")
            reads = stats.reads
            first = await c.call("session.get", _page(sid, 0))
            await _wait_read(host, reads + 1)
            if host.faults.hits("upkeep.after_commit") == upkeeps:
                break  # read ahead before the upkeep (else the machine was slower than 0.3 s: again)
        else:
            raise AssertionError("every read-ahead came after the writer's upkeep")
        await _until(lambda: host.faults.hits("upkeep.after_commit") > upkeeps)
        await _second_page_is_the_one_read_ahead(c, stats, sid, first, whole)


async def test_another_sessions_appends_do_not_make_a_page_read_ahead_stale(tmp_path: Path) -> None:
    """Reproduces the give-ups of a client paging while others write: every index commit of any session
    moved the one commit generation, so a held page was stale after any other session's append. Now the
    check is per session (``GroupStats.generation_of``): other sessions' appends, indexed and committed in
    between, leave the held page taken, and it is the page a fresh read gives."""
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        stats = _read_ahead(host)
        stats.seconds = 60.0  # held until asked: the test does not depend on the machine's speed
        sid = await _session(c)
        other = await _session(c, 3)
        whole = await c.call("session.get", {"sessionId": sid, "messageLimit": N})
        reads = stats.reads
        first = await c.call("session.get", _page(sid, 0))
        await _wait_read(host, reads + 1)
        generation_of = host.services.sessions._deps.db_generation
        db = generation_of.__self__  # the DB writer's GroupStats
        before = (db.generation, generation_of(sid))
        for i in range(5):
            await c.call("session.appendMessage", {"sessionId": other, "message": msg(f"o{i}", f"other {i}")})
        await host.services.index_log.barrier()  # the other session's index rows committed meanwhile
        assert db.generation > before[0] and generation_of(sid) == before[1]
        await _second_page_is_the_one_read_ahead(c, stats, sid, first, whole)
