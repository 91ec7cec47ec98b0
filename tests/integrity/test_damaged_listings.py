"""One damaged record (a JSON column that no longer parses, a value outside its set; only the database holds
these records, and nothing repairs them) is left out of a listing and named in its ``unreadable`` field; the
records that read list as before, and a cursor still moves past a damaged row. The getter of the damaged record
still answers CORRUPT_DATA. Before, each listing answered CORRUPT_DATA as a whole: ``session.listTurns``,
``tasks.list`` and ``plugins.listSessions`` here; ``approvals.pending`` and ``interactions.pending`` in
tests/approvals/test_damaged_pending.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.models_artifacts import ArtifactsListResult
from protocol.models_attachments import AttachmentsRefResult
from protocol.models_catalog import ModelsListResult
from protocol.models_collab import CollabListResult
from protocol.models_notifications import NotificationsListResult
from protocol.models_plans import PlansPendingResult
from protocol.models_plugin_imports import PluginListSessionsResult
from protocol.models_project_groups import ProjectGroupsListResult
from protocol.models_providers import ProvidersListResult
from protocol.models_review import ReviewListResult
from protocol.models_session import SessionListResult
from protocol.models_skills import SkillsListResult
from protocol.models_tasks import TasksListResult, TasksRunsResult
from protocol.models_usage import ListTurnsResult
from runtime.client import HostClient
from store import approvals, artifacts, collab, notifications, plans, tasks, thread_meta, turns
from store.errors import DamagedRecord, NotFound
from store.interchange.plugin_imports import list_plugin_sessions
from tests.collab.test_collab_host import deliver
from tests.collab.test_collab_host import session as collab_session
from tests.dbkit import NOW, add_session, fresh_db
from tests.hostkit import client_for, inprocess_host, msg
from tests.plans.test_executions import contract_session, submit
from tests.turns.turnkit import end, rpc_error, start


def damage(root: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        with conn:
            assert conn.execute(sql, args).rowcount == 1
    finally:
        conn.close()


async def pages_of(c: HostClient, method: str, params: dict[str, Any], model: type[Any], items: str,
                   key: str = "id") -> tuple[list[str], list[str], int]:
    """Every page of a listing, one record a page: (the records' ``key`` values, the unreadable ids, pages);
    a page whose record is damaged is empty and its cursor leads on."""
    listed: list[str] = []
    unreadable: list[str] = []
    cursor: str | None = None
    for pages in range(1, 20):
        more = {"cursor": cursor} if cursor else {}
        page = model.model_validate(await c.call(method, {**params, "limit": 1, **more}))
        listed += [getattr(r, key) for r in getattr(page, items)]
        unreadable += page.unreadable or []
        cursor = page.next_cursor
        if cursor is None:
            return listed, unreadable, pages
    raise AssertionError("the cursor never ended")


async def all_pages(c: HostClient, sid: str) -> tuple[list[str], list[str], int]:
    """Every page of session.listTurns, one turn a page: (turn ids, unreadable ids, pages)."""
    return await pages_of(c, "session.listTurns", {"sessionId": sid}, ListTurnsResult, "turns")


async def test_list_turns_names_a_damaged_turn_and_its_cursor_moves_past_it(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {"title": "turns"}))["id"])
            for i in range(4):
                await start(c, sid, f"t{i}")
                await c.call("session.appendMessage", {"sessionId": sid, "turnId": f"t{i}",
                                                       "message": msg(f"m{i}", f"go {i}")})
                await end(c, sid, f"t{i}")
            damage(tmp_path, "UPDATE turns SET usage_json = '{\"cut' WHERE id = 't2'")
            damage(tmp_path, "UPDATE turns SET status = 'complexed' WHERE id = 't1'")
            whole = ListTurnsResult.model_validate(await c.call("session.listTurns", {"sessionId": sid}))
            assert [t.id for t in whole.turns] == ["t3", "t0"] and whole.unreadable == ["t2", "t1"]
            # one turn a page: the pages of damaged turns are empty and still lead on to the end
            assert await all_pages(c, sid) == (["t3", "t0"], ["t2", "t1"], 4)


async def test_tasks_list_names_a_damaged_task_and_its_getter_still_refuses(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            ids = [(await ui.call("tasks.create", {"title": f"task {i}", "prompt": "p"}))["id"] for i in range(3)]
            damage(tmp_path, "UPDATE scheduled_tasks SET config_json = '{\"cut' WHERE id = ?", ids[1])
            listed = TasksListResult.model_validate(await ui.call("tasks.list", {}))
            assert [t.id for t in listed.tasks] == [ids[0], ids[2]] and listed.unreadable == [ids[1]]
            assert (await rpc_error(ui.call("tasks.get", {"taskId": ids[1]}))).data_code == "CORRUPT_DATA"
            assert (await ui.call("tasks.get", {"taskId": ids[2]}))["id"] == ids[2]


async def test_tasks_runs_answers_the_runs_of_a_damaged_task_and_names_a_damaged_run(tmp_path: Path) -> None:
    """Before, tasks.runs of a task whose own record is damaged answered CORRUPT_DATA although its runs (records
    of their own) read, and a run's status outside its set went out unchecked."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            task = (await ui.call("tasks.create", {"title": "task", "prompt": "p"}))["id"]
            runs = []
            for _ in range(3):
                runs.append((await ui.call("tasks.startRun", {"taskId": task}))["id"])
                await ui.call("tasks.finishRun", {"runId": runs[-1], "status": "completed"})
            damage(tmp_path, "UPDATE scheduled_tasks SET config_json = '{\"cut' WHERE id = ?", task)
            damage(tmp_path, "UPDATE task_runs SET status = 'complexed' WHERE id = ?", runs[1])
            listed = TasksRunsResult.model_validate(await ui.call("tasks.runs", {"taskId": task}))
            assert [r.id for r in listed.runs] == [runs[2], runs[0]] and listed.unreadable == [runs[1]]
            assert [r.status for r in listed.runs] == ["completed", "completed"]
            # the getter of the damaged task still refuses; a task that is not there is NOT_FOUND
            assert (await rpc_error(ui.call("tasks.get", {"taskId": task}))).data_code == "CORRUPT_DATA"
            assert (await rpc_error(ui.call("tasks.runs", {"taskId": "task_none"}))).data_code == "NOT_FOUND"


async def test_plans_pending_names_a_damaged_request_which_still_holds_its_session(tmp_path: Path) -> None:
    """Before, plans.pending sent a stored value outside its set (a kind, a permission mode) as it was."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            asked = []
            for i in range(3):
                sid, ws = await contract_session(c, tmp_path / f"p{i}")
                asked.append((sid, ws, (await submit(c, sid, ws))["requestId"]))
            damage(tmp_path, "UPDATE plan_approvals SET kind = 'plab' WHERE request_id = ?", asked[0][2])
            damage(tmp_path, "UPDATE plan_approvals SET target_permission_mode = 'sure' WHERE request_id = ?",
                   asked[1][2])
            listed = PlansPendingResult.model_validate(await ui.call("plans.pending", {}))
            assert [r.request_id for r in listed.pending] == [asked[2][2]]
            assert listed.unreadable == [asked[1][2], asked[0][2]]  # newest first, as listed
            one = PlansPendingResult.model_validate(await ui.call("plans.pending", {"sessionId": asked[0][0]}))
            assert (one.pending, one.unreadable) == ([], [asked[0][2]])
            # it still holds its session: one pending request at a time
            sid, ws, rid = asked[0]
            refused = await rpc_error(submit(c, sid, ws, call="c2"))
            assert refused.data_code == "CONFLICT" and refused.data["requestId"] == rid


async def test_collab_list_names_a_damaged_delivery_and_its_cursor_moves_past_it(tmp_path: Path) -> None:
    """Before, collab.list sent a stored kind, status or permission ceiling outside its set as it was (a value
    no client model accepts), and so did collab.get."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt = await collab_session(c, "Lead"), await collab_session(c, "Reviewer")
            ids = [(await deliver(c, src, tgt, key=f"k{i}"))["delivery"]["id"] for i in range(4)]
            damage(tmp_path, "UPDATE session_collaboration_messages SET status = 'queueb' WHERE id = ?", ids[2])
            damage(tmp_path, "UPDATE session_collaboration_messages SET permission_ceiling = 'al' WHERE id = ?",
                   ids[1])
            whole = CollabListResult.model_validate(await c.call("collab.list", {"sessionId": tgt}))
            assert [d.id for d in whole.deliveries] == [ids[3], ids[0]] and whole.unreadable == [ids[2], ids[1]]
            listed, unreadable, _ = await pages_of(c, "collab.list", {"sessionId": tgt}, CollabListResult,
                                                   "deliveries")
            assert (listed, unreadable) == ([ids[3], ids[0]], [ids[2], ids[1]])
            assert (await rpc_error(c.call("collab.get", {"deliveryId": ids[2]}))).data_code == "CORRUPT_DATA"
            assert (await c.call("collab.get", {"deliveryId": ids[0]}))["id"] == ids[0]


async def test_notifications_list_names_a_damaged_notification_and_its_cursor_moves_past_it(
        tmp_path: Path) -> None:
    """Before, notifications.list sent a stored kind outside its set as it was."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {"title": "inbox"}))["id"])
            for i in range(3):
                await start(c, sid, f"t{i}")
                await end(c, sid, f"t{i}", createNotification=True)
            notes = [n["id"] for n in (await c.call("notifications.list", {}))["notifications"]]
            damage(tmp_path, "UPDATE notifications SET kind = 'task.complexed' WHERE id = ?", notes[1])
            whole = NotificationsListResult.model_validate(await c.call("notifications.list", {}))
            assert [n.id for n in whole.notifications] == [notes[0], notes[2]] and whole.unreadable == [notes[1]]
            assert whole.unread_count == 3
            listed, unreadable, _ = await pages_of(c, "notifications.list", {}, NotificationsListResult,
                                                   "notifications")
            assert (listed, unreadable) == ([notes[0], notes[2]], [notes[1]])
            # it can still be marked read and cleared by its id
            assert (await c.call("notifications.markRead", {"ids": [notes[1]]}))["updated"] == 1
            assert (await c.call("notifications.clear", {"ids": [notes[1]]}))["deleted"] == 1


async def test_review_list_names_a_snapshot_whose_meta_is_damaged(tmp_path: Path) -> None:
    """A review snapshot's meta.json is its only record. Before, one that no longer parsed made review.list
    answer CORRUPT_DATA for every snapshot of the session."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    ws.mkdir()
    (ws / "a.md").write_bytes(b"after\n")
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = str((await c.call("session.create", {"title": "review", "projectPath": str(ws)}))["id"])
            snaps = [(await c.call("review.record", {
                "sessionId": sid, "path": "a.md", "beforeBase64": None, "toolName": "Edit",
                "toolCallId": f"call_{i}", "messageId": f"a{i}"}))["snapshot"]["snapshotId"] for i in range(3)]
            meta = data / "review-changes" / sid / snaps[1] / "meta.json"
            meta.write_bytes(meta.read_bytes()[:-7])
            listed = ReviewListResult.model_validate(await c.call("review.list", {"sessionId": sid}))
            assert [r.snapshot_id for r in listed.snapshots] == [snaps[0], snaps[2]]
            assert listed.unreadable == [snaps[1]] and listed.truncated is False
            mine = ReviewListResult.model_validate(await c.call("review.list", {"sessionId": sid, "messageId": "a2"}))
            assert [r.snapshot_id for r in mine.snapshots] == [snaps[2]] and mine.unreadable == [snaps[1]]
            got = await rpc_error(c.call("review.get", {"sessionId": sid, "snapshotId": snaps[1]}))
            assert got.data_code == "CORRUPT_DATA"


async def test_artifacts_list_names_a_damaged_artifact_and_its_cursor_moves_past_it(tmp_path: Path) -> None:
    """Before, artifacts.list sent a stored op outside its set as it was (no client model accepts it)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = str((await c.call("session.create", {"title": "files", "projectPath": str(ws)}))["id"])
            for i in range(3):
                write = {"type": "tool_call", "callId": f"call_{i}", "name": "Write", "args": {"path": f"f{i}.md"},
                         "status": "ok", "result": {"output": "written"}}
                await c.call("session.appendMessage", {"sessionId": sid,
                                                       "message": msg(f"a{i}", "", "assistant", blocks=[write])})
            paths = [a["path"] for a in (await c.call("artifacts.list", {"sessionId": sid}))["artifacts"]]
            assert len(paths) == 3
            damage(tmp_path / "data", "UPDATE artifacts SET op = 'wrote' WHERE path = ?", paths[1])
            whole = ArtifactsListResult.model_validate(await c.call("artifacts.list", {"sessionId": sid}))
            assert [a.path for a in whole.artifacts] == [paths[0], paths[2]] and whole.unreadable == [paths[1]]
            listed, unreadable, _ = await pages_of(c, "artifacts.list", {}, ArtifactsListResult, "artifacts", "path")
            assert (listed, unreadable) == ([paths[0], paths[2]], [paths[1]])


async def test_project_groups_list_names_a_damaged_group(tmp_path: Path) -> None:
    """Before, a stored group whose record no longer parsed was left out of projectGroups.list without a word
    (and projectGroups.get of it answered NOT_FOUND, as if it had never been saved)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as ui:
            ids = []
            for name in ("alpha", "beta", "gamma"):
                (tmp_path / name).mkdir()
                saved = await ui.call("projectGroups.save", {"name": name, "roots": [str(tmp_path / name)]})
                ids.append(saved["group"]["id"])
            damage(tmp_path / "data", "UPDATE kv SET value_json = '{\"cut' WHERE ns = 'projectGroups' AND key = ?",
                   ids[1])
            listed = ProjectGroupsListResult.model_validate(await ui.call("projectGroups.list", {}))
            stored = [g.id for g in listed.groups if not g.legacy]
            assert stored == [ids[0], ids[2]] and listed.unreadable == [ids[1]]
            got = await rpc_error(ui.call("projectGroups.get", {"groupId": ids[1]}))
            assert got.data_code == "CORRUPT_DATA"
            assert (await ui.call("projectGroups.delete", {"groupId": ids[1]}))["deleted"] is True
            again = ProjectGroupsListResult.model_validate(await ui.call("projectGroups.list", {}))
            assert [g.id for g in again.groups if not g.legacy] == [ids[0], ids[2]] and again.unreadable is None


async def test_a_blob_whose_meta_is_damaged_is_corrupt_to_get_and_can_still_be_put_and_referenced(
        tmp_path: Path) -> None:
    """Before, attachments.get of it, a second put of its bytes and attachments.ref of it all answered INTERNAL
    (a bare JSON error, "a host bug"): the reference and the put need nothing of its meta."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            sid = str((await ui.call("session.create", {"title": "blobs"}))["id"])
            put = {"name": "a.txt", "mimeType": "text/plain", "dataBase64": "aGVsbG8=", "meta": {"page": 1}}
            sha = (await ui.call("attachments.put", put))["sha256"]
            damage(tmp_path, "UPDATE attachment_blobs SET meta_json = '{\"cut' WHERE sha256 = ?", sha)
            assert (await rpc_error(ui.call("attachments.get", {"sha256": sha}))).data_code == "CORRUPT_DATA"
            assert (await ui.call("attachments.put", put))["sha256"] == sha
            referenced = AttachmentsRefResult.model_validate(await ui.call("attachments.ref", {
                "sha256": sha, "sessionId": sid}))
            assert referenced.created is True


async def test_skills_list_names_a_damaged_skill(tmp_path: Path) -> None:
    """Before, a skill whose record no longer parsed was left out of skills.list without a word, and skills.get
    of it answered NOT_FOUND, as if it had never been stored."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            names = ["alpha", "beta", "gamma"]
            for name in names:
                await ui.call("skills.put", {"name": name, "version": "1", "source": f"# {name}\n"})
            damage(tmp_path, "UPDATE kv SET value_json = '{\"cut' WHERE ns = 'skills' AND key = 'beta'")
            listed = SkillsListResult.model_validate(await ui.call("skills.list", {}))
            assert [sk.name for sk in listed.skills] == ["alpha", "gamma"] and listed.unreadable == ["beta"]
            assert (await rpc_error(ui.call("skills.get", {"name": "beta"}))).data_code == "CORRUPT_DATA"
            await ui.call("skills.put", {"name": "beta", "version": "2", "source": "# beta again\n"})  # over it
            again = SkillsListResult.model_validate(await ui.call("skills.list", {}))
            assert [sk.name for sk in again.skills] == names and again.unreadable is None


async def test_models_list_names_a_damaged_model_and_models_add_writes_over_it(tmp_path: Path) -> None:
    """Before, models.list showed capabilities that no longer parsed as [] (a silent change of the record) and
    sent a source outside its set as it was."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            await ui.call("providers.create", {"id": "local", "name": "Local"})
            for mid in ("a", "b", "c"):
                await ui.call("models.add", {"providerId": "local", "modelId": mid, "capabilities": ["tools"]})
            damage(tmp_path, "UPDATE models SET capabilities_json = '[\"to' WHERE model_id = 'b'")
            damage(tmp_path, "UPDATE models SET source = 'usen' WHERE model_id = 'c'")
            for params in ({}, {"providerId": "local"}):
                listed = ModelsListResult.model_validate(await ui.call("models.list", params))
                assert [x.model_id for x in listed.models] == ["a"] and listed.unreadable == ["local/b", "local/c"]
            await ui.call("models.add", {"providerId": "local", "modelId": "b", "capabilities": ["vision"]})
            again = ModelsListResult.model_validate(await ui.call("models.list", {}))
            assert [(x.model_id, x.capabilities) for x in again.models] == [("a", ["tools"]), ("b", ["vision"])]
            assert again.unreadable == ["local/c"]


def stored_provider(root: Path, pid: str) -> tuple[str, str]:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        name, config = conn.execute("SELECT name, config_json FROM providers WHERE id = ?", (pid,)).fetchone()
        return str(name), str(config)
    finally:
        conn.close()


async def test_providers_list_names_a_provider_whose_config_is_damaged_and_its_use_is_corrupt(tmp_path: Path) -> None:
    """Before, a config_json that no longer parsed (or was not an object) was shown as {} by providers.list and
    providers.get, and models.refresh sent its request without the provider's headers."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            for pid in ("a", "b", "c"):
                await ui.call("providers.create", {"id": pid, "name": pid.upper(), "baseUrl": "http://127.0.0.1:9/v1",
                                                   "config": {"headers": {"X-Team": "core"}}})
            await ui.call("models.add", {"providerId": "b", "modelId": "m1"})
            damage(tmp_path, "UPDATE providers SET config_json = '{\"headers\": {\"X-Te' WHERE id = 'b'")
            damage(tmp_path, "UPDATE providers SET config_json = '[1]' WHERE id = 'c'")
            listed = ProvidersListResult.model_validate(await ui.call("providers.list", {}))
            assert [x.id for x in listed.providers] == ["a"] and listed.unreadable == ["b", "c"]
            for method, params in (("providers.get", {"providerId": "b"}), ("models.refresh", {"providerId": "b"}),
                                   ("providers.update", {"providerId": "b", "name": "Bee"})):
                err = await rpc_error(ui.call(method, params))
                assert err.data_code == "CORRUPT_DATA", method
            assert stored_provider(tmp_path, "b")[0] == "B"  # the refused update wrote nothing
            models = ModelsListResult.model_validate(await ui.call("models.list", {"providerId": "b"}))
            assert [x.model_id for x in models.models] == ["m1"]
            fixed = await ui.call("providers.update", {"providerId": "b", "config": {"headers": {"X-Team": "b"}}})
            assert fixed["provider"]["config"] == {"headers": {"X-Team": "b"}}
            assert (await ui.call("providers.delete", {"providerId": "c"}))["deleted"] is True
            again = ProvidersListResult.model_validate(await ui.call("providers.list", {}))
            assert [x.id for x in again.providers] == ["a", "b"] and again.unreadable is None


async def test_plugin_list_sessions_names_a_session_whose_origin_is_damaged(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, \
                client_for(host, "p1", kind="plugin", plugin_id="alpha") as alpha:
            sids = [(await alpha.call("plugins.importSession", {
                "sourceId": "chatlog", "externalId": f"conv-{i}", "title": f"conv {i}", "history": {"modelId": f"m{i}"},
                "messages": [msg("u1", "hello")]}))["sessionId"] for i in range(3)]
            damage(tmp_path, "UPDATE session_import_origins SET origin_json = '\"a string\"' WHERE session_id = ?",
                   sids[1])
            listed = PluginListSessionsResult.model_validate(await alpha.call("plugins.listSessions", {}))
            assert [s.id for s in listed.sessions] == [sids[2], sids[0]] and listed.unreadable == [sids[1]]
            # the session itself (its messages are in its transcript) still reads
            page = await alpha.call("session.get", {"sessionId": sids[1]})
            assert [m["id"] for m in page["messages"]] == [f"{sids[1]}:u1"]


# ---------------------------------------------------------------------------
# the store


def test_the_store_listings_leave_a_damaged_record_out_and_name_it(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    add_session(conn, "s1")
    for i, (status, usage) in enumerate((("completed", '{"total": 1}'), ("completed", '{"cut'),
                                         ("complexed", None))):
        conn.execute("INSERT INTO turns(id, session_id, status, usage_json, started_at) VALUES (?, 's1', ?, ?, ?)",
                     (f"t{i}", status, usage, NOW + i))
    found = turns.turns_by_id(conn, ["t2", "t1", "t0", "gone"])
    assert [t["id"] for t in found.items] == ["t0"] and found.unreadable == ["t2", "t1"]
    with pytest.raises(DamagedRecord):
        turns.get_turn(conn, "t1")
    for i, config in enumerate(('{}', '[]', '{"mode": "agent"}')):
        conn.execute("INSERT INTO scheduled_tasks(id, title, prompt, config_json, created_at, updated_at) "
                     "VALUES (?, 'x', 'y', ?, ?, ?)", (f"k{i}", config, NOW + i, NOW + i))
    listed = tasks.readable_tasks(conn)
    assert [t["id"] for t in listed.items] == ["k0", "k2"] and listed.unreadable == ["k1"]
    assert listed.map(lambda t: t["id"]).result("tasks") == {"tasks": ["k0", "k2"], "unreadable": ["k1"]}
    with pytest.raises(DamagedRecord):
        tasks.get_task(conn, "k1")
    for i, origin in enumerate(('{"n": 0}', '{"cut')):
        add_session(conn, f"p{i}")
        conn.execute("INSERT INTO session_import_origins(plugin_id, source_id, external_id, session_id, "
                     "origin_json, created_at) VALUES ('alpha', 'src', ?, ?, ?, ?)",
                     (f"e{i}", f"p{i}", origin, NOW + i))
    found = list_plugin_sessions(conn, "alpha")
    assert [s["id"] for s in found.items] == ["p0"] and found.unreadable == ["p1"]
    assert found.result("sessions")["unreadable"] == ["p1"]


def test_the_store_lists_pending_requests_around_a_damaged_one_and_lets_it_be_denied(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    add_session(conn, "s1")
    conn.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES ('t1', 's1', 'running', 1)")
    for rid, risk, options in (("r-ok", "low", '[{"id":"deny","label":"Deny","decision":"deny","remember":"once"}]'),
                               ("r-json", "low", '[{"id":"deny","lab'), ("r-risk", "higt", "[]")):
        conn.execute(
            "INSERT INTO approvals(request_id, session_id, turn_id, tool, args_summary, risk, options_json, "
            "requested_by, status, created_at, updated_at) VALUES (?, 's1', 't1', 'Bash', 'run', ?, ?, 'agent', "
            "'pending', 1, 2)", (rid, risk, options))
    found = approvals.list_pending(conn, "approval", "s1", 10)
    assert [r["requestId"] for r in found.items] == ["r-ok"] and sorted(found.unreadable) == ["r-json", "r-risk"]
    with pytest.raises(DamagedRecord):
        approvals.get_request(conn, "approval", "r-json")
    lenient = approvals.get_request(conn, "approval", "r-json", lenient=True)
    assert lenient["options"] == [] and lenient["status"] == "pending"
    assert approvals.outcome_of("approval", lenient, "deny", None) == ("denied", dict(approvals.DENY))
    with pytest.raises(DamagedRecord):
        approvals.outcome_of("approval", lenient, "allow_once", None)
    assert lenient["unreadable"] == ["options"]
    # a risk outside its set: shown leniently as the most cautious one, named; a deny only
    risky = approvals.get_request(conn, "approval", "r-risk", lenient=True)
    assert (risky["risk"], risky["unreadable"]) == (approvals.RISK_STAND_IN, ["risk"])
    with pytest.raises(DamagedRecord):
        approvals.get_request(conn, "approval", "r-risk")
    # a damaged status of a row never settled (no resolution time) is pending: shown so leniently, and the
    # transitions of a pending row take it (here the fence's)
    conn.execute("UPDATE approvals SET status = 'pendinf' WHERE request_id = 'r-ok'")
    unsure = approvals.get_request(conn, "approval", "r-ok", lenient=True)
    assert (unsure["status"], unsure["unreadable"]) == ("pending", ["status"])
    assert approvals.interrupt_pending(conn, 20) == {"approval": 3, "interaction": 0}
    assert approvals.get_request(conn, "approval", "r-ok")["status"] == "interrupted"
    # a settled row whose status is damaged: how it was settled is not known, leniently or not
    conn.execute("UPDATE approvals SET status = 'denieb' WHERE request_id = 'r-risk'")
    with pytest.raises(DamagedRecord):
        approvals.get_request(conn, "approval", "r-risk", lenient=True)


async def test_session_list_shows_a_session_whose_thread_metadata_is_damaged_without_it(tmp_path: Path) -> None:
    """Thread metadata (tags, folder...) is a record of its own: damaged, the session is listed without
    ``thread`` and named in ``unreadableThreads``, and it still reads and can be given new metadata. Before,
    session.list answered INTERNAL for every session (a bare JSON error), and so did the damaged session's
    reads once a host started on it."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            sids = [(await ui.call("session.create", {"title": f"s{i}"}))["id"] for i in range(2)]
            for sid in sids:
                await ui.call("session.updateMetadata", {"sessionId": sid, "tags": ["mine"]})
            damage(tmp_path, "UPDATE thread_meta SET tags_json = '{\"cut' WHERE session_id = ?", sids[0])
            await check_listed(ui, sids)
    async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
        await check_listed(ui, sids)
        page = await ui.call("session.get", {"sessionId": sids[0]})
        assert page["session"]["id"] == sids[0] and "thread" not in page["session"]
        await ui.call("session.updateMetadata", {"sessionId": sids[0], "tags": ["again"]})  # written over it
        listed = SessionListResult.model_validate(await ui.call("session.list", {}))
        assert listed.unreadable_threads is None
        assert {s.id: s.thread.tags if s.thread else None for s in listed.sessions} == {
            sids[0]: ["again"], sids[1]: ["mine"]}


async def check_listed(ui: HostClient, sids: list[str]) -> None:
    listed = SessionListResult.model_validate(await ui.call("session.list", {}))
    assert sorted(s.id for s in listed.sessions) == sorted(sids) and listed.unreadable_threads == [sids[0]]
    threads = {s.id: s.thread for s in listed.sessions}
    assert threads[sids[0]] is None and threads[sids[1]] is not None and threads[sids[1]].tags == ["mine"]


def test_damaged_thread_metadata_is_left_off_and_a_transcript_line_restores_it(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    for sid in ("s1", "s2"):
        add_session(conn, sid)
        thread_meta.upsert(conn, sid, thread_meta.merge(None, {"tags": ["t"]}), now_ms=NOW)
    conn.execute("UPDATE thread_meta SET tags_json = '{\"cut' WHERE session_id = 's1'")
    rows: list[dict[str, Any]] = [{"id": "s1"}, {"id": "s2"}]
    assert thread_meta.attach(conn, rows) == ["s1"]
    assert "thread" not in rows[0] and rows[1]["thread"]["tags"] == ["t"]
    with pytest.raises(DamagedRecord):
        thread_meta.get(conn, "s1")
    # a rebuild or catch-up meeting the session's session_info line writes its metadata over the damaged row
    assert thread_meta.restore_from_info(conn, "s1", {"thread": {"tags": ["back"]}}, now_ms=NOW)
    found = thread_meta.get(conn, "s1")
    assert found is not None and found["tags"] == ["back"]


def test_the_store_lists_runs_of_a_damaged_task_and_pending_plans_around_a_damaged_one(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    tasks.create_task(conn, task_id="k", title="k", prompt="p", now_ms=NOW)
    for i, status in enumerate(("completed", "complexed", "running")):
        conn.execute("INSERT INTO task_runs(id, task_id, status, started_at) VALUES (?, 'k', ?, ?)",
                     (f"r{i}", status, NOW + i))
    conn.execute("UPDATE scheduled_tasks SET config_json = '{\"cut' WHERE id = 'k'")
    found = tasks.list_runs(conn, "k")
    assert [r["id"] for r in found.items] == ["r2", "r0"] and found.unreadable == ["r1"]
    with pytest.raises(DamagedRecord):
        tasks.get_run(conn, "r1")
    with pytest.raises(NotFound):
        tasks.list_runs(conn, "none")
    for i, (kind, mode) in enumerate((("plan", None), ("goal", "sure"), ("plab", None))):
        add_session(conn, f"s{i}")
        conn.execute(
            "INSERT INTO plan_approvals(request_id, session_id, turn_id, tool_call_id, kind, plan_json, status, "
            "target_permission_mode, created_at, updated_at) VALUES (?, ?, 't', ?, ?, '# p', 'pending', ?, ?, ?)",
            (f"q{i}", f"s{i}", f"c{i}", kind, mode, NOW + i, NOW + i))
    pending = plans.list_pending(conn, None, NOW)
    assert [r["requestId"] for r in pending.items] == ["q0"] and pending.unreadable == ["q2", "q1"]
    held = plans.pending_of(conn, "s2", NOW)  # a damaged one still holds its session
    assert held is not None and held["requestId"] == "q2"


def test_the_store_lists_notifications_and_deliveries_around_a_damaged_one(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    add_session(conn, "s1")
    for i, kind in enumerate(("task.completed", "task.complexed", "task.failed")):
        conn.execute("INSERT INTO notifications(id, kind, session_id, session_title, turn_id, created_at) "
                     "VALUES (?, ?, 's1', 't', ?, ?)", (f"n{i}", kind, f"t{i}", NOW + i))
    page, nxt, unread = notifications.list_notifications(conn, unread_only=False, limit=2, cursor=None)
    assert [n["id"] for n in page.items] == ["n2"] and page.unreadable == ["n1"] and unread == 3
    assert nxt == (NOW + 1, "n1")  # from the damaged row's key: the next page starts past it
    for i, (status, ceiling) in enumerate((("queued", "ask"), ("queueb", "ask"), ("failed", "al"))):
        conn.execute(
            "INSERT INTO session_collaboration_messages(id, plugin_id, source_session_id, source_title, "
            "target_session_id, target_title, kind, content, status, idempotency_key, remaining_hops, "
            "permission_ceiling, created_at, updated_at) VALUES (?, 'p', 's1', 'a', 's1', 'b', 'task', 'c', ?, ?, "
            "4, ?, ?, ?)", (f"d{i}", status, f"k{i}", ceiling, NOW + i, NOW + i))
    found, after = collab.list_deliveries(conn, session_id="s1", direction="all", status=None, limit=3, before=None)
    assert [d["id"] for d in found.items] == ["d0"] and found.unreadable == ["d2", "d1"] and after is None
    with pytest.raises(DamagedRecord):
        collab.get(conn, "d1", checked=True)
    assert collab.get(conn, "d1")["status"] == "queueb"  # the host's own transitions read it unchecked


def test_the_store_lists_artifacts_around_a_damaged_one(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    for i, op in enumerate(("write", "wrote", "edit")):
        conn.execute("INSERT INTO artifacts VALUES ('s1', ?, ?, NULL, ?)", (f"/w/f{i}", op, NOW + i))
    page, nxt = artifacts.list_artifacts(conn, session_id="s1", limit=2, cursor=None)
    assert [a["path"] for a in page.items] == ["/w/f2"] and page.unreadable == ["/w/f1"]
    assert nxt is not None and nxt[:2] == [NOW + 1, "s1"]  # the damaged row's key: the next page is past it
    rest, after = artifacts.list_artifacts(conn, session_id="s1", limit=2, cursor=nxt)
    assert [a["path"] for a in rest.items] == ["/w/f0"] and rest.unreadable == [] and after is None
