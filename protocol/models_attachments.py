"""Params and results: attachments.* (seed 000 §2.3, §5)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, StringConstraints, field_validator

from .models_common import (
    Count,
    FsPath,
    MutatingParams,
    Params,
    Result,
    SessionId,
    TimestampMs,
    WireId,
)

# ---------------------------------------------------------------------------
# Attachments (seed 000 §2.3, §5)

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
MAX_PUT_BYTES = 4 * 1024 * 1024
MimeType = Annotated[str, StringConstraints(min_length=1, max_length=200)]
FileName = Annotated[str, StringConstraints(min_length=1, max_length=255)]


BlobKind = Literal["image", "file", "screenshot", "pageSnapshot", "pageText"]
ShortLabel = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
SourceText = Annotated[str, StringConstraints(min_length=1, max_length=2048)]
MAX_BLOB_META_BYTES = 4096
DeletionState = Literal["live", "evicting", "evicted"]
RefOrigin = Literal["client", "transcript", "revision", "checkpoint", "queue"]


class BlobMetadata(MutatingParams):
    """Seed 000 §2.3: what a blob is and where it came from. The first writer's values stay."""

    kind: BlobKind | None = None
    trust: ShortLabel | None = Field(
        default=None, description='Who vouches for the content, e.g. "user" or "untrusted" (a page, a tool).'
    )
    provenance: ShortLabel | None = Field(
        default=None, description='How it was obtained, e.g. "upload", "capture", "tool".'
    )
    source: SourceText | None = Field(default=None, description="Where it came from: a URL, a path, a tool name.")
    run_id: WireId | None = Field(default=None, description="The run (turn) that produced it.")
    meta: dict[str, Any] | None = Field(
        default=None,
        description="Page metadata (url, title, …) or image metadata (width, height, …); "
        f"at most {MAX_BLOB_META_BYTES} bytes as JSON.",
    )

    @field_validator("meta")
    @classmethod
    def _bounded_meta(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            if len(orjson.dumps(value)) > MAX_BLOB_META_BYTES:
                raise ValueError(f"meta is larger than {MAX_BLOB_META_BYTES} bytes as JSON")
        return value


class AttachmentsPutParams(BlobMetadata):
    name: FileName
    mime_type: MimeType
    data_base64: str = Field(
        max_length=(MAX_PUT_BYTES + 2) // 3 * 4,
        description="Standard base64 of at most 4 MiB; use attachments.importFile for larger files.",
    )


class AttachmentsImportParams(BlobMetadata):
    path: FsPath = Field(
        description="Absolute path of a regular file under an allowed folder: the session's project "
        "(with sessionId), the data directory's scratch/, or a folder the host was configured with "
        "(serve --import-root). Symlinks below the folder are not followed; copied and hashed as a stream."
    )
    session_id: SessionId | None = Field(
        default=None, description="The session the file is for: its project folder may be read."
    )
    name: FileName | None = None
    mime_type: MimeType | None = None


class AttachmentBlob(Result):
    ref: str = Field(description="attachments/<sha256>")
    sha256: Sha256
    size: Count
    name: str | None = None
    mime_type: str | None = None


class AttachmentsGetParams(Params):
    sha256: Sha256


class AttachmentReference(Result):
    session_id: SessionId
    message_id: str | None = Field(default=None, description="The message (or queue entry) holding the block.")
    origin: RefOrigin = Field(description="client (attachments.ref) or where the GC found it.")
    evicted: bool = Field(description="Marked when the blob was evicted (before its bytes were deleted), or "
                          "when its file is gone though no GC evicted it (deleted by hand or lost).")


class AttachmentsGetResult(Result):
    ref: str = Field(description="attachments/<sha256>")
    sha256: Sha256
    size: Count
    mime_type: str | None = None
    kind: BlobKind | None = None
    trust: str | None = None
    provenance: str | None = None
    source: str | None = None
    run_id: str | None = None
    meta: dict[str, Any] | None = None
    created_at: TimestampMs
    last_used_at: TimestampMs
    deletion_state: DeletionState = Field(
        description="live | evicting (bytes being deleted) | evicted (tombstone; also a blob whose bytes are "
        "gone though no GC evicted it, deleted behind the host's back: it reads evicted, its references marked, "
        "without evictedAt until attachments.gc makes it a tombstone).")
    evicted_at: TimestampMs | None = None
    references: list[AttachmentReference] = Field(description="At most 200, by session and message.")
    references_truncated: bool


class AttachmentsRefParams(MutatingParams):
    sha256: Sha256
    session_id: SessionId
    message_id: WireId | None = None


class AttachmentsRefResult(Result):
    sha256: Sha256
    session_id: SessionId
    message_id: str | None = None
    created: bool = Field(description="False when the reference already existed.")


class AttachmentsEstimateParams(Params):
    pass


class AttachmentsEstimate(Result):
    used_bytes: Count = Field(description="Bytes of the live blobs whose file is there (a blob file deleted by hand "
                              "or lost no longer counts, before any attachments.gc).")
    budget_bytes: int = Field(ge=1, description="kv(app, attachmentBudgetBytes), default 200 MB.")
    percent: float = Field(ge=0)
    warning: bool = Field(description="True above 80 % of the budget.")
    blobs: Count = Field(description="How many blobs usedBytes counts.")


class AttachmentsGcParams(MutatingParams):
    active_session_id: SessionId | None = Field(
        default=None, description="Blobs this session references are never evicted."
    )


class AttachmentsGcResult(Result):
    evicted: list[Sha256] = Field(description="Budget eviction: least recently used first.")
    unreferenced_evicted: list[Sha256] = Field(
        default_factory=list,
        description="Swept whatever the budget: referenced by no session file, queued turn or recorded reference "
        "of an existing session, and last used (put, import, ref) longer ago than app.attachmentUnreferencedGraceMs "
        "(default 1 hour). Least recently used first; never in evicted too.",
    )
    freed_bytes: Count = Field(description="Bytes of the evicted and the unreferencedEvicted blobs.")
    orphans_removed: Count = Field(description="Blob files without an index row that no session file or queued turn "
                                               "refers to, removed: an interrupted put's leftover, or a blob a rebuilt "
                                               "index has no row for.")
    estimate: AttachmentsEstimate
    scan_incomplete: list[str] | None = Field(
        default=None,
        description="Present when not empty: the sessions whose files the reference scan could not read whole "
        "(a line over the 64 MiB line limit, a damaged line, an unreadable file). Such a session may reference "
        "any blob: this GC swept nothing unreferenced (unreferencedEvicted is empty), kept their recorded "
        "references, and evicted nothing over budget when one of them is the active session.",
    )


__all__ = [
    "AttachmentBlob",
    "AttachmentReference",
    "AttachmentsGetParams",
    "AttachmentsGetResult",
    "BlobKind",
    "BlobMetadata",
    "AttachmentsEstimate",
    "AttachmentsEstimateParams",
    "AttachmentsGcParams",
    "AttachmentsGcResult",
    "AttachmentsImportParams",
    "AttachmentsPutParams",
    "AttachmentsRefParams",
    "AttachmentsRefResult",
    "FileName",
    "MAX_PUT_BYTES",
    "MimeType",
    "Sha256",
]
