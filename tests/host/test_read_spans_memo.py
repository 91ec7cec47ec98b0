"""A pooled reader keeps the window spans it read, for as long as the index does not change.

``session.get`` of a session without an actor (``sessions.get_direct`` -> ``windows.read_cold``) reads
the window's rows from the index in every call. A page read again while nothing was committed (a client
re-opening a session, the newest page read at each focus) takes them from the reader's memo, dated by
``PRAGMA data_version``: any commit of another connection (a tombstone, an append, a rename) makes the
next read run the statement again, in the same snapshot as the rest of its reply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from store.transcripts import windows
from tests.hostkit import client_for, inprocess_host, msg, passivate
from tests.turns.turnkit import new_session


def _count_window_statements(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    seen: list[tuple[str, int, int]] = []
    real = windows.index.window_spans

    def counted(conn: Any, sid: str, start: int, end: int) -> Any:
        seen.append((sid, start, end))
        return real(conn, sid, start, end)

    monkeypatch.setattr(windows.index, "window_spans", counted)
    return seen


async def test_a_page_read_again_with_the_index_unchanged_runs_no_window_statement(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(6):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
            await host.services.index_log.barrier()
            await passivate(host, sid)
            seen = _count_window_statements(monkeypatch)
            first = await c.call("session.get", {"sessionId": sid, "messageLimit": 4})
            statements = len(seen)
            assert statements >= 1
            for _ in range(5):
                assert await c.call("session.get", {"sessionId": sid, "messageLimit": 4}) == first
            assert host.registry.running(sid) is False
            # the pool lends its most recently returned reader: the same one, its memo valid
            assert len(seen) == statements
            # another window of the same session is a statement of its own
            older = await c.call("session.get", {"sessionId": sid, "messageLimit": 2, "messageBefore": 3})
            assert [m["id"] for m in older["messages"]] == ["m1", "m2"]
            assert len(seen) == statements + 1


async def test_a_commit_after_a_memoized_read_shows_in_the_next_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tombstone changes a row of the window without changing its bounds: the memo, dated by the index's
    version, is not used for the read after it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(4):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
            await host.services.index_log.barrier()
            await passivate(host, sid)
            seen = _count_window_statements(monkeypatch)
            before = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert before == await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert not any(m.get("deleted") for m in before["messages"])
            statements = len(seen)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "m2"})
            await host.services.index_log.barrier()
            await passivate(host, sid)
            after = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert host.registry.running(sid) is False
            assert len(seen) > statements
            assert [m["id"] for m in after["messages"] if m.get("deleted")] == ["m2"]
            assert after["totalMessages"] == before["totalMessages"] == 4


async def test_a_window_longer_than_the_memo_keeps_is_read_each_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo holds pages, not whole histories: a window over ``SPANS_MEMO_ROWS`` rows (3 here) runs its
    statement at every read, and answers the same."""
    monkeypatch.setattr(windows, "SPANS_MEMO_ROWS", 3)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(5):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
            await host.services.index_log.barrier()
            await passivate(host, sid)
            seen = _count_window_statements(monkeypatch)
            pages = [await c.call("session.get", {"sessionId": sid, "messageLimit": 4}) for _ in range(3)]
            assert len(seen) == 3 and pages[0] == pages[1] == pages[2]
            assert [m["id"] for m in pages[0]["messages"]] == ["m1", "m2", "m3", "m4"]
            short = [await c.call("session.get", {"sessionId": sid, "messageLimit": 3}) for _ in range(3)]
            assert len(seen) == 4 and short[0] == short[1] == short[2]
