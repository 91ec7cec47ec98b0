"""Session-actor handlers for turns: start (with run environment snapshot) and end.

Both are DB-only writes (durable commit) with the command receipt in the same
transaction. ``endTurn`` settles the turn, and for completed/error inserts the
notification and prunes to 200 in that transaction; afterwards a
completed/error end removes the in-flight checkpoint when its id is already
indexed as a settled row (D327). ``aborted`` never touches the checkpoint.
"""

from __future__ import annotations

from typing import Any

from actors.session import SessionActor
from actors.session_inflight import settle_on_turn_end
from actors.session_msgs import Custom
from store import turns
from store.ids import new_id
from store.snapshots import prepare_snapshot


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


async def start_turn(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    await actor.ensure_ready()
    p = req.params
    env = p.get("environment")
    snapshot = prepare_snapshot(env) if env is not None else None
    turn_id = p.get("turnId") or new_id("t_")
    now = actor.now()

    def op(conn: Any) -> tuple[dict[str, Any], bool]:
        turn, created = turns.start_turn(
            conn, session_id=actor.sid, turn_id=turn_id, provider_id=p.get("providerId"),
            model_id=p.get("modelId"), snapshot=snapshot, now_ms=now,
        )
        result = _clean(turn)
        SessionActor.store_receipt(conn, req.receipt, result, actor.sid, now)
        return result, created

    result, created = await actor.db(op, durable=True)
    if created:
        actor.publish("turn.started", {"turn": result})
    return result


async def end_turn(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    await actor.ensure_ready()
    p = req.params
    status = str(p["status"])
    now = actor.now()

    def op(conn: Any) -> tuple[dict[str, Any], bool]:
        outcome = turns.end_turn(
            conn, session_id=actor.sid, turn_id=str(p["turnId"]), status=status,
            error_code=p.get("errorCode"), usage=p.get("usage"),
            create_notification=bool(p.get("createNotification", True)), now_ms=now,
        )
        result: dict[str, Any] = {"turn": _clean(outcome.turn)}
        if outcome.notification is not None:
            result["notification"] = _clean(outcome.notification)
        SessionActor.store_receipt(conn, req.receipt, result, actor.sid, now)
        return result, outcome.changed

    result, changed = await actor.db(op, durable=True)
    if status in ("completed", "error"):
        await settle_on_turn_end(actor)
    if changed:
        actor.publish("turn.ended", result)
        if "notification" in result:
            actor.publish("notification.created", {"notification": result["notification"]})
    return result
