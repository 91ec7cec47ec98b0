"""Race audit (h44): more sessions in use than ``max_sessions_active``. Each session that a request
touches gets an actor; idle ones passivate only after ``session_idle_timeout``. Reaching the bound
refused every request to any other session with ``BUSY`` until an actor timed out (minutes), even
though every running actor was idle: a fork's new child could not be read, an append to another
session failed. An idle actor now passivates early to make room; only actors that are all working
refuse a new session."""

from __future__ import annotations

import trio

from tests.hostkit import client_for, inprocess_host, msg


async def test_sessions_beyond_the_active_bound_are_served_while_the_others_are_idle(tmp_path) -> None:
    root = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(root, max_sessions_active=3) as host, client_for(host) as a, \
                client_for(host, client_id="other") as b:
            sids = [f"cap{i}" for i in range(8)]
            for sid in sids:
                await a.call("session.create", {"sessionId": sid, "title": sid})
            acked: dict[str, list[str]] = {sid: [] for sid in sids}

            async def stream(c, sid: str) -> None:
                for i in range(4):
                    mid = f"{sid}-m{i}"
                    await c.call("session.appendMessage", {"sessionId": sid, "submissionId": f"s-{mid}",
                                                           "message": msg(mid, f"text {mid}")})
                    acked[sid].append(mid)

            async with trio.open_nursery() as n:  # two connections, eight sessions, three actor slots
                for i, sid in enumerate(sids):
                    n.start_soon(stream, a if i % 2 else b, sid)
            child = await b.call("session.fork", {"sessionId": sids[0]})
            got = await a.call("session.get", {"sessionId": child["id"], "full": True})
            assert [m["blocks"] for m in got["messages"]] == [
                [{"type": "text", "text": f"text {mid}"}] for mid in acked[sids[0]]]
            for sid in sids:
                got = await b.call("session.get", {"sessionId": sid, "full": True})
                assert [m["id"] for m in got["messages"]] == acked[sid]
            listed = {s["id"]: s["messageCount"] for s in (await a.call("session.list", {"limit": 50}))["sessions"]}
            assert listed == {**{sid: 4 for sid in sids}, child["id"]: 4}
