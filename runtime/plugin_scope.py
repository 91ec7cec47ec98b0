"""What a plugin connection may touch (ARCHITECTURE "Who is calling"; seed 003 §4.5, §11.20).

A plugin connects with ``clientKind: "plugin"`` and its ``pluginId``
(``CallContext.plugin_id``). Its reads and writes are scoped to what it owns;
everything else is ``PERMISSION_DENIED``. For sessions that is:

* a **session method** (any route to a session actor) only on a session the
  plugin imported (its ``session_import_origins`` row names the plugin), and
  not while it is in the trash — except ``sessions.trash`` / ``restore`` /
  ``purge``, which work on the trash. A session another plugin or the host
  owns is ``PERMISSION_DENIED``; a trashed one is ``SESSION_NOT_FOUND``;
* methods whose handler scopes by the caller's plugin id itself
  (:data:`SELF_SCOPED`: its imports, its listings);
* nothing else (search, other stores): ``PERMISSION_DENIED``.

The pipeline calls :func:`authorize` for plugin callers only, after the params
were validated and before anything runs.
"""

from __future__ import annotations

from typing import Any

from actors.gateway_types import CallContext
from runtime.context import Services
from store.errors import PermissionDenied
from store.plugin_imports import require_owned

__all__ = ["SELF_SCOPED", "TRASH_METHODS", "authorize"]

SELF_SCOPED = frozenset({"plugins.importSession", "plugins.listSessions", "sessions.listTrashed", "session.list"})
"""Non-session methods a plugin may call: each handler narrows what it sees to ``caller.plugin_id``."""
TRASH_METHODS = frozenset({"sessions.trash", "sessions.restore", "sessions.purge"})


async def authorize(services: Services, method: str, session_route: bool, params: Any, caller: CallContext) -> None:
    """Raise ``PERMISSION_DENIED`` (or ``SESSION_NOT_FOUND``) unless the plugin caller may run this request."""
    plugin = caller.plugin_id
    assert plugin is not None
    if not session_route:
        if method in SELF_SCOPED:
            return
        raise PermissionDenied(f"{method} is not available to plugins", data={"method": method, "pluginId": plugin})
    sid = getattr(params, "session_id", None)
    if not isinstance(sid, str):
        raise PermissionDenied(f"{method} is not available to plugins", data={"method": method, "pluginId": plugin})
    trash = method in TRASH_METHODS
    await services.reads.run(lambda conn: require_owned(conn, plugin, sid, include_trashed=trash))
