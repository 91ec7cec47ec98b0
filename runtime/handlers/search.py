"""``search.sessions`` and ``search.query``: read-only, one snapshot on the read pool.

Reads never go through a session actor: WAL readers see committed rows, and
the route's index barrier makes them wait until the index covers every append
acknowledged before they arrived (read-your-writes).
"""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext
from store.search.search import search_messages, search_sessions

__all__ = ["query", "sessions"]


def sessions(ctx: ReadContext, p: m.SearchSessionsParams) -> Any:
    return search_sessions(ctx.conn, p.query, limit=p.limit, cursor=p.cursor, scope=p.scope,
                           transcript=ctx.transcript)


def query(ctx: ReadContext, p: m.SearchQueryParams) -> Any:
    return search_messages(ctx.conn, p.query, session_id=p.session_id, limit=p.limit, cursor=p.cursor,
                           scope=p.scope, transcript=ctx.transcript)
