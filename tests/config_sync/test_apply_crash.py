"""configSync.apply killed at each point, restarted, retried: the merge, its answer and base.bin, once.

A `pi-host serve` process SIGKILLs itself at a named point (``RT_CRASHPOINT``) inside a keyed apply; a
host started on its data directory in this process retries the same clientId + submissionId. Apply used
to write ``config-sync/base.bin`` (README §8.7: "then keeps it as config-sync/base.bin") only after the
merge and its receipt committed: a kill between the two left the receipt, so the retry was answered
from it and base.bin was never written. Now base.bin is written (durably) before the commit, as what
the commit makes true; a bundle whose merge is refused puts the previous base.bin back.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, RpcError, open_client
from store.config import config_sync as sync
from tests.hostkit import client_for, inprocess_host, start_host_process

CLIENT = "settings-ui"
POINTS = ["configSync.apply.before_commit", "configSync.apply.after_commit"]


async def _setup(root: Path) -> dict[str, str]:
    """A vault key and two exported bundles (the first one applied already: base.bin holds it)."""
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
        await c.call("configSync.configure", {"enabled": True})
        await c.call("settings.set", {"key": "largePasteThreshold", "value": 900})
        first = (await c.call("configSync.export", {}))["bundleBase64"]
        await c.call("providers.create", {"id": "local", "name": "Local", "baseUrl": "http://127.0.0.1:8080/v1"})
        second = (await c.call("configSync.export", {}))["bundleBase64"]
        await c.call("configSync.apply", {"bundleBase64": first})
        key = (await c.call("secrets.get", {"ref": sync.VAULT_KEY_REF}))["value"]
    return {"first": first, "second": second, "vaultKey": key}


async def _killed_during(root: Path, point: str, params: dict[str, Any]) -> None:
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id=CLIENT, client_kind="ui") as c:
                await c.call("configSync.apply", params)
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
    assert crashing.proc.returncode == -9, f"the host did not die at {point}"


async def _apply_and_read(root: Path, params: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
        first = await c.call("configSync.apply", params)
        assert await c.call("configSync.apply", params) == first
        providers = sorted(p["id"] for p in (await c.call("providers.list", {}))["providers"])
        return first, providers, await c.call("configSync.get", {})


@pytest.mark.parametrize("point", POINTS)
async def test_an_apply_killed_at_its_commit_keeps_the_bundle_as_base_once_retried(
        tmp_path: Path, point: str) -> None:
    data, ref = tmp_path / "data", tmp_path / "ref"
    bundles = await _setup(data)
    shutil.copytree(data, ref)
    keyed = {"bundleBase64": bundles["second"], "submissionId": "apply-1"}
    with trio.fail_after(120):
        expected, expected_providers, _ = await _apply_and_read(ref, keyed)  # the crash-free run
        await _killed_during(data, point, keyed)
        answer, providers, got = await _apply_and_read(data, keyed)
    assert answer == expected and providers == expected_providers
    assert (data / "config-sync" / "base.bin").read_bytes() == base64.b64decode(bundles["second"])
    assert got["base"]["bytes"] == len(base64.b64decode(bundles["second"]))


async def test_a_refused_merge_leaves_base_bin_as_it_was(tmp_path: Path) -> None:
    data = tmp_path / "data"
    bundles = await _setup(data)
    base = data / "config-sync" / "base.bin"
    before = base.read_bytes()
    doc = {"schema": 1, "projectGroupInstructions": {"no-such-group": "text"}}  # breaks a rule: CONFLICT
    bad = sync.encode_bundle(base64.b64decode(bundles["vaultKey"]), doc)
    async with inprocess_host(data) as host, client_for(host, CLIENT, kind="ui") as c:
        with pytest.raises(RpcError) as info:
            await c.call("configSync.apply", {"bundleBase64": base64.b64encode(bad).decode(), "submissionId": "x"})
        assert info.value.data_code == "CONFLICT"
        assert base.read_bytes() == before
        # with no base.bin yet, a refused bundle leaves none
        base.unlink()
        with pytest.raises(RpcError):
            await c.call("configSync.apply", {"bundleBase64": base64.b64encode(bad).decode()})
        assert not base.exists() and "base" not in await c.call("configSync.get", {})
