"""The session collaboration ledger (seed 003 §4.6c, §11.21): plugin-mediated deliveries.

A delivery (``task`` or ``message``) goes from a source session to a target
session. Its row in ``session_collaboration_messages`` is the authoritative
identity and lifecycle record; it is *bound* to a ``turn_queue`` admission of
the target (``turn_queue.session_message_id``), created in the same
transaction:

=========  ==============================================  ==========================
from       event                                           to
=========  ==============================================  ==========================
(new)      ``collab.deliver`` (ceiling and hops checked)   queued + queue admission
queued     the target's turn begins it                     running (``turn_id`` set; an
                                                           admission not yet taken goes)
queued /   its input line is in the transcript, the        bound to the line's turn:
inter-     ledger never recorded the begin (the host died  running if that turn still
rupted     between the two): a begin finds the line        runs, else interrupted
running    it is settled (or its turn ends)                completed / failed
queued /   ``collab.cancel``                               cancelled (the admission is
running                                                    removed; the session stays)
queued     ``session.queueRemove`` of its admission        cancelled (:func:`remove_admission`)
queued /   host restart: running, or queued without an     interrupted (never replayed)
running    admission (``store/fence.py``)
=========  ==============================================  ==========================

Rules:

* idempotency: ``(plugin_id, source_session_id, idempotency_key)`` is UNIQUE;
  a retry returns the original delivery, a changed target, body, kind or
  callback flag is ``IDEMPOTENCY_CONFLICT``;
* permission ceiling: the sender's effective permission mode (capped by the
  delivery it is itself running) is snapshotted; a target whose effective mode
  exceeds it is refused (``PERMISSION_DENIED``), at delivery and again when the
  target begins it;
* hops: a delivery sent by a session that is itself running a delivery is an
  autonomous chain step: ``remaining_hops`` is the parent's minus one, and a
  parent with none left cannot forward (``LIMIT_EXCEEDED``). The parent is the
  delivery the sender's *running turn* began (:func:`_parent`), whatever its
  row's status became meanwhile: a cancel or a settlement does not stop the turn
  that runs it, so it must not give that turn a fresh budget. A completion is
  such a parent too, with no hops left (a completion turn reacts to a result;
  it does not start a new chain: that would let two sessions call each other
  back forever);
* both ends exist and are not in the trash (``SESSION_NOT_FOUND``); a retry of
  a recorded delivery is answered before either is looked at;
* admissions: only the delivery's own target queue holds its admission, and
  only one (``store/queue.py`` refuses any other ``session_message_id``
  binding); removing an entry changes only a delivery addressed to the entry's
  session (:func:`remove_admission`);
* callbacks: settling a delivery with ``notify_on_completion`` creates at most
  one ``completion`` row back to the source (the partial unique index on
  ``reply_to_message_id``), holding a bounded projection of the result, bound
  to an admission in the source's queue; a completion never creates another.
  It carries its delivery's ceiling (the host's reply inside that exchange),
  and the target rule applies: a source whose mode now exceeds it (it sent
  with a lower ``permissionCeiling``, or raised its mode since) would refuse
  it at every begin, so it is recorded ``failed`` (``PERMISSION_DENIED``) and
  not admitted, as one a full queue cannot take (``QUEUE_FULL``);
* a begin is one effect: its input line (``collab-<deliveryId>``) lands first,
  then the ledger. The line is the proof that its turn began the delivery: a
  retry of the same begin (same delivery and turn), keyed or not, after any
  crash, answers what the first try answered (:func:`as_begun`) and never
  writes a second line; a line whose commit never came is recorded when a
  begin finds it (:func:`bind_landed`), and a begin from another turn is then
  ``CONFLICT`` (never replayed);
* provenance: the target's input line carries ``meta.sessionMessage``
  (:func:`provenance`), written by the host only; :func:`check_rewrite` refuses
  a rewrite that would strip or edit it.

SQL functions run inside the caller's transaction; the rest is pure.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from store import queue, tasks
from store.config.settings import delete_value, get_value, set_value
from store.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidInput,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    SessionNotFound,
)
from store.faults import NO_FAULTS, Faults
from store.ids import derived_id
from store.jsonio import Readable, readable, stored_value
from store.receipts import ReceiptKey
from store.rules import COLLAB_INPUT_ID_PREFIX, turn_may_be_running
from store.stamps import after_newest
from store.transcripts.records import meta_of

__all__ = [
    "CEILING",
    "DEFAULT_HOPS",
    "MAX_HOPS",
    "RESULT_PROJECTION_CHARS",
    "Changed",
    "answer_from_header",
    "as_begun",
    "begin",
    "bind_landed",
    "bind_landed_inputs",
    "cancel",
    "check_begin",
    "check_rewrite",
    "delivered_record",
    "delivery_ids",
    "forget_delivered",
    "has_row",
    "keep_delivered",
    "prune_delivered",
    "DELIVERED_META",
    "deliver",
    "effective_permission",
    "get",
    "input_message_id",
    "list_deliveries",
    "provenance",
    "remove_admission",
    "settle",
    "settle_for_turn",
]

CEILING: Final[Mapping[str, int]] = {"ask": 0, "accept-edits": 1, "auto": 2}
DEFAULT_HOPS: Final = 4
MAX_HOPS: Final = 16
RESULT_PROJECTION_CHARS: Final = 2000
MAX_RESULT_CHARS: Final = 1_000_000
DELIVERY_KINDS: Final = ("task", "message")
_COLS = ("id, plugin_id, source_session_id, source_title, target_session_id, target_title, kind, content, status, "
         "notify_on_completion, turn_id, reply_to_message_id, idempotency_key, remaining_hops, permission_ceiling, "
         "result, error, created_at, updated_at")


@dataclass
class Changed:
    """What a ledger operation changed, for the events the caller publishes after the commit."""

    deliveries: list[dict[str, Any]] = field(default_factory=list)
    queues: dict[str, tuple[queue.Entry, ...]] = field(default_factory=dict)
    """session id → its queue afterwards (an admission was added or removed)."""


# ---------------------------------------------------------------------------
# permissions


def effective_permission(conn: sqlite3.Connection, session_id: str) -> str:
    """The session's permission mode, ``inherit`` resolved to the app default (``ask`` if none)."""
    row = conn.execute("SELECT permission_mode FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    if row[0] in CEILING:
        return str(row[0])
    blob = conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'settings'").fetchone()
    try:
        settings = orjson.loads(blob[0]) if blob else {}
    except orjson.JSONDecodeError:
        settings = {}
    if isinstance(settings, dict):
        for key in ("defaultPermissionMode", "permissionMode"):
            if settings.get(key) in CEILING:
                return str(settings[key])
    return "ask"


def _lower(a: str, b: str) -> str:
    return a if CEILING[a] <= CEILING[b] else b


def _check_ceiling(conn: sqlite3.Connection, target: str, ceiling: str) -> str:
    mode = effective_permission(conn, target)
    if CEILING[mode] > CEILING[ceiling]:
        raise PermissionDenied(
            f"target session {target} runs with permission mode {mode}, above the sender's ceiling {ceiling}",
            data={"targetSessionId": target, "targetPermissionMode": mode, "permissionCeiling": ceiling})
    return mode


# ---------------------------------------------------------------------------
# rows


def _exists(conn: sqlite3.Connection, session_id: str) -> bool:
    return conn.execute("SELECT 1 FROM sessions WHERE id = ? AND deleted_at IS NULL",
                        (session_id,)).fetchone() is not None


def _row(conn: sqlite3.Connection, r: Sequence[Any]) -> dict[str, Any]:
    (did, plugin, source, source_title, target, target_title, kind, content, status, notify, turn, reply_to,
     key, hops, ceiling, result, error, created, updated) = r
    out: dict[str, Any] = {
        "id": did, "pluginId": plugin, "kind": kind, "content": content, "status": status,
        "notifyOnCompletion": bool(notify), "turnId": turn, "replyToMessageId": reply_to, "idempotencyKey": key,
        "remainingHops": hops, "permissionCeiling": ceiling, "result": result, "error": error,
        "createdAt": created, "updatedAt": updated,
        "source": {"sessionId": source, "title": source_title, "available": _exists(conn, source)},
        "target": {"sessionId": target, "title": target_title, "available": _exists(conn, target)},
    }
    if kind != "completion":
        callback = conn.execute("SELECT id FROM session_collaboration_messages WHERE kind = 'completion' "
                                "AND reply_to_message_id = ?", (did,)).fetchone()
        if callback is not None:
            out["callbackId"] = callback[0]
    return {k: v for k, v in out.items() if v is not None}


_SETS: Final = ((6, ("task", "message", "completion"), "kind"),
                 (8, ("queued", "running", "completed", "failed", "cancelled", "interrupted"), "status"),
                 (14, tuple(CEILING), "permission_ceiling"))
"""The columns with a fixed set (their CHECKs), by position in :data:`_COLS`."""


def _checked(conn: sqlite3.Connection, r: Sequence[Any]) -> dict[str, Any]:
    """:func:`_row`, each column with a fixed set checked (``DamagedRecord`` naming it: SQLite checks a CHECK on
    writes only), for what goes out on the wire (``collab.list``, ``collab.get``)."""
    for at, allowed, column in _SETS:
        stored_value(r[at], allowed, f"delivery {r[0]}'s {column}")
    return _row(conn, r)


def get(conn: sqlite3.Connection, delivery_id: str, checked: bool = False) -> dict[str, Any]:
    """The delivery; ``checked`` (``collab.get``): ``DamagedRecord`` (CORRUPT_DATA) when a column is outside
    its set."""
    found = conn.execute(f"SELECT {_COLS} FROM session_collaboration_messages WHERE id = ?",
                         (delivery_id,)).fetchone()
    if found is None:
        raise NotFound(f"delivery {delivery_id} not found", data={"deliveryId": delivery_id})
    return _checked(conn, found) if checked else _row(conn, found)


def list_deliveries(conn: sqlite3.Connection, *, session_id: str | None, direction: str, status: str | None,
                    limit: int, before: tuple[int, str] | None
                    ) -> tuple[Readable[dict[str, Any]], tuple[int, str] | None]:
    """Newest first; ``direction`` incoming (target), outgoing (source) or all (either). A delivery whose record
    is damaged (a column outside its set) is named in ``unreadable`` (ids), not listed; the cursor comes from
    the rows' keys, so it moves past it."""
    where: list[str] = []
    args: list[Any] = []
    if session_id is not None:
        if direction == "incoming":
            where.append("target_session_id = ?")
            args.append(session_id)
        elif direction == "outgoing":
            where.append("source_session_id = ?")
            args.append(session_id)
        else:
            where.append("(target_session_id = ? OR source_session_id = ?)")
            args += [session_id, session_id]
    if status is not None:
        where.append("status = ?")
        args.append(status)
    if before is not None:
        where.append("(created_at < ? OR (created_at = ? AND id < ?))")
        args += [before[0], before[0], before[1]]
    sql = f"SELECT {_COLS} FROM session_collaboration_messages"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = conn.execute(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", (*args, limit + 1)).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    found = readable(rows, lambda r: _checked(conn, r), lambda r: str(r[0]))
    return found, ((int(rows[-1][17]), str(rows[-1][0])) if more and rows else None)  # created_at, id


def _parent(conn: sqlite3.Connection, session_id: str) -> tuple[str, int, str] | None:
    """The delivery whose chain a delivery ``session_id`` sends continues: ``(id, remaining_hops,
    permission_ceiling)``, None when the sender runs none (it starts a chain of its own).

    It is the delivery the session's running turn began (bound by ``turn_id``), in whatever status:
    cancelling or settling a delivery does not stop the turn that runs it, and that turn must not
    forward with a fresh budget. A row the ledger still says runs counts too. Of several (not expected:
    one running turn per session), the one with the fewest hops left, so no choice widens the limit."""
    found = conn.execute(
        "SELECT m.id, m.remaining_hops, m.permission_ceiling FROM session_collaboration_messages m "
        "WHERE m.target_session_id = ? AND (m.status = 'running' OR EXISTS (SELECT 1 FROM turns t "
        f"WHERE t.id = m.turn_id AND t.session_id = m.target_session_id AND {turn_may_be_running('t.status')})) "
        "ORDER BY m.remaining_hops ASC, m.updated_at DESC LIMIT 1", (session_id,)).fetchone()
    return None if found is None else (str(found[0]), int(found[1]), str(found[2]))


def _title(conn: sqlite3.Connection, session_id: str) -> str:
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    return str(row[0])


def _admit(conn: sqlite3.Connection, changed: Changed, *, session_id: str, delivery_id: str, plugin_id: str,
           content: str, permission_mode: str, entry_id: str, now_ms: int, faults: Faults) -> None:
    """The delivery's turn-queue admission in ``session_id`` (``LIMIT_EXCEEDED`` when it is full)."""
    inp = queue.PushInput(principal=f"plugin:{plugin_id}", content=content, permission_mode=permission_mode,
                          idempotency_key=f"collab:{delivery_id}", session_message_id=delivery_id)
    out = queue.push(conn, session_id, inp, new_id=entry_id, now_ms=now_ms, faults=faults)
    changed.queues[session_id] = out.entries


def _insert(conn: sqlite3.Connection, *, delivery_id: str, plugin_id: str, source: str, target: str, kind: str,
            content: str, notify: bool, reply_to: str | None, key: str, hops: int, ceiling: str,
            now_ms: int) -> None:
    """Record a delivery (or a completion) as ``queued``. Its ``created_at`` is ``now_ms``, but always after
    every delivery so far: collab.list is "newest first" by ``(created_at, id)`` and ids are random, so
    deliveries made in one millisecond, or after the wall clock stepped back, would list out of order.

    The newest stamp is the last inserted row's (``created_at`` has no index, and the rule keeps the stamps
    in insertion order), one lookup instead of a scan of the whole ledger on every delivery."""
    created = after_newest(conn, "SELECT MAX(created_at) FROM (SELECT created_at FROM "
                           "session_collaboration_messages ORDER BY rowid DESC LIMIT 1)", (), now_ms)
    conn.execute(
        f"INSERT INTO session_collaboration_messages({_COLS}) VALUES (?,?,?,?,?,?,?,?,'queued',?,NULL,?,?,?,?,"
        "NULL,NULL,?,?)",
        (delivery_id, plugin_id, source, _title(conn, source), target, _title(conn, target), kind, content,
         int(notify), reply_to, key, hops, ceiling, created, created))


def deliver(conn: sqlite3.Connection, *, delivery_id: str, entry_id: str, plugin_id: str, source_session_id: str,
            target_session_id: str, kind: str, content: str, notify_on_completion: bool, idempotency_key: str,
            remaining_hops: int | None, permission_ceiling: str | None, now_ms: int,
            faults: Faults = NO_FAULTS) -> tuple[dict[str, Any], bool, Changed]:
    """Create a delivery and its queue admission; a retry returns the original. (row, replayed, changed)."""
    changed = Changed()
    if kind not in DELIVERY_KINDS:
        raise InvalidInput("kind must be task or message (completions are created by the host)",
                           data={"field": "kind"})
    found = conn.execute(f"SELECT {_COLS} FROM session_collaboration_messages WHERE plugin_id = ? AND "
                         "source_session_id = ? AND idempotency_key = ?",
                         (plugin_id, source_session_id, idempotency_key)).fetchone()
    if found is not None:
        row = _row(conn, found)
        differs = [name for name, same in (
            ("target", row["target"]["sessionId"] == target_session_id), ("content", row["content"] == content),
            ("kind", row["kind"] == kind), ("notifyOnCompletion", row["notifyOnCompletion"] == notify_on_completion),
        ) if not same]
        if differs:
            raise IdempotencyConflict(
                f"idempotencyKey {idempotency_key!r} was already used for another delivery ({', '.join(differs)} "
                "differ)", data={"deliveryId": row["id"], "differs": differs})
        return row, True, changed
    if source_session_id == target_session_id:
        raise InvalidInput("a session cannot deliver to itself", data={"field": "targetSessionId"})
    if not _exists(conn, source_session_id):
        raise SessionNotFound(f"source session {source_session_id} not found",
                              data={"sessionId": source_session_id})
    if not _exists(conn, target_session_id):  # a trashed target is as unreachable as a trashed source
        raise SessionNotFound(f"target session {target_session_id} not found",
                              data={"sessionId": target_session_id})
    target_mode = conn.execute("SELECT mode FROM sessions WHERE id = ?", (target_session_id,)).fetchone()[0]
    tasks.require_interactive(conn, target_session_id, target_mode, work="take a collaboration delivery")
    sender = effective_permission(conn, source_session_id)
    parent = _parent(conn, source_session_id)
    if parent is not None:  # the sender is itself running a delivery: an autonomous chain step
        if parent[1] <= 0:
            raise LimitExceeded(f"delivery {parent[0]} has no hops left: session {source_session_id} cannot "
                                "forward work autonomously", data={"parentDeliveryId": parent[0], "reason": "HOPS"})
        hops = parent[1] - 1
        ceiling = _lower(sender, parent[2])
    else:
        hops = DEFAULT_HOPS if remaining_hops is None else remaining_hops
        if not 0 <= hops <= MAX_HOPS:
            raise InvalidInput(f"remainingHops must be 0..{MAX_HOPS}", data={"field": "remainingHops"})
        ceiling = sender
    if permission_ceiling is not None:
        ceiling = _lower(ceiling, permission_ceiling)
    mode = _check_ceiling(conn, target_session_id, ceiling)
    _insert(conn, delivery_id=delivery_id, plugin_id=plugin_id, source=source_session_id, target=target_session_id,
            kind=kind, content=content, notify=notify_on_completion, reply_to=None, key=idempotency_key,
            hops=hops, ceiling=ceiling, now_ms=now_ms)
    _admit(conn, changed, session_id=target_session_id, delivery_id=delivery_id, plugin_id=plugin_id,
           content=content, permission_mode=mode, entry_id=entry_id, now_ms=now_ms, faults=faults)
    row = get(conn, delivery_id)
    changed.deliveries.append(row)
    return row, False, changed


def _require(conn: sqlite3.Connection, delivery_id: str, target: str) -> dict[str, Any]:
    row = get(conn, delivery_id)
    if row["target"]["sessionId"] != target:
        raise NotFound(f"delivery {delivery_id} is not addressed to session {target}",
                       data={"deliveryId": delivery_id, "sessionId": target})
    return row


DELIVERED_META: Final = "collabDelivered"
"""The input line's meta key (internal: never on the wire) carrying what its ``collab.deliver`` answered:
``{"response": answer, "receipt": receipt record or absent}``. The ledger row and its admission are database
rows; once the delivery began, its input line is the one trace a lost database leaves: a retry of the deliver
is answered from it (the keyed one's receipt row is restored from it) and delivers nothing again."""
_DELIVERED_NS: Final = "collabDelivered"


def delivery_ids(plugin_id: str, source_session_id: str, idempotency_key: str) -> tuple[str, str]:
    """(delivery id, admission entry id) of a delivery, derived from its idempotency triple: a retry after
    the database was lost finds the input line of the delivery it made (:func:`input_message_id`)."""
    digest = derived_id("collab.deliver", plugin_id, source_session_id, idempotency_key)
    return "col_" + digest, "q_" + digest


def answer_from_header(entry: Mapping[str, Any], content: str, key: ReceiptKey | None) -> dict[str, Any]:
    """What a retry of a deliver is answered from a transcript header's entry of it
    (``store.transcripts.rewrite.header_delivery``: its input line was cut or archived since): the retry's
    ``content`` put back where the entry names its hash (another content is ``IDEMPOTENCY_CONFLICT``, as the
    ledger row would say); the first answer for the keyed call the entry names, the delivery ``replayed``
    for any other retry."""
    if hashlib.sha256(content.encode("utf-8")).hexdigest() != entry.get("contentSha256"):
        raise IdempotencyConflict(f"idempotencyKey of delivery {entry.get('deliveryId')} was already used for "
                                  "another delivery (content differs)",
                                  data={"deliveryId": entry.get("deliveryId"), "differs": ["content"]})
    said = entry.get("response")
    response = {k: ({**part, "content": content} if k in ("delivery", "entry") and isinstance(part, Mapping)
                    else part) for k, part in (said.items() if isinstance(said, Mapping) else ())}
    receipt = entry.get("receipt")
    if key is not None and isinstance(receipt, Mapping) \
            and (receipt.get("clientId"), receipt.get("submissionId")) == (key.client_id, key.submission_id):
        if (receipt.get("method"), receipt.get("fingerprint")) != (key.method, key.fingerprint):
            raise IdempotencyConflict("submissionId was already used for another request",
                                      data={"submissionId": key.submission_id})
        return response
    return {"delivery": response["delivery"], "replayed": True}


def has_row(conn: sqlite3.Connection, delivery_id: str) -> bool:
    return conn.execute("SELECT 1 FROM session_collaboration_messages WHERE id = ?",
                        (delivery_id,)).fetchone() is not None


def keep_delivered(conn: sqlite3.Connection, delivery_id: str, carried: Mapping[str, Any], now_ms: int) -> None:
    """Until its begin writes the input line: what the deliver answered (:data:`DELIVERED_META`)."""
    set_value(conn, _DELIVERED_NS, delivery_id, dict(carried), now_ms)


def delivered_record(conn: sqlite3.Connection, delivery_id: str) -> dict[str, Any] | None:
    got = get_value(conn, _DELIVERED_NS, delivery_id, lenient=True)
    return dict(got[0]) if got is not None and isinstance(got[0], Mapping) else None


def forget_delivered(conn: sqlite3.Connection, delivery_id: str) -> None:
    """The input line carries it now (or the delivery ended without one)."""
    delete_value(conn, _DELIVERED_NS, delivery_id)


_SETTLED: Final = ("running", "completed", "failed", "cancelled", "interrupted")
"""The statuses of a delivery that can no longer begin (its input line written, or never to be)."""


def prune_delivered(conn: sqlite3.Connection) -> int:
    """Boot: the answers kept for deliveries that can no longer begin (interrupted, cancelled, lost): no input
    line will carry them. Only an answer whose delivery a scan of the table finds settled, or finds not at all,
    goes: one whose status is damaged (it may still begin) is kept, and so is one a damaged index would hide
    from a lookup (``NOT INDEXED``: a prune never deletes what a read missed)."""
    settled = ", ".join(f"'{status}'" for status in _SETTLED)
    return conn.execute(
        "DELETE FROM kv WHERE ns = ? AND key NOT IN (SELECT id FROM session_collaboration_messages NOT INDEXED "
        f"WHERE status NOT IN ({settled}))", (_DELIVERED_NS,)).rowcount


def input_message_id(delivery_id: str) -> str:
    """The id of the target's input line for a delivery (deterministic: a retry finds it)."""
    return COLLAB_INPUT_ID_PREFIX + delivery_id


def provenance(row: Mapping[str, Any]) -> dict[str, Any]:
    """``meta.sessionMessage`` of the input line: where this user row came from."""
    out = {"deliveryId": row["id"], "pluginId": row["pluginId"], "kind": row["kind"],
           "sourceSessionId": row["source"]["sessionId"], "sourceTitle": row["source"]["title"],
           "remainingHops": row["remainingHops"], "sentAt": row["createdAt"]}
    if row.get("replyToMessageId"):
        out["replyToMessageId"] = row["replyToMessageId"]
    return out


def check_begin(conn: sqlite3.Connection, delivery_id: str, target: str, turn_id: str,
                landed: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """May ``turn_id`` begin the delivery? Reads only; raises otherwise. ``landed``: the ref of its
    input line if the target's transcript holds it. Returns the row and what is left to do:

    * ``"new"``: write the input line, then :func:`begin`;
    * ``"landed"``: the line is in the transcript under this turn but the ledger never recorded the
      begin (the host died between the two): only the ledger is left;
    * ``"begun"``: this turn began it (a retry of the same begin, whatever happened to it since).
    """
    row = _require(conn, delivery_id, target)
    if row.get("turnId") == turn_id:
        return row, "begun"
    if landed is not None:
        began = landed.get("turnId")
        if began != turn_id:
            raise Conflict(f"delivery {delivery_id} began in turn {began} (its input row is in the transcript)",
                           data={"deliveryId": delivery_id, "turnId": began, "status": row["status"]})
        if row.get("turnId") is None and row["status"] in _UNBOUND:
            _check_turn_free(conn, delivery_id, turn_id)
            return row, "landed"
    if row["status"] != "queued":
        raise Conflict(f"delivery {delivery_id} is {row['status']}, not queued",
                       data={"deliveryId": delivery_id, "status": row["status"]})
    status = conn.execute("SELECT status FROM turns WHERE id = ? AND session_id = ?", (turn_id, target)).fetchone()
    if status is None:
        raise NotFound(f"turn {turn_id} not found in session {target}", data={"turnId": turn_id})
    if status[0] != "running":
        raise Conflict(f"turn {turn_id} is {status[0]}; a delivery begins in a running turn",
                       data={"turnId": turn_id, "status": status[0]})
    _check_turn_free(conn, delivery_id, turn_id)
    _check_ceiling(conn, target, row["permissionCeiling"])
    return row, "new"


_UNBOUND: Final = ("queued", "interrupted", "cancelled")
"""What a delivery whose input line landed without its commit can be: still queued (held), interrupted
(boot consumed the admission its cut turn had taken) or cancelled since."""


def _check_turn_free(conn: sqlite3.Connection, delivery_id: str, turn_id: str) -> None:
    other = conn.execute("SELECT id FROM session_collaboration_messages WHERE turn_id = ? AND id != ?",
                         (turn_id, delivery_id)).fetchone()
    if other is not None:
        raise Conflict(f"turn {turn_id} already runs another delivery", data={"turnId": turn_id})


def _drop_admission(conn: sqlite3.Connection, changed: Changed, target: str, delivery_id: str, now_ms: int,
                    faults: Faults) -> None:
    for (entry_id,) in conn.execute("SELECT id FROM turn_queue WHERE session_id = ? AND session_message_id = ?",
                                    (target, delivery_id)).fetchall():
        changed.queues[target] = queue.drop(conn, target, entry_id, now_ms=now_ms, faults=faults).entries


def as_begun(row: Mapping[str, Any], turn_id: str, begun_at: int) -> dict[str, Any]:
    """The delivery as its begin left it (the answer that begin gave): running in ``turn_id`` since
    ``begun_at`` (its input line's time), before any settlement, cancel or restart changed it."""
    out = {k: v for k, v in row.items() if k not in ("result", "error", "callbackId")}
    out.update(status="running", turnId=turn_id, updatedAt=begun_at)
    return out


def begin(conn: sqlite3.Connection, delivery_id: str, target: str, turn_id: str, now_ms: int, *,
          landed: Mapping[str, Any] | None = None, faults: Faults = NO_FAULTS) -> tuple[dict[str, Any], Changed]:
    """queued → running in ``turn_id`` (a running turn of the target); the ceiling is checked again.
    An admission still in the queue (the controller did not take it) is consumed: it has begun.

    ``landed``: the ref of the input line already in the transcript (:func:`check_begin`): the begin
    is recorded if the ledger lacks it (:func:`bind_landed`) and the answer is the first try's
    (:func:`as_begun`), whatever happened to the delivery since."""
    row, how = check_begin(conn, delivery_id, target, turn_id, landed)
    if how == "new":
        changed = Changed()
        conn.execute("UPDATE session_collaboration_messages SET status = 'running', turn_id = ?, updated_at = ? "
                     "WHERE id = ? AND status = 'queued'", (turn_id, now_ms, delivery_id))
        _drop_admission(conn, changed, target, delivery_id, now_ms, faults)
        started = get(conn, delivery_id)
        changed.deliveries.append(started)
        return started, changed
    if landed is None:  # begun by this turn, and a rewrite dropped its input row since: nothing to answer with
        raise Conflict(f"delivery {delivery_id} began in turn {turn_id}; its input row is no longer in the "
                       "transcript", data={"deliveryId": delivery_id, "turnId": turn_id, "status": row["status"]})
    changed = bind_landed(conn, delivery_id, target, turn_id, now_ms, faults=faults)
    return as_begun(get(conn, delivery_id), turn_id, int(landed["createdAt"])), changed


def bind_landed(conn: sqlite3.Connection, delivery_id: str, target: str, turn_id: str, now_ms: int, *,
                faults: Faults = NO_FAULTS) -> Changed:
    """Record a begin whose input line (in ``turn_id``) landed but whose commit never came: the
    delivery is bound to that turn and its admission is consumed; a queued one is running if the turn
    still runs, else interrupted (the restart that cut the turn would have interrupted it; nothing
    replays it). Nothing to do for a delivery already bound to a turn or settled."""
    row = _require(conn, delivery_id, target)
    changed = Changed()
    if row.get("turnId") is not None or row["status"] not in _UNBOUND:
        return changed
    turn = conn.execute("SELECT status FROM turns WHERE id = ? AND session_id = ?", (turn_id, target)).fetchone()
    free = conn.execute("SELECT 1 FROM session_collaboration_messages WHERE turn_id = ?", (turn_id,)).fetchone() is None
    bound = turn_id if turn is not None and free else None
    if bound is None and row["status"] != "queued":
        return changed
    status = row["status"]
    if status == "queued":
        status = "running" if bound is not None and turn is not None and turn[0] == "running" else "interrupted"
    conn.execute("UPDATE session_collaboration_messages SET status = ?, turn_id = ?, updated_at = ? "
                 "WHERE id = ? AND turn_id IS NULL", (status, bound, now_ms, delivery_id))
    _drop_admission(conn, changed, target, delivery_id, now_ms, faults)
    changed.deliveries.append(get(conn, delivery_id))
    return changed


def bind_landed_inputs(conn: sqlite3.Connection, *, now_ms: int) -> int:
    """Boot: every queued delivery whose input line is indexed in its target (the host died between a
    begin's line and its commit) is bound to that line's turn (:func:`bind_landed`; the turn was cut by
    the restart: interrupted, its admission consumed), so no queue entry hands out a delivery that began.
    Returns how many."""
    rows = conn.execute(
        "SELECT c.id, c.target_session_id, m.turn_id FROM session_collaboration_messages c "
        "JOIN messages m ON m.id = ? || c.id AND m.session_id = c.target_session_id "
        "WHERE c.status = 'queued' AND c.turn_id IS NULL AND m.deleted = 0 AND m.turn_id IS NOT NULL",
        (COLLAB_INPUT_ID_PREFIX,)).fetchall()
    bound = 0
    for delivery_id, target, turn_id in rows:
        if bind_landed(conn, delivery_id, target, turn_id, now_ms).deliveries:
            bound += 1
    return bound


def _projection(status: str, result: str | None, error: str | None) -> str:
    text = result if status == "completed" else (error or "failed")
    text = text or ""
    if len(text) > RESULT_PROJECTION_CHARS:
        text = text[:RESULT_PROJECTION_CHARS] + f"… [{len(text) - RESULT_PROJECTION_CHARS} more characters]"
    return f"[{status}] {text}".rstrip()


def _callback(conn: sqlite3.Connection, changed: Changed, row: Mapping[str, Any], status: str, result: str | None,
              error: str | None, *, callback_id: str, entry_id: str, now_ms: int, faults: Faults) -> None:
    """At most one completion row back to the source, bound to an admission in the source's queue."""
    if row["kind"] == "completion" or not row["notifyOnCompletion"]:
        return
    source, target = row["source"]["sessionId"], row["target"]["sessionId"]
    if not _exists(conn, source):
        return  # the sender is gone: nothing to call back (the delivery keeps available: false)
    if conn.execute("SELECT 1 FROM session_collaboration_messages WHERE kind = 'completion' "
                    "AND reply_to_message_id = ?", (row["id"],)).fetchone():
        return
    content = _projection(status, result, error)
    _insert(conn, delivery_id=callback_id, plugin_id=row["pluginId"], source=target, target=source,
            kind="completion", content=content, notify=False, reply_to=row["id"], key=f"completion:{row['id']}",
            hops=0, ceiling=row["permissionCeiling"], now_ms=now_ms)
    try:
        mode = _check_ceiling(conn, source, row["permissionCeiling"])
        _admit(conn, changed, session_id=source, delivery_id=callback_id, plugin_id=row["pluginId"],
               content=content, permission_mode=mode, entry_id=entry_id, now_ms=now_ms, faults=faults)
    except (LimitExceeded, PermissionDenied) as refused:
        # recorded, never queued: a full queue cannot take it, and a sender whose mode now exceeds the
        # ceiling it gave the delivery would refuse it at every begin (the rule deliver applies to a target)
        error = "QUEUE_FULL" if isinstance(refused, LimitExceeded) else "PERMISSION_DENIED"
        conn.execute("UPDATE session_collaboration_messages SET status = 'failed', error = ? WHERE id = ?",
                     (error, callback_id))
    changed.deliveries.append(get(conn, callback_id))


def settle(conn: sqlite3.Connection, delivery_id: str, target: str, *, turn_id: str, status: str,
           result: str | None, error: str | None, callback_id: str, entry_id: str, now_ms: int,
           faults: Faults = NO_FAULTS) -> tuple[dict[str, Any], Changed]:
    """running → completed | failed, by its own turn; the completion callback in the same transaction."""
    if status not in ("completed", "failed"):
        raise InvalidInput("status must be completed or failed", data={"field": "status"})
    for name, value in (("result", result), ("error", error)):
        if value is not None and len(value) > MAX_RESULT_CHARS:
            raise InvalidInput(f"{name} is longer than {MAX_RESULT_CHARS} characters", data={"field": name})
    row = _require(conn, delivery_id, target)
    if row["status"] in ("completed", "failed") and row.get("turnId") == turn_id and row["status"] == status \
            and row.get("result") == result and row.get("error") == error:
        return row, Changed()  # a retry of the same settlement
    if row["status"] != "running":
        raise Conflict(f"delivery {delivery_id} is {row['status']}, not running",
                       data={"deliveryId": delivery_id, "status": row["status"]})
    if row.get("turnId") != turn_id:
        raise Conflict(f"delivery {delivery_id} runs in turn {row.get('turnId')}, not {turn_id}",
                       data={"deliveryId": delivery_id, "turnId": row.get("turnId")})
    changed = Changed()
    conn.execute("UPDATE session_collaboration_messages SET status = ?, result = ?, error = ?, updated_at = ? "
                 "WHERE id = ? AND status = 'running'", (status, result, error, now_ms, delivery_id))
    _callback(conn, changed, row, status, result, error, callback_id=callback_id, entry_id=entry_id,
              now_ms=now_ms, faults=faults)
    settled = get(conn, delivery_id)
    changed.deliveries.insert(0, settled)
    return settled, changed


def settle_for_turn(conn: sqlite3.Connection, target: str, turn_id: str, turn_status: str, error_code: str | None,
                    *, new_ids: Any, now_ms: int, faults: Faults = NO_FAULTS) -> Changed:
    """The target's turn ended with its delivery still running: completed → completed, else failed."""
    found = conn.execute("SELECT id FROM session_collaboration_messages WHERE turn_id = ? AND status = 'running'",
                         (turn_id,)).fetchone()
    if found is None:
        return Changed()
    status = "completed" if turn_status == "completed" else "failed"
    callback_id, entry_id = new_ids()
    _, changed = settle(conn, found[0], target, turn_id=turn_id, status=status, result=None,
                        error=None if status == "completed" else f"turn {turn_status}: {error_code or 'no result'}",
                        callback_id=callback_id, entry_id=entry_id, now_ms=now_ms, faults=faults)
    return changed


def cancel(conn: sqlite3.Connection, delivery_id: str, target: str, *, now_ms: int,
           faults: Faults = NO_FAULTS) -> tuple[dict[str, Any], Changed]:
    """queued/running → cancelled; a queued one loses its admission. The target session stays."""
    row = _require(conn, delivery_id, target)
    changed = Changed()
    if row["status"] == "cancelled":
        return row, changed
    if row["status"] not in ("queued", "running"):
        raise Conflict(f"delivery {delivery_id} already ended ({row['status']})",
                       data={"deliveryId": delivery_id, "status": row["status"]})
    _drop_admission(conn, changed, target, delivery_id, now_ms, faults)
    conn.execute("UPDATE session_collaboration_messages SET status = 'cancelled', updated_at = ? WHERE id = ?",
                 (now_ms, delivery_id))
    forget_delivered(conn, delivery_id)  # it never begins now: no input line will carry its answer
    cancelled = get(conn, delivery_id)
    changed.deliveries.append(cancelled)
    return cancelled, changed


def remove_admission(conn: sqlite3.Connection, target: str, entry_id: str, *, now_ms: int,
                     faults: Faults = NO_FAULTS) -> tuple[queue.Outcome, Changed]:
    """``session.queueRemove``: the entry goes (:func:`store.queue.remove`); a queued delivery it admitted
    is cancelled with it. Without its admission the delivery could never begin, and it would have stayed
    ``queued`` until the next start interrupted it. A damaged entry (its record does not read) names its
    delivery by its ``session_message_id`` column when that still reads, and the delivery is cancelled the
    same way.

    Only a delivery addressed to ``target`` (the entry's session): an entry elsewhere naming it is no
    admission of it (``store/queue.py`` refuses to write one now; a row written before that must still
    not let one session's queue cancel another session's work)."""
    out = queue.remove(conn, target, entry_id, now_ms=now_ms, faults=faults)
    changed = Changed()
    if out.plan.entry is not None:
        delivery_id = out.plan.entry.session_message_id
    else:  # a damaged entry: the delivery its session_message_id names, if that column still reads
        delivery_id = out.plan.damaged.delivery_id if out.plan.damaged is not None else None
    if delivery_id is not None and out.plan.changed:
        if conn.execute("UPDATE session_collaboration_messages SET status = 'cancelled', updated_at = ? "
                        "WHERE id = ? AND target_session_id = ? AND status = 'queued'",
                        (now_ms, delivery_id, target)).rowcount:
            forget_delivered(conn, delivery_id)
            changed.deliveries.append(get(conn, delivery_id))
    return out, changed


# ---------------------------------------------------------------------------
# provenance of transcript input (pure)


_PROVENANCE = {  # key -> (what writes it, what a line carrying it is)
    "sessionMessage": ("collab.begin", "collaboration input"),
    "fromAgent": ("an import of a sub-agent thread", "a prompt from its parent agent"),
}
HOST_PROVENANCE = tuple(_PROVENANCE)
"""``meta`` keys only the host writes (``protocol.models_records.HOST_META_KEYS``): collaboration
input (collab.begin) and an imported sub-agent thread's prompt from its parent agent."""


def check_rewrite(old: Mapping[str, Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> None:
    """A rewrite keeps host-written provenance exactly: no stripped, edited or forged
    ``meta.sessionMessage`` (collaboration input) or ``meta.fromAgent`` (a parent agent's prompt).

    ``old``: the live transcript's records by id; ``new``: the records the rewrite writes.
    Dropping such a line entirely is allowed (it does not become human input); adding a line with the id of
    a collaboration input (``collab-<deliveryId>``) that is not there is not (a later begin would take it for
    its own), nor is naming one as the message another line revises (``meta.revisionRootId``: that line would
    become a variant of the input, its edit or regeneration).
    """
    for rec in new:
        rid = str(rec.get("id"))
        before = old.get(rid)
        if rid.startswith(COLLAB_INPUT_ID_PREFIX) and before is None:
            raise PermissionDenied(f"message {rid}: ids starting with {COLLAB_INPUT_ID_PREFIX!r} are the "
                                   "collaboration input lines the host writes (collab.begin); a client cannot "
                                   "add one", data={"messageId": rid})
        root = meta_of(rec).get("revisionRootId")
        had = meta_of(before).get("revisionRootId") if before is not None else None
        if not rid.startswith(COLLAB_INPUT_ID_PREFIX) and isinstance(root, str) \
                and root.startswith(COLLAB_INPUT_ID_PREFIX) and root != had:
            raise PermissionDenied(f"message {rid}: meta.revisionRootId names collaboration input {root}; a "
                                   "message cannot take its place as a revision of it",
                                   data={"messageId": rid, "revisionRootId": root})
        for key, (written_by, what) in _PROVENANCE.items():
            mine = meta_of(rec).get(key)
            theirs = meta_of(before).get(key) if before is not None else None
            if theirs is None and mine is None:
                continue
            if theirs is None:
                raise PermissionDenied(f"message {rec.get('id')}: meta.{key} is written by the host "
                                       f"({written_by}), a client cannot add it",
                                       data={"messageId": rec.get("id")})
            if mine is None:
                raise PermissionDenied(f"message {rec.get('id')} is {what}; its provenance cannot be stripped",
                                       data={"messageId": rec.get("id")})
            assert before is not None
            if mine != theirs or rec.get("blocks") != before.get("blocks") or rec.get("role") != before.get("role"):
                raise PermissionDenied(f"message {rec.get('id')} is {what}; it cannot be edited",
                                       data={"messageId": rec.get("id")})


def is_collaboration_input(record: Mapping[str, Any]) -> bool:
    return isinstance(meta_of(record).get("sessionMessage"), Mapping)
