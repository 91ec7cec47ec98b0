"""Keyed methods (plans, providers, plugin imports) failing once with ENOSPC / EIO at a named point, retried
at once in the same process with the same clientId + submissionId: a stable error first, then the answer and
the one effect a call without the fault has.

A `pi-host serve` process raises ``OSError`` at a point (``RT_CRASHPOINT=<point>:1:<action>``). Before the
fixes:

* an ``OSError`` no layer classified (``<method>.after_commit``) was answered INTERNAL;
* ``plans.respond`` (approve) failing in its commit stored its receipt with the undo line's commit, so every
  retry answered ``null`` and the plan stayed pending;
* ``providers.update`` / ``providers.create`` / ``configSync.configure`` wrote a key without the call's
  receipt, so the retry wrote it a second time (two versions for one call);
* ``secrets.set`` (and the keys ``providers.*`` / ``configSync.configure`` write) failing in its commit, or
  once its file was in place, left the new value readable, the previous one lost, while the answer said the
  call failed;
* ``import.sessions`` failing to sync the directory of a new transcript reported that session refused with
  reason INTERNAL (the ``OSError`` was not classified), not STORAGE_FULL / IO_ERROR;
* a key whose commit failed once it had taken place (an error after the ``COMMIT``) was taken back too:
  the rows (and the receipt a retry is answered from) named a value the file no longer held;
* ``plugins.importSession`` failing after its commit removed the transcript its committed row names: the
  retry answered the import, and the session had no messages, for good.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store.config.secrets import SecretStore
from tests.hostkit import client_for, failed_then_retried, faulted_client, index_caught_up, inprocess_host, msg
from tests.importers import gen

CLIENT = "cli-1"
CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}
ACTIONS = pytest.mark.parametrize("action", ["enospc", "eio"])


@ACTIONS
async def test_an_unclassified_storage_error_after_the_commit_is_answered_by_its_code(tmp_path: Path,
                                                                                      action: str) -> None:
    async with faulted_client(tmp_path, f"providers.create.after_commit:1:{action}", client_id=CLIENT,
                              client_kind="ui") as c:
        params = {"id": "p1", "name": "one", "submissionId": "sub-1"}
        retried = await failed_then_retried(c, "providers.create", params, CODES[action])
        listed = (await c.call("providers.list", {}))["providers"]
    assert retried["provider"]["id"] == "p1" and retried["provider"]["name"] == "one"
    assert [p["id"] for p in listed] == ["p1"]


@ACTIONS
@pytest.mark.parametrize("point", ["plans.respond.before_commit", "append.before_write"])
async def test_plan_approval_retried_after_a_storage_error_approves(tmp_path: Path, point: str,
                                                                   action: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    data = tmp_path / "data"
    async with faulted_client(data, f"{point}:1:{action}", client_id=CLIENT, client_kind="ui") as c:
        sid = (await c.call("session.create", {"title": "p", "projectPath": str(ws), "mode": "plan"}))["id"]
        request = (await c.call("plans.submit", {
            "sessionId": sid, "turnId": "t1", "toolCallId": "call1", "kind": "plan",
            "markdown": "# Plan\n\nDo it.\n", "workspaceRoot": str(ws)}))["requestId"]
        params = {"requestId": request, "action": "approve", "targetPermissionMode": "accept-edits",
                  "submissionId": "sub-1"}
        retried = await failed_then_retried(c, "plans.respond", params, CODES[action])
        pending = (await c.call("plans.pending", {}))["pending"]
        session = (await c.call("session.get", {"sessionId": sid}))["session"]
    assert retried is not None
    assert retried["approval"]["status"] == "approved" and retried["approval"]["requestId"] == request
    assert pending == []
    assert session["mode"] == "agent" and session["permissionMode"] == "accept-edits"


@ACTIONS
@pytest.mark.parametrize("point", ["providers.update.before_commit", "secrets.write.before_dirsync"])
async def test_provider_key_retried_after_a_storage_error_is_written_once(tmp_path: Path, point: str,
                                                                         action: str) -> None:
    async with faulted_client(tmp_path, None, client_id=CLIENT, client_kind="ui") as c:
        await c.call("providers.create", {"id": "p1", "name": "one", "apiKey": "key-one"})
    async with faulted_client(tmp_path, f"{point}:1:{action}", client_id=CLIENT, client_kind="ui") as c:
        params = {"providerId": "p1", "apiKey": "key-new", "submissionId": "sub-1"}
        with pytest.raises(RpcError) as failed:
            await c.call("providers.update", params)
        assert failed.value.data_code == CODES[action]
        assert (await c.call("secrets.get", {"ref": "provider/p1"}))["value"] == "key-one"
        retried = await c.call("providers.update", params)
        assert await c.call("providers.update", params) == retried
        key = await c.call("secrets.get", {"ref": "provider/p1"})
    assert retried["provider"]["hasApiKey"] is True
    assert key["value"] == "key-new"
    assert SecretStore(tmp_path / "secrets").get("provider/p1").version == 2  # create, then one update


@ACTIONS
async def test_plugin_import_failing_after_its_commit_keeps_its_transcript(tmp_path: Path, action: str) -> None:
    async with faulted_client(tmp_path, f"plugins.importSession.after_commit:1:{action}", client_id=CLIENT,
                              client_kind="plugin", plugin_id="test-plugin") as c:
        params = {"sourceId": "chat", "externalId": "e1", "messages": [msg("m1", "from a plugin")],
                  "submissionId": "sub-1"}
        retried = await failed_then_retried(c, "plugins.importSession", params, CODES[action])
        got = await c.call("session.get", {"sessionId": retried["sessionId"], "full": True})
    assert retried["created"] is True and retried["messageCount"] == 1
    assert [m["id"].split(":")[-1] for m in got["messages"]] == ["m1"]
    assert (tmp_path / "sessions" / f"{retried['sessionId']}.jsonl").is_file()


@ACTIONS
async def test_sync_password_retried_after_a_storage_error_is_written_once(tmp_path: Path, action: str) -> None:
    async with faulted_client(tmp_path, f"configSync.configure.before_commit:1:{action}", client_id=CLIENT,
                              client_kind="ui") as c:
        params = {"enabled": True, "webdavPassword": "pw-1", "submissionId": "sub-1"}
        retried = await failed_then_retried(c, "configSync.configure", params, CODES[action])
    assert retried["hasWebdavPassword"] is True
    stored = SecretStore(tmp_path / "secrets").get("configSync/webdavPassword")
    assert (stored.value, stored.version) == ("pw-1", 1)


@ACTIONS
async def test_import_failing_to_publish_reports_the_storage_code(tmp_path: Path, action: str) -> None:
    source = tmp_path / "claude" / "-work-demo"
    source.mkdir(parents=True)
    conv: list[gen.User | gen.Response | gen.Compact] = [gen.User("import me"),
                                                         gen.Response((("text", "imported answer"),), ())]
    sid = "5a1e0000-0000-4000-8000-000000000001"
    (source / f"{sid}.jsonl").write_bytes(b"".join(gen.claude_code_lines(conv, session=sid)))
    data = tmp_path / "data"
    async with faulted_client(data, f"import.after_link:1:{action}", client_id=CLIENT, client_kind="ui") as c:
        params = {"source": "claude-code", "root": str(source.parent)}
        refused = await c.call("import.sessions", {**params, "submissionId": "sub-1"})
        imported = await c.call("import.sessions", {**params, "submissionId": "sub-2"})
        listed = (await c.call("session.list", {}))["sessions"]
    assert refused["counts"]["refused"] == 1
    assert [r["reason"] for r in refused["sessions"]] == [CODES[action]]
    assert imported["counts"]["new"] == 1
    assert [s["messageCount"] for s in listed] == [2]


@ACTIONS
@pytest.mark.parametrize("point", ["secrets.set.before_commit", "secrets.write.after_rename"])
@pytest.mark.parametrize("ref", ["k1", "k-new"])
async def test_failed_secret_write_leaves_the_value_it_found(tmp_path: Path, point: str, action: str,
                                                             ref: str) -> None:
    async with faulted_client(tmp_path, None, client_id=CLIENT, client_kind="ui") as c:
        await c.call("secrets.set", {"ref": "k1", "value": "v1"})
    async with faulted_client(tmp_path, f"{point}:1:{action}", client_id=CLIENT, client_kind="ui") as c:
        params = {"ref": ref, "value": "v2", "submissionId": "sub-1"}
        with pytest.raises(RpcError) as failed:
            await c.call("secrets.set", params)
        assert failed.value.data_code == CODES[action]
        with pytest.raises(RpcError) as missing:
            await c.call("secrets.get", {"ref": "k-new"})
        assert missing.value.data_code == "NOT_FOUND"
        assert (await c.call("secrets.get", {"ref": "k1"}))["value"] == "v1"
        retried = await c.call("secrets.set", params)
        assert await c.call("secrets.set", params) == retried
        now = (await c.call("secrets.get", {"ref": ref}))["value"]
    assert now == "v2"
    assert retried["version"] == SecretStore(tmp_path / "secrets").get(ref).version == (2 if ref == "k1" else 1)


@ACTIONS
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
@pytest.mark.parametrize("method", ["secrets.set", "providers.update"])
async def test_a_key_whose_commit_failed_after_it_took_place_is_kept(tmp_path: Path, method: str, keyed: bool,
                                                                     action: str) -> None:
    """An error once the commit took place (its outcome unknown to the caller): its rows name the new value,
    so the file is not taken back (the retry is answered from the receipt; the value is the one it names)."""
    ref = "provider/p1"
    params: dict[str, Any] = {"ref": ref, "value": "key-new"} if method == "secrets.set" else \
        {"providerId": "p1", "apiKey": "key-new"}
    if keyed:
        params["submissionId"] = "sub-1"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="ui") as c:
            await c.call("providers.create", {"id": "p1", "name": "one", "apiKey": "key-one"})
            await index_caught_up(host)
            host.faults.add("index.after_commit", nth=1, action=action)
            with pytest.raises(RpcError) as failed:
                await c.call(method, params)
            host.faults.clear()
            assert failed.value.data_code == CODES[action]
            assert (await c.call("secrets.get", {"ref": ref}))["value"] == "key-new"
            if keyed:
                retried = await c.call(method, params)
                assert await c.call(method, params) == retried
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="ui") as c:
            assert (await c.call("secrets.get", {"ref": ref}))["value"] == "key-new"
    assert SecretStore(tmp_path / "secrets").get(ref).version == 2  # create, then the one call
