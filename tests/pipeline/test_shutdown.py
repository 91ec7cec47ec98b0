"""Orderly shutdown: stop accepting, answer new requests SHUTTING_DOWN, let in-flight ones finish,
stop actors in reverse start order, write the clean-shutdown marker."""

from __future__ import annotations

import json
import os
import signal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime import routes
from runtime.client import ClientClosed, RpcError, open_client
from runtime.handlers import turns
from runtime.host import RunningHost, run_host
from tests import hostkit
from tests.hostkit import client_for, inprocess_host, msg, start_host_process


async def _until(condition: Any) -> None:
    """Poll a condition another task makes true (what it waits for has no event of its own)."""
    with trio.fail_after(30):
        while not condition():  # noqa: ASYNC110 - conditions of other tasks' state, polled
            await trio.sleep(0.01)


async def test_new_requests_are_refused_while_in_flight_ones_finish(tmp_path: Path) -> None:
    release = trio.Event()
    entered = trio.Event()
    real_start = turns.start_turn

    async def slow_start(ctx: Any, p: Any, key: Any) -> Any:
        entered.set()
        await release.wait()
        return await real_start(ctx, p, key)

    patched = {**routes.ROUTES, "session.startTurn": routes.on_session(slow_start)}
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            host: RunningHost = await nursery.start(partial(run_host, hostkit.test_config(root), routes=patched))
            async with client_for(host, "a") as a, client_for(host, "b") as b:
                sid = (await a.call("session.create", {}))["id"]
                results: dict[str, Any] = {}

                async def slow() -> None:
                    results["slow"] = await a.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})

                nursery.start_soon(slow)
                await entered.wait()
                host.shutdown.request()
                await _until(lambda: host.pipeline.closing)
                with pytest.raises(RpcError) as refused:
                    await b.call("settings.set", {"key": "k", "value": 1})
                assert refused.value.data_code == "SHUTTING_DOWN" and refused.value.retriable
                release.set()
                await _until(lambda: "slow" in results)
                assert results["slow"]["id"] == "t1"  # the request in flight got its answer
    marker = json.loads((root / "clean-shutdown").read_text())
    assert marker["actors"] and set(marker["actors"]) <= {"stopped", "passivated"}, marker
    async with inprocess_host(root) as again, client_for(again) as c:
        boot = (await c.call("host.status", {}))["boot"]
        assert boot["cleanShutdown"] is True
        assert "crashed" not in boot["previousShutdown"]["actors"]
        turn = await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "aborted"})
        assert turn["turn"]["status"] == "aborted"  # the turn the slow request started is durable


async def test_sigterm_under_load(tmp_path: Path) -> None:
    """Every request in flight at SIGTERM gets its reply; later ones SHUTTING_DOWN; all actors
    end stopped; the next boot reports a clean shutdown; every acknowledged append is there."""
    root = tmp_path / "data"
    proc = start_host_process(root)
    acked: dict[str, list[str]] = {}
    outcomes: dict[str, list[str]] = {}
    in_flight: dict[str, str | None] = {}
    snapshot: dict[str, str | None] = {}
    stop_sending = trio.Event()

    async def client(n: int) -> None:
        name = f"c{n}"
        acked[name], outcomes[name], in_flight[name] = [], [], None
        try:
            async with open_client(proc.url, proc.token, client_id=name, client_kind="test") as c:
                sid = (await c.call("session.create", {"sessionId": f"load-{n}"}))["id"]
                for i in range(10_000):
                    if stop_sending.is_set():
                        return
                    mid = f"{name}-{i}"
                    in_flight[name] = mid
                    try:
                        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, "x" * 200),
                                                               "submissionId": mid})
                        acked[name].append(mid)
                        outcomes[name].append(f"ok:{mid}")
                    except RpcError as exc:
                        outcomes[name].append(f"{exc.data_code}:{mid}")
                        if exc.data_code == "SHUTTING_DOWN":
                            return
                    in_flight[name] = None
        except ClientClosed:
            outcomes[name].append(f"closed:{in_flight[name]}")

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(client, n)
            await _until(lambda: sum(len(v) for v in acked.values()) >= 300)
            snapshot.update(in_flight)
            os.kill(proc.proc.pid, signal.SIGTERM)
            stop_sending.set()
        _out, err = await trio.to_thread.run_sync(lambda: proc.proc.communicate(timeout=60))
    assert proc.proc.returncode == 0, err.decode()[-2000:]
    for name, mid in snapshot.items():
        if mid is not None:  # in flight at SIGTERM: answered (ok, or SHUTTING_DOWN), never cut off
            assert any(o.endswith(f":{mid}") and not o.startswith("closed") for o in outcomes[name]), \
                (name, mid, outcomes[name][-3:])
    for seen in outcomes.values():
        assert all(o.split(":")[0] in ("ok", "SHUTTING_DOWN", "closed") for o in seen), seen[-5:]
    marker = json.loads((root / "clean-shutdown").read_text())
    assert set(marker["actors"]) <= {"stopped", "passivated"} and marker["actors"].get("stopped", 0) >= 12
    again = start_host_process(root)
    try:
        async with open_client(again.url, again.token, client_id="check", client_kind="test") as c:
            boot = (await c.call("host.status", {}))["boot"]
            assert boot["cleanShutdown"] is True and "crashed" not in boot["previousShutdown"]["actors"]
            for n in range(12):
                got = await c.call("session.get", {"sessionId": f"load-{n}", "full": True})
                assert [m["id"] for m in got["messages"]] == acked[f"c{n}"]
    finally:
        again.terminate()
        again.proc.communicate(timeout=30)
