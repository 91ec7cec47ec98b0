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
    UNAVAILABLE_DESCRIPTION,
    BranchUnavailable,
    CompactionView,
    Sha256Hex,
)
from .models_turns import RunEnvironmentView, TurnInputView

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
    unavailable: BranchUnavailable | None = Field(
        default=None, description="Archived nodes: about the branch the node id names "
        "(rev:<rootUserId>:<revisionIndex>:…). " + UNAVAILABLE_DESCRIPTION)


class TreeResult(Result):
    nodes: list[TreeNode] = Field(
        description="Parents before children; siblings by revision. A regenerated reply is a sibling under its "
        "user message; an edited user message is a sibling under the original parent (seed 000 §3.2).")
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


class TurnContextView(Result):
    """The latest Turn context (seed 000 §4): the run environment snapshot ``session.startTurn`` stored for the
    newest turn on the active branch, digest verified (as ``session.turnEnvironment`` reads it)."""

    turn_id: str = Field(description="The turn it belongs to.")
    version: int
    digest: Sha256Hex
    snapshot: RunEnvironmentView
    input: TurnInputView | None = Field(default=None, description="The bound input, digest verified.")


class ContextResult(Result):
    messages: list[ContextMessage]
    compaction: CompactionView | None = Field(
        default=None, description="Newest checkpoint applied (messages start after it)."
    )
    turn_context: TurnContextView | None = Field(
        default=None,
        description="The latest Turn context: the snapshot of the newest turn on the active branch (the last "
        "live message naming it as turnId or bound input, or the running turn) that has one; null when none.",
    )


__all__ = [
    "ContextMessage",
    "ContextResult",
    "SessionReadParams",
    "TreeNode",
    "TreeResult",
    "TurnContextView",
]
