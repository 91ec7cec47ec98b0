"""RELIABILITY.md row 12's third slow client, "a fragment dribbled slowly", black-box: an upgraded socket that
sends its ``host.hello`` as a fragmented text message (RFC 6455 §5.4: a first frame without FIN, then
continuation frames), one byte a second. The hello deadline (protocol/README.md §7: 5 s) holds for a
message still being assembled, so each is closed in time, and a healthy client beside them keeps its
latency. Then, as a control, the same fragments sent at once make a hello the host accepts (the frames are
well formed; only their pace is hostile)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import trio

from tests.gateway.test_reliability_outsider_b import client, port_of, running
from tests.hostile.wire import hello_frame

DRIBBLERS = 12


def frame(payload: bytes, *, opcode: int, fin: bool) -> bytes:
    """One masked client frame (RFC 6455 §5.2), payload under 126 bytes."""
    assert len(payload) < 126
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + mask + masked


def fragments(message: bytes) -> list[bytes]:
    """``message`` as one text frame per byte: the first opcode 1 without FIN, the rest continuations."""
    return [frame(message[i:i + 1], opcode=1 if i == 0 else 0, fin=i == len(message) - 1)
            for i in range(len(message))]


async def upgraded(port: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = await stream.receive_some(4096)
        assert chunk, "closed during the upgrade"
        got += chunk
    assert got.startswith(b"HTTP/1.1 101"), got[:200]
    return stream


async def dribble(port: int, message: bytes, closed_at: list[float], started: float) -> None:
    """Send ``message`` one fragment a second; when the host ends the connection (its first frame back: the
    UNAUTHENTICATED answer or a close frame; or the end of the stream)."""
    stream = await upgraded(port)
    async with stream:
        try:
            for piece in fragments(message):
                await stream.send_all(piece)
                with trio.move_on_after(1.0):
                    await stream.receive_some(4096)  # an answer, a close frame or the end of the stream
                    break
            else:
                raise AssertionError("the whole dribbled hello went through")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    closed_at.append(time.monotonic() - started)


async def test_a_hello_dribbled_in_fragments_is_closed_at_the_hello_deadline_and_others_are_served(
        tmp_path: Path) -> None:
    async with running(tmp_path / "data") as proc:
        port = port_of(proc)
        message = hello_frame(proc.token, "dribbler").encode()
        assert len(message) > 20  # more than 20 s of fragments: only the deadline ends it
        with trio.fail_after(60):
            async with client(proc, "healthy") as ok:
                closed: list[float] = []
                latencies: list[float] = []
                started = time.monotonic()
                async with trio.open_nursery() as nursery:
                    for _ in range(DRIBBLERS):
                        nursery.start_soon(dribble, port, message, closed, started)
                    while len(closed) < DRIBBLERS:
                        t0 = time.monotonic()
                        await ok.call("host.status", {})
                        latencies.append(time.monotonic() - t0)
                        await trio.sleep(0.1)
                assert max(closed) < 12, f"slowest dribbled hello closed after {max(closed):.1f} s"
                assert max(latencies) < 2.0, f"a healthy call took {max(latencies):.2f} s beside them"
                # control: the same fragments at once are a hello the host takes
                stream = await upgraded(port)
                async with stream:
                    await stream.send_all(b"".join(fragments(message)))
                    got = b""
                    while not got:
                        got = await stream.receive_some(4096)
                    assert got[0] == 0x81, got[:20]  # one unfragmented text frame back
                    size = got[1] & 0x7F
                    start = 2 if size < 126 else 4
                    while len(got) < start + (size if size < 126 else int.from_bytes(got[2:4], "big")):
                        got += await stream.receive_some(4096)
                    reply = orjson.loads(got[start:])
                    assert "result" in reply, reply
