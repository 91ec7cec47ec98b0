"""Plain HTTP on the gateway's port: ``/healthz``, ``/readyz``, the browser inspector, its login.

The gateway reads the head of every new connection first (bounded in bytes
and time). A WebSocket upgrade goes on to trio-websocket with those bytes
put back in front of the stream (:class:`PrefixedStream`); anything else is
answered here with h11 and the connection is closed:

* ``GET /healthz`` → 200 while the process serves; ``GET /readyz`` → 200
  once boot finished and while the gateway accepts, 503 while it shuts down;
* ``GET /`` and the inspector's static files (``actors/inspector/``, read
  once at start; no build step, no network fetch at run time);
* ``POST /login`` ``{"code": ...}`` → ``{"token": ...}``: a one-time login
  code (``host.createLoginCode``, what ``pi-host open`` uses) exchanged for
  the bearer token, so the token never travels in a URL.

Every request must carry a loopback ``Host`` with the bound port (DNS
rebinding); a ``POST`` with an ``Origin`` must come from the host's own
origin. No response carries ``Access-Control-Allow-Origin``, so no other
origin can read one.
"""

from __future__ import annotations

import errno
import hmac
import json
import secrets
import socket
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import trio

from actors.gateway_handshake import check_host, self_origins

__all__ = ["HttpSite", "LoginCodes", "PrefixedStream", "read_head", "is_websocket_upgrade"]

MAX_HEAD_BYTES = 16 * 1024
_RECEIVE_SIZE = 64 * 1024  # a read without max_bytes (trio's SocketStream default)
MAX_BODY_BYTES = 4 * 1024
LOGIN_CODE_TTL = 60.0
MAX_LOGIN_CODES = 16
STATIC_DIR = Path(__file__).resolve().parent / "inspector"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


class LoginCodes:
    """One-time login codes: at most 16 outstanding, each valid for 60 s, redeemed once."""

    def __init__(self, clock: Callable[[], float], ttl: float = LOGIN_CODE_TTL) -> None:
        self._clock = clock
        self._ttl = ttl
        self._codes: OrderedDict[str, float] = OrderedDict()

    def issue(self) -> tuple[str, float]:
        code = secrets.token_urlsafe(24)
        expires = self._clock() + self._ttl
        self._codes[code] = expires
        while len(self._codes) > MAX_LOGIN_CODES:
            self._codes.popitem(last=False)
        return code, self._ttl

    def redeem(self, code: str) -> bool:
        now = self._clock()
        found = None
        for known in list(self._codes):
            if self._codes[known] < now:
                del self._codes[known]
            elif hmac.compare_digest(known.encode(), code.encode("utf-8", "replace")):
                found = known
        if found is None:
            return False
        del self._codes[found]
        return True


class PrefixedStream(trio.abc.Stream):
    """A stream whose first bytes were already read: they are returned again first.

    :meth:`send_nowait` hands bytes to the socket at once, without a task switch (an append's
    reply, when nothing else is being sent); what the socket did not take is kept as
    :attr:`unsent` and goes out first on the next :meth:`send_all` (whoever sends next:
    the gateway's writer, trio-websocket's pong or close), or on :meth:`flush`.

    :meth:`receive_some` on a plain socket waits until it is readable, then reads once: a
    client that sends one request and waits for its answer leaves nothing to read when its
    frame is done, and the socket stream's way (read first, wait on ``EAGAIN``, read again)
    cost every frame a failed ``recv`` and its exception. After a read that filled the buffer
    (more is likely waiting) it reads first, as the socket stream does.
    """

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix
        self._unsent = b""
        sock = getattr(stream, "socket", None)
        raw = getattr(sock, "_sock", None)  # a trio socket's stdlib socket (non-blocking); no public accessor
        self._sock: trio.socket.SocketType | None = sock if isinstance(raw, socket.socket) else None
        self._raw: socket.socket | None = raw if self._sock is not None else None
        self._receiving = False
        self._read_first = False  # the last read filled its buffer: read before waiting

    @property
    def unsent(self) -> int:
        """Bytes :meth:`send_nowait` accepted that the socket has not taken yet."""
        return len(self._unsent)

    def send_nowait(self, data: bytes) -> bool:
        """Start sending ``data`` now. ``False``: nothing was sent (no plain socket under this stream,
        bytes still unsent, the socket's buffer full or broken), the caller sends it the usual way.
        ``True``: the socket took ``data``, or part of it and the rest is :attr:`unsent`.

        The caller makes sure nobody is in :meth:`send_all` (trio-websocket's send lock is free)."""
        if self._raw is None or self._unsent or not data:
            return False
        try:
            sent = self._raw.send(data)
        except OSError:  # BlockingIOError included: nothing was sent
            return False
        if sent < len(data):
            self._unsent = data[sent:]
        return True

    async def flush(self) -> None:
        """Send what :meth:`send_nowait` left unsent. Cancelled, nothing is lost track of: each
        send either took bytes (and they are dropped from :attr:`unsent`) or none."""
        while self._unsent:
            assert self._sock is not None
            try:
                sent = await self._sock.send(self._unsent)
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc
            self._unsent = self._unsent[sent:]

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        if self._raw is None or self._read_first:
            data = bytes(await self._stream.receive_some(max_bytes))
            self._read_first = max_bytes is not None and len(data) >= max_bytes
            return data
        return await self._wait_then_receive(self._raw, max_bytes)

    async def _wait_then_receive(self, raw: socket.socket, max_bytes: int | None) -> bytes:
        size = _RECEIVE_SIZE if max_bytes is None else max_bytes
        if size < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        self._receiving = True
        try:
            while True:
                if raw.fileno() == -1:
                    raise trio.ClosedResourceError("the stream was closed")
                await trio.lowlevel.wait_readable(raw)  # the checkpoint (cancellable)
                try:
                    data = raw.recv(size)
                except BlockingIOError:
                    continue  # woken without data
                except OSError as exc:
                    if exc.errno == errno.EBADF:
                        raise trio.ClosedResourceError("the stream was closed") from None
                    raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
                self._read_first = len(data) >= size
                return data
        finally:
            self._receiving = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._unsent:
            await self.flush()
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()


async def read_head(stream: trio.abc.Stream) -> bytes:
    """Bytes up to and including the end of the request head (``\\r\\n\\r\\n``), bounded."""
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD_BYTES:
            raise ValueError("request head too large")
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise EOFError("the peer closed before a request")
        buf += chunk
    return bytes(buf)


def _headers(request: h11.Request) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in request.headers}


def is_websocket_upgrade(head: bytes) -> bool:
    """True when the head asks for a WebSocket (trio-websocket answers it, refusals included)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return False
    if not isinstance(event, h11.Request):
        return False
    headers = _headers(event)
    return b"websocket" in headers.get(b"upgrade", b"").lower()


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes
    content_type: str = "application/json"


def _json(status: int, obj: Any) -> _Response:
    return _Response(status, json.dumps(obj).encode() + b"\n")


class HttpSite:
    """The HTTP side of the gateway's port."""

    def __init__(self, *, token: str, codes: LoginCodes, ready: Callable[[], bool],
                 static: Mapping[str, bytes] | None = None) -> None:
        self._token = token
        self._codes = codes
        self._ready = ready
        self._static = dict(static) if static is not None else load_static()

    async def serve(self, stream: trio.abc.Stream, head: bytes, port: int | None, deadline_s: float) -> None:
        """Answer one plain HTTP request on ``stream`` (``head`` already read), then close."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        conn.receive_data(head)
        try:
            with trio.move_on_after(deadline_s):
                event = conn.next_event()
                if not isinstance(event, h11.Request):
                    response = _Response(400, b"bad request\n", "text/plain; charset=utf-8")
                else:
                    body = await self._body(conn, stream)
                    response = self.respond(event, body, port)
                await self._send(conn, stream, response, port)
        except (h11.RemoteProtocolError, h11.LocalProtocolError, ValueError):
            try:
                await self._send(h11.Connection(h11.SERVER), stream,
                                 _Response(400, b"bad request\n", "text/plain; charset=utf-8"), port)
            except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def _body(self, conn: h11.Connection, stream: trio.abc.Stream) -> bytes:
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                chunk = await stream.receive_some(4096)
                conn.receive_data(bytes(chunk))
                if not chunk:
                    break
                continue
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise ValueError("request body too large")
                continue
            break  # EndOfMessage (or a connection event)
        return bytes(body)

    def respond(self, request: h11.Request, body: bytes, port: int | None) -> _Response:
        headers = _headers(request)
        host = headers.get(b"host", b"").decode("latin-1") or None
        refusal = check_host(host, port)
        if refusal is not None:
            return _Response(403, f"{refusal.reason}\n".encode(), "text/plain; charset=utf-8")
        path = request.target.decode("latin-1").split("?", 1)[0]
        method = request.method.decode("latin-1")
        if path == "/login":
            if method != "POST":
                return _json(405, {"error": "POST a JSON object {\"code\": ...}"})
            origin = headers.get(b"origin")
            if origin is not None and origin.decode("latin-1") not in self_origins(port):
                return _json(403, {"error": "login is only accepted from the inspector's own origin"})
            return self._login(body)
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{method} is not served here"})
        if path == "/healthz":
            return _json(200, {"status": "ok"})
        if path == "/readyz":
            return _json(200, {"status": "ready"}) if self._ready() else _json(503, {"status": "shutting down"})
        name = "index.html" if path in ("/", "/index.html") else path.lstrip("/")
        data = self._static.get(name)
        if data is None:
            return _Response(404, b"not found\n", "text/plain; charset=utf-8")
        return _Response(200, data, _TYPES.get(Path(name).suffix, "application/octet-stream"))

    def _login(self, body: bytes) -> _Response:
        try:
            payload = json.loads(body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: 4 KB of "[" nests deeper than json allows
            return _json(400, {"error": "the body must be JSON"})
        code = payload.get("code") if isinstance(payload, dict) else None
        if not isinstance(code, str) or not code or not self._codes.redeem(code):
            return _json(403, {"error": "unknown, used or expired login code; run `pi-host open` again"})
        return _json(200, {"token": self._token})

    async def _send(self, conn: h11.Connection, stream: trio.abc.Stream, response: _Response,
                    port: int | None) -> None:
        ws = " ".join(f"ws://{o.split('://', 1)[1]}" for o in self_origins(port))
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "no-referrer"),
            ("Content-Security-Policy",
             f"default-src 'self'; connect-src 'self' {ws}; img-src 'self' data:; frame-ancestors 'none'"),
            ("Connection", "close"),
        ]
        data = conn.send(h11.Response(status_code=response.status, headers=headers))
        data = (data or b"") + (conn.send(h11.Data(data=response.body)) or b"")
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)


def load_static(root: Path = STATIC_DIR) -> dict[str, bytes]:
    """The inspector's files (blocking: call once at start, in a worker thread)."""
    files: dict[str, bytes] = {}
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if path.is_file() and path.suffix in _TYPES:
                files[path.name] = path.read_bytes()
    return files
