"""A long request frame is decoded off the trio loop.

The strict decode of a text frame (``store.jsonio.loads_strict``: orjson plus the checks for duplicate keys,
lone surrogates and integer ranges) of up to the 4 MiB frame cap took ~10-40 ms on the trio loop for a 2 MB
append, during which no other request of the host moved ("never block the trio loop"). A frame longer than
``DECODE_ON_LOOP`` is now decoded in a worker thread while its connection's reader waits (frames keep their
order); short frames are decoded at once, without a thread hop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors import gateway_connection
from tests.hostkit import client_for, inprocess_host, msg
from tests.threadkit import on_trio_thread


async def test_a_long_frame_is_decoded_in_a_worker_thread_and_a_short_one_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, bool]] = []
    decode = gateway_connection._decode

    def decode_seen(message: str) -> Any:
        seen.append((len(message), on_trio_thread()))
        return decode(message)

    monkeypatch.setattr(gateway_connection, "_decode", decode_seen)
    text = "long é \"quoted\" " * 80_000  # ~1.4 MB of JSON text
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "frames"}))["id"]
            for mid, body in (("big", text), ("small", "short")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, body)})
            got = await c.call("session.get", {"sessionId": sid})
    assert [m["id"] for m in got["messages"]] == ["big", "small"]
    assert got["messages"][0]["blocks"][0]["text"] == text
    long_ones = [on_trio for size, on_trio in seen if size > gateway_connection.DECODE_ON_LOOP]
    short_ones = [on_trio for size, on_trio in seen if size <= gateway_connection.DECODE_ON_LOOP]
    assert long_ones and not any(long_ones), seen
    assert short_ones and all(short_ones), seen
