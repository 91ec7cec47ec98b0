"""A small WebSocket client on anyio streams and wsproto (runs under asyncio and trio).

Only what a JSON-RPC client needs: the opening handshake (with optional extra
headers such as ``Origin``), text messages in both directions (fragments
joined up to ``max_message_size``), automatic pongs, and the closing
handshake. One task reads (:meth:`WebSocket.receive`); sends are serialized
by a lock, so several tasks may call :meth:`WebSocket.send` at once.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

__all__ = ["HandshakeRefused", "WebSocket", "WebSocketClosed", "connect_websocket"]

_READ_CHUNK = 65536


class WebSocketClosed(Exception):
    """The connection is closed; ``code``/``reason`` from the close frame when there was one."""

    def __init__(self, code: int | None, reason: str | None) -> None:
        super().__init__(f"connection closed (code={code}, reason={reason!r})")
        self.code = code
        self.reason = reason


class HandshakeRefused(WebSocketClosed):
    """The server answered the opening handshake with something other than ``101``: an HTTP status (``code``;
    the body as ``reason``: 403 for an Origin or Host the host refuses, 503 while it stops or is full, 200 or
    404 from a web server that is no host), or ``code`` None when the answer was not HTTP at all."""


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    host_header: str
    resource: str


def _parse(url: str) -> _Target:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "ws" or not parts.hostname:
        raise ValueError(f"not a ws:// URL: {url!r}")
    port = parts.port or 80
    host_header = parts.hostname if port == 80 else f"{parts.hostname}:{port}"
    if ":" in parts.hostname:
        host_header = f"[{parts.hostname}]" + ("" if port == 80 else f":{port}")
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(parts.hostname, port, host_header, resource)


class WebSocket:
    """An open client WebSocket. Use :func:`connect_websocket`."""

    def __init__(self, stream: anyio.abc.ByteStream, ws: WSConnection, max_message_size: int,
                 leftover: list[TextMessage | BytesMessage | CloseConnection | Ping]) -> None:
        self._stream = stream
        self._ws = ws
        self._max = max_message_size
        self._send_lock = anyio.Lock()
        self._pending = leftover
        self._parts: list[str] = []
        self._size = 0
        self._closed: WebSocketClosed | None = None
        self._heard = 0
        self._heard_event = anyio.Event()

    @property
    def heard(self) -> int:
        """How many reads brought data from the peer so far (a keepalive's proof of life)."""
        return self._heard

    async def wait_heard(self, since: int) -> None:
        """Until the peer sent something after :attr:`heard` was ``since``, or the socket closed."""
        while self._heard <= since and self._closed is None:
            await self._heard_event.wait()

    async def ping(self) -> None:
        """Send a ping; the peer's pong (or any frame) shows in :attr:`heard`."""
        if self._closed is not None:
            raise self._closed
        await self._write(self._ws.send(Ping(payload=b"pihost-keepalive")))

    @property
    def closed(self) -> WebSocketClosed | None:
        return self._closed

    async def send(self, text: str) -> None:
        if self._closed is not None:
            raise self._closed
        await self._write(self._ws.send(TextMessage(data=text)))

    async def _write(self, data: bytes) -> None:
        async with self._send_lock:
            if self._closed is not None:  # e.g. a frame cut short while this one waited for the lock
                raise self._closed
            try:
                await self._stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise self._mark(1006, f"send failed: {exc!r}") from None
            except BaseException:
                # (A call cancelled before its frame started stops at the lock above, the connection untouched.)
                # Cancelled (or interrupted) while the frame was going out: under trio part of it may be on the
                # wire, and the peer would read whatever came next as the rest of it (a later call waited for a
                # keepalive to find the connection dead). Nothing more is sent on it: closed now, so its reader
                # ends and the client reconnects.
                self._mark(1006, "a send was cancelled before its frame was written whole")
                with anyio.CancelScope(shield=True):
                    await self._stream.aclose()
                raise

    def _mark(self, code: int | None, reason: str | None) -> WebSocketClosed:
        if self._closed is None:
            self._closed = WebSocketClosed(code, reason)
        return self._closed

    async def receive(self) -> str:
        """The next complete text message; raises :class:`WebSocketClosed` at the end."""
        while True:
            while self._pending:
                event = self._pending.pop(0)
                text = await self._handle(event)
                if text is not None:
                    return text
            if self._closed is not None:
                raise self._closed
            try:
                data = await self._stream.receive(_READ_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                raise self._mark(1006, "the connection was lost") from None
            self._heard += 1
            heard, self._heard_event = self._heard_event, anyio.Event()
            heard.set()
            self._ws.receive_data(data)
            self._pending.extend(self._ws.events())  # type: ignore[arg-type]

    async def _handle(self, event: object) -> str | None:
        if isinstance(event, TextMessage):
            self._parts.append(event.data)
            self._size += len(event.data)
            if self._size > self._max:
                await self.aclose(1009, "message too big")
                raise self._mark(1009, "message too big")
            if not event.message_finished:
                return None
            text = "".join(self._parts)
            self._parts, self._size = [], 0
            return text
        if isinstance(event, Ping):
            await self._write(self._ws.send(event.response()))
            return None
        if isinstance(event, CloseConnection):
            closed = self._mark(event.code, event.reason)
            if self._ws.state is ConnectionState.REMOTE_CLOSING:  # answer the peer's close
                try:
                    await self._write(self._ws.send(event.response()))
                except WebSocketClosed:
                    pass
            await self._stream.aclose()
            raise closed
        return None  # binary frames and pongs are not part of the protocol

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame (best effort) and close the TCP stream; idempotent."""
        if self._closed is None and self._ws.state is ConnectionState.OPEN:
            self._mark(code, reason)
            with anyio.move_on_after(2, shield=True):
                try:
                    async with self._send_lock:
                        await self._stream.send(self._ws.send(CloseConnection(code=code, reason=reason)))
                except Exception:  # the peer may be gone already; closing goes on
                    pass
        self._mark(code, reason)
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()


async def connect_websocket(url: str, *, headers: Sequence[tuple[str, str]] = (),
                            max_message_size: int = 64 * 1024 * 1024,
                            open_timeout: float = 30.0) -> WebSocket:
    """Open a TCP connection to ``url`` and complete the WebSocket handshake.

    A refused handshake raises :class:`HandshakeRefused` with the HTTP status as
    ``code`` and the response body as ``reason`` (``code`` None: the answer was
    not HTTP).
    """
    target = _parse(url)
    try:
        with anyio.fail_after(open_timeout):
            stream: anyio.abc.ByteStream = await anyio.connect_tcp(target.host, target.port)
    except OSError as exc:
        # anyio says "All connection attempts failed" and keeps the reason (ECONNREFUSED...) as the cause, which
        # asyncio spells "Connect call failed": say it the same way under both loops
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno:
            raise type(cause)(cause.errno, f"{os.strerror(cause.errno)} ({target.host}:{target.port})") from None
        raise
    try:
        ws = WSConnection(ConnectionType.CLIENT)
        extra = [(k.encode("ascii"), v.encode("ascii")) for k, v in headers]
        with anyio.fail_after(open_timeout):
            await stream.send(ws.send(Request(host=target.host_header, target=target.resource,
                                              extra_headers=extra)))
            status: int | None = None
            seen = False
            body: list[bytes] = []
            while True:
                try:
                    data = await stream.receive(_READ_CHUNK)
                except anyio.EndOfStream:
                    said = b"".join(body).decode("utf-8", "replace") or None
                    if status is not None:
                        raise HandshakeRefused(status, said) from None
                    raise WebSocketClosed(None, "the connection closed during the handshake") from None
                if not seen and not b"HTTP/".startswith(data[:5]):
                    # an SSH banner, a database's greeting...: not an HTTP server, so no host (and no reason
                    # to wait for more of it)
                    raise HandshakeRefused(None, f"the answer is not HTTP: {data[:40]!r}")
                seen = True
                ws.receive_data(data)
                events = list(ws.events())
                for index, event in enumerate(events):
                    if isinstance(event, AcceptConnection):
                        rest = [e for e in events[index + 1:]
                                if isinstance(e, (TextMessage, BytesMessage, CloseConnection, Ping))]
                        return WebSocket(stream, ws, max_message_size, rest)
                    if isinstance(event, RejectConnection):
                        status = event.status_code
                        if not event.has_body:
                            raise HandshakeRefused(status, None)
                    elif isinstance(event, RejectData):
                        body.append(event.data)
                        if event.body_finished:
                            raise HandshakeRefused(status, b"".join(body).decode("utf-8", "replace"))
    except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        # the peer reset the connection mid-handshake (a host killed as it started): a closed
        # connection the caller retries, not a crash of the caller
        with anyio.CancelScope(shield=True):
            await stream.aclose()
        raise WebSocketClosed(None, f"the connection broke during the handshake ({type(exc).__name__})") from exc
    except BaseException:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
        raise
