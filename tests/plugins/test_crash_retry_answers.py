"""``plugins.uninstall`` / ``register`` / ``setEnabled`` SIGKILLed at each step, restarted, retried with the
same clientId + submissionId: one effect, and the answer a crash-free run gives.

Uninstall removes the registry entry and the asset bundle (files), then deletes ``kv(plugin:<id>)`` and
releases the plugin's providers with its receipt (one transaction). Killed between the files and the
transaction, the retry used to answer ``registryEntryRemoved: false`` and no ``assetsRemoved``: it could
only see that the files were gone. A keyed uninstall now records what it removes first (the uninstall
intent, ``store/plugins.py``) and the retry answers from it. The registry and asset writes now pass the
host's fault points (``plugins.registry.*``, ``plugins.assets.*``), so those steps are killed here too.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from store import receipts
from tests.dbkit import rows as _rows
from tests.hostkit import call_killed_at, client_for, inprocess_host

CLIENT = "ui-plugins"
README = base64.b64encode(b"# hi\n").decode()
UNINSTALL = {"pluginId": "acme", "submissionId": "un-1"}
UNINSTALLED = {"pluginId": "acme", "registryEntryRemoved": True, "assetsRemoved": True,
               "settingsRemoved": ["a", "b"], "providersReleased": ["acme-gw"]}

UNINSTALL_POINTS = [
    ("plugins.uninstall.intent.after_tmp_write", 1),  # nothing recorded, nothing removed
    ("plugins.uninstall.intent.after_rename", 1),  # recorded, nothing removed
    ("plugins.registry.after_tmp_write", 1),  # the new registry not in place yet
    ("plugins.registry.after_rename", 1),  # the entry gone, the assets still there
    ("plugins.registry.before_dirsync", 1),
    ("plugins.uninstall.before_commit", 1),  # both files gone, the rows and the receipt not committed
    ("plugins.uninstall.after_commit", 1),  # committed, not answered (the intent still there)
]


async def _setup(root: Path) -> None:
    """Plugins acme and beta, each with an asset and settings; acme also owns a provider."""
    async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
        for pid in ("acme", "beta"):
            await ui.call("plugins.register", {"pluginId": pid, "name": pid, "version": "1", "assets": [
                {"path": "README.md", "mediaType": "text/markdown", "dataBase64": README}]})
            await ui.call("settings.update", {"ns": f"plugin:{pid}", "values": {"a": 1, "b": pid}})
        async with client_for(host, "acme-rt", "plugin:acme") as acme:
            await acme.call("providers.sync", {"providers": [{"id": "acme-gw", "name": "Acme"}]})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plugins-crash") / "data"
    trio.run(_setup, root)
    return root


def _copy(src: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(src, root, symlinks=True)
    return root


async def _killed_during(root: Path, point: str, nth: int, method: str, params: dict[str, Any]) -> None:
    await call_killed_at(root, point, method, params, nth=nth, client_id=CLIENT)


def _leftovers(root: Path) -> list[str]:
    """Anything an interrupted write or an uninstall's record left in plugins/."""
    return sorted(p.name for p in (root / "plugins").iterdir() if ".tmp." in p.name or p.suffix == ".intent")


async def _assert_uninstalled_once(ui: HostClient, root: Path) -> None:
    assert [p["id"] for p in (await ui.call("plugins.list", {}))["plugins"]] == ["beta"]
    assert (await ui.call("plugins.listAssets", {"pluginId": "acme"}))["assets"] == []
    assert [a["path"] for a in (await ui.call("plugins.listAssets", {"pluginId": "beta"}))["assets"]] == \
        ["README.md"]
    assert _rows(root, "SELECT ns, key FROM kv WHERE ns LIKE 'plugin:%' ORDER BY ns, key") == \
        [("plugin:beta", "a"), ("plugin:beta", "b")]
    assert _rows(root, "SELECT id, owner_plugin_id FROM providers WHERE id = 'acme-gw'") == [("acme-gw", None)]
    stored = _rows(root, "SELECT response_json FROM command_receipts WHERE client_id = ? AND submission_id = ?",
                   CLIENT, "un-1")
    assert [json.loads(r[0]) for r in stored] == [UNINSTALLED]


async def test_a_crash_free_uninstall_answers_what_it_removed(tmp_path: Path, prepared: Path) -> None:
    root = _copy(prepared, tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            assert await ui.call("plugins.uninstall", UNINSTALL) == UNINSTALLED
            await _assert_uninstalled_once(ui, root)
    assert _leftovers(root) == []


@pytest.mark.parametrize(("point", "nth"), UNINSTALL_POINTS)
async def test_an_uninstall_killed_at_any_step_is_answered_on_retry_as_without_the_crash(
        tmp_path: Path, prepared: Path, point: str, nth: int) -> None:
    root = _copy(prepared, tmp_path)
    await _killed_during(root, point, nth, "plugins.uninstall", UNINSTALL)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            first = await ui.call("plugins.uninstall", UNINSTALL)
            assert first == UNINSTALLED, f"killed at {point}:{nth}: the retry's answer is not the crash-free one"
            assert await ui.call("plugins.uninstall", UNINSTALL) == first
            await _assert_uninstalled_once(ui, root)
            assert _leftovers(root) == []  # one a kill right after the commit left: boot removed it
            # a new uninstall of the same plugin now finds nothing, as after a crash-free one
            assert await ui.call("plugins.uninstall", {"pluginId": "acme", "submissionId": "un-9"}) == \
                {"pluginId": "acme", "registryEntryRemoved": False, "settingsRemoved": [], "providersReleased": []}
    assert _leftovers(root) == []


async def test_an_uninstall_another_call_finished_is_answered_to_both(tmp_path: Path, prepared: Path) -> None:
    """Killed with both files gone; another client uninstalls the plugin before the first retries: both get
    the whole uninstall's answer (the first from the receipt the second's transaction stored for it)."""
    root = _copy(prepared, tmp_path)
    await _killed_during(root, "plugins.uninstall.before_commit", 1, "plugins.uninstall", UNINSTALL)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, "ui-other", "ui") as other:
            assert await other.call("plugins.uninstall", {"pluginId": "acme", "submissionId": "un-2"}) == UNINSTALLED
            async with client_for(host, CLIENT, "ui") as ui:
                assert await ui.call("plugins.uninstall", UNINSTALL) == UNINSTALLED
                await _assert_uninstalled_once(ui, root)
    assert _leftovers(root) == []


async def test_a_finished_uninstalls_record_never_answers_for_a_later_one(tmp_path: Path, prepared: Path) -> None:
    """Killed right after the commit, the intent stays. The plugin registered again (without assets) and
    uninstalled by another call: that answer is its own (no ``assetsRemoved``), and the intent goes."""
    root = _copy(prepared, tmp_path)
    await _killed_during(root, "plugins.uninstall.after_commit", 1, "plugins.uninstall", UNINSTALL)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            assert await ui.call("plugins.uninstall", UNINSTALL) == UNINSTALLED
            await ui.call("plugins.register", {"pluginId": "acme", "name": "acme", "version": "2"})
            out = await ui.call("plugins.uninstall", {"pluginId": "acme", "submissionId": "un-3"})
            assert out == {"pluginId": "acme", "registryEntryRemoved": True, "settingsRemoved": [],
                           "providersReleased": []}
    assert _leftovers(root) == []


@pytest.mark.parametrize("step", ["before_unlink", "before_dirsync"])
async def test_an_uninstall_whose_intent_could_not_go_answers_what_it_committed(
        tmp_path: Path, prepared: Path, step: str) -> None:
    """After the commit, dropping the intent failed (its unlink, or the directory fsync after it). The
    uninstall took effect with its receipt, yet the call answered ``IO_ERROR``. Now it answers success:
    the answer vouches for the committed transaction, never for the intent's removal (RELIABILITY rule 7),
    and an intent left behind names only stored receipts (ignored, then swept at boot)."""
    root = _copy(prepared, tmp_path)
    point = f"plugins.uninstall.intent.drop.{step}"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            host.faults.add(point, nth=1, action="eio")
            first = await ui.call("plugins.uninstall", UNINSTALL)
            assert host.faults.hits(point) == 1
            assert first == UNINSTALLED
            assert await ui.call("plugins.uninstall", UNINSTALL) == first
            await _assert_uninstalled_once(ui, root)
            later = ui.call("plugins.uninstall", {"pluginId": "acme", "submissionId": "un-9"})
            if step == "before_unlink":
                assert _leftovers(root) == [f"uninstall-{b'acme'.hex()}.intent"]
                # the next uninstall ignores the finished intent (and drops it)
                assert await later == {"pluginId": "acme", "registryEntryRemoved": False, "settingsRemoved": [],
                                       "providersReleased": []}
                assert _leftovers(root) == []
            else:  # the intent is gone, its removal's durability unknown: no later plugin change is answered
                with pytest.raises(RpcError) as exc:
                    await later
                assert exc.value.data_code == "IO_ERROR"
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            assert await ui.call("plugins.uninstall", UNINSTALL) == first
            await _assert_uninstalled_once(ui, root)
            assert _leftovers(root) == []
            assert await ui.call("plugins.uninstall", {"pluginId": "acme", "submissionId": "un-10"}) == \
                {"pluginId": "acme", "registryEntryRemoved": False, "settingsRemoved": [], "providersReleased": []}


def _timeless(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: ("<ms>" if k in ("installedAt", "updatedAt") and isinstance(v, int) else _timeless(v))
                for k, v in x.items()}
    return [_timeless(v) for v in x] if isinstance(x, list) else x


REGISTER = {"pluginId": "gamma", "name": "Gamma", "version": "1", "submissionId": "reg-1",
            "assets": [{"path": "README.md", "mediaType": "text/markdown", "dataBase64": README}]}
SET_ENABLED = {"pluginId": "beta", "enabled": False, "submissionId": "en-1"}
REGISTRY_CASES = [
    ("plugins.register", REGISTER, "plugins.registry.after_tmp_write"),
    ("plugins.register", REGISTER, "plugins.registry.after_rename"),  # the entry written, its assets not
    ("plugins.register", REGISTER, "plugins.assets.after_tmp_write"),
    ("plugins.register", REGISTER, "plugins.assets.after_rename"),
    ("plugins.setEnabled", SET_ENABLED, "plugins.registry.after_tmp_write"),
    ("plugins.setEnabled", SET_ENABLED, "plugins.registry.after_rename"),
]


async def _registry_state(ui: HostClient) -> Any:
    plugins = (await ui.call("plugins.list", {}))["plugins"]
    assets = {p["id"]: (await ui.call("plugins.listAssets", {"pluginId": p["id"]}))["assets"] for p in plugins}
    return _timeless({"plugins": plugins, "assets": assets})


@pytest.mark.parametrize(("method", "params", "point"), REGISTRY_CASES)
async def test_a_registry_write_killed_at_any_step_is_answered_on_retry_as_without_the_crash(
        tmp_path: Path, prepared: Path, method: str, params: dict[str, Any], point: str) -> None:
    ref_root = _copy(prepared, tmp_path / "ref")
    async with inprocess_host(ref_root) as host, client_for(host, CLIENT, "ui") as ui:
        expected = _timeless(await ui.call(method, params))
        expected_state = await _registry_state(ui)
    root = _copy(prepared, tmp_path)
    await _killed_during(root, point, 1, method, params)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            first = await ui.call(method, params)
            assert _timeless(first) == expected, f"killed at {point}: the retry's answer is not the crash-free one"
            assert await ui.call(method, params) == first
            assert await _registry_state(ui) == expected_state
    assert _leftovers(root) == []
    assert not [p for p in (root / "plugins" / "assets").iterdir() if ".tmp." in p.name]


def test_boot_may_sweep_only_finished_uninstall_intents(tmp_path: Path, conn: sqlite3.Connection) -> None:
    """``sweep_uninstall_intents``: an intent whose receipts are all stored (its uninstall committed) goes;
    one still waiting for its retry stays."""
    from store.plugins import (  # the fix's own functions: imported here so the other cases run without it
        UninstallIntent,
        read_uninstall_intent,
        sweep_uninstall_intents,
        write_uninstall_intent,
    )

    directory = tmp_path / "plugins"
    key = receipts.ReceiptKey(CLIENT, "un-1", "plugins.uninstall", "f" * 64)
    for pid in ("acme", "beta"):
        intent = UninstallIntent(pid, registry_entry_removed=True).with_receipt(
            receipts.file_record(receipts.ReceiptKey(CLIENT, f"un-{pid}", key.method, key.fingerprint)))
        write_uninstall_intent(directory, intent)
    receipts.store(conn, receipts.ReceiptKey(CLIENT, "un-acme", key.method, key.fingerprint), UNINSTALLED,
                   session_id=None, now_ms=1)
    assert sweep_uninstall_intents(conn, directory) == 1
    assert read_uninstall_intent(directory, "acme") is None
    waiting = read_uninstall_intent(directory, "beta")
    assert waiting is not None and waiting.registry_entry_removed


async def test_boot_keeps_the_asset_bundle_of_a_plugin_whose_id_contains_tmp(tmp_path: Path) -> None:
    """Boot's temp sweep removed every name containing ``.tmp.``: a plugin id such as ``x.tmp.y`` lost
    its asset bundle (plugins/assets/x.tmp.y.json) at every start. Only ``<name>.tmp.<hex>`` is ours."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            await ui.call("plugins.register", {"pluginId": "x.tmp.y", "name": "x", "version": "1",
                                               "assets": [{"path": "README.md", "mediaType": "text/markdown",
                                                           "dataBase64": README}]})
        bundles = sorted(p.name for p in (root / "plugins" / "assets").iterdir())
        assert bundles
        stray = root / "plugins" / "assets" / "registry.json.tmp.0123456789ab"
        stray.write_bytes(b"{}")
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as ui:
            assert sorted(p.name for p in (root / "plugins" / "assets").iterdir()) == bundles  # the stray went
            assert [a["path"] for a in (await ui.call("plugins.listAssets", {"pluginId": "x.tmp.y"}))["assets"]] \
                == ["README.md"]
