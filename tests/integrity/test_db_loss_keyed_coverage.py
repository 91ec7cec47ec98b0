"""Every keyed (mutating) method, retried after a lost or corrupt ``pi.sqlite``: probed by a test, or exempted
here with the reason. ``test_every_keyed_method_is_probed_or_exempted`` keeps the list whole: a new mutating
method fails it until it gets a probe or an exemption.

The probes below (black-box, ``tests/integrity/test_db_loss_receipts.py``'s harness) cover what that module
does not call: the queue's edits and take, ``configSync.*``, the ledger's begin / settle / cancel, turns, a
checkpoint save, a plan's answer, a tombstone's restore, a purge and a GC. Effects that are database rows only
follow the written rule (protocol/README.md section 4): effect and receipt are lost together, and the retry
runs once on what the loss left; what the test pins is that nothing happens twice.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import METHODS
from runtime.client import HostClient, RpcError
from tests.hostkit import msg
from tests.integrity.test_db_loss_receipts import _damage, _on_host
from tests.revisions.helpers import transcript_path

_RECEIPTS = "tests.integrity.test_db_loss_receipts"
_HERE = "tests.integrity.test_db_loss_keyed_coverage"
_SECRETS = "tests.integrity.test_secret_retry_after_db_loss"
_COLLAB_LINES = "tests.integrity.test_db_loss_collab_lines"

PROBED: dict[str, tuple[str, str]] = {
    # method -> (module, test) retrying it, keyed, after the database was deleted and corrupted
    "session.appendMessage": (_RECEIPTS,
                              "test_a_retried_append_archived_by_a_regenerate_is_answered_not_written_again"),
    **{m: (_RECEIPTS, "test_a_retried_create_or_fork_is_answered_as_the_first_time_after_the_loss")
       for m in ("session.create", "session.fork")},
    **{m: (_RECEIPTS, "test_a_retried_session_change_is_answered_as_the_first_time_after_the_loss")
       for m in ("session.rename", "session.update", "session.updateMetadata", "sessions.trash", "sessions.restore",
                 "session.truncateFrom", "session.replaceMessages", "session.activateRevision",
                 "session.assistantEdit")},
    "plugins.uninstall": (_RECEIPTS, "test_a_retried_uninstall_is_answered_as_the_first_time_after_the_loss"),
    **{m: (_RECEIPTS, "test_a_retried_answer_of_a_request_is_answered_as_the_first_time_after_the_loss")
       for m in ("approvals.respond", "interactions.respond")},
    **{m: (_RECEIPTS, "test_a_retried_database_only_change_runs_once_on_what_the_loss_left")
       for m in ("session.queuePush", "tasks.create", "settings.set")},
    **{m: (_RECEIPTS, "test_a_retried_plugin_registration_is_answered_as_the_first_time_after_the_loss")
       for m in ("plugins.register", "plugins.setEnabled")},
    **{m: (_RECEIPTS, "test_a_retried_change_held_in_a_file_is_answered_once_after_the_loss")
       for m in ("session.saveActiveRevision", "session.deleteMessage", "session.delete", "session.appendCompaction",
                 "secrets.set", "attachments.put", "projects.remove")},
    **{m: (_RECEIPTS, "test_a_retried_review_record_and_restore_answer_as_the_first_time_after_the_loss")
       for m in ("review.record", "review.restore")},
    "plans.submit": (_RECEIPTS, "test_a_retried_plan_submission_writes_no_second_artifact_after_the_loss"),
    **{m: (_RECEIPTS, "test_a_retried_import_is_answered_as_the_first_time_after_the_loss")
       for m in ("import.sessions", "plugins.importSession")},
    "collab.deliver": (_COLLAB_LINES,
                       "test_a_delivery_whose_input_line_was_rewritten_is_not_delivered_again_after_the_loss"),
    "session.recoverInflight": (_RECEIPTS,
                                "test_a_retried_inflight_recovery_is_answered_as_the_first_time_after_the_loss"),
    "secrets.delete": (_SECRETS, "test_a_delete_retried_after_a_newer_set_does_not_remove_it"),
    **{m: (_HERE, "test_retried_queue_edits_and_takes_run_once_on_what_the_loss_left")
       for m in ("session.queueAttach", "session.queuePrioritize", "session.queueReorder", "session.queueRemove",
                 "session.queueTake")},
    **{m: (_HERE, "test_retried_config_sync_calls_after_the_loss")
       for m in ("configSync.configure", "configSync.export", "configSync.apply")},
    **{m: (_HERE, "test_retried_turn_ledger_and_file_changes_after_the_loss")
       for m in ("session.startTurn", "session.endTurn", "session.saveInflightMessage", "collab.begin",
                 "collab.settle", "collab.cancel", "session.restoreMessage", "sessions.purge", "attachments.gc",
                 "plans.respond")},
}

EXEMPT: dict[str, str] = {
    # Not probed after a lost database. Their whole effect is database rows (the route runs them in the DB
    # writer, or their handler touches no file), so the written rule decides: the retry runs once on what the
    # loss left (a row gone with the database is NOT_FOUND, a row made again gets a new id).
    **dict.fromkeys(("notifications.markRead", "notifications.markAllRead", "notifications.clear"),
                    "database only: notification rows"),
    **dict.fromkeys(("approvals.request", "interactions.request", "approvals.removeRule"),
                    "database only: a pending request row (its sidecar asks again), a permission rule. Not "
                    "probed: a request a rule answers at once also writes a decision line (its retry after the "
                    "loss needs its running turn, a database row)"),
    "attachments.ref": "database only: a blob's reference rows",
    **dict.fromkeys(("tasks.update", "tasks.delete", "tasks.startRun", "tasks.finishRun"),
                    "database only: scheduled tasks and their runs"),
    **dict.fromkeys(("plans.startExecution", "plans.finishExecution"),
                    "database only: the execution state on the plan approval row (gone with the database)"),
    **dict.fromkeys(("settings.update", "settings.delete", "skills.put", "skills.delete", "workspace.open",
                     "projects.pin", "projectGroups.save", "projectGroups.delete", "projectGroups.setMemory",
                     "projectGroups.setInstructions"),
                    "database only: kv settings, skills, projects and groups"),
    **dict.fromkeys(("providers.reorder", "providers.sync", "models.add", "models.remove", "models.refresh"),
                    "database only: provider and model rows"),
    # A provider's API key is a secret file written with the call's receipt MAC (store/config/secrets.py), so
    # a retry does not write it again; the provider row is a database row.
    **dict.fromkeys(("providers.create", "providers.update", "providers.delete"),
                    "provider rows; the key's file carries the receipt MAC like secrets.set"),
    # Named by its content like attachments.put (probed): a retry writes the same bytes to the same name.
    "attachments.importFile": "content-addressed like attachments.put",
}


def test_every_keyed_method_is_probed_or_exempted() -> None:
    keyed = {name for name, spec in METHODS.items() if spec.mutating}
    assert sorted(set(PROBED) & set(EXEMPT)) == []
    assert sorted(keyed - set(PROBED) - set(EXEMPT)) == []  # a new keyed method: probe it, or say why not
    assert sorted((set(PROBED) | set(EXEMPT)) - keyed) == []
    for method, (module, test) in PROBED.items():
        assert callable(getattr(importlib.import_module(module), test, None)), (method, module, test)


async def _keyed_calls(calls: list[tuple[str, HostClient, str, dict[str, Any]]]) -> dict[str, Any]:
    """Each ``(name, client, method, params)`` called (``params`` keyed as ``k-<name>``): the answers, or the
    error codes, by name."""
    got: dict[str, Any] = {}
    for name, client, method, params in calls:
        try:
            got[name] = await client.call(method, {**params, "submissionId": f"k-{name}"})
        except RpcError as exc:
            got[name] = exc.data_code
    return got


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_retried_queue_edits_and_takes_run_once_on_what_the_loss_left(tmp_path: Path, how: str) -> None:
    """The queue is database rows only: the entries, their leases and the edits' receipts go with the database
    together. The retried prioritize, reorder and remove find no entry (NOT_FOUND); the retried take hands out
    nothing (``empty``: what it took went with the database, and nothing is taken twice); the retried attach
    attaches again (the controller is this process's memory) to the queue the loss left."""
    calls: list[tuple[str, str, str, dict[str, Any]]] = []

    async def build(c: HostClient, sc: HostClient) -> dict[str, Any]:
        await c.call("session.create", {"sessionId": "s1", "title": "t"})
        ids = [(await c.call("session.queuePush", {"sessionId": "s1", "principal": "ui", "content": f"p{n}",
                                                   "permissionMode": "ask"}))["entry"]["id"] for n in range(4)]
        calls.extend([
            ("attach", "sc", "session.queueAttach", {"sessionId": "s1", "controllerId": "ctl"}),
            ("prioritize", "c", "session.queuePrioritize", {"sessionId": "s1", "entryId": ids[2]}),
            ("reorder", "c", "session.queueReorder", {"sessionId": "s1", "entryId": ids[0], "direction": "down"}),
            ("remove", "c", "session.queueRemove", {"sessionId": "s1", "entryId": ids[3]}),
            ("take", "sc", "session.queueTake", {"sessionId": "s1", "controllerId": "ctl"}),
        ])
        return await _keyed_calls([(n, sc if who == "sc" else c, m, p) for n, who, m, p in calls])

    async def retry(c: HostClient, sc: HostClient) -> dict[str, Any]:
        got = await _keyed_calls([(n, sc if who == "sc" else c, m, p) for n, who, m, p in calls])
        got["queue"] = await c.call("session.queueList", {"sessionId": "s1"})
        return got

    with trio.fail_after(60):
        first = await _on_host(tmp_path, build, sidecar=True)
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry, sidecar=True)
    assert first["take"]["entry"]["content"] == "p2" and len(first["remove"]["entries"]) == 3
    assert {n: got[n] for n in ("prioritize", "reorder", "remove")} == dict.fromkeys(
        ("prioritize", "reorder", "remove"), "NOT_FOUND")
    assert got["take"] == {"entry": None, "reason": "empty"}
    assert got["attach"] == got["queue"] == {"entries": [], "held": False, "controllerId": "ctl"}


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_retried_config_sync_calls_after_the_loss(tmp_path: Path, how: str) -> None:
    """``configSync.export`` writes ``config-sync/pending.bin``; its receipt was a database row only. After the
    loss its retry exported again: a new bundle (a fresh nonce, and what the loss left) written over the first
    one, and answered instead of the first. ``pending.receipt`` names the keyed export that wrote
    ``pending.bin`` now: the retry answers that bundle and writes nothing. The retried configure finds its own
    secret writes (no password put back: the later one stays) and sets its settings on what the loss left; the
    retried apply applies the same bundle again (base.bin keeps the same bytes)."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    sync_dir = tmp_path / "config-sync"

    async def build(c: HostClient) -> dict[str, Any]:
        calls.append(("configure", "configSync.configure", {"webdavUrl": "https://dav.example/a",
                                                            "webdavPassword": "first"}))
        await c.call("settings.set", {"ns": "ui", "key": "theme", "value": "dark"})
        first = await _keyed_calls([(n, c, m, p) for n, m, p in calls])
        calls.append(("export", "configSync.export", {}))
        first.update(await _keyed_calls([(n, c, m, p) for n, m, p in calls[1:]]))
        calls.append(("apply", "configSync.apply", {"bundleBase64": first["export"]["bundleBase64"]}))
        first.update(await _keyed_calls([(n, c, m, p) for n, m, p in calls[2:]]))
        await c.call("configSync.configure", {"webdavPassword": "second"})  # later
        return first

    async def retry(c: HostClient) -> dict[str, Any]:
        got = await _keyed_calls([(n, c, m, p) for n, m, p in calls])
        got["again"] = await _keyed_calls([(n, c, m, p) for n, m, p in calls])  # now from the new receipts
        return got

    with trio.fail_after(60):
        first = await _on_host(tmp_path, build)
        files = {p.name: p.read_bytes() for p in sync_dir.iterdir()}
        secrets = {p.name: p.read_bytes() for p in (tmp_path / "secrets").iterdir()}
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry)
    assert got["export"] == first["export"]
    assert got["configure"] == first["configure"] and got["apply"] == first["apply"]
    assert got["again"] == {n: got[n] for n in ("configure", "export", "apply")}
    for name, method, _ in calls:
        METHODS[method].result_model.model_validate(got[name])
    assert {p.name: p.read_bytes() for p in sync_dir.iterdir()} == files  # no bundle written over the first
    assert {p.name: p.read_bytes() for p in (tmp_path / "secrets").iterdir()} == secrets  # no password put back


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_retried_turn_ledger_and_file_changes_after_the_loss(tmp_path: Path, how: str) -> None:
    """What the loss leaves of each, and what its retry does then (nothing twice):

    * ``session.restoreMessage`` (its receipt in the tombstone line), ``sessions.purge`` (in the delete marker
      and ``deleted-sessions.log``), ``attachments.gc`` (nothing to collect either time): the first answer;
    * ``collab.begin``: its input line stands and carries the deliver's answer: the retry answers what the
      first try answered (before, the ledger row gone, it was NOT_FOUND), and writes no second line;
    * ``plans.respond`` (an approval): its mode line carries the answer now; the request row gone, the retry
      goes to the session its restored receipt names and is answered that (before, NOT_FOUND);
    * ``collab.settle``, ``collab.cancel``: the ledger row is a database row only, so the retry finds none
      (NOT_FOUND), and nothing is written again: no second completion is queued back to the source (the
      settle's callback went with the database, and nothing makes it again);
    * ``session.startTurn`` and ``session.endTurn``: a turn is a database row, which the rebuild restores from
      the lines that name it, ended (``INDEX_LOST``): the retried start answers it as it stands and does not
      run it again (before, a running turn with a new start time, for work that had finished), and the
      retried end ends it as the first end did;
    * ``session.saveInflightMessage``: the checkpoint it wrote is gone (the final reply replaced it), and its
      turn is back ended: the retry is CONFLICT (no checkpoint for a turn that is not running; before, its
      row gone, NOT_FOUND), and writes nothing.
    """
    data, ws = tmp_path / "data", tmp_path / "ws"
    data.mkdir()
    ws.mkdir()
    calls: list[tuple[str, str, str, dict[str, Any]]] = []
    first: dict[str, Any] = {}

    async def send(c: HostClient, name: str, method: str, params: dict[str, Any], who: str = "c") -> Any:
        calls.append((name, who, method, params))
        first.update(await _keyed_calls([(name, c, method, params)]))
        return first[name]

    async def build(c: HostClient, sc: HostClient) -> None:
        for sid in ("src", "tgt", "hm", "pu", "inf"):
            await c.call("session.create", {"sessionId": sid, "title": sid})
        await c.call("session.appendMessage", {"sessionId": "hm", "message": msg("hm-u1", "q")})
        await c.call("session.deleteMessage", {"sessionId": "hm", "messageId": "hm-u1"})
        await send(c, "restoreMessage", "session.restoreMessage", {"sessionId": "hm", "messageId": "hm-u1"})
        await c.call("sessions.trash", {"sessionId": "pu"})
        await send(c, "purge", "sessions.purge", {"sessionId": "pu"})
        delivery = {"pluginId": "team", "sourceSessionId": "src", "targetSessionId": "tgt", "kind": "task"}
        did = (await c.call("collab.deliver", {**delivery, "content": "go", "idempotencyKey": "k1",
                                               "notifyOnCompletion": True}))["delivery"]["id"]
        await send(c, "startTurn", "session.startTurn", {"sessionId": "tgt", "turnId": "t1"})
        await send(c, "begin", "collab.begin", {"sessionId": "tgt", "deliveryId": did, "turnId": "t1"})
        await send(c, "settle", "collab.settle", {"sessionId": "tgt", "deliveryId": did, "turnId": "t1",
                                                  "status": "completed", "result": "ok"})
        await send(c, "endTurn", "session.endTurn", {"sessionId": "tgt", "turnId": "t1", "status": "completed"})
        other = await c.call("collab.deliver", {**delivery, "content": "go2", "idempotencyKey": "k2"})
        await send(c, "cancel", "collab.cancel", {"deliveryId": other["delivery"]["id"]})
        await sc.call("session.startTurn", {"sessionId": "inf", "turnId": "t9"})
        await send(sc, "inflight", "session.saveInflightMessage", {"sessionId": "inf", "turnId": "t9", "message": msg(
            "a9", "partial", role="assistant", meta={"status": "streaming"})}, who="sc")
        await sc.call("session.appendMessage", {"sessionId": "inf", "turnId": "t9",
                                                "message": msg("a9", "whole reply", role="assistant")})
        await sc.call("session.endTurn", {"sessionId": "inf", "turnId": "t9", "status": "completed"})
        await c.call("session.create", {"sessionId": "pl", "title": "p", "projectPath": str(ws), "mode": "plan"})
        await sc.call("session.startTurn", {"sessionId": "pl", "turnId": "p0"})
        plan = await sc.call("plans.submit", {"sessionId": "pl", "turnId": "p0", "toolCallId": "c1", "kind": "plan",
                                              "markdown": "# plan\n", "workspaceRoot": str(ws)})
        await sc.call("session.endTurn", {"sessionId": "pl", "turnId": "p0", "status": "completed"})
        await send(c, "planRespond", "plans.respond", {"requestId": plan["requestId"], "action": "approve"})
        await send(c, "gc", "attachments.gc", {})
        first["src-queue"] = (await c.call("session.queueList", {"sessionId": "src"}))["entries"]

    async def retry(c: HostClient, sc: HostClient) -> dict[str, Any]:
        got = await _keyed_calls([(n, sc if who == "sc" else c, m, p) for n, who, m, p in calls])
        got["src-queue"] = (await c.call("session.queueList", {"sessionId": "src"}))["entries"]
        got["sessions"] = sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])
        return got

    sessions = ("src", "tgt", "hm", "inf", "pl")
    with trio.fail_after(90):
        await _on_host(data, build, sidecar=True)
        files = {sid: transcript_path(data, sid).read_bytes() for sid in sessions}
        _damage(data, how)
        got = await _on_host(data, retry, sidecar=True)
    assert first["inflight"] == {"saved": True} and first["settle"]["callback"]["kind"] == "completion"
    assert [e["sessionMessageId"] for e in first["src-queue"]] == [first["settle"]["callback"]["id"]]
    for name in ("restoreMessage", "purge", "gc", "begin", "planRespond"):
        assert got[name] == first[name], name
    assert {n: got[n] for n in ("settle", "cancel", "inflight")} == {
        "settle": "NOT_FOUND", "cancel": "NOT_FOUND", "inflight": "CONFLICT"}
    assert got["src-queue"] == []  # no second completion queued back (the first went with the database)
    assert (got["startTurn"]["id"], got["startTurn"]["status"], got["startTurn"]["errorCode"]) == (
        "t1", "aborted", "INDEX_LOST")
    assert got["endTurn"]["turn"]["status"] == "completed"
    assert got["sessions"] == sorted(sessions)  # pu stays purged
    assert {sid: transcript_path(data, sid).read_bytes() for sid in sessions} == files  # nothing written again
