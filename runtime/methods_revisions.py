"""JSON-RPC methods for revisions, rewrites and compaction: thin routes to the session actor.

Each method validates nothing beyond the protocol model (the dispatcher did
that), builds a :class:`~actors.session_msgs.Custom` request with the command
receipt key and asks the session's actor. Lossless payloads (messages, the
compaction record) are taken from the client's raw params.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors.gateway_types import CallContext
from actors.session_msgs import Custom
from runtime.api import HostApi

MethodHandler = Callable[[dict[str, Any], Mapping[str, Any], CallContext, Any], Awaitable[Any]]

ROUTES: dict[str, tuple[str, tuple[str, ...]]] = {
    # method: (Custom.kind, keys taken from the raw params)
    "session.saveActiveRevision": ("revisions.save", ()),
    "session.activateRevision": ("revisions.activate", ()),
    "session.listRevisions": ("revisions.list", ()),
    "session.truncateFrom": ("rewrite.truncateFrom", ()),
    "session.replaceMessages": ("rewrite.replaceMessages", ("messages",)),
    "session.appendCompaction": ("compaction.append", ("compaction",)),
}


def _route(registry: Any, method: str, kind: str, raw_keys: tuple[str, ...]) -> MethodHandler:
    async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, model: Any) -> Any:
        params = dict(p)
        for key in raw_keys:
            if key in raw:
                params[key] = raw[key]
        receipt = HostApi.receipt(method, p, raw, ctx)
        return await registry.ask(p["sessionId"], Custom(kind, params, receipt=receipt))

    handler.__name__ = f"method_{kind.replace('.', '_')}"
    return handler


def revision_methods(**deps: Any) -> dict[str, MethodHandler]:
    """Method name → handler; ``deps`` as passed to ``runtime.features.feature_methods``."""
    registry = deps["registry"]
    return {method: _route(registry, method, kind, keys) for method, (kind, keys) in ROUTES.items()}


__all__ = ["ROUTES", "revision_methods"]
