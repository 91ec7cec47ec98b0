"""JSON-RPC over a real socket: error codes, the connection stays usable, batches, limits."""

from __future__ import annotations

from typing import Any

import orjson
import outcome
import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, WebSocketConnection

from tests.gateway.conftest import SECRET, TOKEN, Harness, connect, frame, hello, recv, start_gateway


def req(request_id: Any, method: str, params: Any = None) -> str:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        body["params"] = params
    return frame(body)


async def roundtrip(ws: WebSocketConnection, message: str | bytes) -> Any:
    await ws.send_message(message)
    return await recv(ws)


async def assert_usable(ws: WebSocketConnection) -> None:
    reply = await roundtrip(ws, req("ping", "echo", {"ok": True}))
    assert reply == {"jsonrpc": "2.0", "id": "ping", "result": {"ok": True}}


BAD_FRAMES = [
    ("{bad json", -32700, "PARSE_ERROR"),
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":1,"a":2}}', -32700, "PARSE_ERROR"),  # duplicate keys
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":[NaN]}', -32700, "PARSE_ERROR"),
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":' + "[" * 200 + "]" * 200 + "}", -32700, "PARSE_ERROR"),
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":[' + "9" * 5000 + "]}", -32700, "PARSE_ERROR"),
    ("[]", -32600, "INVALID_REQUEST"),
    ("42", -32600, "INVALID_REQUEST"),
    ('{"id":1,"method":"echo"}', -32600, "INVALID_REQUEST"),
    ('{"jsonrpc":"2.0","id":{"x":1},"method":"echo"}', -32600, "INVALID_REQUEST"),
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":"scalar"}', -32600, "INVALID_REQUEST"),
    # longer than DECODE_ON_LOOP: decoded in a worker thread, refused the same way
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":{"p":"' + "x" * 100_000 + '","a":1,"a":2}}', -32700,
     "PARSE_ERROR"),
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":["' + "x" * 100_000 + '",NaN]}', -32700, "PARSE_ERROR"),
    ('{"jsonrpc":"2.0","id":1,"method":"echo","params":["' + "x" * 100_000 + '\\ud800"]}', -32700, "PARSE_ERROR"),
]


@pytest.mark.parametrize(("message", "numeric", "code"), BAD_FRAMES)
async def test_bad_frames_get_right_code_and_connection_stays(
    harness: Harness, message: str, numeric: int, code: str
) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            response = await roundtrip(ws, message)
            assert response["error"]["code"] == numeric
            assert response["error"]["data"]["code"] == code
            await assert_usable(ws)
    assert harness.dispatcher.enqueued == [{"ok": True}]  # nothing bad reached the dispatcher


async def test_binary_frame_is_invalid_request(harness: Harness) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            response = await roundtrip(ws, req(1, "echo", {}).encode())
            assert (response["id"], response["error"]["code"]) == (None, -32600)
            await assert_usable(ws)


async def test_application_errors_map_to_codes(harness: Harness) -> None:
    expected = {
        "nope.nothing": (-32601, "METHOD_NOT_FOUND", False),
        "fail.session": (-32002, "SESSION_NOT_FOUND", False),
        "fail.full": (-32005, "STORAGE_FULL", True),
        "fail.busy": (-32004, "BUSY", True),
        "fail.restarted": (-32004, "ACTOR_RESTARTED", True),
        "fail.unexpected": (-32603, "INTERNAL", False),
    }
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            for method, (numeric, code, retriable) in expected.items():
                raw = await ws.send_message(req(method, method, {})) or await ws.get_message()
                response = orjson.loads(raw)
                assert response["id"] == method
                assert response["error"]["code"] == numeric
                assert response["error"]["data"]["code"] == code
                assert response["error"]["data"]["retriable"] is retriable
                assert SECRET not in raw and "Traceback" not in raw
            await assert_usable(ws)


async def test_invalid_params_from_validation_error(harness: Harness) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            response = await roundtrip(ws, req(5, "validate", {"sessionId": 3}))
            error = response["error"]
            assert error["code"] == -32602 and error["data"]["code"] == "INVALID_PARAMS"
            assert {e["loc"] for e in error["data"]["errors"]} == {"sessionId", "limit"}
            await assert_usable(ws)


async def test_notification_gets_no_response_and_runs_nothing(harness: Harness) -> None:
    """Issue 25 ("Wire and docs"): a notification (no ``id``) could run a method, e.g. create a session,
    though the reference says notifications are for events only. The host runs none: no reply, nothing
    reaches the dispatcher, the connection stays usable."""
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            await ws.send_message(frame({"jsonrpc": "2.0", "method": "echo", "params": {"note": 1}}))
            await ws.send_message(frame({"jsonrpc": "2.0", "method": "fail.unexpected", "params": {}}))
            await ws.send_message(frame([{"jsonrpc": "2.0", "method": "echo", "params": {"note": 2}}]))
            await trio.testing.wait_all_tasks_blocked()
            # Any response to them would have been queued before this ping's response.
            await assert_usable(ws)
    assert harness.dispatcher.enqueued == [{"ok": True}]


async def test_array_params_are_invalid_params(harness: Harness) -> None:
    """Issue 25 ("Wire and docs"): array ``params`` got a pydantic message; now a clear INVALID_PARAMS
    ("params must be an object") and nothing reaches the dispatcher."""
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            response = await roundtrip(ws, req(9, "echo", [1, 2]))
            error = response["error"]
            assert (response["id"], error["code"], error["data"]["code"]) == (9, -32602, "INVALID_PARAMS")
            assert "params must be an object" in error["message"]
            await assert_usable(ws)
    assert harness.dispatcher.enqueued == [{"ok": True}]


async def test_batch_one_frame_and_enqueue_order(harness: Harness) -> None:
    n = 40
    batch = [{"jsonrpc": "2.0", "id": i, "method": "record", "params": {"n": i}} for i in range(n)]
    batch.insert(7, {"jsonrpc": "2.0", "method": "record", "params": {"n": 1000}})  # notification
    batch.insert(3, {"jsonrpc": "1.0", "id": "bad", "method": "x"})
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            response = await roundtrip(ws, frame(batch))
            assert isinstance(response, list)  # one array frame
            assert [r.get("id") for r in response] == [0, 1, 2, "bad", *range(3, n)]
            assert [r["result"] for r in response if "result" in r] == list(range(n))
            assert response[3]["error"]["code"] == -32600
            await assert_usable(ws)
    # 'record' finishes in reverse order, yet requests reached the dispatcher in arrival order.
    assert harness.dispatcher.enqueued[:n] == list(range(n))  # the notification (n=1000) never ran


async def test_batch_over_limit_is_invalid_request(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery, max_batch=5)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            batch = [{"jsonrpc": "2.0", "id": i, "method": "echo"} for i in range(6)]
            response = await roundtrip(ws, frame(batch))
            assert response["error"]["code"] == -32600 and response["id"] is None
            await assert_usable(ws)
    assert h.dispatcher.enqueued == [{"ok": True}]


async def test_params_over_limit_is_payload_too_large(nursery: trio.Nursery) -> None:
    """Issue 25 ("Wire and docs", oversize frame): params over ``max_params_bytes`` in a frame that fits
    are answered PAYLOAD_TOO_LARGE and the connection stays (protocol/README.md section 7)."""
    h = await start_gateway(nursery, max_params_bytes=200, max_frame_bytes=10_000)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            response = await roundtrip(ws, req(1, "echo", {"blob": "x" * 500}))
            assert response["error"]["code"] == -32006
            assert response["error"]["data"] == {"code": "PAYLOAD_TOO_LARGE", "retriable": False, "limit": 200}
            await assert_usable(ws)
    assert h.dispatcher.enqueued == [{"ok": True}]


async def test_multibyte_params_over_limit_are_payload_too_large(nursery: trio.Nursery) -> None:
    """A text frame's length counts characters: params of 600 '€' (1,800 UTF-8 bytes) in a frame
    of about 640 characters passed a 1,000-byte cap (an 11 MB append passed the 8 MiB default)."""
    h = await start_gateway(nursery, max_params_bytes=1000, max_frame_bytes=10_000)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            response = await roundtrip(ws, req(1, "echo", {"blob": "\u20ac" * 600}))
            assert response["error"]["data"] == {"code": "PAYLOAD_TOO_LARGE", "retriable": False, "limit": 1000}
            await assert_usable(ws)
    assert h.dispatcher.enqueued == [{"ok": True}]


async def test_hello_with_array_params_is_invalid_params(harness: Harness) -> None:
    """README §2: array params are INVALID_PARAMS ('params must be an object'); hello said 'invalid token'."""
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await ws.send_message(req(0, "host.hello", [TOKEN, "c", "test", 1]))
            response = await recv(ws)
            assert response["error"]["data"]["code"] == "INVALID_PARAMS"
            assert "params must be an object" in response["error"]["message"]


async def test_an_integer_beyond_int64_is_a_parse_error_answered_with_the_request_id(harness: Harness) -> None:
    """README §2: a huge integer is PARSE_ERROR. Answered with id null, a client awaiting that call (a
    sidecar ending a turn with inputTokens 2**63) never got an answer: the frame is valid JSON otherwise,
    so its id is known and the answer carries it."""
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            big = '{"jsonrpc":"2.0","id":7,"method":"echo","params":{"n":9223372036854775808}}'
            response = await roundtrip(ws, big)
            assert (response["id"], response["error"]["data"]["code"]) == (7, "PARSE_ERROR")
            garbled = await roundtrip(ws, big.replace('"id":7', '"id":8')[:-1])
            assert (garbled["id"], garbled["error"]["data"]["code"]) == (None, "PARSE_ERROR")
            await assert_usable(ws)


async def test_a_request_nested_past_the_limit_is_a_parse_error_answered_with_the_request_id(
        harness: Harness) -> None:
    """README §2: very deep nesting is PARSE_ERROR. A request nested 65 levels (a settings value 63 deep)
    is well-formed JSON, so its id is known and the answer carries it: answered with id null, the client's
    call waited for ever. A deep one with a repeated "id" key (which id?), and one deeper than the JSON
    reader's own limit, are answered with id null; nothing ran."""
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            deep = '{"jsonrpc":"2.0","id":9,"method":"echo","params":{"v":' + "[" * 63 + "]" * 63 + "}}"
            response = await roundtrip(ws, deep)
            assert (response["id"], response["error"]["data"]["code"]) == (9, "PARSE_ERROR")
            twice = await roundtrip(ws, deep.replace('"id":9', '"id":9,"id":10'))
            assert (twice["id"], twice["error"]["data"]["code"]) == (None, "PARSE_ERROR")
            abyss = '{"jsonrpc":"2.0","id":11,"method":"echo","params":{"v":' + "[" * 2000 + "]" * 2000 + "}}"
            beyond = await roundtrip(ws, abyss)
            assert (beyond["id"], beyond["error"]["data"]["code"]) == (None, "PARSE_ERROR")
            await assert_usable(ws)
    assert harness.dispatcher.enqueued == [{"ok": True}]


async def test_oversized_frame_closes_1009_and_host_stays_up(nursery: trio.Nursery) -> None:
    """Issue 25 ("Wire and docs"): a frame over the frame limit closed the connection with 1009 though the
    reference promised PAYLOAD_TOO_LARGE. 1009 is the documented behaviour now (the standard WebSocket
    close for a message beyond the limit): the frame's request did not run, the host serves on."""
    h = await start_gateway(nursery, max_frame_bytes=1000)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            await ws.send_message(req(1, "echo", {"blob": "x" * 2000}))
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1009
        async with connect(h.url) as again:
            await hello(again)
            await assert_usable(again)
    assert h.dispatcher.enqueued == [{"ok": True}]


async def test_in_flight_is_bounded(nursery: trio.Nursery) -> None:
    """With max_in_flight=2, the third request waits; reading resumes when one completes."""
    h = await start_gateway(nursery, max_in_flight=2)
    gate = trio.Event()
    original = h.dispatcher.submit

    async def answer_when_open(params: Any, reply: Any) -> None:
        await gate.wait()
        reply(outcome.Value(params))

    async def gated(method: str, params: Any, ctx: Any, reply: Any, *, more: bool = False,
                    size: int | None = None) -> None:
        if method == "wait":
            h.dispatcher.enqueued.append(params)
            nursery.start_soon(answer_when_open, params, reply)
            return
        await original(method, params, ctx, reply, more=more, size=size)

    h.dispatcher.submit = gated  # type: ignore[method-assign]
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            for i in range(3):
                await ws.send_message(req(i, "wait", {"i": i}))
            while h.gateway.statistics().in_flight < 2:
                await trio.testing.wait_all_tasks_blocked()
            await trio.testing.wait_all_tasks_blocked()
            assert h.dispatcher.enqueued == [{"i": 0}, {"i": 1}]
            assert h.gateway.statistics().in_flight == 2
            gate.set()
            got = sorted([(await recv(ws))["id"] for _ in range(3)])
            assert got == [0, 1, 2]
            assert h.dispatcher.enqueued == [{"i": 0}, {"i": 1}, {"i": 2}]

