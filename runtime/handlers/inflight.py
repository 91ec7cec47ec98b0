"""In-flight checkpoints of a streaming reply (D299, D327) and the steering rule.

Runs inside the session actor, so a checkpoint save, the final append of the
same message and a turn end are serialized: a late checkpoint for an id that
is already indexed as a settled row is dropped, while an indexed row that is
still ``status: streaming`` (a steering reservation) keeps accepting
checkpoints, including an empty reservation, so crash recovery can settle it.

The checkpoint's message id is memoized in ``ctx.cache`` (only this actor and
boot write the file; boot runs before any actor exists).

Live replies: every saved checkpoint is offered to subscribers as a
*transient* ``session.inflight`` event (``actors/events.py``: coalescing per
message, throttled per subscriber, never replayed; the final ``session.message``
of the same id drops a pending one), and ``session.get`` returns the current
checkpoint after the newest window (:func:`current`), so a UI that connects or
reloads mid-reply shows the partial text. ``session.recoverInflight`` settles a
checkpoint when the sidecar is gone, with the boot sweep's own decision
(``store.inflight.plan_settlement``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.events import Event
from actors.session_context import CarriedAnswer, SessionContext
from protocol import models as m
from runtime.handlers import queue, turn_aftermath
from runtime.handlers.host_lines import append_record
from store import inflight, turns
from store.attachments import mark_evicted_blocks
from store.errors import Conflict, CorruptData, InvalidInput
from store.indexing import appends as store_appends
from store.indexing import index
from store.indexing.appends import Written
from store.indexing.backlog import Backlog
from store.jsonio import dumps_line, loads_line
from store.receipts import ReceiptKey, file_record
from store.transcripts.records import cap_content, is_streaming, normalize_message, wire_record, with_receipt
from store.transcripts.transcript import read_spans

__all__ = ["PREVIEW_TEXT_MAX", "TOPIC", "AfterAppend", "current", "event_key", "learned_checkpoint_id", "recover",
           "recover_replayed", "save", "settle_on_turn_end", "supersedes"]

_KEY = "inflight.messageId"
_UNKNOWN = object()
TOPIC = "session.inflight"
PREVIEW_TEXT_MAX = 32_768
"""Characters per block a ``session.inflight`` preview carries (``session.get`` has the whole reply)."""


def event_key(session_id: str, message_id: str) -> str:
    """The coalescing key of a message's previews."""
    return f"{session_id}/{message_id}"


def supersedes(event: Event) -> str | None:
    """A ``session.message`` event of a message drops that message's pending preview (bus hook)."""
    if event.topic != "session.message" or event.session_id is None:
        return None
    message = event.data.get("message")
    mid = message.get("id") if isinstance(message, Mapping) else None
    return event_key(event.session_id, mid) if isinstance(mid, str) else None


def _projection(session_id: str, turn_id: str, saved_at: int, rec: Mapping[str, Any],
                content_limit: int | None) -> dict[str, Any]:
    """The ``InflightMessage`` wire shape (event payload and ``session.get`` ``inflight``)."""
    message = cap_content(wire_record(rec), content_limit)
    return {"sessionId": session_id, "turnId": turn_id, "savedAt": saved_at,
            "message": {**message, "inflight": True}}


def _is_delegate(rec: Mapping[str, Any]) -> bool:
    """A subagent's reply (seed §4.7a attribution in ``meta``): the parent's checkpoint is its own reply."""
    meta = rec.get("meta")
    return isinstance(meta, Mapping) and bool(meta.get("parentToolCallId") or meta.get("agentName"))


def learned_checkpoint_id(ctx: SessionContext, found: str | None) -> None:
    """What :func:`inflight.checkpoint_message_id` just read for this session, in a hop the
    caller made anyway (a first read looks with its window): no hop of its own later. Only this
    session's actor writes or removes its checkpoint, so the value holds until it does."""
    ctx.cache[_KEY] = found


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


async def settle_ended_turns_leftover(ctx: SessionContext, turn_id: str) -> None:
    """Before turn ``turn_id``'s reply can replace the session's one checkpoint file, settle a checkpoint
    an ended turn left there as the boot sweep would (seed 003 §2.1, D327): a completed/error turn end keeps
    a checkpoint whose final row never landed for the outbox or boot, and the next turn's first checkpoint
    used to overwrite it, losing that reply. Promoted (``completed`` when its turn completed, else
    ``aborted`` + ``interrupted``; a final arriving later replaces the promoted row), removed when its final
    landed meanwhile, quarantined when unreadable. ``turn_id``'s own checkpoint, and one of a turn that may
    still be running (a damaged status), are left alone. Never the calling write's effect (a start, a
    checkpoint): the promotion's commit stores no receipt, the caller's own commit stores the caller's."""
    ctx = ctx.without_receipt()
    if await cached_checkpoint_id(ctx) is None:
        return
    paths, sid, now = ctx.paths, ctx.sid, ctx.now()
    settlement = await ctx.io_with_reader(inflight.plan_settlement, sid, paths.inflight, paths.transcript)
    cp = settlement.checkpoint
    if cp is not None:
        if cp.turn_id == turn_id:
            return
        status = await ctx.read(turns.turn_status, cp.turn_id)
        if status is not None and status[2] == sid and status[0] not in turns.TERMINAL:
            return
    if settlement.action == "promote":
        record = settlement.record
        assert record is not None

        def promote(conn: Any, ref: dict[str, Any]) -> dict[str, Any]:
            inflight.record_promotion(conn, sid, settlement, now, reason="nextTurn")
            return ref

        await append_record(ctx, record, promote)
        await remove(ctx)
    elif settlement.action == "quarantine":
        await ctx.io(inflight.quarantine_checkpoint, paths.inflight, ctx.services.data_dir.quarantine_dir, now)
        ctx.cache[_KEY] = None
    elif settlement.action == "remove":
        await remove(ctx)


async def save(ctx: SessionContext, p: m.SaveInflightParams, key: ReceiptKey | None) -> Any:
    ctx.refuse_if_storage_failed()  # RELIABILITY rule 7: a checkpoint is a write of the session's storage
    turn_id = p.turn_id
    status = await ctx.read(turns.turn_status, turn_id)
    if status is None or status[2] != ctx.sid:
        raise turns.turn_not_found(ctx.sid, turn_id)
    if status[0] == "aborted" and status[1] == turns.INTERRUPTED:
        raise Conflict(f"turn {turn_id} was interrupted by a host restart; its checkpoints are stale",
                       data={"turnId": turn_id, "status": status[0]})
    if status[0] != "running":
        # Only the running turn's reply streams: a checkpoint under an ended turn is stale, and would
        # replace the running turn's checkpoint (the session's one file).
        raise Conflict(f"turn {turn_id} already ended ({status[0]}); only a running turn's reply is checkpointed",
                       data={"turnId": turn_id, "status": status[0]})
    raw = p.message.model_dump(by_alias=True, exclude_unset=True)
    rec = normalize_message(raw, now_ms=ctx.now(), turn_id=turn_id)
    if rec.get("role") != "assistant":
        raise InvalidInput("only an assistant reply can be checkpointed", data={"field": "message.role"})
    spelled = inflight.remapped_id(ctx.sid, rec["id"])
    found = await ctx.read(index.lookup_ids, [rec["id"], spelled])
    owner, remapped = found.get(rec["id"]), found.get(spelled)
    if (owner is not None and owner[0] != ctx.sid) or (owner is None and remapped is not None
                                                        and remapped[0] == ctx.sid):
        # the append path remaps an id owned by another session, and keeps to the remapped row once
        # that session's row is gone (D444; store.indexing.appends): the checkpoint follows it
        rec = {**rec, "id": spelled}
    state = await indexed_state(ctx, rec["id"])
    saved_at = ctx.now()
    result: dict[str, Any]
    if _is_delegate(rec):
        result = {"saved": False, "reason": "delegate"}  # seed §2.1: delegate replies are not checkpointed
    elif state == "settled":
        result = {"saved": False, "reason": "already_indexed"}
    elif state == "absent" and not inflight.has_visible_content(rec):
        result = {"saved": False, "reason": "empty"}
    else:
        if await cached_checkpoint_id(ctx) != rec["id"]:
            await settle_ended_turns_leftover(ctx, turn_id)  # never replaced unsettled (startTurn did it first)
        path, sid, faults = ctx.paths.inflight, ctx.sid, ctx.faults
        ctx.cache[_KEY] = _UNKNOWN  # unknown until the replace is known to have happened
        await ctx.io(lambda: inflight.write_checkpoint(path, sid, turn_id, saved_at, rec, faults=faults))
        ctx.cache[_KEY] = rec["id"]
        result = {"saved": True}
    if key is not None:
        # The checkpoint file is the effect (rewriting it is idempotent); the receipt is a row.
        result = await ctx.commit(lambda conn: result)
    if result["saved"]:
        ctx.services.bus.publish_transient(TOPIC, _projection(ctx.sid, turn_id, saved_at, rec, PREVIEW_TEXT_MAX),
                                           key=event_key(ctx.sid, rec["id"]), session_id=ctx.sid)
    return result


class AfterAppend:
    """The final (non-streaming) row of the checkpointed id removes the checkpoint.

    Runs in the append's own worker-thread hop, right after its lines are durable
    (``SessionContext.append_lines(after_write=...)``): no hop and no handler call of its own on
    the append path. Built on the trio thread from the per-incarnation memo; :meth:`remember`
    stores what it found there afterwards.
    """

    __slots__ = ("_path", "_cached", "found")

    def __init__(self, ctx: SessionContext) -> None:
        self._path = ctx.paths.inflight
        self._cached = ctx.cache.get(_KEY, _UNKNOWN)
        self.found: object = self._cached

    def __call__(self, records: Sequence[Mapping[str, Any]]) -> None:  # worker thread
        cached = self._cached
        cid = cached if cached is None or isinstance(cached, str) else inflight.checkpoint_message_id(self._path)
        self.found = cid
        if cid is None:
            return
        last = None
        for rec in records:
            if rec.get("id") == cid:
                last = rec
        if last is not None and not is_streaming(last):
            self.found = _UNKNOWN  # until the removal returned
            inflight.remove_checkpoint(self._path)
            self.found = None

    def remember(self, ctx: SessionContext) -> None:
        ctx.cache[_KEY] = self.found


async def settle_on_turn_end(ctx: SessionContext) -> bool:
    """completed/error turn end (D327): remove the checkpoint only if its id is indexed as settled."""
    cid = await cached_checkpoint_id(ctx)
    if cid is None:
        return False
    if await indexed_state(ctx, cid) != "settled":
        return False  # left for the outbox's final append or the boot sweep
    return await remove(ctx)


async def current(ctx: SessionContext, content_limit: int | None) -> dict[str, Any] | None:
    """The reply streaming right now (its checkpoint), unless its final row already landed."""
    if await cached_checkpoint_id(ctx) is None:
        return None
    try:
        cp = await ctx.io(inflight.read_checkpoint, ctx.paths.inflight)
    except CorruptData:
        return None
    if cp is None or cp.session_id != ctx.sid:
        return None
    if await indexed_state(ctx, cp.message_id) == "settled":
        return None  # stale: the final row landed (the next final append or turn end removes it)
    # a block whose blob was evicted reads back marked, as the transcript's do (seed 000 §2.3)
    return await ctx.read(mark_evicted_blocks, _projection(ctx.sid, cp.turn_id, cp.saved_at, cp.message,
                                                           content_limit))


async def recover(ctx: SessionContext, p: m.RecoverInflightParams, key: ReceiptKey | None) -> Any:
    """``session.recoverInflight``: the sidecar that streamed into this session is gone.

    The leftover checkpoint is settled exactly as the boot sweep would
    (``store.inflight.plan_settlement``): promoted as ``completed`` when its
    turn completed, otherwise as ``aborted`` + ``interrupted`` under its turn;
    removed when its final row landed; quarantined when unreadable. With no checkpoint on disk, the
    named turn's streaming reservation (a row still ``meta.status: "streaming"``, whose checkpoint never
    came) is settled the same way from its own content (``store.inflight.plan_reservation``), as boot's
    ``settle_reservations`` would. A turn
    still ``running`` ends ``aborted`` (``SIDECAR_LOST``) in the same
    transaction as the promoted line's index row, with what a turn end settles:
    its pending requests are cancelled, the plan execution and the delivery it
    was running end (``cancelled`` / ``failed``). Idempotent by construction:
    a retry finds no checkpoint (or its id settled) and changes nothing more;
    the receipt row rides in that transaction.

    A ``turnId`` of another session's turn, or one nothing here knows (no row, no checkpoint, no
    reservation), is ``NOT_FOUND``, as ``session.endTurn`` answers it, and changes nothing.
    """
    paths, sid, now = ctx.paths, ctx.sid, ctx.now()
    owner = await ctx.read(turns.turn_status, p.turn_id) if p.turn_id is not None else None
    if owner is not None and owner[2] != sid:  # another session's turn: as session.endTurn answers it
        raise turns.turn_not_found(sid, p.turn_id)
    settlement = await ctx.io_with_reader(inflight.plan_settlement, sid, paths.inflight, paths.transcript)
    cp = settlement.checkpoint
    if p.turn_id is not None and cp is not None and cp.turn_id != p.turn_id:
        raise Conflict(f"the checkpoint of session {sid} belongs to turn {cp.turn_id}, not {p.turn_id}",
                       data={"sessionId": sid, "turnId": cp.turn_id})
    turn_id = p.turn_id or (cp.turn_id if cp is not None else None)
    source = "checkpoint"
    if settlement.action == "none" and p.turn_id is not None:
        # no checkpoint: a streaming reservation of the turn is settled from its own row, as boot would
        settlement = await ctx.io_with_reader(inflight.plan_reservation, sid, paths.transcript, p.turn_id)
        source = "reservation"
        if settlement.action == "none" and owner is None:
            # a turn no row and no line of this session knows: nothing to recover, as endTurn says
            raise turns.turn_not_found(sid, p.turn_id)
    ended: list[dict[str, Any]] = []
    aftermath: list[turn_aftermath.Aftermath] = []

    def end_turn(conn: Any, dry: bool = False) -> dict[str, Any] | None:
        if turn_id is None:
            return None
        status = turns.turn_status(conn, turn_id)
        if status is None or status[2] != sid:
            return None
        if status[0] not in turns.TERMINAL:  # running, or a damaged status (it may be running): ended here
            out = turns.end_turn(conn, session_id=sid, turn_id=turn_id, status="aborted",
                                 error_code=SIDECAR_LOST, usage=None, create_notification=False, now_ms=now)
            if dry:  # a rolled-back run asking what the commit answers: nothing to settle or publish
                return out.turn
            ended.append(out.turn)
            aftermath.append(turn_aftermath.settle(conn, sid, [turn_id], "aborted", SIDECAR_LOST, now, ctx.faults))
            return out.turn
        return turns.get_turn(conn, turn_id)

    def answer(action: str, turn: dict[str, Any] | None, ref: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {"action": action}
        if turn is not None:
            out["turn"] = {k: v for k, v in turn.items() if v is not None}
        if ref is not None:
            out["message"] = ref
        return out

    promoted = await _promoted_line(ctx, settlement) if settlement.action == "remove" else None
    if settlement.action == "promote":
        rec = settlement.record
        assert rec is not None
        said: dict[str, Any] | None = None
        if key is not None:
            # keyed: the promoted line carries the receipt with the answer, asked of a rolled-back run before
            # the line is written (the checkpoint goes after it: a retry after the database was lost finds
            # none, and is answered with it)
            draft, start = dumps_line(dict(rec)), ctx.file_len
            written = Written(sid, paths.transcript, start, start + len(draft), ctx.epoch, [draft], [rec])

            def predicted(conn: Any, refs: list[dict[str, Any]]) -> dict[str, Any]:
                return answer("promoted", end_turn(conn, dry=True), refs[0])

            said = await ctx.db(lambda conn: store_appends.message_answer(conn, written, predicted, now_ms=now),
                                durable=False, backlogs=(Backlog(sid, paths.transcript, now, stop=start),))
            rec = with_receipt(dict(rec), file_record(key, response=said))
        carried = CarriedAnswer(said)

        def promote(conn: Any, ref: dict[str, Any]) -> dict[str, Any]:
            inflight.record_promotion(conn, sid, settlement, now, reason="recoverInflight", source=source)
            return carried.give(answer("promoted", end_turn(conn), ref))

        result, _ = await append_record(ctx, rec, promote)
        carried.check(ctx.method)
        await remove(ctx)
    elif promoted is not None:
        # an earlier try wrote the promoted line and failed before its commit: that promotion, finished
        line, ref = promoted

        def finish(conn: Any) -> dict[str, Any]:
            inflight.record_promotion(conn, sid, inflight.Settlement("promote", settlement.checkpoint, line), now,
                                      reason="recoverInflight")
            return answer("promoted", end_turn(conn), ref)

        result = await ctx.commit(finish)
        await remove(ctx)
    else:
        if settlement.action == "quarantine":
            quarantine_dir = ctx.services.data_dir.quarantine_dir
            await ctx.io(inflight.quarantine_checkpoint, paths.inflight, quarantine_dir, now)
            ctx.cache[_KEY] = None
        elif settlement.action == "remove":
            await remove(ctx)
        result = await ctx.commit(lambda conn: answer(
            {"none": "none", "remove": "removed", "quarantine": "quarantined"}[settlement.action],
            end_turn(conn), None))
    if ended:
        ctx.publish("turn.ended", {"turn": result["turn"]})
        if aftermath:
            turn_aftermath.publish(ctx, aftermath[-1])
        await queue.after_turn_end(ctx)
    return result


async def recover_replayed(ctx: SessionContext, p: m.RecoverInflightParams, key: ReceiptKey | None) -> None:
    """A keyed retry answered from its receipt: a checkpoint its first try settled but left on disk
    (a failure after the commit, before the removal) goes now, not at the next boot."""
    settlement = await ctx.io_with_reader(inflight.plan_settlement, ctx.sid, ctx.paths.inflight,
                                          ctx.paths.transcript)
    if settlement.action == "remove":
        await remove(ctx)


async def _promoted_line(ctx: SessionContext, settlement: inflight.Settlement
                         ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The settled line of a checkpoint still on disk, with its MessageRef, when that line is the
    checkpoint's own promotion (``meta.recoveredFrom``, not a final the sidecar appended) whose commit
    did not take place (no audit record of it)."""
    cp = settlement.checkpoint
    assert cp is not None
    found = (await ctx.read(index.lookup_ids, [cp.message_id])).get(cp.message_id)
    if found is None or found[0] != ctx.sid or await ctx.read(inflight.promotion_recorded, ctx.sid, cp.message_id):
        return None
    line = loads_line((await ctx.io(read_spans, ctx.paths.transcript, [(found[2], found[3])]))[0])
    meta = line.get("meta")
    if not isinstance(meta, Mapping) or meta.get("recoveredFrom") != "inflight":
        return None
    return line, (await ctx.read(index.message_refs, [cp.message_id]))[cp.message_id]


SIDECAR_LOST = "SIDECAR_LOST"
