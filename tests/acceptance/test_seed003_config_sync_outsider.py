"""Seed 003 §1.3 "Portable configuration sync" and protocol/README §8.7, read by an outsider: black-box
against real ``pi-host serve`` processes (each test quotes the sentence it checks).

What ``tests/config_sync`` leaves open and this module adds: the sync settings' place in SQLite (and only
refs there); the WebDAV password and vault key in no file outside ``secrets/`` (logs included), in no answer
and in no error; a refused bundle made by *another host* (not a hand-built one) leaving ``base.bin`` and
everything else as it was; a SIGKILL at each temp-file step of ``pending.bin`` / ``pending.receipt`` /
``base.bin`` (not only at the commit) leaving the old or the new file whole, and the keyed retry having one
effect; the bundle files' modes, and that no plugin call or HTTP route hands them out; an apply touching no
session row, transcript or schema; and bad ``bundleBase64`` input over the wire.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import stat
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, open_client
from tests.acceptance.outsiderkit import data_dir, error_of, real_host, say
from tests.dbkit import rows as _db
from tests.hostkit import HostProcess, call_killed_at, start_host_process
from tests.pipeline import probe

PASSWORD = "dav-pw-" + "Zq8Lm" * 6
VAULT_KEY = base64.b64encode(hashlib.sha256(b"outsider vault key").digest()).decode()
CLIENT = "outsider"


@asynccontextmanager
async def _client(proc: HostProcess, kind: str = "ui", plugin_id: str | None = None) -> AsyncIterator[HostClient]:
    async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind=kind, plugin_id=plugin_id) as c:
        yield c


def _outside_vault(data: Path) -> bytes:
    """Every byte under the data directory but the encrypted secret store's own directory."""
    return b"".join(p.read_bytes() for p in sorted(data.rglob("*"))
                    if p.is_file() and p.relative_to(data).parts[0] != "secrets")


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


# ------------------------------------------------------------------ where the settings and secrets live

async def test_sync_settings_are_a_configSync_kv_row_and_the_secrets_go_nowhere_but_the_vault(
        tmp_path: Path) -> None:
    """§1.3: "Host-core stores sync configuration in the configSync key-value namespace. The vault key
    reference and WebDAV password use the existing encrypted secret store." README §8.7: "keeps the sync
    settings in kv(configSync, settings) (references only)"; README: "configSync [is] written only by [its]
    own methods"; README configSync.get: "refs only, never a secret"."""
    data = data_dir(tmp_path)
    proc = start_host_process(data)
    try:
        with trio.fail_after(60):
            async with _client(proc) as c:
                answer = await c.call("configSync.configure", {
                    "enabled": True, "webdavUrl": "https://dav.example/pi", "webdavUsername": "ada",
                    "webdavPassword": PASSWORD, "vaultKey": VAULT_KEY, "submissionId": "cfg-1"})
                got = await c.call("configSync.get", {})
                refusals = [
                    await error_of(c, "configSync.configure", {"webdavUrl": f"https://ada:{PASSWORD}@dav.example/pi",
                                                               "webdavPassword": PASSWORD}),
                    await error_of(c, "configSync.configure", {"webdavUrl": f"https://dav.example/pi?token={PASSWORD}"}),
                    await error_of(c, "configSync.configure", {"webdavUsername": "ada", "webdavPassword": PASSWORD,
                                                               "remoteDir": ""}),
                    await error_of(c, "configSync.configure", {"webdavPassword": PASSWORD * 3000}),
                    await error_of(c, "configSync.configure", {"vaultKey": VAULT_KEY[:-2] + "!!",
                                                               "webdavPassword": PASSWORD}),
                    await error_of(c, "configSync.configure", {"webdavPassword": PASSWORD + "x",
                                                               "submissionId": "cfg-1"}),
                    await error_of(c, "settings.set", {"ns": "configSync", "key": "settings",
                                                       "value": {"webdavPassword": PASSWORD}}),
                ]
                for code, err in refusals:
                    assert code is not None, "a bad configure was accepted"
                    assert PASSWORD not in repr(err) and VAULT_KEY not in repr(err), err
                assert await c.call("configSync.get", {}) == got, "a refused write changed the sync settings"
                exported = await c.call("configSync.export", {"submissionId": "exp-1"})
                applied = await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"],
                                                            "submissionId": "ap-1"})
                again = await c.call("configSync.configure", {"enabled": False})
                reads = [await c.call("secrets.list", {}),
                         await c.call("settings.get", {"ns": "configSync", "key": "settings"}),
                         await c.call("host.status", {})]
        assert proc.terminate() == 0  # a clean stop: the logs are flushed
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    assert "configSync/webdavPassword" in repr(reads[0])
    for said in (answer, got, again, exported, applied, *reads):
        assert PASSWORD not in repr(said) and VAULT_KEY not in repr(said)
    assert answer["settings"] == {"enabled": True, "webdavUrl": "https://dav.example/pi", "webdavUsername": "ada",
                                  "vaultKeyRef": "configSync/vaultKey",
                                  "webdavPasswordRef": "configSync/webdavPassword"}
    assert answer["hasVaultKey"] and answer["hasWebdavPassword"]
    rows = _db(data, "SELECT ns, key FROM kv WHERE value_json LIKE '%dav.example%'")
    assert rows == [("configSync", "settings")], rows
    outside = _outside_vault(data)
    assert (data / "logs").is_dir()
    for value in (PASSWORD.encode(), VAULT_KEY.encode(), base64.b64decode(VAULT_KEY)):
        assert value not in outside, "a sync secret left the secret store (SQLite, logs, bundles ...)"
        assert not [p for p in (data / "secrets").rglob("*") if p.is_file() and value in p.read_bytes()], (
            "the secret store keeps a sync secret in plaintext")


# ------------------------------------------------------------------ refused bundles

async def _configured_with_bundle(data: Path, c: HostClient) -> str:
    await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
    await c.call("settings.set", {"key": "largePasteThreshold", "value": 900})
    bundle: str = (await c.call("configSync.export", {}))["bundleBase64"]
    await c.call("configSync.apply", {"bundleBase64": bundle})  # base.bin holds it
    await c.call("settings.set", {"key": "largePasteThreshold", "value": 42})  # after the export
    return bundle


async def test_a_flipped_truncated_or_foreign_bundle_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """§1.3: "config-sync/base.bin and config-sync/pending.bin are authenticated encrypted bundles". README
    §8.7: "A changed byte, a truncated bundle or one made with another vault key is CORRUPT_DATA (data.reason
    tampered / foreign_key) ... each changes nothing." The foreign bundle is a real one another host made."""
    other = tmp_path / "other"
    other.mkdir()
    with trio.fail_after(60):
        async with real_host(other) as (_p, c):
            await c.call("configSync.configure", {})  # a vault key of its own
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 7})
            foreign = base64.b64decode((await c.call("configSync.export", {}))["bundleBase64"])
        data = data_dir(tmp_path)
        async with real_host(data) as (_p, c):
            good = base64.b64decode(await _configured_with_bundle(data, c))
            before = probe.state(data)
            base = (data / "config-sync" / "base.bin").read_bytes()
            cases: dict[str, tuple[bytes, str]] = {"foreign": (foreign, "foreign_key")}
            for where in (0, 20, len(good) // 2, len(good) - 1):
                bad = bytearray(good)
                bad[where] ^= 0x40
                cases[f"byte {where} flipped"] = (bytes(bad), "foreign_key" if 8 <= where < 16 else "tampered")
            for cut in (1, 16, len(good) // 2, len(good) - 10):
                cases[f"cut to {cut}"] = (good[:cut], "tampered")
            cases["two bundles glued"] = (good + good, "tampered")
            for name, (blob, _reason) in cases.items():
                code, err = await error_of(c, "configSync.apply", {"bundleBase64": _b64(blob),
                                                                   "submissionId": f"bad-{name}"})
                assert code == "CORRUPT_DATA", (name, code, err)
                assert err.get("reason") in ("tampered", "foreign_key"), (name, err)
                if name == "foreign":
                    assert err["reason"] == "foreign_key", err
                assert probe.state(data) == before, f"the {name} bundle changed something"
            assert (data / "config-sync" / "base.bin").read_bytes() == base
            assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 42
            # the good bundle still applies (nothing was poisoned by the refusals)
            await c.call("configSync.apply", {"bundleBase64": _b64(good)})
            assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 900


@pytest.mark.parametrize("bad", [
    pytest.param({"bundleBase64": "not base64!"}, id="not-base64"),
    pytest.param({"bundleBase64": "QUJD\nREVG"}, id="newline-inside"),
    pytest.param({"bundleBase64": "QUJDRA="}, id="bad-padding"),
    pytest.param({"bundleBase64": ""}, id="empty"),
    pytest.param({"bundleBase64": 12345}, id="a-number"),
    pytest.param({"bundleBase64": None}, id="null"),
    pytest.param({"bundleBase64": ["QUJD"]}, id="a-list"),
    pytest.param({"bundleBase64": {"b": "QUJD"}}, id="an-object"),
    pytest.param({}, id="missing"),
    pytest.param({"bundleBase64": "QUJD", "submissionId": 7}, id="submissionId-a-number"),
    pytest.param({"bundleBase64": "A" * 5592412}, id="past-the-field-length"),
])
async def test_bad_bundle_input_is_a_clear_error_and_changes_nothing(tmp_path: Path, bad: dict[str, Any]) -> None:
    """README configSync.apply: "bundleBase64 | string | yes | min length 1, max length 5592409"; the limits
    table: "INVALID_PARAMS once its bundleBase64 text is past the field's length". Bad input is refused before
    anything is written."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_p, c):
            await _configured_with_bundle(data, c)
            before = probe.state(data)
            code, err = await error_of(c, "configSync.apply", bad)
            assert code == "INVALID_PARAMS", (code, err)
            assert probe.state(data) == before


# ------------------------------------------------------------------ crashes at every step of the bundle files

_STEPS = ("after_tmp_write", "after_tmp_fsync", "after_rename", "before_dirsync")
EXPORT_POINTS = [*(f"configSync.pending.bin.{s}" for s in _STEPS),
                 *(f"configSync.pending.receipt.{s}" for s in _STEPS),
                 "configSync.export.before_commit", "configSync.export.after_commit"]
APPLY_POINTS = [*(f"configSync.base.bin.{s}" for s in _STEPS)]


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A data directory whose ``pending.bin`` and ``base.bin`` hold bundle ``old`` (a provider-less
    configuration) and a bundle ``new`` (with provider ``local``) exported before the provider was deleted."""
    root = tmp_path_factory.mktemp("synced") / "data"
    root.mkdir()

    async def make() -> dict[str, str]:
        async with real_host(root, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 900})
            await c.call("providers.create", {"id": "local", "name": "Local", "baseUrl": "http://127.0.0.1:8080/v1"})
            new = (await c.call("configSync.export", {}))["bundleBase64"]
            await c.call("providers.delete", {"providerId": "local"})
            old = (await c.call("configSync.export", {}))["bundleBase64"]
            await c.call("configSync.apply", {"bundleBase64": old})
            return {"old": old, "new": new}

    return root, trio.run(make)


def _copy(synced: tuple[Path, dict[str, str]], tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(synced[0], data)
    (data / "host.json").unlink(missing_ok=True)
    return data


@pytest.mark.parametrize("point", EXPORT_POINTS)
async def test_an_export_killed_at_any_step_leaves_pending_whole_and_its_retry_has_one_effect(
        tmp_path: Path, synced: tuple[Path, dict[str, str]], point: str) -> None:
    """§1.3: "config-sync/base.bin and config-sync/pending.bin are authenticated encrypted bundles replaced
    with temp-file rename". README: "A retry with the same clientId + submissionId returns the stored
    response"; configSync.export row: "A retry after a crash before the commit ... answers the bundle
    pending.bin still holds and writes nothing; once another export replaced it, the retry exports again"."""
    data = _copy(synced, tmp_path)
    old = base64.b64decode(synced[1]["old"])
    pending = data / "config-sync" / "pending.bin"
    keyed = {"submissionId": "exp-crash"}
    with trio.fail_after(90):
        await call_killed_at(data, point, "configSync.export", keyed, client_id=CLIENT)
        left = pending.read_bytes()
        async with real_host(data, client_id=CLIENT) as (_p, c):
            first = await c.call("configSync.export", keyed)
            assert await c.call("configSync.export", keyed) == first, "the retry did not answer the same"
            assert pending.read_bytes() == base64.b64decode(first["bundleBase64"]), "pending.bin is not the answer"
            assert first["sha256"] == hashlib.sha256(pending.read_bytes()).hexdigest()
            # what the crash left was a whole bundle: the old one, or one this host verifies and applies
            if left != old:
                await c.call("configSync.apply", {"bundleBase64": _b64(left)})
            await c.call("configSync.apply", {"bundleBase64": first["bundleBase64"]})
    assert not [p.name for p in (data / "config-sync").iterdir() if ".tmp" in p.name], "a temp file stayed"


@pytest.mark.parametrize("point", APPLY_POINTS)
async def test_an_apply_killed_at_any_step_leaves_base_whole_and_its_retry_has_one_effect(
        tmp_path: Path, synced: tuple[Path, dict[str, str]], point: str) -> None:
    """§1.3: "... authenticated encrypted bundles replaced with temp-file rename". README configSync.apply
    row: "config-sync/base.bin is written before the merge commits with the receipt ...; a retry after a crash
    before the commit applies the same bundle again"."""
    data = _copy(synced, tmp_path)
    old, new = (base64.b64decode(synced[1][k]) for k in ("old", "new"))
    base = data / "config-sync" / "base.bin"
    keyed = {"bundleBase64": synced[1]["new"], "submissionId": "ap-crash"}
    with trio.fail_after(90):
        await call_killed_at(data, point, "configSync.apply", keyed, client_id=CLIENT)
        assert base.read_bytes() in (old, new), "the crash left base.bin neither old nor new"
        async with real_host(data, client_id=CLIENT) as (_p, c):
            first = await c.call("configSync.apply", keyed)
            assert await c.call("configSync.apply", keyed) == first
            assert first["sha256"] == hashlib.sha256(new).hexdigest()
            assert [p["id"] for p in (await c.call("providers.list", {}))["providers"]] == ["local"]
            assert base.read_bytes() == new
    assert not [p.name for p in (data / "config-sync").iterdir() if ".tmp" in p.name], "a temp file stayed"


# ------------------------------------------------------------------ not renderer- or sidecar-readable

async def test_the_bundle_files_are_owner_only_and_no_plugin_call_or_http_route_serves_them(tmp_path: Path) -> None:
    """§1.3: "they are not renderer- or sidecar-readable files". README: "Every other route answers a plugin
    PERMISSION_DENIED"; "No method returns the files themselves or a secret value"."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        proc = start_host_process(data)
        try:
            async with _client(proc) as c:
                await c.call("configSync.configure", {"vaultKey": VAULT_KEY, "webdavPassword": PASSWORD})
                bundle = (await c.call("configSync.export", {"submissionId": "e"}))["bundleBase64"]
                await c.call("configSync.apply", {"bundleBase64": bundle})
            folder = data / "config-sync"
            assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, oct(folder.stat().st_mode)
            for p in folder.iterdir():
                assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p.name, oct(p.stat().st_mode))
            assert {"base.bin", "pending.bin"} <= {p.name for p in folder.iterdir()}
            async with _client(proc, kind="plugin", plugin_id="acme.tools") as plugin:
                for method, params in (("configSync.get", {}), ("configSync.export", {}),
                                       ("configSync.apply", {"bundleBase64": bundle}),
                                       ("configSync.configure", {"enabled": False}),
                                       ("settings.get", {"ns": "configSync", "key": "settings"}),
                                       ("secrets.get", {"ref": "configSync/vaultKey"}),
                                       ("secrets.get", {"ref": "configSync/webdavPassword"})):
                    code, err = await error_of(plugin, method, params)
                    assert code == "PERMISSION_DENIED", (method, code, err)
            http = "http" + proc.url.removeprefix("ws")
            blob = base64.b64decode(bundle)
            for path in ("/config-sync/pending.bin", "/config-sync/base.bin", "/pending.bin", "/base.bin",
                         "/../config-sync/pending.bin", "/%2e%2e/config-sync/base.bin", "/pi.sqlite",
                         f"/pending.bin?token={proc.token}"):
                def fetch(url: str = http + path) -> tuple[int, bytes]:
                    try:
                        with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 - the host's own url
                            return reply.status, reply.read()
                    except urllib.error.HTTPError as refused:
                        return refused.code, refused.read()
                status, body = await trio.to_thread.run_sync(fetch)
                assert status != 200 and blob[:64] not in body, (path, status)
        finally:
            proc.kill9()


# ------------------------------------------------------------------ no schema, session or transcript change

async def test_an_apply_touches_no_session_row_no_transcript_and_not_the_schema(tmp_path: Path) -> None:
    """§1.3: "Sync revisions and resources remain remote immutable objects and do not change the SQLite
    schema or transcript retention." An apply of a bundle another host made, with projects and settings,
    leaves every session row, every transcript byte and the schema as they were."""
    source = tmp_path / "source"
    source.mkdir()
    with trio.fail_after(90):
        async with real_host(source) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 1234})
            await c.call("workspace.open", {"path": str(tmp_path / "proj")})
            await c.call("session.create", {"sessionId": "elsewhere", "title": "not portable"})
            await say(c, "elsewhere", "x1", "from the other device")
            bundle = (await c.call("configSync.export", {}))["bundleBase64"]
        data = data_dir(tmp_path)
        async with real_host(data) as (_p, c):
            schema = _db(data, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("configSync.export", {"submissionId": "e"})
            assert _db(data, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
            await c.call("session.create", {"sessionId": "s1", "title": "Local"})
            await say(c, "s1", "m1", "hello")
            await say(c, "s1", "m2", "hi", "assistant")
            session_before = await c.call("session.get", {"sessionId": "s1"})

            def snapshot() -> dict[str, Any]:
                state = probe.state(data)
                return {"schema": _db(data, "SELECT type, name, sql FROM sqlite_master ORDER BY name"),
                        "version": _db(data, "PRAGMA user_version"),
                        "sessionTables": {t: rows for t, rows in state["db"].items()
                                          if t.startswith(("session", "message", "turn"))},
                        "sessionFiles": {p: d for p, d in state["files"].items() if p.startswith("sessions")}}

            before = snapshot()
            assert before["sessionFiles"], "no transcript to compare"
            out = await c.call("configSync.apply", {"bundleBase64": bundle, "submissionId": "ap"})
            assert out["applied"]["projects"] == 1
            assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 1234
            assert snapshot() == before
            assert await c.call("session.get", {"sessionId": "s1"}) == session_before
            listed = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
            assert listed == ["s1"], listed


# ------------------------------------------------------------------ keyed retries without a crash

async def test_a_keyed_retry_is_answered_from_its_receipt_and_another_request_under_its_key_is_refused(
        tmp_path: Path) -> None:
    """README: "A retry with the same clientId + submissionId returns the stored response" (and the
    methods list IDEMPOTENCY_CONFLICT): a keyed export retried after another export replaced pending.bin
    answers its own bundle and writes nothing; the same key with another bundle is refused and changes
    nothing; another client's same submissionId is a request of its own."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, client_id=CLIENT) as (proc, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            first = await c.call("configSync.export", {"submissionId": "k-exp"})
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 777})
            later = await c.call("configSync.export", {})
            pending = data / "config-sync" / "pending.bin"
            assert pending.read_bytes() == base64.b64decode(later["bundleBase64"])
            assert await c.call("configSync.export", {"submissionId": "k-exp"}) == first
            assert pending.read_bytes() == base64.b64decode(later["bundleBase64"]), "the retry wrote pending.bin"
            applied = await c.call("configSync.apply", {"bundleBase64": first["bundleBase64"], "submissionId": "k-ap"})
            assert applied["sha256"] == first["sha256"]
            before = probe.state(data)
            code, err = await error_of(c, "configSync.apply", {"bundleBase64": later["bundleBase64"],
                                                               "submissionId": "k-ap"})
            assert code == "IDEMPOTENCY_CONFLICT", (code, err)
            assert probe.state(data) == before
            assert await c.call("configSync.apply", {"bundleBase64": first["bundleBase64"],
                                                     "submissionId": "k-ap"}) == applied
            async with _client(proc) as same_id:  # the same clientId: the same receipts
                assert await same_id.call("configSync.apply", {"bundleBase64": first["bundleBase64"],
                                                               "submissionId": "k-ap"}) == applied
            async with open_client(proc.url, proc.token, client_id="another", client_kind="ui") as other:
                mine = await other.call("configSync.apply", {"bundleBase64": later["bundleBase64"],
                                                            "submissionId": "k-ap"})
                assert mine["sha256"] == later["sha256"]
            assert (data / "config-sync" / "base.bin").read_bytes() == base64.b64decode(later["bundleBase64"])


@pytest.mark.parametrize("spec", ["secrets.write.after_tmp_write:1:enospc", "secrets.write.after_tmp_fsync:1:eio",
                                  "configSync.configure.before_commit:1:eio",
                                  "configSync.pending.bin.after_tmp_write:1:enospc",
                                  "configSync.base.bin.after_tmp_fsync:1:eio"])
async def test_a_storage_error_while_syncing_never_carries_a_secret_and_the_retry_lands_once(
        tmp_path: Path, spec: str) -> None:
    """§1.3 "The vault key reference and WebDAV password use the existing encrypted secret store" with
    README: "a failed write is rolled back" and "A retry with the same clientId + submissionId returns the
    stored response": a configure, export or apply failing on a full or failing disk answers a storage code
    whose message and data name no secret, leaves the sync state as it was, and its retry lands once."""
    data = data_dir(tmp_path)
    point = spec.split(":")[0]
    env = {"RT_CRASHPOINT": spec}
    with trio.fail_after(60):
        if point.startswith(("configSync.pending", "configSync.base")):
            async with real_host(data, client_id=CLIENT) as (_p, c):
                await c.call("configSync.configure", {"vaultKey": VAULT_KEY, "webdavPassword": PASSWORD})
                bundle = (await c.call("configSync.export", {}))["bundleBase64"]
        proc = start_host_process(data, env=env)
        try:
            async with _client(proc) as c:
                if point.startswith("configSync.pending"):
                    method, params = "configSync.export", {"submissionId": "k"}
                elif point.startswith("configSync.base"):
                    method, params = "configSync.apply", {"bundleBase64": bundle, "submissionId": "k"}
                else:
                    method = "configSync.configure"
                    params = {"vaultKey": VAULT_KEY, "webdavPassword": PASSWORD, "submissionId": "k"}
                before = await c.call("configSync.get", {})
                code, err = await error_of(c, method, params)
                assert code in ("STORAGE_FULL", "IO_ERROR"), (code, err)
                assert PASSWORD not in repr(err) and VAULT_KEY not in repr(err), err
                assert await c.call("configSync.get", {}) == before, "the failed call changed the sync state"
                retried = await c.call(method, params)
                assert await c.call(method, params) == retried
                assert PASSWORD not in repr(retried) and VAULT_KEY not in repr(retried)
                if method == "configSync.configure":
                    assert retried["hasWebdavPassword"] and retried["hasVaultKey"]
                    got = await c.call("secrets.get", {"ref": "configSync/webdavPassword"})
                    assert got["value"] == PASSWORD
        finally:
            proc.kill9()


@pytest.mark.parametrize("point", ["configSync.base.bin.after_rename", "configSync.base.bin.before_dirsync"])
async def test_a_bundle_the_rules_refuse_never_stays_as_base_even_across_a_kill(tmp_path: Path, point: str) -> None:
    """README §8.7 (before this fix): "keeps it as config-sync/base.bin and merges it in one transaction (it
    adds and updates, never deletes; a refused merge puts the previous base.bin back)" and "A bundle whose
    content breaks a rule is refused whole ... and changes nothing". The merge wrote base.bin first and put the
    previous one back on a refusal, so a kill in between left the refused bundle there, and the refused retry
    put "back" that same bundle. A host killed while it applies a bundle the merge refuses (a
    skill version naming other source: CONFLICT), restarted and retried, still refuses it, and base.bin is the
    bundle applied before: a refused bundle is never the base of the next sync."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    with trio.fail_after(90):
        async with real_host(here, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("skills.put", {"name": "notes", "version": "3", "source": "here v3"})
            old = (await c.call("configSync.export", {}))["bundleBase64"]
            await c.call("configSync.apply", {"bundleBase64": old})
        async with real_host(there, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("skills.put", {"name": "notes", "version": "3", "source": "there v3, other bytes"})
            clash = (await c.call("configSync.export", {}))["bundleBase64"]
        base = here / "config-sync" / "base.bin"
        keyed = {"bundleBase64": clash, "submissionId": "ap-clash"}
        crashing = start_host_process(here, env={"RT_CRASHPOINT": f"{point}:1"})
        try:
            async with _client(crashing) as c:
                code, _err = await error_of(c, "configSync.apply", keyed)
                assert code == "CONFLICT"
        except (ClientClosed, OSError):
            pass  # it died at the point
        finally:
            crashing.kill9()
        async with real_host(here, client_id=CLIENT) as (_p, c):
            code, err = await error_of(c, "configSync.apply", keyed)
            assert code == "CONFLICT", (code, err)
            assert (await c.call("skills.get", {"name": "notes"}))["skill"]["source"] == "here v3"
            assert base.read_bytes() == base64.b64decode(old), "a refused bundle stayed as base.bin"
            assert (await c.call("configSync.get", {}))["base"]["bytes"] == len(base64.b64decode(old))
