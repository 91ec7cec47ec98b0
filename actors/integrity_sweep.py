"""The idle integrity sweep: the index checked table by table while the host is idle.

Boot's ``quick_check`` does not compare tables with their indexes, and a read finds damage only where it
reads, so a byte changed inside a DB-only row (a turn, an approval, a setting) would be served wrong until
something tripped over it. Each step here runs ``PRAGMA integrity_check(<table>)`` on a read-pool
connection in a worker thread (a WAL reader: the DB writer is never held up), one table per step, each
after the DB writer has committed nothing for ``idle_after`` seconds; each pass starts ``interval``
seconds after the previous one ended. The first starts ``first_after`` seconds after boot (a minute by
default, at most ``interval``): boot's ``quick_check`` is blind to damage inside a row and to the search
indexes, so damage made while the host was down (a disk, a copy, another program) is found within a
minute of serving, not an interval later. Damage found is treated as a read meeting it: the host is told
(``on_corruption``) and restarts itself on an index rebuilt from the transcripts, salvaging the DB-only
rows that still read back (``store/indexing/salvage.py``, which leaves out the rows the check names). The
sweep never stops the host by failing: an unexpected error is logged and the pass goes on at the next
interval.

The last steps check each FTS5 index with its own ``integrity-check`` (``store/indexing/integrity.py``:
``integrity_check`` sees only its shadow tables' b-trees, not a leaf gone from the index). That command
holds the write lock while it runs, so it gives way to the DB writer: it does not wait for the lock, and
SQLite's progress callback interrupts it as soon as the writer sets out to open a transaction
(``GroupStats.writes_begun``); the step is tried again once the writer has been idle ``idle_after``
seconds. The writer then waits for the lock at most one progress interval (milliseconds).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import trio

from actors.db_reader import PoolClosed, ReadPool
from runtime.kernel.threads import run_in_thread
from store.indexing.corruption import is_corruption
from store.indexing.group_commit import GroupStats, IndexCorrupt
from store.indexing.integrity import check_fts, check_table, fts_tables, open_fts_checker, sweep_tables

__all__ = ["IntegritySweep"]

log = logging.getLogger("pi_host")

_PROGRESS_OPS = 10_000
"""SQLite VM instructions between two looks at whether a table's step must stop (well under a millisecond)."""
_FTS_PROGRESS_OPS = 1_000
"""The same for an FTS5 check, whose work is mostly outside the VM (it reads its leaves as blobs): measured
on a 25 MB trigram index (20,000 messages), 71 looks in a 0.32 s check, one every 4.5 ms; at 10,000, one
every 70 ms, which the DB writer would wait."""


class IntegritySweep:
    def __init__(self, reads: ReadPool, stats: GroupStats, *, idle_after: float, interval: float,
                 on_corruption: Callable[[BaseException], None], db_path: Path | None = None,
                 first_after: float | None = None) -> None:
        self._reads = reads
        self._db_path = db_path
        """The index file, for the FTS5 checks' writable connection (None: those steps are left out)."""
        self._stats = stats
        self._idle_after = idle_after
        self._interval = interval
        self._first_after = interval if first_after is None else min(first_after, interval)
        """Seconds from boot to the first pass (None: one interval)."""
        self._on_corruption = on_corruption
        self._seen = -1
        """The DB writer's batch count when the host was last seen idle."""

    async def run(self) -> None:
        wait = self._first_after
        while True:
            await trio.sleep(wait)
            wait = self._interval
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
            if self._damaged(table, await self._step(table)):
                return True
        if self._db_path is not None:
            for table in await self._reads.run(fts_tables):
                if self._damaged(table, await self._fts_step(table)):
                    return True
        self._stats.integrity_passes += 1
        return False

    def _damaged(self, table: str, problems: list[str]) -> bool:
        """One step done: True (the host told, it restarts) when it found damage."""
        self._stats.integrity_checks += 1
        if not problems:
            return False
        log.error("the integrity sweep found the index damaged", extra={"table": table, "problems": problems[:5]})
        self._on_corruption(IndexCorrupt(f"integrity_check({table}): {problems[0]}"))
        return True

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
            conn.set_progress_handler(lambda: 1 if stop.is_set() else 0, _PROGRESS_OPS)
            try:
                return check_table(conn, table)
            finally:
                conn.set_progress_handler(None, 0)

    async def _fts_step(self, table: str) -> list[str]:
        """One FTS5 index's ``integrity-check``, tried again after each time it gave way to the DB writer."""
        while True:
            await self._idle()
            stop = threading.Event()
            try:
                problems = await run_in_thread(self._check_fts, table, stop, on_cancel=stop.set)
            except sqlite3.OperationalError:
                if stop.is_set():
                    await trio.lowlevel.checkpoint()  # the cancellation that interrupted it
                raise
            if problems is not None:
                return problems
            self._seen = -1  # gave way: a whole idle period before the next try

    def _check_fts(self, table: str, stop: threading.Event) -> list[str] | None:
        """In a worker thread: the problems found, or None when the check gave way to the DB writer (it
        held the write lock, or set out to open a transaction while the check ran)."""
        assert self._db_path is not None
        begun = self._stats.writes_begun

        def writer_wants() -> bool:
            return self._stats.writes_begun != begun

        try:
            conn = open_fts_checker(self._db_path)
            try:
                conn.set_progress_handler(lambda: 1 if stop.is_set() or writer_wants() else 0, _FTS_PROGRESS_OPS)
                return check_fts(conn, table)
            finally:
                conn.close()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # the latter: a message quoting damage
            if is_corruption(exc):
                return [str(exc)]
            if isinstance(exc, sqlite3.OperationalError) and not stop.is_set() and (
                    writer_wants() or getattr(exc, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED")):
                return None
            raise

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

