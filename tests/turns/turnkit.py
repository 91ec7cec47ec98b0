"""Shared helpers for the turn / notification / checkpoint / artifact tests."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.client import HostClient, RpcError


async def new_session(c: HostClient, title: str = "task") -> str:
    return str((await c.call("session.create", {"title": title}))["id"])


async def start(c: HostClient, sid: str, tid: str, **extra: Any) -> dict[str, Any]:
    return await c.call("session.startTurn", {"sessionId": sid, "turnId": tid, **extra})


async def end(c: HostClient, sid: str, tid: str, status: str = "completed", **extra: Any) -> dict[str, Any]:
    return await c.call("session.endTurn", {"sessionId": sid, "turnId": tid, "status": status, **extra})


async def rpc_error(coro: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        await coro
    return info.value


def assistant(mid: str, text: str, status: str | None = None, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": mid, "role": "assistant", "blocks": [{"type": "text", "text": text}], **extra}
    if status is not None:
        rec["meta"] = {"status": status}
    return rec
