"""The expiry timer: pending user requests expire at their deadline, and that is announced.

A tool-permission approval, an ask-the-user interaction or a plan/goal
approval may carry an absolute deadline (``expiresAt``, wall-clock ms). When it
passes unanswered the request is ``expired`` (seed 003 §4.6a: a plan or goal
session stays in its contract mode and its gate closes; a sidecar waiting on an
approval or interaction stops waiting). Reads already show it so; this actor
writes it at the deadline and publishes the ``<kind>.resolved`` event a late
answer would have published, so a UI or sidecar waiting for one hears it.

One supervised actor per host (``request-expiry``), beside the scheduler, on the
same timer (``actors/wall_timer.py``). It keeps only the earliest pending deadline in memory, read from
the database on start and on every wake-up, and sleeps until then (its mailbox
wait bounded by ``trio.move_on_at``, which delivers a :class:`Tick`), and at
least every ``max_sleep`` seconds so a wall-clock step is noticed. A request
created pending with a deadline tells it (:func:`deadline_notifier`, after the
commit): a tell lost to a full mailbox is harmless, since the queued ones make
it read the earliest deadline again.

A wake-up with something due finds the sessions holding lapsed requests and,
for each, runs ONE durable DB-writer transaction expiring at most
``batch_limit`` of its requests *as an operation of that session's actor*
(:func:`session_runner`), with the transition a late answer applies
(:func:`runtime.handlers.approvals.expire_lapsed`,
:func:`runtime.handlers.plans.expire_lapsed`); after the commit it publishes the
payload each of them returned, so one event per row that transaction changed.
Running in the session's actor orders it with that session's answers: an answer
given in time writes its decision line and commits before the timer's expiry
can run, which then finds the row settled and changes nothing; a late answer
and the timer apply the same ``UPDATE ... WHERE status = 'pending'`` one after
the other, so whichever runs first changes the row and announces it. A session
no actor can take (gone meanwhile) is expired through the DB writer directly.

Cancel-safe: the write and the publishing after it are shielded (bounded by the
DB writer's ask timeout), so a transaction that commits is announced even if
the actor is stopped or killed meanwhile. A failed write (the DB writer
restarting, an I/O error) is retried with exponential backoff.

A request whose stored status is damaged (outside its set, never settled: ``store.approvals._PENDING``,
``store.plans.PENDING``) is in no index: the wake-ups' reads (on start, on each :class:`Tick` and after an
expiry) scan the approvals, interactions and plan approvals tables for its deadline, a new request's tell
does not; so it expires at its deadline, or at the latest on the next wake-up (another deadline, or
``max_sleep``) when it was damaged after the last one and a later tell's read replaced it. The scan is
bounded by the tables' size: about 13 ms per 100,000 rows of 200-byte summaries, warm cache.

Restarts: nothing lives only in memory. The boot fence settles every request
that was pending before a restart (past its deadline: ``expired`` at it; any
other: ``interrupted``, seed 003 §11.18), and a new incarnation of this actor
(host restart or actor crash) reads the earliest deadline again on start.

Time: ``now_ms()`` (the host's injected wall clock) decides what is due; trio's
clock does the sleeping.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from actors.gateway_types import CallContext
from actors.session import SessionOp
from actors.session_context import SessionContext
from actors.wall_timer import Publishes, Reads, Tick, TimerConfig, WallTimer, Writes
from runtime.context import Services, session_call
from runtime.handlers import approvals as approval_handlers
from runtime.handlers import plans as plan_handlers
from runtime.kernel.actor import ActorError, Envelope
from store import approvals, plans
from store.errors import StoreError
from store.receipts import ReceiptKey

log = logging.getLogger("pi_host.request_expiry")

__all__ = [
    "DeadlineAdded",
    "ExpiryBatch",
    "ExpiryConfig",
    "ExpiryStatus",
    "RequestExpiry",
    "Tick",
    "deadline_notifier",
    "expire_lapsed",
    "lapsed_sessions",
    "next_deadline",
    "session_runner",
]

NAME = "request-expiry"


@dataclass(frozen=True)
class ExpiryConfig(TimerConfig):
    batch_limit: int = 64  # most requests expired in one transaction


@dataclass(frozen=True)
class DeadlineAdded:
    """A request with this deadline was created pending: wake earlier if it is the earliest."""

    at: int


@dataclass(frozen=True)
class ExpiryStatus:
    """Ask: a snapshot ``{nextDeadline, expired, failures}``."""


@dataclass(frozen=True)
class Announcement:
    topic: str
    data: dict[str, Any]
    session_id: str


@dataclass(frozen=True)
class ExpiryBatch:
    """What one expiry transaction changed, and the earliest deadline still pending after it."""

    announcements: list[Announcement] = field(default_factory=list)
    next_deadline: int | None = None


def next_deadline(conn: Any, damaged: bool = False) -> int | None:
    """The earliest deadline of any pending request (approval, interaction, plan/goal approval); ``damaged``:
    of one whose status is damaged too (a scan of their tables: :func:`store.approvals.next_deadline`,
    :func:`store.plans.next_deadline`)."""
    found = [at for at in (approvals.next_deadline(conn, damaged=damaged), plans.next_deadline(conn, damaged=damaged))
             if at is not None]
    return min(found) if found else None


def lapsed_sessions(conn: Any, now_ms: int, limit: int) -> list[str]:
    """The sessions (at most ``limit``) holding a pending request past its deadline at ``now_ms``."""
    found = [sid for _kind, _rid, sid in approvals.lapsed(conn, now_ms, limit)]
    found += plans.lapsed_sessions(conn, now_ms, limit)
    return list(dict.fromkeys(found))[:limit]


def expire_lapsed(conn: Any, *, now_ms: int, limit: int, session_id: str | None = None) -> ExpiryBatch:
    """One transaction: at most ``limit`` requests (of ``session_id`` only, if given) past their deadline
    at ``now_ms`` expired, each with the late-answer transition; the events of those this transaction
    changed."""
    out: list[Announcement] = []
    for kind, request_id, _sid in approvals.lapsed(conn, now_ms, limit, session_id):
        payload = approval_handlers.expire_lapsed(conn, kind, request_id, now_ms)
        if payload is not None:
            out.append(Announcement(approval_handlers.resolved_topic(kind), payload,
                                    payload["request"]["sessionId"]))
    sessions = [session_id] if session_id is not None else plans.lapsed_sessions(conn, now_ms,
                                                                                 max(0, limit - len(out)))
    for sid in sessions:
        out.extend(Announcement(plan_handlers.RESOLVED, payload, sid)
                   for payload in plan_handlers.expire_lapsed(conn, sid, now_ms))
    return ExpiryBatch(out, next_deadline(conn, damaged=True))


InSession = Callable[[str, Callable[[Any], ExpiryBatch]], Awaitable[ExpiryBatch]]
"""Run one expiry transaction in a session's actor (ordered with that session's answers: an answer
whose decision line is durable commits before the timer can expire its request)."""


class RequestExpiry(WallTimer):
    log = log
    next_what = "deadline"
    work_what = "expiring requests past their deadline"

    def __init__(
        self,
        *,
        db: Writes,
        reads: Reads,
        bus: Publishes,
        now_ms: Callable[[], int],
        config: ExpiryConfig = ExpiryConfig(),
        name: str = NAME,
        mailbox_size: int = 64,
        in_session: InSession | None = None,
    ) -> None:
        super().__init__(name, reads=reads, now_ms=now_ms, config=config, mailbox_size=mailbox_size,
                         batch_limit=mailbox_size)
        self._db = db
        self._bus = bus
        self._in_session = in_session
        self._expired = 0
        self._sweep = True  # the read on start looks for requests whose status is damaged too

    def _read_next(self, conn: Any) -> int | None:
        return next_deadline(conn, self._sweep)

    # -- actor hooks ----------------------------------------------------------

    async def handle_batch(self, batch: list[Envelope]) -> None:
        """Any number of tells (deadlines, ticks) cost one read of the earliest deadline and at most
        one expiry transaction; status asks are answered after it."""
        for env in batch:
            if not isinstance(env.msg, (DeadlineAdded, Tick, ExpiryStatus)):
                raise TypeError(f"request expiry got {type(env.msg).__name__}")
        if any(not isinstance(env.msg, ExpiryStatus) for env in batch):
            # a request whose status is damaged is in no index: looked for on the timer's own wake-ups (and
            # on start and after an expiry), never on a new request's tell
            self._sweep = any(isinstance(env.msg, Tick) for env in batch)
            await self._refresh()
            await self._expire_due()
        status = {"nextDeadline": self._next, "expired": self._expired, "failures": self._failures}
        for env in batch:
            if env.reply is not None:
                self._deliver(env.reply, value=dict(status))

    # -- expiring ---------------------------------------------------------------

    async def _expire_due(self) -> None:
        """At most one transaction per wake-up; more due than it took: the next wake-up is now."""
        if self._next is None or self._backing_off():
            return
        now = self._now_ms()
        if now < self._next:
            return
        limit = self._config.batch_limit
        try:
            with trio.CancelScope(shield=True):  # committed means announced, even if we are being stopped
                if self._in_session is None:
                    batch: ExpiryBatch = await self._db.write(partial(expire_lapsed, now_ms=now, limit=limit),
                                                              durable=True, label="requests.expire")
                    self._announce(batch)
                    following = batch.next_deadline
                else:
                    for sid in await self._reads.run(lapsed_sessions, now, limit):
                        op = partial(expire_lapsed, now_ms=now, limit=limit, session_id=sid)
                        try:
                            batch = await self._in_session(sid, op)
                        except StoreError as exc:  # no actor can take it (gone meanwhile): none answers there
                            log.info("request expiry: session %s: %s; expired directly", sid, exc)
                            batch = await self._db.write(op, durable=True, label="requests.expire")
                        self._announce(batch)
                    following = await self._reads.run(next_deadline, True)
        except Exception as exc:  # noqa: BLE001 - retried later; trio.Cancelled is a BaseException
            self._backoff(exc)
            return
        self._recovered()
        self._next = following

    def _announce(self, batch: ExpiryBatch) -> None:
        for item in batch.announcements:
            self._expired += 1
            self._bus.publish(item.topic, item.data, session_id=item.session_id)



async def _expire_here(ctx: SessionContext, op: Callable[[Any], ExpiryBatch], _key: ReceiptKey | None) -> ExpiryBatch:
    result: ExpiryBatch = await ctx.db(op)
    return result


_EXPIRE = SessionOp(_expire_here, mutating=False, name="requests.expire")
_CALLER = CallContext(connection_id=0, client_id="pi-host/request-expiry", client_kind="host", protocol=1)


def session_runner(services: Services) -> InSession:
    """The host's :data:`InSession`: the expiry transaction as an operation of the session's actor."""
    async def run(session_id: str, op: Callable[[Any], ExpiryBatch]) -> ExpiryBatch:
        result: ExpiryBatch = await session_call(services, session_id, _EXPIRE, op, _CALLER)
        return result

    return run


def deadline_notifier(tell_nowait: Callable[[Any], None]) -> Callable[[int], None]:
    """The never-raising ``DEADLINES`` service (``runtime.handlers.approvals``): tells the actor of a
    new pending deadline. Dropped when its mailbox is full (a queued tell re-reads every deadline) or
    between two incarnations (the next one reads them on start)."""
    def notify(at: int) -> None:
        try:
            tell_nowait(DeadlineAdded(at))
        except ActorError:
            pass

    return notify
