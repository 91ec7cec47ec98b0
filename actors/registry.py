"""The session registry: one session actor per active session, started on demand.

Built on the kernel's dynamic supervisor: a session actor that crashes is
restarted from the files (they are the source of truth), one that stays idle
passivates and is started again by the next request.
"""

from __future__ import annotations

from typing import Any

from actors.session import SessionActor, SessionDeps
from runtime.kernel.supervisor import ActorRef, DynamicSupervisor
from store.ids import validate_session_id


class SessionRegistry:
    def __init__(self, deps: SessionDeps, supervisor: DynamicSupervisor) -> None:
        self._deps = deps
        self._sup = supervisor

    def _factory(self, session_id: str) -> Any:
        # the id is checked where an actor is built (a running actor's was): not again per request
        return lambda: SessionActor(validate_session_id(session_id), self._deps)

    async def ref(self, session_id: str) -> ActorRef:
        """The session's actor (started if needed): ``post`` to it enqueues without further waiting.
        An invalid id starts none (``INVALID_ID``)."""
        return await self._sup.get_or_start(session_id, self._factory(session_id))

    def current(self, session_id: str) -> ActorRef | None:
        """The session's actor if it is running now (not starting, stopping or between incarnations):
        a ``post_nowait`` to it enters its mailbox (or finds it full); ``None`` otherwise."""
        ref = self._sup.ref(session_id)
        actor = ref.current()
        return ref if actor is not None and actor.state == "running" else None

    def running(self, session_id: str) -> bool:
        """Whether the session has a live actor now."""
        return self._sup.ref(session_id).current() is not None

    def release_if_idle(self, session_id: str) -> bool:
        """Passivate the session's actor now if nothing waits in its mailbox (an import that went
        through many sessions leaves none running). A request arriving after this never entered the
        going-away incarnation's mailbox, so it is offered to the next one: nothing is lost."""
        actor = self._sup.ref(session_id).current()
        if actor is None or actor.state != "running" or actor.statistics().mailbox_depth:
            return False
        actor.stop()
        return True

    def kill(self, session_id: str) -> bool:
        """Chaos hook: crash the session's actor at its current await point."""
        return bool(self._sup.kill(session_id))

    def statistics(self) -> Any:
        return self._sup.statistics()
