"""Session-actor handlers for the host-owned turn queue (seed 003 §4.6b).

Queue rows are DB-only state: every change is one durable DB-writer op
(``synchronous=FULL``) holding the queue change and its command receipt.

Who drives a queue is in-memory state: the controller (the Agent Host
sidecar) that attached in *this host process*. It lives in a
:class:`QueueControl` book made once per host by :func:`queue_handlers`, not
in the actor, so an idle session actor that passivates, or one that crashes
and restarts, keeps its controller; a host restart starts every queue
``held`` again until a controller attaches. ``actor.feature_state["queue"]``
points at the session's :class:`ControllerSlot` in that book.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from actors.session import SessionActor
from actors.session_msgs import Custom
from store import queue
from store.errors import Conflict, InvalidInput
from store.ids import new_id

FEATURE_KEY = "queue"
TOPIC = "session.queue"
CONTROLLER_KIND = "agent"

KIND_PUSH = "queue.push"
KIND_LIST = "queue.list"
KIND_REMOVE = "queue.remove"
KIND_PRIORITIZE = "queue.prioritize"
KIND_REORDER = "queue.reorder"
KIND_ATTACH = "queue.attach"
KIND_TAKE = "queue.take"

Handler = Callable[[SessionActor, Custom], Awaitable[Any]]


@dataclass
class ControllerSlot:
    session_created_at: Any = None  # a deleted and re-created session id starts held again
    controller_id: str | None = None

    @property
    def held(self) -> bool:
        return self.controller_id is None


class QueueControl:
    """Per-host book of queue controllers (one slot per session that was asked about)."""

    def __init__(self) -> None:
        self._slots: dict[str, ControllerSlot] = {}

    def slot(self, session_id: str, session_created_at: Any) -> ControllerSlot:
        found = self._slots.get(session_id)
        if found is None or found.session_created_at != session_created_at:
            found = self._slots[session_id] = ControllerSlot(session_created_at)
        return found


def _slot(control: QueueControl, actor: SessionActor) -> ControllerSlot:
    """The session's controller slot (call after ``actor.ensure_ready()``)."""
    slot = control.slot(actor.sid, (actor.row or {}).get("createdAt"))
    actor.feature_state[FEATURE_KEY] = slot
    return slot


def queue_state(slot: ControllerSlot, entries: tuple[queue.Entry, ...]) -> dict[str, Any]:
    """The ``QueueState`` wire shape."""
    state: dict[str, Any] = {"entries": [e.to_wire() for e in entries], "held": slot.held}
    if slot.controller_id is not None:
        state["controllerId"] = slot.controller_id
    return state


def _publish(actor: SessionActor, state: Mapping[str, Any]) -> None:
    actor.publish(TOPIC, {**state, "sessionId": actor.sid})


def _param(req: Custom, name: str) -> Any:
    value = req.params.get(name)
    if value is None:
        raise InvalidInput(f"{name} is required", data={"field": name})
    return value


# ---------------------------------------------------------------------- handlers


async def handle_push(control: QueueControl, actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    await actor.ensure_ready()
    slot = _slot(control, actor)
    p = req.params
    attachments = p.get("attachments") or ()
    if not isinstance(attachments, (list, tuple)):
        raise InvalidInput("attachments must be a list", data={"field": "attachments"})
    inp = queue.PushInput(
        principal=_param(req, "principal"),
        content=_param(req, "content"),
        permission_mode=_param(req, "permissionMode"),
        idempotency_key=p.get("idempotencyKey"),
        attachments=tuple(attachments),
        session_message_id=p.get("sessionMessageId"),
    )
    entry_id = "q_" + new_id()
    now = actor.now()
    sid = actor.sid
    faults = actor.deps.faults

    def op(conn: Any) -> tuple[dict[str, Any], queue.Outcome]:
        out = queue.push(conn, sid, inp, new_id=entry_id, now_ms=now, faults=faults)
        assert out.plan.entry is not None
        result = {"entry": out.plan.entry.to_wire(), "replayed": out.plan.replayed}
        SessionActor.store_receipt(conn, req.receipt, result, sid, now)
        return result, out

    result, out = await actor.db(op, durable=True)
    if out.plan.changed:
        _publish(actor, queue_state(slot, out.entries))
    return result


async def handle_list(control: QueueControl, actor: SessionActor, req: Custom) -> Any:
    await actor.ensure_ready()
    slot = _slot(control, actor)
    entries = await actor.read(queue.list_entries, actor.sid)
    return queue_state(slot, entries)


async def _edit(
    control: QueueControl,
    actor: SessionActor,
    req: Custom,
    run: Callable[[Any, str, int], queue.Outcome],
) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    await actor.ensure_ready()
    slot = _slot(control, actor)
    now = actor.now()
    sid = actor.sid

    def op(conn: Any) -> tuple[dict[str, Any], bool]:
        out = run(conn, sid, now)
        state = queue_state(slot, out.entries)
        SessionActor.store_receipt(conn, req.receipt, state, sid, now)
        return state, out.plan.changed

    state, changed = await actor.db(op, durable=True)
    if changed:
        _publish(actor, state)
    return state


async def handle_remove(control: QueueControl, actor: SessionActor, req: Custom) -> Any:
    entry_id = _param(req, "entryId")
    faults = actor.deps.faults
    return await _edit(control, actor, req,
                       lambda conn, sid, now: queue.remove(conn, sid, entry_id, now_ms=now, faults=faults))


async def handle_prioritize(control: QueueControl, actor: SessionActor, req: Custom) -> Any:
    entry_id = _param(req, "entryId")
    faults = actor.deps.faults
    return await _edit(control, actor, req,
                       lambda conn, sid, now: queue.prioritize(conn, sid, entry_id, now_ms=now, faults=faults))


async def handle_reorder(control: QueueControl, actor: SessionActor, req: Custom) -> Any:
    entry_id = _param(req, "entryId")
    direction = _param(req, "direction")
    faults = actor.deps.faults
    return await _edit(
        control, actor, req,
        lambda conn, sid, now: queue.reorder(conn, sid, entry_id, direction, now_ms=now, faults=faults),
    )


async def handle_attach(control: QueueControl, actor: SessionActor, req: Custom) -> Any:
    """Become the controller (the last attach wins); releases a held queue.

    Deliberately not receipt-replayed: the controller is in-memory state, so a
    stored answer from before a restart would claim an attachment that no
    longer exists. Attaching twice is harmless.
    """
    controller_id = _param(req, "controllerId")
    kind = req.params.get("clientKind")
    if kind != CONTROLLER_KIND:
        raise Conflict(
            f"only a sidecar connected with clientKind {CONTROLLER_KIND!r} may control a session queue "
            f"(this connection is {kind!r})",
            data={"sessionId": actor.sid, "clientKind": kind},
        )
    await actor.ensure_ready()
    slot = _slot(control, actor)
    changed = slot.controller_id != controller_id
    slot.controller_id = controller_id
    entries = await actor.read(queue.list_entries, actor.sid)
    state = queue_state(slot, entries)
    if changed:
        _publish(actor, state)
    return state


async def handle_take(control: QueueControl, actor: SessionActor, req: Custom) -> Any:
    """Hand out the next entry, removing it in the same transaction as its receipt.

    Nothing while the queue is held or a turn is running (``reason`` says
    which); a caller that is not the attached controller gets CONFLICT.
    """
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    controller_id = _param(req, "controllerId")
    await actor.ensure_ready()
    slot = _slot(control, actor)
    if slot.held:
        return {"entry": None, "reason": "held"}
    if slot.controller_id != controller_id:
        raise Conflict(
            f"{controller_id} is not the queue controller of session {actor.sid} "
            f"(the controller is {slot.controller_id})",
            data={"sessionId": actor.sid, "controllerId": controller_id},
        )
    now = actor.now()
    sid = actor.sid
    faults = actor.deps.faults

    def op(conn: Any) -> tuple[dict[str, Any], queue.Outcome | None]:
        if queue.has_running_turn(conn, sid):
            return {"entry": None, "reason": "turnRunning"}, None
        out = queue.take(conn, sid, now_ms=now, faults=faults)
        if out.plan.entry is None:
            return {"entry": None, "reason": "empty"}, None
        result = {"entry": out.plan.entry.to_wire()}
        SessionActor.store_receipt(conn, req.receipt, result, sid, now)
        return result, out

    result, out = await actor.db(op, durable=True)
    if out is not None:
        _publish(actor, queue_state(slot, out.entries))
    return result


def queue_handlers(control: QueueControl | None = None) -> dict[str, Handler]:
    """``Custom.kind`` → handler, all sharing one per-host :class:`QueueControl`."""
    book = control if control is not None else QueueControl()
    return {
        KIND_PUSH: partial(handle_push, book),
        KIND_LIST: partial(handle_list, book),
        KIND_REMOVE: partial(handle_remove, book),
        KIND_PRIORITIZE: partial(handle_prioritize, book),
        KIND_REORDER: partial(handle_reorder, book),
        KIND_ATTACH: partial(handle_attach, book),
        KIND_TAKE: partial(handle_take, book),
    }
