"""Feature modules plugged into the host: session-actor handlers and extra methods.

Turns/queue/notifications, revisions/rewrites, search and so on register here,
so the core session actor and dispatcher stay small.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def feature_handlers() -> dict[str, Any]:
    """``Custom.kind`` → ``async handler(actor, request)`` for session actors."""
    handlers: dict[str, Any] = {}
    from actors.session_queue import queue_handlers

    handlers.update(queue_handlers())
    from actors.session_revisions import HANDLERS as revision_handlers

    handlers.update(revision_handlers)
    from runtime.methods_turns import turn_handlers

    handlers.update(turn_handlers())
    from actors.session_history import HANDLERS as history_handlers

    handlers.update(history_handlers)
    from runtime.methods_store import store_handlers

    handlers.update(store_handlers())
    return handlers


def feature_methods(**deps: Any) -> dict[str, Any]:
    """JSON-RPC method name → ``async handler(p, raw, ctx, model)``."""
    methods: dict[str, Any] = {}
    from runtime.methods_queue import queue_methods

    methods.update(queue_methods(**deps))
    from runtime.methods_revisions import revision_methods

    methods.update(revision_methods(**deps))
    from runtime.methods_turns import turn_methods

    methods.update(turn_methods(**deps))
    from runtime.methods_search import search_methods

    methods.update(search_methods(**deps))
    from runtime.methods_history import history_methods

    methods.update(history_methods(**deps))
    from runtime.methods_store import store_methods

    methods.update(store_methods(**deps))
    return methods


def inflight_boot_sweep(conn: Any, data_dir: Any, now_ms: int) -> dict[str, Any]:
    """Boot step 4: promote leftover in-flight checkpoints (store/inflight.py)."""
    import os

    from store.faults import Faults
    from store.inflight import sweep

    return sweep(conn, sessions_dir=data_dir.sessions_dir, quarantine_dir=data_dir.quarantine_dir,
                 transcript_path=data_dir.transcript, now_ms=now_ms,
                 faults=Faults.parse(os.environ.get("RT_CRASHPOINT")))


Registration = Callable[..., Mapping[str, Any]]
