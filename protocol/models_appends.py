"""Params and results: session.appendMessage."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from .models_common import (
    MutatingParams,
    Result,
    SessionId,
    WireId,
)
from .models_records import (
    MessageRef,
    TranscriptMessage,
    refuse_host_meta,
    strip_steering_provenance,
)

# ---------------------------------------------------------------------------
# Appends


class AppendMessageParams(MutatingParams):
    session_id: SessionId
    message: TranscriptMessage
    turn_id: WireId | None = Field(
        default=None, description="Owning turn; must equal message.turnId when both are given."
    )

    @model_validator(mode="before")
    @classmethod
    def _steering_is_human_input(cls, data: Any) -> Any:
        return strip_steering_provenance(data)

    @model_validator(mode="after")
    def _no_forged_provenance(self) -> AppendMessageParams:
        refuse_host_meta(self.message)
        return self

    @model_validator(mode="after")
    def _same_turn(self) -> AppendMessageParams:
        inner = self.message.turn_id
        if self.turn_id is not None and inner is not None and inner != self.turn_id:
            raise ValueError("turnId and message.turnId differ")
        return self


class AppendMessageResult(Result):
    message: MessageRef
    replayed: bool = Field(description="True when this id was already stored (no new line).")
    remapped_from: str | None = Field(
        default=None,
        description="Original id when the host stored the message as {sessionId}:{id}.",
    )


__all__ = [
    "AppendMessageParams",
    "AppendMessageResult",
]
