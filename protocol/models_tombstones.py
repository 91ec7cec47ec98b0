"""Params and results: session.deleteMessage / restoreMessage (tombstones, seed 000 §3.3)."""

from __future__ import annotations

from pydantic import Field

from .models_common import (
    MutatingParams,
    Result,
    SessionId,
    WireId,
)

# ---------------------------------------------------------------------------
# Tombstones


class MessageIdParams(MutatingParams):
    session_id: SessionId
    message_id: WireId


class TombstoneResult(Result):
    message_id: str
    deleted: bool = Field(description="State after the call: true = hidden.")


__all__ = [
    "MessageIdParams",
    "TombstoneResult",
]
