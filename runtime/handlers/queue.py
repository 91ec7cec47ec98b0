"""The host-owned turn queue (seed 003 §4.6b): ``session.queue*``.

Queue rows are DB-only state: every change is one durable commit holding the
queue change and its command receipt (``store/queue.py`` plans each change
purely, load → plan → apply).

Who drives a queue is in-memory state: the controller (the agent sidecar)
that attached in *this host process*. It lives in a :class:`QueueControl`
book made once per host (``Services.extra["queue"]``), not in the actor, so
an idle session actor that passivates, or one that crashes and restarts,
keeps its controller; a host restart starts every queue ``held`` again until
a controller attaches.

A push into a Plan/Goal session while a task run bound to it is ``running`` is
``PLAN_REQUIRES_INTERACTIVE_SESSION`` (seed 003 §4.11, §11.19), checked in the
push's own transaction before the queue is touched, as ``session.startTurn``
and ``plans.submit`` refuse it (``store.tasks.require_interactive``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from store import collab, queue, tasks
from store.attachments import mark_evicted_blocks
from store.errors import Conflict
from store.receipts import ReceiptKey

__all__ = ["QueueControl", "after_turn_end", "attach", "list_queue", "prioritize", "publish_deliveries", "push",
           "read_state", "remove", "reorder", "take"]

SERVICE = "queue"
TOPIC = "session.queue"
CONTROLLER_KIND = "agent"


@dataclass
class ControllerSlot:
    session_created_at: Any = None  # a deleted and re-created session id starts held again
    controller_id: str | None = None
    client_id: str | None = None  # the client that attached the controller

    @property
    def held(self) -> bool:
        return self.controller_id is None


class QueueControl:
    """Per-host book of queue controllers: one slot per session whose queue a controller drives. A held
    queue needs no slot (its state is the default), so reading or pushing to a queue leaves nothing
    behind, and a slot goes when its controller's client does: the book never grows with the sessions
    merely touched over the host's life."""

    def __init__(self) -> None:
        self._slots: dict[str, ControllerSlot] = {}

    def slot(self, session_id: str, session_created_at: Any) -> ControllerSlot:
        """The session's slot: the stored one (a controller attached), or a fresh held one, not stored."""
        found = self._slots.get(session_id)
        if found is None or found.session_created_at != session_created_at:
            self._slots.pop(session_id, None)  # a deleted and re-created session id starts held again
            return ControllerSlot(session_created_at)
        return found

    def attach(self, session_id: str, session_created_at: Any, controller_id: str,
               client_id: str) -> ControllerSlot:
        """``controller_id`` (of ``client_id``) drives the session's queue from now on; its slot."""
        found = self.slot(session_id, session_created_at)
        found.controller_id, found.client_id = controller_id, client_id
        self._slots[session_id] = found
        return found

    def forget(self, session_id: str) -> None:
        self._slots.pop(session_id, None)

    def release_client(self, client_id: str) -> list[str]:
        """The client that attached these sessions' controller is gone: they are held again (until a
        controller attaches, as after a restart). The sessions released."""
        released = []
        for sid, slot in list(self._slots.items()):
            if slot.controller_id is not None and slot.client_id == client_id:
                slot.controller_id = slot.client_id = None
                del self._slots[sid]
                released.append(sid)
        return sorted(released)

    def peek(self, session_id: str) -> ControllerSlot:
        """The session's slot as it is (a held one when nobody asked), without making one."""
        return self._slots.get(session_id) or ControllerSlot()

    def statistics(self) -> dict[str, int]:
        return {"controlled": len(self._slots)}


def _slot(ctx: SessionContext) -> ControllerSlot:
    control: QueueControl = ctx.services.get(SERVICE)
    return control.slot(ctx.sid, ctx.row.get("createdAt"))


def queue_state(slot: ControllerSlot, entries: tuple[queue.Entry, ...],
                unreadable: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``QueueState`` wire shape; ``unreadable``: the ids of the damaged rows (absent when none)."""
    state: dict[str, Any] = {"entries": [e.to_wire() for e in entries], "held": slot.held}
    if slot.controller_id is not None:
        state["controllerId"] = slot.controller_id
    if unreadable:
        state["unreadable"] = list(unreadable)
    return state


def read_state(conn: Any, slot: ControllerSlot, sid: str) -> dict[str, Any]:
    """The session's ``QueueState`` as stored now (an evicted attachment's blob marked, seed 000 §2.3)."""
    rows = queue.read_rows(conn, sid)
    return mark_evicted_blocks(conn, queue_state(slot, rows.entries, rows.unreadable))


def _publish(ctx: SessionContext, state: Mapping[str, Any]) -> None:
    ctx.publish(TOPIC, {**state, "sessionId": ctx.sid})


async def push(ctx: SessionContext, p: m.QueuePushParams, key: ReceiptKey | None) -> Any:
    slot = _slot(ctx)
    inp = queue.PushInput(
        principal=p.principal,
        content=p.content,
        permission_mode=p.permission_mode,
        idempotency_key=p.idempotency_key,
        attachments=tuple(p.attachments or ()),
        session_message_id=p.session_message_id,
    )
    entry_id = queue.new_entry_id()
    now, sid, faults, mode = ctx.now(), ctx.sid, ctx.faults, ctx.row.get("mode")
    outcome: list[queue.Outcome] = []
    states: list[dict[str, Any]] = []

    def op(conn: Any) -> dict[str, Any]:
        # The mode changes only through this session's actor; a run starts/ends outside it: read in this snapshot.
        tasks.require_interactive(conn, sid, mode, work="queue a prompt")
        out = queue.push(conn, sid, inp, new_id=entry_id, now_ms=now, faults=faults)
        assert out.plan.entry is not None
        outcome.append(out)
        states.append(mark_evicted_blocks(conn, queue_state(slot, out.entries, out.unreadable)))
        return {"entry": mark_evicted_blocks(conn, out.plan.entry.to_wire()), "replayed": out.plan.replayed}

    result = await ctx.commit(op)
    if outcome[0].plan.changed:
        _publish(ctx, states[0])
    return result


async def list_queue(ctx: SessionContext, p: m.QueueListParams, key: ReceiptKey | None) -> Any:
    slot = _slot(ctx)

    return await ctx.read(lambda conn, sid: read_state(conn, slot, sid), ctx.sid)


async def _edit(ctx: SessionContext, run: Callable[[Any, str, int], queue.Outcome]) -> Any:
    slot = _slot(ctx)
    now, sid = ctx.now(), ctx.sid
    changed: list[bool] = []

    def op(conn: Any) -> dict[str, Any]:
        out = run(conn, sid, now)
        changed.append(out.plan.changed)
        return mark_evicted_blocks(conn, queue_state(slot, out.entries, out.unreadable))

    state = await ctx.commit(op)
    if changed[0]:
        _publish(ctx, state)
    return state


async def remove(ctx: SessionContext, p: m.QueueEntryParams, key: ReceiptKey | None) -> Any:
    """The entry goes; a queued collaboration delivery it admitted is cancelled with it
    (:func:`store.collab.remove_admission`), announced on ``collab.delivery`` to both ends."""
    faults = ctx.faults
    cancelled: list[dict[str, Any]] = []

    def run(conn: Any, sid: str, now: int) -> queue.Outcome:
        out, changed = collab.remove_admission(conn, sid, p.entry_id, now_ms=now, faults=faults)
        cancelled[:] = changed.deliveries
        return out

    state = await _edit(ctx, run)
    publish_deliveries(ctx, cancelled)
    return state


def publish_deliveries(ctx: SessionContext, rows: Iterable[Mapping[str, Any]]) -> None:
    """After the commit: ``collab.delivery`` for each changed delivery, to its target and its source."""
    for row in rows:
        for sid in sorted({row["target"]["sessionId"], row["source"]["sessionId"]}):
            ctx.publish("collab.delivery", {"delivery": row}, session_id=sid)


async def prioritize(ctx: SessionContext, p: m.QueueEntryParams, key: ReceiptKey | None) -> Any:
    faults = ctx.faults
    return await _edit(ctx, lambda conn, sid, now: queue.prioritize(conn, sid, p.entry_id, now_ms=now, faults=faults))


async def reorder(ctx: SessionContext, p: m.QueueReorderParams, key: ReceiptKey | None) -> Any:
    faults = ctx.faults
    return await _edit(ctx, lambda conn, sid, now: queue.reorder(conn, sid, p.entry_id, p.direction, now_ms=now,
                                                                 faults=faults))


async def attach(ctx: SessionContext, p: m.QueueControllerParams, key: ReceiptKey | None) -> Any:
    """Become the controller (the last attach wins); releases a held queue.

    The controller is this host process's memory; the receipt (a row, so a
    retry with the same key is answered from it) records the answer given.
    A retry answered from it attaches again first (:func:`attach_replayed`).
    """
    state, changed = await _attach(ctx, p)
    if key is not None:
        state = await ctx.commit(lambda conn: state)
    if changed:
        _publish(ctx, state)
    return state


async def attach_replayed(ctx: SessionContext, p: m.QueueControllerParams, key: ReceiptKey | None) -> None:
    """A keyed retry of an attach, answered from its receipt: the controller it recorded lives in the
    memory of the process that answered. After a restart (the first try's answer lost with its host)
    the queue is held again and no controller is known; the retry attaches again, or the sidecar
    that retried would be told it controls a queue that hands it nothing. A queue another controller
    took since is left to it (the retried attach took effect before that one)."""
    if _slot(ctx).held:
        state, changed = await _attach(ctx, p)
        if changed:
            _publish(ctx, state)


def _require_controller_kind(ctx: SessionContext) -> None:
    """Only the agent sidecar controls a queue: attaches it and takes from it. A take by another kind of
    client (that read the controller's id from ``queueList``) would hand a prompt to a client that runs no
    turn, and the controller's next take would consume it."""
    kind = ctx.caller.client_kind
    if kind != CONTROLLER_KIND:
        raise Conflict(
            f"only a sidecar connected with clientKind {CONTROLLER_KIND!r} may control a session queue "
            f"(this connection is {kind!r})",
            data={"sessionId": ctx.sid, "clientKind": kind},
        )


async def _attach(ctx: SessionContext, p: m.QueueControllerParams) -> tuple[dict[str, Any], bool]:
    _require_controller_kind(ctx)
    control: QueueControl = ctx.services.get(SERVICE)
    changed = _slot(ctx).controller_id != p.controller_id
    slot = control.attach(ctx.sid, ctx.row.get("createdAt"), p.controller_id, ctx.caller.client_id)
    if await ctx.read(queue.has_leases, ctx.sid):
        sid = ctx.sid
        # A controller attaching has just started (or reconnected): what was taken and no turn began
        # with is offered again. A flow that goes on after a reconnect still binds it at its startTurn.
        if await ctx.db(lambda conn: queue.offer_again(conn, sid)):
            changed = True
    return await ctx.read(lambda conn, sid: read_state(conn, slot, sid), ctx.sid), changed


async def after_turn_end(ctx: SessionContext) -> None:
    """A turn of the session ended: settle the entry it carried (``store/queue.py``, leases) and, when
    prompts wait, say so on ``session.queue``: a controller that is not the one that ended the turn
    (a new sidecar after ``recoverInflight``) has no other signal to take the next one."""
    sid, now, faults, slot = ctx.sid, ctx.now(), ctx.faults, _slot(ctx)

    def waiting(conn: Any) -> dict[str, Any] | None:
        rows = queue.read_rows(conn, sid)
        return mark_evicted_blocks(conn, queue_state(slot, rows.entries, rows.unreadable)) if rows.entries else None

    def settle(conn: Any) -> dict[str, Any] | None:
        if not queue.has_running_turn(conn, sid):
            queue.settle_started(conn, sid, now_ms=now, faults=faults)
        return waiting(conn)

    # one read after the barrier (whether a handed-out prompt landed is indexed); a write only with a lease
    leased, shown = await ctx.read(lambda conn, _sid: (queue.has_leases(conn, sid), waiting(conn)), sid)
    if leased:
        shown = await ctx.db(settle)
    if shown is not None:
        _publish(ctx, shown)


async def take(ctx: SessionContext, p: m.QueueControllerParams, key: ReceiptKey | None) -> Any:
    """Hand out the next entry, leasing it in the same transaction as its receipt.

    What this controller took before is settled first (``store/queue.py``,
    leases): whether a handed-out prompt landed is read from the index, so
    the read barrier comes first. Nothing while the queue is held or a turn
    is running (``reason`` says which); a caller that is not the attached
    controller (another controller id, or the right one quoted by a client
    that did not attach it), or not a sidecar at all, gets CONFLICT.
    """
    _require_controller_kind(ctx)
    slot = _slot(ctx)
    if slot.held:
        return {"entry": None, "reason": "held"}
    if slot.controller_id != p.controller_id:
        raise Conflict(
            f"{p.controller_id} is not the queue controller of session {ctx.sid} "
            f"(the controller is {slot.controller_id})",
            data={"sessionId": ctx.sid, "controllerId": p.controller_id},
        )
    if slot.client_id != ctx.caller.client_id:  # the id is public (queueList): only the attaching client takes
        raise Conflict(
            f"client {ctx.caller.client_id} did not attach the queue controller {p.controller_id} of session "
            f"{ctx.sid}; session.queueAttach first",
            data={"sessionId": ctx.sid, "controllerId": p.controller_id, "clientId": ctx.caller.client_id},
        )
    now, sid, faults, client = ctx.now(), ctx.sid, ctx.faults, ctx.caller.client_id
    taken: list[dict[str, Any]] = []
    await ctx.read(queue.has_leases, sid)  # the barrier: every acknowledged append is indexed

    def op(conn: Any) -> dict[str, Any]:
        if queue.has_running_turn(conn, sid):
            return {"entry": None, "reason": "turnRunning"}
        out = queue.take(conn, sid, now_ms=now, client=client, faults=faults)
        if out.plan.entry is None:
            return {"entry": None, "reason": "empty"}
        taken.append(mark_evicted_blocks(conn, queue_state(slot, out.entries, out.unreadable)))
        return {"entry": mark_evicted_blocks(conn, out.plan.entry.to_wire())}

    result = await ctx.commit(op)
    if taken:
        _publish(ctx, taken[0])
    return result
