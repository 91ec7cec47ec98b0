"""The wall clock steps (NTP, a restored snapshot, a user fixing the date, a clock a year ahead corrected).

Full in-process hosts on a settable wall clock (``SetClock``, the host's injected ``now_ms``): the clock
is stepped back by an hour / a day / a year or forward by a year, within a run or while the host is
down. What must hold whatever the clock does: reads keep the order things were written in, nothing
acknowledged drops out of a read, a retry has one effect, and nothing is run twice or never.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from runtime.client import HostClient
from tests.hostkit import client_for, msg
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import BASE, DAY, HOUR, MINUTE
from tests.turns.turnkit import end, new_session, start

YEAR = 365 * DAY
BACK_STEPS = [pytest.param(HOUR, id="hour"), pytest.param(DAY, id="day"), pytest.param(YEAR, id="year")]
STEPS = [*BACK_STEPS, pytest.param(-YEAR, id="year-forward")]


async def finished_turn(c: HostClient, sid: str, tid: str) -> dict[str, object]:
    await start(c, sid, tid)
    return await end(c, sid, tid)


# --------------------------------------------------------------------------- transcripts


@pytest.mark.parametrize("step", STEPS)
async def test_messages_read_in_written_order_across_a_step_within_a_run_and_a_restart(
        tmp_path: Path, step: int) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"a{i}", f"before {i}")})
            clock.ms -= step
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"b{i}", f"after {i}")})
        clock.ms -= step
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("c0", "after restart")})
            want = ["a0", "a1", "a2", "b0", "b1", "b2", "c0"]
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == want
            newest = await c.call("session.get", {"sessionId": sid, "messageLimit": 2})
            assert [m["id"] for m in newest["messages"]] == want[-2:]


# --------------------------------------------------------------------------- notifications


@pytest.mark.parametrize("step", BACK_STEPS)
async def test_a_notification_written_after_the_clock_went_back_is_listed_first(tmp_path: Path, step: int) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            sid = await new_session(c)
            await finished_turn(c, sid, "t1")
            clock.ms += MINUTE
            await finished_turn(c, sid, "t2")
            clock.ms -= step
            await finished_turn(c, sid, "t3")
            listed = await c.call("notifications.list", {})
            assert [n["turnId"] for n in listed["notifications"]] == ["t3", "t2", "t1"]
            page = await c.call("notifications.list", {"limit": 1})
            rest = await c.call("notifications.list", {"limit": 5, "cursor": page["nextCursor"]})
            assert [n["turnId"] for n in page["notifications"] + rest["notifications"]] == ["t3", "t2", "t1"]
        clock.ms -= step  # and again while the host is down
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            await finished_turn(c, sid, "t4")
            listed = await c.call("notifications.list", {})
            assert [n["turnId"] for n in listed["notifications"]] == ["t4", "t3", "t2", "t1"]


async def test_the_newest_200_cap_keeps_an_acknowledged_notification_after_the_clock_went_back(
        tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(120):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(200):
                clock.ms += 1
                await finished_turn(c, sid, f"old{i}")
            clock.ms -= DAY
            done = await finished_turn(c, sid, "fresh")
            assert done["notification"]["turnId"] == "fresh"  # acknowledged as kept ...
            listed = await c.call("notifications.list", {"limit": 1})
            assert [n["turnId"] for n in listed["notifications"]] == ["fresh"]  # ... and it is the newest
            assert listed["unreadCount"] == 200
