"""A call to a host that froze with the connection open (SIGSTOP): its timeout, and the keepalive that finds it.

clients/python/README.md, "Time limits and callbacks": a call's ``timeout`` (else the client's ``call_timeout``)
ends it with a :class:`CallTimeout` that says whether the request was sent and so may have taken effect; the
keepalive (a WebSocket ping every ``keepalive_interval`` s, unanswered within ``keepalive_timeout`` s) closes a
connection whose host no longer answers, and the calls on it then wait at most ``reconnect_timeout``. Before,
a call sent to a stopped host waited until its caller cancelled it (there was neither a per-call bound nor a
keepalive). And ``RpcError.retriable`` says what the host said (``data.retriable``), as in the TypeScript client.
"""

from __future__ import annotations

import math
import os
import signal
from collections import Counter

import anyio
import pytest

from pihost_client import CallTimeout, HostUnavailable, RpcError
from tests.clients.test_client_holds_up import (
    BACKENDS,
    Host,
    fast,
    run,
    text_message,
)

SLACK = 30
"""Each bounded wait below must end well within this (a hang is what the fix removes)."""




@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_to_a_frozen_host_times_out_saying_whether_it_may_have_taken_effect(host: Host, backend: str) -> None:
    """The call's own ``timeout``, and the client's ``call_timeout`` for a call without one: a keyed write that
    was sent "may have taken effect" and names its submissionId, which applies it once when sent again; a read
    changes nothing; a call made when no connection is left was never sent. The client works once the host
    runs again."""

    async def body() -> None:
        await host.start()
        pid = host.current.proc.pid
        async with fast(host.data_dir, "frozen", keepalive_interval=None, reconnect_timeout=math.inf) as c:
            sid = (await c.session.create(title="Frozen"))["id"]
            os.kill(pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(SLACK):
                    with pytest.raises(CallTimeout) as write:
                        await c.session.append_message(session_id=sid, message=text_message("m1", "x"),
                                                       submission_id="frozen-m1", timeout=0.5)
                    with pytest.raises(CallTimeout) as read:
                        await c.session.get(session_id=sid, timeout=0.5)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert write.value.sent and write.value.may_have_taken_effect, write.value
            assert write.value.submission_id == "frozen-m1" and write.value.timeout == 0.5
            assert "may have taken effect" in str(write.value) and "'frozen-m1'" in str(write.value), write.value
            assert read.value.sent and not read.value.may_have_taken_effect and "changes nothing" in str(read.value)
            assert isinstance(write.value, TimeoutError)
            with anyio.fail_after(SLACK):
                again = await c.session.append_message(session_id=sid, message=text_message("m1", "x"),
                                                       submission_id="frozen-m1")
                assert again["message"]["id"] == "m1"
                page = await c.session.get(session_id=sid, full=True)
            assert Counter(m["id"] for m in page["messages"]) == {"m1": 1}
            assert not c._conn or not c._conn._slots, "a timed-out call left its reply slot behind"
        # the client-wide bound, on a call that passes none; math.inf lifts it for one call
        async with fast(host.data_dir, "frozen-default", keepalive_interval=None, call_timeout=0.5,
                        reconnect_timeout=math.inf) as d:
            os.kill(pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(SLACK):
                    with pytest.raises(CallTimeout) as default:
                        await d.session.rename(session_id=sid, title="Not yet")
                with anyio.move_on_after(1.5) as unbounded:
                    await d.session.list(timeout=math.inf)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert default.value.timeout == 0.5 and default.value.may_have_taken_effect, default.value
            assert unbounded.cancelled_caught  # waited past the client's 0.5 s
            with anyio.fail_after(SLACK):
                assert (await d.session.get(session_id=sid))["session"]["title"] in ("Frozen", "Not yet")
        # the host is gone: a call that finds no connection was never sent
        async with fast(host.data_dir, "gone", keepalive_interval=None, reconnect_timeout=math.inf) as e:
            await host.terminate()
            with anyio.fail_after(SLACK):
                while e.connected:  # noqa: ASYNC110 - the client reads the host's close frame in its own task
                    await anyio.sleep(0.05)
            with anyio.fail_after(SLACK), pytest.raises(CallTimeout) as unsent:
                await e.session.rename(session_id=sid, title="Never", timeout=0.5)
            assert not unsent.value.sent and not unsent.value.may_have_taken_effect
            assert "never sent" in str(unsent.value), unsent.value

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_keepalive_ends_a_call_to_a_frozen_host_without_any_timeout(host: Host, backend: str) -> None:
    """No ``timeout`` anywhere: the keepalive finds the host silent, closes the connection, and the call (retried
    on the next connection) ends with ``HostUnavailable`` after ``reconnect_timeout``; once the host runs again,
    the client reconnects by itself."""

    async def body() -> None:
        await host.start()
        pid = host.current.proc.pid
        async with fast(host.data_dir, "keepalive", keepalive_interval=0.2, keepalive_timeout=0.5,
                        reconnect_timeout=1) as c:
            sid = (await c.session.create(title="Keepalive"))["id"]
            await anyio.sleep(0.5)  # a few pings answered: a live host is left alone
            assert c.connects == 1
            os.kill(pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(SLACK), pytest.raises(HostUnavailable) as lost:
                    await c.session.get(session_id=sid)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert "keepalive" in str(lost.value), lost.value
            with anyio.fail_after(SLACK):
                while not c.connected:  # noqa: ASYNC110 - the client reconnects in its own task
                    await anyio.sleep(0.05)
                assert (await c.session.get(session_id=sid))["session"]["title"] == "Keepalive"
            assert c.connects == 2

    run(backend, body)


def test_retriable_is_what_the_host_says() -> None:
    """protocol/README.md section 3: "`error.data.retriable` is `true` when retrying the same request can
    succeed" (a batch entry that ran says so with a ``PAYLOAD_TOO_LARGE``); the code table decides only when the
    error carries no ``retriable``. The client said "retriable" for a ``BUSY`` the host called not retriable."""

    def error(data: dict[str, object]) -> RpcError:
        return RpcError.from_wire({"code": -32004, "message": "m", "data": data})

    assert error({"code": "PAYLOAD_TOO_LARGE", "retriable": True, "ran": True}).retriable is True
    assert error({"code": "BUSY", "retriable": False}).retriable is False
    assert error({"code": "BUSY"}).retriable is True
    assert error({"code": "SESSION_NOT_FOUND"}).retriable is False
