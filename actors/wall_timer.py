"""An actor that sleeps until a wall-clock time kept in the database (the scheduler, the request expiry).

It keeps only the earliest such time in memory (:attr:`WallTimer._next`, re-read
by :meth:`WallTimer._refresh` on start and on every wake-up, so a lost tell only
delays a change), and sleeps until then instead of polling: its mailbox wait is
bounded by ``trio.move_on_at`` on the next wake-up, which delivers a
:class:`Tick`. It also wakes at least every ``max_sleep`` seconds so a
wall-clock step (suspend/resume, NTP) is noticed. A failed write is retried with
exponential backoff (:meth:`WallTimer._backoff`), never in a tight loop.

Time: ``now_ms()`` (the injected wall clock) decides what is due; trio's clock
does the sleeping. Subclasses say what to read (:meth:`WallTimer._read_next`)
and what to do when it is due.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import trio

from runtime.kernel.actor import Actor, Envelope

__all__ = ["Publishes", "Reads", "Tick", "TimerConfig", "WallTimer", "Writes"]


class Writes(Protocol):
    async def write(self, fn: Callable[[Any], Any], *, durable: bool = True, label: str = "") -> Any: ...


class Reads(Protocol):
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class Publishes(Protocol):
    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None) -> int: ...


@dataclass(frozen=True)
class Tick:
    """The wake-up time passed (sent by the actor to itself)."""


@dataclass(frozen=True)
class TimerConfig:
    max_sleep: float = 60.0  # longest sleep between wall-clock checks (s)
    retry_min: float = 1.0  # first backoff after a failed write (s), doubled per failure
    retry_max: float = 60.0
    batch_limit: int = 32  # most rows handled in one transaction


class WallTimer(Actor):
    log: ClassVar[logging.Logger]
    next_what: ClassVar[str]
    """What the earliest time is, for log lines ("due time", "deadline")."""
    work_what: ClassVar[str]
    """What a failed write was doing, for log lines."""

    def __init__(self, name: str, *, reads: Reads, now_ms: Callable[[], int], config: TimerConfig,
                 **actor: Any) -> None:
        super().__init__(name, **actor)
        self._reads = reads
        self._now_ms = now_ms
        self._config = config
        self._next: int | None = None
        self._retry_at: float | None = None  # trio time before which no write is attempted
        self._failures = 0

    def _read_next(self, conn: Any) -> int | None:
        """The earliest wall-clock time (ms) something is due at; ``None``: nothing is."""
        raise NotImplementedError

    async def on_start(self) -> None:
        await self._refresh()

    async def _wait_for_message(self) -> Envelope | None:
        """The kernel's mailbox wait, bounded by the next wake-up (then a :class:`Tick`)."""
        with trio.move_on_at(self._wake_at()):
            try:
                return await self._recv.receive()
            except trio.EndOfChannel:
                return None
        return Envelope(Tick())

    async def _refresh(self) -> None:
        """Re-read the earliest time (a lost tell only delays a wake-up to the next one)."""
        try:
            self._next = await self._reads.run(self._read_next)
        except Exception as exc:  # noqa: BLE001 - resync through the next attempt instead
            self.log.warning("%s: reading the next %s failed (%s: %s)", self.name, self.next_what,
                             type(exc).__name__, exc)
            self._next = self._now_ms()

    def _wake_at(self) -> float:
        now_t = trio.current_time()
        wake = now_t + self._config.max_sleep
        if self._retry_at is not None:
            return min(wake, self._retry_at)
        if self._next is not None:
            wake = min(wake, now_t + max(0, self._next - self._now_ms()) / 1000)
        return wake

    def _backing_off(self) -> bool:
        return self._retry_at is not None and trio.current_time() < self._retry_at

    def _backoff(self, exc: BaseException) -> None:
        self._failures += 1
        delay = min(self._config.retry_max, self._config.retry_min * 2 ** (self._failures - 1))
        self._retry_at = trio.current_time() + delay
        self.log.warning("%s: %s failed (%s: %s); retrying in %.1fs", self.name, self.work_what,
                         type(exc).__name__, exc, delay)

    def _recovered(self) -> None:
        self._failures, self._retry_at = 0, None
