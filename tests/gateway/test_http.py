"""Plain HTTP on the gateway's port: health, readiness, the inspector's files, the one-time login."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from runtime.client import ClientClosed, open_client
from runtime.host import RunningHost
from tests.hostkit import client_for, inprocess_host


async def http(port: int, method: str, path: str, *, host: str | None = None, body: bytes = b"",
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}",
             f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    parsed = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    return int(status_line.split()[1]), parsed, payload


async def _code(host: RunningHost) -> str:
    async with client_for(host, kind="cli") as c:
        return str((await c.call("host.createLoginCode", {}))["code"])


async def test_health_readiness_and_static_files(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host:
        status, headers, body = await http(host.port, "GET", "/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        assert "access-control-allow-origin" not in headers and headers["cache-control"] == "no-store"
        assert (await http(host.port, "GET", "/readyz"))[0] == 200
        status, headers, body = await http(host.port, "GET", "/")
        assert status == 200 and headers["content-type"].startswith("text/html") and b"pi-host inspector" in body
        assert "connect-src 'self'" in headers["content-security-policy"]
        status, headers, _ = await http(host.port, "GET", "/app.js")
        assert status == 200 and headers["content-type"].startswith("text/javascript")
        assert (await http(host.port, "GET", "/../pi.sqlite"))[0] == 404
        assert (await http(host.port, "DELETE", "/healthz"))[0] == 405
        host.gateway.stop_accepting()
        status, _, body = await http(host.port, "GET", "/readyz")
        assert (status, json.loads(body)) == (503, {"status": "shutting down"})


async def test_http_refuses_a_rebound_host_header(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host:
        status, _, body = await http(host.port, "GET", "/", host=f"rebind.example:{host.port}")
        assert status == 403 and b"loopback" in body
        code = await _code(host)
        status, _, _ = await http(host.port, "POST", "/login", host="rebind.example",
                                  body=json.dumps({"code": code}).encode())
        assert status == 403


async def test_a_login_code_is_exchanged_once_and_only_from_the_own_origin(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host:
        own = {"Origin": f"http://127.0.0.1:{host.port}", "Content-Type": "application/json"}
        code = await _code(host)
        status, _, body = await http(host.port, "POST", "/login", headers={"Origin": "http://evil.example"},
                                     body=json.dumps({"code": code}).encode())
        assert status == 403 and b"token" not in body
        status, headers, body = await http(host.port, "POST", "/login", headers=own,
                                           body=json.dumps({"code": code}).encode())
        assert status == 200 and json.loads(body) == {"token": host.token}
        assert "access-control-allow-origin" not in headers
        status, _, body = await http(host.port, "POST", "/login", headers=own, body=json.dumps({"code": code}).encode())
        assert status == 403 and b"expired" in body
        assert (await http(host.port, "POST", "/login", headers=own, body=b"not json"))[0] == 400
        assert (await http(host.port, "GET", "/login"))[0] == 405


async def test_the_own_origin_gets_a_websocket_and_others_a_403_naming_allow_origin(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host:
        async with open_client(host.url, host.token, client_id="own-origin", client_kind="ui",
                               origin=f"http://localhost:{host.port}") as c:
            assert c.hello["clientId"] == "own-origin"
        stream = await trio.open_tcp_stream("127.0.0.1", host.port)
        await stream.send_all(
            (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{host.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
             "Origin: https://ui.example\r\n\r\n").encode())
        data = b""
        with trio.fail_after(10):
            while b"--allow-origin" not in data and (chunk := await stream.receive_some(4096)):
                data += chunk
        await stream.aclose()
        assert data.startswith(b"HTTP/1.1 403")
        assert b"start the host with --allow-origin https://ui.example" in data
        try:
            async with open_client(host.url, host.token, client_id="other-port", client_kind="ui",
                                   origin="http://127.0.0.1:1"):
                raise AssertionError("a page on another port must be refused")
        except ClientClosed:
            pass
