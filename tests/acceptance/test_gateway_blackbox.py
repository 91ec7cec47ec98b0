"""Issue 3 black-box: one real ``pi-host serve --port 0`` subprocess, spoken to over WebSocket.

Every test here talks to the same host process (module fixture); each test
checks at its end that the host still serves, so a test that hurts the
process fails where it happens, not somewhere later.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from trio_websocket import ConnectionClosed

from runtime.client import RpcError, open_client
from tests.gateway.conftest import connect, raw_upgrade
from tests.hostkit import REPO, HostProcess, msg, start_host_process


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    proc = start_host_process(tmp_path_factory.mktemp("blackbox") / "data")
    try:
        yield proc
    finally:
        code = proc.terminate()
        _out, err = proc.proc.communicate()  # also closes the pipes
        assert code == 0, err.decode()[-3000:]


def _client(host: HostProcess, client_id: str = "bb-client") -> Any:
    return open_client(host.url, host.token, client_id=client_id, client_kind="test")


def _port(host: HostProcess) -> int:
    return int(host.url.rsplit(":", 1)[1].strip("/"))


async def _still_serving(host: HostProcess) -> None:
    assert host.proc.poll() is None, "host process died"
    async with _client(host, "bb-probe") as c:
        status = await c.call("host.status", {})
        assert status["bootId"] == c.hello["bootId"]


async def _raw_call(ws: Any, frame: str | bytes) -> Any:
    await ws.send_message(frame)
    return orjson.loads(await ws.get_message())


def _hello(token: str, request_id: int = 1) -> str:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "host.hello",
                         "params": {"token": token, "clientId": "raw", "clientKind": "test",
                                    "protocol": 1}}).decode()


# ---------------------------------------------------------------------------- auth


async def test_first_request_not_hello_is_unauthenticated_and_closed(host: HostProcess) -> None:
    with trio.fail_after(20):
        async with connect(host.url) as ws:
            reply = await _raw_call(ws, '{"jsonrpc":"2.0","id":1,"method":"session.list","params":{}}')
            assert reply["id"] == 1
            assert reply["error"]["code"] == -32001
            assert reply["error"]["data"]["code"] == "UNAUTHENTICATED"
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
        await _still_serving(host)


async def test_wrong_token_is_unauthenticated_and_closed(host: HostProcess) -> None:
    with trio.fail_after(20):
        async with connect(host.url) as ws:
            reply = await _raw_call(ws, _hello("0" * 64))
            assert reply["error"]["data"]["code"] == "UNAUTHENTICATED"
            assert host.token not in json.dumps(reply)
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
        with pytest.raises(RpcError) as err:
            async with open_client(host.url, host.token[:-1] + "x", client_id="bad"):
                pass
        assert err.value.data_code == "UNAUTHENTICATED"
        await _still_serving(host)


@pytest.mark.parametrize(
    "headers_for",
    [
        lambda p: {"Host": f"127.0.0.1:{p}", "Origin": "https://evil.example"},
        lambda p: {"Host": f"127.0.0.1:{p}", "Origin": "null"},
        lambda p: {"Host": f"localhost:{p}", "Origin": "http://localhost:3000"},
        lambda p: {"Host": f"rebind.example:{p}"},
        lambda p: {"Host": f"127.0.0.1.nip.io:{p}"},
        lambda p: {},
    ],
    ids=["evil-origin", "null-origin", "other-local-origin", "rebind-host", "lookalike-host", "no-host"],
)
async def test_handshake_refuses_bad_origin_and_host(host: HostProcess, headers_for: Any) -> None:
    port = _port(host)
    with trio.fail_after(20):
        # 403 from our check; a request with no Host at all is already a 400 in h11.
        assert await raw_upgrade(port, headers_for(port)) in (400, 403)
        # The same raw upgrade with a loopback Host and no Origin is accepted.
        assert await raw_upgrade(port, {"Host": f"127.0.0.1:{port}"}) == 101
        await _still_serving(host)


# ---------------------------------------------------------------------------- bad input


async def test_malformed_frames_unknown_methods_and_bad_params(host: HostProcess) -> None:
    with trio.fail_after(30):
        async with connect(host.url) as ws:
            assert "result" in await _raw_call(ws, _hello(host.token))
            before = await _raw_call(ws, '{"jsonrpc":"2.0","id":2,"method":"session.list","params":{}}')
            cases: list[tuple[str, int, str]] = [
                ('{"jsonrpc":"2.0","id":3,"method":', -32700, "PARSE_ERROR"),
                ("not json at all", -32700, "PARSE_ERROR"),
                ('{"jsonrpc":"2.0","id":4,"method":"host.status","params":{"x":NaN}}', -32700, "PARSE_ERROR"),
                ('{"jsonrpc":"2.0","id":5,"id":6,"method":"host.status"}', -32700, "PARSE_ERROR"),
                ("[]", -32600, "INVALID_REQUEST"),
                ('{"jsonrpc":"1.0","id":7,"method":"host.status"}', -32600, "INVALID_REQUEST"),
                ('{"jsonrpc":"2.0","id":8,"method":42}', -32600, "INVALID_REQUEST"),
                ('{"jsonrpc":"2.0","id":9,"method":"no.such.method","params":{}}', -32601, "METHOD_NOT_FOUND"),
                ('{"jsonrpc":"2.0","id":10,"method":"session.get","params":{"sessionId":5}}',
                 -32602, "INVALID_PARAMS"),
                ('{"jsonrpc":"2.0","id":11,"method":"session.list","params":{"limit":"ten"}}',
                 -32602, "INVALID_PARAMS"),
                ('{"jsonrpc":"2.0","id":12,"method":"session.create","params":{"title":["x"]}}',
                 -32602, "INVALID_PARAMS"),
                ('{"jsonrpc":"2.0","id":13,"method":"session.appendMessage",'
                 '"params":{"sessionId":"s1","message":"hello"}}', -32602, "INVALID_PARAMS"),
                ('{"jsonrpc":"2.0","id":14,"method":"session.list","params":[1,2]}', -32602, "INVALID_PARAMS"),
            ]
            for frame, code, data_code in cases:
                reply = await _raw_call(ws, frame)
                assert "error" in reply, (frame, reply)
                assert reply["error"]["code"] == code, (frame, reply)
                assert reply["error"]["data"]["code"] == data_code, (frame, reply)
            # Binary frames are refused the same way and the connection stays up.
            reply = await _raw_call(ws, b'{"jsonrpc":"2.0","id":15,"method":"host.status"}')
            assert "error" in reply
            after = await _raw_call(ws, '{"jsonrpc":"2.0","id":16,"method":"session.list","params":{}}')
            assert after["result"] == before["result"], "a refused request changed state"
        await _still_serving(host)


async def test_oversized_frame_refused_host_survives(host: HostProcess) -> None:
    with trio.fail_after(60):
        async with _client(host) as c:
            s = await c.call("session.create", {"title": "size limits"})
            # Params over the params cap but under the frame cap: an error, connection stays.
            big = "x" * (9 * 1024 * 1024)
            with pytest.raises(RpcError) as err:
                await c.call("session.appendMessage", {"sessionId": s["id"], "message": msg("big", big)})
            assert err.value.data_code == "PAYLOAD_TOO_LARGE"
            assert (await c.call("session.get", {"sessionId": s["id"]}))["totalMessages"] == 0
        async with connect(host.url, max_message_size=64 * 1024 * 1024) as ws:
            assert "result" in await _raw_call(ws, _hello(host.token))
            pad = "y" * (17 * 1024 * 1024)
            frame = '{"jsonrpc":"2.0","id":1,"method":"host.status","params":{"pad":"' + pad + '"}}'
            with pytest.raises(ConnectionClosed) as closed:
                await ws.send_message(frame)
                await ws.get_message()
            reason = closed.value.reason
            assert reason is not None and reason.code == 1009
        await _still_serving(host)
        async with _client(host) as c:
            got = await c.call("session.get", {"sessionId": s["id"]})
            assert got["totalMessages"] == 0


# ---------------------------------------------------------------------------- receipts


async def test_receipts_retry_identical_and_conflict(host: HostProcess) -> None:
    with trio.fail_after(30):
        async with _client(host, "receipt-client") as c:
            create = {"title": "receipts", "submissionId": "sub-create-1"}
            first = await c.call("session.create", create)
            assert await c.call("session.create", create) == first
            with pytest.raises(RpcError) as err:
                await c.call("session.create", {**create, "title": "other"})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
            sid = first["id"]
            append = {"sessionId": sid, "message": msg("r1", "once only"), "submissionId": "sub-append-1"}
            a1 = await c.call("session.appendMessage", append)
            a2 = await c.call("session.appendMessage", append)
            assert a1 == a2 and a1["replayed"] is False
            with pytest.raises(RpcError) as err:
                await c.call("session.appendMessage", {**append, "message": msg("r1", "changed")})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
            rename = {"sessionId": sid, "title": "renamed", "submissionId": "sub-rename-1"}
            assert await c.call("session.rename", rename) == await c.call("session.rename", rename)
            got = await c.call("session.get", {"sessionId": sid})
            assert got["totalMessages"] == 1
            assert got["messages"][0]["blocks"] == [{"type": "text", "text": "once only"}]
        # After a reconnect (same clientId) the retry still returns the stored response.
        async with _client(host, "receipt-client") as c:
            assert await c.call("session.appendMessage", append) == a1
            # The same submissionId from another client is a different key.
            async with _client(host, "other-client") as other:
                fresh = await other.call("session.appendMessage",
                                         {**append, "message": msg("r2", "from other")})
                assert fresh["message"]["seq"] == 2
        await _still_serving(host)


async def test_delete_receipt_outlives_session(host: HostProcess) -> None:
    with trio.fail_after(30):
        async with _client(host, "delete-client") as c:
            s = await c.call("session.create", {"title": "to delete"})
            await c.call("session.appendMessage", {"sessionId": s["id"], "message": msg("d1", "bye")})
            req = {"sessionId": s["id"], "submissionId": "sub-delete-1"}
            first = await c.call("session.delete", req)
            assert first == {"sessionId": s["id"], "deleted": True}
        async with _client(host, "delete-client") as c:
            assert await c.call("session.delete", req) == first
            with pytest.raises(RpcError) as err:
                await c.call("session.delete", {"sessionId": s["id"]})
            assert err.value.data_code == "SESSION_NOT_FOUND"
            with pytest.raises(RpcError) as err:
                await c.call("session.get", {"sessionId": s["id"]})
            assert err.value.data_code == "SESSION_NOT_FOUND"
            listed = await c.call("session.list", {"limit": 500})
            assert s["id"] not in {x["id"] for x in listed["sessions"]}
        await _still_serving(host)


# ---------------------------------------------------------------------------- CLI and logs


def _cli(host: HostProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", "--data-dir", str(host.data_dir), *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


async def test_cli_status_sessions_show_search(host: HostProcess) -> None:
    with trio.fail_after(60):
        async with _client(host) as c:
            s = await c.call("session.create", {"title": "cli tour"})
            for i in range(6):
                await c.call("session.appendMessage", {"sessionId": s["id"], "message": msg(f"c{i}", f"line {i}")})
            boot_id = c.hello["bootId"]
        status = await trio.to_thread.run_sync(_cli, host, "status", "--json")
        assert status.returncode == 0, status.stderr
        parsed = json.loads(status.stdout)
        assert parsed["bootId"] == boot_id and parsed["version"]
        sessions = await trio.to_thread.run_sync(_cli, host, "sessions")
        assert sessions.returncode == 0, sessions.stderr
        line = next(ln for ln in sessions.stdout.splitlines() if ln.startswith(s["id"]))
        assert "cli tour" in line and " 6 msgs" in line
        show = await trio.to_thread.run_sync(_cli, host, "show", s["id"], "--limit", "2")
        assert show.returncode == 0, show.stderr
        lines = show.stdout.splitlines()
        assert "cli tour" in lines[0] and "messages #5-#6 of 6" in lines[0]
        assert lines[1:] == ["[5] user: line 4", "[6] user: line 5"]
        missing = await trio.to_thread.run_sync(_cli, host, "show", "no-such-session")
        assert missing.returncode != 0 and "SESSION_NOT_FOUND" in missing.stderr
        found = await trio.to_thread.run_sync(_cli, host, "search", "LINE 4")
        assert found.returncode == 0, found.stderr
        assert found.stdout.splitlines() == [f"{s['id']}  1 matches  cli tour", "    [5] user: line 4"]
        nothing = await trio.to_thread.run_sync(_cli, host, "search", "no such words")
        assert nothing.returncode == 0 and nothing.stdout == ""
        empty = await trio.to_thread.run_sync(_cli, host, "search", "")
        assert empty.returncode != 0 and "INVALID_PARAMS" in empty.stderr
        await _still_serving(host)


async def test_ndjson_log_lines_parse(host: HostProcess) -> None:
    await _still_serving(host)
    log_path = Path(host.data_dir) / "logs" / "host" / "host.ndjson"
    lines = log_path.read_text("utf-8").splitlines()
    assert lines, "no log lines written"
    records = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) and {"ts", "level", "msg"} <= r.keys() for r in records)
    assert any(r["msg"] == "listening" and r.get("url") == host.url for r in records)
