"""Boot maintenance transaction (seed §3): the interruption fence and retention.

Runs once before anything is served. Nothing is ever replayed: running turns
become ``aborted`` (with an audit record each), pending plan approvals and
queued/running executions become ``interrupted`` (an audit record each too), pending tool-permission
approvals and interactions become ``interrupted`` (a late answer is refused),
collaboration deliveries that were running, or queued without a queue
admission, become ``interrupted`` (admitted ones are held; the report counts
both and the admissions it saw),
retention pruning runs, and the notification cap is repaired.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from store import approvals, collab, plans, queue, tasks
from store.newest_kept import delete_past_newest
from store.rules import turn_may_be_running

NOTIFICATION_CAP = 200
DAY_MS = 86_400_000


def interruption_fence(conn: sqlite3.Connection, *, now_ms: int, boot_id: str) -> dict[str, Any]:
    # a turn whose stored status is damaged may be running too: aborted with them (nothing runs past a restart)
    running = conn.execute(f"SELECT id, session_id FROM turns WHERE {turn_may_be_running()}").fetchall()
    for turn_id, session_id in running:
        conn.execute(
            "INSERT INTO audit_log(ts, kind, session_id, payload_json) VALUES (?, 'turn_interrupted', ?, ?)",
            (now_ms, session_id, orjson.dumps({"turnId": turn_id, "bootId": boot_id,
                                               "reason": "host restarted"}).decode()),
        )
    conn.execute(
        "UPDATE turns SET status = 'aborted', error_code = COALESCE(error_code, 'INTERRUPTED'), "
        f"ended_at = MAX(started_at, ?) WHERE {turn_may_be_running()}",  # never before its start (a clock stepped back)
        (now_ms,),
    )
    plans.expire_all_stale(conn, now_ms)  # past its deadline before the restart: expired, not interrupted
    _audit_plan_interruptions(conn, now_ms=now_ms, boot_id=boot_id)
    pending = conn.execute(
        "UPDATE plan_approvals SET status = 'interrupted', updated_at = ?, resolved_at = ? "
        f"WHERE {plans.PENDING}",  # a damaged one too: it was never settled (plans._DAMAGED_PENDING)
        (now_ms, now_ms),
    ).rowcount
    executions = conn.execute(
        "UPDATE plan_approvals SET execution_state = 'interrupted', execution_outcome = 'interrupted', "
        f"execution_ended_at = ?, updated_at = ? WHERE {plans.EXECUTION_MAY_RUN}",  # a damaged one too
        (now_ms, now_ms),
    ).rowcount
    # Scheduled-task runs that were running: aborted, never resumed (seed §4.11, no replay). So is a run whose
    # stored status is damaged (store.tasks.MAY_BE_RUNNING): it kept its task from starting again, and nothing
    # runs past a restart; an end it already had is kept.
    runs = conn.execute(
        "UPDATE task_runs SET status = 'aborted', error_code = COALESCE(error_code, 'INTERRUPTED'), "
        f"ended_at = COALESCE(ended_at, MAX(started_at, ?)) WHERE {tasks.MAY_BE_RUNNING}",  # never before its start
        (now_ms,),
    ).rowcount
    deliveries = interrupt_deliveries(conn, now_ms=now_ms, running=True)
    held = conn.execute("SELECT COUNT(*) FROM session_collaboration_messages WHERE status = 'queued'").fetchone()[0]
    admissions = conn.execute("SELECT COUNT(*) FROM turn_queue WHERE session_message_id IS NOT NULL").fetchone()[0]
    requests = approvals.interrupt_pending(conn, now_ms)
    offered = queue.offer_again(conn)  # handed out, no turn began with it: the next take offers it again
    return {"abortedTurns": [t for t, _ in running], "interruptedApprovals": pending,
            "interruptedExecutions": executions, "abortedTaskRuns": runs,
            "interruptedPermissionRequests": requests["approval"],
            "interruptedInteractions": requests["interaction"],
            "interruptedDeliveries": deliveries, "heldDeliveries": int(held), "deliveryAdmissions": int(admissions),
            "offeredQueueEntries": offered}


def _audit_plan_interruptions(conn: sqlite3.Connection, *, now_ms: int, boot_id: str) -> None:
    """Seed 003 §3: the fence "appends the recovery audit records" — besides each running turn's, one
    ``plan_interrupted`` record per plan/goal approval it interrupts (``interrupted: "approval"``) and per
    execution it interrupts (``"execution"``, with its ``executionId``), written before the rows change."""
    rows = conn.execute(
        f"SELECT request_id, session_id, kind, turn_id, execution_id, {plans.PENDING}, {plans.EXECUTION_MAY_RUN} "
        f"FROM plan_approvals WHERE {plans.PENDING} OR {plans.EXECUTION_MAY_RUN} ORDER BY created_at, request_id",
    ).fetchall()
    for request_id, session_id, kind, turn_id, execution_id, pending, running in rows:
        for what, applies in (("approval", pending), ("execution", running)):
            if not applies:
                continue
            payload: dict[str, Any] = {"requestId": request_id, "kind": kind, "interrupted": what}
            if what == "execution":
                payload["executionId"] = execution_id
            payload |= {"turnId": turn_id, "bootId": boot_id, "reason": "host restarted"}
            conn.execute(
                "INSERT INTO audit_log(ts, kind, session_id, payload_json) VALUES (?, 'plan_interrupted', ?, ?)",
                (now_ms, session_id, orjson.dumps(payload).decode()),
            )


def interrupt_deliveries(conn: sqlite3.Connection, *, now_ms: int, running: bool) -> int:
    """Deliveries the restart cut (seed 003 §4.6c): queued without a queue admission (and, at the fence,
    running) become ``interrupted``, never replayed. Boot runs it again after settling the queue entries
    whose turn the fence ended: an admission a turn had begun with is consumed there once its input
    landed, and its delivery is no longer held."""
    cut = conn.execute(
        "UPDATE session_collaboration_messages SET status = 'interrupted', updated_at = ? "
        "WHERE (? AND status = 'running') OR (status = 'queued' AND NOT EXISTS "
        "(SELECT 1 FROM turn_queue q WHERE q.session_message_id = session_collaboration_messages.id "
        "AND q.session_id = session_collaboration_messages.target_session_id))",  # its own queue's only
        (now_ms, running),
    ).rowcount
    collab.prune_delivered(conn)  # a deliver's answer kept for an input line that will never be written
    return cut


def retention(conn: sqlite3.Connection, *, now_ms: int, audit_days: int = 90) -> dict[str, Any]:
    audit = conn.execute("DELETE FROM audit_log WHERE ts < ?", (now_ms - audit_days * DAY_MS,)).rowcount
    runs = sum(tasks.prune_runs(conn, str(task_id))
               for (task_id,) in conn.execute("SELECT DISTINCT task_id FROM task_runs NOT INDEXED").fetchall())
    notes = prune_notifications(conn)
    return {"auditPruned": audit, "taskRunsPruned": runs, "notificationsPruned": notes}


def prune_notifications(conn: sqlite3.Connection, cap: int = NOTIFICATION_CAP) -> int:
    """Keep the newest ``cap`` notifications by ``(created_at, id)`` (:func:`store.newest_kept.delete_past_newest`:
    a notification a damaged ``idx_notifications_created`` hides from the newest-first list is never deleted for
    it; the table holds about ``cap`` rows, so the scan is small)."""
    return delete_past_newest(conn, "notifications", keep=cap, stamp="created_at", tiebreak="id")


def previous_boot_started(conn: sqlite3.Connection) -> int | None:
    """When the newest boot recorded so far started (this boot records its own at its end): what ran
    since, the previous host's run, began then. None when no boot was recorded (a new index)."""
    row = conn.execute("SELECT MAX(started_at) FROM boot_reports").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def record_boot_report(conn: sqlite3.Connection, boot_id: str, now_ms: int, report_json: str,
                       keep: int = 50) -> None:
    """The boot's report, keeping the newest ``keep`` (``host.status`` shows the current one)."""
    conn.execute("INSERT INTO boot_reports(boot_id, started_at, report_json) VALUES (?, ?, ?)",
                 (boot_id, now_ms, report_json))
    conn.execute("DELETE FROM boot_reports WHERE boot_id NOT IN "
                 "(SELECT boot_id FROM boot_reports ORDER BY started_at DESC LIMIT ?)", (keep,))
