"""The host's keepalive (RELIABILITY.md row 12, "ping timeout"; protocol/README.md §1): after ``host.hello`` the
host pings every ``ping_interval`` seconds and closes (1011) a connection that sent nothing at all, not even the
pong, within ``ping_timeout`` of a ping. A peer that answers pings, or any WebSocket library that reads its
socket, stays connected however long it is idle. Real host, real sockets; short intervals."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import trio

from tests.gateway.test_dribbled_fragments import frame, upgraded
from tests.hostile.wire import hello_frame
from tests.hostkit import client_for, inprocess_host

INTERVAL = 0.3
TIMEOUT = 0.4


async def _read_frame(stream: trio.SocketStream, buf: bytearray) -> tuple[int, bytes]:
    """One unmasked server frame: (opcode, payload); (-1, b"") when the stream ended."""
    while True:
        if len(buf) >= 2:
            size, start = buf[1] & 0x7F, 2
            if size == 126 and len(buf) >= 4:
                size, start = int.from_bytes(buf[2:4], "big"), 4
            elif size == 127 and len(buf) >= 10:
                size, start = int.from_bytes(buf[2:10], "big"), 10
            if size < 126 or start > 2:
                if len(buf) >= start + size:
                    opcode, payload = buf[0] & 0x0F, bytes(buf[start:start + size])
                    del buf[:start + size]
                    return opcode, payload
        try:
            chunk = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return -1, b""
        if not chunk:
            return -1, b""
        buf += chunk


async def _hello(stream: trio.SocketStream, token: str, buf: bytearray) -> None:
    message = hello_frame(token, "keepalive-raw").encode()
    await stream.send_all(_masked(message, opcode=1))
    opcode, payload = await _read_frame(stream, buf)
    assert opcode == 1 and "result" in orjson.loads(payload), (opcode, payload[:200])


def _masked(payload: bytes, *, opcode: int) -> bytes:
    if len(payload) < 126:
        return frame(payload, opcode=opcode, fin=True)
    assert len(payload) < 65536
    mask = b"\x01\x02\x03\x04"
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask + body


async def test_a_peer_that_answers_no_ping_is_closed_1011_and_one_that_does_stays(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, ping_interval=INTERVAL, ping_timeout=TIMEOUT) as host:
            # silent after its hello: reads what the host sends (the pings) but answers nothing
            silent, buf = await upgraded(host.port), bytearray()
            async with silent:
                await _hello(silent, host.token, buf)
                started = time.monotonic()
                pings = 0
                while True:
                    opcode, payload = await _read_frame(silent, buf)
                    if opcode == 0x9:
                        pings += 1
                        continue
                    break
                took = time.monotonic() - started
                assert opcode == 0x8, opcode  # a close frame
                assert int.from_bytes(payload[:2], "big") == 1011 and b"keepalive" in payload[2:], payload
                assert pings == 1  # one ping outstanding at most
                assert INTERVAL + TIMEOUT - 0.05 <= took < INTERVAL + TIMEOUT + 5, took
            assert host.gateway.statistics().keepalive_closes == 1

            # a raw peer that answers each ping with its pong, and nothing else, for ten intervals
            ponging, buf = await upgraded(host.port), bytearray()
            async with ponging:
                await _hello(ponging, host.token, buf)
                answered = 0
                with trio.move_on_after(10 * INTERVAL):
                    while True:
                        opcode, payload = await _read_frame(ponging, buf)
                        assert opcode == 0x9, (opcode, payload)  # only pings: never a close
                        await ponging.send_all(_masked(payload, opcode=0xA))
                        answered += 1
                assert answered >= 5
                request = orjson.dumps({"jsonrpc": "2.0", "id": 7, "method": "host.status", "params": {}})
                await ponging.send_all(_masked(request, opcode=1))
                while True:
                    opcode, payload = await _read_frame(ponging, buf)
                    if opcode == 0x9:
                        await ponging.send_all(_masked(payload, opcode=0xA))
                        continue
                    break
                assert opcode == 1, opcode
                status = orjson.loads(payload)["result"]
                assert status["gateway"]["keepaliveCloses"] == 1

            # a client library reading its socket: idle for ten intervals, then served
            async with client_for(host, "keepalive-idle") as c:
                await trio.sleep(10 * INTERVAL)
                status = await c.call("host.status", {})
                assert status["gateway"]["keepaliveCloses"] == 1
            assert host.gateway.statistics().keepalive_closes == 1


async def test_no_pings_when_turned_off(tmp_path: Path) -> None:
    """``ping_interval=None``: an idle authenticated connection gets no frame at all."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path, ping_interval=None) as host:
            quiet, buf = await upgraded(host.port), bytearray()
            async with quiet:
                await _hello(quiet, host.token, buf)
                with trio.move_on_after(1.0) as idle:
                    opcode, _ = await _read_frame(quiet, buf)
                    raise AssertionError(f"the host sent a frame ({opcode}) with pings turned off")
                assert idle.cancelled_caught
            assert host.gateway.statistics().keepalive_closes == 0


async def test_a_peer_that_sends_requests_is_not_silent_even_when_it_answers_no_ping(tmp_path: Path) -> None:
    """Only silence closes: a peer that answers no ping but keeps talking (a request every 0.1 s) is read, so
    it is alive; it is closed only once it falls silent."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, ping_interval=INTERVAL, ping_timeout=TIMEOUT) as host:
            talker, buf = await upgraded(host.port), bytearray()
            async with talker:
                await _hello(talker, host.token, buf)
                answers = 0
                for n in range(30):  # ten intervals of requests, no pong
                    request = orjson.dumps({"jsonrpc": "2.0", "id": n, "method": "host.status", "params": {}})
                    await talker.send_all(_masked(request, opcode=1))
                    while True:
                        opcode, payload = await _read_frame(talker, buf)
                        if opcode != 0x9:
                            break
                    assert opcode == 1, (opcode, payload[:100])
                    answers += 1
                    await trio.sleep(0.1)
                assert answers == 30 and host.gateway.statistics().keepalive_closes == 0
                while (opcode := (await _read_frame(talker, buf))[0]) == 0x9:  # silent now
                    pass
                assert opcode == 0x8
            assert host.gateway.statistics().keepalive_closes == 1
