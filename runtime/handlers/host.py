"""``host.status``: versions, uptime, actor and DB-writer statistics, the boot recovery report."""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import HostContext
from store.receipts import ReceiptKey

__all__ = ["status"]


async def status(ctx: HostContext, p: m.StatusParams, key: ReceiptKey | None) -> Any:
    report = ctx.services.status
    if report is None:
        raise RuntimeError("host.status has no status provider")
    return await report()
