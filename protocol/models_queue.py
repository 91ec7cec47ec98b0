"""Params and results: the host-owned turn queue (seed 003 §4.6b)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StringConstraints

from .blocks import check_block, refuse_inline_bytes
from .models_common import (
    MAX_ATTACHMENTS,
    MAX_TEXT_FIELD,
    JsonObject,
    MutatingParams,
    Params,
    PermissionMode,
    Ref,
    Result,
    SessionId,
    WireId,
)
from .models_records import QueueEntry

MAX_QUEUE_ENTRIES = 8


def _queue_attachment(attachment: dict[str, Any]) -> dict[str, Any]:
    """Seed 003 §4.6b: attachments_json keeps the prompt's attachment references, bytes stay out. An attachment
    block runs the one block check every message method runs (inline bytes refused, ``ref`` a blob or an
    absolute path: :func:`protocol.blocks.check_block`); a reference object of the caller's own (a path in the
    session scratch or project root) is kept as given, without inline bytes and without a ``..`` component."""
    if attachment.get("type") == "attachment":
        return check_block(attachment)
    refuse_inline_bytes(attachment)
    for key in ("ref", "path"):
        value = attachment.get(key)
        if isinstance(value, str) and ("\x00" in value or ".." in value.replace("\\", "/").split("/")):
            raise ValueError(f"a queued attachment's {key} may not hold a '..' component or a NUL: {value[:80]!r}")
    return attachment


QueueAttachment = Annotated[JsonObject, AfterValidator(_queue_attachment)]


class QueuePushParams(MutatingParams):
    session_id: SessionId
    principal: Ref = Field(description="Who queued it; scopes idempotencyKey.")
    idempotency_key: Ref | None = Field(
        default=None,
        description="Same principal + key returns the same entry; a different "
        "input fails with IDEMPOTENCY_CONFLICT.",
    )
    content: Annotated[str, StringConstraints(max_length=MAX_TEXT_FIELD)]
    attachments: list[QueueAttachment] | None = Field(
        default=None, max_length=MAX_ATTACHMENTS,
        description="The prompt's attachment references (seed 003 §4.6b): attachment blocks {type: "
        "\"attachment\", kind, name, ref}, checked as in session.appendMessage (ref attachments/<sha256> or an "
        "absolute path without '..'), or the caller's own reference objects (a path in the session scratch or "
        "project root), kept as given; bytes inline, or a ref/path with a '..' component, are refused.")
    permission_mode: PermissionMode
    session_message_id: WireId | None = Field(
        default=None,
        description="Binds the admission to its session collaboration ledger row "
        "(seed 003 §4.6c); part of the idempotency check. A delivery addressed to another session, "
        "or one already admitted in this queue, is INVALID_PARAMS.",
    )


class QueuePushResult(Result):
    entry: QueueEntry
    replayed: bool


class QueueListParams(Params):
    session_id: SessionId


class QueueState(Result):
    """The session's queue in delivery order: promoted entries first (by
    priority), then by position."""

    entries: list[QueueEntry] = Field(max_length=MAX_QUEUE_ENTRIES)
    held: bool = Field(description="True until a controller attaches after a restart.")
    controller_id: str | None = None
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of the session's queue entries whose stored record is damaged; absent when every "
        "one reads. They are not in entries, session.queueTake hands nothing out (CORRUPT_DATA) while "
        "one is there, and session.queueRemove of its id removes it.",
    )


class QueueEntryParams(MutatingParams):
    session_id: SessionId
    entry_id: WireId


class QueueReorderParams(QueueEntryParams):
    direction: Literal["up", "down"]


class QueueControllerParams(MutatingParams):
    session_id: SessionId
    controller_id: WireId


class QueueTakeResult(Result):
    entry: QueueEntry | None = Field(
        default=None, description="Absent when the queue is empty, held or a turn is running."
    )
    reason: Literal["held", "empty", "turnRunning"] | None = Field(
        default=None, description="Why no entry was handed out."
    )


__all__ = [
    "MAX_QUEUE_ENTRIES",
    "QueueControllerParams",
    "QueueEntryParams",
    "QueueListParams",
    "QueuePushParams",
    "QueuePushResult",
    "QueueReorderParams",
    "QueueState",
    "QueueTakeResult",
]
