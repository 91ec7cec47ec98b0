"""``session.assistantEdit``: fork through an assistant reply, edit it, record both tails (seed 003 §4.5).

Runs in the SOURCE session's actor, exactly as ``session.fork`` (which see):
it only reads the source. Order (``store/assistant_edit.py`` plans it):

1. copy the referenced pasted inputs (as a fork does);
2. the child's revisions file, whole: the original tail (revision 1, a full
   ``revision`` line) and a reference to the edited tail (revision 2, live);
3. the child's transcript, published whole by ``link`` — its header carries
   the request's receipt (with what the response needs beyond the session
   row), so this is the step that makes the edit happen;
4. one DB transaction: the child's session row, its index rows, its two
   ``message_revisions`` rows (revision 2 active) and the receipt row.

With a receipt key the child's id is derived from the key: a retry after a
crash lands on the same child. A crash before 3 leaves no child (an
unpublished revisions file is replaced by the retry, or quarantined by the
doctor); after 3, boot restores the child's row and the receipt from the
header, and the child's revision rows from its revisions file on first use
(``revisions.ensure_synced``). A handled failure removes the child's files.
"""

from __future__ import annotations

from typing import Any

import trio

from actors.session_context import CarriedAnswer, SessionContext
from protocol import models as m
from store import artifacts
from store.assistant_edit import (
    EDITED_REVISION,
    ORIGINAL_REVISION,
    plan_assistant_edit,
    remove_revisions,
    response,
    write_revisions,
)
from store.errors import Conflict, MessageNotFound
from store.fork import (
    child_answer,
    copy_pasted,
    index_child,
    remove_child_files,
    resolve_pasted,
    write_child_transcript,
)
from store.ids import derived_id, new_id
from store.indexing import index
from store.receipts import ReceiptKey, file_record
from store.revisions import upsert_row
from store.transcripts.records import ms_to_rfc3339

from .fork import child_landed
from .revisions import resolve_position, snapshot

__all__ = ["assistant_edit"]


async def assistant_edit(ctx: SessionContext, p: m.AssistantEditParams, key: ReceiptKey | None) -> Any:
    row = ctx.row
    sid, faults = ctx.sid, ctx.faults
    title = p.title if p.title is not None else (row.get("title") or "")
    live = await snapshot(ctx)
    pos = resolve_position(live, sid, p.message_id)
    if pos is None:
        raise MessageNotFound(f"message {p.message_id} is not in session {sid}; nothing was forked",
                              data={"sessionId": sid, "messageId": p.message_id})
    child = derived_id("assistantEdit", key.client_id, key.submission_id) if key is not None else new_id()
    now = ctx.now()
    settings = {**ctx.settings(), "title": title}
    info = {"type": "session_info", **settings, "updatedAt": ms_to_rfc3339(now)}
    blocks = [dict(b) for b in p.blocks]
    message_id = str(live.messages[pos]["id"])
    # the child's whole transcript serialized: this actor's worker thread's work, not the trio loop's
    edit = await ctx.io(lambda: plan_assistant_edit(sid, child, live.messages, live.compactions, live.tombstones,
                                                    info, message_id=message_id, blocks=blocks, now_ms=now,
                                                    roots=live.roots, root=live.root))
    child_paths = ctx.services.paths(child)
    if await ctx.io(child_paths.transcript.exists):
        # a published child whose receipt row is not (yet) restored: never touch its files
        raise Conflict(f"the child session {child} of this submission already exists; retry after the host "
                       f"restored its receipt", data={"sessionId": child})
    pasted_src = ctx.paths.scratch / "pasted"
    project_id = row.get("projectId")
    extra = {"messageId": edit.edited_id, "originalMessageId": edit.original_id, "rootUserId": edit.root_user_id}
    receipt = answer = None
    if key is not None:
        # the child's header carries the answer this call will give (a retry after the database was lost is
        # answered with it, not with the child as it is then), as a fork's does
        summary = await ctx.db(lambda conn: child_answer(conn, child, edit.plan, now_ms=now, title=title,
                                                         settings=settings, project_id=project_id), durable=False)
        answer = response(summary, extra)
        receipt = file_record(key, **extra, response=answer)
    carried = CarriedAnswer(answer)
    committed = False
    try:
        names = await ctx.io(resolve_pasted, pasted_src, edit.fork.pasted_refs)
        await ctx.io(lambda: copy_pasted(pasted_src, child_paths.scratch / "pasted", names, faults=faults))
        await ctx.io(lambda: write_revisions(child_paths.revisions, edit.revision_lines, faults=faults))
        written = await ctx.io(lambda: write_child_transcript(child_paths.transcript, child, now, edit.plan,
                                                              receipt=receipt, faults=faults))
        await ctx.io(faults.point, "assistantEdit.before_index")

        def op(conn: Any) -> Any:
            index_child(conn, child, written, now_ms=now, title=title, settings=settings, project_id=project_id)
            upsert_row(conn, child, edit.root_user_id, ORIGINAL_REVISION, message_count=len(edit.original_tail),
                       now_ms=now, active=False)
            upsert_row(conn, child, edit.root_user_id, EDITED_REVISION, message_count=len(edit.edited_tail),
                       now_ms=now, active=True)
            # the original tail's files: listed as a rebuild from the child's files lists them (seed 003 §4.10)
            artifacts.record_archived_lines(conn, child, edit.revision_lines, now)
            faults.point("assistantEdit.index_before_commit")
            value = response(index.public_session(index.require_session(conn, child)), extra)
            assert value is not None  # extra holds every id it needs
            return carried.give(value)  # keyed: the one the child's header carries

        result = await ctx.commit(op)
        committed = True
    except BaseException:
        if not committed:
            with trio.CancelScope(shield=True):
                if not await child_landed(ctx, child):
                    await _undo(ctx, child, child_paths)
        raise
    carried.check("session.assistantEdit")
    ctx.publish("session.created", {"session": result["session"]}, session_id=child)
    return result


async def _undo(ctx: SessionContext, child: str, paths: Any) -> None:
    """Remove what a failed edit left. Rows: the DB op rolled back, unless its outcome is unknown."""
    await ctx.io(remove_child_files, paths.transcript, paths.scratch)
    await ctx.io(remove_revisions, paths.revisions)
    now = ctx.now()
    try:
        await ctx.db(lambda conn: index.delete_session_rows(conn, child, now_ms=now), durable=True)
    except Exception:  # noqa: BLE001 - best effort; the original error is the one to report
        pass
