"""Firing scheduled tasks: the SQL half of the scheduler actor (seed 003 §4.11, §8, §11.19).

A task is *armed* when it is enabled, its cadence is not ``manual`` and its
``config.nextRunAt`` is an integer; it is *due* when ``nextRunAt <= now``.
:func:`fire_due` fires every due task inside the caller's ONE transaction:

* agent task: :func:`store.tasks.start_run` inserts a ``running`` run and
  advances ``nextRunAt`` (same statement sequence, same transaction) - the
  sidecar is told with a ``task.due`` event and later calls ``tasks.finishRun``;
* plan/goal task: nothing is started (no session, turn, queue entry or
  artifact); the refusal is recorded as a finished run with status ``error``
  and ``error_code = PLAN_REQUIRES_INTERACTIVE_SESSION``, and ``nextRunAt``
  advances;
* a task whose previous run is still ``running``: the slot is skipped (no
  overlapping runs) and ``nextRunAt`` advances.

``nextRunAt`` is always recomputed from *now*, so slots missed while the host
was down fire once, then the next future slot is scheduled - never a burst.
A task whose next slot cannot be computed (or is not in the future) is
disarmed instead of firing in a loop.

Pure SQL on a connection the caller owns; no trio.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from store import tasks
from store.errors import Conflict, PlanRequiresInteractiveSession
from store.faults import NO_FAULTS, Faults

__all__ = [
    "FIRE_POINT",
    "FireBatch",
    "FireOutcome",
    "due_payload",
    "fire_due",
    "is_armed",
    "next_due_at",
]

FIRE_POINT = "scheduler.fire.after_start"
REFUSED_CODE = PlanRequiresInteractiveSession.code
OutcomeKind = Literal["started", "refused", "skipped"]


@dataclass(frozen=True)
class FireOutcome:
    kind: OutcomeKind
    task: dict[str, Any]  # the task as it was when it fired
    slot: int  # the nextRunAt that fired
    run: dict[str, Any] | None  # the run row (None when skipped)
    next_run_at: int | None  # the task's new nextRunAt (None: disarmed)


@dataclass(frozen=True)
class FireBatch:
    outcomes: list[FireOutcome] = field(default_factory=list)
    next_due: int | None = None  # earliest nextRunAt of the armed tasks after this batch
    more_due: bool = False  # the batch hit its limit; call again


def is_armed(task: Mapping[str, Any]) -> bool:
    return bool(task["enabled"]) and task["cadence"] != "manual" and isinstance(task.get("nextRunAt"), int)


def next_due_at(conn: sqlite3.Connection) -> int | None:
    """Earliest ``nextRunAt`` over the armed tasks (``None``: nothing to wait for)."""
    slots = [t["nextRunAt"] for t in tasks.list_tasks(conn) if is_armed(t)]
    return min(slots) if slots else None


def due_payload(outcome: FireOutcome) -> dict[str, Any]:
    """The ``task.due`` event data for a started run (what the agent sidecar needs to run it).

    ``permissionMode`` and ``thinkingLevel`` are always present: the task's own
    values, else ``ask`` and ``off`` (:func:`store.tasks.run_settings`).
    """
    task, run = outcome.task, outcome.run
    assert run is not None
    out: dict[str, Any] = {"taskId": task["id"], "runId": run["id"], "title": task["title"],
                           "prompt": task["prompt"], "scheduledFor": outcome.slot, "startedAt": run["startedAt"]}
    if task.get("projectId") is not None:
        out["projectId"] = task["projectId"]
    # §4.11: an automatic run without a task-owned permission runs with Ask; thinking level off when unset.
    settings = tasks.run_settings(task, trigger="schedule")
    settings.pop("trigger")
    out.update(settings)
    return out


def _set_next(conn: sqlite3.Connection, task_id: str, now_ms: int, *, last_run: bool) -> int | None:
    """Recompute ``nextRunAt`` from ``now``; disarm when there is no future slot."""
    task = tasks.get_task(conn, task_id)
    config = dict(task["config"])
    nxt = tasks.next_run_at(task["cadence"], config, now_ms)
    if nxt is not None and nxt > now_ms:
        config["nextRunAt"] = nxt
    else:
        nxt = None
        config.pop("nextRunAt", None)
    sql = "UPDATE scheduled_tasks SET config_json = ?" + (", last_run_at = ?" if last_run else "") + " WHERE id = ?"
    args: tuple[Any, ...] = (orjson.dumps(config).decode(), *((now_ms,) if last_run else ()), task_id)
    conn.execute(sql, args)
    return nxt


def _fire_one(conn: sqlite3.Connection, task: dict[str, Any], run_id: str, now_ms: int,
              faults: Faults) -> FireOutcome:
    slot = int(task["nextRunAt"])
    kind: OutcomeKind
    try:
        run: dict[str, Any] | None = tasks.start_run(conn, task_id=task["id"], run_id=run_id, session_id=None,
                                                     now_ms=now_ms)
        kind = "started"
    except PlanRequiresInteractiveSession:
        # §11.19: refused before any work; the refusal itself is the run's history.
        conn.execute(
            "INSERT INTO task_runs(id, task_id, session_id, status, error_code, started_at, ended_at) "
            "VALUES (?, ?, NULL, 'error', ?, ?, ?)", (run_id, task["id"], REFUSED_CODE, now_ms, now_ms))
        tasks.prune_runs(conn, task["id"])
        run, kind = tasks.get_run(conn, run_id), "refused"
    except Conflict:
        run, kind = None, "skipped"  # the previous run is still running: no overlap
    nxt = _set_next(conn, task["id"], now_ms, last_run=kind != "skipped")
    faults.point(FIRE_POINT)  # run recorded + slot advanced, transaction not yet committed
    return FireOutcome(kind, task, slot, run, nxt)


def fire_due(conn: sqlite3.Connection, *, now_ms: int, new_run_id: Callable[[], str],
             faults: Faults = NO_FAULTS, limit: int = 32) -> FireBatch:
    """Fire up to ``limit`` due tasks (oldest slot first) in the caller's transaction."""
    armed = [t for t in tasks.list_tasks(conn) if is_armed(t)]
    due = sorted((t for t in armed if t["nextRunAt"] <= now_ms), key=lambda t: (t["nextRunAt"], t["id"]))
    outcomes = [_fire_one(conn, t, new_run_id(), now_ms, faults) for t in due[:limit]]
    return FireBatch(outcomes=outcomes, next_due=next_due_at(conn), more_due=len(due) > limit)
