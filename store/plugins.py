"""Plugins (seed 003 §2 ``plugins/``, §4.1 ``plugin:<id>``, §4.3, §4.5, §11.8): registry file and ownership.

``plugins/registry.json`` — the host's record of installed plugins, read and
replaced whole (temp file + fsync + rename + directory fsync, never edited in
place)::

    {"version": 1,
     "plugins": {"acme.tools": {"id": "acme.tools", "name": "Acme tools", "version": "1.2.0",
                                "enabled": true, "installedAt": 1785056400000, "updatedAt": 1785056400000}}}

Keys this host does not know (top level or per plugin) are kept as they are.
A registry that is not valid JSON of this shape is ``CORRUPT_DATA`` and is
never overwritten (the host refuses to write over what it cannot read).

What a plugin owns in the database: its ``kv(plugin:<id>)`` namespace, the
``providers`` rows with ``owner_plugin_id = <id>`` and the sessions whose
``session_import_origins.plugin_id`` is ``<id>``. Uninstall deletes the
namespace in one statement and releases the provider rows to the user
(``owner_plugin_id = NULL``); imported sessions stay.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Final

import orjson

from store.config.settings import delete_namespace
from store.errors import CorruptData, InvalidInput
from store.fsutil import atomic_write
from store.rules import PLUGIN_ID_RE

__all__ = [
    "REGISTRY_FILE",
    "forget_plugin",
    "plugin_namespace",
    "read_registry",
    "registry_entries",
    "release_providers",
    "session_owner",
    "validate_plugin_id",
    "with_entry",
    "without_entry",
    "write_registry",
]

REGISTRY_FILE: Final = "registry.json"
REGISTRY_VERSION: Final = 1
def validate_plugin_id(plugin_id: object) -> str:
    if not isinstance(plugin_id, str) or not PLUGIN_ID_RE.fullmatch(plugin_id):
        raise InvalidInput(f"plugin id must match {PLUGIN_ID_RE.pattern}", data={"field": "pluginId"})
    return plugin_id


def plugin_namespace(plugin_id: str) -> str:
    return f"plugin:{validate_plugin_id(plugin_id)}"


# -- registry.json ------------------------------------------------------------------


def read_registry(directory: Path) -> dict[str, Any]:
    """The whole registry document (an empty one when the file does not exist)."""
    path = directory / REGISTRY_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {"version": REGISTRY_VERSION, "plugins": {}}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CorruptData(f"{path} is not valid JSON; fix or remove it", data={"path": str(path)}) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("plugins", {}), dict):
        raise CorruptData(f"{path} is not a plugin registry ({{version, plugins: {{id: entry}}}})",
                          data={"path": str(path)})
    doc.setdefault("plugins", {})
    for pid, entry in doc["plugins"].items():
        if not isinstance(entry, dict):
            raise CorruptData(f"{path}: entry {pid!r} is not an object", data={"path": str(path)})
    return dict(doc)


def registry_entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**entry, "id": pid} for pid, entry in sorted(doc["plugins"].items())]


def with_entry(doc: dict[str, Any], plugin_id: str, fields: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """The registry with ``plugin_id`` added or updated (its unknown keys and installedAt kept)."""
    plugins = dict(doc["plugins"])
    old = plugins.get(plugin_id, {})
    entry = {**old, **fields, "id": plugin_id, "installedAt": old.get("installedAt", now_ms), "updatedAt": now_ms}
    plugins[plugin_id] = entry
    return {**doc, "version": doc.get("version", REGISTRY_VERSION), "plugins": plugins}


def without_entry(doc: dict[str, Any], plugin_id: str) -> tuple[dict[str, Any], bool]:
    plugins = dict(doc["plugins"])
    removed = plugins.pop(plugin_id, None) is not None
    return {**doc, "plugins": plugins}, removed


def write_registry(directory: Path, doc: dict[str, Any]) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(directory / REGISTRY_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS),
                 point_prefix="plugins.registry")


# -- ownership in the database -----------------------------------------------------------


def session_owner(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The plugin that imported ``session_id`` (None: a user session)."""
    row = conn.execute("SELECT plugin_id FROM session_import_origins WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else str(row[0])


def release_providers(conn: sqlite3.Connection, plugin_id: str) -> list[str]:
    """Hand the plugin's provider rows to the user (``owner_plugin_id = NULL``); their ids."""
    ids = [r[0] for r in conn.execute("SELECT id FROM providers WHERE owner_plugin_id = ? ORDER BY id",
                                      (plugin_id,))]
    conn.execute("UPDATE providers SET owner_plugin_id = NULL WHERE owner_plugin_id = ?", (plugin_id,))
    return ids


def forget_plugin(conn: sqlite3.Connection, plugin_id: str) -> dict[str, Any]:
    """Uninstall's transaction: ``kv(plugin:<id>)`` in one statement, provider rows released."""
    ns = plugin_namespace(plugin_id)
    keys = [r[0] for r in conn.execute("SELECT key FROM kv WHERE ns = ? ORDER BY key", (ns,))]
    delete_namespace(conn, ns)
    released = release_providers(conn, plugin_id)
    return {"settingsRemoved": keys, "providersReleased": released}
