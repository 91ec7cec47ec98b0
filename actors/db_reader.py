"""A small pool of read-only SQLite connections used from worker threads.

WAL readers never block the writer. Each call borrows one connection for the
duration of one function run in a thread; the pool size bounds both
connections and threads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from store.database import open_reader

T = TypeVar("T")


class ReadPool:
    def __init__(self, db_path: Path, *, size: int = 4) -> None:
        self._db_path = db_path
        self._size = size
        self._free: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._limiter = trio.CapacityLimiter(size)
        self._closed = False

    def warm(self) -> None:
        """Open every connection now (blocking; run in a thread at startup), not on first use."""
        while len(self._all) < self._size:
            self._free.append(self._open())

    def _open(self) -> sqlite3.Connection:
        conn = open_reader(self._db_path)
        self._all.append(conn)
        return conn

    def _take(self) -> sqlite3.Connection:
        if self._free:
            return self._free.pop()
        return self._open()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise RuntimeError("read pool closed")
        async with self._limiter:
            conn = self._take()
            try:
                return await trio.to_thread.run_sync(_call, fn, conn, args)
            finally:
                self._free.append(conn)

    def close(self) -> None:
        self._closed = True
        for conn in self._all:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._all.clear()
        self._free.clear()


def _call(fn: Callable[..., T], conn: sqlite3.Connection, args: tuple[Any, ...]) -> T:
    # Each read is its own snapshot: make sure no implicit transaction lingers.
    try:
        return fn(conn, *args)
    finally:
        if conn.in_transaction:
            conn.rollback()
