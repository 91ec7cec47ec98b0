"""Params and results: events.subscribe / events.unsubscribe."""

from __future__ import annotations

from pydantic import Field, field_validator

from .models_common import (
    MAX_TOPICS,
    Count,
    Params,
    Result,
    SessionId,
    Topic,
    WireId,
)

# ---------------------------------------------------------------------------
# Events


class SubscribeParams(Params):
    topics: list[Topic] = Field(min_length=1, max_length=MAX_TOPICS,
                                description="Each topic once (a repeated topic is INVALID_PARAMS).")
    session_id: SessionId | None = Field(
        default=None, description="Only events of this session (all sessions when absent)."
    )
    cursor: int | None = Field(
        default=None,
        ge=0,
        description="Resume after this event cursor; CURSOR_EXPIRED if too old.",
    )

    @field_validator("topics")
    @classmethod
    def _unique(cls, topics: list[str]) -> list[str]:
        if len(set(topics)) != len(topics):
            raise ValueError("topics must not repeat")
        return topics


class SubscribeResult(Result):
    subscription_id: str
    cursor: Count = Field(description="Cursor of the newest event already sent or skipped.")


class UnsubscribeParams(Params):
    subscription_id: WireId


class OkResult(Result):
    ok: bool


__all__ = [
    "OkResult",
    "SubscribeParams",
    "SubscribeResult",
    "UnsubscribeParams",
]
