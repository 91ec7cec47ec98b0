"""Params and results: artifacts.list (seed 003 §4.10)."""

from __future__ import annotations

from pydantic import Field

from .models_common import (
    ArtifactOp,
    Cursor,
    Params,
    Result,
    SessionId,
    TimestampMs,
)

# ---------------------------------------------------------------------------
# Artifacts (seed 003 §4.10)


class ArtifactsListParams(Params):
    session_id: SessionId | None = None
    limit: int = Field(default=100, ge=1, le=500)
    cursor: Cursor | None = None


class Artifact(Result):
    session_id: SessionId
    path: str = Field(
        description="Absolute, workspace-resolved: a tool's relative path joined to the session's project root "
        "by session.resolvePath's rule. Writes that resolve into the session's scratch directory are not listed."
    )
    op: ArtifactOp
    turn_id: str | None = None
    updated_at: TimestampMs


class ArtifactsListResult(Result):
    artifacts: list[Artifact] = Field(description="Newest updatedAt first.")
    next_cursor: str | None = None
    unreadable: list[str] | None = Field(
        default=None,
        description="Paths of this page's artifacts whose stored record is damaged (an op outside its set): left "
        "out of artifacts, so the others still list; they count toward limit and nextCursor moves past them. "
        "Absent when every record reads.",
    )


__all__ = [
    "Artifact",
    "ArtifactsListParams",
    "ArtifactsListResult",
]
