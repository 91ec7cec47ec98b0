"""Appending messages to one session: what the index knows, a pure plan, the encoded lines.

A group of ``session.appendMessage`` requests that waited in one session
actor's mailbox together is decided in three steps, all run in that actor's
worker thread in one hop (after :func:`gather`'s one read snapshot, the plan
needs no I/O):

1. :func:`gather` (read): stored receipts of the requests that carry one, the
   ids the index already holds (the client's id and its ``{sessionId}:{id}``
   spelling), whether a held line of this session is still a streaming
   reservation, and which named turns exist;
2. :func:`plan_appends` (pure): one :class:`Outcome` per request, by the rows
   of the table below, first match wins, with the encoded line of every write
   (each carrying its receipt in ``meta.receipt``: one write + one fdatasync
   makes effect and receipt durable together);
3. the actor writes :attr:`AppendPlan.lines` and indexes :attr:`AppendPlan.writes`.

====================================================  =========================================
situation                                             outcome
====================================================  =========================================
a stored receipt, same request                        :class:`Replay` of the stored response
a stored receipt, another request                     :class:`Refuse` ``IDEMPOTENCY_CONFLICT``
the message does not normalize or encode              :class:`Refuse` with that error
the id is held by another session (D444)              continue with ``{sessionId}:{id}``,
                                                      ``remappedFrom`` = the client's id
the id is held here (index or earlier in the group)   :class:`Write` ``replace=True``, same seq
and is streaming, the new one a terminal assistant    (the steering replacement)
the id is held here otherwise                         :class:`Replay` of the held row,
                                                      ``replayed: true`` (no new line)
a new id                                              :class:`Write` with the next seq
====================================================  =========================================
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store import receipts
from store.errors import StoreError
from store.indexing.group_commit import is_corruption
from store.indexing.index import IndexRecord, index_messages, message_ref, session_row
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.indexing.sql_lists import in_chunks
from store.jsonio import dumps_line, loads_line
from store.receipts import ReceiptKey
from store.transcripts.records import is_streaming, normalize_message, with_receipt
from store.transcripts.transcript import read_spans

__all__ = [
    "AppendPlan",
    "AppendRequest",
    "Held",
    "Known",
    "Outcome",
    "Refuse",
    "Replay",
    "Write",
    "gather",
    "index_appended",
    "plan_appends",
]


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One ``session.appendMessage``: the client's message (validated), its turn and receipt."""

    message: Mapping[str, Any]
    turn_id: str | None = None
    receipt: ReceiptKey | None = None


@dataclass(frozen=True, slots=True)
class Held:
    """A message id the index (or the session's not-yet-indexed tail) already holds."""

    session_id: str
    ref: Mapping[str, Any]
    """Its MessageRef: id, sessionId, seq, turnId, role, createdAt."""
    streaming: bool = False
    """This session's line is a streaming reservation (only looked up where it matters)."""


@dataclass(frozen=True, slots=True)
class Known:
    """What :func:`gather` found; everything :func:`plan_appends` needs."""

    receipts: Sequence[Any] = ()
    """Per request: ``None``, the stored response, or the :class:`StoreError` to refuse with."""
    held: Mapping[str, Held] = field(default_factory=dict)
    turns: frozenset[str] = frozenset()
    """Ids of the named turns that exist (a line's ``turnId`` is indexed only then)."""


@dataclass(frozen=True, slots=True)
class Replay:
    response: Any


@dataclass(frozen=True, slots=True)
class Refuse:
    error: StoreError


@dataclass(frozen=True, slots=True)
class Write:
    record: dict[str, Any]
    """The line's record, receipt included in ``meta.receipt``."""
    line: bytes
    """``record`` encoded as its transcript line."""
    seq: int
    ref: dict[str, Any]
    replace: bool = False
    remapped_from: str | None = None

    def response(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": dict(self.ref), "replayed": False}
        if self.remapped_from is not None:
            out["remappedFrom"] = self.remapped_from
        return out


Outcome = Replay | Refuse | Write


@dataclass(frozen=True, slots=True)
class AppendPlan:
    outcomes: list[Outcome]
    """One per request, in request order."""
    last_seq: int
    """The session's last seq once every write of the plan is indexed."""

    @property
    def writes(self) -> list[Write]:
        """The writes, in file order."""
        return [o for o in self.outcomes if isinstance(o, Write)]

    @property
    def lines(self) -> list[bytes]:
        return [o.line for o in self.outcomes if isinstance(o, Write)]


def _client_id(message: Mapping[str, Any]) -> str | None:
    value = message.get("id")
    return value if isinstance(value, str) else None


def plan_appends(
    session_id: str, requests: Sequence[AppendRequest], known: Known, *, last_seq: int, now_ms: int
) -> AppendPlan:
    """Decide every request of a group (pure; see the module's table)."""
    outcomes: list[Outcome] = []
    group: dict[str, Write] = {}  # id -> newest write of this group
    seq = last_seq
    for i, req in enumerate(requests):
        stored = known.receipts[i] if i < len(known.receipts) else None
        if isinstance(stored, StoreError):
            outcomes.append(Refuse(stored))
            continue
        if stored is not None:
            outcomes.append(Replay(stored))
            continue
        try:
            rec = normalize_message(req.message, now_ms=now_ms, turn_id=req.turn_id)
        except StoreError as exc:
            outcomes.append(Refuse(exc))
            continue
        remapped_from = None
        mid = rec["id"]
        owner = known.held.get(mid)
        if mid not in group and owner is not None and owner.session_id != session_id:
            remapped_from = mid
            mid = f"{session_id}:{mid}"
            rec = {**rec, "id": mid}
        prior_write = group.get(mid)
        prior_held = known.held.get(mid) if prior_write is None else None
        if prior_held is not None and prior_held.session_id != session_id:
            prior_held = None  # cannot happen for a D444 spelling; never replay another session's row
        terminal = rec.get("role") == "assistant" and not is_streaming(rec)
        if prior_write is not None or prior_held is not None:
            streaming = is_streaming(prior_write.record) if prior_write is not None else bool(
                prior_held is not None and prior_held.streaming)
            held_ref = prior_write.ref if prior_write is not None else dict(prior_held.ref)  # type: ignore[union-attr]
            if not (streaming and terminal):
                outcomes.append(Replay({"message": dict(held_ref), "replayed": True}))
                continue
            new_seq, ref, replace = int(held_ref["seq"]), {**held_ref, "role": rec.get("role")}, True
        else:
            turn = rec.get("turnId")
            new_seq, replace = seq + 1, False
            ref = message_ref(session_id, new_seq, rec,
                              turn if isinstance(turn, str) and turn in known.turns else None)
        record = _with_receipt(rec, req.receipt, remapped_from)
        try:
            line = dumps_line(record)
        except StoreError as exc:
            outcomes.append(Refuse(exc))
            continue
        if not replace:
            seq = new_seq
        write = Write(record, line, new_seq, ref, replace=replace, remapped_from=remapped_from)
        group[mid] = write
        outcomes.append(write)
    return AppendPlan(outcomes, seq)


def _with_receipt(rec: dict[str, Any], key: ReceiptKey | None, remapped_from: str | None) -> dict[str, Any]:
    if key is None:
        return rec
    extra = {"remappedFrom": remapped_from} if remapped_from is not None else {}
    return with_receipt(rec, receipts.file_record(key, **extra))


def gather(
    conn: sqlite3.Connection,
    path: Path,
    session_id: str,
    requests: Sequence[AppendRequest],
    *,
    pending: Mapping[str, Held] | None = None,
) -> Known:
    """One read snapshot (plus the lines of held streaming candidates) for :func:`plan_appends`.

    ``pending`` is the session actor's record of ids it wrote that the index
    does not cover yet; it wins over what the index says.
    """
    found: list[Any] = []
    for req in requests:
        if req.receipt is None:
            found.append(None)
            continue
        try:
            row = receipts.check(conn, req.receipt)
        except StoreError as exc:
            found.append(exc)
            continue
        found.append(None if row is None else row["response"])
    candidates: list[str] = []
    turn_ids: set[str] = set()
    for req in requests:
        mid = _client_id(req.message)
        if mid is not None:
            candidates += [mid, f"{session_id}:{mid}"]
        turn = req.turn_id if req.turn_id is not None else req.message.get("turnId")
        if isinstance(turn, str):
            turn_ids.add(turn)
    held: dict[str, Held] = {}
    spans: dict[str, tuple[int, int]] = {}
    for marks, chunk in in_chunks(list(dict.fromkeys(candidates))):
        for mid, sid, seq, off, length, turn, role, created in conn.execute(
            "SELECT id, session_id, seq, line_offset, line_len, turn_id, role, created_at FROM messages "
            f"WHERE id IN ({marks})", chunk,
        ):
            held[mid] = Held(sid, {"id": mid, "sessionId": sid, "seq": seq, "turnId": turn, "role": role,
                                   "createdAt": created})
            if sid == session_id and off is not None:
                spans[mid] = (int(off), int(length))
    if pending:
        held.update({mid: h for mid, h in pending.items() if mid in candidates})
        for mid in pending:
            spans.pop(mid, None)
    wanted = [mid for mid in spans if _may_replace(requests, mid, session_id)]
    if wanted:
        for mid, blob in zip(wanted, read_spans(path, [spans[m] for m in wanted]), strict=True):
            try:
                streaming = is_streaming(loads_line(blob))
            except ValueError:
                streaming = False
            old = held[mid]
            held[mid] = Held(old.session_id, old.ref, streaming)
    turns: set[str] = set()
    for marks, chunk in in_chunks(sorted(turn_ids)):
        turns.update(r[0] for r in conn.execute(f"SELECT id FROM turns WHERE id IN ({marks})", chunk))
    return Known(found, held, frozenset(turns))


def _may_replace(requests: Sequence[AppendRequest], held_id: str, session_id: str) -> bool:
    """Whether some request is a terminal assistant for ``held_id`` (only then is the held line read)."""
    for req in requests:
        mid = _client_id(req.message)
        if mid is None or held_id not in (mid, f"{session_id}:{mid}"):
            continue
        meta = req.message.get("meta")
        streaming = isinstance(meta, Mapping) and meta.get("status") == "streaming"
        if req.message.get("role") == "assistant" and not streaming:
            return True
    return False


def index_appended(
    conn: sqlite3.Connection,
    session_id: str,
    path: Path,
    items: Sequence[IndexRecord],
    *,
    indexed_len: int,
    file_epoch: str | None,
    now_ms: int,
) -> str:
    """The DB writer's half of an acknowledged append group: index its lines.

    If that fails (the index drifted from the file, a constraint...), the
    session's index is brought in line with its transcript instead — the file
    is the source of truth and already holds the lines. Returns which of the
    two happened. A corrupt database is not masked: it propagates.
    """
    conn.execute("SAVEPOINT index_appended")
    try:
        index_messages(conn, session_id, items, indexed_len=indexed_len, file_epoch=file_epoch, now_ms=now_ms)
    except Exception as exc:
        conn.execute("ROLLBACK TO index_appended")
        conn.execute("RELEASE index_appended")
        if isinstance(exc, sqlite3.DatabaseError) and is_corruption(exc):
            raise
        row = session_row(conn, session_id)
        plan = plan_reconcile(path, int(row["_indexedLen"]) if row else 0, row["_fileEpoch"] if row else None)
        apply_plan(conn, session_id, plan, now_ms=now_ms)
        return "reconciled"
    conn.execute("RELEASE index_appended")
    return "indexed"
