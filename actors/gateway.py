"""The WebSocket JSON-RPC gateway: handshake checks, connection cap, serving.

The gateway only translates between the wire and the dispatcher (ARCHITECTURE.md
"Gateway and protocol"). Pieces:

- ``gateway_types``      GatewayConfig, CallContext, Dispatcher, GatewayStatistics
- ``gateway_handshake``  pure Origin / Host checks of the upgrade request
- ``gateway_connection`` one connection: hello, requests, writer, event pumps
- ``gateway_http``       plain HTTP on the same port (health, readiness, the inspector)
- this module            listening, refusing (403 / 503), counting, statistics

Usage::

    port = await nursery.start(serve_gateway, config, dispatcher, bus)
"""

from __future__ import annotations

import itertools
import logging

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, wrap_server_stream

from actors.events import EventBus
from actors.gateway_connection import Counters, GatewayConnection
from actors.gateway_handshake import check_upgrade
from actors.gateway_http import HttpSite, PrefixedStream, is_websocket_upgrade, read_head
from actors.gateway_inbound import hand_over_without_yield
from actors.gateway_outbound import ByteBudget, SharedBytes
from actors.gateway_types import CallContext, Dispatcher, GatewayConfig, GatewayStatistics

__all__ = [
    "Gateway",
    "GatewayConfig",
    "GatewayStatistics",
    "CallContext",
    "Dispatcher",
    "serve_gateway",
]

logger = logging.getLogger(__name__)

# trio-websocket's own inbound message queue per connection; our reader drains it
# promptly, and in-flight limits give the real backpressure.
_INBOUND_QUEUE = 1
_RECEIVE_BUFFER = 64 * 1024  # bytes per socket read (trio-websocket's 4 KiB default makes a 1 MB batch 250 reads)


def _request_host(request: WebSocketRequest) -> str | None:
    """The ``Host`` header of the upgrade request.

    wsproto keeps Host out of ``request.headers`` and stores it on the underlying
    ``wsproto.events.Request``; trio-websocket 0.12 has no public accessor, so we
    read it there and fail closed if that ever changes. h11 already refuses a
    request with several Host headers.
    """
    event = getattr(request, "_event", None)
    host = getattr(event, "host", None)
    return host if isinstance(host, str) else None


class Gateway:
    """Serves :class:`GatewayConnection`s; one instance per host."""

    def __init__(self, config: GatewayConfig, dispatcher: Dispatcher, bus: EventBus,
                 site: HttpSite | None = None) -> None:
        self._config = config
        self._site = site
        self._dispatcher = dispatcher
        self._bus = bus
        self._counters = Counters()
        self._connections: dict[int, GatewayConnection] = {}
        self._ids = itertools.count(1)
        self._work = ByteBudget(config.max_host_work_bytes)  # window reads in flight, all connections
        self._outbound = SharedBytes(config.max_host_outbound_bytes)  # frames queued, all connections
        self._head_ids = itertools.count(1)
        self._pending_heads: dict[int, trio.CancelScope] = {}  # connections whose request is not read yet, oldest first
        self._accepting = 0  # handshakes being accepted (count toward the unauthenticated cap)
        self._unauthenticated: dict[int, GatewayConnection] = {}  # oldest first
        self._authenticated: set[int] = set()
        self._port: int | None = None
        self._closing = False
        self._none_left: trio.Event | None = None  # set when the last connection ended (``wait_closed``)

    @property
    def port(self) -> int | None:
        return self._port

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen; ``task_status.started(bound_port)`` once listening; run until cancelled."""
        config = self._config
        listeners = await trio.open_tcp_listeners(config.port, host=config.host)
        if len(listeners) != 1:
            for listener in listeners:
                await listener.aclose()
            raise RuntimeError(f"{config.host!r} resolves to {len(listeners)} addresses; give one address")
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle_stream, listeners)
            self._port = listeners[0].socket.getsockname()[1]
            logger.info("gateway listening on %s:%d", config.host, self._port)
            task_status.started(self._port)

    @property
    def accepting(self) -> bool:
        return not self._closing

    async def _handle_stream(self, stream: trio.SocketStream) -> None:
        """One TCP connection: plain HTTP is answered by the site, an upgrade becomes a WebSocket."""
        config = self._config
        try:
            prefixed = await self._read_request(stream)
        except Exception:
            # Nothing a peer sends before it is a WebSocket may take the listener (and the host) down.
            logger.exception("gateway: a plain HTTP request failed")
            prefixed = None
        if prefixed is None:
            await trio.aclose_forcefully(stream)
            return
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(config.handshake_timeout) as connect_scope:
                request = await wrap_server_stream(nursery, prefixed, message_queue_size=_INBOUND_QUEUE,
                                                   max_message_size=config.max_frame_bytes,
                                                   receive_buffer_size=_RECEIVE_BUFFER)
            if connect_scope.cancelled_caught:
                nursery.cancel_scope.cancel()
                await trio.aclose_forcefully(stream)
                return
            try:
                await self._handle(request)
            finally:
                nursery.cancel_scope.cancel()  # the connection's reader task
                await trio.aclose_forcefully(stream)

    async def _read_request(self, stream: trio.SocketStream) -> PrefixedStream | None:
        """Read the head of a new connection; answer plain HTTP here (``None``), or the stream with the
        head put back for the WebSocket handshake.

        Until its request is read (and, for plain HTTP, answered) a connection holds one of
        ``max_pending_heads`` slots, within ``handshake_timeout`` from its accept. When every slot
        is taken the oldest is closed: a flood of slow or silent sockets, oversized heads or
        dribbled ``POST /login`` bodies stays bounded in descriptors and memory and cannot lock
        out a client that sends its head at once (it is never the oldest for long).
        """
        config = self._config
        slot = next(self._head_ids)
        while len(self._pending_heads) >= config.max_pending_heads:
            oldest = next(iter(self._pending_heads))
            self._pending_heads.pop(oldest).cancel()
            self._counters.evicted_heads += 1
        scope = trio.CancelScope(deadline=trio.current_time() + config.handshake_timeout)
        self._pending_heads[slot] = scope
        try:
            with scope:
                head = await read_head(stream)
                if self._site is not None and not is_websocket_upgrade(head):
                    await self._site.serve(stream, head, self._port, config.handshake_timeout)
                    return None
                return PrefixedStream(stream, head)
        except (EOFError, ValueError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return None
        finally:
            self._pending_heads.pop(slot, None)
        return None  # evicted, or out of time

    async def _refuse(self, request: WebSocketRequest, status: int, reason: str) -> None:
        self._counters.rejected_total += 1
        logger.info("gateway refused a handshake from %s: %d %s", request.remote, status, reason)
        try:
            await request.reject(status, body=reason.encode("utf-8"))
        except ConnectionClosed:
            pass

    async def _handle(self, request: WebSocketRequest) -> None:
        refusal = check_upgrade(
            request.headers,
            _request_host(request),
            port=self._port,
            allowed_origins=self._config.allowed_origins,
        )
        if refusal is not None:
            await self._refuse(request, refusal.status, refusal.reason)
            return
        if self._closing:
            await self._refuse(request, 503, "the host is shutting down")
            return
        if not self._make_room_unauthenticated():
            await self._refuse(request, 503, "too many connections are opening; retry")
            return
        self._accepting += 1
        connection_id = next(self._ids)
        accepting = True
        try:
            try:
                ws = await request.accept()
            except ConnectionClosed:
                return
            hand_over_without_yield(ws)  # one task step per frame for trio-websocket's reader, not two
            self._accepting -= 1
            accepting = False
            self._counters.accepted_total += 1
            conn = GatewayConnection(ws, connection_id, self._config, self._dispatcher, self._bus, self._counters,
                                     self._work, self._outbound)
            conn.on_authenticated = self._admit_authenticated
            self._connections[connection_id] = conn
            self._unauthenticated[connection_id] = conn
            await conn.run()
        except Exception:
            # A bug in one connection must not take the host down.
            logger.exception("gateway connection %d failed", connection_id)
        finally:
            self._accepting -= int(accepting)
            self._connections.pop(connection_id, None)
            self._unauthenticated.pop(connection_id, None)
            self._authenticated.discard(connection_id)
            if not self._connections and self._none_left is not None:
                self._none_left.set()

    def _make_room_unauthenticated(self) -> bool:
        """Admission before ``host.hello``: its own small cap, separate from authenticated connections.

        When it is full, the oldest connection that has not said hello is closed (it had
        the longest to do so), so a flood of silent sockets cannot lock an honest client
        out: a client that says hello at once is never the oldest for long.
        """
        cap = self._config.max_unauthenticated
        while len(self._unauthenticated) + self._accepting >= cap:
            if not self._unauthenticated:
                return False  # every slot is a handshake still being accepted
            oldest_id = next(iter(self._unauthenticated))
            oldest = self._unauthenticated.pop(oldest_id)
            self._counters.evicted_unauthenticated += 1
            oldest.close(1008, "too many connections without host.hello")
        return True

    def _admit_authenticated(self, conn: GatewayConnection) -> str | None:
        """``host.hello`` succeeded: move ``conn`` under the authenticated cap (a refusal text if full)."""
        self._unauthenticated.pop(conn.id, None)
        if len(self._authenticated) >= self._config.max_connections:
            self._counters.rejected_total += 1
            return f"too many connections (at most {self._config.max_connections}); retry later"
        self._authenticated.add(conn.id)
        return None

    def stop_accepting(self) -> None:
        """Shutdown, first step: every new handshake is refused (503); open connections go on."""
        self._closing = True

    def close_connections(self, code: int, reason: str) -> None:
        """Close every open connection once what is queued for it was sent."""
        for conn in list(self._connections.values()):
            conn.close_after_queued(code, reason)

    async def wait_closed(self) -> None:
        """After :meth:`close_connections`: wait until every connection has ended, each within its
        ``close_timeout`` (the close frame and the peer's reply), at most that long in all.

        The host waits here before it cancels the gateway: a cancel would end each connection's
        WebSocket reader task first, and a close handshake without its reader waits out the whole
        ``close_timeout`` for a reply nobody reads (every open connection made a stop take 5 s more)."""
        with trio.move_on_after(self._config.close_timeout):
            while self._connections:
                self._none_left = trio.Event()
                await self._none_left.wait()

    def connection(self, connection_id: int) -> GatewayConnection | None:
        return self._connections.get(connection_id)

    def statistics(self) -> GatewayStatistics:
        conns = list(self._connections.values())
        return GatewayStatistics(
            connections=len(conns),
            accepted_total=self._counters.accepted_total,
            rejected_total=self._counters.rejected_total,
            slow_consumer_closes=self._counters.slow_consumer_closes,
            keepalive_closes=self._counters.keepalive_closes,
            overflow_closes=self._counters.overflow_closes,
            outbound_queued=sum(c.outbound_queued() for c in conns),
            peak_outbound_queued=self._counters.peak_outbound_queued,
            in_flight=sum(c.in_flight() for c in conns),
            outbound_bytes=sum(c.outbound_bytes() for c in conns),
            peak_outbound_bytes=self._counters.peak_outbound_bytes,
            unauthenticated=len(self._unauthenticated),
            evicted_unauthenticated=self._counters.evicted_unauthenticated,
            oversized_replies=self._counters.oversized_replies,
            pending_heads=len(self._pending_heads),
            evicted_heads=self._counters.evicted_heads,
        )


async def serve_gateway(
    config: GatewayConfig,
    dispatcher: Dispatcher,
    bus: EventBus,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a :class:`Gateway`; ``task_status.started(bound_port)`` once listening."""
    await Gateway(config, dispatcher, bus).serve(task_status=task_status)
