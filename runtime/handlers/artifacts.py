"""``artifacts.list``: files sessions produced (seed 003 §4.10), newest first."""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext
from store import artifacts
from store.indexing import cursors

__all__ = ["list_artifacts"]


def list_artifacts(ctx: ReadContext, p: m.ArtifactsListParams) -> Any:
    fp = cursors.query_fingerprint("artifacts.list", p.session_id)
    after = cursors.decode_cursor(p.cursor, "artifacts", fp, (int, str, str)) if p.cursor else None
    found, nxt = artifacts.list_artifacts(ctx.conn, session_id=p.session_id, limit=p.limit, cursor=after)
    return found.map(lambda a: {k: v for k, v in a.items() if v is not None}).result(
        "artifacts", nextCursor=cursors.encode_cursor("artifacts", fp, list(nxt)) if nxt else None)
