"""Scheduled tasks (seed 003 §4.11): DB-only; effect + receipt in one durable transaction.

A change (create / update / delete / startRun) wakes the scheduler actor once
it committed; the scheduler also re-reads its next slot periodically, so a
lost wake-up only delays a change.
"""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store import tasks
from store.ids import new_id
from store.receipts import ReceiptKey

__all__ = ["create", "delete", "finish_run", "get", "list_tasks", "runs", "start_run", "update"]


def _projected(p: m.TasksCreateParams | m.TasksUpdateParams) -> dict[str, Any]:
    """The top-level projected fields the client sent, as config keys (``None``: sent as null)."""
    out: dict[str, Any] = {}
    for name in p.model_fields_set:
        field = type(p).model_fields[name]
        key = field.alias or name
        if key in tasks.PROJECTED_KEYS:
            value = getattr(p, name)
            out[key] = value.model_dump(exclude_none=True) if isinstance(value, m.TaskScheduleInput) else value
    return out


def create(ctx: WriterContext, p: m.TasksCreateParams, key: ReceiptKey | None) -> Any:
    config = dict(p.config or {})
    config.update({k: v for k, v in _projected(p).items() if v is not None})
    if p.mode is not None:
        config["mode"] = p.mode
    ctx.after_commit(ctx.wake_scheduler)
    return tasks.to_wire(tasks.create_task(
        ctx.conn, task_id=p.task_id or new_id("task_"), title=p.title, prompt=p.prompt, cadence=p.cadence,
        enabled=p.enabled, project_id=p.project_id, config=config, now_ms=ctx.now))


def update(ctx: WriterContext, p: m.TasksUpdateParams, key: ReceiptKey | None) -> Any:
    patch: dict[str, Any] = {}
    for name, value in (("title", p.title), ("prompt", p.prompt), ("cadence", p.cadence), ("enabled", p.enabled),
                        ("projectId", p.project_id), ("mode", p.mode)):
        if value is not None:
            patch[name] = value
    if p.config is not None:
        patch["config"] = dict(p.config)
    keys = _projected(p)
    if keys:
        patch["configKeys"] = keys
    ctx.after_commit(ctx.wake_scheduler)
    return tasks.to_wire(tasks.update_task(ctx.conn, p.task_id, patch, now_ms=ctx.now))


def delete(ctx: WriterContext, p: m.TasksDeleteParams, key: ReceiptKey | None) -> Any:
    ctx.after_commit(ctx.wake_scheduler)
    return {"taskId": p.task_id, "deleted": tasks.delete_task(ctx.conn, p.task_id)}


def start_run(ctx: WriterContext, p: m.TasksStartRunParams, key: ReceiptKey | None) -> Any:
    ctx.after_commit(ctx.wake_scheduler)
    run = tasks.start_run(ctx.conn, task_id=p.task_id, run_id=p.run_id or new_id("run_"),
                          session_id=p.session_id, now_ms=ctx.now)
    # Run now: a missing permission inherits the session's; the thinking level applies as for automatic runs.
    return {**run, "settings": tasks.run_settings(tasks.get_task(ctx.conn, p.task_id), trigger="manual")}


def finish_run(ctx: WriterContext, p: m.TasksFinishRunParams, key: ReceiptKey | None) -> Any:
    return tasks.finish_run(ctx.conn, run_id=p.run_id, status=p.status, error_code=p.error_code,
                            session_id=p.session_id, now_ms=ctx.now)


def list_tasks(ctx: ReadContext, p: m.TasksListParams) -> Any:
    return tasks.readable_tasks(ctx.conn).map(tasks.to_wire).result("tasks")


def get(ctx: ReadContext, p: m.TaskIdParams) -> Any:
    return tasks.to_wire(tasks.get_task(ctx.conn, p.task_id))


def runs(ctx: ReadContext, p: m.TasksRunsParams) -> Any:
    return tasks.list_runs(ctx.conn, p.task_id, limit=p.limit).result("runs")
