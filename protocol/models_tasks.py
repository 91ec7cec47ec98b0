"""Params and results: scheduled tasks, tasks.* (seed 003 §4.11)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from .models_common import (
    MAX_REF_CHARS,
    MAX_TEXT_FIELD,
    ErrorCode,
    JsonObject,
    Mode,
    MutatingParams,
    Params,
    PermissionMode,
    ProjectPath,
    Record,
    Result,
    SessionId,
    ThinkingLevel,
    TimestampMs,
    WireId,
    label_rule,
)

# ---------------------------------------------------------------------------
# Scheduled tasks (seed 003 §4.11)

Cadence = Literal["manual", "hourly", "daily", "weekly"]
TaskMode = Literal["plan", "agent", "goal", "chat"]
TaskTitle = Annotated[str, StringConstraints(min_length=1, max_length=200), label_rule("a task title"),
                      Field(description="1-200 characters, kept as sent; blank or holding a control character "
                            "other than tab, line feed, carriage return is INVALID_PARAMS.")]
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_FIELD)]
RunStatus = Literal["running", "completed", "aborted", "error"]
RunTrigger = Literal["manual", "schedule"]
RunAt = Annotated[str, Field(
    description="RFC 3339 timestamp in UTC with milliseconds, e.g. 2026-07-27T08:30:00.000Z.",
    pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")]
Weekday = Annotated[int, Field(ge=0, le=6, description="0 = Sunday ... 6 = Saturday.")]
# The same rules hold for these keys inside ``config`` (store/tasks.py checks them with store/rules.py's
# path_problem and text_problem, on the same bounds): a value newly written there is refused as at the top level.
WorkspacePath = ProjectPath  # 1-4096 chars, no NUL, at most 4096 bytes: INVALID_PARAMS, never an OSError at run time
ProviderRef = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REF_CHARS)]


class TaskSchedule(Result):
    """Calendar fields of a task (host local time); hourly tasks ignore them. The object itself arms the
    task: an hourly, daily or weekly task without one is unarmed (no nextRunAt, never fires)."""

    hour: int | None = None
    minute: int | None = None
    weekday: int | None = None


class TaskScheduleInput(Record):
    hour: int | None = Field(default=None, ge=0, le=23)
    minute: int | None = Field(default=None, ge=0, le=59)
    weekday: Weekday | None = None


class ScheduledTask(Result):
    """A scheduled task (§4.11). The top-level schedule, weekdays, workspacePath, permissionMode,
    providerId/modelId, thinkingLevel and calendarConfigured are projections of ``config``; absent
    when unset."""

    id: str
    title: str
    prompt: str
    cadence: Cadence
    enabled: bool
    mode: Mode = Field(description="Normalized projection of config.mode (chat → plan, absent → agent).")
    config: JsonObject = Field(description="The stored extension object (kept as sent, without the host's "
                                           "internal nextRunAt); the projected keys below come from it.")
    schedule: TaskSchedule | None = None
    weekdays: list[int] | None = Field(default=None, description="Weekly days (0 = Sunday); overrides "
                                                                 "schedule.weekday.")
    workspace_path: str | None = None
    permission_mode: PermissionMode | None = Field(
        default=None, description="Task-owned permission; absent: Ask for automatic runs, inherit for Run now.")
    provider_id: str | None = Field(default=None, description="Task-owned model override (with modelId); "
                                                              "absent: the app default at run time.")
    model_id: str | None = None
    thinking_level: ThinkingLevel | None = Field(default=None, description="Applied to manual and automatic "
                                                                           "runs; absent: off.")
    calendar_configured: bool = Field(
        default=False, description="Known calendar intent: explicit, or inferred for a daily/weekly task with a "
                                   "saved schedule. Converting an hourly task to daily/weekly needs it true.")
    project_id: int | None = None
    last_run_at: TimestampMs | None = None
    next_run_at: RunAt | None = Field(default=None, description="The next armed slot; absent when unarmed "
                                                                "(manual, or no saved schedule object: hourly "
                                                                "needs one too).")
    created_at: TimestampMs
    updated_at: TimestampMs


class _TaskFields(MutatingParams):
    """The projected config keys, accepted at the top level (they win over the same key in ``config``)."""

    schedule: TaskScheduleInput | None = None
    weekdays: list[Weekday] | None = Field(default=None, min_length=1, max_length=7)
    workspace_path: WorkspacePath | None = None
    permission_mode: PermissionMode | None = None
    provider_id: ProviderRef | None = Field(default=None, description="Set together with modelId.")
    model_id: ProviderRef | None = None
    thinking_level: ThinkingLevel | None = None
    calendar_configured: bool | None = Field(
        default=None, description="Explicit calendar intent; true confirms an hourly → daily/weekly conversion.")


class TasksCreateParams(_TaskFields):
    task_id: WireId | None = Field(default=None, description="Generated when absent.")
    title: TaskTitle
    prompt: Prompt
    cadence: Cadence = "manual"
    enabled: bool = True
    project_id: int | None = Field(default=None, ge=1)
    mode: TaskMode | None = Field(default=None, description="Stored as config.mode; default agent.")
    config: JsonObject | None = Field(default=None, description="Extension keys; a nextRunAt in it (an older "
                                                                "client's integer) is ignored: the host "
                                                                "computes it.")


class TasksUpdateParams(_TaskFields):
    """Top-level projected fields set one config key each; sent as null they remove it."""

    task_id: WireId
    title: TaskTitle | None = None
    prompt: Prompt | None = None
    cadence: Cadence | None = None
    enabled: bool | None = None
    project_id: int | None = Field(default=None, ge=1)
    mode: TaskMode | None = None
    config: JsonObject | None = Field(
        default=None,
        description="Replaces the whole config object; without a mode in it the task keeps its mode "
        "(change it with mode or config.mode).")


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
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of tasks whose stored record is damaged (a config_json that no longer parses): left out "
        "of tasks, so the others still list; tasks.get of one answers CORRUPT_DATA. Absent when every record reads.",
    )


class TaskRunSettings(Result):
    """What a run applies (§4.11): the task's values, else the legacy defaults."""

    trigger: RunTrigger = Field(description="manual: Run now (tasks.startRun); schedule: the scheduler.")
    mode: Mode
    permission_mode: PermissionMode = Field(description="The task's permissionMode; absent: inherit for Run "
                                                        "now (the session's), ask for an automatic run.")
    thinking_level: ThinkingLevel = Field(description="The task's thinkingLevel; absent or cleared: off.")
    provider_id: str | None = Field(default=None, description="Absent: the app default at run time.")
    model_id: str | None = None
    workspace_path: str | None = None


class TaskRun(Result):
    id: str
    task_id: str
    session_id: str | None = None
    status: RunStatus
    error_code: str | None = None
    started_at: TimestampMs
    ended_at: TimestampMs | None = None
    settings: TaskRunSettings | None = Field(default=None, description="tasks.startRun only: what the run "
                                                                       "applies.")


class TasksRunsParams(Params):
    task_id: WireId
    limit: int = Field(default=100, ge=1, le=100)


class TasksRunsResult(Result):
    runs: list[TaskRun] = Field(description="Newest first; at most the last 100 are kept.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of runs whose stored record is damaged (a status outside its set): left out of runs, so "
        "the others still list; they count toward limit. A task whose own record is damaged still lists its runs. "
        "Absent when every record reads.",
    )


class TasksStartRunParams(MutatingParams):
    task_id: WireId
    run_id: WireId | None = Field(default=None, description="Generated when absent.")
    session_id: SessionId | None = Field(default=None, description="The session holding the run's transcript.")


class TasksFinishRunParams(MutatingParams):
    run_id: WireId
    status: Literal["completed", "aborted", "error"]
    error_code: ErrorCode | None = Field(
        default=None, description="Why an error or aborted run ended; with status completed it is INVALID_PARAMS "
        "(as session.endTurn).")
    session_id: SessionId | None = Field(
        default=None, description="The session the agent created for this run (links its transcript)."
    )

    @model_validator(mode="after")
    def _no_error_on_success(self) -> TasksFinishRunParams:
        if self.status == "completed" and self.error_code is not None:
            raise ValueError("errorCode is only valid for an error or aborted run")
        return self


__all__ = [
    "Cadence",
    "Prompt",
    "RunAt",
    "RunStatus",
    "RunTrigger",
    "ScheduledTask",
    "TaskIdParams",
    "TaskMode",
    "TaskRun",
    "TaskRunSettings",
    "TaskSchedule",
    "TaskScheduleInput",
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
