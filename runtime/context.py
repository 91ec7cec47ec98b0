"""What handlers get: the host's services and one context per kind of target.

* :class:`WriterContext` — a DB-only method, run inside the DB writer's
  transaction (``ctx.conn``); its receipt row is stored by the pipeline in the
  same transaction; events and after-commit callbacks run once it committed.
* :class:`ReadContext` — a read, one snapshot on a read-pool connection.
* :class:`HostContext` — a method that orchestrates several steps (a file in
  a worker thread, then a transaction; or several session actors). Its last
  step is :meth:`HostContext.commit`, which stores the receipt with the effect.
* session methods get ``actors.session.SessionContext`` inside their actor.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio

from actors.db_reader import ReadPool
from actors.events import EventBus
from actors.gateway_types import CallContext
from actors.index_log import IndexLog
from actors.session import DbHandle, SessionCall, SessionOp
from runtime.datadir import DataDir
from runtime.kernel.actor import CallbackReply
from store import receipts
from store.errors import StoreError
from store.faults import Faults
from store.receipts import ReceiptKey
from store.transcripts.session_files import SessionPaths

T = TypeVar("T")

__all__ = ["HostContext", "Pinned", "ReadContext", "Services", "WriterContext", "WriterResult", "session_call"]


async def session_call(services: Services, session_id: str, op: SessionOp, params: Any, caller: CallContext,
                       receipt: ReceiptKey | None = None) -> Any:
    """Run a session operation in ``session_id``'s actor as ``caller`` and wait for its answer."""
    done = trio.Event()
    box: list[Any] = []

    def reply(result: Any) -> None:
        box.append(result)
        done.set()

    ref = await services.sessions.ref(session_id)
    await ref.post(SessionCall(op, params, receipt, caller), CallbackReply(reply))
    await done.wait()
    return box[0].unwrap()


@dataclass
class Services:
    """The host's shared machinery, built once by the composition root (``runtime/host.py``)."""

    data_dir: DataDir
    db: DbHandle
    reads: ReadPool
    bus: EventBus
    faults: Faults
    now_ms: Callable[[], int]
    writer: Any
    """The DB writer's ``ActorRef`` (the pipeline posts DB-only requests to it)."""
    index_log: IndexLog
    sessions: Any = None
    """``actors.registry.SessionRegistry`` (set once it exists)."""
    status: Callable[[], Awaitable[dict[str, Any]]] | None = None
    wake_scheduler: Callable[[], None] = lambda: None
    extra: dict[str, Any] = field(default_factory=dict)
    """Per-capability state (the queue-controller book, the secret vault, the blob store...)."""

    def get(self, name: str) -> Any:
        return self.extra[name]

    def paths(self, session_id: str) -> SessionPaths:
        return self.data_dir.session_paths(session_id)

    def db_ref(self) -> Any:
        return self.writer

    async def index_barrier(self) -> None:
        """Wait until the index covers every append acknowledged before this call (read-your-writes
        for index-backed reads: lists, search)."""
        await self.index_log.barrier()


@dataclass
class WriterContext:
    conn: sqlite3.Connection
    now: int
    caller: CallContext
    wake_scheduler: Callable[[], None] = lambda: None
    """Tell the scheduler that scheduled tasks changed (pass it to :meth:`after_commit`)."""
    events: list[tuple[str, dict[str, Any], str | None]] = field(default_factory=list)
    after: list[Callable[[], None]] = field(default_factory=list)

    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None) -> None:
        """Publish once the transaction committed (never for a rolled-back request)."""
        self.events.append((topic, data, session_id))

    def after_commit(self, fn: Callable[[], None]) -> None:
        self.after.append(fn)


@dataclass(frozen=True, slots=True)
class Pinned:
    """An answer whose receipt reaches the database only with index log sequence ``seq``
    (an append's receipt rides in its line): the pipeline keeps it for retries until then."""

    response: Any
    seq: int


@dataclass(frozen=True, slots=True)
class WriterResult:
    value: Any
    events: list[tuple[str, dict[str, Any], str | None]]
    after: list[Callable[[], None]]


@dataclass
class ReadContext:
    conn: sqlite3.Connection
    now: int
    caller: CallContext
    transcript: Callable[[str], Path] | None = None
    """A session's transcript path (search checks a few rows against their lines: ``store/search/stand_in.py``)."""


class HostContext:
    """A multi-step method: services, the caller, and a receipt-carrying final commit."""

    def __init__(self, services: Services, caller: CallContext, receipt: ReceiptKey | None,
                 method: str = "", *, receipt_answer: Callable[..., Awaitable[Any]] | None = None) -> None:
        self.services = services
        self.caller = caller
        self.receipt = receipt
        self.method = method
        self.committed: Any = None
        self._receipt_answer = receipt_answer

    async def answer_of(self, stored: Any) -> Any:
        """The answer a stored receipt row gives (the route's ``receipt_answer`` when the row holds a stand-in
        for it: :meth:`commit`'s ``stand_in``)."""
        if self._receipt_answer is None:
            return stored
        return await self._receipt_answer(self, stored)

    def now(self) -> int:
        return self.services.now_ms()

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.services.reads.run(fn, *args)

    async def in_thread(self, fn: Callable[..., T], *args: Any, limiter: trio.CapacityLimiter | None = None) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)

    def with_receipt(self, fn: Callable[[sqlite3.Connection], T], *, session_id: str | None = None,
                     stand_in: Callable[[Any], Any] | None = None,
                     found: list[Any] | None = None) -> Callable[[sqlite3.Connection], T]:
        """``fn`` as the effect's transaction body plus the receipt row (a raced retry gets the stored one;
        with ``found``, it is put there instead). ``stand_in``: the row holds ``stand_in(value)``, not the value
        (see :meth:`commit`)."""
        key, now, faults, method = self.receipt, self.now(), self.services.faults, self.method

        def op(conn: sqlite3.Connection) -> Any:
            if key is not None:
                stored = receipts.check(conn, key)
                if stored is not None:
                    if found is not None:
                        found.append(stored["response"])
                    return stored["response"]
            value = fn(conn)
            if key is not None:
                row = value if stand_in is None else stand_in(value)
                receipts.store(conn, key, row, session_id=session_id, now_ms=now)
            faults.point(f"{method}.before_commit")
            self.committed = value
            return value

        return op

    async def commit(self, fn: Callable[[sqlite3.Connection], T], *, session_id: str | None = None,
                     stand_in: Callable[[Any], Any] | None = None) -> T:
        """The effect's transaction plus the receipt row, durably; its value is the response.

        ``stand_in``: the receipt row holds ``stand_in(value)`` instead of the value, for an answer whose bulk
        is a file's bytes (the database stores no large payloads); the route's ``receipt_answer`` rebuilds the
        answer from it for a retry (:meth:`answer_of`), and so does this call when it finds the row stored."""
        found: list[Any] = []
        value: T = await self.services.db.write(
            self.with_receipt(fn, session_id=session_id, stand_in=stand_in, found=found), durable=True)
        self.services.faults.point(f"{self.method}.after_commit")
        if found:
            value = await self.answer_of(found[0])
        self.committed = value
        return value

    async def landed(self, check: Callable[[sqlite3.Connection], bool]) -> bool:
        """After :meth:`commit` raised: whether its transaction took place all the same (an error once the
        commit may have happened). With a receipt, its row says; else ``check`` (reads the effect's rows).
        Not known (the read fails too): False."""
        try:
            return await self.read(receipts.landed, self.receipt, check)
        except StoreError:
            return False

    async def session_call(self, session_id: str, op: SessionOp, params: Any,
                           receipt: ReceiptKey | None = None) -> Any:
        """Run a session operation in ``session_id``'s actor and wait for its answer."""
        return await session_call(self.services, session_id, op, params, self.caller, receipt)

    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None) -> None:
        self.services.bus.publish(topic, data, session_id=session_id)
