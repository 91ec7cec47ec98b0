"""The scheduler actor: scheduled tasks → ``task_runs`` + ``task.due`` events (seed 003 §4.11).

One supervised actor. It keeps only the earliest ``nextRunAt`` of the armed
tasks in memory (re-read from the DB on start and on every
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
from typing import Any, Protocol

import trio

from runtime.kernel.actor import Actor, ActorError, Envelope
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


class _Db(Protocol):
    async def write(self, fn: Callable[[Any], Any], *, durable: bool = True, label: str = "") -> Any: ...


class _Reads(Protocol):
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class _Bus(Protocol):
    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None) -> int: ...


@dataclass(frozen=True)
class SchedulerConfig:
    max_sleep: float = 60.0  # longest sleep between wall-clock checks (s)
    retry_min: float = 1.0  # first backoff after a failed fire (s), doubled per failure
    retry_max: float = 60.0
    batch_limit: int = 32  # most tasks fired in one transaction


@dataclass(frozen=True)
class TasksChanged:
    """A task was created/updated/deleted/started: re-read the next due time."""


@dataclass(frozen=True)
class Tick:
    """The wake-up deadline passed (sent by the actor to itself)."""


@dataclass(frozen=True)
class SchedulerStatus:
    """Ask: a snapshot ``{nextDueAt, fired, refused, skipped, failures}``."""


class Scheduler(Actor):
    def __init__(
        self,
        *,
        db: _Db,
        reads: _Reads,
        bus: _Bus,
        now_ms: Callable[[], int],
        faults: Faults = NO_FAULTS,
        config: SchedulerConfig = SchedulerConfig(),
        name: str = "scheduler",
        mailbox_size: int = 16,
    ) -> None:
        super().__init__(name, mailbox_size=mailbox_size)
        self._db = db
        self._reads = reads
        self._bus = bus
        self._now_ms = now_ms
        self._faults = faults
        self._config = config
        self._next_due: int | None = None
        self._retry_at: float | None = None  # trio time before which no fire is attempted
        self._failures = 0
        self._counts = {"fired": 0, "refused": 0, "skipped": 0}

    # -- actor hooks ----------------------------------------------------------

    async def on_start(self) -> None:
        await self._refresh()

    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, SchedulerStatus):
            return {"nextDueAt": self._next_due, "failures": self._failures, **self._counts}
        if not isinstance(msg, (TasksChanged, Tick)):
            raise TypeError(f"scheduler got {type(msg).__name__}")
        await self._refresh()
        await self._fire_due()
        return None

    async def _wait_for_message(self) -> Envelope | None:
        """The kernel's mailbox wait, bounded by the next wake-up (then a :class:`Tick`)."""
        with trio.move_on_at(self._wake_at()):
            try:
                return await self._recv.receive()
            except trio.EndOfChannel:
                return None
        return Envelope(Tick())

    # -- scheduling -------------------------------------------------------------

    async def _refresh(self) -> None:
        """Re-read the earliest armed slot (also on every timer wake-up: a lost tell only delays)."""
        try:
            self._next_due = await self._reads.run(schedule.next_due_at)
        except Exception as exc:  # noqa: BLE001 - resync through the next fire attempt instead
            log.warning("scheduler: reading the next due time failed (%s: %s)", type(exc).__name__, exc)
            self._next_due = self._now_ms()

    def _wake_at(self) -> float:
        now_t = trio.current_time()
        wake = now_t + self._config.max_sleep
        if self._retry_at is not None:
            return min(wake, self._retry_at)
        if self._next_due is not None:
            wake = min(wake, now_t + max(0, self._next_due - self._now_ms()) / 1000)
        return wake

    async def _fire_due(self) -> None:
        while self._next_due is not None:
            if self._retry_at is not None and trio.current_time() < self._retry_at:
                return
            now = self._now_ms()
            if now < self._next_due:
                return
            fire = partial(schedule.fire_due, now_ms=now, new_run_id=partial(new_id, "run_"),
                           faults=self._faults, limit=self._config.batch_limit)
            try:
                batch: schedule.FireBatch = await self._db.write(fire, durable=True, label="scheduler.fire")
            except Exception as exc:  # noqa: BLE001 - retried later; trio.Cancelled is a BaseException
                self._backoff(exc)
                return
            self._failures, self._retry_at = 0, None
            self._next_due = batch.next_due
            self._announce(batch)
            if not batch.more_due:
                return

    def _backoff(self, exc: BaseException) -> None:
        self._failures += 1
        delay = min(self._config.retry_max, self._config.retry_min * 2 ** (self._failures - 1))
        self._retry_at = trio.current_time() + delay
        log.warning("scheduler: firing due tasks failed (%s: %s); retrying in %.1fs",
                    type(exc).__name__, exc, delay)

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
                log.warning("scheduler: task %s slot %s skipped: its previous run is still running",
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

