"""The scheduler actor: scheduled tasks → ``task_runs`` + ``task.due`` events (seed 003 §4.11).

One supervised actor. It keeps only the earliest ``nextRunAt`` of the armed
tasks in memory (``actors/wall_timer.py``: re-read from the DB on start and on every
:class:`TasksChanged` tell), and sleeps until then instead of polling: its
mailbox wait is bounded by ``trio.move_on_at`` on the next wake-up, which
delivers a :class:`Tick`. A wake-up also happens at least every
``max_sleep`` seconds so a wall-clock step (suspend/resume, NTP) is noticed;
each wake-up re-reads the earliest slot (one small read; writes happen only
when something is due), so a lost tell delays a change by at most
``max_sleep``.

Time: ``now_ms()`` (injected wall clock) decides what is due; trio's clock
does the sleeping. Tests run it under ``autojump_clock`` with
``now_ms = base + trio.current_time() * 1000``.

Firing (``store/schedule.fire_due``) is ONE durable DB-writer transaction per
batch: run row + ``nextRunAt`` advance (or the recorded refusal of a plan/goal
task) commit together, so a crash can never leave a started run whose slot
was not advanced (no double fire) nor an advanced slot without its run.
After the commit each started run is announced as a ``task.due`` event; the
host never runs a model. The event is at most once: if the host dies between
commit and publish, the run stays ``running`` until the boot fence aborts it
(``tasks.runs`` shows it). A failed fire (DB writer restarting, I/O error) is
retried with exponential backoff, never in a tight loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from actors.wall_timer import Publishes, Reads, Tick, TimerConfig, WallTimer, Writes
from runtime.kernel.actor import ActorError
from store import schedule
from store.faults import NO_FAULTS, Faults
from store.ids import new_id

log = logging.getLogger("pi_host.scheduler")

__all__ = [
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStatus",
    "TasksChanged",
    "Tick",
    "tasks_changed",
]

TASK_DUE = "task.due"


@dataclass(frozen=True)
class SchedulerConfig(TimerConfig):
    batch_limit: int = 32  # most tasks fired in one transaction


@dataclass(frozen=True)
class TasksChanged:
    """A task was created/updated/deleted/started: re-read the next due time."""


@dataclass(frozen=True)
class SchedulerStatus:
    """Ask: a snapshot ``{nextDueAt, fired, refused, skipped, failures}``."""


class Scheduler(WallTimer):
    log = log
    next_what = "due time"
    work_what = "firing due tasks"

    def __init__(
        self,
        *,
        db: Writes,
        reads: Reads,
        bus: Publishes,
        now_ms: Callable[[], int],
        faults: Faults = NO_FAULTS,
        config: SchedulerConfig = SchedulerConfig(),
        name: str = "scheduler",
        mailbox_size: int = 16,
    ) -> None:
        super().__init__(name, reads=reads, now_ms=now_ms, config=config, mailbox_size=mailbox_size)
        self._db = db
        self._bus = bus
        self._faults = faults
        self._counts = {"fired": 0, "refused": 0, "skipped": 0}

    def _read_next(self, conn: Any) -> int | None:
        return schedule.next_due_at(conn, self._now_ms())

    # -- actor hooks ----------------------------------------------------------

    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, SchedulerStatus):
            return {"nextDueAt": self._next, "failures": self._failures, **self._counts}
        if not isinstance(msg, (TasksChanged, Tick)):
            raise TypeError(f"scheduler got {type(msg).__name__}")
        await self._refresh()
        await self._fire_due()
        return None

    # -- scheduling -------------------------------------------------------------

    async def _fire_due(self) -> None:
        while self._next is not None:
            if self._backing_off():
                return
            now = self._now_ms()
            if now < self._next:
                return
            fire = partial(schedule.fire_due, now_ms=now, new_run_id=partial(new_id, "run_"),
                           faults=self._faults, limit=self._config.batch_limit)
            try:
                batch: schedule.FireBatch = await self._db.write(fire, durable=True, label="scheduler.fire")
            except Exception as exc:  # noqa: BLE001 - retried later; trio.Cancelled is a BaseException
                self._backoff(exc)
                return
            self._recovered()
            self._next = batch.next_due
            self._announce(batch)
            if not batch.more_due:
                return

    def _announce(self, batch: schedule.FireBatch) -> None:
        for outcome in batch.outcomes:
            if outcome.kind == "started":
                self._counts["fired"] += 1
                self._bus.publish(TASK_DUE, schedule.due_payload(outcome))
            elif outcome.kind == "refused":
                self._counts["refused"] += 1
                log.info("scheduler: task %s is in %s mode; run %s refused (%s)", outcome.task["id"],
                         outcome.task["mode"], outcome.run and outcome.run["id"], schedule.REFUSED_CODE)
            else:
                self._counts["skipped"] += 1
                log.warning("scheduler: task %s slot %s skipped: its previous run is still running "
                            "(or its stored status is damaged)",
                            outcome.task["id"], outcome.slot)


def tasks_changed(tell_nowait: Callable[[Any], None]) -> Callable[[], None]:
    """A never-raising "tasks changed" notifier for the ``tasks.*`` methods.

    ``tell_nowait`` is the scheduler ref's. A full mailbox already holds a
    wake-up; no running incarnation re-reads everything when it starts. Either
    way the notification may be dropped safely.
    """
    def notify() -> None:
        try:
            tell_nowait(TasksChanged())
        except ActorError:
            pass

    return notify

