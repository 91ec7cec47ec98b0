"""``IndexLog``: a failed index op is not covered until a repair of its session commits (issue 22)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from actors.index_log import IndexLog
from store.errors import CorruptData, StorageFull
from tests.eventkit import count_events


async def test_a_failed_op_holds_the_barrier_until_its_repair_commits(autojump_clock: Any) -> None:
    """Reproduces issue 22: ``IndexLog.settle`` settled an op that failed like one that committed, so
    the barrier opened over an acknowledged append the index lacked."""
    log = IndexLog()
    first, second = log.enqueue(10, {"m1": "held"}), log.enqueue(10)
    attempts: list[str] = []

    async def write(fn: Callable[[Any], Any]) -> Any:
        attempts.append(fn(None))
        if len(attempts) == 1:
            raise StorageFull("the disk is full")  # transient: tried again after a pause
        return None

    log.fail(first, "s1", lambda conn: "repair s1")
    log.settle(second)
    assert log.covered_seq == 0 and log.held(["m1"]) == {"m1": "held"}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run_repairs, write)
        with trio.fail_after(10):
            await log.barrier()
        nursery.cancel_scope.cancel()
    assert attempts == ["repair s1", "repair s1"]
    assert log.covered_seq == second and log.held(["m1"]) == {}
    stats = log.statistics()
    assert (stats.failed_ops, stats.repairs, stats.repair_failures) == (1, 1, 1)


async def test_a_transcript_that_cannot_be_indexed_does_not_hold_every_reader(autojump_clock: Any) -> None:
    log = IndexLog()
    seq = log.enqueue(10)

    async def write(fn: Callable[[Any], Any]) -> Any:
        raise CorruptData("not a regular file")

    log.fail(seq, "broken", lambda conn: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run_repairs, write)
        with trio.fail_after(60):
            await log.barrier()
        nursery.cancel_scope.cancel()
    assert log.statistics().repair_failures == 5 and log.covered_seq == seq


async def test_while_the_disk_stays_full_a_wait_ends_with_storage_full_not_a_hang(autojump_clock: Any) -> None:
    """Reproduces a hang found by hand on a full tmpfs: a disk that filled during a stream of appends left
    their index ops failing, and every read that had to see them (and the next append of the session,
    whose catch-up reads) waited for a repair that could not commit as long as the disk stayed full.
    Now a wait asks for a repair attempt at once and ends with its error if that fails too; once the
    disk takes writes again the same wait is served."""
    log = IndexLog()
    seq = log.enqueue(10)
    full = [True]
    attempts: list[float] = []

    async def write(fn: Callable[[Any], Any]) -> Any:
        attempts.append(trio.current_time())
        if full[0]:
            raise StorageFull("index commit: the disk is full")
        return None

    log.fail(seq, "s1", lambda conn: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run_repairs, write)
        await trio.sleep(30)  # the repair keeps failing, its pause grown to the maximum (2 s)
        before = len(attempts)
        started = trio.current_time()
        for _ in range(3):
            with trio.fail_after(1):  # each wait: one attempt, at once, not after the pause
                try:
                    await log.barrier()
                except StorageFull as exc:
                    assert exc.retriable and "safe in their transcripts" in exc.message
                else:
                    raise AssertionError("the barrier opened over an op the index lacks")
        assert len(attempts) - before >= 3 and trio.current_time() - started < 0.1
        full[0] = False
        with trio.fail_after(1):
            await log.barrier()  # space came back: the attempt this wait asks for commits
        nursery.cancel_scope.cancel()
    assert log.covered_seq == seq


async def test_an_append_waiting_for_room_wakes_and_no_event_is_built_per_settle(monkeypatch: Any) -> None:
    """``IndexLog.settle`` builds a new room event only when an append waits for room, not at every sequence."""
    log = IndexLog(max_lag_ops=2)
    events = count_events(monkeypatch)
    for _ in range(10):
        log.settle(log.enqueue(10))
    assert events.built == 0 and log.covered_seq == 10
    first, _second = log.enqueue(10), log.enqueue(10)
    assert log.full()
    woke: list[bool] = []

    async def append() -> None:
        await log.wait_room()
        woke.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(append)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        log.settle(first)
        await trio.testing.wait_all_tasks_blocked()
    assert woke == [True]
