"""The client's connection errors: every one is a :class:`ConnectionLost`, never an exception group."""

from __future__ import annotations

__all__ = ["ConnectionLost", "HostNotRunning", "HostRefused", "HostUnavailable"]


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


class HostUnavailable(ConnectionLost):
    """The connection was lost and no host answered within the client's ``reconnect_timeout`` (``waited``
    seconds; ``last_error``: why the last attempt failed). The call that waited gives up; the client keeps
    reconnecting in the background, so a later call works once the host is back. A mutating call that raised
    this may or may not have taken effect: send it again with the same ``submissionId`` and the host answers
    from its receipt instead of applying it twice."""

    def __init__(self, waited: float, last_error: BaseException | None) -> None:
        super().__init__(f"no connection to the host within {waited:g} s ({last_error or 'not connected'})")
        self.waited = waited
        self.last_error = last_error
