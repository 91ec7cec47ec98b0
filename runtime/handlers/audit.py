"""``audit.list``: the audit log (seed 003 §4.13), newest first, filtered by session, kind and time."""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext
from store import audit
from store.indexing import cursors

__all__ = ["list_audit"]


def list_audit(ctx: ReadContext, p: m.AuditListParams) -> Any:
    fp = cursors.query_fingerprint("audit.list", p.session_id, p.kind,
                                   None if p.since is None else str(p.since),
                                   None if p.until is None else str(p.until))
    after = cursors.decode_cursor(p.cursor, "audit", fp, (int, int)) if p.cursor else None
    items, nxt = audit.list_rows(ctx.conn, session_id=p.session_id, kind=p.kind, since=p.since, until=p.until,
                                 limit=p.limit, cursor=after)
    return {"entries": items, "nextCursor": cursors.encode_cursor("audit", fp, list(nxt)) if nxt else None}
