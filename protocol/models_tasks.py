"""Params and results: scheduled tasks, tasks.* (seed 003 §4.11)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .models_common import (
    MAX_TEXT_FIELD,
    ErrorCode,
    JsonObject,
    Mode,
    MutatingParams,
    Params,
    Result,
    SessionId,
    TimestampMs,
    WireId,
)

# ---------------------------------------------------------------------------
# Scheduled tasks (seed 003 §4.11)

Cadence = Literal["manual", "hourly", "daily", "weekly"]
TaskMode = Literal["plan", "agent", "goal", "chat"]
TaskTitle = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_FIELD)]
RunStatus = Literal["running", "completed", "aborted", "error"]


class ScheduledTask(Result):
    id: str
    title: str
    prompt: str
    cadence: Cadence
    enabled: bool
    mode: Mode = Field(description="Normalized projection of config.mode (chat → plan, absent → agent).")
    config: JsonObject = Field(description="schedule, weekdays, workspacePath, permissionMode, providerId/"
                                           "modelId, thinkingLevel, nextRunAt, ... (kept as sent).")
    project_id: int | None = None
    last_run_at: TimestampMs | None = None
    next_run_at: TimestampMs | None = None
    created_at: TimestampMs
    updated_at: TimestampMs


class TasksCreateParams(MutatingParams):
    task_id: WireId | None = Field(default=None, description="Generated when absent.")
    title: TaskTitle
    prompt: Prompt
    cadence: Cadence = "manual"
    enabled: bool = True
    project_id: int | None = Field(default=None, ge=1)
    mode: TaskMode | None = Field(default=None, description="Stored as config.mode; default agent.")
    config: JsonObject | None = None


class TasksUpdateParams(MutatingParams):
    task_id: WireId
    title: TaskTitle | None = None
    prompt: Prompt | None = None
    cadence: Cadence | None = None
    enabled: bool | None = None
    project_id: int | None = Field(default=None, ge=1)
    mode: TaskMode | None = None
    config: JsonObject | None = Field(default=None, description="Replaces the whole config object.")


class TaskIdParams(Params):
    task_id: WireId


class TasksDeleteParams(MutatingParams):
    task_id: WireId


class TasksDeleteResult(Result):
    task_id: str
    deleted: bool


class TasksListParams(Params):
    pass


class TasksListResult(Result):
    tasks: list[ScheduledTask]


class TaskRun(Result):
    id: str
    task_id: str
    session_id: str | None = None
    status: RunStatus
    error_code: str | None = None
    started_at: TimestampMs
    ended_at: TimestampMs | None = None


class TasksRunsParams(Params):
    task_id: WireId
    limit: int = Field(default=100, ge=1, le=100)


class TasksRunsResult(Result):
    runs: list[TaskRun] = Field(description="Newest first; at most the last 100 are kept.")


class TasksStartRunParams(MutatingParams):
    task_id: WireId
    run_id: WireId | None = Field(default=None, description="Generated when absent.")
    session_id: SessionId | None = Field(default=None, description="The session holding the run's transcript.")


class TasksFinishRunParams(MutatingParams):
    run_id: WireId
    status: Literal["completed", "aborted", "error"]
    error_code: ErrorCode | None = None
    session_id: SessionId | None = Field(
        default=None, description="The session the agent created for this run (links its transcript)."
    )


__all__ = [
    "Cadence",
    "Prompt",
    "RunStatus",
    "ScheduledTask",
    "TaskIdParams",
    "TaskMode",
    "TaskRun",
    "TaskTitle",
    "TasksCreateParams",
    "TasksDeleteParams",
    "TasksDeleteResult",
    "TasksFinishRunParams",
    "TasksListParams",
    "TasksListResult",
    "TasksRunsParams",
    "TasksRunsResult",
    "TasksStartRunParams",
    "TasksUpdateParams",
]
