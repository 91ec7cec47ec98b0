"""``session.appendCompaction``: a model-context checkpoint line (seed 003 §2.1).

The line is authoritative (boot rebuilds the ``compactions`` row from it); only
a receipt needs a durable commit.
"""

from __future__ import annotations

from typing import Any

from actors.session_context import Lines, SessionContext
from protocol import models as m
from store.compaction import normalize_compaction, normalize_on_read
from store.errors import Conflict, InvalidInput, MessageNotFound
from store.indexing import index
from store.jsonio import dumps_line, loads_line
from store.receipts import ReceiptKey
from store.transcripts.records import wire_record
from store.transcripts.transcript import read_spans

__all__ = ["append_compaction"]


async def append_compaction(ctx: SessionContext, p: m.AppendCompactionParams, key: ReceiptKey | None) -> Any:
    sid = ctx.sid
    rec = normalize_compaction(p.compaction.model_dump(by_alias=True, exclude_unset=True), now_ms=ctx.now())
    for name in ("throughMessageId", "firstKeptMessageId"):
        anchor = rec.get(name)
        if anchor is None:
            continue
        stored = await ctx.read(index.resolve_id, sid, anchor)
        if stored is None:
            raise MessageNotFound(f"compaction {name} {anchor} is not in session {sid}",
                                  data={"sessionId": sid, "messageId": anchor})
        rec[name] = stored
    first_kept = rec.get("firstKeptMessageId")
    if first_kept is not None and first_kept != rec["throughMessageId"]:
        through_at = await ctx.read(index.position_of, sid, rec["throughMessageId"])
        first_at = await ctx.read(index.position_of, sid, first_kept)
        if through_at is not None and first_at is not None and first_at > through_at + 1:
            # seed 003 §2.1: the summary covers what comes before the first kept message and throughMessageId
            # is the durable boundary; keeping from further past it would leave the messages between neither
            # summarized nor kept (the message right after the boundary keeps from there: nothing lost)
            raise InvalidInput(
                f"compaction firstKeptMessageId {first_kept} comes after the message following its "
                f"throughMessageId {rec['throughMessageId']} in session {sid}: the messages between would be "
                "neither summarized nor kept", data={"sessionId": sid, "field": "compaction.firstKeptMessageId"})
    if await ctx.read(index.resolve_id, sid, rec["id"]) is not None:
        # one id, two things: session.context would list it twice, and a delete of the message would
        # silently end the checkpoint
        raise Conflict(f"compaction id {rec['id']} is a message id of session {sid}: a checkpoint needs an id "
                       "of its own", data={"sessionId": sid, "compactionId": rec["id"], "field": "compaction.id"})
    existing = await ctx.read(index.compaction_span, sid, rec["id"])
    if existing is not None:
        stored_rec = loads_line((await ctx.io(read_spans, ctx.paths.transcript, [existing]))[0])
        if ({k: v for k, v in stored_rec.items() if k != "createdAt"}
                != {k: v for k, v in rec.items() if k != "createdAt"}):
            raise Conflict(f"compaction {rec['id']} already exists with different content",
                           data={"sessionId": sid, "compactionId": rec["id"]})
        result = {"compaction": wire_record(normalize_on_read(stored_rec))}
        return await ctx.commit(lambda conn: result) if key is not None else result
    line = dumps_line(rec)
    result = {"compaction": wire_record(normalize_on_read(rec))}
    # the line's index op records the ``compactions`` row
    return (await ctx.append_lines(Lines([line], records=[rec]), then=lambda conn, refs: result,
                                   durable=False)).value
