"""Derived views of one session: ``session.tree`` and ``session.context`` (seed 000 §3-4).

Pure views (``store/context.py``) over one full read of the transcript (and
the revisions file for the tree), served by the session actor so they see
every acknowledged line.
"""

from __future__ import annotations

from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from store.context import StoredBranch, build_session_context, build_tree
from store.receipts import ReceiptKey
from store.records import wire_record
from store.revisions import read_revisions
from store.tombstones import deleted_ids

from .revisions import snapshot

__all__ = ["context", "tree"]


async def context(ctx: SessionContext, p: m.SessionReadParams, key: ReceiptKey | None) -> Any:
    live = await snapshot(ctx)
    built = build_session_context(live.messages, live.compactions, deleted_ids(live.tombstones))
    checkpoint = built["compaction"]
    return {
        "messages": built["messages"],
        "compaction": wire_record(checkpoint) if checkpoint is not None else None,
    }


async def tree(ctx: SessionContext, p: m.SessionReadParams, key: ReceiptKey | None) -> Any:
    live = await snapshot(ctx)
    rf = await ctx.io(read_revisions, ctx.paths.revisions)
    branches = [StoredBranch(e.root_user_id, e.revision_index, e.messages, e.live)
                for _, e in sorted(rf.entries.items())]
    return build_tree(live.messages, deleted_ids(live.tombstones), branches)
