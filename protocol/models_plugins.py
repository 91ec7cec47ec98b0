"""Params and results: plugins.* (the registry file, uninstall; seed 003 §11.8)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from .models_common import MutatingParams, Params, PluginId, Result, TimestampMs

Text = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class PluginEntry(Result):
    id: str
    name: str | None = None
    version: str | None = None
    enabled: bool | None = None
    source: str | None = None
    installed_at: TimestampMs | None = None
    updated_at: TimestampMs | None = None


class PluginsListParams(Params):
    pass


class PluginsListResult(Result):
    plugins: list[PluginEntry] = Field(description="Every entry of plugins/registry.json, by id.")


class PluginsRegisterParams(MutatingParams):
    plugin_id: PluginId
    name: Text
    version: Text
    enabled: bool = True
    source: Text | None = Field(default=None, description="Where it came from (a path, a URL, a store id).")


class PluginResult(Result):
    plugin: PluginEntry


class PluginsSetEnabledParams(MutatingParams):
    plugin_id: PluginId
    enabled: bool


class PluginsUninstallParams(MutatingParams):
    plugin_id: PluginId


class PluginsUninstallResult(Result):
    plugin_id: str
    registry_entry_removed: bool
    settings_removed: list[str] = Field(description="Keys of kv(plugin:<id>), deleted in one statement.")
    providers_released: list[str] = Field(description="The plugin's provider rows, now the user's.")


__all__ = [
    "PluginEntry",
    "PluginResult",
    "PluginsListParams",
    "PluginsListResult",
    "PluginsRegisterParams",
    "PluginsSetEnabledParams",
    "PluginsUninstallParams",
    "PluginsUninstallResult",
]
