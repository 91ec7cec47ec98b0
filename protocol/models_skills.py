"""Params and results: skills.* and memories.list (seed 000 §2 ``skills, memories``; rules: store/skills.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from store.rules import (
    MAX_MEMORY_LIST,
    MAX_PATH_CHARS,
    MAX_SKILL_DESCRIPTION_CHARS,
    MAX_SKILL_ORIGIN_CHARS,
    MAX_SKILL_SOURCE_BYTES,
    MAX_SKILL_VERSION_CHARS,
    MAX_SKILLS,
    SKILL_NAME_RE,
    SKILL_VERSION_RE,
)

from .models_common import MutatingParams, Params, Result, TimestampMs

SkillName = Annotated[str, StringConstraints(pattern=SKILL_NAME_RE.pattern),
                      Field(description="Lowercase letters, digits and inner hyphens, at most 64 characters.")]
SkillVersion = Annotated[str, StringConstraints(pattern=SKILL_VERSION_RE.pattern,
                                                max_length=MAX_SKILL_VERSION_CHARS)]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class SkillMeta(Result):
    name: str
    version: str
    description: str | None = None
    origin: str | None = Field(default=None, description="Where the skill came from (a path, a URL, a store id).")
    sha256: Sha256Hex = Field(description="SHA-256 of the source text (UTF-8).")
    size_bytes: int = Field(ge=0, le=MAX_SKILL_SOURCE_BYTES)
    created_at: TimestampMs
    updated_at: TimestampMs


class Skill(SkillMeta):
    source: str = Field(description="The skill's source text (its SKILL.md).")


class SkillsListParams(Params):
    pass


class SkillsListResult(Result):
    skills: list[SkillMeta] = Field(max_length=MAX_SKILLS, description="Every skill, by name, without its source.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Names of skills whose stored record is damaged (it no longer parses as an object): left out "
        "of skills, so the others still list; skills.get of one answers CORRUPT_DATA, skills.put writes over it "
        "and skills.delete removes it. Absent when every record reads.",
    )


class SkillsGetParams(Params):
    name: SkillName


class SkillResult(Result):
    skill: Skill


class SkillsPutParams(MutatingParams):
    name: SkillName
    version: SkillVersion = Field(description="A name and version identify one source: new source, new version.")
    source: Annotated[str, StringConstraints(min_length=1, max_length=MAX_SKILL_SOURCE_BYTES)] = Field(
        description=f"The skill's source text, at most {MAX_SKILL_SOURCE_BYTES} bytes of UTF-8.")
    description: Annotated[str, StringConstraints(max_length=MAX_SKILL_DESCRIPTION_CHARS)] | None = None
    origin: Annotated[str, StringConstraints(max_length=MAX_SKILL_ORIGIN_CHARS)] | None = None


class SkillsPutResult(Result):
    skill: SkillMeta
    changed: bool = Field(description="False when the same skill was stored already (nothing written).")


class SkillsDeleteParams(MutatingParams):
    name: SkillName


class SkillsDeleteResult(Result):
    name: str
    deleted: bool = Field(description="False when no such skill was stored.")


class MemoriesListParams(Params):
    scope: Literal["project", "group"] = Field(
        default="project", description="project: kv(projectMemory) by project path; group: kv(projectGroupMemory).")
    after: Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH_CHARS)] | None = Field(
        default=None, description="The last key of the previous page (its nextAfter).")
    limit: int = Field(default=100, ge=1, le=MAX_MEMORY_LIST)


class MemorySummary(Result):
    scope: Literal["project", "group"]
    key: str = Field(description="The canonical project path, or the group id.")
    entries: int = Field(ge=0)
    content_bytes: int = Field(ge=0, description="Size of the derived content (UTF-8).")
    updated_at: TimestampMs


class MemoriesListResult(Result):
    memories: list[MemorySummary] = Field(max_length=MAX_MEMORY_LIST)
    next_after: str | None = Field(default=None, description="Set when more may follow: pass it as `after`.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Keys (project paths or group ids) whose stored memory is damaged (it no longer parses, or "
        "its entries lost their shape): left out of memories, counted toward limit; reading it is CORRUPT_DATA, "
        "writing it replaces it. Absent when every memory of the page reads.",
    )


__all__ = [
    "MemoriesListParams",
    "MemoriesListResult",
    "MemorySummary",
    "Skill",
    "SkillMeta",
    "SkillResult",
    "SkillsDeleteParams",
    "SkillsDeleteResult",
    "SkillsGetParams",
    "SkillsListParams",
    "SkillsListResult",
    "SkillsPutParams",
    "SkillsPutResult",
]
