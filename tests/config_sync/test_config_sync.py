"""Portable configuration sync (seed 003 §1.3): bundles between two data directories, tampering refused."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient, RpcError
from store.config import config_sync as sync
from store.errors import CorruptData
from tests.hostkit import client_for, inprocess_host
from tests.integrity.test_damaged_listings import damage
from tests.pipeline import probe
from tests.threadkit import on_trio_thread

KEY = "sk-never-travels-4b1f"


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def _fill(c: HostClient, tmp: Path) -> None:
    await c.call("settings.update", {"values": {"largePasteThreshold": 1500, "thinkingDisplayMode": "compact",
                                                "promptEnhancementUserTemplate": "Better: {{draft}}"}})
    await c.call("settings.set", {"ns": "ui", "key": "sidebarWidth", "value": 300})  # not portable
    await c.call("providers.create", {"id": "or", "name": "OpenRouter", "baseUrl": "https://openrouter.ai/api/v1",
                                      "apiKey": KEY, "config": {"headers": {"HTTP-Referer": "https://pi"}}})
    await c.call("providers.create", {"id": "local", "name": "Local", "baseUrl": "http://127.0.0.1:8080/v1"})
    await c.call("providers.reorder", {"providerIds": ["local", "or"]})
    await c.call("models.add", {"providerId": "or", "modelId": "my/model", "displayName": "Mine"})
    project = (await c.call("workspace.open", {"path": str(tmp / "parser")}))["project"]
    await c.call("projects.pin", {"projectId": project["id"], "pinned": True})
    await c.call("settings.set", {"ns": "projectMemory", "key": str(tmp / "parser"), "value": "use pnpm"})
    group = (await c.call("projectGroups.save", {"name": "Parser", "roots": [str(tmp / "parser"),
                                                                             str(tmp / "lexer")]}))["group"]
    await c.call("projectGroups.setMemory", {"groupId": group["id"], "memory": "shared memory"})
    await c.call("projectGroups.setInstructions", {"groupId": group["id"], "instructions": "run both suites"})
    await c.call("skills.put", {"name": "release-notes", "version": "1.0.0",
                                "source": "---\nname: release-notes\n---\n", "description": "Draft release notes",
                                "origin": "~/.pi/skills/release-notes"})


async def _portable(c: HostClient) -> dict[str, Any]:
    providers = (await c.call("providers.list", {}))["providers"]
    groups = (await c.call("projectGroups.list", {}))["groups"]
    stored = [g for g in groups if not g.get("legacy")]
    return {
        "settings": (await c.call("settings.getAll", {"ns": "app"}))["values"],
        "providers": [{k: v for k, v in p.items() if k not in ("createdAt", "updatedAt", "hasApiKey", "secretRef")}
                      for p in providers],
        "models": [{k: v for k, v in m.items() if k != "updatedAt"}
                   for m in (await c.call("models.list", {}))["models"]],
        "projects": sorted((p["path"], p["name"], p["pinned"])
                           for p in (await c.call("projects.list", {}))["projects"]),
        "groups": [{k: v for k, v in g.items() if k not in ("createdAt", "updatedAt")} for g in stored],
        "groupDetails": [{k: (v if k != "memory" else v["content"]) for k, v in
                          (await c.call("projectGroups.get", {"groupId": g["id"]})).items() if k != "group"}
                         for g in stored],
        "skills": [{k: v for k, v in (await c.call("skills.get", {"name": m["name"]}))["skill"].items()
                    if k not in ("createdAt", "updatedAt")} for m in (await c.call("skills.list", {}))["skills"]],
        "memory": (await c.call("settings.get", {"ns": "projectMemory", "key": stored[0]["roots"][0]}))["value"][
            "content"] if stored else None,
    }


async def test_a_bundle_round_trips_between_two_data_directories(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with trio.fail_after(60):
        async with inprocess_host(a) as host, client_for(host, kind="ui") as c:
            state = await c.call("configSync.configure", {"enabled": True, "webdavUrl": "https://dav.example/pi",
                                                          "webdavUsername": "ada", "webdavPassword": "dav-secret"})
            assert state["hasVaultKey"] and state["hasWebdavPassword"]
            assert state["settings"]["vaultKeyRef"] == "configSync/vaultKey"
            await _fill(c, tmp_path)
            exported = await c.call("configSync.export", {"submissionId": "exp-1"})
            vault_key = (await c.call("secrets.get", {"ref": "configSync/vaultKey"}))["value"]
            expected = await _portable(c)
            got = await c.call("configSync.get", {})
            assert got["pending"]["bytes"] == exported["bytes"] and "base" not in got
            assert "dav-secret" not in repr(got) and vault_key not in repr(got)
        bundle = base64.b64decode(exported["bundleBase64"])
        assert (a / "config-sync" / "pending.bin").read_bytes() == bundle
        for secret in (KEY, "dav-secret", "use pnpm", "Better: {{draft}}"):
            assert secret.encode() not in bundle  # the bundle is ciphertext
        async with inprocess_host(b) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {"vaultKey": vault_key})
            out = await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"], "submissionId": "ap"})
            assert out["applied"]["providers"] == 2 and out["applied"]["projects"] == 1
            assert out["applied"]["skills"] == 1
            assert await _portable(c) == expected
            assert "value" not in (await c.call("settings.get", {"ns": "ui", "key": "sidebarWidth"}))
            providers = {p["id"]: p for p in (await c.call("providers.list", {}))["providers"]}
            assert providers["or"]["hasApiKey"] is False  # secrets never travel
            assert (b / "config-sync" / "base.bin").read_bytes() == bundle
            again = await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"]})
            assert await _portable(c) == expected and again["sha256"] == out["sha256"]
    key = KEY.encode()
    assert not [p for p in b.rglob("*") if p.is_file() and key in p.read_bytes()]


async def test_a_flipped_byte_or_a_foreign_key_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {})
            await _fill(c, tmp_path)
            blob = base64.b64decode((await c.call("configSync.export", {}))["bundleBase64"])
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 42})  # after the export
            state = probe.state(data)
            head = len(sync.MAGIC) + sync.KEY_ID_BYTES
            positions = {"magic": 0, "key id": len(sync.MAGIC), "nonce": head, "ciphertext": head + 20,
                         "tag": len(blob) - 1}
            for where, i in positions.items():
                bad = bytearray(blob)
                bad[i] ^= 0x01
                err = await _err(c.call("configSync.apply", {"bundleBase64": base64.b64encode(bad).decode()}))
                assert err.data_code == "CORRUPT_DATA", where
                assert err.data["reason"] == ("foreign_key" if where == "key id" else "tampered"), where
                assert probe.state(data) == state, f"a bundle with a flipped {where} byte changed something"
            truncated = base64.b64encode(blob[:-5]).decode()
            assert (await _err(c.call("configSync.apply", {"bundleBase64": truncated}))).data_code == "CORRUPT_DATA"
            foreign = sync.encode_bundle(base64.b64decode(sync.new_vault_key()), {"schema": 1, "settings": {}})
            err = await _err(c.call("configSync.apply", {"bundleBase64": base64.b64encode(foreign).decode()}))
            assert (err.data_code, err.data["reason"]) == ("CORRUPT_DATA", "foreign_key")
            assert (await _err(c.call("configSync.apply", {"bundleBase64": "not base64!"}))).data_code \
                == "INVALID_PARAMS"
            assert probe.state(data) == state
            assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 42


async def test_export_and_apply_need_a_vault_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            state = probe.state(data)
            assert (await _err(c.call("configSync.export", {}))).data_code == "CONFLICT"
            assert (await _err(c.call("configSync.apply", {"bundleBase64": "AAAA"}))).data_code == "CONFLICT"
            assert (await _err(c.call("configSync.configure", {"vaultKey": "A" * 44}))).data_code == "INVALID_PARAMS"
            assert probe.state(data) == state
            assert (await c.call("configSync.get", {}))["hasVaultKey"] is False


async def test_a_bundle_that_breaks_a_rule_is_refused_whole(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {})
            key = base64.b64decode((await c.call("secrets.get", {"ref": sync.VAULT_KEY_REF}))["value"])
            state = probe.state(data)
            for doc in (
                {"schema": 1, "providers": [{"id": "p", "name": "P", "config": {"apiKey": "sk-x"}}]},
                {"schema": 1, "projects": [{"path": "/p"}], "projectMemory": {"/p": "x" * 40000}},
                {"schema": 1, "projectGroupInstructions": {"g-unknown": "text"}},
                {"schema": 1, "projects": [{"path": "/ok"}], "models": [{"providerId": "missing", "modelId": "m"}]},
                {"schema": 1, "projects": [{"path": "/ok"}], "skills": [{"name": "Bad Name!", "version": "1",
                                                                         "source": "x"}]},
                {"schema": 1, "projects": [{"path": "/ok"}], "skills": [{"name": "notes", "version": "1.0",
                                                                         "source": "", "updatedAt": 1}]},
            ):
                blob = base64.b64encode(sync.encode_bundle(key, doc)).decode()
                with pytest.raises(RpcError):
                    await c.call("configSync.apply", {"bundleBase64": blob})
                assert probe.state(data) == state, doc


async def test_skills_travel_newest_wins_and_a_version_with_other_source_is_refused(tmp_path: Path) -> None:
    """Config sync carried no skills: a second device lost them. Newest ``updatedAt`` wins; an older
    copy never replaces a newer local one; a version naming other source here refuses the bundle whole.

    The copy keeps the bundle's ``updatedAt``. It used to be stamped with the apply's wall clock, so the clash
    below (then ``local + 99`` ms) read as older than the copy whenever the host took over ~90 ms between the
    ``skills.put`` and the apply (a loaded machine): skipped as older, no ``CONFLICT``, the test failed. The
    stamps here are fixed numbers, never compared with the host's clock."""
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {})
            key = base64.b64decode((await c.call("secrets.get", {"ref": sync.VAULT_KEY_REF}))["value"])
            await c.call("skills.put", {"name": "local", "version": "2", "source": "local v2"})
            local = (await c.call("skills.get", {"name": "local"}))["skill"]

            def bundle(*items: dict[str, Any]) -> str:
                return base64.b64encode(sync.encode_bundle(key, {"schema": 1, "skills": list(items)})).decode()

            older = {"name": "local", "version": "1", "source": "local v1", "updatedAt": local["updatedAt"] - 1}
            fresh = {"name": "fresh", "version": "1", "source": "fresh v1", "description": "new here",
                     "updatedAt": 5}
            out = await c.call("configSync.apply", {"bundleBase64": bundle(older, fresh)})
            assert out["applied"]["skills"] == 1
            assert (await c.call("skills.get", {"name": "local"}))["skill"] == local
            got = (await c.call("skills.get", {"name": "fresh"}))["skill"]
            assert (got["version"], got["source"], got["description"]) == ("1", "fresh v1", "new here")
            assert got["updatedAt"] == 5, "the copy is stamped with the apply's clock, not the bundle's edit time"
            # an hour ahead of the local edit: never the wall clock of the apply below, however loaded the machine
            newer = {"name": "local", "version": "3", "source": "local v3", "updatedAt": local["updatedAt"] + 3_600_000}
            await c.call("configSync.apply", {"bundleBase64": bundle(newer)})
            got = (await c.call("skills.get", {"name": "local"}))["skill"]
            assert (got["source"], got["updatedAt"]) == ("local v3", newer["updatedAt"])
            state = probe.state(data)
            clash = {"name": "local", "version": "3", "source": "other v3", "updatedAt": newer["updatedAt"] + 1}
            err = await _err(c.call("configSync.apply", {"bundleBase64": bundle(fresh | {"updatedAt": 10**13}, clash)}))
            assert err.data_code == "CONFLICT"
            assert probe.state(data) == state


def test_every_single_bit_flip_of_a_bundle_is_detected() -> None:
    key = base64.b64decode(sync.new_vault_key())
    blob = sync.encode_bundle(key, {"schema": 1, "settings": {"largePasteThreshold": 900}})
    assert sync.decode_bundle(key, blob)["settings"] == {"largePasteThreshold": 900}
    for i in range(len(blob)):
        for bit in range(8):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptData):
                sync.decode_bundle(key, bytes(bad))


def test_bundle_files_are_written_whole(tmp_path: Path) -> None:
    sync.write_bundle(tmp_path / "config-sync", sync.PENDING_FILE, b"one")
    sync.write_bundle(tmp_path / "config-sync", sync.PENDING_FILE, b"two")
    assert [p.name for p in (tmp_path / "config-sync").iterdir()] == ["pending.bin"]
    assert (tmp_path / "config-sync" / "pending.bin").read_bytes() == b"two"
    assert (tmp_path / "config-sync" / "pending.bin").stat().st_mode & 0o777 == 0o600


async def test_a_group_whose_record_is_gone_or_damaged_stays_home_and_the_bundle_applies(tmp_path: Path) -> None:
    """``pi-host doctor --repair`` of a damaged group record deletes the record and keeps its memory and
    instructions rows. Before, the export carried those rows (and a record that is not an object), and the other
    host's apply refused instructions for a group it did not know: CONFLICT, nothing of the bundle applied."""
    a, b = tmp_path / "a", tmp_path / "b"
    roots = {}
    for name in ("kept", "repaired", "damaged"):
        roots[name] = tmp_path / name
        roots[name].mkdir()
    with trio.fail_after(60):
        async with inprocess_host(a) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {"enabled": True})
            ids = {}
            for name, root in roots.items():
                ids[name] = (await c.call("projectGroups.save", {"name": name, "roots": [str(root)]}))["group"]["id"]
                await c.call("projectGroups.setMemory", {"groupId": ids[name], "memory": f"{name} memory"})
                await c.call("projectGroups.setInstructions", {"groupId": ids[name], "instructions": f"{name} rules"})
            damage(a, "DELETE FROM kv WHERE ns = 'projectGroups' AND key = ?", ids["repaired"])
            damage(a, "UPDATE kv SET value_json = '[1]' WHERE ns = 'projectGroups' AND key = ?", ids["damaged"])
            exported = await c.call("configSync.export", {})
            vault_key = (await c.call("secrets.get", {"ref": "configSync/vaultKey"}))["value"]
        async with inprocess_host(b) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {"vaultKey": vault_key})
            out = await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"]})
            assert out["applied"]["projectGroups"] == 1
            groups = (await c.call("projectGroups.list", {}))["groups"]
            assert [g["id"] for g in groups if not g.get("legacy")] == [ids["kept"]]
            got = await c.call("projectGroups.get", {"groupId": ids["kept"]})
            assert (got["memory"]["content"], got["instructions"]) == ("kept memory", "kept rules")
            for name in ("repaired", "damaged"):
                assert "value" not in await c.call("settings.get", {"ns": "projectGroupInstructions",
                                                                    "key": ids[name]})


async def test_bundles_are_sealed_and_opened_off_the_trio_thread(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An export or apply handles up to 4 MiB of JSON, AES-GCM, SHA-256 and base64: never on the trio loop
    (every other request of the host waits while it runs there). Bad base64 is refused first, configured or not."""
    threads: list[tuple[str, bool]] = []
    encode, decode = sync.encode_bundle, sync.decode_bundle

    def encode_seen(*args: Any, **kwargs: Any) -> bytes:
        threads.append(("encode", on_trio_thread()))
        return encode(*args, **kwargs)

    def decode_seen(*args: Any, **kwargs: Any) -> Any:
        threads.append(("decode", on_trio_thread()))
        return decode(*args, **kwargs)

    monkeypatch.setattr(sync, "encode_bundle", encode_seen)
    monkeypatch.setattr(sync, "decode_bundle", decode_seen)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            bad = await _err(c.call("configSync.apply", {"bundleBase64": "not base64!"}))
            assert bad.data_code == "INVALID_PARAMS" and bad.data.get("field") == "bundleBase64"
            await c.call("configSync.configure", {"enabled": True})
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 1300})
            exported = await c.call("configSync.export", {})
            await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"]})
    assert threads == [("encode", False), ("decode", False)]


async def test_memory_of_another_writers_entry_shape_travels_as_it_reads_and_a_damaged_one_stays_home(
        tmp_path: Path) -> None:
    """A seed-era project memory (entries of ``{title, body}`` beside its derived content, the shape the seed's
    writer left) reads as its content, one untitled entry (``memory_view``); the export copied it raw, and the
    other host's apply refused the whole bundle (``INVALID_PARAMS bundle.projectMemory.entries.0``). Now it
    travels as it reads; a memory that cannot be read at all stays home, and the rest of the bundle applies."""
    a, b = tmp_path / "a", tmp_path / "b"
    seed_shape = {"format": "entries-v1", "entries": [{"title": "db", "body": "use WAL"}], "content": "use WAL",
                  "updatedAt": 1}
    with trio.fail_after(60):
        async with inprocess_host(a) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {"enabled": True})
            for name in ("seed", "broken", "text"):
                await c.call("settings.set", {"ns": "projectMemory", "key": str(tmp_path / name), "value": name})
            damage(a, "UPDATE kv SET value_json = ? WHERE ns = 'projectMemory' AND key = ?",
                   orjson.dumps(seed_shape).decode(), str(tmp_path / "seed"))
            damage(a, "UPDATE kv SET value_json = ? WHERE ns = 'projectMemory' AND key = ?",
                   '{"entries": [{"body": 1}]}', str(tmp_path / "broken"))
            damage(a, "UPDATE kv SET value_json = ? WHERE ns = 'projectMemory' AND key = ?",
                   '"legacy text"', str(tmp_path / "text"))
            seen = (await c.call("settings.get", {"ns": "projectMemory", "key": str(tmp_path / "seed")}))["value"]
            assert seen["content"] == "use WAL"
            exported = await c.call("configSync.export", {})
            vault_key = (await c.call("secrets.get", {"ref": "configSync/vaultKey"}))["value"]
        async with inprocess_host(b) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {"vaultKey": vault_key})
            out = await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"]})
            assert out["applied"]["memory"] == 2
            got = (await c.call("settings.get", {"ns": "projectMemory", "key": str(tmp_path / "seed")}))["value"]
            assert (got["content"], [e["content"] for e in got["entries"]]) == ("use WAL", ["use WAL"])
            text = (await c.call("settings.get", {"ns": "projectMemory", "key": str(tmp_path / "text")}))["value"]
            assert text["content"] == "legacy text"
            assert "value" not in await c.call("settings.get", {"ns": "projectMemory", "key": str(tmp_path / "broken")})


async def test_a_bundle_whose_provider_name_breaks_the_label_rule_still_applies(tmp_path: Path) -> None:
    """providers.create refuses a blank name or one holding a control character (store.rules.label_problem), but
    a bundle is rows another database stored, perhaps before that rule: apply takes such a name as the bundle
    carries it (as that database lists it) rather than refusing the whole bundle for one label; the row then
    lists here, and providers.update renames it."""
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {})
            key = base64.b64decode((await c.call("secrets.get", {"ref": sync.VAULT_KEY_REF}))["value"])
            doc = {"schema": 1, "providers": [{"id": "blank", "name": " "}, {"id": "nul", "name": "a\x00b"},
                                              {"id": "ok", "name": "OK"}]}
            blob = base64.b64encode(sync.encode_bundle(key, doc)).decode()
            out = await c.call("configSync.apply", {"bundleBase64": blob})
            assert out["applied"]["providers"] == 3
            names = {p["id"]: p["name"] for p in (await c.call("providers.list", {}))["providers"]}
            assert names == {"blank": " ", "nul": "a\x00b", "ok": "OK"}
            assert (await c.call("providers.update", {"providerId": "blank", "name": "Named"}))["provider"]["name"] \
                == "Named"
