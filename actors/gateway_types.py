"""Gateway configuration, per-connection call context and the dispatcher contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import outcome

from store.rules import MAX_BATCH_REPLY_BYTES, MAX_REPLY_BYTES

__all__ = ["GatewayConfig", "CallContext", "Dispatcher", "GatewayStatistics", "PROTOCOL_VERSION", "Reply"]

PROTOCOL_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 0
    token: str  # compared with hmac.compare_digest
    # Exact match; requests without Origin (non-browser) are allowed; "null" and
    # IP-literal origins are always refused.
    allowed_origins: frozenset[str] = field(default_factory=frozenset)
    # Bigger message -> close 1009 (trio-websocket measures len(): chars for text).
    max_frame_bytes: int = 4 * 1024 * 1024
    max_params_bytes: int = 2 * 1024 * 1024  # -> PAYLOAD_TOO_LARGE, connection stays
    max_batch: int = 1000
    # Per connection, encoded bytes waiting for the socket: past it the client is not
    # reading and is closed (1008 slow consumer). Frames are counted too, loosely.
    max_outbound_bytes: int = 32 * 1024 * 1024
    outbound_queue: int = 1024  # frames
    max_reply_bytes: int = MAX_REPLY_BYTES  # any one reply; a bigger one becomes PAYLOAD_TOO_LARGE
    max_batch_reply_bytes: int = MAX_BATCH_REPLY_BYTES  # one batch's replies together
    # Per connection, bytes that window and whole-transcript reads in flight may read
    # (each reserves its budget before it runs; reading frames waits beyond it).
    max_work_bytes: int = 16 * 1024 * 1024
    max_host_work_bytes: int = 32 * 1024 * 1024  # the same, all connections together
    # Encoded bytes queued by all connections together: past it, a connection with unread
    # frames is closed as a slow consumer (one with an empty queue may always send one frame).
    max_host_outbound_bytes: int = 64 * 1024 * 1024
    # Per connection: a frame the socket has not taken for this long (the peer reads nothing)
    # closes the connection as a slow consumer, however few bytes are queued.
    send_stall_timeout: float = 30.0
    max_in_flight: int = 256  # per connection; reading waits beyond it
    max_request_rate: float = 50_000.0  # requests per second per connection (token bucket); reading waits
    max_connections: int = 256  # authenticated connections
    max_unauthenticated: int = 128  # connections that have not said host.hello yet (oldest evicted)
    # TCP connections whose request head is not read yet, or whose plain HTTP request is being
    # answered (oldest evicted): bounds slow, silent and oversized heads before any upgrade.
    max_pending_heads: int = 64
    max_subscriptions: int = 64  # per connection
    handshake_timeout: float = 10.0
    hello_timeout: float = 5.0
    close_timeout: float = 5.0  # bound on the closing handshake
    # Keepalive (RELIABILITY.md row 12's ping timeout): after host.hello, a ping every ping_interval seconds;
    # a connection that sent nothing at all, not even the pong, ping_timeout seconds after a ping is closed
    # (1011). None: no pings.
    ping_interval: float | None = 20.0
    ping_timeout: float = 20.0

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("GatewayConfig.token must not be empty")
        for name in ("max_frame_bytes", "max_params_bytes", "max_batch", "outbound_queue",
                     "max_in_flight", "max_connections", "max_subscriptions", "max_outbound_bytes",
                     "max_reply_bytes", "max_batch_reply_bytes", "max_work_bytes", "max_unauthenticated",
                     "max_pending_heads", "max_host_work_bytes", "max_host_outbound_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"GatewayConfig.{name} must be >= 1")
        if (self.ping_interval is not None and self.ping_interval <= 0) or self.ping_timeout <= 0:
            raise ValueError("GatewayConfig.ping_interval and ping_timeout must be > 0")

    def __repr__(self) -> str:  # never print the token
        return (f"GatewayConfig(host={self.host!r}, port={self.port}, "
                f"allowed_origins={sorted(self.allowed_origins)!r}, ...)")


@dataclass(frozen=True, slots=True)
class CallContext:
    """Who is calling: fixed per connection after ``host.hello``."""

    connection_id: int
    client_id: str
    client_kind: str
    protocol: int
    plugin_id: str | None = None
    """Set for ``clientKind: "plugin"``: what the connection may touch is scoped to it."""


Reply = Callable[[outcome.Outcome[Any]], None]
"""Called exactly once with a request's outcome (in the trio thread, possibly before ``submit`` returns)."""


class Dispatcher(Protocol):
    async def submit(self, method: str, params: Any, ctx: CallContext, reply: Reply, *, more: bool = False,
                     size: int | None = None) -> None:
        """Start ``method``: return once the request is queued behind the earlier requests of its
        connection (submitted in frame order), without waiting for them, or was answered.
        ``reply`` gets a JSON-able result or an exception to translate. ``more``: further
        requests of the same JSON-RPC batch follow (a group-commit hint). ``size``: the params'
        JSON text is at most this many characters (its frame's length; ``None``: not known)."""
        ...

    def hello(self, ctx: CallContext) -> dict[str, Any]:
        """Extra fields for the ``host.hello`` result (``bootId``, ``hostVersion``...)."""
        ...

    def connected(self, ctx: CallContext) -> None:
        """The connection of ``ctx`` authenticated and is served (its ``disconnected`` follows)."""
        ...

    def disconnected(self, ctx: CallContext) -> None:
        """The connection of ``ctx`` closed: its requests not started yet need not run."""
        ...


@dataclass(frozen=True, slots=True)
class GatewayStatistics:
    connections: int
    accepted_total: int
    rejected_total: int
    slow_consumer_closes: int
    overflow_closes: int
    outbound_queued: int  # sum over live connections
    peak_outbound_queued: int  # max depth any connection's queue reached
    in_flight: int
    outbound_bytes: int = 0  # encoded bytes queued, sum over live connections
    peak_outbound_bytes: int = 0  # max bytes any connection's queue held
    unauthenticated: int = 0
    evicted_unauthenticated: int = 0
    oversized_replies: int = 0
    pending_heads: int = 0  # connections whose request head is not read (or plain HTTP answered) yet
    evicted_heads: int = 0  # of them, closed to make room for a newer one
    keepalive_closes: int = 0  # authenticated connections closed for a ping left unanswered
