"""The notification inbox (seed 003 §4.14): plain DB reads and DB-only writes.

Never touches sessions, turns or transcripts (§11.15).
"""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store import notifications
from store.indexing import cursors
from store.receipts import ReceiptKey

__all__ = ["clear", "list_notifications", "mark_all_read", "mark_read"]


def list_notifications(ctx: ReadContext, p: m.NotificationsListParams) -> Any:
    fp = cursors.query_fingerprint("notifications.list", str(p.unread_only))
    after = cursors.decode_cursor(p.cursor, "notifications", fp, (int, str)) if p.cursor else None
    found, nxt, unread = notifications.list_notifications(
        ctx.conn, unread_only=p.unread_only, limit=p.limit, cursor=(after[0], after[1]) if after else None)
    return found.map(lambda n: {k: v for k, v in n.items() if v is not None}).result(
        "notifications", unreadCount=unread,
        nextCursor=cursors.encode_cursor("notifications", fp, list(nxt)) if nxt else None)


def mark_read(ctx: WriterContext, p: m.NotificationsMarkReadParams, key: ReceiptKey | None) -> Any:
    return {"updated": notifications.mark_read(ctx.conn, p.ids, ctx.now)}


def mark_all_read(ctx: WriterContext, p: m.NotificationsMarkAllReadParams, key: ReceiptKey | None) -> Any:
    return {"updated": notifications.mark_all_read(ctx.conn, ctx.now)}


def clear(ctx: WriterContext, p: m.NotificationsClearParams, key: ReceiptKey | None) -> Any:
    return {"deleted": notifications.clear(ctx.conn, p.ids)}
