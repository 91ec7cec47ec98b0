"""Params and results: session.appendCompaction (model-context checkpoints)."""

from __future__ import annotations

from .models_common import (
    MutatingParams,
    Result,
    SessionId,
)
from .models_records import (
    Compaction,
    CompactionView,
)


class AppendCompactionParams(MutatingParams):
    session_id: SessionId
    compaction: Compaction


class AppendCompactionResult(Result):
    compaction: CompactionView


__all__ = [
    "AppendCompactionParams",
    "AppendCompactionResult",
]
