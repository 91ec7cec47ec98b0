"""The wall clock steps (NTP, a restored snapshot, a user fixing the date, a clock a year ahead corrected).

Full in-process hosts on a settable wall clock (``SetClock``, the host's injected ``now_ms``): the clock
is stepped back by an hour / a day / a year or forward by a year, within a run or while the host is
down. What must hold whatever the clock does: reads keep the order things were written in, nothing
acknowledged drops out of a read, a retry has one effect, and nothing is run twice or never.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import trio

from actors.scheduler import SchedulerStatus, Tick
from runtime.client import HostClient
from runtime.datadir import DataDir
from runtime.host import RunningHost
from store import tasks
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
# --------------------------------------------------------------------------- scheduled tasks


def tick(host: RunningHost) -> None:
    assert host.scheduler is not None
    host.scheduler.tell_nowait(Tick())


async def next_due(host: RunningHost) -> int | None:
    assert host.scheduler is not None
    status = await host.scheduler.ask(SchedulerStatus())
    return None if status["nextDueAt"] is None else int(status["nextDueAt"])


async def fired(c: HostClient) -> dict[str, object]:
    """The next ``task.due`` event's data."""
    with trio.fail_after(10):
        while True:
            ev = await c.next_event()
            if ev.topic == "task.due":
                return dict(ev.data)


async def runs_of(c: HostClient, task_id: str) -> list[dict[str, object]]:
    return list((await c.call("tasks.runs", {"taskId": task_id}))["runs"])


CADENCES = [pytest.param("hourly", {"schedule": {"hour": 0, "minute": 0}}, HOUR, id="hourly"),  # §4.11: armed by it
            pytest.param("daily", {"schedule": {"hour": 9, "minute": 0}}, DAY, id="daily")]


@pytest.mark.parametrize("step", BACK_STEPS)
@pytest.mark.parametrize(("cadence", "config", "period"), CADENCES)
async def test_a_task_that_ran_on_a_clock_ahead_runs_again_one_period_after_the_correction(
        tmp_path: Path, step: int, cadence: str, config: dict[str, object], period: int) -> None:
    """The clock was ``step`` ahead when the task fired (at the slot's time on that clock); it is
    corrected while the host is down. The task does not fire again at once (its slot ran), and its
    next run comes at most a period late (not ``step`` later: a year ahead, a year without a run)."""
    ahead = BASE + step
    clock = SetClock(ahead - MINUTE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"], cursor=0)
            created = await c.call("tasks.create", {"taskId": "t", "title": "Digest", "prompt": "Summarize",
                                                    "cadence": cadence, "config": config})
            slot = tasks.next_run_at(cadence, config, clock.ms)
            assert slot is not None and created["nextRunAt"] == tasks.rfc3339(slot)
            clock.ms = slot
            tick(host)
            assert (await fired(c))["scheduledFor"] == slot
            [run] = await runs_of(c, "t")
            await c.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
        clock.ms = slot - step + MINUTE  # corrected: the real time the slot ran at, a minute later
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"], cursor=0)
            due = await next_due(host)
            assert due is not None and due > clock.ms  # not again at once
            assert len(await runs_of(c, "t")) == 1
            # at most one period late: the first slot a period on (a daily slot is a day or two away)
            assert due <= clock.ms + (period if cadence == "hourly" else 2 * DAY)
            clock.ms = due
            tick(host)
            assert (await fired(c))["scheduledFor"] == due
            assert len(await runs_of(c, "t")) == 2


@pytest.mark.parametrize("step", BACK_STEPS)
async def test_a_run_started_after_the_clock_went_back_is_kept_by_the_last_100_and_listed_first(
        tmp_path: Path, step: int) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(120):
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            task = await c.call("tasks.create", {"title": "t", "prompt": "p"})
            for _ in range(100):
                clock.ms += 1
                run = await c.call("tasks.startRun", {"taskId": task["id"]})
                await c.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
            clock.ms -= step
            fresh = await c.call("tasks.startRun", {"taskId": task["id"]})
            [first] = (await c.call("tasks.runs", {"taskId": task["id"], "limit": 1}))["runs"]
            assert first["id"] == fresh["id"]  # the newest run, kept by the last-100 cap ...
            done = await c.call("tasks.finishRun", {"runId": fresh["id"], "status": "completed"})
            assert done["status"] == "completed" and done["endedAt"] >= done["startedAt"]  # ... and finishable
        clock.ms -= step  # and again while the host is down
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            again = await c.call("tasks.startRun", {"taskId": task["id"]})
            runs = (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"]
            assert [r["id"] for r in runs[:2]] == [again["id"], fresh["id"]] and len(runs) == 100
            assert (await c.call("tasks.get", {"taskId": task["id"]}))["lastRunAt"] == again["startedAt"]


@pytest.mark.parametrize("step", BACK_STEPS)
async def test_a_task_created_after_the_clock_went_back_is_listed_last(tmp_path: Path, step: int) -> None:
    """tasks.list is "Every scheduled task, oldest first": a task created after the clock stepped back is
    still the newest (listed last), within the run and after a restart on a clock stepped back again."""
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            for tid in ("b", "c"):
                await c.call("tasks.create", {"taskId": tid, "title": tid, "prompt": "p"})
                clock.ms += MINUTE
            clock.ms -= step
            later = await c.call("tasks.create", {"taskId": "a", "title": "a", "prompt": "p"})
            assert [t["id"] for t in (await c.call("tasks.list", {}))["tasks"]] == ["b", "c", "a"]
        clock.ms -= step  # and again while the host is down
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            newest = await c.call("tasks.create", {"taskId": "0", "title": "0", "prompt": "p"})
            assert newest["createdAt"] > later["createdAt"]
            assert [t["id"] for t in (await c.call("tasks.list", {}))["tasks"]] == ["b", "c", "a", "0"]


# --------------------------------------------------------------------------- turns


@pytest.mark.parametrize("step", BACK_STEPS)
async def test_a_turn_started_after_the_clock_went_back_is_the_sessions_latest_turn(
        tmp_path: Path, step: int) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            sid = await new_session(c)
            await finished_turn(c, sid, "t1")
            clock.ms -= step
            await start(c, sid, "t2")
            got = await c.call("session.get", {"sessionId": sid})
            assert got["session"]["latestTurn"] == {"id": "t2", "status": "running"}
            turns = await c.call("session.listTurns", {"sessionId": sid})
            assert [t["id"] for t in turns["turns"]] == ["t2", "t1"]
            ended = (await end(c, sid, "t2"))["turn"]
            assert ended["endedAt"] >= ended["startedAt"]
        clock.ms -= step  # and again while the host is down
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            await start(c, sid, "t3")
            listed = (await c.call("session.list", {}))["sessions"]
            assert listed[0]["latestTurn"] == {"id": "t3", "status": "running"}
            turns = await c.call("session.listTurns", {"sessionId": sid, "limit": 1})
            rest = await c.call("session.listTurns", {"sessionId": sid, "cursor": turns["nextCursor"]})
            assert [t["id"] for t in turns["turns"] + rest["turns"]] == ["t3", "t2", "t1"]


# --------------------------------------------------------------------------- collaboration deliveries


async def _deliveries(c: HostClient, sid: str, limit: int) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = await c.call("collab.list", {"sessionId": sid, "limit": limit, **({"cursor": cursor} if cursor else {})})
        seen += [d["content"] for d in page["deliveries"]]
        cursor = page.get("nextCursor")
        if not cursor:
            return seen


@pytest.mark.parametrize("step", [pytest.param(0, id="same-millisecond"), *BACK_STEPS])
async def test_a_delivery_made_after_the_clock_went_back_is_listed_first(tmp_path: Path, step: int) -> None:
    """collab.list is "Deliveries, newest first" (seed 003 §4.6c): deliveries made in one millisecond list in
    reverse order of making (their ids are random), and one made after the clock stepped back lists first,
    on every page size, within the run and after a restart on a clock stepped back again."""
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            src = await new_session(c)
            dst = await new_session(c)
            for i in range(6):
                await c.call("collab.deliver", {"pluginId": "team", "sourceSessionId": src, "targetSessionId": dst,
                                                "kind": "message", "content": f"m{i}", "idempotencyKey": f"k{i}"})
                clock.ms -= step
            want = [f"m{i}" for i in reversed(range(6))]
            for limit in (1, 4, 50):
                assert await _deliveries(c, dst, limit) == want
        clock.ms -= step
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            await c.call("collab.deliver", {"pluginId": "team", "sourceSessionId": src, "targetSessionId": dst,
                                            "kind": "message", "content": "m6", "idempotencyKey": "k6"})
            assert await _deliveries(c, dst, 2) == ["m6", *want]


# --------------------------------------------------------------------------- boot sweeps


async def test_a_checkpoint_quarantined_at_a_boot_never_replaces_one_an_earlier_boot_quarantined(
        tmp_path: Path) -> None:
    """Boot moves an unusable in-flight checkpoint aside under a name stamped with the clock: a clock
    stepped back onto the stamp an earlier boot used (a restored snapshot, an hour corrected) must not
    overwrite that earlier evidence."""
    data = DataDir(tmp_path)
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            sid = await new_session(c)
        data.inflight(sid).write_bytes(b"first torn checkpoint")
        async with host_at(tmp_path, clock):
            pass
        clock.ms += HOUR
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            await finished_turn(c, sid, "t1")
        clock.ms -= HOUR  # corrected: back on the first quarantine's stamp
        data.inflight(sid).write_bytes(b"second torn checkpoint")
        async with host_at(tmp_path, clock):
            pass
    kept = sorted(p.read_bytes() for p in data.quarantine_dir.iterdir() if p.name.startswith(f"{sid}."))
    assert kept == [b"first torn checkpoint", b"second torn checkpoint"]


# --------------------------------------------------------------------------- attachment eviction


async def put_blob(c: HostClient, data: bytes) -> str:
    got = await c.call("attachments.put", {"name": "f.bin", "mimeType": "application/octet-stream",
                                           "dataBase64": base64.b64encode(data).decode()})
    return str(got["sha256"])


@pytest.mark.parametrize("step", BACK_STEPS)
async def test_budget_eviction_takes_the_least_recently_used_blob_across_a_clock_step_back(
        tmp_path: Path, step: int) -> None:
    """``attachments.gc`` evicts least recently used first: a blob put (or put again, or referenced)
    after the clock stepped back was used last, and an older blob goes before it."""
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            sid = await new_session(c)
            old = await put_blob(c, b"o" * 1000)
            clock.ms += MINUTE
            reput = await put_blob(c, b"r" * 1000)
            clock.ms += MINUTE
            mid = await put_blob(c, b"m" * 1000)
            clock.ms -= step
            fresh = await put_blob(c, b"f" * 1000)
            await put_blob(c, b"r" * 1000)  # used again: as recent as the fresh one
            await c.call("attachments.ref", {"sha256": old, "sessionId": sid})  # and this one too
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 3000})
            gc = await c.call("attachments.gc", {})
            assert gc["evicted"] == [mid]
            for sha in (old, reput, fresh):
                got = await c.call("attachments.get", {"sha256": sha})
                assert got["deletionState"] == "live"


# --------------------------------------------------------------------------- trash


async def test_a_session_trashed_after_the_clock_went_back_is_listed_first_in_the_trash(tmp_path: Path) -> None:
    """``sessions.listTrashed`` shows the most recently trashed first, the newest 200 by default: a
    session trashed after a clock step back must not sort under (nor drop out behind) older ones."""
    clock = SetClock(BASE)
    with trio.fail_after(180):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            for i in range(200):
                clock.ms += 1
                await c.call("sessions.trash", {"sessionId": await new_session(c, f"old {i}")})
            sid = await new_session(c, "fresh")
            clock.ms -= DAY
            trashed = (await c.call("sessions.trash", {"sessionId": sid}))["session"]
            listed = (await c.call("sessions.listTrashed", {}))["sessions"]
            assert listed[0]["id"] == sid and listed[0]["deletedAt"] == trashed["deletedAt"]
        clock.ms -= DAY  # the index rebuilt from the files keeps it
        (tmp_path / "pi.sqlite").unlink()
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            listed = (await c.call("sessions.listTrashed", {}))["sessions"]
            assert listed[0]["id"] == sid and listed[0]["deletedAt"] == trashed["deletedAt"]


# --------------------------------------------------------------------------- providers


@pytest.mark.parametrize("step", BACK_STEPS)
async def test_a_provider_created_after_the_clock_went_back_keeps_its_place_in_creation_order(
        tmp_path: Path, step: int) -> None:
    """Seed 003 "Provider display order": "missing metadata preserves creation order, new IDs follow saved
    IDs". A provider created after the clock stepped back is still the newest: it lists after the older
    ones (no saved order; and after the saved ids once there is one), within the run and after a restart on
    a clock stepped back again."""
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            for pid in ("b", "c"):
                await c.call("providers.create", {"id": pid, "name": pid})
                clock.ms += MINUTE
            clock.ms -= step
            await c.call("providers.create", {"id": "a", "name": "a"})
            assert [p["id"] for p in (await c.call("providers.list", {}))["providers"]] == ["b", "c", "a"]
        clock.ms -= step  # and again while the host is down
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            await c.call("providers.reorder", {"providerIds": ["c"]})
            await c.call("providers.create", {"id": "0", "name": "0"})
            assert [p["id"] for p in (await c.call("providers.list", {}))["providers"]] == ["c", "b", "a", "0"]
