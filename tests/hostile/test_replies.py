"""Replies bounded in bytes (issue 18 "Memory" findings), on the gateway and on a real host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from trio_websocket import ConnectionClosed

from runtime.client import HostClient, RpcError
from store.rules import MAX_BATCH_REPLY_BYTES, MAX_REPLY_BYTES
from tests.gateway.conftest import connect, frame, hello, recv, start_gateway, take_the_rest, until_handled
from tests.hostkit import client_for, inprocess_host, msg

# ---------------------------------------------------------------------------------------- gateway


async def test_outbound_queue_is_bounded_by_bytes_not_frames(nursery: trio.Nursery) -> None:
    """Finding "the outbound queue counts frames, not bytes" (and "60 pipelined calls on a connection that
    never reads grew RSS by about 1 GB"): with room for 1024 frames but 1 MiB of bytes, a client that
    pipelines 256 KiB replies without reading is closed once 1 MiB is queued."""
    h = await start_gateway(nursery, outbound_queue=1024, max_outbound_bytes=1 << 20, close_timeout=0.5,
                            max_frame_bytes=2**20)
    blob = {"blob": "y" * 256 * 1024}
    with trio.fail_after(20):
        async with connect(h.url, message_queue_size=1, max_message_size=2**30) as ws:
            await hello(ws)
            sent = 0
            try:
                while h.gateway.statistics().slow_consumer_closes == 0:
                    assert sent < 200, "never disconnected"
                    await ws.send_message(frame({"jsonrpc": "2.0", "id": sent, "method": "echo", "params": blob}))
                    sent += 1
                    await until_handled(h, sent)
            except ConnectionClosed:
                pass
            await take_the_rest(ws)
    stats = h.gateway.statistics()
    assert stats.slow_consumer_closes == 1
    assert stats.peak_outbound_bytes <= (1 << 20) + 300 * 1024  # the bound plus the frame that did not fit
    assert stats.peak_outbound_queued < 10  # far from the 1024-frame bound: bytes decided


async def test_each_reply_is_encoded_once_and_sent_as_it_is(nursery: trio.Nursery) -> None:
    """Finding "batch responses are held whole, encoded to one bytes object, copied to a str and copied
    again": every frame goes out on the zero-copy path (the orjson bytes are the payload; a batch's
    pieces are written one after the other, never joined) and the client reads valid JSON."""
    h = await start_gateway(nursery)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"v": "é" * 70000}}))
            assert (await recv(ws))["result"] == {"v": "é" * 70000}
            batch = [{"jsonrpc": "2.0", "id": i, "method": "echo", "params": {"i": i, "x": "x" * i}} for i in range(50)]
            await ws.send_message(frame(batch))
            answers = await recv(ws)
            assert sorted(a["id"] for a in answers) == list(range(50))
            conn = next(iter(h.gateway._connections.values()))
            for _ in range(500):  # the writer counts a frame once its last byte was handed over, which
                if conn.zero_copy_frames >= 3:  # can be after the client already read it
                    break
                await trio.sleep(0.01)
            assert conn.zero_copy_frames >= 3  # hello, the single reply, the batch


async def test_a_reply_over_the_reply_cap_is_payload_too_large(nursery: trio.Nursery) -> None:
    """Any one reply is capped: over ``max_reply_bytes`` the client gets PAYLOAD_TOO_LARGE for that id."""
    h = await start_gateway(nursery, max_reply_bytes=100_000, max_frame_bytes=2**20)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 7, "method": "echo", "params": {"v": "z" * 200_000}}))
            answer = await recv(ws)
            assert answer["id"] == 7 and answer["error"]["data"]["code"] == "PAYLOAD_TOO_LARGE"
            assert answer["error"]["data"]["limit"] == 100_000
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 8, "method": "echo", "params": {"v": "ok"}}))
            assert (await recv(ws))["result"] == {"v": "ok"}
    assert h.gateway.statistics().oversized_replies == 1


async def test_batch_replies_are_answered_within_the_batch_budget(nursery: trio.Nursery) -> None:
    """A batch's replies together stay within ``max_batch_reply_bytes``: entries past it are answered
    PAYLOAD_TOO_LARGE (small), the others whole, all in one array."""
    h = await start_gateway(nursery, max_batch_reply_bytes=300_000, max_frame_bytes=2**20)
    with trio.fail_after(10):
        async with connect(h.url) as ws:
            await hello(ws)
            batch = [{"jsonrpc": "2.0", "id": i, "method": "echo", "params": {"v": "q" * 50_000}} for i in range(20)]
            await ws.send_message(frame(batch))
            raw = await ws.get_message()
            assert len(raw) <= 300_000
            answers = orjson.loads(raw)
            ok = [a for a in answers if "result" in a]
            refused = [a for a in answers if "error" in a]
            assert len(answers) == 20 and 1 <= len(ok) <= 6 and len(refused) == 20 - len(ok)
            assert {a["error"]["data"]["code"] for a in refused} == {"PAYLOAD_TOO_LARGE"}
            # each of them ran (echo answered): a write among them took effect, so the error says so and a
            # retry with the same submissionId is the way to its answer (not a new intent: applied twice)
            assert all(a["error"]["data"]["ran"] is True and a["error"]["data"]["retriable"] is True
                       for a in refused)


async def test_pre_encoded_results_are_sent_from_their_own_bytes_and_capped(nursery: trio.Nursery) -> None:
    """Whole-history pages (issue 26 item 5): a pre-encoded result (``Encoded``, what ``session.get`` answers)
    goes out without being copied into an encoder's buffer, alone or in a batch, on the zero-copy path; the
    client reads the same JSON; over the reply cap it is PAYLOAD_TOO_LARGE like any other reply."""
    h = await start_gateway(nursery, max_reply_bytes=300_000, max_frame_bytes=2**20)
    big = {"v": "é" * 100_000, "n": [1, 2, 3]}  # a 200 KB payload: the large-frame path (chunks sent as they are)
    with trio.fail_after(10):
        async with connect(h.url, max_message_size=2**22) as ws:
            await hello(ws)
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 1, "method": "encoded", "params": big}))
            assert await recv(ws) == {"jsonrpc": "2.0", "id": 1, "result": big}
            batch = [{"jsonrpc": "2.0", "id": i, "method": "encoded", "params": {"i": i}} for i in range(3)]
            await ws.send_message(frame([*batch, {"jsonrpc": "2.0", "id": 9, "method": "echo", "params": {}}]))
            answers = await recv(ws)
            assert answers == [*({"jsonrpc": "2.0", "id": i, "result": {"i": i}} for i in range(3)),
                               {"jsonrpc": "2.0", "id": 9, "result": {}}]
            over = {"v": "z" * 400_000}
            await ws.send_message(frame({"jsonrpc": "2.0", "id": 2, "method": "encoded", "params": over}))
            answer = await recv(ws)
            assert answer["id"] == 2 and answer["error"]["data"]["code"] == "PAYLOAD_TOO_LARGE"
            assert answer["error"]["data"]["size"] > 400_000
            conn = next(iter(h.gateway._connections.values()))
            for _ in range(500):
                if conn.zero_copy_frames >= 4:
                    break
                await trio.sleep(0.01)
            assert conn.zero_copy_frames >= 4  # hello, the single reply, the batch, the refusal
    assert h.gateway.statistics().oversized_replies == 1


# ---------------------------------------------------------------------------------------- real host

TEXT = "lorem ipsum dolor sit amet " * 600  # ~16 KB per message


async def _big_session(c: HostClient, n: int, text: str = TEXT) -> str:
    sid = str((await c.call("session.create", {"title": "big"}))["id"])
    for start in range(0, n, 64):
        calls = [("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"{i} {text}")})
                 for i in range(start, min(n, start + 64))]
        results = await c.batch(calls)
        assert not [r for r in results if isinstance(r, RpcError)]
    return sid


async def test_whole_history_read_is_capped_and_streams_in_pages(tmp_path: Path) -> None:
    """Finding "a whole-history session.get has no byte cap": the whole transcript over the budget is
    PAYLOAD_TOO_LARGE naming the paging params; paging forward with messageEnd + maxBytes returns every
    message exactly once; a backward window over the budget is cut to the newest page."""
    with trio.fail_after(120):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = await _big_session(c, 300)  # ~5 MB
            for params in ({"full": True, "maxBytes": 1 << 20}, {"maxBytes": 1 << 20}):  # agent: whole by default
                with pytest.raises(RpcError) as exc:
                    await c.call("session.get", {"sessionId": sid, **params})
                assert exc.value.data_code == "PAYLOAD_TOO_LARGE"
                assert {"messageEnd", "maxBytes", "contentLimit"} <= set(exc.value.data["paging"])
                assert exc.value.data["limit"] == 1 << 20
            seen: list[str] = []
            end, pages = 0, 0
            while True:
                page = await c.call("session.get", {"sessionId": sid, "messageEnd": end, "maxBytes": 1 << 20})
                assert len(orjson.dumps(page)) <= 1 << 20
                seen += [m["id"] for m in page["messages"]]
                pages += 1
                end = page["messageEnd"]
                if not page["hasMoreAfter"]:
                    break
            assert seen == [f"m{i}" for i in range(300)] and pages >= 5
            back = await c.call("session.get", {"sessionId": sid, "messageLimit": 300, "maxBytes": 1 << 20})
            assert back["messages"][-1]["id"] == "m299" and back["hasMoreBefore"] is True
            assert back["messageStart"] == 300 - len(back["messages"]) and len(orjson.dumps(back)) <= 1 << 20
            around = await c.call("session.get", {"sessionId": sid, "messageAround": "m150", "messageLimit": 300,
                                                  "maxBytes": 200_000})
            ids = [m["id"] for m in around["messages"]]
            assert "m150" in ids and 5 <= len(ids) < 20
            small = await c.call("session.get", {"sessionId": sid, "messageLimit": 3})  # ordinary windows unchanged
            assert [m["id"] for m in small["messages"]] == ["m297", "m298", "m299"]


async def test_a_page_too_small_for_one_message_names_the_budget_that_holds_it(tmp_path: Path) -> None:
    """Paging forward with a small ``maxBytes`` stopped at a larger message with PAYLOAD_TOO_LARGE and no
    way on but guessing: the error names the smallest budget that holds that message, and a page with it
    returns it, so a reader goes on through every message exactly once."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            sid = str((await c.call("session.create", {"title": "mixed"}))["id"])
            texts = ["short"] * 3 + [TEXT] + ["short"] * 3  # one ~16 KB message among small ones
            for i, text in enumerate(texts):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", text)})
            seen: list[str] = []
            end, budget, raised = 0, 4_000, []
            while True:
                try:
                    page = await c.call("session.get", {"sessionId": sid, "messageEnd": end, "maxBytes": budget})
                except RpcError as exc:
                    assert exc.data_code == "PAYLOAD_TOO_LARGE" and exc.data["limit"] == budget
                    raised.append(exc.data["needed"])
                    assert 16_000 < exc.data["needed"] < 20_000
                    page = await c.call("session.get", {"sessionId": sid, "messageEnd": end,
                                                        "maxBytes": exc.data["needed"]})
                    assert [m["id"] for m in page["messages"]][:1] == ["m3"]
                    with pytest.raises(RpcError):  # one byte less does not hold it
                        await c.call("session.get", {"sessionId": sid, "messageEnd": end,
                                                     "maxBytes": exc.data["needed"] - 1})
                seen += [m["id"] for m in page["messages"]]
                end = page["messageEnd"]
                if not page["hasMoreAfter"]:
                    break
            assert seen == [f"m{i}" for i in range(len(texts))] and len(raised) == 1


async def test_batch_of_window_reads_shares_the_batch_budget(tmp_path: Path) -> None:
    """Finding "one 17.9 KB frame holding a batch of 150 session.get calls on a 9.5 MB session drove the
    host to 7.2 GB RSS and MemoryError; a 5.9 KB batch of 50 produced a 477 MB reply": the batch's reads
    share its budget (each a page of its share), its reply stays under MAX_BATCH_REPLY_BYTES; a batch
    whose declared budgets cannot fit is refused whole before any entry runs."""
    with trio.fail_after(180):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = await _big_session(c, 640)  # ~10 MB
            async with client_for(host, client_id="raw", kind="agent") as raw:
                results = await raw.batch([("session.get", {"sessionId": sid, "messageLimit": 5000})] * 150)
            pages = [r for r in results if not isinstance(r, RpcError)]
            assert len(pages) == 150
            assert sum(len(orjson.dumps(p)) for p in pages) <= MAX_BATCH_REPLY_BYTES
            assert all(p["hasMoreBefore"] and p["messages"][-1]["id"] == "m639" for p in pages)
            # declared budgets that cannot fit: refused whole, the append in the batch never ran
            calls: list[tuple[str, Any]] = [("session.get", {"sessionId": sid, "maxBytes": MAX_REPLY_BYTES})] * 3
            calls.append(("session.appendMessage", {"sessionId": sid, "message": msg("never", "x")}))
            refused = await c.batch(calls)
            assert all(isinstance(r, RpcError) and r.data_code == "PAYLOAD_TOO_LARGE" for r in refused)
            last = await c.call("session.get", {"sessionId": sid, "messageLimit": 1})
            assert last["messages"][0]["id"] == "m639" and last["totalMessages"] == 640


async def test_a_peer_that_reads_nothing_is_closed_by_time_under_the_byte_bound(nursery: trio.Nursery) -> None:
    """Found by scripts/chaos --mode fuzz: a client blocked in its own send (a big frame) while the host was
    blocked sending it events held the connection forever on both sides, with 1.1 MB queued, far under
    the 32 MiB byte bound. A frame the socket has not taken for ``send_stall_timeout`` closes the
    connection as a slow consumer; an honest connection meanwhile is unaffected."""
    h = await start_gateway(nursery, send_stall_timeout=1.0, max_frame_bytes=2**22)
    blob = {"blob": "s" * (1 << 20)}
    with trio.fail_after(30):
        async with connect(h.url, message_queue_size=1, max_message_size=2**30) as stuck, connect(h.url) as ok:
            await hello(stuck)
            await hello(ok)
            try:
                for i in range(20):  # 20 MiB of replies: more than the socket buffers hold, under the byte bound
                    await stuck.send_message(frame({"jsonrpc": "2.0", "id": i, "method": "echo", "params": blob}))
            except ConnectionClosed:
                pass  # on a loaded machine the host's stall can end the connection before all 20 are sent
            start = trio.current_time()
            while h.gateway.statistics().slow_consumer_closes == 0:
                assert trio.current_time() - start < 15, "never closed"
                await ok.send_message(frame({"jsonrpc": "2.0", "id": "ok", "method": "echo", "params": {"v": 1}}))
                assert (await recv(ok))["result"] == {"v": 1}
                await trio.sleep(0.2)
            assert h.gateway.statistics().peak_outbound_bytes < h.config.max_outbound_bytes
            await ok.send_message(frame({"jsonrpc": "2.0", "id": "after", "method": "echo", "params": {"v": 2}}))
            assert (await recv(ok))["result"] == {"v": 2}
            # What reached the stalled peer is whole frames, then the end: the host closed it in the middle of
            # a reply frame, so a close frame written after it would be read as that frame's payload (found on
            # a loaded machine: the peer failed with 1007, "'utf-8' codec can't decode byte 0x88", 0x88 being
            # the first byte of a close frame).
            while True:
                try:
                    await stuck.get_message()
                except ConnectionClosed:
                    break
            assert stuck.closed is not None and stuck.closed.code != 1007, stuck.closed
