"""JSON-RPC methods for tombstones, fork, and the derived tree and model context.

Thin routes: the dispatcher validated the params with the protocol model; each
method builds a :class:`~actors.session_msgs.Custom` request (with the command
receipt key for mutating methods) and asks the session's actor. Fork is asked
of the SOURCE session's actor, which creates the child itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors.gateway_types import CallContext
from actors.session_msgs import Custom
from runtime.api import HostApi

MethodHandler = Callable[[dict[str, Any], Mapping[str, Any], CallContext, Any], Awaitable[Any]]

ROUTES: dict[str, str] = {
    "session.deleteMessage": "history.delete",
    "session.restoreMessage": "history.restore",
    "session.fork": "history.fork",
    "session.tree": "history.tree",
    "session.context": "history.context",
}


def _route(registry: Any, method: str, kind: str) -> MethodHandler:
    async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, model: Any) -> Any:
        receipt = HostApi.receipt(method, p, raw, ctx)
        return await registry.ask(p["sessionId"], Custom(kind, dict(p), receipt=receipt))

    handler.__name__ = f"method_{kind.replace('.', '_')}"
    return handler


def history_methods(**deps: Any) -> dict[str, MethodHandler]:
    """Method name → handler; ``deps`` as passed to ``runtime.features.feature_methods``."""
    registry = deps["registry"]
    return {method: _route(registry, method, kind) for method, kind in ROUTES.items()}


__all__ = ["ROUTES", "history_methods"]
