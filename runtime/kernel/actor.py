"""The actor kernel: a trio task with a bounded mailbox and its own cancel scope.

An :class:`Actor` owns one bounded memory channel (its mailbox) and runs one
loop that takes a message, drains whatever else is already waiting (up to
``batch_limit``), and hands the batch to :meth:`Actor.handle_batch`. Callers use

* ``await ask(msg)``         send (waiting for room: backpressure), await one reply;
* ``await ask_or_busy(msg)`` like ``ask`` but fails with :class:`Busy` on a full mailbox;
* ``await tell(msg)`` / ``tell_nowait(msg)`` fire and forget (``Busy`` when full);
* ``await post(msg, reply)`` / ``post_nowait(msg, reply)`` send with a reply the
  caller owns (a callback), returning as soon as the message is in the mailbox.

Every ask carries a caller-owned one-shot :class:`ReplySlot`; ``post(msg, reply)``
carries any :class:`Reply`, e.g. a :class:`CallbackReply` that hands the outcome
to a function (the request pipeline answers a request that way, with no task
waiting per request). Whatever way the actor exits, every reply still pending
(in flight or queued) is failed:
:class:`ActorStopped` after an orderly stop or passivation, :class:`ActorCrashed`
after a crash or a kill. A reply that arrives after the caller gave up lands in
an abandoned slot and is dropped (counted in :meth:`Actor.statistics`).

Error vocabulary (after trio: "you closed it" vs "it broke"):

* ``ActorStopped`` - we stopped it (``ACTOR_RESTARTED``, retriable);
* ``ActorCrashed`` - it died or was killed (``ACTOR_RESTARTED``, retriable);
* ``Busy``         - mailbox full on a ``*_nowait``/``*_or_busy`` call (``BUSY``);
* ``AskTimeout``   - the whole ask exceeded its timeout (``TIMEOUT``);
* ``InternalBug``  - an invariant of the kernel or of an actor was violated.

``ActorStopped``/``ActorCrashed`` carry ``enqueued``: ``False`` means the message
never entered the mailbox (it had no effect and may be sent elsewhere, e.g. to
the next incarnation); ``True`` means it was accepted and then failed.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import outcome
import trio

log = logging.getLogger("pi_host.kernel")

ActorState = Literal["starting", "running", "stopping", "stopped", "crashed", "passivated"]
_TERMINAL: frozenset[str] = frozenset({"stopped", "crashed", "passivated"})


# ---------------------------------------------------------------------- errors


class ActorError(Exception):
    """Base class of the kernel's errors. ``code`` is the stable wire code."""

    code: str = "INTERNAL"
    retriable: bool = False


class ActorStopped(ActorError):
    """The actor was stopped (orderly stop or passivation) before it replied."""

    code = "ACTOR_RESTARTED"
    retriable = True

    def __init__(self, message: str, *, enqueued: bool = False) -> None:
        super().__init__(message)
        self.enqueued = enqueued


class ActorCrashed(ActorError):
    """The actor died (exception, ``Fatal``) or was killed before it replied."""

    code = "ACTOR_RESTARTED"
    retriable = True

    def __init__(self, message: str, *, enqueued: bool = False) -> None:
        super().__init__(message)
        self.enqueued = enqueued


class Busy(ActorError):
    """The mailbox is full and the caller asked not to wait for room."""

    code = "BUSY"
    retriable = True


class AskTimeout(ActorError):
    """An ask (send + reply) did not complete within its timeout."""

    code = "TIMEOUT"
    retriable = True


class InternalBug(ActorError):
    """A kernel or actor invariant was violated (a bug, never a user error)."""

    code = "INTERNAL"


class Fatal(Exception):
    """Raise from ``handle``/``handle_batch`` to crash the actor on purpose.

    Wrap the real cause: ``raise Fatal("index corrupt") from exc`` or
    ``raise Fatal(exc)``. Every pending ask then fails with :class:`ActorCrashed`
    and :meth:`Actor.run` raises this exception (the supervisor restarts it).
    """


# ---------------------------------------------------------------------- reply slot


class ReplySlot:
    """Caller-owned one-shot reply: the first ``set_*`` wins, later ones are ignored.

    A slot whose caller gave up (timeout, cancellation) is *abandoned*; a reply
    that arrives afterwards is dropped silently and ``set_*`` returns ``False``.
    """

    __slots__ = ("_event", "_value", "_error", "_abandoned")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._abandoned = False

    @property
    def done(self) -> bool:
        return self._event.is_set()

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    def set_result(self, value: Any) -> bool:
        """Deliver a value. Returns whether it was accepted (first, not abandoned)."""
        if self._event.is_set() or self._abandoned:
            return False
        self._value = value
        self._event.set()
        return True

    def set_exception(self, exc: BaseException) -> bool:
        """Deliver an error. Returns whether it was accepted (first, not abandoned)."""
        if self._event.is_set() or self._abandoned:
            return False
        self._error = exc
        self._event.set()
        return True

    def abandon(self) -> None:
        """The caller no longer waits: later replies are dropped."""
        if not self._event.is_set():
            self._abandoned = True

    async def wait(self) -> None:
        """Wait until a reply (value or error) has been delivered."""
        await self._event.wait()

    def unwrap(self) -> Any:
        """Return the value or raise the error. Only valid once ``done``."""
        if not self._event.is_set():
            raise InternalBug("ReplySlot.unwrap() before a reply was delivered")
        if self._error is not None:
            raise self._error
        return self._value


class Reply(Protocol):
    """A one-shot reply: the first ``set_*`` wins and returns True, later ones return False."""

    @property
    def done(self) -> bool: ...

    @property
    def abandoned(self) -> bool: ...

    def set_result(self, value: Any) -> bool: ...

    def set_exception(self, exc: BaseException) -> bool: ...


reply_callback_failed: contextvars.ContextVar[Callable[[BaseException], None] | None] = contextvars.ContextVar(
    "reply_callback_failed", default=None)
"""Who hears of a :class:`CallbackReply` whose callback raised (a task-scoped setting, inherited
by the tasks a host starts): a host in test mode records them and fails when it stops."""


class CallbackReply:
    """A reply delivered by calling ``fn(outcome)`` once, in the thread that replies.

    ``fn`` runs inside the replying actor's task: it must be quick and must not
    raise. If it does (a bug), the exception never reaches the actor that
    answered: it is logged, reported to :data:`reply_callback_failed` as it was
    when the reply was made, and ``fn`` is called once more with an
    :class:`InternalBug` (wire ``INTERNAL``) so the request still gets an answer
    instead of none. A callback must accept that second call after raising.
    """

    __slots__ = ("_fn", "_done", "_on_failure")

    def __init__(self, fn: Callable[[outcome.Outcome[Any]], None]) -> None:
        self._fn = fn
        self._done = False
        self._on_failure = reply_callback_failed.get()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def abandoned(self) -> bool:
        return False

    def set_result(self, value: Any) -> bool:
        return self._deliver(outcome.Value(value))

    def set_exception(self, exc: BaseException) -> bool:
        return self._deliver(outcome.Error(exc))

    def _deliver(self, result: outcome.Outcome[Any]) -> bool:
        if self._done:
            return False
        self._done = True
        try:
            self._fn(result)
        except Exception as exc:  # noqa: BLE001 - a reply callback must never crash the replying actor
            log.exception("reply callback failed; answering INTERNAL instead")
            if self._on_failure is not None:
                self._on_failure(exc)
            bug = InternalBug(f"the reply callback failed: {type(exc).__name__}: {exc}")
            bug.__cause__ = exc
            try:
                self._fn(outcome.Error(bug))
            except Exception:  # noqa: BLE001 - same rule; nothing is left to answer with
                log.exception("reply callback failed again on its INTERNAL answer; the request has no answer")
        return True


@dataclass(slots=True)
class Envelope:
    """A message in a mailbox; ``reply`` is ``None`` for a tell."""

    msg: Any
    reply: Reply | None = None


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    name: str
    incarnation: int
    state: ActorState
    mailbox_size: int
    mailbox_depth: int
    peak_depth: int
    senders_waiting: int
    handled: int
    batches: int
    largest_batch: int
    dropped_replies: int
    dropped_tells: int


@dataclass(slots=True)
class _Counters:
    peak_depth: int = 0
    handled: int = 0
    batches: int = 0
    largest_batch: int = 0
    dropped_replies: int = 0
    dropped_tells: int = 0
    in_flight: list[Envelope] = field(default_factory=list)


# ---------------------------------------------------------------------- actor


class Actor:
    """Base class. Override :meth:`handle` (and optionally the hooks below).

    Class (or instance) attributes read when the loop runs, so a subclass can
    set them after ``super().__init__``:

    * ``batch_limit``  - most envelopes handed to one ``handle_batch`` (default 1);
    * ``drain_on_stop`` - on an orderly stop, handle what is already in the
      mailbox before exiting (default False: queued messages fail with
      :class:`ActorStopped`);
    * ``idle_timeout`` - seconds without an inbound message after which the
      actor passivates (exits normally, state ``passivated``); ``None`` = never;
    * ``hold_seconds`` - how long a batch that :meth:`may_hold` approves waits
      for more messages (default 0: never); see :meth:`_hold`;
    * ``idle_work_after`` - seconds of an empty mailbox after which
      :meth:`on_idle` runs; ``None`` (default) = never. ``idle_work_interval``
      is the pause between two calls while ``on_idle`` keeps returning True;
    * ``start_waits`` - whether the supervisor's ``start_child``/``get_or_start``
      waits until :meth:`on_start` has run, so that a failing first start is
      the caller's exception (default True). An actor that keeps no
      ``on_start`` sets it False: its task is started without that wait (two
      scheduler passes fewer), messages sent meanwhile wait in the mailbox, and
      anything that still fails before it is ready counts as a crash.
    """

    batch_limit: int = 1
    start_waits: bool = True
    idle_timeout: float | None = None
    idle_work_after: float | None = None
    idle_work_interval: float = 0.0
    drain_on_stop: bool = False  # True: an orderly stop handles everything already queued first
    linger_ticks: int = 0  # see _linger: scheduler ticks to wait for more messages before a batch
    linger_max_ticks: int = 2000
    linger_max_seconds: float = 0.02
    hold_seconds: float = 0.0  # see _hold: how long a batch :meth:`may_hold` says may wait for company

    def __init__(
        self,
        name: str,
        *,
        mailbox_size: int = 64,
        batch_limit: int | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        if mailbox_size < 1 or mailbox_size == math.inf:
            raise ValueError(f"actor {name!r}: mailbox_size must be a finite int >= 1, got {mailbox_size!r}")
        self.name = name
        self.incarnation = 1  # set by the supervisor before run()
        if batch_limit is not None:
            self.batch_limit = batch_limit
        if idle_timeout is not None:
            self.idle_timeout = idle_timeout
        self._mailbox_size = mailbox_size
        self._send, self._recv = trio.open_memory_channel[Envelope](mailbox_size)
        self._scope = trio.CancelScope()
        self._state: ActorState = "starting"
        self._ran = False
        self._ready = False
        self._stop_requested = False
        self._exited = trio.Event()
        self._counters = _Counters()
        self._room = trio.Event()  # set (and replaced) when the loop takes messages out while someone waits on it
        self._room_wanted = False  # a wait_room() waits on _room: the next take sets it
        self._idle_work_due = True  # on_idle may have work once after start and after every batch
        self._hold_wake: trio.Event | None = None  # set while a batch is held (see _hold)
        self._held_entries = 0  # envelopes that entered the mailbox since the current hold began
        self._idle_since: float | None = None  # set while the loop waits on an empty mailbox
        # The alarm (see _alarm): one task per actor, started at the first timed mailbox wait, instead
        # of a cancel scope per wait (each one costs the trio thread microseconds per message).
        self._alarm_nursery: trio.Nursery | None = None  # set while _loop runs
        self._alarm_started = False
        self._alarm_at = math.inf  # when the alarm task wakes next (it may wake early, never late)
        self._alarm_scope: trio.CancelScope | None = None  # the alarm task's current sleep
        self._wait_until = math.inf  # while parked on an empty mailbox: when the alarm must wake the loop
        self._tick = Envelope(None)  # what the alarm hands the parked loop (compared by identity)

    # -- hooks for subclasses -------------------------------------------------

    async def on_start(self) -> None:
        """Runs before the actor is ready (``task_status.started()``)."""

    async def on_stop(self) -> None:
        """Runs on an orderly exit (stop, passivation) only; crashes skip it."""

    async def on_idle(self) -> bool:
        """Background work while the mailbox is empty (see ``idle_work_after``).

        Runs in the actor's own task, so never concurrently with a batch; a
        message that arrives meanwhile waits until it returns. Return True to
        be called again after ``idle_work_interval`` if the mailbox is still
        empty; after False it runs again only once another batch was handled.
        An exception crashes the actor like one from a tell.
        """
        return False

    async def handle(self, msg: Any) -> Any:
        """Handle one message; the return value is the reply to an ask."""
        raise NotImplementedError(f"{type(self).__name__}.handle")

    async def handle_batch(self, batch: list[Envelope]) -> None:
        """Handle a batch; must reply to every ask in it.

        The default calls :meth:`handle` for each envelope in order. An
        exception from ``handle`` goes to that asker and the actor keeps
        running; from a tell (nobody to tell) or a :class:`Fatal`, it crashes.
        """
        for env in batch:
            if env.reply is None:
                await self.handle(env.msg)
                continue
            try:
                result = await self.handle(env.msg)
            except Fatal:
                raise
            except Exception as exc:
                self._deliver(env.reply, error=exc)
            else:
                self._deliver(env.reply, value=result)

    # -- lifecycle ------------------------------------------------------------

    @property
    def state(self) -> ActorState:
        return self._state

    @property
    def idle_since(self) -> float | None:
        """When the loop began waiting on an empty mailbox (trio clock); ``None`` while it handles a
        batch, runs idle work or is not running: such an actor may be passivated early (see
        ``DynamicSupervisor(evict_idle=True)``)."""
        return self._idle_since if self._state == "running" else None

    @property
    def ready(self) -> bool:
        """True once ``on_start`` finished and ``task_status.started()`` was called."""
        return self._ready

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the actor until it stops, passivates, crashes or is killed.

        Returns normally after an orderly stop or passivation. Raises the
        original exception after a crash, :class:`ActorCrashed` after
        :meth:`kill`, and lets outside cancellation propagate.
        """
        if self._ran:
            raise InternalBug(f"actor {self.name!r}: run() called twice")
        self._ran = True
        ending: ActorState | None = None
        try:
            with self._scope:
                await self.on_start()
                if self._state == "starting":
                    self._state = "running"
                self._ready = True
                task_status.started()
                passivated = await self._loop_with_alarm()  # returns with the mailbox closed
                self._fail_queued(ActorStopped, cause=None)
                await self.on_stop()
                ending = "passivated" if passivated else "stopped"
        except BaseException as exc:
            # A crash, or outside cancellation (escalation of a stop if one was
            # requested). Either way: fail everything pending, then re-raise.
            orderly = self._stop_requested and isinstance(exc, trio.Cancelled)
            self._finish("stopped" if orderly else "crashed", exc)
            raise
        if ending is None:  # our own scope absorbed kill()'s cancellation
            killed = ActorCrashed(f"actor {self.name!r} (incarnation {self.incarnation}) was killed")
            self._finish("crashed", killed)
            raise killed
        self._finish(ending, None)

    def stop(self) -> None:
        """Orderly stop: refuse new messages, finish the current batch, then fail the
        rest (or, with ``drain_on_stop``, handle the rest first)."""
        if self._state in _TERMINAL or self._stop_requested:
            return
        self._stop_requested = True
        self._state = "stopping"
        self._send.close()
        self.wake()

    def kill(self) -> None:
        """Chaos hook: cancel the actor at its current await point (crash semantics)."""
        if self._state in _TERMINAL:
            return
        self._scope.cancel()

    async def wait_exited(self) -> None:
        """Wait until :meth:`run` has finished (for any reason)."""
        await self._exited.wait()

    # -- sending --------------------------------------------------------------

    async def ask(self, msg: Any, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the actor API's own deadline: raises AskTimeout (wire TIMEOUT), not Cancelled
        """Send ``msg`` (waiting for room) and wait for the reply.

        The whole operation is bounded by ``timeout`` (:class:`AskTimeout`).
        Cancelled or timed out before the send completed: the message was not
        enqueued. After: it may take effect once; its reply is dropped.
        """
        return await self._ask(msg, timeout, wait_for_room=True)

    async def ask_or_busy(self, msg: Any, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the actor API's own deadline: raises AskTimeout (wire TIMEOUT), not Cancelled
        """Like :meth:`ask`, but raise :class:`Busy` instead of waiting for room."""
        return await self._ask(msg, timeout, wait_for_room=False)

    async def tell(self, msg: Any) -> None:
        """Send without a reply, waiting for room in the mailbox (backpressure)."""
        await self._send_waiting(Envelope(msg))

    def tell_nowait(self, msg: Any) -> None:
        """Send without a reply; raise :class:`Busy` if the mailbox is full."""
        self._send_nowait(Envelope(msg))

    async def post(self, msg: Any, reply: Reply) -> None:
        """Send with a caller-owned ``reply``, waiting for room; return once it is enqueued.

        Atomic like :meth:`tell`: cancelled (or the actor gone) before the send
        completed, the message was not enqueued and ``reply`` is untouched.
        """
        await self._send_waiting(Envelope(msg, reply))

    def post_nowait(self, msg: Any, reply: Reply) -> None:
        """Like :meth:`post`, but raise :class:`Busy` instead of waiting for room."""
        self._send_nowait(Envelope(msg, reply))

    async def wait_room(self) -> None:
        """Return once the mailbox has room (a following ``*_nowait`` can still find it full)."""
        while self._recv.statistics().current_buffer_used >= self._mailbox_size and self._state not in _TERMINAL:
            self._room_wanted = True
            await self._room.wait()
        await trio.lowlevel.checkpoint()

    def statistics(self) -> ActorStatistics:
        chan = self._recv.statistics()
        c = self._counters
        return ActorStatistics(
            name=self.name,
            incarnation=self.incarnation,
            state=self._state,
            mailbox_size=self._mailbox_size,
            mailbox_depth=chan.current_buffer_used,
            peak_depth=max(c.peak_depth, chan.current_buffer_used),  # noted when the loop takes messages out
            senders_waiting=chan.tasks_waiting_send,
            handled=c.handled,
            batches=c.batches,
            largest_batch=c.largest_batch,
            dropped_replies=c.dropped_replies,
            dropped_tells=c.dropped_tells,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} #{self.incarnation} {self._state}>"

    # -- internals: sending -----------------------------------------------------

    async def _ask(self, msg: Any, timeout: float | None, *, wait_for_room: bool) -> Any:  # noqa: ASYNC109 - the actor API's own deadline: raises AskTimeout (wire TIMEOUT), not Cancelled
        slot = ReplySlot()
        env = Envelope(msg, slot)
        scope = trio.move_on_after(timeout) if timeout is not None else trio.CancelScope()
        try:
            with scope:
                if wait_for_room:
                    await self._send_waiting(env)
                else:
                    await trio.lowlevel.checkpoint_if_cancelled()
                    self._send_nowait(env)
                await slot.wait()
        except BaseException:
            slot.abandon()
            raise
        if not slot.done:
            slot.abandon()
            raise AskTimeout(f"ask to actor {self.name!r} timed out after {timeout}s")
        return slot.unwrap()

    async def _send_waiting(self, env: Envelope) -> None:
        # Same atomicity as trio's MemorySendChannel.send: either the envelope
        # is in the mailbox and we return, or it is not and we raise.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._send.send_nowait(env)
        except trio.WouldBlock:
            self._note_depth(self._mailbox_size)
            try:
                await self._send.send(env)
            except trio.ClosedResourceError:
                raise self._closed_error() from None
            self._entered(env)
        except trio.ClosedResourceError:
            raise self._closed_error() from None
        else:
            self._entered(env)
            await trio.lowlevel.cancel_shielded_checkpoint()

    def _send_nowait(self, env: Envelope) -> None:
        try:
            self._send.send_nowait(env)
        except trio.WouldBlock:
            self._note_depth(self._mailbox_size)
            raise Busy(f"actor {self.name!r}: mailbox full ({self._mailbox_size} messages)") from None
        except trio.ClosedResourceError:
            raise self._closed_error() from None
        self._entered(env)

    def _entered(self, env: Envelope) -> None:
        """``env`` is in the mailbox: end a hold it must not wait behind.

        No channel statistics per message (an object built per call, on every send): the peak depth
        is noted where the loop takes messages out (:meth:`_drain_into`), and while a batch is held
        the envelopes that entered since the hold began bound the depth from above (the mailbox
        was empty when it began, and nothing takes messages out during it); the exact depth is
        read only once that bound reaches the batch limit."""
        wake = self._hold_wake
        if wake is None:
            return
        self._held_entries += 1
        if self.ends_hold(env.msg):
            wake.set()
            return
        limit = self.batch_limit - len(self._counters.in_flight)
        if self._held_entries >= limit and self._recv.statistics().current_buffer_used >= limit:
            wake.set()

    def _made_room(self) -> None:
        """The loop took messages out: wake whoever waits for room (a new event only then, not per batch)."""
        if self._room_wanted:
            self._room_wanted = False
            self._room.set()
            self._room = trio.Event()

    def _closed_error(self) -> ActorError:
        if self._state == "crashed":
            return ActorCrashed(f"actor {self.name!r} (incarnation {self.incarnation}) has crashed")
        return ActorStopped(f"actor {self.name!r} (incarnation {self.incarnation}) is {self._state}")

    def _note_depth(self, depth: int) -> None:
        if depth > self._counters.peak_depth:
            self._counters.peak_depth = depth

    # -- internals: the loop ------------------------------------------------------

    async def _loop(self) -> bool:
        """Handle messages until stopped (returns False) or idle (returns True)."""
        limit = self.batch_limit
        if limit < 1:
            raise InternalBug(f"actor {self.name!r}: batch_limit must be >= 1, got {limit}")
        while True:
            if self._stop_requested and not self.drain_on_stop:
                await trio.lowlevel.checkpoint()
                return False
            try:
                first = self._recv.receive_nowait()
            except trio.EndOfChannel:
                await trio.lowlevel.checkpoint()
                return False
            except trio.WouldBlock:
                got = await self._wait_for_message()  # a checkpoint: an idle actor yields here only
                if got is None:
                    return not self._stop_requested
                batch = [got]
                taken = 0  # handed over to the parked loop (or the one message there was): depth 0 or 1
            else:
                # A mailbox that never empties still lets the other tasks run once per batch;
                # the message taken is in flight (failed, not lost, if this is cancelled).
                batch = self._counters.in_flight = [first]
                taken = 1
                await trio.lowlevel.checkpoint()
            self._drain_into(batch, limit, taken=taken)
            self._made_room()
            if self.hold_seconds and len(batch) < limit and self.may_hold(batch):
                await self._hold(batch, limit)  # sleeps for company: no tick-by-tick linger first
            elif (self.linger_ticks or self.expects_more(batch)) and len(batch) < limit:
                await self._linger(batch, limit)
            await self._dispatch(batch)

    async def _loop_with_alarm(self) -> bool:
        """Run :meth:`_loop` beside a nursery for the alarm task; re-raise what the loop raised.

        The loop's own exception (a crash, Cancelled) is kept and re-raised once the alarm is
        cancelled, so callers see it as it was, not wrapped in an exception group. The mailbox is
        closed as soon as the loop ends, before waiting for the alarm task: a message sent meanwhile
        is refused (never enqueued) instead of failed after it was accepted.
        """
        error: BaseException | None = None
        passivated = False
        async with trio.open_nursery() as nursery:
            self._alarm_nursery = nursery
            try:
                passivated = await self._loop()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the alarm task is gone
                error = exc
                if not (self._stop_requested and isinstance(exc, trio.Cancelled)):
                    self._state = "crashed"  # what a sender refused meanwhile is told (run() settles it)
            else:
                self._state = "stopping"
            finally:
                self._send.close()  # no new messages; the mailbox is failed by run()
                self._alarm_nursery = None
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        return passivated

    def _arm(self, at: float) -> bool:
        """Make the alarm wake the parked loop at ``at``; False: no alarm here (use a cancel scope).

        Lazy: the alarm is moved only when ``at`` is earlier than its next wake-up. A wake-up that
        comes early (the loop has parked again since, with a later time) just sleeps on.
        """
        nursery = self._alarm_nursery
        if nursery is None:
            return False
        if at < self._alarm_at:
            self._alarm_at = at
            if self._alarm_scope is not None:
                self._alarm_scope.deadline = at
            elif not self._alarm_started:
                self._alarm_started = True
                nursery.start_soon(self._alarm, name=f"{self.name}:alarm")
        self._wait_until = at
        return True

    async def _alarm(self) -> None:
        """Wake the loop parked on an empty mailbox once its time (``_wait_until``) has come.

        It hands the loop ``_tick`` through the mailbox, only while the loop is parked in
        ``receive`` (then the mailbox is empty and the tick goes straight to it: it never takes a
        slot a sender could need, and is never left behind in the mailbox).
        """
        while True:
            with trio.CancelScope(deadline=self._alarm_at) as scope:
                self._alarm_scope = scope
                await trio.sleep_forever()
            self._alarm_scope = None
            due = self._wait_until
            if due <= trio.current_time():
                if self._recv.statistics().tasks_waiting_receive:
                    self._wait_until = math.inf
                    self._send.send_nowait(self._tick)
                due = math.inf  # not parked: the loop re-arms when it parks again
            self._alarm_at = due

    def _drain_into(self, batch: list[Envelope], limit: int, *, taken: int = 0) -> int:
        """Take what the mailbox holds into ``batch`` (up to ``limit``), and note the depth it had:
        the mailbox only fills between two takes, so its peak is what it held right before one
        (``taken``: messages taken out just before, without a task switch since)."""
        added = 0
        while len(batch) < limit:
            try:
                batch.append(self._recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            added += 1
        depth = taken + added
        if len(batch) >= limit:  # stopped at the limit: what it left counts too
            depth += self._recv.statistics().current_buffer_used
        self._note_depth(min(depth, self._mailbox_size))
        return added

    async def _linger(self, batch: list[Envelope], limit: int) -> None:
        """Group commit: while producers keep enqueueing, give them a few scheduler ticks.

        Stops after ``linger_ticks`` consecutive ticks brought nothing new, so a lone
        message waits only that many ticks (microseconds), while a burst (a JSON-RPC
        batch, many clients) lands in one batch. While :meth:`expects_more` says the
        newest message announced followers, it keeps waiting, bounded by
        ``linger_max_ticks`` and ``linger_max_seconds``.
        """
        self._counters.in_flight = batch
        quiet = 0
        ticks = 0
        deadline = trio.current_time() + self.linger_max_seconds
        while len(batch) < limit and ticks < self.linger_max_ticks:
            if quiet >= self.linger_ticks and not self.expects_more(batch):
                break
            if quiet >= self.linger_ticks and trio.current_time() > deadline:
                break
            await trio.lowlevel.checkpoint()
            ticks += 1
            quiet = 0 if self._drain_into(batch, limit) else quiet + 1

    def expects_more(self, batch: list[Envelope]) -> bool:
        """Override: True when the newest message says more of its kind is on the way."""
        return False

    def may_hold(self, batch: list[Envelope]) -> bool:
        """Override: True when nobody waits for this batch, so it may wait for company (see :meth:`_hold`)."""
        return False

    def ends_hold(self, msg: Any) -> bool:
        """Override: True when ``msg``, arriving during a hold, must be handled now."""
        return True

    def wake(self) -> None:
        """End a hold now (someone started waiting for the held batch); no-op otherwise."""
        if self._hold_wake is not None:
            self._hold_wake.set()

    async def _hold(self, batch: list[Envelope], limit: int) -> None:
        """Let a batch nobody waits for wait up to ``hold_seconds`` for more messages.

        Unlike :meth:`_linger` (a few scheduler ticks), a hold sleeps: one wakeup
        at the end instead of one per tick. It ends early on :meth:`wake`, on a
        message :meth:`ends_hold` says must not wait, when the mailbox holds a
        full batch, and on stop. Then whatever arrived joins the batch.
        """
        self._counters.in_flight = batch
        self._held_entries = 0
        wake = self._hold_wake = trio.Event()
        try:
            if self._stop_requested:
                return
            with trio.move_on_after(self.hold_seconds):
                await wake.wait()
        finally:
            self._hold_wake = None
        self._drain_into(batch, limit)
        self._made_room()

    async def _wait_for_message(self) -> Envelope | None:
        """Block for the next message; ``None`` when closed or idle for too long.

        While waiting, runs :meth:`on_idle` once the mailbox stayed empty for
        ``idle_work_after`` seconds (and again every ``idle_work_interval`` while
        it asks for more). Idle work does not postpone passivation. A timed wait parks on the
        mailbox alone: the actor's alarm task (:meth:`_alarm`) hands it a tick when the time comes,
        so no cancel scope is built per message.
        """
        idle = self.idle_timeout
        passivate_at = trio.current_time() + idle if idle is not None else math.inf
        delay = self.idle_work_after
        try:
            while True:
                now = trio.current_time()
                work_at = math.inf
                if delay is not None and self._idle_work_due:
                    work_at = now + delay
                self._idle_since = now if self._idle_since is None else self._idle_since
                wait_until = min(passivate_at, work_at)
                if wait_until == math.inf:
                    try:
                        return await self._recv.receive()
                    except trio.EndOfChannel:
                        return None
                elif wait_until > now and self._arm(wait_until):
                    try:
                        got = await self._recv.receive()
                    except trio.EndOfChannel:
                        return None
                    finally:
                        self._wait_until = math.inf
                    if got is not self._tick:
                        return got
                else:
                    with trio.move_on_at(wait_until):
                        try:
                            return await self._recv.receive()
                        except trio.EndOfChannel:
                            return None
                if self._stop_requested:
                    return None
                if trio.current_time() >= passivate_at:
                    # A message that came as the timer fired (or while idle work ran past it) is in
                    # the mailbox, not handed over: the actor is not idle after all. Passivating now
                    # would fail it as enqueued, so the caller would get ACTOR_RESTARTED.
                    try:
                        return self._recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        return None
                since, self._idle_since = self._idle_since, None  # idle work is work: not evictable
                self._idle_work_due = await self.on_idle()
                self._idle_since = since
                delay = self.idle_work_interval
        finally:
            self._idle_since = None

    async def _dispatch(self, batch: list[Envelope]) -> None:
        c = self._counters
        c.in_flight = batch
        try:
            await self.handle_batch(batch)
        except Fatal:
            raise
        except Exception as exc:
            if any(env.reply is None for env in batch):
                raise  # a tell failed: nobody to tell, so let it crash
            for env in batch:
                assert env.reply is not None
                self._deliver(env.reply, error=exc)
        c.in_flight = []
        for env in batch:
            if env.reply is not None and not env.reply.done and not env.reply.abandoned:
                env.reply.set_exception(
                    InternalBug(f"actor {self.name!r}: handle_batch returned without replying to an ask")
                )
        self._idle_work_due = True
        c.handled += len(batch)
        c.batches += 1
        c.largest_batch = max(c.largest_batch, len(batch))

    def _deliver(self, slot: Reply, *, value: Any = None, error: BaseException | None = None) -> None:
        accepted = slot.set_exception(error) if error is not None else slot.set_result(value)
        if not accepted and slot.abandoned:
            self._counters.dropped_replies += 1

    # -- internals: exit ------------------------------------------------------------

    def _fail_queued(self, kind: type[ActorStopped] | type[ActorCrashed], cause: BaseException | None) -> None:
        """Fail every envelope in flight or still in the mailbox (synchronous)."""
        c = self._counters
        pending = c.in_flight
        c.in_flight = []
        queued = len(pending)
        while True:
            try:
                pending.append(self._recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        self._note_depth(min(len(pending) - queued, self._mailbox_size))
        what = "crashed" if kind is ActorCrashed else "stopped"
        for env in pending:
            if env.reply is None:
                c.dropped_tells += 1
                continue
            if env.reply.done:
                continue
            err = kind(
                f"actor {self.name!r} (incarnation {self.incarnation}) {what} before replying",
                enqueued=True,
            )
            err.__cause__ = cause
            self._deliver(env.reply, error=err)

    def _finish(self, state: ActorState, cause: BaseException | None) -> None:
        self._state = state
        self._room.set()  # nobody waits for room in a mailbox that is gone
        self._send.close()  # parked senders get ClosedResourceError -> _closed_error()
        self._fail_queued(ActorCrashed if state == "crashed" else ActorStopped, cause)
        self._recv.close()
        self._exited.set()
