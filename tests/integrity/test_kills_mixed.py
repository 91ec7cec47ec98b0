"""Issue 22: the DB writer killed at random while one session takes appends mixed with the other
line-writing methods (rename, update, deleteMessage, appendCompaction). The chaos tests before killed
with appends only; a line writer after a lost index op is what hid acknowledged messages for good."""

from __future__ import annotations

import random
from typing import Any

import trio

from runtime.client import HostClient, RpcError
from store.indexing.database import open_reader
from store.transcripts.transcript import read_transcript
from tests.hostkit import client_for, inprocess_host, msg

RETRIABLE = {"ACTOR_RESTARTED", "BUSY", "TIMEOUT"}


async def _until_done(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    while True:
        try:
            return await c.call(method, params)
        except RpcError as exc:
            assert exc.data_code in RETRIABLE, exc
            await trio.sleep(0.002)


async def test_acknowledged_appends_survive_db_writer_kills_between_line_writers(tmp_path) -> None:
    """Reproduces issue 22's vanishing message under chaos: with the DB writer killed at random while
    index ops are held, a rename / update / deleteMessage / compaction of the same session moved the
    mark over a lost append. Every acknowledged message must stay in every read, and the index must
    hold exactly the transcript's ids, before and after a restart."""
    rng = random.Random(22)
    root = tmp_path / "data"
    acked: list[str] = []
    kills = 0
    with trio.fail_after(90):
        async with inprocess_host(root, index_hold=0.05) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"sessionId": "mixed", "title": "t"}))["id"]
            done = trio.Event()

            async def killer() -> None:
                nonlocal kills
                while not done.is_set() and kills < 12:  # under the supervisor's restart intensity
                    await trio.sleep(rng.uniform(0.03, 0.12))
                    if host.kill_actor("db-writer"):
                        kills += 1

            async with trio.open_nursery() as n:
                n.start_soon(killer)
                i = 0
                while i < 60 or (kills < 5 and i < 600):  # the kills land where the machine's timing puts them
                    mid = f"m{i}"
                    await _until_done(c, "session.appendMessage", {
                        "sessionId": sid, "submissionId": f"sub-{mid}", "message": msg(mid, f"tok{i}x")})
                    acked.append(mid)
                    kind = rng.randrange(4)
                    if kind == 0:
                        await _until_done(c, "session.rename", {"sessionId": sid, "title": f"title {i}"})
                    elif kind == 1:
                        await _until_done(c, "session.update", {"sessionId": sid, "modelId": f"model-{i}"})
                    elif kind == 2:
                        await _until_done(c, "session.deleteMessage", {"sessionId": sid, "messageId": mid})
                    else:
                        await _until_done(c, "session.appendCompaction", {"sessionId": sid, "compaction": {
                            "id": f"c{i}", "summary": f"up to {mid}", "throughMessageId": mid, "tokensBefore": i}})
                    i += 1
                done.set()
            assert kills >= 5
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"]] == acked
            listed = {s["id"]: s for s in (await c.call("session.list", {"limit": 10}))["sessions"]}
            assert listed[sid]["messageCount"] == len(acked)
            path = host.config.data_dir.transcript(sid)
        file_ids = [m.id for m in read_transcript(path).messages]
        assert file_ids == acked
        async with inprocess_host(root) as host, client_for(host) as c:
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"]] == acked
        conn = open_reader(host.config.data_dir.db_path)
        try:
            rows = [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
        finally:
            conn.close()
        assert rows == acked
