"""A stored setting or memory that no longer reads (a value_json cut by index damage, a memory whose entries lost
their shape) answers CORRUPT_DATA for that key and is named in a listing's ``unreadable``; before, it read as
unset (or as an empty memory), and a write to the app settings merged into that empty view and replaced every
other app setting with it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

from protocol.models_settings import SettingsGetAllResult, SettingsGetResult
from protocol.models_skills import MemoriesListResult
from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host
from tests.integrity.test_damaged_listings import damage
from tests.turns.turnkit import rpc_error

REPAIR = "pi-host doctor --repair"
"""What every damaged setting's CORRUPT_DATA names as the way out (``data.repair``; its message too)."""


def stored(root: Path, ns: str, key: str) -> str:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return str(conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()[0])
    finally:
        conn.close()


async def test_a_damaged_app_settings_blob_reads_as_defaults_named_and_is_corrupt_to_write(tmp_path: Path) -> None:
    """Reads normalize it (seed 003 §7: "host settings reads normalize a missing, malformed, or out-of-range
    value") and say so (``unreadable``); a write is CORRUPT_DATA, so nothing merges into the defaults shown
    and the damaged bytes stay for ``pi-host doctor --repair``."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            fresh = SettingsGetAllResult.model_validate(await ui.call("settings.getAll", {}))
            values = {"largePasteThreshold": 1200, "thinkingDisplayMode": "compact"}
            await ui.call("settings.update", {"values": values})
            for cut in ('{"largePasteThreshold": 12', '[1200]'):
                damage(tmp_path, "UPDATE kv SET value_json = ? WHERE ns = 'app' AND key = 'settings'", cut)
                got = SettingsGetResult.model_validate(await ui.call("settings.get", {"key": "largePasteThreshold"}))
                assert (got.value, got.unreadable, got.updated_at) == (600, ["settings"], None), cut
                every = SettingsGetAllResult.model_validate(await ui.call("settings.getAll", {}))
                assert (every.values, every.unreadable) == (fresh.values, ["settings"]), cut
                for method, params in (("settings.set", {"key": "thinkingDisplayMode", "value": "detailed"}),
                                       ("settings.update", {"values": {"largePasteThreshold": 900}}),
                                       ("settings.delete", {"key": "largePasteThreshold"})):
                    err = await rpc_error(ui.call(method, params))
                    assert err.data_code == "CORRUPT_DATA", (cut, method)
                    assert (err.data["ns"], err.data["key"], err.data["repair"]) == ("app", "settings", REPAIR)
                assert stored(tmp_path, "app", "settings") == cut  # no write replaced it with an empty blob's merge
            assert fresh.unreadable is None


async def test_a_damaged_key_is_corrupt_to_get_named_by_get_all_and_a_set_writes_over_it(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            await ui.call("settings.update", {"ns": "ui", "values": {"a": 1, "b": {"open": True}, "c": 3}})
            damage(tmp_path, "UPDATE kv SET value_json = '{\"op' WHERE ns = 'ui' AND key = 'b'")
            err = await rpc_error(ui.call("settings.get", {"ns": "ui", "key": "b"}))
            assert (err.data_code, err.data["ns"], err.data["key"]) == ("CORRUPT_DATA", "ui", "b")
            assert err.data["repair"] == REPAIR and REPAIR in err.message
            listed = SettingsGetAllResult.model_validate(await ui.call("settings.getAll", {"ns": "ui"}))
            assert listed.values == {"a": 1, "c": 3} and listed.unreadable == ["b"]
            wrote = await ui.call("settings.set", {"ns": "ui", "key": "b", "value": {"open": False}})
            assert wrote["changed"] == ["b"]
            again = SettingsGetAllResult.model_validate(await ui.call("settings.getAll", {"ns": "ui"}))
            assert again.values == {"a": 1, "b": {"open": False}, "c": 3} and again.unreadable is None


async def test_a_damaged_project_memory_is_corrupt_to_read_and_named_by_memories_list(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            for path in ("/w/a", "/w/b", "/w/c"):
                await ui.call("settings.set", {"ns": "projectMemory", "key": path, "value": f"notes of {path}"})
            damage(tmp_path, "UPDATE kv SET value_json = '{\"format\": \"entries-v1\", \"entries\": [{\"x\": 1}]}' "
                   "WHERE ns = 'projectMemory' AND key = '/w/b'")
            damage(tmp_path, "UPDATE kv SET value_json = '{\"format\": \"entr' "
                   "WHERE ns = 'projectMemory' AND key = '/w/c'")
            for path in ("/w/b", "/w/c"):
                err = await rpc_error(ui.call("settings.get", {"ns": "projectMemory", "key": path}))
                assert err.data_code == "CORRUPT_DATA", path
                assert (err.data["ns"], err.data["key"], err.data["repair"]) == ("projectMemory", path, REPAIR)
            got = await ui.call("settings.get", {"ns": "projectMemory", "key": "/w/a"})
            assert got["value"]["content"] == "notes of /w/a"
            listed = MemoriesListResult.model_validate(await ui.call("memories.list", {}))
            assert [x.key for x in listed.memories] == ["/w/a"] and listed.unreadable == ["/w/b", "/w/c"]
            page = MemoriesListResult.model_validate(await ui.call("memories.list", {"limit": 2}))
            assert [x.key for x in page.memories] == ["/w/a"] and page.unreadable == ["/w/b"]
            assert page.next_after == "/w/b"
            await ui.call("settings.set", {"ns": "projectMemory", "key": "/w/b", "value": "new notes"})
            got = await ui.call("settings.get", {"ns": "projectMemory", "key": "/w/b"})
            assert got["value"]["content"] == "new notes"


async def new_group(ui: HostClient, tmp_path: Path) -> str:
    """A project group over one new folder; its id."""
    root = tmp_path / "proj"
    root.mkdir()
    return str((await ui.call("projectGroups.save", {"name": "G", "roots": [str(root)]}))["group"]["id"])


async def test_a_damaged_group_memory_makes_project_groups_get_corrupt_until_set_again(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            gid = await new_group(ui, tmp_path)
            await ui.call("projectGroups.setMemory", {"groupId": gid, "memory": "group notes"})
            damage(tmp_path, "UPDATE kv SET value_json = '7' WHERE ns = 'projectGroupMemory' AND key = ?", gid)
            err = await rpc_error(ui.call("projectGroups.get", {"groupId": gid}))
            assert err.data_code == "CORRUPT_DATA"
            assert (err.data["ns"], err.data["key"], err.data["repair"]) == ("projectGroupMemory", gid, REPAIR)
            await ui.call("projectGroups.setMemory", {"groupId": gid, "memory": "again"})
            assert (await ui.call("projectGroups.get", {"groupId": gid}))["memory"]["content"] == "again"


async def test_attachments_gc_with_a_damaged_app_settings_blob_is_corrupt_and_evicts_nothing(tmp_path: Path) -> None:
    """Before, the budget and the grace of a damaged blob read as their defaults (200 MB, one hour): a GC evicted
    and swept by those in place of the user's settings."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            await ui.call("settings.update", {"values": {"attachmentBudgetBytes": 10**12,
                                                         "attachmentUnreferencedGraceMs": 31_536_000_000}})
            blob = await ui.call("attachments.put", {"name": "f.bin", "mimeType": "application/octet-stream",
                                                     "dataBase64": "aGVsbG8="})
            damage(tmp_path, "UPDATE kv SET value_json = '{\"attachmentBud' WHERE ns = 'app' AND key = 'settings'")
            for method in ("attachments.gc", "attachments.estimate"):
                err = await rpc_error(ui.call(method, {}))
                assert (err.data_code, err.data["key"]) == ("CORRUPT_DATA", "settings"), method
                assert err.data["repair"] == REPAIR, method
            got = await ui.call("attachments.get", {"sha256": blob["sha256"]})
            assert got["deletionState"] == "live"


async def test_damaged_config_sync_settings_are_corrupt_to_read_and_to_configure(tmp_path: Path) -> None:
    """Before, they read as {"enabled": false}, and a configure merged into that view: the WebDAV address, user and
    folder it did not send were dropped."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            await ui.call("configSync.configure", {"enabled": True, "webdavUrl": "https://dav.example/pi",
                                                   "webdavUsername": "ada"})
            cut = '{"enabled": true, "webdavUrl": "https://dav.exa'
            damage(tmp_path, "UPDATE kv SET value_json = ? WHERE ns = 'configSync' AND key = 'settings'", cut)
            for method, params in (("configSync.get", {}), ("configSync.configure", {"remoteDir": "pi2"})):
                err = await rpc_error(ui.call(method, params))
                assert (err.data_code, err.data["ns"]) == ("CORRUPT_DATA", "configSync"), method
                assert err.data["repair"] == REPAIR and REPAIR in err.message, method
            assert stored(tmp_path, "configSync", "settings") == cut


async def test_a_skill_record_that_is_json_but_not_an_object_names_its_row_and_repair(tmp_path: Path) -> None:
    """Before, skills.get of a skill stored as a JSON array (or any non-object) was CORRUPT_DATA with only
    ``data.name``: no ns/key for ``pi-host doctor --repair``, and the doctor did not flag the row."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            await ui.call("skills.put", {"name": "notes", "version": "1", "source": "# notes\n"})
            for stored_as in ('["# notes"]', '{"na'):
                damage(tmp_path, "UPDATE kv SET value_json = ? WHERE ns = 'skills' AND key = 'notes'", stored_as)
                err = await rpc_error(ui.call("skills.get", {"name": "notes"}))
                assert err.data_code == "CORRUPT_DATA", stored_as
                assert (err.data["ns"], err.data["key"], err.data["repair"]) == ("skills", "notes", REPAIR), stored_as
                assert REPAIR in err.message


async def test_a_group_record_not_an_object_and_instructions_not_text_name_their_row_and_repair(
        tmp_path: Path) -> None:
    """Before, projectGroups.get of a group record stored as JSON that is not an object was CORRUPT_DATA with no
    data (and instructions that are not text had only ``data.groupId``): no ns/key for ``pi-host doctor
    --repair``, and the doctor did not flag either row."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            gid = await new_group(ui, tmp_path)
            await ui.call("projectGroups.setInstructions", {"groupId": gid, "instructions": "be brief"})
            damage(tmp_path, "UPDATE kv SET value_json = '[\"be brief\"]' "
                   "WHERE ns = 'projectGroupInstructions' AND key = ?", gid)
            err = await rpc_error(ui.call("projectGroups.get", {"groupId": gid}))
            assert err.data_code == "CORRUPT_DATA"
            assert (err.data["ns"], err.data["key"], err.data["repair"]) == ("projectGroupInstructions", gid, REPAIR)
            assert err.data["groupId"] == gid and REPAIR in err.message
            for stored_as in ('"G"', '{"na'):
                damage(tmp_path, "UPDATE kv SET value_json = ? WHERE ns = 'projectGroups' AND key = ?", stored_as, gid)
                err = await rpc_error(ui.call("projectGroups.get", {"groupId": gid}))
                assert err.data_code == "CORRUPT_DATA", stored_as
                got = (err.data["ns"], err.data["key"], err.data["repair"])
                assert got == ("projectGroups", gid, REPAIR), stored_as
                assert REPAIR in err.message
