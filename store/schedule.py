"""Firing scheduled tasks: the SQL half of the scheduler actor (seed 003 §4.11, §8, §11.19).

A task is *armed* when it is enabled, its cadence is hourly, daily or weekly,
it has a saved ``config.schedule`` object (§4.11: "Absence of schedule leaves
legacy tasks unarmed", hourly ones too) and its ``config.nextRunAt`` is an
integer; it is *due* when ``nextRunAt <= now``.
:func:`fire_due` fires every due task inside the caller's ONE transaction:

* agent task: :func:`store.tasks.start_run` inserts a ``running`` run and
  advances ``nextRunAt`` (same statement sequence, same transaction) - the
  sidecar is told with a ``task.due`` event and later calls ``tasks.finishRun``;
* plan/goal task: nothing is started (no session, turn, queue entry or
  artifact); the refusal is recorded as a finished run with status ``error``
  and ``error_code = PLAN_REQUIRES_INTERACTIVE_SESSION``, and ``nextRunAt``
  advances;
* a task whose previous run is still ``running``, or may be (its stored status
  is damaged, :data:`store.tasks.MAY_BE_RUNNING`): the slot is skipped (no
  overlapping runs) and ``nextRunAt`` advances.

``nextRunAt`` is always recomputed from *now*, so slots missed while the host
was down fire once, then the next future slot is scheduled - never a burst.
A task whose next slot cannot be computed (or is not in the future) is
disarmed instead of firing in a loop.

A daily, weekly or hourly row that has a saved ``schedule`` but no stored
``nextRunAt`` (an older build's row, or one written by hand) is armed once at
boot by :func:`arm_unslotted`: its next slot from *now* is stored, as for a new
task (daily/weekly in the host local timezone), so no slot that passed while the
host was down fires; a schedule no slot comes out of leaves it unarmed.

A daily/weekly task whose stored future slot is not a slot of its schedule in
the zone the host runs in now (the host was restarted in another zone, or the
zone's rules changed) gets its next slot from *now* at boot
(:func:`reslot_off_grid`): the schedule is a wall-clock time wherever the host
runs.

A wall clock stepped back (a clock that ran ahead, corrected) leaves a
``nextRunAt`` computed on the wrong clock: beyond what the cadence can reach
from now (:func:`reach`), the task would wait out the whole step (a year
ahead: a year without a run). :func:`fire_due` moves such a slot back to the
reach, in its transaction, firing nothing: the slot the task last ran for is
not run again, and the next one comes at most one period late.

Pure SQL on a connection the caller owns; no trio.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from store import tasks
from store.errors import Conflict, PlanRequiresInteractiveSession
from store.faults import NO_FAULTS, Faults
from store.jsonio import dumps_exact

__all__ = [
    "FIRE_POINT",
    "arm_unslotted",
    "FireBatch",
    "FireOutcome",
    "due_payload",
    "fire_due",
    "beyond_reach",
    "is_armed",
    "next_due_at",
    "reach",
    "reslot_off_grid",
]

FIRE_POINT = "scheduler.fire.after_start"
DAY_MS = 24 * 3600 * 1000
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
    return (bool(task["enabled"]) and tasks.has_schedule(task["cadence"], task["config"])
            and isinstance(task.get("nextRunAt"), int))


def reach(task: Mapping[str, Any], now_ms: int) -> int | None:
    """The latest ``nextRunAt`` the task's cadence gives from ``now_ms`` on a clock that never went back:
    hourly one hour on, daily/weekly the first slot at least a day on (``None``: no slot).

    A later slot was computed on a clock that has since stepped back by more than that."""
    cadence, config = task["cadence"], task["config"]
    if cadence == "hourly":
        return tasks.next_run_at(cadence, config, now_ms)
    return tasks.next_run_at(cadence, config, now_ms + DAY_MS - 1)


def beyond_reach(task: Mapping[str, Any], now_ms: int) -> bool:
    """An armed task whose ``nextRunAt`` a clock stepped back left out of reach (:func:`reach`)."""
    limit = reach(task, now_ms)
    return limit is not None and int(task["nextRunAt"]) > limit


def _tasks(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The tasks the scheduler arms and fires: every one whose record reads. A damaged one (``tasks.list`` names
    it in ``unreadable``) cannot fire, its schedule being unknown, and never keeps the others from firing."""
    return tasks.readable_tasks(conn).items


def next_due_at(conn: sqlite3.Connection, now_ms: int | None = None) -> int | None:
    """Earliest ``nextRunAt`` over the armed tasks (``None``: nothing to wait for). With ``now_ms``: a
    task whose slot is beyond reach (:func:`beyond_reach`) is due now (:func:`fire_due` moves it back)."""
    slots = [now_ms if now_ms is not None and beyond_reach(t, now_ms) else t["nextRunAt"]
             for t in _tasks(conn) if is_armed(t)]
    return min(slots) if slots else None


def arm_unslotted(conn: sqlite3.Connection, now_ms: int) -> list[str]:
    """Store the next slot of every task with a saved schedule but no stored ``nextRunAt`` (§4.11:
    a saved schedule arms a task; "Absence of schedule leaves legacy tasks unarmed", presence arms it).

    The slot is computed from ``now_ms`` as :func:`store.tasks.create_task` does for a new task, so a
    row that never had one fires at its next slot, never at once. Disabled tasks get theirs too (a
    created disabled task has one; enabling recomputes it). A schedule no slot comes out of
    (:func:`store.tasks.next_run_at` ``None``) leaves the row as it is. Returns the armed task ids."""
    armed: list[str] = []
    for task in _tasks(conn):
        config = task["config"]
        if isinstance(config.get("nextRunAt"), int) or not tasks.has_schedule(task["cadence"], config):
            continue
        if _arm_from(conn, task, now_ms):
            armed.append(task["id"])
    return armed


def reslot_off_grid(conn: sqlite3.Connection, now_ms: int) -> list[str]:
    """Store the next slot from ``now_ms`` of every daily/weekly task whose stored future ``nextRunAt`` is not
    a slot of its schedule in the host's local time (§4.11 "Daily/weekly schedules use the host local
    timezone"): the host now runs in another zone than the one the slot was computed in (a laptop that
    travelled), or the zone's rules changed. Kept as stored, the slot would run at the old zone's wall time
    (Berlin's 09:30 is 03:30 in New York). A slot of the schedule is the first slot after itself less a
    millisecond; a slot that passed (missed while the host was down) is left to fire once. Returns the ids."""
    moved: list[str] = []
    for task in _tasks(conn):
        slot, config = task.get("nextRunAt"), task["config"]
        if task["cadence"] not in tasks.CALENDAR_CADENCES or not isinstance(slot, int) or slot <= now_ms:
            continue
        if tasks.next_run_at(task["cadence"], config, slot - 1) == slot:
            continue
        if _arm_from(conn, task, now_ms):
            moved.append(task["id"])
    return moved


def _move_back(conn: sqlite3.Connection, task: Mapping[str, Any], now_ms: int) -> None:
    """A slot beyond reach back to the reach (nothing fires, ``last_run_at`` stays)."""
    slot = reach(task, now_ms)
    assert slot is not None
    _store_slot(conn, task, slot)


def _arm_from(conn: sqlite3.Connection, task: Mapping[str, Any], now_ms: int) -> bool:
    """Store ``task``'s next slot after ``now_ms``; False (nothing stored) when its schedule gives none."""
    nxt = tasks.next_run_at(task["cadence"], task["config"], now_ms)
    if nxt is None or nxt <= now_ms:
        return False
    _store_slot(conn, task, nxt)
    return True


def _store_slot(conn: sqlite3.Connection, task: Mapping[str, Any], slot: int) -> None:
    """``task``'s ``nextRunAt`` set to ``slot`` (the rest of its config as read)."""
    conn.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = ?",
                 (dumps_exact({**task["config"], "nextRunAt": slot}).decode(), task["id"]))


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


def _set_next(conn: sqlite3.Connection, task_id: str, now_ms: int, *, last_run: int | None) -> int | None:
    """Recompute ``nextRunAt`` from ``now``; disarm when there is no future slot. ``last_run``: the
    ``last_run_at`` to record (the run's ``started_at``), ``None``: keep it."""
    task = tasks.get_task(conn, task_id)
    config = dict(task["config"])
    nxt = tasks.next_run_at(task["cadence"], config, now_ms)
    if nxt is not None and nxt > now_ms:
        config["nextRunAt"] = nxt
    else:
        nxt = None
        config.pop("nextRunAt", None)
    sql = ("UPDATE scheduled_tasks SET config_json = ?" + (", last_run_at = ?" if last_run is not None else "")
           + " WHERE id = ?")
    args: tuple[Any, ...] = (dumps_exact(config).decode(), *(() if last_run is None else (last_run,)), task_id)
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
        at = tasks.run_started_at(conn, task["id"], now_ms)
        conn.execute(
            "INSERT INTO task_runs(id, task_id, session_id, status, error_code, started_at, ended_at) "
            "VALUES (?, ?, NULL, 'error', ?, ?, ?)", (run_id, task["id"], REFUSED_CODE, at, at))
        tasks.prune_runs(conn, task["id"])
        run, kind = tasks.get_run(conn, run_id), "refused"
    except Conflict:
        run, kind = None, "skipped"  # the previous run is still running: no overlap
    nxt = _set_next(conn, task["id"], now_ms, last_run=None if run is None else int(run["startedAt"]))
    faults.point(FIRE_POINT)  # run recorded + slot advanced, transaction not yet committed
    return FireOutcome(kind, task, slot, run, nxt)


def fire_due(conn: sqlite3.Connection, *, now_ms: int, new_run_id: Callable[[], str],
             faults: Faults = NO_FAULTS, limit: int = 32) -> FireBatch:
    """Fire up to ``limit`` due tasks (oldest slot first) in the caller's transaction."""
    armed = [t for t in _tasks(conn) if is_armed(t)]
    for task in armed:
        if beyond_reach(task, now_ms):
            _move_back(conn, task, now_ms)
    armed = [t for t in _tasks(conn) if is_armed(t)]
    due = sorted((t for t in armed if t["nextRunAt"] <= now_ms), key=lambda t: (t["nextRunAt"], t["id"]))
    outcomes = [_fire_one(conn, t, new_run_id(), now_ms, faults) for t in due[:limit]]
    return FireBatch(outcomes=outcomes, next_due=next_due_at(conn, now_ms), more_due=len(due) > limit)
