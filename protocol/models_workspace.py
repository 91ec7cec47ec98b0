"""Params and results: workspace.* and session.resolvePath (seed 003 §4.1 D093, §4.2, §11.9, §11.10)."""

from __future__ import annotations

from pydantic import Field

from .models_common import MutatingParams, Params, ProjectPath, ProjectRoot, Result, SessionId, Title
from .models_projects import Project


class WorkspaceOpenParams(MutatingParams):
    path: ProjectRoot = Field(description="Absolute; stored canonical (trimmed, '/' separators, no trailing '/').")
    name: Title | None = Field(default=None, description="Display name (default: the last path component).")


class WorkspaceResult(Result):
    current_project_id: int | None = Field(default=None, description="kv(app, currentProjectId).")
    project: Project | None = Field(default=None, description="Absent when no (existing) project is selected.")


class WorkspaceGetParams(Params):
    pass


class SessionResolvePathParams(Params):
    session_id: SessionId
    path: ProjectPath | None = Field(default=None, description="Relative paths resolve against the session's root.")


class SessionResolvePathResult(Result):
    session_id: str
    project_id: int | None = Field(default=None, description="The session's persisted project (its tool root).")
    root: str | None = Field(default=None, description="That project's path; never the visible workspace.")
    path: str | None = Field(default=None, description="The requested path, absolute and folded ('.', '..').")
    inside_root: bool | None = Field(default=None, description="Whether path stays under root.")


__all__ = [
    "SessionResolvePathParams",
    "SessionResolvePathResult",
    "WorkspaceGetParams",
    "WorkspaceOpenParams",
    "WorkspaceResult",
]
