"""The host-owned turn queue (seed 003 §4.6b, D375 / ADR 0213 / ADR 0265).

Synchronous and sans-I/O in the h11 style: :func:`load` reads a session's
queue into an immutable :class:`Snapshot`; a pure ``plan_*`` function checks
the requested transition against :data:`TRANSITIONS` and the snapshot and
returns a :class:`Plan` (a list of effects) or raises a :class:`StoreError`;
only then :func:`apply` writes the effects. Nothing is written for a refused
operation. The ``push``/``remove``/... helpers run load → plan → apply on a
connection that is already inside the caller's transaction (the DB writer's
SAVEPOINT), so an operation and its command receipt commit together.

Rules:

* ``position`` is per session and only grows. The session's high-water mark is
  kept in ``kv(ns='queue', key=<session id>)`` so removing or taking the last
  entry never lets its position be reused. The ledger records the session's
  ``created_at``; a ledger left behind by a deleted session with the same id
  is ignored (kv has no foreign key to cascade).
* ``principal`` + ``idempotency_key`` make a retried push return the same
  entry; the same key with another input hash (or another
  ``session_message_id``) fails with ``IDEMPOTENCY_CONFLICT``. The same kv row
  remembers the last :data:`CONSUMED_KEYS_KEPT` keys whose entries were taken
  or removed (a damaged one too, as far as its record still reads:
  :meth:`Damaged.consumed`), so a late retry of an already delivered push is
  answered as a replay instead of queueing the prompt twice.
* At most :data:`MAX_ENTRIES` entries per session (``LIMIT_EXCEEDED``), counting the handed-out ones
  whose turn has not run: they may wait again (see leases below).
* ``session_message_id`` binds an admission to a collaboration delivery (seed
  003 §4.6c; ``store/collab.py``): removing the admission cancels that delivery,
  beginning it consumes it. So a new entry may name a delivery only when it is
  addressed to this very session and has no admission here yet (waiting or
  handed out): a binding into another session's queue would let that queue
  cancel a foreign delivery, and a second admission would hand one delivery out
  twice (``INVALID_PARAMS``, see :func:`check_binding`). A
  ``session_message_id`` that names no delivery at all is still accepted as a
  loose reference (clients already send those; seed 003 §4.6b gives the
  column no other rule); it can change no delivery.
* Delivery order: promoted entries (``priority`` set) first in click order
  (priority ascending), then the rest by position.
* ``prioritize`` writes ``MAX(priority) + 1`` within the session; an entry that
  is already promoted keeps its place (a repeated click changes nothing).
* ``reorder`` swaps the position values of an unpromoted entry and its
  adjacent unpromoted neighbour; it refuses promoted entries and moves past
  either end (``CONFLICT``). An entry offered again (leases, below) is listed
  first whatever its position: it is refused too and is nobody's neighbour,
  so every reorder that answers moves its entry in the listed order.

Leases (schema v30): ``take`` does not delete the entry it hands out; it
leases it (``lease = 'taken'``), so a controller (or the host) that dies
between the take and the prompt's line loses nothing. A leased entry is no
longer listed (the queue shows what waits) but keeps its row, its
idempotency key and its place:

* the turn that starts next in the session carries it (``started``,
  :func:`bind_lease`, in the turn's own transaction);
* the controller's next take settles it first (so do the turn's end and, for
  turns a restart cut, boot after the reconcile: :func:`settle_started`,
  :func:`settle_after_restart`): a ``taken`` entry it never
  started is consumed (the controller moved on); a ``started`` one is
  consumed when its turn ran (completed or failed, or a message of the turn,
  or a user message after the hand-out, is in the session) and otherwise
  comes back to wait under a new id (its turn was aborted before its prompt
  landed; the new id lets a sidecar derive fresh turn and message ids);
* a restart, or a controller attaching (a sidecar that restarted), turns
  ``taken`` into ``offered``: listed again, first, and the next take hands
  that same entry out again; a turn that starts binds an ``offered`` entry
  too (a sidecar flow that went on after a reconnect);
* the clients an entry was handed to are kept with it (``lease_client``,
  schema v31: a JSON array of client ids in hand-out order; an entry offered
  again and taken by another client keeps the earlier takers, whose flow may
  still go on). Only a turn one of them starts carries it (another client's
  turn in the session leaves it alone; the turn's starter is then its only
  client). Once the last taker is gone (its last connection closed and none
  came back within the host's grace) what it took and began no turn with is
  offered again (:func:`offer_again_taken_by`), so a sidecar that died while
  the host runs hides no prompt.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import orjson

from store import ids
from store.errors import (
    Conflict,
    CorruptData,
    DamagedRecord,
    IdempotencyConflict,
    InvalidInput,
    LimitExceeded,
    NotFound,
    SessionNotFound,
)
from store.faults import NO_FAULTS, Faults
from store.rules import turn_may_be_running

MAX_ENTRIES: Final = 8
CONSUMED_KEYS_KEPT: Final = 64
KV_NS: Final = "queue"
MAX_PRINCIPAL: Final = 200
PERMISSION_MODES: Final = frozenset({"inherit", "ask", "accept-edits", "auto"})

EntryState = Literal["queued", "promoted"]
Lease = Literal["taken", "offered", "started"]
Operation = Literal["remove", "prioritize", "reorder", "take"]
GONE: Final = "gone"

TRANSITIONS: Final[Mapping[tuple[EntryState, Operation], str]] = {
    ("queued", "remove"): GONE,
    ("promoted", "remove"): GONE,
    ("queued", "take"): GONE,
    ("promoted", "take"): GONE,
    ("queued", "prioritize"): "promoted",
    ("promoted", "prioritize"): "promoted",  # no-op: keeps its click order
    ("queued", "reorder"): "queued",
    # ("promoted", "reorder") is absent: refused with CONFLICT.
}
"""Which operation an entry in a given state accepts, and the state it leaves it in."""

_COLUMNS = (
    "id, session_id, principal, idempotency_key, input_hash, content, attachments_json, "
    "permission_mode, position, priority, session_message_id, created_at, lease, lease_turn_id, lease_seq, "
    "lease_client"
)


# ---------------------------------------------------------------------------
# values


@dataclass(frozen=True)
class Entry:
    id: str
    session_id: str
    principal: str
    idempotency_key: str | None
    input_hash: str
    content: str
    attachments: tuple[Mapping[str, Any], ...]
    permission_mode: str
    position: int
    priority: int | None
    session_message_id: str | None
    created_at: int
    lease: Lease | None = None
    lease_turn_id: str | None = None
    lease_seq: int | None = None
    lease_clients: tuple[str, ...] = ()  # the client ids it was handed to (or whose turn began with it)

    @property
    def state(self) -> EntryState:
        return "queued" if self.priority is None else "promoted"

    def to_wire(self) -> dict[str, Any]:
        """The ``QueueEntry`` wire shape (camelCase)."""
        out: dict[str, Any] = {
            "id": self.id,
            "sessionId": self.session_id,
            "principal": self.principal,
            "idempotencyKey": self.idempotency_key,
            "inputHash": self.input_hash,
            "content": self.content,
            "attachments": [dict(a) for a in self.attachments],
            "permissionMode": self.permission_mode,
            "position": self.position,
            "priority": self.priority,
            "createdAt": self.created_at,
        }
        if self.session_message_id is not None:
            out["sessionMessageId"] = self.session_message_id
        return out


@dataclass(frozen=True)
class Consumed:
    """An idempotency key whose entry already left the queue (taken or removed)."""

    principal: str
    idempotency_key: str
    input_hash: str
    entry_id: str
    position: int
    session_message_id: str | None
    created_at: int

    def to_json(self) -> dict[str, Any]:
        return {"principal": self.principal, "key": self.idempotency_key, "inputHash": self.input_hash,
                "id": self.entry_id, "position": self.position, "sessionMessageId": self.session_message_id,
                "createdAt": self.created_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Consumed:
        return cls(str(data["principal"]), str(data["key"]), str(data["inputHash"]), str(data["id"]),
                   int(data["position"]), data.get("sessionMessageId"), int(data["createdAt"]))


@dataclass(frozen=True)
class Damaged:
    """A queue row of the session that does not read (:func:`_entry` raised :class:`DamagedRecord`): its
    state, place and lease are unknown, so it may be ahead of every entry that reads. What its plain
    columns still say is kept, so no operation repeats its effect (a push retried with its key is refused,
    its position is never reused) and its removal does what a healthy entry's does (its key remembered,
    the delivery it admitted cancelled: ``store.collab.remove_admission``)."""

    id: str
    principal: Any
    idempotency_key: Any
    position: int | None
    input_hash: Any = None
    session_message_id: Any = None
    created_at: int | None = None

    @property
    def delivery_id(self) -> str | None:
        """The collaboration delivery it admitted, when its ``session_message_id`` still reads."""
        return self.session_message_id if isinstance(self.session_message_id, str) else None

    def consumed(self) -> Consumed | None:
        """Its key as :func:`_remember` keeps a removed entry's, so a late retry of its push is answered as a
        replay (not queued again); None when its principal, key or input hash do not read (no retry can
        match them). A position or time that does not read is kept as 0 (no entry has either)."""
        if not all(isinstance(v, str) for v in (self.principal, self.idempotency_key, self.input_hash)):
            return None
        return Consumed(self.principal, self.idempotency_key, self.input_hash, self.id, self.position or 0,
                        self.delivery_id, self.created_at or 0)


@dataclass(frozen=True)
class Snapshot:
    """One session's queue: entries in delivery order plus its kv ledger."""

    session_id: str
    entries: tuple[Entry, ...]  # waiting or offered again (the queue a person sees), delivery order
    high_water: int
    consumed: tuple[Consumed, ...] = ()
    session_created_at: int | None = None  # ties the kv ledger to this incarnation of the session id
    leased: tuple[Entry, ...] = ()  # handed out (taken or started) and not yet settled
    damaged: tuple[Damaged, ...] = ()  # rows that do not read: named in ``unreadable``, removable by id

    @property
    def unreadable(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.damaged)

    def find_any(self, entry_id: str) -> Entry:
        """``entry_id`` waiting or handed out."""
        for entry in self.leased:
            if entry.id == entry_id:
                return entry
        return self.find(entry_id)

    def find(self, entry_id: str) -> Entry:
        for entry in self.entries:
            if entry.id == entry_id:
                return entry
        raise NotFound(
            f"queue entry {entry_id} is not in session {self.session_id}'s queue",
            data={"sessionId": self.session_id, "entryId": entry_id},
        )


@dataclass(frozen=True)
class Binding:
    """The collaboration delivery a push's ``session_message_id`` names (its ledger row); ``target_session_id``
    None when no ledger row has that id."""

    delivery_id: str
    target_session_id: str | None


@dataclass(frozen=True)
class PushInput:
    principal: str
    content: str
    permission_mode: str
    idempotency_key: str | None = None
    attachments: tuple[Mapping[str, Any], ...] = ()
    session_message_id: str | None = None


# effects ------------------------------------------------------------------


@dataclass(frozen=True)
class Insert:
    entry: Entry


@dataclass(frozen=True)
class Delete:
    entry_id: str


@dataclass(frozen=True)
class SetPriority:
    entry_id: str
    priority: int


@dataclass(frozen=True)
class SetPosition:
    entry_id: str
    position: int


@dataclass(frozen=True)
class SetLease:
    entry_id: str
    lease: Lease
    seq: int | None
    clients: tuple[str, ...] = ()


@dataclass(frozen=True)
class WriteLedger:
    high_water: int
    consumed: tuple[Consumed, ...]
    session_created_at: int | None = None


Effect = Insert | Delete | SetPriority | SetPosition | SetLease | WriteLedger


@dataclass(frozen=True)
class Plan:
    effects: tuple[Effect, ...] = ()
    entry: Entry | None = None  # the entry the operation was about (pushed, taken, removed...)
    replayed: bool = False
    damaged: Damaged | None = None  # the damaged row it removed (its record did not read: no entry)

    @property
    def changed(self) -> bool:
        return bool(self.effects)


# ---------------------------------------------------------------------------
# pure helpers


def delivery_key(entry: Entry) -> tuple[int, int, int]:
    if entry.lease == "offered":
        return (-1, entry.position, 0)  # handed out before a restart: first again
    if entry.priority is not None:
        return (0, entry.priority, entry.position)
    return (1, entry.position, 0)


def delivery_order(entries: Sequence[Entry]) -> tuple[Entry, ...]:
    return tuple(sorted(entries, key=delivery_key))


def input_hash(content: str, attachments: Sequence[Mapping[str, Any]] | None, permission_mode: str) -> str:
    """SHA-256 of the canonical (content, attachments, permissionMode); key order does not matter."""
    body = orjson.dumps(
        {"content": content, "attachments": [dict(a) for a in attachments or ()], "permissionMode": permission_mode},
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(body).hexdigest()


def transition(entry: Entry, op: Operation) -> str:
    """The state ``op`` leaves ``entry`` in, or CONFLICT when the table refuses it."""
    target = TRANSITIONS.get((entry.state, op))
    if target is None:
        raise Conflict(
            f"queue entry {entry.id} is {entry.state}; {op} is not allowed for a {entry.state} entry"
            + (" (promoted entries are delivered in click order and cannot be reordered)" if op == "reorder" else ""),
            data={"sessionId": entry.session_id, "entryId": entry.id, "state": entry.state, "operation": op},
        )
    return target


def validate_push(inp: PushInput) -> None:
    if not isinstance(inp.principal, str) or not 1 <= len(inp.principal) <= MAX_PRINCIPAL:
        raise InvalidInput(f"principal must be a 1-{MAX_PRINCIPAL} character string", data={"field": "principal"})
    if inp.idempotency_key is not None and (
        not isinstance(inp.idempotency_key, str) or not 1 <= len(inp.idempotency_key) <= MAX_PRINCIPAL
    ):
        raise InvalidInput(f"idempotencyKey must be a 1-{MAX_PRINCIPAL} character string",
                           data={"field": "idempotencyKey"})
    if not isinstance(inp.content, str):
        raise InvalidInput("content must be a string", data={"field": "content"})
    if inp.permission_mode not in PERMISSION_MODES:
        raise InvalidInput(f"permissionMode must be one of {sorted(PERMISSION_MODES)}",
                           data={"field": "permissionMode"})
    if not all(isinstance(a, Mapping) for a in inp.attachments):
        raise InvalidInput("attachments must be JSON objects", data={"field": "attachments"})


def _remember(snap: Snapshot, entry: Entry | Damaged) -> tuple[Consumed, ...]:
    if isinstance(entry, Damaged):
        item = entry.consumed()
    elif entry.idempotency_key is not None:
        item = Consumed(entry.principal, entry.idempotency_key, entry.input_hash, entry.id, entry.position,
                        entry.session_message_id, entry.created_at)
    else:
        item = None
    if item is None:
        return snap.consumed
    kept = tuple(c for c in snap.consumed
                 if (c.principal, c.idempotency_key) != (item.principal, item.idempotency_key))
    return (kept + (item,))[-CONSUMED_KEYS_KEPT:]


def _ledger_after(snap: Snapshot, gone: Entry | Damaged) -> WriteLedger:
    return WriteLedger(snap.high_water, _remember(snap, gone), snap.session_created_at)


def _check_same_input(found_hash: str, found_smid: str | None, h: str, inp: PushInput, sid: str) -> None:
    if found_hash != h or found_smid != inp.session_message_id:
        raise IdempotencyConflict(
            f"idempotencyKey {inp.idempotency_key!r} of principal {inp.principal!r} was already used in "
            f"session {sid} for a different prompt",
            data={"sessionId": sid, "principal": inp.principal, "idempotencyKey": inp.idempotency_key},
        )


def check_binding(snap: Snapshot, binding: Binding) -> None:
    """May a new entry of ``snap``'s session be the admission of ``binding``'s delivery?

    Only into the delivery's own target queue (elsewhere, removing the entry would cancel a delivery
    that queue does not hold), and only as its one admission (a second would hand it out twice, and
    removing either would cancel it under the other)."""
    sid = snap.session_id
    if binding.target_session_id is None:
        return  # a loose reference: it names no delivery, so it can change none
    if binding.target_session_id != sid:
        raise InvalidInput(
            f"sessionMessageId {binding.delivery_id} names a collaboration delivery addressed to another "
            f"session; only its target's queue may hold its admission (not session {sid})",
            data={"field": "sessionMessageId", "sessionId": sid, "deliveryId": binding.delivery_id},
        )
    held = next((e.id for e in snap.entries + snap.leased if e.session_message_id == binding.delivery_id),
                next((d.id for d in snap.damaged if d.delivery_id == binding.delivery_id), None))
    if held is not None:  # a damaged admission too: it may be handed out once repaired
        raise InvalidInput(
            f"collaboration delivery {binding.delivery_id} already has its admission {held} in session "
            f"{sid}; a second one would hand it out twice",
            data={"field": "sessionMessageId", "sessionId": sid, "deliveryId": binding.delivery_id,
                  "entryId": held},
        )


# ---------------------------------------------------------------------------
# planners (pure: snapshot in, plan out; raise before anything is written)


def plan_push(snap: Snapshot, inp: PushInput, *, new_id: str, now_ms: int, binding: Binding | None = None,
              ran: frozenset[str] = frozenset()) -> Plan:
    """``binding``: the delivery ``inp.session_message_id`` names (:func:`load_binding`; None when it names
    none). A retry of an earlier push is answered as a replay before the binding is checked, so the
    retried push of an admission is not refused as its own second admission. ``ran``: the handed-out
    entries whose turn ran (:func:`turns_ran`); every other handed-out entry counts against the limit."""
    validate_push(inp)
    h = input_hash(inp.content, inp.attachments, inp.permission_mode)
    sid = snap.session_id
    if inp.idempotency_key is not None:
        for bad in snap.damaged:
            if (bad.principal, bad.idempotency_key) == (inp.principal, inp.idempotency_key):
                # maybe this very push, queued before: a new entry would queue its prompt twice
                raise DamagedRecord(
                    f"idempotencyKey {inp.idempotency_key!r} of principal {inp.principal!r} names queue entry "
                    f"{bad.id} of session {sid}, whose record is damaged; remove it (session.queueRemove) "
                    "to push the prompt again",
                    data={"sessionId": sid, "entryId": bad.id})
        for entry in snap.entries + snap.leased:
            if (entry.principal, entry.idempotency_key) == (inp.principal, inp.idempotency_key):
                _check_same_input(entry.input_hash, entry.session_message_id, h, inp, sid)
                return Plan(entry=entry, replayed=True)
        for c in snap.consumed:
            if (c.principal, c.idempotency_key) == (inp.principal, inp.idempotency_key):
                _check_same_input(c.input_hash, c.session_message_id, h, inp, sid)
                # Same input hash ⇒ same content/attachments/mode as the original push.
                gone = Entry(c.entry_id, sid, c.principal, c.idempotency_key, c.input_hash, inp.content,
                             tuple(inp.attachments), inp.permission_mode, c.position, None,
                             c.session_message_id, c.created_at)
                return Plan(entry=gone, replayed=True)
    if binding is not None:
        check_binding(snap, binding)
    # A handed-out entry whose turn has not run may wait again (a restart or an attach offers a taken
    # one again, an aborted turn re-queues its prompt): it still holds its place, or the queue would
    # list a ninth entry then.
    waiting = len(snap.entries) + sum(e.id not in ran for e in snap.leased) + len(snap.damaged)
    if waiting >= MAX_ENTRIES:
        raise LimitExceeded(
            f"session {sid} already has {waiting} queued prompts (at most {MAX_ENTRIES}); "
            "remove one or wait until one is delivered",
            data={"sessionId": sid, "limit": MAX_ENTRIES},
        )
    if any(e.id == new_id for e in snap.entries + snap.leased):
        raise Conflict(f"queue entry id {new_id} already exists", data={"entryId": new_id})
    position = snap.high_water + 1
    entry = Entry(new_id, sid, inp.principal, inp.idempotency_key, h, inp.content, tuple(inp.attachments),
                  inp.permission_mode, position, None, inp.session_message_id, now_ms)
    return Plan(effects=(Insert(entry), WriteLedger(position, snap.consumed, snap.session_created_at)), entry=entry)


def _remove_damaged(snap: Snapshot, entry_id: str) -> Plan | None:
    """Removing a damaged row by its id (the one way past it): it goes, its position stays used, and its
    key is remembered as a removed entry's is (a late retry of its push replays it, not queued again)."""
    bad = next((d for d in snap.damaged if d.id == entry_id), None)
    if bad is None:
        return None
    return Plan(effects=(Delete(entry_id), _ledger_after(snap, bad)), damaged=bad)


def plan_remove(snap: Snapshot, entry_id: str) -> Plan:
    gone = _remove_damaged(snap, entry_id)
    if gone is not None:
        return gone
    entry = snap.find(entry_id)
    transition(entry, "remove")
    return Plan(effects=(Delete(entry.id), _ledger_after(snap, entry)), entry=entry)


def plan_prioritize(snap: Snapshot, entry_id: str) -> Plan:
    entry = snap.find(entry_id)
    transition(entry, "prioritize")
    if entry.state == "promoted":
        return Plan(entry=entry)
    # MAX over the session's rows, the handed-out ones too: one may come back (its place kept), and a
    # promotion made meanwhile must still come after it in click order.
    top = max((e.priority for e in snap.entries + snap.leased if e.priority is not None), default=0)
    return Plan(effects=(SetPriority(entry.id, top + 1),), entry=replace(entry, priority=top + 1))


def plan_reorder(snap: Snapshot, entry_id: str, direction: str) -> Plan:
    if direction not in ("up", "down"):
        raise InvalidInput("direction must be 'up' or 'down'", data={"field": "direction"})
    entry = snap.find(entry_id)
    transition(entry, "reorder")
    if entry.lease == "offered":
        raise Conflict(
            f"queue entry {entry.id} was handed out before and is offered again first; it cannot be reordered",
            data={"sessionId": snap.session_id, "entryId": entry.id, "state": "offered", "operation": "reorder"},
        )
    # The neighbours a person sees: an entry offered again is listed first whatever its position, so
    # swapping position values with it would answer a move that changes nothing in the list.
    line = sorted((e for e in snap.entries if e.state == "queued" and e.lease != "offered"),
                  key=lambda e: e.position)
    i = next(k for k, e in enumerate(line) if e.id == entry.id)
    j = i - 1 if direction == "up" else i + 1
    if not 0 <= j < len(line):
        edge = "first" if direction == "up" else "last"
        raise Conflict(
            f"queue entry {entry.id} is already the {edge} unpromoted entry; it cannot move {direction}",
            data={"sessionId": snap.session_id, "entryId": entry.id, "direction": direction},
        )
    other = line[j]
    return Plan(effects=(SetPosition(entry.id, other.position), SetPosition(other.id, entry.position)),
                entry=replace(entry, position=other.position))


def new_entry_id() -> str:
    return "q_" + ids.new_id()


def _settle(snap: Snapshot, *, ran: frozenset[str], new_id: Callable[[], str],
            taken: bool) -> tuple[list[Effect], list[Entry]]:
    """Effects settling the handed-out entries (``started`` ones; ``taken`` ones too when ``taken``),
    and the entries that wait afterwards. Only while no turn of the session runs."""
    effects: list[Effect] = []
    consumed = snap.consumed
    waiting = list(snap.entries)
    settled = [e for e in snap.leased if taken or e.lease == "started"]
    for entry in settled:
        if entry.lease == "started" and entry.id not in ran:
            back = replace(entry, id=new_id(), lease=None, lease_turn_id=None, lease_seq=None, lease_clients=())
            effects += [Delete(entry.id), Insert(back)]
            waiting.append(back)
            continue
        effects.append(Delete(entry.id))  # taken and not started (the controller moved on), or ran
        consumed = _remember(replace(snap, consumed=consumed), entry)
    if settled:
        effects.append(WriteLedger(snap.high_water, consumed, snap.session_created_at))
    return effects, waiting


def plan_take(snap: Snapshot, *, ran: frozenset[str] = frozenset(), last_seq: int = 0,
              new_id: Callable[[], str] = new_entry_id, client: str | None = None) -> Plan:
    """Settle what was handed out before, then lease the next entry (an empty plan when none waits).

    Called only while no turn of the session runs. ``ran``: the ``started`` entries whose turn ran
    (:func:`turns_ran`); ``new_id``: gives the id a ``started`` entry whose turn did not run waits
    under again; ``last_seq``: the session's last seq now (a user message after it means a prompt
    landed); ``client``: the client id taking it (only its turns carry the entry).

    ``DamagedRecord`` (nothing handed out or settled) while a row of the session does not read: it may be
    ahead of the next entry, or be the entry handed out before; only removing it (by the id ``unreadable``
    names) lets the queue go on, so no prompt is skipped, or handed out twice, unseen.
    """
    if snap.damaged:
        names = list(snap.unreadable)
        raise DamagedRecord(
            f"session {snap.session_id}'s queue holds entries whose record is damaged ({', '.join(names)}); "
            "none is handed out until they are removed (session.queueRemove)",
            data={"sessionId": snap.session_id, "entryIds": names})
    offered = next((e for e in snap.entries if e.lease == "offered"), None)
    if offered is not None:  # a restart or a new controller: the same entry again
        takers = _takers(offered.lease_clients, client)
        return Plan(effects=(SetLease(offered.id, "taken", last_seq, takers),),
                    entry=replace(offered, lease="taken", lease_seq=last_seq, lease_clients=takers))
    effects, waiting = _settle(snap, ran=ran, new_id=new_id, taken=True)
    if waiting:
        entry = delivery_order(waiting)[0]
        transition(entry, "take")
        takers = _takers((), client)
        effects.append(SetLease(entry.id, "taken", last_seq, takers))
        return Plan(effects=tuple(effects), entry=replace(entry, lease="taken", lease_seq=last_seq,
                                                          lease_clients=takers))
    return Plan(effects=tuple(effects))


def _takers(before: tuple[str, ...], client: str | None) -> tuple[str, ...]:
    """The clients an entry was handed to, ``client`` last (the one whose absence offers it again)."""
    if client is None:
        return before
    return (*(c for c in before if c != client), client)


def plan_drop(snap: Snapshot, entry_id: str) -> Plan:
    """Remove an entry waiting or handed out (a collaboration delivery began or was cancelled)."""
    gone = _remove_damaged(snap, entry_id)
    if gone is not None:
        return gone
    entry = snap.find_any(entry_id)
    return Plan(effects=(Delete(entry.id), _ledger_after(snap, entry)), entry=entry)


# ---------------------------------------------------------------------------
# SQL


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _entry(row: Sequence[Any]) -> Entry:
    """One queue row; ``DamagedRecord`` naming it when a column holds what the host never writes there."""
    try:
        loaded = orjson.loads(row[6]) if row[6] else []
    except orjson.JSONDecodeError as exc:
        raise DamagedRecord(f"queue entry {row[0]} has unreadable attachments_json: {exc}") from None
    attachments = tuple(loaded) if isinstance(loaded, list) else None
    if attachments is None or not all(isinstance(a, dict) for a in attachments):
        raise DamagedRecord(f"queue entry {row[0]}'s attachments_json is not a list of objects")
    lease = row[12]
    if lease not in (None, "taken", "offered", "started"):
        raise DamagedRecord(f"queue entry {row[0]} has an unknown lease {lease!r}")
    if (_int(row[8]) is None or _int(row[11]) is None  # position, created_at
            or any(v is not None and _int(v) is None for v in (row[9], row[14]))):  # priority, lease_seq
        raise DamagedRecord(f"queue entry {row[0]} has a position, priority or time that is not an integer")
    return Entry(row[0], row[1], row[2], row[3], row[4], row[5], attachments, row[7], int(row[8]),
                 None if row[9] is None else int(row[9]), row[10], int(row[11]), lease, row[13],
                 None if row[14] is None else int(row[14]), _clients(row[0], row[15]))


def _clients(entry_id: str, raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return ()  # handed out before schema v31: no taker kept
    if raw and not raw.startswith("["):
        # the first v31 build kept the one client it was handed to as plain text (a client id never
        # starts with "["); the same schema version, so no step converts it: read it as that client
        return (raw,)
    try:
        got = orjson.loads(raw)
    except orjson.JSONDecodeError:
        got = None
    if not isinstance(got, list) or not all(isinstance(c, str) for c in got):
        raise DamagedRecord(f"queue entry {entry_id} has an unreadable lease_client {raw!r}")
    return tuple(got)


def _clients_json(clients: tuple[str, ...]) -> str | None:
    return orjson.dumps(list(clients)).decode() if clients else None


@dataclass(frozen=True)
class Rows:
    """A session's queue rows as read: waiting (or offered again), handed out, and damaged."""

    entries: tuple[Entry, ...]  # delivery order
    leased: tuple[Entry, ...]  # delivery order
    damaged: tuple[Damaged, ...]  # by id

    @property
    def unreadable(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.damaged)


def read_rows(conn: sqlite3.Connection, session_id: str) -> Rows:
    """Every queue row of the session, each decoded on its own: one that does not read (a damaged
    record; a lease outside its set too, which no query by lease would ever see) is kept apart in
    ``damaged``, never left out unseen."""
    # every row read before any is decoded (a raise mid-iteration would keep the statement active)
    rows = conn.execute(f"SELECT {_COLUMNS} FROM turn_queue WHERE session_id = ? ORDER BY id",
                        (session_id,)).fetchall()
    waiting: list[Entry] = []
    leased: list[Entry] = []
    damaged: list[Damaged] = []
    for row in rows:
        try:
            entry = _entry(row)
        except DamagedRecord:
            damaged.append(Damaged(str(row[0]), row[2], row[3], _int(row[8]), row[4], row[10], _int(row[11])))
            continue
        (waiting if entry.lease in (None, "offered") else leased).append(entry)
    return Rows(delivery_order(waiting), delivery_order(leased), tuple(damaged))


def list_entries(conn: sqlite3.Connection, session_id: str) -> tuple[Entry, ...]:
    """The entries that wait, or are offered again (the queue a person sees), in delivery order; a
    damaged one is not among them (:func:`read_rows` names it)."""
    return read_rows(conn, session_id).entries


def list_leased(conn: sqlite3.Connection, session_id: str) -> tuple[Entry, ...]:
    """The entries handed out (taken or started) and not yet settled, in delivery order."""
    return read_rows(conn, session_id).leased


def _read_ledger(
    conn: sqlite3.Connection, session_id: str, session_created_at: int | None
) -> tuple[int, tuple[Consumed, ...]]:
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", (KV_NS, session_id)).fetchone()
    if row is None:
        return 0, ()
    try:
        data = orjson.loads(row[0])
        high = int(data.get("highWater", 0))
        consumed = tuple(Consumed.from_json(c) for c in data.get("consumed", ()))
        owner = data.get("sessionCreatedAt")
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CorruptData(f"queue ledger of session {session_id} is unreadable: {exc}") from None
    if owner != session_created_at:
        return 0, ()  # left over from a deleted session that had the same id
    return high, consumed


def load(conn: sqlite3.Connection, session_id: str) -> Snapshot:
    rows = read_rows(conn, session_id)
    row = conn.execute("SELECT created_at FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    created = int(row[0])
    floor, consumed = _read_ledger(conn, session_id, created)
    positions = [e.position for e in rows.entries + rows.leased]
    positions += [d.position for d in rows.damaged if d.position is not None]
    return Snapshot(session_id, rows.entries, max([floor, *positions]), consumed, created, rows.leased,
                    rows.damaged)


def load_binding(conn: sqlite3.Connection, session_message_id: str | None) -> Binding | None:
    """The collaboration delivery ``session_message_id`` names (None without one; a binding with no target
    when no ledger row has that id)."""
    if session_message_id is None:
        return None
    row = conn.execute("SELECT target_session_id FROM session_collaboration_messages WHERE id = ?",
                       (session_message_id,)).fetchone()
    return Binding(session_message_id, None if row is None else str(row[0]))


def apply(conn: sqlite3.Connection, session_id: str, plan: Plan, *, now_ms: int, faults: Faults = NO_FAULTS) -> None:
    """Write a plan's effects (inside the caller's transaction)."""
    for i, effect in enumerate(plan.effects):
        if i:
            faults.point("queue.between_effects")
        if isinstance(effect, Insert):
            e = effect.entry
            conn.execute(
                f"INSERT INTO turn_queue({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (e.id, e.session_id, e.principal, e.idempotency_key, e.input_hash, e.content,
                 orjson.dumps([dict(a) for a in e.attachments]).decode() if e.attachments else None,
                 e.permission_mode, e.position, e.priority, e.session_message_id, e.created_at,
                 e.lease, e.lease_turn_id, e.lease_seq, _clients_json(e.lease_clients)),
            )
        elif isinstance(effect, Delete):
            conn.execute("DELETE FROM turn_queue WHERE id = ? AND session_id = ?", (effect.entry_id, session_id))
        elif isinstance(effect, SetPriority):
            conn.execute("UPDATE turn_queue SET priority = ? WHERE id = ? AND session_id = ?",
                         (effect.priority, effect.entry_id, session_id))
        elif isinstance(effect, SetPosition):
            conn.execute("UPDATE turn_queue SET position = ? WHERE id = ? AND session_id = ?",
                         (effect.position, effect.entry_id, session_id))
        elif isinstance(effect, SetLease):
            conn.execute("UPDATE turn_queue SET lease = ?, lease_seq = ?, lease_client = ? "
                         "WHERE id = ? AND session_id = ?",
                         (effect.lease, effect.seq, _clients_json(effect.clients), effect.entry_id, session_id))
        elif isinstance(effect, WriteLedger):
            value = {"highWater": effect.high_water, "consumed": [c.to_json() for c in effect.consumed],
                     "sessionCreatedAt": effect.session_created_at}
            conn.execute(
                "INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?,?,?,?) ON CONFLICT(ns, key) "
                "DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
                (KV_NS, session_id, orjson.dumps(value).decode(), now_ms),
            )
    faults.point("queue.after_apply")


def forget_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Drop the session's ledger (its entries go with the session row by FK cascade)."""
    conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (KV_NS, session_id))


# ---------------------------------------------------------------------------
# one-call operations (load → plan → apply in the caller's transaction)


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    entries: tuple[Entry, ...] = field(default=())  # the queue afterwards, delivery order
    unreadable: tuple[str, ...] = ()  # the ids of its damaged rows afterwards


def _run(conn: sqlite3.Connection, session_id: str, plan: Plan, now_ms: int, faults: Faults) -> Outcome:
    if plan.changed:
        apply(conn, session_id, plan, now_ms=now_ms, faults=faults)
    rows = read_rows(conn, session_id)
    return Outcome(plan, rows.entries, rows.unreadable)


def push(conn: sqlite3.Connection, session_id: str, inp: PushInput, *, new_id: str, now_ms: int,
         faults: Faults = NO_FAULTS) -> Outcome:
    snap = load(conn, session_id)
    plan = plan_push(snap, inp, new_id=new_id, now_ms=now_ms, binding=load_binding(conn, inp.session_message_id),
                     ran=turns_ran(conn, snap.leased))
    return _run(conn, session_id, plan, now_ms, faults)


def remove(conn: sqlite3.Connection, session_id: str, entry_id: str, *, now_ms: int,
           faults: Faults = NO_FAULTS) -> Outcome:
    return _run(conn, session_id, plan_remove(load(conn, session_id), entry_id), now_ms, faults)


def prioritize(conn: sqlite3.Connection, session_id: str, entry_id: str, *, now_ms: int,
               faults: Faults = NO_FAULTS) -> Outcome:
    return _run(conn, session_id, plan_prioritize(load(conn, session_id), entry_id), now_ms, faults)


def reorder(conn: sqlite3.Connection, session_id: str, entry_id: str, direction: str, *, now_ms: int,
            faults: Faults = NO_FAULTS) -> Outcome:
    return _run(conn, session_id, plan_reorder(load(conn, session_id), entry_id, direction), now_ms, faults)


def take(conn: sqlite3.Connection, session_id: str, *, now_ms: int, client: str | None = None,
         faults: Faults = NO_FAULTS) -> Outcome:
    """Settle the entries handed out before and lease the next to ``client`` (no running turn: the
    caller checks).

    The index must cover the session's acknowledged appends (a read barrier first): whether a
    handed-out prompt landed is read from it."""
    snap = load(conn, session_id)
    ran = turns_ran(conn, snap.leased)
    plan = plan_take(snap, ran=ran, last_seq=_last_seq(conn, session_id), client=client)
    return _run(conn, session_id, plan, now_ms, faults)


def settle_started(conn: sqlite3.Connection, session_id: str, *, now_ms: int,
                   faults: Faults = NO_FAULTS) -> Outcome:
    """Settle the session's ``started`` entries whose turn ended (no turn of it runs: the caller
    checks): consumed if the turn ran, else waiting again under a new id. The index must cover the
    session's acknowledged appends."""
    snap = load(conn, session_id)
    effects, _ = _settle(snap, ran=turns_ran(conn, snap.leased), new_id=new_entry_id, taken=False)
    return _run(conn, session_id, Plan(effects=tuple(effects)), now_ms, faults)


def settle_after_restart(conn: sqlite3.Connection, *, now_ms: int) -> dict[str, int]:
    """Boot, after the fence and the reconcile (the index holds every line): every ``started`` entry's
    turn has ended; settle them, so a prompt whose turn was cut before it landed is listed again."""
    out = {"consumed": 0, "waitingAgain": 0}
    sessions = [r[0] for r in conn.execute("SELECT DISTINCT session_id FROM turn_queue WHERE lease = 'started'")]
    for sid in sessions:
        if has_running_turn(conn, sid):
            continue
        effects = settle_started(conn, sid, now_ms=now_ms).plan.effects
        back = sum(isinstance(e, Insert) for e in effects)
        out["waitingAgain"] += back
        out["consumed"] += sum(isinstance(e, Delete) for e in effects) - back
    return out


def drop(conn: sqlite3.Connection, session_id: str, entry_id: str, *, now_ms: int,
         faults: Faults = NO_FAULTS) -> Outcome:
    return _run(conn, session_id, plan_drop(load(conn, session_id), entry_id), now_ms, faults)


def _last_seq(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return int(row[0]) if row else 0


def turns_ran(conn: sqlite3.Connection, leased: Sequence[Entry]) -> frozenset[str]:
    """The ``started`` entries whose turn ran: it completed or failed, or it was aborted after a
    message of it (or a user message after the hand-out) reached the session."""
    ran: set[str] = set()
    for entry in leased:
        if entry.lease != "started" or entry.lease_turn_id is None:
            continue
        row = conn.execute("SELECT status FROM turns WHERE id = ?", (entry.lease_turn_id,)).fetchone()
        if row is None or row[0] in ("completed", "error"):
            ran.add(entry.id)  # a turn that is gone (its session was rewritten) is not run again
            continue
        landed = conn.execute(
            "SELECT 1 FROM messages WHERE session_id = ? AND (turn_id = ? OR (role = 'user' AND seq > ?)) LIMIT 1",
            (entry.session_id, entry.lease_turn_id, entry.lease_seq or 0),
        ).fetchone()
        if landed is not None:
            ran.add(entry.id)
    return frozenset(ran)


def has_leases(conn: sqlite3.Connection, session_id: str) -> bool:
    """Is an entry of the session handed out (taken or started)?"""
    return conn.execute("SELECT 1 FROM turn_queue WHERE session_id = ? AND lease IN ('taken', 'started') LIMIT 1",
                        (session_id,)).fetchone() is not None


def bind_lease(conn: sqlite3.Connection, session_id: str, turn_id: str, client: str | None) -> None:
    """A turn ``client`` starts: the entry handed out to that client (if any; to it among others, when
    it was offered again and another took it meanwhile) is now ``started`` by it, and ``client`` is its
    only client. An entry handed to other clients only is left alone (their own turn carries it); one
    handed out before schema v31 (no taker kept) goes with any turn, as it did then. A ``lease_client``
    kept as plain text (the first v31 build, :func:`_clients`) names that one client; a damaged one (not
    JSON) names none, so no turn carries that entry and the turn still starts (``json_each`` of it would
    fail the statement)."""
    conn.execute(
        "UPDATE turn_queue SET lease = 'started', lease_turn_id = ?, "
        "lease_client = CASE WHEN ? IS NULL THEN lease_client ELSE json_array(?) END "
        "WHERE session_id = ? AND lease IN ('taken', 'offered') AND (lease_client IS NULL OR "
        "CASE WHEN json_valid(lease_client) AND json_type(lease_client) = 'array' "
        "THEN EXISTS (SELECT 1 FROM json_each(turn_queue.lease_client) WHERE value = ?) "
        "ELSE lease_client = ? END)",
        (turn_id, client, client, session_id, client, client))


def offer_again(conn: sqlite3.Connection, session_id: str | None = None) -> int:
    """Entries handed out and not started are offered again (a restart; another controller).
    ``session_id`` None: every session's. The number changed."""
    if session_id is None:
        return conn.execute("UPDATE turn_queue SET lease = 'offered' WHERE lease = 'taken'").rowcount
    return conn.execute("UPDATE turn_queue SET lease = 'offered' WHERE session_id = ? AND lease = 'taken'",
                        (session_id,)).rowcount


def _last_client(column: str = "lease_client") -> str:
    """SQL: the client an entry was handed to last (``lease_client`` is a JSON array of client ids; plain
    text is the one client the first v31 build kept, as :func:`_clients` reads it). A damaged array (not
    JSON, starting with "[" as no client id does) matches no client instead of failing the statement: one
    damaged entry would otherwise keep a gone client's entries in every session from being offered again."""
    return f"CASE WHEN json_valid({column}) THEN json_extract({column}, '$[#-1]') ELSE {column} END"


def offer_again_taken_by(conn: sqlite3.Connection, client: str) -> list[str]:
    """``client`` is gone: what it took last and began no turn with is offered again (listed, handed out
    first by the next take; its own flow, were it to come back, still binds it). The sessions whose
    queue changed."""
    rows = conn.execute(f"UPDATE turn_queue SET lease = 'offered' WHERE lease = 'taken' AND {_last_client()} = ? "
                        "RETURNING session_id", (client,)).fetchall()
    return sorted({str(r[0]) for r in rows})


def running_turns_started_by(conn: sqlite3.Connection, client: str) -> list[tuple[str, str]]:
    """``(session id, turn id)`` of every running turn ``client`` started with an entry handed to it."""
    return [(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT q.session_id, q.lease_turn_id FROM turn_queue q JOIN turns t ON t.id = q.lease_turn_id "
        f"WHERE q.lease = 'started' AND {_last_client('q.lease_client')} = ? "
        f"AND {turn_may_be_running('t.status')} ORDER BY q.session_id", (client,))]


def has_running_turn(conn: sqlite3.Connection, session_id: str) -> bool:
    """A turn of the session is running, or may be (its stored status is damaged): nothing is handed out."""
    row = conn.execute(f"SELECT 1 FROM turns WHERE session_id = ? AND {turn_may_be_running()} LIMIT 1",
                       (session_id,)).fetchone()
    return row is not None
