"""The TypeScript client as an app developer reads its README, against a real host process (Node with the ``ws``
package, through the harness of test_typescript_reconnect.py).

What that module leaves open and this one checks: a caller ending a call it no longer wants (a UI leaving a
page, an agent's step cancelled), with an ``AbortSignal``, while the call waits for its answer (the host is
stopped with SIGSTOP) and while it waits for a connection (the host is down); nothing is left waiting, the call
is not sent again, later calls work, and a keyed write that was already sent takes effect once. And an app
whose callbacks throw (``onEvent``, ``onState``, ``onResync``): the client goes on.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from pihost_client import connect
from tests.clients.relay import free_port
from tests.clients.test_clients_outsider import FakeServer
from tests.clients.test_deep_params import nest
from tests.clients.test_typescript_reconnect import (
    CAP_MS,
    INITIAL_MS,
    Line,
    Node,
    _call,
    _message,
    _started,
    _state,
    data_dir,
    harness,
)
from tests.hostkit import HostProcess, start_host_process

__all__ = ["data_dir", "harness"]  # the fixtures this module uses from the reconnect tests


def _abortable(node: Node, tag: str, method: str, **params: Any) -> Callable[[float], Line]:
    """Start a call with an AbortSignal (``node.run("abort", tag=tag)`` fires it); returns a function waiting (up to a
    timeout) for the line saying how it ended."""
    node.run("startAbortable", tag=tag, method=method, params=params)
    return lambda timeout: node.seen(lambda x: x.get("kind") == "done" and x.get("tag") == tag, timeout)


def _until(node: Node, want: dict[str, int], timeout: float = 10) -> dict[str, int]:
    """``pendingCalls`` once it is ``want`` (it changes as the client's own tasks run), else the last one seen."""
    deadline = time.monotonic() + timeout
    while True:
        got: dict[str, int] = node.run("pending")
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _ids(host: HostProcess, sid: str) -> list[str]:
    async def read() -> list[str]:
        async with connect(host.url, host.token, client_id="ts-outsider-reader") as c:
            page = await c.session.get(session_id=sid, full=True)
            return [m["id"] for m in page["messages"]]

    return anyio.run(read)


def _end(node: Node, host: HostProcess, *, stopped: bool = False) -> None:
    """Every test's end: the host continued if the test left it stopped (SIGSTOP), the Node harness stopped,
    the host stopped and reaped."""
    if stopped:
        os.kill(host.proc.pid, signal.SIGCONT)
    node.stop()
    host.terminate()
    host.proc.communicate()


def test_an_aborted_call_ends_at_once_and_leaves_the_client_working(harness: Path, data_dir: Path) -> None:
    """clients/typescript/README.md: "Aborting ends the call's wait (for a connection, for its answer, between
    retries) at once: it rejects with the signal's `reason` (an `AbortError` by default), is not sent again, and an
    answer that comes later is dropped. A mutating call that was already sent may have taken effect: send it again
    with the same `submissionId` to know", and "sending it again with the same `submissionId` gets the receipt's
    answer instead of applying it twice".

    The client had no way to end a call: ``call`` took no signal, and a request in flight ended only with its
    connection ("only a connection, never a timer, ends a request in flight"), so a call to a stalled host
    waited as long as the host did."""
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS})
    stopped = False
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS abort")
        # 1. waiting for its answer: the host is stopped, the request sent
        os.kill(host.proc.pid, signal.SIGSTOP)
        stopped = True
        answer = _abortable(node, "answer", "session.appendMessage", sessionId=sid, message=_message("m1"),
                            submissionId="ts-abort-1")
        assert _until(node, {"waiting": 0, "inFlight": 1}) == {"waiting": 0, "inFlight": 1}
        node.run("abort", tag="answer")
        done = answer(5)  # the host is still stopped: the abort alone ended it
        assert done.get("name") == "AbortError" and done["connectionLost"] is False, done
        assert _until(node, {"waiting": 0, "inFlight": 0}) == {"waiting": 0, "inFlight": 0}
        os.kill(host.proc.pid, signal.SIGCONT)
        stopped = False
        appended = node.run("append", sessionId=sid, id="m2", text="after the abort")
        assert isinstance(appended, int)
        # it had been sent: the same key answers once (from the receipt, or by applying it now), never twice
        again = _abortable(node, "again", "session.appendMessage", sessionId=sid, message=_message("m1"),
                           submissionId="ts-abort-1")(20)
        assert again.get("value", {}).get("message", {}).get("id") == "m1", again
        assert sorted(_ids(host, sid)) == ["m1", "m2"]
        assert not any(x.get("kind") == "done" and x.get("tag") == "answer" and x is not done for x in node.lines)

        # 2. waiting for a connection: the host is down
        assert host.terminate() == 0
        node.expect(_state("waiting"))
        waiting = _abortable(node, "waiting", "session.get", sessionId=sid)
        assert _until(node, {"waiting": 1, "inFlight": 0}) == {"waiting": 1, "inFlight": 0}
        node.run("abort", tag="waiting")
        done = waiting(5)
        assert done.get("name") == "AbortError" and done["elapsedMs"] < 5000, done  # not reconnectTimeoutMs
        assert _until(node, {"waiting": 0, "inFlight": 0}) == {"waiting": 0, "inFlight": 0}
        # 3. a write aborted while it waits for a connection is not sent once the host is back
        node.run("startAbortable", tag="late", method="session.rename",
                 params={"sessionId": sid, "title": "never sent"})
        node.run("abort", tag="late")
        host = start_host_process(data_dir, "--port", str(port))
        node.expect(_state("reconnected"), timeout=30)
        late = node.seen(lambda x: x.get("kind") == "done" and x.get("tag") == "late", 5)
        assert late.get("name") == "AbortError", late
        got = _abortable(node, "after", "session.get", sessionId=sid)(20)
        assert got.get("value", {}).get("session", {}).get("title") == "TS abort", got  # the rename never ran
        node.run("close")
        assert node.proc.wait(timeout=10) == 0  # no timer or listener left behind
    finally:
        _end(node, host, stopped=stopped)


def _event(message_id: str) -> Callable[[Line], bool]:
    return lambda x: x.get("kind") == "event" and x.get("messageId") == message_id


def test_callbacks_that_throw_end_neither_the_connection_nor_the_client(harness: Path, data_dir: Path) -> None:
    """clients/typescript/src/client.ts, ``onCallbackError``: "Such an exception never ends the connection or the
    client: the next events and answers are delivered as usual". An app's ``onEvent``, ``onState`` and
    ``onResync`` that throw (a rendering bug) while events flow, and across a host restart: every answer and
    every event still arrives, each exception is reported, the client reconnects and resyncs.

    The exception went up into the socket's message handler: under Node it ended the process (an uncaught
    exception), and with a global handler keeping it alive the socket read nothing more (the next call never
    got its answer)."""
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                throwInCallbacks=True)
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS throwing callbacks")
        node.run("subscribe", sessionId=sid)
        for i in range(3):
            node.run("append", sessionId=sid, id=f"a{i}", text="x")
        for i in range(3):
            node.seen(_event(f"a{i}"))
        reported = [x for x in node.lines if x.get("kind") == "callbackError"]
        assert {x["callback"] for x in reported} >= {"onEvent", "onState"}, reported
        host.kill9()
        host.proc.communicate()
        host = start_host_process(data_dir, "--port", str(port))
        node.expect(_state("reconnected"), timeout=30)
        node.run("append", sessionId=sid, id="a3", text="after the restart")
        node.seen(_event("a3"))
        assert any(x.get("kind") == "resync" for x in node.lines)
        assert any(x.get("kind") == "callbackError" and x["callback"] == "onResync" for x in node.lines)
        assert [x["messageId"] for x in node.lines if x.get("kind") == "event"] == ["a0", "a1", "a2", "a3"]
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        _end(node, host)


def test_a_keyed_write_killed_before_it_was_written_is_applied_once_with_its_first_answer(harness: Path,
                                                                                         data_dir: Path) -> None:
    """clients/typescript/README.md: "A mutating call carries a `submissionId`, so a call whose connection dropped
    before the answer is sent again with it after the reconnect and answered from the host's receipt (once: it
    resolves with the original answer [...])"; protocol/README.md section 4: "The same key used for a different
    request [...] fails with `IDEMPOTENCY_CONFLICT` and changes nothing", and section 3: "Clients should branch
    on [`error.data.code`]". The host is SIGKILLed before the append's line is written (test_typescript_reconnect
    kills it after): the resend on the restarted host applies it, once, no silent loss; the same key with other
    params is an ``RpcError`` whose ``dataCode`` says so."""
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS})
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS before the write")
        assert host.terminate() == 0
        host = start_host_process(data_dir, "--port", str(port), env={"RT_CRASHPOINT": "append.before_write:1:kill"})
        node.expect(_state("reconnected"), timeout=30)
        m1 = _started(node, "m1", "session.appendMessage", sessionId=sid, message=_message("m1"),
                      submissionId="ts-before-m1")
        assert host.reap(30) == -9
        host = start_host_process(data_dir, "--port", str(port))
        first = m1(30)
        assert "error" not in first, first
        assert first["value"]["message"]["id"] == "m1" and first["value"]["replayed"] is False, first
        again = _call(node, "session.appendMessage", sessionId=sid, message=_message("m1"), submissionId="ts-before-m1")
        assert again.get("value") == first["value"], again
        other = _call(node, "session.appendMessage", sessionId=sid, message=_message("m2"), submissionId="ts-before-m1")
        assert other.get("name") == "RpcError" and "IDEMPOTENCY_CONFLICT" in other["error"], other
        assert _ids(host, sid) == ["m1"]
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        _end(node, host)


def _timed(node: Node, tag: str, method: str, timeout_ms: int | None = None,
           **params: Any) -> Callable[[float], Line]:
    """Start a call (with its own ``timeoutMs`` when given); returns a function waiting for how it ended."""
    bound = {} if timeout_ms is None else {"timeoutMs": timeout_ms}
    node.run("start", tag=tag, method=method, params=params, **bound)
    return lambda timeout: node.seen(lambda x: x.get("kind") == "done" and x.get("tag") == tag, timeout)


def test_a_call_to_a_frozen_host_times_out_saying_whether_it_may_have_taken_effect(harness: Path,
                                                                                   data_dir: Path) -> None:
    """clients/typescript/README.md: a call's `timeoutMs` (else the client's `callTimeoutMs`) ends it with a
    `CallTimeout` that says whether the request was sent and so may have taken effect, and a keyed write sent again
    with the same `submissionId` is applied once; a call that finds no connection was never sent. And `retriable`
    is what the host says (`data.retriable`), the code table only when it says nothing (it ignored the host).

    A call sent to a stopped host (SIGSTOP, connection open) waited until its caller aborted it."""
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                callTimeoutMs=700, keepaliveIntervalMs=10**9, reconnectTimeoutMs=10**9)
    stopped = False
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        assert node.run("retriable", data={"code": "PAYLOAD_TOO_LARGE", "retriable": True, "ran": True}) is True
        assert node.run("retriable", data={"code": "BUSY", "retriable": False}) is False
        assert node.run("retriable", data={"code": "BUSY"}) is True
        sid = node.run("create", title="TS frozen")
        os.kill(host.proc.pid, signal.SIGSTOP)
        stopped = True
        write = _timed(node, "write", "session.appendMessage", 400, sessionId=sid, message=_message("m1"),
                         submissionId="ts-frozen-m1")(10)
        read = _timed(node, "read", "session.get", sessionId=sid)(10)  # the client's callTimeoutMs
        assert _until(node, {"waiting": 0, "inFlight": 0}) == {"waiting": 0, "inFlight": 0}
        os.kill(host.proc.pid, signal.SIGCONT)
        stopped = False
        assert write.get("name") == "CallTimeout" and write["timeoutMs"] == 400, write
        assert write["sent"] is True and write["mayHaveTakenEffect"] is True, write
        assert write["submissionId"] == "ts-frozen-m1" and "'ts-frozen-m1'" in write["error"], write
        assert "may have taken effect" in write["error"] and write["connectionLost"] is False, write
        assert read.get("name") == "CallTimeout" and read["timeoutMs"] == 700, read
        assert read["sent"] is True and read["mayHaveTakenEffect"] is False and "changes nothing" in read["error"]
        again = _timed(node, "again", "session.appendMessage", sessionId=sid, message=_message("m1"),
                         submissionId="ts-frozen-m1")(20)
        assert again.get("value", {}).get("message", {}).get("id") == "m1", again
        assert _ids(host, sid) == ["m1"]
        # the host is gone: a call that finds no connection was never sent
        assert host.terminate() == 0
        node.expect(_state("waiting"))
        unsent = _timed(node, "unsent", "session.rename", sessionId=sid, title="never")(10)
        assert unsent.get("name") == "CallTimeout" and unsent["sent"] is False, unsent
        assert unsent["mayHaveTakenEffect"] is False and "never sent" in unsent["error"], unsent
        node.run("close")
        assert node.proc.wait(timeout=10) == 0  # no timer left behind
    finally:
        _end(node, host, stopped=stopped)


def test_the_keepalive_ends_a_call_to_a_frozen_host_without_any_timeout(harness: Path, data_dir: Path) -> None:
    """clients/typescript/README.md: with the `ws` package the client pings every `keepaliveIntervalMs`; a host
    that answers nothing within `keepaliveTimeoutMs` is dropped, and a call on it (retried on the next connection)
    ends with `HostUnavailable` once `reconnectTimeoutMs` passes; the client reconnects when the host runs again."""
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                keepaliveIntervalMs=200, keepaliveTimeoutMs=500, reconnectTimeoutMs=1000)
    stopped = False
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS keepalive")
        time.sleep(0.6)  # pings answered: a live host is left alone
        assert not any(x.get("kind") == "state" and x.get("state") == "waiting" for x in node.lines), node.lines
        os.kill(host.proc.pid, signal.SIGSTOP)
        stopped = True
        lost = _timed(node, "lost", "session.get", sessionId=sid)(20)
        os.kill(host.proc.pid, signal.SIGCONT)
        stopped = False
        assert lost.get("name") == "HostUnavailable" and "keepalive" in (lost["lastError"] or ""), lost
        node.expect(_state("reconnected"), timeout=30)
        back = _timed(node, "back", "session.get", sessionId=sid)(20)
        assert back.get("value", {}).get("session", {}).get("title") == "TS keepalive", back
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        _end(node, host, stopped=stopped)


def test_a_reconnect_to_a_frozen_host_ends_its_handshake_and_tries_again(harness: Path, data_dir: Path) -> None:
    """clients/typescript/README.md, `handshakeTimeoutMs`: after the keepalive dropped a frozen host (SIGSTOP: the
    kernel still accepts its connections, nothing answers the WebSocket handshake), each reconnect attempt ends after
    `handshakeTimeoutMs` and the next follows the backoff; the client reconnects once the host runs again. A first
    connection to the frozen host fails as `HostNotRunning` naming the handshake (not after `connectTimeoutMs`).

    Before, nothing bounded the handshake (the `ws` package has no bound by default): the first reconnect attempt
    waited until the host ran again, with no second attempt and no state change (the Python client gives up after
    30 s)."""
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                keepaliveIntervalMs=200, keepaliveTimeoutMs=500, handshakeTimeoutMs=500, reconnectTimeoutMs=1000)
    stopped = False
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS handshake")
        os.kill(host.proc.pid, signal.SIGSTOP)
        stopped = True
        node.expect(lambda x: _state("waiting")(x) and "keepalive" in x["message"], timeout=20)

        def handshake_failed(x: Line) -> bool:
            return _state("waiting")(x) and "no WebSocket handshake within 500 ms" in x["message"]

        first, second = node.expect(handshake_failed, timeout=20), node.expect(handshake_failed, timeout=20)
        assert second["attempt"] == first["attempt"] + 1, (first, second)
        fresh = Node(harness, host.url, host.token, handshakeTimeoutMs=500, connectTimeoutMs=120_000)
        try:
            refused = fresh.expect(lambda x: x.get("kind") == "error", timeout=60)
        finally:
            fresh.stop()
        assert refused["name"] == "HostNotRunning", refused
        assert "no WebSocket handshake within 500 ms" in refused["message"], refused
        os.kill(host.proc.pid, signal.SIGCONT)
        stopped = False
        node.expect(_state("reconnected"), timeout=30)
        back = _timed(node, "back", "session.get", sessionId=sid)(20)
        assert back.get("value", {}).get("session", {}).get("title") == "TS handshake", back
        node.run("close")
        assert node.proc.wait(timeout=10) == 0  # no handshake timer left behind
    finally:
        _end(node, host, stopped=stopped)


@pytest.mark.parametrize(("reply", "expect"), [
    (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\nno way", 403),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 200),
    (b"SSH-2.0-OpenSSH_9.2\r\n", None),
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nfull", 503),
], ids=["http-403", "http-200", "not-http", "http-503"])
def test_a_refused_handshake_ends_the_first_connection_at_once(harness: Path, reply: bytes, expect: int | None) -> None:
    """clients/typescript/README.md, "The first connection" (the Python client's rule): a handshake answered with an
    HTTP status other than 101 and 503, or not in HTTP, is `HostRefused` (`HANDSHAKE_REFUSED`, `status`) at once,
    `waitForHost` or not; a busy host (503) is tried again until `connectTimeoutMs`, `waitForHost` or not. With
    `waitForHost` every failure was retried until `connectTimeoutMs`, and without it a 503 ended the client at
    once as `HostNotRunning`."""
    server = FakeServer(reply)
    node = Node(harness, f"ws://127.0.0.1:{server.port}/", "0" * 64, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                waitForHost=expect != 503, connectTimeoutMs=15000 if expect != 503 else 2000)
    try:
        failed = node.expect(lambda x: x.get("kind") == "error", timeout=30)
    finally:
        node.stop()
        server.close()
    if expect == 503:
        assert failed["name"] == "HostNotRunning" and "within 2000 ms" in failed["message"], failed
        assert len(server.conns) >= 2, len(server.conns)  # tried again
    else:
        assert failed["name"] == "HostRefused" and failed["code"] == "HANDSHAKE_REFUSED", failed
        assert failed["status"] == expect and failed["elapsedMs"] < 10000, failed
        assert ("no HTTP answer" if expect is None else f"HTTP {expect}") in failed["message"], failed
        assert len(server.conns) == 1, len(server.conns)


def _with(node: Node, tag: str, method: str, path: list[str | int], make: str, **params: Any) -> Line:
    """A call whose params hold, at ``path``, a value JSON lines cannot carry (the harness makes it: ``NaN``,
    ``bigint``, ``Map``, ``deep``...); how it ended."""
    node.run("startWith", tag=tag, method=method, params=params, path=path, value=make)
    return node.seen(lambda x: x.get("kind") == "done" and x.get("tag") == tag, 20)


def _subscribe_with(node: Node, place: str, make: str) -> Line:
    """``subscribe`` with a value the harness makes (see :func:`_with`) as a topic, the session id or the cursor."""
    tag = f"sub-{place}-{make}"
    node.run("subscribeWith", tag=tag, place=place, value=make)
    return node.seen(lambda x: x.get("kind") == "done" and x.get("tag") == tag, 20)


MEMBER, ITEM = (["value", "w"], "params.value.w"), (["value", "list", 1], "params.value.list[1]")
UNSENDABLE_TS = [
    # the value the harness makes, what the message names, where it is put
    ("NaN", "NaN", (MEMBER, ITEM)), ("Infinity", "Infinity", (MEMBER, ITEM)), ("-Infinity", "-Infinity", (MEMBER,)),
    ("bigint", "a bigint", (MEMBER, ITEM)), ("Map", "a Map", (MEMBER, ITEM)), ("Set", "a Set", (ITEM,)),
    ("Uint8Array", "a Uint8Array", (MEMBER,)),
    # in an array these would be written null; as a member they are left out, like an absent key (below)
    ("undefined", "undefined", (ITEM,)), ("function", "a function", (ITEM,)), ("symbol", "a symbol", (ITEM,)),
]


def test_lone_surrogates_and_wide_integers_are_refused_as_the_python_client_does(harness: Path,
                                                                              data_dir: Path) -> None:
    """A string or key holding a lone surrogate, and a number written as an integer outside the signed 64-bit range
    (2**63 on), are refused before anything is sent, as ``INVALID_PARAMS`` naming what and where (``data.sent``
    false), as the Python client refuses them (tests/clients/test_deep_params.py). ``JSON.stringify`` wrote the
    surrogate as an escape (``"\\ud800"``), which the host refuses as ``PARSE_ERROR`` with ``id: null``: no answer
    to the call, which waited until its timeout; the integer went to the host, which answered ``PARSE_ERROR`` after
    the frame had left. A whole surrogate pair, and an integer in range with 19 digits, are sent as they are; the
    refused write's ``submissionId`` was never sent, so the same key with good params applies once."""
    host = start_host_process(data_dir)
    node = Node(harness, host.url, host.token)
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        for make, named, path, where in (
                ("lone", "a lone surrogate", ["value", "w"], "params.value.w"),
                ("loneLow", "a lone surrogate", ["value", "list", 1], "params.value.list[1]"),
                ("loneKey", "a lone surrogate in a key", ["value", "w"], "params.value.w"),
                ("2**63", "an integer outside the signed 64-bit range", ["value", "w"], "params.value.w"),
                ("-2**63", "an integer outside the signed 64-bit range", ["value", "list", 0], "params.value.list[0]")):
            done = _with(node, f"{make}-{len(path)}", "settings.set", path, make, ns="ui", key="k",
                         value={"list": [1, 2]}, submissionId="ts-lone-1")
            assert done.get("name") == "RpcError" and done["dataCode"] == "INVALID_PARAMS", done
            assert done["data"]["sent"] is False and done["data"]["retriable"] is False, done
            assert f"settings.set: params hold {named} at {where}, which JSON cannot carry; nothing was sent" in (
                done["error"]), done
            assert [e["loc"] for e in done["data"]["errors"]] == [".".join(str(p) for p in path)], done
        done = _subscribe_with(node, "sessionId", "lone")
        assert done.get("dataCode") == "INVALID_PARAMS" and done["data"]["sent"] is False, done
        assert "events.subscribe: params hold a lone surrogate at params.sessionId" in done["error"], done
        assert _call(node, "settings.get", ns="ui", key="k")["value"].get("value") is None  # nothing was written
        # 2**62 is written in its shortest digits (4611686018427388000): in range, 19 of them
        for make, expect in (("pair", "a\U0001f600b"), ("2**62", 4611686018427388000)):
            kept = _with(node, f"{make}-kept", "settings.set", ["value", "w"], make, ns="ui", key=f"k-{make}",
                         value={})
            assert kept.get("value", {}).get("value") == {"w": expect}, kept
        good = _call(node, "settings.set", ns="ui", key="k", value={"w": 1}, submissionId="ts-lone-1")
        assert good.get("value", {}).get("value") == {"w": 1}, good
        assert node.run("pending") == {"waiting": 0, "inFlight": 0}
        states = [x["state"] for x in node.lines if x.get("kind") == "state"]
        assert states == ["connecting", "connected"], states  # one connection throughout
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        _end(node, host)


def test_params_json_cannot_carry_are_refused_before_sending(harness: Path, data_dir: Path) -> None:
    """clients/typescript/README.md: params JSON cannot carry are refused before anything is sent, as an
    ``RpcError`` ``INVALID_PARAMS`` naming the method, what and where (``data.sent`` false), as the Python client
    does. ``JSON.stringify`` wrote NaN and ±Infinity as ``null``, a Map or a Set as ``{}``, a typed array as an
    object of indexes, ``undefined`` or a function in an array as ``null``, so the host stored data the caller
    never wrote (``settings.set`` answered ``{"w": null}``); a BigInt, params nested past what it writes or an
    object holding itself threw inside the send, which the client took for a lost connection, tried again at once
    up to 8 times, and failed with ``ConnectionLost`` ("send failed: TypeError: Do not know how to serialize a
    BigInt"). Those nested past what it writes (a cycle too) are ``PARSE_ERROR`` with ``data.maxDepth`` (what it
    writes goes to the host, which answers ``PARSE_ERROR`` past 64 itself). The connection goes on, and a refused
    write's ``submissionId`` was never sent: the same key with good params applies once. ``undefined``, a function
    or a symbol as a member is left out (as absent), and a Date is written by its ``toJSON``."""
    host = start_host_process(data_dir)
    node = Node(harness, host.url, host.token)
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        for make, named, places in UNSENDABLE_TS:
            for path, where in places:
                done = _with(node, f"{make}-{len(path)}", "settings.set", path, make, ns="ui", key="k",
                             value={"list": [1, 2]}, submissionId="ts-unsendable-1")
                assert done.get("name") == "RpcError" and done["dataCode"] == "INVALID_PARAMS", done
                data = done["data"]
                assert data["sent"] is False and data["retriable"] is False, done
                assert f"settings.set: params hold {named} at {where}, which JSON cannot carry; nothing was sent" in (
                    done["error"]), done
                assert [e["loc"] for e in data["errors"]] == [".".join(str(p) for p in path)], done
        for make in ("deep", "cycle"):  # more than JSON.stringify writes (5000 levels), or no end at all
            done = _with(node, make, "settings.set", ["value", "w"], make, ns="ui", key="k", value={})
            assert done["dataCode"] == "PARSE_ERROR" and done["data"]["maxDepth"] == 64, done
            assert done["data"]["sent"] is False and "deeper than 64 containers" in done["error"], done
        # what JSON.stringify writes but the host reads no deeper than 64 containers: refused here too
        shallow = _call(node, "settings.set", ns="ui", key="k", value={"w": nest(70)})
        assert shallow.get("name") == "RpcError" and shallow["dataCode"] == "PARSE_ERROR", shallow
        assert shallow["data"]["sent"] is False and shallow["data"]["maxDepth"] == 64, shallow
        assert "deeper than 64 containers" in shallow["error"], shallow
        within = _call(node, "settings.set", ns="ui", key="k", value={"w": nest(60)})  # level 64: the host reads it
        assert within.get("value", {}).get("value") == {"w": nest(60)}, within
        # nothing reached the host: the key was never used, so good params with it apply (not IDEMPOTENCY_CONFLICT)
        good = _call(node, "settings.set", ns="ui", key="k", value={"w": 1.5}, submissionId="ts-unsendable-1")
        assert good.get("value", {}).get("value") == {"w": 1.5}, good
        for make in ("undefined", "function", "symbol"):  # a member left out: accepted
            kept = _with(node, f"{make}-member", "settings.set", ["value", "gone"], make, ns="ui", key="k2",
                         value={"w": 1})
            assert kept.get("value", {}).get("value") == {"w": 1}, kept
        dated = _with(node, "date", "settings.set", ["value", "at"], "Date", ns="ui", key="k3", value={})
        assert dated.get("value", {}).get("value") == {"at": "1970-01-01T00:00:00.000Z"}, dated
        assert _call(node, "settings.get", ns="ui", key="k")["value"]["value"] == {"w": 1.5}
        # subscribe() runs the same check: NaN as a cursor was written null (a subscription from the start), a
        # Map as a session id {} (the host answered INVALID_PARAMS with no word of the Map)
        for place, make, named, where in (("cursor", "NaN", "NaN", "params.cursor"),
                                          ("topic", "Infinity", "Infinity", "params.topics[1]"),
                                          ("sessionId", "Map", "a Map", "params.sessionId")):
            done = _subscribe_with(node, place, make)
            assert done.get("name") == "RpcError" and done["dataCode"] == "INVALID_PARAMS", done
            assert done["data"]["sent"] is False, done
            assert f"events.subscribe: params hold {named} at {where}, which JSON cannot carry" in done["error"], done
        for make in ("deep70", "cycle"):
            done = _subscribe_with(node, "sessionId", make)
            assert done.get("dataCode") == "PARSE_ERROR" and done["data"]["sent"] is False, done
        assert node.run("pending") == {"waiting": 0, "inFlight": 0}
        states = [x["state"] for x in node.lines if x.get("kind") == "state"]
        assert states == ["connecting", "connected"], states  # one connection throughout
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        _end(node, host)
