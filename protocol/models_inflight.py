"""Params and results: in-flight checkpoints of a streaming reply (seed 003 §2.1, D299)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .models_common import (
    MutatingParams,
    Result,
    SessionId,
    TimestampMs,
    WireId,
)
from .models_records import InflightUiMessage, MessageRef, TranscriptMessage, Turn, refuse_host_meta

# ---------------------------------------------------------------------------
# In-flight checkpoints (seed 003 §2.1, D299)


class SaveInflightParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId
    message: TranscriptMessage

    @model_validator(mode="after")
    def _no_forged_provenance(self) -> SaveInflightParams:
        refuse_host_meta(self.message)
        return self

    @model_validator(mode="after")
    def _same_turn(self) -> SaveInflightParams:
        # as session.appendMessage: a recovered reply is promoted under the turn it streamed in
        inner = self.message.turn_id
        if inner is not None and inner != self.turn_id:
            raise ValueError("turnId and message.turnId differ")
        return self


class SaveInflightResult(Result):
    saved: bool
    reason: Literal["empty", "already_indexed", "delegate"] | None = Field(
        default=None,
        description="Why it was dropped: no visible content yet, the final row already landed, or a delegate's "
        "(subagent-attributed: meta.parentToolCallId / meta.agentName) reply, which is never checkpointed.",
    )


class InflightMessage(Result):
    """The reply streaming right now: its newest checkpoint (``message.inflight`` is true).

    Not a transcript row: it has no position, and the final row with the same
    id replaces it. In a ``session.inflight`` event each block's text is capped
    at 32,768 characters (``truncated: true``); ``session.get`` applies its own
    ``contentLimit``.
    """

    session_id: SessionId
    turn_id: str
    saved_at: TimestampMs = Field(description="When the host stored this checkpoint.")
    message: InflightUiMessage


class RecoverInflightParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId | None = Field(
        default=None, description="The turn the lost sidecar was running (checked against the checkpoint's)."
    )


class RecoverInflightResult(Result):
    action: Literal["promoted", "removed", "quarantined", "none"] = Field(
        description="promoted: appended as a message (completed when its turn completed, else aborted); "
        "removed: its final row had landed; quarantined: unreadable, moved aside; none: no checkpoint."
    )
    message: MessageRef | None = Field(default=None, description="The promoted row.")
    turn: Turn | None = Field(
        default=None, description="The turn after recovery (a running one ends aborted, SIDECAR_LOST)."
    )


__all__ = [
    "InflightMessage",
    "RecoverInflightParams",
    "RecoverInflightResult",
    "SaveInflightParams",
    "SaveInflightResult",
]
