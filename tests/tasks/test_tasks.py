"""Scheduled tasks: §11.6 CRUD + run history through host RPC only, §11.19 contract modes."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import trio

from runtime.client import RpcError
from store import tasks
from store.errors import InvalidInput, PlanRequiresInteractiveSession
from store.fence import interruption_fence
from tests.dbkit import NOW, add_session
from tests.hostkit import client_for, inprocess_host


async def _error(call: object) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call  # type: ignore[misc]
    return exc.value


async def test_crud_and_run_history_round_trip_through_rpc(tmp_path: Path) -> None:
    """Seed §11.6: every operation through the host; the history survives a restart."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            created = await c.call("tasks.create", {
                "title": "Digest", "prompt": "Summarize commits", "cadence": "weekly",
                "config": {"schedule": {"hour": 8, "minute": 30}, "weekdays": [1, 3], "workspacePath": "/w",
                           "custom": {"kept": True}},
                "submissionId": "t-1"})
            tid = created["id"]
            assert created["mode"] == "agent" and created["config"]["custom"] == {"kept": True}
            assert isinstance(created["nextRunAt"], str)  # RFC 3339 (test_tasks_wire.py)
            assert await c.call("tasks.create", {
                "title": "Digest", "prompt": "Summarize commits", "cadence": "weekly",
                "config": {"schedule": {"hour": 8, "minute": 30}, "weekdays": [1, 3], "workspacePath": "/w",
                           "custom": {"kept": True}},
                "submissionId": "t-1"}) == created  # a retry creates nothing
            assert [t["id"] for t in (await c.call("tasks.list", {}))["tasks"]] == [tid]
            upd = await c.call("tasks.update", {"taskId": tid, "title": "Weekly digest", "enabled": False,
                                                "mode": "chat"})
            assert (upd["title"], upd["enabled"], upd["mode"]) == ("Weekly digest", False, "plan")
            upd = await c.call("tasks.update", {"taskId": tid, "mode": "agent"})
            assert await c.call("tasks.get", {"taskId": tid}) == upd
            runs = []
            for i in range(3):
                run = await c.call("tasks.startRun", {"taskId": tid, "runId": f"r{i}"})
                assert run["status"] == "running"
                assert (await _error(c.call("tasks.startRun", {"taskId": tid}))).data_code == "CONFLICT"
                runs.append(await c.call("tasks.finishRun", {"runId": f"r{i}",
                                                             "status": "error" if i == 1 else "completed",
                                                             "errorCode": "E1" if i == 1 else None}))
            assert (await _error(c.call("tasks.finishRun", {"runId": "r0", "status": "completed"}))).data_code \
                == "CONFLICT"
            history = (await c.call("tasks.runs", {"taskId": tid}))["runs"]
            assert [r["id"] for r in history] == ["r2", "r1", "r0"]
            assert history[1]["errorCode"] == "E1"
            await c.call("tasks.startRun", {"taskId": tid, "runId": "r3"})  # left running at shutdown
            bad = await _error(c.call("tasks.create", {"title": "x", "prompt": "y", "config": {"weekdays": [9]}}))
            assert bad.data_code == "INVALID_PARAMS"
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            history = (await c.call("tasks.runs", {"taskId": tid}))["runs"]
            assert [(r["id"], r["status"]) for r in history] == [
                ("r3", "aborted"), ("r2", "completed"), ("r1", "error"), ("r0", "completed")]
            assert (await c.call("tasks.get", {"taskId": tid}))["lastRunAt"] == history[0]["startedAt"]
            assert (await c.call("tasks.delete", {"taskId": tid})) == {"taskId": tid, "deleted": True}
            assert (await _error(c.call("tasks.runs", {"taskId": tid}))).data_code == "NOT_FOUND"
            assert (await c.call("tasks.list", {}))["tasks"] == []


async def test_plan_or_goal_run_fails_before_any_work(tmp_path: Path) -> None:
    """Seed §11.19: PLAN_REQUIRES_INTERACTIVE_SESSION, no run row, no artifact, no approval."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for mode in ("plan", "goal", "chat"):
                t = await c.call("tasks.create", {"title": mode, "prompt": "p", "mode": mode})
                err = await _error(c.call("tasks.startRun", {"taskId": t["id"], "submissionId": f"run-{mode}"}))
                assert err.data_code == "PLAN_REQUIRES_INTERACTIVE_SESSION"
                assert (await c.call("tasks.runs", {"taskId": t["id"]}))["runs"] == []
            agent = await c.call("tasks.create", {"title": "agent", "prompt": "p"})
            sess = await c.call("session.create", {"title": "s", "mode": "goal", "projectPath": str(tmp_path)})
            err = await _error(c.call("tasks.startRun", {"taskId": agent["id"], "sessionId": sess["id"]}))
            assert err.data_code == "PLAN_REQUIRES_INTERACTIVE_SESSION"
            assert (await c.call("tasks.runs", {"taskId": agent["id"]}))["runs"] == []
            assert (await c.call("plans.pending", {}))["pending"] == []
            assert not (tmp_path / ".pi").exists()
            await c.call("session.update", {"sessionId": sess["id"], "mode": "agent"})
            run = await c.call("tasks.startRun", {"taskId": agent["id"], "sessionId": sess["id"]})
            assert run["sessionId"] == sess["id"]


def test_runs_are_pruned_to_the_last_100(conn: sqlite3.Connection) -> None:
    tasks.create_task(conn, task_id="t", title="t", prompt="p", now_ms=NOW)
    for i in range(105):
        tasks.start_run(conn, task_id="t", run_id=f"r{i:03}", session_id=None, now_ms=NOW + i)
        tasks.finish_run(conn, run_id=f"r{i:03}", status="completed", error_code=None, now_ms=NOW + i)
    runs = tasks.list_runs(conn, "t").items
    assert len(runs) == 100 and runs[0]["id"] == "r104" and runs[-1]["id"] == "r005"


def test_fence_aborts_running_runs(conn: sqlite3.Connection) -> None:
    tasks.create_task(conn, task_id="t", title="t", prompt="p", now_ms=NOW)
    tasks.start_run(conn, task_id="t", run_id="r", session_id=None, now_ms=NOW)
    report = interruption_fence(conn, now_ms=NOW + 1, boot_id="b")
    assert report["abortedTaskRuns"] == 1
    assert tasks.get_run(conn, "r") == {"id": "r", "taskId": "t", "status": "aborted", "errorCode": "INTERRUPTED",
                                        "startedAt": NOW, "endedAt": NOW + 1}


def test_contract_session_is_refused_in_store(conn: sqlite3.Connection) -> None:
    tasks.create_task(conn, task_id="t", title="t", prompt="p", now_ms=NOW)
    add_session(conn, "s", mode="plan")
    with pytest.raises(PlanRequiresInteractiveSession):
        tasks.start_run(conn, task_id="t", run_id="r", session_id="s", now_ms=NOW)
    assert conn.execute("SELECT COUNT(*) FROM task_runs").fetchone()[0] == 0


def test_next_run_at() -> None:
    utc = UTC
    now = int(datetime(2026, 7, 29, 9, 0, tzinfo=utc).timestamp() * 1000)  # a Wednesday
    # §4.11: hourly is now + 1 h ignoring the calendar fields, but only with a schedule object
    assert tasks.next_run_at("hourly", {"schedule": {"hour": 0, "minute": 0}}, now, utc) == now + tasks.HOUR_MS
    assert tasks.next_run_at("hourly", {"schedule": {}}, now, utc) == now + tasks.HOUR_MS
    assert tasks.next_run_at("hourly", {}, now, utc) is None  # "Absence of schedule leaves legacy tasks unarmed"
    assert tasks.next_run_at("weekly", {"weekdays": [1]}, now, utc) is None
    assert tasks.next_run_at("manual", {"schedule": {"hour": 1}}, now, utc) is None
    assert tasks.next_run_at("daily", {}, now, utc) is None  # legacy task without schedule: unarmed
    daily = tasks.next_run_at("daily", {"schedule": {"hour": 8, "minute": 30}}, now, utc)
    assert daily == int(datetime(2026, 7, 30, 8, 30, tzinfo=utc).timestamp() * 1000)
    later = tasks.next_run_at("daily", {"schedule": {"hour": 10, "minute": 0}}, now, utc)
    assert later == int(datetime(2026, 7, 29, 10, 0, tzinfo=utc).timestamp() * 1000)
    weekly = tasks.next_run_at("weekly", {"schedule": {"hour": 8, "minute": 0}, "weekdays": [1]}, now, utc)
    assert weekly == int(datetime(2026, 8, 3, 8, 0, tzinfo=utc).timestamp() * 1000)  # next Monday
    legacy = tasks.next_run_at("weekly", {"schedule": {"hour": 8, "minute": 0, "weekday": 0}}, now, utc)
    assert legacy == int(datetime(2026, 8, 2, 8, 0, tzinfo=utc).timestamp() * 1000)  # Sunday


def test_next_run_at_in_the_host_zone_follows_each_days_own_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """§4.11 "Daily/weekly schedules use the host local timezone" (``tz=None``, as the host calls it): a slot
    after a summer-time change is at the schedule's hour on that day's clock. New York leaves EDT (UTC-4) for
    EST (UTC-5) on 2026-11-01; before the fix the slots carried the EDT offset of "now" and came an hour
    early."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        ny = ZoneInfo("America/New_York")
        now = int(datetime(2026, 10, 31, 12, 0, tzinfo=ny).timestamp() * 1000)  # a Saturday, EDT
        daily = tasks.next_run_at("daily", {"schedule": {"hour": 9, "minute": 0}}, now)
        assert daily == int(datetime(2026, 11, 1, 14, 0, tzinfo=UTC).timestamp() * 1000)  # 09:00 EST
        weekly = tasks.next_run_at("weekly", {"schedule": {"hour": 9, "minute": 0}, "weekdays": [3]}, now)
        assert weekly == int(datetime(2026, 11, 4, 14, 0, tzinfo=UTC).timestamp() * 1000)  # Wednesday, EST
        back = int(datetime(2027, 3, 13, 12, 0, tzinfo=ny).timestamp() * 1000)  # EST; EDT from 03-14
        spring = tasks.next_run_at("daily", {"schedule": {"hour": 9, "minute": 0}}, back)
        assert spring == int(datetime(2027, 3, 14, 13, 0, tzinfo=UTC).timestamp() * 1000)  # 09:00 EDT
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("config", [
    {"schedule": {"hour": 24}}, {"schedule": {"minute": -1}}, {"weekdays": []}, {"weekdays": [1, 1]},
    {"weekdays": [7]}, {"mode": "chatty"}, {"permissionMode": "yolo"}, {"providerId": "p"},
    {"thinkingLevel": "extreme"}, {"schedule": "8am"}, {"workspacePath": "/w/\x00repo"},
    {"workspacePath": "/" + "w" * 4096}, {"workspacePath": 7},
])
def test_invalid_config_is_refused_before_mutation(conn: sqlite3.Connection, config: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        tasks.create_task(conn, task_id="t", title="t", prompt="p", cadence="weekly", config=config, now_ms=NOW)
    assert tasks.readable_tasks(conn).items == []
