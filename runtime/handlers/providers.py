"""Providers (seed 003 §4.3, §10): CRUD, display order, and a plugin's own rows.

The API key is only ever in the secret store (``secrets/``, AES-256-GCM):
``providers.create`` / ``update`` write it there first (the vault's worker
thread, under the vault lock), then one transaction stores the row with its
``secret_ref`` (``provider/<id>``), the ``secrets_meta`` row and the receipt.
Re-running either after a crash between the two writes the same value again
(idempotent by construction). ``providers.delete`` removes the key's file
first, then the row (models cascade) and its ``secrets_meta`` row. No
providers.* result ever carries the key (``hasApiKey`` says whether one is set),
and receipts fingerprint it with a keyed MAC, like ``secrets.set``.

Ownership: the user path (any non-plugin connection) creates, edits and
deletes rows without ``owner_plugin_id``; a plugin connection sees only its own
rows and refreshes them with ``providers.sync``, which deletes the rows it no
longer declares as ``providers.delete`` does (models and stored key with them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

import trio

from protocol import models as m
from runtime.context import HostContext, ReadContext, Services, WriterContext
from store.config import providers as store
from store.config import secrets as secret_store
from store.errors import Conflict, InvalidInput, NotFound, PermissionDenied, StoreError
from store.ids import derived_id, new_id
from store.receipts import ReceiptKey

from .plugins import require_owner
from .secrets import SERVICE as VAULT
from .secrets import Vault, fingerprint_hiding

__all__ = ["create", "delete", "fingerprint", "get", "list_providers", "reorder", "sync", "update"]

TOPIC = "providers.changed"
LOCK = "providers.lock"
_FIELDS = tuple(store.PROVIDER_FIELDS)


def _lock(services: Services) -> trio.Lock:
    lock: trio.Lock = services.get(LOCK)
    return lock


async def fingerprint(services: Services, method: str, raw: Mapping[str, Any]) -> str:
    """The request without its API key, plus a keyed MAC of the key."""
    return await fingerprint_hiding(services, method, raw, ("apiKey",))


def _fields(p: Any, *, only_set: bool) -> dict[str, Any]:
    """The wire fields a request sets (validated); with ``only_set``, only those it sent."""
    out: dict[str, Any] = {}
    for wire, attr in zip(_FIELDS, ("name", "vendor_key", "type", "protocol", "api_style", "auth_kind", "base_url",
                                    "enabled", "default_model_id", "config"), strict=True):
        if only_set and attr not in p.model_fields_set:
            continue
        value = getattr(p, attr)
        if value is None and not only_set:
            continue
        if value is not None and wire == "baseUrl":
            store.validate_base_url(value)
        if value is not None and wire == "config":
            store.validate_config(value)
        if value is None and wire in ("name", "vendorKey", "type", "protocol", "authKind", "enabled", "config"):
            raise_invalid(wire)
        out[wire] = value
    return out


def raise_invalid(wire: str) -> None:
    raise InvalidInput(f"{wire} cannot be cleared", data={"field": wire})


def _visible(caller: Any, row: Mapping[str, Any]) -> None:
    if caller.plugin_id is not None:
        require_owner(caller, row["ownerPluginId"], what=f"provider {row['id']}")


# -- reads ---------------------------------------------------------------------------


def list_providers(ctx: ReadContext, p: m.ProvidersListParams) -> Any:
    return store.list_providers(ctx.conn, owner=ctx.caller.plugin_id).map(store.provider_view).result("providers")


def get(ctx: ReadContext, p: m.ProvidersGetParams) -> Any:
    row = store.get_provider(ctx.conn, p.provider_id)
    _visible(ctx.caller, row)
    return {"provider": store.provider_view(row)}


# -- the user path -------------------------------------------------------------------


def _new_id(key: ReceiptKey | None) -> str:
    return derived_id("provider", key.client_id, key.submission_id) if key is not None else new_id()


async def create(ctx: HostContext, p: m.ProvidersCreateParams, key: ReceiptKey | None) -> Any:
    pid = p.id or _new_id(key)
    fields = _fields(p, only_set=False)
    vault: Vault = ctx.services.get(VAULT)
    ref = store.secret_ref_for(pid)
    async with _lock(ctx.services):
        if await ctx.read(_exists, pid):
            raise Conflict(f"provider {pid!r} already exists", data={"providerId": pid})
        now = ctx.now()
        wrote = False
        async with vault.lock:
            stored = await vault.run(vault.store.exists, ref)  # a key set under provider/<id> before the row
            before = await vault.before(ref)
            if p.api_key is not None:
                # with the receipt: a retry after a failed commit finds its own write, not a second one
                await _put_back_on_failure(vault, before, vault.run(
                    lambda: vault.store.set(ref, p.api_key or "", now_ms=now, receipt=key)))
                wrote, stored = not stored, True

        def effect(conn: Any) -> Any:
            row = store.insert_provider(conn, pid, fields, secret_ref=ref if stored else None,
                                        owner=None, now_ms=now)
            if p.api_key is not None:
                secret_store.upsert_meta(conn, ref, owner_kind="provider", owner_id=pid, kind="api_key", now_ms=now)
            return {"provider": store.provider_view(row)}

        try:
            result = await ctx.commit(effect)
        except Conflict:
            if wrote:  # a plugin's sync took the id meanwhile: leave no key behind for it
                async with vault.lock:
                    await vault.run(lambda: vault.store.delete(ref, now_ms=now))
            raise
        except StoreError:
            async with vault.lock:
                await vault.take_back(ctx, before, lambda conn: _exists(conn, pid))
            raise
    ctx.publish(TOPIC, {"providerIds": [pid]})
    return result


def _exists(conn: Any, pid: str) -> bool:
    try:
        store.provider_head(conn, pid)
    except NotFound:
        return False
    return True


async def update(ctx: HostContext, p: m.ProvidersUpdateParams, key: ReceiptKey | None) -> Any:
    pid = p.provider_id
    changes = _fields(p, only_set=True)
    vault: Vault = ctx.services.get(VAULT)
    ref = store.secret_ref_for(pid)
    key_change = "api_key" in p.model_fields_set
    async with _lock(ctx.services):
        row = await ctx.read(store.provider_head, pid)
        require_owner(ctx.caller, row["ownerPluginId"], what=f"provider {pid}", user_may_change=False)
        now = ctx.now()
        before: dict[str, bytes | None] = {}
        if key_change:
            async with vault.lock:
                before = await vault.before(ref)
                if p.api_key is not None:  # with the receipt, like create
                    await _put_back_on_failure(vault, before, vault.run(
                        lambda: vault.store.set(ref, p.api_key or "", now_ms=now, receipt=key)))
                else:
                    await vault.run(lambda: vault.store.delete(ref, now_ms=now))

        def effect(conn: Any) -> Any:
            current = store.provider_head(conn, pid)
            require_owner(ctx.caller, current["ownerPluginId"], what=f"provider {pid}", user_may_change=False)
            if key_change and p.api_key is not None:
                store.update_provider(conn, pid, changes, now_ms=now, secret_ref=ref)
                secret_store.upsert_meta(conn, ref, owner_kind="provider", owner_id=pid, kind="api_key", now_ms=now)
            elif key_change:
                store.update_provider(conn, pid, changes, now_ms=now, secret_ref=None)
                secret_store.delete_meta(conn, ref)
            else:
                store.update_provider(conn, pid, changes, now_ms=now)
            # a row whose config is damaged and is not written over stays damaged: CORRUPT_DATA, rolled back
            return {"provider": store.provider_view(store.get_provider(conn, pid))}

        try:
            result = await ctx.commit(effect)
        except StoreError:
            async with vault.lock:
                await vault.take_back(ctx, before, lambda conn: store.provider_head(conn, pid)["updatedAt"] == now)
            raise
    ctx.publish(TOPIC, {"providerIds": [pid]})
    return result


async def _put_back_on_failure(vault: Vault, before: Mapping[str, bytes | None], write: Awaitable[Any]) -> None:
    """``write`` (of the refs in ``before``), taken back if it fails once its file may be in place."""
    try:
        await write
    except StoreError:
        await vault.put_back(before)
        raise


async def delete(ctx: HostContext, p: m.ProvidersDeleteParams, key: ReceiptKey | None) -> Any:
    pid = p.provider_id
    vault: Vault = ctx.services.get(VAULT)
    async with _lock(ctx.services):
        row = await ctx.read(store.provider_head, pid)
        require_owner(ctx.caller, row["ownerPluginId"], what=f"provider {pid}", user_may_change=False)
        now = ctx.now()
        # its key, whether or not the row knew of it (one stored by secrets.set before the row existed)
        key_ref: str = row["secretRef"] or store.secret_ref_for(pid)
        async with vault.lock:
            stored = await vault.run(vault.store.exists, key_ref)
            if stored:
                await vault.run(lambda: vault.store.delete(key_ref, now_ms=now))  # file first: the key is gone
        ref = key_ref if stored or row["secretRef"] is not None else None

        def effect(conn: Any) -> Any:
            current = store.provider_head(conn, pid)
            require_owner(ctx.caller, current["ownerPluginId"], what=f"provider {pid}", user_may_change=False)
            store.delete_provider(conn, pid, now)
            if ref is not None:
                secret_store.delete_meta(conn, ref)
            return {"providerId": pid, "deleted": True}

        result = await ctx.commit(effect)
    ctx.publish(TOPIC, {"providerIds": [pid]})
    return result


def reorder(ctx: WriterContext, p: m.ProvidersReorderParams, key: ReceiptKey | None) -> Any:
    ids = store.set_order(ctx.conn, p.provider_ids, ctx.now)
    ctx.publish("settings.changed", {"ns": "app", "keys": [store.ORDER_KEY[1]]})
    return {"providerIds": ids}


# -- a plugin's own rows ---------------------------------------------------------------


async def sync(ctx: HostContext, p: m.ProvidersSyncParams, key: ReceiptKey | None) -> Any:
    """Upsert every declared row as the calling plugin's, delete its rows it no longer declares.

    A row deleted here goes as in ``providers.delete``: its models cascade and the key stored for it (a user
    may give a plugin's row a key with ``secrets.set``) is removed, file first, then the rows; a provider made
    later under that id does not inherit it. Everything a sync can be refused for (a duplicate, a bad field,
    another owner's row) is checked before a key file goes; a commit refused after that puts them back."""
    plugin = ctx.caller.plugin_id
    if plugin is None:
        raise PermissionDenied("providers.sync is for plugin connections (the user path uses providers.create)")
    declared: dict[str, Any] = {}
    for decl in p.providers:
        if decl.id in declared:
            raise Conflict(f"provider {decl.id!r} is declared twice", data={"providerId": decl.id})
        declared[decl.id] = decl
    fields = {pid: _fields(decl, only_set=False) for pid, decl in declared.items()}
    vault: Vault = ctx.services.get(VAULT)

    def dropped(conn: Any) -> dict[str, str]:
        """The plugin's rows it no longer declares -> the ref of the key stored for each."""
        for pid in declared:
            try:
                row = store.provider_head(conn, pid)
            except NotFound:
                continue
            require_owner(ctx.caller, row["ownerPluginId"], what=f"provider {pid}")
        before = store.list_providers(conn, owner=plugin)
        gone = [pid for pid in [*(r["id"] for r in before.items), *before.unreadable] if pid not in declared]
        return {pid: store.provider_head(conn, pid)["secretRef"] or store.secret_ref_for(pid) for pid in gone}

    async with _lock(ctx.services):
        refs = await ctx.read(dropped)
        now = ctx.now()
        async with vault.lock:
            stored = await vault.before(*refs.values())
            for ref, blob in stored.items():
                if blob is not None:
                    await vault.run(lambda ref=ref: vault.store.delete(ref, now_ms=now))

        def effect(conn: Any) -> Any:
            for pid, decl_fields in fields.items():
                try:
                    row = store.provider_head(conn, pid)
                except NotFound:
                    store.insert_provider(conn, pid, decl_fields, secret_ref=None, owner=plugin, now_ms=now)
                    continue
                require_owner(ctx.caller, row["ownerPluginId"], what=f"provider {pid}")
                store.update_provider(conn, pid, decl_fields, now_ms=now)
            before = store.list_providers(conn, owner=plugin)
            removed = [pid for pid in [*(r["id"] for r in before.items), *before.unreadable] if pid not in declared]
            for pid in removed:
                ref = store.provider_head(conn, pid)["secretRef"] or store.secret_ref_for(pid)
                store.delete_provider(conn, pid, now)
                secret_store.delete_meta(conn, ref)
            rows = store.list_providers(conn, owner=plugin)
            return rows.map(store.provider_view).result("providers", removed=removed)

        try:
            result = await ctx.commit(effect)
        except StoreError:
            async with vault.lock:
                await vault.take_back(ctx, stored, lambda conn: not any(_exists(conn, pid) for pid in refs))
            raise
    changed = sorted({*declared, *result["removed"]})
    if changed:
        ctx.publish(TOPIC, {"providerIds": changed})
    return result
