"""Seed 003 §11 item 20, audited from the spec's text against real ``pi-host serve`` processes.

"Schema v14 plugin imports have host-generated session ids, one origin row per session, (pluginId, source,
externalId) idempotency, no project or model binding unless an explicit host-created projectId is supplied,
ownership-scoped reads/mutations, and recoverable trash before purge." (§4.5; protocol/README.md §8.5, §9.)

Held elsewhere and not repeated here: the basic idempotent re-import and another plugin's own copy, a purge only
from the trash (tests/plugin_imports/test_plugin_imports_rpc.py), an import SIGKILLed at each step and retried
with its receipt key (tests/plugin_imports/test_crash_retry.py) or without one
(test_seed003_acceptance_adversarial.py), a re-import in the trash, after a purge and after the database is lost
(test_seed003_runs_outsider.py). This file covers what those leave loose: a plugin-chosen id, another source's
same externalId, two racing clients of a real process, a made-up projectId writing nothing, a history that
names a host project, every mutation another plugin might try, the UI's rights, an exact restore, the owner's
trash, restore and purge SIGKILLed midway and retried once, and the origin-row invariant checked after each step
and across restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import client, code_of, data_dir, real_host
from tests.dbkit import rows
from tests.hostkit import HostProcess, call_killed_at, msg, start_host_process

KEY: dict[str, Any] = {
    "sourceId": "chatlog", "externalId": "conv-81", "title": "Parser ideas",
    "history": {"projectPath": "/elsewhere/parser", "modelId": "gpt-x", "providerId": "openai"},
    "messages": [msg("u1", "how do I split the lexer pangolin"), msg("a1", "move it to lexer.py", role="assistant")],
}


def origin_invariant(root: Path) -> list[tuple[Any, ...]]:
    """§4.5 "one origin row per session": every origin row names a live session row, no session has two, and
    no (plugin, source, external) key has two. Returns the rows (plugin, source, external, session), sorted."""
    assert rows(root, "SELECT session_id FROM session_import_origins GROUP BY session_id HAVING COUNT(*) > 1") == []
    assert rows(root, "SELECT plugin_id FROM session_import_origins GROUP BY plugin_id, source_id, external_id "
                      "HAVING COUNT(*) > 1") == []
    assert rows(root, "SELECT o.session_id FROM session_import_origins o LEFT JOIN sessions s ON s.id = o.session_id "
                      "WHERE s.id IS NULL") == []
    return rows(root, "SELECT plugin_id, source_id, external_id, session_id FROM session_import_origins "
                      "ORDER BY 1, 2, 3")


def origin_row(root: Path, sid: str) -> list[tuple[Any, ...]]:
    return rows(root, "SELECT plugin_id, source_id, external_id, source_label, origin_json, created_at "
                      "FROM session_import_origins WHERE session_id = ?", sid)


def session_row(root: Path, sid: str) -> list[tuple[Any, ...]]:
    """The session's §4.5 columns (not the index's own bookkeeping: how far it read the transcript)."""
    return rows(root, "SELECT id, title, project_id, provider_id, model_id, mode, thinking_level, permission_mode, "
                      "source, deleted_at, pinned, last_seq, created_at, updated_at FROM sessions WHERE id = ?", sid)


def binding(root: Path, sid: str) -> list[tuple[Any, ...]]:
    return rows(root, "SELECT project_id, provider_id, model_id FROM sessions WHERE id = ?", sid)


async def full(c: HostClient, sid: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
    return got


def restart(proc: HostProcess, root: Path) -> HostProcess:
    proc.kill9()
    return start_host_process(root)


async def test_the_id_is_the_hosts_and_the_key_is_plugin_source_and_external_id(tmp_path: Path) -> None:
    """A plugin cannot choose the session id (an unknown ``sessionId`` param is ``INVALID_PARAMS`` and writes
    nothing); the same externalId under another sourceId is another session; the same triple after a restart is
    the same session (``created: false``, one origin row)."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        proc = start_host_process(root)
        try:
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                for forged in ({"sessionId": "mine-1"}, {"id": "mine-1"}):
                    assert await code_of(alpha, "plugins.importSession", {**KEY, **forged}) == "INVALID_PARAMS"
                assert rows(root, "SELECT COUNT(*) FROM sessions") == [(0,)]
                assert not (root / "sessions" / "mine-1.jsonl").exists()
                first = await alpha.call("plugins.importSession", KEY)
                sid = first["sessionId"]
                assert first == {"sessionId": sid, "created": True, "messageCount": 2}
                assert sid not in ("conv-81", "chatlog", "mine-1")
                other_source = await alpha.call("plugins.importSession", {**KEY, "sourceId": "mailbox"})
                assert other_source["created"] is True and other_source["sessionId"] != sid
                assert origin_invariant(root) == [("alpha", "chatlog", "conv-81", sid),
                                                  ("alpha", "mailbox", "conv-81", other_source["sessionId"])]
            proc = restart(proc, root)
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                again = await alpha.call("plugins.importSession", {**KEY, "messages": [msg("x", "changed")]})
                assert again == {"sessionId": sid, "created": False, "messageCount": 2}
                assert [m["id"] for m in await full(alpha, sid)] == [f"{sid}:u1", f"{sid}:a1"]
                assert len(origin_invariant(root)) == 2
        finally:
            proc.kill9()


async def test_two_clients_racing_one_key_on_a_real_host_make_one_session(tmp_path: Path) -> None:
    """§11.20 idempotency "even when two race": clients of one plugin, keyed and keyless, import one triple at
    once; one session, one origin row, one transcript; every answer names it, exactly one says created."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root, kind="plugin", client_id="rt-0", plugin_id="alpha") as (proc, _c):
            answers: list[dict[str, Any]] = []

            async def one(i: int) -> None:
                async with client(proc, f"rt-{i}", "plugin", "alpha") as c:
                    params = {**KEY, "submissionId": f"imp-{i}"} if i % 2 else KEY
                    answers.append(await c.call("plugins.importSession", params))

            async with trio.open_nursery() as nursery:
                for i in range(1, 7):
                    nursery.start_soon(one, i)
            sids = {a["sessionId"] for a in answers}
            assert len(sids) == 1 and sum(a["created"] for a in answers) == 1, answers
            (sid,) = sids
            assert origin_invariant(root) == [("alpha", "chatlog", "conv-81", sid)]
            assert rows(root, "SELECT id FROM sessions") == [(sid,)]
            assert sorted(p.name for p in (root / "sessions").glob("*.jsonl")) == [f"{sid}.jsonl"]


async def test_no_binding_but_an_explicit_host_project(tmp_path: Path) -> None:
    """History never binds, even when its projectPath is a project the host has; a made-up projectId is
    refused and writes nothing; a host-created one binds the project only (no provider or model), across a
    restart, and its origin history stays as the plugin sent it."""
    root = data_dir(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(120):
        proc = start_host_process(root)
        try:
            async with client(proc, "ui", "ui") as ui, client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                made = await ui.call("session.create", {"title": "host's", "projectPath": str(ws)})
                project_id = made["projectId"]
                projects = rows(root, "SELECT id, path FROM projects")
                named = await alpha.call("plugins.importSession", {
                    **KEY, "externalId": "named", "history": {"projectPath": str(ws), "modelId": "gpt-x",
                                                              "providerId": "openai"}})
                assert binding(root, named["sessionId"]) == [(None, None, None)]
                before = (rows(root, "SELECT COUNT(*) FROM sessions"), origin_invariant(root),
                          sorted(p.name for p in (root / "sessions").iterdir()))
                assert await code_of(alpha, "plugins.importSession",
                                     {**KEY, "externalId": "made-up", "projectId": project_id + 100}) == "NOT_FOUND"
                assert (rows(root, "SELECT COUNT(*) FROM sessions"), origin_invariant(root),
                        sorted(p.name for p in (root / "sessions").iterdir())) == before
                bound = await alpha.call("plugins.importSession", {**KEY, "externalId": "bound",
                                                                   "projectId": project_id})
                assert binding(root, bound["sessionId"]) == [(project_id, None, None)]
                assert rows(root, "SELECT id, path FROM projects") == projects  # no project made by an import
            proc = restart(proc, root)
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                assert binding(root, bound["sessionId"]) == [(project_id, None, None)]
                assert binding(root, named["sessionId"]) == [(None, None, None)]
                listed = {s["id"]: s for s in (await alpha.call("plugins.listSessions", {}))["sessions"]}
                assert listed[named["sessionId"]]["origin"]["history"]["projectPath"] == str(ws)
                assert listed[bound["sessionId"]]["origin"]["history"]["projectPath"] == "/elsewhere/parser"
                assert listed[bound["sessionId"]]["origin"]["history"]["modelId"] == "gpt-x"
        finally:
            proc.kill9()


async def test_another_plugin_can_neither_read_nor_change_an_import_and_the_ui_can(tmp_path: Path) -> None:
    """Ownership (§8.5): beta is ``PERMISSION_DENIED`` on every read and mutation of alpha's session, live or
    trashed, and changes nothing; so is alpha on a UI session. The UI reaches every session (reads, trash,
    restore) but is not a plugin (``plugins.importSession`` / ``listSessions`` are ``PERMISSION_DENIED``).
    The scoping survives a restart."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        proc = start_host_process(root)
        try:
            for life in ("first", "after restart"):
                async with client(proc, "alpha-rt", "plugin", "alpha") as alpha, \
                        client(proc, "beta-rt", "plugin", "beta") as beta, client(proc, "ui", "ui") as ui:
                    if life == "first":
                        sid = (await alpha.call("plugins.importSession", KEY))["sessionId"]
                        own = (await beta.call("plugins.importSession", KEY))["sessionId"]
                        mine = (await ui.call("session.create", {"title": "the user's"}))["id"]
                    files = {p.name: p.read_bytes() for p in (root / "sessions").iterdir() if p.is_file()}
                    table = rows(root, "SELECT id, title, deleted_at, last_seq FROM sessions ORDER BY id")
                    origins = origin_invariant(root)
                    for method, params in (
                            ("session.get", {"sessionId": sid}),
                            ("session.export", {"sessionId": sid, "format": "md"}),
                            ("session.rename", {"sessionId": sid, "title": "stolen"}),
                            ("session.appendMessage", {"sessionId": sid, "message": msg("x1", "injected")}),
                            ("session.delete", {"sessionId": sid}),
                            ("sessions.trash", {"sessionId": sid}),
                            ("sessions.restore", {"sessionId": sid}),
                            ("sessions.purge", {"sessionId": sid})):
                        assert await code_of(beta, method, params) == "PERMISSION_DENIED", (life, method)
                    assert await code_of(alpha, "session.get", {"sessionId": mine}) == "PERMISSION_DENIED"
                    assert await code_of(alpha, "sessions.trash", {"sessionId": own}) == "PERMISSION_DENIED"
                    assert [s["id"] for s in (await beta.call("session.list", {}))["sessions"]] == [own]
                    assert [s["id"] for s in (await beta.call("plugins.listSessions", {}))["sessions"]] == [own]
                    await alpha.call("sessions.trash", {"sessionId": sid})
                    for method in ("session.get", "sessions.restore", "sessions.purge"):
                        assert await code_of(beta, method, {"sessionId": sid}) == "PERMISSION_DENIED", method
                    assert (await beta.call("sessions.listTrashed", {}))["sessions"] == []
                    await alpha.call("sessions.restore", {"sessionId": sid})
                    assert rows(root, "SELECT id, title, deleted_at, last_seq FROM sessions ORDER BY id") == table
                    assert origin_invariant(root) == origins
                    for name, data in files.items():  # nothing of beta's reached a file
                        assert (root / "sessions" / name).read_bytes().startswith(data)
                    # the UI: every session, and not a plugin
                    assert [m["id"] for m in await full(ui, sid)] == [f"{sid}:u1", f"{sid}:a1"]
                    assert {sid, own, mine} <= {s["id"] for s in (await ui.call("session.list", {}))["sessions"]}
                    assert await code_of(ui, "plugins.importSession", KEY) == "PERMISSION_DENIED"
                    assert await code_of(ui, "plugins.listSessions", {}) == "PERMISSION_DENIED"
                    await ui.call("sessions.trash", {"sessionId": sid})
                    assert [s["id"] for s in (await alpha.call("sessions.listTrashed", {}))["sessions"]] == [sid]
                    await ui.call("sessions.restore", {"sessionId": sid})
                    assert origin_invariant(root) == origins
                if life == "first":
                    proc = restart(proc, root)
        finally:
            proc.kill9()


async def test_trash_restore_is_exact_and_purge_comes_only_after_the_trash(tmp_path: Path) -> None:
    """Recoverable trash: the trash survives a SIGKILL (same deletedAt); restore gives back the same messages,
    the same session row and the same origin row; purge before the trash is ``CONFLICT`` and changes nothing;
    purge after it removes the rows, origin and files, and the triple imports anew with one origin row."""
    root = data_dir(tmp_path)
    with trio.fail_after(150):
        proc = start_host_process(root)
        try:
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                sid = (await alpha.call("plugins.importSession", KEY))["sessionId"]
                messages = await full(alpha, sid)
                summary = (await alpha.call("plugins.listSessions", {}))["sessions"]
                row = session_row(root, sid)
                origin = origin_row(root, sid)
                lines = (root / "sessions" / f"{sid}.jsonl").read_bytes()
                assert await code_of(alpha, "sessions.purge", {"sessionId": sid}) == "CONFLICT"
                assert session_row(root, sid) == row
                assert (root / "sessions" / f"{sid}.jsonl").read_bytes() == lines
                trashed = (await alpha.call("sessions.trash", {"sessionId": sid}))["session"]["deletedAt"]
                assert isinstance(trashed, int)
                assert origin_row(root, sid) == origin
                in_trash = (root / "sessions" / f"{sid}.jsonl").read_bytes()
                again = await alpha.call("plugins.importSession", {**KEY, "messages": [msg("u9", "newer")]})
                assert again == {"sessionId": sid, "created": False, "messageCount": 2}  # writes nothing
                assert (root / "sessions" / f"{sid}.jsonl").read_bytes() == in_trash
                assert (await alpha.call("sessions.trash", {"sessionId": sid}))["session"]["deletedAt"] == trashed
            proc = restart(proc, root)
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                assert await code_of(alpha, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"
                listed = (await alpha.call("sessions.listTrashed", {}))["sessions"]
                assert [(s["id"], s["deletedAt"]) for s in listed] == [(sid, trashed)]
                assert (await alpha.call("plugins.listSessions", {}))["sessions"] == []
                assert origin_row(root, sid) == origin
                await alpha.call("sessions.restore", {"sessionId": sid})
            proc = restart(proc, root)
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                assert await full(alpha, sid) == messages
                assert (await alpha.call("plugins.listSessions", {}))["sessions"] == summary
                assert session_row(root, sid) == row
                assert origin_row(root, sid) == origin
                after = (root / "sessions" / f"{sid}.jsonl").read_bytes()
                assert after.startswith(lines)  # only the trash's own session_info lines were added
                await alpha.call("sessions.trash", {"sessionId": sid})
                assert await alpha.call("sessions.purge", {"sessionId": sid}) == {"sessionId": sid, "purged": True}
                assert rows(root, "SELECT COUNT(*) FROM sessions WHERE id = ?", sid) == [(0,)]
                assert origin_invariant(root) == []
                assert not any(p.name.startswith(sid) for p in (root / "sessions").iterdir())
            proc = restart(proc, root)
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                assert origin_invariant(root) == []
                assert await code_of(alpha, "sessions.restore", {"sessionId": sid}) in ("SESSION_NOT_FOUND",
                                                                                        "PERMISSION_DENIED")
                fresh = await alpha.call("plugins.importSession", KEY)
                assert fresh["created"] is True and fresh["sessionId"] != sid
                assert origin_invariant(root) == [("alpha", "chatlog", "conv-81", fresh["sessionId"])]
        finally:
            proc.kill9()


TRASH_KILLS = [
    ("sessions.trash", "append.after_fsync"), ("sessions.trash", "sessions.trash.before_commit"),
    ("sessions.restore", "append.after_fsync"), ("sessions.restore", "sessions.restore.before_commit"),
    ("sessions.purge", "purge.after_marker"), ("sessions.purge", "sessions.purge.before_commit"),
    ("sessions.purge", "purge.before_files"), ("sessions.purge", "sessions.purge.after_commit"),
]


@pytest.mark.parametrize(("method", "point"), TRASH_KILLS)
async def test_a_plugins_trash_restore_or_purge_killed_midway_is_finished_by_its_retry(
        tmp_path: Path, method: str, point: str) -> None:
    """The owning plugin's trash, restore or purge SIGKILLed at a step, the host restarted and the call retried
    once (same submissionId): the outcome is the crash-free one, with one origin row per remaining session;
    another plugin still reaches nothing; the key imports anew only once the purge is done."""
    root = data_dir(tmp_path)
    with trio.fail_after(150):
        async with real_host(root, kind="plugin", client_id="alpha-rt", plugin_id="alpha") as (_proc, alpha):
            sid = (await alpha.call("plugins.importSession", KEY))["sessionId"]
            messages = await full(alpha, sid)
            origin = origin_row(root, sid)
            if method != "sessions.trash":
                await alpha.call("sessions.trash", {"sessionId": sid})
        call = {"sessionId": sid, "submissionId": "k-1"}
        await call_killed_at(root, point, method, call, client_id="alpha-rt", client_kind="plugin",
                             plugin_id="alpha")
        async with real_host(root, kind="plugin", client_id="alpha-rt", plugin_id="alpha") as (proc, alpha), \
                client(proc, "beta-rt", "plugin", "beta") as beta:
            assert await code_of(beta, method, {"sessionId": sid}) in ("PERMISSION_DENIED", "SESSION_NOT_FOUND")
            await alpha.call(method, call)
            assert await alpha.call(method, call) is not None  # the retry's receipt answers again
            if method == "sessions.purge":
                assert origin_invariant(root) == []
                assert rows(root, "SELECT COUNT(*) FROM sessions") == [(0,)]
                assert not any(p.name.startswith(sid) for p in (root / "sessions").iterdir())
                fresh = await alpha.call("plugins.importSession", KEY)
                assert fresh["created"] is True and fresh["sessionId"] != sid
                assert origin_invariant(root) == [("alpha", "chatlog", "conv-81", fresh["sessionId"])]
                return
            assert origin_invariant(root) == [("alpha", "chatlog", "conv-81", sid)]
            assert origin_row(root, sid) == origin
            trashed = [s["id"] for s in (await alpha.call("sessions.listTrashed", {}))["sessions"]]
            if method == "sessions.trash":
                assert trashed == [sid]
                assert await code_of(alpha, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"
            else:
                assert trashed == []
                assert await full(alpha, sid) == messages
            again = await alpha.call("plugins.importSession", KEY)
            assert (again["sessionId"], again["created"]) == (sid, False)
            assert len(origin_invariant(root)) == 1


async def test_a_core_delete_cascades_the_origin_and_the_key_imports_anew(tmp_path: Path) -> None:
    """§4.5: "Core session deletion cascades the sidecar". The UI deletes a plugin's imported session
    (``session.delete``, not the plugin's trash): its origin row, rows and transcript go; the plugin lists
    nothing; the same (pluginId, sourceId, externalId) imports again as a new session with one origin row and
    no binding; across a restart that stays so."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        proc = start_host_process(root)
        try:
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha, client(proc, "ui-1") as ui:
                sid = (await alpha.call("plugins.importSession", KEY))["sessionId"]
                await ui.call("session.delete", {"sessionId": sid})
                assert origin_invariant(root) == []
                assert rows(root, "SELECT COUNT(*) FROM sessions") == [(0,)]
                assert not (root / "sessions" / f"{sid}.jsonl").exists()
                assert (await alpha.call("plugins.listSessions", {}))["sessions"] == []
                again = await alpha.call("plugins.importSession", KEY)
                assert again["created"] is True and again["messageCount"] == 2
                assert origin_invariant(root) == [("alpha", "chatlog", "conv-81", again["sessionId"])]
                assert binding(root, again["sessionId"]) == [(None, None, None)]
            proc = restart(proc, root)
            async with client(proc, "alpha-rt", "plugin", "alpha") as alpha:
                assert origin_invariant(root) == [("alpha", "chatlog", "conv-81", again["sessionId"])]
                assert [s["id"] for s in (await alpha.call("plugins.listSessions", {}))["sessions"]] == [
                    again["sessionId"]]
        finally:
            proc.kill9()
