"""Feature modules plugged into the host: session-actor handlers and extra methods.

Turns/queue/notifications, revisions/rewrites, search and so on register here,
so the core session actor and dispatcher stay small.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


def feature_handlers() -> dict[str, Any]:
    """``Custom.kind`` → ``async handler(actor, request)`` for session actors."""
    handlers: dict[str, Any] = {}
    from actors.session_queue import queue_handlers

    handlers.update(queue_handlers())
    return handlers


def feature_methods(**deps: Any) -> dict[str, Any]:
    """JSON-RPC method name → ``async handler(p, raw, ctx, model)``."""
    methods: dict[str, Any] = {}
    from runtime.methods_queue import queue_methods

    methods.update(queue_methods(**deps))
    return methods


def inflight_boot_sweep(conn: Any, data_dir: Any, now_ms: int) -> dict[str, Any]:
    return {"promoted": 0}


Registration = Callable[..., Mapping[str, Any]]
