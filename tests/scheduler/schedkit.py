"""Helpers for the scheduler tests: a real schema DB driven from the trio thread, a virtual wall clock.

The DB handle runs each op in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the test
thread (what the DB writer does, minus the worker thread), so trio's
``autojump_clock`` never jumps while SQL is running: virtual time only moves
when every task sleeps, which makes the firing times exact.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

from actors.events import EventBus
from actors.scheduler import Scheduler, SchedulerConfig, SchedulerStatus
from store import tasks
from store.faults import NO_FAULTS, Faults
from store.indexing.database import apply_pragmas
from store.upgrade.schema import apply_schema

BASE = 1_785_056_400_000  # Sunday 2026-07-26 09:00:00 UTC
HOUR = 3_600_000
MINUTE = 60_000
DAY = 24 * HOUR


class LoopDb:
    """``write(fn)`` / ``run(fn, *args)`` on one connection, each write in its own transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.writes = 0

    async def write(self, fn: Callable[[sqlite3.Connection], Any], *, durable: bool = True, label: str = "") -> Any:
        await trio.lowlevel.checkpoint()
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            out = fn(self.conn)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        self.writes += 1
        return out

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(self.conn, *args)

    def tx(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Synchronous write (test setup)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            out = fn(self.conn)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return out


@contextmanager
def open_db(path: Path) -> Iterator[LoopDb]:
    conn = sqlite3.connect(path, isolation_level=None)
    apply_pragmas(conn)
    apply_schema(conn)
    try:
        yield LoopDb(conn)
    finally:
        conn.close()


class VirtualWall:
    """Wall-clock ms that advance with trio's (virtual) clock: ``base`` at the moment of creation."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.t0 = trio.current_time()

    def __call__(self) -> int:
        return self.base + round((trio.current_time() - self.t0) * 1000)

    async def sleep_until(self, wall_ms: int) -> None:
        await trio.sleep_until(self.t0 + (wall_ms - self.base) / 1000)


@asynccontextmanager
async def running_scheduler(db: LoopDb, clock: Callable[[], int], *, faults: Faults = NO_FAULTS,
                            config: SchedulerConfig | None = None) -> AsyncIterator[tuple[Scheduler, EventBus]]:
    bus = EventBus()
    sched = Scheduler(db=db, reads=db, bus=bus, now_ms=clock, faults=faults, config=config or SchedulerConfig())
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        try:
            yield sched, bus
        finally:
            sched.stop()


HOURLY_SCHEDULE = {"hour": 0, "minute": 0}
"""An hourly task's schedule object: §4.11 requires one to arm it ("required by Hourly intervals"); an
hourly task ignores its fields (nextRunAt = now + 1 h)."""


def create(db: LoopDb, task_id: str, now_ms: int, *, cadence: str = "hourly", enabled: bool = True,
           config: dict[str, Any] | None = None, title: str = "Digest") -> dict[str, Any]:
    """Create a task; an hourly one gets :data:`HOURLY_SCHEDULE` unless ``config`` names a schedule."""
    cfg = dict(config or {})
    if cadence == "hourly":
        cfg.setdefault("schedule", HOURLY_SCHEDULE)
    return db.tx(lambda c: tasks.create_task(c, task_id=task_id, title=title, prompt=f"run {task_id}",
                                             cadence=cadence, enabled=enabled, config=cfg, now_ms=now_ms))


def runs(db: LoopDb, task_id: str) -> list[dict[str, Any]]:
    return list(reversed(tasks.list_runs(db.conn, task_id).items))  # oldest first


def task(db: LoopDb, task_id: str) -> dict[str, Any]:
    return tasks.get_task(db.conn, task_id)


async def status(sched: Scheduler) -> dict[str, Any]:
    result: dict[str, Any] = await sched.ask(SchedulerStatus())
    return result
