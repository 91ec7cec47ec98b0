"""``search.sessions`` and ``search.query``: read-only, served from the read pool.

Reads never go through a session actor: WAL readers see committed rows, and
every acknowledged append committed its index row before its reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from store.search import search_messages, search_sessions


def search_methods(**deps: Any) -> dict[str, Any]:
    reads = deps["reads"]

    async def sessions(p: Mapping[str, Any], raw: Mapping[str, Any], ctx: Any, model: Any) -> Any:
        return await reads.run(
            lambda conn: search_sessions(conn, p["query"], limit=p.get("limit", 20), cursor=p.get("cursor"))
        )

    async def query(p: Mapping[str, Any], raw: Mapping[str, Any], ctx: Any, model: Any) -> Any:
        return await reads.run(
            lambda conn: search_messages(conn, p["query"], session_id=p.get("sessionId"),
                                         limit=p.get("limit", 50), cursor=p.get("cursor"))
        )

    return {"search.sessions": sessions, "search.query": query}
