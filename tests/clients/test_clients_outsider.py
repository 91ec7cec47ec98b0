"""An app developer's reading of pihost_client, checked against real ``pi-host serve`` processes.

Each test quotes the sentence of the documents it holds the client (and the host behind it) to:
clients/python/README.md and ``pihost_client/client.py`` (which the README points to for reconnect,
resubscribe and receipt-backed retries), and protocol/README.md sections 3 to 7.

What tests/clients/test_client_holds_up.py, test_connect_failures.py and test_handshake_reset.py already
cover is not repeated: an append or a database-only call killed *after* its effect, a workload through
random SIGKILLs, SIGTERM during a stream of calls, a bad token, a missing data directory, a reset during
the handshake, resuming after a dropped connection. What they left open, and this file checks:

* a keyed write killed *before* its effect (the retry must apply it, not lose it), and the same key reused
  for another request;
* a raw ``call`` of a mutating method without a ``submissionId`` (documented as not retried);
* a subscriber that does not read its events while the same client makes calls;
* SIGTERM in the middle of a stream of events: no duplicate, no gap, one Resync;
* a call cancelled by its caller while its frame is half sent, or while it waits for its answer;
* a url nobody answers, a server that answers garbage, and one that accepts the WebSocket and never answers
  ``host.hello`` (on the first connection, and on a reconnect: ``hello_timeout``, as the TypeScript client's
  ``helloTimeoutMs``);
* app callbacks (``on_state``, ``on_connect``) that raise: reported to ``on_callback_error`` (or logged), never
  the end of the client, as the TypeScript client's ``onCallbackError``;
* paging a session larger than one reply may be, and the error codes on the way.

Every scenario runs under asyncio and trio (the client claims both).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections import Counter
from typing import Any

import anyio
import pytest

from pihost_client import (
    ConnectionLost,
    Event,
    HostNotRunning,
    HostRefused,
    HostUnavailable,
    Resync,
    RpcError,
    connect,
)
from pihost_client._ws import WebSocketClosed, connect_websocket
from tests.clients.relay import Relay, free_port
from tests.clients.test_client_holds_up import (
    BACKENDS,
    Host,
    fast,
    message_event,
    message_ids,
    next_items,
    run,
    text_message,
    valid,
)


# -- receipts: a keyed write killed before its effect; a key reused for another request ---------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_keyed_write_killed_before_it_was_written_is_applied_once_by_the_retry(host: Host, backend: str) -> None:
    """client.py: "when the connection is lost before the answer [...], the same request is sent again with the
    same id, so the host applies it at most once and answers the retry from its receipt". Killed before the
    line was written, the retry on the restarted host must apply it (no silent loss), once, and a second send
    with the same key must get the same answer (no duplicate)."""

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="before-write") as c:
            sid = (await c.session.create(title="Before"))["id"]
        await host.terminate()
        await host.start(env={"RT_CRASHPOINT": "append.before_write:1:kill"})
        armed = host.current
        async with fast(host.data_dir, "before-write") as c:

            async def restart_when_dead() -> None:
                assert await host.died() == -9
                await host.start()

            async with anyio.create_task_group() as tg:
                tg.start_soon(restart_when_dead)
                with anyio.fail_after(30):
                    answered = valid("session.appendMessage", await c.session.append_message(
                        session_id=sid, message=text_message("m1", "killed before its line"),
                        submission_id="key-1"))
            assert armed.proc.returncode == -9 and c.connects == 2
            again = valid("session.appendMessage", await c.session.append_message(
                session_id=sid, message=text_message("m1", "killed before its line"), submission_id="key-1"))
            assert answered["replayed"] is False and answered["message"]["id"] == "m1"
            assert again == answered
            assert await message_ids(c, sid) == ["m1"]
            # protocol/README.md section 4: "The same key used for a different request (other params, or another
            # method) fails with `IDEMPOTENCY_CONFLICT` and changes nothing."
            with pytest.raises(RpcError) as conflict:
                await c.session.append_message(session_id=sid, message=text_message("m2", "other"),
                                               submission_id="key-1")
            assert conflict.value.data_code == "IDEMPOTENCY_CONFLICT" and not conflict.value.retriable
            assert await message_ids(c, sid) == ["m1"]
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_raw_mutating_call_without_a_submission_id_is_not_resent(host: Host, backend: str) -> None:
    """client.py, ``Client.call``: "mutating calls need a ``submissionId`` in ``params`` to be retried after a lost
    connection". Without one, the host dying after the effect must be a ConnectionLost for the caller (who cannot
    know whether it took effect), never a second, unkeyed send that stores the message twice."""

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="raw") as c:
            sid = (await c.session.create(title="Raw"))["id"]
        await host.terminate()
        await host.start(env={"RT_CRASHPOINT": "append.after_fsync:1:kill"})
        async with fast(host.data_dir, "raw", reconnect_timeout=20) as c:

            async def restart_when_dead() -> None:
                assert await host.died() == -9
                await host.start()

            async with anyio.create_task_group() as tg:
                tg.start_soon(restart_when_dead)
                with anyio.fail_after(30), pytest.raises(ConnectionLost) as lost:
                    await c.call("session.appendMessage",
                                 {"sessionId": sid, "message": text_message("m1", "unkeyed")})
            assert not isinstance(lost.value, HostUnavailable)  # it did not wait for the host: it was not resent
            with anyio.fail_after(30):
                assert await message_ids(c, sid) == ["m1"]  # the effect, once
        await host.terminate()

    run(backend, body)


# -- a subscriber that does not read --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_subscriber_that_does_not_read_holds_up_no_call(host: Host, backend: str) -> None:
    """client.py: "Slow consumers never hold up calls: each subscription buffers at most ``buffer`` items [...]
    once the consumer has read what is buffered, resubscribes from its cursor: the host replays what was missed"
    (protocol/README.md section 5: "A slow subscriber is disconnected instead of being buffered without limit";
    "After a reconnect, subscribe with it to get the events you missed, with no gaps").

    The tour's own shape (subscribe, make calls, then iterate) with more calls than the buffer holds: the calls
    hung for ever (the connection's reader waited for room in the subscription's buffer, so no answer was read),
    and the host, whose socket was still read by nobody, could not tell."""
    count = 40

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="slow-reader") as c:
            sid = (await c.session.create(title="Slow reader"))["id"]
            other = (await c.session.create(title="Read on time"))["id"]
            async with c.subscribe(["session.message"], session_id=sid, buffer=4) as events, \
                    c.subscribe(["session.message"], session_id=other) as live:
                with anyio.move_on_after(30) as hung:
                    for i in range(count):
                        await c.session.append_message(session_id=sid, message=text_message(f"m{i}", f"n{i}"))
                    # another subscription of the same client is not held up either
                    await c.session.append_message(session_id=other, message=text_message("o0", "on time"))
                    assert [message_event(e) for e in await next_items(live, 1)] == ["o0"]
                if hung.cancelled_caught:
                    with anyio.move_on_after(2):  # free the reader, so that the client can close
                        async for _ in events:
                            pass
                    pytest.fail("the calls hung behind the events nobody read")
                got = await next_items(events, count)
                assert [message_event(e) for e in got] == [f"m{i}" for i in range(count)]  # no Resync, no gap
                cursors = [e.cursor for e in got if isinstance(e, Event)]
                assert cursors == sorted(set(cursors))
                await c.session.append_message(session_id=sid, message=text_message("after", "live again"))
                assert [message_event(e) for e in await next_items(events, 1)] == ["after"]
            assert c.connects == 1
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_subscriber_that_does_not_read_across_a_restart_gets_its_resync_in_order(host: Host, backend: str) -> None:
    """client.py: "If the host restarted (a new ``bootId``) [...] the subscription yields a :class:`Resync` first:
    reload what you show, then go on with the events that follow", and slow consumers "never hold up calls". A
    subscriber with a full buffer when the host is SIGKILLed and restarted: the client reconnects (its calls
    work: the reconnect used to wait for room for the Resync, so they waited ``reconnect_timeout`` and raised
    HostUnavailable), and the consumer reads what was buffered, then the Resync, then every event of the new boot
    since the reconnect, in order."""

    async def body() -> None:
        await host.start()
        async with fast(host.data_dir, "slow-restart", reconnect_timeout=10) as c, \
                fast(host.data_dir, "slow-restart-writer", reconnect_timeout=10) as writer:
            sid = (await c.session.create(title="Slow restart"))["id"]
            async with c.subscribe(["session.message"], session_id=sid, buffer=4) as events:
                with anyio.move_on_after(30) as hung:
                    for i in range(8):
                        await writer.session.append_message(session_id=sid, message=text_message(f"m{i}", "x"))
                    await c.session.get(session_id=sid)  # the buffer is full and the reader went on
                    await host.kill()
                    await host.start()
                    renamed = await c.session.rename(session_id=sid, title="After the restart")
                    assert renamed["title"] == "After the restart" and c.connects == 2
                    for i in range(3):
                        await writer.session.append_message(session_id=sid, message=text_message(f"n{i}", "y"))
                if hung.cancelled_caught:
                    with anyio.move_on_after(2):
                        async for _ in events:
                            pass
                    pytest.fail("the calls hung behind the events nobody read")
                items = await next_items(events, 8)
        assert [message_event(e) for e in items[:4]] == ["m0", "m1", "m2", "m3"]
        assert isinstance(items[4], Resync) and "restarted" in items[4].reason, items[4]
        assert [message_event(e) for e in items[5:]] == ["n0", "n1", "n2"]
        await host.terminate()

    run(backend, body)


# -- SIGTERM in the middle of a stream of events ---------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graceful_stop_mid_stream_gives_each_event_once_then_one_resync(host: Host, backend: str) -> None:
    """protocol/README.md section 5: "`cursor` is host-wide and strictly increasing" and "`cursor`s restart with
    every host start [...] subscribe without one and reload (the Python client does this and yields a
    `Resync`)"; client.py: "If the host restarted (a new ``bootId``) [...] the subscription yields a
    :class:`Resync` first". A writer streams appends while the host gets SIGTERM and is started again: the
    subscriber sees no message twice, its events before the stop are a gapless prefix of what was acknowledged,
    one Resync separates the boots, and reloading after it shows every acknowledged message once."""

    async def body() -> None:
        await host.start()
        acked: list[str] = []
        async with fast(host.data_dir, "stream-reader", reconnect_timeout=20) as reader, \
                fast(host.data_dir, "stream-writer", reconnect_timeout=20) as writer:
            sid = (await writer.session.create(title="Stream"))["id"]
            async with reader.subscribe(["session.message"], session_id=sid) as events:
                stopped = anyio.Event()
                streaming = anyio.Event()

                async def write() -> None:
                    n = 0
                    while not stopped.is_set() or n < 60:
                        mid = f"m{n:04d}"
                        await writer.session.append_message(session_id=sid, message=text_message(mid, mid))
                        acked.append(mid)
                        if n == 20:
                            streaming.set()
                        n += 1

                async def stop() -> None:
                    await streaming.wait()
                    assert await host.terminate() == 0
                    await host.start()
                    stopped.set()

                items: list[Event | Resync] = []
                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(write)
                        tg.start_soon(stop)
                    while not items or not isinstance(items[-1], Event) or message_event(items[-1]) != acked[-1]:
                        with anyio.move_on_after(2) as waited:
                            items.append(await events.next())
                        if waited.cancelled_caught:
                            # on a loaded machine the writer can reconnect and write the rest before the reader
                            # subscribed again (those are what the Resync's reload covers): one more write, which
                            # the new subscription must deliver
                            mid = f"m{len(acked):04d}"
                            await writer.session.append_message(session_id=sid, message=text_message(mid, mid))
                            acked.append(mid)
            assert reader.connects == 2 and writer.connects == 2
            resyncs = [i for i, item in enumerate(items) if isinstance(item, Resync)]
            assert len(resyncs) == 1, items
            before = [message_event(e) for e in items[:resyncs[0]]]
            after = [message_event(e) for e in items[resyncs[0] + 1:]]
            assert before == acked[:len(before)], "a gap or a reordering before the stop"
            assert not set(before) & set(after), "an event delivered again after the restart"
            for segment in (items[:resyncs[0]], items[resyncs[0] + 1:]):
                cursors = [e.cursor for e in segment if isinstance(e, Event)]
                assert cursors == sorted(set(cursors))
            assert after == acked[len(acked) - len(after):], "a gap after the restart"
            assert await message_ids(reader, sid) == acked  # the reload the Resync asks for: each message once
        await host.terminate()

    run(backend, body)


# -- cancellation by the caller -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_cancelled_by_its_caller_leaves_the_client_working(host: Host, backend: str) -> None:
    """client.py, ``connect``: a call "waits at most ``reconnect_timeout``"; the README: "The adapter runs under
    asyncio and trio like the client". A caller's cancel scope is the other bound an app has. With the host
    stopped (SIGSTOP), a call waiting for its answer and a call whose 7 MiB frame is only partly sent are
    cancelled; once the host runs again, the client answers the next calls (no frame left half written ahead of
    them), holds no reply slot for the cancelled ones, and each cancelled write took effect at most once."""

    async def body() -> None:
        await host.start()
        pid = host.current.proc.pid
        async with fast(host.data_dir, "cancel", reconnect_timeout=20) as c:
            sid = (await c.session.create(title="Cancel"))["id"]
            os.kill(pid, signal.SIGSTOP)
            try:
                with anyio.move_on_after(0.5) as waiting:
                    await c.session.append_message(session_id=sid, message=text_message("small", "waits"),
                                                   submission_id="cancel-small")
                with anyio.move_on_after(0.5) as sending:
                    await c.session.append_message(session_id=sid, message=text_message("big", "y" * (7 << 20)),
                                                   submission_id="cancel-big")
            finally:
                os.kill(pid, signal.SIGCONT)
            assert waiting.cancelled_caught and sending.cancelled_caught
            with anyio.fail_after(30):
                after = valid("session.appendMessage", await c.session.append_message(
                    session_id=sid, message=text_message("after", "works")))
                assert after["message"]["id"] == "after"
                renamed = valid("session.rename", await c.session.rename(session_id=sid, title="Still works"))
                assert renamed["title"] == "Still works"
                page = valid("session.get", await c.session.get(session_id=sid, full=True, content_limit=8))
            ids = Counter(m["id"] for m in page["messages"])
            assert ids["after"] == 1 and ids["small"] <= 1 and ids["big"] <= 1, ids
            conn = c._conn
            assert conn is not None and not conn._slots, "a cancelled call left its reply slot behind"
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_send_cancelled_part_way_ends_its_connection(backend: str) -> None:
    """_ws.py: a frame whose send was cancelled may be partly on the wire (trio writes it in pieces as the
    socket takes them), and the peer reads whatever follows as the rest of it: the next call's frame, the
    keepalive's ping. That next call then waited for the keepalive to give up (some 20 s; the test above took
    that long 1 time in 20 under trio). Now the connection ends there: ``closed`` is set, a later send raises
    at once (the client reconnects), and the peer gets nothing after the cut frame, then the end of the stream.
    The peer here never reads until the send was cancelled, so its socket buffers fill part way through."""
    server = FakeServer(None)
    payload = 24 << 20  # far more than loopback's socket buffers hold
    frame_bytes = 2 + 8 + 4 + payload  # a masked text frame with a 64-bit length

    async def body() -> None:
        ws = await connect_websocket(f"ws://127.0.0.1:{server.port}/")
        with anyio.move_on_after(0.5) as sending:
            await ws.send("y" * payload)
        assert sending.cancelled_caught, "the send was not held up by the peer's full buffers"
        assert isinstance(ws.closed, WebSocketClosed) and "cancelled" in str(ws.closed), ws.closed
        with pytest.raises(WebSocketClosed):
            await ws.send('{"after": true}')
        await ws.aclose()

    got = _what_the_peer_got(server, body, backend)
    assert 0 < len(got) <= frame_bytes, (len(got), frame_bytes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_send_cancelled_before_it_started_leaves_its_connection_open(backend: str) -> None:
    """The other side of the test above: a call whose cancel scope was cancelled before its frame started
    (nothing written) keeps the connection (no needless reconnect), and the next frame goes out whole."""
    server = FakeServer(None)

    async def body() -> None:
        ws = await connect_websocket(f"ws://127.0.0.1:{server.port}/")
        with anyio.CancelScope() as scope:
            scope.cancel()
            await ws.send('{"never": "sent"}')
        assert scope.cancelled_caught and ws.closed is None
        await ws.send('{"after": true}')
        await ws.aclose()

    got = _what_the_peer_got(server, body, backend)
    # a masked text frame of 15 bytes ('{"after": true}'), then the close frame: nothing of the cancelled one
    assert got[0] == 0x81 and got[1] == 0x80 | len('{"after": true}') and got[2 + 4 + 15] == 0x88, got.hex()


def _what_the_peer_got(server: FakeServer, body: Any, backend: str) -> bytes:
    """Run ``body`` (a client of ``server``), then every byte the server's first connection received after the
    handshake, up to the end of the stream (not a timeout)."""
    try:
        anyio.run(body, backend=backend)
        assert server.accepted.wait(5)
        conn = server.conns[0]
        conn.settimeout(20)
        chunks = []
        while chunk := conn.recv(1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        server.close()


# -- no host, a garbage answer, a silent WebSocket -------------------------------------------------------------
class FakeServer:
    """A TCP server on loopback that answers every connection with ``reply`` (bytes, or None: accept the
    WebSocket upgrade, send ``after_upgrade``, then say nothing) and keeps the socket open until it is closed."""

    def __init__(self, reply: bytes | None, after_upgrade: bytes = b"") -> None:
        self.reply = reply
        self.after_upgrade = after_upgrade
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.conns: list[socket.socket] = []
        self.accepted = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()
            try:
                head = conn.recv(65536)
                if self.reply is not None:
                    conn.sendall(self.reply)
                    continue
                key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                           if line.lower().startswith(b"sec-websocket-key:"))
                import base64
                import hashlib
                accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + self.after_upgrade)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def _connect_raises(backend: str, url: str, **options: Any) -> tuple[BaseException, float]:
    """What ``async with connect(url, token)`` raises and after how long (bounded by the test at 20 s)."""

    async def attempt() -> tuple[BaseException, float]:
        started = anyio.current_time()
        with anyio.fail_after(20):
            try:
                async with connect(url, "0" * 64, client_id="outsider", **options):
                    pass
            except BaseException as exc:  # noqa: B036 - the test inspects exactly what comes out
                return exc, anyio.current_time() - started
        raise AssertionError("connect() succeeded")

    return anyio.run(attempt, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_url_nobody_listens_on_fails_at_once_unless_asked_to_wait(backend: str) -> None:
    """client.py, ``connect``: "Fails at once, with a :class:`ConnectionLost` subclass [...] when no host runs on it
    (:class:`HostNotRunning`; ``wait_for_host=True`` waits for one instead, up to ``connect_timeout``)"; the
    TypeScript README says the same of its client ("`HostNotRunning` (nobody answered the first connection;
    `waitForHost: true` keeps trying until `connectTimeoutMs`)"). A wrong port given as a url waited the whole
    ``connect_timeout`` (30 s by default) and then said only "All connection attempts failed"."""
    port = free_port()
    exc, took = _connect_raises(backend, f"ws://127.0.0.1:{port}/", connect_timeout=15)
    assert isinstance(exc, HostNotRunning) and isinstance(exc, ConnectionLost), repr(exc)
    assert f"127.0.0.1:{port}" in str(exc) and "refused" in str(exc).lower() and took < 5, (str(exc), took)
    said: list[str] = []
    waited, took = _connect_raises(backend, f"ws://127.0.0.1:{port}/", connect_timeout=1, wait_for_host=True,
                                   on_state=said.append)
    assert type(waited) is ConnectionLost and "could not connect within 1" in str(waited), repr(waited)
    assert "refused" in str(waited).lower() and said and "refused" in said[0].lower(), (str(waited), said)


OVERSIZED = 65 << 20
"""A text frame past the client's 64 MiB message limit."""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("reply", "after_upgrade", "expect"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "", 200),
    (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\nno way", "", 403),
    (b"SSH-2.0-OpenSSH_9.2\r\n", "", "not-http"),
    (None, "", "no-hello"),
    (None, "garbage-frames", "no-hello"),
    (None, "oversized-frame", "1009"),
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nfull", "", "busy"),
], ids=["http", "http-403", "garbage", "silent-websocket", "garbage-frames", "oversized-frame", "http-503"])
def test_a_server_that_is_not_a_host_is_a_typed_error_at_once(
        backend: str, reply: bytes | None, after_upgrade: str, expect: int | str) -> None:
    """client.py, ``connect``: it "Fails at once, with a :class:`ConnectionLost` subclass (never an exception
    group), on the first failure retrying cannot fix, the rule the TypeScript client follows": a handshake
    answered with an HTTP status other than 101 and 503, or not in HTTP, is :class:`HostRefused`
    (``HANDSHAKE_REFUSED``) even with ``wait_for_host``; a WebSocket that never answers ``host.hello`` (or sends
    frames that are no answer, or one past the client's 64 MiB limit: ``_ws.connect_websocket`` reads no further)
    is :class:`HostNotRunning` after that one attempt; a busy host (503) is retried up to ``connect_timeout``. The
    client retried every one of them for the whole ``connect_timeout`` (30 s by default) where the TypeScript one
    stopped at once."""
    frames = {  # made for its own case only: the oversized frame (65 MiB) takes ~0.3 s of CPU to make
        "": lambda: b"",
        "garbage-frames": lambda: b"\x81\x04[1,2" + b"\x81\x03{}}" + b"\x81\x02{}",  # text frames, no answer
        "oversized-frame": lambda: b"\x81\x7f" + OVERSIZED.to_bytes(8, "big") + b"a" * OVERSIZED,
    }[after_upgrade]()
    server = FakeServer(reply, frames)
    url = f"ws://127.0.0.1:{server.port}/"
    try:
        if isinstance(expect, int) or expect == "not-http":
            exc, took = _connect_raises(backend, url, connect_timeout=15, wait_for_host=True)
            assert isinstance(exc, HostRefused) and exc.code == "HANDSHAKE_REFUSED", repr(exc)
            assert exc.status == (expect if isinstance(expect, int) else None), repr(exc)
            assert ("not HTTP" if expect == "not-http" else f"HTTP {expect}") in str(exc), str(exc)
        elif expect == "busy":
            exc, took = _connect_raises(backend, url, connect_timeout=2)
            assert type(exc) is ConnectionLost and "could not connect within 2" in str(exc), repr(exc)
            assert "code=503" in str(exc) and len(server.conns) >= 2, (str(exc), len(server.conns))
        else:
            # reading up to the 64 MiB limit can take seconds on a loaded machine: the oversized frame's hello
            # bound leaves room for it (its check is the 1009 close, not the timeout)
            exc, took = _connect_raises(backend, url, connect_timeout=15, hello_timeout=8 if expect == "1009" else 0.5)
            assert isinstance(exc, HostNotRunning) and len(server.conns) == 1, (repr(exc), len(server.conns))
            if expect == "1009":  # closed at the limit (1009), not read on to the end
                assert "code=1009" in str(exc), str(exc)
            else:
                assert "no answer to host.hello within 0.5 s" in str(exc), str(exc)
    finally:
        server.close()
    assert took < 10, (str(exc), took)


# -- large sessions and error codes ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_session_larger_than_a_reply_is_read_page_by_page(host: Host, backend: str) -> None:
    """protocol/README.md section 6: "A read of the **whole** transcript (`full: true` [...]) that is over the
    budget is `PAYLOAD_TOO_LARGE` with `data.paging` [...]: stream it instead with `messageEnd: 0, maxBytes: N`,
    then `messageEnd: <previous messageEnd>` until `hasMoreAfter` is false", and section 3: "`error.data.code`
    is a **stable string**". Four 5 MiB messages (20 MiB, over the 16 MiB budget): the whole read is a typed
    RpcError with that code and its paging hint; paging with a 6 MiB budget reads every message once, in
    order; a default window is cut to what fits. Unknown ids and bad params answer their codes."""
    size = 5 << 20

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="pager") as c:
            sid = (await c.session.create(title="Big"))["id"]
            for i in range(4):
                await c.session.append_message(session_id=sid, message=text_message(f"b{i}", chr(97 + i) * size))
            with pytest.raises(RpcError) as whole:
                await c.session.get(session_id=sid, full=True)
            assert whole.value.data_code == "PAYLOAD_TOO_LARGE" and not whole.value.retriable
            assert {"messageEnd", "maxBytes"} <= set(whole.value.data["paging"])
            seen: list[str] = []
            end = 0
            while True:
                page = valid("session.get", await c.session.get(session_id=sid, message_end=end,
                                                                max_bytes=6 << 20))
                assert len(page["messages"]) == 1  # 6 MiB holds one 5 MiB line, not two
                for m in page["messages"]:
                    seen.append(m["id"])
                    assert m["blocks"][0]["text"] == m["blocks"][0]["text"][0] * size
                end = page["messageEnd"]
                if not page["hasMoreAfter"]:
                    break
            assert seen == ["b0", "b1", "b2", "b3"]
            # "`maxBytes` [...] bounds the transcript lines it is built from": a default window of the newest four
            # (16 MiB of lines) is cut to the newest whole messages that fit, and says there is more before
            newest = valid("session.get", await c.session.get(session_id=sid, message_limit=4, content_limit=10))
            assert [m["id"] for m in newest["messages"]] == seen[1:] and newest["hasMoreBefore"] is True
            assert all(m["truncated"] for m in newest["messages"])
            with pytest.raises(RpcError) as unknown:
                await c.session.get(session_id="no-such-session")
            assert unknown.value.data_code == "SESSION_NOT_FOUND" and not unknown.value.retriable
            with pytest.raises(RpcError) as around:
                await c.session.get(session_id=sid, message_around="no-such-message")
            assert around.value.data_code == "MESSAGE_NOT_FOUND"
            with pytest.raises(RpcError) as bad:
                await c.session.append_message(session_id=sid, message={"id": "x", "role": "user", "blocks": [
                    {"type": "text"}]})
            assert bad.value.data_code == "INVALID_PARAMS" and bad.value.code == -32602
            assert any(e["loc"].startswith("message.blocks.0") for e in bad.value.field_errors), bad.value.describe()
        await host.terminate()

    run(backend, body)


# -- host.hello unanswered on a reconnect; app callbacks that raise ---------------------------------------------
def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reconnect_to_a_server_that_never_answers_hello_gives_up_and_tries_again(host: Host, backend: str) -> None:
    """client.py, ``connect``: "Every connection attempt, the first and each reconnect, waits at most
    ``hello_timeout`` seconds (default 10) for the answer to ``host.hello`` once the WebSocket is open; then it
    closes that socket and tries again after its backoff" (clients/typescript: ``helloTimeoutMs``, "Bound on
    `host.hello` once the socket is open"). The connection drops and the reconnect reaches a server that takes
    the WebSocket and says nothing; the host is reachable again right after. The reconnect waited in
    ``host.hello`` for ever: the next call waited ``reconnect_timeout`` and raised HostUnavailable, and so would
    every later one, with the host up all along."""
    silent = FakeServer(None)

    async def body() -> None:
        await host.start()
        host_port = _port(host.current.url)
        relay = Relay(host_port)
        said: list[str] = []
        try:
            async with connect(f"ws://127.0.0.1:{relay.port}/", host.current.token, client_id="hello-timeout",
                               backoff=0.05, max_backoff=0.25, hello_timeout=1, reconnect_timeout=20,
                               on_state=said.append) as c:
                sid = (await c.session.create(title="Hello timeout"))["id"]
                boot = c.hello["bootId"]
                relay.target_port = silent.port
                relay.down()
                relay.up()
                # the reconnect has reached the silent server (where it sends hello)
                assert await anyio.to_thread.run_sync(silent.accepted.wait, 20)
                relay.target_port = host_port
                with anyio.fail_after(30):
                    renamed = valid("session.rename", await c.session.rename(session_id=sid, title="Back"))
                assert renamed["title"] == "Back"
                assert c.connects == 2 and c.hello["bootId"] == boot
                assert any("no answer to host.hello within 1 s" in line for line in said), said
        finally:
            relay.down()
            silent.close()
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_first_connection_to_a_server_that_never_answers_hello_says_so(backend: str) -> None:
    """client.py, ``connect``: ``hello_timeout`` bounds each attempt, "the first connection stays bounded by
    ``connect_timeout`` as a whole". Against a silent WebSocket the attempts (``wait_for_host``: a failure that
    is not a refusal is retried) give up on hello and retry, and the error names why (it said "could not connect
    within 3 s (None)")."""
    server = FakeServer(None)
    try:
        exc, _ = _connect_raises(backend, f"ws://127.0.0.1:{server.port}/", connect_timeout=3, hello_timeout=0.5,
                                 wait_for_host=True)
    finally:
        server.close()
    assert type(exc) is ConnectionLost and "could not connect within 3" in str(exc), repr(exc)
    assert "no answer to host.hello within 0.5 s" in str(exc), str(exc)
    assert len(server.conns) >= 2  # it tried again


@pytest.mark.parametrize("backend", BACKENDS)
def test_callbacks_that_raise_are_reported_and_the_client_carries_on(host: Host, backend: str) -> None:
    """client.py: "what ``on_state`` or ``on_connect`` raises (an :class:`Exception`) is passed to
    ``on_callback_error(error, name)`` [...] and never ends the connection or the client" (the TypeScript
    client's ``onCallbackError``: "Such an exception never ends the connection or the client"). An ``on_state``
    that raises every time, and an ``on_connect`` that raises: the client connects, reconnects after a SIGKILL
    and restart, resubscribes (a Resync) and answers calls. What ``on_state`` raised came out of
    ``async with connect()`` and ended the client at its first line ("connected")."""
    reported: list[tuple[str, Exception]] = []

    def on_state(line: str) -> None:
        raise RuntimeError(f"on_state bug: {line}")

    def on_connect(hello: dict[str, Any]) -> None:
        raise ValueError("on_connect bug")

    async def body() -> None:
        await host.start()
        async with fast(host.data_dir, "raising-callbacks", reconnect_timeout=20, on_state=on_state,
                        on_callback_error=lambda exc, name: reported.append((name, exc))) as c:
            c.on_connect = on_connect
            sid = (await c.session.create(title="Raising callbacks"))["id"]
            async with c.subscribe(["session.message"], session_id=sid) as events:
                await host.kill()
                await host.start()
                with anyio.fail_after(30):
                    await c.session.append_message(session_id=sid, message=text_message("m1", "after"))
                    items = await next_items(events, 2)
            assert isinstance(items[0], Resync) and message_event(items[1]) == "m1", items
            assert c.connects == 2
        names = [name for name, _ in reported]
        assert names[0] == "on_state" and str(reported[0][1]) == "on_state bug: connected", reported
        assert ("on_connect", "on_connect bug") in [(n, str(e)) for n, e in reported], reported
        assert any(n == "on_state" and "reconnected" in str(e) for n, e in reported), reported
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_callback_error_is_logged_by_default(host: Host, backend: str, caplog: pytest.LogCaptureFixture) -> None:
    """client.py, ``connect``: what the callbacks raise goes to ``on_callback_error`` "(default: logged at error
    level, with the traceback, on the ``pihost_client`` logger), and the client carries on"."""

    def on_state(line: str) -> None:
        raise RuntimeError(f"on_state bug: {line}")

    async def body() -> None:
        await host.start()
        with caplog.at_level(logging.ERROR, logger="pihost_client"):
            async with connect(data_dir=host.data_dir, client_id="logged-callback", on_state=on_state) as c:
                assert (await c.session.create(title="Logged"))["title"] == "Logged"
        await host.terminate()

    run(backend, body)
    records = [r for r in caplog.records if r.name == "pihost_client"]
    assert records and records[0].levelno == logging.ERROR and "on_state" in records[0].getMessage(), records
    exc_info = records[0].exc_info
    assert exc_info is not None and str(exc_info[1]) == "on_state bug: connected"


class _NotAnError(BaseException):
    """Stands for what must never be reported and carried past: trio.Cancelled, KeyboardInterrupt, SystemExit."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_callback_raising_a_base_exception_is_not_swallowed(host: Host, backend: str) -> None:
    """client.py: "cancellation, :class:`KeyboardInterrupt` and :class:`SystemExit` go on out as raised": only an
    :class:`Exception` is reported. (A guard for the reporting itself: this held before it existed.)"""
    reported: list[str] = []

    def on_state(line: str) -> None:
        raise _NotAnError(line)

    async def body() -> None:
        await host.start()
        raised: BaseException | None = None
        try:
            async with connect(data_dir=host.data_dir, client_id="base-exception", on_state=on_state,
                               on_callback_error=lambda exc, name: reported.append(name)):
                pass
        except BaseException as exc:  # noqa: B036 - the test inspects exactly what comes out
            raised = exc
        finally:
            await host.terminate()
        # it comes out bare, or in a group with the ConnectionLost of the first connection it ended
        if isinstance(raised, BaseExceptionGroup):
            raised = raised.split(_NotAnError)[0]
        assert raised is not None and (isinstance(raised, _NotAnError) or raised.exceptions), repr(raised)
        assert reported == []

    run(backend, body)
