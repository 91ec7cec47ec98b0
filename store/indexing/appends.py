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
a user message's ``meta.revisionRootId`` names a      :class:`Refuse` ``INVALID_PARAMS``
live message of this session
it names an archived message of another family        the original family is written instead
                                                      (:attr:`Known.roots`: an edit of an edit)
the id is held by another session (D444), or by       continue with ``{sessionId}:{id}``,
none while this session holds ``{sessionId}:{id}``    ``remappedFrom`` = the client's id
the id is held here (index or earlier in the group)   :class:`Write` ``replace=True``, same seq
and is streaming, the new one a terminal assistant    and owning turn (the steering replacement);
                                                      :class:`Refuse` ``IDEMPOTENCY_CONFLICT`` if
                                                      it names another turn
the id is held here, another role or other blocks     :class:`Refuse` ``IDEMPOTENCY_CONFLICT``
(neither is a streaming snapshot; or the held row     (the id names different content)
awaits its final and the new one has another role)
the id is held here otherwise                         :class:`Replay` of the held row,
                                                      ``replayed: true`` (no new line)
a new steering row (``meta.steering``) naming a turn  :class:`Refuse` ``INVALID_PARAMS`` (it must
another session claimed for a collaboration delivery  target that delivery's session; seed 003)
a new id                                              :class:`Write` with the next seq
====================================================  =========================================
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from store import receipts
from store.errors import Conflict, CorruptData, IdempotencyConflict, InvalidInput, SessionNotFound, StoreError
from store.ids import remapped_message_id
from store.indexing import index
from store.indexing.group_commit import attempt, db_error
from store.indexing.index import IndexRecord, PendingRows, index_messages, message_ref
from store.indexing.message_ids import MessageIds
from store.indexing.reconcile import (
    TailScan,
    apply_plan,
    plan_missing_bytes,
    plan_reconcile,
    read_header,
    scan_lines,
    session_info_settings,
)
from store.indexing.sql_lists import in_chunks
from store.jsonio import dumps_line, loads_line
from store.receipts import ReceiptKey
from store.revisions import RevisionFile, family_root, read_revisions
from store.transcripts.records import (
    awaits_final,
    is_streaming,
    message_record,
    normalize_message,
    rfc3339_to_ms,
    with_receipt,
)
from store.transcripts.transcript import read_spans

T = TypeVar("T")

__all__ = [
    "AppendPlan",
    "AppendRequest",
    "Held",
    "content_of",
    "Known",
    "Outcome",
    "Refuse",
    "Replay",
    "Write",
    "Written",
    "gather",
    "follows",
    "index_written",
    "info_answer",
    "index_written_batch",
    "index_written_run",
    "join_written",
    "known_without_reads",
    "plan_appends",
]


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One ``session.appendMessage``: the client's message (validated), its turn and receipt."""

    message: Mapping[str, Any]
    turn_id: str | None = None
    receipt: ReceiptKey | None = None
    validated: bool = False
    """``message`` was dumped from its validated protocol model: its record is built without
    checking it a second time (:func:`store.transcripts.records.message_record`)."""


@dataclass(frozen=True, slots=True)
class Held:
    """A message id the index (or the session's not-yet-indexed tail) already holds."""

    session_id: str
    ref: Mapping[str, Any]
    """Its MessageRef: id, sessionId, seq, turnId, role, createdAt."""
    streaming: bool = False
    """This session's line awaits its final (a streaming reservation, or a reply promoted from its
    checkpoint: ``records.awaits_final``; looked up, like :attr:`content`, only for a repeated id)."""
    content: tuple[Any, Any] | None = None
    """:func:`content_of` its stored line (read only when a request repeats its id); None: not known."""


def content_of(record: Mapping[str, Any]) -> tuple[Any, Any]:
    """What a repeated message id must carry again to be a replay: its role and blocks (not its
    ``createdAt``, receipt or other meta, which a retry may legitimately fill differently). A reply
    promoted from its in-flight checkpoint is never compared: it awaits its final
    (``records.awaits_final``), like a streaming reservation."""
    return record.get("role"), record.get("blocks")


@dataclass(frozen=True, slots=True)
class Known:
    """What :func:`gather` found; everything :func:`plan_appends` needs."""

    receipts: Sequence[Any] = ()
    """Per request: ``None``, the stored response, or the :class:`StoreError` to refuse with."""
    held: Mapping[str, Held] = field(default_factory=dict)
    turns: frozenset[str] = frozenset()
    """Ids of the named turns of this session (a line's ``turnId`` is indexed only then: a turn id
    another session owns is kept in the line, bound to no row, as ``index_written`` binds it)."""
    aborted: frozenset[str] = frozenset()
    """Those of them that ended ``aborted``: a new user prompt for one is refused (its turn was cut,
    by a restart or a recovery; the queue hands the prompt out again for a new turn)."""
    roots: Mapping[str, str | None] = field(default_factory=dict)
    """Per id a user message names in ``meta.revisionRootId`` (:func:`named_root`): the family it joins
    (:func:`store.revisions.family_root`), or ``None`` when it is a live message of this session."""
    foreign_deliveries: Mapping[str, str] = field(default_factory=dict)
    """Named turns that another session claimed for a collaboration delivery: turn id -> that
    session (a steering row naming one is refused: it must target the delivery's session)."""


def named_root(message: Mapping[str, Any]) -> str | None:
    """The message a user message names as the one it revises (``meta.revisionRootId``), when that is
    not the message itself."""
    if message.get("role") != "user":
        return None
    meta = message.get("meta")
    root = meta.get("revisionRootId") if isinstance(meta, Mapping) else None
    return root if isinstance(root, str) and root and root != message.get("id") else None


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
            rec = (message_record(req.message, req.message["id"], now_ms=now_ms, turn_id=req.turn_id)
                   if req.validated else normalize_message(req.message, now_ms=now_ms, turn_id=req.turn_id))
        except StoreError as exc:
            outcomes.append(Refuse(exc))
            continue
        # a createdAt the record took from ``now_ms`` (the client sent none) is not parsed back for its ref
        created_ms = None if isinstance(req.message.get("createdAt"), str) else now_ms
        named = named_root(rec)
        if named is not None:
            family = known.roots.get(named, named)
            if family is None or named in group:
                outcomes.append(Refuse(InvalidInput(
                    f"meta.revisionRootId {named!r} names a live message of session {session_id}: an edited "
                    "message names the one it revises after that one left the transcript (session.truncateFrom "
                    "mode edit); two live messages of one family would lose one at the next branch switch",
                    data={"field": "message.meta.revisionRootId", "sessionId": session_id, "messageId": named})))
                continue
            if family != named:  # an edit of an edit: the original family
                rec = {**rec, "meta": {**rec["meta"], "revisionRootId": family}}
        remapped_from = None
        mid = rec["id"]
        owner = known.held.get(mid)
        if mid not in group and _remapped_here(known, session_id, mid, owner):
            remapped_from = mid
            mid = remapped_message_id(session_id, mid)
            rec = {**rec, "id": mid}
        prior_write = group.get(mid)
        prior_held = known.held.get(mid) if prior_write is None else None
        if prior_held is not None and prior_held.session_id != session_id:
            prior_held = None  # cannot happen for a D444 spelling; never replay another session's row
        terminal = rec.get("role") == "assistant" and not is_streaming(rec)
        if prior_write is not None or prior_held is not None:
            streaming = awaits_final(prior_write.record) if prior_write is not None else bool(
                prior_held is not None and prior_held.streaming)
            held_ref = prior_write.ref if prior_write is not None else dict(prior_held.ref)  # type: ignore[union-attr]
            if not (streaming and terminal):
                stored = prior_write.record if prior_write is not None else None
                held_content = content_of(stored) if stored is not None else (
                    prior_held.content if prior_held is not None else None)
                settled = not streaming and not is_streaming(rec)  # a streaming snapshot's content moves on
                # a row awaiting its final takes its final or another snapshot of itself: a message of
                # another role under its id (a user's prompt, a tool's output) is other content, never a
                # replay (it would be acknowledged and never written)
                held_role = held_ref.get("role")
                other_role = streaming and held_role is not None and rec.get("role") != held_role
                if other_role or (settled and held_content is not None and held_content != content_of(rec)):
                    outcomes.append(Refuse(IdempotencyConflict(
                        f"message {mid} already holds other content (role or blocks) in session {session_id}; "
                        "a retry must send the same message, a new message needs a new id",
                        data={"sessionId": session_id, "messageId": mid, "seq": held_ref.get("seq")})))
                    continue
                outcomes.append(Replay({"message": dict(held_ref), "replayed": True}))
                continue
            held_turn = held_ref.get("turnId")
            if held_turn is not None and rec.get("turnId") not in (None, held_turn):
                outcomes.append(Refuse(IdempotencyConflict(
                    f"message {mid} is turn {held_turn}'s reply in session {session_id}; its final cannot "
                    f"move it to turn {rec.get('turnId')}",
                    data={"sessionId": session_id, "messageId": mid, "turnId": held_turn})))
                continue
            if held_turn is not None:
                rec = {**rec, "turnId": held_turn}  # the replacing line keeps the owning turn (seed 003)
            # the replaced row's seq and turn; its time is the final line's, as every read and a replay
            # rebuilt from the line's receipt say
            new_seq, replace = int(held_ref["seq"]), True
            ref = {**held_ref, "role": rec.get("role"), "createdAt": rfc3339_to_ms(rec.get("createdAt"), 0)}
        else:
            turn = rec.get("turnId")
            owner_of_turn = known.foreign_deliveries.get(turn) if isinstance(turn, str) else None
            if owner_of_turn is not None and _is_steering(rec):
                outcomes.append(Refuse(InvalidInput(
                    f"turn {turn} runs a collaboration delivery of session {owner_of_turn}: steering into it "
                    f"must target that session, not {session_id}",
                    data={"field": "message.turnId", "sessionId": session_id, "turnId": turn,
                          "targetSessionId": owner_of_turn, "messageId": mid})))
                continue
            if rec.get("role") == "user" and isinstance(turn, str) and turn in known.aborted:
                outcomes.append(Refuse(Conflict(
                    f"turn {turn} of session {session_id} was aborted; a prompt for it is not appended "
                    "(start a new turn for it)",
                    data={"sessionId": session_id, "turnId": turn, "status": "aborted", "messageId": mid})))
                continue
            new_seq, replace = seq + 1, False
            ref = message_ref(session_id, new_seq, rec,
                              turn if isinstance(turn, str) and turn in known.turns else None, created_ms=created_ms)
        record = _with_receipt(rec, req.receipt, remapped_from, new_seq)
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


def _remapped_here(known: Known, session_id: str, mid: str, owner: Held | None) -> bool:
    """Whether the client's id ``mid`` stands for its ``{sessionId}:{id}`` spelling here (D444): another
    session holds it, or nobody does and this session holds the remapped row (the other session's row
    was deleted or rewritten away since: a replay of the original id is still a no-op against the
    remapped row, a final still replaces its reservation)."""
    if owner is not None:
        return owner.session_id != session_id
    spelled = known.held.get(remapped_message_id(session_id, mid))
    return spelled is not None and spelled.session_id == session_id


def _with_receipt(rec: dict[str, Any], key: ReceiptKey | None, remapped_from: str | None,
                  seq: int) -> dict[str, Any]:
    """The line with its receipt; ``extra.seq`` is the seq the append answers, so a rebuilt index answers
    it even when the line has left the transcript for a branch with no live place (reconcile's
    ``restore_archived_receipts``)."""
    if key is None:
        return rec
    extra: dict[str, Any] = {"seq": seq}
    if remapped_from is not None:
        extra["remappedFrom"] = remapped_from
    return with_receipt(rec, receipts.file_record(key, **extra))


def gather(
    conn: sqlite3.Connection,
    path: Path,
    session_id: str,
    requests: Sequence[AppendRequest],
    *,
    pending: Mapping[str, Held] | None = None,
    revisions_path: Path | None = None,
    ids: MessageIds | None = None,
) -> Known:
    """One read snapshot (plus the lines of held streaming candidates) for :func:`plan_appends`.

    ``pending`` is the session actor's record of ids it wrote that the index
    does not cover yet; it wins over what the index says. The caller reads it (and the index log's
    held ids of every session) before this call: an id released from there since was committed first.

    ``ids``: the filter of every indexed message id (:class:`~store.indexing.message_ids.MessageIds`);
    an id it says is certainly absent, in both spellings, is not looked up (the SQL runs for the rest).
    None: every id is looked up.

    On a connection in autocommit mode every statement is a read transaction of its own (its own
    WAL read lock, taken and released; a commit may land between two of them): when more than one
    statement reads, they run in one read transaction, the snapshot this promises. One statement
    (an append without receipt or turn: the id lookup) runs as it is.
    """
    quick = known_without_reads(session_id, requests, pending=pending, ids=ids)
    if quick is not None:
        return quick
    candidates = _candidates(session_id, requests)
    lookup = [mid for mid in candidates if ids is None or ids.might_hold(mid)]
    reads = sum(req.receipt is not None for req in requests)
    reads += bool(lookup)
    reads += any(isinstance(turn, str) for turn, _ in _named_turns(requests))
    if reads < 2 or conn.in_transaction:
        return _gather(conn, path, session_id, requests, pending, revisions_path, candidates, lookup)
    conn.execute("BEGIN")
    try:
        known = _gather(conn, path, session_id, requests, pending, revisions_path, candidates, lookup)
    except BaseException:
        if conn.in_transaction:  # the error raised is the one the caller sees, never one of ending the read
            with suppress(sqlite3.Error):
                conn.rollback()
        raise
    conn.execute("COMMIT")  # a read transaction: it ends, nothing else
    return known


def known_without_reads(session_id: str, requests: Sequence[AppendRequest], *,
                        pending: Mapping[str, Held] | None = None, ids: MessageIds | None = None) -> Known | None:
    """What :func:`gather` finds for a group that needs no read (None: it needs one): no receipt, no named
    turn or revision root, and only new ids, ones the filter (``ids``) rules out in both spellings. Then the
    index holds none of them, and what the index log holds of them (``pending``) is all there is to know:
    the caller need not take a read connection at all (the usual append)."""
    if ids is None:
        return None
    for req in requests:
        if req.receipt is not None or named_root(req.message) is not None:
            return None
        turn = req.turn_id if req.turn_id is not None else req.message.get("turnId")
        if isinstance(turn, str):
            return None
    candidates = _candidates(session_id, requests)
    if any(ids.might_hold(mid) for mid in candidates):
        return None
    held = {mid: h for mid in candidates if (h := pending.get(mid)) is not None} if pending else {}
    return Known([None] * len(requests), held)


def _candidates(session_id: str, requests: Sequence[AppendRequest]) -> list[str]:
    """The ids the requests may find held: each client id and its ``{sessionId}:{id}`` spelling."""
    out: list[str] = []
    for req in requests:
        mid = _client_id(req.message)
        if mid is not None:
            out += [mid, remapped_message_id(session_id, mid)]
    return list(dict.fromkeys(out))


def _gather(conn: sqlite3.Connection, path: Path, session_id: str, requests: Sequence[AppendRequest],
            pending: Mapping[str, Held] | None, revisions_path: Path | None, candidates: Sequence[str],
            lookup: Sequence[str]) -> Known:
    """``lookup``: the ``candidates`` the index may hold (the others are certainly not in it)."""
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
    turn_ids: set[str] = set()
    for req in requests:
        turn = req.turn_id if req.turn_id is not None else req.message.get("turnId")
        if isinstance(turn, str):
            turn_ids.add(turn)
    held: dict[str, Held] = {}
    spans: dict[str, tuple[int, int]] = {}
    for marks, chunk in in_chunks(list(lookup)):
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
    # Every line of this session whose id a request repeats is read (replays only: a new id reads
    # nothing): whether it is a streaming reservation, and its content to compare with the retry's.
    wanted = list(spans)
    if wanted:
        for mid, blob in zip(wanted, read_spans(path, [spans[m] for m in wanted]), strict=True):
            try:
                stored = loads_line(blob)
            except ValueError:
                continue  # unreadable: not a reservation, content unknown (replayed as before)
            old = held[mid]
            held[mid] = Held(old.session_id, old.ref, awaits_final(stored), content_of(stored))
    turns: set[str] = set()
    aborted: set[str] = set()
    for marks, chunk in in_chunks(sorted(turn_ids)):
        for turn_id, status in conn.execute(
                f"SELECT id, status FROM turns WHERE id IN ({marks}) AND session_id = ?", (*chunk, session_id)):
            turns.add(turn_id)
            if status == "aborted":
                aborted.add(turn_id)
    foreign: dict[str, str] = {}
    steered = sorted({t for t, req in _named_turns(requests) if t not in turns and _is_steering(req.message)})
    for marks, chunk in in_chunks(steered):
        for turn_id, target in conn.execute(
                f"SELECT turn_id, target_session_id FROM session_collaboration_messages WHERE turn_id IN ({marks})",
                chunk):
            if target != session_id:
                foreign[turn_id] = target
    return Known(found, held, frozenset(turns), frozenset(aborted),
                 _roots(conn, session_id, requests, pending or {}, revisions_path), foreign)


def _named_turns(requests: Sequence[AppendRequest]) -> list[tuple[str, AppendRequest]]:
    """Each request's named turn (its ``turnId`` param, else its message's), with the request."""
    out: list[tuple[str, AppendRequest]] = []
    for req in requests:
        turn = req.turn_id if req.turn_id is not None else req.message.get("turnId")
        if isinstance(turn, str):
            out.append((turn, req))
    return out


def _is_steering(message: Mapping[str, Any]) -> bool:
    """An accepted steering input (``meta.steering: true``; seed 003, active-turn steering)."""
    meta = message.get("meta")
    return isinstance(meta, Mapping) and meta.get("steering") is True


def _roots(conn: sqlite3.Connection, session_id: str, requests: Sequence[AppendRequest],
           pending: Mapping[str, Held], revisions_path: Path | None) -> dict[str, str | None]:
    """:attr:`Known.roots`: nothing to read unless a request names a root other than itself. A named id is
    found by the id the client chose or by its ``{sessionId}:{id}`` spelling (the message was stored so
    because another session held that id): a family keyed by that spelling is the one the edit joins."""
    named = sorted({r for req in requests if (r := named_root(req.message)) is not None})
    if not named:
        return {}
    spelled = {r: remapped_message_id(session_id, r) for r in named}
    ask = sorted({*named, *spelled.values()})
    live = {mid for mid, h in pending.items() if h.session_id == session_id and mid in ask}
    for marks, chunk in in_chunks(ask):
        live.update(r[0] for r in conn.execute(
            f"SELECT id FROM messages WHERE id IN ({marks}) AND session_id = ?", (*chunk, session_id)))
    rest = [r for r in named if r not in live and spelled[r] not in live]
    stored = read_revisions(revisions_path) if rest and revisions_path is not None else RevisionFile()
    return {r: family_root(stored, r, spelled[r]) if r in rest else None for r in named}


@dataclass(frozen=True, slots=True)
class Written:
    """Lines a session actor made durable at ``[start, end)`` of its transcript (epoch ``epoch``).

    ``start`` is also the mark the actor believed indexed before it wrote them:
    every line before ``start`` was indexed by an earlier op, or is indexed now.
    """

    session_id: str
    path: Path
    start: int
    end: int
    epoch: str | None
    lines: Sequence[bytes]
    records: Sequence[Mapping[str, Any]] | None = None
    """The lines parsed (one per line), when the caller has them."""
    seqs: Mapping[int, int] = field(default_factory=dict)
    """Line index -> the seq the actor acknowledged for that new message id (checked, never renumbered)."""
    touch: bool = True
    """Message lines move the session's ``updated_at``."""


EXACT, COVERED, REPLACED = "exact", "covered", "replaced"


def _cover(conn: sqlite3.Connection, w: Written, *, now_ms: int) -> str:
    """Before ``w``'s lines are indexed: the index must cover every byte before ``w.start``.

    ``EXACT`` when the mark stands at ``w.start`` (the compare-and-set then moves it
    to ``w.end``); otherwise the bytes it misses are indexed from the transcript
    first — an earlier op was lost (a batch that failed whole, a DB writer that
    died with ops queued). ``COVERED`` when the mark already lies past ``w``'s lines
    (a repair indexed them) or the file was reconciled up to its end; ``REPLACED``
    when the transcript is no longer the file ``w`` was written to (a rewrite
    followed: its own reindex covers the new file whole).
    """
    mark = index.index_mark(conn, w.session_id)
    if mark is None:
        raise SessionNotFound(f"session {w.session_id} not found", data={"sessionId": w.session_id})
    if mark == (w.start, w.epoch):
        return EXACT
    if mark[1] == w.epoch and mark[0] >= w.end:
        return COVERED
    header = read_header(w.path)
    if header is None or header.get("epoch") != w.epoch:
        return REPLACED
    if mark[1] == w.epoch and mark[0] < w.start:
        apply_plan(conn, w.session_id, plan_missing_bytes(w.path, mark[0], w.epoch, w.start), now_ms=now_ms)
        if index.index_mark(conn, w.session_id) == (w.start, w.epoch):
            return EXACT
    now = index.index_mark(conn, w.session_id) or (0, None)
    apply_plan(conn, w.session_id, plan_reconcile(w.path, now[0], now[1]), now_ms=now_ms)
    return COVERED


def index_written(conn: sqlite3.Connection, w: Written, *, now_ms: int,
                  pending: PendingRows | None = None) -> list[dict[str, Any]]:
    """Index lines a session actor made durable, and move the mark over them by compare-and-set.

    The one op through which lines written by a session actor reach the index
    (ARCHITECTURE.md "Read barriers": one owner for the index mark). Message lines
    get rows (receipts in ``meta.receipt`` with them), compaction lines theirs,
    tombstones flip ``deleted``, a ``session_info`` line updates the row's
    settings. If the mark is not where the actor believed, the missing bytes are
    indexed from the transcript first (:func:`_cover`). If indexing the lines
    fails (the index drifted from the file, a constraint...), the session's
    index is brought in line with its transcript instead: the file is the
    source of truth and already holds the lines. A corrupt database is not
    masked: it propagates. Returns a MessageRef per message line.
    """
    sid = w.session_id
    scan = scan_lines(w.lines, w.start, w.records)
    items = scan.messages
    cover = _cover(conn, w, now_ms=now_ms)
    if cover == REPLACED:
        return _refs_of(conn, sid, items, strict=False)
    exact = cover == EXACT
    if w.seqs:
        starts = _line_starts(w)
        by_offset = {starts[i]: seq for i, seq in w.seqs.items()}
        items = [item.with_seq(by_offset.get(item.offset)) for item in items]
    refs: list[dict[str, Any]]
    if pending is not None:
        refs = _index_lines(conn, w, items, scan, now_ms=now_ms, pending=pending)  # its owner rolls back
    else:
        ok, value = attempt(conn, "index_written", partial(_index_lines, conn, w, items, scan, now_ms=now_ms))
        if not ok:  # the file already holds the lines: bring the session's index in line with it instead
            mark = index.index_mark(conn, sid) or (0, None)
            apply_plan(conn, sid, plan_reconcile(w.path, mark[0], mark[1]), now_ms=now_ms)
            return _refs_of(conn, sid, items)
        refs = value
    if exact and not index.set_index_mark(conn, sid, w.end, w.epoch, expected=(w.start, w.epoch)):
        raise CorruptData(f"session {sid}: the index mark moved under an index op", data={"sessionId": sid})
    return refs


def follows(before: Written, after: Written) -> bool:
    """``after``'s lines come right after ``before``'s in the same file of the same session: one
    op writing both would have carried them as one :class:`Written` (:func:`join_written`)."""
    return (after.session_id == before.session_id and after.path == before.path and after.epoch == before.epoch
            and after.start == before.end and after.touch == before.touch)


def join_written(ws: Sequence[Written]) -> Written:
    """Several :class:`Written` that each :func:`follows` the one before, as one."""
    first = ws[0]
    lines: list[bytes] = []
    records: list[Mapping[str, Any]] | None = [] if all(w.records is not None for w in ws) else None
    seqs: dict[int, int] = {}
    for w in ws:
        seqs.update({len(lines) + i: seq for i, seq in w.seqs.items()})
        lines.extend(w.lines)
        if records is not None and w.records is not None:
            records.extend(w.records)
    return Written(first.session_id, first.path, first.start, ws[-1].end, first.epoch, lines, records, seqs,
                   any(w.touch for w in ws))


def index_written_run(conn: sqlite3.Connection, ws: Sequence[Written], *,
                      now_ms: int) -> list[tuple[bool, Any]]:
    """Index ops of one session whose lines follow each other (:func:`follows`), indexed as one op.

    The same rows as :func:`index_written` one op at a time (a reconcile indexes any run of
    lines in one go by the same rules), in one statement per table: FTS5 writes the terms it
    holds out as a new search-index segment at every statement, so one op per message made a
    segment per message. Per op ``(ok, its MessageRefs)``; the refs of a message whose index row
    took another spelling (D444) are found under it. If the joined op fails (it rolled back
    whole), each op runs again alone under its own savepoint and gets its own outcome; a corrupt
    database propagates. (A message two ops of the run hold: see :func:`_each_ops_refs`.)
    """
    if len(ws) > 1:
        ok, value = attempt(conn, "index_run", lambda: index_written(conn, join_written(ws), now_ms=now_ms))
        if ok:
            return _each_ops_refs(ws, value)
    results: list[tuple[bool, Any]] = []
    for w in ws:
        ok, value = attempt(conn, "index_one", partial(index_written, conn, w, now_ms=now_ms))
        results.append((ok, value if ok else db_error(value, "index write")))
    return results


def index_written_batch(conn: sqlite3.Connection, runs: Sequence[Sequence[Written]], *,
                        now_ms: Sequence[int]) -> list[list[tuple[bool, Any]]]:
    """Runs of several sessions (each: ops of one session whose lines follow each other), with the
    new rows of them all in one INSERT per table (``index.PendingRows``): one search-index segment
    for the batch instead of one per session. Per run, per op ``(ok, its MessageRefs)``.

    ``now_ms``: one time per run, its session's own (the latest its actor acknowledged the run's
    lines at, the ``updatedAt`` it answered with): a session never takes another's time.

    No statement sees a held row before the flush, so this path tolerates no failure: anything
    that fails (a duplicate id across two sessions fails the flush; an index that drifted from its
    file, which :func:`index_written` alone would reconcile) rolls the whole batch back, and each
    run goes again on its own (:func:`index_written_run`). A corrupt database propagates.
    """
    if len(runs) > 1:
        pending = PendingRows()

        def together() -> list[list[dict[str, Any]]]:
            joined = [index_written(conn, join_written(ws), now_ms=at, pending=pending)
                      for ws, at in zip(runs, now_ms, strict=True)]
            pending.flush(conn)
            return joined

        ok, value = attempt(conn, "index_batch", together)
        if ok:
            return [_each_ops_refs(ws, refs) for ws, refs in zip(runs, value, strict=True)]
    return [index_written_run(conn, ws, now_ms=at) for ws, at in zip(runs, now_ms, strict=True)]


def _each_ops_refs(ws: Sequence[Written], refs: Sequence[dict[str, Any]]) -> list[tuple[bool, Any]]:
    """The joined op's refs, each op its own (a row that took the D444 spelling is found under it).

    A ref is the message's row as the whole run left it: when a later op of the run replaced a
    message, the earlier op's ref carries the later line's role (one op at a time, it carried its
    own line's). The ids and seqs are each op's own either way, and they are all a caller
    reads: the session actor takes an index op's outcome as success or failure."""
    by_id = {ref["id"]: ref for ref in refs}
    sid = ws[0].session_id
    out: list[tuple[bool, Any]] = []
    for w in ws:
        mine = [by_id.get(mid) or by_id.get(remapped_message_id(sid, mid)) for mid in _message_ids(w)]
        out.append((True, [ref for ref in mine if ref is not None]))
    return out


def _message_ids(w: Written) -> list[str]:
    """The ids of ``w``'s message lines, in order (those :func:`index_written` returns refs for)."""
    records = w.records if w.records is not None else [loads_line(line) for line in w.lines]
    return [rec["id"] for rec in records if rec.get("type") == "message" and isinstance(rec.get("id"), str)]


def _index_lines(conn: sqlite3.Connection, w: Written, items: Sequence[IndexRecord], scan: TailScan, *,
                 now_ms: int, pending: PendingRows | None = None) -> list[dict[str, Any]]:
    sid = w.session_id
    refs = index_messages(conn, sid, items, indexed_len=None, file_epoch=w.epoch, now_ms=now_ms, touch=w.touch,
                          pending=pending)
    index.index_compactions(conn, sid, scan.compactions, now_ms)
    if scan.tombstones and pending is not None:
        pending.flush(conn)  # a tombstone flips a row's flag: the row must be there
    for mid, flag in scan.tombstones.items():
        index.set_deleted(conn, sid, mid, flag)
    _index_info(conn, sid, scan.session_info, now_ms=now_ms)
    return refs


def _index_info(conn: sqlite3.Connection, sid: str, info: Mapping[str, Any] | None, *, now_ms: int) -> None:
    """What a ``session_info`` line does to its session's row: the settings it names."""
    settings = session_info_settings(info)
    if settings:
        index.update_session_settings(conn, sid, settings, now_ms=now_ms)


def info_answer(conn: sqlite3.Connection, sid: str, info: Mapping[str, Any],
                then: Callable[[sqlite3.Connection, list[dict[str, Any]]], T], *, now_ms: int) -> T:
    """The answer the commit of a ``session_info`` line (``info``, alone in its append) will give: what its
    index op does to the row (:func:`_index_info`; a line without messages has no other rows and leaves
    ``updated_at``) then ``then(conn, [])``, read in a savepoint rolled back
    (:func:`store.indexing.index.dry_run`). The caller runs it in the DB writer behind every index op of the
    session's earlier lines, so the row it starts from is the one the commit starts from. The id of a new
    project the line names is reserved for good first, not its row (the project id the answer names is the
    one the commit gives it; a change that fails leaves no project behind)."""
    path = session_info_settings(info).get("projectPath")
    if path:
        index.reserve_project_id(conn, path, now_ms)

    def run(c: sqlite3.Connection) -> T:
        _index_info(c, sid, info, now_ms=now_ms)
        return then(c, [])

    return index.dry_run(conn, run)


def message_answer(conn: sqlite3.Connection, w: Written,
                   then: Callable[[sqlite3.Connection, list[dict[str, Any]]], T], *, now_ms: int) -> T:
    """The answer the commit of message lines not yet written (``w``, where the actor will write them) will
    give: their index op (:func:`index_written`: a replaced row keeps its seq, an id another session holds
    takes its D444 spelling) then ``then(conn, refs)``, read in a savepoint rolled back. Run in the DB writer
    behind every index op of the session's earlier lines, as :func:`info_answer`."""
    return index.dry_run(conn, lambda c: then(c, index_written(c, w, now_ms=now_ms)))


def _refs_of(conn: sqlite3.Connection, sid: str, items: Sequence[IndexRecord], *,
             strict: bool = True) -> list[dict[str, Any]]:
    """The MessageRefs the index holds for ``items`` (after a reconcile indexed them instead);
    ``strict=False``: those it holds (a rewrite may have dropped some)."""
    found = index.message_refs(conn, [name for item in items for name in index.client_spellings(
        sid, item.record["id"])])
    out = []
    for item in items:
        ref = found.get(item.record["id"]) or found.get(remapped_message_id(sid, item.record["id"]))
        if ref is None and not strict:
            continue
        if ref is None:
            raise CorruptData(f"session {sid}: message {item.record['id']} is in its transcript but not indexed",
                              data={"sessionId": sid, "messageId": item.record["id"]})
        out.append(ref)
    return out


def _line_starts(w: Written) -> list[int]:
    out, pos = [], w.start
    for line in w.lines:
        out.append(pos)
        pos += len(line)
    return out
