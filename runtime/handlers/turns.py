"""Turns: ``session.startTurn`` (with its run environment snapshot), ``endTurn``, ``turnEnvironment``.

Start and end are DB-only writes inside the session actor (one durable commit
holding the effect and the receipt); a new turn first settles a checkpoint an
ended turn left behind, as boot would (its reply lands before this turn's). ``endTurn`` settles the turn and, for
completed/error, inserts the notification and prunes to 200 in that same
transaction; afterwards a completed/error end removes the in-flight
checkpoint when its id is already indexed as a settled row (D327). A turn's
end cancels the approvals and interactions it still had pending, and ends a plan
execution or a collaboration delivery it was running that it did not settle itself.
"""

from __future__ import annotations

import logging
from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from runtime.context import ReadContext
from runtime.handlers import inflight, queue, turn_aftermath
from store import bindings, turns
from store.errors import InvalidInput, StoreError
from store.ids import new_id, remapped_message_id
from store.indexing import index
from store.jsonio import loads_line
from store.receipts import ReceiptKey
from store.snapshots import bind_input, load_snapshot, prepare_input, prepare_snapshot
from store.transcripts.transcript import read_spans

__all__ = ["end_turn", "start_turn", "turn_environment", "verify_environment"]

log = logging.getLogger("pi_host")


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


async def start_turn(ctx: SessionContext, p: m.StartTurnParams, key: ReceiptKey | None) -> Any:
    # Every field, defaults included, nothing dropped: this is what gets digested.
    env = p.environment.model_dump(mode="json", by_alias=True) if p.environment is not None else None
    # The size limit measures the snapshot as sent, not the defaults filled in for what it left out.
    sent = (p.environment.model_dump(mode="json", by_alias=True, exclude_unset=True)
            if p.environment is not None else None)
    snapshot = prepare_snapshot(env, sent=sent) if env is not None else None
    if p.input is not None and snapshot is None:
        raise InvalidInput("input is bound to an environment snapshot: give `environment` too",
                           data={"field": "input"})
    bound = prepare_input(p.input.message_id, [dict(b) for b in p.input.blocks]) if p.input is not None else None
    turn_id = p.turn_id or new_id("t_")
    now, sid, client = ctx.now(), ctx.sid, ctx.caller.client_id
    created: list[bool] = []

    def op(conn: Any) -> dict[str, Any]:
        turn, was_created = turns.start_turn(conn, session_id=sid, turn_id=turn_id, provider_id=p.provider_id,
                                             model_id=p.model_id, snapshot=snapshot, now_ms=now,
                                             retry_of=p.retry_of, client_id=client)
        if bound is not None:
            bind_input(conn, turn_id, bound)
        created.append(was_created)
        return _clean(turn)

    result = await ctx.commit(op)
    if created and created[0]:
        ctx.publish("turn.started", {"turn": result})
        # the reply an ended turn left in the checkpoint file lands before this turn's can replace it; the
        # turn is started whatever happens here (a failure leaves it to this turn's first checkpoint, or boot)
        try:
            await inflight.settle_ended_turns_leftover(ctx, turn_id)
        except StoreError as exc:
            log.warning("turn %s of session %s started; the checkpoint an ended turn left is not settled yet: %s",
                        turn_id, sid, exc)
    return result


async def end_turn(ctx: SessionContext, p: m.EndTurnParams, key: ReceiptKey | None) -> Any:
    usage = p.usage.model_dump(by_alias=True, exclude_unset=True) if p.usage is not None else None
    now, sid = ctx.now(), ctx.sid
    changed: list[bool] = []
    aftermath: list[turn_aftermath.Aftermath] = []
    faults = ctx.faults

    def op(conn: Any) -> dict[str, Any]:
        outcome = turns.end_turn(conn, session_id=sid, turn_id=p.turn_id, status=p.status,
                                 error_code=p.error_code, usage=usage,
                                 create_notification=p.create_notification, now_ms=now)
        changed.append(outcome.changed)
        if outcome.changed:  # what the turn still asked or ran ends with it
            aftermath.append(turn_aftermath.settle(conn, sid, [p.turn_id], p.status, p.error_code, now, faults))
        result: dict[str, Any] = {"turn": _clean(outcome.turn)}
        if outcome.notification is not None:
            result["notification"] = _clean(outcome.notification)
        return result

    result = await ctx.commit(op)
    if p.status in ("completed", "error"):
        await inflight.settle_on_turn_end(ctx)
    if changed and changed[-1]:
        ctx.publish("turn.ended", result)
        if "notification" in result:
            ctx.publish("notification.created", {"notification": result["notification"]})
        if aftermath:
            turn_aftermath.publish(ctx, aftermath[-1])
        await queue.after_turn_end(ctx)
    return result


def turn_environment(ctx: ReadContext, p: m.TurnEnvironmentParams) -> Any:
    turns.require_turn_exists(ctx.conn, p.turn_id)
    return load_snapshot(ctx.conn, p.turn_id)


async def verify_environment(ctx: SessionContext, p: m.VerifyEnvironmentParams, key: ReceiptKey | None) -> Any:
    """Recovery's gate (seed 000 §4): the snapshot's bindings against the current state (``store/bindings.py``),
    the bound input against the transcript's message of that id. In the session actor: no write of this
    session moves the lines it reads."""
    sid, path = ctx.sid, ctx.paths.transcript

    def check(conn: Any) -> Any:
        def record(message_id: str) -> dict[str, Any] | None:
            for mid in (message_id, remapped_message_id(sid, message_id)):  # as sent, or its D444 spelling
                hit = index.lookup_ids(conn, [mid]).get(mid)
                if hit is not None and hit[0] == sid:
                    return loads_line(read_spans(path, [(hit[2], hit[3])])[0])
            return None

        return bindings.verify(conn, sid, p.turn_id, input_record=record)

    return await ctx.read(check)
