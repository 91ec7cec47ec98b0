"""``sessions.trash`` / ``restore`` / ``purge`` / ``listTrashed`` (seed 003 §4.5, §11.20).

Trash is the ``sessions.deleted_at`` host timestamp: a trashed session is hidden
from ``session.list``, plugin reads and search, while its transcript, rows and
origin stay, so ``restore`` brings it back exactly. ``purge`` (only from the
trash) removes it for good with the delete protocol: the ``.deleting`` marker
carrying the receipt → rows (cascades: messages, origin...) → files, marker
last; boot finishes a purge a crash interrupted and restores its receipt.
All three run in the session's actor (serialized with its writes). A plugin
caller (the routes are open to plugins) reaches only the sessions it imported:
the store checks the owner in the transaction (``store/trash.py``, ``plugin_id``).
"""

from __future__ import annotations

from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from runtime.context import ReadContext
from runtime.handlers.sessions import remove_session
from store import queue
from store.receipts import ReceiptKey
from store.trash import check_purgeable, list_trashed, purge_rows, restore_session, trash_session

__all__ = ["list_trash", "purge", "restore", "trash"]


async def trash(ctx: SessionContext, p: m.TrashParams, key: ReceiptKey | None) -> Any:
    sid, now, plugin = ctx.sid, ctx.now(), ctx.caller.plugin_id
    result = await ctx.commit(lambda conn: {"session": trash_session(conn, sid, now_ms=now, plugin_id=plugin)},
                              reload_row=True)
    ctx.publish("session.updated", result)
    return result


async def restore(ctx: SessionContext, p: m.TrashParams, key: ReceiptKey | None) -> Any:
    sid, plugin = ctx.sid, ctx.caller.plugin_id
    result = await ctx.commit(lambda conn: {"session": restore_session(conn, sid, plugin_id=plugin)},
                              reload_row=True)
    ctx.publish("session.updated", result)
    return result


async def purge(ctx: SessionContext, p: m.TrashParams, key: ReceiptKey | None) -> Any:
    """Refused unless trashed (before any file is touched); then marker → rows → files
    (``runtime/handlers/sessions.remove_session``, as ``session.delete``)."""
    sid, plugin, now = ctx.sid, ctx.caller.plugin_id, ctx.now()
    await ctx.read(lambda conn: check_purgeable(conn, sid, plugin_id=plugin))

    def op(conn: Any) -> Any:
        out = purge_rows(conn, sid, now_ms=now, plugin_id=plugin)
        queue.forget_session(conn, sid)
        return out

    return await remove_session(ctx, key, op, points="purge")


def list_trash(ctx: ReadContext, p: m.ListTrashedParams) -> Any:
    return {"sessions": list_trashed(ctx.conn, plugin_id=ctx.caller.plugin_id, limit=p.limit)}
