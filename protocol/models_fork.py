"""Params: session.fork."""

from __future__ import annotations

from pydantic import Field

from .models_common import (
    MutatingParams,
    SessionId,
    Title,
    WireId,
)


class ForkParams(MutatingParams):
    session_id: SessionId
    through_message_id: WireId | None = Field(
        default=None,
        description="Copy the prefix through this message; whole transcript when absent.",
    )
    title: Title | None = None


__all__ = [
    "ForkParams",
]
