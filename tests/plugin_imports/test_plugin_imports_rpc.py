"""Plugin imports and the trash over the wire (seed 003 §4.5, acceptance §11.20), two plugins and the UI."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import client_for, inprocess_host, msg


def db_rows(root: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def session_files(root: Path, sid: str) -> list[str]:
    return sorted(p.name for p in (root / "sessions").iterdir() if p.name.startswith(sid))


async def denied(c: HostClient, method: str, params: dict[str, Any], code: str = "PERMISSION_DENIED") -> None:
    with pytest.raises(RpcError) as err:
        await c.call(method, params)
    assert err.value.data_code == code, (method, err.value)


IMPORT = {"sourceId": "chatlog", "externalId": "conv-81", "title": "Parser ideas",
          "history": {"projectPath": "/elsewhere/parser", "modelId": "gpt-x", "providerId": "openai"},
          "messages": [msg("u1", "how do I split the lexer ostrich"),
                       msg("a1", "move it to lexer.py", role="assistant")]}


async def test_seed_11_20_plugin_imports_over_rpc(tmp_path: Path) -> None:
    """§11.20: host-generated ids, one origin row per session, (pluginId, source, externalId) idempotency,
    no project or model binding unless an explicit host-created projectId, ownership-scoped reads and
    mutations, recoverable trash before purge."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, \
                client_for(host, "p1", kind="plugin", plugin_id="alpha") as alpha, \
                client_for(host, "p2", kind="plugin", plugin_id="beta") as beta, \
                client_for(host, "ui", kind="ui") as ui:
            first = await alpha.call("plugins.importSession", IMPORT)
            sid = first["sessionId"]
            assert first == {"sessionId": sid, "created": True, "messageCount": 2}
            assert sid.startswith("pl-") and sid not in (IMPORT["externalId"], "conv-81")  # host-generated
            again = await alpha.call("plugins.importSession", {**IMPORT, "title": "other title"})
            assert again == {"sessionId": sid, "created": False, "messageCount": 2}  # idempotent, nothing written
            other_plugin = await beta.call("plugins.importSession", IMPORT)  # the key includes the plugin
            assert other_plugin["created"] and other_plugin["sessionId"] != sid
            assert db_rows(root, "SELECT plugin_id, source_id, external_id FROM session_import_origins "
                           "ORDER BY plugin_id") == [("alpha", "chatlog", "conv-81"), ("beta", "chatlog", "conv-81")]
            # no project / model binding: the history stays in the origin row
            row = db_rows(root, "SELECT project_id, model_id, provider_id, source FROM sessions WHERE id = ?", sid)
            assert row == [(None, None, None, "chatlog")]
            assert db_rows(root, "SELECT COUNT(*) FROM projects") == [(0,)]
            listed = (await alpha.call("plugins.listSessions", {}))["sessions"]
            assert [s["id"] for s in listed] == [sid]
            assert listed[0]["origin"]["history"]["projectPath"] == "/elsewhere/parser"
            assert listed[0]["origin"]["history"]["modelId"] == "gpt-x"
            # only an explicit host-created project binds
            ws = tmp_path / "ws"
            ws.mkdir()
            made = await ui.call("session.create", {"title": "x", "projectPath": str(ws)})
            project_id = made["projectId"]
            bound = await alpha.call("plugins.importSession", {**IMPORT, "externalId": "conv-82",
                                                               "projectId": project_id})
            assert db_rows(root, "SELECT project_id FROM sessions WHERE id = ?", bound["sessionId"]) == [
                (project_id,)]
            await denied(alpha, "plugins.importSession", {**IMPORT, "externalId": "conv-83", "projectId": 999},
                         "NOT_FOUND")
            # reads and mutations are scoped to the owner
            page = await alpha.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in page["messages"]] == [f"{sid}:u1", f"{sid}:a1"]
            await denied(beta, "session.get", {"sessionId": sid})
            await denied(beta, "sessions.trash", {"sessionId": sid})
            await denied(alpha, "session.get", {"sessionId": made["id"]})  # the UI's own session
            await denied(alpha, "search.sessions", {"query": "lexer"})
            await denied(ui, "plugins.importSession", IMPORT)  # only plugins import as plugins
            assert [s["id"] for s in (await beta.call("session.list", {}))["sessions"]] == [
                other_plugin["sessionId"]]
            # trash: hidden from lists, plugin reads and search; the files and origin remain
            trashed = await alpha.call("sessions.trash", {"sessionId": sid})
            assert trashed["session"]["deletedAt"] is not None
            assert sid not in [s["id"] for s in (await ui.call("session.list", {}))["sessions"]]
            assert sid not in [s["id"] for s in (await alpha.call("plugins.listSessions", {}))["sessions"]]
            assert (await ui.call("search.sessions", {"query": "ostrich"}))["results"] != []  # beta's copy
            hits = {r["sessionId"] for r in (await ui.call("search.sessions", {"query": "ostrich"}))["results"]}
            assert sid not in hits
            await denied(alpha, "session.get", {"sessionId": sid}, "SESSION_NOT_FOUND")
            assert session_files(root, sid) == [f"{sid}.jsonl"]
            assert db_rows(root, "SELECT COUNT(*) FROM session_import_origins WHERE session_id = ?", sid) == [(1,)]
            in_trash = (await alpha.call("sessions.listTrashed", {}))["sessions"]
            assert [s["id"] for s in in_trash] == [sid]
            assert (await beta.call("sessions.listTrashed", {}))["sessions"] == []
            # restore brings it back exactly
            restored = await alpha.call("sessions.restore", {"sessionId": sid})
            assert restored["session"]["deletedAt"] is None
            hits = {r["sessionId"] for r in (await ui.call("search.sessions", {"query": "ostrich"}))["results"]}
            assert sid in hits
            # purge only from the trash, only by the owner; it removes rows, origin and files
            await denied(alpha, "sessions.purge", {"sessionId": sid}, "CONFLICT")
            await alpha.call("sessions.trash", {"sessionId": sid})
            await denied(beta, "sessions.purge", {"sessionId": sid})
            assert await alpha.call("sessions.purge", {"sessionId": sid}) == {"sessionId": sid, "purged": True}
            assert session_files(root, sid) == []
            assert db_rows(root, "SELECT COUNT(*) FROM sessions WHERE id = ?", sid) == [(0,)]
            assert db_rows(root, "SELECT COUNT(*) FROM session_import_origins WHERE session_id = ?", sid) == [(0,)]
            assert db_rows(root, "SELECT COUNT(*) FROM messages WHERE session_id = ?", sid) == [(0,)]


async def test_a_plugin_must_say_who_it_is() -> None:
    from pydantic import ValidationError

    from protocol.models_host import HelloParams

    base = {"token": "t", "clientId": "c", "protocol": 1}
    with pytest.raises(ValidationError):
        HelloParams.model_validate({**base, "clientKind": "plugin"})
    with pytest.raises(ValidationError):
        HelloParams.model_validate({**base, "clientKind": "ui", "pluginId": "alpha"})
    with pytest.raises(ValidationError):
        HelloParams.model_validate({**base, "clientKind": "plugin", "pluginId": "../x"})
    assert HelloParams.model_validate({**base, "clientKind": "plugin", "pluginId": "alpha"}).plugin_id == "alpha"


async def test_two_plugin_imports_of_one_key_at_once_make_one_session(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host:
            answers: list[Any] = []

            async def one(i: int) -> None:
                async with client_for(host, f"c{i}", kind="plugin", plugin_id="alpha") as c:
                    answers.append(await c.call("plugins.importSession", IMPORT))

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, i)
            assert len({a["sessionId"] for a in answers}) == 1
            assert sum(a["created"] for a in answers) == 1
            sid = answers[0]["sessionId"]
            assert [p.name for p in (root / "sessions").glob("*.jsonl")] == [f"{sid}.jsonl"]  # losers cleaned up
            assert db_rows(root, "SELECT COUNT(*) FROM sessions") == [(1,)]


async def test_two_plugins_sharing_a_client_id_never_share_receipts(tmp_path: Path) -> None:
    """Receipts are keyed by clientId + submissionId; a plugin connection's are scoped by its pluginId.
    Beta, with alpha's clientId and submissionId, was answered alpha's import from alpha's receipt:
    it learned a session it does not own, and its own import was acknowledged and never stored."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, \
                client_for(host, "same", kind="plugin", plugin_id="alpha") as alpha, \
                client_for(host, "same", kind="plugin", plugin_id="beta") as beta:
            a = await alpha.call("plugins.importSession", {**IMPORT, "submissionId": "s1"})
            b = await beta.call("plugins.importSession", {**IMPORT, "submissionId": "s1"})
            assert a["created"] and b["created"] and a["sessionId"] != b["sessionId"]
            assert sorted(db_rows(root, "SELECT plugin_id, session_id FROM session_import_origins")) == \
                [("alpha", a["sessionId"]), ("beta", b["sessionId"])]
            # a retry is still answered from its own receipt
            assert await beta.call("plugins.importSession", {**IMPORT, "submissionId": "s1"}) == b


async def test_ui_trash_restore_purge_of_a_host_session_and_search(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            sid = (await ui.call("session.create", {"title": "keep me"}))["id"]
            await ui.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "flamingo notes")})
            before = (root / "sessions" / f"{sid}.jsonl").read_bytes()
            await ui.call("sessions.trash", {"sessionId": sid})
            assert (await ui.call("search.sessions", {"query": "flamingo"}))["results"] == []
            assert (await ui.call("session.list", {}))["sessions"] == []
            after = (root / "sessions" / f"{sid}.jsonl").read_bytes()
            assert after.startswith(before)  # nothing removed: one line records the trash (kept by a rebuild)
            added = orjson.loads(after[len(before):])
            assert added["type"] == "session_info" and isinstance(added["trashedAt"], int)
            await ui.call("sessions.restore", {"sessionId": sid})
            assert [r["sessionId"] for r in (await ui.call("search.sessions", {"query": "flamingo"}))["results"]] == [
                sid]
            await ui.call("sessions.trash", {"sessionId": sid})
            await ui.call("sessions.purge", {"sessionId": sid, "submissionId": "purge-1"})
            assert not (root / "sessions" / f"{sid}.jsonl").exists()
            await denied(ui, "session.get", {"sessionId": sid}, "SESSION_NOT_FOUND")
            # the purge's receipt outlives the session
            again = await ui.call("sessions.purge", {"sessionId": sid, "submissionId": "purge-1"})
            assert again == {"sessionId": sid, "purged": True}


async def test_a_plugin_refused_a_session_starts_no_actor_for_it(tmp_path: Path) -> None:
    """A plugin's ``session.get`` of a session it did not import (another's, one that does not exist, its own in
    the trash) is refused with the same answers as before, without starting that session's actor: before, each
    refusal came from a session actor started for it, and a plugin probing ids started one per id. Its own
    session is served as before."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, "p1", kind="plugin", plugin_id="alpha") as alpha, \
                client_for(host, "ui", kind="ui") as ui:
            mine = (await alpha.call("plugins.importSession", IMPORT))["sessionId"]
            trashed = (await alpha.call("plugins.importSession", {**IMPORT, "externalId": "conv-90"}))["sessionId"]
            await alpha.call("sessions.trash", {"sessionId": trashed})
            other = (await ui.call("session.create", {"title": "the user's"}))["id"]
        async with inprocess_host(root) as host, client_for(host, "p1", kind="plugin", plugin_id="alpha") as alpha:
            for sid, code in ((other, "PERMISSION_DENIED"), ("no-such-session", "PERMISSION_DENIED"),
                              (trashed, "SESSION_NOT_FOUND")):
                await denied(alpha, "session.get", {"sessionId": sid}, code)
                assert not host.services.sessions.running(sid), sid
            page = await alpha.call("session.get", {"sessionId": mine})
            assert [m["id"].rsplit(":", 1)[-1] for m in page["messages"]] == ["u1", "a1"]
