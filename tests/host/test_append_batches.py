"""JSON-RPC batches of appends to one session over the real gateway (issue 26): each entry validated
once, the whole batch one group commit (one write + one fdatasync), one index op, one reply frame;
a bad entry fails alone."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio

from actors.session import SessionActor
from tests.hostile.wire import raw_connection
from tests.hostkit import client_for, inprocess_host, msg

N = 64


def _entry(request_id: int, sid: str, message: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "session.appendMessage",
            "params": {"sessionId": sid, "message": message}}


@pytest.fixture(autouse=True)
def _no_split(monkeypatch: pytest.MonkeyPatch) -> None:
    # The linger's safety bounds (ticks, seconds) exist for a lost batch tail; lift them so a loaded
    # machine cannot split the batch and the test checks the batch path alone.
    monkeypatch.setattr(SessionActor, "linger_max_ticks", 10**9)
    monkeypatch.setattr(SessionActor, "linger_max_seconds", 60.0)


async def test_a_batch_of_64_is_one_fsync_one_index_op_and_one_reply_frame(tmp_path) -> None:
    """Reproduces the question of issue 26: does a batch of 64 appends cost one write + one
    fdatasync, one index op and one reply frame (not 64 of each)?"""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "batch"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("warm", "actor started")})
            async with raw_connection(host.url, host.token) as ws:
                frame = orjson.dumps([_entry(i, sid, msg(f"b{i}", f"text {i}")) for i in range(N)])
                host.faults.enabled = True  # count fault-point hits (no rule is armed: nothing fires)
                fsyncs = host.faults.hits("append.after_fsync")
                index_ops = host.services.index_log.acknowledged
                await ws.send_message(frame.decode())
                replies = orjson.loads(await ws.get_message())  # ONE frame holds every reply
            assert isinstance(replies, list) and len(replies) == N
            by_id = {r["id"]: r for r in replies}
            assert [by_id[i]["result"]["message"]["seq"] for i in range(N)] == list(range(2, N + 2))
            assert host.faults.hits("append.after_fsync") - fsyncs == 1
            assert host.services.index_log.acknowledged - index_ops == 1
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": N + 1})
            assert [m["id"] for m in got["messages"]] == ["warm", *(f"b{i}" for i in range(N))]


async def test_a_bad_entry_fails_alone_and_the_rest_is_one_group(tmp_path) -> None:
    """Reproduces: one invalid message in a batch of 64 must not fail (or split) its neighbours."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "batch"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("warm", "actor started")})
            entries = [_entry(i, sid, msg(f"b{i}", f"text {i}")) for i in range(N)]
            bad = 17
            entries[bad]["params"]["message"]["role"] = "not-a-role"
            async with raw_connection(host.url, host.token) as ws:
                host.faults.enabled = True
                fsyncs = host.faults.hits("append.after_fsync")
                await ws.send_message(orjson.dumps(entries).decode())
                replies = orjson.loads(await ws.get_message())
            by_id = {r["id"]: r for r in replies}
            assert len(by_id) == N
            assert by_id[bad]["error"]["data"]["code"] == "INVALID_PARAMS"
            good = [i for i in range(N) if i != bad]
            assert all("result" in by_id[i] for i in good)
            assert [by_id[i]["result"]["message"]["seq"] for i in good] == list(range(2, N + 1))
            assert host.faults.hits("append.after_fsync") - fsyncs == 1  # the 63 others: still one group
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": N + 1})
            assert [m["id"] for m in got["messages"]] == ["warm", *(f"b{i}" for i in good)]
