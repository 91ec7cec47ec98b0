"""Derived views of one session: ``session.tree`` and ``session.context`` (seed 000 §3-4).

Pure views (``store/context.py``) over one full read of the transcript (and
the revisions file for the tree), served by the session actor so they see
every acknowledged line.
"""

from __future__ import annotations

from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from protocol.limits import MAX_WHOLE_READ_BYTES
from store.context import StoredBranch, build_session_context, build_tree
from store.errors import PayloadTooLarge
from store.receipts import ReceiptKey
from store.records import wire_record
from store.revisions import read_revisions
from store.tombstones import deleted_ids

from .revisions import snapshot

__all__ = ["context", "tree"]


async def _whole_read(ctx: SessionContext, method: str) -> Any:
    """The live transcript, read whole: refused beyond ``MAX_WHOLE_READ_BYTES`` before a byte is read."""
    await ctx.ensure_ready()
    if ctx.file_len > MAX_WHOLE_READ_BYTES:
        raise PayloadTooLarge(
            f"{method} reads the whole transcript ({ctx.file_len} bytes), over the limit of {MAX_WHOLE_READ_BYTES}: "
            "read it in pages with session.get (messageEnd + maxBytes), or compact the session",
            data={"limit": MAX_WHOLE_READ_BYTES, "size": ctx.file_len, "paging": ["messageEnd", "maxBytes"]})
    return await snapshot(ctx)


async def context(ctx: SessionContext, p: m.SessionReadParams, key: ReceiptKey | None) -> Any:
    live = await _whole_read(ctx, "session.context")
    built = build_session_context(live.messages, live.compactions, deleted_ids(live.tombstones))
    checkpoint = built["compaction"]
    return {
        "messages": built["messages"],
        "compaction": wire_record(checkpoint) if checkpoint is not None else None,
    }


async def tree(ctx: SessionContext, p: m.SessionReadParams, key: ReceiptKey | None) -> Any:
    live = await _whole_read(ctx, "session.tree")
    rf = await ctx.io(read_revisions, ctx.paths.revisions)
    branches = [StoredBranch(e.root_user_id, e.revision_index, e.messages, e.live)
                for _, e in sorted(rf.entries.items())]
    return build_tree(live.messages, deleted_ids(live.tombstones), branches)
