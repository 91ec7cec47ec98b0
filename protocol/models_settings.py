"""Params and results: settings.get / settings.set (the kv table, seed 003 §4.1)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from .models_common import (
    MutatingParams,
    Params,
    Result,
    TimestampMs,
)

# ---------------------------------------------------------------------------
# Settings (kv table, seed 003 §4.1)

Namespace = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,100}$"),
    Field(description="kv namespace: app, ui, cache, plugin:<id>, projectMemory ..."),
]
SettingKey = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class SettingsGetParams(Params):
    ns: Namespace = "app"
    key: SettingKey


class SettingsGetResult(Result):
    ns: str
    key: str
    value: Any = Field(default=None, description="Absent when the key is not set.")
    updated_at: TimestampMs | None = None


class SettingsSetParams(MutatingParams):
    ns: Namespace = "app"
    key: SettingKey
    value: Any = Field(description="Any JSON value.")


class SettingsSetResult(Result):
    ns: str
    key: str
    value: Any = Field(description="The value as stored.")
    updated_at: TimestampMs


__all__ = [
    "Namespace",
    "SettingKey",
    "SettingsGetParams",
    "SettingsGetResult",
    "SettingsSetParams",
    "SettingsSetResult",
]
