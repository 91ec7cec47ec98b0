"""Params and results: event subscriptions, artifacts, search, settings."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints, field_validator

from .models_common import (
    MAX_QUERY_CHARS,
    MAX_TOPICS,
    ArtifactOp,
    Count,
    Cursor,
    MutatingParams,
    Params,
    Result,
    Role,
    SessionId,
    TimestampMs,
    Topic,
    WireId,
)

# ---------------------------------------------------------------------------
# Events


class SubscribeParams(Params):
    topics: list[Topic] = Field(min_length=1, max_length=MAX_TOPICS)
    session_id: SessionId | None = Field(
        default=None, description="Only events of this session (all sessions when absent)."
    )
    cursor: int | None = Field(
        default=None,
        ge=0,
        description="Resume after this event cursor; CURSOR_EXPIRED if too old.",
    )

    @field_validator("topics")
    @classmethod
    def _unique(cls, topics: list[str]) -> list[str]:
        if len(set(topics)) != len(topics):
            raise ValueError("topics must not repeat")
        return topics


class SubscribeResult(Result):
    subscription_id: str
    cursor: Count = Field(description="Cursor of the newest event already sent or skipped.")


class UnsubscribeParams(Params):
    subscription_id: WireId


class OkResult(Result):
    ok: bool


# ---------------------------------------------------------------------------
# Artifacts (seed 003 §4.10)


class ArtifactsListParams(Params):
    session_id: SessionId | None = None
    limit: int = Field(default=100, ge=1, le=500)
    cursor: Cursor | None = None


class Artifact(Result):
    session_id: SessionId
    path: str
    op: ArtifactOp
    turn_id: str | None = None
    updated_at: TimestampMs


class ArtifactsListResult(Result):
    artifacts: list[Artifact] = Field(description="Newest updatedAt first.")
    next_cursor: str | None = None


# ---------------------------------------------------------------------------
# Search (seed 003 §4.8)

Query = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]


class SearchSessionsParams(Params):
    query: Query = Field(description="Literal text; %, _, quotes and backslashes are literal.")
    limit: int = Field(default=20, ge=1, le=100)
    cursor: Cursor | None = None


class Snippet(Result):
    message_id: str
    role: Role
    seq: int
    snippet: str


class SessionSearchResult(Result):
    session_id: SessionId
    title: str
    project_path: str | None = None
    title_match: bool
    project_match: bool
    message_matches: Count
    snippets: list[Snippet]


class SearchSessionsResult(Result):
    results: list[SessionSearchResult]
    total_sessions: Count
    total_message_matches: Count
    next_cursor: str | None = None


class SearchQueryParams(Params):
    query: Query
    session_id: SessionId | None = None
    limit: int = Field(default=50, ge=1, le=500)
    cursor: Cursor | None = None


class MessageSearchHit(Result):
    session_id: SessionId
    message_id: str
    role: Role
    seq: int
    snippet: str
    created_at: TimestampMs


class SearchQueryResult(Result):
    results: list[MessageSearchHit]
    next_cursor: str | None = None


# ---------------------------------------------------------------------------
# Settings (kv table, seed 003 §4.1)

Namespace = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,100}$"),
    Field(description="kv namespace: app, ui, cache, plugin:<id>, projectMemory ..."),
]
SettingKey = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class SettingsGetParams(Params):
    ns: Namespace = "app"
    key: SettingKey


class SettingsGetResult(Result):
    ns: str
    key: str
    value: Any = Field(default=None, description="Absent when the key is not set.")
    updated_at: TimestampMs | None = None


class SettingsSetParams(MutatingParams):
    ns: Namespace = "app"
    key: SettingKey
    value: Any = Field(description="Any JSON value.")


class SettingsSetResult(Result):
    ns: str
    key: str
    updated_at: TimestampMs


__all__ = [
    "Artifact",
    "ArtifactsListParams",
    "ArtifactsListResult",
    "MessageSearchHit",
    "OkResult",
    "SearchQueryParams",
    "SearchQueryResult",
    "SearchSessionsParams",
    "SearchSessionsResult",
    "SessionSearchResult",
    "SettingsGetParams",
    "SettingsGetResult",
    "SettingsSetParams",
    "SettingsSetResult",
    "Snippet",
    "SubscribeParams",
    "SubscribeResult",
    "UnsubscribeParams",
]
