"""Params and results: usage.* rollups and session.listTurns (seed 003 §4.6)."""

from __future__ import annotations

from pydantic import Field

from .models_common import Count, Cursor, Params, Result, SessionId
from .models_records import Turn


class UsageSums(Result):
    turns: Count
    input_tokens: Count
    output_tokens: Count
    cost_micros: Count = Field(description="Sum of usage.cost.total, in millionths of the currency unit.")
    failed_turns: Count = Field(description="Turns that ended with status error.")
    aborted_turns: Count


class ModelUsage(UsageSums):
    provider_id: str | None = None
    model_id: str | None = None


class UsageSessionParams(Params):
    session_id: SessionId


class UsageSessionResult(Result):
    session_id: SessionId
    total: UsageSums
    by_model: list[ModelUsage] = Field(description="One row per (providerId, modelId) the turns ran with.")


class UsageHistoryParams(Params):
    days: int = Field(default=30, ge=1, le=366, description="Today and the days before it.")
    utc_offset_minutes: int = Field(default=0, ge=-840, le=840, description="Where a day starts (the UI's zone).")
    session_id: SessionId | None = Field(default=None, description="One session's; every session's when absent.")


class UsageDay(UsageSums):
    day: str = Field(description="YYYY-MM-DD in the requested offset.")


class UsageHistoryResult(Result):
    days: list[UsageDay] = Field(description="Oldest first; days without ended turns are left out.")


class ListTurnsParams(Params):
    session_id: SessionId
    limit: int = Field(default=50, ge=1, le=500)
    cursor: Cursor | None = None


class ListTurnsResult(Result):
    turns: list[Turn] = Field(description="Newest first; retryOf links a retry to the turn it retries.")
    next_cursor: str | None = None
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of this page's turns whose stored record is damaged (usage_json that no longer parses, "
        "a status outside its set): left out of turns; nextCursor still moves past them. Absent when every "
        "record reads.",
    )


__all__ = [
    "ListTurnsParams",
    "ListTurnsResult",
    "ModelUsage",
    "UsageDay",
    "UsageHistoryParams",
    "UsageHistoryResult",
    "UsageSessionParams",
    "UsageSessionResult",
    "UsageSums",
]
