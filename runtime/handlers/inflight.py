"""In-flight checkpoints of a streaming reply (D299, D327) and the steering rule.

Runs inside the session actor, so a checkpoint save, the final append of the
same message and a turn end are serialized: a late checkpoint for an id that
is already indexed as a settled row is dropped, while an indexed row that is
still ``status: streaming`` (a steering reservation) keeps accepting
checkpoints, including an empty reservation, so crash recovery can settle it.

The checkpoint's message id is memoized in ``ctx.cache`` (only this actor and
boot write the file; boot runs before any actor exists).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from store import index, inflight, turns
from store.errors import Conflict, InvalidInput, NotFound
from store.receipts import ReceiptKey
from store.records import is_streaming, normalize_message
from store.transcript import read_spans

__all__ = ["after_append", "save", "settle_on_turn_end"]

_KEY = "inflight.messageId"
LIVE_TOPIC = "session.inflight"  # one event per saved checkpoint: the partial reply so far
_UNKNOWN = object()


async def cached_checkpoint_id(ctx: SessionContext) -> str | None:
    cached = ctx.cache.get(_KEY, _UNKNOWN)
    if cached is None or isinstance(cached, str):
        return cached
    found = await ctx.io(inflight.checkpoint_message_id, ctx.paths.inflight)
    ctx.cache[_KEY] = found
    return found


async def remove(ctx: SessionContext) -> bool:
    ctx.cache[_KEY] = _UNKNOWN
    removed = await ctx.io(inflight.remove_checkpoint, ctx.paths.inflight)
    ctx.cache[_KEY] = None
    return bool(removed)


async def indexed_state(ctx: SessionContext, message_id: str) -> inflight.IndexedState:
    """What the index holds for ``message_id`` in this session: absent / streaming / settled."""
    found = (await ctx.read(index.lookup_ids, [message_id])).get(message_id)
    if found is None or found[0] != ctx.sid:
        return "absent"
    blob = (await ctx.io(read_spans, ctx.paths.transcript, [(found[2], found[3])]))[0]
    return inflight.line_state(blob)


async def save(ctx: SessionContext, p: m.SaveInflightParams, key: ReceiptKey | None) -> Any:
    turn_id = p.turn_id
    status = await ctx.read(turns.turn_status, turn_id)
    if status is None or status[2] != ctx.sid:
        raise NotFound(f"turn {turn_id} not found in session {ctx.sid}",
                       data={"sessionId": ctx.sid, "turnId": turn_id})
    if status[0] == "aborted" and status[1] == turns.INTERRUPTED:
        raise Conflict(f"turn {turn_id} was interrupted by a host restart; its checkpoints are stale",
                       data={"turnId": turn_id, "status": status[0]})
    raw = p.message.model_dump(by_alias=True, exclude_unset=True)
    rec = normalize_message(raw, now_ms=ctx.now(), turn_id=turn_id)
    if rec.get("role") != "assistant":
        raise InvalidInput("only an assistant reply can be checkpointed", data={"field": "message.role"})
    owner = (await ctx.read(index.lookup_ids, [rec["id"]])).get(rec["id"])
    if owner is not None and owner[0] != ctx.sid:
        # the append path remaps an id owned by another session (D444); the checkpoint follows it
        rec = {**rec, "id": inflight.remapped_id(ctx.sid, rec["id"])}
    state = await indexed_state(ctx, rec["id"])
    result: dict[str, Any]
    live: dict[str, Any] | None = None
    if state == "settled":
        result = {"saved": False, "reason": "already_indexed"}
    elif state == "absent" and not inflight.has_visible_content(rec):
        result = {"saved": False, "reason": "empty"}
    else:
        path, sid, faults = ctx.paths.inflight, ctx.sid, ctx.faults
        ctx.cache[_KEY] = _UNKNOWN  # unknown until the replace is known to have happened
        saved_at = ctx.now()
        await ctx.io(lambda: inflight.write_checkpoint(path, sid, turn_id, saved_at, rec, faults=faults))
        ctx.cache[_KEY] = rec["id"]
        result = {"saved": True}
        live = {"turnId": turn_id, "message": rec, "savedAt": saved_at}
    if key is not None:
        # The checkpoint file is the effect (rewriting it is idempotent); the receipt is a row.
        result = await ctx.commit(lambda conn: result)
    if live is not None:
        ctx.publish(LIVE_TOPIC, live)
    return result


async def after_append(ctx: SessionContext, records: Sequence[Mapping[str, Any]]) -> None:
    """The final (non-streaming) row of the checkpointed id removes the checkpoint."""
    cid = await cached_checkpoint_id(ctx)
    if cid is None:
        return
    last = None
    for rec in records:
        if rec.get("id") == cid:
            last = rec
    if last is not None and not is_streaming(last):
        await remove(ctx)


async def settle_on_turn_end(ctx: SessionContext) -> bool:
    """completed/error turn end (D327): remove the checkpoint only if its id is indexed as settled."""
    cid = await cached_checkpoint_id(ctx)
    if cid is None:
        return False
    if await indexed_state(ctx, cid) != "settled":
        return False  # left for the outbox's final append or the boot sweep
    return await remove(ctx)
