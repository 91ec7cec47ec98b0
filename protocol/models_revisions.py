"""Params and results: regenerate branches and whole-transcript rewrites (seed 003 §4.9, §5)."""

from __future__ import annotations

from pydantic import Field, field_validator

from .models_common import (
    MAX_MESSAGES_PER_REPLACE,
    Count,
    MutatingParams,
    Params,
    Result,
    SessionId,
    TruncateMode,
    WireId,
)
from .models_records import (
    RevisionInfo,
    SessionSummary,
    TranscriptMessage,
)

# ---------------------------------------------------------------------------
# Revisions


class SaveActiveRevisionParams(MutatingParams):
    session_id: SessionId
    root_user_id: WireId


class RevisionResult(Result):
    revision: RevisionInfo


class ActivateRevisionParams(MutatingParams):
    session_id: SessionId
    root_user_id: WireId
    revision_index: int = Field(ge=1)


class ActivateRevisionResult(Result):
    session: SessionSummary
    revisions: list[RevisionInfo]


class ListRevisionsParams(Params):
    session_id: SessionId
    root_user_id: WireId | None = Field(default=None, description="All families when absent.")


class ListRevisionsResult(Result):
    revisions: list[RevisionInfo]


# ---------------------------------------------------------------------------
# Rewrites


class TruncateFromParams(MutatingParams):
    """Cut the transcript at a named message (identity, never a count)."""

    session_id: SessionId
    message_id: WireId
    mode: TruncateMode | None = Field(
        default=None,
        description="regenerate/retry archive the discarded tail as a revision; "
        "edit keeps the source revisions untouched.",
    )


class TruncateFromResult(Result):
    session: SessionSummary
    removed: Count


class ReplaceMessagesParams(MutatingParams):
    session_id: SessionId
    messages: list[TranscriptMessage] = Field(max_length=MAX_MESSAGES_PER_REPLACE)

    @field_validator("messages")
    @classmethod
    def _unique_ids(cls, messages: list[TranscriptMessage]) -> list[TranscriptMessage]:
        seen: set[str] = set()
        for index, message in enumerate(messages):
            if message.id in seen:
                raise ValueError(f"duplicate message id {message.id!r} at index {index}")
            seen.add(message.id)
        return messages


class SessionResult(Result):
    session: SessionSummary


__all__ = [
    "ActivateRevisionParams",
    "ActivateRevisionResult",
    "ListRevisionsParams",
    "ListRevisionsResult",
    "ReplaceMessagesParams",
    "RevisionResult",
    "SaveActiveRevisionParams",
    "SessionResult",
    "TruncateFromParams",
    "TruncateFromResult",
]
