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

Uninstall's file steps (the registry entry, the asset bundle) come before its
transaction, and a retry cannot tell from the files what the first try removed.
So a keyed uninstall that has something to remove first records it, as
``projects.remove`` does: the *uninstall intent*
``plugins/uninstall-<hex of the id>.intent`` (:class:`UninstallIntent`, written
whole and fsynced; the id is hex-encoded so no name holds a temp-file marker)
names the plugin, whether its entry and its assets were there, and the receipt
record of each keyed call that took part. A call that finds it (the retry of
one cut short) removes what is left and answers from it; its transaction
stores the receipt of every call the intent names with that one answer
(:func:`store_uninstall_receipts`); the intent goes after that transaction.
One left by a kill right after the transaction has all its receipts stored
(:func:`uninstall_finished`): it is ignored, and replaced by the next uninstall
(boot may remove it: :func:`sweep_uninstall_intents`).

A keyed uninstall always writes its intent, with the answer it will give
(``answer``: what the files held and what the transaction will remove, read
before the first file step), and its registry write carries the receipt record
of each keyed call in it with that answer (``receipts``, below). If the database
is lost, a retry finds its record there: an intent naming it still waits (the
retry finishes the uninstall and answers the intent's answer), else the
uninstall is over and the retry is answered the record's answer, with no second
effect (a plugin registered again since stays).

``receipts`` in the registry: the receipt record, with its answer
(``extra.response``), of each keyed ``plugins.register`` / ``setEnabled`` /
``uninstall`` whose registry write carried it, newest first (the newest
:data:`CARRIED_REGISTRY_RECEIPTS`). Their effect is that file, so their receipt
rides in it: after the database was lost, a retry is answered from it and does
not undo what changed since.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import orjson

from store import receipts
from store.config.settings import delete_namespace
from store.errors import CorruptData, InvalidInput
from store.faults import NO_FAULTS, Faults
from store.fsutil import OwedSyncs, atomic_write, remove_file_durable
from store.rules import PLUGIN_ID_RE
from store.safe_open import read_json_file

__all__ = [
    "REGISTRY_FILE",
    "CARRIED_REGISTRY_RECEIPTS",
    "UninstallIntent",
    "drop_uninstall_intent",
    "forget_plugin",
    "forgotten_by",
    "plugin_namespace",
    "read_registry",
    "read_uninstall_intent",
    "registry_entries",
    "registry_receipt",
    "release_providers",
    "session_owner",
    "store_uninstall_receipts",
    "sweep_uninstall_intents",
    "uninstall_finished",
    "uninstall_intent_path",
    "validate_plugin_id",
    "with_entry",
    "with_receipts",
    "without_entry",
    "write_registry",
    "write_uninstall_intent",
]

REGISTRY_FILE: Final = "registry.json"
REGISTRY_VERSION: Final = 1
_MAX_INTENT_BYTES: Final = 1 << 20
REGISTRY_RECEIPTS: Final = "receipts"
CARRIED_REGISTRY_RECEIPTS: Final = 64
"""How many keyed registry changes' receipt records the registry keeps, newest first (a retry of an older one
after the database was lost runs again)."""


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


def write_registry(directory: Path, doc: dict[str, Any], faults: Faults = NO_FAULTS,
                   owed: OwedSyncs | None = None) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(directory / REGISTRY_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS),
                 faults=faults, point_prefix="plugins.registry", owed=owed)


def with_receipts(doc: dict[str, Any], records: Sequence[Mapping[str, Any]], answer: Any) -> dict[str, Any]:
    """The registry with the receipt record of each keyed call of a change (``records``: one, or an
    uninstall's), carrying its ``answer``, first among the kept ones (the newest
    :data:`CARRIED_REGISTRY_RECEIPTS`)."""
    new = [{**record, "extra": {"response": answer}} for record in records]
    kept = doc.get(REGISTRY_RECEIPTS)
    older = [r for r in kept if isinstance(r, dict) and not any(_same_key(r, n) for n in new)] \
        if isinstance(kept, list) else []
    return {**doc, REGISTRY_RECEIPTS: (new + older)[:CARRIED_REGISTRY_RECEIPTS]}


def registry_receipt(doc: Mapping[str, Any], key: receipts.ReceiptKey) -> tuple[receipts.ReceiptKey, Any] | None:
    """The key and answer the registry keeps for a keyed change with ``key``'s client and submission id."""
    kept = doc.get(REGISTRY_RECEIPTS)
    for record in kept if isinstance(kept, list) else []:
        found = receipts.key_of_record(record)
        extra = record.get("extra") if isinstance(record, Mapping) else None
        if (found is not None and (found.client_id, found.submission_id) == (key.client_id, key.submission_id)
                and isinstance(extra, Mapping) and isinstance(extra.get("response"), Mapping)):
            return found, dict(extra["response"])
    return None


# -- the uninstall intent: what an uninstall removes, durable before its first file step -----------------


@dataclass(frozen=True, slots=True)
class UninstallIntent:
    """An uninstall in progress: what it found to remove and the receipt record of each keyed call in it."""

    plugin_id: str
    registry_entry_removed: bool = False
    assets_removed: bool = False
    receipt_records: tuple[Mapping[str, Any], ...] = ()
    carried: Mapping[str, Any] | None = None
    """A keyed uninstall's answer, read before its first file step (:meth:`answer` of :func:`forgotten_by`):
    the one it gives, and every retry (also after the database was lost)."""

    def found(self, *, entry: bool, assets: bool) -> UninstallIntent:
        """Also what this call finds still there (an entry registered again since counts)."""
        return replace(self, registry_entry_removed=self.registry_entry_removed or entry,
                       assets_removed=self.assets_removed or assets)

    def with_receipt(self, record: Mapping[str, Any] | None) -> UninstallIntent:
        if record is None or any(_same_key(r, record) for r in self.receipt_records):
            return self
        return replace(self, receipt_records=(*self.receipt_records, dict(record)))

    def answer(self, removed_rows: Mapping[str, Any]) -> dict[str, Any]:
        """The uninstall's answer: what the intent says the files held, and what the transaction removed."""
        out = {"pluginId": self.plugin_id, "registryEntryRemoved": self.registry_entry_removed, **removed_rows}
        if self.assets_removed:
            out["assetsRemoved"] = True
        return out


def _same_key(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("clientId"), a.get("submissionId")) == (b.get("clientId"), b.get("submissionId"))


def uninstall_intent_path(directory: Path, plugin_id: str) -> Path:
    return directory / f"uninstall-{validate_plugin_id(plugin_id).encode().hex()}.intent"


def write_uninstall_intent(directory: Path, intent: UninstallIntent, faults: Faults = NO_FAULTS,
                           owed: OwedSyncs | None = None) -> None:
    """Replace the intent whole (temp, fsync, rename, directory fsync)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = {"type": "plugin_uninstall", "pluginId": intent.plugin_id,
            "registryEntryRemoved": intent.registry_entry_removed, "assetsRemoved": intent.assets_removed,
            "receipts": list(intent.receipt_records),
            **({"answer": dict(intent.carried)} if intent.carried is not None else {})}
    atomic_write(uninstall_intent_path(directory, intent.plugin_id), orjson.dumps(body) + b"\n", faults=faults,
                 point_prefix="plugins.uninstall.intent", owed=owed)


def read_uninstall_intent(directory: Path, plugin_id: str) -> UninstallIntent | None:
    """The plugin's intent; ``None`` when there is none (or it is not one: it is then replaced)."""
    body = read_json_file(uninstall_intent_path(directory, plugin_id), _MAX_INTENT_BYTES)
    if not isinstance(body, dict) or body.get("type") != "plugin_uninstall" or body.get("pluginId") != plugin_id:
        return None
    entry, assets, records = body.get("registryEntryRemoved"), body.get("assetsRemoved"), body.get("receipts")
    if not (isinstance(entry, bool) and isinstance(assets, bool) and isinstance(records, list)):
        return None
    kept = tuple(r for r in records if receipts.key_of_record(r) is not None)
    answer = body.get("answer")
    return UninstallIntent(plugin_id, entry, assets, kept, dict(answer) if isinstance(answer, dict) else None)


def drop_uninstall_intent(directory: Path, plugin_id: str, owed: OwedSyncs | None = None,
                          faults: Faults = NO_FAULTS) -> None:
    """Remove the intent of an uninstall that committed (fault points ``plugins.uninstall.intent.drop.*``).
    Left behind, it is harmless: every receipt it names is stored, so :func:`uninstall_finished` says
    so, the next uninstall ignores it and boot sweeps it (:func:`sweep_uninstall_intents`)."""
    remove_file_durable(uninstall_intent_path(directory, plugin_id), owed=owed, faults=faults,
                        point_prefix="plugins.uninstall.intent.drop")


def uninstall_finished(conn: sqlite3.Connection, intent: UninstallIntent) -> bool:
    """Whether the intent's uninstall committed (every receipt it names is stored): a kill right after the
    transaction left it, and it answers for nothing any more."""
    for record in intent.receipt_records:
        key = receipts.key_of_record(record)
        if key is not None and not receipts.exists(conn, key.client_id, key.submission_id):
            return False
    return True


def store_uninstall_receipts(conn: sqlite3.Connection, intent: UninstallIntent, answer: Any, *,
                             now_ms: int, skip: receipts.ReceiptKey | None = None) -> None:
    """In the uninstall's transaction: the receipt of every keyed call the intent names (but ``skip``, the
    caller's own, which its commit stores), with the one answer."""
    for record in intent.receipt_records:
        key = receipts.key_of_record(record)
        if key is not None and (skip is None or (key.client_id, key.submission_id)
                                != (skip.client_id, skip.submission_id)):
            receipts.store(conn, key, answer, session_id=None, now_ms=now_ms)


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


def forgotten_by(conn: sqlite3.Connection, plugin_id: str) -> dict[str, Any]:
    """What :func:`forget_plugin` would remove now (read only)."""
    keys = [r[0] for r in conn.execute("SELECT key FROM kv WHERE ns = ? ORDER BY key", (plugin_namespace(plugin_id),))]
    ids = [r[0] for r in conn.execute("SELECT id FROM providers WHERE owner_plugin_id = ? ORDER BY id", (plugin_id,))]
    return {"settingsRemoved": keys, "providersReleased": ids}


def forget_plugin(conn: sqlite3.Connection, plugin_id: str) -> dict[str, Any]:
    """Uninstall's transaction: ``kv(plugin:<id>)`` in one statement, provider rows released."""
    ns = plugin_namespace(plugin_id)
    keys = forgotten_by(conn, plugin_id)["settingsRemoved"]
    delete_namespace(conn, ns)
    released = release_providers(conn, plugin_id)
    return {"settingsRemoved": keys, "providersReleased": released}


def sweep_uninstall_intents(conn: sqlite3.Connection, directory: Path) -> int:
    """Remove every finished uninstall intent in ``directory`` (one left by a kill right after its
    transaction, or not an intent at all); one still waiting for its retry stays. Returns how many went."""
    swept = 0
    for path in sorted(directory.glob("uninstall-*.intent")) if directory.is_dir() else []:
        try:
            plugin_id = bytes.fromhex(path.name.removeprefix("uninstall-").removesuffix(".intent")).decode()
            intent = read_uninstall_intent(directory, validate_plugin_id(plugin_id))
        except (ValueError, InvalidInput):
            intent = None
        if intent is not None and not uninstall_finished(conn, intent):
            continue
        remove_file_durable(path)
        swept += 1
    return swept
