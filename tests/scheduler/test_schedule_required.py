"""§4.11: a task is armed only with a saved ``schedule`` object, whatever its cadence.

"Absence of schedule leaves legacy tasks unarmed", and the schedule object is "required by Hourly
intervals" ("hourly schedules compute nextRunAt = now + 3_600_000, ignoring calendar fields"). A
task without one has no ``nextRunAt`` and never fires - not after days of (virtual) clock time, not
after enable/disable, a cadence change or a rename, not after a host restart (also with an older
host's stored slot in its row). Giving it a schedule through ``tasks.update`` arms it; removing it
(``schedule: null``) disarms it. Run now needs no schedule.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors.scheduler import SchedulerStatus, TasksChanged, Tick
from runtime.client import HostClient
from runtime.host import RunningHost
from store import schedule, tasks
from tests.hostkit import client_for
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import (
    BASE,
    DAY,
    HOUR,
    MINUTE,
    VirtualWall,
    open_db,
    running_scheduler,
    runs,
    status,
    task,
)

CADENCES = ("hourly", "daily", "weekly")
SCHEDULE = {"hour": 9, "minute": 30}  # BASE is Sunday 09:00 UTC: daily and weekly (Sunday) slots at BASE + 30 min


def _slot(cadence: str, now: int) -> int:
    """Where a schedule of :data:`SCHEDULE` (weekly: Sundays) arms the task from ``now`` (UTC host)."""
    slot = tasks.next_run_at(cadence, {"schedule": SCHEDULE, "weekdays": [0]}, now)
    assert slot is not None
    return slot


@pytest.mark.parametrize("cadence", CADENCES)
async def test_a_task_without_a_schedule_never_fires_until_one_is_saved(
        tmp_path: Path, autojump_clock: object, cadence: str) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        created = db.tx(lambda c: tasks.create_task(c, task_id="t", title="t", prompt="p", cadence=cadence,
                                                    config={"weekdays": [0]} if cadence == "weekly" else None,
                                                    now_ms=BASE))
        assert "nextRunAt" not in created and "nextRunAt" not in tasks.to_wire(created)
        assert not schedule.is_armed(created)
        async with running_scheduler(db, clock) as (sched, bus):
            assert (await status(sched))["nextDueAt"] is None
            await clock.sleep_until(BASE + 2 * DAY)
            # enable/disable, a rename and a cadence round trip re-arm nothing without a schedule
            for patch in ({"enabled": False}, {"enabled": True}, {"title": "renamed"}, {"cadence": "manual"},
                          {"cadence": cadence}):
                updated = db.tx(lambda c, patch=patch: tasks.update_task(c, "t", patch, now_ms=clock()))
                assert "nextRunAt" not in updated, patch
                await sched.tell(TasksChanged())
                assert (await status(sched))["nextDueAt"] is None, patch
            await clock.sleep_until(BASE + 3 * DAY)
            assert runs(db, "t") == []
            sub = bus.subscribe(["task.due"], cursor=0)
            assert sub.queued() == 0
            sub.close()
            # saving a schedule arms it; hourly ignores its fields (now + 1 h)
            now = clock()
            armed = db.tx(lambda c: tasks.update_task(c, "t", {"configKeys": {"schedule": SCHEDULE}}, now_ms=now))
            slot = now + HOUR if cadence == "hourly" else _slot(cadence, now)
            assert armed["nextRunAt"] == slot
            await sched.tell(TasksChanged())
            assert (await status(sched))["nextDueAt"] == slot
            await clock.sleep_until(slot)
            await trio.testing.wait_all_tasks_blocked()
            assert [r["startedAt"] for r in runs(db, "t")] == [slot]
            db.tx(lambda c: tasks.finish_run(c, run_id=runs(db, "t")[0]["id"], status="completed",
                                             error_code=None, now_ms=clock()))
            # removing it disarms the task again
            bare = db.tx(lambda c: tasks.update_task(c, "t", {"configKeys": {"schedule": None}}, now_ms=clock()))
            assert "nextRunAt" not in bare and "schedule" not in bare["config"]
            await sched.tell(TasksChanged())
            assert (await status(sched))["nextDueAt"] is None
            await clock.sleep_until(slot + 9 * DAY)
            assert len(runs(db, "t")) == 1
        # a fresh scheduler (what a restart starts) finds nothing to wait for either
        async with running_scheduler(db, clock) as (sched, _bus):
            assert (await status(sched))["nextDueAt"] is None
            await clock.sleep_until(slot + 10 * DAY)
            assert len(runs(db, "t")) == 1 and "nextRunAt" not in task(db, "t")


async def _status(host: RunningHost) -> dict[str, Any]:
    assert host.scheduler is not None
    result: dict[str, Any] = await host.scheduler.ask(SchedulerStatus())
    return result


async def _tick_through(host: RunningHost, clock: SetClock, until: int) -> None:
    """Move the wall clock an hour at a time to ``until``, waking the scheduler at each step."""
    assert host.scheduler is not None
    while clock.ms < until:
        clock.ms = min(clock.ms + HOUR, until)
        await host.scheduler.tell(Tick())
        await _status(host)  # the tick was handled


async def _ids_without_slot(c: HostClient) -> set[str]:
    listed = (await c.call("tasks.list", {}))["tasks"]
    return {t["id"] for t in listed if "nextRunAt" not in t}


async def test_schedule_less_tasks_stay_unarmed_across_restarts_on_the_wire(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    bare = [f"bare-{cadence}" for cadence in CADENCES]
    with trio.fail_after(90):
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"])
            for tid, cadence in zip(bare, CADENCES, strict=True):
                created = await c.call("tasks.create", {"taskId": tid, "title": tid, "prompt": "p",
                                                        "cadence": cadence})
                assert "nextRunAt" not in created and "schedule" not in created
                assert "nextRunAt" not in await c.call("tasks.get", {"taskId": tid})
            assert await _ids_without_slot(c) == set(bare)
            assert (await _status(host))["nextDueAt"] is None
            # Run now needs no schedule, and arms nothing
            run = await c.call("tasks.startRun", {"taskId": "bare-hourly"})
            await c.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
            assert "nextRunAt" not in await c.call("tasks.get", {"taskId": "bare-hourly"})
            await _tick_through(host, clock, BASE + 30 * HOUR)
            assert (await _status(host))["fired"] == 0
        # an older host's row: hourly, enabled, a stored slot long past, no schedule object
        conn = sqlite3.connect(tmp_path / "pi.sqlite")
        legacy = json.dumps({"mode": "agent", "nextRunAt": BASE + HOUR})
        with conn:
            conn.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = 'bare-hourly'", (legacy,))
        conn.close()
        clock.ms = BASE + 2 * DAY
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"], cursor=0)
            await _tick_through(host, clock, BASE + 4 * DAY)
            assert (await _status(host))["fired"] == 0 and (await _status(host))["nextDueAt"] is None
            assert await _ids_without_slot(c) == set(bare)
            assert [len((await c.call("tasks.runs", {"taskId": tid}))["runs"]) for tid in bare] == [1, 0, 0]
            conn = sqlite3.connect(tmp_path / "pi.sqlite")
            try:  # the legacy row keeps its fields: nothing rewrote it
                assert conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = 'bare-hourly'").fetchone() \
                    == (legacy,)
            finally:
                conn.close()
            # a schedule saved through tasks.update arms each of them
            now = clock.ms
            for tid, cadence in zip(bare, CADENCES, strict=True):
                armed = await c.call("tasks.update", {"taskId": tid, "schedule": SCHEDULE, "weekdays": [0]})
                slot = now + HOUR if cadence == "hourly" else _slot(cadence, now)
                assert armed["nextRunAt"] == tasks.rfc3339(slot), tid
            assert await _ids_without_slot(c) == set()
            assert (await _status(host))["nextDueAt"] == now + 30 * MINUTE  # daily/weekly: Sunday 09:30
            # schedule: null removes it again (the wire allows it), and the task is unarmed
            for tid in bare:
                removed = await c.call("tasks.update", {"taskId": tid, "schedule": None})
                assert "nextRunAt" not in removed and "schedule" not in removed["config"], tid
            assert (await _status(host))["nextDueAt"] is None
            await _tick_through(host, clock, now + DAY)
            assert (await _status(host))["fired"] == 0
        clock.ms = BASE + 10 * DAY
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            await _tick_through(host, clock, BASE + 11 * DAY)
            assert (await _status(host))["fired"] == 0 and await _ids_without_slot(c) == set(bare)
