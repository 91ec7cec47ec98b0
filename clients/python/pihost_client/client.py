"""The pi-host client: typed methods, reconnect, resubscribe and receipt-backed retries.

::

    async with connect(data_dir="/tmp/pi-tour", client_id="my-app") as client:
        s = await client.session.create(title="Tour")
        async with client.subscribe(["session.message"], session_id=s["id"]) as events:
            await client.session.append_message(session_id=s["id"], message={...})
            async for event in events:
                ...

Runs under asyncio and trio (anyio). What it does for you:

* **Reconnect**: when the connection drops, a background task reconnects
  with backoff, re-reading ``host.json`` each time when it was given a
  ``data_dir`` (a restarted host may listen on another port).
* **Retries backed by receipts**: every mutating call carries a
  ``submissionId`` (generated when you pass none); when the connection is
  lost before the answer, or the host answers a retriable error
  (``TIMEOUT``, ``ACTOR_RESTARTED``, ``BUSY``, ``SHUTTING_DOWN``,
  ``STORAGE_FULL``), the same request is sent again with the same id, so the
  host applies it at most once and answers the retry from its receipt.
* **Bounded waits**: a call made while the client is disconnected (or whose
  connection dropped) waits at most ``reconnect_timeout`` seconds for the
  next connection, then raises :class:`HostUnavailable`; the client goes on
  reconnecting, so a later call works once the host is back. Each connection
  attempt waits at most ``hello_timeout`` seconds (10) for the answer to
  ``host.hello`` once the WebSocket is open: a server that takes the socket
  and never answers is left, and the client tries again after its backoff.
  A call already sent on an open connection ends with its answer, with that
  connection, or with its timeout (``timeout=`` on the call, else the
  client's ``call_timeout``; none by default, since a call may rightly take
  minutes, e.g. ``import.sessions``): :class:`CallTimeout` says whether the
  request was sent and so may have taken effect (then send it again with the
  same ``submission_id``: the host applies it at most once). A host that is
  gone or frozen with the connection left open is found by the keepalive (a
  WebSocket ping every ``keepalive_interval`` seconds, 20, unanswered within
  ``keepalive_timeout``, 20): the connection is closed and its calls are
  retried on the next one, waiting at most ``reconnect_timeout``; as in the
  TypeScript client (``timeoutMs``, ``callTimeoutMs``, ``keepaliveIntervalMs``).
  A caller can also cancel a call, e.g. ``with anyio.move_on_after(5): ...``
  (the TypeScript client's ``AbortSignal``); a mutating call cancelled after
  it was sent may have taken effect in the same way.
* **Callbacks that raise**: what ``on_state`` or ``on_connect`` raises (an
  :class:`Exception`) is passed to ``on_callback_error(error, name)``
  (default: logged with its traceback at error level on the
  ``pihost_client`` logger) and never ends the connection or the client;
  cancellation, :class:`KeyboardInterrupt` and :class:`SystemExit` go on
  out as raised.
* **Resubscribe**: each :class:`Subscription` is re-established on the new
  connection from the last cursor it delivered. If the host restarted (a new
  ``bootId``) or no longer holds that history (``CURSOR_EXPIRED``), the
  subscription yields a :class:`Resync` first: reload what you show, then
  go on with the events that follow.
* **Slow consumers never hold up calls**: each subscription buffers at most
  ``buffer`` items (1024). When its consumer falls that far behind, the
  client stops taking that subscription's events (answers to calls and the
  other subscriptions go on) and, once the consumer has read what is
  buffered, resubscribes from its cursor: the host replays what was missed,
  or the subscription yields a :class:`Resync` when it no longer holds it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._generated import MAX_JSON_DEPTH, MUTATING, PROTOCOL_VERSION, RETRIABLE_CODES, GeneratedMethods
from ._unsendable import describe, unsendable
from ._ws import HandshakeRefused, WebSocket, WebSocketClosed, connect_websocket
from .errors import CallTimeout, ConnectionLost, HostNotRunning, HostRefused, HostUnavailable
from .hostinfo import HostInfo, read_host_info

__all__ = ["CallTimeout", "Client", "ConnectionLost", "Event", "HostNotRunning", "HostRefused", "HostUnavailable",
           "Resync", "RpcError", "Subscription", "connect"]

_log = logging.getLogger("pihost_client")

REFUSED_HELLO_CODES = frozenset({"UNAUTHENTICATED", "UNSUPPORTED_PROTOCOL"})
"""``host.hello`` errors no retry can fix: the client stops at once with :class:`HostRefused`."""


class RpcError(Exception):
    """The host answered with a JSON-RPC error: ``data_code`` is the stable string to branch on."""

    def __init__(self, code: int, data_code: str, message: str, data: dict[str, Any]) -> None:
        super().__init__(f"{data_code}: {message}")
        self.code = code
        self.data_code = data_code
        self.message = message
        self.data = data

    @property
    def retriable(self) -> bool:
        """Whether the same request may succeed if sent again: what the host says (``data.retriable``, sent with
        every error, e.g. true for a ``PAYLOAD_TOO_LARGE`` batch entry that ran), else the code table
        (:data:`RETRIABLE_CODES`). The TypeScript client's ``RpcError.retriable`` reads it the same way."""
        said = self.data.get("retriable")
        return said if isinstance(said, bool) else self.data_code in RETRIABLE_CODES

    @property
    def field_errors(self) -> list[dict[str, Any]]:
        """``INVALID_PARAMS`` field details: ``[{loc, msg, type}, ...]``."""
        errors = self.data.get("errors")
        return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []

    def describe(self) -> str:
        """One line per problem: the code, the message and each field error."""
        lines = [f"{self.data_code}: {self.message}"]
        lines += [f"  {e.get('loc', '?')}: {e.get('msg', '')}" for e in self.field_errors]
        return "\n".join(lines)

    @classmethod
    def from_wire(cls, err: Any) -> RpcError:
        if not isinstance(err, dict):
            return cls(-32603, "INTERNAL", "malformed error object", {})
        raw = err.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        code = err.get("code")
        return cls(code if isinstance(code, int) else -32603, str(data.get("code", "UNKNOWN")),
                   str(err.get("message", "")), data)


@dataclass(frozen=True, slots=True)
class Event:
    """One ``event`` notification. ``data`` matches ``EVENT_PAYLOADS[topic]``."""

    topic: str
    cursor: int
    data: dict[str, Any]
    session_id: str | None = None
    transient: bool = False
    """A live preview (``session.inflight``): not numbered, its cursor repeats the newest numbered one."""


@dataclass(frozen=True, slots=True)
class Resync:
    """Events may have been missed (``reason``): reload state, then keep reading."""

    reason: str


@dataclass(frozen=True, slots=True)
class _Encoded:
    """A call's params as JSON text: encoded once per call, before it waits for a connection, and sent as is by
    every try."""

    text: str


@dataclass
class _Progress:
    """How far one call got: ``sent`` once a try began writing its request to a connection."""

    sent: bool = False


@dataclass
class _Slot:
    event: anyio.Event = field(default_factory=anyio.Event)
    response: dict[str, Any] | None = None
    on_result: Callable[[Any], None] | None = None


class _Connection:
    """One WebSocket: a reader task routes answers to slots and events to subscriptions."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self.routes: dict[str, Subscription] = {}
        self.done = anyio.Event()
        self.hello: dict[str, Any] = {}

    async def call(self, method: str, params: dict[str, Any] | _Encoded,
                   on_result: Callable[[Any], None] | None = None, progress: _Progress | None = None) -> Any:
        """Send one request and wait for its answer. ``params``: the client's own (a dict), or the caller's as
        :meth:`Client.call` encoded them once, before any try (:func:`_encode_params`)."""
        request_id = next(self._ids)
        slot = self._slots[request_id] = _Slot(on_result=on_result)
        try:
            if isinstance(params, _Encoded):
                frame = (f'{{"jsonrpc": "2.0", "id": {request_id}, "method": '
                         f'{json.dumps(method, ensure_ascii=False)}, "params": {params.text}}}')
            else:
                frame = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
                                   ensure_ascii=False, allow_nan=False)
            if progress is not None:
                progress.sent = True  # from the first byte on, the host may have it
            try:
                await self.ws.send(frame)
            except WebSocketClosed as exc:
                await self.abort()  # the reader ends now, so the client reconnects
                raise ConnectionLost(str(exc)) from None
            await slot.event.wait()
            response = slot.response
            if response is None:
                raise ConnectionLost(str(self.ws.closed or "connection closed"))
            if "error" in response:
                raise RpcError.from_wire(response["error"])
            return response.get("result")
        finally:
            self._slots.pop(request_id, None)

    @property
    def alive(self) -> bool:
        """Open for calls: its reader runs and no close was seen (a close frame marks the socket closed before
        the reader has finished with it)."""
        return not self.done.is_set() and self.ws.closed is None

    async def abort(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket under the reader, which then ends (``done``)."""
        with anyio.CancelScope(shield=True):
            await self.ws.aclose(code, reason)

    async def keepalive(self, interval: float, patience: float) -> None:
        """Ping every ``interval`` seconds. When nothing comes back within ``patience`` seconds of a ping (no pong,
        no frame at all), the host is gone or frozen with the connection left open: close it, so that the calls
        waiting on it fail over to the reconnect (and, being retried, wait at most ``reconnect_timeout``)."""
        while True:
            await anyio.sleep(interval)
            heard = self.ws.heard
            with anyio.move_on_after(patience):
                try:
                    await self.ws.ping()  # a send stuck behind a full socket buffer is silence too
                except WebSocketClosed:
                    return
                await self.ws.wait_heard(heard)
            if self.ws.closed is not None:
                return
            if self.ws.heard == heard:
                await self.abort(1011, f"no answer to a keepalive ping within {patience:g} s")
                return

    async def read(self) -> None:
        try:
            while True:
                try:
                    frame = await self.ws.receive()
                except WebSocketClosed:
                    return
                try:
                    message = json.loads(frame)
                except ValueError:
                    continue
                for item in message if isinstance(message, list) else [message]:
                    if isinstance(item, dict):
                        await self._route(item)
        finally:
            self.done.set()
            for slot in self._slots.values():
                slot.event.set()

    async def _route(self, item: dict[str, Any]) -> None:
        if item.get("method") == "event" and "id" not in item:
            params = item.get("params")
            if not isinstance(params, dict):
                return
            sub = self.routes.get(str(params.get("subscriptionId")))
            if sub is not None:
                data = params.get("data")
                sub._deliver(Event(str(params.get("topic", "")), int(params.get("cursor", 0)),
                                         data if isinstance(data, dict) else {}, params.get("sessionId"),
                                         params.get("transient") is True))
            return
        request_id = item.get("id")
        slot = self._slots.get(request_id) if isinstance(request_id, int) else None
        if slot is None:
            return
        slot.response = item
        if slot.on_result is not None and "result" in item:
            slot.on_result(item["result"])  # before the next frame is routed (subscription ids)
        slot.event.set()


class Subscription:
    """Events of some topics, across reconnects. Iterate it; it yields :class:`Event` and :class:`Resync`."""

    def __init__(self, client: Client, topics: Sequence[str], session_id: str | None, buffer: int) -> None:
        self._client = client
        self.topics = list(topics)
        self.session_id = session_id
        self.cursor: int | None = None
        self.boot_id: str | None = None
        self.wire_id: str | None = None
        params = self._params("")  # refused as a call's params are, before anything is sent or held
        _refuse_too_deep("events.subscribe", params)
        _encode_params("events.subscribe", params)
        self._send: MemoryObjectSendStream[Event | Resync]
        self._recv: MemoryObjectReceiveStream[Event | Resync]
        if buffer < 1:
            raise ValueError("a subscription buffers at least one item")
        self._send, self._recv = anyio.create_memory_object_stream[Event | Resync](buffer)
        self.closed = False
        self._overflowed = False
        """The buffer was full: events are dropped (the cursor stays at the last buffered one) until the consumer
        has read the buffer and :meth:`_resume` resubscribes from the cursor."""
        self._pending_resync: str | None = None

    def _deliver(self, item: Event | Resync) -> None:
        """Buffer ``item`` without waiting: the connection's reader calls this, and a consumer that does not
        read must not hold up the answers to calls (or the other subscriptions) behind its events."""
        if self.closed:
            return
        if isinstance(item, Resync):
            if self._overflowed:
                self._pending_resync = item.reason
                return
        elif item.transient:
            if not self._overflowed:
                try:
                    self._send.send_nowait(item)
                except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # a live preview is not replayed: the next one, or the final message, supersedes it
            return
        elif self._overflowed or (self.cursor is not None and item.cursor <= self.cursor):
            return  # dropped after an overflow (replayed by the resume), or delivered before a reconnect
        try:
            self._send.send_nowait(item)
        except anyio.WouldBlock:
            self._overflowed = True
            if isinstance(item, Resync):
                self._pending_resync = item.reason
            return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return
        if isinstance(item, Event):
            self.cursor = item.cursor

    async def _resume(self) -> Resync | None:
        """After an overflow, once the buffer is read: resubscribe from the cursor on the live connection (the
        host replays the missed events; a Resync when it no longer holds them). A Resync that did not fit is
        returned, to be yielded first."""
        self._overflowed = False
        pending, self._pending_resync = self._pending_resync, None
        conn = self._client._conn
        if conn is not None and conn.alive:  # else the reconnect resubscribes from the cursor
            old = self.wire_id
            if old is not None:
                conn.routes.pop(old, None)  # its events from here on would come after a gap
            try:
                if old is not None:
                    try:
                        await conn.call("events.unsubscribe", {"subscriptionId": old})
                    except RpcError:
                        pass
                await self._attach(conn)
            except ConnectionLost:
                pass  # the reconnect resubscribes from the cursor
        return Resync(pending) if pending is not None else None

    async def _next(self) -> Event | Resync:
        if self._overflowed and self._recv.statistics().current_buffer_used == 0:
            resync = await self._resume()
            if resync is not None:
                return resync
        return await self._recv.receive()

    def _params(self, boot_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {"topics": self.topics}
        if self.session_id is not None:
            params["sessionId"] = self.session_id
        if self.cursor is not None and boot_id == self.boot_id:
            params["cursor"] = self.cursor
        return params

    async def _attach(self, conn: _Connection) -> int | None:
        """(Re)subscribe on ``conn``; the cursor it resumed after, or None when it started afresh (a Resync)."""
        boot_id = str(conn.hello.get("bootId", ""))
        resumed = self.boot_id is not None
        params = self._params(boot_id)
        if resumed and "cursor" not in params:
            self._deliver(Resync("the host restarted" if self.boot_id != boot_id else "resubscribed"))
            self.cursor = None

        def bind(result: Any) -> None:
            self.wire_id = str(result["subscriptionId"])
            conn.routes[self.wire_id] = self
            if self.cursor is None:
                self.cursor = int(result.get("cursor", 0))

        try:
            await conn.call("events.subscribe", params, on_result=bind)
        except RpcError as exc:
            if exc.data_code != "CURSOR_EXPIRED":
                raise
            self._deliver(Resync("the host no longer holds the missed events"))
            self.cursor = None
            params.pop("cursor", None)
            await conn.call("events.subscribe", params, on_result=bind)
        self.boot_id = boot_id
        resumed_at: int | None = params.get("cursor")
        return resumed_at

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event | Resync:
        try:
            return await self._next()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def next(self) -> Event | Resync:
        return await self._next()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._client._subscriptions.discard(self)
        conn = self._client._conn
        if conn is not None and self.wire_id is not None and not conn.done.is_set():
            conn.routes.pop(self.wire_id, None)
            try:
                await conn.call("events.unsubscribe", {"subscriptionId": self.wire_id})
            except (RpcError, ConnectionLost):
                pass
        self._send.close()
        self._recv.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()


class Client(GeneratedMethods):
    """A connection to pi-host that heals itself. Use :func:`connect`."""

    def __init__(self, endpoint: Callable[[], HostInfo], *, client_id: str, client_kind: str,
                 origin: str | None, reconnect: bool, max_attempts: int, backoff: float,
                 max_backoff: float, reconnect_timeout: float = 30.0, hello_timeout: float = 10.0,
                 call_timeout: float | None = None, keepalive_interval: float | None = 20.0,
                 keepalive_timeout: float = 20.0) -> None:
        super().__init__(self._call)
        self._endpoint = endpoint
        self.client_id = client_id
        self.client_kind = client_kind
        self._origin = origin
        self._reconnect = reconnect
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._reconnect_timeout = reconnect_timeout
        self._hello_timeout = hello_timeout
        self._call_timeout = _bound("call_timeout", call_timeout)
        self._keepalive = None if keepalive_interval is None or math.isinf(keepalive_interval) else (
            _positive("keepalive_interval", keepalive_interval), _positive("keepalive_timeout", keepalive_timeout))
        self._conn: _Connection | None = None
        self._ready = anyio.Event()
        self._closing = False
        self._subscriptions: set[Subscription] = set()
        self.connects = 0
        self.last_error: BaseException | None = None
        self.fatal: ConnectionLost | None = None
        """Why the client stopped for good (:class:`HostRefused`, :class:`HostNotRunning`), once it has."""
        self.on_connect: Callable[[dict[str, Any]], None] | None = None
        self.on_state: Callable[[str], None] | None = None
        """Called with one line when the connection state changes ("waiting for a host: ...",
        "reconnected; resumed at cursor 1046")."""
        self.on_callback_error: Callable[[Exception, str], None] | None = None
        """Called with what ``on_state`` or ``on_connect`` raised and that callback's name (None: log it)."""
        self._last_state = ""
        # the url of a host that closed our connection saying it was going away (1001: it stops), while its
        # host.json may still name it: refused attempts to it are its shutdown, not news (nothing is said)
        self._leaving: str | None = None
        self._wait_for_host = False

    @property
    def hello(self) -> dict[str, Any]:
        return self._conn.hello if self._conn is not None else {}

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.alive

    # -- the connection loop ---------------------------------------------------
    def _wake(self) -> None:
        """Wake every task waiting for a connection (they re-check the state)."""
        self._ready.set()

    def _rearm(self) -> None:
        if self._ready.is_set():  # never replace an event somebody waits on unset
            self._ready = anyio.Event()

    async def _serve(self, ws: WebSocket, token: str) -> None:
        conn = _Connection(ws)
        error: BaseException | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.read)
            if self._keepalive is not None:
                tg.start_soon(conn.keepalive, *self._keepalive)
            try:
                with anyio.move_on_after(self._hello_timeout) as hello_wait:
                    try:
                        conn.hello = await conn.call("host.hello", {
                            "token": token, "clientId": self.client_id,
                            "clientKind": self.client_kind, "protocol": PROTOCOL_VERSION})
                    except RpcError as exc:
                        # refused for good; on the first connection, so is any error retrying cannot fix
                        if exc.data_code in REFUSED_HELLO_CODES or (self.connects == 0 and not exc.retriable):
                            raise HostRefused(exc.data_code, exc.message) from None
                        raise
                if hello_wait.cancelled_caught:
                    raise ConnectionLost(f"no answer to host.hello within {self._hello_timeout:g} s")
                resumed = [await sub._attach(conn) for sub in list(self._subscriptions)]
                self._conn = conn
                self.connects += 1
                self._tell("connected" if self.connects == 1 else _reconnected_line(resumed))
                on_connect = self.on_connect
                if on_connect is not None:
                    hello = conn.hello
                    self._notify("on_connect", lambda: on_connect(hello))
                self._wake()
                await conn.done.wait()
                self.last_error = ws.closed  # why it closed (the host's close frame, a keepalive left unanswered)
            except (RpcError, ConnectionLost) as exc:  # HostRefused included
                error = exc
            finally:
                self._rearm()
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await ws.aclose()
        if error is not None:
            raise error

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The one reconnect loop: backoff doubling from ``backoff`` to ``max_backoff``, with jitter, reset once
        connected. It stops for good (``fatal``) when the host refuses this client, when the data directory does
        not exist, and, before the first connection, on the first failure retrying cannot fix
        (:meth:`_first_failure`)."""
        task_status.started()
        delay = self._backoff
        try:
            while not self._closing:
                url: str | None = None
                try:
                    info = await anyio.to_thread.run_sync(self._endpoint)
                    url = info.url
                    headers = [("Origin", self._origin)] if self._origin else []
                    ws = await connect_websocket(info.url, headers=headers)
                except HostNotRunning as exc:
                    self.last_error = exc
                    self._leaving = None
                    if exc.no_data_dir or (self.connects == 0 and not self._wait_for_host):
                        self.fatal = exc
                        return
                    self._tell(f"waiting for a host: {exc}")
                except (OSError, WebSocketClosed, TimeoutError) as exc:
                    self.last_error = exc
                    if self._first_failure(url, exc):
                        return
                    if not (url is not None and url == self._leaving and _refused_while_stopping(exc)):
                        self._tell(f"waiting for the host to answer: {exc}")
                else:
                    try:
                        await self._serve(ws, info.token)
                        delay = self._backoff
                        closed = self.last_error
                        self._leaving = url if isinstance(closed, WebSocketClosed) and closed.code == 1001 else None
                    except HostRefused as exc:
                        self.last_error = self.fatal = exc
                        return
                    except (RpcError, ConnectionLost) as exc:
                        self.last_error = exc
                        if self._first_failure(url, exc):
                            return
                        self._tell(f"waiting for the host to answer: {exc}")
                if not self._reconnect:
                    return
                await anyio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(self._max_backoff, delay * 2)
        finally:
            self._closing = True
            self._wake()

    def _first_failure(self, url: str | None, exc: BaseException) -> bool:
        """Before the first connection, whether ``exc`` ends the client (``fatal``), as in the TypeScript client:
        a refused handshake (an HTTP answer other than 101 and 503, or no HTTP at all: :class:`HostRefused`
        ``HANDSHAKE_REFUSED``) always; any failure but a busy host's (503, a retriable answer to ``host.hello``)
        unless ``wait_for_host`` (:class:`HostNotRunning`)."""
        if self.connects > 0:
            return False
        if isinstance(exc, HandshakeRefused) and exc.code != 503:
            said = "no HTTP answer" if exc.code is None else f"HTTP {exc.code}"
            if exc.reason:
                said += f" ({exc.reason.strip()[:200]})"
            self.last_error = self.fatal = HostRefused(
                "HANDSHAKE_REFUSED", f"{url} answered the WebSocket handshake with {said}", status=exc.code)
            return True
        busy = (isinstance(exc, HandshakeRefused) and exc.code == 503) or (isinstance(exc, RpcError) and exc.retriable)
        if busy or self._wait_for_host:
            return False
        self.last_error = self.fatal = HostNotRunning(f"no host answered on {url} ({exc})")
        return True

    def _tell(self, state: str) -> None:
        on_state = self.on_state
        if on_state is not None and state != self._last_state:
            self._notify("on_state", lambda: on_state(state))
        self._last_state = state

    def _notify(self, name: str, callback: Callable[[], object]) -> None:
        """Run one of the app's callbacks: an :class:`Exception` it raises goes to ``on_callback_error`` (else to
        the log) and never ends the connection or the client. Cancellation, KeyboardInterrupt and SystemExit (not
        Exceptions) go on out."""
        try:
            callback()
        except Exception as exc:
            report = self.on_callback_error
            try:
                if report is not None:
                    report(exc, name)
                else:
                    _log.error("pi-host client: %s raised", name, exc_info=exc)
            except Exception:
                _log.exception("pi-host client: on_callback_error raised")

    async def _connection(self, patience: float | None = None) -> _Connection:
        """The live connection, waiting for the reconnect loop to make one: at most ``patience`` seconds (None:
        ``reconnect_timeout``), then :class:`HostUnavailable`."""
        waited = self._reconnect_timeout if patience is None else patience
        with anyio.move_on_after(waited):
            while True:
                conn = self._conn
                if conn is not None and conn.alive:
                    return conn
                if self._closing:
                    if self.fatal is not None:
                        raise self.fatal
                    raise ConnectionLost(f"not connected ({self.last_error or 'the client is closed'})")
                self._rearm()
                await self._ready.wait()
        raise HostUnavailable(waited, self.last_error)

    # -- calls -----------------------------------------------------------------
    # ASYNC109: a call's timeout is more than a cancel scope (its CallTimeout says whether the request was sent)
    async def _call(self, method: str, params: dict[str, Any], mutating: bool,
                    timeout: float | None = None) -> Any:  # noqa: ASYNC109
        if mutating and params.get("submissionId") is None:
            params = {**params, "submissionId": uuid.uuid4().hex}
        return await self.call(method, params, timeout=timeout)

    async def call(self, method: str, params: dict[str, Any] | None = None, *,
                   timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Call any method by name; retried like the typed ones (mutating calls need a ``submissionId``
        in ``params`` to be retried after a lost connection).

        ``timeout`` bounds the whole call in seconds, waiting for a connection and retries included (None: the
        client's ``call_timeout``; ``math.inf``: no bound for this call); past it the call raises
        :class:`CallTimeout`, which says whether the request was sent and so may have taken effect."""
        params = dict(params or {})
        _refuse_too_deep(method, params)
        encoded = _encode_params(method, params)
        limit = self._call_timeout if timeout is None else _bound("timeout", timeout)
        progress = _Progress()
        if limit is None:
            return await self._attempts(method, params, encoded, progress)
        with anyio.move_on_after(limit) as bounded:
            return await self._attempts(method, params, encoded, progress)
        assert bounded.cancelled_caught
        submission_id = params.get("submissionId")
        raise CallTimeout(method, limit, sent=progress.sent, mutating=method in MUTATING,
                          submission_id=submission_id if isinstance(submission_id, str) else None)

    async def _attempts(self, method: str, params: dict[str, Any], encoded: _Encoded, progress: _Progress) -> Any:
        retry_safe = method not in MUTATING or params.get("submissionId") is not None
        attempt = 0
        delay = self._backoff
        await anyio.lowlevel.checkpoint()  # every call yields, even one that fails at once (no busy loop)
        while True:
            attempt += 1
            conn = await self._connection()
            try:
                return await conn.call(method, encoded, progress=progress)
            except ConnectionLost:
                if not (self._reconnect and retry_safe) or attempt >= self._max_attempts:
                    raise
            except RpcError as exc:
                if not (exc.retriable and retry_safe) or attempt >= self._max_attempts:
                    raise
                await anyio.sleep(delay)
                delay = min(self._max_backoff, delay * 2)

    def subscribe(self, topics: Sequence[str], *, session_id: str | None = None,
                  buffer: int = 1024) -> _SubscribeContext:
        """``async with client.subscribe([...]) as events: async for ev in events: ...``

        Topics or a session id JSON cannot carry are refused here, before anything is sent, as a call's params
        are (:func:`_refuse_too_deep`, :func:`_encode_params`)."""
        return _SubscribeContext(self, Subscription(self, topics, session_id, buffer))

    async def aclose(self) -> None:
        for sub in list(self._subscriptions):
            await sub.aclose()
        self._closing = True
        conn = self._conn
        if conn is not None:
            await conn.ws.aclose()
        self._wake()


class _SubscribeContext:
    def __init__(self, client: Client, sub: Subscription) -> None:
        self._client = client
        self._sub = sub

    async def __aenter__(self) -> Subscription:
        self._client._subscriptions.add(self._sub)
        try:
            while True:  # a reconnect attaches it too; a duplicate is dropped by cursor
                conn = await self._client._connection()
                try:
                    await self._sub._attach(conn)
                except ConnectionLost:
                    continue
                return self._sub
        except BaseException:
            # refused (RpcError), not connected in time, cancelled: forget it, or every reconnect would send it
            # again (and fail on a refused one: the client never reconnected)
            with anyio.CancelScope(shield=True):
                await self._sub.aclose()
            raise

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self._sub.aclose()


def _refuse_too_deep(method: str, params: dict[str, Any]) -> None:
    """Params nested deeper than the host reads (:data:`MAX_JSON_DEPTH` containers, the request object being
    level 1) are refused here, before anything is sent, as the host would refuse them: an :class:`RpcError`
    ``PARSE_ERROR`` (``data.maxDepth``, ``data.sent`` false). The encoder never sees them (it fails on deep
    values with a ``RecursionError``); the connection stays as it was. Iterative: no recursion, and it stops at
    the first container past the limit."""
    stack: list[tuple[Any, int]] = [(params, 2)]  # the request object is level 1, its params level 2
    while stack:
        value, level = stack.pop()
        if level > MAX_JSON_DEPTH:
            raise RpcError(-32700, "PARSE_ERROR",
                           f"{method}: params nest deeper than {MAX_JSON_DEPTH} containers (the request object "
                           f"being level 1), which the host refuses; nothing was sent",
                           {"code": "PARSE_ERROR", "retriable": False, "maxDepth": MAX_JSON_DEPTH, "sent": False})
        items = value.values() if isinstance(value, dict) else value
        stack.extend((item, level + 1) for item in items if isinstance(item, (dict, list, tuple)))


def _encode_params(method: str, params: dict[str, Any]) -> _Encoded:
    """``params`` as JSON text, or an :class:`RpcError` ``INVALID_PARAMS`` (``data.sent`` false, ``data.errors``
    saying where) when they hold what the protocol's JSON cannot carry (:mod:`._unsendable`): NaN or ±Infinity
    (strict JSON has no such number: the host refuses the frame), a value JSON has no form for (a set, bytes, a
    ``datetime``, a ``UUID``, a dataclass, an ``Enum`` that is no ``int`` or ``str``, any other object; a key that is
    no string, number, boolean or None), a string holding a lone surrogate (no UTF-8 frame carries it: the socket
    raised a bare ``UnicodeEncodeError``), or an integer outside the signed 64-bit range (the host refuses the frame
    as ``PARSE_ERROR``). Nothing is sent; the connection, and a retry-safe write's ``submissionId`` (never sent),
    stay as they were. Only a failed encode, or a text with a surrogate or a run of 19 digits in it, looks for where
    (:func:`unsendable`, the check the host's own client shares), after :func:`_refuse_too_deep` (no cycle, a
    bounded depth): a call whose params encode pays one regular-expression scan of the text more than the one
    encode every try used to repeat."""
    try:
        text = json.dumps(params, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as exc:
        found = unsendable(params) or (f"a value the encoder refused ({exc})", [])
    else:
        if not _suspect(text):
            return _Encoded(text)
        suspect = unsendable(params)  # a run of digits may be in a string, or an integer that fits
        if suspect is None:
            return _Encoded(text)
        found = suspect
    message, data = describe(method, *found)
    raise RpcError(-32602, "INVALID_PARAMS", message, data) from None


_DIGIT_AS_ZERO = bytes.maketrans(b"123456789", b"0" * 9)
_NINETEEN_DIGITS = b"0" * 19


def _suspect(text: str) -> bool:
    """Whether an encoded text may hold a lone surrogate, or an integer outside the signed 64-bit range (19 digits
    or more; 2**63 - 1 has 19): what the regular expression ``[\\ud800-\\udfff]|[0-9]{19}`` finds, at a tenth of
    its CPU on a long text (a 5 MiB message: ~0.1 s each try of the expression, which no prefix lets skip ahead). A
    surrogate is what UTF-8 refuses to encode; in the UTF-8 bytes an ASCII digit is its own byte (every byte of a
    longer character is 0x80 or more), so 19 digits in a row are 19 zeros once each digit byte reads as a zero."""
    try:
        data = text.encode()
    except UnicodeEncodeError:
        return True
    return _NINETEEN_DIGITS in data.translate(_DIGIT_AS_ZERO)


def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, not {value!r}")
    return value


def _bound(name: str, value: float | None) -> float | None:
    """A call's bound in seconds: None or ``math.inf`` for none, else a number > 0."""
    return None if value is None or math.isinf(value) else _positive(name, value)


def _reconnected_line(resumed: list[int | None]) -> str:
    """What ``on_state`` says after a reconnect: where the subscriptions resumed."""
    cursors = [c for c in resumed if c is not None]
    if not resumed:
        return "reconnected"
    if len(cursors) == len(resumed):
        return f"reconnected; resumed at cursor {min(cursors)}"
    return "reconnected; resubscribed without a cursor (the host restarted or dropped the missed events: resync)"


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception inside (nested) groups, or None when there are several."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        item = pending.pop()
        if isinstance(item, BaseExceptionGroup):
            pending.extend(item.exceptions)
        else:
            leaves.append(item)
    return leaves[0] if len(leaves) == 1 else None


@asynccontextmanager
async def connect(url: str | None = None, token: str | None = None, *,
                  data_dir: str | os.PathLike[str] | None = None, client_id: str | None = None,
                  client_kind: str = "ui", origin: str | None = None, reconnect: bool = True,
                  max_attempts: int = 8, backoff: float = 0.1, max_backoff: float = 2.0,
                  connect_timeout: float = 30.0, reconnect_timeout: float = 30.0, hello_timeout: float = 10.0,
                  call_timeout: float | None = None, keepalive_interval: float | None = 20.0,
                  keepalive_timeout: float = 20.0, wait_for_host: bool = False,
                  on_state: Callable[[str], None] | None = None,
                  on_callback_error: Callable[[Exception, str], None] | None = None) -> AsyncIterator[Client]:
    """Connect to a host by ``url`` + ``token``, or by its data directory (``host.json``; the
    default data directory when neither is given; a ``token`` given with it is the one sent, not the token
    file's). ``client_id`` should be stable per install
    (it scopes command receipts); a random one is used when absent.

    Fails at once, with a :class:`ConnectionLost` subclass (never an exception group), on the first failure
    retrying cannot fix, the rule the TypeScript client follows: the server refuses this client
    (:class:`HostRefused`: a bad token or protocol, another error ``host.hello`` answers that is not retriable,
    or a WebSocket handshake answered with an HTTP status other than 101 and 503, or not in HTTP, e.g. a web
    server that is no host); the data directory does not exist; and any other failure of the first attempt
    (no host.json, nobody listening on ``url``, the connection closed before ``host.hello`` was answered;
    :class:`HostNotRunning`) unless ``wait_for_host=True``, which waits for a host instead, up to
    ``connect_timeout``, telling ``on_state`` so. A busy host (the handshake answered 503, ``host.hello`` a
    retriable error such as ``SHUTTING_DOWN``) is retried up to ``connect_timeout`` either way.
    Exceptions raised in the ``async with`` body come out as they were raised, not wrapped in a group.

    Once connected, a call made while the connection is down waits at most ``reconnect_timeout`` seconds
    for the client to reconnect (``math.inf``: as long as it takes), then raises :class:`HostUnavailable`
    (a :class:`ConnectionLost`); the client keeps reconnecting in the background.

    Every connection attempt, the first and each reconnect, waits at most ``hello_timeout`` seconds (default 10)
    for the answer to ``host.hello`` once the WebSocket is open; then it closes that socket and tries again after
    its backoff (the first connection stays bounded by ``connect_timeout`` as a whole).

    ``call_timeout`` (seconds; default None: no bound) bounds every call, waiting for a connection and retries
    included, unless the call passes its own ``timeout``; past it the call raises :class:`CallTimeout`. The
    connection is checked instead: a WebSocket ping every ``keepalive_interval`` seconds (default 20; None: no
    pings) that nothing answers within ``keepalive_timeout`` seconds (default 20) closes it, and its calls fail
    over to the reconnect, bounded by ``reconnect_timeout``.

    ``on_state`` (and ``client.on_connect``) are the app's: what they raise goes to ``on_callback_error(error,
    name)`` with ``name`` "on_state" or "on_connect" (default: logged at error level, with the traceback, on the
    ``pihost_client`` logger), and the client carries on."""
    if url is not None:
        if token is None:
            raise ValueError("a url needs its token")
        fixed = HostInfo(url=url, token=token.strip(), pid=0)

        def endpoint() -> HostInfo:
            return fixed
    elif token is not None:
        given = token.strip()

        def endpoint() -> HostInfo:  # the data directory names the url; the token given is the one sent
            return dataclasses.replace(read_host_info(data_dir), token=given)
    else:
        def endpoint() -> HostInfo:
            return read_host_info(data_dir)

    client = Client(endpoint, client_id=client_id or f"py-{uuid.uuid4().hex[:12]}", client_kind=client_kind,
                    origin=origin, reconnect=reconnect, max_attempts=max_attempts if reconnect else 1,
                    backoff=backoff, max_backoff=max_backoff if math.isfinite(max_backoff) else 2.0,
                    reconnect_timeout=reconnect_timeout, hello_timeout=hello_timeout, call_timeout=call_timeout,
                    keepalive_interval=keepalive_interval, keepalive_timeout=keepalive_timeout)
    client._wait_for_host = wait_for_host
    client.on_state = on_state
    client.on_callback_error = on_callback_error
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(client._run)
            try:
                with anyio.fail_after(connect_timeout):
                    await client._connection(math.inf)
            except TimeoutError:
                tg.cancel_scope.cancel()
                raise ConnectionLost(
                    f"could not connect within {connect_timeout} s ({client.last_error})") from None
            try:
                yield client
            finally:
                with anyio.CancelScope(shield=True):
                    await client.aclose()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # the task group wraps what it raises; callers catch ConnectionLost, RpcError... themselves
        single = _single(group)
        if single is None:
            raise
        raise single from single.__cause__


def _refused_while_stopping(exc: BaseException) -> bool:
    """What a host that is stopping answers a new connection until its ``host.json`` is gone: its port closed
    (connection refused) or a busy handshake (503)."""
    return isinstance(exc, ConnectionRefusedError) or (isinstance(exc, HandshakeRefused) and exc.code == 503)
