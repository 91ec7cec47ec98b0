"""Params: session.fork."""

from __future__ import annotations

from pydantic import Field

from .models_common import (
    MutatingParams,
    SessionRef,
    Title,
    WireId,
)


class ForkParams(MutatingParams):
    """Fork a host session, or a native pi session (`native-pi:...`: one new v3 child in its directory)."""

    session_id: SessionRef
    through_message_id: WireId | None = Field(
        default=None,
        description="Copy the prefix through this message; whole transcript when absent.",
    )
    title: Title | None = None


__all__ = [
    "ForkParams",
]
