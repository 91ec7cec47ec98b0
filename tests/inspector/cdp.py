"""Headless Chromium (Debian's package) driven through the DevTools protocol, for the inspector tests.

One browser per test, a fresh profile in a temporary directory; commands go
over the browser's DevTools WebSocket (trio-websocket), one page target at a
time (flattened sessions). Input is real input: clicks are mouse events at
the element's centre, typing is ``Input.insertText`` plus key events.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("headless Chromium is required (apt-get install chromium)")


class Page:
    def __init__(self, browser: Browser, session_id: str) -> None:
        self._browser = browser
        self.session_id = session_id

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._browser.send(method, params, session_id=self.session_id)

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})
        await self.wait("document.readyState === 'complete'")

    async def eval(self, expression: str) -> Any:
        res = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": True})
        if "exceptionDetails" in res:
            raise AssertionError(f"page error in {expression!r}: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def wait(self, expression: str, seconds: float = 20) -> Any:
        with trio.fail_after(seconds):
            while True:
                try:
                    value = await self.eval(expression)
                except AssertionError:
                    value = None
                if value:
                    return value
                await trio.sleep(0.05)

    async def click(self, selector: str) -> None:
        box = await self.wait(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return r.width && r.height ? {{x: r.x + r.width / 2, y: r.y + r.height / 2}} : null; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", {"type": kind, "x": box["x"], "y": box["y"],
                                                         "button": "left", "clickCount": 1})

    async def type(self, selector: str, text: str, *, enter: bool = False) -> None:
        await self.click(selector)
        await self.send("Input.insertText", {"text": text})
        if enter:
            for kind in ("keyDown", "keyUp"):
                await self.send("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                           "windowsVirtualKeyCode": 13, "text": "\r"})

    async def screenshot(self, path: Path) -> None:
        res = await self.send("Page.captureScreenshot", {"format": "png"})
        await trio.Path(path).write_bytes(base64.b64decode(res["data"]))


class Browser:
    def __init__(self, ws: WebSocketConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}

    async def reader(self) -> None:
        while True:
            message = json.loads(await self._ws.get_message())
            slot = self._waiting.pop(message.get("id"), None) if "id" in message else None
            if slot is not None:
                slot.send_nowait(message)

    async def send(self, method: str, params: dict[str, Any] | None = None, *,
                   session_id: str | None = None) -> dict[str, Any]:
        request_id = next(self._ids)
        send, recv = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[request_id] = send
        frame: dict[str, Any] = {"id": request_id, "method": method, "params": params or {}}
        if session_id is not None:
            frame["sessionId"] = session_id
        await self._ws.send_message(json.dumps(frame))
        with trio.fail_after(30):
            reply = await recv.receive()
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def new_page(self, width: int = 1400, height: int = 900) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        await page.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                               "deviceScaleFactor": 1, "mobile": False})
        return page


def _devtools_port(port_file: Path, seconds: float = 30) -> tuple[str, str]:
    """Chromium writes its DevTools port and browser path here once it listens."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            lines = port_file.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        if len(lines) >= 2:
            return lines[0], lines[1]
        time.sleep(0.05)
    raise TimeoutError("Chromium did not open its DevTools port")


@asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Browser]:
    """A headless Chromium with its own profile; its DevTools port is chosen by the browser.

    Chromium puts its process-singleton socket in a fresh ``org.chromium.Chromium.XXXXXX`` directory under
    TMPDIR and leaves it there when it is terminated (SIGTERM and ``Browser.close`` alike), so each browser
    gets a private TMPDIR, removed once the browser has exited. It is a short directory directly in the
    system temp directory, not under the test's tmp_path: the socket's path must fit a Unix socket address
    (108 bytes), which pytest's per-test paths can exceed.
    """
    scratch = Path(await trio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="pihost-chromium-")))
    try:
        async with _chromium_process(profile, scratch) as browser:
            yield browser
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutil.rmtree, scratch)


@asynccontextmanager
async def _chromium_process(profile: Path, scratch: Path) -> AsyncIterator[Browser]:
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = await trio.to_thread.run_sync(lambda: subprocess.Popen(
        [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
    try:
        port, path = await trio.to_thread.run_sync(_devtools_port, profile / "DevToolsActivePort")
        async with open_websocket_url(f"ws://127.0.0.1:{port}{path}", max_message_size=64 * 1024 * 1024) as ws:
            browser = Browser(ws)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(browser.reader)
                try:
                    yield browser
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        # shielded: a test that timed out (fail_after) still waits for its browser to exit, so no browser
        # outlives its test and the scratch directory is removed after the last write to it
        with trio.CancelScope(shield=True):
            proc.terminate()
            try:
                await trio.to_thread.run_sync(lambda: proc.wait(timeout=10))
            except subprocess.TimeoutExpired:
                proc.kill()
                await trio.to_thread.run_sync(proc.wait)
