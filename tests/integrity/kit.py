"""Helpers for the index-integrity tests: act at the moment a given line is durable, and read
a session back through every route that reads the index."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from store.transcripts.transcript import TranscriptWriter


@contextmanager
def when_durable(monkeypatch: pytest.MonkeyPatch, marker: bytes,
                 action: Callable[[], Awaitable[None]]) -> Iterator[list[bool]]:
    """Run ``action`` (in trio) right after the first transcript write holding ``marker`` is durable,
    before the session actor goes on to its index op. Yields a one-element list once it fired.
    ``action`` must be bounded in time: the actor's worker thread waits for it."""
    token = trio.lowlevel.current_trio_token()
    real = TranscriptWriter.append
    fired: list[bool] = []

    def append(self: TranscriptWriter, lines: Any) -> tuple[int, int]:
        out = real(self, lines)
        if not fired and any(marker in line for line in lines):
            fired.append(True)
            trio.from_thread.run(action, trio_token=token)
        return out

    monkeypatch.setattr(TranscriptWriter, "append", append)
    try:
        yield fired
    finally:
        monkeypatch.setattr(TranscriptWriter, "append", real)


async def visible(c: Any, sid: str, mid: str, token: str) -> dict[str, Any]:
    """What the index-reading routes say of message ``mid`` (text holds ``token``) of ``sid``."""
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    listed = {s["id"]: s for s in (await c.call("session.list", {"limit": 500}))["sessions"]}
    found = await c.call("search.query", {"query": token})
    return {
        "get": [m["id"] for m in got["messages"]],
        "total": got["totalMessages"],
        "listed": listed.get(sid, {}).get("messageCount"),
        "search": [h["messageId"] for h in found["results"]],
    }
