"""``secrets.set`` of ``configSync/vaultKey`` takes only a value config sync can use as its vault key.

It used to store anything (``"not-a-key"``, 16 bytes, an empty string); the next
``configSync.export`` / ``apply`` then failed with INVALID_PARAMS about a parameter
the caller never sent. Now the write is refused, and nothing changes.
"""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.client import RpcError
from store.config import config_sync as sync
from store.config import secrets as secret_store
from tests.hostkit import client_for, inprocess_host

VAULT_KEY = sync.VAULT_KEY_REF


def _rows(root: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("value", ["not-a-key", "", base64.b64encode(bytes(16)).decode(),
                                   base64.b64encode(bytes(33)).decode(), "!" * 44])
async def test_a_value_that_is_not_a_vault_key_is_refused_and_changes_nothing(tmp_path: Path, value: str) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            with pytest.raises(RpcError) as err:
                await c.call("secrets.set", {"ref": VAULT_KEY, "value": value, "submissionId": "vk-1"})
            assert err.value.data_code == "INVALID_PARAMS"
            assert "vault key" in err.value.message and "32 bytes, base64" in err.value.message
            assert err.value.data.get("field") == "value"
            assert (await c.call("configSync.get", {}))["hasVaultKey"] is False
            assert VAULT_KEY not in [s["ref"] for s in (await c.call("secrets.list", {}))["secrets"]]
            with pytest.raises(RpcError) as get:
                await c.call("secrets.get", {"ref": VAULT_KEY})
            assert get.value.data_code == "NOT_FOUND"
            with pytest.raises(RpcError) as export:  # not configured: not a broken key
                await c.call("configSync.export", {})
            assert export.value.data_code == "CONFLICT"
    assert not secret_store.SecretStore(tmp_path / "secrets").exists(VAULT_KEY)
    assert _rows(tmp_path, "SELECT secret_ref FROM secrets_meta WHERE secret_ref = ?", VAULT_KEY) == []
    assert _rows(tmp_path, "SELECT status FROM command_receipts WHERE submission_id = 'vk-1'") == []


async def test_a_valid_vault_key_is_stored_and_config_sync_uses_it(tmp_path: Path) -> None:
    key = sync.new_vault_key()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            with pytest.raises(RpcError):
                await c.call("secrets.set", {"ref": VAULT_KEY, "value": "not-a-key"})
            await c.call("secrets.set", {"ref": VAULT_KEY, "value": key})
            assert (await c.call("secrets.get", {"ref": VAULT_KEY}))["value"] == key
            blob = base64.b64decode((await c.call("configSync.export", {}))["bundleBase64"])
    assert sync.decode_bundle(sync.decode_vault_key(key), blob)  # encrypted with the key that was set


async def test_other_refs_still_take_any_value(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            for ref in ("configSync/webdavPassword", "configSync/vaultKeyOld", "provider/x"):
                await c.call("secrets.set", {"ref": ref, "value": "not-a-key"})
                assert (await c.call("secrets.get", {"ref": ref}))["value"] == "not-a-key"
