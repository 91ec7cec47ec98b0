"""One accepted gateway connection: hello, frame reading, request tasks, writer, events.

Tasks per connection (all in one nursery inside one cancel scope):
- the *reader* (``_serve``): reads frames in order and submits each request to
  the dispatcher itself, in frame order (``submit`` queues the request in the
  connection's order and returns: the pipeline runs it after every earlier
  mutation of this connection took effect, ``runtime/ordering.py``), with no
  task per request: the answer comes back through a reply callback that
  encodes it and queues it; at most ``max_in_flight`` requests are unanswered
  at once (reading waits beyond that);
- one *writer*: drains the bounded outbound queue into the socket; a small
  frame with nothing queued or being sent before it goes to the socket from
  the task that answered (``deliver``: no hop to the writer and back), and
  the writer only finishes what the socket did not take at once;
- after ``host.hello``, one *keepalive*: a ping every ``ping_interval`` seconds,
  closing (1011) a peer silent past ``ping_timeout`` after one (``_keepalive``);
- one *pump* per event subscription, forwarding bus events as notifications (a
  long event's data encoded once for every subscriber, in a worker thread:
  ``_event_frame``).

Every reply is encoded once (orjson bytes, which are the frame's payload as they
are: ``gateway_outbound.send_text``; a pre-encoded ``session.get`` page is sent from
its own bytes between the envelope's head and brace, never copied) and checked
against the reply cap. A reply longer than ``REPLY_ON_LOOP`` (roughly counted,
``protocol.jsonrpc.longer_than``: a whole session.context, a base64 file, a
configSync.export bundle, a queued prompt) is encoded in a worker thread (the
connection's, one at a time), never on the trio loop; the request counts as in
flight until then. Short ones (an append's summary, a small read) are encoded at
once by the task that answered, without a thread hop; a batch's
replies are encoded as each entry completes and counted against the batch's
budget (an entry past it is answered ``PAYLOAD_TOO_LARGE``), then sent as one
array frame made of the pieces, never joined. A batch whose declared window
budgets cannot fit is refused whole before any entry runs
(``protocol/reply_budget.py``). Window and whole-transcript reads reserve their
budget from the connection's work budget before they are submitted.

Encoded frames wait in a queue bounded by **bytes** (``max_outbound_bytes``): a
frame that does not fit means the client is not reading, and the connection is
closed (1008 "slow consumer"). Event pumps leave half of it to responses and
wait otherwise; a subscriber that falls behind the bus overflows and the
connection is closed with 1013 (the client resubscribes with its last cursor,
gap-free). A token bucket bounds requests per second (reading waits).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import outcome
import pydantic
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from actors.events import Event, EventBus, SubscriberOverflow, Subscription
from actors.gateway_outbound import (
    ByteBudget,
    CloseAfter,
    Flush,
    Frame,
    Outbound,
    PeerGone,
    RequestRate,
    SharedBytes,
    flush_unsent,
    send_text,
    send_text_nowait,
)
from actors.gateway_types import PROTOCOL_VERSION, CallContext, Dispatcher, GatewayConfig
from protocol.errors import RpcErrorCode, RpcFailure
from protocol.jsonrpc import (
    Call,
    Encoded,
    Invalid,
    Item,
    RequestId,
    dumps_content,
    encode,
    encoded_parts,
    error,
    error_for_code,
    longer_than,
    notification,
    parse_message,
    success,
    valid_id,
)
from protocol.models import HelloParams, SubscribeParams, UnsubscribeParams
from protocol.reply_budget import BatchRefused, batch_budgets, declared_bytes
from store.errors import InvalidInput, StoreError
from store.ids import validate_session_id
from store.interchange.native_pi import is_native_id, unsupported_for_native
from store.jsonio import IntegerOutOfRange, NestingTooDeep, loads_strict

__all__ = ["GatewayConnection", "Counters", "close_transport"]

logger = logging.getLogger(__name__)

CLOSE_POLICY = 1008  # policy violation: unauthenticated, slow consumer
CLOSE_TRY_AGAIN = 1013  # event subscriber overflowed: resubscribe with cursor
CLOSE_GOING_AWAY = 1001  # the host is shutting down
CLOSE_KEEPALIVE = 1011  # a ping went unanswered (the code and reason the websockets library uses)
_CONNECTION_METHODS = frozenset({"host.hello", "events.subscribe", "events.unsubscribe"})
_PLUGIN_TOPICS = frozenset({"settings.changed"})
"""What a plugin connection may subscribe to (its own namespace's events only: ``_plugin_scope``)."""
REPLY_ON_LOOP = 64 * 1024
"""A reply or an event of up to about this many characters is encoded on the trio loop (tens of microseconds);
a longer one in a worker thread (a 16 MiB reply: ~7 ms of orjson, and the walk for its long strings)."""
DECODE_ON_LOOP = 64 * 1024
"""A text frame of up to this many characters is decoded (strict JSON) on the trio loop; a longer one (up to
the 4 MiB frame cap: ~10-40 ms of strict decoding) in a worker thread, its connection's reader waiting for it;
when it is longer than a quarter of the params cap, its params are measured there too (``_decode_long``)."""


@dataclass
class Counters:
    """Gateway-wide counters (owned by one Gateway instance)."""

    accepted_total: int = 0
    rejected_total: int = 0
    slow_consumer_closes: int = 0
    overflow_closes: int = 0
    peak_outbound_queued: int = 0
    peak_outbound_bytes: int = 0
    oversized_replies: int = 0
    evicted_unauthenticated: int = 0
    evicted_heads: int = 0
    keepalive_closes: int = 0


class _Sink(Protocol):
    def put(self, index: int, response: dict[str, Any] | None, after: Sequence[Callable[[], None]], *,
            encoded: bytes | None = None) -> None: ...


class _SingleSink:
    def __init__(self, conn: GatewayConnection) -> None:
        self._conn = conn

    def put(self, index: int, response: dict[str, Any] | None, after: Sequence[Callable[[], None]], *,
            encoded: bytes | None = None) -> None:
        if response is not None:
            parts = self._conn.encode_reply(response, encoded=encoded)
            self._conn.deliver(Frame(parts, sum(len(p) for p in parts)))
        for callback in after:
            callback()


class _BatchSink:
    """A batch's responses, encoded as each entry completes and counted against the batch budget;
    sent as ONE array frame of those pieces when all are done (never joined into one copy)."""

    def __init__(self, conn: GatewayConnection, size: int, budget: int) -> None:
        self._conn = conn
        self._slots: list[tuple[bytes, ...] | None] = [None] * size
        self._remaining = size
        self._after: list[Callable[[], None]] = []
        self._budget = budget
        self._bytes = 2  # the brackets

    def put(self, index: int, response: dict[str, Any] | None, after: Sequence[Callable[[], None]], *,
            encoded: bytes | None = None) -> None:
        conn = self._conn
        if response is not None:
            parts = conn.encode_reply(response, encoded=encoded)
            size = sum(len(p) for p in parts)
            over_batch = self._bytes + size + 1 > self._budget
            if over_batch or not conn.hold_pieces(size):
                conn.counted_oversized()
                what = "the batch's replies exceed" if over_batch else "the connection's unsent batch replies exceed"
                if "result" in response:
                    # The entry ran (a write took effect): saying only "too large, not retriable" would make
                    # a client send the intent again under a new submissionId and apply it twice.
                    refused = error_for_code(
                        response.get("id"), RpcErrorCode.PAYLOAD_TOO_LARGE,
                        f"{what} {self._budget} bytes; this entry ran, but its answer was not sent in it: "
                        "a write's retry with the same submissionId is answered from its receipt; "
                        "send a read again on its own or with a smaller maxBytes / messageLimit",
                        {"limit": self._budget, "size": size, "ran": True})
                    refused["error"]["data"]["retriable"] = True
                else:
                    refused = error_for_code(
                        response.get("id"), RpcErrorCode.PAYLOAD_TOO_LARGE,
                        f"{what} {self._budget} bytes; this entry was not answered in it: "
                        "send it again on its own or with a smaller maxBytes / messageLimit",
                        {"limit": self._budget, "size": size})
                data = encode(refused)
                parts, size = (data,), len(data)
                conn.hold_pieces(size, force=True)
            self._slots[index] = parts
            self._bytes += size + 1
        self._after.extend(after)
        self._remaining -= 1
        if self._remaining:
            return
        pieces = [r for r in self._slots if r is not None]
        self._slots = []
        conn.release_pieces(sum(len(p) for parts in pieces for p in parts))
        if pieces:
            chunks: list[bytes] = [b"["]
            for n, parts in enumerate(pieces):
                if n:
                    chunks.append(b",")
                chunks.extend(parts)
            chunks.append(b"]")
            self._conn.deliver(Frame(tuple(chunks), sum(len(c) for c in chunks)))
        for callback in self._after:
            callback()


def trim(data: bytes) -> bytes:
    """A copy of ``data`` that owns exactly ``len(data)`` bytes (see ``GatewayConnection.encode_reply``)."""
    return bytes(memoryview(data))


def _encode_long(response: dict[str, Any]) -> bytes:
    """A long read's reply as :meth:`GatewayConnection.encode_reply` encodes it, trimmed (a worker thread's)."""
    return trim(encode(response, big_strings=True))


def _encode_event_data(data: Any) -> bytes:
    """A long event's ``data`` as JSON, trimmed (a worker thread's); ``b""`` if it holds what JSON cannot."""
    try:
        return trim(dumps_content(data))
    except (TypeError, orjson.JSONEncodeError):
        return b""


def _params_size(params: Any) -> int:
    try:
        return len(orjson.dumps(params))
    except (TypeError, orjson.JSONEncodeError):  # e.g. integers beyond 64 bits
        return len(json.dumps(params, ensure_ascii=False).encode("utf-8"))


def _decode_long(message: str, measure: bool) -> tuple[Any, list[int | None] | None]:
    """A long frame decoded (a worker thread's); with ``measure``, the UTF-8 length of each request's
    params too (``_params_size``, in the frame's order: one for a single request, one per batch entry;
    ``None`` where there is no request object), for the params cap."""
    value = _decode(message)
    if not measure:
        return value, None
    requests = value if isinstance(value, list) else [value]
    return value, [_params_size(r.get("params")) if isinstance(r, dict) else None for r in requests]


def _decode(message: str) -> Any:
    """Decode one text frame; every failure is a PARSE_ERROR."""
    try:
        # every accepted integer must fit int64: the transcript encoder and SQLite store it losslessly
        return loads_strict(message, max_int_digits=20, int64=True)
    except InvalidInput:
        raise
    except (ValueError, RecursionError, TypeError) as exc:
        raise RpcFailure(RpcErrorCode.PARSE_ERROR, f"invalid JSON: {type(exc).__name__}") from None


def _int_or_none(token: str) -> int | None:
    return int(token) if len(token) <= 40 else None


def _no_duplicate_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = {key for key, _ in pairs}
    if len(keys) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def _id_of_refused(message: str, exc: BaseException) -> RequestId:
    """The id of a request refused only for an integer outside int64 or for nesting deeper than the strict
    profile's limit (well-formed JSON otherwise), so the client can match the PARSE_ERROR to the call it is
    waiting for; ``None`` for any other parse failure, a batch, or an id that is itself no valid id
    (JSON-RPC: the id could not be determined)."""
    if not isinstance(exc, IntegerOutOfRange | NestingTooDeep):
        return None
    try:
        # the stdlib reader; an integer too long for int() (4,300 digits) is no valid id either. A too-deep
        # document was not checked for duplicate keys yet: one that has any gets no id (which "id" is it?)
        hook = _no_duplicate_pairs if isinstance(exc, NestingTooDeep) else None
        value = json.loads(message, parse_int=_int_or_none, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        return None
    request_id = value.get("id") if isinstance(value, dict) else None
    return request_id if request_id is not None and valid_id(request_id) else None


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
        shared_work: ByteBudget | None = None,
        shared_outbound: SharedBytes | None = None,
    ) -> None:
        self.id = connection_id
        self._ws = ws
        self._config = config
        self._dispatcher = dispatcher
        self._bus = bus
        self._counters = counters
        self._out = Outbound(max_bytes=config.max_outbound_bytes, max_frames=config.outbound_queue,
                             shared=shared_outbound)
        self._work = ByteBudget(config.max_work_bytes)
        self._shared_work = shared_work if shared_work is not None else ByteBudget(config.max_host_work_bytes)
        self._rate = RequestRate(config.max_request_rate, max(config.max_request_rate, config.max_batch))
        self._in_flight = trio.Semaphore(config.max_in_flight)
        self.on_authenticated: Callable[[GatewayConnection], str | None] | None = None
        self._pieces = 0  # encoded replies held by batches not yet complete (all of this connection's)
        self._pieces_freed = trio.Event()
        self._encoder = trio.CapacityLimiter(1)  # the thread encoding this connection's long replies and events
        self._encoding = 0  # long replies being encoded: a close after the queued frames waits for them
        self._close_after: tuple[int, str] | None = None
        self._decoder = trio.CapacityLimiter(1)  # the thread decoding its long frames (one reader: one at a time)
        self.zero_copy_frames = 0
        self.direct_frames = 0  # of them, sent from the replying task (no hop to the writer)
        self.ignored_notifications = 0  # requests without an id: never run (logged once per connection)
        self._ctx: CallContext | None = None
        self._subs: dict[str, tuple[Subscription, trio.CancelScope]] = {}
        self._scope = trio.CancelScope()
        self._close_reason: tuple[int, str] | None = None
        # True while a frame is being written: a send cancelled there (a stalled peer, a close) leaves
        # part of a frame on the stream, and a close frame after it would land inside its payload.
        self._mid_frame = False
        self._nursery: trio.Nursery | None = None
        self.peak_outbound = 0
        # Since when the reader has been waiting for the peer's next message (None: it is handling one, or
        # waiting for the host: in-flight slots, the rate, a budget). Only while it waits for the peer does
        # trio-websocket's reader take every frame, pongs included (its message channel is drained).
        self._peer_wait_since: float | None = None

    # -- introspection -------------------------------------------------------
    def outbound_queued(self) -> int:
        return len(self._out)

    def outbound_bytes(self) -> int:
        return self._out.queued_bytes

    @property
    def authenticated(self) -> bool:
        return self._ctx is not None

    def work_statistics(self) -> tuple[int, int]:
        """Bytes reserved by reads in flight now, and the most ever reserved at once."""
        return self._work.held, self._work.peak

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
            if self._ctx is not None:
                self._dispatcher.disconnected(self._ctx)  # its queued requests: nobody reads their answers
            for sub, scope in self._subs.values():
                sub.close()
                scope.cancel()
            self._subs.clear()
            code, reason = self._close_reason or (1000, "")
            with trio.CancelScope(deadline=trio.current_time() + self._config.close_timeout, shield=True):
                if not self._mid_frame:
                    await self._ws.aclose(code, reason)
                # else: part of a frame is on the stream; the peer would read a close frame's bytes as that
                # frame's payload (seen as invalid UTF-8, close 1007). The TCP stream is closed instead.
                await close_transport(self._ws)

    def close(self, code: int, reason: str) -> None:
        """Close now (first reason wins); queued output is dropped."""
        if self._close_reason is None:
            self._close_reason = (code, reason)
        self._scope.cancel()

    def close_after_queued(self, code: int, reason: str) -> None:
        """Send what is already queued (answers included, and the long ones still being encoded), then
        close with ``code``."""
        if self._encoding:
            self._close_after = (code, reason)  # queued once the last of them is
            return
        if not self._out.offer(CloseAfter(code, reason)):
            self.close(code, reason)

    async def _finish(self, code: int, reason: str) -> None:
        """Send what is queued, then close with ``code`` (bounded by close_timeout)."""
        if not self._out.offer(CloseAfter(code, reason)):
            self.close(code, reason)
            return
        with trio.move_on_after(self._config.close_timeout):
            await trio.sleep_forever()
        self.close(code, reason)

    # -- outbound ------------------------------------------------------------
    def encode_reply(self, response: dict[str, Any], *, encoded: bytes | None = None) -> tuple[bytes, ...]:
        """Encode once, as the pieces of one frame's payload; a reply over the reply cap is answered
        ``PAYLOAD_TOO_LARGE`` instead. ``encoded``: the response's bytes, encoded and trimmed already
        (in a worker thread: ``_encode_long``).

        A pre-encoded result (``protocol.jsonrpc.Encoded``: a ``session.get`` page of up to
        16 MiB) is not copied: its bytes are the middle piece, between the envelope's head and
        its closing brace (``encoded_parts``). Anything else is one piece from orjson, which
        returns its output buffer as it grew it, holding up to 16 times the length of the
        longest string it wrote (measured: a 33 KB reply keeps 519 KB, a 16 MiB string
        265 MB). A reply may wait in a batch or in the outbound queue, where only its length
        is counted, so it is trimmed to its length first (one memcpy; the oversized buffer is
        freed at once).
        """
        cap = self._config.max_reply_bytes
        parts = encoded_parts(response)
        if parts is None:
            data = encode(response) if encoded is None else encoded
            if len(data) <= cap:
                return (trim(data) if encoded is None else data,)
            size = len(data)
        else:
            size = sum(len(p) for p in parts)
            if size <= cap:
                return parts
        self.counted_oversized()
        logger.warning("connection %d: a %d-byte reply exceeds the reply cap (%d)", self.id, size, cap)
        return (encode(error_for_code(
            response.get("id"), RpcErrorCode.PAYLOAD_TOO_LARGE,
            f"the reply would be {size} bytes, over the limit of {cap}: ask for less (page with a "
            "cursor, messageLimit/maxBytes, or a smaller limit)", {"limit": cap, "size": size})),)

    def hold_pieces(self, n: int, *, force: bool = False) -> bool:
        """Count ``n`` bytes of a batch's encoded reply as held; False if they do not fit the
        connection's batch budget (its incomplete batches together, not each one)."""
        if not force and self._pieces and self._pieces + n > self._config.max_batch_reply_bytes:
            return False
        self._pieces += n
        return True

    def release_pieces(self, n: int) -> None:
        self._pieces = max(0, self._pieces - n)
        self._pieces_freed.set()
        self._pieces_freed = trio.Event()

    async def _wait_pieces(self) -> None:
        """Backpressure: no new frame while incomplete batches hold a batch budget of replies."""
        while self._pieces >= self._config.max_batch_reply_bytes // 2:
            await self._pieces_freed.wait()

    def counted_oversized(self) -> None:
        self._counters.oversized_replies += 1

    def deliver(self, frame: Frame) -> None:
        """Queue one encoded frame; one that does not fit the byte bound closes the connection (1008)."""
        if self._close_reason is not None or self._out.closed:
            return  # a peer that left is not a slow consumer: its replies are dropped
        out = self._out
        if not out:
            # Nothing waits for the writer: a small frame goes to the socket from this task (no hop to
            # the writer task and back); the writer only sends what the socket did not take at once.
            unsent = send_text_nowait(self._ws, frame.chunks, frame.size)
            if unsent is not None:
                self.zero_copy_frames += 1
                self.direct_frames += 1
                if unsent:
                    out.offer(Flush())
                return
        if not out.offer(frame):
            self._counters.slow_consumer_closes += 1
            logger.warning("connection %d: %d bytes in %d frames unread, closing (slow consumer)",
                           self.id, self._out.queued_bytes, len(self._out))
            self.close(CLOSE_POLICY, "slow consumer")
            return
        depth = self.outbound_queued()
        self.peak_outbound = max(self.peak_outbound, depth)
        self._counters.peak_outbound_queued = max(self._counters.peak_outbound_queued, depth)
        self._counters.peak_outbound_bytes = max(self._counters.peak_outbound_bytes, self._out.queued_bytes)

    async def _writer(self) -> None:
        try:
            while True:
                item = await self._out.get()
                if isinstance(item, CloseAfter):
                    self.close(item.code, item.reason)
                    return
                with trio.move_on_after(self._config.send_stall_timeout) as stalled:
                    self._mid_frame = True
                    try:
                        if isinstance(item, Flush):
                            await flush_unsent(self._ws)
                            fast = False  # counted when it was started
                        else:
                            fast = await send_text(self._ws, item.chunks, item.size)
                    except PeerGone:
                        self.close(1000, "")
                        return
                    self._mid_frame = False
                    self.zero_copy_frames += int(fast)
                if stalled.cancelled_caught:
                    # The peer has read nothing for that long: closed whatever the bytes queued (a client
                    # blocked in its own send while we are blocked in ours would hold both forever).
                    self._counters.slow_consumer_closes += 1
                    logger.warning("connection %d: one frame unsent for %.0f s, closing (slow consumer)",
                                   self.id, self._config.send_stall_timeout)
                    self.close(CLOSE_POLICY, "slow consumer")
                    return
        except trio.EndOfChannel:
            return
        finally:
            self._out.close()

    async def _wait_event_room(self) -> None:
        while not self._out.has_room(0.5):
            await self._out.wait_progress()

    # -- hello ---------------------------------------------------------------
    async def _serve(self, nursery: trio.Nursery) -> None:
        try:
            with trio.fail_after(self._config.hello_timeout):
                message = await self._ws.get_message()
        except trio.TooSlowError:
            self._deliver_small(error_for_code(
                None, RpcErrorCode.UNAUTHENTICATED, "no host.hello within the hello timeout"))
            await self._finish(CLOSE_POLICY, "hello timeout")
            return
        except ConnectionClosed:
            return
        ctx, response = self._authenticate(message)
        if ctx is not None and self.on_authenticated is not None:
            refusal = self.on_authenticated(self)  # the authenticated connection cap
            if refusal is not None:
                ctx, response = None, error_for_code(response.get("id"), "BUSY", refusal)
        self._deliver_small(response)
        if ctx is None:
            await self._finish(CLOSE_POLICY, "unauthenticated")
            return
        self._ctx = ctx
        self._dispatcher.connected(ctx)
        if self._config.ping_interval is not None:
            nursery.start_soon(self._keepalive, nursery, self._config.ping_interval)
        await self._read_loop(nursery)

    def _deliver_small(self, response: dict[str, Any]) -> None:
        data = trim(encode(response))
        self.deliver(Frame((data,), len(data)))

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
        if params is not None and not isinstance(params, dict):  # README §2: before the token is looked at
            return None, error_for_code(
                request_id, RpcErrorCode.INVALID_PARAMS,
                "params must be an object (named params); positional (array) params are not accepted",
                {"errors": [{"loc": "", "msg": "params must be an object", "type": "dict_type"}]})
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
            self._peer_wait_since = trio.current_time()
            try:
                message = await self._ws.get_message()
            except ConnectionClosed:
                return
            finally:
                self._peer_wait_since = None
            await self._on_frame(message, nursery)

    # -- keepalive -----------------------------------------------------------
    async def _keepalive(self, nursery: trio.Nursery, interval: float) -> None:
        """Ping every ``interval`` seconds (one ping outstanding at most); close with 1011 a connection
        whose peer sent nothing at all, not even the pong, for ``ping_timeout`` seconds after a ping: a
        client that stopped reading, a process that froze, a half-open socket, a message dribbled without
        end. trio-websocket, browsers and the other WebSocket libraries answer pings by themselves.

        Only silence closes: while the reader waits for the host (in-flight slots, the request rate, a
        work budget), a pong may sit behind frames the host has not read yet, so an unanswered ping then
        starts the wait over, from the moment the reader waits for the peer again."""
        timeout = self._config.ping_timeout
        answered = trio.Event()
        answered.set()  # nothing outstanding yet
        since = 0.0
        while True:
            await trio.sleep(interval)
            if answered.is_set():
                answered, since = trio.Event(), trio.current_time()
                nursery.start_soon(self._ping, answered)
            with trio.move_on_after(max(0.0, since + timeout - trio.current_time())):
                await answered.wait()
            if answered.is_set():
                continue
            waiting = self._peer_wait_since
            if waiting is not None and waiting <= since:  # nothing read since the ping, not even its pong
                self._counters.keepalive_closes += 1
                logger.info("connection %d: no pong within %.0f s of a ping; closing", self.id, timeout)
                self.close(CLOSE_KEEPALIVE, "keepalive ping timeout")
                return
            since = trio.current_time()  # the peer spoke, or the host held its frames: measure from now

    async def _ping(self, answered: trio.Event) -> None:
        """One ping, sent under trio-websocket's send lock (as the fast path's frames are); ``answered`` is
        set by its pong. Its own task: a timeout never cancels the ping's send part way through a frame."""
        try:
            await self._ws.ping()
        except ConnectionClosed:
            return
        answered.set()

    async def _on_frame(self, message: str | bytes, nursery: trio.Nursery) -> None:
        await self._wait_pieces()
        if isinstance(message, bytes):
            self._deliver_small(error_for_code(
                None, RpcErrorCode.INVALID_REQUEST, "binary frames are not accepted; send JSON text"))
            return
        # at most this many UTF-8 bytes (a text frame's length counts characters, up to 4 bytes each): the
        # frame bounds the params only when this does not pass the cap
        size = len(message) * 4
        sizes: list[int | None] | None = None  # the params' lengths, measured with a long frame's decode
        try:
            if len(message) <= DECODE_ON_LOOP:
                value = _decode(message)
            else:  # the reader waits for it (frames stay in order); the loop does not
                value, sizes = await trio.to_thread.run_sync(
                    _decode_long, message, size > self._config.max_params_bytes, limiter=self._decoder)
        except (StoreError, RpcFailure) as exc:
            self._deliver_small(error(_id_of_refused(message, exc), exc))
            return
        parsed = parse_message(value, max_batch=self._config.max_batch)
        if isinstance(parsed, list):
            await self._rate.take(len(parsed))
            calls = [(item.method, item.params) if isinstance(item, Call) else ("", None) for item in parsed]
            try:
                budgets = batch_budgets(calls, limit=self._config.max_batch_reply_bytes)
            except BatchRefused as exc:
                self._refuse_batch(parsed, exc)
                return
            sink: _Sink = _BatchSink(self, len(parsed), self._config.max_batch_reply_bytes)
            last = len(parsed) - 1
            for index, item in enumerate(parsed):
                await self._start(item, sink, index, size, more=index < last, budget=budgets[index],
                                  params_size=sizes[index] if sizes else None)
        else:
            await self._rate.take(1)
            await self._start(parsed, _SingleSink(self), 0, size, more=False, budget=None,
                              params_size=sizes[0] if sizes else None)

    def _refuse_batch(self, items: list[Item], exc: BatchRefused) -> None:
        """The whole batch is answered PAYLOAD_TOO_LARGE (each request by its id); nothing ran."""
        sink = _BatchSink(self, len(items), self._config.max_batch_reply_bytes)
        for index, item in enumerate(items):
            if isinstance(item, Call) and item.is_notification:
                sink.put(index, None, ())
                continue
            request_id = item.response_id if isinstance(item, Call) else item.id
            sink.put(index, error_for_code(request_id, RpcErrorCode.PAYLOAD_TOO_LARGE, exc.message, exc.data), ())

    async def _start(self, item: Item, sink: _Sink, index: int, frame_size: int, *, more: bool,
                     budget: int | None, params_size: int | None = None) -> None:
        if isinstance(item, Invalid):
            sink.put(index, error_for_code(item.id, RpcErrorCode.INVALID_REQUEST, item.reason), ())
            return
        if item.is_notification:
            # A request without an id cannot be answered, so its outcome could never be known: the host
            # runs none (protocol/README.md section 2: notifications are for events only).
            self.ignored_notifications += 1
            if self.ignored_notifications == 1:
                logger.warning("connection %d: ignored a notification (%s without an id); nothing was done",
                               self.id, item.method)
            sink.put(index, None, ())
            return
        if isinstance(item.params, list):
            sink.put(index, error_for_code(
                item.response_id, RpcErrorCode.INVALID_PARAMS,
                "params must be an object (named params); positional (array) params are not accepted",
                {"errors": [{"loc": "", "msg": "params must be an object", "type": "dict_type"}]}), ())
            return
        limit = self._config.max_params_bytes
        if frame_size > limit and (_params_size(item.params) if params_size is None else params_size) > limit:
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
        params = item.params
        if budget is not None and isinstance(params, dict) and "maxBytes" not in params:
            params = {**params, "maxBytes": budget}  # this entry's share of the batch's reply budget
        reserved = declared_bytes(item.method, params)
        try:
            self._in_flight.acquire_nowait()  # the usual case: room, and no task switch for it
        except trio.WouldBlock:
            await self._in_flight.acquire()
        try:
            await self._work.acquire(reserved)
            try:
                await self._shared_work.acquire(reserved)
            except BaseException:
                self._work.release(reserved)
                raise
        except BaseException:
            self._in_flight.release()
            raise
        answered = False

        def release() -> None:
            self._in_flight.release()
            self._work.release(reserved)
            self._shared_work.release(reserved)

        def reply(result: outcome.Outcome[Any]) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if isinstance(result, outcome.Value):
                value = result.value
                response = success(item.response_id, value)
                if not isinstance(value, Encoded):
                    # a read's or a mutation's (configSync.export's bundle, a queue entry's prompt)
                    if longer_than(value, REPLY_ON_LOOP):
                        self._encode_off_loop(sink, index, response, release)
                        return
                    # no string in it is long enough for the content path's care (BIG_STRING): plain orjson
                    release()
                    sink.put(index, response, ())
                    return
            else:
                assert isinstance(result, outcome.Error)
                response = error(item.response_id, result.error)
            release()
            sink.put(index, None if item.is_notification else response, ())

        assert self._ctx is not None
        try:
            await self._dispatcher.submit(item.method, params, self._ctx, reply, more=more, size=frame_size // 4)
        except BaseException as exc:
            if not answered:
                if isinstance(exc, Exception):
                    reply(outcome.Error(exc))
                else:
                    answered = True
                    self._in_flight.release()
                    self._work.release(reserved)
                    self._shared_work.release(reserved)
            raise

    def _encode_off_loop(self, sink: _Sink, index: int, response: dict[str, Any],
                         release: Callable[[], None]) -> None:
        """Encode a long reply in this connection's worker thread, then hand it to ``sink``; the request
        stays in flight (its budgets held) until then. A connection whose tasks are gone drops it."""
        nursery = self._nursery
        try:
            if nursery is None:
                raise RuntimeError("the connection is not serving")
            nursery.start_soon(self._encode_then_put, sink, index, response, release)
        except RuntimeError:  # its nursery closed: the peer left, nobody reads the reply
            release()
            return
        self._encoding += 1

    async def _encode_then_put(self, sink: _Sink, index: int, response: dict[str, Any],
                               release: Callable[[], None]) -> None:
        try:
            try:
                data = await trio.to_thread.run_sync(_encode_long, response, limiter=self._encoder)
            finally:
                release()
            sink.put(index, response, (), encoded=data)
        finally:
            self._encoding -= 1
            if not self._encoding and self._close_after is not None:
                self.close_after_queued(*self._close_after)

    def _connection_call(self, call: Call, after: list[Callable[[], None]]) -> Any:
        if call.method == "host.hello":
            raise RpcFailure("ALREADY_AUTHENTICATED", "host.hello was already accepted on this connection")
        if call.method == "events.subscribe":
            return self._subscribe(call.params, after)
        return self._unsubscribe(call.params)

    # -- events --------------------------------------------------------------
    def _subscribe(self, params: Any, after: list[Callable[[], None]]) -> dict[str, Any]:
        params = {} if params is None else params  # README §2: params left out count as {}
        if isinstance(params, dict) and params.get("sessionId") is not None:
            if is_native_id(params["sessionId"]):  # README §3: a native pi session has no host events
                raise unsupported_for_native("events.subscribe", params["sessionId"])
            validate_session_id(params["sessionId"])  # INVALID_ID before any other check
        request = SubscribeParams.model_validate(params)
        accept = self._plugin_scope(request.topics)
        if len(self._subs) >= self._config.max_subscriptions:
            raise RpcFailure("LIMIT_EXCEEDED", f"at most {self._config.max_subscriptions} subscriptions per connection")
        sub = self._bus.subscribe(request.topics, session_id=request.session_id, cursor=request.cursor,
                                  accept=accept)
        sub_id = f"sub-{sub.id}"
        scope = trio.CancelScope()
        ready = trio.Event()
        self._subs[sub_id] = (sub, scope)
        assert self._nursery is not None
        self._nursery.start_soon(self._pump, sub, sub_id, scope, ready)
        after.append(ready.set)  # events flow only after the response was queued
        return {"subscriptionId": sub_id, "cursor": sub.start_cursor}

    def _plugin_scope(self, topics: Iterable[str]) -> Callable[[Event], bool] | None:
        """A plugin connection is scoped to what its plugin owns (README §8.5): events are reads, so it may
        subscribe to ``settings.changed`` only and hears its own ``plugin:<id>`` namespace; any other topic
        (a user's session messages, other namespaces, providers, imports) is PERMISSION_DENIED. Other
        connections: no scope (None)."""
        plugin = self._ctx.plugin_id if self._ctx is not None else None
        if plugin is None:
            return None
        refused = sorted(set(topics) - _PLUGIN_TOPICS)
        if refused:
            raise RpcFailure("PERMISSION_DENIED", f"a plugin connection may subscribe to settings.changed only "
                             f"(its own namespace), not {', '.join(refused)}", data={"topics": refused})
        namespace = f"plugin:{plugin}"

        def own(event: Event) -> bool:
            return isinstance(event.data, dict) and event.data.get("ns") == namespace

        return own

    def _unsubscribe(self, params: Any) -> dict[str, Any]:
        sub_id = UnsubscribeParams.model_validate({} if params is None else params).subscription_id
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
                        await self._wait_event_room()
                        chunks = await self._event_frame(event, sub_id)
                        self.deliver(Frame(chunks, sum(len(c) for c in chunks)))
                except trio.EndOfChannel:
                    pass
                except SubscriberOverflow:
                    self._overflowed(sub)
                watch.cancel_scope.cancel()

    async def _event_frame(self, event: Event, sub_id: str) -> tuple[bytes, ...]:
        """The event's notification for this subscription. A long one's ``data`` (a queue of long prompts)
        is encoded once for every subscriber, in a worker thread (:func:`_encode_event_data`, shared through
        ``event.wire``), and sent as the middle piece of the frame (not copied); a short one is encoded here
        at once, no thread hop."""
        params: dict[str, Any] = {"topic": event.topic, "cursor": event.cursor, "subscriptionId": sub_id}
        if event.session_id is not None:
            params["sessionId"] = event.session_id
        if event.transient:
            params["transient"] = True
        wire = event.wire
        if wire.long is None:
            wire.long = longer_than(event.data, REPLY_ON_LOOP)
        if not wire.long:
            params["data"] = event.data
            return (trim(self._encode_event(params)),)
        data = await self._event_data(event)
        if not data:
            logger.error("event %s (cursor %s) has unserializable data", event.topic, event.cursor)
            params["data"] = {"error": RpcErrorCode.INTERNAL, "message": "event data could not be serialized"}
            return (trim(orjson.dumps(notification("event", params))),)
        head = orjson.dumps(notification("event", params))
        return head[:-2] + b',"data":', data, b"}}"

    async def _event_data(self, event: Event) -> bytes:
        """``event.data`` as JSON, encoded by the first subscriber that needs it (in this connection's worker
        thread); the others wait for it."""
        wire = event.wire
        while wire.data is None:
            if wire.ready is not None:
                await wire.ready.wait()
                continue
            ready = wire.ready = trio.Event()
            try:
                wire.data = await trio.to_thread.run_sync(_encode_event_data, event.data, limiter=self._encoder)
            finally:
                if wire.data is None:  # cancelled before its thread started: the next subscriber encodes it
                    wire.ready = None
                ready.set()
        return wire.data

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
