"""Secrets (seed 003 §4.12, §10): encrypted files under ``secrets/``, bookkeeping in ``secrets_meta``.

``secrets.set`` / ``delete`` change a file first (in the vault's own worker
thread, writers serialized by the vault's lock), then one transaction with the
``secrets_meta`` row and the receipt. A keyed request leaves its own mark in
the file step (``store/config/secrets.py``): ``set`` writes a keyed MAC of its
receipt key into the file's authenticated header, ``delete`` renames the file
to a trace named by that MAC, which then holds the receipt record and no value
(removed after the commit, or by boot once the receipt row is there). A retry
after a crash between the file and the commit finds its own effect there and
answers what the first try would have (the same version, not the next one;
``deleted: true``), writing nothing more; then the row and the receipt commit.
The file also keeps the ref's earlier keyed writes with their answers (a
``.receipts`` record beside it while the ref has no file): a retry whose receipt
row went with a lost database is answered what it was answered, and only its
receipt row commits - an older ``set`` never puts its value back, an older
``delete`` never removes a value set since (README §4).
Receipts of ``secrets.set`` never confirm a value: the fingerprint is a keyed
MAC (machine key) of the request *without* its value, so whether a replayed
``submissionId`` carries the same value or another one changes nothing in the
answer — a retry gets the stored response, a conflict (another ref, owner or
kind) says nothing about the value, and a receipt row cannot be tested offline.
A replay with a different value does not write it (reuse a ``submissionId``
only for a retry).

``secrets.set`` of ``configSync/vaultKey`` takes only a value config sync can
use as its vault key (32 bytes, base64: ``store.config.config_sync``'s own
check); anything else is ``INVALID_PARAMS`` before the vault is touched.

``secrets.get`` returns a value only to ``agent`` and ``ui`` clients (the
sidecar needs provider keys, the Settings UI shows them); ``cli``/``test``
clients get ``PERMISSION_DENIED``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio

from protocol import models as m
from runtime.context import HostContext, ReadContext, Services
from store import receipts
from store.config import config_sync, providers
from store.config import secrets as secret_store
from store.errors import InvalidInput, PermissionDenied, StoreError
from store.faults import Faults
from store.receipts import ReceiptKey

T = TypeVar("T")

__all__ = ["Vault", "delete", "fingerprint", "fingerprint_hiding", "get", "legacy_fingerprint", "list_secrets",
           "set_secret"]

log = logging.getLogger("pi_host")
SERVICE = "vault"
SECRET_READERS = frozenset({"agent", "ui"})
PROVIDERS_TOPIC = "providers.changed"  # runtime/handlers/providers.TOPIC (which imports this module)


class Vault:
    """The secret store with its one writer lock and its own worker thread."""

    def __init__(self, directory: Any, *, faults: Faults) -> None:
        self.store = secret_store.SecretStore(directory, faults=faults)
        self.lock = trio.Lock()
        self._thread = trio.CapacityLimiter(1)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._thread)

    async def before(self, *refs: str) -> dict[str, bytes | None]:
        """The files of ``refs`` as they are, for :meth:`put_back` (hold :attr:`lock`)."""
        return {ref: await self.run(self.store.raw, ref) for ref in refs}

    async def put_back(self, before: Mapping[str, bytes | None]) -> None:
        """A call that wrote these refs failed before its row committed (its transaction was refused, or
        the write failed once its file was in place): the values it found come back, so a failed call
        leaves no value it did not store (hold :attr:`lock`). A failure here is logged: the call's own
        error is the one answered."""
        for ref, blob in before.items():
            try:
                await self.run(self.store.put_back, ref, blob)
            except StoreError as exc:
                log.warning("secret %s: a failed call's write could not be taken back: %s", ref, exc)

    async def take_back(self, ctx: HostContext, before: Mapping[str, bytes | None],
                        check: Callable[[Any], bool]) -> None:
        """The call's commit raised: its writes of ``before``'s refs are put back unless that commit took
        place all the same (``ctx.landed(check)``: its rows name these values; taking them back would
        lose what a retry is then answered). Hold :attr:`lock`."""
        if not await ctx.landed(check):
            await self.put_back(before)


async def fingerprint(services: Services, method: str, raw: Mapping[str, Any]) -> str:
    """A keyed MAC of the request without its value: the answer to a replay cannot depend on the value."""
    return await fingerprint_hiding(services, method, raw, ("value",))


async def legacy_fingerprint(services: Services, method: str, raw: Mapping[str, Any]) -> str:
    """The fingerprint builds before the keyed one (schema v24 and earlier) stored for ``secrets.set``:
    the plain one of the request with its value replaced by a keyed MAC of it (``valueMac``). A retry of
    a request such a build answered finds its receipt after an in-place upgrade instead of
    IDEMPOTENCY_CONFLICT; it is only matched against such a row, never stored."""
    vault: Vault = services.get(SERVICE)
    value = raw.get("value")
    mac = await vault.run(vault.store.value_mac, value if isinstance(value, str) else "")
    shown = {k: v for k, v in raw.items() if k != "value"}
    return receipts.fingerprint(method, {**shown, "valueMac": mac})


async def fingerprint_hiding(services: Services, method: str, raw: Mapping[str, Any],
                             fields: tuple[str, ...]) -> str:
    """A keyed MAC (machine key) of the request *without* the secret ``fields``.

    A replayed ``submissionId`` is then answered from its receipt whatever those
    fields hold (a different secret is not written), and a conflict (another
    non-secret field) never says whether a guessed secret was right; the stored
    fingerprint cannot be tested offline either.
    """
    vault: Vault = services.get(SERVICE)
    shown = {k: v for k, v in raw.items() if k not in fields}
    plain = receipts.fingerprint(method, shown)
    return await vault.run(vault.store.keyed_fingerprint, plain.encode("ascii"))


async def set_secret(ctx: HostContext, p: m.SecretsSetParams, key: ReceiptKey | None) -> Any:
    vault: Vault = ctx.services.get(SERVICE)
    secret_store.validate_ref(p.ref)
    _check_value(p.ref, p.value)
    async with vault.lock:
        now = ctx.now()
        before = await vault.before(p.ref)
        changed: list[str | None] = []
        try:
            done = await vault.run(lambda: vault.store.put(p.ref, p.value, now_ms=now, receipt=key))
        except StoreError:
            await vault.put_back(before)
            raise
        answer = {"ref": p.ref, "updatedAt": done.updated_at, "version": done.version}

        def effect(conn: Any) -> Any:
            if done.replayed == "earlier":
                return answer  # written or deleted since under another key: only the receipt row is missing
            secret_store.upsert_meta(conn, p.ref, owner_kind=p.owner_kind, owner_id=p.owner_id, kind=p.kind,
                                     now_ms=done.updated_at)
            changed.append(providers.follow_key(conn, p.ref, stored=True, now_ms=now))
            return answer

        def landed(conn: Any) -> bool:
            meta = secret_store.get_meta(conn, p.ref)
            return meta is not None and meta["updatedAt"] == done.updated_at

        try:
            result = await ctx.commit(effect)
        except StoreError:
            await vault.take_back(ctx, before, landed)
            raise
    _announce(ctx, changed)
    return result


def _check_value(ref: str, value: str) -> None:
    """A secret another part of the host reads back must hold a value it can use: config sync's vault key."""
    if ref != config_sync.VAULT_KEY_REF:
        return
    try:
        config_sync.decode_vault_key(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{ref} is config sync's vault key, and the value is not one ({exc.message}); "
                           "leave it to configSync.configure to generate, or pass a key exported elsewhere",
                           data={"field": "value", "ref": ref}) from None


def _announce(ctx: HostContext, changed: list[str | None]) -> None:
    """A provider whose key reference followed the secret store (``hasApiKey``)."""
    ids = [pid for pid in changed if pid is not None]
    if ids:
        ctx.publish(PROVIDERS_TOPIC, {"providerIds": ids})


async def get(ctx: HostContext, p: m.SecretsRefParams, key: ReceiptKey | None) -> Any:
    if ctx.caller.client_kind not in SECRET_READERS:
        raise PermissionDenied(f"client kind {ctx.caller.client_kind!r} may not read secret values "
                               f"(only {', '.join(sorted(SECRET_READERS))})")
    vault: Vault = ctx.services.get(SERVICE)
    stored = await vault.run(vault.store.get, p.ref)
    return {"ref": stored.ref, "value": stored.value}


async def delete(ctx: HostContext, p: m.SecretsDeleteParams, key: ReceiptKey | None) -> Any:
    vault: Vault = ctx.services.get(SERVICE)
    ref = secret_store.validate_ref(p.ref)
    async with vault.lock:
        now = ctx.now()
        # what a keyed delete answers is recorded with it (a retry after a database loss gets it again)
        listed = key is not None and await ctx.read(lambda conn: secret_store.get_meta(conn, ref) is not None)
        # file first: the value is gone (a keyed delete leaves its trace until the receipt is durable)
        done = await vault.run(lambda: vault.store.remove(ref, now_ms=now, receipt=key, listed=listed))
        removed = done.deleted and not done.replayed
        changed: list[str | None] = []

        def effect(conn: Any) -> Any:
            if done.replayed and done.present:
                return {"ref": ref, "deleted": done.deleted}  # set again since under another key: leave it
            changed.append(providers.follow_key(conn, ref, stored=False, now_ms=now))
            gone = secret_store.delete_meta(conn, ref) or removed
            return {"ref": ref, "deleted": done.deleted if done.replayed else gone}

        result = await ctx.commit(effect)
        if key is not None and done.deleted:
            await vault.run(vault.store.forget_delete, ref, key)
    _announce(ctx, changed)
    return result


def list_secrets(ctx: ReadContext, p: m.SecretsListParams) -> Any:
    return {"secrets": secret_store.list_meta(ctx.conn, owner_kind=p.owner_kind, owner_id=p.owner_id)}
