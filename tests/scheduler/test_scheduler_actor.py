"""The scheduler actor on virtual time (``autojump_clock``) over a real schema database.

Due-time computation in UTC and fixed non-UTC zones, exactly-once firing, no
burst after downtime, plan/goal refusals (§11.19), disabled/manual tasks, the
wake-up tell, the single-transaction fire under an injected fault, and no
overlapping runs.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors.events import EventBus
from actors.scheduler import Scheduler, SchedulerConfig, SchedulerStatus, TasksChanged
from runtime.kernel.supervisor import ChildSpec, Supervisor
from store import schedule, tasks
from store.faults import Faults
from tests.scheduler.schedkit import (
    BASE,
    DAY,
    HOUR,
    MINUTE,
    VirtualWall,
    create,
    open_db,
    running_scheduler,
    runs,
    status,
    task,
)


async def _drain(bus: EventBus, topic: str = "task.due") -> list[dict[str, object]]:
    """Every ``topic`` event published so far (replayed from the bus backlog)."""
    sub = bus.subscribe([topic], cursor=0)
    out = [(await sub.receive()).data for _ in range(sub.queued())]
    sub.close()
    return out


# -- due computation (store.tasks.next_run_at in the host local timezone) --------

DUE_CASES = [
    # tz, now, cadence, config, expected next slot
    ("UTC0", BASE, "hourly", {"schedule": {"hour": 0, "minute": 0}}, BASE + HOUR),
    ("UTC0", BASE, "daily", {"schedule": {"hour": 9, "minute": 0}}, BASE + DAY),  # strictly after now
    ("UTC0", BASE, "daily", {"schedule": {"hour": 10, "minute": 30}}, BASE + HOUR + 30 * MINUTE),
    ("UTC0", BASE, "weekly", {"schedule": {"hour": 9, "minute": 0, "weekday": 0}}, BASE + 7 * DAY),
    ("UTC0", BASE, "weekly", {"schedule": {"hour": 8, "minute": 30}, "weekdays": [1, 3]},
     BASE + DAY - 30 * MINUTE),
    ("UTC0", BASE - 10 * HOUR, "weekly", {"schedule": {"hour": 9, "minute": 0}, "weekdays": [0]}, BASE),
    # UTC+05:30: BASE is Sunday 14:30 local
    ("IST-5:30", BASE, "hourly", {"schedule": {"hour": 3}}, BASE + HOUR),  # hourly ignores calendar fields
    ("IST-5:30", BASE, "daily", {"schedule": {"hour": 9, "minute": 0}}, BASE + 18 * HOUR + 30 * MINUTE),
    ("IST-5:30", BASE, "daily", {"schedule": {"hour": 15, "minute": 0}}, BASE + 30 * MINUTE),
    ("IST-5:30", BASE, "weekly", {"schedule": {"hour": 14, "minute": 0}, "weekdays": [0]},
     BASE + 7 * DAY - 30 * MINUTE),
    # UTC-05:00: BASE is Sunday 04:00 local; Saturday 18:00 local ten hours earlier
    ("EST5", BASE, "daily", {"schedule": {"hour": 9, "minute": 0}}, BASE + 5 * HOUR),
    ("EST5", BASE, "weekly", {"schedule": {"hour": 23, "minute": 0}, "weekdays": [6]}, BASE + 7 * DAY - 5 * HOUR),
    ("EST5", BASE - 10 * HOUR, "weekly", {"schedule": {"hour": 9, "minute": 0}, "weekdays": [0]}, BASE + 5 * HOUR),
    ("UTC0", BASE, "manual", {"schedule": {"hour": 9}}, None),
    ("UTC0", BASE, "daily", {}, None),  # legacy task without a schedule: unarmed
    ("UTC0", BASE, "hourly", {}, None),  # §4.11: hourly needs a schedule object too
    ("UTC0", BASE, "weekly", {"weekdays": [1]}, None),  # weekdays alone are no schedule
]


@pytest.mark.parametrize(("tz", "now", "cadence", "config", "expected"), DUE_CASES)
def test_due_computation_in_host_local_time(set_tz: Callable[[str], None], tz: str, now: int, cadence: str,
                                            config: dict[str, object], expected: int | None) -> None:
    set_tz(tz)
    assert tasks.next_run_at(cadence, config, now) == expected


# -- firing -----------------------------------------------------------------------


async def test_due_task_fires_exactly_once_then_next_slot(tmp_path: Path, autojump_clock: object) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        created = create(db, "t1", BASE, config={"providerId": "anthropic", "modelId": "m1",
                                                 "permissionMode": "auto", "thinkingLevel": "high",
                                                 "workspacePath": "/w"})
        assert created["nextRunAt"] == BASE + HOUR
        async with running_scheduler(db, clock) as (sched, bus):
            assert (await status(sched))["nextDueAt"] == BASE + HOUR
            await clock.sleep_until(BASE + HOUR - 1)
            assert runs(db, "t1") == [] and await _drain(bus) == []
            await clock.sleep_until(BASE + HOUR)
            await trio.testing.wait_all_tasks_blocked()
            [run] = runs(db, "t1")
            assert (run["status"], run["startedAt"], run.get("sessionId")) == ("running", BASE + HOUR, None)
            after = task(db, "t1")
            assert after["nextRunAt"] == BASE + 2 * HOUR > clock()
            assert after["lastRunAt"] == BASE + HOUR
            assert await _drain(bus) == [{
                "taskId": "t1", "runId": run["id"], "title": "Digest", "prompt": "run t1", "mode": "agent",
                "scheduledFor": BASE + HOUR, "startedAt": BASE + HOUR, "providerId": "anthropic",
                "modelId": "m1", "permissionMode": "auto", "thinkingLevel": "high", "workspacePath": "/w"}]
            db.tx(lambda c: tasks.finish_run(c, run_id=run["id"], status="completed", error_code=None,
                                             now_ms=clock()))
            await clock.sleep_until(BASE + 2 * HOUR - 1)
            assert len(runs(db, "t1")) == 1  # exactly once for the first slot
            await clock.sleep_until(BASE + 2 * HOUR)
            await trio.testing.wait_all_tasks_blocked()
            assert [r["startedAt"] for r in runs(db, "t1")] == [BASE + HOUR, BASE + 2 * HOUR]
            assert (await status(sched))["fired"] == 2


async def test_daily_task_fires_at_local_time_in_non_utc_zone(tmp_path: Path, autojump_clock: object,
                                                              set_tz: Callable[[str], None]) -> None:
    set_tz("IST-5:30")  # BASE is 14:30 local
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        due = BASE + 18 * HOUR + 30 * MINUTE  # Monday 09:00 local
        assert create(db, "d", BASE, cadence="daily", config={"schedule": {"hour": 9, "minute": 0}})["nextRunAt"] \
            == due
        async with running_scheduler(db, clock) as (_sched, bus):
            await clock.sleep_until(due + 23 * HOUR)
            assert [r["startedAt"] for r in runs(db, "d")] == [due]
            assert task(db, "d")["nextRunAt"] == due + DAY
            assert [e["scheduledFor"] for e in await _drain(bus)] == [due]


async def test_missed_slots_fire_once_after_downtime(tmp_path: Path, autojump_clock: object) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        create(db, "h", BASE)  # due BASE + 1 h
        create(db, "d", BASE, cadence="daily", config={"schedule": {"hour": 10, "minute": 0}})  # due BASE + 1 h
        create(db, "w", BASE, cadence="weekly", config={"schedule": {"hour": 9, "minute": 15}, "weekdays": [0, 1]})
        down_until = BASE + 3 * DAY + 5 * HOUR + 7 * MINUTE  # Wednesday 14:07 UTC: many slots missed
        clock = VirtualWall(down_until)
        async with running_scheduler(db, clock) as (_sched, bus):
            await trio.testing.wait_all_tasks_blocked()
            for tid in ("h", "d", "w"):
                assert [r["startedAt"] for r in runs(db, tid)] == [down_until], tid
            assert task(db, "h")["nextRunAt"] == down_until + HOUR
            assert task(db, "d")["nextRunAt"] == BASE + 4 * DAY + HOUR  # Thursday 10:00, the next future slot
            assert task(db, "w")["nextRunAt"] == BASE + 7 * DAY + 15 * MINUTE  # next Sunday 09:15
            assert sorted(e["taskId"] for e in await _drain(bus)) == ["d", "h", "w"]
            await clock.sleep_until(down_until + HOUR - 1)
            assert sum(len(runs(db, t)) for t in ("h", "d", "w")) == 3  # no burst


@pytest.mark.parametrize("mode", ["plan", "goal", "chat"])
async def test_plan_and_goal_tasks_are_refused_without_any_work(tmp_path: Path, autojump_clock: object,
                                                                mode: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        created = create(db, "p", BASE, config={"mode": mode, "workspacePath": str(ws)})
        assert created["mode"] in ("plan", "goal")
        async with running_scheduler(db, clock) as (sched, bus):
            await clock.sleep_until(BASE + 2 * HOUR + 1)
            history = runs(db, "p")
            assert [(r["status"], r["errorCode"], r["startedAt"], r["endedAt"], r.get("sessionId"))
                    for r in history] == [
                ("error", "PLAN_REQUIRES_INTERACTIVE_SESSION", BASE + HOUR, BASE + HOUR, None),
                ("error", "PLAN_REQUIRES_INTERACTIVE_SESSION", BASE + 2 * HOUR, BASE + 2 * HOUR, None)]
            assert task(db, "p")["nextRunAt"] == BASE + 3 * HOUR
            assert await _drain(bus) == []  # the sidecar is never asked to run it
            st = await status(sched)
            assert (st["refused"], st["fired"]) == (2, 0)
        for table in ("sessions", "turns", "turn_queue", "plan_approvals", "notifications"):
            assert db.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,), table
        assert list(ws.iterdir()) == []  # no .pi/<kind>/ artifact


async def test_disabled_manual_and_unarmed_tasks_never_fire(tmp_path: Path, autojump_clock: object) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        create(db, "manual", BASE, cadence="manual")
        create(db, "off", BASE, enabled=False)
        create(db, "legacy", BASE, cadence="daily")  # no schedule: never armed
        for tid in ("bare-hourly", "bare-weekly"):  # §4.11: no schedule object, whatever the cadence
            db.tx(lambda c, tid=tid: tasks.create_task(c, task_id=tid, title="t", prompt="p",
                                                       cadence=tid.split("-")[1], now_ms=BASE))
        async with running_scheduler(db, clock) as (sched, bus):
            assert (await status(sched))["nextDueAt"] is None
            await clock.sleep_until(BASE + 8 * DAY)
            for tid in ("manual", "off", "legacy", "bare-hourly", "bare-weekly"):
                assert runs(db, tid) == []
            assert await _drain(bus) == []
            assert db.writes == 0  # the wake-ups every max_sleep seconds touch nothing


async def test_created_task_wakes_the_scheduler_and_fires_after_one_hour(tmp_path: Path,
                                                                         autojump_clock: object) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        async with running_scheduler(db, clock) as (sched, _bus):
            await clock.sleep_until(BASE + 10 * MINUTE)
            created_at = clock()
            create(db, "new", created_at)
            await sched.tell(TasksChanged())
            assert (await status(sched))["nextDueAt"] == created_at + HOUR
            await clock.sleep_until(created_at + HOUR - 1)
            assert runs(db, "new") == []
            await clock.sleep_until(created_at + HOUR)
            await trio.testing.wait_all_tasks_blocked()
            assert [r["startedAt"] for r in runs(db, "new")] == [created_at + HOUR]
            # an update moving the schedule is picked up the same way
            db.tx(lambda c: tasks.update_task(c, "new", {"cadence": "daily",
                                                         "config": {"schedule": {"hour": 23, "minute": 0},
                                                                    "calendarConfigured": True}},
                                              now_ms=clock()))
            await sched.tell(TasksChanged())
            assert (await status(sched))["nextDueAt"] == BASE + 14 * HOUR


async def test_fault_inside_the_fire_transaction_leaves_nothing_then_fires_once(
        tmp_path: Path, autojump_clock: object) -> None:
    faults = Faults()
    faults.add(schedule.FIRE_POINT, nth=1, action="raise")
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        create(db, "t", BASE)
        config = SchedulerConfig(retry_min=2.0)
        async with running_scheduler(db, clock, faults=faults, config=config) as (sched, bus):
            await clock.sleep_until(BASE + HOUR + 1000)
            # the run row and the slot advance were one transaction: both rolled back
            assert runs(db, "t") == [] and task(db, "t")["nextRunAt"] == BASE + HOUR
            assert (await status(sched))["failures"] == 1
            await clock.sleep_until(BASE + HOUR + 2000)  # retried after the backoff
            await trio.testing.wait_all_tasks_blocked()
            assert [r["startedAt"] for r in runs(db, "t")] == [BASE + HOUR + 2000]
            assert task(db, "t")["nextRunAt"] == BASE + 2 * HOUR + 2000
            assert len(await _drain(bus)) == 1
            assert faults.hits(schedule.FIRE_POINT) == 2


async def test_killed_scheduler_is_restarted_and_never_fires_a_slot_twice(tmp_path: Path,
                                                                          autojump_clock: object) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        create(db, "t", BASE)
        bus = EventBus()
        sup = Supervisor(intensity=3, period=10.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            ref = await sup.start_child(ChildSpec("scheduler", lambda: Scheduler(
                db=db, reads=db, bus=bus, now_ms=clock)))
            await clock.sleep_until(BASE + HOUR + 5)
            assert sup.kill("scheduler")
            await clock.sleep_until(BASE + HOUR + 10)
            assert ref.incarnation == 2
            await clock.sleep_until(BASE + 2 * HOUR - 1)  # the new incarnation re-read the advanced slot
            assert [r["startedAt"] for r in runs(db, "t")] == [BASE + HOUR]
            assert (await ref.ask(SchedulerStatus()))["nextDueAt"] == BASE + 2 * HOUR
            await sup.aclose(grace=1.0)
            nursery.cancel_scope.cancel()


async def test_slot_is_skipped_while_the_previous_run_is_still_running(tmp_path: Path,
                                                                        autojump_clock: object) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        clock = VirtualWall(BASE)
        create(db, "t", BASE)
        async with running_scheduler(db, clock) as (sched, bus):
            await clock.sleep_until(BASE + 2 * HOUR + 1)
            [run] = runs(db, "t")  # the 2 h slot found run 1 still running: skipped, not overlapped
            assert run["startedAt"] == BASE + HOUR and run["status"] == "running"
            assert task(db, "t")["nextRunAt"] == BASE + 3 * HOUR
            assert task(db, "t")["lastRunAt"] == BASE + HOUR
            assert (await status(sched))["skipped"] == 1
            db.tx(lambda c: tasks.finish_run(c, run_id=run["id"], status="completed", error_code=None,
                                             now_ms=clock()))
            await clock.sleep_until(BASE + 3 * HOUR + 1)
            assert [r["startedAt"] for r in runs(db, "t")] == [BASE + HOUR, BASE + 3 * HOUR]
            assert len(await _drain(bus)) == 2


def test_a_slot_that_cannot_advance_is_disarmed_not_looped(tmp_path: Path) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        create(db, "t", BASE, cadence="weekly", config={"schedule": {"hour": 9}, "weekdays": [1]})

        def corrupt(c: sqlite3.Connection) -> None:  # a hand-edited row: weekly, armed, but no day to run on
            c.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = 't'",
                      (f'{{"mode": "agent", "schedule": {{"hour": 9}}, "weekdays": [], "nextRunAt": {BASE - 1}}}',))

        db.tx(corrupt)
        batch = db.tx(lambda c: schedule.fire_due(c, now_ms=BASE, new_run_id=lambda: "r1"))
        assert [(o.kind, o.next_run_at) for o in batch.outcomes] == [("started", None)]
        assert batch.next_due is None and "nextRunAt" not in task(db, "t")
        again = db.tx(lambda c: schedule.fire_due(c, now_ms=BASE + 1, new_run_id=lambda: "r2"))
        assert again.outcomes == []


@pytest.mark.parametrize("bad", [{"hour": "x"}, {"hour": 25}, {"minute": 61}, {"hour": None}, {"hour": 9.5},
                                 {"hour": True}, {"weekday": "mon"}, {"hour": 2 ** 70}])
def test_a_schedule_that_gives_no_slot_disarms_its_task_and_blocks_no_other(tmp_path: Path, bad: Any) -> None:
    """A row another version (or a hand) wrote with schedule fields no slot comes out of: the scheduler fires
    what is due at its stored slot, then disarms it (no slot to advance to), and the other due tasks fire in the
    same batch; before, the slot computation raised inside the fire transaction and no task fired, ever."""
    with open_db(tmp_path / "pi.sqlite") as db:
        create(db, "bad", BASE, cadence="weekly", config={"schedule": {"hour": 9}, "weekdays": [1]})
        create(db, "good", BASE, cadence="hourly", config={"schedule": {"hour": 0, "minute": 0}})

        def corrupt(c: sqlite3.Connection) -> None:
            config = {"mode": "agent", "schedule": bad, "nextRunAt": BASE - 1}
            c.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = 'bad'", (json.dumps(config),))

        db.tx(corrupt)
        assert db.tx(lambda c: schedule.next_due_at(c, BASE)) == BASE - 1
        batch = db.tx(lambda c: schedule.fire_due(c, now_ms=BASE + HOUR, new_run_id=iter(["r1", "r2"]).__next__))
        assert sorted((o.task["id"], o.kind) for o in batch.outcomes) == [("bad", "started"), ("good", "started")]
        assert "nextRunAt" not in task(db, "bad") and task(db, "good")["nextRunAt"] == BASE + 2 * HOUR
        assert tasks.next_run_at("weekly", {"schedule": bad}, BASE) is None
        assert ("weekday" in bad) != (tasks.next_run_at("daily", {"schedule": bad}, BASE) is None)  # daily: no day
        db.tx(lambda c: tasks.finish_run(c, run_id="r2", status="completed", error_code=None, now_ms=BASE + HOUR))
        again = db.tx(lambda c: schedule.fire_due(c, now_ms=BASE + 2 * HOUR, new_run_id=lambda: "r3"))
        assert [(o.task["id"], o.kind) for o in again.outcomes] == [("good", "started")]


def test_a_damaged_task_record_fires_nothing_and_blocks_no_other(tmp_path: Path) -> None:
    """A task whose config_json no longer parses (damage of that record; only the database holds it): its
    schedule is unknown, so it cannot fire, and ``tasks.list`` names it in ``unreadable``; the other tasks are
    armed and fire as before. Before, every read of the tasks raised, in the fire transaction too: no task
    fired, ever, until something repaired the record (nothing does)."""
    with open_db(tmp_path / "pi.sqlite") as db:
        hourly = {"schedule": {"hour": 0, "minute": 0}}
        create(db, "bad", BASE, cadence="hourly", config=hourly)
        create(db, "good", BASE, cadence="hourly", config=hourly)
        db.tx(lambda c: c.execute("UPDATE scheduled_tasks SET config_json = '{\"cut' WHERE id = 'bad'"))
        assert db.tx(lambda c: schedule.arm_unslotted(c, BASE)) == []
        assert db.tx(lambda c: schedule.next_due_at(c, BASE)) == BASE + HOUR
        batch = db.tx(lambda c: schedule.fire_due(c, now_ms=BASE + HOUR, new_run_id=lambda: "r1"))
        assert [(o.task["id"], o.kind) for o in batch.outcomes] == [("good", "started")]
        assert batch.next_due == BASE + 2 * HOUR


@pytest.mark.parametrize("cadence", ["hourly", "daily", "weekly"])
def test_a_stored_slot_without_a_schedule_arms_nothing(tmp_path: Path, cadence: str) -> None:
    """§4.11 "Absence of schedule leaves legacy tasks unarmed": a row with a stored nextRunAt (an older
    host's, or hand-edited) but no schedule object is not armed: it never fires, its slot is neither
    moved back (clock-step reach) nor rewritten, and it is not on the wire."""
    with open_db(tmp_path / "pi.sqlite") as db:
        create(db, "t", BASE, cadence="manual")
        stored = f'{{"mode": "agent", "weekdays": [1], "nextRunAt": {BASE + 400 * DAY}}}'  # far beyond reach

        def legacy(c: sqlite3.Connection) -> None:
            c.execute("UPDATE scheduled_tasks SET cadence = ?, config_json = ? WHERE id = 't'", (cadence, stored))

        db.tx(legacy)
        assert not schedule.is_armed(task(db, "t")) and "nextRunAt" not in tasks.to_wire(task(db, "t"))
        for now in (BASE, BASE + HOUR, BASE + 500 * DAY):
            batch = db.tx(lambda c, now=now: schedule.fire_due(c, now_ms=now, new_run_id=lambda: "r"))
            assert (batch.outcomes, batch.next_due) == ([], None)
            assert db.tx(lambda c, now=now: schedule.next_due_at(c, now)) is None
        assert runs(db, "t") == []
        assert db.conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = 't'").fetchone() == (stored,)


def test_fire_batch_limit_reports_more_due(tmp_path: Path) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        for i in range(5):
            create(db, f"t{i}", BASE + i)
        ids = iter(f"r{i}" for i in range(10))
        first = db.tx(lambda c: schedule.fire_due(c, now_ms=BASE + 2 * HOUR, new_run_id=lambda: next(ids),
                                                  limit=3))
        assert [o.task["id"] for o in first.outcomes] == ["t0", "t1", "t2"] and first.more_due
        rest = db.tx(lambda c: schedule.fire_due(c, now_ms=BASE + 2 * HOUR, new_run_id=lambda: next(ids), limit=3))
        assert [o.task["id"] for o in rest.outcomes] == ["t3", "t4"] and not rest.more_due
        assert rest.next_due == BASE + 3 * HOUR


async def test_many_due_tasks_are_fired_in_batches(tmp_path: Path, autojump_clock: object) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        for i in range(7):
            create(db, f"t{i}", BASE)
        clock = VirtualWall(BASE + HOUR)
        async with running_scheduler(db, clock, config=SchedulerConfig(batch_limit=3)) as (_sched, bus):
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(e["taskId"] for e in await _drain(bus)) == [f"t{i}" for i in range(7)]
            assert db.writes == 3

