"""Params and results: audit.list (seed 003 §4.13)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints, model_validator

from .models_common import Cursor, Params, Result, SessionId, TimestampMs

AuditKind = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]


class AuditListParams(Params):
    session_id: SessionId | None = Field(default=None, description="Only this session's rows.")
    kind: AuditKind | None = Field(
        default=None, description="Only rows of this kind: tool_execute, tool_denied, turn_interrupted, "
        "plan_interrupted, inflight_promoted (an open set)."
    )
    since: TimestampMs | None = Field(default=None, description="Rows at or after this time (ms).")
    until: TimestampMs | None = Field(default=None, description="Rows before this time (ms).")
    limit: int = Field(default=100, ge=1, le=500)
    cursor: Cursor | None = None

    @model_validator(mode="after")
    def _ordered_range(self) -> AuditListParams:
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValueError("since must not be after until (since == until is the empty range)")
        return self


class AuditEntry(Result):
    id: int = Field(ge=1, description="Increasing with insertion order.")
    ts: TimestampMs
    kind: str
    session_id: SessionId | None = None
    payload: dict[str, Any] = Field(description="What the row records (tool, callId, requestId, by, …).")


class AuditListResult(Result):
    entries: list[AuditEntry] = Field(description="Newest ts first (ties: newest id first).")
    next_cursor: str | None = None


__all__ = ["AuditEntry", "AuditListParams", "AuditListResult", "AuditKind"]
