"""settings.* over the wire: defaults, merges, deletes, refusals and the settings.changed event."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from tests.hostkit import client_for, inprocess_host, run_cli, start_host_process
from tests.pipeline import probe


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def test_settings_over_the_wire(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c, \
                client_for(host, "watcher", kind="ui") as watcher:
            await watcher.subscribe(["settings.changed"])
            unset = await c.call("settings.get", {"key": "largePasteThreshold"})
            assert unset == {"ns": "app", "key": "largePasteThreshold", "value": 600}
            assert (await c.call("settings.getAll", {}))["values"] == {"largePasteThreshold": 600,
                                                                       "thinkingDisplayMode": "detailed"}
            set_one = await c.call("settings.set", {"key": "largePasteThreshold", "value": 1200})
            assert set_one["value"] == 1200 and set_one["changed"] == ["largePasteThreshold"]
            both = await c.call("settings.update", {"values": {"thinkingDisplayMode": "compact",
                                                               "promptEnhancementUserTemplate": " "}})
            assert both["values"] == {"thinkingDisplayMode": "compact", "promptEnhancementUserTemplate": None}
            assert (await c.call("settings.get", {"key": "settings"}))["value"] == {
                "largePasteThreshold": 1200, "thinkingDisplayMode": "compact"}
            state = probe.state(data)
            for bad, field in (({"key": "largePasteThreshold", "value": -5}, "largePasteThreshold"),
                               ({"key": "largePasteThreshold", "value": "600"}, "largePasteThreshold"),
                               ({"key": "thinkingDisplayMode", "value": "fancy"}, "thinkingDisplayMode"),
                               ({"key": "promptEnhancementUserTemplate", "value": "no variable"},
                                "promptEnhancementUserTemplate"),
                               ({"key": "currentProjectId", "value": 1}, "currentProjectId")):
                err = await _err(c.call("settings.set", bad))
                assert (err.data_code, err.data["field"]) == ("INVALID_PARAMS", field)
            assert probe.state(data) == state
            deleted = await c.call("settings.delete", {"key": "largePasteThreshold"})
            assert deleted == {"ns": "app", "key": "largePasteThreshold", "deleted": True,
                               "changed": ["largePasteThreshold"]}
            assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 600
            assert (await c.call("settings.delete", {"key": "largePasteThreshold"}))["deleted"] is False
            await c.call("settings.set", {"ns": "ui", "key": "secretish", "value": "a value no event carries"})
            events = []
            with trio.fail_after(5):
                while len(events) < 4:
                    events.append(await watcher.next_event())
            assert [(e.topic, e.data) for e in events] == [
                ("settings.changed", {"ns": "app", "keys": ["largePasteThreshold"]}),
                ("settings.changed", {"ns": "app", "keys": ["thinkingDisplayMode"]}),
                ("settings.changed", {"ns": "app", "keys": ["largePasteThreshold"]}),
                ("settings.changed", {"ns": "ui", "keys": ["secretish"]}),
            ]
            listed = await _err(c.call("settings.getAll", {"ns": "projectMemory"}))
            assert listed.data_code == "INVALID_PARAMS"


async def test_a_key_that_is_not_set_reads_without_a_value_and_a_stored_null_reads_as_null(tmp_path: Path) -> None:
    """README SettingsGetResult: ``value`` is "Absent when the key is not set (app fields read their default)".
    A stored JSON null is a value: the two answers differ, in every namespace and for an app field that has no
    default."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            for ns, key in (("ui", "never"), ("plugin:acme", "never"), ("newDomain", "never"),
                            ("projectMemory", "/w/none"), ("app", "currentProjectId"), ("app", "someField")):
                assert await c.call("settings.get", {"ns": ns, "key": key}) == {"ns": ns, "key": key}, (ns, key)
            await c.call("settings.set", {"ns": "ui", "key": "nulled", "value": None})
            got = await c.call("settings.get", {"ns": "ui", "key": "nulled"})
            assert got["value"] is None and "updatedAt" in got
            await c.call("settings.set", {"key": "someField", "value": None})
            assert (await c.call("settings.get", {"key": "someField"}))["value"] is None
            await c.call("settings.delete", {"ns": "ui", "key": "nulled"})
            assert "value" not in await c.call("settings.get", {"ns": "ui", "key": "nulled"})


def _cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--data-dir", str(data), *args, timeout=60)


def test_cli_settings_providers_and_models(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host = start_host_process(data)
    try:
        assert _cli(data, "settings", "get", "largePasteThreshold").stdout.strip() == "600"
        assert _cli(data, "settings", "set", "largePasteThreshold", "1200").stdout.strip() == "1200"
        assert _cli(data, "settings", "set", "language", "en").stdout.strip() == '"en"'
        refused = _cli(data, "settings", "set", "largePasteThreshold", "0")
        assert refused.returncode == 1 and "largePasteThreshold" in refused.stderr
        whole = _cli(data, "settings", "get")
        assert '"largePasteThreshold": 1200' in whole.stdout and '"language": "en"' in whole.stdout
        assert _cli(data, "settings", "delete", "language").stdout.strip() == "deleted"
        assert _cli(data, "settings", "delete", "language").stdout.strip() == "not set"
        assert _cli(data, "settings", "set", "--ns", "ui", "width", "280").returncode == 0
        assert _cli(data, "settings", "get", "--ns", "ui", "width").stdout.strip() == "280"
        # NaN / Infinity are not JSON: taken as the words they are, never written null
        for word in ("NaN", "Infinity"):
            assert _cli(data, "settings", "set", "--ns", "ui", "word", word).stdout.strip() == f'"{word}"'
            assert _cli(data, "settings", "get", "--ns", "ui", "word").stdout.strip() == f'"{word}"'

        async def add() -> None:
            from runtime.client import open_client

            async with open_client(host.url, host.token, client_id="cli-test", client_kind="ui") as c:
                await c.call("providers.create", {"id": "or", "name": "OpenRouter", "apiKey": "sk-cli-secret",
                                                  "baseUrl": "https://openrouter.ai/api/v1"})
                await c.call("models.add", {"providerId": "or", "modelId": "my/model", "displayName": "Mine"})

        trio.run(add)
        providers = _cli(data, "providers")
        assert providers.stdout.strip() == "or  OpenRouter  https://openrouter.ai/api/v1  key set"
        assert "sk-cli-secret" not in providers.stdout
        assert _cli(data, "models").stdout.strip() == "or/my/model  Mine  [user]"
        none = _cli(data, "models", "--provider", "none")
        assert (none.stdout, none.stderr.strip()) == ("", "no models of provider none")
    finally:
        host.proc.terminate()
        host.proc.communicate(timeout=60)
