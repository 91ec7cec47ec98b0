"""Params and results: configSync.* (seed 003 §1.3 portable configuration sync)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from store.rules import MAX_BUNDLE_BYTES

from .models_common import Count, MutatingParams, Params, Result, TimestampMs
from .models_secrets import MAX_SECRET_CHARS

Url = Annotated[str, StringConstraints(min_length=1, max_length=2048)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=500)]
Secret = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SECRET_CHARS)]


class ConfigSyncSettings(Result):
    enabled: bool = False
    webdav_url: str | None = None
    webdav_username: str | None = None
    remote_dir: str | None = None
    vault_key_ref: str | None = Field(default=None, description="Secret-store ref of the bundle key.")
    webdav_password_ref: str | None = Field(default=None, description="Secret-store ref of the WebDAV password.")


class BundleInfo(Result):
    bytes: Count
    written_at: TimestampMs


class ConfigSyncGetParams(Params):
    pass


class ConfigSyncState(Result):
    settings: ConfigSyncSettings
    has_vault_key: bool
    has_webdav_password: bool
    pending: BundleInfo | None = Field(default=None, description="config-sync/pending.bin (the last export).")
    base: BundleInfo | None = Field(default=None, description="config-sync/base.bin (the last applied bundle).")


class ConfigSyncConfigureParams(MutatingParams):
    enabled: bool | None = None
    webdav_url: Url | None = None
    webdav_username: Text | None = None
    remote_dir: Text | None = None
    webdav_password: Secret | None = Field(default=None, description="Kept in the secret store; null removes it.")
    vault_key: Annotated[str, StringConstraints(min_length=44, max_length=44)] | None = Field(
        default=None, description="Another device's bundle key (32 bytes, base64). Absent: one is generated "
        "when none exists yet.")


class ConfigSyncExportParams(MutatingParams):
    pass


class ConfigSyncExportResult(Result):
    bundle_base64: str = Field(description="The encrypted, authenticated bundle (also written to pending.bin).")
    sha256: str
    bytes: Count = Field(le=MAX_BUNDLE_BYTES)
    exported_at: TimestampMs


class ConfigSyncApplyParams(MutatingParams):
    bundle_base64: Annotated[str, StringConstraints(min_length=1, max_length=MAX_BUNDLE_BYTES * 4 // 3 + 4)]


class ConfigSyncApplied(Result):
    settings: Count
    providers: Count
    models: Count
    projects: Count
    project_groups: Count
    memory: Count
    skills: Count


class ConfigSyncApplyResult(Result):
    sha256: str
    applied: ConfigSyncApplied


__all__ = [
    "BundleInfo",
    "ConfigSyncApplied",
    "ConfigSyncApplyParams",
    "ConfigSyncApplyResult",
    "ConfigSyncConfigureParams",
    "ConfigSyncExportParams",
    "ConfigSyncExportResult",
    "ConfigSyncGetParams",
    "ConfigSyncSettings",
    "ConfigSyncState",
]
