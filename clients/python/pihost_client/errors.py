"""The client's connection errors: every one is a :class:`ConnectionLost`, never an exception group."""

from __future__ import annotations

__all__ = ["CallTimeout", "ConnectionLost", "HostNotRunning", "HostRefused", "HostUnavailable"]


class ConnectionLost(Exception):
    """The connection closed and the client does not (or may no longer) reconnect."""


class HostRefused(ConnectionLost):
    """The server refused this client in a way retrying cannot fix; the client stops at once. ``code``:
    ``UNAUTHENTICATED`` (a bad token) or ``UNSUPPORTED_PROTOCOL`` from ``host.hello``, on any connection; on the
    first connection also any other error ``host.hello`` answers that is not retriable (e.g. ``INVALID_PARAMS``
    for a malformed ``client_id``), and ``HANDSHAKE_REFUSED`` when the server answered the WebSocket handshake
    with an HTTP status other than 101 and 503 (``status``: 403 for an Origin or Host the host refuses; 200 or 404
    from a web server that is no host) or with no HTTP at all (``status`` None)."""

    def __init__(self, code: str, message: str, *, status: int | None = None) -> None:
        super().__init__(f"the host refused this client: {code}: {message}")
        self.code = code
        self.status = status


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


class CallTimeout(TimeoutError):
    """A call got no answer within its ``timeout`` (the call's own, else the client's ``call_timeout``), in
    seconds. The call gives up; the connection and the client go on.

    ``sent``: the request was written to a connection (by this try or an earlier one whose connection was
    lost), so the host may have received it. ``may_have_taken_effect``: it was sent and it is a mutating
    method; then send it again with the same ``submission_id`` (the typed methods always carry one): the host
    applies it at most once and answers a request it already applied from its receipt. A call that was never
    sent, and a read, changed nothing. A mutating call sent through :meth:`Client.call` without a
    ``submissionId`` cannot be retried safely: its message says so."""

    def __init__(self, method: str, timeout: float, *, sent: bool, mutating: bool,
                 submission_id: str | None) -> None:
        if not sent:
            outcome = "it was never sent (no connection): nothing took effect"
        elif not mutating:
            outcome = "it was sent; a read changes nothing: call it again"
        elif submission_id is not None:
            outcome = (f"it was sent and may have taken effect: send it again with the same submissionId "
                       f"({submission_id!r}) and the host applies it at most once")
        else:
            outcome = ("it was sent and may have taken effect; it carried no submissionId, so sending it again "
                       "may apply it twice")
        super().__init__(f"{method}: no answer within {timeout:g} s; {outcome}")
        self.method = method
        self.timeout = timeout
        self.sent = sent
        self.mutating = mutating
        self.submission_id = submission_id

    @property
    def may_have_taken_effect(self) -> bool:
        return self.sent and self.mutating
