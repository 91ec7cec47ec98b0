"""Params nested past what the host reads are refused by the Python clients before anything is sent, with the
code the host gives them (``PARSE_ERROR``, protocol/README "JSON input must be strict"), and the connection goes
on: ``pihost_client`` at the host's own limit (``MAX_JSON_DEPTH`` containers, the request object being level 1;
its encoder raised a bare ``RecursionError`` past ~1000 levels), the host's own ``HostClient`` past what orjson
writes (254 levels: it raised orjson's bare ``TypeError``; up to there it sends, so tests see the host's answer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from pihost_client import MAX_JSON_DEPTH as CLIENT_MAX_DEPTH
from pihost_client import RpcError, connect
from runtime.client import RpcError as HostRpcError
from runtime.client import open_client
from store.rules import MAX_JSON_DEPTH
from tests.hostkit import HostProcess, start_host_process


def nest(levels: int) -> Any:
    """``levels`` lists, one inside the other."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def stop(host: HostProcess) -> None:
    host.terminate()
    host.proc.communicate()


def test_the_client_knows_the_hosts_limit() -> None:
    assert CLIENT_MAX_DEPTH == MAX_JSON_DEPTH == 64


async def test_params_nested_past_the_hosts_limit_never_leave_the_client(tmp_path: Path) -> None:
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        with trio.fail_after(60):
            # the request object is level 1, params level 2, so nest(62) is the deepest the host reads
            async with open_client(host.url, host.token, client_id="deep-raw") as raw:
                with pytest.raises(HostRpcError) as within:
                    await raw.call("session.list", {"x": nest(MAX_JSON_DEPTH - 2)})
                assert within.value.data_code == "INVALID_PARAMS"  # read, then refused for the unknown key
                with pytest.raises(HostRpcError) as past:
                    await raw.call("session.list", {"x": nest(MAX_JSON_DEPTH - 1)})
                assert past.value.data_code == "PARSE_ERROR"  # the host's own answer
                for levels in (300, 5000):
                    with pytest.raises(HostRpcError) as refused:
                        await raw.call("session.list", {"x": nest(levels)})
                    assert refused.value.data_code == "PARSE_ERROR" and refused.value.data["sent"] is False
                    assert f"more than {MAX_JSON_DEPTH} containers" in refused.value.message
                    assert "nothing was sent" in refused.value.message
                assert (await raw.call("session.list", {}))["sessions"] == []  # the connection goes on
            async with connect(data_dir=tmp_path, client_id="deep-sdk") as c:
                with pytest.raises(RpcError) as within_sdk:
                    await c.call("session.list", {"x": nest(MAX_JSON_DEPTH - 2)})
                assert within_sdk.value.data_code == "INVALID_PARAMS"  # sent: the host read it
                for levels in (MAX_JSON_DEPTH - 1, 300, 5000):
                    with pytest.raises(RpcError) as refused_sdk:
                        await c.call("session.list", {"x": nest(levels)})
                    err = refused_sdk.value
                    assert err.data_code == "PARSE_ERROR" and not err.retriable, levels
                    assert err.data["maxDepth"] == MAX_JSON_DEPTH and err.data["sent"] is False
                    assert f"deeper than {MAX_JSON_DEPTH} containers" in err.message
                with pytest.raises(RpcError):  # a typed method goes through the same check
                    await c.settings.set(ns="ui", key="deep", value=nest(MAX_JSON_DEPTH))
                assert c.connected and c.connects == 1  # the connection went on, never dropped
                assert (await c.call("session.list", {}))["sessions"] == []
    finally:
        stop(host)
