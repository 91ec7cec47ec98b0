"""Hostile plain HTTP on the gateway's port (issue 18 "Lockout" and "no INTERNAL reachable from input",
applied to issue 17's HTTP side: request heads, ``POST /login`` bodies, slow or oversized heads, many
unauthenticated HTTP connections). Nothing sent before a WebSocket exists may take the host down, and
none of it may lock out an honest WebSocket client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.gateway_http import MAX_HEAD_BYTES, HttpSite, LoginCodes
from runtime.client import open_client
from tests.gateway.conftest import Harness, connect, hello, start_gateway
from tests.gateway.test_http import http
from tests.hostile.wire import open_fds
from tests.hostkit import client_for, inprocess_host, start_host_process

HOSTILE_LOGIN_BODIES: list[bytes] = [
    b"[" * 4000,  # nests deeper than json.loads allows: RecursionError, not ValueError
    b'{"code":' * 500 + b"1" + b"}" * 500,
    b"\xff\xfe\x00garbage",  # not UTF-8
    b'{"code": "\\ud800"}',  # a lone surrogate
    b'{"code": NaN}',
    b'{"code": ' + b"9" * 3000 + b"}",  # a huge integer
    b'{"code": ["x"]}',
    b'{"code": {"code": "x"}}',
    b'"just a string"',
    b"[]",
    b"x" * 4000,
]


def _site(token: str = "t") -> HttpSite:
    return HttpSite(token=token, codes=LoginCodes(trio.current_time), ready=lambda: True, static={})


async def test_hostile_login_bodies_are_400_or_403_and_the_host_lives(tmp_path: Path) -> None:
    """A 4 KB ``POST /login`` body of ``[`` (any local process, no token needed) raised RecursionError
    out of the HTTP handler, through the listener, and stopped the host. Every hostile body is a 400
    or a 403, never the token, and the host keeps serving WebSocket clients."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host:
            own = {"Origin": f"http://127.0.0.1:{host.port}", "Content-Type": "application/json"}
            for body in HOSTILE_LOGIN_BODIES:
                status, _, payload = await http(host.port, "POST", "/login", headers=own, body=body)
                assert status in (400, 403), (body[:20], status)
                assert host.token.encode() not in payload
            async with client_for(host) as c:
                assert (await c.call("host.status", {}))["version"]
            assert (await http(host.port, "GET", "/healthz"))[0] == 200


class _Exploding(HttpSite):
    def respond(self, request: Any, body: bytes, port: int | None) -> Any:
        raise RuntimeError("a bug in a plain HTTP route")


async def test_a_failing_http_route_closes_that_connection_only(nursery: trio.Nursery) -> None:
    """Whatever a plain HTTP route raises is logged and closes that one connection: the listener (and with
    it the host) keeps accepting, WebSocket clients keep working."""
    h = await start_gateway(nursery, site=_Exploding(token="t", codes=LoginCodes(trio.current_time),
                                                      ready=lambda: True, static={}))
    with trio.fail_after(20):
        for _ in range(3):
            stream = await trio.open_tcp_stream("127.0.0.1", h.port)
            await stream.send_all(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{h.port}\r\n\r\n".encode())
            assert await stream.receive_some(1024) == b""  # closed without an answer
            await stream.aclose()
        async with connect(h.url) as ws:
            assert (await hello(ws))["clientId"]


async def _dribble(port: int, prefix: bytes, closed: list[float], stop: trio.Event) -> None:
    """Send ``prefix`` then one byte every 0.2 s, never finishing; note when the gateway closes us."""
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        closed.append(trio.current_time())
        return
    start = trio.current_time()
    try:
        await stream.send_all(prefix)
        while not stop.is_set():
            with trio.move_on_after(0.2):
                if await stream.receive_some(4096) == b"":
                    break
            await stream.send_all(b"x")
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        closed.append(trio.current_time() - start)
        await stream.aclose()


async def _oversized(port: int, outcomes: list[str]) -> None:
    """A head larger than the gateway reads (no end of head ever): the gateway must close it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
        filler = b"X-Filler: " + b"f" * 1000 + b"\r\n"
        for _ in range(4 * MAX_HEAD_BYTES // len(filler)):
            await stream.send_all(filler)
        with trio.fail_after(5):
            while await stream.receive_some(4096):
                pass
        outcomes.append("closed")
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        outcomes.append("closed")  # reset while we were still writing
    finally:
        await stream.aclose()


async def _honest(h: Harness, latencies: list[float]) -> None:
    start = trio.current_time()
    async with connect(h.url) as ws:
        assert (await hello(ws))["clientId"]
    latencies.append(trio.current_time() - start)


async def test_slow_oversized_and_dribbled_requests_are_bounded_and_do_not_lock_out(nursery: trio.Nursery) -> None:
    """Before the upgrade nothing bounded how many connections could sit in a slow head or a dribbled
    ``POST /login`` body (each held a descriptor and up to 20 KB for 10 s): 300 of them, plus oversized
    heads, keep at most ``max_pending_heads`` open (the oldest evicted), oversized heads are closed,
    and an honest WebSocket client connects and says hello 5 times out of 5 meanwhile."""
    h = await start_gateway(nursery, site=_site(), max_pending_heads=16, handshake_timeout=4.0)
    stop = trio.Event()
    closed: list[float] = []
    outcomes: list[str] = []
    latencies: list[float] = []
    login_head = (f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{h.port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: 4000\r\n\r\n").encode()
    slow_head = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{h.port}\r\n".encode()
    peak = 0
    with trio.fail_after(60):
        async with trio.open_nursery() as attack:
            for i in range(300):
                attack.start_soon(_dribble, h.port, login_head if i % 2 else slow_head, closed, stop)
                if i % 50 == 0:
                    attack.start_soon(_oversized, h.port, outcomes)
                peak = max(peak, h.gateway.statistics().pending_heads)
                await trio.sleep(0.005)
            for _ in range(5):
                for _ in range(10):  # more keep arriving
                    attack.start_soon(_dribble, h.port, slow_head, closed, stop)
                await _honest(h, latencies)
                peak = max(peak, h.gateway.statistics().pending_heads)
            stop.set()
    stats = h.gateway.statistics()
    print(f"\npending heads peak {peak}, evicted {stats.evicted_heads}, honest hellos "
          f"{[round(x, 2) for x in latencies]} s")
    assert peak <= 16
    assert stats.evicted_heads >= 300 - 16
    assert outcomes == ["closed"] * 6
    assert len(latencies) == 5 and max(latencies) < 3.0
    assert len(closed) == 350


async def _status_of(port: int, i: int) -> int:
    """One plain HTTP request (a health probe, the inspector's page or a bad login): its status, or 0 when
    the host closed the connection first (evicted under the flood, which is allowed)."""
    method, path, body = [("GET", "/healthz", b""), ("GET", "/", b""),
                          ("POST", "/login", json.dumps({"code": f"guess{i}"}).encode())][i % 3]
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return 0
    data = b""
    try:
        with trio.fail_after(30):
            await stream.send_all(head + body)
            while chunk := await stream.receive_some(65536):
                data += chunk
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()
    if not data.startswith(b"HTTP/1.1 "):
        return 0
    return int(data.split(b" ", 2)[1])


async def test_many_unauthenticated_http_requests_are_answered_and_release_their_descriptors(
        tmp_path: Path) -> None:
    """Many unauthenticated plain HTTP requests at once on a real host (health probes, static files, bad
    logins): each is answered or closed, an honest WebSocket client keeps getting answers, and the host's
    descriptors come back to where they were."""
    host = await trio.to_thread.run_sync(lambda: start_host_process(tmp_path, "--quiet"))
    try:
        port = int(host.url.rsplit(":", 1)[1].strip("/"))
        with trio.fail_after(120):
            async with open_client(host.url, host.token, client_id="honest", client_kind="ui") as c:
                await c.call("host.status", {})
                await trio.sleep(0.5)
                baseline = open_fds(host.proc.pid, but_database=True)
                statuses: list[int] = []
                honest: list[float] = []

                async def one(i: int) -> None:
                    statuses.append(await _status_of(port, i))

                async def keep_asking(done: trio.Event) -> None:
                    while not done.is_set():
                        t0 = trio.current_time()
                        await c.call("session.list", {"limit": 5})
                        honest.append(trio.current_time() - t0)
                        await trio.sleep(0.02)

                done = trio.Event()
                async with trio.open_nursery() as n:
                    n.start_soon(keep_asking, done)
                    async with trio.open_nursery() as flood:
                        for i in range(600):
                            flood.start_soon(one, i)
                            if i % 20 == 0:
                                await trio.lowlevel.checkpoint()
                    done.set()
                assert len(statuses) == 600
                assert set(statuses) <= {0, 200, 403}, sorted(set(statuses))
                assert statuses.count(200) >= 300  # most were answered, not merely closed
                assert honest and max(honest) < 5.0
                for _ in range(100):
                    if open_fds(host.proc.pid, but_database=True) <= baseline + 2:
                        break
                    await trio.sleep(0.05)
                assert open_fds(host.proc.pid, but_database=True) <= baseline + 2
        assert await trio.to_thread.run_sync(lambda: host.terminate(timeout=30)) == 0
    finally:
        await trio.to_thread.run_sync(host.kill9)
        for pipe in (host.proc.stdout, host.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.parametrize("head", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n",  # a TLS ClientHello
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n",  # two Host headers
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n\r\n",  # an upgrade missing its key
    b"GET / HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
])
async def test_malformed_heads_are_answered_or_closed(nursery: trio.Nursery, head: bytes) -> None:
    """Malformed request heads get a 4xx or a close, and the gateway keeps serving."""
    h = await start_gateway(nursery, site=_site(), handshake_timeout=3.0)
    with trio.fail_after(15):
        stream = await trio.open_tcp_stream("127.0.0.1", h.port)
        await stream.send_all(head.replace(b"Host: 127.0.0.1", f"Host: 127.0.0.1:{h.port}".encode()))
        data = b""
        try:
            while chunk := await stream.receive_some(4096):
                data += chunk
        except trio.BrokenResourceError:
            pass
        await stream.aclose()
        assert data == b"" or data.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), data[:80]
        async with connect(h.url) as ws:
            assert (await hello(ws))["clientId"]
