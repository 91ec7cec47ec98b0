"""``session.fork``: copy the transcript (or a prefix) into a new, independent session.

Runs in the SOURCE session's actor. It never asks the registry (the child's
actor would be a second writer racing this one, and asking our own actor
would deadlock): it copies referenced pasted inputs, writes the child
transcript atomically — its header carries the request's receipt — then
inserts the child's session row and index rows in one DB op with the receipt
row; the child's actor finds a clean index on first use. With a receipt key
the child's id is derived from the key, so a retry after a crash lands on the
same child (boot restores the child's row and the receipt from its file). A
handled failure removes the child's files (and, if the DB op's outcome is
unknown, its rows).
"""

from __future__ import annotations

from typing import Any

import trio

from actors.session_context import CarriedAnswer, SessionContext
from protocol import models as m
from store.fork import (
    child_answer,
    copy_pasted,
    index_child,
    plan_fork,
    remove_child_files,
    resolve_pasted,
    write_child_transcript,
)
from store.ids import derived_id, new_id
from store.indexing import index
from store.receipts import ReceiptKey, file_record
from store.transcripts.records import ms_to_rfc3339

from .revisions import resolve_position, snapshot

__all__ = ["child_landed", "fork"]


async def fork(ctx: SessionContext, p: m.ForkParams, key: ReceiptKey | None) -> Any:
    row = ctx.row
    sid, faults = ctx.sid, ctx.faults
    title = p.title if p.title is not None else (row.get("title") or "")
    live = await snapshot(ctx)
    through = p.through_message_id
    if through is not None:
        pos = resolve_position(live, sid, through)
        through = live.messages[pos]["id"] if pos is not None else through
    child = derived_id("fork", key.client_id, key.submission_id) if key is not None else new_id()
    now = ctx.now()
    settings = {**ctx.settings(), "title": title}
    info = {"type": "session_info", **settings, "updatedAt": ms_to_rfc3339(now)}
    # the child's whole transcript serialized: this actor's worker thread's work, not the trio loop's
    plan = await ctx.io(lambda: plan_fork(sid, child, live.messages, live.compactions, live.tombstones, info,
                                          through_message_id=through, now_ms=now, roots=live.roots,
                                          root=live.root))
    child_paths = ctx.services.paths(child)
    pasted_src = ctx.paths.scratch / "pasted"
    project_id = row.get("projectId")
    receipt = answer = None
    if key is not None:
        # the child's header carries the answer this call will give (a retry after the database was lost is
        # answered with it, not with the child as it is then)
        answer = await ctx.db(lambda conn: child_answer(conn, child, plan.plan, now_ms=now, title=title,
                                                        settings=settings, project_id=project_id), durable=False)
        receipt = file_record(key, response=answer)
    carried = CarriedAnswer(answer)
    committed = False
    try:
        names = await ctx.io(resolve_pasted, pasted_src, plan.pasted_refs)
        await ctx.io(lambda: copy_pasted(pasted_src, child_paths.scratch / "pasted", names, faults=faults))
        written = await ctx.io(lambda: write_child_transcript(child_paths.transcript, child, now, plan.plan,
                                                              receipt=receipt, faults=faults))
        await ctx.io(faults.point, "fork.before_index")

        def op(conn: Any) -> Any:
            index_child(conn, child, written, now_ms=now, title=title, settings=settings, project_id=project_id)
            faults.point("fork.index_before_commit")
            return carried.give(index.public_session(index.require_session(conn, child)))  # keyed: the header's

        result = await ctx.commit(op)
        committed = True
    except BaseException:
        if not committed:
            with trio.CancelScope(shield=True):
                if not await child_landed(ctx, child):
                    await _undo(ctx, child, child_paths.transcript, child_paths.scratch)
        raise
    carried.check("session.fork")
    ctx.publish("session.created", {"session": result}, session_id=child)
    return result


async def child_landed(ctx: SessionContext, child: str) -> bool:
    """After a failure: whether the child's commit took place all the same (a failure after the commit,
    ``STORAGE_FULL`` / ``IO_ERROR`` included). Then it is the effect its receipt answers with: kept."""
    return await ctx.landed(lambda conn: index.session_row(conn, child) is not None)


async def _undo(ctx: SessionContext, child: str, path: Any, scratch: Any) -> None:
    """Remove what a failed fork left. Rows: the DB op rolled back, unless its outcome is unknown."""
    await ctx.io(remove_child_files, path, scratch)
    now = ctx.now()
    try:
        await ctx.db(lambda conn: index.delete_session_rows(conn, child, now_ms=now), durable=True)
    except Exception:  # noqa: BLE001 - best effort; the original error is the one to report
        pass
