"""Params and results: ``review.*``, message-owned review-change snapshots (seed 003 §2.0, ADR 0043).

A successful workspace Write/Edit tool result carries a bounded ``details.review`` record
(:class:`ReviewRef`) that refers to a snapshot recorded with ``review.record``: the previous
bytes and the hashes live outside the workspace in ``review-changes/<sessionId>/<snapshotId>/``.
The limits are ``store/rules.py``'s (``MAX_REVIEW_*``), checked here and again by the store.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from store.rules import MAX_REVIEW_FILE_BYTES, MAX_REVIEW_SNAPSHOTS, REVIEW_SNAPSHOT_ID_RE

from .models_common import FsPath, MutatingParams, Params, Result, SessionId, TimestampMs, WireId

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
SnapshotId = Annotated[
    str,
    StringConstraints(pattern=REVIEW_SNAPSHOT_ID_RE.pattern),
    Field(description="A review snapshot id (`rv-` and 32 hex digits), from review.record."),
]
ReviewToolName = Literal["Write", "Edit"]
ReviewState = Literal["recorded", "restored"]
_BASE64_MAX = (MAX_REVIEW_FILE_BYTES + 2) // 3 * 4


class ReviewRecordParams(MutatingParams):
    """Record the file's previous bytes once a Write/Edit tool has succeeded on it."""

    session_id: SessionId
    path: FsPath = Field(description="The file the tool wrote: absolute, or relative to the session's "
                         "workspace root (resolved as session.resolvePath does; it must stay inside).")
    before_base64: Annotated[str, StringConstraints(max_length=_BASE64_MAX)] | None = Field(
        description=f"The file's bytes before the tool ran (base64, at most {MAX_REVIEW_FILE_BYTES} bytes); "
        "null when the tool created the file.",
    )
    tool_name: ReviewToolName
    tool_call_id: WireId | None = None
    message_id: WireId | None = Field(default=None, description="The message whose tool result owns the card.")
    turn_id: WireId | None = None


class ReviewFileSide(Result):
    exists: bool
    sha256: Sha256 | None = Field(default=None, description="None when the file did not exist.")
    size: int = Field(ge=0)


class ReviewSnapshot(Result):
    snapshot_id: SnapshotId
    session_id: SessionId
    path: str = Field(description="Absolute, resolved under the session's workspace root.")
    tool_name: ReviewToolName
    tool_call_id: str | None = None
    message_id: str | None = None
    turn_id: str | None = None
    created_at: TimestampMs
    state: ReviewState = Field(description="recorded: the change stands; restored: the before bytes are back.")
    restored_at: TimestampMs | None = None
    before: ReviewFileSide
    after: ReviewFileSide = Field(description="The file as the tool left it (what a restore expects to find).")


class ReviewRef(Result):
    """The bounded ``details.review`` record a tool result carries."""

    snapshot_id: SnapshotId
    path: str
    before_sha256: Sha256 | None = None
    after_sha256: Sha256
    created: bool = Field(description="The tool created the file (a restore removes it).")


class ReviewRecordResult(Result):
    snapshot: ReviewSnapshot
    review: ReviewRef = Field(description="Put this in the tool result's details.review.")


class ReviewGetParams(Params):
    session_id: SessionId
    snapshot_id: SnapshotId
    include_before: bool = Field(default=False, description="Also return the before bytes (base64).")


class ReviewGetResult(Result):
    snapshot: ReviewSnapshot
    before_base64: str | None = Field(default=None, description="With includeBefore, when the file existed.")


class ReviewListParams(Params):
    session_id: SessionId
    message_id: WireId | None = Field(default=None, description="Only the snapshots this message owns.")
    limit: int = Field(default=MAX_REVIEW_SNAPSHOTS, ge=1, le=MAX_REVIEW_SNAPSHOTS)


class ReviewListResult(Result):
    snapshots: list[ReviewSnapshot] = Field(description="Oldest first (createdAt, then snapshotId).")
    truncated: bool = Field(description="More snapshots matched than limit.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of the session's snapshots whose stored meta.json is damaged (it no longer parses, or "
        "lost a field the host wrote): left out of snapshots, so the others still list; named whatever the "
        "messageId filter (theirs no longer reads); review.get of one answers CORRUPT_DATA. Absent when every "
        "snapshot reads.",
    )


class ReviewRestoreParams(MutatingParams):
    """Put the before bytes back (remove a created file), only if the file is still what the tool wrote."""

    session_id: SessionId
    snapshot_id: SnapshotId


class ReviewRestoreResult(Result):
    snapshot: ReviewSnapshot


__all__ = [
    "ReviewFileSide",
    "ReviewGetParams",
    "ReviewGetResult",
    "ReviewListParams",
    "ReviewListResult",
    "ReviewRecordParams",
    "ReviewRecordResult",
    "ReviewRef",
    "ReviewRestoreParams",
    "ReviewRestoreResult",
    "ReviewSnapshot",
    "ReviewState",
    "ReviewToolName",
    "SnapshotId",
]
