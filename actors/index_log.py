"""The index log: appends are acknowledged before their index rows commit, reads still see them.

ARCHITECTURE.md "Read barriers". An append is acknowledged once its line is
durable (write + fdatasync); its index op goes to the DB writer in the same
synchronous step as it is given a host-wide sequence number (:meth:`IndexLog.enqueue`),
so the DB writer's mailbox holds index ops in sequence order. Each op's reply
(after its batch committed) settles its sequence (:meth:`IndexLog.settle`);
the *covered* sequence is the longest settled prefix. An op that failed is not
covered: it queues a repair of its session (:meth:`IndexLog.fail`, run by
:meth:`IndexLog.run_repairs` through the DB writer), and settles when that
repair commits, so a read never sees the barrier open over an acknowledged
line the index lacks.

* A read that needs the index waits until every append acknowledged before it
  arrived is covered (:meth:`IndexLog.barrier`); a session's own reads wait only
  for that session's last sequence (:meth:`IndexLog.wait_covered`).
* Ids of acknowledged-but-not-yet-indexed messages stay here (:meth:`held`) so an
  append in another session still sees them (D444) before the index does.
* The lag is bounded in bytes and in operations: past either bound new appends
  wait (:meth:`wait_room`), so memory and catch-up time stay bounded.
* While nobody waits (:meth:`wanted` is False) the DB writer may hold index ops
  back a few milliseconds to commit more of them at once; ``on_wanted``
  callbacks run the moment a reader or a stalled append starts waiting.
* ``on_covered`` callbacks run as sequences are covered (the pipeline retires
  receipt claims that were pinned until their row is in the database).

Single trio thread; no locks. After a crash nothing here survives and nothing
needs to: boot reconciles the index with the transcripts.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from runtime.kernel.actor import ActorError
from store.errors import IOFailure, StorageFull

__all__ = ["IndexLog", "IndexLogStatistics"]

log = logging.getLogger("pi_host.index_log")


def _transient(exc: BaseException) -> bool:
    """A repair failure that passes (a full disk, an I/O error, a DB writer restarting or busy)."""
    return isinstance(exc, (StorageFull, IOFailure, ActorError, OSError))


@dataclass(frozen=True, slots=True)
class IndexLogStatistics:
    acknowledged: int
    covered: int
    lag_ops: int
    lag_bytes: int
    max_lag_ops: int
    max_lag_bytes: int
    waits: int
    stalls: int
    failed_ops: int = 0
    """Index ops that failed (each then waited for a repair of its session)."""
    repairs: int = 0
    repair_failures: int = 0


@dataclass
class _Entry:
    nbytes: int
    held: tuple[str, ...]
    settled: bool = False


@dataclass
class IndexLog:
    max_lag_bytes: int = 64 * 1024 * 1024
    max_lag_ops: int = 50_000
    acknowledged: int = 0
    """Highest sequence handed out (its index op is in the DB writer's mailbox)."""
    covered_seq: int = 0
    """Highest sequence such that it and every sequence before it is in the index."""
    _entries: dict[int, _Entry] = field(default_factory=dict)
    _held: dict[str, Any] = field(default_factory=dict)
    _held_by: dict[str, int] = field(default_factory=dict)
    _waiters: list[tuple[int, int, trio.Event]] = field(default_factory=list)
    _tie: Any = field(default_factory=itertools.count)
    _room: trio.Event = field(default_factory=trio.Event)
    _room_wanted: bool = False
    """An append waits on ``_room`` (:meth:`wait_room`): the next advance that leaves room sets it."""
    _lag_bytes: int = 0
    _peak_ops: int = 0
    _peak_bytes: int = 0
    _waits: int = 0
    _stalls: int = 0
    _on_covered: list[Callable[[int], None]] = field(default_factory=list)
    _repairs: dict[str, tuple[Callable[[Any], Any], set[int]]] = field(default_factory=dict)
    _repair_wanted: trio.Event = field(default_factory=trio.Event)
    _failed: int = 0
    _repaired: int = 0
    _repairs_failed: int = 0
    _on_wanted: list[Callable[[], None]] = field(default_factory=list)
    _stalled: StorageFull | IOFailure | None = None
    """Why the last repair failed, while the disk is full or fails (cleared by the next one that commits)."""
    _stalls_seen: int = 0
    _retry_now: trio.Event = field(default_factory=trio.Event)

    # -- appends ---------------------------------------------------------------
    def enqueue(self, nbytes: int, held: Mapping[str, Any] | None = None) -> int:
        """The next sequence, for an index op the caller enqueues in this same synchronous step."""
        self.acknowledged += 1
        seq = self.acknowledged
        ids = tuple(held or ())
        self._entries[seq] = _Entry(nbytes, ids)
        for mid in ids:
            self._held[mid] = held[mid]  # type: ignore[index]
            self._held_by[mid] = seq
        self._lag_bytes += nbytes
        self._peak_ops = max(self._peak_ops, len(self._entries))
        self._peak_bytes = max(self._peak_bytes, self._lag_bytes)
        return seq

    def held(self, ids: Iterable[str]) -> dict[str, Any]:
        """What the not-yet-indexed appends hold of ``ids`` (``store.indexing.appends.Held`` values)."""
        return {mid: self._held[mid] for mid in ids if mid in self._held}

    def full(self) -> bool:
        return len(self._entries) >= self.max_lag_ops or self._lag_bytes >= self.max_lag_bytes

    async def wait_room(self) -> None:
        """Backpressure: wait while the index trails by more than the bounds.

        Always a cancellation point (trio's convention), even with room: a killed session
        actor stops here, before it posts the index op of lines it has just made durable."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.full():
            self._stalls += 1
            self._want()
        while self.full():
            self._room_wanted = True
            await self._room.wait()

    # -- the DB writer -----------------------------------------------------------
    def fail(self, seq: int, session: str, repair: Callable[[Any], Any]) -> None:
        """Index op ``seq`` failed (its batch failed whole, the DB writer died holding it...).

        Its lines are durable and acknowledged, so it is not covered: ``repair``
        (``repair(conn)``, one DB-writer op that indexes the session from its
        transcript) is queued for :meth:`run_repairs`, and ``seq`` settles when a
        repair of that session commits. One pending repair per session covers
        every failed op of it queued before the repair was sent.
        """
        if seq not in self._entries:
            return
        self._failed += 1
        _, seqs = self._repairs.get(session, (repair, set()))
        seqs.add(seq)
        self._repairs[session] = (repair, seqs)
        self._repair_wanted.set()

    async def run_repairs(self, write: Callable[[Callable[[Any], Any]], Awaitable[Any]], *,
                          backoff: float = 0.05, max_backoff: float = 2.0, max_refusals: int = 5) -> None:
        """Run queued repairs through ``write`` (the DB writer), one session at a time, forever.

        A repair that fails is queued again after a growing pause (a full disk
        stays full for a while), or at once when a read starts waiting; its
        sequences stay uncovered meanwhile, so a read never misses acknowledged
        lines: it waits for the repair, or fails with the repair's error when that
        is a full disk or an I/O error (:meth:`wait_covered`).
        Only a repair refused ``max_refusals`` times for a reason that is not
        transient (the transcript cannot be indexed at all) settles its sequences
        without it, so one broken file cannot hold every reader of the host.
        """
        pause = backoff
        refused: dict[str, int] = {}
        while True:
            if not self._repairs:
                self._repair_wanted = trio.Event()
                await self._repair_wanted.wait()
                continue
            session = next(iter(self._repairs))
            repair, seqs = self._repairs.pop(session)
            try:
                await write(repair)
            except Exception as exc:  # noqa: BLE001 - retried: the sequences stay uncovered until it commits
                self._repairs_failed += 1
                if isinstance(exc, StorageFull | IOFailure):
                    self._stall(exc)
                if not _transient(exc):
                    refused[session] = refused.get(session, 0) + 1
                if refused.get(session, 0) >= max_refusals:
                    # The transcript itself cannot be indexed (corrupt, not a regular file...): waiting
                    # longer would hold every reader of the host. Its session reports the error itself.
                    log.error("index repair of session %s refused %d times (%s); its failed ops are settled",
                              session, refused.pop(session), exc)
                    for seq in sorted(seqs):
                        self.settle(seq)
                    continue
                again = self._repairs.pop(session, None)
                merged = seqs | (again[1] if again else set())
                self._repairs[session] = (again[0] if again else repair, merged)
                with trio.move_on_after(pause):
                    await self._retry_now.wait()  # or at once, for a read that waits (wait_covered)
                self._retry_now = trio.Event()
                pause = min(max_backoff, pause * 2)
                continue
            pause = backoff
            refused.pop(session, None)
            self._repaired += 1
            self._stalled = None
            for seq in sorted(seqs):
                self.settle(seq)

    def settle(self, seq: int) -> None:
        """Index op ``seq`` committed (or a repair of its session did): its lines are in the index.
        The covered sequence advances over every settled prefix."""
        entry = self._entries.get(seq)
        if entry is None:
            return
        entry.settled = True
        advanced = self.covered_seq
        while True:
            nxt = self._entries.get(advanced + 1)
            if nxt is None or not nxt.settled:
                break
            advanced += 1
            del self._entries[advanced]
            self._lag_bytes -= nxt.nbytes
            for mid in nxt.held:
                if self._held_by.get(mid) == advanced:
                    del self._held_by[mid]
                    del self._held[mid]
        if advanced == self.covered_seq:
            return
        self.covered_seq = advanced
        while self._waiters and self._waiters[0][0] <= advanced:
            heapq.heappop(self._waiters)[2].set()
        if self._room_wanted and not self.full():
            self._room_wanted = False
            self._room.set()
            self._room = trio.Event()
        for fn in self._on_covered:
            fn(advanced)

    def on_covered(self, fn: Callable[[int], None]) -> None:
        self._on_covered.append(fn)

    def on_wanted(self, fn: Callable[[], None]) -> None:
        self._on_wanted.append(fn)

    def wanted(self) -> bool:
        """True while a read waits for the index or an append waits for room."""
        return bool(self._waiters) or self.full()

    def _want(self) -> None:
        for fn in self._on_wanted:
            fn()

    def _stall(self, exc: StorageFull | IOFailure) -> None:
        """A repair failed for want of space (or an I/O error): every read waiting for coverage learns it."""
        self._stalled = exc
        self._stalls_seen += 1
        while self._waiters:
            heapq.heappop(self._waiters)[2].set()

    # -- reads -------------------------------------------------------------------
    async def wait_covered(self, seq: int) -> None:
        """Wait until sequence ``seq`` is covered (returns at once when it already is).

        While repairs of failed index ops fail for want of space or with an I/O error, a wait
        has the next repair tried at once and ends with that attempt's error (``STORAGE_FULL``,
        retriable; ``IO_ERROR``) if it fails too, instead of lasting as long as the disk stays
        full: a read that must see those appends cannot be served, and its caller learns why. A
        repair that fails while a read already waits is tried again at once for it first (a
        moment's full disk costs that read nothing)."""
        if seq <= self.covered_seq:
            return
        self._waits += 1
        retried = False  # a repair attempt was asked for this wait
        while True:
            event = trio.Event()
            heapq.heappush(self._waiters, (seq, next(self._tie), event))
            self._want()
            stalls = self._stalls_seen
            if self._stalled is not None:
                self._retry_now.set()
                retried = True
            await event.wait()
            if seq <= self.covered_seq:
                return
            exc = self._stalled
            if exc is not None and self._stalls_seen != stalls and retried:
                raise type(exc)(
                    f"the index cannot take appends acknowledged earlier ({exc.message}); they are safe in "
                    "their transcripts and are indexed as soon as the disk takes writes again", data=exc.data)

    async def barrier(self) -> None:
        """Wait until every append acknowledged before this call is in the index."""
        await self.wait_covered(self.acknowledged)

    def statistics(self) -> IndexLogStatistics:
        return IndexLogStatistics(
            acknowledged=self.acknowledged, covered=self.covered_seq, lag_ops=len(self._entries),
            lag_bytes=self._lag_bytes, max_lag_ops=self._peak_ops, max_lag_bytes=self._peak_bytes,
            waits=self._waits, stalls=self._stalls, failed_ops=self._failed, repairs=self._repaired,
            repair_failures=self._repairs_failed)
