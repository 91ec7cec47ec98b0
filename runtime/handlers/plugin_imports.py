"""``plugins.importSession`` / ``plugins.listSessions`` (seed 003 §4.5, §11.20).

Only a plugin connection (``clientKind: "plugin"``) may call them; the plugin id
is the connection's, never a parameter. An import of a key (pluginId, sourceId,
externalId) seen before answers that session (``created: false``) and writes
nothing. A new one gets a host-generated id — derived from the receipt key when
there is one, so a retry after a crash lands on the same session — and is
written inside that session's actor (``HostContext.session_call``): stage the
transcript (temp file), link it, then one transaction with the rows, the origin
row and the receipt (``store/interchange/plugin_imports.py``); the transaction first checks
the key again, so of two imports racing for one key exactly one writes and the
other removes its file and answers the winner. A failure removes the file.
No project or model binding is made, except an explicit host-created ``projectId``.

Receipt: in the effect's transaction (``ctx.commit``); after a crash between the
link and the commit, boot indexes the orphan transcript with its origin (the
``session_info`` line carries the whole origin row), so the retry finds the key;
the transcript's header carries the request's receipt record, so the retry
knows the import is its own and answers ``created: true``, as the first try
would have (``answer_found``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from actors.gateway_types import CallContext
from actors.session import SessionOp
from actors.session_context import SessionContext
from protocol import models as m
from runtime.context import HostContext, ReadContext
from store.errors import Conflict, PermissionDenied, SessionNotFound, StoreError
from store.ids import derived_id, new_id
from store.indexing import index
from store.interchange.import_write import ImportTarget, publish, undo
from store.interchange.native_pi import is_native_id
from store.interchange.plugin_imports import (
    PluginImport,
    answer_found,
    bound_project,
    commit_plugin_import,
    existing_result,
    list_plugin_sessions,
    stage_plugin_import,
)
from store.plugins import session_owner
from store.receipts import ReceiptKey

from .imports import SERVICE as IMPORTS
from .imports import landed
from .plugins import require_owner

__all__ = ["IMPORT_SESSION", "import_session", "list_sessions", "require_plugin", "scope_session"]


async def scope_session(read: Callable[..., Awaitable[Any]], caller: CallContext, session_id: str, *,
                        trashed_ok: bool = False) -> None:
    """A plugin caller reaches only a session it imported (``require_owner``), and not while it is in the
    trash (``SESSION_NOT_FOUND``) unless ``trashed_ok``. Other callers reach every session."""
    if caller.plugin_id is None:
        return
    if is_native_id(session_id):
        raise PermissionDenied(f"native session {session_id} does not belong to plugin {caller.plugin_id}",
                               data={"pluginId": caller.plugin_id})

    def look(conn: Any) -> tuple[str | None, bool]:
        row = index.session_row(conn, session_id)
        return session_owner(conn, session_id), bool(row is not None and row["deletedAt"] is not None)

    owner, trashed = await read(look)
    require_owner(caller, owner, what=f"session {session_id}")
    if trashed and not trashed_ok:
        raise SessionNotFound(f"session {session_id} is in the trash", data={"sessionId": session_id})


def require_plugin(caller: CallContext, method: str) -> str:
    if caller.plugin_id is None:
        raise PermissionDenied(f"{method} is for plugin connections (clientKind plugin with a pluginId)",
                               data={"method": method})
    return caller.plugin_id


def _request(plugin: str, p: m.PluginImportSessionParams) -> PluginImport:
    history = p.history.model_dump(by_alias=True, exclude_none=True) if p.history is not None else {}
    messages = [msg.model_dump(by_alias=True, exclude_none=True) for msg in p.messages]
    return PluginImport(plugin, p.source_id, p.external_id, messages, title=p.title or "", project_id=p.project_id,
                        history=history, source_label=p.source_label)


@dataclass(frozen=True, slots=True)
class _Call:
    request: PluginImport
    target: ImportTarget


async def import_session(ctx: HostContext, p: m.PluginImportSessionParams, key: ReceiptKey | None) -> Any:
    plugin = require_plugin(ctx.caller, "plugins.importSession")
    req = _request(plugin, p)
    sid = derived_id("plugin-import", key.client_id, key.submission_id, prefix="pl-")[:40] if key is not None \
        else new_id("pl-")
    target: ImportTarget = ctx.services.get(IMPORTS).target
    found = await ctx.read(existing_result, req)
    if found is not None:
        if key is None:
            return found
        answer = await _answer(found, sid, target, key)
        return await ctx.commit(lambda conn: answer)
    return await ctx.session_call(sid, IMPORT_SESSION, _Call(req, target), key)


async def _answer(found: dict[str, Any], sid: str, target: ImportTarget, key: ReceiptKey) -> dict[str, Any]:
    """The answer for a key imported before: ``created: true`` if this very request imported it (its id is
    the one the key derives, and the header carries the key's receipt: a retry after a crash before the
    commit), else ``created: false`` (``answer_found``)."""
    if found["sessionId"] != sid:
        return found
    return await trio.to_thread.run_sync(answer_found, found, target.transcript(sid), key)


async def _import_in_actor(ctx: SessionContext, call: _Call, key: ReceiptKey | None) -> Any:
    req, target = call.request, call.target
    ctx.undelete()
    row = await ctx.catch_up()
    if row is not None:
        # This id's transcript exists already (an earlier attempt of this very request, indexed by boot).
        found = await ctx.read(existing_result, req)
        if found is None or found["sessionId"] != ctx.sid:
            raise Conflict(f"session {ctx.sid} exists and is not this import", data={"sessionId": ctx.sid})
        answer = await _answer(found, ctx.sid, target, key) if key is not None else found
        return await ctx.commit(lambda conn: answer)
    now = ctx.now()
    project = await ctx.read(bound_project, req)
    staged = await ctx.io(lambda: stage_plugin_import(req, ctx.sid, target, project, now_ms=now, key=key))
    try:
        await ctx.io(lambda: publish(staged, faults=target.faults))
    except BaseException:
        with trio.CancelScope(shield=True):
            await ctx.io(undo, staged)
        raise
    try:
        result = await ctx.commit(lambda conn: commit_plugin_import(conn, req, staged, now_ms=now))
    except StoreError:
        # Refused, or failed with its outcome unknown (an error once the commit may have taken place):
        # the transcript goes only if no row names it. Any other exception leaves it too: the next
        # catch-up (or boot) indexes it as this import, like after a kill.
        with trio.CancelScope(shield=True):
            if not await landed(ctx, staged):
                await ctx.io(undo, staged)
        raise
    if not result["created"]:  # another import of the key won the race: it wrote the session, not us
        await ctx.io(undo, staged)
        ctx.forget_session()
        return result
    row = await ctx.catch_up()
    if row is not None:
        ctx.publish("session.created", {"session": index.public_session(row)})
    return result


IMPORT_SESSION = SessionOp(_import_in_actor, mutating=True, name="plugins.importSession", ready_check=False)


def list_sessions(ctx: ReadContext, p: m.PluginListSessionsParams) -> Any:
    plugin = require_plugin(ctx.caller, "plugins.listSessions")
    return list_plugin_sessions(ctx.conn, plugin, source_id=p.source_id, include_trashed=p.include_trashed,
                                limit=p.limit).result("sessions")
