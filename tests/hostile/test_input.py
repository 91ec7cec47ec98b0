"""Hostile input reaching a real host: forged cursors, paths, big integers (issue 18 "Fuzzing" findings).

Each test names the finding it reproduces; none of them may ever end in
``INTERNAL``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostile.wire import error_code, exchange, raw_connection, request
from tests.hostkit import client_for, inprocess_host, msg


def _forge(cursor: str, key: list[Any]) -> str:
    raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    raw[3] = key
    return base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")


async def _code(c: HostClient, method: str, params: dict[str, Any]) -> str:
    with pytest.raises(RpcError) as exc:
        await c.call(method, params)
    return exc.value.data_code


async def _pages(c: HostClient) -> dict[str, tuple[str, dict[str, Any]]]:
    """A real first page of every paged list: (method, params) and its nextCursor."""
    sids = [(await c.call("session.create", {"title": f"s{i}"}))["id"] for i in range(3)]
    for i, sid in enumerate(sids):
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}a", "needle one")})
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}b", "needle two")})
    for n in range(2):  # issue 16's paged lists: deliveries and turns
        await c.call("collab.deliver", {"pluginId": "pl", "sourceSessionId": sids[0], "targetSessionId": sids[1],
                                        "kind": "task", "content": f"task {n}", "idempotencyKey": f"k{n}"})
        await c.call("session.startTurn", {"sessionId": sids[2], "turnId": f"turn{n}"})
        await c.call("session.endTurn", {"sessionId": sids[2], "turnId": f"turn{n}", "status": "completed"})
    calls = {
        "session.list": {"limit": 1},
        "search.sessions": {"query": "needle", "limit": 1},
        "search.query": {"query": "needle", "limit": 1},
        "collab.list": {"sessionId": sids[1], "limit": 1},
        "session.listTurns": {"sessionId": sids[2], "limit": 1},
    }
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for method, params in calls.items():
        page = await c.call(method, params)
        assert page["nextCursor"], (method, page)
        out[method] = (page["nextCursor"], params)
    return out


async def test_forged_cursor_elements_are_invalid_cursor(tmp_path: Path) -> None:
    """Finding "forged cursors whose element types are never checked (lists and dicts bound into SQL,
    integer overflow)": every paged list answers INVALID_CURSOR, never INTERNAL."""
    forged_keys = [[[1], "x"], [{"a": 1}, "x"], [2**70, "x"], [-(2**64), "x"], [1, ["x"]], [1, {"x": 1}],
                   [True, "x"], [1.5, "x"], [None, "x"], [1], [1, "x", 3]]
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            pages = await _pages(c)
            for method, (cursor, params) in pages.items():
                for key in forged_keys:
                    got = await _code(c, method, {**params, "cursor": _forge(cursor, key)})
                    assert got == "INVALID_CURSOR", (method, key, got)
                for junk in ("%%%", "eyJ4IjoxfQ", base64.urlsafe_b64encode(b"[2]").decode()):
                    assert await _code(c, method, {**params, "cursor": junk}) == "INVALID_CURSOR"
            # a real cursor still pages
            cursor, params = pages["session.list"]
            assert len((await c.call("session.list", {**params, "cursor": cursor}))["sessions"]) == 1


async def test_nul_byte_in_a_path_is_invalid_params(tmp_path: Path) -> None:
    """Finding "a NUL byte in a path (ValueError)": INVALID_PARAMS on every method taking a path."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            project = tmp_path.parent / f"{tmp_path.name}-ws"
            project.mkdir()
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(project), "mode": "plan"}))["id"]
            cases = [
                ("attachments.importFile", {"path": f"{project}/a\x00b", "sessionId": sid}),
                ("session.create", {"title": "x", "projectPath": "/tmp/a\x00b"}),
                ("session.update", {"sessionId": sid, "projectPath": "/tmp/\x00"}),
                ("plans.submit", {"sessionId": sid, "turnId": "t1", "toolCallId": "c1", "kind": "plan",
                                  "markdown": "# p", "title": "p", "question": "ok?",
                                  "workspaceRoot": f"{project}\x00"}),
            ]
            for method, params in cases:
                assert await _code(c, method, params) == "INVALID_PARAMS", method


async def test_over_long_paths_are_invalid_params(tmp_path: Path) -> None:
    """Finding "a 4,000-character workspaceRoot (ENAMETOOLONG)": over-long paths and components are
    INVALID_PARAMS before any filesystem call."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            project = tmp_path.parent / f"{tmp_path.name}-ws"
            project.mkdir()
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(project), "mode": "plan"}))["id"]
            long_component = "/" + "a" * 4000
            many_components = "/" + "/".join(["abcdefgh"] * 500)  # 4501 bytes
            for root in (long_component, many_components, "/" + "é" * 200):  # 400 bytes in one component
                got = await _code(c, "plans.submit", {
                    "sessionId": sid, "turnId": "t1", "toolCallId": "c1", "kind": "plan", "markdown": "# p",
                    "title": "p", "question": "ok?", "workspaceRoot": root})
                assert got == "INVALID_PARAMS", root[:20]
                assert await _code(c, "attachments.importFile", {"path": root, "sessionId": sid}) == "INVALID_PARAMS"
                assert await _code(c, "session.create", {"title": "x", "projectPath": root}) == "INVALID_PARAMS"


@pytest.mark.parametrize("literal", ["9223372036854775808", "9999999999999999999", "-9223372036854775809",
                                     "-9999999999999999999", "18446744073709551615", "18446744073709551616"])
async def test_integers_outside_int64_are_refused_at_decode(tmp_path: Path, literal: str) -> None:
    """Finding "19-digit integers above int64 passing the strict decoder (its digit check only catches
    20+)" and "-9999999999999999999 is stored and read back as -1e+19 in settings and transcript meta":
    refused with PARSE_ERROR, nothing stored; the int64 extremes round-trip exactly."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "ints"}))["id"]
            async with raw_connection(host.url, host.token) as ws:
                setting = request("settings.set", {"ns": "app", "key": "n", "value": 1}).replace(
                    '"value":1', f'"value":{literal}')
                assert error_code(await exchange(ws, setting)) == "PARSE_ERROR"
                meta = request("session.appendMessage", {"sessionId": sid, "message": {
                    "id": "m1", "role": "user", "blocks": [{"type": "text", "text": "t"}], "meta": {"n": 1}}})
                assert error_code(await exchange(ws, meta.replace('"n":1', f'"n":{literal}'))) == "PARSE_ERROR"
            assert (await c.call("settings.get", {"ns": "app", "key": "n"})).get("value") is None
            assert (await c.call("session.get", {"sessionId": sid}))["messages"] == []
            for value in (2**63 - 1, -(2**63)):
                await c.call("settings.set", {"ns": "app", "key": "edge", "value": value})
                got = (await c.call("settings.get", {"ns": "app", "key": "edge"}))["value"]
                assert got == value and isinstance(got, int)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m2", "t", meta={"n": -(2**63)})})
            stored = (await c.call("session.get", {"sessionId": sid}))["messages"][0]["meta"]["n"]
            assert stored == -(2**63) and isinstance(stored, int)
