"""A task run whose stored status is damaged (a value outside its set, written by nothing the host runs) while it
runs: the task "may still be running", so a second run is refused (``tasks.startRun`` CONFLICT naming the run,
the scheduler skips the slot) instead of sending the task's prompt twice. The ways out: the run is ended
(``tasks.finishRun`` accepts it), a restart aborts it (the boot fence), or the record is repaired. Before, the
check read ``status = 'running'`` only, so a damaged status counted as ended and a second run started."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.client import RpcError
from store import schedule, tasks
from store.errors import Conflict
from store.fence import interruption_fence
from tests.dbkit import NOW, fresh_db
from tests.hostkit import client_for, inprocess_host
from tests.integrity.test_damaged_listings import damage

BAD = "runnimg"


def _damage(conn: sqlite3.Connection, run_id: str) -> None:
    conn.execute("PRAGMA ignore_check_constraints = ON")
    assert conn.execute("UPDATE task_runs SET status = ? WHERE id = ?", (BAD, run_id)).rowcount == 1


def _running(conn: sqlite3.Connection, task_id: str) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM task_runs WHERE task_id = ? AND status != 'completed'",
                            (task_id,)).fetchone()[0])


async def test_start_run_refuses_while_a_run_with_a_damaged_status_may_be_running_until_it_is_ended(
        tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            tid = (await ui.call("tasks.create", {"title": "t", "prompt": "p"}))["id"]
            await ui.call("tasks.startRun", {"taskId": tid, "runId": "r0"})
            damage(tmp_path, "UPDATE task_runs SET status = ? WHERE id = 'r0'", BAD)
            with pytest.raises(RpcError) as refused:
                await ui.call("tasks.startRun", {"taskId": tid, "runId": "r1"})
            assert refused.value.data_code == "CONFLICT"
            assert refused.value.data.get("runId") == "r0"
            assert refused.value.data.get("damaged") is True
            runs = await ui.call("tasks.runs", {"taskId": tid})
            assert runs["runs"] == [] and runs["unreadable"] == ["r0"]  # no second run was written
            # the way out: the run is ended (the sidecar's finishRun, or a person's), then the task runs again
            ended = await ui.call("tasks.finishRun", {"runId": "r0", "status": "aborted"})
            assert ended["status"] == "aborted"
            assert (await ui.call("tasks.startRun", {"taskId": tid, "runId": "r1"}))["status"] == "running"
            with pytest.raises(RpcError) as again:
                await ui.call("tasks.finishRun", {"runId": "r0", "status": "completed"})
            assert again.value.data_code == "CONFLICT"  # an ended run stays ended


def test_the_scheduler_skips_a_slot_while_a_run_with_a_damaged_status_may_be_running(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    tasks.create_task(conn, task_id="t", title="t", prompt="p", cadence="hourly",
                      config={"schedule": {}}, now_ms=NOW)
    slot = tasks.get_task(conn, "t")["nextRunAt"]
    tasks.start_run(conn, task_id="t", run_id="r0", session_id=None, now_ms=NOW)
    _damage(conn, "r0")
    ids = iter(["r1", "r2"])
    batch = schedule.fire_due(conn, now_ms=slot, new_run_id=lambda: next(ids))
    assert [o.kind for o in batch.outcomes] == ["skipped"]
    assert _running(conn, "t") == 1  # only the damaged run; the prompt was not sent a second time
    # a restart aborts it like a running run (nothing runs past a restart), and the next slot fires
    assert interruption_fence(conn, now_ms=slot + 1, boot_id="b")["abortedTaskRuns"] == 1
    assert tasks.get_run(conn, "r0")["status"] == "aborted"
    nxt = tasks.get_task(conn, "t")["nextRunAt"]
    assert [o.kind for o in schedule.fire_due(conn, now_ms=nxt, new_run_id=lambda: next(ids)).outcomes] \
        == ["started"]


def test_a_damaged_status_is_not_proof_of_an_end_and_ended_runs_do_not_hold_the_task(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    tasks.create_task(conn, task_id="t", title="t", prompt="p", now_ms=NOW)
    for i, status in enumerate(("completed", "aborted", "error")):
        tasks.start_run(conn, task_id="t", run_id=f"e{i}", session_id=None, now_ms=NOW + i)
        tasks.finish_run(conn, run_id=f"e{i}", status=status, error_code=None, now_ms=NOW + i)
    tasks.start_run(conn, task_id="t", run_id="r0", session_id=None, now_ms=NOW + 5)
    tasks.finish_run(conn, run_id="r0", status="completed", error_code=None, now_ms=NOW + 6)
    _damage(conn, "r0")  # damaged after it ended: its end is unknown now, so it holds the task too
    with pytest.raises(Conflict):
        tasks.start_run(conn, task_id="t", run_id="r1", session_id=None, now_ms=NOW + 7)
    # a restart aborts it and keeps the end it had; the task runs again
    assert interruption_fence(conn, now_ms=NOW + 50, boot_id="b")["abortedTaskRuns"] == 1
    assert tasks.get_run(conn, "r0") == {"id": "r0", "taskId": "t", "status": "aborted", "errorCode": "INTERRUPTED",
                                         "startedAt": NOW + 5, "endedAt": NOW + 6}
    assert tasks.start_run(conn, task_id="t", run_id="r1", session_id=None, now_ms=NOW + 51)["status"] == "running"
    tasks.finish_run(conn, run_id="r1", status="completed", error_code=None, now_ms=NOW + 52)
    # or the record repaired by hand: the task runs again at once
    _damage(conn, "r1")
    with pytest.raises(Conflict):
        tasks.start_run(conn, task_id="t", run_id="r2", session_id=None, now_ms=NOW + 53)
    conn.execute("UPDATE task_runs SET status = 'completed' WHERE id = 'r1'")
    assert tasks.start_run(conn, task_id="t", run_id="r2", session_id=None, now_ms=NOW + 53)["status"] == "running"


async def test_contract_work_is_refused_in_the_session_of_a_run_whose_status_is_damaged(tmp_path: Path) -> None:
    """Before, require_interactive read status = 'running' only: a run with a damaged status counted as ended, and
    a Plan/Goal turn (or a queued prompt) started in the session the unattended run may still be driving."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c:
            sid = (await c.call("session.create", {"title": "s", "projectPath": str(ws)}))["id"]
            tid = (await c.call("tasks.create", {"title": "t", "prompt": "p"}))["id"]
            await c.call("tasks.startRun", {"taskId": tid, "runId": "r0", "sessionId": sid})
            await c.call("session.update", {"sessionId": sid, "mode": "plan"})
            damage(tmp_path / "data", "UPDATE task_runs SET status = ? WHERE id = 'r0'", BAD)
            for method, params in (("session.startTurn", {"sessionId": sid, "turnId": "t1"}),
                                   ("session.queuePush", {"sessionId": sid, "principal": "ui", "content": "x",
                                                          "permissionMode": "ask"})):
                with pytest.raises(RpcError) as refused:
                    await c.call(method, params)
                assert refused.value.data_code == "PLAN_REQUIRES_INTERACTIVE_SESSION", method
                assert refused.value.data["runId"] == "r0" and refused.value.data["damaged"] is True
            await c.call("tasks.finishRun", {"runId": "r0", "status": "aborted"})
            assert (await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"}))["status"] == "running"
