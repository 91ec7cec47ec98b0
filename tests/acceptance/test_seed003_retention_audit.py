"""Seed 003 §8 retention and §4.14 inbox rules, read by an outsider and checked where the other outsider modules
do not already: against real ``pi-host serve`` processes, with the states a long-lived install reaches (audit
rows months old, a task with more runs than it keeps, an inbox a newer build's rows pushed a turn's
notification out of) written with sqlite3 into a stopped host's database, then read back through the
methods protocol/README.md documents and the database itself.

Already held elsewhere (not repeated): the notification cap after every insert and at boot
(test_seed003_tasks_outsider, test_seed003_acceptance_adversarial item 14), one notification per
completed/error turn, none for aborted, repeats and races (test_seed003_write_paths_outsider,
test_seed003_acceptance_adversarial), inbox writes leaving the session's read view alone (turns/test_turns_host)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, open_client
from tests.acceptance.outsiderkit import all_pages, code_of, data_dir, real_host, say
from tests.hostkit import run_cli, start_host_process

DAY_MS = 86_400_000


def _db(data: Path) -> sqlite3.Connection:
    return sqlite3.connect(data / "pi.sqlite")


async def _now(c: HostClient) -> int:
    started: int = (await c.call("host.status", {}))["startedAt"]
    return started


async def _all_audit(c: HostClient, **filters: Any) -> list[dict[str, Any]]:
    return await all_pages(c, "audit.list", "entries", filters, limit=500)


async def _all_notifications(c: HostClient) -> list[dict[str, Any]]:
    return await all_pages(c, "notifications.list", "notifications")


# ------------------------------------------------------------------------------------------ §8 audit_log


async def _audited_session(data: Path) -> tuple[str, int]:
    """A session created on a host of ``data`` (then killed), and the host's clock at its start (Unix ms)."""
    async with real_host(data) as (_proc, c):
        sid: str = (await c.call("session.create", {"title": "audited"}))["id"]
        return sid, await _now(c)


def _add_audit(data: Path, rows: list[tuple[int, str, str | None, dict[str, Any]]]) -> int:
    """Write audit rows ``(ts, kind, session_id, payload)`` into the stopped host's database, as an older
    install left them; the number of audit rows it then holds."""
    conn = _db(data)
    try:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL: the vacuum has pages to free
        conn.executemany("INSERT INTO audit_log (ts, kind, session_id, payload_json) VALUES (?, ?, ?, ?)",
                         [(ts, kind, sid, json.dumps(payload)) for ts, kind, sid, payload in rows])
        conn.commit()
        held: int = conn.execute("SELECT count(*) FROM audit_log").fetchone()[0]
        return held
    finally:
        conn.close()

async def test_audit_rows_older_than_90_days_left_in_the_database_are_pruned_at_boot_and_their_pages_given_back(
        tmp_path: Path) -> None:
    """§8 "audit_log: prune rows older than 90 days (configurable) at boot; incremental_vacuum afterwards";
    §4.13 ``session_id`` may be NULL. 40 rows of 91 to 130 days (4 KB each, with and without a session) and 3
    rows of 89 days, written into the stopped host's database: the next boot removes exactly the 40
    (``host.status`` ``boot.retention.auditPruned``), ``audit.list`` shows the recent ones and the freed pages
    are returned to the file; the boot after prunes nothing more."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        sid, now = await _audited_session(data)
        before = _add_audit(data, [(now - (91 + i) * DAY_MS, "tool_execute", sid if i % 2 else None,
                                    {"n": f"old-{i}", "pad": "p" * 4000}) for i in range(40)]
                            + [(now - 89 * DAY_MS + i, "tool_denied", sid, {"n": f"recent-{i}"}) for i in range(3)])
        async with real_host(data) as (_proc, c):
            assert (await c.call("host.status", {}))["boot"]["retention"]["auditPruned"] == 40
            mine = await _all_audit(c, sessionId=sid)
            assert [e["payload"]["n"] for e in mine] == ["recent-2", "recent-1", "recent-0"]
            assert not [e for e in await _all_audit(c) if str(e["payload"].get("n", "")).startswith("old-")]
        conn = _db(data)
        try:
            left = conn.execute("SELECT count(*) FROM audit_log").fetchone()[0]
            assert left >= before - 40 and conn.execute(
                "SELECT count(*) FROM audit_log WHERE ts < ?", (now - 90 * DAY_MS,)).fetchone()[0] == 0
            # 40 rows of 4 KB freed ~40 pages: incremental_vacuum gave them back (boot may free a page or two)
            assert conn.execute("PRAGMA freelist_count").fetchone()[0] < 5
        finally:
            conn.close()
        async with real_host(data) as (_proc, c):
            assert (await c.call("host.status", {}))["boot"]["retention"]["auditPruned"] == 0
            assert len(await _all_audit(c, sessionId=sid)) == 3


async def test_the_audit_retention_is_configurable_on_serve_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    """§8 "older than 90 days (configurable)": ``pi-host serve --audit-retention-days 30`` prunes rows of 31
    days and keeps rows of 29; a value that is not 1-36500 whole days is refused before anything starts (exit
    2, one line naming the flag), the data directory untouched."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        sid, now = await _audited_session(data)
        _add_audit(data, [(now - age * DAY_MS, "tool_denied", sid, {"n": f"age-{age}"}) for age in (31, 45, 29, 1)])
        for bad in ("0", "-3", "1.5", "ninety", "36501"):
            refused = run_cli("--data-dir", str(data), "serve", "--port", "0", "--audit-retention-days", bad)
            assert refused.returncode == 2, (bad, refused)
            assert "--audit-retention-days" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        proc = start_host_process(data, "--audit-retention-days", "30")
        try:
            async with open_client(proc.url, proc.token, client_id="outsider", client_kind="ui") as c:
                assert (await c.call("host.status", {}))["boot"]["retention"]["auditPruned"] == 2
                assert [e["payload"]["n"] for e in await _all_audit(c, sessionId=sid)] == ["age-1", "age-29"]
        finally:
            proc.kill9()


# ------------------------------------------------------------------------------------------ §8 task_runs

async def test_task_runs_past_the_newest_100_per_task_are_pruned_at_boot_and_their_sessions_stay(
        tmp_path: Path) -> None:
    """§8 "task_runs: keep last 100 per task (prune with the same boot pass)", "sessions are never
    auto-deleted"; §4.11 ``session_id ... the run's transcript``. A task holding 131 runs (one recorded
    through ``tasks.startRun`` / ``finishRun``, 130 older ones written into the stopped host's database, some
    naming a session) and a second task holding 5: the next boot keeps the first task's newest 100 by start
    time (``boot.retention.taskRunsPruned`` 31), leaves the other task's 5, and every session a pruned run
    named still reads with its transcript. A run started afterwards keeps the count at 100."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            many = (await c.call("tasks.create", {"title": "many", "prompt": "p"}))["id"]
            few = (await c.call("tasks.create", {"title": "few", "prompt": "p"}))["id"]
            sid = (await c.call("session.create", {"title": "run transcript"}))["id"]
            await say(c, sid, "rt-1", "what the run said")
            run = await c.call("tasks.startRun", {"taskId": many, "sessionId": sid})
            await c.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
            now = await _now(c)
        transcript = (data / "sessions" / f"{sid}.jsonl").read_bytes()
        conn = _db(data)
        try:
            for i in range(130):  # old-000 is the newest of them, all older than the recorded run
                conn.execute("INSERT INTO task_runs (id, task_id, session_id, status, started_at, ended_at) "
                             "VALUES (?, ?, ?, 'completed', ?, ?)",
                             (f"old-{i:03d}", many, sid if i % 10 == 0 else None,
                              now - DAY_MS - i * 60_000, now - DAY_MS - i * 60_000 + 5))
            for i in range(5):
                conn.execute("INSERT INTO task_runs (id, task_id, status, started_at, ended_at) "
                             "VALUES (?, ?, 'error', ?, ?)", (f"few-{i}", few, now - 400 * DAY_MS - i, now))
            conn.commit()
        finally:
            conn.close()
        async with real_host(data, kind="agent") as (_proc, c):
            assert (await c.call("host.status", {}))["boot"]["retention"]["taskRunsPruned"] == 31
            kept = (await c.call("tasks.runs", {"taskId": many, "limit": 100}))["runs"]
            assert [r["id"] for r in kept] == [run["id"]] + [f"old-{i:03d}" for i in range(99)]
            assert [r["id"] for r in (await c.call("tasks.runs", {"taskId": few}))["runs"]] == [
                f"few-{i}" for i in range(5)]
            view = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in view["messages"]] == ["rt-1"]
            again = await c.call("tasks.startRun", {"taskId": many})
            await c.call("tasks.finishRun", {"runId": again["id"], "status": "aborted"})
            kept = (await c.call("tasks.runs", {"taskId": many, "limit": 100}))["runs"]
            assert [r["id"] for r in kept] == [again["id"], run["id"]] + [f"old-{i:03d}" for i in range(98)]
        assert (data / "sessions" / f"{sid}.jsonl").read_bytes() == transcript
        conn = _db(data)
        try:
            assert conn.execute("SELECT count(*) FROM task_runs WHERE task_id = ?", (many,)).fetchone()[0] == 100
        finally:
            conn.close()


# ------------------------------------------------------------------------------------------ §4.14, item 14

async def test_a_turn_whose_notification_the_boot_cap_pruned_gets_none_back_from_a_repeated_end(
        tmp_path: Path) -> None:
    """§4.14 "Repeating a terminal update cannot duplicate a notification", §8 the newest-200 cap "at boot as
    a defensive repair", §11.14 "repeated terminal updates do not duplicate it": a completed turn's
    notification pushed out at boot by 200 newer rows (left in the database by hand) does not come back when
    the sidecar repeats the turn's end, and the repeat answers the settled turn without ``notification``.
    A turn ended ``aborted`` by a rewrite (``session.truncateFrom`` under a running turn) creates none,
    and neither does its late ``completed`` (CONFLICT); nor does a repeat of a quiet end."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {"title": "pushed out"}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "first"})
            made = (await c.call("session.endTurn", {"sessionId": sid, "turnId": "first",
                                                     "status": "completed"}))["notification"]
        conn = _db(data)
        try:
            for i in range(200):
                conn.execute("INSERT INTO notifications (id, kind, session_id, session_title, turn_id, "
                             "created_at) VALUES (?, 'task.failed', ?, 'pushed out', ?, ?)",
                             (f"n_hand{i:03d}", sid, f"hand{i:03d}", made["createdAt"] + 1 + i))
            conn.commit()
        finally:
            conn.close()
        async with real_host(data, kind="agent") as (_proc, c):
            assert (await c.call("host.status", {}))["boot"]["retention"]["notificationsPruned"] == 1
            end = {"sessionId": sid, "turnId": "first", "status": "completed"}
            repeated = await c.call("session.endTurn", end)
            assert repeated["turn"]["status"] == "completed" and "notification" not in repeated
            listed = await _all_notifications(c)
            assert len(listed) == 200 and "first" not in {n["turnId"] for n in listed}

            await say(c, sid, "u1", "question")
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "cut"})
            await say(c, sid, "a1", "partial answer", role="assistant", turnId="cut")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "retry"})
            [cut] = [t for t in (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
                     if t["id"] == "cut"]
            assert cut["status"] == "aborted"
            assert await code_of(c, "session.endTurn", {"sessionId": sid, "turnId": "cut",
                                                        "status": "completed"}) == "CONFLICT"
            assert await _all_notifications(c) == listed

            # README "Repeating the same status returns the settled turn without notification": a turn the
            # focused chat ended quietly (createNotification false) gets none from a repeat that asks for one
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "quiet"})
            quiet = {"sessionId": sid, "turnId": "quiet", "status": "completed"}
            assert "notification" not in await c.call("session.endTurn", quiet | {"createNotification": False})
            assert "notification" not in await c.call("session.endTurn", quiet)
            assert await _all_notifications(c) == listed


# ------------------------------------------------------------------------------------------ §4.14, item 15

def _snapshot(data: Path) -> dict[str, Any]:
    """Every turn, session and transcript-index row, and every session file's bytes."""
    conn = _db(data)
    try:
        rows = {t: sorted(map(tuple, conn.execute(f"SELECT * FROM {t}").fetchall()), key=repr)
                for t in ("sessions", "turns", "messages")}
    finally:
        conn.close()
    files = {p.name: p.read_bytes() for p in sorted((data / "sessions").iterdir())
             if not p.name.startswith("deleted-sessions")}  # the delete's own record (README: session.delete)
    return {"rows": rows, "files": files}


async def test_inbox_writes_and_a_session_cascade_change_no_turn_or_transcript_data(tmp_path: Path) -> None:
    """§11.15 "Notification list/unread, mark-read, mark-all-read, clear, and session cascade deletion ...
    without changing turn or transcript data"; §4.14 "None of these operations changes sessions, turns, or
    transcripts", "session deletion also cascades its rows"; §8 rows "survive restart until cleared, pruned,
    or cascade-deleted with their session". Two sessions with messages and completed / error / aborted turns.
    The turn, session and message rows and every session file are compared byte for byte, in the database
    of the stopped host, before and after mark-read, mark-all-read and clear; deleting one session then
    removes its notifications, turns and files only: the other session's notifications (read state
    included), turns and transcript stay, and so after a restart."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data, kind="agent") as (_proc, c):
            keep = (await c.call("session.create", {"title": "keep"}))["id"]
            gone = (await c.call("session.create", {"title": "gone"}))["id"]
            for sid in (keep, gone):
                for i, status in enumerate(("completed", "error", "aborted", "completed")):
                    turn = f"{sid}-t{i}"
                    await c.call("session.startTurn", {"sessionId": sid, "turnId": turn})
                    await say(c, sid, f"{sid}-u{i}", f"question {i}", turnId=turn)
                    await say(c, sid, f"{sid}-a{i}", f"answer {i}", role="assistant", turnId=turn)
                    await c.call("session.endTurn", {"sessionId": sid, "turnId": turn, "status": status})
        async with real_host(data, kind="agent") as (_proc, c):  # a boot of its own: its own writes, if any
            inbox = await _all_notifications(c)
            assert sorted(n["turnId"] for n in inbox) == sorted(
                f"{sid}-t{i}" for sid in (keep, gone) for i in (0, 1, 3))
        before = _snapshot(data)
        async with real_host(data, kind="agent") as (_proc, c):
            ids = {n["turnId"]: n["id"] for n in inbox}
            assert (await c.call("notifications.markRead", {"ids": [ids[f"{keep}-t0"]]}))["updated"] == 1
            assert (await c.call("notifications.markAllRead", {}))["updated"] == 5
            assert (await c.call("notifications.clear", {"ids": [ids[f"{keep}-t1"]]}))["deleted"] == 1
            assert (await c.call("notifications.list", {"unreadOnly": True}))["unreadCount"] == 0
        assert _snapshot(data) == before
        async with real_host(data, kind="agent") as (_proc, c):
            kept = [n for n in await _all_notifications(c) if n["sessionId"] == keep]
            assert [n["turnId"] for n in kept] == [f"{keep}-t3", f"{keep}-t0"] and all(n["readAt"] for n in kept)
            keep_turns = await c.call("session.listTurns", {"sessionId": keep})
            keep_view = await c.call("session.get", {"sessionId": keep})
            await c.call("session.delete", {"sessionId": gone})
            assert await _all_notifications(c) == kept
            assert await c.call("session.listTurns", {"sessionId": keep}) == keep_turns
            assert await c.call("session.get", {"sessionId": keep}) == keep_view
        after = _snapshot(data)
        assert {k: [r for r in v if keep in repr(r)] for k, v in before["rows"].items()} == after["rows"]
        assert not [r for rows in after["rows"].values() for r in rows if gone in repr(r)]
        assert after["files"] == {k: v for k, v in before["files"].items() if not k.startswith(gone)}
        conn = _db(data)
        try:
            assert conn.execute("SELECT count(*) FROM notifications WHERE session_id = ?", (gone,)).fetchone()[0] == 0
        finally:
            conn.close()
        async with real_host(data, kind="agent") as (_proc, c):
            assert await _all_notifications(c) == kept
            assert await c.call("session.listTurns", {"sessionId": keep}) == keep_turns


async def test_a_project_removal_and_a_purge_cascade_their_sessions_notifications_only(tmp_path: Path) -> None:
    """§4.14 "session deletion also cascades its rows" by the two other paths that delete sessions (§5
    "project delete (projects.remove) — one tx per session (DELETE FROM sessions, cascades)", ``sessions.purge``
    of a trashed session): their sessions' notifications go with them, the remaining session's notification,
    turn and transcript stay, and a trashed session keeps its inbox rows until the purge (``sessions.restore``
    "brings it back exactly"); so after a restart."""
    data = data_dir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            stay = (await c.call("session.create", {"title": "stay"}))["id"]
            owned = (await c.call("session.create", {"title": "owned", "projectPath": str(work)}))["id"]
            trashed = (await c.call("session.create", {"title": "trashed"}))["id"]
            for sid in (stay, owned, trashed):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"{sid}-t"})
                await say(c, sid, f"{sid}-u", "question", turnId=f"{sid}-t")
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"{sid}-t", "status": "completed"})
            inbox = await _all_notifications(c)
            assert {n["sessionId"] for n in inbox} == {stay, owned, trashed}
            stay_turns = await c.call("session.listTurns", {"sessionId": stay})
            stay_view = await c.call("session.get", {"sessionId": stay})
            await c.call("sessions.trash", {"sessionId": trashed})
            await c.call("sessions.restore", {"sessionId": trashed})
            assert await _all_notifications(c) == inbox
            await c.call("sessions.trash", {"sessionId": trashed})
            await c.call("sessions.purge", {"sessionId": trashed})
            [project] = [p for p in (await c.call("projects.list", {}))["projects"] if p["path"] == str(work)]
            await c.call("projects.remove", {"projectId": project["id"]})
            left = await _all_notifications(c)
            assert left == [n for n in inbox if n["sessionId"] == stay]
            assert await c.call("session.listTurns", {"sessionId": stay}) == stay_turns
            assert await c.call("session.get", {"sessionId": stay}) == stay_view
        async with real_host(data, kind="agent") as (_proc, c):
            assert await _all_notifications(c) == left
            assert await c.call("session.listTurns", {"sessionId": stay}) == stay_turns
        conn = _db(data)
        try:
            assert conn.execute("SELECT count(*) FROM notifications WHERE session_id <> ?", (stay,)).fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM turns WHERE session_id <> ?", (stay,)).fetchone()[0] == 0
        finally:
            conn.close()
