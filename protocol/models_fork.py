"""Params and results: session.fork, session.assistantEdit."""

from __future__ import annotations

from pydantic import Field

from .blocks import Blocks
from .models_common import (
    MutatingParams,
    Result,
    SessionId,
    SessionRef,
    Title,
    WireId,
)
from .models_records import SessionSummary


class ForkParams(MutatingParams):
    """Fork a host session, or a native pi session (`native-pi:...`: one new v3 child in its directory)."""

    session_id: SessionRef
    through_message_id: WireId | None = Field(
        default=None,
        description="Copy the prefix through this message; whole transcript when absent.",
    )
    title: Title | None = None


class AssistantEditParams(MutatingParams):
    """Assistant Edit (seed 003 §4.5): fork through an assistant reply with that reply's content replaced."""

    session_id: SessionId
    message_id: WireId = Field(description="The assistant message to edit (the fork's last message).")
    blocks: Blocks = Field(min_length=1, description="The edited reply's content blocks.")
    title: Title | None = Field(default=None, description="The child's title; the source's when absent.")


class AssistantEditResult(Result):
    session: SessionSummary = Field(description="The new child session.")
    message_id: WireId = Field(description="The edited reply in the child (its last message).")
    original_message_id: WireId = Field(description="The child's copy of the original reply (in revision 1).")
    root_user_id: WireId = Field(description="The revision family of both tails (the child's user message).")
    revision_index: int = Field(ge=1, description="The edited tail's revision (active).")
    original_revision_index: int = Field(ge=1, description="The original tail's revision.")


__all__ = [
    "AssistantEditParams",
    "AssistantEditResult",
    "ForkParams",
]
