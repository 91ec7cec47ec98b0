"""The order of one connection's requests: each takes effect after every earlier mutation.

A connection's requests enter an :class:`Ordering` in frame order and never
wait there (:meth:`Ordering.add` is synchronous: the gateway's reader goes on
reading frames). One task per busy connection *dispatches* them, one after the
other, in that order: each request's step resolves its target, calls
:meth:`Turn.ready` with it, and hands the request to the target (a mailbox
post, or a task for reads and multi-step requests); then the next one starts.

:meth:`Turn.ready` is the ordering rule. It returns once every earlier
*mutating* request of the connection has taken effect (:meth:`Turn.settle`:
it was answered), except those already queued at the same ordered target — a
session actor's or the DB writer's mailbox runs them before this one anyway,
so consecutive requests to one actor are pipelined into it (an append group
commit is not split). A target of ``None`` (the read pool, a host task) orders
nothing: everything pending before it must have taken effect. Reads never hold
up later requests; reads after reads run concurrently.

A submitter may also hand a request on itself, at once, when nothing would make
it wait (:meth:`Ordering.may_hand_on`, then :meth:`Ordering.turn` and
:meth:`Ordering.handed_on`): the same bookkeeping as the dispatching task's,
without that task (``Pipeline._to_actor_now``).

So: a read sees every write its connection sent before it, and two writes of
one connection apply in frame order, whatever their targets. A request waiting
here holds up the requests behind it (they must come after it), never the
reader. When the connection closes, what it had not dispatched yet is dropped
(:meth:`Ordering.abandon`). Bounded by the connection's in-flight limit;
single trio thread.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import trio

__all__ = ["Abandoned", "Ordering", "Turn"]

log = logging.getLogger("pi_host")


class Abandoned(Exception):
    """Raised by :meth:`Turn.ready` once the connection is gone: the request is not run."""


Target = Hashable | None
"""Where a request is queued: an ordered mailbox (``("session", sid)``, ``("writer",)``) or ``None``."""


class Turn:
    """One request's place in its connection's order."""

    __slots__ = ("_order", "mutating", "tag", "target", "settled", "_pending")

    def __init__(self, order: Ordering, mutating: bool, tag: Any) -> None:
        self._order = order
        self.mutating = mutating
        self.tag = tag
        self.target: Target = None
        self.settled = False
        self._pending = False

    async def ready(self, target: Target = None) -> None:
        """Wait until every earlier mutation has taken effect, but those queued at ``target``
        (an ordered mailbox that runs them before this request); this request is queued at
        ``target`` from now on (call it again to name another)."""
        order = self._order
        while order._blocked(target) and not order._abandoned:
            if order._changed is None:  # the first to wait since the last change: built only then
                order._changed = trio.Event()
            await order._changed.wait()
        if order._abandoned:
            raise Abandoned("the connection closed before the request was run")
        self.target = target

    def settle(self) -> None:
        """The request was answered: its effect, if any, has taken place. Idempotent."""
        if self.settled:
            return
        self.settled = True
        self._order._settled(self)

    def following(self) -> Any:
        """The tag of the next request waiting to be dispatched, if one is queued already."""
        queue = self._order._queue
        return queue[0][0].tag if queue else None


Step = Callable[[Turn], Awaitable[None]]


class Ordering:
    """One connection's order (see the module docstring).

    ``spawn(fn)`` starts the dispatching task (in a nursery that outlives the
    connection's requests); ``on_idle()`` is called whenever nothing is queued,
    dispatching or pending any more (the owner may forget this object then).
    """

    def __init__(self, spawn: Callable[[Callable[[], Awaitable[None]]], None],
                 on_idle: Callable[[], None] | None = None) -> None:
        self._spawn = spawn
        self._on_idle = on_idle
        self._queue: deque[tuple[Turn, Step, Callable[[], None]]] = deque()
        self._running = False
        self._pending = 0  # mutations dispatched and not yet answered
        self._at: dict[Hashable, int] = {}  # of them, how many per ordered target
        # Events are built only when a task waits (an order is built for each request of a connection
        # that had gone idle: the usual case of a client awaiting each answer)
        self._changed: trio.Event | None = None
        self._abandoned = False
        self._went_idle: trio.Event | None = None

    @property
    def idle(self) -> bool:
        return not self._queue and not self._running and self._pending == 0

    async def wait_idle(self) -> None:
        """Until nothing is queued, dispatching or waiting for its answer (every mutation this
        connection handed on has taken effect, or failed)."""
        while not self.idle:
            if self._went_idle is None:
                self._went_idle = trio.Event()
            await self._went_idle.wait()

    def statistics(self) -> dict[str, int]:
        return {"queued": len(self._queue), "pending": self._pending}

    def add(self, step: Step, drop: Callable[[], None], *, mutating: bool, tag: Any = None) -> Turn:
        """Queue ``step`` behind every request added before it; never waits.

        ``drop()`` answers the request if it is never dispatched (the dispatching task
        was cancelled, the connection closed). Raises what ``spawn`` raises when no task can
        be started."""
        turn = Turn(self, mutating, tag)
        self._queue.append((turn, step, drop))
        if not self._running:
            self._running = True
            try:
                self._spawn(self._dispatch)
            except BaseException:
                self._running = False
                self._queue.pop()
                raise
        return turn

    async def _dispatch(self) -> None:
        try:
            while self._queue:
                turn, step, _ = self._queue.popleft()
                try:
                    await step(turn)
                except Exception:
                    # A step answers its own request; one that raised anyway must not stop the rest.
                    log.exception("ordering: a request's step raised")
                self._handed_on(turn)
        except BaseException:
            while self._queue:
                _, _, drop = self._queue.popleft()
                drop()
            raise
        finally:
            self._running = False
        self._maybe_idle()

    def may_hand_on(self, target: Target) -> bool:
        """Whether a request for ``target`` added now would be dispatched at once without waiting:
        nothing is queued or dispatching before it, and :meth:`Turn.ready` would not wait."""
        return not self._queue and not self._running and not self._abandoned and not self._blocked(target)

    def turn(self, mutating: bool, tag: Any = None) -> Turn:
        """A turn for a request its submitter hands to ``target`` itself, now (when :meth:`may_hand_on`
        said so, with no await in between), instead of :meth:`add`: no dispatching task; then
        :meth:`handed_on`."""
        return Turn(self, mutating, tag)

    def handed_on(self, turn: Turn, target: Target) -> None:
        """``turn``'s request is in ``target``'s mailbox (see :meth:`turn`): what :meth:`add`'s
        dispatching task records after a step."""
        turn.target = target
        self._handed_on(turn)
        self._maybe_idle()

    def _handed_on(self, turn: Turn) -> None:
        if turn.mutating and not turn.settled:
            turn._pending = True
            self._pending += 1
            if turn.target is not None:
                self._at[turn.target] = self._at.get(turn.target, 0) + 1

    def abandon(self) -> None:
        """The connection is gone: drop every request not dispatched yet (one waiting for its
        turn gets :class:`Abandoned`); those handed to their targets already run on."""
        self._abandoned = True
        while self._queue:
            _, _, drop = self._queue.popleft()
            drop()
        self._wake_changed()
        self._maybe_idle()

    def _blocked(self, target: Target) -> bool:
        ahead = self._pending
        if target is not None:
            ahead -= self._at.get(target, 0)
        return ahead > 0

    def _settled(self, turn: Turn) -> None:
        if not turn._pending:
            return
        turn._pending = False
        self._pending -= 1
        if turn.target is not None:
            left = self._at[turn.target] - 1
            if left:
                self._at[turn.target] = left
            else:
                del self._at[turn.target]
        self._wake_changed()
        self._maybe_idle()

    def _wake_changed(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _maybe_idle(self) -> None:
        if not self.idle:
            return
        if self._went_idle is not None:
            self._went_idle.set()
            self._went_idle = None
        if self._on_idle is not None:
            self._on_idle()
