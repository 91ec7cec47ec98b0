"""Plugins: who owns what (:func:`require_owner`), the registry file, uninstall (seed 003 §4.1, §11.8).

A plugin connects with ``clientKind: "plugin"`` and its ``pluginId``
(``host.hello``). The pipeline lets it reach only routes opened to plugins
(``Route.plugins``); those handlers scope it with :func:`require_owner`, the
one rule for plugin-owned data:

* ``kv(plugin:<id>)`` — ``settings.*`` (``handlers/settings.require_namespace``);
* provider rows with ``owner_plugin_id`` — ``providers.*``;
* imported sessions (``session_import_origins.plugin_id``) — read the owner with
  ``store.plugins.session_owner`` and call ``require_owner(caller, owner,
  what=f"session {sid}")`` before touching the session.

* its read-only assets (``store/plugin_assets.py``) — ``plugins.listAssets`` /
  ``getAsset``: installed by ``plugins.register`` with ``assets`` (the whole set
  replaced), removed by ``plugins.uninstall``, never written otherwise.

``plugins.register`` / ``setEnabled`` / ``uninstall`` replace
``plugins/registry.json`` whole (temp file + rename), serialized by the
registry's lock; each write is idempotent by construction (the same request
writes the same entry), so a retry after a crash between the file and the
receipt's transaction repeats the file step harmlessly. A keyed change's
registry write also keeps its receipt record with its answer (the registry's
``receipts``): a retry whose receipt row a lost database took is answered from
it and undoes nothing that changed since. A retry that finds the file already so writes
nothing, so a directory fsync that failed after the first try's file was published (or removed) is
owed (``PluginRegistry.owed``): every later change is ``IO_ERROR`` until the host restarts (RELIABILITY
rule 7: never retry-then-ack; never answered on a file of unknown durability; the next boot trusts the disk).
``plugins.uninstall``
then deletes ``kv(plugin:<id>)`` in one statement and releases the plugin's
provider rows to the user, in one transaction with its receipt. What its file
steps removed (the entry, the assets) cannot be read back from the files by a
retry, so a keyed uninstall records it first in its intent
(``store.plugins.UninstallIntent``): a retry after a crash answers from it.
The file writes pass the host's fault points (``plugins.registry.*``,
``plugins.assets.*``, ``plugins.uninstall.intent.*``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from actors.gateway_types import CallContext
from actors.session_context import CarriedAnswer
from protocol import models as m
from runtime.context import HostContext
from store import plugin_assets as asset_store
from store import plugins as plugin_store
from store import receipts
from store.errors import InvalidInput, NotFound, PermissionDenied, StoreError
from store.faults import NO_FAULTS, Faults
from store.fsutil import OwedSyncs
from store.plugins import UninstallIntent
from store.receipts import ReceiptKey

T = TypeVar("T")

__all__ = ["PluginRegistry", "get_asset", "list_assets", "list_plugins", "register", "require_owner", "set_enabled",
           "uninstall"]

SERVICE = "plugins"

log = logging.getLogger("pi_host")


def require_owner(caller: CallContext, owner: str | None, *, what: str, user_may_change: bool = True) -> None:
    """Refuse (``PERMISSION_DENIED``) a caller that does not own ``what``.

    ``owner`` is the plugin id that owns the data (None: the user's). A plugin
    connection may read and change only data its own id owns. A user
    connection (any other kind) may touch everything, unless
    ``user_may_change=False``: then it may not change plugin-owned data
    (provider rows a plugin declared are refreshed by that plugin only).
    """
    if caller.plugin_id is not None:
        if owner != caller.plugin_id:
            raise PermissionDenied(f"{what} does not belong to plugin {caller.plugin_id}",
                                   data={"pluginId": caller.plugin_id})
    elif not user_may_change and owner is not None:
        raise PermissionDenied(f"{what} is owned by plugin {owner}; only that plugin changes it",
                               data={"ownerPluginId": owner})


class PluginRegistry:
    """``plugins/registry.json`` with its one writer lock and worker thread."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.lock = trio.Lock()
        self._thread = trio.CapacityLimiter(1)
        self.owed = OwedSyncs()
        """A directory fsync (the registry's, the intents', the assets') that failed after its file was
        published or removed: the next change is refused (``IO_ERROR``) until the host restarts, so a retry
        that finds the first try's files in place (nothing to write) is never answered on them."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._thread)

    async def change(self, edit: Callable[[dict[str, Any]], tuple[dict[str, Any], Any]],
                     faults: Faults = NO_FAULTS) -> Any:
        """Read, edit and replace the registry under the lock; returns what ``edit`` reports."""
        async with self.lock:
            return await self.change_locked(edit, faults)

    async def change_locked(self, edit: Callable[[dict[str, Any]], tuple[dict[str, Any], Any]],
                            faults: Faults = NO_FAULTS) -> Any:
        """:meth:`change` for a caller that holds the lock."""
        await self.run(self.owed.pay)
        doc = await self.run(plugin_store.read_registry, self.directory)
        new, report = edit(doc)
        if new != doc:
            await self.run(plugin_store.write_registry, self.directory, new, faults, self.owed)
        return report


async def list_plugins(ctx: HostContext, p: m.PluginsListParams, key: ReceiptKey | None) -> Any:
    registry: PluginRegistry = ctx.services.get(SERVICE)
    doc = await registry.run(plugin_store.read_registry, registry.directory)
    return {"plugins": plugin_store.registry_entries(doc)}


async def register(ctx: HostContext, p: m.PluginsRegisterParams, key: ReceiptKey | None) -> Any:
    registry: PluginRegistry = ctx.services.get(SERVICE)
    plugin_store.validate_plugin_id(p.plugin_id)
    fields: dict[str, Any] = {"name": p.name, "version": p.version, "enabled": p.enabled}
    if p.source is not None:
        fields["source"] = p.source
    now = ctx.now()
    assets = None
    if p.assets is not None:  # validated whole before anything is written
        raw = [{"path": a.path, "mediaType": a.media_type, "dataBase64": a.data_base64} for a in p.assets]
        assets = await registry.run(asset_store.validate_assets, raw)

    metas = asset_store.asset_metas(assets) if assets is not None else None
    said: list[Any] = []

    def edit(doc: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        if key is not None and _kept_answer(doc, key, said):
            return doc, None
        old = doc["plugins"].get(p.plugin_id)
        if old is not None and all(old.get(k) == v for k, v in fields.items()):
            new, entry = doc, old  # the same registration again: nothing to write (but a receipt)
        else:
            new = plugin_store.with_entry(doc, p.plugin_id, fields, now)
            entry = new["plugins"][p.plugin_id]
        if key is not None:
            answer = {"plugin": {**entry, "id": p.plugin_id}, **({"assets": metas} if metas is not None else {})}
            new = plugin_store.with_receipts(new, [receipts.file_record(key)], answer)
        return new, entry

    entry = await registry.change(edit, ctx.services.faults)
    if said:  # answered before (the database that held its receipt was lost): nothing undone since
        if assets is not None:
            async with registry.lock:  # cut short before its assets, and still registered: they go in once
                await registry.run(registry.owed.pay)
                doc = await registry.run(plugin_store.read_registry, registry.directory)
                if (p.plugin_id in doc["plugins"]
                        and not await registry.run(asset_store.has_bundle, registry.directory, p.plugin_id)):
                    await registry.run(asset_store.write_bundle, registry.directory, p.plugin_id, assets, now,
                                       ctx.services.faults, registry.owed)
        return await ctx.commit(lambda conn: said[0])
    out: dict[str, Any] = {"plugin": {**entry, "id": p.plugin_id}}
    if assets is not None:  # the install's assets, replaced whole (idempotent: a retry writes the same file)
        async with registry.lock:
            await registry.run(registry.owed.pay)
            await registry.run(asset_store.write_bundle, registry.directory, p.plugin_id, assets, now,
                               ctx.services.faults, registry.owed)
        out["assets"] = metas
    return await ctx.commit(lambda conn: out)


def _kept_answer(doc: dict[str, Any], key: ReceiptKey, said: list[Any]) -> bool:
    """Whether the registry keeps the answer of this keyed call (appended to ``said``): its change is in this
    file, and its receipt row went with a lost database. The same key for another request is a conflict."""
    kept = plugin_store.registry_receipt(doc, key)
    if kept is None:
        return False
    found, answer = kept
    if found.fingerprint != key.fingerprint or found.method != key.method:
        raise receipts.conflict(key, found.method)
    said.append(answer)
    return True


def _asset_owner(ctx: HostContext, plugin_id: str | None, what: str) -> str:
    """The plugin whose assets are asked for: a plugin connection reaches only its own."""
    target = plugin_id if plugin_id is not None else ctx.caller.plugin_id
    if target is None:
        raise InvalidInput("pluginId is required on a user connection", data={"field": "pluginId"})
    require_owner(ctx.caller, target, what=f"{what} of plugin {target}")
    return plugin_store.validate_plugin_id(target)


async def list_assets(ctx: HostContext, p: m.PluginsListAssetsParams, key: ReceiptKey | None) -> Any:
    registry: PluginRegistry = ctx.services.get(SERVICE)
    plugin_id = _asset_owner(ctx, p.plugin_id, "the assets")
    doc = await registry.run(asset_store.read_bundle, registry.directory, plugin_id)
    return {"pluginId": plugin_id, "assets": asset_store.asset_metas(doc["assets"] if doc else [])}


async def get_asset(ctx: HostContext, p: m.PluginsGetAssetParams, key: ReceiptKey | None) -> Any:
    registry: PluginRegistry = ctx.services.get(SERVICE)
    plugin_id = _asset_owner(ctx, p.plugin_id, f"asset {p.path!r}")
    asset = await registry.run(asset_store.read_asset, registry.directory, plugin_id, p.path)
    return {"pluginId": plugin_id, "asset": asset}


async def set_enabled(ctx: HostContext, p: m.PluginsSetEnabledParams, key: ReceiptKey | None) -> Any:
    registry: PluginRegistry = ctx.services.get(SERVICE)
    now = ctx.now()

    said: list[Any] = []

    def edit(doc: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        if key is not None and _kept_answer(doc, key, said):
            return doc, None
        old = doc["plugins"].get(p.plugin_id)
        if old is None:
            return doc, None
        if old.get("enabled") is p.enabled:
            new, entry = doc, old
        else:
            new = plugin_store.with_entry(doc, p.plugin_id, {"enabled": p.enabled}, now)
            entry = new["plugins"][p.plugin_id]
        if key is not None:
            new = plugin_store.with_receipts(new, [receipts.file_record(key)], {"plugin": {**entry, "id": p.plugin_id}})
        return new, entry

    entry = await registry.change(edit, ctx.services.faults)
    if said:  # answered before (the database that held its receipt was lost): nothing undone since
        return await ctx.commit(lambda conn: said[0])
    if entry is None:
        raise NotFound(f"plugin {p.plugin_id!r} is not registered", data={"pluginId": p.plugin_id})
    return await ctx.commit(lambda conn: {"plugin": {**entry, "id": p.plugin_id}})


async def _begin_uninstall(ctx: HostContext, registry: PluginRegistry, plugin_id: str,
                           key: ReceiptKey | None) -> UninstallIntent:
    """What the uninstall removes (with what an earlier call cut short recorded), made durable in the
    intent before any file step when a receipt must answer it."""
    directory = registry.directory
    earlier = await registry.run(plugin_store.read_uninstall_intent, directory, plugin_id)
    if earlier is not None and await ctx.read(plugin_store.uninstall_finished, earlier):
        earlier = None  # left by a kill right after its commit: that uninstall is over
    doc = await registry.run(plugin_store.read_registry, directory)
    assets = await registry.run(asset_store.has_bundle, directory, plugin_id)
    record = receipts.file_record(key) if key is not None else None
    intent = (earlier or UninstallIntent(plugin_id)).found(entry=plugin_id in doc["plugins"], assets=assets) \
        .with_receipt(record)
    if intent.receipt_records and (intent.carried is None or earlier is None or (
            intent.registry_entry_removed, intent.assets_removed) != (earlier.registry_entry_removed,
                                                                      earlier.assets_removed)):
        # the answer it will give (every retry too, also after the database was lost): read before any step
        # (again when this call finds more to remove than the try cut short did: that one never answered)
        rows = await ctx.read(plugin_store.forgotten_by, plugin_id)
        intent = dataclasses.replace(intent, carried=intent.answer(rows))
    if intent.receipt_records and intent != earlier:
        await registry.run(plugin_store.write_uninstall_intent, directory, intent, ctx.services.faults,
                           registry.owed)
    return intent


async def _answered_before(ctx: HostContext, registry: PluginRegistry, plugin_id: str, key: ReceiptKey) -> Any:
    """The answer of this keyed call's uninstall, kept in the registry, when that uninstall is over (no intent
    naming the call waits): the database that held its receipt was lost. ``None``: not answered before."""
    said: list[Any] = []
    if not _kept_answer(await registry.run(plugin_store.read_registry, registry.directory), key, said):
        return None
    intent = await registry.run(plugin_store.read_uninstall_intent, registry.directory, plugin_id)
    if intent is not None and any(_same_call(r, key) for r in intent.receipt_records) \
            and not await ctx.read(plugin_store.uninstall_finished, intent):
        return None  # cut short: the retry finishes it (and answers the intent's answer)
    return said[0]


def _same_call(record: Any, key: ReceiptKey) -> bool:
    found = receipts.key_of_record(record)
    return found is not None and (found.client_id, found.submission_id) == (key.client_id, key.submission_id)


async def _drop_intent(ctx: HostContext, registry: PluginRegistry, plugin_id: str) -> None:
    """The uninstall committed: its intent goes (this one's, or one a kill right after its commit left; the
    uninstall that wrote it is over). Left behind, every receipt it names is stored: the next uninstall
    ignores it (``uninstall_finished``) and boot sweeps it (``sweep_uninstall_intents``), so a failure here
    does not fail the committed call. RELIABILITY rule 7 holds: the answer vouches for the committed
    transaction (and the file steps before it, fsynced), never for this removal, whose durability a failed
    directory fsync leaves unknown (``registry.owed`` then refuses every later plugin change until the host
    restarts)."""
    try:
        await registry.run(plugin_store.drop_uninstall_intent, registry.directory, plugin_id, registry.owed,
                           ctx.services.faults)
    except StoreError as exc:
        log.warning("a finished uninstall of plugin %s left its intent: %s", plugin_id, exc)


async def uninstall(ctx: HostContext, p: m.PluginsUninstallParams, key: ReceiptKey | None) -> Any:
    registry: PluginRegistry = ctx.services.get(SERVICE)
    plugin_id = plugin_store.validate_plugin_id(p.plugin_id)
    async with registry.lock:  # one uninstall (or register) at a time, from its intent to its commit
        await registry.run(registry.owed.pay)  # nothing written nor answered on files of unknown durability
        if key is not None and (said := await _answered_before(ctx, registry, plugin_id, key)) is not None:
            return await ctx.commit(lambda conn: said)  # its receipt row again; nothing removed twice
        intent = await _begin_uninstall(ctx, registry, plugin_id, key)

        def edit(doc: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            new, removed = plugin_store.without_entry(doc, plugin_id)
            if intent.receipt_records:  # the receipts ride with the file step, with the answer
                new = plugin_store.with_receipts(new, intent.receipt_records, intent.carried)
            return new, removed

        await registry.change_locked(edit, ctx.services.faults)
        await registry.run(asset_store.remove_bundle, registry.directory, plugin_id, registry.owed)
        now = ctx.now()
        carried = CarriedAnswer(intent.carried)

        def effect(conn: Any) -> Any:
            out = carried.give(intent.answer(plugin_store.forget_plugin(conn, plugin_id)))
            plugin_store.store_uninstall_receipts(conn, intent, out, now_ms=now, skip=key)
            return out

        result = await ctx.commit(effect)
        carried.check("plugins.uninstall")
        await _drop_intent(ctx, registry, plugin_id)
    if result["settingsRemoved"]:
        ctx.publish("settings.changed", {"ns": plugin_store.plugin_namespace(plugin_id),
                                         "keys": result["settingsRemoved"]})
    if result["providersReleased"]:
        ctx.publish("providers.changed", {"providerIds": result["providersReleased"]})
    return result
