"""A task's workspacePath and providerId/modelId inside ``config`` (seed 003 §4.11): one rule per field.

A value newly written through ``config`` on tasks.create/update meets the rule of the same field at the
top level of the params (INVALID_PARAMS naming ``config.<key>``, nothing written); a row an older build
wrote with ``""`` there still lists, runs and updates: only what a request sets is checked, and a blank
value reads as unset ("Missing model fields retain run-time app-default resolution").
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from protocol import models as m
from runtime.client import RpcError
from store import schedule, tasks
from store.errors import InvalidInput
from tests.dbkit import NOW
from tests.hostkit import client_for, inprocess_host

HOUR = 3_600_000
LONG_COMPONENT = "/w/" + "x" * 256  # a component over 255 bytes: refused as a top-level workspacePath too
# (config values, the field the refusal names)
BAD_CONFIG: list[tuple[dict[str, Any], str]] = [
    ({"workspacePath": ""}, "config.workspacePath"),
    ({"workspacePath": LONG_COMPONENT}, "config.workspacePath"),
    ({"providerId": "", "modelId": "m"}, "config.providerId"),
    ({"providerId": "p", "modelId": ""}, "config.modelId"),
    ({"providerId": "", "modelId": ""}, "config.providerId"),
    ({"providerId": "p" * 201, "modelId": "m"}, "config.providerId"),
]
OLD_CONFIG = {"mode": "agent", "schedule": {"hour": 0, "minute": 0}, "workspacePath": "", "providerId": "",
              "modelId": "", "custom": 1}


async def _refusal(c: Any, method: str, params: dict[str, Any]) -> tuple[str | None, Any]:
    with pytest.raises(RpcError) as bad:
        await c.call(method, params)
    return bad.value.data_code, (bad.value.data or {}).get("field")


async def test_new_blank_or_oversized_values_through_config_are_refused_naming_the_field(tmp_path: Path) -> None:
    """§4.11: "Invalid or empty selections are rejected before mutation" - through ``config`` as at the top
    level: create makes no task, update changes nothing."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            # The top level refuses the same values (the rule the config keys now share).
            assert (await _refusal(c, "tasks.create", {"title": "t", "prompt": "p", "workspacePath": ""}))[0] == (
                "INVALID_PARAMS")
            assert (await _refusal(c, "tasks.create", {"title": "t", "prompt": "p", "providerId": "",
                                                       "modelId": "m"}))[0] == "INVALID_PARAMS"
            for config, field in BAD_CONFIG:
                got = await _refusal(c, "tasks.create", {"title": "t", "prompt": "p", "config": config})
                assert got == ("INVALID_PARAMS", field), config
            assert (await c.call("tasks.list", {}))["tasks"] == []
            good = await c.call("tasks.create", {"title": "t", "prompt": "p", "config": {
                "workspacePath": "/w", "providerId": "openai", "modelId": "gpt-5"}})
            for config, field in BAD_CONFIG:
                got = await _refusal(c, "tasks.update", {"taskId": good["id"], "config": config})
                assert got == ("INVALID_PARAMS", field), config
            assert await c.call("tasks.get", {"taskId": good["id"]}) == good


def _write_old_row(data: Path, tid: str) -> None:
    """Offline, with the host down: the task's config as an older build stored it (blank values)."""
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        conn.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = ?",
                     (orjson.dumps(OLD_CONFIG).decode(), tid))
        conn.commit()
    finally:
        conn.close()


async def test_a_row_an_older_build_wrote_with_blank_values_still_lists_runs_and_updates(tmp_path: Path) -> None:
    """An update that does not set workspacePath/providerId/modelId (top-level fields, or a config sent back
    as read) succeeds on such a row; the blank values read as unset on the wire and in what a run applies."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            tid = (await c.call("tasks.create", {"title": "t", "prompt": "p", "cadence": "hourly",
                                                 "schedule": {"hour": 0, "minute": 0}}))["id"]
        _write_old_row(tmp_path, tid)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            listed = await c.call("tasks.list", {})
            assert "unreadable" not in listed and [t["id"] for t in listed["tasks"]] == [tid]
            [task] = listed["tasks"]
            m.ScheduledTask.model_validate(task)
            assert not {"workspacePath", "providerId", "modelId"} & task.keys()
            assert task["config"]["workspacePath"] == ""  # config stays as stored
            renamed = await c.call("tasks.update", {"taskId": tid, "title": "renamed", "thinkingLevel": "high"})
            assert (renamed["title"], renamed["thinkingLevel"]) == ("renamed", "high")
            sent_back = await c.call("tasks.update", {"taskId": tid, "config": {**renamed["config"], "custom": 2}})
            assert sent_back["config"]["custom"] == 2 and sent_back["config"]["providerId"] == ""
            run = await c.call("tasks.startRun", {"taskId": tid})
            assert not {"workspacePath", "providerId", "modelId"} & run["settings"].keys()
            await c.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
            # Setting one of them now meets the rule; a real value replaces the blank one.
            before = await c.call("tasks.get", {"taskId": tid})
            assert await _refusal(c, "tasks.update", {"taskId": tid, "providerId": "openai"}) == (
                "INVALID_PARAMS", "config.modelId")  # paired: the blank modelId is no model
            assert await c.call("tasks.get", {"taskId": tid}) == before
            fixed = await c.call("tasks.update", {"taskId": tid, "workspacePath": "/w", "providerId": "openai",
                                                  "modelId": "gpt-5"})
            assert (fixed["workspacePath"], fixed["providerId"], fixed["modelId"]) == ("/w", "openai", "gpt-5")


def test_the_scheduler_fires_an_old_blank_row_with_the_app_defaults(conn: sqlite3.Connection) -> None:
    """The task.due payload of such a row carries no blank provider, model or workspace; a store-level
    rewrite of that config keeps it, and a new blank value is still refused there."""
    conn.execute("INSERT INTO scheduled_tasks(id, title, prompt, cadence, enabled, project_id, config_json, "
                 "last_run_at, created_at, updated_at) VALUES ('old', 't', 'p', 'hourly', 1, NULL, ?, NULL, ?, ?)",
                 (orjson.dumps({**OLD_CONFIG, "nextRunAt": NOW + HOUR}).decode(), NOW, NOW))
    batch = schedule.fire_due(conn, now_ms=NOW + HOUR, new_run_id=lambda: "run-1")
    [outcome] = batch.outcomes
    assert outcome.kind == "started"
    payload = schedule.due_payload(outcome)
    m.TaskDueEvent.model_validate(payload)
    assert not {"workspacePath", "providerId", "modelId"} & payload.keys()
    kept = tasks.update_task(conn, "old", {"config": dict(tasks.get_task(conn, "old")["config"])}, now_ms=NOW)
    assert kept["config"]["workspacePath"] == ""
    with pytest.raises(InvalidInput) as bad:
        tasks.create_task(conn, task_id="new", title="t", prompt="p", config={"workspacePath": ""}, now_ms=NOW)
    assert bad.value.data == {"field": "config.workspacePath"}
