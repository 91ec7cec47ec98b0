"""Raw WebSocket access to a real host for hostile-input tests (frames the typed client would never send)."""

from __future__ import annotations

import os
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from trio_websocket import WebSocketConnection, open_websocket_url

from actors.gateway_connection import close_transport


def hello_frame(token: str, client_id: str = "hostile", kind: str = "test") -> str:
    return orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "host.hello",
                         "params": {"token": token, "clientId": client_id, "clientKind": kind,
                                    "protocol": 1}}).decode()


@asynccontextmanager
async def raw_connection(url: str, token: str | None, **kwargs: Any) -> AsyncIterator[WebSocketConnection]:
    """A WebSocket to the host; with ``token``, ``host.hello`` already answered."""
    opened: list[WebSocketConnection] = []
    kwargs.setdefault("max_message_size", 256 * 1024 * 1024)
    try:
        async with open_websocket_url(url, **kwargs) as ws:
            opened.append(ws)
            if token is not None:
                await ws.send_message(hello_frame(token))
                answer = orjson.loads(await ws.get_message())
                assert "result" in answer, answer
            yield ws
    finally:
        for ws in opened:
            await close_transport(ws)


async def exchange(ws: WebSocketConnection, frame: str | bytes) -> Any:
    await ws.send_message(frame)
    return orjson.loads(await ws.get_message())


def request(method: str, params: Any, request_id: int = 1) -> str:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).decode()


def error_code(response: Any) -> str | None:
    err = response.get("error") if isinstance(response, dict) else None
    return err["data"]["code"] if err else None


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (``/proc/<pid>/status`` VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def rss_parts(pid: int) -> dict[str, int]:
    """``VmRSS``, ``RssAnon`` (heap: what the host allocated), ``RssFile`` (mapped files: SQLite's mmap)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(line.split()[1]) * 1024
    return out


def open_fds(pid: int, *, but_database: bool = False) -> int:
    """The process's open file descriptors. ``but_database``: not those on the index (``pi.sqlite`` and its
    ``-wal`` / ``-shm``): the read pool opens a connection as concurrent reads first need one, up to its size
    (``read_pool_size``), and keeps it, which is no leak."""
    names = os.listdir(f"/proc/{pid}/fd")
    if not but_database:
        return len(names)
    kept = 0
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:  # closed since the listing
            continue
        kept += not os.path.basename(target).startswith("pi.sqlite")
    return kept


def nofile_limit() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_NOFILE)
