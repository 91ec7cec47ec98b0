"""Params and results: settings.* (the kv table, seed 003 §4.1; rules: store/config/settings_rules.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from store.rules import MAX_PATH_CHARS, MAX_SETTING_KEY_CHARS, MAX_SETTINGS_PER_UPDATE

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
SettingKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_PATH_CHARS),
    Field(description=f"1-{MAX_SETTING_KEY_CHARS} characters; in `projectMemory` a project path of up to "
          f"{MAX_PATH_CHARS} (the host checks the namespace's bound)."),
]


class SettingsGetParams(Params):
    ns: Namespace = "app"
    key: SettingKey = Field(description="In `app`, a field of the settings blob (`settings` = the whole blob). "
                            f"1-{MAX_SETTING_KEY_CHARS} characters; in `projectMemory` a project path of up to "
                            f"{MAX_PATH_CHARS}.")


class SettingsGetResult(Result):
    ns: str
    key: str
    value: Any = Field(default=None, description="Absent when the key is not set (app fields read their default).")
    updated_at: TimestampMs | None = None
    unreadable: list[str] | None = Field(
        default=None,
        description='Only for an app key while the stored app settings blob is damaged (it no longer parses as an '
        'object): ["settings"]; the value shown is the default, as for an unset blob. App writes are CORRUPT_DATA '
        "until pi-host doctor --repair sets the damaged bytes aside. Absent otherwise.",
    )


class SettingsGetAllParams(Params):
    ns: Namespace = "app"


class SettingsGetAllResult(Result):
    ns: str
    values: dict[str, Any] = Field(description="Every key of the namespace (app: the normalized settings blob).")
    updated_at: TimestampMs | None = Field(default=None, description="Newest write to the namespace.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Keys whose stored value is damaged (it no longer parses): left out of values, so the others "
        "still read; settings.get of one is CORRUPT_DATA, a settings.set or settings.delete of it writes over it. "
        "Absent when every key reads. App: its one blob; while it is damaged the values are the defaults and this "
        'is ["settings"] (app writes are CORRUPT_DATA until pi-host doctor --repair).',
    )


class SettingsSetParams(MutatingParams):
    ns: Namespace = "app"
    key: SettingKey
    value: Any = Field(description="Any JSON value the namespace's rules accept.")


class SettingsSetResult(Result):
    ns: str
    key: str
    value: Any = Field(default=None, description="The value now stored (absent: the write stored no key).")
    changed: list[str] = Field(default_factory=list, description="Keys whose stored value changed.")
    updated_at: TimestampMs


class SettingsUpdateParams(MutatingParams):
    ns: Namespace = "app"
    values: dict[SettingKey, Any] = Field(min_length=1, max_length=MAX_SETTINGS_PER_UPDATE,
                                          description="Keys to set (merged into what is stored), all or none.")


class SettingsUpdateResult(Result):
    ns: str
    values: dict[str, Any] = Field(description="Each requested key's value now (null: no key stored).")
    changed: list[str]
    updated_at: TimestampMs


class SettingsDeleteParams(MutatingParams):
    ns: Namespace = "app"
    key: SettingKey


class SettingsDeleteResult(Result):
    ns: str
    key: str
    deleted: bool = Field(description="False when the key was not set.")
    changed: list[str]


__all__ = [
    "Namespace",
    "SettingKey",
    "SettingsDeleteParams",
    "SettingsDeleteResult",
    "SettingsGetAllParams",
    "SettingsGetAllResult",
    "SettingsGetParams",
    "SettingsGetResult",
    "SettingsSetParams",
    "SettingsSetResult",
    "SettingsUpdateParams",
    "SettingsUpdateResult",
]
