"""Session-actor side of in-flight checkpoints (D299, D327) and the steering rule.

Runs inside the session actor, so a checkpoint save, the final append of the
same message and a turn end are serialized: a late checkpoint for an id that
is already indexed as a settled row is dropped, while an indexed row that is
still ``status: streaming`` (a steering reservation) keeps accepting
checkpoints, including an empty reservation, so crash recovery can settle it.

The checkpoint's message id is cached in ``actor.feature_state`` (only this
actor and boot write the file; boot runs before any actor exists).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.session import SessionActor
from actors.session_msgs import Custom
from store import index, inflight, turns
from store.errors import Conflict, CorruptData, InvalidInput, IOFailure, NotFound
from store.records import is_streaming, normalize_message
from store.transcript import read_spans

_KEY = "inflight.messageId"
_UNKNOWN = object()


async def cached_checkpoint_id(actor: SessionActor) -> str | None:
    cached = actor.feature_state.get(_KEY, _UNKNOWN)
    if cached is None or isinstance(cached, str):
        return cached
    found = await actor.io(inflight.checkpoint_message_id, actor.deps.data_dir.inflight(actor.sid))
    actor.feature_state[_KEY] = found
    return found


async def remove(actor: SessionActor) -> bool:
    actor.feature_state[_KEY] = _UNKNOWN
    removed = await actor.io(inflight.remove_checkpoint, actor.deps.data_dir.inflight(actor.sid))
    actor.feature_state[_KEY] = None
    return bool(removed)


async def indexed_state(actor: SessionActor, message_id: str) -> inflight.IndexedState:
    """What the index holds for ``message_id`` in this session: absent / streaming / settled."""
    found = (await actor.read(index.lookup_ids, [message_id])).get(message_id)
    if found is None or found[0] != actor.sid:
        return "absent"
    try:
        blob = (await actor.io(read_spans, actor.path, [(found[2], found[3])]))[0]
    except (CorruptData, IOFailure, NotFound):
        actor.needs_catchup = True
        raise
    return inflight.line_state(blob)


async def save_inflight(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    await actor.ensure_ready()
    p = req.params
    turn_id = str(p["turnId"])
    status = await actor.read(turns.turn_status, turn_id)
    if status is None or status[2] != actor.sid:
        raise NotFound(f"turn {turn_id} not found in session {actor.sid}",
                       data={"sessionId": actor.sid, "turnId": turn_id})
    if status[0] == "aborted" and status[1] == turns.INTERRUPTED:
        raise Conflict(f"turn {turn_id} was interrupted by a host restart; its checkpoints are stale",
                       data={"turnId": turn_id, "status": status[0]})
    rec = normalize_message(p["message"], now_ms=actor.now(), turn_id=turn_id)
    if rec.get("role") != "assistant":
        raise InvalidInput("only an assistant reply can be checkpointed", data={"field": "message.role"})
    owner = (await actor.read(index.lookup_ids, [rec["id"]])).get(rec["id"])
    if owner is not None and owner[0] != actor.sid:
        # the append path remaps an id owned by another session (D444); the checkpoint follows it
        rec = {**rec, "id": inflight.remapped_id(actor.sid, rec["id"])}
    state = await indexed_state(actor, rec["id"])
    result: dict[str, Any]
    if state == "settled":
        result = {"saved": False, "reason": "already_indexed"}
    elif state == "absent" and not inflight.has_visible_content(rec):
        result = {"saved": False, "reason": "empty"}
    else:
        path = actor.deps.data_dir.inflight(actor.sid)
        actor.feature_state[_KEY] = _UNKNOWN  # unknown until the replace is known to have happened
        saved_at = actor.now()
        await actor.io(lambda: inflight.write_checkpoint(path, actor.sid, turn_id, saved_at, rec,
                                                         faults=actor.deps.faults))
        actor.feature_state[_KEY] = rec["id"]
        result = {"saved": True}
    if req.receipt is not None:
        now = actor.now()
        await actor.db(lambda conn: SessionActor.store_receipt(conn, req.receipt, result, actor.sid, now))
    return result


async def after_append(actor: SessionActor, req: Custom) -> None:
    """``__after_append__`` hook: the final (non-streaming) row of the checkpointed id removes it."""
    records: Sequence[Mapping[str, Any]] = req.params.get("records", ())
    cid = await cached_checkpoint_id(actor)
    if cid is None:
        return
    last = None
    for rec in records:
        if rec.get("id") == cid:
            last = rec
    if last is not None and not is_streaming(last):
        await remove(actor)


async def settle_on_turn_end(actor: SessionActor) -> bool:
    """completed/error turn end (D327): remove the checkpoint only if its id is indexed as settled."""
    cid = await cached_checkpoint_id(actor)
    if cid is None:
        return False
    if await indexed_state(actor, cid) != "settled":
        return False  # left for the outbox's final append or the boot sweep
    return await remove(actor)
