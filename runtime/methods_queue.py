"""Dispatcher side of the turn queue: ``session.queue*`` → session-actor requests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors import session_queue as sq
from actors.gateway_types import CallContext
from actors.session_msgs import Custom
from runtime.api import HostApi

MethodHandler = Callable[[dict[str, Any], Mapping[str, Any], CallContext, Any], Awaitable[Any]]

_KINDS: Mapping[str, str] = {
    "session.queuePush": sq.KIND_PUSH,
    "session.queueList": sq.KIND_LIST,
    "session.queueRemove": sq.KIND_REMOVE,
    "session.queuePrioritize": sq.KIND_PRIORITIZE,
    "session.queueReorder": sq.KIND_REORDER,
    "session.queueAttach": sq.KIND_ATTACH,
    "session.queueTake": sq.KIND_TAKE,
}


def _method(registry: Any, method: str, kind: str) -> MethodHandler:
    async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, model: Any) -> Any:
        params = dict(p)
        if kind == sq.KIND_PUSH:
            # Lossless prompt payload: the client's own content and attachments.
            params["content"] = raw.get("content")
            params["attachments"] = raw.get("attachments")
        if kind == sq.KIND_ATTACH:
            params["clientKind"] = ctx.client_kind
        receipt = None if kind in (sq.KIND_LIST, sq.KIND_ATTACH) else HostApi.receipt(method, p, raw, ctx)
        return await registry.ask(p["sessionId"], Custom(kind, params, receipt=receipt))

    return handler


def queue_methods(**deps: Any) -> dict[str, MethodHandler]:
    """JSON-RPC method → handler; needs ``deps["registry"]``."""
    registry = deps["registry"]
    return {method: _method(registry, method, kind) for method, kind in _KINDS.items()}
