"""Handshake refusals: Origin allow-list, DNS-rebinding Host check, connection cap, hello."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from trio.testing import wait_all_tasks_blocked
from trio_websocket import ConnectionClosed

from actors.gateway_handshake import check_host, check_origin
from tests.gateway.conftest import TOKEN, Harness, connect, frame, hello, hello_frame, raw_upgrade, recv, start_gateway

APP = "https://app.example"


@pytest.mark.parametrize(
    "origin",
    ["https://evil.example", "null", "http://127.0.0.1:1234", "http://[::1]:80", "https://app.example.evil"],
)
def test_check_origin_refuses(origin: str) -> None:
    refusal = check_origin([origin], frozenset({APP, "http://127.0.0.1:1234"}))
    assert refusal is not None and refusal.status == 403


def test_check_origin_accepts_allow_listed_and_absent() -> None:
    assert check_origin([APP], frozenset({APP})) is None
    assert check_origin([], frozenset()) is None
    assert check_origin([APP, APP], frozenset({APP})) is not None  # repeated header


@pytest.mark.parametrize("host", ["127.0.0.1:4000", "localhost:4000", "[::1]:4000", "LOCALHOST:4000"])
def test_check_host_accepts_loopback_with_port(host: str) -> None:
    assert check_host(host, 4000) is None


@pytest.mark.parametrize(
    "host", [None, "rebind.example:4000", "127.0.0.1:4001", "127.0.0.1", "localhost6:4000", "0.0.0.0:4000"])
def test_check_host_refuses(host: str | None) -> None:
    refusal = check_host(host, 4000)
    assert refusal is not None and refusal.status == 403


@pytest.fixture
async def app_harness(nursery: trio.Nursery) -> Harness:
    return await start_gateway(nursery, allowed_origins=frozenset({APP, "http://127.0.0.1:1234"}))


@pytest.mark.parametrize(
    "headers_for",
    [
        lambda p: {"Host": f"127.0.0.1:{p}", "Origin": "https://evil.example"},
        lambda p: {"Host": f"127.0.0.1:{p}", "Origin": "null"},
        lambda p: {"Host": f"127.0.0.1:{p}", "Origin": "http://127.0.0.1:1234"},  # IP literal, even if listed
        lambda p: {"Host": f"rebind.example:{p}"},
        lambda p: {"Host": f"127.0.0.1:{p + 1}"},
        lambda p: {"Host": f"localhost:{p}", "Origin": APP, "X-Other": "1"} | {"Origin": "https://evil.example"},
    ],
    ids=["evil-origin", "null-origin", "ip-origin", "rebind-host", "wrong-port", "evil-with-localhost"],
)
async def test_handshake_refused_with_403(app_harness: Harness, headers_for) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(10):
        assert await raw_upgrade(app_harness.port, headers_for(app_harness.port)) == 403
    assert app_harness.gateway.statistics().accepted_total == 0
    assert app_harness.gateway.statistics().rejected_total == 1


async def test_allow_listed_origin_and_no_origin_accepted(app_harness: Harness) -> None:
    with trio.fail_after(10):
        port = app_harness.port
        assert await raw_upgrade(port, {"Host": f"localhost:{port}", "Origin": APP}) == 101
        assert await raw_upgrade(port, {"Host": f"127.0.0.1:{port}"}) == 101
        async with connect(app_harness.url, extra_headers=[(b"Origin", APP.encode())]) as ws:
            result = await hello(ws)
        assert result["protocol"] == 1 and result["bootId"] == "boot-1"


async def test_first_request_must_be_hello(harness: Harness) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 7, "method": "echo", "params": {}}))
            response = await recv(ws)
            assert response["id"] == 7
            assert response["error"]["code"] == -32001
            assert response["error"]["data"]["code"] == "UNAUTHENTICATED"
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1008
    assert harness.dispatcher.enqueued == []  # nothing reached the dispatcher


async def test_wrong_token_is_refused_and_closed(harness: Harness) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await ws.send_message(hello_frame(token="wrong"))
            response = await recv(ws)
            assert response["error"]["data"]["code"] == "UNAUTHENTICATED"
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1008


@pytest.mark.parametrize("first", ["not json", "[]", '{"jsonrpc":"2.0","method":"host.hello","params":{}}'])
async def test_garbage_or_notification_before_hello_closes(harness: Harness, first: str) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await ws.send_message(first)
            response = await recv(ws)
            assert response["error"]["data"]["code"] == "UNAUTHENTICATED"
            with pytest.raises(ConnectionClosed):
                await ws.get_message()


async def test_no_hello_within_timeout_closes(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery, hello_timeout=0.05)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            response = await recv(ws)  # we send nothing
            assert response["error"]["data"]["code"] == "UNAUTHENTICATED"
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1008


async def test_second_hello_is_refused_but_connection_stays(harness: Harness) -> None:
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            await hello(ws)
            await ws.send_message(hello_frame(request_id=2))
            assert (await recv(ws))["error"]["data"]["code"] == "ALREADY_AUTHENTICATED"
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 3, "method": "echo", "params": {"n": 1}}))
            assert (await recv(ws))["result"] == {"n": 1}


async def test_authenticated_connection_cap_refuses_the_hello(nursery: trio.Nursery) -> None:
    """The cap counts authenticated connections: the third hello is BUSY and that connection closes."""
    h = await start_gateway(nursery, max_connections=2)
    with trio.fail_after(10):
        async with connect(h.url) as a:
            await hello(a)
            async with connect(h.url) as b:
                await hello(b)
                async with connect(h.url) as extra:
                    await extra.send_message(hello_frame())
                    refused = await recv(extra)
                    assert refused["error"]["data"]["code"] == "BUSY"
                    assert refused["error"]["data"]["retriable"] is True
                    with pytest.raises(ConnectionClosed):
                        await extra.get_message()
                while h.gateway.statistics().connections > 2:
                    await wait_all_tasks_blocked()
            while h.gateway.statistics().connections > 1:  # b's handler is finishing
                await wait_all_tasks_blocked()
            async with connect(h.url) as c:  # a freed slot is reusable
                await hello(c)
        assert h.gateway.statistics().rejected_total == 1


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"clientId": "c1", "clientKind": "browser-ext", "protocol": 1}, "INVALID_PARAMS"),
        ({"clientId": "a b\n", "clientKind": "cli", "protocol": 1}, "INVALID_PARAMS"),
        ({"clientId": "c1", "clientKind": "cli", "protocol": 2}, "UNSUPPORTED_PROTOCOL"),
        ({"clientId": "c1", "clientKind": "cli", "protocol": 1, "token": "LONE-SURROGATE"}, "UNAUTHENTICATED"),
    ],
)
async def test_bad_hello_params_close(harness: Harness, params: dict[str, object], code: str) -> None:
    body = {"token": TOKEN, **params}
    with trio.fail_after(10):
        async with connect(harness.url) as ws:
            text = frame({"jsonrpc": "2.0", "id": 1, "method": "host.hello", "params": body})
            await ws.send_message(text.replace("LONE-SURROGATE", "\\ud800"))
            response = await recv(ws)
            assert response["error"]["data"]["code"] == code
            with pytest.raises(ConnectionClosed):
                await ws.get_message()


async def test_silent_tcp_client_is_dropped_at_handshake_timeout(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery, handshake_timeout=0.05)
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", h.port)
        async with stream:
            await stream.send_all(b"GET / HTTP/1.1\r\n")  # slowloris: never finishes the request
            assert await stream.receive_some(4096) == b""  # the server hung up
    assert h.gateway.statistics().accepted_total == 0
