"""An integer beyond 64 bits in a seed-era app settings blob: the guarded v8→v11 step keeps it exact (up to
309 digits, ``LEGACY_JSON_MAX_INT_DIGITS``), and so must the runtime afterwards. The settings reader read it as
a float (orjson), so a later unrelated ``settings.set`` rewrote the blob with it rounded (``1e+120``); a
config-sync bundle carried it rounded too. Now the reader keeps it exact, a write of another key leaves its
bytes as they were, ``settings.get`` answers its exact literal, and a bundle carries it exactly."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from protocol.jsonrpc import encode, success
from store.jsonio import dumps_exact, loads_exact
from store.upgrade.seed_migrations import LEGACY_JSON_MAX_INT_DIGITS
from tests.hostkit import client_for, inprocess_host
from tests.migrations.seedkit import build_seed_dir

Rows = dict[str, list[dict[str, Any]]]

LONGEST = 10 ** (LEGACY_JSON_MAX_INT_DIGITS - 1) + 12345  # 309 digits, below the largest double (orjson reads it)
INSTALL_ID = 123456789012345678901234567890
NEGATIVE = -(2**64) - 7


def _big_ints(rows: Rows) -> None:
    row = next(r for r in rows["kv"] if (r["ns"], r["key"]) == ("app", "settings"))
    value = json.loads(row["value_json"])
    row["value_json"] = json.dumps({**value, "serial": LONGEST, "installId": INSTALL_ID,
                                    "window": {"seed": NEGATIVE, "scale": 1.5}})


def _blob(data: Path) -> str:
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        return str(conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'settings'").fetchone()[0])
    finally:
        conn.close()


LITERALS = (f'"serial":{LONGEST}', f'"installId":{INSTALL_ID}', f'"seed":{NEGATIVE}')


@pytest.mark.parametrize("version", [8, 9])
async def test_a_write_of_another_key_leaves_a_seed_era_big_integer_exact(tmp_path: Path, version: int) -> None:
    data = tmp_path / "data"
    build_seed_dir(data, version, tweak=_big_ints)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            migrated = _blob(data)
            assert all(lit in migrated.replace(" ", "") for lit in LITERALS), migrated
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 4242})
            await c.call("settings.update", {"values": {"thinkingDisplayMode": "compact"}})
            after = _blob(data)
            for lit in LITERALS:
                assert lit in after, f"{lit[:40]}... rewritten: {after[-400:]}"
            stored = json.loads(after)  # the stdlib reader: exact
            assert (stored["serial"], stored["installId"], stored["window"]["seed"]) == (LONGEST, INSTALL_ID, NEGATIVE)
            assert stored["largePasteThreshold"] == 4242 and stored["thinkingDisplayMode"] == "compact"
            # the reply carries the value (orjson on the client's side reads it as a double: its own business)
            got = await c.call("settings.get", {"key": "settings"})
            assert got["value"]["largePasteThreshold"] == 4242 and "serial" in got["value"]
            await c.call("configSync.configure", {})
            bundle = await c.call("configSync.export", {})
            vault_key = (await c.call("secrets.get", {"ref": "configSync/vaultKey"}))["value"]
            assert _blob(data) == after, "an export changed the blob"
        other = tmp_path / "other"
        async with inprocess_host(other) as host, client_for(host, kind="ui") as c:
            await c.call("configSync.configure", {"vaultKey": vault_key})
            await c.call("configSync.apply", {"bundleBase64": bundle["bundleBase64"]})
            applied = _blob(other)
            assert json.loads(applied)["installId"] == INSTALL_ID, applied[-400:]
            assert f'"installId":{INSTALL_ID}' in applied


def test_the_reader_and_writer_keep_integers_beyond_64_bits_and_the_reply_encoder_writes_them() -> None:
    text = f'{{"a":{LONGEST},"b":[{NEGATIVE},1.5,"{"9" * 30}"],"c":{2**63 - 1}}}'
    value = loads_exact(text)
    assert value == {"a": LONGEST, "b": [NEGATIVE, 1.5, "9" * 30], "c": 2**63 - 1}
    assert dumps_exact(value).decode() == text
    assert loads_exact('{"s":"' + "1" * 40 + '","n":12}') == {"s": "1" * 40, "n": 12}  # digits in a string only
    assert dumps_exact({"b": 1, "a": 2}, sort_keys=True) == b'{"a":2,"b":1}'
    with pytest.raises(orjson.JSONDecodeError):  # what the migration refuses stays unreadable (damaged)
        loads_exact("1" * (LEGACY_JSON_MAX_INT_DIGITS + 1))
    reply = encode(success(7, {"value": value}))
    assert reply == b'{"jsonrpc":"2.0","id":7,"result":{"value":' + text.encode() + b"}}"


def test_an_unencodable_reply_is_still_internal() -> None:
    reply: dict[str, Any] = json.loads(encode(success(7, {"value": object()})))
    assert reply["error"]["data"]["code"] == "INTERNAL"


def _big_task_config(rows: Rows) -> None:
    row = next(r for r in rows["scheduled_tasks"] if r["id"] == "task-hourly")
    row["config_json"] = json.dumps({**json.loads(row["config_json"]), "extension": {"serial": INSTALL_ID}})


def _task_config(data: Path) -> str:
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        return str(conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = 'task-hourly'").fetchone()[0])
    finally:
        conn.close()


async def test_a_task_update_and_run_leave_a_seed_era_big_integer_in_its_config_exact(tmp_path: Path) -> None:
    """The same for a task's ``config_json`` (the guarded step keeps it exact too): the task reader read it with
    orjson (a float), so a rename, a schedule change or a run wrote the config back with ``1.2345678901234568e+29``;
    the size check of an update raised on it."""
    data = tmp_path / "data"
    build_seed_dir(data, 9, tweak=_big_task_config)
    literal = f'"serial":{INSTALL_ID}'
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            assert literal in _task_config(data).replace(" ", "")
            await c.call("tasks.update", {"taskId": "task-hourly", "title": "Renamed"})
            assert literal in _task_config(data), _task_config(data)
            await c.call("tasks.update", {"taskId": "task-hourly", "cadence": "daily",
                                          "schedule": {"hour": 9, "minute": 30}, "calendarConfigured": True})
            assert literal in _task_config(data), _task_config(data)
            await c.call("tasks.startRun", {"taskId": "task-hourly"})
            assert literal in _task_config(data), _task_config(data)
            got = await c.call("tasks.get", {"taskId": "task-hourly"})
            assert got["title"] == "Renamed" and got["cadence"] == "daily"
