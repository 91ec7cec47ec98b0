"""Params and results: session.export (seed 003 §10.4)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from store.rules import MAX_EXPORT_INLINE_BYTES

from .models_common import Count, Params, ProjectPath, Result, SessionRef


class SessionExportParams(Params):
    session_id: SessionRef
    format: Literal["md", "html", "jsonl"] = Field(
        default="md",
        description="md; html (one self-contained page: no network fetch, images inlined); jsonl (this "
        "host's transcript format, which import.sessions source pi-host reads back).",
    )
    include_thinking: bool = Field(default=False, description="Thinking blocks are left out unless asked.")
    include_secrets: bool = Field(
        default=False,
        description="Secrets are excluded by default: credential references, secret-named values and every "
        "value the secret store holds are redacted unless this is true (not allowed to plugins).",
    )
    out_path: ProjectPath | None = Field(
        default=None,
        description="Absolute path of a new file the host writes the export to (never an existing file: "
        "CONFLICT); without it the export is answered inline, up to "
        f"{MAX_EXPORT_INLINE_BYTES} bytes.",
    )


class SessionExportResult(Result):
    format: str
    content: str | None = Field(default=None, description="The export (UTF-8 text), when no outPath was given.")
    path: str | None = Field(default=None, description="The file written, with outPath.")
    bytes: Count
    messages: Count
    compactions: Count
    environments: Count
    redactions: Count = Field(description="Secrets, credential references and secret-named values removed.")
    thinking_omitted: Count
    unreadable_lines: Count | None = Field(
        default=None, description="Indexed transcript lines that no longer parse (damaged on disk), left out of the "
                                  "export; `pi-host doctor` names them. Absent when there are none.")
    blobs: Count | None = Field(
        default=None, description="JSONL: blobs whose bytes the export carries (`blob` lines). Absent when zero.")
    blobs_evicted: Count | None = Field(
        default=None, description="JSONL: blobs referred to that this host no longer holds (evicted, lost, or "
        "bytes no longer hashing to their name), carried as `{\"type\": \"blob\", \"sha256\", \"evicted\": true}`. "
        "Absent when zero.")
    review_snapshots: Count | None = Field(
        default=None, description="JSONL: review-change snapshots carried (`review_snapshot` lines). Absent when zero.")
    review_unreadable: Count | None = Field(
        default=None, description="JSONL: review snapshots left out because their bytes no longer match their hash. "
        "Absent when zero.")


__all__ = ["SessionExportParams", "SessionExportResult"]
