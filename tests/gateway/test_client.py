"""runtime/client.py against a real gateway with the fake dispatcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from runtime.client import ClientClosed, HostInfoError, RpcError, open_client, read_host_info
from tests.gateway.conftest import TOKEN, Harness, start_gateway


async def test_call_batch_notify_and_errors(harness: Harness) -> None:
    with trio.fail_after(10):
        async with open_client(harness.url, TOKEN, client_id="cli-1") as client:
            assert client.hello["clientId"] == "cli-1" and client.hello["bootId"] == "boot-1"
            assert await client.call("echo", {"a": [1, 2]}) == {"a": [1, 2]}
            with pytest.raises(RpcError) as info:
                await client.call("fail.busy")
            assert (info.value.code, info.value.data_code, info.value.retriable) == (-32004, "BUSY", True)
            results = await client.batch([("echo", {"n": 1}), ("nope", None), ("echo", {"n": 3})])
            assert results[0] == {"n": 1} and results[2] == {"n": 3}
            assert isinstance(results[1], RpcError) and results[1].code == -32601
            await client.notify("echo", {"note": True})
            assert await client.call("echo", {"done": True}) == {"done": True}
    assert {"note": True} not in harness.dispatcher.enqueued  # a notification runs nothing (issue 25)
    assert {"done": True} in harness.dispatcher.enqueued
    assert {c.client_id for c in harness.dispatcher.contexts} == {"cli-1"}


async def test_events_via_client(harness: Harness) -> None:
    with trio.fail_after(10):
        async with open_client(harness.url, TOKEN, client_id="cli-2") as client:
            sub = await client.subscribe(["session.message"], session_id="s1")
            harness.bus.publish("session.message", {"n": 1}, session_id="s1")
            harness.bus.publish("session.message", {"n": 2}, session_id="s2")
            harness.bus.publish("session.message", {"n": 3}, session_id="s1")
            first = await client.next_event()
            assert (first.topic, first.data, first.session_id, first.subscription_id) == (
                "session.message", {"n": 1}, "s1", sub["subscriptionId"])
            async for event in client:
                assert event.data == {"n": 3} and event.cursor == 3
                break


async def test_wrong_token_raises_unauthenticated(harness: Harness) -> None:
    with trio.fail_after(10):
        with pytest.raises(RpcError) as info:
            async with open_client(harness.url, "nope", client_id="cli-3"):
                pytest.fail("must not get here")
    assert info.value.data_code == "UNAUTHENTICATED"


async def test_pending_call_fails_when_host_closes(nursery: trio.Nursery) -> None:
    h = await start_gateway(nursery, max_frame_bytes=1000)
    with trio.fail_after(10):
        async with open_client(h.url, TOKEN, client_id="cli-4") as client:
            with pytest.raises(ClientClosed) as info:
                await client.call("echo", {"blob": "x" * 5000})
            assert info.value.code == 1009
            with pytest.raises(ClientClosed):
                await client.call("echo", {})


def test_read_host_info(tmp_path: Path) -> None:
    (tmp_path / "host.token").write_text(TOKEN + "\n")
    (tmp_path / "host.json").write_text(
        json.dumps({"pid": 42, "url": "ws://127.0.0.1:5000/", "tokenFile": "host.token", "startedAt": "x"})
    )
    info = read_host_info(tmp_path)
    assert (info.url, info.token, info.pid) == ("ws://127.0.0.1:5000/", TOKEN, 42)
    assert TOKEN not in repr(info)
    (tmp_path / "host.token").unlink()
    with pytest.raises(HostInfoError):
        read_host_info(tmp_path)
    with pytest.raises(HostInfoError):
        read_host_info(tmp_path / "missing")
