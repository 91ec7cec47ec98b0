"""Small replies go to the socket from the task that answers (issue 26, host CPU per append): no hop to the
connection's writer task; what the socket does not take at once is finished before any other byte."""

from __future__ import annotations

import socket

import orjson
import trio

from actors.gateway_http import PrefixedStream
from tests.gateway.conftest import connect, frame, hello, recv, start_gateway


async def _stream_pair(sndbuf: int) -> tuple[PrefixedStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    return PrefixedStream(trio.SocketStream(a), b""), trio.SocketStream(b)


async def _read_all(stream: trio.SocketStream, size: int, into: bytearray) -> None:
    while len(into) < size:
        chunk = await stream.receive_some(65536)
        assert chunk, "the sender closed early"
        into += chunk


async def test_what_the_socket_did_not_take_goes_before_the_next_send() -> None:
    sender, receiver = await _stream_pair(4096)
    async with sender, receiver:
        head = bytes(range(256)) * 4096  # 1 MiB: far more than the socket buffers hold
        assert sender.send_nowait(head)
        assert 0 < sender.unsent < len(head)  # the socket took part of it, the rest is kept
        assert not sender.send_nowait(b"later")  # nothing may overtake those bytes
        got = bytearray()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_all, receiver, len(head) + 4, got)
                await sender.send_all(b"tail")  # trio-websocket's next frame (a pong, a close, a reply)
        assert bytes(got) == head + b"tail"
        assert sender.unsent == 0
        assert sender.send_nowait(b"again")
        assert await receiver.receive_some(100) == b"again"


async def test_flush_sends_the_rest_and_a_cancelled_flush_loses_no_byte() -> None:
    sender, receiver = await _stream_pair(4096)
    async with sender, receiver:
        head = b"x" * (1 << 20)
        assert sender.send_nowait(head)
        with trio.move_on_after(0.05):
            await sender.flush()  # nobody reads: it waits, then is cancelled
        assert 0 < sender.unsent < len(head)
        got = bytearray()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_all, receiver, len(head), got)
                await sender.flush()
        assert bytes(got) == head and sender.unsent == 0


async def test_a_full_socket_takes_nothing_and_says_so() -> None:
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender, receiver = PrefixedStream(trio.SocketStream(a), b""), trio.SocketStream(b)
    async with sender, receiver:
        while True:  # fill the socket's buffers (nobody reads)
            with trio.move_on_after(0.05) as waited:
                await a.send(b"f" * 4096)
            if waited.cancelled_caught:
                break
        assert not sender.send_nowait(b"reply")  # nothing was sent: the caller queues it for the writer
        assert sender.unsent == 0


async def test_small_replies_are_sent_by_the_answering_task(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            for i in range(20):
                await ws.send_message(frame({"jsonrpc": "2.0", "id": i, "method": "echo", "params": {"i": i}}))
                assert await recv(ws) == {"jsonrpc": "2.0", "id": i, "result": {"i": i}}
            conn = next(iter(h.gateway._connections.values()))
            assert conn.direct_frames == 21  # hello and every reply: none waited for the writer task
            assert conn.zero_copy_frames == 21


async def test_replies_to_a_client_that_reads_late_arrive_whole_and_in_order(nursery: trio.Nursery) -> None:
    """The client sends 600 requests before reading one reply (about 18 MB of replies, more than loopback
    socket buffers hold): the socket fills, a reply is left half sent, the rest wait for the writer; every
    reply arrives intact, in order."""
    h = await start_gateway(nursery, max_frame_bytes=2**20)
    blob = "z" * 30_000
    with trio.fail_after(30):
        async with connect(h.url, message_queue_size=1) as ws:
            await hello(ws)
            for i in range(600):
                request = {"jsonrpc": "2.0", "id": i, "method": "echo", "params": {"i": i, "b": blob}}
                await ws.send_message(frame(request))
            conn = next(iter(h.gateway._connections.values()))
            for _ in range(3000):  # until the gateway read and answered them all
                if len(h.dispatcher.enqueued) == 600:
                    break
                await trio.sleep(0.01)
            assert len(h.dispatcher.enqueued) == 600
            assert conn.direct_frames < 601  # some had to wait: the socket was full
            for i in range(600):
                assert orjson.loads(await ws.get_message()) == {"jsonrpc": "2.0", "id": i,
                                                                "result": {"i": i, "b": blob}}
            await ws.send_message(frame({"jsonrpc": "2.0", "id": "last", "method": "echo", "params": {}}))
            assert await recv(ws) == {"jsonrpc": "2.0", "id": "last", "result": {}}
