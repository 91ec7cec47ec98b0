"""Whole-transcript rewrites: plan the new body, write it atomically, reindex it.

Every rewrite (truncate, replace, revision switch, and later fork/import) goes
through three pure-or-synchronous steps that the session actor orders:

1. :func:`load_live` — the transcript as readers see it (deduped messages,
   every compaction record, tombstones, the newest ``session_info``).
2. :func:`plan_rewrite` — the new body lines: the given messages in order,
   every compaction still valid against them (a record whose
   ``throughMessageId`` is gone is dropped, per record) placed after its
   boundary and in its original relative order, the tombstones of surviving
   messages, the approval decisions and the lines of kinds this version does
   not know after the message they followed (while it survives), a
   ``session_info`` line naming the project root before each kept message whose
   root differs from the one before it (the root its Write/Edit paths resolve
   against: ``records.Root``), and the newest ``session_info`` line so a rebuilt
   index keeps the session's metadata.
   Offsets are computed here, so no re-scan is needed.
3. :func:`apply_rewrite` (file: temp + fsync + rename + dir fsync, new header
   epoch) then :func:`reindex` (one DB transaction replacing every row).

The receipt of a rewrite rides in the new header (``receipt``), and the new
header also carries forward the receipts the old one held (``receipts``,
oldest first, the newest :data:`CARRIED_RECEIPTS`): a rewrite replaces the
header, and a receipt must stay as durable as its effect, which a later rewrite
does not undo. Without the carry a database rebuild would restore only the last
rewrite's receipt, and a retry of an earlier truncate or switch would run again.

A crash between 3a and 3b leaves a file whose epoch the index does not know,
so the next catch-up reindexes it in full: old or new file, never a mix, and
the index always ends up matching the file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.collab import DELIVERED_META
from store.compaction import split_valid
from store.faults import NO_FAULTS, Faults
from store.indexing.index import (
    CompactionRecord,
    IndexRecord,
    append_response,
    message_ref,
    reindex_session,
    set_message_count,
)
from store.jsonio import dumps_line
from store.rules import COLLAB_INPUT_ID_PREFIX
from store.transcripts.records import Root, meta_of, rfc3339_to_ms, root_line
from store.transcripts.transcript import (
    keep_dropped_lines,
    read_transcript,
    rewrite_transcript,
)

CARRIED_RECEIPTS = 64
"""At most this many receipts of earlier rewrites and ``session_info`` changes ride in a rewritten header,
the newest kept (a few hundred bytes each: the header stays small, and it is read on every open), beside
the receipt of the call that made the file (:data:`BIRTH_METHODS`), which is never dropped. A retry older
than that many later keyed changes is answered from the database row while it exists; after a rebuild
that lost it, it runs again."""

BIRTH_METHODS = frozenset({"session.create", "session.fork", "session.assistantEdit"})
"""The calls that make a transcript (a session, a fork's or an edit's child): one such receipt per file, kept
by every rewrite whatever came after it, so its retry after a lost database is answered with its first
answer (``extra.response``), never CONFLICT."""


CARRIED_DELIVERED = 64
"""At most this many deliver answers of dropped collaboration input lines ride in a rewritten header
(:func:`carried_delivered`), the newest kept."""


# --------------------------------------------------------------------------- receipts in the header


def carried_delivered(previous: Sequence[Mapping[str, Any]], live: Sequence[Mapping[str, Any]],
                      kept: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The deliver answers a new header carries (``transcript.HEADER_DELIVERED``): ``previous`` (the old
    header's), then those of the collaboration input lines in ``live`` (the old live messages) that ``kept``
    (the new ones) leaves out, cut or archived. Such a line's ``meta.collabDelivered`` is the one trace of its
    delivery a lost database leaves (``store.collab.DELIVERED_META``): without it a retry of the deliver would
    deliver the task again. One per delivery (the newest), the newest :data:`CARRIED_DELIVERED`, each as
    :func:`header_delivery` keeps it (no content: a header stays small)."""
    staying = {str(rec.get("id")) for rec in kept}
    newest: dict[str, dict[str, Any]] = {}
    for rec in previous:
        newest.pop(str(rec["deliveryId"]), None)
        newest[str(rec["deliveryId"])] = dict(rec)
    for rec in live:
        rid = str(rec.get("id"))
        carried = meta_of(rec).get(DELIVERED_META)
        if rid.startswith(COLLAB_INPUT_ID_PREFIX) and rid not in staying and isinstance(carried, Mapping):
            entry = header_delivery(rid.removeprefix(COLLAB_INPUT_ID_PREFIX), carried)
            if entry is not None:
                newest.pop(entry["deliveryId"], None)
                newest[entry["deliveryId"]] = entry
    return list(newest.values())[-CARRIED_DELIVERED:]


def header_delivery(delivery_id: str, carried: Mapping[str, Any]) -> dict[str, Any] | None:
    """A line's ``meta.collabDelivered`` as a header keeps it: the deliver's answer without the task's content
    (up to a million characters, twice: the delivery's and its queue entry's), which ``contentSha256`` names
    instead (a retry carries that content again: ``store.collab.answer_from_header`` puts it back), and the
    receipt's key without its copy of the answer. ``None``: nothing well-formed to keep."""
    response = carried.get("response")
    delivery = response.get("delivery") if isinstance(response, Mapping) else None
    if not isinstance(response, Mapping) or not isinstance(delivery, Mapping) \
            or not isinstance(delivery.get("content"), str):
        return None
    stripped = {k: ({f: v for f, v in part.items() if f != "content"} if k in ("delivery", "entry")
                    and isinstance(part, Mapping) else part) for k, part in response.items()}
    entry: dict[str, Any] = {"deliveryId": delivery_id, "response": stripped,
                             "contentSha256": hashlib.sha256(delivery["content"].encode("utf-8")).hexdigest()}
    receipt = carried.get("receipt")
    if isinstance(receipt, Mapping):
        entry["receipt"] = {k: v for k, v in receipt.items() if k != "extra"}
    return entry



def dropped_append_receipts(session_id: str, live: Sequence[Mapping[str, Any]],
                            kept: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The receipts of keyed appends whose lines ``kept`` (the new live messages) leaves out, each with the
    answer the append gave (``extra.response``), for the new header to carry: the line was the receipt's
    only durable place (``meta.receipt``), so without this a retry after a lost database would append the
    message again (seed 000 §2.4). A receipt without the ``seq`` its append answered (``extra.seq``: lines
    written before receipts recorded it) is left out: its answer is unknown."""
    staying = {str(rec.get("id")) for rec in kept}
    out: list[dict[str, Any]] = []
    for rec in live:
        carried = meta_of(rec).get("receipt")
        if str(rec.get("id")) in staying or not isinstance(carried, Mapping) \
                or carried.get("method", "session.appendMessage") != "session.appendMessage":
            continue
        extra = carried.get("extra")
        seq = extra.get("seq") if isinstance(extra, Mapping) else None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1 or not isinstance(rec.get("id"), str):
            continue
        turn = rec.get("turnId")
        answer = append_response(message_ref(session_id, seq, rec, turn if isinstance(turn, str) else None),
                                 carried)
        out.append({**carried, "method": "session.appendMessage",
                    "extra": {**(extra if isinstance(extra, Mapping) else {}), "response": answer}})
    return out


def carried_receipts(previous: Sequence[Mapping[str, Any]],
                     receipt: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The receipts a new header carries beside its own ``receipt``: ``previous`` (the old header's,
    oldest first) without ``receipt``'s key, one per key (the newest), the newest
    :data:`CARRIED_RECEIPTS`, and the file's birth receipt (:data:`BIRTH_METHODS`) wherever it stood."""

    def key(rec: Mapping[str, Any]) -> tuple[Any, Any]:
        return rec.get("clientId"), rec.get("submissionId")

    skip = key(receipt) if receipt is not None else None
    newest: dict[tuple[Any, Any], dict[str, Any]] = {}
    for rec in previous:
        k = key(rec)
        if k == skip:
            continue
        newest.pop(k, None)  # re-inserted: the dict keeps the last occurrence's place (oldest first)
        newest[k] = dict(rec)
    records = list(newest.values())
    later = [r for r in records if r.get("method") not in BIRTH_METHODS]
    kept = {id(r) for r in later[-CARRIED_RECEIPTS:]}
    return [r for r in records if id(r) in kept or r.get("method") in BIRTH_METHODS]


@dataclass
class LiveTranscript:
    """A snapshot of the live transcript, taken inside the session actor."""

    session_id: str
    created_at_ms: int
    epoch: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    compactions: list[dict[str, Any]] = field(default_factory=list)
    tombstones: dict[str, dict[str, Any]] = field(default_factory=dict)
    """messageId → newest tombstone record (deleted true or false)."""
    session_info: dict[str, Any] | None = None
    roots: dict[str, Root | None] = field(default_factory=dict)
    """Per message id, the project root its line stands under (``Transcript.roots``): :func:`plan_rewrite`
    keeps it in position."""
    root: Root | None = None
    """The root in effect at the end of the file (the session's), for lines the rewrite brings in."""
    decisions: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    """``approval_decision`` lines with the id of the message they follow (kept by a rewrite
    while that message survives)."""
    valid_length: int = 0
    dropped_offsets: list[int] = field(default_factory=list)
    """Lines readers skip that a rewrite cannot carry over (damaged, or of no kind at all): it keeps them
    beside the transcript first (:func:`keep_dropped_lines`)."""
    unknown: list[tuple[str | None, int, bytes]] = field(default_factory=list)
    """Lines of a kind this version does not know (``Transcript.unknown``): a rewrite writes them again
    after the message they followed while it survives (:func:`plan_rewrite` ``opaque``), and keeps the
    others beside the transcript (``RewritePlan.left_out``)."""
    receipts: list[dict[str, Any]] = field(default_factory=list)
    """The receipts the header carries (``TranscriptHeader.receipts``), then those of the ``session_info``
    lines (``Transcript.info_receipts``): a rewrite carries them forward."""
    delivered: list[dict[str, Any]] = field(default_factory=list)
    """The deliver answers the header carries (``TranscriptHeader.delivered``): a rewrite carries them forward."""

    @property
    def ids(self) -> list[str]:
        return [m["id"] for m in self.messages]

    def position(self, message_id: str) -> int | None:
        for i, rec in enumerate(self.messages):
            if rec["id"] == message_id:
                return i
        return None


def _carried_in(header: Sequence[Mapping[str, Any]], lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What a rewrite carries forward: the header's receipts, then those of the ``session_info`` lines (the
    rewrite keeps only the newest line) whose key the header does not hold (a create's first line carries
    its receipt without the answer its header holds)."""
    held = {(r.get("clientId"), r.get("submissionId")) for r in header}
    return [*(dict(r) for r in header),
            *(dict(r) for r in lines if (r.get("clientId"), r.get("submissionId")) not in held)]


def load_live(path: str | os.PathLike[str], *, default_created_ms: int = 0) -> LiveTranscript:
    """Read the whole transcript (messages deduped keep-last at first position)."""
    t = read_transcript(path)
    header = t.header
    created = rfc3339_to_ms(header.created_at if header else None, default_created_ms)
    live = LiveTranscript(
        session_id=header.session_id if header else "",
        created_at_ms=created,
        epoch=header.epoch if header else None,
        messages=[m.record for m in t.messages],
        compactions=[c.record for c in t.compactions],
        session_info=t.session_info,
        roots=dict(t.roots),
        root=t.root,
        decisions=list(t.decisions),
        valid_length=t.valid_length,
        dropped_offsets=[*t.bad_line_offsets,
                         *sorted(set(t.unknown_line_offsets) - {off for _, off, _ in t.unknown})],
        unknown=list(t.unknown),
        receipts=_carried_in(header.receipts if header is not None else (), t.info_receipts),
        delivered=list(header.delivered) if header is not None else [],
    )
    for mid, tomb in t.tombstones.items():
        live.tombstones[mid] = {"type": "tombstone", "id": tomb.id or f"t-{mid}", "messageId": mid,
                                "deleted": tomb.deleted}
    return live


@dataclass(frozen=True)
class RewritePlan:
    """New body lines (header excluded) and where each indexed line sits in the body."""

    body: list[bytes]
    messages: list[dict[str, Any]]
    message_spans: list[tuple[int, int]]
    compactions: list[dict[str, Any]]
    compaction_spans: list[tuple[int, int]]
    dropped_compactions: list[str]
    deleted_ids: list[str]
    left_out: list[int] = field(default_factory=list)
    """Offsets of the ``opaque`` lines the body does not hold (the message they followed is gone): kept
    beside the transcript by :func:`apply_rewrite`'s caller (``dropped_offsets``)."""
    message_roots: list[Root | None] = field(default_factory=list)
    """Per message, the root it stands under in the new body (None: no line before it names one)."""


def _placement(messages: Sequence[Mapping[str, Any]], kept: Sequence[Mapping[str, Any]]) -> list[int]:
    """For each kept compaction, the message position it is written after.

    After its own boundary, and never before an earlier checkpoint (the chain
    stays oldest-first, which is the file order readers rely on).
    """
    pos = {m["id"]: i for i, m in enumerate(messages)}
    out: list[int] = []
    floor = -1
    for rec in kept:
        at = max(pos[rec["throughMessageId"]], floor)
        out.append(at)
        floor = at
    return out


def plan_rewrite(
    messages: Sequence[Mapping[str, Any]],
    compactions: Sequence[Mapping[str, Any]] = (),
    *,
    tombstones: Mapping[str, Mapping[str, Any]] | None = None,
    session_info: Mapping[str, Any] | None = None,
    decisions: Sequence[tuple[str | None, Mapping[str, Any]]] = (),
    opaque: Sequence[tuple[str | None, int, bytes]] = (),
    roots: Mapping[str, Root | None] | None = None,
    root: Root | None = None,
) -> RewritePlan:
    """Lay out a rewritten body. Messages must have unique ids (the caller decides which).

    ``decisions`` (``approval_decision`` lines) follow the message they followed
    before, when it survives (``None``: the body's start); the others go.
    ``opaque``: lines of kinds this version does not know (``LiveTranscript.unknown``),
    written again byte for byte after their decisions under the same rule; the offsets
    of the others are ``left_out``.
    ``roots`` (``LiveTranscript.roots``): the project root each old line stands under; a message the
    rewrite keeps gets a ``session_info`` line naming its root before it when that differs from the root
    in effect there (``records.root_line``), so a rebuilt index resolves its Write/Edit paths where the
    live index did (``records.Root``). A message ``roots`` does not hold (one the rewrite brings in) stands
    under ``root``, the session's now, as the live index resolves it. A leading run of old messages under no
    named root (a file written before rewrites kept them) stays so. ``roots`` None: no root lines.
    """
    ids = [m["id"] for m in messages]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"rewrite plan has message id {dup!r} twice")
    kept, dropped = split_valid(compactions, ids)
    after = _placement(messages, kept)
    by_pos: dict[int, list[Mapping[str, Any]]] = {}
    for rec, at in zip(kept, after, strict=True):
        by_pos.setdefault(at, []).append(rec)
    body: list[bytes] = []
    offset = 0
    msg_spans: list[tuple[int, int]] = []
    comp_recs: list[dict[str, Any]] = []
    comp_spans: list[tuple[int, int]] = []
    deleted: list[str] = []

    def put(rec: Mapping[str, Any]) -> tuple[int, int]:
        nonlocal offset
        line = dumps_line(rec)
        body.append(line)
        span = (offset, len(line))
        offset += len(line)
        return span

    def put_raw(line: bytes) -> None:
        nonlocal offset
        body.append(line)
        offset += len(line)

    surviving = set(ids)
    after_msg: dict[str | None, list[Mapping[str, Any]]] = {}
    for anchor, rec in decisions:
        if anchor is None or anchor in surviving:
            after_msg.setdefault(anchor, []).append(rec)
    raw_after: dict[str | None, list[bytes]] = {}
    left_out: list[int] = []
    for anchor, at, line in opaque:
        if anchor is None or anchor in surviving:
            raw_after.setdefault(anchor, []).append(line)
        else:
            left_out.append(at)
    for rec in after_msg.get(None, ()):
        put(rec)
    for line in raw_after.get(None, ()):
        put_raw(line)
    in_effect: Root | None = None
    message_roots: list[Root | None] = []
    for i, rec in enumerate(messages):
        if roots is not None:
            want = roots[rec["id"]] if rec["id"] in roots else root
            if want is None and in_effect is not None:
                want = root  # an old line under no named root, after one that names one: the session's
            if want is not None and want != in_effect:
                put(root_line(want))
                in_effect = want
        message_roots.append(in_effect)
        msg_spans.append(put(rec))
        for decision in after_msg.get(rec["id"], ()):
            put(decision)
        for line in raw_after.get(rec["id"], ()):
            put_raw(line)
        tomb = (tombstones or {}).get(rec["id"])
        if tomb is not None and tomb.get("deleted", True) is True:
            put(tomb)
            deleted.append(rec["id"])
        for comp in by_pos.get(i, ()):
            comp_recs.append(dict(comp))
            comp_spans.append(put(comp))
            hidden = (tombstones or {}).get(str(comp.get("id")))
            if hidden is not None and hidden.get("deleted", True) is True:  # a checkpoint an import hid
                put(hidden)
                deleted.append(str(comp["id"]))
    if session_info is not None:
        put(session_info)
    return RewritePlan(
        body=body,
        messages=[dict(m) for m in messages],
        message_spans=msg_spans,
        compactions=comp_recs,
        compaction_spans=comp_spans,
        dropped_compactions=[str(c.get("id")) for c in dropped],
        deleted_ids=deleted,
        left_out=left_out,
        message_roots=message_roots,
    )


@dataclass(frozen=True)
class Rewritten:
    """The file a rewrite produced, ready for :func:`reindex`."""

    epoch: str | None
    file_len: int
    messages: list[IndexRecord]
    compactions: list[CompactionRecord]
    deleted_ids: list[str]


def apply_rewrite(
    path: str | os.PathLike[str],
    session_id: str,
    created_at_ms: int,
    plan: RewritePlan,
    *,
    receipt: Mapping[str, Any] | None = None,
    carried: Sequence[Mapping[str, Any]] = (),
    faults: Faults = NO_FAULTS,
    dropped_offsets: Sequence[int] = (),
    now_ms: int = 0,
    delivered: Sequence[Mapping[str, Any]] = (),
) -> Rewritten:
    """Atomically replace the transcript with ``plan`` (fault points ``rewrite.*``).

    ``receipt``: the receipt record of the request that rewrites the file; it
    rides in the new header (``store/receipts.py``). ``carried``: the receipts the old header held
    (``LiveTranscript.receipts``); the new header keeps them (:func:`carried_receipts`), so every
    rewrite that is a request's effect stays answerable after a database rebuild.
    ``dropped_offsets``: lines of the old file the plan cannot hold (``LiveTranscript.dropped_offsets``),
    copied aside first, never lost. ``delivered``: the deliver answers the new header carries
    (:func:`carried_delivered`).
    """
    keep_dropped_lines(path, dropped_offsets, now_ms)
    header = rewrite_transcript(path, session_id, created_at_ms, plan.body, receipt=receipt,
                                receipts=carried_receipts(carried, receipt), faults=faults,
                                written_at_ms=now_ms or None, delivered=delivered)
    return rewritten(plan, header.epoch, header.length)


def rewritten(plan: RewritePlan, epoch: str | None, header_len: int) -> Rewritten:
    """What a file made of a header of ``header_len`` bytes followed by ``plan.body`` holds."""
    at: dict[int, bytes] = {}
    pos = 0
    for body_line in plan.body:
        at[pos] = body_line
        pos += len(body_line)
    roots = plan.message_roots or [None] * len(plan.messages)
    msgs = [IndexRecord(rec, header_len + off, n, line=at.get(off) if len(at.get(off, b"")) == n else None,
                        root=root)
            for rec, (off, n), root in zip(plan.messages, plan.message_spans, roots, strict=True)]
    comps = [
        CompactionRecord(rec, header_len + off, n)
        for rec, (off, n) in zip(plan.compactions, plan.compaction_spans, strict=True)
    ]
    total = header_len + sum(len(line) for line in plan.body)
    return Rewritten(epoch, total, msgs, comps, list(plan.deleted_ids))


def reindex(
    conn: Any,
    session_id: str,
    rewritten: Rewritten,
    *,
    now_ms: int,
    turn_overrides: Mapping[str, str] | None = None,
) -> None:
    """Replace the session's index rows with the rewritten file's (one transaction, caller's)."""
    reindex_session(
        conn, session_id, rewritten.messages, rewritten.compactions, rewritten.deleted_ids,
        indexed_len=rewritten.file_len, file_epoch=rewritten.epoch, now_ms=now_ms,
        turn_overrides=turn_overrides,
    )


def as_reindexed(conn: Any, session_id: str, plan: RewritePlan) -> None:
    """The session's row as :func:`reindex` of ``plan``'s file leaves it, without its message rows (its message
    count): a dry run of a rewrite's commit, for the answer its header carries, which reads the row and the
    rows the commit's other steps write, never the message rows (``runtime/handlers/revisions.commit_rewrite``)."""
    set_message_count(conn, session_id, len(plan.messages))


def turn_map(conn: Any, session_id: str, ids: Iterable[str] | None = None) -> dict[str, str]:
    """``messageId → turnId`` from the index (the owning turn of each live message)."""
    rows = conn.execute(
        "SELECT id, turn_id FROM messages WHERE session_id = ? AND turn_id IS NOT NULL", (session_id,)
    ).fetchall()
    wanted = None if ids is None else set(ids)
    return {mid: tid for mid, tid in rows if wanted is None or mid in wanted}


__all__ = [
    "CARRIED_DELIVERED",
    "CARRIED_RECEIPTS",
    "as_reindexed",
    "dropped_append_receipts",
    "LiveTranscript",
    "RewritePlan",
    "Rewritten",
    "apply_rewrite",
    "carried_delivered",
    "header_delivery",
    "carried_receipts",
    "load_live",
    "plan_rewrite",
    "reindex",
    "turn_map",
]
