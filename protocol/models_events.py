"""Event payloads: the ``data`` of an ``event`` notification, per topic.

Wire shape (a JSON-RPC notification, sent after ``events.subscribe``)::

    {"jsonrpc": "2.0", "method": "event",
     "params": {"topic": "...", "cursor": 42, "subscriptionId": "...",
                "sessionId": "...", "data": {...}}}
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import BaseModel, Field

from .models_common import Count, JsonObject, Result, SessionId, Topic
from .models_queue import QueueState
from .models_records import MessageRef, Notification, SessionSummary, Turn


class EventParams(Result):
    """``params`` of an ``event`` notification."""

    topic: Topic
    cursor: Count = Field(description="Host-wide, strictly increasing; resume with it.")
    subscription_id: str
    session_id: SessionId | None = None
    data: JsonObject


class SessionEvent(Result):
    """session.created / session.updated."""

    session: SessionSummary


class SessionDeletedEvent(Result):
    session_id: SessionId


class SessionMessageEvent(Result):
    """A message line was appended (or replaced a streaming row in place)."""

    message: MessageRef
    replaced: bool = Field(
        default=False, description="A terminal row replaced a streaming row of the same id."
    )
    deleted: bool | None = Field(
        default=None,
        description="Set when a tombstone line changed the message's state (deleteMessage/restoreMessage).",
    )


class SessionQueueEvent(QueueState):
    """The session's queue after a change."""

    session_id: SessionId


class NotificationEvent(Result):
    notification: Notification


class TurnStartedEvent(Result):
    turn: Turn


class TurnEndedEvent(Result):
    turn: Turn
    notification: Notification | None = None


EVENT_PAYLOADS: Mapping[str, type[BaseModel]] = MappingProxyType(
    {
        "session.created": SessionEvent,
        "session.updated": SessionEvent,
        "session.deleted": SessionDeletedEvent,
        "session.message": SessionMessageEvent,
        "session.queue": SessionQueueEvent,
        "notification.created": NotificationEvent,
        "turn.started": TurnStartedEvent,
        "turn.ended": TurnEndedEvent,
    }
)

__all__ = [
    "EVENT_PAYLOADS",
    "EventParams",
    "NotificationEvent",
    "SessionDeletedEvent",
    "SessionEvent",
    "SessionMessageEvent",
    "SessionQueueEvent",
    "TurnEndedEvent",
    "TurnStartedEvent",
]
