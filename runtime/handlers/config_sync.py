"""Portable configuration sync (seed 003 §1.3): settings, export and apply of encrypted bundles.

* ``configSync.configure``: the WebDAV password and the vault key go to the
  secret store first (vault thread, vault lock), then ``kv(configSync,
  settings)`` (refs only) and the ``secrets_meta`` rows commit with the receipt;
  re-running after a crash writes the same secrets again.
* ``configSync.export``: the portable document is read in one snapshot,
  encrypted (``store/config_sync``), written to ``config-sync/pending.bin``
  (temp + rename), and returned; the receipt commits last. Neither the receipt
  row nor the record below holds the bundle (seed 003 §1.3: the database stores
  no large payloads): both keep the answer's stand-in (``sha256``, ``bytes``,
  ``exportedAt``), and a retry answered from the row reads the bundle back from
  ``pending.bin`` (byte for byte what it answered) while its SHA-256 is the one
  the stand-in names; once another export replaced it, that retry is
  ``CONFLICT`` (``data.reason: "superseded"``; ``"damaged"`` when the file is
  gone or fails authentication), never another bundle. A
  keyed export records itself beside the bundle (``pending.receipt``) before the
  commit: a retry whose receipt row a crash before the commit, or a lost
  database, took answers the bundle ``pending.bin`` still holds and writes
  nothing. Once another export replaced it (or before the record was written),
  that retry exports again (a fresh nonce: a new, equally valid bundle).
* ``configSync.apply``: the bundle is verified and decrypted with this host's
  vault key before anything is written (a flipped byte or another key's bundle
  is ``CORRUPT_DATA`` and changes nothing), kept as ``config-sync/base.bin``
  (temp + rename, durable) *before* the merge commits in ONE transaction with
  the receipt: base.bin is what the commit makes true, so a crash after the
  commit cannot leave a receipt whose retry never writes it. The merge's rules
  are checked (and rolled back) before base.bin is written: a bundle they refuse
  never becomes base.bin, not even across a crash. A merge refused at the
  commit all the same (a write in between) puts the previous base.bin back; a crash (or an I/O failure) before the
  commit leaves the new one, which the retry (no receipt: it runs again) makes
  true. Applying the same bundle again changes nothing more (idempotent by
  construction). Applies run one at a time (the vault lock), so a refusal
  never puts back over another apply's base.bin. Once committed, the apply
  announces every namespace the merge may write (``settings.changed`` with
  empty ``keys``: reload it), the providers and each provider catalog the
  bundle carried models for (``models.changed``).

No method returns the files themselves or a secret value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from typing import Any

from protocol import models as m
from runtime.context import HostContext, Services
from store import receipts
from store.config import config_sync as sync
from store.config import secrets as secret_store
from store.config.providers import validate_base_url
from store.config.settings import get_value, set_value
from store.errors import Conflict, InvalidInput, NotFound, StoreError
from store.receipts import ReceiptKey, file_record
from store.upgrade.seed_migrations import current_platform

from .secrets import SERVICE as VAULT
from .secrets import Vault, fingerprint_hiding

__all__ = ["apply", "configure", "export", "export_answer", "fingerprint", "get"]

_FIELDS = {"enabled": "enabled", "webdav_url": "webdavUrl", "webdav_username": "webdavUsername",
           "remote_dir": "remoteDir"}


async def fingerprint(services: Services, method: str, raw: Mapping[str, Any]) -> str:
    """The request with the WebDAV password and the vault key as keyed MACs."""
    return await fingerprint_hiding(services, method, raw, ("webdavPassword", "vaultKey"))


async def get(ctx: HostContext, p: m.ConfigSyncGetParams, key: ReceiptKey | None) -> Any:
    vault: Vault = ctx.services.get(VAULT)
    directory = ctx.services.data_dir.root / "config-sync"
    settings = await ctx.read(sync.stored_settings)
    out: dict[str, Any] = {
        "settings": settings,
        "hasVaultKey": await vault.run(vault.store.exists, sync.VAULT_KEY_REF),
        "hasWebdavPassword": await vault.run(vault.store.exists, sync.PASSWORD_REF),
    }
    for name, label in ((sync.PENDING_FILE, "pending"), (sync.BASE_FILE, "base")):
        info = await ctx.in_thread(sync.bundle_info, directory, name)
        if info is not None:
            out[label] = info
    return out


async def configure(ctx: HostContext, p: m.ConfigSyncConfigureParams, key: ReceiptKey | None) -> Any:
    vault: Vault = ctx.services.get(VAULT)
    sent = p.model_fields_set
    if p.webdav_url is not None:
        # stored in SQLite and echoed: a user:password@ or a ?token= in it would be a secret in plaintext
        validate_base_url(p.webdav_url, "webdavUrl", instead="set webdavUsername and webdavPassword instead")
    if p.vault_key is not None:
        sync.decode_vault_key(p.vault_key)
    now = ctx.now()
    async with vault.lock:
        before = await vault.before(sync.PASSWORD_REF, sync.VAULT_KEY_REF)
        try:
            has_password = await _write_secrets(vault, p, key, now)
        except StoreError:
            await vault.put_back(before)
            raise

    def effect(conn: Any) -> Any:
        settings = sync.stored_settings(conn)
        for attr, wire in _FIELDS.items():
            if attr in sent:
                value = getattr(p, attr)
                if value is None:
                    settings.pop(wire, None)
                else:
                    settings[wire] = value
        settings["vaultKeyRef"] = sync.VAULT_KEY_REF
        secret_store.upsert_meta(conn, sync.VAULT_KEY_REF, owner_kind="configSync", owner_id=None,
                                 kind="vault_key", now_ms=now)
        if has_password:
            settings["webdavPasswordRef"] = sync.PASSWORD_REF
            secret_store.upsert_meta(conn, sync.PASSWORD_REF, owner_kind="configSync", owner_id=None,
                                     kind="password", now_ms=now)
        else:
            settings.pop("webdavPasswordRef", None)
            secret_store.delete_meta(conn, sync.PASSWORD_REF)
        set_value(conn, *sync.SETTINGS_KEY, settings, now)
        return {"settings": settings, "hasVaultKey": True, "hasWebdavPassword": has_password}

    def landed(conn: Any) -> bool:
        found = get_value(conn, *sync.SETTINGS_KEY, lenient=True)
        return found is not None and found[1] == now

    try:
        result = await ctx.commit(effect)
    except StoreError:
        async with vault.lock:
            await vault.take_back(ctx, before, landed)
        raise
    ctx.publish("settings.changed", {"ns": sync.SETTINGS_KEY[0], "keys": [sync.SETTINGS_KEY[1]]})
    return result


async def _write_secrets(vault: Vault, p: m.ConfigSyncConfigureParams, key: ReceiptKey | None, now: int) -> bool:
    """The password and the vault key as ``p`` says (hold the vault's lock); whether a password is stored.
    With the call's receipt: a retry after a failed commit finds its own write, not a second one."""
    if "webdav_password" in p.model_fields_set:
        if p.webdav_password is not None:
            await vault.run(lambda: vault.store.set(sync.PASSWORD_REF, p.webdav_password or "", now_ms=now,
                                                    receipt=key))
        else:
            await vault.run(lambda: vault.store.delete(sync.PASSWORD_REF, now_ms=now))
    if p.vault_key is not None:
        await vault.run(lambda: vault.store.set(sync.VAULT_KEY_REF, p.vault_key or "", now_ms=now, receipt=key))
    elif not await vault.run(vault.store.exists, sync.VAULT_KEY_REF):
        fresh = sync.new_vault_key()
        await vault.run(lambda: vault.store.set(sync.VAULT_KEY_REF, fresh, now_ms=now))
    return await vault.run(vault.store.exists, sync.PASSWORD_REF)


async def _vault_key(ctx: HostContext) -> bytes:
    vault: Vault = ctx.services.get(VAULT)
    try:
        stored = await vault.run(vault.store.get, sync.VAULT_KEY_REF)
    except NotFound:
        raise Conflict("config sync has no vault key yet: call configSync.configure first",
                       data={"reason": "not_configured"}) from None
    return sync.decode_vault_key(stored.value)


async def export_answer(ctx: HostContext, stored: Any) -> Any:
    """A keyed export's answer, from its receipt row's stand-in and ``pending.bin`` (``sync.export_answer``).
    The vault key tells a ``pending.bin`` damaged on disk from one a later export wrote (``data.reason``
    ``damaged`` / ``superseded``); with none stored, that is not known."""
    directory = ctx.services.data_dir.root / "config-sync"
    try:
        return await ctx.in_thread(sync.export_answer, directory, stored)
    except Conflict as exc:
        if exc.data.get("reason") != "superseded":
            raise
        try:  # only now: a retry whose bundle is there never needs the vault
            vault_key = await _vault_key(ctx)
        except StoreError:
            raise exc from None
        return await ctx.in_thread(sync.export_answer, directory, stored, vault_key)


async def export(ctx: HostContext, p: m.ConfigSyncExportParams, key: ReceiptKey | None) -> Any:
    directory = ctx.services.data_dir.root / "config-sync"
    if key is not None:  # its receipt row lost with the database: pending.bin may still hold what it exported
        said = await ctx.in_thread(sync.exported_answer, directory, key)
        if said is not None:
            return await ctx.commit(lambda conn: said, stand_in=sync.export_stand_in)
    vault_key = await _vault_key(ctx)
    now = ctx.now()
    doc = await ctx.read(sync.export_portable, now, current_platform())
    faults = ctx.services.faults

    def sealed() -> tuple[bytes, dict[str, Any]]:
        # up to 4 MiB of JSON, AES-GCM, SHA-256 and base64: a worker thread's work, not the trio loop's
        blob = sync.encode_bundle(vault_key, doc)
        sync.write_bundle(directory, sync.PENDING_FILE, blob, faults=faults)
        return blob, {"bundleBase64": base64.b64encode(blob).decode("ascii"),
                      "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), "exportedAt": now}

    blob, result = await ctx.in_thread(sealed)
    if key is not None:
        record = file_record(key, response=sync.export_stand_in(result))
        await ctx.in_thread(lambda: sync.write_export_receipt(directory, record, faults=faults))
    # the receipt row holds the answer but the bundle (the stand-in): the bytes stay in pending.bin
    return await ctx.commit(lambda conn: result, stand_in=sync.export_stand_in)


def _check(conn: Any, key: ReceiptKey | None, doc: dict[str, Any], now: int, platform: str) -> None:
    """The merge's rules, checked and rolled back (a retry of an apply that committed: its receipt answers)."""
    if key is None or receipts.check(conn, key) is None:
        sync.check_portable(conn, doc, now, platform)


def _decoded(bundle_base64: str) -> bytes:
    try:
        return base64.b64decode(bundle_base64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("bundleBase64 is not base64", data={"field": "bundleBase64"}) from None


def _opened(vault_key: bytes, blob: bytes) -> tuple[dict[str, Any], str]:
    """The bundle's document (verified and decrypted: refused before anything is written) and SHA-256."""
    return sync.decode_bundle(vault_key, blob), hashlib.sha256(blob).hexdigest()


async def apply(ctx: HostContext, p: m.ConfigSyncApplyParams, key: ReceiptKey | None) -> Any:
    # up to 4 MiB of base64, AES-GCM and JSON: a worker thread's work, not the trio loop's (bad base64 is
    # refused first, configured or not)
    blob = await ctx.in_thread(_decoded, p.bundle_base64)
    vault_key = await _vault_key(ctx)
    doc, digest = await ctx.in_thread(_opened, vault_key, blob)
    now, platform = ctx.now(), current_platform()
    refused: list[StoreError] = []

    def effect(conn: Any) -> Any:
        try:
            applied = sync.apply_portable(conn, doc, now, platform)
        except StoreError as exc:
            refused.append(exc)  # rolled back with its savepoint: nothing of it commits
            raise
        return {"sha256": digest, "applied": applied}

    vault: Vault = ctx.services.get(VAULT)
    directory, faults = ctx.services.data_dir.root / "config-sync", ctx.services.faults
    async with vault.lock:
        # a bundle the rules refuse is refused before base.bin is touched: a crash while it is in place could
        # otherwise leave it there, and its refused retry would then put "back" the refused bundle itself
        await ctx.services.db.write(lambda conn: _check(conn, key, doc, now, platform), durable=False)
        previous = await ctx.in_thread(sync.read_bundle, directory, sync.BASE_FILE)
        # what the commit makes true
        await ctx.in_thread(lambda: sync.write_bundle(directory, sync.BASE_FILE, blob, faults=faults))
        try:
            result = await ctx.commit(effect)
        except StoreError:
            if refused:
                await ctx.in_thread(lambda: sync.restore_bundle(directory, sync.BASE_FILE, previous,
                                                                faults=faults))
            raise
    for ns in sync.MERGED_NAMESPACES:  # every kind of thing the merge writes: reload it
        ctx.publish("settings.changed", {"ns": ns, "keys": []})
    ctx.publish("providers.changed", {"providerIds": []})
    for provider_id in sync.model_providers(doc):
        ctx.publish("models.changed", {"providerId": provider_id})
    return result
