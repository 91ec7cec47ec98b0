"""The idle integrity sweep: the index checked table by table while the host is idle.

Boot's ``quick_check`` does not compare tables with their indexes, and a read finds damage only where it
reads, so a byte changed inside a DB-only row (a turn, an approval, a setting) would be served wrong until
something tripped over it. Each step here runs ``PRAGMA integrity_check(<table>)`` on a read-pool
connection in a worker thread (a WAL reader: the DB writer is never held up), one table per step, each
after the DB writer has committed nothing for ``idle_after`` seconds; each pass starts ``interval``
seconds after the previous one ended (the first, that long after boot, whose ``quick_check`` just
ran). Damage found is treated as a read meeting it: the host is told (``on_corruption``)
and restarts itself on an index rebuilt from the transcripts, salvaging the DB-only rows that still read
back (``store/indexing/salvage.py``, which leaves out the rows the check names). The sweep never stops the
host by failing: an unexpected error is logged and the pass goes on at the next interval.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

import trio

from actors.db_reader import PoolClosed, ReadPool
from runtime.kernel.threads import run_in_thread
from store.indexing.group_commit import GroupStats, IndexCorrupt
from store.indexing.integrity import check_table, sweep_tables

__all__ = ["IntegritySweep"]

log = logging.getLogger("pi_host")


class IntegritySweep:
    def __init__(self, reads: ReadPool, stats: GroupStats, *, idle_after: float, interval: float,
                 on_corruption: Callable[[BaseException], None]) -> None:
        self._reads = reads
        self._stats = stats
        self._idle_after = idle_after
        self._interval = interval
        self._on_corruption = on_corruption
        self._seen = -1
        """The DB writer's batch count when the host was last seen idle."""

    async def run(self) -> None:
        while True:
            await trio.sleep(self._interval)  # boot has just run quick_check: the first pass waits too
            try:
                if await self._one_pass():
                    return  # damage found: the host restarts
            except (PoolClosed, IndexCorrupt):
                return  # shutting down, or a step met damage the read pool has already reported
            except Exception as exc:  # noqa: BLE001 - a sweep failure must never stop the host
                log.warning("the integrity sweep failed; it runs again later: %s", exc, exc_info=True)

    async def _one_pass(self) -> bool:
        for table in await self._reads.run(sweep_tables):
            await self._idle()
            problems = await self._step(table)
            self._stats.integrity_checks += 1
            if problems:
                log.error("the integrity sweep found the index damaged",
                          extra={"table": table, "problems": problems[:5]})
                self._on_corruption(IndexCorrupt(f"integrity_check({table}): {problems[0]}"))
                return True
        self._stats.integrity_passes += 1
        return False

    async def _step(self, table: str) -> list[str]:
        """One table's check in a worker thread; the host stopping interrupts it at SQLite's next progress
        callback instead of waiting for a large table's check to end."""
        stop = threading.Event()
        try:
            return await run_in_thread(self._check, table, stop, on_cancel=stop.set)
        except sqlite3.OperationalError:
            if stop.is_set():
                await trio.lowlevel.checkpoint()  # the cancellation that interrupted it
            raise

    def _check(self, table: str, stop: threading.Event) -> list[str]:
        with self._reads.borrow() as conn:
            conn.set_progress_handler(lambda: 1 if stop.is_set() else 0, 10_000)
            try:
                return check_table(conn, table)
            finally:
                conn.set_progress_handler(None, 0)

    async def _idle(self) -> None:
        """Until the DB writer has committed no batch for ``idle_after`` seconds; at once while it has
        committed none since the previous step began (the host stayed idle)."""
        if self._seen == self._stats.batches:
            return
        while True:
            self._seen = self._stats.batches
            await trio.sleep(self._idle_after)
            if self._stats.batches == self._seen:
                return

