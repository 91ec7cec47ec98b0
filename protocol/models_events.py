"""Event payloads: the ``data`` of an ``event`` notification, per topic.

Wire shape (a JSON-RPC notification, sent after ``events.subscribe``)::

    {"jsonrpc": "2.0", "method": "event",
     "params": {"topic": "...", "cursor": 42, "subscriptionId": "...",
                "sessionId": "...", "data": {...}}}
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, Field

from .models_approvals import ApprovalRequest, InteractionRequest, PermissionRule
from .models_collab import CollabDelivery
from .models_common import (
    Count,
    JsonObject,
    Mode,
    PermissionMode,
    Result,
    SessionId,
    ThinkingLevel,
    TimestampMs,
    Topic,
)
from .models_imports import ImportProgress
from .models_inflight import InflightMessage
from .models_plans import PlanApproval
from .models_queue import QueueState
from .models_records import MessageRef, Notification, SessionSummary, Turn


class EventParams(Result):
    """``params`` of an ``event`` notification."""

    topic: Topic
    cursor: Count = Field(description="Host-wide, strictly increasing; resume with it.")
    subscription_id: str
    session_id: SessionId | None = None
    data: JsonObject
    transient: bool | None = Field(
        default=None,
        description="A live preview (session.inflight): not numbered (cursor repeats the newest one "
        "you got), coalesced and throttled per subscriber, never replayed.",
    )


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
    record: dict[str, Any] | None = Field(
        default=None,
        description="The line itself, as session.get returns it, when its JSON is at most 8 KiB; absent for a "
        "larger line (read it with session.get).",
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


class TaskDueEvent(Result):
    """A scheduled task's slot came due and the host started run ``runId`` (status ``running``).

    For the agent sidecar: create the session/turn, run ``prompt``, then call
    ``tasks.finishRun``. Sent at most once; a run still ``running`` when the
    host restarts is aborted by the boot fence (``tasks.runs`` shows it). Plan
    and goal tasks are never announced: their slot is recorded as an ``error``
    run with ``PLAN_REQUIRES_INTERACTIVE_SESSION``.
    """

    task_id: str
    run_id: str
    title: str
    prompt: str
    mode: Mode = Field(description="Always agent: plan/goal tasks never run unattended.")
    project_id: int | None = None
    provider_id: str | None = Field(default=None, description="Task-owned model override (with modelId).")
    model_id: str | None = None
    permission_mode: PermissionMode = Field(description="The task's permissionMode; absent: ask (an automatic "
                                                        "run never inherits).")
    thinking_level: ThinkingLevel = Field(description="The task's thinkingLevel; absent or cleared: off.")
    workspace_path: str | None = None
    scheduled_for: TimestampMs = Field(description="The nextRunAt slot that fired (earlier after downtime).")
    started_at: TimestampMs


class PlanRequestedEvent(Result):
    """plans.submit stored a pending plan/goal approval (the same row plans.pending returns)."""

    approval: PlanApproval


class PlanResolvedEvent(Result):
    """A pending approval left ``pending``.

    Approvals interrupted by a restart are not announced (no client is
    subscribed before the gateway opens): after a reconnect, ``plans.pending``
    is the rehydration path - a row missing from it is no longer answerable.
    """

    request_id: str
    session_id: SessionId
    status: Literal["approved", "rejected", "expired"]


class PlanExecutionEvent(Result):
    """An approved plan/goal's execution moved (queued → running → completed | failed | cancelled)."""

    approval: PlanApproval


class CollabDeliveryEvent(Result):
    """A delivery was created or moved (sent once with the target's and once with the source's sessionId)."""

    delivery: CollabDelivery


class SessionInflightEvent(InflightMessage):
    """A checkpoint of the reply streaming in the session (transient: see ``EventParams.transient``).

    Per subscriber and message the newest checkpoint wins and at most one is
    sent per 250 ms; the final ``session.message`` of the same id follows, and
    a preview never comes after it. A UI that connects mid-reply gets the
    current one from ``session.get`` (``inflight``).
    """


class ApprovalRequestedEvent(Result):
    """A sidecar asked for a tool permission; answer with ``approvals.respond`` (UIs)."""

    request: ApprovalRequest


class ApprovalResolvedEvent(Result):
    """An approval left ``pending`` (answered, expired, or cancelled by its turn's end), or a rule
    answered a new one at once. The requesting sidecar waits for this (subscribe with its sessionId).
    Requests a restart interrupted are not announced: ``approvals.pending`` rehydrates."""

    request: ApprovalRequest
    rule: PermissionRule | None = None


class InteractionRequestedEvent(Result):
    """A sidecar asked the user a question; answer with ``interactions.respond``."""

    request: InteractionRequest


class InteractionResolvedEvent(Result):
    """An interaction left ``pending`` (answered, expired, cancelled)."""

    request: InteractionRequest


class SettingsChangedEvent(Result):
    """Keys of a kv namespace changed (settings.*, workspace.open, providers.reorder, projectGroups.*,
    skills.*, projects.remove (its project memory, and currentProjectId when it named the project),
    plugins.uninstall, configSync.*). Names only, never values: read them with settings.get.
    An empty ``keys`` list means "many keys changed": reload the namespace."""

    ns: str
    keys: list[str]


class ProvidersChangedEvent(Result):
    """Provider rows were created, edited, deleted, synced by a plugin or released (empty: reload all)."""

    provider_ids: list[str]


class ModelsChangedEvent(Result):
    """The model catalog of a provider changed (models.add / remove / refresh, configSync.apply)."""

    provider_id: str


HOST_TOPICS: frozenset[str] = frozenset(
    {"settings.changed", "providers.changed", "models.changed", "task.due", "import.progress"}
)
"""Host-wide topics: published without a ``sessionId``, so a subscription with one never receives them."""

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
        "task.due": TaskDueEvent,
        "plan.requested": PlanRequestedEvent,
        "plan.resolved": PlanResolvedEvent,
        "session.inflight": SessionInflightEvent,
        "plan.execution": PlanExecutionEvent,
        "collab.delivery": CollabDeliveryEvent,
        "approval.requested": ApprovalRequestedEvent,
        "approval.resolved": ApprovalResolvedEvent,
        "interaction.requested": InteractionRequestedEvent,
        "interaction.resolved": InteractionResolvedEvent,
        "settings.changed": SettingsChangedEvent,
        "providers.changed": ProvidersChangedEvent,
        "models.changed": ModelsChangedEvent,
        "import.progress": ImportProgress,
    }
)

__all__ = [
    "ApprovalRequestedEvent",
    "ApprovalResolvedEvent",
    "CollabDeliveryEvent",
    "EVENT_PAYLOADS",
    "HOST_TOPICS",
    "InteractionRequestedEvent",
    "InteractionResolvedEvent",
    "EventParams",
    "ModelsChangedEvent",
    "NotificationEvent",
    "PlanExecutionEvent",
    "PlanRequestedEvent",
    "PlanResolvedEvent",
    "ProvidersChangedEvent",
    "SessionDeletedEvent",
    "SessionEvent",
    "SessionInflightEvent",
    "SessionMessageEvent",
    "SessionQueueEvent",
    "SettingsChangedEvent",
    "TaskDueEvent",
    "TurnEndedEvent",
    "TurnStartedEvent",
]
