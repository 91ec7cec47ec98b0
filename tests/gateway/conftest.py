"""Shared harness for gateway tests: a fake in-memory dispatcher and a running gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import outcome
import pydantic
import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from actors.events import EventBus
from actors.gateway import Gateway, GatewayConfig
from actors.gateway_connection import close_transport
from actors.gateway_http import HttpSite
from actors.gateway_types import CallContext
from protocol.errors import MethodNotFound
from protocol.jsonrpc import Encoded
from store.errors import SessionNotFound, StorageFull

TOKEN = "t0ken-" + "x" * 58
SECRET = "SECRET-DETAIL-/etc/shadow"


class _Model(pydantic.BaseModel):
    sessionId: str
    limit: int


class CodedError(Exception):
    """Stands in for runtime.kernel.actor errors (ActorCrashed, Busy, AskTimeout): a string .code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class FakeDispatcher:
    """Records the order in which requests reach the 'actor' (the ordering point)."""

    enqueued: list[Any] = field(default_factory=list)
    contexts: list[CallContext] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)
    nursery: trio.Nursery | None = None

    def hello(self, ctx: CallContext) -> dict[str, Any]:
        return {"bootId": "boot-1", "hostVersion": "test"}

    def connected(self, ctx: CallContext) -> None:
        pass

    def disconnected(self, ctx: CallContext) -> None:
        self.gone.append(ctx.connection_id)

    async def submit(self, method: str, params: Any, ctx: CallContext, reply: Any, *, more: bool = False,
                     size: int | None = None) -> None:
        """Enqueue synchronously (the ordering point), answer later through ``reply``."""
        self.contexts.append(ctx)
        if method == "record":
            # Enqueue, then finish in REVERSE order: later requests complete first.
            self.enqueued.append(params["n"])
            assert self.nursery is not None
            self.nursery.start_soon(self._finish_record, params["n"], reply)
            return
        if method == "echo":
            self.enqueued.append(params)
        try:
            value = self._answer(method, params)
        except Exception as exc:
            reply(outcome.Error(exc))
        else:
            reply(outcome.Value(value))

    async def _finish_record(self, n: int, reply: Any) -> None:
        for _ in range(max(0, 50 - n)):
            await trio.lowlevel.checkpoint()
        reply(outcome.Value(n))

    def _answer(self, method: str, params: Any) -> Any:
        if method == "echo":
            return params
        if method == "encoded":  # a pre-encoded result (as session.get answers)
            return Encoded(orjson.dumps(params))
        if method == "validate":
            return _Model.model_validate(params).model_dump()
        if method == "fail.session":
            raise SessionNotFound("session s1 not found", data={"sessionId": "s1"})
        if method == "fail.full":
            raise StorageFull("disk full")
        if method == "fail.busy":
            raise CodedError("BUSY", "session actor mailbox is full")
        if method == "fail.restarted":
            raise CodedError("ACTOR_RESTARTED", "actor crashed and was restarted")
        if method == "fail.unexpected":
            raise RuntimeError(SECRET)
        raise MethodNotFound(method)


@dataclass
class Harness:
    gateway: Gateway
    bus: EventBus
    dispatcher: FakeDispatcher
    port: int
    config: GatewayConfig

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"


async def start_gateway(
    nursery: trio.Nursery, *, bus: EventBus | None = None, site: HttpSite | None = None, **overrides: Any
) -> Harness:
    config = GatewayConfig(token=TOKEN, **overrides)
    bus = bus or EventBus()
    dispatcher = FakeDispatcher(nursery=nursery)
    gateway = Gateway(config, dispatcher, bus, site)
    port = await nursery.start(gateway.serve)
    return Harness(gateway, bus, dispatcher, port, config)


@pytest.fixture
async def harness(nursery: trio.Nursery) -> Harness:
    return await start_gateway(nursery)


def frame(obj: Any) -> str:
    return orjson.dumps(obj).decode()


async def until_handled(h: Harness, count: int) -> None:
    """Until the gateway handed ``count`` echo requests to the dispatcher, or closed a connection as a slow
    consumer. ``wait_all_tasks_blocked`` alone no longer says so for a frame over ``DECODE_ON_LOOP``: its decode
    runs on a worker thread, and a task waiting for one counts as blocked."""
    while len(h.dispatcher.enqueued) < count and not h.gateway.statistics().slow_consumer_closes:
        await trio.testing.wait_all_tasks_blocked()
        if len(h.dispatcher.enqueued) < count:
            await trio.sleep(0.001)


def hello_frame(token: str = TOKEN, request_id: Any = 0) -> str:
    return frame(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "host.hello",
            "params": {"token": token, "clientId": "test-client", "clientKind": "test", "protocol": 1},
        }
    )


@asynccontextmanager
async def connect(url: str, **kwargs: Any) -> AsyncIterator[WebSocketConnection]:
    """``open_websocket_url`` that also closes the TCP stream when the server closed first."""
    opened: list[WebSocketConnection] = []
    try:
        async with open_websocket_url(url, **kwargs) as ws:
            opened.append(ws)
            yield ws
    finally:
        for ws in opened:
            await close_transport(ws)


async def take_the_rest(ws: WebSocketConnection) -> None:
    """Read what reached the client before the host closed it. trio-websocket's reader task hands each message
    to a channel of ``message_queue_size`` and waits while it is full, and leaving ``open_websocket`` waits for
    that task: a client that stopped reading would wait there until the test's deadline (seen under load: the
    reader had a message in hand when the close came)."""
    try:
        while True:
            await ws.get_message()
    except ConnectionClosed:
        pass


async def recv(ws: WebSocketConnection) -> Any:
    return orjson.loads(await ws.get_message())


async def hello(ws: WebSocketConnection) -> dict[str, Any]:
    await ws.send_message(hello_frame())
    response = await recv(ws)
    assert "result" in response, response
    return response["result"]


async def raw_upgrade(port: int, headers: dict[str, str]) -> int:
    """Send a hand-made upgrade request; return the HTTP status code of the answer."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        lines = [
            "GET / HTTP/1.1",
            *(f"{name}: {value}" for name, value in headers.items()),
            "Upgrade: websocket",
            "Connection: Upgrade",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13",
            "",
            "",
        ]
        await stream.send_all("\r\n".join(lines).encode())
        data = b""
        while b"\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
        return int(data.split(b" ")[1])


__all__ = [
    "connect",
    "Harness",
    "FakeDispatcher",
    "CodedError",
    "SECRET",
    "TOKEN",
    "start_gateway",
    "frame",
    "until_handled",
    "hello_frame",
    "recv",
    "hello",
    "raw_upgrade",
    "open_websocket_url",
]
