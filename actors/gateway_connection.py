"""One accepted gateway connection: hello, frame reading, request tasks, writer, events.

Tasks per connection (all in one nursery inside one cancel scope):
- the *reader* (``_serve``): reads frames in order and submits each request to
  the dispatcher itself, in frame order (``submit`` returns once the request is
  in its target's mailbox: the ordering point), with no task per request: the
  answer comes back through a reply callback that encodes it and queues it;
  at most ``max_in_flight`` requests are unanswered at once (reading waits
  beyond that);
- one *writer*: drains the bounded outbound queue into the socket;
- one *pump* per event subscription, forwarding bus events as notifications.

Responses are offered to the outbound queue with ``send_nowait``: a full queue
means the client is not reading, and the connection is closed (1008 "slow
consumer"). Event pumps leave half the queue to responses and wait otherwise; a
subscriber that falls behind the bus overflows and the connection is closed with
1013 (the client resubscribes with its last cursor, gap-free).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import outcome
import pydantic
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from actors.events import EventBus, SubscriberOverflow, Subscription
from actors.gateway_types import PROTOCOL_VERSION, CallContext, Dispatcher, GatewayConfig
from protocol.errors import RpcErrorCode, RpcFailure
from protocol.jsonrpc import (
    Call,
    Invalid,
    Item,
    RequestId,
    encode,
    encode_batch,
    error,
    error_for_code,
    notification,
    parse_message,
    success,
)
from protocol.models import HelloParams, SubscribeParams, UnsubscribeParams
from store.errors import InvalidInput, StoreError
from store.ids import validate_session_id
from store.jsonio import loads_strict

__all__ = ["GatewayConnection", "Counters", "close_transport"]

logger = logging.getLogger(__name__)

CLOSE_POLICY = 1008  # policy violation: unauthenticated, slow consumer
CLOSE_TRY_AGAIN = 1013  # event subscriber overflowed: resubscribe with cursor
CLOSE_GOING_AWAY = 1001  # the host is shutting down
_CONNECTION_METHODS = frozenset({"host.hello", "events.subscribe", "events.unsubscribe"})


@dataclass
class Counters:
    """Gateway-wide counters (owned by one Gateway instance)."""

    accepted_total: int = 0
    rejected_total: int = 0
    slow_consumer_closes: int = 0
    overflow_closes: int = 0
    peak_outbound_queued: int = 0


@dataclass(frozen=True, slots=True)
class _CloseAfter:
    """Outbound sentinel: everything queued before it is sent, then close."""

    code: int
    reason: str


class _Sink(Protocol):
    def put(self, index: int, response: dict[str, Any] | None, after: Sequence[Callable[[], None]]) -> None: ...


class _SingleSink:
    def __init__(self, conn: GatewayConnection) -> None:
        self._conn = conn

    def put(self, index: int, response: dict[str, Any] | None, after: Sequence[Callable[[], None]]) -> None:
        if response is not None:
            self._conn.deliver(encode(response))
        for callback in after:
            callback()


class _BatchSink:
    """Collects a batch's responses; sends them as ONE array frame when all are done."""

    def __init__(self, conn: GatewayConnection, size: int) -> None:
        self._conn = conn
        self._slots: list[dict[str, Any] | None] = [None] * size
        self._remaining = size
        self._after: list[Callable[[], None]] = []

    def put(self, index: int, response: dict[str, Any] | None, after: Sequence[Callable[[], None]]) -> None:
        self._slots[index] = response
        self._after.extend(after)
        self._remaining -= 1
        if self._remaining:
            return
        responses = [r for r in self._slots if r is not None]
        self._slots = []
        if responses:
            self._conn.deliver(encode_batch(responses))
        for callback in self._after:
            callback()


def _params_size(params: Any) -> int:
    try:
        return len(orjson.dumps(params))
    except (TypeError, orjson.JSONEncodeError):  # e.g. integers beyond 64 bits
        return len(json.dumps(params, ensure_ascii=False).encode("utf-8"))


def _decode(message: str) -> Any:
    """Decode one text frame; every failure is a PARSE_ERROR."""
    try:
        return loads_strict(message, max_int_digits=18)  # every accepted int must fit the int64 transcript encoder
    except InvalidInput:
        raise
    except (ValueError, RecursionError, TypeError) as exc:
        raise RpcFailure(RpcErrorCode.PARSE_ERROR, f"invalid JSON: {type(exc).__name__}") from None


async def close_transport(ws: WebSocketConnection) -> None:
    """Close the TCP stream under ``ws`` (idempotent).

    trio-websocket 0.12 leaves the stream open when the WebSocket was already
    closed by the library (1009 on an oversized message) or by the peer before
    TCP EOF, and its ``aclose()`` then returns early: the socket would linger
    until garbage collection. There is no public accessor, so reach for the
    stream and fail quietly if the attribute ever disappears.
    """
    stream = getattr(ws, "_stream", None)
    if isinstance(stream, trio.abc.AsyncResource):
        await trio.aclose_forcefully(stream)


class GatewayConnection:
    """Serves one accepted WebSocket until the peer leaves or we close it."""

    def __init__(
        self,
        ws: WebSocketConnection,
        connection_id: int,
        config: GatewayConfig,
        dispatcher: Dispatcher,
        bus: EventBus,
        counters: Counters,
    ) -> None:
        self.id = connection_id
        self._ws = ws
        self._config = config
        self._dispatcher = dispatcher
        self._bus = bus
        self._counters = counters
        self._out_send, self._out_recv = trio.open_memory_channel[str | _CloseAfter](config.outbound_queue)
        self._event_room = max(1, config.outbound_queue // 2)
        self._progress = trio.Event()
        self._in_flight = trio.Semaphore(config.max_in_flight)
        self._ctx: CallContext | None = None
        self._subs: dict[str, tuple[Subscription, trio.CancelScope]] = {}
        self._scope = trio.CancelScope()
        self._close_reason: tuple[int, str] | None = None
        self._nursery: trio.Nursery | None = None
        self.peak_outbound = 0

    # -- introspection -------------------------------------------------------
    def outbound_queued(self) -> int:
        return self._out_send.statistics().current_buffer_used

    def in_flight(self) -> int:
        return self._config.max_in_flight - self._in_flight.value

    @property
    def close_reason(self) -> tuple[int, str] | None:
        return self._close_reason

    # -- lifecycle -----------------------------------------------------------
    async def run(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._writer)
                    await self._serve(nursery)
                    nursery.cancel_scope.cancel()  # the peer left: stop everything
        finally:
            for sub, scope in self._subs.values():
                sub.close()
                scope.cancel()
            self._subs.clear()
            code, reason = self._close_reason or (1000, "")
            with trio.CancelScope(deadline=trio.current_time() + self._config.close_timeout, shield=True):
                await self._ws.aclose(code, reason)
                await close_transport(self._ws)

    def close(self, code: int, reason: str) -> None:
        """Close now (first reason wins); queued output is dropped."""
        if self._close_reason is None:
            self._close_reason = (code, reason)
        self._scope.cancel()

    def close_after_queued(self, code: int, reason: str) -> None:
        """Send what is already queued (answers included), then close with ``code``."""
        try:
            self._out_send.send_nowait(_CloseAfter(code, reason))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.close(code, reason)

    async def _finish(self, code: int, reason: str) -> None:
        """Send what is queued, then close with ``code`` (bounded by close_timeout)."""
        try:
            self._out_send.send_nowait(_CloseAfter(code, reason))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.close(code, reason)
            return
        with trio.move_on_after(self._config.close_timeout):
            await trio.sleep_forever()
        self.close(code, reason)

    # -- outbound ------------------------------------------------------------
    def deliver(self, data: bytes) -> None:
        """Queue one serialized frame; a full queue closes the connection (1008)."""
        try:
            self._out_send.send_nowait(data.decode("utf-8"))
        except trio.WouldBlock:
            if self._close_reason is None:
                self._counters.slow_consumer_closes += 1
                logger.warning("connection %d: outbound queue full, closing (slow consumer)", self.id)
            self.close(CLOSE_POLICY, "slow consumer")
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        depth = self.outbound_queued()
        self.peak_outbound = max(self.peak_outbound, depth)
        self._counters.peak_outbound_queued = max(self._counters.peak_outbound_queued, depth)

    async def _writer(self) -> None:
        async with self._out_recv:
            async for item in self._out_recv:
                self._progress.set()
                self._progress = trio.Event()
                if isinstance(item, _CloseAfter):
                    self.close(item.code, item.reason)
                    return
                try:
                    await self._ws.send_message(item)
                except ConnectionClosed:
                    self.close(1000, "")
                    return

    async def _wait_event_room(self) -> None:
        while self.outbound_queued() >= self._event_room:
            await self._progress.wait()

    # -- hello ---------------------------------------------------------------
    async def _serve(self, nursery: trio.Nursery) -> None:
        try:
            with trio.fail_after(self._config.hello_timeout):
                message = await self._ws.get_message()
        except trio.TooSlowError:
            self.deliver(encode(error_for_code(
                None, RpcErrorCode.UNAUTHENTICATED, "no host.hello within the hello timeout")))
            await self._finish(CLOSE_POLICY, "hello timeout")
            return
        except ConnectionClosed:
            return
        ctx, response = self._authenticate(message)
        self.deliver(encode(response))
        if ctx is None:
            await self._finish(CLOSE_POLICY, "unauthenticated")
            return
        self._ctx = ctx
        await self._read_loop(nursery)

    def _authenticate(self, message: str | bytes) -> tuple[CallContext | None, dict[str, Any]]:
        def refuse(request_id: RequestId, text: str) -> tuple[None, dict[str, Any]]:
            return None, error_for_code(request_id, RpcErrorCode.UNAUTHENTICATED, text)

        first = "the first request must be host.hello {token, clientId, clientKind, protocol}"
        if isinstance(message, bytes):
            return refuse(None, first)
        try:
            item = parse_message(_decode(message), max_batch=1)
        except (StoreError, RpcFailure):
            return refuse(None, first)
        if not isinstance(item, Call) or item.method != "host.hello" or item.is_notification:
            if isinstance(item, Call):
                return refuse(item.response_id, first)
            return refuse(item.id if isinstance(item, Invalid) else None, first)
        request_id = item.response_id
        params = item.params
        token = params.get("token") if isinstance(params, dict) else None
        if not isinstance(token, str) or not hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), self._config.token.encode("utf-8", "surrogatepass")
        ):
            return refuse(request_id, "invalid token")
        try:
            hello = HelloParams.model_validate(params)
        except pydantic.ValidationError as exc:
            return None, error(request_id, exc)
        if hello.protocol != PROTOCOL_VERSION:
            return None, error_for_code(
                request_id, "UNSUPPORTED_PROTOCOL", f"unsupported protocol {hello.protocol}",
                {"supported": [PROTOCOL_VERSION]},
            )
        client_id, kind = hello.client_id, hello.client_kind
        ctx = CallContext(connection_id=self.id, client_id=client_id, client_kind=kind, protocol=PROTOCOL_VERSION,
                          plugin_id=hello.plugin_id)
        try:
            extra = dict(self._dispatcher.hello(ctx))
        except Exception as exc:
            return None, error(request_id, exc)
        result = {"protocol": PROTOCOL_VERSION, "clientId": client_id, "connectionId": self.id, **extra}
        return ctx, success(request_id, result)

    # -- requests ------------------------------------------------------------
    async def _read_loop(self, nursery: trio.Nursery) -> None:
        while True:
            try:
                message = await self._ws.get_message()
            except ConnectionClosed:
                return
            await self._on_frame(message, nursery)

    async def _on_frame(self, message: str | bytes, nursery: trio.Nursery) -> None:
        if isinstance(message, bytes):
            self.deliver(encode(error_for_code(
                None, RpcErrorCode.INVALID_REQUEST, "binary frames are not accepted; send JSON text")))
            return
        try:
            value = _decode(message)
        except (StoreError, RpcFailure) as exc:
            self.deliver(encode(error(None, exc)))
            return
        parsed = parse_message(value, max_batch=self._config.max_batch)
        size = len(message)
        if isinstance(parsed, list):
            sink: _Sink = _BatchSink(self, len(parsed))
            last = len(parsed) - 1
            for index, item in enumerate(parsed):
                await self._start(item, sink, index, size, more=index < last)
        else:
            await self._start(parsed, _SingleSink(self), 0, size, more=False)

    async def _start(self, item: Item, sink: _Sink, index: int, frame_size: int, *, more: bool) -> None:
        if isinstance(item, Invalid):
            sink.put(index, error_for_code(item.id, RpcErrorCode.INVALID_REQUEST, item.reason), ())
            return
        limit = self._config.max_params_bytes
        if frame_size > limit and _params_size(item.params) > limit:
            response = error_for_code(
                item.response_id, RpcErrorCode.PAYLOAD_TOO_LARGE, f"params exceed {limit} bytes", {"limit": limit}
            )
            sink.put(index, None if item.is_notification else response, ())
            return
        if item.method in _CONNECTION_METHODS:
            after: list[Callable[[], None]] = []
            try:
                result = self._connection_call(item, after)
                response = success(item.response_id, result)
            except Exception as exc:
                response = error(item.response_id, exc)
            sink.put(index, None if item.is_notification else response, after)
            return
        await self._in_flight.acquire()
        answered = False

        def reply(result: outcome.Outcome[Any]) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            self._in_flight.release()
            if isinstance(result, outcome.Value):
                response = success(item.response_id, result.value)
            else:
                assert isinstance(result, outcome.Error)
                response = error(item.response_id, result.error)
            sink.put(index, None if item.is_notification else response, ())

        assert self._ctx is not None
        try:
            await self._dispatcher.submit(item.method, item.params, self._ctx, reply, more=more)
        except BaseException as exc:
            if not answered:
                if isinstance(exc, Exception):
                    reply(outcome.Error(exc))
                else:
                    answered = True
                    self._in_flight.release()
            raise

    def _connection_call(self, call: Call, after: list[Callable[[], None]]) -> Any:
        if call.method == "host.hello":
            raise RpcFailure("ALREADY_AUTHENTICATED", "host.hello was already accepted on this connection")
        if call.method == "events.subscribe":
            return self._subscribe(call.params, after)
        return self._unsubscribe(call.params)

    # -- events --------------------------------------------------------------
    def _subscribe(self, params: Any, after: list[Callable[[], None]]) -> dict[str, Any]:
        if isinstance(params, dict) and params.get("sessionId") is not None:
            validate_session_id(params["sessionId"])  # INVALID_ID before any other check
        request = SubscribeParams.model_validate(params)
        if len(self._subs) >= self._config.max_subscriptions:
            raise RpcFailure("LIMIT_EXCEEDED", f"at most {self._config.max_subscriptions} subscriptions per connection")
        sub = self._bus.subscribe(request.topics, session_id=request.session_id, cursor=request.cursor)
        sub_id = f"sub-{sub.id}"
        scope = trio.CancelScope()
        ready = trio.Event()
        self._subs[sub_id] = (sub, scope)
        assert self._nursery is not None
        self._nursery.start_soon(self._pump, sub, sub_id, scope, ready)
        after.append(ready.set)  # events flow only after the response was queued
        return {"subscriptionId": sub_id, "cursor": sub.start_cursor}

    def _unsubscribe(self, params: Any) -> dict[str, Any]:
        sub_id = UnsubscribeParams.model_validate(params).subscription_id
        entry = self._subs.pop(sub_id, None)
        if entry is None:
            raise RpcFailure("NOT_FOUND", f"no subscription {sub_id!r} on this connection",
                             data={"subscriptionId": sub_id})
        sub, scope = entry
        sub.close()
        scope.cancel()
        return {"ok": True}

    async def _pump(self, sub: Subscription, sub_id: str, scope: trio.CancelScope, ready: trio.Event) -> None:
        with scope:
            await ready.wait()
            async with trio.open_nursery() as watch:
                watch.start_soon(self._watch_overflow, sub)
                try:
                    while True:
                        event = await sub.receive()
                        params: dict[str, Any] = {
                            "topic": event.topic,
                            "cursor": event.cursor,
                            "subscriptionId": sub_id,
                            "data": event.data,
                        }
                        if event.session_id is not None:
                            params["sessionId"] = event.session_id
                        await self._wait_event_room()
                        self.deliver(self._encode_event(params))
                except trio.EndOfChannel:
                    pass
                except SubscriberOverflow:
                    self._overflowed(sub)
                watch.cancel_scope.cancel()

    def _encode_event(self, params: dict[str, Any]) -> bytes:
        try:
            return orjson.dumps(notification("event", params))
        except (TypeError, orjson.JSONEncodeError):
            # Keep the cursor sequence gap-free: send the event without its data.
            logger.error("event %s (cursor %s) has unserializable data", params["topic"], params["cursor"])
            params = {**params,
                      "data": {"error": RpcErrorCode.INTERNAL, "message": "event data could not be serialized"}}
            return orjson.dumps(notification("event", params))

    async def _watch_overflow(self, sub: Subscription) -> None:
        await sub.wait_overflowed()
        self._overflowed(sub)

    def _overflowed(self, sub: Subscription) -> None:
        if self._close_reason is None:
            self._counters.overflow_closes += 1
            logger.warning("connection %d: subscription %d overflowed, closing (1013)", self.id, sub.id)
        self.close(CLOSE_TRY_AGAIN, "event subscriber overflow; resubscribe with your last cursor")
