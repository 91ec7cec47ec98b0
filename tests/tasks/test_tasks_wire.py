"""Scheduled tasks on the wire (seed 003 §4.11): the projection, the run defaults, calendar provenance.

Each test's docstring quotes the §4.11 line it holds the host to. The store
keeps ``config_json.nextRunAt`` in epoch milliseconds (what the scheduler
compares); only the wire form is RFC 3339.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from protocol import models as m
from runtime.client import RpcError
from store import schedule, tasks
from store.errors import InvalidInput
from tests.dbkit import NOW, add_session
from tests.hostkit import client_for, inprocess_host

HOUR = 3_600_000
HOURLY = {"hour": 0, "minute": 0}  # §4.11: an hourly task is armed only with a schedule object


def _legacy_row(conn: sqlite3.Connection, tid: str, cadence: str, config: dict[str, Any]) -> None:
    """A row as an older host wrote it: no calendarConfigured key."""
    conn.execute("INSERT INTO scheduled_tasks(id, title, prompt, cadence, enabled, project_id, config_json, "
                 "last_run_at, created_at, updated_at) VALUES (?, 't', 'p', ?, 1, NULL, ?, NULL, ?, ?)",
                 (tid, cadence, orjson.dumps(config).decode(), NOW, NOW))


def _stored_config(conn: sqlite3.Connection, tid: str) -> dict[str, Any]:
    row = conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = ?", (tid,)).fetchone()
    config: dict[str, Any] = orjson.loads(row[0])
    return config


async def test_wire_task_projects_rfc3339_next_run_at_and_task_owned_fields(tmp_path: Path) -> None:
    """§4.11: "Task wire fields project schedule, RFC3339 nextRunAt, workspacePath and the optional
    task-owned permissionMode plus paired providerId/modelId values. These additive values stay in
    config_json" (and thinkingLevel: "Tasks also persist optional thinkingLevel")."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            created = await c.call("tasks.create", {
                "title": "Digest", "prompt": "Summarize", "cadence": "weekly",
                "schedule": {"hour": 8, "minute": 30}, "weekdays": [1, 3], "workspacePath": "/w/repo",
                "permissionMode": "accept-edits", "providerId": "anthropic", "modelId": "claude-sonnet-4",
                "thinkingLevel": "high", "config": {"custom": {"kept": True}}})
            m.ScheduledTask.model_validate(created)
            assert isinstance(created["nextRunAt"], str)
            assert datetime.fromisoformat(created["nextRunAt"]).utcoffset() is not None
            assert (created["schedule"], created["weekdays"], created["workspacePath"]) == (
                {"hour": 8, "minute": 30}, [1, 3], "/w/repo")
            assert (created["permissionMode"], created["providerId"], created["modelId"],
                    created["thinkingLevel"]) == ("accept-edits", "anthropic", "claude-sonnet-4", "high")
            assert created["config"]["custom"] == {"kept": True}
            assert "nextRunAt" not in created["config"]  # one wire form: the top-level RFC 3339 value
            got = await c.call("tasks.get", {"taskId": created["id"]})
            assert got == created
            assert (await c.call("tasks.list", {}))["tasks"] == [created]
        stored = _stored_config_of(tmp_path, created["id"])
        assert stored["workspacePath"] == "/w/repo" and stored["thinkingLevel"] == "high"
        ms = stored["nextRunAt"]
        assert isinstance(ms, int)  # stays epoch milliseconds in config_json
        assert tasks.rfc3339(ms) == created["nextRunAt"]
        assert int(datetime.fromisoformat(created["nextRunAt"]).timestamp() * 1000) == ms


def _stored_config_of(tmp_path: Path, tid: str) -> dict[str, Any]:
    c = sqlite3.connect(tmp_path / "pi.sqlite")
    try:
        return _stored_config(c, tid)
    finally:
        c.close()


def test_rfc3339_is_utc_with_milliseconds() -> None:
    """§4.11: "RFC3339 nextRunAt" - UTC, millisecond precision, round-trips to the stored integer."""
    assert tasks.rfc3339(1_785_133_800_000) == "2026-07-27T06:30:00.000Z"
    assert tasks.rfc3339(1_785_133_800_123) == "2026-07-27T06:30:00.123Z"
    assert m.ScheduledTask.model_validate({
        "id": "t", "title": "t", "prompt": "p", "cadence": "manual", "enabled": True, "mode": "agent",
        "config": {}, "nextRunAt": tasks.rfc3339(NOW), "createdAt": NOW, "updatedAt": NOW}).next_run_at


async def test_old_client_integer_next_run_at_is_still_accepted_on_input(tmp_path: Path) -> None:
    """§4.11 (and issue 24 part 5): "old clients' integer values still accepted on input": a config
    carrying the earlier wire's integer nextRunAt is accepted; the host computes the slot itself."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            created = await c.call("tasks.create", {
                "title": "Old", "prompt": "p", "cadence": "daily",
                "config": {"schedule": {"hour": 9, "minute": 0}, "nextRunAt": 1}})
            assert isinstance(created["nextRunAt"], str) and created["nextRunAt"] != tasks.rfc3339(1)
            updated = await c.call("tasks.update", {"taskId": created["id"], "config": {
                "schedule": {"hour": 9, "minute": 0}, "nextRunAt": 5}})
            assert updated["nextRunAt"] == created["nextRunAt"]


async def test_projected_fields_update_one_key_and_null_clears_it(tmp_path: Path) -> None:
    """§4.11: "Missing or cleared levels retain the legacy off behavior" - a top-level field sets one
    config key; sent as null it clears that key, the others stay."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            t = await c.call("tasks.create", {"title": "t", "prompt": "p", "thinkingLevel": "low",
                                              "workspacePath": "/w"})
            t = await c.call("tasks.update", {"taskId": t["id"], "thinkingLevel": None,
                                              "permissionMode": "auto"})
            assert "thinkingLevel" not in t and "thinkingLevel" not in t["config"]
            assert (t["permissionMode"], t["workspacePath"]) == ("auto", "/w")
            run = await c.call("tasks.startRun", {"taskId": t["id"]})
            assert run["settings"]["thinkingLevel"] == "off"
            with pytest.raises(RpcError) as bad:
                await c.call("tasks.update", {"taskId": t["id"], "providerId": "anthropic"})
            assert bad.value.data_code == "INVALID_PARAMS"  # providerId/modelId are paired
            assert await c.call("tasks.get", {"taskId": t["id"]}) == {**t, "lastRunAt": run["startedAt"]}
            for field in ({"workspacePath": "/w\x00x"}, {"config": {"workspacePath": "/w\x00x"}}):
                with pytest.raises(RpcError) as bad:  # a NUL can never be a path: refused, nothing changes
                    await c.call("tasks.update", {"taskId": t["id"], **field})
                assert bad.value.data_code == "INVALID_PARAMS" and "NUL" in f"{bad.value} {bad.value.data}"
            assert (await c.call("tasks.get", {"taskId": t["id"]}))["workspacePath"] == "/w"


def _fire(conn: sqlite3.Connection, now: int) -> dict[str, dict[str, Any]]:
    """Fire every due task; the ``task.due`` payloads by task id, each valid against its model."""
    ids = iter(range(1_000))
    batch = schedule.fire_due(conn, now_ms=now, new_run_id=lambda: f"run-{next(ids)}")
    out = {}
    for outcome in batch.outcomes:
        assert outcome.kind == "started"
        out[outcome.task["id"]] = schedule.due_payload(outcome)
        m.TaskDueEvent.model_validate(out[outcome.task["id"]])
    return out


def test_automatic_run_without_permission_gets_ask(conn: sqlite3.Connection) -> None:
    """§4.11: "Missing permission keeps legacy behavior: Ask for automatic runs and inherited
    permission for Run now." - the task.due event of a task without permissionMode says ask."""
    tasks.create_task(conn, task_id="a", title="t", prompt="p", cadence="hourly", config={"schedule": HOURLY},
                      now_ms=NOW)
    tasks.create_task(conn, task_id="b", title="t", prompt="p", cadence="hourly",
                      config={"schedule": HOURLY, "permissionMode": "auto"}, now_ms=NOW)
    due = _fire(conn, NOW + HOUR)
    assert due["a"]["permissionMode"] == "ask"
    assert due["b"]["permissionMode"] == "auto"  # a task-owned value wins


async def test_run_now_without_permission_inherits(tmp_path: Path) -> None:
    """§4.11: "Missing permission keeps legacy behavior: Ask for automatic runs and inherited
    permission for Run now." - tasks.startRun says what the run applies."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            t = await c.call("tasks.create", {"title": "t", "prompt": "p"})
            run = await c.call("tasks.startRun", {"taskId": t["id"]})
            m.TaskRun.model_validate(run)
            assert run["settings"] == {"trigger": "manual", "mode": "agent", "permissionMode": "inherit",
                                       "thinkingLevel": "off"}
            await c.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
            await c.call("tasks.update", {"taskId": t["id"], "permissionMode": "ask"})
            run = await c.call("tasks.startRun", {"taskId": t["id"]})
            assert run["settings"]["permissionMode"] == "ask"
            assert "settings" not in (await c.call("tasks.runs", {"taskId": t["id"]}))["runs"][0]


def test_thinking_level_is_applied_to_manual_and_automatic_runs(conn: sqlite3.Connection) -> None:
    """§4.11: "Both manual and automatic runs apply the saved level. Missing or cleared levels retain
    the legacy off behavior"."""
    tasks.create_task(conn, task_id="x", title="t", prompt="p", cadence="hourly",
                      config={"schedule": HOURLY, "thinkingLevel": "xhigh"}, now_ms=NOW)
    tasks.create_task(conn, task_id="y", title="t", prompt="p", cadence="hourly", config={"schedule": HOURLY},
                      now_ms=NOW)
    due = _fire(conn, NOW + HOUR)
    assert (due["x"]["thinkingLevel"], due["y"]["thinkingLevel"]) == ("xhigh", "off")
    assert tasks.run_settings(tasks.get_task(conn, "x"), trigger="manual")["thinkingLevel"] == "xhigh"
    assert tasks.run_settings(tasks.get_task(conn, "y"), trigger="manual")["thinkingLevel"] == "off"
    tasks.update_task(conn, "x", {"configKeys": {"thinkingLevel": "omit"}}, now_ms=NOW)
    assert tasks.run_settings(tasks.get_task(conn, "x"), trigger="manual")["thinkingLevel"] == "omit"


def test_missing_model_fields_keep_app_default_resolution(conn: sqlite3.Connection) -> None:
    """§4.11: "Missing model fields retain run-time app-default resolution." - neither the due event
    nor the Run now settings invent a provider or model."""
    tasks.create_task(conn, task_id="n", title="t", prompt="p", cadence="hourly", config={"schedule": HOURLY},
                      now_ms=NOW)
    payload = _fire(conn, NOW + HOUR)["n"]
    settings = tasks.run_settings(tasks.get_task(conn, "n"), trigger="manual")
    assert not {"providerId", "modelId"} & (payload.keys() | settings.keys())


def test_legacy_daily_and_weekly_rows_with_a_schedule_infer_calendar_intent(conn: sqlite3.Connection) -> None:
    """§4.11 "Scheduled calendar provenance": "Legacy Daily/Weekly rows with a saved schedule infer
    calendar intent"."""
    _legacy_row(conn, "d", "daily", {"schedule": {"hour": 7, "minute": 0}})
    _legacy_row(conn, "w", "weekly", {"schedule": {"hour": 7, "minute": 0, "weekday": 2}})
    _legacy_row(conn, "bare", "daily", {})  # no saved schedule: nothing to infer
    _legacy_row(conn, "h", "hourly", {"schedule": {"hour": 7, "minute": 0}})
    wire = {t["id"]: tasks.to_wire(t) for t in tasks.readable_tasks(conn).items}
    assert {k: v["calendarConfigured"] for k, v in wire.items()} == {
        "d": True, "w": True, "bare": False, "h": False}
    for tid, cadence in (("d", "hourly"), ("w", "hourly")):  # ... and a conversion back needs no confirmation
        tasks.update_task(conn, tid, {"cadence": cadence}, now_ms=NOW)
        assert tasks.to_wire(tasks.update_task(conn, tid, {"cadence": "daily"}, now_ms=NOW))["calendarConfigured"]


def test_legacy_hourly_row_needs_explicit_calendar_confirmation_to_convert(conn: sqlite3.Connection) -> None:
    """§4.11 "Scheduled calendar provenance": "legacy Hourly rows retain their fields but require
    explicit calendar confirmation when converted." - refused with nothing written, then confirmed."""
    _legacy_row(conn, "h", "hourly", {"schedule": {"hour": 7, "minute": 15}, "nextRunAt": NOW + HOUR})
    before = _stored_config(conn, "h")
    for patch in ({"cadence": "daily"}, {"cadence": "weekly"},
                  {"cadence": "daily", "configKeys": {"calendarConfigured": False}},
                  {"cadence": "daily", "config": {"schedule": {"hour": 7, "minute": 15}}}):
        with pytest.raises(InvalidInput) as exc:
            tasks.update_task(conn, "h", patch, now_ms=NOW)
        assert exc.value.data["field"] == "calendarConfigured"
        assert (tasks.get_task(conn, "h")["cadence"], _stored_config(conn, "h")) == ("hourly", before)
    # other edits of the hourly row keep its calendar fields
    assert tasks.update_task(conn, "h", {"title": "renamed"}, now_ms=NOW)["config"]["schedule"] == \
        {"hour": 7, "minute": 15}
    done = tasks.update_task(conn, "h", {"cadence": "daily", "configKeys": {"calendarConfigured": True}},
                             now_ms=NOW)
    assert done["cadence"] == "daily" and done["config"]["calendarConfigured"] is True
    assert tasks.to_wire(done)["calendarConfigured"] is True


async def test_hourly_to_daily_conversion_through_rpc_needs_confirmation(tmp_path: Path) -> None:
    """§4.11: "legacy Hourly rows ... require explicit calendar confirmation when converted" - the wire
    answer is INVALID_PARAMS naming calendarConfigured; the top-level flag confirms."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            t = await c.call("tasks.create", {"title": "t", "prompt": "p", "cadence": "hourly",
                                              "schedule": {"hour": 6, "minute": 0}})
            assert t["calendarConfigured"] is False
            with pytest.raises(RpcError) as bad:
                await c.call("tasks.update", {"taskId": t["id"], "cadence": "daily"})
            assert bad.value.data_code == "INVALID_PARAMS"
            assert await c.call("tasks.get", {"taskId": t["id"]}) == t
            ok = await c.call("tasks.update", {"taskId": t["id"], "cadence": "daily", "calendarConfigured": True})
            assert (ok["cadence"], ok["calendarConfigured"], ok["schedule"]) == ("daily", True,
                                                                                {"hour": 6, "minute": 0})


def test_known_calendar_intent_survives_cadence_changes_and_reopen(tmp_path: Path) -> None:
    """§4.11 "Scheduled calendar provenance": "Known intent survives cadence changes and database
    reopen." - including a whole-config replacement that does not mention it."""
    from store.upgrade.schema import apply_schema

    path = tmp_path / "reopen.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    apply_schema(conn)
    _legacy_row(conn, "d", "daily", {"schedule": {"hour": 7, "minute": 0}})
    tasks.update_task(conn, "d", {"cadence": "hourly"}, now_ms=NOW)  # inferred intent written down
    assert _stored_config(conn, "d")["calendarConfigured"] is True
    tasks.update_task(conn, "d", {"config": {"schedule": {"hour": 8, "minute": 0}}}, now_ms=NOW)
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        task = tasks.get_task(conn, "d")
        assert task["cadence"] == "hourly" and tasks.to_wire(task)["calendarConfigured"] is True
        converted = tasks.update_task(conn, "d", {"cadence": "weekly"}, now_ms=NOW)  # no confirmation needed
        assert converted["cadence"] == "weekly" and isinstance(converted.get("nextRunAt"), int)
    finally:
        conn.close()


def test_run_settings_carry_the_session_independent_fields(conn: sqlite3.Connection) -> None:
    """§4.11: the automatic run's event carries "workspacePath and ... paired providerId/modelId values"
    as saved on the task."""
    add_session(conn, "s1")
    tasks.create_task(conn, task_id="f", title="t", prompt="p", cadence="hourly",
                      config={"schedule": HOURLY, "workspacePath": "/w", "providerId": "openai", "modelId": "gpt-5"},
                      now_ms=NOW)
    payload = _fire(conn, NOW + HOUR)["f"]
    assert (payload["workspacePath"], payload["providerId"], payload["modelId"]) == ("/w", "openai", "gpt-5")
