"""Params and results: secrets, attachments, scheduled tasks, plan/goal approvals, projects."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .models_common import (
    MAX_PATH_CHARS,
    MAX_TEXT_FIELD,
    Count,
    ErrorCode,
    JsonObject,
    Mode,
    MutatingParams,
    Params,
    ProjectPath,
    Ref,
    Result,
    SessionId,
    TimestampMs,
    WireId,
)
from .models_records import SessionSummary

# ---------------------------------------------------------------------------
# Secrets (seed 003 §4.12, §10)

SecretRef = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512),
    Field(description="Secret reference, e.g. provider/anthropic (1-512 bytes, no control characters)."),
]
MAX_SECRET_CHARS = 64 * 1024


class SecretsSetParams(MutatingParams):
    ref: SecretRef
    value: str = Field(max_length=MAX_SECRET_CHARS,
                       description="The secret; encrypted at rest (AES-256-GCM), never echoed, never in SQLite.")
    owner_kind: Ref | None = Field(default=None, description="Default provider.")
    owner_id: Ref | None = None
    kind: Ref | None = Field(default=None, description="Default api_key.")


class SecretsSetResult(Result):
    ref: str
    updated_at: TimestampMs
    version: int = Field(ge=1, description="Bumped on every write of this ref (authenticated in the file).")


class SecretsRefParams(Params):
    ref: SecretRef


class SecretsGetResult(Result):
    ref: str
    value: str


class SecretsDeleteParams(MutatingParams):
    ref: SecretRef


class SecretsDeleteResult(Result):
    ref: str
    deleted: bool = Field(description="False when no such secret existed.")


class SecretsListParams(Params):
    owner_kind: Ref | None = None
    owner_id: Ref | None = None


class SecretMeta(Result):
    ref: str
    owner_kind: str
    owner_id: str | None = None
    kind: str
    backend: str = Field(description="file_fallback (safe_storage is reserved).")
    updated_at: TimestampMs


class SecretsListResult(Result):
    secrets: list[SecretMeta] = Field(description="Bookkeeping only; never a value.")


# ---------------------------------------------------------------------------
# Attachments (seed 000 §2.3, §5)

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
MAX_PUT_BYTES = 4 * 1024 * 1024
MimeType = Annotated[str, StringConstraints(min_length=1, max_length=200)]
FileName = Annotated[str, StringConstraints(min_length=1, max_length=255)]


class AttachmentsPutParams(MutatingParams):
    name: FileName
    mime_type: MimeType
    data_base64: str = Field(
        max_length=(MAX_PUT_BYTES + 2) // 3 * 4,
        description="Standard base64 of at most 4 MiB; use attachments.importFile for larger files.",
    )


class AttachmentsImportParams(MutatingParams):
    path: Annotated[str, StringConstraints(min_length=2, max_length=MAX_PATH_CHARS)] = Field(
        description="Absolute path of a regular file; copied and hashed as a stream."
    )
    name: FileName | None = None
    mime_type: MimeType | None = None


class AttachmentBlob(Result):
    ref: str = Field(description="attachments/<sha256>")
    sha256: Sha256
    size: Count
    name: str | None = None
    mime_type: str | None = None


class AttachmentsRefParams(MutatingParams):
    sha256: Sha256
    session_id: SessionId
    message_id: WireId | None = None


class AttachmentsRefResult(Result):
    sha256: Sha256
    session_id: SessionId
    message_id: str | None = None
    created: bool = Field(description="False when the reference already existed.")


class AttachmentsEstimateParams(Params):
    pass


class AttachmentsEstimate(Result):
    used_bytes: Count
    budget_bytes: int = Field(ge=1, description="kv(app, attachmentBudgetBytes), default 200 MB.")
    percent: float = Field(ge=0)
    warning: bool = Field(description="True above 80 % of the budget.")
    blobs: Count


class AttachmentsGcParams(MutatingParams):
    active_session_id: SessionId | None = Field(
        default=None, description="Blobs this session references are never evicted."
    )


class AttachmentsGcResult(Result):
    evicted: list[Sha256] = Field(description="Least recently used first.")
    freed_bytes: Count
    orphans_removed: Count = Field(description="Blob files without an index row (crash leftovers).")
    estimate: AttachmentsEstimate


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


# ---------------------------------------------------------------------------
# Plan / goal approvals (seed 003 §4.6a)

ProposalKind = Literal["plan", "goal"]
TargetPermissionMode = Literal["ask", "accept-edits", "auto"]


class PlansSubmitParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId
    tool_call_id: WireId
    kind: ProposalKind
    markdown: str = Field(min_length=1, max_length=1024 * 1024,
                          description="Written byte-for-byte (UTF-8) to .pi/<kind>/<unique>.md.")
    title: Annotated[str, StringConstraints(max_length=200)] = ""
    question: Annotated[str, StringConstraints(max_length=2000)] = ""
    workspace_root: ProjectPath = Field(description="Absolute; must be the session's project path.")
    expires_at: TimestampMs | None = Field(default=None, description="Absolute deadline (kept as sent).")


class PlanApproval(Result):
    request_id: str
    session_id: SessionId
    turn_id: str
    tool_call_id: str
    kind: ProposalKind
    title: str
    question: str
    status: Literal["pending", "approved", "changes_requested", "rejected", "expired", "interrupted"]
    action: str | None = None
    target_permission_mode: TargetPermissionMode | None = None
    created_at: TimestampMs
    updated_at: TimestampMs
    expires_at: TimestampMs | None = None
    resolved_at: TimestampMs | None = None
    error_code: str | None = None
    artifact_path: str = Field(description="Relative to the workspace: .pi/<kind>/<unique>.md")
    artifact_sha256: Sha256
    artifact_size: Count
    version: int
    execution_id: str | None = None
    execution_state: Literal["queued", "running", "completed", "interrupted"] | None = None


class PlansPendingParams(Params):
    session_id: SessionId | None = None


class PlansPendingResult(Result):
    pending: list[PlanApproval] = Field(description="Only pending rows; terminal ones are never rehydrated.")


class PlansRespondParams(MutatingParams):
    request_id: WireId
    action: Literal["approve", "reject"]
    target_permission_mode: TargetPermissionMode | None = Field(
        default=None, description="Approve only: the session's explicit permission mode from now on."
    )


class PlansRespondResult(Result):
    approval: PlanApproval
    session: SessionSummary


# ---------------------------------------------------------------------------
# Projects (seed 003 §4.2)


class Project(Result):
    id: int
    path: str
    name: str
    pinned: bool
    created_at: TimestampMs
    last_opened_at: TimestampMs
    session_count: Count


class ProjectsListParams(Params):
    pass


class ProjectsListResult(Result):
    projects: list[Project] = Field(description="Most recently opened first.")


class ProjectsRemoveParams(MutatingParams):
    project_id: int = Field(ge=1)


class ProjectsRemoveResult(Result):
    project_id: int
    path: str
    deleted_sessions: list[str] = Field(description="Sessions deleted with it (rows and files).")


__all__ = [
    "AttachmentBlob",
    "AttachmentsEstimate",
    "AttachmentsEstimateParams",
    "AttachmentsGcParams",
    "AttachmentsGcResult",
    "AttachmentsImportParams",
    "AttachmentsPutParams",
    "AttachmentsRefParams",
    "AttachmentsRefResult",
    "PlanApproval",
    "PlansPendingParams",
    "PlansPendingResult",
    "PlansRespondParams",
    "PlansRespondResult",
    "PlansSubmitParams",
    "Project",
    "ProjectsListParams",
    "ProjectsListResult",
    "ProjectsRemoveParams",
    "ProjectsRemoveResult",
    "ScheduledTask",
    "SecretMeta",
    "SecretsDeleteParams",
    "SecretsDeleteResult",
    "SecretsGetResult",
    "SecretsListParams",
    "SecretsListResult",
    "SecretsRefParams",
    "SecretsSetParams",
    "SecretsSetResult",
    "TaskIdParams",
    "TaskRun",
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
