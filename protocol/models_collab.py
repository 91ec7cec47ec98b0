"""Params and results: collab.* — the session collaboration ledger (seed 003 §4.6c, §11.21).

A plugin delivers a task or a message from one session to another. The host
records it, admits it to the target's turn queue, binds it to the target turn
that begins it, and, when asked, calls back to the source with a bounded result
once it is settled.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .models_common import (
    MAX_TEXT_FIELD,
    Count,
    Cursor,
    MutatingParams,
    Params,
    Ref,
    Result,
    SessionId,
    TimestampMs,
    WireId,
)
from .models_records import MessageRef, QueueEntry

DeliveryStatus = Literal["queued", "running", "completed", "failed", "cancelled", "interrupted"]
Ceiling = Literal["ask", "accept-edits", "auto"]
Content = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_FIELD)]


class CollabEndpoint(Result):
    session_id: SessionId
    title: str = Field(description="Snapshot taken when the row was written.")
    available: bool = Field(description="False once that session was deleted (the row outlives a deleted sender).")


class CollabDelivery(Result):
    id: str
    plugin_id: str
    kind: Literal["task", "message", "completion"] = Field(
        description="completion: the host's callback to the source of replyToMessageId."
    )
    content: str
    status: DeliveryStatus
    notify_on_completion: bool
    turn_id: str | None = Field(default=None, description="The target turn that began it (set on collab.begin).")
    reply_to_message_id: str | None = Field(default=None, description="completion rows: the original delivery.")
    idempotency_key: str
    remaining_hops: Count = Field(description="Autonomous forwards left on this chain.")
    permission_ceiling: Ceiling = Field(description="The sender's effective permission mode when it was sent.")
    result: str | None = None
    error: str | None = None
    created_at: TimestampMs
    updated_at: TimestampMs
    source: CollabEndpoint
    target: CollabEndpoint
    callback_id: str | None = Field(default=None, description="The completion row this delivery's settlement made.")


class CollabDeliverParams(MutatingParams):
    plugin_id: Ref
    source_session_id: SessionId
    target_session_id: SessionId
    kind: Literal["task", "message"]
    content: Content
    notify_on_completion: bool = Field(default=False, description="Call back to the source once settled.")
    idempotency_key: Ref = Field(description="With pluginId and sourceSessionId: a retry returns the original.")
    remaining_hops: int | None = Field(
        default=None, ge=0, le=16,
        description="Hops an autonomous chain may still take (default 4); ignored inside a chain (parent's - 1).",
    )
    permission_ceiling: Ceiling | None = Field(
        default=None, description="A lower ceiling than the sender's effective mode (never a higher one)."
    )


class CollabDeliverResult(Result):
    delivery: CollabDelivery
    replayed: bool = Field(description="True: a retry; the original delivery, nothing new queued.")
    entry: QueueEntry | None = Field(default=None, description="The target's queue admission (new deliveries).")


class CollabBeginParams(MutatingParams):
    session_id: SessionId = Field(description="The target session.")
    delivery_id: WireId
    turn_id: WireId = Field(description="The target's running turn that handles the delivery.")


class CollabBeginResult(Result):
    delivery: CollabDelivery
    message: MessageRef = Field(description="The input row the host wrote (meta.sessionMessage: its provenance).")


class CollabSettleParams(MutatingParams):
    session_id: SessionId = Field(description="The target session.")
    delivery_id: WireId
    turn_id: WireId
    status: Literal["completed", "failed"]
    result: Annotated[str, StringConstraints(max_length=MAX_TEXT_FIELD)] | None = None
    error: Annotated[str, StringConstraints(max_length=MAX_TEXT_FIELD)] | None = None


class CollabSettleResult(Result):
    delivery: CollabDelivery
    callback: CollabDelivery | None = Field(
        default=None,
        description="The completion made for the source (at most one per delivery): queued in its turn queue, or "
        "failed (error QUEUE_FULL, or PERMISSION_DENIED when the source's mode now exceeds the delivery's ceiling) "
        "and not queued.",
    )


class CollabCancelParams(MutatingParams):
    delivery_id: WireId


class CollabCancelResult(Result):
    delivery: CollabDelivery


class CollabListParams(Params):
    session_id: SessionId | None = None
    direction: Literal["incoming", "outgoing", "all"] = Field(
        default="all", description="incoming: the session is the target; outgoing: the source."
    )
    status: DeliveryStatus | None = None
    limit: int = Field(default=50, ge=1, le=500)
    cursor: Cursor | None = None


class CollabListResult(Result):
    deliveries: list[CollabDelivery] = Field(description="Newest first.")
    next_cursor: str | None = None
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of this page's deliveries whose stored record is damaged (a kind, status or permission "
        "ceiling outside its set): left out of deliveries, so the others still list; they count toward limit and "
        "nextCursor moves past them; collab.get of one answers CORRUPT_DATA. Absent when every record reads.",
    )


class CollabGetParams(Params):
    delivery_id: WireId


__all__ = [
    "CollabBeginParams",
    "CollabBeginResult",
    "CollabCancelParams",
    "CollabCancelResult",
    "CollabDeliverParams",
    "CollabDeliverResult",
    "CollabDelivery",
    "CollabEndpoint",
    "CollabGetParams",
    "CollabListParams",
    "CollabListResult",
    "CollabSettleParams",
    "CollabSettleResult",
]
