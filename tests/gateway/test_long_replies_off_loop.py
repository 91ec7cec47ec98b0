"""Long mutation replies, long events and a long frame's params measure stay off the trio loop.

The never-block-the-loop audit found three pieces of work that grow with a payload still on the trio loop:
- a mutation's reply was encoded by the task that answered, whatever its length (``configSync.export``'s
  bundle of several MiB of base64: ~3.4 ms; ``session.queuePush`` / ``queueTake`` answers carrying a prompt
  of up to 1 MB);
- an event notification was encoded in each subscriber's pump, once per subscriber (a ``session.queue``
  event holds every entry's prompt: 8 prompts of 1 MB, ~5.4 ms per subscriber);
- a request frame longer than a quarter of the params cap had its params measured with orjson on the loop
  (~1.3 ms for 2 MB).
A reply or an event longer than ``REPLY_ON_LOOP`` is now encoded in the connection's worker thread (an event
once for all its subscribers); a long frame's params are measured in the thread that decodes it. Short ones
are encoded at once, without a thread hop.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import gateway_connection
from runtime.client import HostClient, RpcError
from tests.hostkit import client_for, inprocess_host, msg
from tests.threadkit import on_trio_thread

PROMPT = ("queued é \"q\"\n\u2028 " * 60_000)[:900_000]  # escapes and non-ASCII throughout


async def _push(c: HostClient, sid: str, content: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.queuePush", {
        "sessionId": sid, "principal": "ui", "content": content, "permissionMode": "ask"})
    return result


async def test_a_long_mutation_reply_is_encoded_in_a_worker_thread_and_a_short_one_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, bool]] = []
    encode = gateway_connection.encode

    def encode_seen(response: dict[str, Any], **kwargs: Any) -> bytes:
        data = encode(response, **kwargs)
        seen.append((len(data), on_trio_thread()))
        return data

    monkeypatch.setattr(gateway_connection, "encode", encode_seen)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "queue"}))["id"]
            long_one = await _push(c, sid, PROMPT)
            short_one = await _push(c, sid, "short")
    assert long_one["entry"]["content"] == PROMPT and short_one["entry"]["content"] == "short"
    long_ones = [on_trio for size, on_trio in seen if size > len(PROMPT)]
    short_ones = [on_trio for size, on_trio in seen if size < 64 * 1024]
    assert long_ones == [False], seen  # the long push's answer, in a worker thread
    assert len(short_ones) == 3 and all(short_ones), seen  # hello, create, the short push: on the loop


async def test_a_long_event_is_encoded_once_for_every_subscriber_in_a_worker_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[int, bool]] = []  # each event notification encoded whole: its length, on the loop?
    data_encodes: list[bool] = []  # each long event's data encoded once: on the loop?
    encode_event = gateway_connection.GatewayConnection._encode_event
    encode_data = getattr(gateway_connection, "_encode_event_data", None)

    def encode_event_seen(self: gateway_connection.GatewayConnection, params: dict[str, Any]) -> bytes:
        data = encode_event(self, params)
        events.append((len(data), on_trio_thread()))
        return data

    def encode_data_seen(data: Any) -> bytes:
        data_encodes.append(on_trio_thread())
        assert encode_data is not None
        return encode_data(data)

    monkeypatch.setattr(gateway_connection.GatewayConnection, "_encode_event", encode_event_seen)
    monkeypatch.setattr(gateway_connection, "_encode_event_data", encode_data_seen, raising=False)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "one") as a, \
                client_for(host, "two") as b:
            sid = (await a.call("session.create", {"title": "queue"}))["id"]
            for c in (a, b):
                await c.subscribe(["session.queue"], session_id=sid)
            await _push(a, sid, "short")
            await _push(a, sid, PROMPT)
            got = {}
            for c in (a, b):
                short, long = await c.next_event(), await c.next_event()
                assert [e["content"] for e in short.data["entries"]] == ["short"]
                got[c] = [e["content"] for e in long.data["entries"]]
                assert long.topic == "session.queue" and long.session_id == sid and long.cursor > short.cursor
    assert list(got.values()) == [["short", PROMPT]] * 2
    assert data_encodes == [False]  # once for both subscribers, in a worker thread
    assert len(events) == 2 and all(on_trio and size < 64 * 1024 for size, on_trio in events), events


async def test_a_long_frames_params_are_measured_in_a_worker_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[tuple[int, bool]] = []
    params_size = gateway_connection._params_size

    def params_size_seen(params: Any) -> int:
        size = params_size(params)
        measured.append((size, on_trio_thread()))
        return size

    monkeypatch.setattr(gateway_connection, "_params_size", params_size_seen)
    text = "x" * 600_000  # a frame longer than a quarter of the params cap: its params are measured
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", max_params_bytes=1_000_000) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "params"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("one", text)})
            with pytest.raises(RpcError) as refused:
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("over", text * 2)})
            got = await c.call("session.get", {"sessionId": sid})
    assert refused.value.data_code == "PAYLOAD_TOO_LARGE"
    assert [m["id"] for m in got["messages"]] == ["one"]
    assert len(measured) == 2 and not any(on_trio for _, on_trio in measured), measured
    assert measured[1][0] > 1_000_000 > measured[0][0]


async def test_a_close_after_the_queued_replies_waits_for_a_long_one_still_being_encoded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's stop closes each connection once what is queued was sent (``close_after_queued``); a long
    answer still in its worker thread then is sent before the close, not dropped (the client would have to
    ask again for a write that took effect)."""
    started, go = threading.Event(), threading.Event()
    encode_long = gateway_connection._encode_long

    def encode_held(response: dict[str, Any]) -> bytes:
        started.set()
        go.wait(30)
        return encode_long(response)

    monkeypatch.setattr(gateway_connection, "_encode_long", encode_held)
    answers: list[dict[str, Any]] = []
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "queue"}))["id"]

            async def push() -> None:
                answers.append(await _push(c, sid, PROMPT))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(push)
                await trio.to_thread.run_sync(started.wait, 30)
                host.gateway.close_connections(1001, "the host is shutting down")
                await trio.testing.wait_all_tasks_blocked()  # the close went out first unless it waits
                go.set()
    assert [a["entry"]["content"] for a in answers] == [PROMPT]


async def test_params_of_many_items_are_validated_in_a_worker_thread_and_a_usual_append_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validating params costs per item, not per character: a message of 4,096 empty text blocks (~107 KB of
    JSON) took 8-9 ms of pydantic on the trio loop (helper N's measure). Params of more than
    ``VALIDATE_ON_LOOP`` objects, arrays and items are validated in a worker thread; a usual append on the loop
    (no hop), and a refused one is answered alike either way."""
    from protocol.methods import METHODS
    from runtime import pipeline

    model = METHODS["session.appendMessage"].params_model
    validate = model.model_validate
    seen: list[tuple[int, bool]] = []

    def validate_seen(obj: Any, *args: Any, **kwargs: Any) -> Any:
        blocks = obj.get("message", {}).get("blocks") if isinstance(obj, dict) else None
        seen.append((len(blocks) if isinstance(blocks, list) else -1, on_trio_thread()))
        return validate(obj, *args, **kwargs)

    monkeypatch.setattr(model, "model_validate", validate_seen)
    many = [{"type": "text", "text": f"b{i}"} for i in range(4096)]
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "blocks"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "x", blocks=many)})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m2", "usual")})
            bad = [*many[:-1], {"type": "text", "text": 7}]
            with pytest.raises(RpcError) as refused:
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m3", "x", blocks=bad)})
            window = await c.call("session.get", {"sessionId": sid})
    assert refused.value.data_code == "INVALID_PARAMS", refused.value
    assert [m["id"] for m in window["messages"]] == ["m1", "m2"]
    assert len(window["messages"][0]["blocks"]) == 4096
    assert (4096, False) in seen and (1, True) in seen and (4096, True) not in seen, seen
    assert pipeline.VALIDATE_ON_LOOP < 4096


async def test_a_long_frame_reaches_the_socket_in_bounded_slices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One send is one task step, and the kernel takes as much as the socket's buffer holds (up to 4 MiB):
    a long reply or event went to the socket whole, ~1 ms of copying in one step of the trio loop (measured
    with a client in another process: a writer step's CPU time up to 0.65-1.08 ms, 0.35 ms sliced). A long
    frame's payload is handed to the socket in slices of at most ``SEND_SLICE`` bytes, and a batch's short
    replies are joined into sends of at most that many."""
    from actors import gateway_outbound
    from actors.gateway_http import PrefixedStream

    sizes: list[int] = []
    send_all = PrefixedStream.send_all

    async def send_all_seen(self: PrefixedStream, data: bytes | bytearray | memoryview) -> None:
        sizes.append(len(data))
        await send_all(self, data)

    monkeypatch.setattr(PrefixedStream, "send_all", send_all_seen)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "queue"}))["id"]
            answer = await _push(c, sid, PROMPT)
            long_sizes, sizes[:] = sizes[:], []
            mid = PROMPT[:40_000]  # each answer shorter than 64 KiB, eight together longer than a slice
            answers = await c.batch([("session.queuePush", {"sessionId": sid, "principal": "ui", "content": mid,
                                                             "permissionMode": "ask"})] * 7)
    assert answer["entry"]["content"] == PROMPT
    assert [a["entry"]["content"] for a in answers] == [mid] * 7
    assert sum(long_sizes) > 3 * gateway_outbound.SEND_SLICE, long_sizes  # the long answer went out
    assert max(long_sizes) <= gateway_outbound.SEND_SLICE, long_sizes
    assert sum(sizes) > gateway_outbound.SEND_SLICE, sizes  # the batch's answers, joined by slice
    assert max(sizes) <= gateway_outbound.SEND_SLICE, sizes
