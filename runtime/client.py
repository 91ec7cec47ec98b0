"""A small typed async client for the host's WebSocket JSON-RPC gateway.

::

    info = read_host_info(data_dir)
    async with open_client(info.url, info.token, client_id="cli-1") as client:
        sessions = await client.call("sessions.list", {})
        await client.subscribe(["session.*"])
        async for event in client:
            ...

One reader task routes responses to their callers and events to a bounded queue.
If events are not consumed, the queue fills, the reader waits, and the host
eventually closes the connection (1013/1008); resubscribe with the last cursor.
"""

from __future__ import annotations

import itertools
import json
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection, wrap_client_stream

from protocol.jsonrpc import loads_large
from protocol.unsendable import describe, holds_other, unsendable
from store.rules import MAX_JSON_DEPTH

__all__ = [
    "ClientClosed",
    "ClientEvent",
    "HostClient",
    "HostInfo",
    "HostInfoError",
    "RpcError",
    "open_client",
    "read_host_info",
]

PROTOCOL_VERSION = 1


class RpcError(Exception):
    """The host answered with a JSON-RPC error."""

    def __init__(self, code: int, data_code: str, message: str, data: dict[str, Any]) -> None:
        super().__init__(f"{data_code} ({code}): {message}")
        self.code = code
        self.data_code = data_code
        self.message = message
        self.data = data

    @property
    def retriable(self) -> bool:
        return bool(self.data.get("retriable", False))

    @classmethod
    def from_wire(cls, err: Any) -> RpcError:
        if not isinstance(err, dict):
            return cls(-32603, "INTERNAL", "malformed error object", {})
        raw_data = err.get("data")
        data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
        code = err.get("code")
        return cls(
            code if isinstance(code, int) else -32603,
            str(data.get("code", "UNKNOWN")),
            str(err.get("message", "")),
            data,
        )


class ClientClosed(Exception):
    """The connection is closed (by us, the host, or the network)."""

    def __init__(self, code: int | None, reason: str | None) -> None:
        super().__init__(f"connection closed (code={code}, reason={reason!r})")
        self.code = code
        self.reason = reason


class HostInfoError(OSError):
    """``host.json`` or the token file is missing or unreadable."""


@dataclass(frozen=True, slots=True)
class HostInfo:
    url: str
    token: str
    pid: int

    def __repr__(self) -> str:  # never print the token
        return f"HostInfo(url={self.url!r}, pid={self.pid})"


@dataclass(frozen=True, slots=True)
class ClientEvent:
    topic: str
    cursor: int
    subscription_id: str
    data: Any
    session_id: str | None = None
    transient: bool = False
    """A live preview (``session.inflight``): coalesced, throttled, not numbered."""


def read_host_info(data_dir: str | Path) -> HostInfo:
    """Read ``<dataDir>/host.json`` and the token file it names (blocking file I/O)."""
    root = Path(data_dir)
    try:
        info = json.loads((root / "host.json").read_text("utf-8"))
        token_file = Path(info["tokenFile"])
        if not token_file.is_absolute():
            token_file = root / token_file
        token = token_file.read_text("utf-8").strip()
        url, pid = info["url"], info["pid"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HostInfoError(f"cannot read host info in {root}: {exc}") from None
    if not isinstance(url, str) or not isinstance(pid, int) or not token:
        raise HostInfoError(f"host info in {root} is malformed")
    return HostInfo(url=url, token=token, pid=pid)


class _Slot:
    """Caller-owned one-shot reply slot."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._response: dict[str, Any] | None = None
        self._closed: ClientClosed | None = None

    def set(self, response: dict[str, Any]) -> None:
        if not self._done.is_set():
            self._response = response
            self._done.set()

    def fail(self, exc: ClientClosed) -> None:
        if not self._done.is_set():
            self._closed = exc
            self._done.set()

    async def wait(self) -> dict[str, Any]:
        await self._done.wait()
        if self._response is None:
            assert self._closed is not None
            raise self._closed
        return self._response


def _encode(payload: Any) -> str:
    """A request (or a batch of them) as the text of one frame, or an :class:`RpcError` and nothing sent: params
    that hold what JSON cannot carry are refused as ``pihost_client`` refuses them (``INVALID_PARAMS``, ``data.sent``
    false, ``data.errors`` saying where; the check both share, :mod:`protocol.unsendable`), nesting past what orjson
    writes as ``PARSE_ERROR``. orjson writes NaN and ±Infinity as ``null``, a ``datetime``, ``date`` or ``time`` as
    an ISO string, a ``UUID`` as its text, a dataclass as an object and an ``Enum`` as its value, all without a word,
    so a frame whose params hold anything but plain values is looked into (quickly, :func:`holds_other`; then
    where). A lone surrogate (no UTF-8 frame carries it) fails orjson and is named with its path. What orjson has no
    form for but JSON has (an integer key, an integer past 64 bits) is written by the standard encoder: this
    client sends an integer the host refuses, so tests see the host's answer."""
    try:
        frame = orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:
        if "Recursion limit" in str(exc):
            # orjson writes 254 levels at most: deeper never leaves (the host refuses past MAX_JSON_DEPTH anyway;
            # this client sends up to 254 so tests can see the host's own answer)
            raise RpcError(-32700, "PARSE_ERROR",
                           f"the request nests deeper than this client's encoder writes (254 levels; the host refuses "
                           f"more than {MAX_JSON_DEPTH} containers, the request object being level 1); nothing was "
                           "sent", {"code": "PARSE_ERROR", "retriable": False, "maxDepth": MAX_JSON_DEPTH,
                                    "sent": False}) from None
        _refuse_unsendable(payload)
        try:
            text = json.dumps(payload, ensure_ascii=False, allow_nan=False)
            text.encode("utf-8")  # a lone surrogate outside params (a method name): no UTF-8 frame carries it
            return text
        except (ValueError, TypeError) as stdlib_exc:  # found nothing to name: say what the encoders said
            raise RpcError(-32602, "INVALID_PARAMS", f"the request holds a value the encoder refused ({exc}; "
                           f"{stdlib_exc}), which JSON cannot carry; nothing was sent",
                           {"code": "INVALID_PARAMS", "retriable": False, "sent": False}) from None
    if holds_other([payload]):
        _refuse_unsendable(payload)
    return frame.decode("utf-8")


def _refuse_unsendable(payload: Any) -> None:
    """The ``INVALID_PARAMS`` refusal of the first request in ``payload`` (one, or a batch) whose params hold
    what JSON cannot carry; nothing when none does. Integers past 64 bits are let through (see :func:`_encode`)."""
    for request in payload if isinstance(payload, list) else [payload]:
        if isinstance(request, dict) and "params" in request:
            found = unsendable(request["params"], wide_ints=True)
            if found is not None:
                message, data = describe(str(request.get("method")), *found)
                raise RpcError(-32602, "INVALID_PARAMS", message, data)


def _unwrap(response: dict[str, Any]) -> Any:
    if "error" in response:
        raise RpcError.from_wire(response["error"])
    return response.get("result")


class HostClient:
    """Use :func:`open_client` to get one."""

    def __init__(self, ws: WebSocketConnection, event_queue: int) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._events_send, self._events_recv = trio.open_memory_channel[ClientEvent](event_queue)
        self._closed: ClientClosed | None = None
        self.hello: dict[str, Any] = {}

    # -- requests --------------------------------------------------------------
    def _request(self, method: str, params: Any, request_id: int | None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if request_id is not None:
            message["id"] = request_id
        return message

    async def _send(self, payload: Any) -> None:
        if self._closed is not None:
            raise self._closed
        frame = _encode(payload)
        try:
            await self._ws.send_message(frame)
        except ConnectionClosed as exc:
            raise self._close_error(exc) from None

    async def call(self, method: str, params: Any = None) -> Any:
        """Send one request and return its result; raises :class:`RpcError`."""
        request_id = next(self._ids)
        slot = self._pending[request_id] = _Slot()
        try:
            await self._send(self._request(method, params, request_id))
            return _unwrap(await slot.wait())
        finally:
            self._pending.pop(request_id, None)

    async def batch(self, calls: Sequence[tuple[str, Any]]) -> list[Any]:
        """Send a batch; returns results in order, an :class:`RpcError` in place of each failure."""
        return await self._many(calls, one_frame=True)

    async def pipelined(self, calls: Sequence[tuple[str, Any]]) -> list[Any]:
        """Send each call as its own frame, back to back, before reading any answer.

        Returns results in order, an :class:`RpcError` in place of each failure.
        The host runs a connection's requests in the order its frames arrive.
        """
        return await self._many(calls, one_frame=False)

    async def _many(self, calls: Sequence[tuple[str, Any]], *, one_frame: bool) -> list[Any]:
        ids = [next(self._ids) for _ in calls]
        slots = [_Slot() for _ in calls]
        self._pending.update(zip(ids, slots, strict=True))
        try:
            requests = [self._request(m, p, i) for (m, p), i in zip(calls, ids, strict=True)]
            if one_frame:
                await self._send(requests)
            else:
                for request in requests:
                    await self._send(request)
            results: list[Any] = []
            for slot in slots:
                try:
                    results.append(_unwrap(await slot.wait()))
                except RpcError as exc:
                    results.append(exc)
            return results
        finally:
            for request_id in ids:
                self._pending.pop(request_id, None)

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no response)."""
        await self._send(self._request(method, params, None))

    async def send_raw(self, frame: str | bytes) -> None:
        """Send a raw frame (diagnostics and tests)."""
        if self._closed is not None:
            raise self._closed
        try:
            await self._ws.send_message(frame)
        except ConnectionClosed as exc:
            raise self._close_error(exc) from None

    # -- events ----------------------------------------------------------------
    async def subscribe(
        self, topics: Sequence[str], *, session_id: str | None = None, cursor: int | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"topics": list(topics)}
        if session_id is not None:
            params["sessionId"] = session_id
        if cursor is not None:
            params["cursor"] = cursor
        result: dict[str, Any] = await self.call("events.subscribe", params)
        return result

    async def next_event(self) -> ClientEvent:
        try:
            return await self._events_recv.receive()
        except trio.EndOfChannel:
            raise self._closed or ClientClosed(None, None) from None

    def __aiter__(self) -> HostClient:
        return self

    async def __anext__(self) -> ClientEvent:
        try:
            return await self.next_event()
        except ClientClosed:
            raise StopAsyncIteration from None

    @property
    def closed(self) -> ClientClosed | None:
        return self._closed

    # -- reader ----------------------------------------------------------------
    def _close_error(self, exc: ConnectionClosed) -> ClientClosed:
        if self._closed is None:
            reason = exc.reason
            self._closed = ClientClosed(reason.code if reason else None, reason.reason if reason else None)
        return self._closed

    async def _route(self, message: Any) -> None:
        if isinstance(message, list):
            for item in message:
                await self._route(item)
            return
        if not isinstance(message, dict):
            return
        if message.get("method") == "event" and "id" not in message:
            params = message.get("params") or {}
            await self._events_send.send(
                ClientEvent(
                    topic=params.get("topic", ""),
                    cursor=params.get("cursor", 0),
                    subscription_id=str(params.get("subscriptionId", "")),
                    data=params.get("data"),
                    session_id=params.get("sessionId"),
                    transient=params.get("transient") is True,
                )
            )
            return
        request_id = message.get("id")
        slot = self._pending.get(request_id) if isinstance(request_id, int) else None
        if slot is not None:
            slot.set(message)

    async def _reader(self) -> None:
        async with self._events_send:
            try:
                while True:
                    frame = await self._ws.get_message()
                    try:
                        message = loads_large(frame)
                    except orjson.JSONDecodeError:
                        continue
                    await self._route(message)
            except ConnectionClosed as exc:
                closed = self._close_error(exc)
                for slot in list(self._pending.values()):
                    slot.fail(closed)


_CONNECT_TIMEOUT = 60.0
_RECEIVE_BUFFER = 64 * 1024  # bytes per socket read (trio-websocket's default of 4 KiB: 3,000 reads per 12 MB reply)
_CLOSE_TIMEOUT = 5.0


@asynccontextmanager
async def open_client(
    url: str,
    token: str,
    *,
    client_id: str,
    client_kind: str = "cli",
    plugin_id: str | None = None,
    origin: str | None = None,
    event_queue: int = 1024,
    max_message_size: int = 64 * 1024 * 1024,
) -> AsyncIterator[HostClient]:
    """Connect, send ``host.hello`` and yield a :class:`HostClient` (``plugin_id`` with ``client_kind="plugin"``)."""
    headers = [(b"Origin", origin.encode("ascii"))] if origin is not None else None
    user_error: BaseException | None = None
    try:
        async with _websocket(url, headers, max_message_size) as ws:
            client = HostClient(ws, event_queue)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client._reader)
                try:
                    hello: dict[str, Any] = {"token": token, "clientId": client_id, "clientKind": client_kind,
                                             "protocol": PROTOCOL_VERSION}
                    if plugin_id is not None:
                        hello["pluginId"] = plugin_id
                    client.hello = await client.call("host.hello", hello)
                    yield client
                except BaseException as exc:  # re-raised below, outside the nursery (no group wrapping)
                    user_error = exc
                finally:
                    nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # the connection's reader task failed (a refused handshake): one error, not a group
        handshake = group.subgroup((HandshakeError, ConnectionClosed))
        if handshake is None or handshake.exceptions != group.exceptions or len(group.exceptions) != 1:
            raise
        cause = group.exceptions[0]
        raise ClientClosed(None, f"handshake failed: {cause!r}") from cause
    if user_error is not None:
        raise user_error


class _HandshakeWatch(trio.abc.Stream):
    """The TCP (or TLS) stream under a client WebSocket, passed through, that cancels ``scope`` when the
    host closes it (end of file, or a reset) before the handshake finished (``scope`` is then None)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self.scope: trio.CancelScope | None = None

    def _closed_by_peer(self) -> None:
        if self.scope is not None:
            self.scope.cancel()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._closed_by_peer()
            raise
        if not data:
            self._closed_by_peer()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()


@asynccontextmanager
async def _websocket(
    url: str, headers: list[tuple[bytes, bytes]] | None, max_message_size: int
) -> AsyncIterator[WebSocketConnection]:
    """A client WebSocket on a TCP stream this function owns and always closes.

    trio-websocket 0.12's ``open_websocket_url`` leaves its TCP stream open
    when the host goes away first or the connect is cancelled mid-handshake
    (a socket left to garbage collection); here the stream is opened first
    and closed on every way out.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    secure = parts.scheme == "wss"
    port = parts.port or (443 if secure else 80)
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.hostname if port in (80, 443) else f"{parts.hostname}:{port}"
    try:
        with trio.fail_after(_CONNECT_TIMEOUT):
            if secure:
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    parts.hostname, port, ssl_context=ssl.create_default_context(), https_compatible=True)
            else:
                stream = await trio.open_tcp_stream(parts.hostname, port)
    except trio.TooSlowError:  # an OSError, as every other way a connect fails
        raise TimeoutError(f"no connection to {url} within {_CONNECT_TIMEOUT:g} s") from None
    try:
        async with trio.open_nursery() as nursery:
            watched = _HandshakeWatch(stream)
            closed_early = watched.scope = trio.CancelScope()
            try:
                with trio.fail_after(_CONNECT_TIMEOUT), closed_early:
                    ws = await wrap_client_stream(nursery, watched, host_header, resource,  # type: ignore[arg-type]
                                                  extra_headers=headers, max_message_size=max_message_size,
                                                  receive_buffer_size=_RECEIVE_BUFFER)
            except trio.TooSlowError:  # a host that accepts but never answers (stopped, hung): not a traceback
                raise HandshakeError(f"the host accepted the connection but did not answer the WebSocket handshake "
                                     f"within {_CONNECT_TIMEOUT:g} s (is it stopped or hung?)") from None
            if closed_early.cancelled_caught:
                # trio-websocket 0.12 waits for a handshake reply that can no longer come (until the
                # connect timeout) when the host closes the connection first (it died, or is stopping)
                raise HandshakeError("the host closed the connection during the WebSocket handshake")
            watched.scope = None
            try:
                yield ws
            finally:
                with trio.move_on_after(_CLOSE_TIMEOUT):
                    await ws.aclose()  # the close handshake (skipped when cancelled)
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
