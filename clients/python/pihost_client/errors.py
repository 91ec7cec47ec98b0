"""The client's connection errors: every one is a :class:`ConnectionLost`, never an exception group."""

from __future__ import annotations

__all__ = ["ConnectionLost", "HostNotRunning", "HostRefused"]


class ConnectionLost(Exception):
    """The connection closed and the client does not (or may no longer) reconnect."""


class HostRefused(ConnectionLost):
    """The host answered ``host.hello`` with an error retrying cannot fix (``code``: ``UNAUTHENTICATED`` for a
    bad token, ``UNSUPPORTED_PROTOCOL``); the client stops at once."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"the host refused this client: {code}: {message}")
        self.code = code


class HostNotRunning(ConnectionLost, OSError):
    """No host serves this data directory (``host.json`` missing, unreadable or left by a dead process;
    ``no_data_dir``: the directory itself does not exist)."""

    def __init__(self, message: str, *, stale_pid: int | None = None, no_data_dir: bool = False) -> None:
        super().__init__(message)
        self.stale_pid = stale_pid
        self.no_data_dir = no_data_dir
