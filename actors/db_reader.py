"""A small pool of read-only SQLite connections used from worker threads.

WAL readers never block the writer. :meth:`ReadPool.run` borrows one
connection for one function run in a worker thread; :meth:`ReadPool.borrow`
lends one to code that is already in a worker thread (a session actor folds
its read into the same hop as its file write). The pool size bounds the
connections; a thread that finds none free waits for one.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from runtime.kernel.threads import run_in_thread
from store.indexing.database import open_reader
from store.indexing.group_commit import index_corrupt, is_corruption

T = TypeVar("T")


class PoolClosed(RuntimeError):
    code = "SHUTTING_DOWN"
    retriable = True


class ReadPool:
    def __init__(self, db_path: Path, *, size: int = 4,
                 prepare: Callable[[sqlite3.Connection], None] | None = None,
                 on_corruption: Callable[[BaseException], None] | None = None) -> None:
        self._db_path = db_path
        self._on_corruption = on_corruption or (lambda exc: None)
        """Told (from the worker thread that met it) when a read finds the database corrupt."""
        self._size = size
        self._prepare = prepare
        """Run on each connection as it opens (blocking): statements its reads will run, prepared."""
        self._free: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._limiter = trio.CapacityLimiter(size)
        self._closed = False

    def warm(self, count: int | None = None) -> None:
        """Open ``count`` connections (every one: ``None``) now, blocking (run in a thread at startup), so the
        first reads do not open theirs; the rest open as concurrent reads first need them."""
        want = self._size if count is None else max(0, min(count, self._size))
        with self._lock:
            while len(self._all) < want:
                conn = self._open()
                self._all.append(conn)
                self._free.append(conn)

    @property
    def opened(self) -> int:
        """How many connections the pool holds open."""
        with self._lock:
            return len(self._all)

    def _open(self) -> sqlite3.Connection:
        conn = open_reader(self._db_path)
        if self._prepare is not None:
            try:
                self._prepare(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    @contextmanager
    def borrow(self) -> Iterator[sqlite3.Connection]:
        """A connection for the calling worker thread (blocking until one is free)."""
        if self._closed:
            raise PoolClosed("read pool closed")
        self._slots.acquire()
        try:
            with self._lock:
                conn = self._free.pop() if self._free else None
            if conn is None:
                conn = self._open()
                with self._lock:
                    self._all.append(conn)
            try:
                yield conn
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # the latter: a message SQLite quoted
                if not is_corruption(exc):
                    raise
                self._on_corruption(exc)
                raise index_corrupt(exc) from exc
            finally:
                # Each read is its own snapshot: no implicit transaction may linger.
                if conn.in_transaction:
                    conn.rollback()
                with self._lock:
                    self._free.append(conn)
        finally:
            self._slots.release()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise PoolClosed("read pool closed")
        limiter = self._limiter
        try:
            limiter.acquire_nowait()  # the usual case: a free connection, no scheduler pass to take it
        except trio.WouldBlock:
            await limiter.acquire()
        try:
            return await run_in_thread(self._call, fn, args)  # a checkpoint itself
        finally:
            limiter.release()

    def _call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        with self.borrow() as conn:
            return fn(conn, *args)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conns, self._all, self._free = self._all, [], []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
