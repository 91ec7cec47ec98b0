"""Plugin assets (seed 000 §2: "plugins, pluginAssets | Plugin ownership and validated read-only assets").

A plugin's assets (icons, a readme, a JSON manifest ...) arrive with its
install (``plugins.register`` with ``assets``) and are read-only from then on:
no method writes one asset; a reinstall replaces the whole set, an uninstall
removes it. They are payloads the host stores and ships (seed 003 §9: "files/
JSON for payloads the host merely stores and ships"), so they live in one file
per plugin, ``plugins/assets/<pluginId>.json``, replaced whole (temp file +
fsync + rename + directory fsync)::

    {"version": 1, "pluginId": "acme.tools", "installedAt": 1785056400000,
     "assets": [{"path": "icons/logo.png", "mediaType": "image/png", "size": 1234,
                 "sha256": "<hex>", "dataBase64": "iVBORw0K..."}]}

Validation before anything is written (limits: ``store/rules.py``): at most
:data:`~store.rules.MAX_PLUGIN_ASSETS` assets, each a relative path of plain
segments (no ``..``, no hidden names), unique; a media type from
:data:`~store.rules.PLUGIN_ASSET_TYPES` that the bytes really have (image
signatures; UTF-8 text without NUL; strict JSON); at most
:data:`~store.rules.MAX_PLUGIN_ASSET_BYTES` each and
:data:`~store.rules.MAX_PLUGIN_ASSETS_TOTAL_BYTES` together. Nothing
executable (no SVG, no HTML, no scripts) is accepted.

A read verifies the asset's SHA-256: bytes changed on disk are
``CORRUPT_DATA``, never served.

Synchronous: file functions run in a worker thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from store.errors import CorruptData, InvalidInput, NotFound, PayloadTooLarge
from store.faults import NO_FAULTS, Faults
from store.fsutil import OwedSyncs, atomic_write, remove_file_durable
from store.rules import (
    MAX_PLUGIN_ASSET_BYTES,
    MAX_PLUGIN_ASSETS,
    MAX_PLUGIN_ASSETS_TOTAL_BYTES,
    PLUGIN_ASSET_PATH_RE,
    PLUGIN_ASSET_TYPES,
)

__all__ = [
    "ASSETS_DIR",
    "Asset",
    "asset_metas",
    "bundle_path",
    "has_bundle",
    "read_asset",
    "read_bundle",
    "remove_bundle",
    "validate_assets",
    "write_bundle",
]

ASSETS_DIR: Final = "assets"
BUNDLE_VERSION: Final = 1
Asset = dict[str, Any]
"""``{path, mediaType, size, sha256, dataBase64}``"""

_IMAGE_SIGNATURES: Final[Mapping[str, tuple[bytes, ...]]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}


def _bad(field: str, reason: str) -> InvalidInput:
    return InvalidInput(f"{field}: {reason}", data={"field": field})


def _check_content(media_type: str, data: bytes, field: str) -> None:
    """The bytes are what ``media_type`` says (so a client never renders a disguised file)."""
    if media_type in _IMAGE_SIGNATURES:
        if not data.startswith(_IMAGE_SIGNATURES[media_type]):
            raise _bad(field, f"is not a {media_type} file (its signature does not match)")
    elif media_type == "image/webp":
        if not (len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP"):
            raise _bad(field, "is not an image/webp file (its signature does not match)")
    else:  # text/* and application/json
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(field, f"{media_type} must be UTF-8 text") from None
        if "\x00" in text:
            raise _bad(field, f"{media_type} must not contain NUL characters")
        if media_type == "application/json":
            try:
                orjson.loads(data)
            except orjson.JSONDecodeError:
                raise _bad(field, "application/json must be valid JSON") from None


def validate_assets(raw: Sequence[Mapping[str, Any]]) -> list[Asset]:
    """The stored form of an install's assets (by path); raises on the first bad one, writing nothing."""
    if len(raw) > MAX_PLUGIN_ASSETS:
        raise _bad("assets", f"at most {MAX_PLUGIN_ASSETS} assets per plugin")
    out: list[Asset] = []
    seen: set[str] = set()
    total = 0
    for i, item in enumerate(raw):
        where = f"assets.{i}"
        path, media_type, encoded = item.get("path"), item.get("mediaType"), item.get("dataBase64")
        if not isinstance(path, str) or not PLUGIN_ASSET_PATH_RE.fullmatch(path):
            raise _bad(f"{where}.path", "must be a relative path of 1-4 plain segments (letters, digits, _ . -; "
                                        "no segment starting with a dot)")
        if path in seen:
            raise _bad(f"{where}.path", f"repeats {path!r}")
        seen.add(path)
        if media_type not in PLUGIN_ASSET_TYPES or not isinstance(media_type, str):
            raise _bad(f"{where}.mediaType", f"must be one of {', '.join(PLUGIN_ASSET_TYPES)}")
        if not isinstance(encoded, str):
            raise _bad(f"{where}.dataBase64", "must be base64 text")
        if len(encoded) > (MAX_PLUGIN_ASSET_BYTES + 2) // 3 * 4:
            raise PayloadTooLarge(f"{where}: more than {MAX_PLUGIN_ASSET_BYTES} bytes",
                                  data={"field": f"{where}.dataBase64", "limit": MAX_PLUGIN_ASSET_BYTES})
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(f"{where}.dataBase64", "is not valid base64") from None
        if not data:
            raise _bad(f"{where}.dataBase64", "must not be empty")
        if len(data) > MAX_PLUGIN_ASSET_BYTES:
            raise PayloadTooLarge(f"{where}: {len(data)} bytes, at most {MAX_PLUGIN_ASSET_BYTES}",
                                  data={"field": f"{where}.dataBase64", "limit": MAX_PLUGIN_ASSET_BYTES})
        total += len(data)
        if total > MAX_PLUGIN_ASSETS_TOTAL_BYTES:
            raise PayloadTooLarge(f"assets: more than {MAX_PLUGIN_ASSETS_TOTAL_BYTES} bytes together",
                                  data={"field": "assets", "limit": MAX_PLUGIN_ASSETS_TOTAL_BYTES})
        _check_content(media_type, data, f"{where}.dataBase64")
        out.append({"path": path, "mediaType": media_type, "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(), "dataBase64": base64.b64encode(data).decode()})
    return sorted(out, key=lambda a: str(a["path"]))


def asset_metas(assets: Sequence[Asset]) -> list[dict[str, Any]]:
    """What a listing shows: everything but the bytes."""
    return [{k: v for k, v in a.items() if k != "dataBase64"} for a in assets]


def bundle_path(directory: Path, plugin_id: str) -> Path:
    return directory / ASSETS_DIR / f"{plugin_id}.json"


def read_bundle(directory: Path, plugin_id: str) -> dict[str, Any] | None:
    """The plugin's installed bundle (None: it installed no assets)."""
    path = bundle_path(directory, plugin_id)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CorruptData(f"{path} is not valid JSON; reinstall the plugin", data={"path": str(path)}) from None
    if not isinstance(doc, dict) or doc.get("pluginId") != plugin_id or not isinstance(doc.get("assets"), list) \
            or not all(isinstance(a, dict) for a in doc["assets"]):
        raise CorruptData(f"{path} is not the asset bundle of plugin {plugin_id}; reinstall the plugin",
                          data={"path": str(path)})
    return doc


def write_bundle(directory: Path, plugin_id: str, assets: Sequence[Asset], now_ms: int,
                 faults: Faults = NO_FAULTS, owed: OwedSyncs | None = None) -> bool:
    """Install ``assets`` (replacing the whole set; an empty set removes the file). False: already installed."""
    try:
        old = read_bundle(directory, plugin_id)
    except CorruptData:
        old = None  # a reinstall is the repair of an unreadable bundle
    if old is not None and old["assets"] == list(assets):
        return False  # the same set, byte for byte (bytes changed on disk are rewritten)
    if not assets:
        return remove_bundle(directory, plugin_id, owed)
    target = bundle_path(directory, plugin_id)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = {"version": BUNDLE_VERSION, "pluginId": plugin_id, "installedAt": now_ms, "assets": list(assets)}
    atomic_write(target, orjson.dumps(doc), faults=faults, point_prefix="plugins.assets", owed=owed)
    return True


def has_bundle(directory: Path, plugin_id: str) -> bool:
    """Whether the plugin has installed assets (a file is there, readable or not)."""
    return os.path.lexists(bundle_path(directory, plugin_id))


def remove_bundle(directory: Path, plugin_id: str, owed: OwedSyncs | None = None) -> bool:
    return remove_file_durable(bundle_path(directory, plugin_id), owed=owed)


def read_asset(directory: Path, plugin_id: str, asset_path: str) -> Asset:
    """One asset with its bytes, its SHA-256 verified (``NOT_FOUND`` / ``CORRUPT_DATA``)."""
    doc = read_bundle(directory, plugin_id)
    found = next((a for a in (doc or {}).get("assets", ()) if a.get("path") == asset_path), None)
    if found is None:
        raise NotFound(f"plugin {plugin_id} has no asset {asset_path!r}",
                       data={"pluginId": plugin_id, "path": asset_path})
    try:
        data = base64.b64decode(str(found.get("dataBase64")), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if hashlib.sha256(data).hexdigest() != found.get("sha256") or len(data) != found.get("size"):
        raise CorruptData(f"asset {asset_path!r} of plugin {plugin_id} does not match its digest; "
                          "reinstall the plugin", data={"pluginId": plugin_id, "path": asset_path})
    return dict(found)
