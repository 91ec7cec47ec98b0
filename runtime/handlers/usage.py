"""``usage.session``, ``usage.history``, ``session.listTurns``: rollups of the turns rows (reads)."""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext
from store import turns, usage
from store.indexing import cursors, index

__all__ = ["history", "list_turns", "session_usage"]


def session_usage(ctx: ReadContext, p: m.UsageSessionParams) -> Any:
    index.require_session(ctx.conn, p.session_id)
    return usage.session_usage(ctx.conn, p.session_id)


def history(ctx: ReadContext, p: m.UsageHistoryParams) -> Any:
    if p.session_id is not None:
        index.require_session(ctx.conn, p.session_id)
    return {"days": usage.history(ctx.conn, now_ms=ctx.now, days=p.days, utc_offset_minutes=p.utc_offset_minutes,
                                  session_id=p.session_id)}


def list_turns(ctx: ReadContext, p: m.ListTurnsParams) -> Any:
    index.require_session(ctx.conn, p.session_id)
    fp = cursors.query_fingerprint("session.listTurns", p.session_id)
    before = cursors.decode_cursor(p.cursor, "turns", fp, (int, str)) if p.cursor else None
    ids, nxt = usage.list_turns(ctx.conn, p.session_id, limit=p.limit,
                                before=(before[0], before[1]) if before else None)
    # the cursor comes from the rows' keys, damaged or not: a page whose every turn is damaged still moves on
    found = turns.turns_by_id(ctx.conn, ids).map(lambda t: {k: v for k, v in t.items() if v is not None})
    return found.result("turns", nextCursor=cursors.encode_cursor("turns", fp, list(nxt)) if nxt else None)
