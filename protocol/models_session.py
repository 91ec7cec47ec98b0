"""Params and results: session lifecycle (create, list, rename, update, delete) and window reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from store.rules import MAX_FOLDER_CHARS, MAX_PRESET_CHARS, MAX_SESSION_PAGE, MAX_TAGS, MAX_THREAD_ORIGINS

from .models_approvals import UserRequest
from .models_common import (
    MAX_REPLY_BYTES,
    MAX_WINDOW,
    Count,
    Cursor,
    Mode,
    MutatingParams,
    Params,
    PermissionMode,
    ProjectRoot,
    Ref,
    Result,
    SessionId,
    SessionRef,
    ThinkingLevel,
    Title,
    WireId,
)
from .models_inflight import InflightMessage
from .models_records import (
    CompactionView,
    SessionSummary,
    TagText,
    ThreadOrigin,
    UiMessage,
)

# ---------------------------------------------------------------------------
# Session lifecycle


class SessionCreateParams(MutatingParams):
    session_id: SessionId | None = Field(
        default=None, description="Client-chosen id; the host generates one when absent."
    )
    title: Title | None = None
    project_path: ProjectRoot | None = None
    provider_id: Ref | None = None
    model_id: Ref | None = None
    mode: Mode | None = Field(default=None, description="Default agent.")
    thinking_level: ThinkingLevel | None = Field(default=None, description="Default off.")
    permission_mode: PermissionMode | None = Field(default=None, description="Default inherit.")


class SessionListParams(Params):
    limit: int = Field(default=50, ge=1, le=MAX_SESSION_PAGE)
    cursor: Cursor | None = None
    project_id: int | None = Field(default=None, ge=1)


class SessionListResult(Result):
    sessions: list[SessionSummary] = Field(description="Newest updatedAt first.")
    next_cursor: str | None = None
    unreadable_threads: list[str] | None = Field(
        default=None,
        description="Ids of this page's sessions whose stored thread metadata is damaged (a JSON column that no "
        "longer parses): listed without thread; the session itself reads, and session.updateMetadata writes new "
        "metadata over it. Absent when every record reads.",
    )


class SessionIdParams(Params):
    session_id: SessionId


class SessionGetParams(Params):
    """A bounded window of the transcript (seed 003 §5).

    ``sessionId`` may be a native pi session (`native-pi:...`): the window is then
    read from an immutable snapshot of its file, on its current branch.

    At most one anchor: `messageBefore` (backward paging, exclusive end),
    `messageAround` (centre on a message id) or `messageEnd` (forward
    paging: the window starts at a previous response's `messageEnd`).
    Without an anchor the newest window is returned. Positions are 0-based
    physical message positions in the transcript file.
    """

    session_id: SessionRef
    message_before: int | None = Field(
        default=None, ge=0, description="Exclusive physical end of the window."
    )
    message_limit: int | None = Field(default=None, ge=1, le=MAX_WINDOW)
    content_limit: int | None = Field(
        default=None, ge=1, description="Cap on each projected message's text, and on each tool call's args and result "
                    "(characters; a structured value is measured and cut as its compact JSON text). Ignored with full."
    )
    message_around: WireId | None = None
    message_end: int | None = Field(
        default=None,
        ge=0,
        description="Forward paging: start the window at this physical position.",
    )
    full: bool = Field(default=False, description="Whole transcript, no content cap.")
    max_bytes: int | None = Field(
        default=None,
        ge=1024,
        le=MAX_REPLY_BYTES,
        description="Byte budget of the window (its transcript lines; default and maximum 16 MiB). A window "
        "that does not fit is cut to a page of whole messages (newest for a backward window, oldest for "
        "messageEnd); the whole transcript (full, or no limit) over the budget is PAYLOAD_TOO_LARGE: page it "
        "with messageEnd.",
    )

    @model_validator(mode="after")
    def _one_anchor(self) -> SessionGetParams:
        anchors = [
            name
            for name, value in (
                ("messageBefore", self.message_before),
                ("messageAround", self.message_around),
                ("messageEnd", self.message_end),
            )
            if value is not None
        ]
        if len(anchors) > 1:
            raise ValueError(f"give at most one of {', '.join(anchors)}")
        if self.full and (anchors or self.message_limit is not None):
            raise ValueError("full cannot be combined with a window")
        return self


class SessionGetResult(Result):
    session: SessionSummary
    messages: list[UiMessage]
    compactions: list[CompactionView] = Field(
        description="Every still-valid checkpoint, oldest first; always whole."
    )
    message_start: Count = Field(
        description="0-based physical position of messages[0], so messages[0].seq - 1; show seq to people "
        "(#1 is the first message) and pass positions back (messageBefore, messageEnd)."
    )
    message_end: Count = Field(
        description="Exclusive 0-based end of the window: the seq of its last message (when it has one)."
    )
    has_more_before: bool
    has_more_after: bool
    total_messages: Count
    navigation_parent: UiMessage | None = Field(
        default=None, description="Owning Task row of a nested messageAround target."
    )
    decisions: list[UserRequest] | None = Field(
        default=None,
        description="Approvals and interactions of the window's turns that are no longer pending (answered, "
        "expired, cancelled, interrupted), oldest first; the answers are approval_decision lines in the transcript.",
    )
    unreadable_decisions: list[str] | None = Field(
        default=None,
        description="Request ids of the window's turns' approvals and interactions whose stored record is damaged "
        "(a JSON column that no longer parses): left out of decisions, so the page of messages still reads. "
        "Absent when every record reads.",
    )
    inflight: InflightMessage | None = Field(
        default=None,
        description="Newest window only (hasMoreAfter false): the reply streaming right now, after the "
        "indexed rows; absent once its final row landed.",
    )


class SessionRenameParams(MutatingParams):
    session_id: SessionId
    title: Title


class SessionUpdateParams(MutatingParams):
    session_id: SessionId
    provider_id: Ref | None = None
    model_id: Ref | None = None
    mode: Mode | None = None
    thinking_level: ThinkingLevel | None = None
    permission_mode: PermissionMode | None = None
    project_path: ProjectRoot | None = None

    @model_validator(mode="after")
    def _something_to_update(self) -> SessionUpdateParams:
        updates = self.model_dump(exclude={"session_id", "submission_id"}, exclude_none=True)
        if not updates:
            raise ValueError("nothing to update: give at least one field besides sessionId")
        return self


class SessionUpdateMetadataParams(MutatingParams):
    """Thread metadata (seed 000 §2.1). An absent field stays as it is; ``null`` clears it
    (``tags``/``origins`` to empty, ``archived`` to false); a list replaces the stored one."""

    session_id: SessionId
    tags: list[TagText] | None = Field(default=None, max_length=MAX_TAGS)
    folder: str | None = Field(default=None, max_length=MAX_FOLDER_CHARS)
    preset: str | None = Field(default=None, max_length=MAX_PRESET_CHARS)
    archived: bool | None = None
    parent_thread_id: SessionId | None = None
    origins: list[ThreadOrigin] | None = Field(default=None, max_length=MAX_THREAD_ORIGINS)

    @model_validator(mode="after")
    def _something_to_update(self) -> SessionUpdateMetadataParams:
        if not self.model_fields_set - {"session_id", "submission_id"}:
            raise ValueError("nothing to update: give at least one field besides sessionId")
        if self.parent_thread_id is not None and self.parent_thread_id == self.session_id:
            raise ValueError("parentThreadId must name another session")
        return self


class SessionDeleteParams(MutatingParams):
    session_id: SessionId


class SessionDeleteResult(Result):
    session_id: SessionId
    deleted: Literal[True] = True


__all__ = [
    "SessionCreateParams",
    "SessionDeleteParams",
    "SessionDeleteResult",
    "SessionGetParams",
    "SessionGetResult",
    "SessionIdParams",
    "SessionListParams",
    "SessionListResult",
    "SessionRenameParams",
    "SessionUpdateMetadataParams",
    "SessionUpdateParams",
]
