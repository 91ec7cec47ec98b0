"""Plugin identity and scope (ARCHITECTURE "Who is calling"; seed 003 §4.1, §4.3, §4.5, §11.8)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, RpcError, open_client
from store import plugins as plugin_store
from tests.dbkit import NOW, tx
from tests.dbkit import rows as _rows
from tests.hostkit import client_for, inprocess_host, msg
from tests.pipeline import probe


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


def _import_origin(root: Path, plugin_id: str, session_id: str) -> None:
    """What an import by that plugin records (issue 15 writes these rows; the host is stopped here)."""
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        conn.execute("INSERT INTO session_import_origins(plugin_id, source_id, external_id, session_id, created_at) "
                     "VALUES (?, 'src', ?, ?, ?)", (plugin_id, session_id, session_id, NOW))
        conn.commit()
    finally:
        conn.close()


async def test_two_plugins_are_each_denied_the_others_kv_providers_and_sessions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui:
            sessions = {}
            for pid in ("acme", "beta"):
                sid = str((await ui.call("session.create", {"title": f"imported by {pid}"}))["id"])
                await ui.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", f"from {pid}")})
                sessions[pid] = sid
            await ui.call("providers.create", {"id": "user-row", "name": "Mine"})
        for pid, sid in sessions.items():
            _import_origin(data, pid, sid)
        async with inprocess_host(data) as host, client_for(host, "acme-rt", kind="plugin:acme") as acme, \
                client_for(host, "beta-rt", kind="plugin:beta") as beta, client_for(host, kind="ui") as ui:
            plugins = {"acme": acme, "beta": beta}
            for pid, c in plugins.items():
                await c.call("settings.set", {"ns": f"plugin:{pid}", "key": "token.ref", "value": f"{pid}-value"})
                synced = await c.call("providers.sync", {"providers": [{"id": f"{pid}-gw", "name": pid}]})
                assert [p["ownerPluginId"] for p in synced["providers"]] == [pid]
            for pid, c in plugins.items():
                other = "beta" if pid == "acme" else "acme"
                state = probe.state(data)
                own = await c.call("settings.get", {"ns": f"plugin:{pid}", "key": "token.ref"})
                assert own["value"] == f"{pid}-value"
                assert (await c.call("settings.getAll", {"ns": f"plugin:{pid}"}))["values"] == {
                    "token.ref": f"{pid}-value"}
                for call in (
                    c.call("settings.get", {"ns": f"plugin:{other}", "key": "token.ref"}),
                    c.call("settings.getAll", {"ns": f"plugin:{other}"}),
                    c.call("settings.set", {"ns": f"plugin:{other}", "key": "token.ref", "value": "stolen"}),
                    c.call("settings.delete", {"ns": f"plugin:{other}", "key": "token.ref"}),
                    c.call("settings.get", {"key": "largePasteThreshold"}),  # not its namespace either
                    c.call("providers.get", {"providerId": f"{other}-gw"}),
                    c.call("providers.get", {"providerId": "user-row"}),
                    c.call("providers.sync", {"providers": [{"id": f"{other}-gw", "name": "taken"}]}),
                    c.call("providers.sync", {"providers": [{"id": "user-row", "name": "taken"}]}),
                    c.call("providers.delete", {"providerId": f"{other}-gw"}),
                    c.call("models.list", {"providerId": f"{other}-gw"}),
                    c.call("session.get", {"sessionId": sessions[other]}),
                    c.call("session.appendMessage", {"sessionId": sessions[other], "message": msg("x", "x")}),
                    c.call("plugins.uninstall", {"pluginId": other}),
                ):
                    assert (await _err(call)).data_code == "PERMISSION_DENIED"
                assert probe.state(data) == state, f"plugin {pid} changed another's data"
                assert [p["id"] for p in (await c.call("providers.list", {}))["providers"]] == [f"{pid}-gw"]
                assert (await c.call("providers.get", {"providerId": f"{pid}-gw"}))["provider"]["name"] == pid
                assert (await c.call("models.list", {}))["models"] == []
                # session.list is scoped (issue 15): only the plugin's own imported sessions
                assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [sessions[pid]]
                mine = await c.call("session.get", {"sessionId": sessions[pid]})  # its own imported session
                assert [m["blocks"][0]["text"] for m in mine["messages"]] == [f"from {pid}"]
            # the user path sees everything, and may not change a plugin's row
            assert {p["id"] for p in (await ui.call("providers.list", {}))["providers"]} == {
                "user-row", "acme-gw", "beta-gw"}
            assert (await ui.call("settings.get", {"ns": "plugin:acme", "key": "token.ref"}))["value"] == "acme-value"
            state = probe.state(data)
            for call in (ui.call("providers.update", {"providerId": "acme-gw", "name": "edited"}),
                         ui.call("providers.delete", {"providerId": "beta-gw"}),
                         ui.call("providers.sync", {"providers": []})):
                assert (await _err(call)).data_code == "PERMISSION_DENIED"
            assert probe.state(data) == state
            # a plugin's sync removes the rows it no longer declares
            assert (await acme.call("providers.sync", {"providers": []}))["removed"] == ["acme-gw"]


async def test_session_scope_rule_for_imported_sessions(conn: sqlite3.Connection) -> None:
    """``require_owner`` + ``session_owner``: the check issue 15's session routes apply."""
    from actors.gateway_types import CallContext
    from runtime.handlers.plugins import require_owner
    from store.errors import PermissionDenied
    from tests.dbkit import add_session

    add_session(conn, "s-acme")
    add_session(conn, "s-user")
    conn.execute("INSERT INTO session_import_origins(plugin_id, source_id, external_id, session_id, created_at) "
                 "VALUES ('acme', 'src', 'x', 's-acme', ?)", (NOW,))
    acme = CallContext(connection_id=1, client_id="a", client_kind="plugin", protocol=1, plugin_id="acme")
    beta = CallContext(connection_id=2, client_id="b", client_kind="plugin", protocol=1, plugin_id="beta")
    ui = CallContext(connection_id=3, client_id="u", client_kind="ui", protocol=1)
    require_owner(acme, plugin_store.session_owner(conn, "s-acme"), what="session s-acme")
    require_owner(ui, plugin_store.session_owner(conn, "s-acme"), what="session s-acme")
    for caller, sid in ((beta, "s-acme"), (acme, "s-user")):
        with pytest.raises(PermissionDenied):
            require_owner(caller, plugin_store.session_owner(conn, sid), what=f"session {sid}")
    with pytest.raises(PermissionDenied):
        require_owner(ui, "acme", what="provider x", user_may_change=False)


async def test_uninstall_clears_the_namespace_and_releases_the_providers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui:
            for pid in ("acme", "beta"):
                await ui.call("plugins.register", {"pluginId": pid, "name": pid.title(), "version": "1.0"})
            async with client_for(host, "acme-rt", kind="plugin:acme") as acme:
                await acme.call("settings.update", {"ns": "plugin:acme", "values": {"a": 1, "b": [2], "c": {}}})
                await acme.call("providers.sync", {"providers": [{"id": "acme-gw", "name": "Acme"},
                                                                 {"id": "acme-2", "name": "Acme 2"}]})
            await ui.call("settings.set", {"ns": "plugin:beta", "key": "keep", "value": True})
            out = await ui.call("plugins.uninstall", {"pluginId": "acme", "submissionId": "un-1"})
            assert out == {"pluginId": "acme", "registryEntryRemoved": True, "settingsRemoved": ["a", "b", "c"],
                           "providersReleased": ["acme-2", "acme-gw"]}
            assert _rows(data, "SELECT COUNT(*) FROM kv WHERE ns = 'plugin:acme'") == [(0,)]
            assert _rows(data, "SELECT COUNT(*) FROM providers WHERE owner_plugin_id = 'acme'") == [(0,)]
            assert _rows(data, "SELECT ns, key FROM kv WHERE ns LIKE 'plugin:%'") == [("plugin:beta", "keep")]
            released = (await ui.call("providers.get", {"providerId": "acme-gw"}))["provider"]
            assert "ownerPluginId" not in released  # the user's row now: editable on the user path
            await ui.call("providers.update", {"providerId": "acme-gw", "name": "Mine now"})
            assert [p["id"] for p in (await ui.call("plugins.list", {}))["plugins"]] == ["beta"]
            registry = json.loads((data / "plugins" / "registry.json").read_text())
            assert set(registry["plugins"]) == {"beta"}
            assert not [p for p in (data / "plugins").iterdir() if ".tmp." in p.name]
            again = await ui.call("plugins.uninstall", {"pluginId": "acme"})  # idempotent
            assert again == {"pluginId": "acme", "registryEntryRemoved": False, "settingsRemoved": [],
                             "providersReleased": []}


def test_seed_11_8_uninstall_clears_the_plugin_namespace_in_one_statement(conn: sqlite3.Connection) -> None:
    for key in ("a", "b", "c"):
        conn.execute("INSERT INTO kv VALUES ('plugin:acme', ?, '1', ?)", (key, NOW))
    conn.execute("INSERT INTO kv VALUES ('plugin:acme2', 'a', '1', ?)", (NOW,))
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    out = tx(conn)(lambda c: plugin_store.forget_plugin(c, "acme"))
    conn.set_trace_callback(None)
    deletes = [s for s in statements if s.lstrip().upper().startswith("DELETE FROM KV")]
    assert deletes == ["DELETE FROM kv WHERE ns = 'plugin:acme'"]
    assert out["settingsRemoved"] == ["a", "b", "c"]
    assert conn.execute("SELECT ns FROM kv").fetchall() == [("plugin:acme2",)]


async def test_registry_is_replaced_whole_and_a_corrupt_one_is_never_overwritten(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui:
            first = (await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1"}))
            path = data / "plugins" / "registry.json"
            doc = json.loads(path.read_text())
            doc["plugins"]["acme"]["electronOnly"] = {"kept": True}
            doc["schemaNote"] = "unknown keys survive"
            path.write_text(json.dumps(doc))
            again = await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "2"})
            assert again["plugin"]["installedAt"] == first["plugin"]["installedAt"]
            doc = json.loads(path.read_text())
            assert doc["plugins"]["acme"]["electronOnly"] == {"kept": True} and doc["schemaNote"]
            assert (await ui.call("plugins.setEnabled", {"pluginId": "acme", "enabled": False}))["plugin"][
                "enabled"] is False
            assert (await _err(ui.call("plugins.setEnabled", {"pluginId": "none", "enabled": True}))).data_code \
                == "NOT_FOUND"
            path.write_bytes(b'{"plugins": {"acme": ')
            for call in (ui.call("plugins.list", {}),
                         ui.call("plugins.register", {"pluginId": "beta", "name": "B", "version": "1"}),
                         ui.call("plugins.uninstall", {"pluginId": "acme"})):
                assert (await _err(call)).data_code == "CORRUPT_DATA"
            assert path.read_bytes() == b'{"plugins": {"acme": '


async def test_hello_requires_a_plugin_id_with_the_plugin_kind_only(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host:
            for kind, plugin_id in (("plugin", None), ("ui", "acme"), ("plugin", "../etc"), ("plugin", "a:b")):
                with pytest.raises((RpcError, ClientClosed)):
                    async with open_client(host.url, host.token, client_id="x", client_kind=kind,
                                           plugin_id=plugin_id):
                        pass
            async with open_client(host.url, host.token, client_id="x", client_kind="plugin",
                                   plugin_id="acme.tools_2") as c:
                assert (await c.call("settings.getAll", {"ns": "plugin:acme.tools_2"}))["values"] == {}


def test_the_routes_open_to_plugins_are_exactly_these() -> None:
    """Opening a route to plugins is deliberate: its handler must scope them with require_owner."""
    from runtime.routes import ROUTES

    assert {name for name, route in ROUTES.items() if route.plugins} == {
        "settings.get", "settings.getAll", "settings.set", "settings.update", "settings.delete",
        "providers.list", "providers.get", "providers.sync", "models.list", "session.get",
        "plugins.listAssets", "plugins.getAsset",  # its own installed assets (seed 000 §2)
        # issue 15: a plugin's imported sessions (each handler scopes by the owner)
        "plugins.importSession", "plugins.listSessions", "session.list", "session.export",
        "sessions.trash", "sessions.restore", "sessions.purge", "sessions.listTrashed"}
