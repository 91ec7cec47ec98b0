"""The session registry: one session actor per active session, started on demand.

Built on the kernel's dynamic supervisor: a session actor that crashes is
restarted from the files (they are the source of truth), one that stays idle
passivates and is started again by the next request.
"""

from __future__ import annotations

from typing import Any

from actors.session import SessionActor, SessionDeps
from runtime.kernel.supervisor import DynamicSupervisor
from store.ids import validate_session_id


class SessionRegistry:
    def __init__(self, deps: SessionDeps, supervisor: DynamicSupervisor, *, ask_timeout: float = 60.0) -> None:
        self._deps = deps
        self._sup = supervisor
        self._ask_timeout = ask_timeout

    def _factory(self, session_id: str) -> Any:
        return lambda: SessionActor(session_id, self._deps)

    async def ask(self, session_id: str, msg: Any, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the actor API's own deadline: raises AskTimeout (wire TIMEOUT), not Cancelled
        sid = validate_session_id(session_id)
        ref = await self._sup.get_or_start(sid, self._factory(sid))
        return await ref.ask(msg, timeout=timeout if timeout is not None else self._ask_timeout)

    async def warm(self, session_id: str) -> None:
        """Start the session's actor if needed, so a following ``ask`` enqueues without yielding."""
        sid = validate_session_id(session_id)
        await self._sup.get_or_start(sid, self._factory(sid))

    def kill(self, session_id: str) -> bool:
        """Chaos hook: crash the session's actor at its current await point."""
        return bool(self._sup.kill(session_id))

    def statistics(self) -> Any:
        return self._sup.statistics()
