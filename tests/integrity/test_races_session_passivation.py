"""Race audit (h44): requests racing a session actor's idle passivation. A request that reached the
mailbox as the idle timer fired was failed with ACTOR_RESTARTED ("stopped before replying") although
it never ran: passivation must be invisible to clients. The first test makes the race certain: the
session actor's idle work (reading the next page ahead) runs past the idle timeout while an append
arrives. The second keeps meeting it black-box: an idle timeout of a few milliseconds, two
connections' appends and a line writer."""

from __future__ import annotations

import random

import trio

from actors.session import SessionActor
from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host, msg


async def test_an_append_that_arrives_while_idle_work_outlasts_the_idle_timeout_is_answered(
        tmp_path, monkeypatch) -> None:
    read_ahead = SessionActor.on_idle
    started = trio.Event()

    async def slow_read_ahead(self: SessionActor) -> bool:
        started.set()
        await trio.sleep(0.5)  # the idle timer (0.2 s) fires meanwhile
        return await read_ahead(self)

    monkeypatch.setattr(SessionActor, "on_idle", slow_read_ahead)
    root = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(root, session_idle_timeout=0.2) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "ahead", "title": "t"})
            for i in range(4):
                await c.call("session.appendMessage", {"sessionId": "ahead", "message": msg(f"m{i}", f"text {i}")})
            page = await c.call("session.get", {"sessionId": "ahead", "messageEnd": 0, "messageLimit": 2})
            assert page["hasMoreAfter"]  # a forward page with more after it: the actor reads the next one ahead
            with trio.fail_after(5):
                await started.wait()
            await trio.sleep(0.05)
            answer = await c.call("session.appendMessage", {"sessionId": "ahead", "submissionId": "late",
                                                             "message": msg("m4", "text 4")})
            assert answer["message"]["seq"] == 5
            got = await c.call("session.get", {"sessionId": "ahead", "full": True})
            assert [m["id"] for m in got["messages"]] == [f"m{i}" for i in range(5)]


async def test_requests_meeting_the_idle_timeout_are_answered_not_failed(tmp_path) -> None:
    rng = random.Random(44)
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root, session_idle_timeout=0.002) as host, client_for(host) as a, \
                client_for(host, client_id="other") as b:
            sids = ["idle0", "idle1", "idle2", "idle3"]
            for sid in sids:
                await a.call("session.create", {"sessionId": sid, "title": sid})
            acked: dict[str, list[str]] = {sid: [] for sid in sids}

            async def appends(c: HostClient, sid: str) -> None:
                for i in range(120):
                    mid = f"{sid}-m{i}"
                    await c.call("session.appendMessage", {"sessionId": sid, "submissionId": f"s-{mid}",
                                                           "message": msg(mid, f"text {mid}")})
                    acked[sid].append(mid)
                    await trio.sleep(rng.uniform(0.0018, 0.0026))

            async def renames(c: HostClient, sid: str) -> None:
                for i in range(60):
                    await c.call("session.rename", {"sessionId": sid, "title": f"t{i}"})
                    await trio.sleep(rng.uniform(0.0015, 0.0045))

            async with trio.open_nursery() as n:
                for i, sid in enumerate(sids):
                    n.start_soon(appends, (a, b)[i % 2], sid)
                n.start_soon(renames, b, sids[0])
            for sid in sids:
                got = await a.call("session.get", {"sessionId": sid, "full": True})
                assert [m["id"] for m in got["messages"]] == acked[sid]
