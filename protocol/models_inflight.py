"""Params and results: in-flight checkpoints of a streaming reply (seed 003 §2.1, D299)."""

from __future__ import annotations

from typing import Literal

from .models_common import (
    MutatingParams,
    Result,
    SessionId,
    WireId,
)
from .models_records import TranscriptMessage

# ---------------------------------------------------------------------------
# In-flight checkpoints (seed 003 §2.1, D299)


class SaveInflightParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId
    message: TranscriptMessage


class SaveInflightResult(Result):
    saved: bool
    reason: Literal["empty", "already_indexed"] | None = None


__all__ = [
    "SaveInflightParams",
    "SaveInflightResult",
]
