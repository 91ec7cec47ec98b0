"""Read-your-writes with the index off the acknowledgement path (ARCHITECTURE.md "Read barriers").

An append is answered once its line is durable; its index rows commit later. A
property test: several writers append concurrently while the index is made slow
on purpose (each index op sleeps in the DB writer's thread), and after every
acknowledged append its writer reads at once — ``session.get`` must show the
message, ``session.list`` must count it, ``search.sessions`` must find its token.
Making the barrier a no-op (or dropping the session actor's own wait) fails it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.indexing import appends
from tests.hostkit import client_for, inprocess_host, msg

Plan = list[tuple[int, int]]  # per writer: (messages, batch size)


async def _get(c: Any, sid: str, last: dict[str, Any], token: str, problems: list[str]) -> None:
    got = await c.call("session.get", {"sessionId": sid, "messageLimit": 5})
    if got["messages"][-1]["id"] != last["id"] or got["totalMessages"] != last["seq"]:
        problems.append(f"session.get after {last['id']}: {got['messages'][-1]['id']}")


async def _listed(c: Any, sid: str, last: dict[str, Any], token: str, problems: list[str]) -> None:
    found = {s["id"]: s for s in (await c.call("session.list", {"limit": 500}))["sessions"]}
    if found.get(sid, {}).get("messageCount", 0) < last["seq"]:
        problems.append(f"session.list after {last['id']}: {found.get(sid)}")


async def _search(c: Any, sid: str, last: dict[str, Any], token: str, problems: list[str]) -> None:
    found = await c.call("search.sessions", {"query": token})
    hits = [(r["sessionId"], r["messageMatches"]) for r in found["results"]]
    if hits != [(sid, 1)]:
        problems.append(f"search.sessions after {last['id']}: {hits}")


async def _writer(host: Any, name: str, n: int, batch: int, problems: list[str]) -> None:
    async with client_for(host, name) as c:
        sid = (await c.call("session.create", {"sessionId": f"ryw-{name}", "title": name}))["id"]
        i = 0
        while i < n:
            chunk = list(range(i, min(n, i + batch)))
            calls = [("session.appendMessage", {"sessionId": sid, "message": msg(f"{name}-{k}", f"tok{name}x{k}q")})
                     for k in chunk]
            results = await (c.batch(calls) if len(calls) > 1 else c.pipelined(calls))
            last = results[-1]["message"]
            # each read right after the acknowledgement; which one comes first alternates
            reads = [_get, _listed, _search] if (i // batch) % 2 == 0 else [_search, _listed, _get]
            for read in reads:
                await read(c, sid, last, f"tok{name}x{chunk[-1]}q", problems)
            i += len(chunk)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 4)), min_size=2, max_size=4),
       delay_ms=st.integers(1, 15))
async def test_every_acknowledged_append_is_read_back_at_once(tmp_path_factory: pytest.TempPathFactory,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             plan: Plan, delay_ms: int) -> None:
    real = appends.index_written

    def slow_index(*args: Any, **kwargs: Any) -> Any:
        time.sleep(delay_ms / 1000)  # the DB writer's thread: the index trails the acknowledgements
        return real(*args, **kwargs)

    monkeypatch.setattr(appends, "index_written", slow_index)
    root = Path(tmp_path_factory.mktemp("ryw")) / "data"
    problems: list[str] = []
    with trio.fail_after(120):
        async with inprocess_host(root) as host:
            async with trio.open_nursery() as nursery:
                for w, (n, batch) in enumerate(plan):
                    nursery.start_soon(_writer, host, f"w{w}", n, batch, problems)
            lag = host.services.index_log.statistics()
    assert problems == []
    assert lag.max_lag_ops >= 1  # the index did trail the acknowledgements


async def test_index_rows_nobody_reads_are_held_and_a_read_ends_the_hold_at_once(tmp_path: Path) -> None:
    """With a hold far longer than the test may take, sequential appends share index commits,
    and each read that needs the index wakes the DB writer instead of waiting for the hold."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", index_hold=3600.0) as host, client_for(host, "hold") as c:
            writer = host.services.writer.current()
            assert writer is not None
            sid = (await c.call("session.create", {"sessionId": "held", "title": "held"}))["id"]
            await host.services.index_log.barrier()
            before = writer.statistics().batches
            for k in range(20):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"h{k}", f"tokhold{k}q")})
            lag = host.services.index_log.statistics()
            assert lag.lag_ops >= 1  # still held: nobody has read yet
            found = await c.call("search.sessions", {"query": "tokhold19q"})
            assert [r["sessionId"] for r in found["results"]] == [sid]
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1})
            assert got["totalMessages"] == 20
            assert writer.statistics().batches - before <= 3  # 20 index ops, not 20 transactions


async def _announced_reads(host: Any, sid: str, last: str, problems: list[str]) -> None:
    """Another client: on each ``session.message`` event, read the message back through the index at once."""
    async with client_for(host, "watcher") as r:
        await r.subscribe(["session.message"], session_id=sid)
        while True:
            event = await r.next_event()
            m = event.data["message"]
            found = await r.call("search.query", {"query": f"tok{m['id']}q"})
            listed = {s["id"]: s["messageCount"] for s in (await r.call("session.list", {}))["sessions"]}
            if [h["messageId"] for h in found["results"]] != [m["id"]] or listed.get(sid, 0) < m["seq"]:
                problems.append(f"after the event of {m['id']}: {found['results']}, {listed}")
            if m["id"] == last:
                return


async def test_another_connection_reads_an_append_once_it_is_acknowledged_or_announced(tmp_path: Path) -> None:
    """The barrier is host-wide, not the writer's: a read on another connection that arrives after an
    append's answer, or after its ``session.message`` event, sees it through the index (search, list,
    project counts), though the index rows are still held (``index_hold``: nobody else would commit them)."""
    problems: list[str] = []
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", index_hold=3600.0) as host, client_for(host, "writer") as c, \
                client_for(host, "reader") as r:
            sid = (await c.call("session.create", {"sessionId": "seen", "title": "seen", "projectPath": "/p/a"}))["id"]
            await host.services.index_log.barrier()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_announced_reads, host, sid, "e5", problems)
                await trio.testing.wait_all_tasks_blocked()
                for k in range(6):
                    answer = await c.call("session.appendMessage",
                                          {"sessionId": sid, "message": msg(f"e{k}", f"toke{k}q")})
                    assert host.services.index_log.statistics().lag_ops >= 1  # held: not in the index yet
                    found = await r.call("search.sessions", {"query": f"toke{k}q"})
                    assert [(s["sessionId"], s["messageMatches"]) for s in found["results"]] == [(sid, 1)]
                    listed = {s["id"]: s["messageCount"] for s in (await r.call("session.list", {}))["sessions"]}
                    assert listed[sid] == answer["message"]["seq"]
            moved = await c.call("session.update", {"sessionId": sid, "projectPath": "/p/b"})
            await c.call("sessions.trash", {"sessionId": sid})
            counts = {p["path"]: (p["sessionCount"], p["trashedSessionCount"])
                      for p in (await r.call("projects.list", {}))["projects"]}
            assert counts == {"/p/a": (0, 0), "/p/b": (0, 1)} and moved["projectPath"] == "/p/b"
            assert (await r.call("search.query", {"query": "toke"}))["results"] == []
            await c.call("sessions.restore", {"sessionId": sid})
            assert len((await r.call("search.query", {"query": "toke"}))["results"]) == 6
    assert problems == []
