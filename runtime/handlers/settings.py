"""``settings.get`` / ``settings.set``: one key of a ``kv`` namespace (seed 003 §4.1)."""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store import settings
from store.receipts import ReceiptKey

__all__ = ["get", "set_value"]


def get(ctx: ReadContext, p: m.SettingsGetParams) -> Any:
    found = settings.get_value(ctx.conn, p.ns, p.key)
    if found is None:
        return {"ns": p.ns, "key": p.key, "value": None, "updatedAt": None}
    value, updated_at = found
    return {"ns": p.ns, "key": p.key, "value": value, "updatedAt": updated_at}


def set_value(ctx: WriterContext, p: m.SettingsSetParams, key: ReceiptKey | None) -> Any:
    settings.set_value(ctx.conn, p.ns, p.key, p.value, ctx.now)
    return {"ns": p.ns, "key": p.key, "value": p.value, "updatedAt": ctx.now}
