"""Params and results: projects.* (seed 003 §4.2)."""

from __future__ import annotations

from pydantic import Field

from .models_common import (
    Count,
    MutatingParams,
    Params,
    Result,
    TimestampMs,
)

# ---------------------------------------------------------------------------
# Projects (seed 003 §4.2)


class Project(Result):
    id: int
    path: str
    name: str
    pinned: bool
    created_at: TimestampMs
    last_opened_at: TimestampMs
    session_count: Count = Field(description="Its sessions session.list shows (the trash left out).")
    trashed_session_count: Count = Field(
        description="Its sessions in the trash. projects.remove deletes sessionCount + trashedSessionCount "
                    "sessions.")


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


class ProjectsPinParams(MutatingParams):
    project_id: int = Field(ge=1)
    pinned: bool


class ProjectResult(Result):
    project: Project


__all__ = [
    "Project",
    "ProjectResult",
    "ProjectsPinParams",
    "ProjectsListParams",
    "ProjectsListResult",
    "ProjectsRemoveParams",
    "ProjectsRemoveResult",
]
