"""Issue 2's chaos test: kill the session actors and the DB-writer actor at random
points during a stream of appends. Afterwards every acknowledged append is in the
file and in the index exactly once, and the host keeps serving."""

from __future__ import annotations

import random
from collections import Counter

import trio
import trio.lowlevel

from runtime.client import HostClient, RpcError
from store.indexing.database import open_reader
from store.transcripts.transcript import read_transcript
from tests.hostkit import client_for, inprocess_host, msg

RETRIABLE = {"ACTOR_RESTARTED", "BUSY", "TIMEOUT"}
SESSIONS = 3
APPENDS = 40
KILLS = 12


async def _append_until_acked(c: HostClient, sid: str, mid: str, state: dict[str, int]) -> dict:
    params = {"sessionId": sid, "submissionId": f"sub-{mid}", "message": msg(mid, f"text of {mid}")}
    while True:
        state["in_flight"] += 1
        try:
            return await c.call("session.appendMessage", params)
        except RpcError as exc:
            assert exc.data_code in RETRIABLE, exc
            state["retries"] += 1
            await trio.sleep(0.005)
        finally:
            state["in_flight"] -= 1


async def test_acked_appends_survive_actor_kills_exactly_once(tmp_path) -> None:
    rng = random.Random(2024)
    acked: dict[str, dict[str, int]] = {}
    state = {"in_flight": 0, "retries": 0}
    kills: list[str] = []
    with trio.fail_after(120):
        async with inprocess_host(tmp_path) as host:
            sids = [f"kill{i}" for i in range(SESSIONS)]
            async with client_for(host, "setup") as c:
                for sid in sids:
                    await c.call("session.create", {"sessionId": sid})

            async def stream(sid: str) -> None:
                async with client_for(host, f"writer-{sid}") as c:
                    n = 0
                    while n < APPENDS or (len(kills) < KILLS and n < 50 * APPENDS):
                        mid = f"{sid}-m{n}"
                        n += 1
                        result = await _append_until_acked(c, sid, mid, state)
                        acked.setdefault(sid, {})[mid] = result["message"]["seq"]

            async def killer(done: trio.Event) -> None:
                targets = ["db-writer"] + [f"session:{sid}" for sid in sids]
                # writers keep appending until the last kill landed
                while len(kills) < KILLS and not done.is_set():
                    await trio.sleep(rng.uniform(0.005, 0.05))
                    # chaos timing: spin until some request is in flight, then strike at a random tick
                    while not state["in_flight"] and not done.is_set():  # noqa: ASYNC110
                        await trio.sleep(0.001)
                    for _ in range(rng.randrange(6)):  # a random await point inside the request
                        await trio.lowlevel.checkpoint()
                    target = "db-writer" if len(kills) % 3 == 0 else rng.choice(targets[1:])
                    if host.kill_actor(target):
                        kills.append(target)

            done = trio.Event()
            async with trio.open_nursery() as n:
                n.start_soon(killer, done)
                async with trio.open_nursery() as writers:
                    for sid in sids:
                        writers.start_soon(stream, sid)
                done.set()

            # the host keeps serving
            async with client_for(host, "after") as c:
                r = await c.call("session.appendMessage", {"sessionId": sids[0], "message": msg("after", "still here")})
                assert r["message"]["seq"] == len(acked[sids[0]]) + 1
                got = await c.call("session.get", {"sessionId": sids[0], "full": True})
                assert [m["id"] for m in got["messages"]][-1] == "after"
                status = await c.call("host.status", {})
                assert status["actors"]["restarts"] >= 1

            for sid in sids:
                transcript = await trio.to_thread.run_sync(read_transcript, tmp_path / "sessions" / f"{sid}.jsonl")
                file_ids = [m.id for m in transcript.messages]
                conn = open_reader(tmp_path / "pi.sqlite")
                try:
                    rows = conn.execute("SELECT id, seq FROM messages WHERE session_id = ? ORDER BY seq",
                                        (sid,)).fetchall()
                finally:
                    conn.close()
                index_ids = [r[0] for r in rows]
                want = acked[sid]
                assert len(want) >= APPENDS
                file_counts, index_counts = Counter(file_ids), Counter(index_ids)
                for mid, seq in want.items():
                    assert file_counts[mid] == 1, (sid, mid)
                    assert index_counts[mid] == 1, (sid, mid)
                    assert file_ids.index(mid) + 1 == seq, (sid, mid, seq)
                assert index_ids == file_ids
                assert [r[1] for r in rows] == list(range(1, len(rows) + 1))
                assert set(file_ids) - set(want) <= {"after"}
    assert len(kills) >= 10, kills
    assert state["retries"] >= 1  # some kills landed inside a request and the client retried it
    assert {k.split(":")[0] for k in kills} == {"db-writer", "session"}
