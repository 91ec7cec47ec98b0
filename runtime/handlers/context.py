"""Derived views of one session: ``session.tree`` and ``session.context`` (seed 000 §3-4).

Pure views (``store/context.py``) over one full read of the transcript (and
the revisions file for the tree), served by the session actor so they see
every acknowledged line; read and built in one worker-thread hop (never on
the event loop: a long session is seconds of work). ``session.context`` adds
the latest Turn context: the run environment snapshot of the newest turn on
the active branch, read from the index (turns and snapshots live there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from runtime.handlers.revisions import foreign_ids
from store.attachments import mark_evicted_blocks
from store.context import StoredBranch, build_session_context, build_tree, latest_turn_context
from store.errors import PayloadTooLarge
from store.receipts import ReceiptKey
from store.revisions import ROOT_MISSING, RevisionFile, find_root, read_revisions, respell
from store.rules import MAX_WHOLE_READ_BYTES
from store.tombstones import deleted_ids
from store.transcripts.records import wire_record
from store.transcripts.rewrite import LiveTranscript, load_live

__all__ = ["context", "tree"]


async def _check_whole_read(ctx: SessionContext, method: str) -> None:
    """A whole-transcript read is refused beyond ``MAX_WHOLE_READ_BYTES`` before a byte is read."""
    await ctx.ensure_ready()
    if ctx.file_len > MAX_WHOLE_READ_BYTES:
        raise PayloadTooLarge(
            f"{method} reads the whole transcript ({ctx.file_len} bytes), over the limit of {MAX_WHOLE_READ_BYTES}: "
            "read it in pages with session.get (messageEnd + maxBytes; contentLimit cuts a message that is alone "
            "over the reply limit), or compact the session",
            data={"limit": MAX_WHOLE_READ_BYTES, "size": ctx.file_len,
                  "paging": ["messageEnd", "maxBytes", "contentLimit"]})


async def context(ctx: SessionContext, p: m.SessionReadParams, key: ReceiptKey | None) -> Any:
    await _check_whole_read(ctx, "session.context")
    created = int(ctx.row.get("createdAt") or 0)
    path, sid = ctx.paths.transcript, ctx.sid

    # in the actor's worker thread: a long session is seconds of work
    def build() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        live = load_live(path, default_created_ms=created)
        built = build_session_context(live.messages, live.compactions, deleted_ids(live.tombstones))
        checkpoint = built["compaction"]
        return {
            "messages": built["messages"],
            "compaction": wire_record(checkpoint) if checkpoint is not None else None,
        }, live.messages

    def finish(conn: Any, result: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
        # "... plus the latest Turn context" (seed 000 §4): the newest active-branch turn's snapshot (first: it
        # compares the records' blocks as the transcript holds them, before any read-side mark)
        turn_context = latest_turn_context(conn, sid, records)
        # a block whose blob was evicted reads back marked, as in session.get (seed 000 §2.3)
        mark_evicted_blocks(conn, result)
        result["turnContext"] = turn_context
        return result

    result, records = await ctx.io(build)
    return await ctx.read(finish, result, records)


async def tree(ctx: SessionContext, p: m.SessionReadParams, key: ReceiptKey | None) -> Any:
    await _check_whole_read(ctx, "session.tree")
    created = int(ctx.row.get("createdAt") or 0)
    paths = ctx.paths

    def read() -> tuple[LiveTranscript, RevisionFile, list[str]]:  # one worker-thread hop for both files
        rf = read_revisions(paths.revisions)
        archived = dict.fromkeys(str(msg["id"]) for e in rf.entries.values() if not e.live for msg in e.messages)
        return load_live(paths.transcript, default_created_ms=created), rf, list(archived)

    live, rf, archived = await ctx.io(read)
    # an archived message whose id another session took since its branch left the transcript is shown under
    # the id activateRevision gives it back (its D444 spelling, store.revisions.respell), the one a client
    # then finds in the transcript
    taken = await foreign_ids(ctx, archived) if archived else set()
    sid = ctx.sid

    def build() -> Any:  # the tree in the worker thread too: a long session is seconds of work
        branches = []
        for _, e in sorted(rf.entries.items()):
            messages: Sequence[Mapping[str, Any]] = e.messages
            deleted = e.deleted
            if taken and not e.live:
                spelled = respell(sid, taken, messages, {}, (), deleted)
                messages, deleted = spelled.messages, frozenset(spelled.deleted)
            unavailable = None if find_root(live.messages, e.root_user_id) is not None else ROOT_MISSING
            branches.append(StoredBranch(e.root_user_id, e.revision_index, messages, e.live, deleted, unavailable))
        return build_tree(live.messages, deleted_ids(live.tombstones), branches)

    return await ctx.io(build)
