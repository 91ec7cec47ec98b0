"""The TypeScript client against a real host process, under the machine's Node (20: no global WebSocket, so the
``ws`` package is passed in): one retry chain with capped, jittered backoff, a visible state, resume at the
cursor, a typed refusal, bounded waiting.

Reproduces issue 25's "reconnection done once, well, in every client" for ``clients/typescript`` (its client had
no reconnect at all: a lost connection failed every call for good, a bad token surfaced as a bare ``Error``, and
Node 20 needed a WebSocket passed in).
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from pihost_client import connect
from tests.clients.node_packages import tsc_build
from tests.clients.relay import Relay, free_port
from tests.hostkit import HostProcess, start_host_process

PKG = Path(__file__).resolve().parents[2] / "clients" / "typescript"
INITIAL_MS = 100
CAP_MS = 800
FIRST_CAPPED = 4
"""The first waiting line whose delay the cap bounds (a line's ``attempt`` is its index in the chain: the bases
double from ``INITIAL_MS``, 100, 200, 400, 800, then 1600 capped at ``CAP_MS``)."""

Line = dict[str, Any]


@pytest.fixture(scope="module")
def harness() -> Path:
    """``test/harness.js``: ``test/harness.ts`` and the client compiled by tsc into a build folder inside the package
    (so Node resolves the package's ``ws``), once for this module and test_typescript_outsider.py, whichever
    worker asks first (:func:`tests.clients.node_packages.tsc_build`). ``--skipLibCheck``: the harness and the
    client are type-checked whole, the declaration files they use are not (most of tsc's time here): the package's
    own ``tsc --noEmit`` (tests/clients/test_typescript.py) checks the ES and DOM ones, and ``@types/node``'s are
    that package's own business."""
    return tsc_build(PKG, "test/tsconfig.json", "--skipLibCheck") / "test" / "harness.js"


class Node:
    """The harness as a subprocess: JSON commands in, JSON lines out (read by a thread into a queue)."""

    def __init__(self, script: Path, url: str, token: str, **options: Any) -> None:
        self.proc = subprocess.Popen(["node", str(script), url, token, json.dumps(options)], cwd=PKG,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[Line] = []
        self._queue: queue.Queue[Line | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._queue.put(json.loads(raw))
        self._queue.put(None)

    def expect(self, match: Callable[[Line], bool], timeout: float = 20) -> Line:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.01, left))
            except queue.Empty:
                line = None
            if line is None:
                if left <= 0 or self.proc.poll() is not None:
                    err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
                    raise AssertionError(f"no matching line within {timeout} s; got {self.lines[-8:]} {err}")
                continue
            self.lines.append(line)
            if line.get("kind") == "crash":
                raise AssertionError(f"the harness crashed: {line}")
            if match(line):
                return line

    def seen(self, match: Callable[[Line], bool], timeout: float = 20) -> Line:
        """The first line read so far that matches, else the next one that does."""
        for line in self.lines:
            if match(line):
                return line
        return self.expect(match, timeout)

    def run(self, op: str, **args: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.expect(lambda x: x.get("kind") == "result" and x.get("op") == op)
        assert "error" not in line, line
        return line["value"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def _event(message_id: str) -> Callable[[Line], bool]:
    return lambda x: x.get("kind") == "event" and x.get("messageId") == message_id


def _state(name: str) -> Callable[[Line], bool]:
    return lambda x: x.get("kind") == "state" and x.get("state") == name


def _check_one_chain(lines: list[Line]) -> list[Line]:
    """The attempts made while the host was away: sequential, each after the backoff it announced, the
    announced delays doubling (with jitter) up to the cap. Returns the waiting lines."""
    waits = [x for x in lines if x.get("kind") == "state" and x["state"] == "waiting"]
    assert waits, lines
    first = waits[0]["attempt"]
    assert [x["attempt"] for x in waits] == list(range(first, first + len(waits))), waits
    for i, wait in enumerate(waits):
        base = min(CAP_MS, INITIAL_MS * 2 ** i)
        assert base / 2 - 1 <= wait["delayMs"] <= base, (i, wait)
        assert wait["message"].startswith("waiting for a host on ws://127.0.0.1:"), wait
        # the attempts after this wait in the harness's own order (a failed attempt and the wait it
        # announces can share one millisecond: their timestamps alone cannot order them)
        after = lines[next(n for n, x in enumerate(lines) if x is wait) + 1:]
        nxt = [x for x in after if x.get("kind") == "state" and x["state"] == "connecting"]
        if nxt:  # the next attempt came no sooner than announced (one chain: nothing else tries in between)
            assert nxt[0]["t"] - wait["t"] >= wait["delayMs"] - 5, (wait, nxt[0])
    return waits


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.mark.slow  # a host killed, then booted again on its port
def test_host_killed_and_restarted_one_retry_chain_then_resynced(harness: Path, data_dir: Path) -> None:
    """Issue 25: the host is SIGKILLed for ~2 s (until the backoff is at its cap) and restarted on its port: the
    client makes a handful of attempts spaced by the backoff (never two chains), says it is waiting, keeps at most
    ``maxWaitingCalls`` calls waiting (the rest are refused at once: bounded memory), reconnects once, resyncs its
    subscription (a new bootId: old cursors do not resume) and delivers the next event; the waiting calls then
    complete."""
    port = free_port()
    host: HostProcess = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                maxWaitingCalls=50)
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS reconnect")
        node.run("subscribe", sessionId=sid)
        node.run("append", sessionId=sid, id="a1", text="before")
        node.seen(_event("a1"))

        host.kill9()
        host.proc.communicate()
        down_at = time.time() * 1000
        node.expect(_state("waiting"))
        flooded = node.run("flood", n=60)
        assert flooded == {"refused": 10, "resolved": 0}, flooded
        # down until two delays were capped (~1.7 s; a fixed 3 s wait got that far, and further): the chain's
        # doubling and its cap are what _check_one_chain holds the waits to
        node.seen(lambda x: _state("waiting")(x) and x["attempt"] >= FIRST_CAPPED + 1, timeout=30)
        host = start_host_process(data_dir, "--port", str(port))
        back = node.expect(_state("reconnected"), timeout=30)
        assert back["message"] == "reconnected; the host restarted; subscriptions resynced", back
        assert any(x.get("kind") == "resync" and "restarted" in x["reason"] for x in node.lines)
        settled = node.run("settle")
        assert settled == {"refused": 10, "resolved": 50, "failed": 0}, settled
        node.run("append", sessionId=sid, id="a2", text="after")
        node.seen(_event("a2"))

        waits = _check_one_chain(node.lines)
        assert waits[0]["t"] >= down_at - 1000 and waits[0]["attempt"] == 0, waits[0]
        # a handful: each delay is at least half its doubling base (jitter), so the count is bounded by the
        # outage's length (host boot included), not by how often something fires
        outage_ms = back["t"] - waits[0]["t"]
        bound = 4 + outage_ms / (CAP_MS / 2)
        assert 3 <= len(waits) <= bound, (outage_ms, [w["delayMs"] for w in waits])
        assert sum(1 for x in node.lines if x.get("state") == "reconnected") == 1
        assert [x["messageId"] for x in node.lines if x.get("kind") == "event"] == ["a1", "a2"]
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        node.stop()
        host.terminate()
        host.proc.communicate()


def test_connection_dropped_resumes_at_the_cursor_with_the_missed_events(harness: Path, data_dir: Path) -> None:
    """Issue 25: the connection drops while the host keeps running (a relay taken down for ~1.2 s, until the
    backoff is at its cap) and two messages are appended meanwhile: the client says "reconnected; resumed at cursor
    N" with the cursor of the last event it delivered, gets the two missed events, and nothing twice; no resync."""
    host = start_host_process(data_dir)
    port = int(host.url.rsplit(":", 1)[1].split("/")[0])
    proxy = Relay(port)
    node = Node(harness, f"ws://127.0.0.1:{proxy.port}", host.token,
                backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS})
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS resume")
        node.run("subscribe", sessionId=sid)
        node.run("append", sessionId=sid, id="a1", text="before")
        cursor = node.seen(_event("a1"))["cursor"]

        proxy.down()
        node.expect(_state("waiting"))

        async def append_missed() -> None:
            async with connect(url=host.url, token=host.token, client_id="ts-test-writer") as c:
                for mid in ("b1", "b2"):
                    await c.session.append_message(session_id=sid, message={
                        "id": mid, "role": "user", "blocks": [{"type": "text", "text": mid}]})

        anyio.run(append_missed)
        # down until a delay was capped (~1.2 s; a fixed 1.5 s wait after the appends got about that far)
        node.seen(lambda x: _state("waiting")(x) and x["attempt"] >= FIRST_CAPPED, timeout=30)
        proxy.up()
        back = node.expect(_state("reconnected"), timeout=30)
        assert back["message"] == f"reconnected; resumed at cursor {cursor}", back
        assert back["resumed"] == [cursor]
        node.seen(_event("b2"))
        assert [x["messageId"] for x in node.lines if x.get("kind") == "event"] == ["a1", "b1", "b2"]
        assert not any(x.get("kind") == "resync" for x in node.lines)
        _check_one_chain(node.lines)
        node.run("close")
    finally:
        node.stop()
        proxy.down()
        host.terminate()
        host.proc.communicate()


def test_a_bad_token_fails_at_once_with_host_refused(harness: Path, data_dir: Path) -> None:
    """Issue 25: UNAUTHENTICATED is not retried: ``HostClient.connect`` rejects within 2 s with ``HostRefused``
    (a ``ConnectionLost``), after one attempt."""
    host = start_host_process(data_dir)
    node = Node(harness, host.url, "0" * 64, waitForHost=True, connectTimeoutMs=30000)
    try:
        err = node.expect(lambda x: x.get("kind") == "error")
        assert err["name"] == "HostRefused" and err["connectionLost"] is True, err
        assert err["code"] == "UNAUTHENTICATED", err
        assert err["elapsedMs"] < 2000, err
        assert sum(1 for x in node.lines if x.get("state") == "connecting") == 1
        assert node.proc.wait(timeout=10) == 0
    finally:
        node.stop()
        host.terminate()
        host.proc.communicate()


def test_no_host_fails_at_once_and_waiting_is_bounded(harness: Path, data_dir: Path) -> None:
    """Issue 25: without ``waitForHost`` a url nobody answers fails at once with ``HostNotRunning``; with it, the
    client waits (saying so) until ``connectTimeoutMs``, then fails with the same typed error."""
    url = f"ws://127.0.0.1:{free_port()}"
    node = Node(harness, url, "0" * 64)
    try:
        err = node.expect(lambda x: x.get("kind") == "error")
        assert err["name"] == "HostNotRunning" and err["connectionLost"] is True, err
    finally:
        node.stop()
    node = Node(harness, url, "0" * 64, waitForHost=True, connectTimeoutMs=1500,
                backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS})
    try:
        err = node.expect(lambda x: x.get("kind") == "error")
        assert err["name"] == "HostNotRunning" and "within 1500 ms" in err["message"], err
        assert 2 <= len(_check_one_chain(node.lines)) <= 8
    finally:
        node.stop()


def test_node_without_a_global_websocket_says_what_to_pass(harness: Path) -> None:
    """Issue 25: Node 20 has no global WebSocket; the client says to pass one (``WebSocketImpl``) instead of
    failing on an undefined constructor. (On a runtime with a global WebSocket the check is moot.)"""
    client_js = harness.parent.parent / "src" / "client.js"
    code = ("if (globalThis.WebSocket !== undefined) { console.log('HAS_GLOBAL'); process.exit(0); }\n"
            f"const {{ HostClient }} = await import({json.dumps(client_js.as_uri())});\n"
            "try { await HostClient.connect({ url: 'ws://127.0.0.1:1', token: 'x', clientId: 'c' }); }\n"
            "catch (e) { console.log(e.name + ': ' + e.message); }\n")
    proc = subprocess.run(["node", "--input-type=module", "-e", code], cwd=PKG, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.strip() == "HAS_GLOBAL":
        pytest.skip("this Node has a global WebSocket")
    assert proc.stdout.strip().startswith("TypeError: this runtime has no global WebSocket"), proc.stdout
    assert "WebSocketImpl" in proc.stdout


# -- the time a call waits for a reconnect is bounded (reconnectTimeoutMs), like pihost_client's reconnect_timeout --
def _started(node: Node, tag: str, method: str, **params: Any) -> Callable[[float], Line]:
    """Send a call without waiting; returns a function waiting (up to a timeout) for the line saying how it ended."""
    node.run("start", tag=tag, method=method, params=params)
    return lambda timeout: node.seen(lambda x: x.get("kind") == "done" and x.get("tag") == tag, timeout)


def _call(node: Node, method: str, timeout: float = 20, **params: Any) -> Line:
    return _started(node, f"{method}-{uuid.uuid4().hex[:6]}", method, **params)(timeout)


def _message(mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "blocks": [{"type": "text", "text": mid}]}


def _assert_host_unavailable(done: Line, window_ms: int) -> None:
    assert done.get("name") == "HostUnavailable" and done["connectionLost"] is True, done
    assert done["waitedMs"] == window_ms, done
    assert f"no connection to the host within {window_ms} ms" in done["error"], done
    # the last connection error says why: the host's port refuses connections
    assert done["lastError"] and "ECONNREFUSED" in done["lastError"], done
    assert window_ms - 50 <= done["elapsedMs"] < window_ms + 4000, done


def test_a_call_while_the_host_is_down_fails_with_host_unavailable_then_calls_work_again(
        harness: Path, data_dir: Path) -> None:
    """With the host stopped, a read and a write each wait ``reconnectTimeoutMs`` for the client to reconnect,
    then fail with ``HostUnavailable`` (a ``ConnectionLost`` carrying how long it waited and the last connection
    error) instead of waiting forever; the client goes on reconnecting meanwhile, and once a host runs on the
    port again the same client's calls work. Closing it leaves no timer behind (the process exits by itself)."""
    window_ms = 1500
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                reconnectTimeoutMs=window_ms)
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS down")
        assert host.terminate() == 0
        node.expect(_state("waiting"))

        for method, params in (("session.get", {"sessionId": sid}),
                               ("session.rename", {"sessionId": sid, "title": "while down"})):
            _assert_host_unavailable(_call(node, method, **params), window_ms)
        # the client did not give up: it still tries (one chain), so it finds the host when it is back
        tried = sum(1 for x in node.lines if x.get("state") == "connecting")
        node.expect(_state("connecting"), timeout=10)
        assert not any(x.get("state") == "closed" for x in node.lines), node.lines

        host = start_host_process(data_dir, "--port", str(port))
        node.expect(_state("reconnected"), timeout=30)
        renamed = _call(node, "session.rename", sessionId=sid, title="back")
        assert renamed.get("value", {}).get("title") == "back", renamed
        got = _call(node, "session.get", sessionId=sid)
        assert got.get("value", {}).get("session", {}).get("title") == "back", got
        assert sum(1 for x in node.lines if x.get("state") == "connecting") > tried
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        node.stop()
        host.terminate()
        host.proc.communicate()


@pytest.mark.slow  # a host killed three times, then booted again on its port
def test_a_call_in_flight_when_the_host_dies_gets_its_answer_once_or_host_unavailable_past_the_window(
        harness: Path, data_dir: Path) -> None:
    """An append in flight when the host is SIGKILLed (after its fsync, before the answer):

    * the host is back within ``reconnectTimeoutMs``: the call is sent again with its submissionId and resolves
      once, with the original answer from the receipt (``replayed: false``: not a second apply met by the
      message-id check), and no ``HostUnavailable``;
    * the host stays down: the call fails once with ``HostUnavailable`` after the window (never also resolves);
      sent again with the same submissionId once the host is back, it is answered, and each message is stored
      once."""
    window_ms = 6000
    crash = {"RT_CRASHPOINT": "append.after_fsync:1:kill"}
    port = free_port()
    host = start_host_process(data_dir, "--port", str(port))
    node = Node(harness, host.url, host.token, backoff={"initialMs": INITIAL_MS, "maxMs": CAP_MS},
                reconnectTimeoutMs=window_ms)
    try:
        node.expect(lambda x: x.get("kind") == "connected")
        sid = node.run("create", title="TS in flight")
        assert host.terminate() == 0
        host = start_host_process(data_dir, "--port", str(port), env=crash)
        node.expect(_state("reconnected"), timeout=30)

        # 1. back within the window: the original answer, once
        m1 = _started(node, "m1", "session.appendMessage", sessionId=sid, message=_message("m1"),
                      submissionId="ts-in-flight-m1")
        assert host.reap(30) == -9
        host = start_host_process(data_dir, "--port", str(port), env=crash)
        first = m1(30)
        assert "error" not in first, first
        assert first["value"]["message"]["id"] == "m1" and first["value"]["replayed"] is False, first

        # 2. down past the window: HostUnavailable, once
        m2 = _started(node, "m2", "session.appendMessage", sessionId=sid, message=_message("m2"),
                      submissionId="ts-in-flight-m2")
        assert host.reap(30) == -9
        _assert_host_unavailable(m2(window_ms / 1000 + 20), window_ms)

        host = start_host_process(data_dir, "--port", str(port))
        node.expect(_state("reconnected"), timeout=30)
        again = _call(node, "session.appendMessage", sessionId=sid, message=_message("m2"),
                      submissionId="ts-in-flight-m2")
        assert "error" not in again and again["value"]["message"]["id"] == "m2", again
        session = _call(node, "session.get", sessionId=sid)["value"]
        assert [m["id"] for m in session["messages"]] == ["m1", "m2"], session
        # each call settled once (a late second settlement would show as a second line)
        time.sleep(0.5)
        assert [x["tag"] for x in node.lines if x.get("kind") == "done" and x["tag"] in ("m1", "m2")] == ["m1", "m2"]
        node.run("close")
        assert node.proc.wait(timeout=10) == 0
    finally:
        node.stop()
        host.terminate()
        host.proc.communicate()
