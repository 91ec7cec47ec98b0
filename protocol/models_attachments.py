"""Params and results: attachments.* (seed 000 §2.3, §5)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from .models_common import (
    Count,
    FsPath,
    MutatingParams,
    Params,
    Result,
    SessionId,
    WireId,
)

# ---------------------------------------------------------------------------
# Attachments (seed 000 §2.3, §5)

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
MAX_PUT_BYTES = 4 * 1024 * 1024
MimeType = Annotated[str, StringConstraints(min_length=1, max_length=200)]
FileName = Annotated[str, StringConstraints(min_length=1, max_length=255)]


class AttachmentsPutParams(MutatingParams):
    name: FileName
    mime_type: MimeType
    data_base64: str = Field(
        max_length=(MAX_PUT_BYTES + 2) // 3 * 4,
        description="Standard base64 of at most 4 MiB; use attachments.importFile for larger files.",
    )


class AttachmentsImportParams(MutatingParams):
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
    used_bytes: Count
    budget_bytes: int = Field(ge=1, description="kv(app, attachmentBudgetBytes), default 200 MB.")
    percent: float = Field(ge=0)
    warning: bool = Field(description="True above 80 % of the budget.")
    blobs: Count


class AttachmentsGcParams(MutatingParams):
    active_session_id: SessionId | None = Field(
        default=None, description="Blobs this session references are never evicted."
    )


class AttachmentsGcResult(Result):
    evicted: list[Sha256] = Field(description="Least recently used first.")
    freed_bytes: Count
    orphans_removed: Count = Field(description="Blob files without an index row (crash leftovers).")
    estimate: AttachmentsEstimate


__all__ = [
    "AttachmentBlob",
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
