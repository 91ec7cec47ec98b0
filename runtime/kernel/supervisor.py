"""One-for-one supervision of actors (OTP), with stable references by name.

:class:`Supervisor` owns a nursery. ``start_child(spec)`` builds the actor from
``spec.factory`` and starts it with ``nursery.start`` (so it returns once the
actor is ready; an actor with ``start_waits = False`` is started without
waiting). One *keeper* task per child runs incarnation after incarnation:

* crash (exception, :class:`~runtime.kernel.actor.Fatal`, ``kill``): restarted unless
  the child is ``temporary``;
* normal exit (stop, passivation): restarted only if ``permanent``;
* an explicit ``stop_child``/``aclose`` is never restarted.

Every restart counts against the supervisor's restart intensity: more than
``intensity`` restarts within ``period`` seconds (trio clock) and the
supervisor gives up: all children are cancelled and ``run`` raises
:class:`RestartIntensityExceeded` (the host exits non-zero).

:class:`ActorRef` is a handle by name that survives restarts. An ask that hits
an incarnation which is going away *before* its message was enqueued waits
for the next incarnation (bounded by the ask's timeout); if no incarnation
will come it fails with :class:`~runtime.kernel.actor.ActorStopped`.

:class:`DynamicSupervisor` keeps many short-lived children by key
(``get_or_start``); a child that passivates or stops is forgotten and started
again by its next use, which waits until the old incarnation has fully exited
(one incarnation per key at a time: the single-writer rule).

Shutdown (``aclose(grace=...)``) goes through the children in reverse start
order: stop request, bounded wait, hard cancel (tractor's
``_try_cancel_then_kill``). ``grace`` bounds the whole graceful phase.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import trio

from runtime.kernel.actor import Actor, ActorCrashed, ActorState, ActorStopped, AskTimeout, Busy, InternalBug, Reply

RestartType = Literal["permanent", "transient", "temporary"]
SupervisorState = Literal["new", "running", "closing", "closed", "failed"]


class RestartIntensityExceeded(Exception):
    """Too many restarts within the period: the supervisor gave up."""

    code = "INTERNAL"

    def __init__(self, supervisor: str, child: str, intensity: int, period: float) -> None:
        super().__init__(
            f"supervisor {supervisor!r}: child {child!r} crashed and more than {intensity} "
            f"restart(s) within {period}s would be needed; giving up"
        )
        self.supervisor = supervisor
        self.child = child
        self.intensity = intensity
        self.period = period


@dataclass(frozen=True)
class ChildSpec:
    name: str
    factory: Callable[[], Actor]
    restart: RestartType = "permanent"


@dataclass(frozen=True)
class ChildStatistics:
    name: str
    restart: RestartType
    incarnation: int
    restarts: int
    state: ActorState


@dataclass(frozen=True)
class SupervisorStatistics:
    name: str
    state: SupervisorState
    restarts: int
    children: dict[str, ChildStatistics]


@dataclass(eq=False)
class _Child:
    spec: ChildSpec
    actor: Actor
    incarnation: int = 1
    restarts: int = 0
    stop_requested: bool = False
    gone: bool = False
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    changed: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)

    def notify(self) -> None:
        """Wake everyone waiting for a new incarnation (or for the end)."""
        self.changed.set()
        self.changed = trio.Event()


class Supervisor:
    """One-for-one supervisor with restart intensity ``intensity`` per ``period`` s."""

    def __init__(self, intensity: int, period: float, *, name: str = "supervisor", stop_grace: float = 5.0) -> None:
        if intensity < 0 or period <= 0:
            raise ValueError(f"supervisor {name!r}: need intensity >= 0 and period > 0")
        self.name = name
        self.intensity = intensity
        self.period = period
        self.stop_grace = stop_grace
        self._state: SupervisorState = "new"
        self._nursery: trio.Nursery | None = None
        self._children: dict[str, _Child] = {}  # insertion order = start order
        self._restart_times: collections.deque[float] = collections.deque(maxlen=intensity + 1)
        self._restarts = 0
        self._failure: RestartIntensityExceeded | None = None
        self._exited = trio.Event()
        self._final_states: dict[str, ActorState] = {}

    # -- lifecycle ------------------------------------------------------------

    @property
    def state(self) -> SupervisorState:
        return self._state

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the children's nursery until :meth:`aclose` (or a give-up)."""
        if self._state != "new":
            raise InternalBug(f"supervisor {self.name!r}: run() called in state {self._state}")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._state = "running"
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            if self._state != "failed":  # type: ignore[comparison-overlap]  # _give_up() sets it while we await
                self._state = "closed"
            self._exited.set()
        if self._failure is not None:
            raise self._failure

    async def aclose(self, *, grace: float) -> dict[str, ActorState]:
        """Stop children in reverse start order: stop, wait (``grace`` in total), cancel.

        Returns how each child it stopped ended (``stopped`` for an orderly
        stop, even after the hard cancel; ``crashed`` if it died meanwhile).
        Idempotent; a second call waits for the first. Never raises the
        supervisor's own failure (``run`` does).
        """
        if self._state == "new":
            self._state = "closed"
            self._exited.set()
            return {}
        if self._state != "running":
            await self._exited.wait()
            return dict(self._final_states)
        self._state = "closing"
        deadline = trio.current_time() + grace
        for child in reversed(list(self._children.values())):
            await self._stop(child, deadline)
            self._final_states[child.spec.name] = child.actor.state
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        await self._exited.wait()
        return dict(self._final_states)

    # -- children ---------------------------------------------------------------

    async def start_child(self, spec: ChildSpec) -> ActorRef:
        """Start a child and wait until it is ready; errors of its first start propagate."""
        self._check_running()
        if spec.name in self._children:
            raise ValueError(f"supervisor {self.name!r} already has a child named {spec.name!r}")
        return await self._start(spec)

    def ref(self, name: str) -> ActorRef:
        """A stable handle for the child ``name`` (which need not exist yet)."""
        return ActorRef(self, name)

    def kill(self, name: str) -> bool:
        """Chaos hook: crash the current incarnation of ``name`` at its await point."""
        child = self._children.get(name)
        if child is None or child.gone:
            return False
        child.actor.kill()
        return True

    async def stop_child(self, name: str, *, grace: float | None = None) -> None:
        """Stop ``name`` (never restarted); hard-cancel it after ``grace`` seconds."""
        child = self._children.get(name)
        if child is None:
            raise LookupError(f"supervisor {self.name!r} has no child named {name!r}")
        await self._stop(child, trio.current_time() + (self.stop_grace if grace is None else grace))

    def children(self) -> list[str]:
        """Names of the current children, in start order."""
        return [name for name, child in self._children.items() if not child.gone]

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            name=self.name,
            state=self._state,
            restarts=self._restarts,
            children={
                name: ChildStatistics(
                    name=name,
                    restart=child.spec.restart,
                    incarnation=child.incarnation,
                    restarts=child.restarts,
                    state=child.actor.state,
                )
                for name, child in self._children.items()
            },
        )

    # -- internals ----------------------------------------------------------------

    def _check_running(self) -> trio.Nursery:
        if self._state == "new":
            raise InternalBug(f"supervisor {self.name!r} is not running yet (start run() first)")
        if self._state != "running" or self._nursery is None:
            raise ActorStopped(f"supervisor {self.name!r} is {self._state}")
        return self._nursery

    async def _start(self, spec: ChildSpec) -> ActorRef:
        nursery = self._check_running()
        actor = spec.factory()
        actor.incarnation = 1
        child = _Child(spec=spec, actor=actor)
        self._children[spec.name] = child  # visible at once: asks buffer in the mailbox
        name = f"actor:{self.name}/{spec.name}"
        if actor.start_waits:
            await nursery.start(self._keep, child, name=name)
        else:  # nothing to report from its start: it runs in the next scheduler pass
            nursery.start_soon(partial(self._keep, child, task_status=trio.TASK_STATUS_IGNORED), name=name)
        return ActorRef(self, spec.name)

    async def _stop(self, child: _Child, deadline: float) -> None:
        child.stop_requested = True
        child.actor.stop()
        with trio.move_on_at(deadline):
            await child.done.wait()
        if not child.done.is_set():
            child.scope.cancel()  # hard cancel: the actor exits as "stopped", asks fail
            await child.done.wait()

    async def _keep(self, child: _Child, *, task_status: trio.TaskStatus[None]) -> None:
        """Run incarnation after incarnation of ``child`` until it ends for good."""
        status: Any = task_status
        try:
            with child.scope:
                while True:
                    actor = child.actor
                    crash: BaseException | None = None
                    try:
                        await actor.run(task_status=status)
                    except Exception as exc:
                        if not actor.ready and status is task_status and status is not trio.TASK_STATUS_IGNORED:
                            raise  # the first start failed: start_child raises it
                        crash = exc
                    status = trio.TASK_STATUS_IGNORED
                    if not self._next_incarnation(child, crash):
                        return
        finally:
            child.gone = True
            if self._children.get(child.spec.name) is child:
                del self._children[child.spec.name]
            child.notify()
            child.done.set()

    def _next_incarnation(self, child: _Child, crash: BaseException | None) -> bool:
        """Decide on a restart; install the new actor. False = the child ends."""
        while True:
            if self._state != "running" or child.stop_requested:
                return False
            policy = child.spec.restart
            if policy == "temporary" or (policy == "transient" and crash is None):
                return False
            if not self._admit_restart(child, crash):
                return False
            try:
                actor = child.spec.factory()
            except Exception as exc:  # counts as a crash of the new incarnation
                crash = exc
                continue
            child.incarnation += 1
            actor.incarnation = child.incarnation
            child.actor = actor
            child.notify()
            return True

    def _admit_restart(self, child: _Child, crash: BaseException | None) -> bool:
        now = trio.current_time()
        times = self._restart_times
        while times and now - times[0] >= self.period:
            times.popleft()
        if len(times) >= self.intensity:
            failure = RestartIntensityExceeded(self.name, child.spec.name, self.intensity, self.period)
            failure.__cause__ = crash
            self._give_up(failure)
            return False
        times.append(now)
        child.restarts += 1
        self._restarts += 1
        return True

    def _give_up(self, failure: RestartIntensityExceeded) -> None:
        if self._failure is None:
            self._failure = failure
        self._state = "failed"
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _acquire(self, name: str, stale: Actor | None, factory: Callable[[], Actor] | None) -> Actor:
        """The current incarnation of ``name`` other than ``stale``; waits between incarnations."""
        while True:
            child = self._children.get(name)
            if child is None or child.gone:
                raise ActorStopped(f"supervisor {self.name!r}: child {name!r} is not running")
            if child.actor is not stale:
                return child.actor
            await child.changed.wait()


class DynamicSupervisor(Supervisor):
    """Many short-lived ``transient`` children by key, at most ``max_children``.

    At the bound, a new key is refused with :class:`Busy`; with ``evict_idle`` the child that has
    waited longest on an empty mailbox is stopped first (an early passivation: its next use starts
    it again), and only a bound made of children that are all working is refused.
    """

    def __init__(
        self,
        intensity: int,
        period: float,
        *,
        max_children: int,
        name: str = "dynamic-supervisor",
        stop_grace: float = 5.0,
        evict_idle: bool = False,
    ) -> None:
        super().__init__(intensity, period, name=name, stop_grace=stop_grace)
        if max_children < 1:
            raise ValueError(f"supervisor {name!r}: max_children must be >= 1")
        self.max_children = max_children
        self.evict_idle = evict_idle

    async def get_or_start(self, key: str, factory: Callable[[], Actor]) -> ActorRef:
        """A reference to ``key``'s actor, starting it (after any old one exited) if needed."""
        await self._acquire(key, None, factory)
        return ActorRef(self, key, factory)

    async def _acquire(self, name: str, stale: Actor | None, factory: Callable[[], Actor] | None) -> Actor:
        while True:
            child = self._children.get(name)
            if child is None:
                if factory is None:
                    raise ActorStopped(f"supervisor {self.name!r}: child {name!r} is not running")
                self._check_running()
                if len(self._children) >= self.max_children:
                    victim = self._longest_idle() if self.evict_idle else None
                    if victim is not None:
                        victim.actor.stop()  # as its idle timeout would: a message sent meanwhile goes to the next one
                        await victim.done.wait()
                        continue
                    leaving = self._leaving() if self.evict_idle else None
                    if leaving is not None:  # a slot is being freed (another eviction, a passivation): wait for it
                        await leaving.changed.wait()
                        continue
                    raise Busy(f"supervisor {self.name!r}: {self.max_children} children already running")
                await self._start(ChildSpec(name, factory, "transient"))
                continue
            exiting = child.actor.state in ("stopping", "stopped", "passivated") and not child.gone
            if child.actor is not stale and not exiting:
                return child.actor
            # Wait for the next incarnation, or for the old one to be gone
            # entirely so the next one never overlaps it.
            await child.changed.wait()

    def _longest_idle(self) -> _Child | None:
        """The child waiting longest on an empty mailbox, if any."""
        best: _Child | None = None
        best_since = math.inf
        for child in self._children.values():
            since = None if child.gone or child.actor.statistics().mailbox_depth else child.actor.idle_since
            if since is not None and since < best_since:
                best, best_since = child, since
        return best

    def _leaving(self) -> _Child | None:
        """A child whose incarnation is on its way out, if any."""
        for child in self._children.values():
            if not child.gone and child.actor.state in ("stopping", "stopped", "passivated", "crashed"):
                return child
        return None


class ActorRef:
    """A stable handle by name: resolves the child's current incarnation per call."""

    def __init__(self, supervisor: Supervisor, name: str, factory: Callable[[], Actor] | None = None) -> None:
        self._sup = supervisor
        self.name = name
        self._factory = factory

    @property
    def incarnation(self) -> int | None:
        child = self._sup._children.get(self.name)
        return None if child is None or child.gone else child.incarnation

    def current(self) -> Actor | None:
        """The current incarnation, if any (for introspection and chaos tests)."""
        child = self._sup._children.get(self.name)
        return None if child is None or child.gone else child.actor

    async def ask(self, msg: Any, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the actor API's own deadline: raises AskTimeout (wire TIMEOUT), not Cancelled
        """Ask the current incarnation; waits for the next one if it is between incarnations."""
        return await self._ask(msg, timeout, wait_for_room=True)

    async def ask_or_busy(self, msg: Any, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the actor API's own deadline: raises AskTimeout (wire TIMEOUT), not Cancelled
        return await self._ask(msg, timeout, wait_for_room=False)

    async def tell(self, msg: Any) -> None:
        stale: Actor | None = None
        while True:
            actor = await self._sup._acquire(self.name, stale, self._factory)
            try:
                return await actor.tell(msg)
            except (ActorStopped, ActorCrashed) as exc:
                if exc.enqueued:
                    raise
                stale = actor

    async def post(self, msg: Any, reply: Reply) -> None:
        """Enqueue ``msg`` with a caller-owned reply at the current incarnation (waiting for room).

        Like :meth:`ask`, a message that never entered a going-away incarnation's
        mailbox is offered to the next one.
        """
        stale: Actor | None = None
        while True:
            actor = await self._sup._acquire(self.name, stale, self._factory)
            try:
                return await actor.post(msg, reply)
            except (ActorStopped, ActorCrashed) as exc:
                if exc.enqueued:
                    raise
                stale = actor

    async def wait_room(self) -> None:
        """Wait for an incarnation (if between two) and for room in its mailbox."""
        actor = await self._sup._acquire(self.name, None, self._factory)
        await actor.wait_room()

    def post_nowait(self, msg: Any, reply: Reply) -> None:
        """Post to the current incarnation now; ``ActorStopped`` if there is none, ``Busy`` if full."""
        actor = self.current()
        if actor is None:
            raise ActorStopped(f"supervisor {self._sup.name!r}: child {self.name!r} is not running")
        actor.post_nowait(msg, reply)

    def wake(self) -> None:
        """End the current incarnation's hold, if it holds a batch (see ``Actor.wake``)."""
        actor = self.current()
        if actor is not None:
            actor.wake()

    def tell_nowait(self, msg: Any) -> None:
        """Tell the current incarnation now; ``ActorStopped`` if there is none, ``Busy`` if full."""
        actor = self.current()
        if actor is None:
            raise ActorStopped(f"supervisor {self._sup.name!r}: child {self.name!r} is not running")
        actor.tell_nowait(msg)

    async def _ask(self, msg: Any, timeout: float | None, *, wait_for_room: bool) -> Any:  # noqa: ASYNC109 - the actor API's own deadline: raises AskTimeout (wire TIMEOUT), not Cancelled
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        stale: Actor | None = None
        while True:
            actor: Actor | None = None
            with trio.move_on_at(deadline):
                actor = await self._sup._acquire(self.name, stale, self._factory)
            if actor is None:
                raise AskTimeout(f"ask to {self.name!r} timed out after {timeout}s waiting for an incarnation")
            remaining = None if timeout is None else max(0.0, deadline - trio.current_time())
            try:
                if wait_for_room:
                    return await actor.ask(msg, timeout=remaining)
                return await actor.ask_or_busy(msg, timeout=remaining)
            except (ActorStopped, ActorCrashed) as exc:
                if exc.enqueued:
                    raise
                stale = actor  # never entered its mailbox: try the next incarnation

    def __repr__(self) -> str:
        return f"<ActorRef {self._sup.name}/{self.name}>"


__all__ = [
    "ActorRef",
    "ChildSpec",
    "ChildStatistics",
    "DynamicSupervisor",
    "RestartIntensityExceeded",
    "Supervisor",
    "SupervisorStatistics",
]
