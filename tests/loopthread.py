"""A trio loop in a background thread, for synchronous tests (hypothesis state machines) that drive a host.

A subclass says what one connection to its host is (:meth:`LoopThread._opened`, an async context manager);
:meth:`LoopThread.connect` opens it in the loop and :meth:`LoopThread.disconnect` closes it, so a test can stop
and start the host between two steps. :meth:`LoopThread.run` runs a coroutine function in the loop and returns
its result to the calling thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

__all__ = ["LoopThread"]


class LoopThread:
    """One trio loop in a daemon thread and at most one open connection (:meth:`_opened`) at a time."""

    tolerate_errors_after_stop = False
    """An error raised while the connection closes after :meth:`disconnect` asked it to is ignored (a
    SIGKILLed host's connections die with it)."""

    def __init__(self, name: str) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._done: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("host thread did not start")

    def _opened(self) -> AbstractAsyncContextManager[object]:
        """The connection, open while the context is entered (the subclass keeps what it needs of it)."""
        raise NotImplementedError

    def _main(self) -> None:
        try:
            trio.run(self._amain)
        except BaseException as exc:  # noqa: BLE001 - reported by shutdown()
            self._error = exc
            self._ready.set()

    async def _amain(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await trio.sleep_forever()

    async def _serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self._stop is not None and self._done is not None
        try:
            async with self._opened():
                task_status.started()
                await self._stop.wait()
        except Exception:
            if not (self.tolerate_errors_after_stop and self._stop.is_set()):
                raise
        finally:
            self._done.set()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await fn(*args)`` in the loop; its result here."""
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def connect(self) -> None:
        async def go() -> None:
            self._stop, self._done = trio.Event(), trio.Event()
            assert self._nursery is not None
            with trio.fail_after(30):
                await self._nursery.start(self._serve)

        self.run(go)

    def disconnect(self) -> None:
        async def go() -> None:
            assert self._stop is not None and self._done is not None
            self._stop.set()
            with trio.fail_after(30):
                await self._done.wait()

        self.run(go)

    def shutdown(self) -> None:
        """End the loop and its thread (the connection closed first by the caller); a loop error is raised."""
        if self._nursery is not None:
            trio.from_thread.run_sync(self._nursery.cancel_scope.cancel, trio_token=self._token)
        self._thread.join(30)
        if self._error is not None:
            raise self._error
