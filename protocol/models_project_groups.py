"""Params and results: projectGroups.* (seed 003 §1 project groups, §4.2 memory)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from store.rules import MAX_GROUP_ROOTS, MAX_TEXT_FIELD

from .models_common import MutatingParams, Params, ProjectRoot, Result, TimestampMs

GroupId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,100}$")]
GroupName = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class ProjectGroup(Result):
    id: str = Field(description="project:<projectId> for a legacy single-root projection.")
    name: str
    roots: list[str] = Field(description="Ordered canonical roots.")
    primary_root: str
    detached_paths: list[str] | None = Field(default=None, description="Roots removed from the group (kept).")
    legacy: bool | None = Field(default=None, description="A path project projected as a group (read-only).")
    created_at: TimestampMs
    updated_at: TimestampMs


class MemoryEntry(Result):
    id: str
    title: str
    content: str


class Memory(Result):
    format: str = Field(description="entries-v1")
    entries: list[MemoryEntry]
    content: str = Field(description="Derived plain text (what the runtime loads), at most 32 KiB.")
    updated_at: TimestampMs | None = None
    legacy: bool | None = Field(default=None, description="Stored as plain text by an older build.")


class ProjectGroupsListParams(Params):
    pass


class ProjectGroupsListResult(Result):
    groups: list[ProjectGroup] = Field(description="Stored groups by name, then legacy projections.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of stored groups whose record is damaged (it no longer parses as an object): left "
        "out of groups, so the others still list; the roots it claimed are not known, so their path projects are "
        "listed as legacy projections; projectGroups.get of one answers CORRUPT_DATA, projectGroups.delete "
        "removes it. Absent when every record reads.",
    )


class ProjectGroupsGetParams(Params):
    group_id: GroupId


class ProjectGroupsGetResult(Result):
    group: ProjectGroup
    memory: Memory
    instructions: str | None = None


class ProjectGroupsSaveParams(MutatingParams):
    group_id: GroupId | None = Field(default=None, description="Absent: create a group.")
    name: GroupName
    roots: list[ProjectRoot] = Field(min_length=1, max_length=MAX_GROUP_ROOTS)
    primary_root: ProjectRoot | None = Field(default=None, description="Default: the first root.")


class ProjectGroupResult(Result):
    group: ProjectGroup


class ProjectGroupsDeleteParams(MutatingParams):
    group_id: GroupId


class ProjectGroupsDeleteResult(Result):
    group_id: str
    deleted: bool


class ProjectGroupsSetMemoryParams(MutatingParams):
    group_id: GroupId
    memory: Any = Field(description='Text, or {"format": "entries-v1", "entries": [{id?, title?, content}]}.')


class ProjectGroupsMemoryResult(Result):
    group_id: str
    memory: Memory


class ProjectGroupsSetInstructionsParams(MutatingParams):
    group_id: GroupId
    instructions: str = Field(max_length=MAX_TEXT_FIELD, description="Blank removes them; at most 32 KiB.")


class ProjectGroupsInstructionsResult(Result):
    group_id: str
    instructions: str | None = None


__all__ = [
    "Memory",
    "MemoryEntry",
    "ProjectGroup",
    "ProjectGroupResult",
    "ProjectGroupsDeleteParams",
    "ProjectGroupsDeleteResult",
    "ProjectGroupsGetParams",
    "ProjectGroupsGetResult",
    "ProjectGroupsInstructionsResult",
    "ProjectGroupsListParams",
    "ProjectGroupsListResult",
    "ProjectGroupsMemoryResult",
    "ProjectGroupsSaveParams",
    "ProjectGroupsSetInstructionsParams",
    "ProjectGroupsSetMemoryParams",
]
