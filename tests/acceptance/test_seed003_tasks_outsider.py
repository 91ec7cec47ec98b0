"""Seed 003 §4.11 scheduled tasks + task runs, §4.14 notifications, §8 retention, §4.12/§10 secrets and §4.3/§4.4
providers and the model catalog, read by a hostile outsider: black-box probes against real ``pi-host serve``
processes over WebSocket (the methods protocol/README.md documents), and, for the catalog, a real HTTP server
on 127.0.0.1 that answers garbage or hangs. Each probe quotes its sentence and checks it where it is easiest
to break: a SIGKILL at a commit and a retry with the same key (exactly one effect), bad input (a clear code,
nothing changed), and the limits. Probes that need no restart share one host (``shared``); the others run
on a data directory of their own. The other seed 003 outsider modules' checks are not repeated here."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import stat
import time
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.acceptance.outsiderkit import all_pages, client, code_of, data_dir, killed_during, real_host, shared_host
from tests.hostkit import HostProcess, boot_killed_at, call_killed_at, start_host_process
from tests.httpkit import FakeProvider, Reply


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that need no restart (each uses ids of its own)."""
    yield from shared_host(tmp_path_factory, "shared")


def at_ms(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def every_file_but_the_vault(data: Path) -> bytes:
    """Every byte under the data directory except the encrypted secret store itself."""
    return b"".join(p.read_bytes() for p in sorted(data.rglob("*"))
                    if p.is_file() and "secrets" not in p.relative_to(data).parts[:1])


async def all_notifications(c: HostClient) -> list[dict[str, Any]]:
    return await all_pages(c, "notifications.list", "notifications")


# ------------------------------------------------------------------------------- §4.11 scheduled tasks

BAD_SCHEDULES: list[Any] = [
    {"hour": 24, "minute": 0}, {"hour": 9, "minute": 60}, {"hour": -1, "minute": 0}, {"hour": 9, "minute": -1},
    {"hour": "9", "minute": 0}, {"hour": True, "minute": 0}, {"hour": 9.5, "minute": 0},
    {"hour": 9, "minute": 0, "weekday": 7}, {"hour": 9, "minute": 0, "weekday": -1}, "09:00", [9, 0],
]


async def test_bad_task_input_is_refused_with_a_clear_code_and_changes_nothing(shared: HostProcess) -> None:
    """§4.11: cadence "manual | hourly | daily | weekly", the schedule {hour, minute, weekday} in config_json,
    "Invalid or empty selections are rejected before mutation": an hour or minute outside the clock, a weekday
    outside 0-6, a schedule of another shape (top level or inside config), an unknown cadence, mode,
    permission or thinking level, a providerId without its modelId ("paired") each give INVALID_PARAMS on
    create and on update, and neither creates a task nor changes one."""
    with trio.fail_after(60):
        async with client(shared) as c:
            before = (await c.call("tasks.list", {}))["tasks"]
            base = {"title": "bad-input", "prompt": "p", "cadence": "daily"}
            bad: list[dict[str, Any]] = [{"schedule": s} for s in BAD_SCHEDULES]
            bad += [{"config": {"schedule": s}} for s in BAD_SCHEDULES]
            bad += [{"cadence": "yearly"}, {"cadence": "Daily"}, {"mode": "autopilot"}, {"permissionMode": "root"},
                    {"thinkingLevel": "extreme"}, {"providerId": "p-only"}, {"modelId": "m-only"},
                    {"title": ""}, {"prompt": ""}, {"enabled": "yes"}, {"config": "mode=agent"},
                    {"config": {"workspacePath": ""}}, {"config": {"providerId": "", "modelId": "m"}},
                    {"config": {"providerId": "p", "modelId": ""}}]
            for extra in bad:
                assert await code_of(c, "tasks.create", {**base, **extra}) == "INVALID_PARAMS", extra
            for task_id in ("a b", "", "x" * 201, "t\u00e9"):
                assert await code_of(c, "tasks.create", {**base, "taskId": task_id}) == "INVALID_PARAMS", task_id
            assert await code_of(c, "tasks.create", {**base, "projectId": 987_654}) in ("NOT_FOUND", "INVALID_PARAMS")
            assert (await c.call("tasks.list", {}))["tasks"] == before
            good = await c.call("tasks.create", {**base, "taskId": "bad-input-good",
                                                 "schedule": {"hour": 23, "minute": 59}})
            for extra in bad:
                assert await code_of(c, "tasks.update", {"taskId": good["id"], **extra}) == "INVALID_PARAMS", extra
            assert await code_of(c, "tasks.update", {"taskId": "no-such-task", "title": "x"}) == "NOT_FOUND"
            assert await c.call("tasks.get", {"taskId": good["id"]}) == good
            assert [t["id"] for t in (await c.call("tasks.list", {}))["tasks"]] == [
                t["id"] for t in before] + [good["id"]]


async def test_run_history_refuses_overlaps_stale_settles_and_unknown_ids_without_a_trace(
        shared: HostProcess) -> None:
    """§4.11 task_runs: status "running | completed | aborted | error", one history per task, the run's
    transcript by session_id; "CRUD + run history round-trip through host RPC only" (§11.6). A run id taken,
    a status outside the terminal set, an unknown run, task or session, a second terminal status: each is
    refused with its code and the history reads as before. A deleted task takes its runs with it (ON DELETE
    CASCADE): they can no longer be read or settled."""
    with trio.fail_after(60):
        async with client(shared, kind="agent", client_id="runs-agent") as c:
            task = await c.call("tasks.create", {"taskId": "lc-task", "title": "lc", "prompt": "p"})
            run = await c.call("tasks.startRun", {"taskId": task["id"], "runId": "lc-r1"})
            assert run["status"] == "running"
            history = (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"]
            assert await code_of(c, "tasks.startRun", {"taskId": task["id"], "runId": "lc-r1"}) == "CONFLICT"
            assert await code_of(c, "tasks.startRun", {"taskId": "no-such-task"}) == "NOT_FOUND"
            assert await code_of(c, "tasks.startRun", {"taskId": task["id"], "sessionId": "s_nope"}) \
                == "SESSION_NOT_FOUND"
            for status in ("running", "done", ""):
                assert await code_of(c, "tasks.finishRun", {"runId": "lc-r1", "status": status}) \
                    == "INVALID_PARAMS", status
            assert await code_of(c, "tasks.finishRun", {"runId": "no-such-run", "status": "completed"}) \
                == "NOT_FOUND"
            assert await code_of(c, "tasks.finishRun", {"runId": "lc-r1", "status": "completed",
                                                        "sessionId": "s_nope"}) == "SESSION_NOT_FOUND"
            for limit in (0, 101, -1):
                assert await code_of(c, "tasks.runs", {"taskId": task["id"], "limit": limit}) == "INVALID_PARAMS"
            assert (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"] == history
            done = await c.call("tasks.finishRun", {"runId": "lc-r1", "status": "error", "errorCode": "E_X"})
            assert (done["status"], done["errorCode"]) == ("error", "E_X") and done["endedAt"] >= done["startedAt"]
            assert await code_of(c, "tasks.finishRun", {"runId": "lc-r1", "status": "completed"}) == "CONFLICT"
            assert await code_of(c, "tasks.startRun", {"taskId": task["id"], "runId": "lc-r1"}) == "CONFLICT"
            assert (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"] == [
                {k: v for k, v in done.items() if k != "settings"}]
            assert (await c.call("tasks.delete", {"taskId": task["id"]}))["deleted"] is True
            assert await code_of(c, "tasks.runs", {"taskId": task["id"]}) == "NOT_FOUND"
            assert await code_of(c, "tasks.finishRun", {"runId": "lc-r1", "status": "error"}) == "NOT_FOUND"
            assert await code_of(c, "tasks.delete", {"taskId": task["id"]}) == "NOT_FOUND"
            assert await code_of(c, "tasks.get", {"taskId": task["id"]}) == "NOT_FOUND"


async def test_keyed_task_writes_killed_after_their_commit_answer_once_on_retry(tmp_path: Path) -> None:
    """§11.6 run history through RPC, RELIABILITY rule 10 (the receipt commits with the effect): a SIGKILL
    after the DB writer's commit (``index.after_commit``: the first of a fresh host, the second when the
    run starts on it too) of tasks.startRun, tasks.finishRun and tasks.delete, before the answer. The retry
    with the same key answers what the first try would have and adds nothing: one run, not two; a finished
    run stays finished (the boot fence aborts only runs still running); the deleted task stays deleted."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data) as (_proc, c):
            task = await c.call("tasks.create", {"taskId": "kt", "title": "k", "prompt": "p"})
        start = {"taskId": "kt", "runId": "kt-r1", "submissionId": "start-1"}
        await call_killed_at(data, "index.after_commit", "tasks.startRun", start, client_id="outsider")
        async with real_host(data) as (_proc, c):
            again = await c.call("tasks.startRun", start)
            assert (again["id"], again["taskId"]) == ("kt-r1", "kt")
            assert await c.call("tasks.startRun", start) == again
            runs = (await c.call("tasks.runs", {"taskId": "kt"}))["runs"]
            assert [(r["id"], r["status"]) for r in runs] == [("kt-r1", "aborted")]
        finish = {"runId": "kt-r2", "status": "completed", "submissionId": "finish-1"}
        await killed_during(data, "index.after_commit:2", [
            ("tasks.startRun", {"taskId": "kt", "runId": "kt-r2"}), ("tasks.finishRun", finish)])
        async with real_host(data) as (_proc, c):
            runs = (await c.call("tasks.runs", {"taskId": "kt"}))["runs"]
            assert [(r["id"], r["status"]) for r in runs] == [("kt-r2", "completed"), ("kt-r1", "aborted")]
            settled = await c.call("tasks.finishRun", finish)
            assert (settled["status"], settled["endedAt"]) == ("completed", runs[0]["endedAt"])
            assert (await c.call("tasks.runs", {"taskId": "kt"}))["runs"] == runs
        delete = {"taskId": "kt", "submissionId": "delete-1"}
        await call_killed_at(data, "index.after_commit", "tasks.delete", delete, client_id="outsider")
        async with real_host(data) as (_proc, c):
            assert await c.call("tasks.delete", delete) == {"taskId": "kt", "deleted": True}
            assert (await c.call("tasks.list", {}))["tasks"] == []
            assert await code_of(c, "tasks.runs", {"taskId": task["id"]}) == "NOT_FOUND"
            assert await code_of(c, "tasks.create", {"taskId": "kt", "title": "k", "prompt": "p",
                                                     "submissionId": "start-1"}) == "IDEMPOTENCY_CONFLICT"


async def test_a_run_running_at_a_clean_shutdown_is_aborted_at_the_next_boot(tmp_path: Path) -> None:
    """§4.11 run status "running | completed | aborted | error" with a task whose run is running when the host
    is asked to stop (SIGTERM, protocol/README "Shutdown"): the next boot shows it aborted with an end time,
    the task and its schedule intact, and the run can be neither finished late nor started again."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        proc = start_host_process(data)
        async with client(proc, kind="agent") as c:
            task = await c.call("tasks.create", {"taskId": "sd", "title": "sd", "prompt": "p", "cadence": "daily",
                                                 "schedule": {"hour": 4, "minute": 30}})
            await c.call("tasks.startRun", {"taskId": "sd", "runId": "sd-r1"})
        assert proc.terminate() == 0
        async with real_host(data, kind="agent") as (_proc, c):
            [run] = (await c.call("tasks.runs", {"taskId": "sd"}))["runs"]
            assert run["status"] == "aborted" and run["endedAt"] is not None and run["endedAt"] >= run["startedAt"]
            assert await code_of(c, "tasks.finishRun", {"runId": "sd-r1", "status": "completed"}) == "CONFLICT"
            kept = await c.call("tasks.get", {"taskId": "sd"})
            assert (kept["schedule"], kept["nextRunAt"]) == (task["schedule"], task["nextRunAt"])


def _set_next_run_at(data: Path, task_id: str, next_ms: int | None) -> None:
    """Offline, with the host down: the task's stored nextRunAt (config_json) moved to ``next_ms`` (``None``:
    removed, as an older build's row)."""
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        (raw,) = conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = ?", (task_id,)).fetchone()
        config = json.loads(raw)
        config["nextRunAt"] = next_ms
        if next_ms is None:
            del config["nextRunAt"]
        conn.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = ?", (json.dumps(config), task_id))
        conn.commit()
    finally:
        conn.close()


async def test_a_due_task_fires_once_after_a_kill_mid_fire_and_days_of_downtime_and_uses_local_time(
        tmp_path: Path) -> None:
    """§4.11: "Daily/weekly schedules use the host local timezone" (a host in Asia/Kathmandu, UTC+05:45: the
    slot is 05:07 there, not UTC nor a whole-hour zone), nextRunAt in epoch milliseconds; the run row is the
    run history. A task whose slot passed three days ago while the host was down fires once, not three times;
    a SIGKILL at the fire before its commit leaves no run and fires it again at the next boot, once; the slot
    moves to the next local 05:07; a SIGKILL with the run running leaves it aborted and fires nothing more."""
    data = data_dir(tmp_path)
    env = {"TZ": "Asia/Kathmandu"}
    zone = ZoneInfo("Asia/Kathmandu")
    with trio.fail_after(120):
        proc = start_host_process(data, env=env)
        try:
            async with client(proc) as c:
                task = await c.call("tasks.create", {"taskId": "due", "title": "due", "prompt": "p",
                                                     "cadence": "daily", "schedule": {"hour": 5, "minute": 7}})
        finally:
            proc.kill9()
        slot = datetime.fromtimestamp(at_ms(task["nextRunAt"]) / 1000, zone)
        assert (slot.hour, slot.minute, slot.second) == (5, 7, 0), task["nextRunAt"]
        assert at_ms(task["nextRunAt"]) > time.time() * 1000
        _set_next_run_at(data, "due", int(time.time() * 1000) - 3 * 86_400_000)
        assert boot_killed_at(data, "scheduler.fire.after_start")
        proc = start_host_process(data, env=env)
        try:
            async with client(proc) as c:
                await c.subscribe(["task.due"], cursor=0)
                due = await c.next_event()
                runs = (await c.call("tasks.runs", {"taskId": "due"}))["runs"]
                assert [r["id"] for r in runs] == [due.data["runId"]]
                fired = await c.call("tasks.get", {"taskId": "due"})
        finally:
            proc.kill9()
        assert [r["status"] for r in runs] == ["running"]
        nxt = at_ms(fired["nextRunAt"])
        assert nxt > runs[0]["startedAt"] and nxt - runs[0]["startedAt"] <= 86_400_000
        slot = datetime.fromtimestamp(nxt / 1000, zone)
        assert (slot.hour, slot.minute) == (5, 7)
        proc = start_host_process(data, env=env)  # the same zone: a host restarted elsewhere moves the slot
        try:
            async with client(proc, kind="agent") as c:
                again = (await c.call("tasks.runs", {"taskId": "due"}))["runs"]
                assert [(r["id"], r["status"]) for r in again] == [(runs[0]["id"], "aborted")]
                assert (await c.call("tasks.get", {"taskId": "due"}))["nextRunAt"] == fired["nextRunAt"]
        finally:
            proc.kill9()


# -------------------------------------------------------------------------- §4.14 notifications, §8

async def test_notification_reads_and_writes_refuse_bad_input_and_a_bad_end_turn_makes_no_row(
        shared: HostProcess) -> None:
    """§4.14: kind "task.completed | task.failed" only, "aborted never inserts a row"; mark-read / clear take
    ids. A terminal update with a status outside the set, a list limit outside 1-200 or a cursor the host never
    gave, ids that are not a list of strings: each a clear code, the turn still running and the inbox as it
    was. A turn of another session is not this session's to end. "Permission requests ... are not
    notification sources": an approval and a question asked in the turn add none."""
    with trio.fail_after(60):
        async with client(shared, kind="agent", client_id="notif-agent") as c:
            sid = (await c.call("session.create", {"title": "bad end"}))["id"]
            other = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "nb-t1"})
            inbox = await all_notifications(c)
            for status in ("running", "done", "cancelled", ""):
                assert await code_of(c, "session.endTurn", {"sessionId": sid, "turnId": "nb-t1",
                                                            "status": status}) == "INVALID_PARAMS", status
            assert await code_of(c, "session.endTurn", {"sessionId": other, "turnId": "nb-t1",
                                                        "status": "completed"}) in ("NOT_FOUND", "CONFLICT")
            for params in ({"limit": 0}, {"limit": 201}, {"limit": "5"}, {"unreadOnly": "yes"}):
                assert await code_of(c, "notifications.list", params) == "INVALID_PARAMS", params
            assert await code_of(c, "notifications.list", {"cursor": "not-a-cursor"}) in (
                "INVALID_CURSOR", "INVALID_PARAMS")
            for params in ({"ids": "n_1"}, {"ids": [1, 2]}, {"ids": []}, {}):
                assert await code_of(c, "notifications.markRead", params) == "INVALID_PARAMS", params
            assert await code_of(c, "notifications.clear", {"ids": "n_1"}) == "INVALID_PARAMS"
            await c.call("approvals.request", {"sessionId": sid, "turnId": "nb-t1", "toolCallId": "nb-c1",
                                               "tool": "Bash", "risk": "high", "argsSummary": "rm -rf build"})
            await c.call("interactions.request", {"sessionId": sid, "turnId": "nb-t1", "question": "Which one?",
                                                  "allowFreeText": True})
            [turn] = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
            assert turn["status"] == "running"
            assert await all_notifications(c) == inbox
            ended = await c.call("session.endTurn", {"sessionId": sid, "turnId": "nb-t1", "status": "completed"})
            assert ended["notification"]["turnId"] == "nb-t1"


def _copy_notifications(data: Path, template_turn: str, rows: list[tuple[str, str, int]]) -> None:
    """Offline: rows written beside the host's own, as copies of the notification of ``template_turn`` with
    another (id, turn_id, created_at) each: what a build without the cap, or a hand edit, could have left."""
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(notifications)")]
        (template,) = conn.execute(f"SELECT {', '.join(cols)} FROM notifications WHERE turn_id = ?",
                                   (template_turn,)).fetchall()
        for nid, turn_id, created in rows:
            row = dict(zip(cols, template, strict=True)) | {"id": nid, "turn_id": turn_id, "created_at": created}
            conn.execute(f"INSERT INTO notifications ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                         [row[k] for k in cols])
        conn.commit()
    finally:
        conn.close()


async def test_the_newest_200_cap_is_repaired_at_boot_and_holds_across_restarts_and_a_keyed_retry(
        tmp_path: Path) -> None:
    """§8: "notifications: enforce the newest-200 global cap after every insert and at boot as a defensive
    repair; rows otherwise survive restart"; §4.14 "prunes all but the newest 200 rows by (created_at DESC, id
    DESC)" and "Repeating a terminal update cannot duplicate a notification". 150 rows, then 60 older ones
    left by hand (ties on created_at broken by id): boot keeps exactly the newest 200. 60 more terminal turns on
    the next host push out the hand-made ones and the 10 oldest real ones. A keyed endTurn killed after its
    commit and retried adds its notification once."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {"title": "cap"}))["id"]
            for i in range(150):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"a{i:03d}"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"a{i:03d}", "status": "completed"})
            oldest = min(n["createdAt"] for n in await all_notifications(c))
        _copy_notifications(data, "a000", [(f"n_hand{i:02d}", f"hand{i:02d}", oldest - 1) for i in range(60)])
        async with real_host(data, kind="agent") as (_proc, c):
            kept = await all_notifications(c)
            assert len(kept) == 200
            assert {n["turnId"] for n in kept} == {f"a{i:03d}" for i in range(150)} | {
                f"hand{i:02d}" for i in range(10, 60)}
            for i in range(150, 210):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"a{i:03d}"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"a{i:03d}", "status": "error"})
        end = {"sessionId": sid, "turnId": "keyed", "status": "completed", "submissionId": "end-keyed"}
        await killed_during(data, "session.endTurn.after_commit:1", [
            ("session.startTurn", {"sessionId": sid, "turnId": "keyed"}), ("session.endTurn", end)], kind="agent")
        async with real_host(data, kind="agent") as (_proc, c):
            first = await c.call("session.endTurn", end)
            assert first["turn"]["status"] == "completed"
            assert await c.call("session.endTurn", end) == first
            kept = await all_notifications(c)
            assert [n["turnId"] for n in kept].count("keyed") == 1 and kept[0]["turnId"] == "keyed"
            assert {n["turnId"] for n in kept} == {"keyed"} | {f"a{i:03d}" for i in range(11, 210)}
            keys = [(n["createdAt"], n["id"]) for n in kept]
            assert keys == sorted(keys, reverse=True)


# ------------------------------------------------------------------------------------ §4.12, §10 secrets

async def test_secret_values_stay_out_of_sqlite_logs_receipts_and_the_config_bundle_through_a_kill(
        tmp_path: Path) -> None:
    """§10.3 "Secret values never in SQLite; only secrets_meta bookkeeping", §4.12 "Secret values never enter
    the DB", §10.1/§10.4 nothing but the vault holds them. A provider key the provider's HTTP server echoes back
    in its error body (as real APIs do: "Incorrect API key provided: ..."), a key it refuses (401), a secret set
    with a key and killed after its commit then retried: no byte of any value is in any file under the data
    directory but the vault (database, WAL, logs, receipts, the config bundle) nor on the host's stderr; the
    retry answers once (version 1). §4.12: the vault's files are "sha256-named" and owner-only, like
    ".machine-key (owner-only file mode)". The WebDAV password config sync keeps goes the same way."""
    data = data_dir(tmp_path)
    key = "sk-echo-" + "Q7w2Z" * 6
    other = "tok-mcp-" + "h4Jk9" * 6
    dav = "dav-pw-" + "Rr5tY" * 6
    echoed = json.dumps({"error": {"message": f"Incorrect API key provided: {key}", "key": key}}).encode()
    stderr = b""
    with FakeProvider(Reply(status=400, body=echoed)) as server, trio.fail_after(120):
        proc = start_host_process(data)
        async with client(proc) as c:
            await c.call("providers.create", {"id": "echo", "name": "Echo", "baseUrl": server.base_url,
                                              "apiKey": key})
            assert await code_of(c, "models.refresh", {"providerId": "echo"}) == "PROVIDER_BAD_REPLY"
            server.reply = Reply(api_key="something-else")
            assert await code_of(c, "models.refresh", {"providerId": "echo"}) == "PROVIDER_UNAUTHORIZED"
            await c.call("configSync.configure", {"webdavUrl": "http://127.0.0.1:9/dav", "webdavUsername": "ada",
                                                  "webdavPassword": dav})
            await c.call("configSync.export", {})
        assert proc.terminate() == 0
        stderr += proc.proc.communicate()[1] or b""
        setp = {"ref": "mcp/echo", "value": other, "ownerKind": "mcp", "ownerId": "echo", "submissionId": "s-1"}
        await call_killed_at(data, "secrets.set.after_commit", "secrets.set", setp, client_id="outsider")
        proc = start_host_process(data)
        async with client(proc) as c:
            answer = await c.call("secrets.set", setp)
            assert answer["version"] == 1 and await c.call("secrets.set", setp) == answer
            assert (await c.call("secrets.get", {"ref": "mcp/echo"}))["value"] == other
            assert [s["ref"] for s in (await c.call("secrets.list", {"ownerKind": "mcp"}))["secrets"]] == ["mcp/echo"]
            bundle = await c.call("configSync.export", {})
            assert all(v not in json.dumps(bundle) for v in (key, other, dav))
        assert proc.terminate() == 0
        stderr += proc.proc.communicate()[1] or b""
    files = every_file_but_the_vault(data)
    assert (data / "logs").is_dir()
    vault = [p for p in (data / "secrets").rglob("*") if p.is_file()]
    assert {p.name for p in vault} >= {".machine-key", hashlib.sha256(b"mcp/echo").hexdigest() + ".sec"}
    for p in vault:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
        assert p.name == ".machine-key" or re.fullmatch(r"[0-9a-f]{64}\.sec", p.name), p.name
    for value in (key, other, dav):
        assert value.encode() not in files, value
        assert value.encode() not in stderr, value


async def test_secret_reads_are_for_agents_and_the_ui_only_and_bad_refs_change_nothing(shared: HostProcess) -> None:
    """§10.1 "The renderer never persists secrets" (the host holds them), protocol/README secrets.get "clientKind
    agent or ui only": a plugin and a CLI client are refused the value (PERMISSION_DENIED) and a test client too;
    a ref with a control character, an empty one or one over 512 bytes, a value over 64 KiB are INVALID_PARAMS
    (or PAYLOAD_TOO_LARGE) and store nothing; a delete of a ref never set says so and changes nothing."""
    with trio.fail_after(60):
        async with client(shared, client_id="sec-ui") as ui:
            await ui.call("secrets.set", {"ref": "mcp/readers", "value": "v-✓-readers", "ownerKind": "mcp"})
            before = (await ui.call("secrets.list", {}))["secrets"]
            for kind, plugin in (("plugin", "acme.tools"), ("cli", None)):
                async with client(shared, kind=kind, client_id=f"sec-{kind}", plugin_id=plugin) as c:
                    assert await code_of(c, "secrets.get", {"ref": "mcp/readers"}) == "PERMISSION_DENIED", kind
            for ref in ("mcp/\x00x", "mcp/\nx", "", "r" * 513):
                assert await code_of(ui, "secrets.set", {"ref": ref, "value": "v"}) == "INVALID_PARAMS", ref
            assert await code_of(ui, "secrets.set", {"ref": "mcp/big", "value": "v" * 65_537}) in (
                "INVALID_PARAMS", "PAYLOAD_TOO_LARGE")
            assert (await ui.call("secrets.list", {}))["secrets"] == before
            gone = await ui.call("secrets.delete", {"ref": "mcp/never-set"})
            assert gone["deleted"] is False
            assert (await ui.call("secrets.get", {"ref": "mcp/readers"}))["value"] == "v-✓-readers"
            assert (await ui.call("secrets.list", {}))["secrets"] == before


# ---------------------------------------------------------------------- §4.3 providers, §4.4 catalog

async def test_provider_writes_refuse_duplicates_credentials_and_foreign_rows_and_keep_the_first_key(
        shared: HostProcess) -> None:
    """§4.3 providers (id PRIMARY KEY, owner_plugin_id: "the user path may edit or delete only the rows it
    owns"), §10.3 keys only in the secret store: a second create of an id with another key is CONFLICT and the
    first key stays; a credential in baseUrl or config is INVALID_PARAMS and creates nothing; a plugin's row
    cannot be edited or deleted by the user path, nor a user row by a plugin (PERMISSION_DENIED), and the
    refused calls change nothing."""
    with trio.fail_after(60):
        async with client(shared, client_id="prov-ui") as ui, \
                client(shared, kind="plugin", client_id="prov-plugin", plugin_id="acme.tools") as plugin:
            made = (await ui.call("providers.create", {"id": "dup", "name": "Dup", "apiKey": "sk-first-1111"}))
            assert await code_of(ui, "providers.create", {"id": "dup", "name": "Again",
                                                          "apiKey": "sk-second-2222"}) == "CONFLICT"
            assert (await ui.call("secrets.get", {"ref": made["provider"]["secretRef"]}))["value"] == "sk-first-1111"
            assert (await ui.call("providers.get", {"providerId": "dup"})) == made
            listed = (await ui.call("providers.list", {}))["providers"]
            for bad in ({"baseUrl": "http://user:pw-in-url-9@127.0.0.1:9/v1"},
                        {"baseUrl": "http://127.0.0.1:9/v1?api_key=in-query-9"},
                        {"baseUrl": "file:///etc/passwd"}, {"baseUrl": "not a url"},
                        {"config": {"headers": {"Authorization": "Bearer in-header-9"}}},
                        {"apiKey": "sk-with\nnewline"}):
                assert await code_of(ui, "providers.create", {"id": "cred", "name": "Cred", **bad}) \
                    == "INVALID_PARAMS", bad
                assert await code_of(ui, "providers.update", {"providerId": "dup", **bad}) == "INVALID_PARAMS", bad
            assert (await ui.call("providers.list", {}))["providers"] == listed
            await plugin.call("providers.sync", {"providers": [{"id": "acme-gw", "name": "Acme"}]})
            owned = (await ui.call("providers.get", {"providerId": "acme-gw"}))["provider"]
            assert owned["ownerPluginId"] == "acme.tools"
            assert await code_of(ui, "providers.update", {"providerId": "acme-gw", "name": "Mine"}) \
                == "PERMISSION_DENIED"
            assert await code_of(ui, "providers.delete", {"providerId": "acme-gw"}) == "PERMISSION_DENIED"
            assert await code_of(plugin, "providers.update", {"providerId": "dup", "name": "Theirs"}) \
                in ("PERMISSION_DENIED", "NOT_FOUND")
            assert await code_of(plugin, "providers.delete", {"providerId": "dup"}) in (
                "PERMISSION_DENIED", "NOT_FOUND")
            assert (await ui.call("providers.get", {"providerId": "acme-gw"}))["provider"] == owned
            assert (await ui.call("providers.get", {"providerId": "dup"})) == made


GARBAGE: list[bytes] = [
    b"not json at all", b"", b"\xff\xfe\x00garbage", b"[]", b"null", b'{"data": "models"}', b'{"data": null}',
    b'{"object": "list"}', b'{"data": [{"name": "no id"}]}', b'{"data": [{"id": 7}]}', b'{"data": [{"id": ""}]}',
    b'{"data": [{"id": null}]}', b'{"data": ["m-str"]}',
    b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"data": [{"id": "big", "context_window": ' + b"9" * 5000 + b"}]}",
    json.dumps({"data": [{"id": f"m{i}"} for i in range(5001)]}).encode(),
]


async def test_the_catalog_keeps_its_rows_and_stamp_when_the_provider_answers_garbage_or_hangs(
        shared: HostProcess) -> None:
    """§4.4 "models — catalog cache", README §8.4 "Only a readable 2xx model list is written ... Otherwise
    nothing is written and the error says why". A real HTTP server on 127.0.0.1 answers: not JSON, bytes that
    are not UTF-8, JSON of the wrong shape, entries without a usable id, 100,000 nested brackets, a
    5,000-digit number, 5,001 models; hangs past timeoutMs; nothing listens. Each refresh is refused with its
    code; the catalog rows and the refresh stamp stay as the last good refresh left them, and the host keeps
    answering (a hung provider blocks nobody)."""
    with FakeProvider(Reply(models=[{"id": "good-a"}, {"id": "good-b"}])) as server, trio.fail_after(120):
        async with client(shared, client_id="cat-ui") as c:
            await c.call("providers.create", {"id": "garbage", "name": "G", "baseUrl": server.base_url})
            await c.call("models.refresh", {"providerId": "garbage"})
            rows = (await c.call("models.list", {"providerId": "garbage"}))["models"]
            stamp = await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:garbage"})
            for body in GARBAGE:
                server.reply = Reply(body=body)
                assert await code_of(c, "models.refresh", {"providerId": "garbage"}) == "PROVIDER_BAD_REPLY", body[:60]
            server.reply = Reply(models=[{"id": "late"}], delay=60)
            assert await code_of(c, "models.refresh", {"providerId": "garbage", "timeoutMs": 300}) \
                == "PROVIDER_TIMEOUT"
            await c.call("providers.create", {"id": "nobody", "name": "N", "baseUrl": "http://127.0.0.1:9/v1"})
            assert await code_of(c, "models.refresh", {"providerId": "nobody"}) == "PROVIDER_UNREACHABLE"
            assert (await c.call("models.list", {"providerId": "garbage"}))["models"] == rows
            assert await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:garbage"}) == stamp
            assert (await c.call("models.list", {"providerId": "nobody"}))["models"] == []


async def test_a_provider_deleted_while_its_refresh_hangs_gets_no_catalog_rows_back(shared: HostProcess) -> None:
    """§4.4 models "REFERENCES providers(id) ON DELETE CASCADE": the catalog holds rows of existing providers
    only. A refresh waits on a provider that hangs; meanwhile the host answers other calls and the provider is
    deleted; then the server answers with a model list. No model row and no refresh stamp of the deleted
    provider exist afterwards, and the provider stays deleted."""
    with FakeProvider(Reply(models=[{"id": "ghost-a"}, {"id": "ghost-b"}], delay=60)) as server, \
            trio.fail_after(60):
        async with client(shared, client_id="ghost-ui") as c, client(shared, client_id="ghost-ui-2") as other:
            await c.call("providers.create", {"id": "ghost", "name": "Ghost", "baseUrl": server.base_url})
            outcome: list[str | None] = []

            async def refresh() -> None:
                outcome.append(await code_of(c, "models.refresh", {"providerId": "ghost", "timeoutMs": 30_000}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(refresh)
                while not server.requests:  # noqa: ASYNC110 - another thread's progress, polled
                    await trio.sleep(0.02)
                assert "ghost" in {p["id"] for p in (await other.call("providers.list", {}))["providers"]}
                assert (await other.call("providers.delete", {"providerId": "ghost"}))["deleted"] is True
                server.close()  # releases the hung request: it answers the model list now
            assert outcome[0] in (None, "NOT_FOUND", "CONFLICT", "PROVIDER_UNREACHABLE"), outcome
            assert "ghost" not in {p["id"] for p in (await other.call("providers.list", {}))["providers"]}
            assert [m for m in (await other.call("models.list", {}))["models"] if m["providerId"] == "ghost"] == []
            assert "value" not in await other.call("settings.get", {"ns": "cache", "key": "modelRefresh:ghost"})


# ------------------------------------------------------------------ §4.11 firing, run settings, schedules

async def test_one_due_batch_fires_the_enabled_task_refuses_the_plan_task_and_skips_the_disabled_one(
        tmp_path: Path) -> None:
    """§4.11: "Missing permission keeps legacy behavior: Ask for automatic runs and inherited permission for
    Run now", "Both manual and automatic runs apply the saved level", and "A scheduled or unattended run whose
    mode is a contract mode (Plan or Goal) is explicitly rejected before provider work, .pi/<kind>/*.md
    creation, approval, or queue insertion with PLAN_REQUIRES_INTERACTIVE_SESSION". Three tasks due at once
    after a restart (their slots passed while the host was down): the enabled Agent task fires once, one
    ``task.due`` event naming its run with Ask and its saved thinking level; the Plan task's refusal is its
    history (an error run with that code, no event, no .pi file) and its slot moves on; the disabled task
    fires nothing in the same pass, and enabling it later gives it its next slot (its passed one is not due
    then). Neither does a task whose row lost its stored slot (an older build's: it is
    armed at boot for its next slot, "nothing fires at once") nor one without a schedule whose row holds a
    passed nextRunAt ("Absence of schedule leaves legacy tasks unarmed")."""
    data, ws = data_dir(tmp_path), tmp_path / "ws"
    ws.mkdir()
    daily = {"cadence": "daily", "schedule": {"hour": 6, "minute": 0}, "prompt": "p"}
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            await c.call("tasks.create", {"taskId": "go", "title": "go", "thinkingLevel": "high", **daily})
            await c.call("tasks.create", {"taskId": "off", "title": "off", "enabled": False, **daily})
            await c.call("tasks.create", {"taskId": "plan", "title": "plan", "mode": "plan",
                                          "workspacePath": str(ws), **daily})
            now_run = await c.call("tasks.startRun", {"taskId": "go", "runId": "go-now"})
            assert (now_run["settings"]["permissionMode"], now_run["settings"]["thinkingLevel"]) == (
                "inherit", "high")
            await c.call("tasks.finishRun", {"runId": "go-now", "status": "completed"})
            await c.call("tasks.create", {"taskId": "legacy", "title": "legacy", **daily})
            await c.call("tasks.create", {"taskId": "unarmed", "title": "unarmed", "prompt": "p", "cadence": "hourly"})
        past = int(time.time() * 1000) - 60_000
        for task_id in ("go", "off", "plan", "unarmed"):
            _set_next_run_at(data, task_id, past)
        _set_next_run_at(data, "legacy", None)
        async with real_host(data, kind="agent") as (_proc, c):
            await c.subscribe(["task.due"], cursor=0)
            event = await c.next_event()
            runs = (await c.call("tasks.runs", {"taskId": "go"}))["runs"]
            fired = runs[0]
            assert [r["id"] for r in runs[1:]] == ["go-now"]
            assert fired["status"] == "running"
            assert (event.topic, event.data["taskId"], event.data["runId"]) == ("task.due", "go", fired["id"])
            assert (event.data["permissionMode"], event.data["thinkingLevel"]) == ("ask", "high")
            for task_id in ("off", "legacy", "unarmed"):
                assert (await c.call("tasks.runs", {"taskId": task_id}))["runs"] == [], task_id
            assert (await c.call("tasks.get", {"taskId": "unarmed"})).get("nextRunAt") is None
            before = int(time.time() * 1000)
            enabled = await c.call("tasks.update", {"taskId": "off", "enabled": True})
            assert at_ms(enabled["nextRunAt"]) > before, enabled  # its passed slot is not due
            assert at_ms((await c.call("tasks.get", {"taskId": "legacy"}))["nextRunAt"]) > fired["startedAt"]
            [refused] = (await c.call("tasks.runs", {"taskId": "plan"}))["runs"]
            assert (refused["status"], refused["errorCode"]) == ("error", "PLAN_REQUIRES_INTERACTIVE_SESSION")
            assert at_ms((await c.call("tasks.get", {"taskId": "plan"}))["nextRunAt"]) > past + 60_000
            assert not (ws / ".pi").exists()
            assert (await c.call("plans.pending", {}))["pending"] == []
            assert (await c.call("notifications.list", {}))["notifications"] == []  # "scheduled reminders" are not
            with trio.move_on_after(0.3):
                extra = await c.next_event()
                raise AssertionError(f"a second task.due event: {extra}")


async def test_a_schedule_on_the_current_minute_is_next_due_tomorrow_and_a_removed_schedule_stays_unarmed(
        tmp_path: Path) -> None:
    """§4.11 "Daily/weekly schedules use the host local timezone", nextRunAt "epoch milliseconds" and "Absence
    of schedule leaves legacy tasks unarmed". A daily slot on the minute the host is in has passed: the next
    is tomorrow's, never now (nothing fires at once); a weekly one on today's weekday is a week on. A
    schedule a tasks.update removes leaves no nextRunAt; re-enabling, a cadence change and a SIGKILL + restart
    do not arm it; saving a schedule again arms it. Converting an hourly task to daily without calendar intent
    is refused and changes nothing."""
    data = data_dir(tmp_path)
    env = {"TZ": "UTC"}
    with trio.fail_after(60):
        proc = start_host_process(data, env=env)
        try:
            async with client(proc) as c:
                now = datetime.now(ZoneInfo("UTC"))
                here = {"hour": now.hour, "minute": now.minute}
                called = int(time.time() * 1000)
                daily = await c.call("tasks.create", {"taskId": "d", "title": "d", "prompt": "p", "cadence": "daily",
                                                      "schedule": here})
                weekly = await c.call("tasks.create", {"taskId": "w", "title": "w", "prompt": "p",
                                                       "cadence": "weekly", "schedule": here,
                                                       "weekdays": [now.isoweekday() % 7]})
                day = 86_400_000
                assert called + day - 120_000 < at_ms(daily["nextRunAt"]) <= called + day, daily["nextRunAt"]
                assert called + 7 * day - 120_000 < at_ms(weekly["nextRunAt"]) <= called + 7 * day
                gone = await c.call("tasks.update", {"taskId": "d", "schedule": None})
                assert gone.get("nextRunAt") is None
                for change in ({"enabled": False}, {"enabled": True}, {"cadence": "weekly"}, {"cadence": "daily"}):
                    assert (await c.call("tasks.update", {"taskId": "d", **change})).get("nextRunAt") is None, change
                hourly = await c.call("tasks.create", {"taskId": "h", "title": "h", "prompt": "p", "cadence": "hourly",
                                                       "schedule": {}})
                failed = await code_of(c, "tasks.update", {"taskId": "h", "cadence": "daily",
                                                           "schedule": {"hour": 1, "minute": 2}})
                assert failed == "INVALID_PARAMS"
                assert await c.call("tasks.get", {"taskId": "h"}) == hourly
        finally:
            proc.kill9()
        proc = start_host_process(data, env=env)
        try:
            async with client(proc) as c:
                assert (await c.call("tasks.get", {"taskId": "d"})).get("nextRunAt") is None
                armed = await c.call("tasks.update", {"taskId": "d", "schedule": {"hour": 3, "minute": 4}})
                at = datetime.fromtimestamp(at_ms(armed["nextRunAt"]) / 1000, ZoneInfo("UTC"))
                assert (at.hour, at.minute) == (3, 4)
        finally:
            proc.kill9()



def _m_rule(day: date) -> str:
    """The POSIX TZ rule naming ``day`` (Mm.w.d: month, its w-th such weekday, 0 = Sunday)."""
    return f"M{day.month}.{(day.day - 1) // 7 + 1}.{day.isoweekday() % 7}"


async def test_a_daily_slot_past_a_dst_change_is_at_the_local_wall_time_of_its_own_day(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """§4.11: "Daily/weekly schedules use the host local timezone": the slot is the schedule's hour:minute on
    the local clock of the day it falls on. A host whose zone leaves summer time at the coming local midnight
    (a POSIX TZ rule: XDT = UTC+1 until tomorrow 00:00, then XST = UTC+0): a daily task on the hour the host's
    clock shows now is next due tomorrow at that hour of tomorrow's clock, not an hour off (today's offset)."""
    utc_now = datetime.now(ZoneInfo("UTC"))
    tomorrow_utc = (utc_now + timedelta(days=1)).date()
    far = (utc_now + timedelta(days=180)).date()
    zone = f"XST0XDT-1,{_m_rule(far)},{_m_rule(tomorrow_utc)}/0"
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        data = data_dir(tmp_path)
        with trio.fail_after(60):
            proc = start_host_process(data, env={"TZ": zone})
            try:
                async with client(proc) as c:
                    local = time.localtime()
                    task = await c.call("tasks.create", {"taskId": "dst", "title": "dst", "prompt": "p",
                                                         "cadence": "daily",
                                                         "schedule": {"hour": local.tm_hour, "minute": 0}})
            finally:
                proc.kill9()
        following = date(local.tm_year, local.tm_mon, local.tm_mday) + timedelta(days=1)
        expected = time.mktime((following.year, following.month, following.day, local.tm_hour, 0, 0, 0, 0, -1))
        got = time.localtime(at_ms(task["nextRunAt"]) / 1000)
        assert (got.tm_mday, got.tm_hour, got.tm_min) == (following.day, local.tm_hour, 0), (task["nextRunAt"], zone)
        assert at_ms(task["nextRunAt"]) == int(expected * 1000)
    finally:
        monkeypatch.undo()
        time.tzset()

# ------------------------------------------------------------------ §4.14 what a notification holds

async def test_a_notification_holds_the_raw_title_snapshot_and_no_prose_and_acknowledged_reads_survive_a_kill(
        tmp_path: Path) -> None:
    """§4.14: "session_title is the stable session-name snapshot at notification creation ... An empty title
    remains valid and receives a localized 'Untitled task' fallback only at presentation time" (a session
    created without a title: the snapshot is its title as stored, no fallback), "No title/body prose is
    stored"; "rows otherwise survive restart until cleared" (§8) and an acknowledged mark-read or
    clear is not undone by a SIGKILL right after it."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            title = (await c.call("session.get", {"sessionId": sid}))["session"].get("title")
            for t in ("e1", "e2", "e3"):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": t})
                ended = await c.call("session.endTurn", {"sessionId": sid, "turnId": t, "status": "completed"})
            note = ended["notification"]
            assert note["sessionTitle"] == (title or "") and "ntitled" not in note["sessionTitle"], (title, note)
            assert not {"title", "body", "message", "text"} & set(note), note
            listed = await all_notifications(c)
            assert (await c.call("notifications.markRead", {"ids": [listed[-1]["id"]]}))["updated"] == 1
            assert (await c.call("notifications.clear", {"ids": [listed[0]["id"]]}))["deleted"] == 1
        async with real_host(data, kind="agent") as (_proc, c):
            page = await c.call("notifications.list", {})
            assert [n["turnId"] for n in page["notifications"]] == ["e2", "e1"]
            assert page["unreadCount"] == 1 and page["notifications"][1]["readAt"] is not None
            assert (await c.call("notifications.markAllRead", {}))["updated"] == 1
        async with real_host(data, kind="agent") as (_proc, c):
            assert (await c.call("notifications.list", {}))["unreadCount"] == 0


# ------------------------------------------------------------------ §10 secrets in refusals

async def test_a_refused_write_never_echoes_the_secret_it_carried(tmp_path: Path) -> None:
    """§10.3 secret values never in SQLite, and nothing but the vault keeps them: a write refused for its
    secret (an API key with a control character, a key too long, a vault key that is not one, a secret-named
    header in a provider's config) answers a clear error whose message and data do not repeat the value, and
    the value reaches no file of the data directory (logs included)."""
    data = data_dir(tmp_path)
    leak = "sk-LEAKME-" + "p0o9i8" * 4
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            attempts: list[tuple[str, dict[str, Any]]] = [
                ("providers.create", {"id": "x", "name": "X", "apiKey": leak + "\n"}),
                ("providers.create", {"id": "x", "name": "X", "apiKey": leak * 3000}),
                ("providers.create", {"id": "x", "name": "X", "config": {"headers": {"X-Api-Key": leak}}}),
                ("providers.create", {"id": "x", "name": "X", "baseUrl": f"http://u:{leak}@127.0.0.1:9/v1"}),
                ("secrets.set", {"ref": "configSync/vaultKey", "value": leak}),
                ("secrets.set", {"ref": "mcp/long", "value": leak * 3000}),
                ("configSync.configure", {"vaultKey": leak + "x" * (44 - len(leak))}),
            ]
            for method, params in attempts:
                try:
                    await c.call(method, params)
                except RpcError as refused:
                    assert refused.data_code in ("INVALID_PARAMS", "PAYLOAD_TOO_LARGE"), (method, refused)
                    assert "LEAKME" not in refused.message and "LEAKME" not in json.dumps(refused.data), (
                        method, refused.message, refused.data)
                else:
                    raise AssertionError(f"{method} accepted {params}")
            assert (await c.call("providers.list", {}))["providers"] == []
    assert b"LEAKME" not in every_file_but_the_vault(data)


async def test_a_notification_after_a_clock_that_ran_ahead_still_lands_on_top_and_survives_the_cap(
        tmp_path: Path) -> None:
    """§4.14 "prunes all but the newest 200 rows by (created_at DESC, id DESC)" with protocol/README "never
    earlier than (nor equal to) any notification already in the inbox": a row written while the clock ran a
    day ahead (left from an earlier run) does not push the next turn's notification below it, across a
    restart; the new one lists first and is the one the call returned."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {"title": "clock"}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "c0"})
            first = (await c.call("session.endTurn", {"sessionId": sid, "turnId": "c0",
                                                      "status": "completed"}))["notification"]
        ahead = first["createdAt"] + 86_400_000
        _copy_notifications(data, "c0", [("n_ahead", "ahead", ahead)])
        async with real_host(data, kind="agent") as (_proc, c):
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "c1"})
            made = (await c.call("session.endTurn", {"sessionId": sid, "turnId": "c1",
                                                     "status": "error"}))["notification"]
            assert made["createdAt"] > ahead
            listed = await all_notifications(c)
            assert [n["turnId"] for n in listed] == ["c1", "ahead", "c0"]
            assert listed[0] == made


async def test_inbox_pages_list_every_row_once_while_turns_end_and_rows_are_cleared_between_pages(
        shared: HostProcess) -> None:
    """§4.14 "idx_notifications_created ON notifications(created_at DESC)" read page by page (README:
    newest first, ``nextCursor``): while new notifications arrive and already-read ones are cleared between
    pages, every notification that was there when the listing began and was not cleared is listed exactly
    once and in (createdAt, id) descending order; none of the newer ones slips into a later page."""
    with trio.fail_after(60):
        async with client(shared, kind="agent", client_id="pages-agent") as c:
            sid = (await c.call("session.create", {"title": "pages"}))["id"]
            for i in range(30):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"pg{i:02d}"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"pg{i:02d}", "status": "completed"})
            seen: list[dict[str, Any]] = []
            page = await c.call("notifications.list", {"limit": 7})
            extra = 0
            while True:
                seen += page["notifications"]
                if not page.get("nextCursor"):
                    break
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"late{extra}"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"late{extra}", "status": "error"})
                await c.call("notifications.clear", {"ids": [page["notifications"][0]["id"]]})
                extra += 1
                page = await c.call("notifications.list", {"limit": 7, "cursor": page["nextCursor"]})
            mine = [n["turnId"] for n in seen if n["sessionId"] == sid]
            assert not [t for t in mine if t.startswith("late")]
            assert mine == [f"pg{i:02d}" for i in reversed(range(30))]
            keys = [(n["createdAt"], n["id"]) for n in seen]
            assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)


async def test_run_now_applies_the_tasks_own_level_permission_and_model_and_clearing_them_restores_defaults(
        shared: HostProcess) -> None:
    """§4.11: "Tasks also persist optional thinkingLevel using the existing session values (including off and
    omit) ... Both manual and automatic runs apply the saved level. Missing or cleared levels retain the legacy
    off behavior"; "the optional task-owned permissionMode plus paired providerId/modelId values ... Missing
    model fields retain run-time app-default resolution. Missing permission keeps legacy behavior: ... inherited
    permission for Run now". A pair cannot be half cleared."""
    with trio.fail_after(60):
        async with client(shared, kind="agent", client_id="settings-agent") as c:
            await c.call("tasks.create", {"taskId": "own", "title": "own", "prompt": "p", "thinkingLevel": "omit",
                                          "permissionMode": "auto", "providerId": "prov", "modelId": "mod"})
            run = await c.call("tasks.startRun", {"taskId": "own", "runId": "own-1"})
            assert {k: run["settings"].get(k) for k in ("thinkingLevel", "permissionMode", "providerId", "modelId")} \
                == {"thinkingLevel": "omit", "permissionMode": "auto", "providerId": "prov", "modelId": "mod"}
            await c.call("tasks.finishRun", {"runId": "own-1", "status": "completed"})
            for half in ({"modelId": None}, {"providerId": None}):
                assert await code_of(c, "tasks.update", {"taskId": "own", **half}) == "INVALID_PARAMS", half
            cleared = await c.call("tasks.update", {"taskId": "own", "thinkingLevel": None, "permissionMode": None,
                                                    "providerId": None, "modelId": None})
            assert not {"thinkingLevel", "permissionMode", "providerId", "modelId"} & set(cleared["config"])
            run = await c.call("tasks.startRun", {"taskId": "own", "runId": "own-2"})
            assert (run["settings"]["thinkingLevel"], run["settings"]["permissionMode"]) == ("off", "inherit")
            assert "providerId" not in run["settings"] and "modelId" not in run["settings"]
            await c.call("tasks.finishRun", {"runId": "own-2", "status": "completed"})


async def test_a_keyed_secret_delete_killed_mid_way_is_one_delete_on_retry(tmp_path: Path) -> None:
    """§4.12 secrets_meta: "Registry of which secrets exist" and the file store as the value's only home: a
    keyed secrets.delete killed after its file was set aside, before its row commits. The retry with the same
    key answers deleted (what the first try would have), the registry and the store agree the secret is gone,
    the other secret is untouched, and setting the ref again starts it anew."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            await c.call("secrets.set", {"ref": "mcp/gone", "value": "v-gone-1", "ownerKind": "mcp"})
            await c.call("secrets.set", {"ref": "mcp/kept", "value": "v-kept-1", "ownerKind": "mcp"})
        delete = {"ref": "mcp/gone", "submissionId": "del-gone"}
        await call_killed_at(data, "secrets.delete.after_aside", "secrets.delete", delete, client_id="outsider")
        async with real_host(data) as (_proc, c):
            assert await c.call("secrets.delete", delete) == {"ref": "mcp/gone", "deleted": True}
            assert await c.call("secrets.delete", delete) == {"ref": "mcp/gone", "deleted": True}
            assert [s["ref"] for s in (await c.call("secrets.list", {}))["secrets"]] == ["mcp/kept"]
            assert await code_of(c, "secrets.get", {"ref": "mcp/gone"}) == "NOT_FOUND"
            assert (await c.call("secrets.get", {"ref": "mcp/kept"}))["value"] == "v-kept-1"
            await c.call("secrets.set", {"ref": "mcp/gone", "value": "v-gone-2"})
            assert (await c.call("secrets.get", {"ref": "mcp/gone"}))["value"] == "v-gone-2"
    assert not [p for p in (data / "secrets").iterdir() if "deleting" in p.name]
