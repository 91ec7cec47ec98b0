"""A TCP relay to a host that a test can take down and bring back on the same port: the connection drops while
the host keeps running (same bootId), so a client's reconnect can resume at its cursor."""

from __future__ import annotations

import random
import socket
import threading


def free_port() -> int:
    """A port nothing listens on now, for a host a test restarts on the same port. Taken below the kernel's
    ephemeral range (32768-60999 on Linux): a port ``bind(0)`` gave back can go to the next outgoing connection of
    any process (a client, the Node harness) before the host binds it ("port ... is already in use", seen in a
    full run); one outside that range only an explicit bind takes."""
    for _ in range(200):
        port = random.randint(20_000, 32_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


class Relay:
    """A TCP relay to the host that can be taken down (listener and connections) and brought back on its port:
    the host stays up, so the client's reconnect finds the same boot and resumes at its cursor. (Sequential
    accepts: a handshake is read whole before the next connection is taken.)"""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._socks: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._socks += [client, upstream]
            # the host checks the Host header against its own port (DNS-rebinding defence): say the host's
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    break
                head += chunk
            upstream.sendall(head.replace(f"127.0.0.1:{self.port}".encode(), f"127.0.0.1:{self.target_port}".encode(),
                                          1))
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def down(self) -> None:
        if self._listener is None:
            return
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
        except OSError:
            pass
        self._listener.close()
        self._listener = None
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._socks.clear()
