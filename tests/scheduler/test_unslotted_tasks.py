"""§4.11: a scheduled task row with a saved ``schedule`` but no stored ``nextRunAt`` is armed at boot.

Such a row (an older build's, or written by hand) has a schedule, and "Absence of schedule leaves legacy
tasks unarmed" means its presence arms it; before, nothing ever computed its slot and it never fired. Boot
stores its next slot from now, as for a new task (daily/weekly in the host local timezone): no slot that
passed while the host was down fires at once (there was no stored slot to miss). Rows whose schedule gives
no slot, and rows without a schedule, are left exactly as they were.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from actors.scheduler import SchedulerStatus, Tick
from runtime.client import HostClient
from runtime.host import RunningHost
from store import tasks
from tests.hostkit import client_for
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import BASE, DAY, HOUR, MINUTE

# BASE is Sunday 2026-07-26 09:00 UTC, 14:30 in UTC+05:30; the host comes back two days later (Tuesday 14:30)
BACK = BASE + 2 * DAY
DAILY_SLOT = BACK + 18 * HOUR + 30 * MINUTE  # Wednesday 09:00 local
WEEKLY_SLOT = BACK + 6 * DAY - 5 * HOUR - 30 * MINUTE  # Monday 09:00 local
NINE = {"hour": 9, "minute": 0}
ROWS: dict[str, tuple[str, bool, dict[str, Any]]] = {
    "daily": ("daily", True, {"mode": "agent", "schedule": NINE}),
    "weekly": ("weekly", True, {"mode": "agent", "schedule": NINE, "weekdays": [1]}),
    "legacy-weekday": ("weekly", True, {"schedule": {"hour": 9, "weekday": 3}}),  # Wednesday, no mode either
    "hourly": ("hourly", True, {"mode": "agent", "schedule": {"hour": 0, "minute": 0}}),
    "disabled": ("daily", False, {"mode": "agent", "schedule": NINE}),
    "bad-hour": ("daily", True, {"mode": "agent", "schedule": {"hour": 25}}),
    "no-days": ("weekly", True, {"mode": "agent", "schedule": NINE, "weekdays": []}),
    "bare": ("daily", True, {"mode": "agent"}),
    "manual": ("manual", True, {"mode": "agent", "schedule": NINE}),
}
ARMED = {"daily": DAILY_SLOT, "weekly": WEEKLY_SLOT, "legacy-weekday": DAILY_SLOT, "hourly": BACK + HOUR,
         "disabled": DAILY_SLOT}
UNTOUCHED = sorted(set(ROWS) - set(ARMED))


async def _status(host: RunningHost) -> dict[str, Any]:
    assert host.scheduler is not None
    result: dict[str, Any] = await host.scheduler.ask(SchedulerStatus())
    return result


def _write_rows(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        with conn:
            for n, (tid, (cadence, enabled, config)) in enumerate(ROWS.items()):
                conn.execute(
                    "INSERT INTO scheduled_tasks(id, title, prompt, cadence, enabled, project_id, config_json, "
                    "last_run_at, created_at, updated_at) VALUES (?, ?, 'p', ?, ?, NULL, ?, NULL, ?, ?)",
                    (tid, tid, cadence, int(enabled), json.dumps(config), BASE + n, BASE + n))
    finally:
        conn.close()


def _configs(db: Path) -> dict[str, str]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT id, config_json FROM scheduled_tasks").fetchall())
    finally:
        conn.close()


async def _slots(c: HostClient) -> dict[str, str | None]:
    return {t["id"]: t.get("nextRunAt") for t in (await c.call("tasks.list", {}))["tasks"]}


async def _due(c: HostClient, count: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with trio.fail_after(10):
        while len(seen) < count:
            ev = await c.next_event()
            if ev.topic == "task.due":
                seen[ev.data["taskId"]] = ev.data
    return seen


async def test_a_saved_schedule_without_a_slot_is_armed_at_boot_and_fires_there(
        tmp_path: Path, set_tz: Callable[[str], None]) -> None:
    set_tz("IST-5:30")
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with host_at(tmp_path, clock):
            pass  # the schema, then a stopped host
        _write_rows(tmp_path / "pi.sqlite")
        before = _configs(tmp_path / "pi.sqlite")
        clock.ms = BACK
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"], cursor=0)
            assert sorted(host.boot.report["tasksArmed"]) == sorted(ARMED)
            slots = await _slots(c)
            assert slots == {tid: tasks.rfc3339(ARMED[tid]) if tid in ARMED else None for tid in ROWS}
            for tid, slot in ARMED.items():
                assert (await c.call("tasks.get", {"taskId": tid}))["nextRunAt"] == tasks.rfc3339(slot), tid
            # armed from now: nothing fired at boot, the earliest slot is the hourly one
            status = await _status(host)
            assert (status["fired"], status["nextDueAt"]) == (0, BACK + HOUR)
            after = _configs(tmp_path / "pi.sqlite")
            assert {tid: after[tid] for tid in UNTOUCHED} == {tid: before[tid] for tid in UNTOUCHED}
            assert json.loads(after["legacy-weekday"]) == {**ROWS["legacy-weekday"][2], "nextRunAt": DAILY_SLOT}
            # the daily slot comes: the daily tasks fire there (the hourly one too: its slot passed)
            clock.ms = DAILY_SLOT
            assert host.scheduler is not None
            await host.scheduler.tell(Tick())
            due = await _due(c, 3)
            assert sorted(due) == ["daily", "hourly", "legacy-weekday"]
            assert due["daily"]["scheduledFor"] == due["legacy-weekday"]["scheduledFor"] == DAILY_SLOT
            assert due["daily"]["startedAt"] == DAILY_SLOT
            assert (await c.call("tasks.get", {"taskId": "daily"}))["nextRunAt"] == tasks.rfc3339(DAILY_SLOT + DAY)
            for tid in ("weekly", "disabled", *UNTOUCHED):
                assert (await c.call("tasks.runs", {"taskId": tid}))["runs"] == [], tid
        # once: a later boot finds every slot stored and rewrites none
        clock.ms = DAILY_SLOT + HOUR
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            assert host.boot.report["tasksArmed"] == []
            assert (await _slots(c))["weekly"] == tasks.rfc3339(WEEKLY_SLOT)
            assert (await _slots(c))["disabled"] == tasks.rfc3339(DAILY_SLOT)  # armed, never fired
