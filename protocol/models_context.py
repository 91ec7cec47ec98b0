"""Params and results: the derived views session.tree and session.context (seed 000 §3-4)."""

from __future__ import annotations

from pydantic import Field

from .models_common import (
    JsonObject,
    Params,
    Result,
    Role,
    SessionId,
)
from .models_records import (
    CompactionView,
)

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
    "ContextMessage",
    "ContextResult",
    "SessionReadParams",
    "TreeNode",
    "TreeResult",
]
