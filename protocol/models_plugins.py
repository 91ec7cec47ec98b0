"""Params and results: plugins.* (the registry file, uninstall; seed 003 §11.8)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, StringConstraints

from store.rules import (
    MAX_PLUGIN_ASSET_BYTES,
    MAX_PLUGIN_ASSETS,
    MAX_PLUGIN_ASSETS_TOTAL_BYTES,
    PLUGIN_ASSET_PATH_RE,
    PLUGIN_ASSET_TYPES,
)

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


AssetPath = Annotated[str, StringConstraints(pattern=PLUGIN_ASSET_PATH_RE.pattern),
                      Field(description="Relative path of 1-4 plain segments (no `..`, no hidden names).")]
AssetMediaType = Annotated[str, StringConstraints(pattern="^(?:" + "|".join(re.escape(t) for t in PLUGIN_ASSET_TYPES)
                                                   + ")$"),
                           Field(description="One of: " + ", ".join(PLUGIN_ASSET_TYPES) + ".")]


class PluginAssetInput(Params):
    path: AssetPath
    media_type: AssetMediaType = Field(description="Checked against the bytes (image signature, UTF-8, JSON).")
    data_base64: Annotated[str, StringConstraints(min_length=1, max_length=(MAX_PLUGIN_ASSET_BYTES + 2) // 3 * 4)]


class PluginAssetMeta(Result):
    path: str
    media_type: str
    size: int = Field(ge=1, le=MAX_PLUGIN_ASSET_BYTES)
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class PluginAsset(PluginAssetMeta):
    data_base64: str


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
    assets: list[PluginAssetInput] | None = Field(
        default=None, max_length=MAX_PLUGIN_ASSETS,
        description=f"Install these read-only assets, replacing the plugin's whole set ([] removes them; absent "
        f"keeps them); at most {MAX_PLUGIN_ASSET_BYTES} bytes each, {MAX_PLUGIN_ASSETS_TOTAL_BYTES} together.")


class PluginResult(Result):
    plugin: PluginEntry
    assets: list[PluginAssetMeta] | None = Field(default=None, description="The installed assets (register with "
                                                 "`assets`): no bytes.")


class PluginsListAssetsParams(Params):
    plugin_id: PluginId | None = Field(default=None, description="Default: the calling plugin's own id.")


class PluginsListAssetsResult(Result):
    plugin_id: str
    assets: list[PluginAssetMeta] = Field(max_length=MAX_PLUGIN_ASSETS)


class PluginsGetAssetParams(Params):
    plugin_id: PluginId | None = Field(default=None, description="Default: the calling plugin's own id.")
    path: AssetPath


class PluginsGetAssetResult(Result):
    plugin_id: str
    asset: PluginAsset


class PluginsSetEnabledParams(MutatingParams):
    plugin_id: PluginId
    enabled: bool


class PluginsUninstallParams(MutatingParams):
    plugin_id: PluginId


class PluginsUninstallResult(Result):
    plugin_id: str
    registry_entry_removed: bool
    assets_removed: bool | None = Field(default=None, description="True: its installed assets were removed.")
    settings_removed: list[str] = Field(description="Keys of kv(plugin:<id>), deleted in one statement.")
    providers_released: list[str] = Field(description="The plugin's provider rows, now the user's.")


__all__ = [
    "PluginAsset",
    "PluginAssetInput",
    "PluginAssetMeta",
    "PluginEntry",
    "PluginsGetAssetParams",
    "PluginsGetAssetResult",
    "PluginsListAssetsParams",
    "PluginsListAssetsResult",
    "PluginResult",
    "PluginsListParams",
    "PluginsListResult",
    "PluginsRegisterParams",
    "PluginsSetEnabledParams",
    "PluginsUninstallParams",
    "PluginsUninstallResult",
]
