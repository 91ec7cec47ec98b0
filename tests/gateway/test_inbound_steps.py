"""A request costs trio-websocket's reader one task step and the socket one read (issue 26, host CPU per
append over WebSocket): the frame is handed to the connection's reader without a second step, and a socket
with nothing to read is waited on before it is read (no failed ``recv`` per frame)."""

from __future__ import annotations

import socket
from typing import Any

import trio
import trio.testing

from actors.gateway_http import PrefixedStream
from tests.gateway.conftest import connect, frame, hello, recv, start_gateway


class _CountingSocket(socket.socket):
    """A stdlib socket that counts its ``recv`` calls, failed ones (``EAGAIN``) included."""

    recvs = 0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.recvs += 1
        return super().recv(bufsize, flags)


def _counting_pair() -> tuple[_CountingSocket, trio.SocketStream, trio.SocketStream]:
    """A connected pair of trio socket streams; the first one's stdlib socket counts its reads."""
    a, b = socket.socketpair()
    first = trio.socket.from_stdlib_socket(a)
    counted = _CountingSocket(a.family, a.type, a.proto, fileno=a.detach())
    counted.setblocking(False)
    first._sock = counted  # type: ignore[attr-defined]  # the trio socket reads through the counting one
    return counted, trio.SocketStream(first), trio.SocketStream(trio.socket.from_stdlib_socket(b))


async def test_a_read_waits_for_data_before_it_reads() -> None:
    raw, under, sender = _counting_pair()
    stream = PrefixedStream(under, b"")
    async with stream, sender:
        got: list[bytes] = []
        with trio.fail_after(10):
            for n in range(5):
                async with trio.open_nursery() as nursery:
                    async def read() -> None:
                        got.append(await stream.receive_some(65536))
                    nursery.start_soon(read)
                    await trio.testing.wait_all_tasks_blocked()  # the reader waits: nothing was sent yet
                    await sender.send_all(b"frame %d" % n)
        assert got == [b"frame %d" % n for n in range(5)]
        assert raw.recvs == 5  # one read per frame, none that found nothing


async def test_a_read_that_filled_its_buffer_reads_the_rest_first() -> None:
    raw, under, sender = _counting_pair()
    stream = PrefixedStream(under, b"")
    async with stream, sender:
        with trio.fail_after(10):
            await sender.send_all(b"x" * 300)
            got = bytearray()
            while len(got) < 300:
                got += await stream.receive_some(100)
            assert got == b"x" * 300
        await sender.aclose()
        with trio.fail_after(10):
            assert await stream.receive_some(100) == b""  # the peer closed: end of stream, as before


async def test_a_read_of_a_closed_stream_fails_as_the_socket_stream_does() -> None:
    _raw, under, peer = _counting_pair()
    stream = PrefixedStream(under, b"")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            failed: list[BaseException] = []

            async def read() -> None:
                try:
                    await stream.receive_some(100)
                except trio.ClosedResourceError as exc:
                    failed.append(exc)
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()  # closed while the reader waits
    assert len(failed) == 1
    try:
        await stream.receive_some(100)
    except trio.ClosedResourceError:
        pass
    else:
        raise AssertionError("a read of a closed stream returned")
    await peer.aclose()


class _ReaderSteps(trio.abc.Instrument):
    """Task steps of one WebSocket connection's reader task (trio-websocket's ``_reader_task``)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        frame_ = getattr(task.coro, "cr_frame", None)
        if frame_ is not None and task.name.endswith("_reader_task") and frame_.f_locals.get("self") is self.ws:
            self.steps += 1


async def test_each_request_costs_the_websocket_reader_one_task_step(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            conn = next(iter(h.gateway._connections.values()))
            counter = _ReaderSteps(conn._ws)
            trio.lowlevel.add_instrument(counter)
            try:
                for i in range(20):
                    await ws.send_message(frame({"jsonrpc": "2.0", "id": i, "method": "echo", "params": {"i": i}}))
                    assert await recv(ws) == {"jsonrpc": "2.0", "id": i, "result": {"i": i}}
            finally:
                trio.lowlevel.remove_instrument(counter)
    # one step per frame: woken by the socket, read, parse, hand over, wait again (it was two: the channel's
    # send yielded once more before the reader went back to the socket)
    assert counter.steps <= 25
