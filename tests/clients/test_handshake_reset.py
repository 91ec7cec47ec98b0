"""A host that resets the connection during the WebSocket handshake (killed as it started) is a closed
connection the SDK retries, not an exception that ends the client (the reference sidecar exited with
``anyio.BrokenResourceError`` when chaos killed a host right after it started)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import trio

from pihost_client._ws import WebSocketClosed, connect_websocket


@pytest.fixture
def resetting_server() -> Iterator[int]:
    """A TCP server that reads the upgrade request and resets the connection (RST, like a killed process)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.recv(4096)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        srv.close()


async def test_a_reset_during_the_handshake_is_a_closed_connection(resetting_server: int) -> None:
    with trio.fail_after(10):
        for _ in range(3):
            with pytest.raises(WebSocketClosed) as exc:
                await connect_websocket(f"ws://127.0.0.1:{resetting_server}/")
            assert exc.value.code is None and "handshake" in (exc.value.reason or "")
