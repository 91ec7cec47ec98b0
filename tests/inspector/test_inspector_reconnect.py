"""The inspector while its host is gone, in real headless Chromium.

Reproduces issue 25's "the inspector grows without bound while its host is
gone": a failed ``connect()`` rejected in ``ws.onerror`` (``reconnect``'s catch
scheduled a retry in 2 s) while ``ws.onclose`` scheduled another in 1 s, so
every failed attempt started two retry chains; a page left open reached 11 GB
and hammered the host with attempts when it came back.

Here the page logs in to a real host, the host is SIGKILLed, and a loopback
listener takes its port: it counts the page's WebSocket upgrade requests and
refuses each (503). One chain with capped exponential backoff makes a handful
of attempts, spaced out, and the page's JS heap stays put; a host started
again on the same port (same data directory, same token) is found by the
next attempt.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
import trio

from runtime.client import open_client
from tests.hostkit import start_host_process
from tests.inspector.cdp import chromium

WINDOW = 15.0
"""Seconds the host stays away. Backoff from 1 s doubling (jitter: the upper half) allows 3 or 4 attempts."""


class RefusingListener:
    """Takes the host's port: counts WebSocket upgrade requests (their times) and refuses them with 503."""

    def __init__(self) -> None:
        self.attempts: list[float] = []

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            with trio.move_on_after(5):
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    head += chunk
            if b"upgrade: websocket" in head.lower():
                self.attempts.append(trio.current_time())
            try:
                await stream.send_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                      b"Connection: close\r\n\r\n")
            except trio.BrokenResourceError:
                pass


@pytest.mark.slow  # about 40 s: the host stays away for WINDOW seconds, then the page finds it again
async def test_inspector_retries_once_with_backoff_while_the_host_is_gone(tmp_path: Path) -> None:
    """Issue 25: one retry chain with capped backoff while the host is away, bounded heap, reconnects after."""
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    data = tmp_path / "data"
    host = start_host_process(data)
    try:
        port = int(host.url.rsplit(":", 1)[1].rstrip("/"))
        with trio.fail_after(120):
            async with open_client(host.url, host.token, client_id="reconnect-test", client_kind="agent") as c:
                await c.call("session.create", {"title": "Still here"})
                url = (await c.call("host.createLoginCode", {}))["url"]
            async with chromium(tmp_path / "profile") as browser:
                page = await browser.new_page()
                await page.goto(url)
                await page.wait("document.querySelectorAll('#sessions li').length === 1")
                await page.send("HeapProfiler.collectGarbage")
                heap_before = (await page.send("Runtime.getHeapUsage"))["usedSize"]

                listener = RefusingListener()
                killed = host
                await trio.to_thread.run_sync(lambda: (killed.kill9(), killed.proc.communicate()))
                async with trio.open_nursery() as nursery:
                    await nursery.start(functools.partial(trio.serve_tcp, listener.handle, port, host="127.0.0.1"))
                    await trio.sleep(WINDOW)
                    status = await page.eval("document.getElementById('status').textContent")
                    nursery.cancel_scope.cancel()

                attempts = listener.attempts
                gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
                assert 2 <= len(attempts) <= 5, f"{len(attempts)} attempts in {WINDOW} s, gaps {gaps}"
                assert all(g >= 0.4 for g in gaps), gaps
                # the n-th delay is a random point in [d/2, d], d = 1 s doubling to the 10 s cap (app.js), so
                # two neighbours can come out of order (5.12 s, then 5.10 s); each gap is at least its step's floor
                floors = [min(2.0 ** i, 10.0) / 2 for i in range(len(gaps))]
                assert all(g >= f * 0.95 for g, f in zip(gaps, floors, strict=True)), \
                    f"the backoff did not grow: gaps {gaps}, floors {floors}"
                assert f"waiting for a host on 127.0.0.1:{port}" in status, status
                await page.send("HeapProfiler.collectGarbage")
                heap_after = (await page.send("Runtime.getHeapUsage"))["usedSize"]
                assert heap_after - heap_before < 4 * 1024 * 1024, (heap_before, heap_after)

                host = await trio.to_thread.run_sync(lambda: start_host_process(data, "--port", str(port)))
                await page.wait("document.getElementById('status').textContent.startsWith('reconnected')",
                                seconds=30)
                await page.wait("document.querySelectorAll('#sessions li').length === 1")
    finally:
        if host.proc.poll() is None:
            host.terminate()
        host.proc.communicate()
