"""The DB writer merges search index segments while idle; searches see the same results."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import trio

from runtime.datadir import DataDir
from store.indexing.database import open_reader
from store.search.search_upkeep import segment_count
from tests.hostkit import client_for, inprocess_host, msg

WORDS = ["alpha", "beta", "gamma", "delta", "the", "to", "of", "merge", "検索", "索引"]
QUERIES = ["the", "to the", "gam", "検索", "lta be"]


def _segments(root: Path) -> int | None:
    conn = open_reader(DataDir(root).db_path)
    try:
        return segment_count(conn)
    finally:
        conn.close()


async def _results(c: Any) -> list[Any]:
    out = []
    for q in QUERIES:
        out.append(await c.call("search.sessions", {"query": q, "limit": 100}))
        out.append(await c.call("search.query", {"query": q, "limit": 500}))
    return out


async def _upkeep_steps(c: Any) -> int:
    status = await c.call("host.status", {})
    return int(status["dbWriter"]["searchUpkeepSteps"])


async def test_idle_writer_merges_segments_without_changing_results(tmp_path: Path) -> None:
    rng = random.Random(3)
    with trio.fail_after(120):
        async with inprocess_host(tmp_path, search_upkeep_after=0.5) as host, client_for(host) as c:
            sessions = [(await c.call("session.create", {"title": f"s{i}"}))["id"] for i in range(4)]
            for i in range(160):  # one DB transaction each: many small FTS segments
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25)))
                await c.call("session.appendMessage",
                             {"sessionId": rng.choice(sessions), "message": msg(f"m{i}", text)})
                # a read that waits for the index ends the DB writer's hold: this append's rows commit
                # alone (held, the index ops of many appends would share one transaction and one segment)
                await c.call("session.list", {"limit": 1})
            before = await _results(c)
            fragmented = _segments(tmp_path)
            # wait for idle merges to start, then to finish (steps stop growing)
            steps = 0
            while steps == 0:
                await trio.sleep(0.2)
                steps = await _upkeep_steps(c)
            while True:
                await trio.sleep(1.0)
                now = await _upkeep_steps(c)
                if now == steps:
                    break
                steps = now
            merged = _segments(tmp_path)
            assert fragmented is not None and fragmented > 1 and merged == 1
            assert await _results(c) == before
            # writes after the merges are acknowledged and found at once
            await c.call("session.appendMessage", {"sessionId": sessions[0], "message": msg("late", "zebra 検索")})
            found = await c.call("search.query", {"query": "zebra"})
            assert [h["messageId"] for h in found["results"]] == ["late"]
