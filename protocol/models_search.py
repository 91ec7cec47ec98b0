"""Params and results: search.sessions and search.query (seed 003 §4.8)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .models_common import (
    MAX_QUERY_CHARS,
    Count,
    Cursor,
    Params,
    Result,
    Role,
    SessionId,
    TimestampMs,
)

# ---------------------------------------------------------------------------
# Search (seed 003 §4.8)

Query = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS), Field(
    description="Literal text, trimmed of leading and trailing whitespace; %, _, quotes and backslashes are literal.")]
SearchScope = Literal["messages", "tools"]
_SCOPE = ("What is searched: \"messages\" (default): user and assistant text; \"tools\": tool rows' "
          "output (results and error strings, the first 65,536 characters of each), from an index of its own.")


class SearchSessionsParams(Params):
    query: Query
    limit: int = Field(default=20, ge=1, le=100)
    cursor: Cursor | None = None
    scope: SearchScope = Field(default="messages", description=_SCOPE)


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
    scope: SearchScope = Field(default="messages", description=_SCOPE)


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


__all__ = [
    "MessageSearchHit",
    "Query",
    "SearchQueryParams",
    "SearchQueryResult",
    "SearchScope",
    "SearchSessionsParams",
    "SearchSessionsResult",
    "SessionSearchResult",
    "Snippet",
]
