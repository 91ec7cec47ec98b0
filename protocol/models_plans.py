"""Params and results: plan/goal approvals, plans.* (seed 003 §4.6a)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .models_attachments import Sha256
from .models_common import (
    Count,
    MutatingParams,
    Params,
    ProjectRoot,
    Result,
    SessionId,
    TimestampMs,
    WireId,
)
from .models_records import SessionSummary

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
                          description="Written byte-for-byte (UTF-8) to .pi/<kind>/<unique>.md; at most "
                                      "1,048,576 bytes of UTF-8, so fewer characters when some are multi-byte: "
                                      "more than 1,048,576 characters is INVALID_PARAMS (this field's bound), "
                                      "fewer characters that take more bytes PAYLOAD_TOO_LARGE.")
    title: Annotated[str, StringConstraints(max_length=200)] = ""
    question: Annotated[str, StringConstraints(max_length=2000)] = ""
    workspace_root: ProjectRoot = Field(description="Absolute (a relative one is INVALID_PARAMS); must be the "
                                              "session's project path.")
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
    execution_state: Literal["queued", "running", "completed", "failed", "cancelled", "interrupted"] | None = (
        Field(default=None, description="After approval: queued → running (bound to its turn) → completed | failed "
              "| cancelled; interrupted by a host restart.")
    )
    execution_turn_id: str | None = Field(default=None, description="The turn that runs the execution.")
    execution_error_code: str | None = None
    execution_started_at: TimestampMs | None = None
    execution_ended_at: TimestampMs | None = None


class PlansPendingParams(Params):
    session_id: SessionId | None = None


class PlansPendingResult(Result):
    pending: list[PlanApproval] = Field(description="Only pending rows, newest first; terminal ones are never "
                                        "rehydrated.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Request ids of pending plan/goal approvals whose stored record is damaged (a value outside "
        "its set; a status outside its set of a request never settled too): left out of pending, so the others "
        "still list; such a request still holds its session (a new plans.submit is CONFLICT naming it), unless its "
        "status is the damaged value. Absent when every record reads.",
    )


class PlansRespondParams(MutatingParams):
    request_id: WireId
    action: Literal["approve", "reject"]
    target_permission_mode: TargetPermissionMode | None = Field(
        default=None, description="Approve only: the session's explicit permission mode from now on."
    )


class PlansRespondResult(Result):
    approval: PlanApproval
    session: SessionSummary


class PlansStartExecutionParams(MutatingParams):
    session_id: SessionId
    execution_id: WireId
    turn_id: WireId = Field(description="The running turn that executes the approved plan/goal.")


class PlansFinishExecutionParams(MutatingParams):
    session_id: SessionId
    execution_id: WireId
    turn_id: WireId | None = Field(
        default=None, description="The executing turn (required once running; a queued one can only be cancelled)."
    )
    outcome: Literal["completed", "failed", "cancelled"]
    error_code: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None


class PlanExecutionResult(Result):
    approval: PlanApproval
    session: SessionSummary


__all__ = [
    "PlanApproval",
    "PlanExecutionResult",
    "PlansFinishExecutionParams",
    "PlansStartExecutionParams",
    "PlansPendingParams",
    "PlansPendingResult",
    "PlansRespondParams",
    "PlansRespondResult",
    "PlansSubmitParams",
    "ProposalKind",
    "TargetPermissionMode",
]
