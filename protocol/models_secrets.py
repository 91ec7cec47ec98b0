"""Params and results: secrets.* (seed 003 §4.12, §10)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from .models_common import (
    MutatingParams,
    Params,
    Ref,
    Result,
    TimestampMs,
)

# ---------------------------------------------------------------------------
# Secrets (seed 003 §4.12, §10)

SecretRef = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512),
    Field(description="Secret reference, e.g. provider/anthropic (1-512 bytes, no control characters)."),
]
MAX_SECRET_CHARS = 64 * 1024


class SecretsSetParams(MutatingParams):
    ref: SecretRef
    value: str = Field(max_length=MAX_SECRET_CHARS,
                       description="The secret; encrypted at rest (AES-256-GCM), never echoed, never in SQLite.")
    owner_kind: Ref | None = Field(default=None, description="Default provider.")
    owner_id: Ref | None = None
    kind: Ref | None = Field(default=None, description="Default api_key.")


class SecretsSetResult(Result):
    ref: str
    updated_at: TimestampMs
    version: int = Field(ge=1, description="Bumped on every write of this ref (authenticated in the file).")


class SecretsRefParams(Params):
    ref: SecretRef


class SecretsGetResult(Result):
    ref: str
    value: str


class SecretsDeleteParams(MutatingParams):
    ref: SecretRef


class SecretsDeleteResult(Result):
    ref: str
    deleted: bool = Field(description="False when no such secret existed.")


class SecretsListParams(Params):
    owner_kind: Ref | None = None
    owner_id: Ref | None = None


class SecretMeta(Result):
    ref: str
    owner_kind: str
    owner_id: str | None = None
    kind: str
    backend: str = Field(description="file_fallback (safe_storage is reserved).")
    updated_at: TimestampMs = Field(description=(
        "When the secret's last write answered (what secrets.set answered). A row rebuilt from the files "
        "after a lost database takes it from the file's header; a file of an earlier format gives its mtime."))


class SecretsListResult(Result):
    secrets: list[SecretMeta] = Field(description="Bookkeeping only; never a value. By ref.")


__all__ = [
    "MAX_SECRET_CHARS",
    "SecretMeta",
    "SecretRef",
    "SecretsDeleteParams",
    "SecretsDeleteResult",
    "SecretsGetResult",
    "SecretsListParams",
    "SecretsListResult",
    "SecretsRefParams",
    "SecretsSetParams",
    "SecretsSetResult",
]
