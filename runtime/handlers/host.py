"""``host.status`` (versions, uptime, statistics, the boot report) and ``host.createLoginCode``."""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import HostContext
from store.receipts import ReceiptKey

__all__ = ["create_login_code", "status"]

LOGIN_CODES = "login_codes"
INSPECTOR_URL = "inspector_url"


async def status(ctx: HostContext, p: m.StatusParams, key: ReceiptKey | None) -> Any:
    report = ctx.services.status
    if report is None:
        raise RuntimeError("host.status has no status provider")
    return await report()


async def create_login_code(ctx: HostContext, p: m.LoginCodeParams, key: ReceiptKey | None) -> Any:
    """A one-time code for the inspector's ``POST /login`` (memory only: a restart forgets it)."""
    code, ttl = ctx.services.get(LOGIN_CODES).issue()
    base = ctx.services.get(INSPECTOR_URL)
    return {"code": code, "expiresInMs": int(ttl * 1000), "url": f"{base}/#code={code}"}
