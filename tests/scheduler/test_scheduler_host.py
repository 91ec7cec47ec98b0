"""The scheduler inside a real host: ``task.due`` through the gateway, wake-ups from ``tasks.*``,
no burst after downtime, plan/goal refusals, and a SIGKILL inside the fire transaction."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.scheduler import SchedulerStatus, Tick
from protocol.methods import dump_event
from runtime.client import HostClient, RpcError, open_client
from runtime.host import RunningHost
from store import schedule, tasks
from tests.hostkit import HostProcess, client_for, run_cli, start_host_process
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import BASE, HOUR, HOURLY_SCHEDULE, MINUTE

AGENT_CONFIG = {"providerId": "anthropic", "modelId": "claude-sonnet", "permissionMode": "ask",
                "thinkingLevel": "low", "workspacePath": "/home/ada/src"}


async def _status(host: RunningHost) -> dict[str, Any]:
    assert host.scheduler is not None
    result: dict[str, Any] = await host.scheduler.ask(SchedulerStatus())
    return result


async def _next_event(c: HostClient, topic: str) -> Any:
    with trio.fail_after(10):
        while True:
            ev = await c.next_event()
            if ev.topic == topic:
                dump_event(topic, ev.data, cursor=ev.cursor, subscription_id=ev.subscription_id)  # payload model
                return ev


async def test_task_due_reaches_the_sidecar_and_missed_slots_fire_once(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            agent = await c.call("tasks.create", {"taskId": "a", "title": "Digest", "prompt": "Summarize",
                                                  "cadence": "hourly", "schedule": HOURLY_SCHEDULE,
                                                  "config": AGENT_CONFIG})
            await c.call("tasks.create", {"taskId": "p", "title": "Plan", "prompt": "Plan it", "cadence": "hourly",
                                          "schedule": HOURLY_SCHEDULE, "mode": "plan"})
            await c.call("tasks.create", {"taskId": "m", "title": "Manual", "prompt": "Now", "cadence": "manual"})
            assert agent["nextRunAt"] == tasks.rfc3339(BASE + HOUR)
            assert (await _status(host))["nextDueAt"] == BASE + HOUR
        clock.ms = back = BASE + 5 * HOUR + 7 * MINUTE  # down for five hours: five slots missed
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"], cursor=0)  # the fire may precede the subscription: replayed
            ev = await _next_event(c, "task.due")
            [run] = (await c.call("tasks.runs", {"taskId": "a"}))["runs"]
            assert ev.data == {"taskId": "a", "runId": run["id"], "title": "Digest", "prompt": "Summarize",
                               "mode": "agent", "scheduledFor": BASE + HOUR, "startedAt": back, **AGENT_CONFIG}
            assert (run["status"], run["startedAt"]) == ("running", back)
            assert (await c.call("tasks.get", {"taskId": "a"}))["nextRunAt"] == tasks.rfc3339(back + HOUR)
            [refused] = (await c.call("tasks.runs", {"taskId": "p"}))["runs"]
            assert (refused["status"], refused["errorCode"]) == ("error", "PLAN_REQUIRES_INTERACTIVE_SESSION")
            assert (await c.call("tasks.runs", {"taskId": "m"}))["runs"] == []
            status = await _status(host)
            assert (status["fired"], status["refused"], status["nextDueAt"]) == (1, 1, back + HOUR)
            done = await c.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
            assert done["status"] == "completed"
            assert (await c.call("session.list", {}))["sessions"] == []  # the host never runs anything itself


async def test_tasks_methods_wake_the_scheduler_and_the_slot_fires(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"])
            assert (await _status(host))["nextDueAt"] is None
            created = await c.call("tasks.create", {"taskId": "t", "title": "T", "prompt": "p", "cadence": "hourly",
                                                    "schedule": HOURLY_SCHEDULE})
            assert (await _status(host))["nextDueAt"] == BASE + HOUR
            assert created["nextRunAt"] == tasks.rfc3339(BASE + HOUR)
            await c.call("tasks.update", {"taskId": "t", "enabled": False})
            assert (await _status(host))["nextDueAt"] is None
            clock.ms = BASE + 10 * MINUTE
            await c.call("tasks.update", {"taskId": "t", "enabled": True})
            assert (await _status(host))["nextDueAt"] == BASE + 70 * MINUTE
            clock.ms = BASE + 70 * MINUTE  # the wall clock reaches the slot; the timer's wake-up:
            assert host.scheduler is not None
            await host.scheduler.tell(Tick())
            ev = await _next_event(c, "task.due")
            assert (ev.data["taskId"], ev.data["startedAt"]) == ("t", BASE + 70 * MINUTE)
            with pytest.raises(RpcError) as refused:  # "Run now" while the scheduled run runs: no overlap
                await c.call("tasks.startRun", {"taskId": "t"})
            assert refused.value.data_code == "CONFLICT"
            await c.call("tasks.delete", {"taskId": "t"})
            assert (await _status(host))["nextDueAt"] is None


async def test_fault_inside_the_fire_transaction_rolls_back_then_fires_once(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(["task.due"])
            await c.call("tasks.create", {"taskId": "t", "title": "T", "prompt": "p", "cadence": "hourly",
                                          "schedule": HOURLY_SCHEDULE})
            host.faults.add(schedule.FIRE_POINT, nth=1, action="raise")
            clock.ms = BASE + HOUR
            assert host.scheduler is not None
            await host.scheduler.tell(Tick())
            ev = await _next_event(c, "task.due")  # after the failed attempt and one backoff
            assert host.faults.hits(schedule.FIRE_POINT) == 2
            [run] = (await c.call("tasks.runs", {"taskId": "t"}))["runs"]
            assert run["id"] == ev.data["runId"]
            assert (await c.call("tasks.get", {"taskId": "t"}))["nextRunAt"] == tasks.rfc3339(BASE + 2 * HOUR)
            assert (await _status(host))["fired"] == 1


def _stop(proc: HostProcess) -> int:
    code = proc.terminate()
    proc.proc.communicate()  # closes the pipes
    return code


def _db_task(root: Path, task_id: str) -> tuple[dict[str, Any], int]:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        (config,) = conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = ?", (task_id,)).fetchone()
        (runs,) = conn.execute("SELECT COUNT(*) FROM task_runs WHERE task_id = ?", (task_id,)).fetchone()
    finally:
        conn.close()
    return json.loads(config), runs


async def test_sigkill_inside_the_fire_transaction_never_double_fires(tmp_path: Path) -> None:
    proc = start_host_process(tmp_path)
    try:
        async with open_client(proc.url, proc.token, client_id="t", client_kind="test") as c:
            await c.call("tasks.create", {"taskId": "t", "title": "T", "prompt": "p", "cadence": "hourly",
                                          "schedule": HOURLY_SCHEDULE})
    finally:
        assert _stop(proc) == 0
    missed = int(time.time() * 1000) - 10 * MINUTE
    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    config, _ = _db_task(tmp_path, "t")
    config["nextRunAt"] = missed  # the slot passed while the host was down
    with conn:
        conn.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = 't'", (json.dumps(config),))
    conn.close()
    env = {"RT_CRASHPOINT": f"{schedule.FIRE_POINT}:1:kill"}
    with trio.fail_after(60):
        crashed = await trio.to_thread.run_sync(lambda: run_cli("--data-dir", str(tmp_path), "serve", "--port", "0",
                                                                "--quiet", env=env, timeout=60))
    assert crashed.returncode == -9  # killed inside the transaction that starts the run
    config, runs = _db_task(tmp_path, "t")
    assert (config["nextRunAt"], runs) == (missed, 0)  # neither the run nor the advance survived
    proc = start_host_process(tmp_path)
    try:
        async with open_client(proc.url, proc.token, client_id="t", client_kind="test") as c:
            with trio.fail_after(20):
                while not (history := (await c.call("tasks.runs", {"taskId": "t"}))["runs"]):  # noqa: ASYNC110 - polls another process over RPC; no local event exists
                    await trio.sleep(0.05)
            task = await c.call("tasks.get", {"taskId": "t"})
            assert len(history) == 1 and history[0]["status"] == "running"
            assert task["nextRunAt"] == tasks.rfc3339(history[0]["startedAt"] + HOUR)
            assert history[0]["startedAt"] + HOUR > int(time.time() * 1000)
    finally:
        assert _stop(proc) == 0
    _, runs = _db_task(tmp_path, "t")
    assert runs == 1
