"""Params and results: revisions, rewrites, compaction, fork, tombstones, the
conversation tree and derived model context (seed 003 §4.9, §5; seed 000 §3-4)."""

from __future__ import annotations

from pydantic import Field, field_validator

from .models_common import (
    MAX_MESSAGES_PER_REPLACE,
    Count,
    JsonObject,
    MutatingParams,
    Params,
    Result,
    Role,
    SessionId,
    Title,
    TruncateMode,
    WireId,
)
from .models_records import (
    Compaction,
    CompactionView,
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


class AppendCompactionParams(MutatingParams):
    session_id: SessionId
    compaction: Compaction


class AppendCompactionResult(Result):
    compaction: CompactionView


class ForkParams(MutatingParams):
    session_id: SessionId
    through_message_id: WireId | None = Field(
        default=None,
        description="Copy the prefix through this message; whole transcript when absent.",
    )
    title: Title | None = None


# ---------------------------------------------------------------------------
# Tombstones


class MessageIdParams(MutatingParams):
    session_id: SessionId
    message_id: WireId


class TombstoneResult(Result):
    message_id: str
    deleted: bool = Field(description="State after the call: true = hidden.")


# ---------------------------------------------------------------------------
# Tree and context


class SessionReadParams(Params):
    session_id: SessionId


class TreeNode(Result):
    id: str = Field(
        description="Node id: the message id on the live transcript; "
        "rev:<rootUserId>:<revisionIndex>:<messageId> in an archived branch."
    )
    message_id: str | None = Field(default=None, description="The transcript message this node shows.")
    parent_id: str | None = None
    role: Role
    revision_index: int | None = Field(default=None, ge=1)
    active: bool = Field(description="On the live branch.")
    deleted: bool = Field(description="Tombstoned.")
    preview: str = Field(description="Short plain-text preview.")


class TreeResult(Result):
    nodes: list[TreeNode] = Field(description="Parents before children; siblings by revision.")
    active_leaf_id: str | None = None


class ContextMessage(Result):
    """Provider-neutral message for the model."""

    id: str
    role: Role
    blocks: list[JsonObject] = Field(
        description="text, tool_call and attachment blocks; thinking only as 'reasoning' when replay is asked for."
    )
    tool_name: str | None = None
    turn_id: str | None = None
    created_at: str | None = None
    compaction_summary: bool | None = Field(
        default=None, description="The checkpoint's summary (id = the compaction id), first in the list."
    )


class ContextResult(Result):
    messages: list[ContextMessage]
    compaction: CompactionView | None = Field(
        default=None, description="Newest checkpoint applied (messages start after it)."
    )
    turn_context: JsonObject | None = None


__all__ = [
    "ActivateRevisionParams",
    "ActivateRevisionResult",
    "AppendCompactionParams",
    "AppendCompactionResult",
    "ContextMessage",
    "ContextResult",
    "ForkParams",
    "ListRevisionsParams",
    "ListRevisionsResult",
    "MessageIdParams",
    "ReplaceMessagesParams",
    "RevisionResult",
    "SaveActiveRevisionParams",
    "SessionReadParams",
    "SessionResult",
    "TombstoneResult",
    "TreeNode",
    "TreeResult",
    "TruncateFromParams",
    "TruncateFromResult",
]
