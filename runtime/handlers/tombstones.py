"""``session.deleteMessage`` / ``restoreMessage``: a reversible tombstone line (seed 000 §3.3).

One ``tombstone`` line (write + fsync) through ``ctx.append_lines``, whose index
op sets ``messages.deleted`` and moves the mark, reply last. A message only an archived
branch holds (a regenerate or edit moved it to the revisions file) is tombstoned on that
branch's ``revision`` line instead, with the request's receipt (``revisions.set_archived_deleted``): activating the
branch brings it back deleted; no ``session.message`` event (it is in no transcript).
Asking for the state a message already has writes nothing. The line is authoritative (a tail catch-up re-applies it);
only a receipt needs a durable commit.
"""

from __future__ import annotations

from typing import Any

from actors.session_context import Lines, SessionContext
from protocol import models as m
from runtime.handlers.revisions import set_archived_deleted
from store.errors import MessageNotFound
from store.ids import new_id
from store.indexing import index
from store.receipts import ReceiptKey, file_record
from store.tombstones import line_id, message_state, tombstone_line

__all__ = ["delete_message", "restore_message"]


async def delete_message(ctx: SessionContext, p: m.MessageIdParams, key: ReceiptKey | None) -> Any:
    return await _set_deleted(ctx, p, True)


async def restore_message(ctx: SessionContext, p: m.MessageIdParams, key: ReceiptKey | None) -> Any:
    return await _set_deleted(ctx, p, False)


async def _set_deleted(ctx: SessionContext, p: m.MessageIdParams, deleted: bool) -> Any:
    sid = ctx.sid
    stored = await ctx.read(index.resolve_id, sid, p.message_id)
    state = await ctx.read(message_state, sid, stored) if stored is not None else None
    result = {"messageId": p.message_id, "deleted": deleted}
    if stored is None or state is None:
        # not in the transcript: a message of a branch a regenerate or edit archived
        if not await set_archived_deleted(ctx, p.message_id, deleted):
            raise MessageNotFound(f"message {p.message_id} is not in session {sid}",
                                  data={"sessionId": sid, "messageId": p.message_id})
        return await ctx.commit(lambda conn: result) if ctx.receipt is not None else result
    now = ctx.now()
    if state["deleted"] == deleted:
        return await ctx.commit(lambda conn: result) if ctx.receipt is not None else result
    target = await ctx.read(line_id, ctx.paths.transcript, sid, stored) if stored.startswith(f"{sid}:") else stored
    carried = file_record(ctx.receipt, messageId=p.message_id) if ctx.receipt is not None else None
    line = tombstone_line(new_id("t"), target, deleted, created_at_ms=now, receipt=carried)
    # the line's index op flips ``messages.deleted`` (a tail catch-up would re-apply it the same way)
    result = (await ctx.append_lines(Lines([line]), then=lambda conn, refs: result, durable=False)).value
    ctx.publish("session.message", {"message": state["ref"], "deleted": deleted})
    return result
