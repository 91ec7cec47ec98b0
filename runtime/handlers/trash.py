"""``sessions.trash`` / ``restore`` / ``purge`` / ``listTrashed`` (seed 003 §4.5, §11.20).

Trash is the ``sessions.deleted_at`` host timestamp: a trashed session is hidden
from ``session.list``, plugin reads and search, while its transcript, rows and
origin stay, so ``restore`` brings it back exactly. ``trash`` and ``restore``
write it into the transcript first (a ``session_info`` line with ``trashedAt``,
the call's receipt riding in it), then the row in the line's commit: a rebuilt
index keeps the trash (``store/trash.py``). ``purge`` (only from the
trash) removes it for good with the delete protocol: the ``.deleting`` marker
carrying the receipt → rows (cascades: messages, origin...) → files, marker
last; boot finishes a purge a crash interrupted and restores its receipt.
All three run in the session's actor (serialized with its writes). A plugin
caller (the routes are open to plugins) reaches only the sessions it imported:
the store checks the owner in the transaction (``store/trash.py``, ``plugin_id``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from runtime.context import ReadContext
from runtime.handlers.sessions import remove_session
from store import queue
from store.indexing import index
from store.receipts import ReceiptKey
from store.trash import (
    TRASHED_AT,
    check_purgeable,
    check_scope,
    list_trashed,
    purge_rows,
    restore_session,
    trash_session,
    trash_time,
)

__all__ = ["list_trash", "purge", "restore", "trash"]


async def trash(ctx: SessionContext, p: m.TrashParams, key: ReceiptKey | None) -> Any:
    sid, now, plugin = ctx.sid, ctx.now(), ctx.caller.plugin_id
    row, stamp = await ctx.read(lambda conn: (check_scope(conn, sid, plugin), trash_time(conn, now)))
    if row["deletedAt"] is not None:  # trashed already: keeps its first time, and nothing is written
        return await _as_it_is(ctx, key, row)
    return await _write_state(ctx, stamp,
                              lambda conn: {"session": trash_session(conn, sid, now_ms=stamp, plugin_id=plugin)})


async def restore(ctx: SessionContext, p: m.TrashParams, key: ReceiptKey | None) -> Any:
    sid, plugin = ctx.sid, ctx.caller.plugin_id
    row = await ctx.read(lambda conn: check_scope(conn, sid, plugin))
    if row["deletedAt"] is None:  # not in the trash: nothing to bring back, nothing is written
        return await _as_it_is(ctx, key, row)
    return await _write_state(ctx, None, lambda conn: {"session": restore_session(conn, sid, plugin_id=plugin)})


async def _as_it_is(ctx: SessionContext, key: ReceiptKey | None, row: dict[str, Any]) -> Any:
    """A trash or restore that finds the session in the state it asks for: the session as it is (``row``), no
    line and no event. Keyed, its receipt is a database row only (there is no effect for it to ride with,
    ARCHITECTURE "Receipts ride with their effect"): a retry is answered with it, a restart included."""
    answer = {"session": index.public_session(row)}
    return await ctx.commit(lambda conn: answer) if key is not None else answer


async def _write_state(ctx: SessionContext, at: int | None, rows: Callable[[Any], Any]) -> Any:
    """The trash state (``at``: its time, None: restored) as a ``session_info`` line, then ``rows(conn)`` in
    the line's commit (its value the answer; the caller was checked before the line was written). The
    receipt in the line carries the time, so an answer rebuilt from it is the one given."""
    result = await ctx.append_info({**ctx.settings(), TRASHED_AT: at}, lambda conn, refs: rows(conn), touch=False,
                                   receipt_extra={TRASHED_AT: at})
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
