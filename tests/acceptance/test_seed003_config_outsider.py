"""Seed 003 §4.1-§4.5, §4.10, §4.12, §4.13, §8, §9, §10 and acceptance items 8-11 of §11 read by an outsider:
black-box checks over a real host's WebSocket gateway (and, for the model catalog, a real OpenAI-compatible
HTTP server on 127.0.0.1), with nasty-but-legal inputs, exact retries of keyed writes, and a SIGKILL + restart
where the seed makes a durability claim. Each test quotes the statement it checks; the methods are the ones
protocol/README.md documents."""

from __future__ import annotations

import json
import sqlite3
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, open_client
from tests.acceptance.outsiderkit import code_of, real_host
from tests.hostkit import HostProcess, client_for, inprocess_host, msg
from tests.httpkit import FakeProvider, Reply


@asynccontextmanager
async def plugin_of(proc: HostProcess, plugin_id: str) -> AsyncIterator[HostClient]:
    async with open_client(proc.url, proc.token, client_id=f"{plugin_id}-rt", client_kind="plugin",
                           plugin_id=plugin_id) as c:
        yield c


def sqlite_bytes(data: Path) -> bytes:
    """Every byte of the database files (main file, WAL, shared memory)."""
    return b"".join(p.read_bytes() for p in data.iterdir() if p.name.startswith("pi.sqlite") and p.is_file())


def tool(mid: str, name: str, path: str, turn: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"id": mid, "role": "tool", "toolName": name,
                         "blocks": [{"type": "tool_call", "callId": f"c-{mid}", "name": name,
                                     "args": {"path": path}, "status": "ok", "result": "done"}]}
    if turn:
        m["turnId"] = turn
    return m


# ------------------------------------------------------------------- §4.1 kv, plugin uninstall (§11.8)

async def test_uninstall_clears_exactly_its_own_namespace_even_beside_look_alike_ids(tmp_path: Path) -> None:
    """§4.1: "plugin:<id> per-plugin settings; uninstall = DELETE WHERE ns = ?" and §11.8 "Plugin uninstall
    clears kv(plugin:<id>) in one statement". Plugin ids may hold '_' and '.', which are wildcards or
    prefixes to a careless match: uninstalling ``a_b`` must leave ``axb``, ``a_b.c``, ``a_bx`` and ``A_B``
    alone. The exact retry answers what the first call did; a SIGKILL right after it changes nothing;
    the plugin's imported session stays; a re-install starts with an empty namespace."""
    data = tmp_path / "data"
    data.mkdir()
    ids = ["a_b", "axb", "a_b.c", "a_bx", "A_B"]
    with trio.fail_after(60):
        async with real_host(data) as (proc, ui):
            for pid in ids:
                await ui.call("plugins.register", {"pluginId": pid, "name": pid, "version": "1"})
                async with plugin_of(proc, pid) as p:
                    await p.call("settings.update", {"ns": f"plugin:{pid}", "values": {"k1": pid, "k2": [1]}})
            async with plugin_of(proc, "a_b") as p:
                imported = await p.call("plugins.importSession", {"sourceId": "src", "externalId": "e1",
                                                                  "messages": [msg("m1", "kept")]})
            sid = imported["sessionId"]
            out = await ui.call("plugins.uninstall", {"pluginId": "a_b", "submissionId": "un-a_b"})
            assert out["registryEntryRemoved"] is True
            assert sorted(out["settingsRemoved"]) == ["k1", "k2"]
            again = await ui.call("plugins.uninstall", {"pluginId": "a_b", "submissionId": "un-a_b"})
            assert again == out
            proc.kill9()
        async with real_host(data) as (proc, ui):
            assert (await ui.call("settings.getAll", {"ns": "plugin:a_b"})).get("values", {}) in ({}, None)
            for pid in ids[1:]:
                got = await ui.call("settings.get", {"ns": f"plugin:{pid}", "key": "k1"})
                assert got["value"] == pid, pid
            assert sorted(p["id"] for p in (await ui.call("plugins.list", {}))["plugins"]) == sorted(ids[1:])
            view = await ui.call("session.get", {"sessionId": sid})
            assert [m["blocks"] for m in view["messages"]] == [[{"type": "text", "text": "kept"}]]
            await ui.call("plugins.register", {"pluginId": "a_b", "name": "again", "version": "2"})
            assert "value" not in await ui.call("settings.get", {"ns": "plugin:a_b", "key": "k1"})


async def test_uninstall_clears_the_settings_of_a_plugin_that_was_never_registered(tmp_path: Path) -> None:
    """§4.1 "uninstall = DELETE WHERE ns = ?": the namespace goes whatever the registry says (settings a UI
    wrote for a plugin whose registry entry is already gone, or never was)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as ui:
            await ui.call("settings.set", {"ns": "plugin:ghost", "key": "left", "value": {"x": 1}})
            out = await ui.call("plugins.uninstall", {"pluginId": "ghost"})
            assert out["registryEntryRemoved"] is False
            assert out["settingsRemoved"] == ["left"]
            assert "value" not in await ui.call("settings.get", {"ns": "plugin:ghost", "key": "left"})


async def test_app_blob_rules_for_thinking_display_and_prompt_template(tmp_path: Path) -> None:
    """§4.1: "thinkingDisplayMode ... Missing values retain detailed presentation"; "An absent or blank user
    template means the built-in default applies, so clearing the field stores no key rather than an empty
    string. A non-blank user template must contain the draft variable ... host-core rejects a write that
    breaks either rule"."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as ui:
            assert (await ui.call("settings.get", {"key": "thinkingDisplayMode"}))["value"] == "detailed"
            await ui.call("settings.set", {"key": "promptEnhancementUserTemplate", "value": "Fix: {{draft}}"})
            assert await code_of(ui, "settings.set", {"key": "promptEnhancementUserTemplate",
                                                      "value": "no variable"}) == "INVALID_PARAMS"
            blob = (await ui.call("settings.get", {"key": "settings"}))["value"]
            assert blob["promptEnhancementUserTemplate"] == "Fix: {{draft}}"
            await ui.call("settings.set", {"key": "promptEnhancementUserTemplate", "value": "   "})
            blob = (await ui.call("settings.get", {"key": "settings"}))["value"]
            assert "promptEnhancementUserTemplate" not in blob
            assert await code_of(ui, "settings.set", {"key": "thinkingDisplayMode",
                                                      "value": "verbose"}) == "INVALID_PARAMS"


# --------------------------------------------------------------------------- §4.2 projects, §11.9, §11.10

async def test_projects_upsert_by_canonical_path_and_sessions_bind_the_same_row(tmp_path: Path) -> None:
    """§4.2: "Rows are auto-upserted by path whenever a workspace is opened, a session is created with a
    project path" and "Project paths are trimmed, separators are normalized to /, and trailing separators
    are removed before the unique-path upsert". Every spelling below is one project; the Windows drive forms
    are one other."""
    root = tmp_path / "w"
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as ui:
            opened = await ui.call("workspace.open", {"path": f"  {root}/app/  "})
            pid = opened["project"]["id"]
            assert opened["project"]["path"] == f"{root}/app"
            for spelling in (f"{root}/app", f"{root}/app//", f"\t{root}/app\n"):
                again = await ui.call("workspace.open", {"path": spelling})
                assert again["project"]["id"] == pid, spelling
                s = await ui.call("session.create", {"projectPath": spelling})
                assert (s["projectId"], s["projectPath"]) == (pid, f"{root}/app"), spelling
            win = [await ui.call("session.create", {"projectPath": p})
                   for p in ("C:\\src\\app\\", "C:/src/app", "C:\\src/app")]
            assert len({s["projectId"] for s in win}) == 1
            assert {s["projectPath"] for s in win} == {"C:/src/app"}
            projects = (await ui.call("projects.list", {}))["projects"]
            assert sorted(p["path"] for p in projects) == sorted([f"{root}/app", "C:/src/app"])
            by_path = {p["path"]: p for p in projects}
            assert by_path[f"{root}/app"]["sessionCount"] == 3
            assert by_path["C:/src/app"]["sessionCount"] == 3
            assert not root.exists()  # a project row is a logical index entry: no directory is made


async def test_sidebar_reset_changes_no_host_data_and_workspace_get_restores_after_sigkill(tmp_path: Path) -> None:
    """§11.9: "Resetting sidebar preferences changes no projects, sessions, or transcript data; retained paths
    and organization choices survive a normal renderer restart" and §4.1 "The selected workspace remains
    host-owned kv(app, currentProjectId) and is restored through workspace.get". A renderer that keeps its
    preferences in kv(ui) and clears them touches nothing else."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, ui):
            a = (await ui.call("workspace.open", {"path": "/w/a"}))["project"]
            b = (await ui.call("workspace.open", {"path": "/w/b"}))["project"]
            s1 = await ui.call("session.create", {"projectPath": "/w/a", "title": "one"})
            await ui.call("session.appendMessage", {"sessionId": s1["id"], "message": msg("u1", "hello")})
            s2 = await ui.call("session.create", {"projectPath": "/w/b", "title": "two"})
            prefs = {"sessionMeta": {s1["id"]: {"pinned": True}}, "projectMeta": {"/w/a": {"archived": True}},
                     "projectSort": "manual", "sessionView": {"sort": "recent", "archived": False},
                     "openProjectPaths": ["/w/a", "/w/b"]}
            await ui.call("settings.set", {"ns": "ui", "key": "sidebarPreferences", "value": prefs})
            await ui.call("settings.set", {"ns": "ui", "key": "other", "value": 1})
            before_projects = (await ui.call("projects.list", {}))["projects"]
            before_sessions = (await ui.call("session.list", {}))["sessions"]
            before_files = {p.name: p.read_bytes() for p in (data / "sessions").iterdir()}
            await ui.call("settings.delete", {"ns": "ui", "key": "sidebarPreferences"})
            assert (await ui.call("projects.list", {}))["projects"] == before_projects
            assert (await ui.call("session.list", {}))["sessions"] == before_sessions
            assert {p.name: p.read_bytes() for p in (data / "sessions").iterdir()} == before_files
            await ui.call("settings.set", {"ns": "ui", "key": "sidebarPreferences", "value": prefs})
            proc.kill9()
        async with real_host(data) as (proc, ui):
            ws = await ui.call("workspace.get", {})
            assert ws["currentProjectId"] == b["id"] and ws["project"]["path"] == "/w/b"
            assert (await ui.call("settings.get", {"ns": "ui", "key": "sidebarPreferences"}))["value"] == prefs
            assert {p["id"] for p in (await ui.call("projects.list", {}))["projects"]} == {a["id"], b["id"]}
            assert {s["id"] for s in (await ui.call("session.list", {}))["sessions"]} == {s1["id"], s2["id"]}
            assert (await ui.call("workspace.get", {})) == ws  # a read changes nothing


async def test_a_sessions_tool_root_is_its_own_project_across_switches_and_a_sigkill(tmp_path: Path) -> None:
    """§11.10: "A tool call for session A resolves A's persisted project root even after the visible
    workspace switches to project B" and §4.5 "project_id is also the tool-root authority for that session.
    Switching the visible workspace cannot redirect an in-flight or later tool call"."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (proc, c):
            await c.call("workspace.open", {"path": "/proj/a"})
            sa = await c.call("session.create", {"projectPath": "/proj/a"})
            await c.call("workspace.open", {"path": "/proj/b/"})
            r = await c.call("session.resolvePath", {"sessionId": sa["id"], "path": "src/../lib/x.py"})
            assert (r["root"], r["path"], r["insideRoot"]) == ("/proj/a", "/proj/a/lib/x.py", True)
            assert r["projectId"] == sa["projectId"]
            proc.kill9()
        async with real_host(data, kind="agent") as (proc, c):
            assert (await c.call("workspace.get", {}))["project"]["path"] == "/proj/b"
            r = await c.call("session.resolvePath", {"sessionId": sa["id"], "path": "../b/secret"})
            assert (r["root"], r["path"], r["insideRoot"]) == ("/proj/a", "/proj/b/secret", False)
            listed = {s["id"]: s for s in (await c.call("session.list", {}))["sessions"]}
            assert listed[sa["id"]]["projectPath"] == "/proj/a"


# ---------------------------------------------------------------------------- §4.5 sessions, §11.11

LEVELS = ["off", "minimal", "low", "medium", "high", "xhigh", "max", "omit"]


async def test_every_thinking_level_survives_a_sigkill_and_a_stale_retry_does_not_reapply(tmp_path: Path) -> None:
    """§11.11 "A session's thinking level survives restart"; §4.5 "thinking_level is the durable session
    selector. New ... sessions default to off" and "Schema v19 adds omit". A retry of an older keyed
    session.update answers its stored response and does not put the old level back."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            plain = await c.call("session.create", {})
            assert (plain["thinkingLevel"], plain["mode"], plain["permissionMode"]) == ("off", "agent", "inherit")
            assert plain["messageCount"] == 0 and plain["pinned"] is False
            made = {lvl: (await c.call("session.create", {"thinkingLevel": lvl}))["id"] for lvl in LEVELS}
            first = await c.call("session.update", {"sessionId": plain["id"], "thinkingLevel": "high",
                                                    "submissionId": "up-1"})
            await c.call("session.update", {"sessionId": plain["id"], "thinkingLevel": "omit",
                                            "submissionId": "up-2"})
            stale = await c.call("session.update", {"sessionId": plain["id"], "thinkingLevel": "high",
                                                    "submissionId": "up-1"})
            assert stale == first
            assert (await c.call("session.get", {"sessionId": plain["id"]}))["session"]["thinkingLevel"] == "omit"
            assert await code_of(c, "session.update", {"sessionId": plain["id"],
                                                       "thinkingLevel": "extreme"}) == "INVALID_PARAMS"
            proc.kill9()
        async with real_host(data) as (proc, c):
            listed = {s["id"]: s["thinkingLevel"] for s in (await c.call("session.list", {"limit": 50}))["sessions"]}
            assert listed[plain["id"]] == "omit"
            for lvl, sid in made.items():
                assert listed[sid] == lvl
                assert (await c.call("session.get", {"sessionId": sid}))["session"]["thinkingLevel"] == lvl


async def test_list_order_rename_trash_and_restore(tmp_path: Path) -> None:
    """§4.5: idx_sessions_updated (newest activity first); "A manual rename does not update updated_at, so
    changing a label cannot reorder recent activity; transcript rows, message count, and session state remain
    unchanged"; "last_seq is exposed as SessionSummary.messageCount"; "A trashed plugin session is hidden from
    normal session lists ... but its transcript and origin remain"; the trash marker survives a SIGKILL and
    restore brings the session back exactly."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            for i in range(3):
                await c.call("session.create", {"sessionId": f"s{i}", "title": f"t{i}"})
            await trio.sleep(0.01)
            await c.call("session.appendMessage", {"sessionId": "s0", "message": msg("u1", "zebra crossing")})
            order = [x["id"] for x in (await c.call("session.list", {}))["sessions"]]
            assert order[0] == "s0" and set(order) == {"s0", "s1", "s2"}
            before = (await c.call("session.get", {"sessionId": "s1"}))["session"]
            renamed = await c.call("session.rename", {"sessionId": "s1", "title": "  a brand new label  "})
            assert renamed["title"] == "a brand new label"
            assert renamed["updatedAt"] == before["updatedAt"]
            assert [x["id"] for x in (await c.call("session.list", {}))["sessions"]] == order
            assert await code_of(c, "session.rename", {"sessionId": "s1", "title": "   "}) == "INVALID_PARAMS"
            assert await code_of(c, "session.rename", {"sessionId": "s1", "title": "x" * 81}) == "INVALID_PARAMS"
            assert (await c.call("session.rename", {"sessionId": "s1", "title": "é" * 80}))["title"] == "é" * 80
            got = (await c.call("session.get", {"sessionId": "s0"}))["session"]
            assert got["messageCount"] == 1
            trashed = (await c.call("sessions.trash", {"sessionId": "s0"}))["session"]
            assert trashed.get("deletedAt")
            assert "s0" not in [x["id"] for x in (await c.call("session.list", {}))["sessions"]]
            assert (await c.call("search.query", {"query": "zebra"}))["results"] == []
            proc.kill9()
        async with real_host(data) as (proc, c):
            assert "s0" not in [x["id"] for x in (await c.call("session.list", {}))["sessions"]]
            assert [x["id"] for x in (await c.call("sessions.listTrashed", {}))["sessions"]] == ["s0"]
            back = (await c.call("sessions.restore", {"sessionId": "s0"}))["session"]
            assert back.get("deletedAt") is None
            assert back["updatedAt"] == got["updatedAt"] and back["messageCount"] == 1
            assert [x["id"] for x in (await c.call("session.list", {}))["sessions"]][0] == "s0"
            hits = (await c.call("search.query", {"query": "zebra"}))["results"]
            assert [(h["sessionId"], h["messageId"]) for h in hits] == [("s0", "u1")]
            assert (await c.call("session.get", {"sessionId": "s1"}))["session"]["title"] == "é" * 80


async def test_fork_keeps_project_model_mode_thinking_and_permission(tmp_path: Path) -> None:
    """§4.5: "Forking a session copies its current active transcript into a new session row while retaining
    the exact project_id, provider/model, mode, thinking, and permission configuration"."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            src = await c.call("session.create", {"projectPath": "/w/f", "providerId": "p1", "modelId": "m/1",
                                                  "mode": "plan", "thinkingLevel": "xhigh",
                                                  "permissionMode": "accept-edits"})
            await c.call("session.appendMessage", {"sessionId": src["id"], "message": msg("u1", "hi")})
            forked = await c.call("session.fork", {"sessionId": src["id"]})
            child = forked.get("session", forked)
            for key in ("projectId", "projectPath", "providerId", "modelId", "mode", "thinkingLevel",
                        "permissionMode"):
                assert child[key] == src[key], key
            assert child["id"] != src["id"]


# ---------------------------------------------------------------------- §4.3 providers, §4.12, §10

async def test_provider_key_lives_only_in_the_secret_store_and_a_retry_makes_one_row(tmp_path: Path) -> None:
    """§4.3 defaults (vendor_key custom, type/protocol openai_compatible, auth_kind api_key_and_base_url,
    enabled, config '{}'); §4.12 "host-core records file_fallback for every write" and ".machine-key
    (owner-only file mode)"; §10.3 "Secret values never in SQLite; only secrets_meta bookkeeping". The exact
    retry of a keyed create answers the same provider and stores no second row; §9 "new provider/task knob:
    config_json key" survives a SIGKILL."""
    data = tmp_path / "data"
    data.mkdir()
    key = "sk-outsider-" + "7f3a9c" * 6
    params = {"id": "acme", "name": "Acme", "baseUrl": "http://127.0.0.1:9/v1", "apiKey": key,
              "config": {"futureKnob": {"depth": 3}}, "submissionId": "prov-1"}
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            made = (await c.call("providers.create", params))["provider"]
            assert (made["vendorKey"], made["type"], made["protocol"], made["authKind"], made["enabled"]) == (
                "custom", "openai_compatible", "openai_compatible", "api_key_and_base_url", True)
            assert made["hasApiKey"] is True and key not in json.dumps(made)
            assert (await c.call("providers.create", params))["provider"] == made
            metas = (await c.call("secrets.list", {}))["secrets"]
            mine = [m for m in metas if m["ref"] == made["secretRef"]]
            assert len(mine) == 1 and mine[0]["backend"] == "file_fallback"
            assert "value" not in mine[0]
            assert (await c.call("secrets.get", {"ref": made["secretRef"]}))["value"] == key
            proc.kill9()
        assert key.encode() not in sqlite_bytes(data)
        machine_key = data / "secrets" / ".machine-key"
        assert stat.S_IMODE(machine_key.stat().st_mode) & 0o077 == 0
        async with real_host(data) as (proc, c):
            rows = (await c.call("providers.list", {}))["providers"]
            assert [p["id"] for p in rows] == ["acme"]
            assert rows[0]["config"] == {"futureKnob": {"depth": 3}}
            cleared = (await c.call("providers.update", {"providerId": "acme", "apiKey": None}))["provider"]
            assert cleared["hasApiKey"] is False
            assert [m for m in (await c.call("secrets.list", {}))["secrets"] if m["ref"] == made["secretRef"]] == []
            assert await code_of(c, "secrets.get", {"ref": made["secretRef"]}) == "NOT_FOUND"


async def test_secret_values_never_reach_sqlite_and_exports_redact_them_by_default(tmp_path: Path) -> None:
    """§10: "Secret values never in SQLite; only secrets_meta bookkeeping" and "Exported sessions exclude
    secrets by default". A value the store holds that also appears in a transcript (a user pasted it), the
    value of a secret-named key and the host's bearer token are redacted from md, html and jsonl exports
    unless includeSecrets is asked for. (The search index of a message a user typed holds what was typed:
    the SQLite check is made before any transcript holds the value.)"""
    data = tmp_path / "data"
    value = "tok-" + "Zq81Lx" * 5
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("secrets.set", {"ref": "mcp/github", "value": value, "ownerKind": "mcp",
                                         "ownerId": "github", "kind": "token", "submissionId": "sec-1"})
            await c.call("secrets.set", {"ref": "mcp/github", "value": value, "ownerKind": "mcp",
                                         "ownerId": "github", "kind": "token", "submissionId": "sec-1"})
            assert value.encode() not in sqlite_bytes(data)  # before any transcript holds it
            meta = (await c.call("secrets.list", {"ownerKind": "mcp"}))["secrets"]
            assert [(m["ref"], m["ownerKind"], m["ownerId"], m["kind"], m["backend"]) for m in meta] == [
                ("mcp/github", "mcp", "github", "token", "file_fallback")]
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "u1", f"my token is {value} please keep it safe")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "t1", "role": "tool", "toolName": "Bash", "blocks": [{
                    "type": "tool_call", "callId": "c1", "name": "Bash", "status": "ok",
                    "args": {"apiKey": "plain-named-value-991", "cmd": "ls"}, "result": f"bearer {host.token}"}]}})
            for fmt in ("md", "html", "jsonl"):
                out = await c.call("session.export", {"sessionId": sid, "format": fmt})
                assert value not in out["content"], fmt
                assert "plain-named-value-991" not in out["content"], fmt  # a secret-named key's value
                assert host.token not in out["content"], fmt  # the host's own bearer token
                assert out["redactions"] >= 1, fmt
                assert "please keep it safe" in out["content"], fmt
            kept = await c.call("session.export", {"sessionId": sid, "format": "md", "includeSecrets": True})
            assert value in kept["content"]


# ----------------------------------------------------------------------------- §4.4 models catalog

async def test_refresh_keeps_user_rows_flags_and_unflags_dropped_models_and_survives_sigkill(tmp_path: Path) -> None:
    """§4.4: "Refresh upserts discovered rows and never overwrites source='user' rows"; README §8.4: a
    discovered model the provider no longer lists is kept with deprecated: true, the stamp goes to
    kv(cache, modelRefresh:<id>), a failed refresh writes nothing; §9 "new model capability: value in
    capabilities_json"; the models go with their provider (ON DELETE CASCADE)."""
    data = tmp_path / "data"
    data.mkdir()
    with FakeProvider(Reply(api_key="sk-live-123")) as server, trio.fail_after(60):
        async with real_host(data) as (proc, c):
            await c.call("providers.create", {"id": "lp", "name": "Local", "baseUrl": server.base_url,
                                              "apiKey": "sk-live-123"})
            await c.call("models.add", {"providerId": "lp", "modelId": "m-user", "displayName": "Mine",
                                        "capabilities": ["telepathy", "vision"], "contextWindow": 1234})
            server.reply.models = [{"id": "m-user", "object": "model"}, {"id": "m-a"}, {"id": "m-b"}]
            first = await c.call("models.refresh", {"providerId": "lp", "submissionId": "r-1"})
            assert (first["listed"], first["added"], first["userKept"]) == (3, 2, 1)
            assert server.requests[-1] == ("/v1/models", "Bearer sk-live-123")
            stamp = await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:lp"})
            assert "value" in stamp
            server.reply.models = [{"id": "m-a"}]
            second = await c.call("models.refresh", {"providerId": "lp"})
            assert second["deprecated"] == ["m-b"]
            assert await c.call("models.refresh", {"providerId": "lp", "submissionId": "r-1"}) == first
            proc.kill9()
        async with real_host(data) as (proc, c):
            models = {m["modelId"]: m for m in (await c.call("models.list", {"providerId": "lp"}))["models"]}
            assert set(models) == {"m-user", "m-a", "m-b"}
            assert (models["m-user"]["source"], models["m-user"]["displayName"]) == ("user", "Mine")
            assert models["m-user"]["capabilities"] == ["telepathy", "vision"]
            assert models["m-user"]["contextWindow"] == 1234
            assert models["m-b"]["deprecated"] is True and models["m-a"]["deprecated"] is False
            server.reply.models = [{"id": "m-a"}, {"id": "m-b"}]
            await c.call("models.refresh", {"providerId": "lp"})
            models = {m["modelId"]: m for m in (await c.call("models.list", {"providerId": "lp"}))["models"]}
            assert models["m-b"]["deprecated"] is False and models["m-b"]["source"] == "discovered"
            stamp = await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:lp"})
            server.reply.status = 500
            assert await code_of(c, "models.refresh", {"providerId": "lp"}) == "PROVIDER_BAD_REPLY"
            assert await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:lp"}) == stamp
            assert {m["modelId"] for m in (await c.call("models.list", {"providerId": "lp"}))["models"]} == set(models)
            await c.call("providers.delete", {"providerId": "lp"})
            assert await code_of(c, "models.list", {"providerId": "lp"}) in ("NOT_FOUND", None)
            left = (await c.call("models.list", {}))["models"]
            assert [m for m in left if m["providerId"] == "lp"] == []


# --------------------------------------------------------------------------- §4.10 artifacts, §4.13 audit

async def test_artifacts_keep_one_row_per_file_and_the_audit_log_reads_newest_first(tmp_path: Path) -> None:
    """§4.10: "repeat edits update op/updated_at, keeping one row per file per session" (the same file in two
    sessions is two rows) and survive a SIGKILL; §4.13 audit_log "Append-only ... natural order": audit.list
    newest first, since inclusive / until exclusive, by session and kind."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (proc, c):
            a = (await c.call("session.create", {"projectPath": "/w/art"}))["id"]
            b = (await c.call("session.create", {"projectPath": "/w/art"}))["id"]
            await c.call("session.startTurn", {"sessionId": a, "turnId": "t1"})
            await c.call("session.appendMessage", {"sessionId": a, "message": tool("m1", "Write", "/w/art/x.py", "t1")})
            await c.call("session.appendMessage", {"sessionId": a, "message": tool("m2", "Edit", "/w/art/x.py", "t1")})
            await c.call("session.appendMessage", {"sessionId": a, "message": tool("m3", "Write", "y.py", "t1")})
            await c.call("session.appendMessage", {"sessionId": b, "message": tool("n1", "Write", "/w/art/x.py")})
            proc.kill9()
        async with real_host(data, kind="agent") as (proc, c):
            mine = (await c.call("artifacts.list", {"sessionId": a}))["artifacts"]
            assert sorted((x["path"], x["op"]) for x in mine) == [("/w/art/x.py", "edit"), ("/w/art/y.py", "write")]
            assert [x["updatedAt"] for x in mine] == sorted((x["updatedAt"] for x in mine), reverse=True)
            every = (await c.call("artifacts.list", {}))["artifacts"]
            assert sorted((x["sessionId"], x["path"]) for x in every) == sorted(
                [(a, "/w/art/x.py"), (a, "/w/art/y.py"), (b, "/w/art/x.py")])
            log = (await c.call("audit.list", {"kind": "tool_execute"}))["entries"]
            assert len(log) == 4
            keys = [(e["ts"], e["id"]) for e in log]
            assert keys == sorted(keys, reverse=True)
            assert [e["sessionId"] for e in (await c.call("audit.list", {"sessionId": b}))["entries"]] == [b]
            ts = sorted({e["ts"] for e in log})
            for since, until in ((ts[0], ts[-1]), (ts[0], ts[-1] + 1), (ts[-1], ts[-1] + 1)):
                if since == until:
                    continue
                window = (await c.call("audit.list", {"kind": "tool_execute", "since": since,
                                                      "until": until}))["entries"]
                assert [e["id"] for e in window] == [e["id"] for e in log if since <= e["ts"] < until]
            page = await c.call("audit.list", {"limit": 3})
            rest = await c.call("audit.list", {"limit": 3, "cursor": page["nextCursor"]})
            assert [e["id"] for e in page["entries"] + rest["entries"]] == [e["id"] for e in (
                await c.call("audit.list", {}))["entries"]]


# ------------------------------------------------------------------------------------ §8 retention

async def test_boot_prunes_audit_rows_past_the_configured_age_and_task_runs_past_100(tmp_path: Path) -> None:
    """§8: "audit_log: prune rows older than 90 days (configurable) at boot" and "task_runs: keep last 100
    per task (prune with the same boot pass)"; "sessions are never auto-deleted"."""
    data = tmp_path / "data"
    with trio.fail_after(90):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            sid = (await c.call("session.create", {}))["id"]
            for task in ("ta", "tb"):
                await c.call("tasks.create", {"taskId": task, "title": task, "prompt": "do it"})
            for i in range(104):
                await c.call("tasks.startRun", {"taskId": "ta", "runId": f"ra-{i:03d}"})
                await c.call("tasks.finishRun", {"runId": f"ra-{i:03d}", "status": "completed"})
            await c.call("tasks.startRun", {"taskId": "tb", "runId": "rb-0"})
        conn = sqlite3.connect(data / "pi.sqlite")
        try:
            now = conn.execute("SELECT max(updated_at) FROM sessions").fetchone()[0]
            day = 86_400_000
            for age in (100, 40, 10):
                conn.execute("INSERT INTO audit_log (ts, kind, session_id, payload_json) VALUES (?, ?, ?, '{}')",
                             (now - age * day, "tool_execute", sid))
            conn.commit()
        finally:
            conn.close()
        async with inprocess_host(data, audit_retention_days=30) as host, client_for(host, kind="ui") as c:
            status = await c.call("host.status", {})
            assert status["boot"]["retention"]["auditPruned"] == 2
            ages = sorted(e["ts"] for e in (await c.call("audit.list", {"sessionId": sid}))["entries"])
            assert ages == [now - 10 * day]
            runs = (await c.call("tasks.runs", {"taskId": "ta"}))["runs"]
            assert len(runs) == 100 and runs[0]["id"] == "ra-103" and runs[-1]["id"] == "ra-004"
            assert [r["id"] for r in (await c.call("tasks.runs", {"taskId": "tb"}))["runs"]] == ["rb-0"]
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [sid]


# ---------------------------------------------------------------------------- §9 extensibility

async def test_unknown_blocks_meta_line_types_and_namespaces_survive(tmp_path: Path) -> None:
    """§9: "new message content kind: new block type in the transcript file", "new per-response metadata:
    meta key in the message line", "new transcript line kind: new JSONL type (readers skip unknown)", "new
    config domain: kv namespace" — none needs a migration, and each survives a SIGKILL + restart. A line of a
    kind this host does not know is skipped by readers and never lost from the file."""
    data = tmp_path / "data"
    data.mkdir()
    cite = {"type": "citation", "url": "https://example.org/x", "span": [3, 9], "nested": {"k": [1, None]}}
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "a1", "answer with quasar", role="assistant",
                blocks=[{"type": "text", "text": "answer with quasar"}, cite],
                meta={"futureMeta": {"score": 0.5}, "modelId": "m"})})
            await c.call("settings.set", {"ns": "mcpServers", "key": "github", "value": {"cmd": ["gh", "mcp"]}})
            proc.kill9()
        path = data / "sessions" / f"{sid}.jsonl"
        future = {"type": "voice_note", "id": "vn1", "createdAt": "2026-01-01T00:00:00.000Z", "audio": "abc"}
        with path.open("a") as f:
            f.write(json.dumps(future) + "\n")
        async with real_host(data) as (proc, c):
            view = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in view["messages"]] == ["a1"]
            a1 = view["messages"][0]
            assert a1["blocks"][1] == cite
            assert a1["meta"]["futureMeta"] == {"score": 0.5}
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u2", "after the note")})
            await c.call("session.rename", {"sessionId": sid, "title": "renamed"})
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == ["a1", "u2"]
            hits = (await c.call("search.query", {"query": "quasar"}))["results"]
            assert [h["messageId"] for h in hits] == ["a1"]
            assert (await c.call("settings.get", {"ns": "mcpServers", "key": "github"}))["value"] == {
                "cmd": ["gh", "mcp"]}
            proc.kill9()
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        assert future in lines
        async with real_host(data) as (proc, c):
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})  # a whole-file rewrite
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == ["a1"]
        # whatever the rewrite does with a line it cannot place, its bytes are not lost from the data directory
        kept = [p for p in (data / "sessions").iterdir() if p.name.startswith(sid)]
        assert any(json.dumps(future).encode() in p.read_bytes() or b'"voice_note"' in p.read_bytes() for p in kept)


async def test_an_emptied_session_counts_zero_messages_across_a_sigkill(tmp_path: Path) -> None:
    """§4.5: "last_seq is exposed as SessionSummary.messageCount. Appends allocate the next ordinal and full
    transcript rewrites reseat it to the current message count, so zero is the durable empty-session
    predicate"; a later append gets the next ordinal again."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"u{i}", f"m{i}")})
            cut = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u0",
                                                        "submissionId": "cut-1"})
            assert cut["session"]["messageCount"] == 0
            proc.kill9()
        async with real_host(data) as (proc, c):
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["messageCount"] == 0
            listed = {x["id"]: x for x in (await c.call("session.list", {}))["sessions"]}
            assert listed[sid]["messageCount"] == 0
            again = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u0",
                                                          "submissionId": "cut-1"})
            assert again == cut
            appended = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u9", "fresh")})
            assert appended["message"]["seq"] == 1
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["messageCount"] == 1


async def test_a_user_takeover_of_a_discovered_model_is_never_overwritten_and_only_user_rows_are_removable(
        tmp_path: Path) -> None:
    """§4.4: "Refresh ... upserts discovered rows and never overwrites source='user' rows"; README: models.add
    adds "(or take[s] over)" a model as source=user, models.remove removes a user model (discovered ones are
    managed by models.refresh)."""
    with FakeProvider(Reply(models=[{"id": "d1"}, {"id": "d2"}])) as server, trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            await c.call("providers.create", {"id": "p", "name": "P", "baseUrl": server.base_url})
            await c.call("models.refresh", {"providerId": "p"})
            await c.call("models.add", {"providerId": "p", "modelId": "d1", "displayName": "Taken over"})
            server.reply.models = [{"id": "d1", "context_window": 9}, {"id": "d2"}]
            out = await c.call("models.refresh", {"providerId": "p"})
            assert out["userKept"] == 1
            models = {m["modelId"]: m for m in (await c.call("models.list", {"providerId": "p"}))["models"]}
            assert (models["d1"]["source"], models["d1"]["displayName"]) == ("user", "Taken over")
            assert models["d2"]["source"] == "discovered"
            assert await code_of(c, "models.remove", {"providerId": "p", "modelId": "d2"}) is not None
            assert (await c.call("models.remove", {"providerId": "p", "modelId": "d1"}))["deleted"] is True
            assert {m["modelId"] for m in (await c.call("models.list", {"providerId": "p"}))["models"]} == {"d2"}


async def test_a_trashed_plugin_session_is_hidden_from_its_plugin_and_core_delete_cascades_the_origin(
        tmp_path: Path) -> None:
    """§4.5: "A trashed plugin session is hidden from normal session lists and plugin reads, but its transcript
    and origin remain until the owning plugin purges it. Core session deletion cascades the sidecar; purging
    also removes transcript files." With the origin gone, the same (pluginId, sourceId, externalId) imports a
    new session."""
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui, \
                client_for(host, "acme-rt", kind="plugin:acme") as p:
            await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1"})
            key = {"sourceId": "src", "externalId": "e1", "messages": [msg("m1", "findme please")]}
            first = await p.call("plugins.importSession", key)
            sid = first["sessionId"]
            await ui.call("sessions.trash", {"sessionId": sid})
            assert await code_of(p, "session.get", {"sessionId": sid}) is not None
            assert (await p.call("plugins.listSessions", {}))["sessions"] == []
            assert [x["id"] for x in (await p.call("sessions.listTrashed", {}))["sessions"]] == [sid]
            again = await p.call("plugins.importSession", key)
            assert (again["sessionId"], again["created"]) == (sid, False)  # the origin remains in the trash
            assert (data / "sessions" / f"{sid}.jsonl").exists()
            await ui.call("sessions.restore", {"sessionId": sid})
            await ui.call("session.delete", {"sessionId": sid})
            assert not (data / "sessions" / f"{sid}.jsonl").exists()
            fresh = await p.call("plugins.importSession", key)
            assert fresh["created"] is True and fresh["sessionId"] != sid
            await p.call("sessions.trash", {"sessionId": fresh["sessionId"]})
            await p.call("sessions.purge", {"sessionId": fresh["sessionId"]})
            assert not (data / "sessions" / f"{fresh['sessionId']}.jsonl").exists()
            assert (await ui.call("sessions.listTrashed", {}))["sessions"] == []
