"""pihost_client: the same example under asyncio and trio; reconnect, resubscribe, receipt-backed retries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from pihost_client import Event, Resync, RpcError, connect
from tests.hostkit import REPO, HostProcess, start_host_process

TOUR = REPO / "clients" / "python" / "examples" / "tour.py"


def stop(host: HostProcess) -> None:
    host.terminate()
    host.proc.communicate()  # closes the pipes


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_tour_runs_under_both_event_loops(tmp_path: Path, backend: str) -> None:
    host = start_host_process(tmp_path)
    try:
        for _ in range(2):  # idempotent: a second run makes its own session and receipts
            proc = subprocess.run([sys.executable, str(TOUR), "--data-dir", str(tmp_path), "--backend", backend],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            out = proc.stdout
            assert "events seq [1, 2, 3]" in out
            assert "window 1 True ['hello 1 — 数据库', 'hello 2 — 数据库']" in out
            assert "search finds this session True" in out
            assert "error code SESSION_NOT_FOUND" in out
            assert out.rstrip().endswith(f"tour ok on {backend}")
    finally:
        stop(host)


def test_the_client_imports_none_of_the_host(tmp_path: Path) -> None:
    """Installable without the host's dependencies: importing it loads no trio, pydantic or host package."""
    code = ("import sys, pihost_client, pihost_client.client, pihost_client._ws;"
            "print(sorted(m for m in ('trio','pydantic','orjson','trio_websocket','runtime','protocol','store',"
            "'actors') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    meta = (REPO / "clients" / "python" / "pyproject.toml").read_text()
    assert 'dependencies = [\n    "anyio>=4.4",\n    "wsproto>=1.2",\n]' in meta


async def _wait_dead(host: HostProcess) -> None:
    await trio.to_thread.run_sync(host.proc.wait)


async def test_a_retry_after_a_crash_is_answered_from_the_receipt(tmp_path: Path) -> None:
    """The host dies after committing a queue push but before answering: the client reconnects to the
    restarted host and resends with the same submissionId; exactly one entry exists."""
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    restarted = []
    try:
        async with connect(data_dir=tmp_path, client_id="retry-test", client_kind="ui", backoff=0.05) as c:
            sid = (await c.session.create(title="Retry"))["id"]
            first_boot = c.hello["bootId"]
            stop(host)
            host = await trio.to_thread.run_sync(
                lambda: start_host_process(tmp_path, env={"RT_CRASHPOINT": "session.queuePush.after_commit:1:kill"}))

            async def restart_when_dead() -> None:
                nonlocal host
                await _wait_dead(host)
                host.proc.communicate()
                host = await trio.to_thread.run_sync(start_host_process, tmp_path)
                restarted.append(True)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(restart_when_dead)
                with trio.fail_after(60):
                    pushed = await c.session.queue_push(session_id=sid, principal="user", content="only once",
                                                        permission_mode="ask")
            assert restarted == [True]
            assert c.hello["bootId"] != first_boot
            assert pushed["replayed"] is False
            state = await c.session.queue_list(session_id=sid)
            assert [e["content"] for e in state["entries"]] == ["only once"]
            assert state["entries"][0]["id"] == pushed["entry"]["id"]
    finally:
        stop(host)


async def test_subscriptions_survive_a_restart_and_resync(tmp_path: Path) -> None:
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        async with connect(data_dir=tmp_path, client_id="resub-test", backoff=0.05) as c:
            sid = (await c.session.create(title="Resub"))["id"]
            async with c.subscribe(["session.message"], session_id=sid) as events:
                await c.session.append_message(session_id=sid, message={
                    "id": "a1", "role": "user", "blocks": [{"type": "text", "text": "before"}]})
                with trio.fail_after(10):
                    first = await events.next()
                assert isinstance(first, Event) and first.data["message"]["id"] == "a1"
                host.kill9()
                host.proc.communicate()
                host = await trio.to_thread.run_sync(start_host_process, tmp_path)
                # the call waits for the reconnect, then runs on the new host
                with trio.fail_after(30):
                    await c.session.append_message(session_id=sid, message={
                        "id": "a2", "role": "user", "blocks": [{"type": "text", "text": "after"}]})
                    second = await events.next()
                    third = await events.next()
                assert isinstance(second, Resync) and "restarted" in second.reason
                assert isinstance(third, Event) and third.data["message"]["id"] == "a2"
                assert c.connects == 2
    finally:
        stop(host)


async def test_errors_keep_their_code_and_field_details(tmp_path: Path) -> None:
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        async with connect(data_dir=tmp_path, client_id="err-test") as c:
            with pytest.raises(RpcError) as info:
                await c.call("session.list", {"limit": "50"})
            err = info.value
            assert err.data_code == "INVALID_PARAMS" and not err.retriable
            assert [e["loc"] for e in err.field_errors] == ["limit"]
            assert "limit:" in err.describe()
            info_json = json.loads((tmp_path / "host.json").read_text())
            assert c.hello["connectionId"] >= 1 and info_json["pid"] == host.proc.pid
    finally:
        stop(host)
