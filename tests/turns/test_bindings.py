"""Run environment binding (seed 000 §4): recovery rejects drift, a rotated secret still passes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from store import bindings
from store.bindings import EnvironmentDrift
from store.snapshots import prepare_snapshot, store_snapshot
from tests.dbkit import NOW, conn  # noqa: F401 - the conn fixture
from tests.hostkit import client_for, inprocess_host
from tests.turns.turnkit import end, rpc_error, start


def _env(**extra: Any) -> dict[str, Any]:
    return {"version": 1, "connection": {"providerId": "anthropic", "baseUrl": "https://api.example/v1",
                                         "protocol": "anthropic", "credentialRef": "prov-key"},
            "executionBindings": {"modelId": "sonnet", "permissionMode": "ask"},
            "credentialRefs": ["prov-key"], **extra}


def _setup(c: sqlite3.Connection, env: dict[str, Any]) -> None:
    c.execute("INSERT INTO sessions(id, provider_id, model_id, permission_mode, created_at, updated_at) "
              "VALUES ('s1', 'anthropic', 'sonnet', 'ask', 1, 1)")
    c.execute("INSERT INTO providers(id, name, protocol, base_url, secret_ref, created_at, updated_at) "
              "VALUES ('anthropic', 'A', 'anthropic', 'https://api.example/v1', 'prov-key', 1, 1)")
    c.execute("INSERT INTO secrets_meta(secret_ref, backend, updated_at) VALUES ('prov-key', 'file', 1)")
    c.execute("INSERT INTO turns(id, session_id, started_at) VALUES ('t1', 's1', 1)")
    store_snapshot(c, "t1", prepare_snapshot(env), NOW)


def test_an_unchanged_world_passes_and_every_binding_change_is_drift(conn: sqlite3.Connection) -> None:  # noqa: F811
    _setup(conn, _env())
    assert bindings.verify(conn, "s1", "t1")["turnId"] == "t1"
    conn.execute("UPDATE secrets_meta SET updated_at = 99")  # the value rotated behind the same reference
    bindings.verify(conn, "s1", "t1")
    for change, field in (
        ("UPDATE providers SET base_url = 'https://elsewhere/v1'", "connection.baseUrl"),
        ("UPDATE providers SET secret_ref = 'other-key'", "connection.credentialRef"),
        ("UPDATE sessions SET model_id = 'opus'", "executionBindings.modelId"),
        ("UPDATE sessions SET permission_mode = 'auto'", "executionBindings.permissionMode"),
        ("DELETE FROM secrets_meta", "credentialRefs[0]"),
        ("DELETE FROM providers", "connection.providerId"),
    ):
        conn.execute("SAVEPOINT s")
        conn.execute(change)
        with pytest.raises(EnvironmentDrift) as info:
            bindings.verify(conn, "s1", "t1")
        assert [d["field"] for d in info.value.data["drift"]] == [field], change
        assert info.value.code == "ENVIRONMENT_DRIFT"
        conn.execute("ROLLBACK TO s")
        conn.execute("RELEASE s")


async def test_recovery_check_on_a_host(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {"version": 1, "executionBindings": {"projectPath": str(ws) + "/", "modelId": "sonnet"},
           "credentialRefs": ["prov-key"]}
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {"title": "b", "projectPath": str(ws),
                                                       "modelId": "sonnet"}))["id"])
            await c.call("secrets.set", {"ref": "prov-key", "value": "sk-one"})
            await start(c, sid, "t1", environment=env)
            ok = await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            assert len(ok["digest"]) == 64 and ok["version"] == 1
            await c.call("secrets.set", {"ref": "prov-key", "value": "sk-two"})  # rotated: still binds
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            await c.call("session.update", {"sessionId": sid, "modelId": "opus"})
            err = await rpc_error(c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"}))
            assert err.data_code == "ENVIRONMENT_DRIFT"
            assert err.data["drift"] == [{"field": "executionBindings.modelId", "snapshot": "sonnet",
                                          "current": "opus"}]
            await c.call("session.update", {"sessionId": sid, "modelId": "sonnet"})
            await c.call("secrets.delete", {"ref": "prov-key"})
            err = await rpc_error(c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"}))
            assert [d["field"] for d in err.data["drift"]] == ["credentialRefs[0]"]
            await end(c, sid, "t1")  # one running turn per session
            await start(c, sid, "t2")
            err = await rpc_error(c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t2"}))
            assert err.data_code == "NOT_FOUND"  # no snapshot to recover from
            # the provider's connection, through providers.*
            await c.call("providers.create", {"id": "openrouter", "name": "OpenRouter",
                                              "baseUrl": "https://openrouter.ai/api/v1"})
            await end(c, sid, "t2")
            await start(c, sid, "t3", environment={"version": 1, "connection": {
                "providerId": "openrouter", "baseUrl": "https://openrouter.ai/api/v1"}})
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t3"})
            await c.call("providers.update", {"providerId": "openrouter", "baseUrl": "https://proxy.example/v1"})
            err = await rpc_error(c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t3"}))
            assert [d["field"] for d in err.data["drift"]] == ["connection.baseUrl"]


async def test_a_connection_that_names_no_provider_binds_to_the_turns_provider(tmp_path: Path) -> None:
    """README §10 "Usage and recovery": verifyEnvironment checks "the same provider connection (base URL,
    protocol, credential reference)". The reference sidecar (``pihost_client.agent_providers``) and the
    README's own ``session.startTurn`` example name the provider on the turn (``providerId``) and leave it out
    of ``connection`` ({baseUrl, type, protocol, apiStyle, credentialRef}). Such a connection was compared with
    nothing: the provider's base URL moved or its protocol changed, and the snapshot still verified. It binds to
    the turn's provider now (while the host holds it); a rotated key still passes."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c:
            provider = (await c.call("providers.create", {
                "id": "lab", "name": "Lab", "baseUrl": "https://lab.example/v1", "apiKey": "sk-lab-one"}))["provider"]
            sid = str((await c.call("session.create", {"title": "b", "providerId": "lab", "modelId": "m"}))["id"])
            connection = {"baseUrl": provider["baseUrl"], "type": provider["type"], "protocol": provider["protocol"],
                          "credentialRef": provider["secretRef"]}
            await start(c, sid, "t1", providerId="lab", modelId="m", environment={
                "version": 1, "connection": connection, "credentialRefs": [provider["secretRef"]]})
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            await c.call("providers.update", {"providerId": "lab", "apiKey": "sk-lab-two"})  # rotated: binds
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            await c.call("providers.update", {"providerId": "lab", "baseUrl": "https://proxy.example/v1"})
            err = await rpc_error(c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"}))
            assert err.data_code == "ENVIRONMENT_DRIFT"
            assert err.data["drift"] == [{"field": "connection.baseUrl", "snapshot": "https://lab.example/v1",
                                          "current": "https://proxy.example/v1"}]
            await c.call("providers.update", {"providerId": "lab", "baseUrl": "https://lab.example/v1",
                                              "protocol": "anthropic"})
            err = await rpc_error(c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"}))
            assert [d["field"] for d in err.data["drift"]] == ["connection.protocol"]
            await end(c, sid, "t1")
            # a connection that names its provider binds to that one, whatever the turn says
            await c.call("providers.create", {"id": "other", "name": "Other", "baseUrl": "https://other.example/v1"})
            await start(c, sid, "t2", providerId="lab", environment={
                "version": 1, "connection": {"providerId": "other", "baseUrl": "https://other.example/v1"}})
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t2"})
            await end(c, sid, "t2")
            # the turn's providerId is a loose reference: one the host does not hold binds nothing
            await start(c, sid, "t3", providerId="anthropic", environment={
                "version": 1, "connection": {"baseUrl": "https://api.anthropic.com", "apiStyle": "messages"}})
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t3"})
