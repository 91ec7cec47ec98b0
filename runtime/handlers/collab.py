"""``collab.*``: the session collaboration ledger (seed 003 §4.6c; rules in ``store/collab.py``).

Every mutation is routed to the *target* session's actor (a delivery changes the
target's queue and transcript): ``collab.deliver`` by ``targetSessionId``,
``collab.begin`` / ``collab.settle`` by ``sessionId`` (the target), and
``collab.cancel`` by the target its delivery names. A settlement's callback
admits a completion into the *source*'s queue in the same transaction (queue
rows are DB-only state, serialized by the DB writer).

``collab.begin`` writes the input line itself — a user row whose
``meta.sessionMessage`` is the delivery's provenance (``UiMessage.sessionMessage``)
— line first, then its index row with the ledger change and the receipt
(``runtime/handlers/host_lines.py``). The line's id is derived from the
delivery, so a begin after a crash finds it: the line is the proof that its
turn began the delivery. A retry of that begin (the same delivery and turn,
with or without its ``submissionId``) records what the ledger lacks and
answers what the first try answered; a begin from another turn records it too
and is ``CONFLICT``. Never a second line, never a second begin.

Events after each commit: ``collab.delivery`` (with the target's and with the
source's session id) and ``session.queue`` for every queue that changed.
"""

from __future__ import annotations

from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from runtime.context import ReadContext, Services
from runtime.handlers.host_lines import append_record
from runtime.handlers.queue import QueueControl, publish_deliveries, queue_state
from store import collab
from store.collab import Changed
from store.errors import Conflict, IdempotencyConflict
from store.ids import new_id
from store.indexing import cursors, index
from store.jsonio import loads_line
from store.receipts import ReceiptKey, file_record
from store.transcripts.records import meta_of, ms_to_rfc3339
from store.transcripts.transcript import read_header, read_spans

__all__ = ["begin", "cancel", "cancel_target", "deliver", "deliver_target", "get", "list_deliveries", "publish",
           "settle", "settle_for_turn"]


async def deliver_target(services: Services, p: m.CollabDeliverParams, key: ReceiptKey | None) -> str:
    return p.target_session_id


def _created_at(conn: Any, session_id: str) -> Any:
    row = conn.execute("SELECT created_at FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return row[0] if row else None


def _queue_owners(conn: Any, changed: Changed) -> dict[str, Any]:
    """Each changed queue's session ``created_at`` (the controller book is keyed by it)."""
    return {sid: _created_at(conn, sid) for sid in changed.queues}


def publish(ctx: SessionContext, changed: Changed, owners: dict[str, Any]) -> None:
    """After the commit: the deliveries to both ends, the queues that changed."""
    publish_deliveries(ctx, changed.deliveries)
    control: QueueControl = ctx.services.get("queue")
    for sid, entries in changed.queues.items():
        slot = control.slot(sid, owners.get(sid))
        ctx.publish("session.queue", {**queue_state(slot, entries), "sessionId": sid}, session_id=sid)


async def deliver(ctx: SessionContext, p: m.CollabDeliverParams, key: ReceiptKey | None) -> Any:
    now, faults = ctx.now(), ctx.faults
    # derived from the idempotency triple: a retry after the database was lost finds its input line
    delivery_id, entry_id = collab.delivery_ids(p.plugin_id, p.source_session_id, p.idempotency_key)
    began = await _began_without_row(ctx, delivery_id, p.content, key)
    if began is not None:
        return await ctx.commit(lambda conn: began) if key is not None else began
    effects: list[tuple[Changed, dict[str, Any]]] = []

    def op(conn: Any) -> dict[str, Any]:
        row, replayed, changed = collab.deliver(
            conn, delivery_id=delivery_id, entry_id=entry_id, plugin_id=p.plugin_id,
            source_session_id=p.source_session_id, target_session_id=ctx.sid, kind=p.kind, content=p.content,
            notify_on_completion=p.notify_on_completion, idempotency_key=p.idempotency_key,
            remaining_hops=p.remaining_hops, permission_ceiling=p.permission_ceiling, now_ms=now, faults=faults)
        effects.append((changed, _queue_owners(conn, changed)))
        out: dict[str, Any] = {"delivery": row, "replayed": replayed}
        entries = changed.queues.get(ctx.sid, ())
        entry = next((e for e in entries if e.session_message_id == row["id"]), None)
        if entry is not None:
            out["entry"] = entry.to_wire()
        if not replayed:  # until its begin's input line carries it (collab.DELIVERED_META)
            carried: dict[str, Any] = {"response": out}
            if key is not None:
                carried["receipt"] = file_record(key, response=out)
            collab.keep_delivered(conn, delivery_id, carried, now)
        return out

    result = await ctx.commit(op)
    publish(ctx, *effects[0])
    return result


async def _began_without_row(ctx: SessionContext, delivery_id: str, content: str,
                             key: ReceiptKey | None) -> dict[str, Any] | None:
    """A retry of a delivery whose ledger row a lost database took, while its input line (it began) is in
    the target's transcript: answered from the line (what the first deliver answered, ``replayed``), never
    delivered again. A rewrite that dropped the line since (cut, or archived by an edit) left what it carried
    in the transcript's header (``store.transcripts.rewrite.carried_delivered``): answered from there
    (:func:`collab.answer_from_header`: the keyed call's first answer, else ``replayed``). ``None``: no such
    line nor header entry, or the row is there (the ledger answers)."""
    mid = collab.input_message_id(delivery_id)
    hit = (await ctx.read(index.lookup_ids, [mid])).get(mid)
    entry: dict[str, Any] | None = None
    if hit is None:
        header = await ctx.io(read_header, ctx.paths.transcript)
        entry = next((d for d in header.delivered if d["deliveryId"] == delivery_id), None)
    if (hit is None and entry is None) or await ctx.read(collab.has_row, delivery_id):
        return None
    if entry is not None:
        return collab.answer_from_header(entry, content, key)
    assert hit is not None
    if hit[0] != ctx.sid:  # the key's delivery began in another target: not this request's
        raise IdempotencyConflict(f"idempotencyKey of delivery {delivery_id} was already used for a delivery to "
                                  "another session", data={"deliveryId": delivery_id, "differs": ["target"]})
    blob = (await ctx.io(read_spans, ctx.paths.transcript, [(hit[2], hit[3])]))[0]
    carried = meta_of(loads_line(blob)).get(collab.DELIVERED_META)
    said = carried.get("response") if isinstance(carried, dict) else None
    if not isinstance(said, dict) or not isinstance(said.get("delivery"), dict):
        raise Conflict(f"delivery {delivery_id} began (its input line is in the transcript) and its ledger "
                       "record was lost: it is not delivered again", data={"deliveryId": delivery_id})
    return {"delivery": said["delivery"], "replayed": True}


async def begin(ctx: SessionContext, p: m.CollabBeginParams, key: ReceiptKey | None) -> Any:
    """queued → running in the target's turn, and the input row with its provenance."""
    sid, now, faults = ctx.sid, ctx.now(), ctx.faults
    mid = collab.input_message_id(p.delivery_id)
    held = (await ctx.read(index.message_refs, [mid])).get(mid)
    landed = held if held is not None and held["sessionId"] == sid else None
    began = landed.get("turnId") if landed is not None else None
    # (a rebuilt index knows no turn: its rows hold no turn id, the line does)
    if landed is not None and began in (p.turn_id, None) and not await ctx.read(collab.has_row, p.delivery_id):
        answered = await _begun_without_row(ctx, p.delivery_id, p.turn_id, landed)
        if answered is not None:
            return await ctx.commit(lambda conn: answered) if key is not None else answered
    if isinstance(began, str) and began != p.turn_id:  # its line landed in another turn: that turn began it
        await _bind_landed(ctx, p.delivery_id, began)
    row, how = await ctx.read(collab.check_begin, p.delivery_id, sid, p.turn_id, landed)  # refused before any write
    effects: list[tuple[Changed, dict[str, Any]]] = []

    def respond(conn: Any, ref: dict[str, Any] | None) -> dict[str, Any]:
        started, changed = collab.begin(conn, p.delivery_id, sid, p.turn_id, now,
                                        landed=None if how == "new" else ref, faults=faults)
        effects.append((changed, _queue_owners(conn, changed)))
        return {"delivery": started, "message": ref}

    if how != "new":  # the line is there (or the begin is): only the ledger is left, if anything
        result = await ctx.commit(lambda conn: respond(conn, landed))
    else:
        meta: dict[str, Any] = {"sessionMessage": collab.provenance(row)}
        delivered = await ctx.read(collab.delivered_record, p.delivery_id)
        if delivered is not None:  # the line carries what the deliver answered (a lost database keeps it)
            meta[collab.DELIVERED_META] = delivered
        record = {"type": "message", "id": mid, "role": "user", "createdAt": ms_to_rfc3339(now),
                  "turnId": p.turn_id, "blocks": [{"type": "text", "text": row["content"]}], "meta": meta}

        def begun(conn: Any, ref: dict[str, Any]) -> dict[str, Any]:
            collab.forget_delivered(conn, p.delivery_id)
            return respond(conn, ref)

        result, _ = await append_record(ctx, record, begun)
    publish(ctx, *effects[0])
    return result


async def _begun_without_row(ctx: SessionContext, delivery_id: str, turn_id: str,
                             landed: dict[str, Any]) -> dict[str, Any] | None:
    """A retry of a begin whose ledger row a lost database took, while its input line (written in ``turn_id``)
    stands: answered as the first try was (:func:`collab.as_begun` of the delivery the line's deliver answer
    holds, running in ``turn_id`` since the line's time, and the line's ref), never written again. ``None``: the
    line is another turn's, or carries no deliver answer (the row is gone: nothing to answer with)."""
    mid = collab.input_message_id(delivery_id)
    hit = (await ctx.read(index.lookup_ids, [mid])).get(mid)
    if hit is None or hit[0] != ctx.sid:
        return None
    rec = loads_line((await ctx.io(read_spans, ctx.paths.transcript, [(hit[2], hit[3])]))[0])
    carried = meta_of(rec).get(collab.DELIVERED_META)
    said = carried.get("response") if isinstance(carried, dict) else None
    delivery = said.get("delivery") if isinstance(said, dict) else None
    if rec.get("turnId") != turn_id or not isinstance(delivery, dict) or delivery.get("id") != delivery_id:
        return None
    return {"delivery": collab.as_begun(delivery, turn_id, int(landed["createdAt"])),
            "message": {**landed, "turnId": turn_id}}


async def _bind_landed(ctx: SessionContext, delivery_id: str, turn_id: str) -> None:
    """Record the begin an input line in ``turn_id`` proves, whose commit never came (its own transaction:
    the begin asking now is refused after it)."""
    sid, now, faults = ctx.sid, ctx.now(), ctx.faults

    def op(conn: Any) -> tuple[Changed, dict[str, Any]]:
        changed = collab.bind_landed(conn, delivery_id, sid, turn_id, now, faults=faults)
        return changed, _queue_owners(conn, changed)

    publish(ctx, *await ctx.db(op))


async def settle(ctx: SessionContext, p: m.CollabSettleParams, key: ReceiptKey | None) -> Any:
    sid, now, faults = ctx.sid, ctx.now(), ctx.faults
    callback_id, entry_id = new_id("col_"), "q_" + new_id()
    effects: list[tuple[Changed, dict[str, Any]]] = []

    def op(conn: Any) -> dict[str, Any]:
        row, changed = collab.settle(conn, p.delivery_id, sid, turn_id=p.turn_id, status=p.status, result=p.result,
                                     error=p.error, callback_id=callback_id, entry_id=entry_id, now_ms=now,
                                     faults=faults)
        effects.append((changed, _queue_owners(conn, changed)))
        out: dict[str, Any] = {"delivery": row}
        callback = row.get("callbackId")
        if callback is not None:
            out["callback"] = collab.get(conn, callback)
        return out

    result = await ctx.commit(op)
    publish(ctx, *effects[0])
    return result


def settle_for_turn(conn: Any, sid: str, turn_id: str, status: str, error_code: str | None, now: int,
                    faults: Any) -> tuple[Changed, dict[str, Any]]:
    """Inside a turn end's transaction: the delivery that turn was running ends with it."""
    changed = collab.settle_for_turn(conn, sid, turn_id, status, error_code,
                                     new_ids=lambda: (new_id("col_"), "q_" + new_id()), now_ms=now, faults=faults)
    return changed, _queue_owners(conn, changed)


async def cancel_target(services: Services, p: m.CollabCancelParams, key: ReceiptKey | None) -> str:
    row = await services.reads.run(collab.get, p.delivery_id)
    return str(row["target"]["sessionId"])


async def cancel(ctx: SessionContext, p: m.CollabCancelParams, key: ReceiptKey | None) -> Any:
    sid, now, faults = ctx.sid, ctx.now(), ctx.faults
    effects: list[tuple[Changed, dict[str, Any]]] = []

    def op(conn: Any) -> dict[str, Any]:
        row, changed = collab.cancel(conn, p.delivery_id, sid, now_ms=now, faults=faults)
        effects.append((changed, _queue_owners(conn, changed)))
        return {"delivery": row}

    result = await ctx.commit(op)
    publish(ctx, *effects[0])
    return result


def list_deliveries(ctx: ReadContext, p: m.CollabListParams) -> Any:
    fp = cursors.query_fingerprint("collab.list", p.session_id, p.direction, p.status)
    before = cursors.decode_cursor(p.cursor, "collab", fp, (int, str)) if p.cursor else None
    found, nxt = collab.list_deliveries(ctx.conn, session_id=p.session_id, direction=p.direction, status=p.status,
                                        limit=p.limit, before=(before[0], before[1]) if before else None)
    return found.result("deliveries", nextCursor=cursors.encode_cursor("collab", fp, list(nxt)) if nxt else None)


def get(ctx: ReadContext, p: m.CollabGetParams) -> Any:
    return collab.get(ctx.conn, p.delivery_id, checked=True)

