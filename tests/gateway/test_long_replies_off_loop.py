"""A long mutation reply is encoded off the trio loop.

The never-block-the-loop audit found a mutation's reply encoded by the task that answered, whatever its length
(``configSync.export``'s bundle of several MiB of base64: ~3.4 ms; ``session.queuePush`` / ``queueTake``
answers carrying a prompt of up to 1 MB). A reply longer than ``REPLY_ON_LOOP``, a read's or a mutation's, is
now encoded in the connection's worker thread; short ones are encoded at once, without a thread hop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors import gateway_connection
from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host
from tests.threadkit import on_trio_thread

PROMPT = ("queued é \"q\"\n\u2028 " * 60_000)[:900_000]  # escapes and non-ASCII throughout


async def _push(c: HostClient, sid: str, content: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.queuePush", {
        "sessionId": sid, "principal": "ui", "content": content, "permissionMode": "ask"})
    return result


async def test_a_long_mutation_reply_is_encoded_in_a_worker_thread_and_a_short_one_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, bool]] = []
    encode = gateway_connection.encode

    def encode_seen(response: dict[str, Any], **kwargs: Any) -> bytes:
        data = encode(response, **kwargs)
        seen.append((len(data), on_trio_thread()))
        return data

    monkeypatch.setattr(gateway_connection, "encode", encode_seen)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "queue"}))["id"]
            long_one = await _push(c, sid, PROMPT)
            short_one = await _push(c, sid, "short")
    assert long_one["entry"]["content"] == PROMPT and short_one["entry"]["content"] == "short"
    long_ones = [on_trio for size, on_trio in seen if size > len(PROMPT)]
    short_ones = [on_trio for size, on_trio in seen if size < 64 * 1024]
    assert long_ones == [False], seen  # the long push's answer, in a worker thread
    assert len(short_ones) == 3 and all(short_ones), seen  # hello, create, the short push: on the loop
