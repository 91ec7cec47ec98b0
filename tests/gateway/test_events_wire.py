"""Events over the wire: in-order delivery, gap-free resume, slow consumers closed, memory bounded."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from trio_websocket import ConnectionClosed, WebSocketConnection

from actors.events import EventBus
from tests.gateway.conftest import Harness, connect, frame, hello, recv, start_gateway, take_the_rest, until_handled


async def subscribe(ws: WebSocketConnection, params: dict[str, Any], request_id: int = 1) -> Any:
    await ws.send_message(frame({"jsonrpc": "2.0", "id": request_id, "method": "events.subscribe", "params": params}))
    return await recv(ws)


async def test_subscriber_sees_every_event_in_order(harness: Harness) -> None:
    harness.bus.publish("session.message", {"before": True})
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            response = await subscribe(ws, {"topics": ["session.message", "session.created"]})
            sub_id = response["result"]["subscriptionId"]
            assert response["result"]["cursor"] == 1
            for i in range(50):
                harness.bus.publish("session.message", {"i": i}, session_id="s1")
                harness.bus.publish("turn.started", {"i": i})
            notes = [await recv(ws) for _ in range(50)]
    assert all(n["method"] == "event" and "id" not in n for n in notes)
    params = [n["params"] for n in notes]
    assert [p["data"]["i"] for p in params] == list(range(50))
    assert [p["cursor"] for p in params] == list(range(2, 101, 2))
    assert {(p["topic"], p["subscriptionId"], p["sessionId"]) for p in params} == {("session.message", sub_id, "s1")}


async def test_resume_by_cursor_is_gap_free_across_connections(harness: Harness) -> None:
    seen: list[int] = []
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            await subscribe(ws, {"topics": ["session.message"]})
            for i in range(10):
                harness.bus.publish("session.message", {"i": i})
            seen += [(await recv(ws))["params"]["cursor"] for _ in range(6)]
        for i in range(10, 20):  # published while disconnected
            harness.bus.publish("session.message", {"i": i})
        async with connect(harness.url) as ws:
            await hello(ws)
            response = await subscribe(ws, {"topics": ["session.message"], "cursor": seen[-1]})
            assert "result" in response
            harness.bus.publish("session.message", {"i": 20})
            seen += [(await recv(ws))["params"]["cursor"] for _ in range(15)]
    assert seen == list(range(1, 22))


async def test_expired_cursor_and_unsubscribe(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery, bus=EventBus(backlog=3))
    for i in range(10):
        h.bus.publish("session.message", {"i": i})
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            expired = await subscribe(ws, {"topics": ["session.message"], "cursor": 2})
            assert expired["error"]["code"] == -32007
            assert expired["error"]["data"]["code"] == "CURSOR_EXPIRED"
            bad = await subscribe(ws, {"topics": "session.message"}, request_id=2)
            assert bad["error"]["code"] == -32602
            unknown = await subscribe(ws, {"topics": ["session.*"]}, request_id=22)
            assert unknown["error"]["data"]["code"] == "INVALID_PARAMS"
            bad_sid = await subscribe(ws, {"topics": ["session.message"], "sessionId": "../etc"}, request_id=3)
            assert bad_sid["error"]["data"]["code"] == "INVALID_ID"
            ok = await subscribe(ws, {"topics": ["session.message"]}, request_id=4)
            sub_id = ok["result"]["subscriptionId"]
            assert h.bus.statistics().subscribers == 1
            unsubscribe = {"jsonrpc": "2.0", "method": "events.unsubscribe", "params": {"subscriptionId": sub_id}}
            await ws.send_message(frame({**unsubscribe, "id": 5}))
            assert (await recv(ws))["result"] == {"ok": True}
            await ws.send_message(frame({**unsubscribe, "id": 55}))
            assert (await recv(ws))["error"]["data"]["code"] == "NOT_FOUND"
            assert h.bus.statistics().subscribers == 0
            h.bus.publish("session.message", {"after": True})
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 6, "method": "echo", "params": [6]}))
            assert (await recv(ws))["id"] == 6  # no event arrived in between


async def _until(predicate: Any) -> None:
    while not predicate():
        await trio.testing.wait_all_tasks_blocked()


async def test_slow_event_consumer_is_closed_and_memory_bounded(nursery: trio.Nursery) -> None:
    bus = EventBus(subscriber_queue=8)
    h = await start_gateway(nursery, bus=bus, outbound_queue=4, close_timeout=0.5)
    blob = {"blob": "x" * 256 * 1024}
    with trio.fail_after(20):
        # message_queue_size=1 and we never call get_message: the client stops reading the socket.
        async with connect(h.url, message_queue_size=1, max_message_size=2**30) as ws:
            await hello(ws)
            await subscribe(ws, {"topics": ["session.message"]})
            published = 0
            while h.gateway.statistics().overflow_closes == 0:
                assert published < 5000, "never disconnected"
                bus.publish("session.message", blob)
                published += 1
                await trio.testing.wait_all_tasks_blocked()
                stats = h.gateway.statistics()
                assert stats.outbound_queued <= 4
                assert bus.statistics().peak_subscriber_queue <= 8
            await _until(lambda: h.gateway.statistics().connections == 0)
            await take_the_rest(ws)
    assert bus.statistics().subscribers == 0
    assert h.gateway.statistics().peak_outbound_queued <= 4
    assert published > 8  # the socket buffers filled first; then the bounded queues


async def test_client_not_reading_responses_is_closed_as_slow_consumer(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery, outbound_queue=4, close_timeout=0.5, max_frame_bytes=2**20)
    params = {"blob": "y" * 256 * 1024}
    with trio.fail_after(20):
        async with connect(h.url, message_queue_size=1, max_message_size=2**30) as ws:
            await hello(ws)
            sent = 0
            try:
                while h.gateway.statistics().slow_consumer_closes == 0:
                    assert sent < 5000, "never disconnected"
                    await ws.send_message(frame({"jsonrpc": "2.0", "id": sent, "method": "echo", "params": params}))
                    sent += 1
                    await until_handled(h, sent)
                    assert h.gateway.statistics().outbound_queued <= 4
            except ConnectionClosed:
                pass
            await _until(lambda: h.gateway.statistics().connections == 0)
            await take_the_rest(ws)
    stats = h.gateway.statistics()
    assert stats.slow_consumer_closes == 1
    assert stats.peak_outbound_queued <= 4


async def test_unserializable_event_keeps_cursor_sequence(harness: Harness) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            await subscribe(ws, {"topics": ["session.message"]})
            harness.bus.publish("session.message", {"bad": object()})
            harness.bus.publish("session.message", {"good": 1})
            first, second = (await recv(ws))["params"], (await recv(ws))["params"]
    assert (first["cursor"], first["data"]["error"]) == (1, "INTERNAL")
    assert (second["cursor"], second["data"]) == (2, {"good": 1})


async def test_subscribe_and_unsubscribe_without_params_name_the_missing_field(harness: Harness) -> None:
    """README §2: params left out count as {}; these connection methods validated None (a 'dictionary'
    error at loc '') instead of naming the missing field."""
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            for method, field in (("events.subscribe", "topics"), ("events.unsubscribe", "subscriptionId")):
                await ws.send_message(frame({"jsonrpc": "2.0", "id": 5, "method": method}))
                error = (await recv(ws))["error"]
                assert error["data"]["code"] == "INVALID_PARAMS"
                assert [(e["loc"], e["type"]) for e in error["data"]["errors"]] == [(field, "missing")]
