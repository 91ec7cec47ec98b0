"""A real HTTP server on 127.0.0.1 for provider tests: an OpenAI-compatible ``GET /v1/models``.

Runs ``http.server`` in a thread of the test process. It answers with what
the test set (models, a status, a raw body, a delay), records every request
(path and ``Authorization`` header) and stops on ``close()`` — or by itself
after ``lifetime`` seconds, so nothing outlives a test.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    models: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    body: bytes | None = None
    """Sent as is instead of the model list."""
    delay: float = 0.0
    """Seconds before answering (a stuck provider)."""
    api_key: str | None = None
    """When set, any other bearer token gets 401."""


class FakeProvider:
    def __init__(self, reply: Reply | None = None, *, lifetime: float = 120.0) -> None:
        self.reply = reply or Reply()
        self.requests: list[tuple[str, str | None]] = []
        self._release = threading.Event()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                provider.requests.append((self.path, self.headers.get("Authorization")))
                reply = provider.reply
                if reply.delay:
                    provider._release.wait(reply.delay)
                if reply.api_key is not None and self.headers.get("Authorization") != f"Bearer {reply.api_key}":
                    status, body = 401, b'{"error": {"message": "invalid api key"}}'
                elif self.path != "/v1/models":
                    status, body = 404, b'{"error": "not found"}'
                else:
                    status = reply.status
                    body = reply.body if reply.body is not None else json.dumps(
                        {"object": "list", "data": reply.models}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        self._timer = threading.Timer(lifetime, self.close)
        self._timer.daemon = True
        self._timer.start()
        self._closed = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._timer.cancel()
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
