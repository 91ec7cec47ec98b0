"""Params and results: host.*, session lifecycle, window reads, appends."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from .models_common import (
    MAX_TOKEN_CHARS,
    MAX_WINDOW,
    ClientKind,
    Count,
    Cursor,
    Mode,
    MutatingParams,
    Params,
    PermissionMode,
    ProjectPath,
    Ref,
    Result,
    SessionId,
    ThinkingLevel,
    TimestampMs,
    Title,
    WireId,
)
from .models_records import (
    CompactionView,
    MessageRef,
    SessionSummary,
    TranscriptMessage,
    UiMessage,
)

# ---------------------------------------------------------------------------
# host.*


class HelloParams(Params):
    token: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TOKEN_CHARS)] = Field(
        description="Contents of <dataDir>/host.token."
    )
    client_id: WireId = Field(description="Stable per client install; keys command receipts.")
    client_kind: ClientKind
    protocol: int = Field(ge=1, description="Protocol version the client speaks.")


class HelloResult(Result):
    protocol: int
    host_version: str
    boot_id: str
    server_time: TimestampMs


class StatusParams(Params):
    pass


class ActorStats(Result):
    sessions: Count = Field(description="Live session actors.")
    total: Count = Field(description="All live actors.")
    restarts: Count = Field(description="Restarts since boot.")


class DbWriterStats(Result):
    queue_depth: Count
    peak_depth: Count
    batches: Count
    ops: Count | None = None
    max_batch: Count | None = None
    full_commits: Count | None = None
    normal_commits: Count | None = None
    search_upkeep_steps: Count | None = Field(
        default=None, description="Idle merge steps of the search index since start (store/search_upkeep.py)."
    )


class BootReport(Result):
    """What boot recovery found and repaired. Keys may grow."""

    duration_ms: Count | None = None
    clean_shutdown: bool | None = None
    sessions_scanned: Count | None = None
    index_rows_added: Count | None = None
    index_rows_removed: Count | None = None
    torn_tails: Count | None = None
    inflight_promoted: Count | None = None
    turns_aborted: Count | None = None
    temp_files_removed: Count | None = None
    db_rebuilt: bool | None = None
    secrets_meta_rebuilt: Count | None = Field(
        default=None, description="secrets_meta rows restored from the secrets/*.sec file headers."
    )


class StatusResult(Result):
    version: str
    boot_id: str
    started_at: TimestampMs
    uptime_ms: Count
    actors: ActorStats
    db_writer: DbWriterStats
    data_dir_bytes: Count
    boot: BootReport


# ---------------------------------------------------------------------------
# Session lifecycle


class SessionCreateParams(MutatingParams):
    session_id: SessionId | None = Field(
        default=None, description="Client-chosen id; the host generates one when absent."
    )
    title: Title | None = None
    project_path: ProjectPath | None = None
    provider_id: Ref | None = None
    model_id: Ref | None = None
    mode: Mode | None = Field(default=None, description="Default agent.")
    thinking_level: ThinkingLevel | None = Field(default=None, description="Default off.")
    permission_mode: PermissionMode | None = Field(default=None, description="Default inherit.")


class SessionListParams(Params):
    limit: int = Field(default=50, ge=1, le=500)
    cursor: Cursor | None = None
    project_id: int | None = Field(default=None, ge=1)


class SessionListResult(Result):
    sessions: list[SessionSummary] = Field(description="Newest updatedAt first.")
    next_cursor: str | None = None


class SessionIdParams(Params):
    session_id: SessionId


class SessionGetParams(SessionIdParams):
    """A bounded window of the transcript (seed 003 §5).

    At most one anchor: `messageBefore` (backward paging, exclusive end),
    `messageAround` (centre on a message id) or `messageEnd` (forward
    paging: the window starts at a previous response's `messageEnd`).
    Without an anchor the newest window is returned. Positions are 0-based
    physical message positions in the transcript file.
    """

    message_before: int | None = Field(
        default=None, ge=0, description="Exclusive physical end of the window."
    )
    message_limit: int | None = Field(default=None, ge=1, le=MAX_WINDOW)
    content_limit: int | None = Field(
        default=None, ge=1, description="Cap on each projected message's text (characters)."
    )
    message_around: WireId | None = None
    message_end: int | None = Field(
        default=None,
        ge=0,
        description="Forward paging: start the window at this physical position.",
    )
    full: bool = Field(default=False, description="Whole transcript, no content cap.")

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
    message_start: Count = Field(description="Physical position of messages[0].")
    message_end: Count = Field(description="Exclusive physical end of the window.")
    has_more_before: bool
    has_more_after: bool
    total_messages: Count
    navigation_parent: UiMessage | None = Field(
        default=None, description="Owning Task row of a nested messageAround target."
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
    project_path: ProjectPath | None = None

    @model_validator(mode="after")
    def _something_to_update(self) -> SessionUpdateParams:
        updates = self.model_dump(exclude={"session_id", "submission_id"}, exclude_none=True)
        if not updates:
            raise ValueError("nothing to update: give at least one field besides sessionId")
        return self


class SessionDeleteParams(MutatingParams):
    session_id: SessionId


class SessionDeleteResult(Result):
    session_id: SessionId
    deleted: Literal[True] = True


# ---------------------------------------------------------------------------
# Appends


class AppendMessageParams(MutatingParams):
    session_id: SessionId
    message: TranscriptMessage
    turn_id: WireId | None = Field(
        default=None, description="Owning turn; must equal message.turnId when both are given."
    )

    @model_validator(mode="after")
    def _same_turn(self) -> AppendMessageParams:
        inner = self.message.turn_id
        if self.turn_id is not None and inner is not None and inner != self.turn_id:
            raise ValueError("turnId and message.turnId differ")
        return self


class AppendMessageResult(Result):
    message: MessageRef
    replayed: bool = Field(description="True when this id was already stored (no new line).")
    remapped_from: str | None = Field(
        default=None,
        description="Original id when the host stored the message as {sessionId}:{id}.",
    )


__all__ = [
    "AppendMessageParams",
    "AppendMessageResult",
    "BootReport",
    "HelloParams",
    "HelloResult",
    "SessionCreateParams",
    "SessionDeleteParams",
    "SessionDeleteResult",
    "SessionGetParams",
    "SessionGetResult",
    "SessionIdParams",
    "SessionListParams",
    "SessionListResult",
    "SessionRenameParams",
    "SessionUpdateParams",
    "StatusParams",
    "StatusResult",
]
