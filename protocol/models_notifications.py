"""Params and results: the notification inbox (seed 003 §4.14)."""

from __future__ import annotations

from pydantic import Field

from .models_common import (
    MAX_IDS_PER_CALL,
    Count,
    Cursor,
    MutatingParams,
    Params,
    Result,
    WireId,
)
from .models_records import Notification

# ---------------------------------------------------------------------------
# Notifications (seed 003 §4.14)


class NotificationsListParams(Params):
    unread_only: bool = False
    limit: int = Field(default=50, ge=1, le=200)
    cursor: Cursor | None = None


class NotificationsListResult(Result):
    notifications: list[Notification] = Field(description="Newest first.")
    unread_count: Count
    next_cursor: str | None = None
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of this page's notifications whose stored record is damaged (a kind outside its set): "
        "left out of notifications, so the others still list; they count toward limit and unreadCount, "
        "nextCursor moves past them, and notifications.markRead / clear take their ids. Absent when every "
        "record reads.",
    )


class NotificationsMarkReadParams(MutatingParams):
    ids: list[WireId] = Field(min_length=1, max_length=MAX_IDS_PER_CALL)


class NotificationsMarkAllReadParams(MutatingParams):
    pass


class UpdatedResult(Result):
    updated: Count = Field(description="Rows whose readAt changed (idempotent).")


class NotificationsClearParams(MutatingParams):
    ids: list[WireId] | None = Field(
        default=None, max_length=MAX_IDS_PER_CALL, description="All notifications when absent."
    )


class DeletedResult(Result):
    deleted: Count


__all__ = [
    "DeletedResult",
    "NotificationsClearParams",
    "NotificationsListParams",
    "NotificationsListResult",
    "NotificationsMarkAllReadParams",
    "NotificationsMarkReadParams",
    "UpdatedResult",
]
