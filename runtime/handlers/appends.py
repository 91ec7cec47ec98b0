"""``session.appendMessage``: a group of appends, one write + one fdatasync + one index op.

The session actor hands every append that waited in its mailbox together to
:func:`append_group`. In ONE hop to the actor's worker thread it reads what
the index knows (stored receipts, held ids — ``store.indexing.appends.gather``; nothing, and no read
connection taken, for new ids the message-id filter rules out: ``known_without_reads``; plus
what the index log holds of ids acknowledged but not indexed yet), plans each
request purely (``store.indexing.appends.plan_appends``: replay, D444 remap, steering
replacement, refusal), and writes + fdatasyncs the planned lines, each carrying
its receipt in ``meta.receipt`` — all through ``ctx.append_lines(step, later=True)``,
the one way lines enter a transcript; the in-flight checkpoint rule (a final row of the
checkpointed id removes it) runs in that same hop once the lines are durable. Then every
request is answered: the index op goes to the DB writer without being awaited, and reads
that need the index wait for it (ARCHITECTURE.md "Read barriers").

Each message is validated once (the pipeline, into its protocol model), dumped once and
encoded once (the plan's ``dumps_line``); nothing on this path calls another handler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.session import SessionCall
from actors.session_context import Borrow, Lines, SessionContext
from protocol import models as m
from runtime.context import Pinned
from runtime.handlers import inflight
from store.ids import remapped_message_id
from store.indexing.appends import (
    AppendPlan,
    AppendRequest,
    Held,
    Refuse,
    Replay,
    Write,
    content_of,
    gather,
    known_without_reads,
    named_root,
    plan_appends,
)
from store.receipts import ReceiptKey
from store.rules import EVENT_RECORD_MAX
from store.transcripts.records import awaits_final, wire_record

__all__ = ["append", "append_group"]


async def append(ctx: SessionContext, p: m.AppendMessageParams, key: ReceiptKey | None) -> Any:
    """One append (the route's group handler is what the actor runs)."""
    raise NotImplementedError("session.appendMessage runs as a group: see append_group")


def request_of(call: SessionCall) -> AppendRequest:
    params: m.AppendMessageParams = call.params
    # Validated once (the pipeline, into the model), dumped once, encoded once (in the plan).
    return AppendRequest(params.message.model_dump(by_alias=True, exclude_unset=True), params.turn_id, call.receipt,
                         validated=True)


async def append_group(ctx: SessionContext, calls: Sequence[SessionCall]) -> list[Any]:
    requests = [request_of(call) for call in calls]
    sid, path, now = ctx.sid, ctx.paths.transcript, ctx.now()

    log = ctx.index_log
    candidates = [mid for r in requests if isinstance(mid := r.message.get("id"), str)]
    roots = [root for r in requests if (root := named_root(r.message)) is not None]  # rare: edits naming one
    pending = log.held([*candidates, *(remapped_message_id(sid, m) for m in [*candidates, *roots]), *roots])
    revisions_path = ctx.paths.revisions if roots else None
    ids = ctx.message_ids

    checkpoint = inflight.AfterAppend(ctx)
    planned: list[Lines] = []

    def step(borrow: Borrow) -> tuple[AppendPlan, Lines]:
        # The row as it is once the writer is open: opening it may have found lines the actor did not
        # know (a torn tail cut, another program's line) and caught the index up: seqs follow those.
        last_seq = int(ctx.row["messageCount"])
        # the usual append reads nothing: no read connection is taken for it
        known = known_without_reads(sid, requests, pending=pending, ids=ids)
        if known is None:
            with borrow() as conn:
                known = gather(conn, path, sid, requests, pending=pending, revisions_path=revisions_path, ids=ids)
        plan = plan_appends(sid, requests, known, last_seq=last_seq, now_ms=now)
        writes = plan.writes
        held = {w.record["id"]: Held(sid, w.ref, awaits_final(w.record), content_of(w.record)) for w in writes}
        seqs = {i: w.seq for i, w in enumerate(writes) if not w.replace}
        lines = Lines([w.line for w in writes], records=[w.record for w in writes], seqs=seqs, held=held,
                      last_seq=plan.last_seq)
        planned.append(lines)
        return plan, lines

    def after_write() -> None:  # same hop, the lines durable: the in-flight checkpoint rule
        checkpoint(planned[-1].records or ())

    # Acknowledged once durable; the index catches up behind the read barrier.
    done = await ctx.append_lines(step, later=True, after_write=after_write)
    plan: AppendPlan = done.planned
    replayed = [r.message for r, o in zip(requests, plan.outcomes, strict=True) if isinstance(o, Replay)]
    if replayed:  # a retry whose first try's line is durable (its answer lost): the rule that try missed
        await ctx.io(checkpoint, replayed)
    checkpoint.remember(ctx)
    writes = plan.writes
    if writes:
        for w in writes:
            data: dict[str, Any] = {"message": w.ref}
            if len(w.line) <= EVENT_RECORD_MAX:
                data["record"] = wire_record(w.record)
            ctx.publish("session.message", data, size=min(len(w.line), EVENT_RECORD_MAX))
    return [_answer(o, done.seq) for o in plan.outcomes]


def _answer(outcome: Write | Replay | Refuse, seq: int) -> Any:
    if isinstance(outcome, Write):
        # Its receipt reaches command_receipts with the index rows: the pipeline keeps the
        # answer for retries until the index covers ``seq``.
        return Pinned(outcome.response(), seq)
    if isinstance(outcome, Replay):
        return outcome.response
    return outcome.error
