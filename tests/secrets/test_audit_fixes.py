"""Secrets, providers and settings: what a black-box audit found (each failed before its fix)."""

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


def rows(root: Path, sql: str) -> str:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return repr(conn.execute(sql).fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize("url", ["https://ada:hunter2-DAVPW@dav.example/pi", "https://dav.example/pi?token=hunter2-DAVPW",
                                 "https://", "https://a b/x"])
async def test_a_webdav_url_carrying_a_credential_or_no_host_is_refused(tmp_path: Path, url: str) -> None:
    """README §8.7: configSync settings hold references only. A password in webdavUrl was stored in
    kv(configSync, settings), kept in the command receipt and echoed by configure and configSync.get."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            with pytest.raises(RpcError) as err:
                await c.call("configSync.configure", {"webdavUrl": url, "submissionId": "cfg-1"})
            assert err.value.data_code == "INVALID_PARAMS" and "hunter2" not in str(err.value)
            ok = await c.call("configSync.configure", {"webdavUrl": "https://dav.example/pi",
                                                       "webdavUsername": "ada", "webdavPassword": "hunter2-DAVPW"})
            assert ok["settings"]["webdavUrl"] == "https://dav.example/pi" and ok["hasWebdavPassword"] is True
    assert "hunter2" not in rows(tmp_path, "SELECT * FROM kv") + rows(tmp_path, "SELECT * FROM command_receipts")


async def test_a_provider_key_follows_the_secret_store_across_a_crash(tmp_path: Path) -> None:
    """providers.update writes or unlinks the key file before its row commits. Cut between the two,
    boot repaired secrets_meta from the files but left hasApiKey saying the opposite (and models.refresh
    reads the row's secretRef, so a stored key was never sent)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            await c.call("providers.create", {"id": "gone", "name": "G", "apiKey": "k-1"})
            await c.call("providers.create", {"id": "new", "name": "N"})
        store = secret_store.SecretStore(tmp_path / "secrets")
        store.path_for("provider/gone").unlink()  # update {apiKey: null}: file unlinked, row not yet
        store.set("provider/new", "k-2", now_ms=1)  # update {apiKey: "k-2"}: file written, row not yet
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            gone = (await c.call("providers.get", {"providerId": "gone"}))["provider"]
            new = (await c.call("providers.get", {"providerId": "new"}))["provider"]
            assert gone["hasApiKey"] is False and new["hasApiKey"] is True
            assert (await c.call("secrets.get", {"ref": "provider/new"}))["value"] == "k-2"


async def test_a_key_stored_before_its_provider_belongs_to_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            await c.call("secrets.set", {"ref": "provider/late", "value": "k-pre", "ownerId": "late"})
            created = (await c.call("providers.create", {"id": "late", "name": "L"}))["provider"]
            assert created["hasApiKey"] is True
            await c.call("providers.delete", {"providerId": "late"})  # deletes its stored key too
            with pytest.raises(RpcError) as err:
                await c.call("secrets.get", {"ref": "provider/late"})
            assert err.value.data_code == "NOT_FOUND"
            assert all(s["ref"] != "provider/late" for s in (await c.call("secrets.list", {}))["secrets"])


async def test_an_api_key_with_a_control_character_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """It is sent as an HTTP header: a CR/LF key could never be sent, and every refresh failed as
    PROVIDER_UNREACHABLE (retriable) instead."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            for key in ("sk-abc\r\nX-Injected: 1", "sk-\x00abc"):
                with pytest.raises(RpcError) as err:
                    await c.call("providers.create", {"id": "p", "name": "P", "apiKey": key})
                assert err.value.data_code == "INVALID_PARAMS" and "sk-abc" not in repr(err.value.data)
                assert "sk-abc" not in err.value.message
            assert (await c.call("providers.list", {}))["providers"] == []


async def test_a_new_key_stored_as_null_is_reported_changed(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            set_null = await c.call("settings.set", {"ns": "ui", "key": "collapsed", "value": None})
            assert set_null["changed"] == ["collapsed"]
            again = await c.call("settings.set", {"ns": "ui", "key": "collapsed", "value": None})
            assert again["changed"] == []


async def test_applying_a_bundle_never_deletes_local_project_memory(tmp_path: Path) -> None:
    """README §8.7: apply adds and updates, never deletes. An empty memory in a bundle deleted ours."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {})
            key = base64.b64decode((await c.call("secrets.get", {"ref": sync.VAULT_KEY_REF}))["value"])
            await c.call("settings.set", {"ns": "projectMemory", "key": "/w/app", "value": "keep me"})
            blob = base64.b64encode(sync.encode_bundle(key, {"schema": 1, "projectMemory": {"/w/app": ""}})).decode()
            applied = await c.call("configSync.apply", {"bundleBase64": blob})
            assert applied["applied"]["memory"] == 0
            assert (await c.call("settings.get", {"ns": "projectMemory", "key": "/w/app"}))["value"] is not None
