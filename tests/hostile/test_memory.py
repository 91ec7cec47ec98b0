"""The memory bound (issue 18 "What it must show"): the worst batches the limits allow, against the
largest sessions, from a connection that never reads and one that does, keep the host's RSS growth
under 300 MB; an honest client on another connection keeps getting answers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import trio

from runtime.client import HostClient, RpcError, open_client
from store.rules import MAX_REPLY_BYTES
from tests.hostile.wire import hello_frame, raw_connection, rss_bytes, rss_parts
from tests.hostkit import msg, start_host_process
from tests.soak import soak

TEXT = "the quick brown fox jumps over the lazy dog " * 370  # ~16 KB per message
HUGE = "x" * (6 * 1024 * 1024)  # one message near the params limit (8 MiB)
BOUND = 300 * 1024 * 1024
# CI-sized: both sessions still hold more than one reply may carry (MAX_REPLY_BYTES, 16 MiB), so every capped
# reply is as large as the limits allow; PIHOST_SOAK=1 fills the full 48 MB of each.
MANY_COUNT = soak(1100, 3000)  # ~18 MB (CI) / ~48 MB (soak) of 16 KB messages
HUGE_COUNT = soak(3, 8)  # ~18 MB (CI) / ~48 MB (soak) in 6 MB messages


async def _fill(c: HostClient, sid: str, count: int, text: str, per_batch: int) -> None:
    for start in range(0, count, per_batch):
        calls = [("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"{i} {text}")})
                 for i in range(start, min(count, start + per_batch))]
        assert not [r for r in await c.batch(calls) if isinstance(r, RpcError)]


def _worst_frames(many: str, huge: str) -> list[str]:
    """The heaviest frames the limits accept, round robin."""
    def req(i: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": i, "method": method, "params": params}

    two_full = [req(1, "session.get", {"sessionId": many, "messageLimit": 5000, "maxBytes": MAX_REPLY_BYTES}),
                req(2, "session.get", {"sessionId": huge, "messageLimit": 5000, "maxBytes": MAX_REPLY_BYTES})]
    thousand = [req(i, "session.get", {"sessionId": many if i % 2 else huge, "messageLimit": 5000})
                for i in range(1000)]
    whole = [req(3, "session.context", {"sessionId": many}), req(4, "session.tree", {"sessionId": huge}),
             req(5, "session.get", {"sessionId": many, "full": True})]
    single = req(6, "session.get", {"sessionId": many, "messageLimit": 5000})
    return [orjson.dumps(f).decode() for f in (two_full, thousand, whole, single)]


async def test_worst_batches_keep_rss_growth_under_300_mb(tmp_path: Path) -> None:
    host = await trio.to_thread.run_sync(lambda: start_host_process(tmp_path, "--quiet"))
    try:
        with trio.fail_after(600):
            async with open_client(host.url, host.token, client_id="builder", client_kind="agent") as c:
                many = str((await c.call("session.create", {"title": "many"}))["id"])
                await _fill(c, many, MANY_COUNT, TEXT, 64)
                huge = str((await c.call("session.create", {"title": "huge"}))["id"])
                await _fill(c, huge, HUGE_COUNT, HUGE, 1)
                own = str((await c.call("session.create", {"title": "honest"}))["id"])
                await _fill(c, own, 100, "a short message", 50)
            await trio.sleep(1.0)
            baseline = rss_bytes(host.proc.pid)
            base_parts = rss_parts(host.proc.pid)
            peak = baseline
            peaks: dict[str, int] = dict(base_parts)
            done = trio.Event()

            async def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    parts = rss_parts(host.proc.pid)
                    peak = max(peak, parts["VmRSS"])
                    for k, v in parts.items():
                        peaks[k] = max(peaks[k], v)
                    await trio.sleep(0.01)

            frames = _worst_frames(many, huge)
            honest_latency: list[float] = []

            async def slow_consumer_closed() -> None:
                """Until the host closed a connection as a slow consumer (on a loaded machine the replies
                take longer than a fixed wait to pile up past the connection's byte bound)."""
                async with open_client(host.url, host.token, client_id="watch", client_kind="test") as w:
                    with trio.move_on_after(90):
                        while (await w.call("host.status", {}))["gateway"]["slowConsumerCloses"] < 1:  # noqa: ASYNC110
                            await trio.sleep(0.2)

            async def never_reads() -> None:
                try:
                    async with raw_connection(host.url, host.token, message_queue_size=1) as ws:
                        for i in range(40):
                            await ws.send_message(frames[i % len(frames)])
                        await trio.sleep(5)
                        await slow_consumer_closed()
                        # Drain what reached us, then the end: our reader is blocked on its full queue, so it
                        # would never see the host close the stream, and our own close would wait for it.
                        with trio.move_on_after(60):
                            while True:
                                await ws.get_message()
                except Exception:  # noqa: BLE001 - closed as a slow consumer (or its close timing out): expected
                    return

            async def reads_slowly() -> None:
                async with raw_connection(host.url, None, max_message_size=1 << 30) as ws:
                    await ws.send_message(hello_frame(host.token, "reader"))
                    await ws.get_message()
                    for i in range(12):
                        await ws.send_message(frames[i % len(frames)])
                        answer = orjson.loads(await ws.get_message())
                        assert answer is not None
                        await trio.sleep(0.05)

            async def honest() -> None:
                async with open_client(host.url, host.token, client_id="honest", client_kind="ui") as h:
                    while not done.is_set():
                        t0 = time.monotonic()
                        page = await h.call("session.get", {"sessionId": own, "messageLimit": 20,
                                                            "contentLimit": 200})
                        assert len(page["messages"]) == 20
                        await h.call("session.list", {"limit": 10})
                        honest_latency.append(time.monotonic() - t0)
                        await trio.sleep(0.05)

            async with trio.open_nursery() as n:
                n.start_soon(sample)
                n.start_soon(honest)
                attack_started = time.monotonic()
                async with trio.open_nursery() as attack:
                    attack.start_soon(never_reads)
                    attack.start_soon(reads_slowly)
                    attack.start_soon(never_reads)
                attack_seconds = time.monotonic() - attack_started
                await trio.sleep(0.5)
                done.set()
            growth = peak - baseline
            # RssFile is SQLite's mmap of pi.sqlite (clean pages of the page cache, mapped once per
            # read-pool connection); what the host allocates is the rest.
            allocated = growth - (peaks["RssFile"] - base_parts["RssFile"])
            worst = max(honest_latency)
            print(f"\nRSS baseline {baseline / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB, growth "
                  f"{growth / 2**20:.0f} MiB, of it allocated (not file-mapped) {allocated / 2**20:.0f} MiB "
                  f"(bound {BOUND / 2**20:.0f}); honest calls {len(honest_latency)}, "
                  f"slowest {worst * 1000:.0f} ms, attack {attack_seconds:.1f} s; " + ", ".join(
                      f"{k} {base_parts[k] / 2**20:.0f}->{peaks[k] / 2**20:.0f} MiB" for k in sorted(peaks)))
            assert allocated < BOUND, f"allocated RSS grew by {allocated / 2**20:.0f} MiB"
            # the honest client is answered all through the attack: no call waits 10 s, or, on a machine so
            # loaded that the attack itself takes minutes (other processes' load stretches both alike), a
            # quarter of the attack (a starved client would wait for all of it)
            assert len(honest_latency) >= 5 and worst < max(10.0, attack_seconds / 4), (
                f"an honest call waited {worst:.1f} s during a {attack_seconds:.1f} s attack")
            async with open_client(host.url, host.token, client_id="after", client_kind="test") as c:
                status = await c.call("host.status", {})
                assert status["gateway"]["slowConsumerCloses"] >= 1
                assert status["gateway"]["peakOutboundBytes"] <= 32 * 1024 * 1024 + 2 * MAX_REPLY_BYTES
        assert await trio.to_thread.run_sync(lambda: host.terminate(timeout=60)) == 0
    finally:
        await trio.to_thread.run_sync(host.kill9)
        for pipe in (host.proc.stdout, host.proc.stderr):
            if pipe is not None:
                pipe.close()
